//! A prefork server (nginx, Apache prefork, gunicorn): the listening socket is made before the
//! server forks its workers, and only the workers accept. Each of two workers serves one of the
//! client's two connections, echoing blocks for about four seconds.
//!
//! The scenario (src/bin/behave.rs, `prefork`) asserts what Linux TCP does: every byte arrives
//! in order, each connection at its own worker. Under the shim a worker's listening socket has
//! its RDMA side in the parent (which never accepts), so the connections stay on TCP, with a
//! reason on both ends and no byte lost while that is being decided (the client's upgrade
//! attempt lasts until the parent gives up on matching it, mid-exchange).

use rdmashim_compat_tests::*;

const BIN: &str = env!("CARGO_BIN_EXE_behave");

#[test]
fn kernel_tcp() {
    behave_roles(BIN, "prefork", Side::Plain, Side::Plain, "127.0.0.1", None);
}

/// Runs the scenario with both ends shimmed on `ip` and checks the stats: the client's two
/// connections and one per worker, all on TCP (the client's for `client_reason`, the workers'
/// for `worker_reason`); the parent accepted none.
fn shimmed(ip: &str, client_reason: &str, worker_reason: &str) {
    let shim = Side::Shim(Via::Preload);
    let r = behave_roles(BIN, "prefork", shim, shim, ip, None);
    let c = r.client.as_ref().expect("the client wrote no stats");
    assert_eq!(c.connections(), 2, "client: {}", c.summary());
    c.assert_all_fallback(client_reason);
    let parent = r.server.as_ref().expect("the parent wrote no stats");
    assert_eq!(parent.connections(), 0, "parent: {}", parent.summary());
    assert_eq!(
        r.server_forks.len(),
        2,
        "one stats file per worker: {:#?}",
        r.server_forks
    );
    for w in &r.server_forks {
        assert_eq!(w.connections(), 1, "worker: {}", w.summary());
        w.assert_all_fallback(worker_reason);
    }
}

#[test]
fn under_the_shim() {
    shimmed("127.0.0.1", &expected_reason(), &expected_reason());
}

/// RDMA tier: both ends shimmed on `RDMASHIM_TEST_IP`. The workers know at accept() that the
/// listener's RDMA side is not theirs; a listener of their own (whose port their token would
/// name) cannot work either, since librdmacm's device state in a fork child is the parent's
/// (see `behaviour_fork_dial`). So they send no token, and the clients, seeing the workers'
/// first bytes without one, never dial.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn over_rdma() {
    shimmed(&test_ip(), "plain_peer", "inherited_listener");
}
