//! A prefork server (nginx, Apache prefork, gunicorn): the listening socket is made before the
//! server forks its workers, and only the workers accept. Each of two workers serves one of the
//! client's two connections, echoing blocks for about four seconds.
//!
//! The scenario (src/bin/behave.rs, `prefork`) asserts what Linux TCP does: every byte arrives
//! in order, each connection at its own worker. Under the shim a worker's listening socket has
//! its rdma_cm side in the parent (which never accepts): each worker serves its connections on
//! an rdma_cm listener of its own, whose port its token gives the client (docs/protocol.md
//! 2.9), with queue pairs on a device context of its own (the parent's cannot be used in a
//! fork child), and the connections go onto rings mid-exchange, with no byte lost.

use rdmashim_compat_tests::*;

const BIN: &str = env!("CARGO_BIN_EXE_behave");

#[test]
fn kernel_tcp() {
    behave_roles(BIN, "prefork", Side::Plain, Side::Plain, "127.0.0.1", None);
}

/// Runs the scenario with both ends shimmed on `ip` and checks the stats: the client's two
/// connections and one per worker, each checked by `check` (the client's with `"client"`,
/// the workers' with `"worker"`); the parent accepted none. Returns the client's stats.
fn shimmed(ip: &str, check: impl Fn(&str, &Stats)) -> Stats {
    let shim = Side::Shim(Via::Preload);
    let r = behave_roles(BIN, "prefork", shim, shim, ip, None);
    let c = r.client.expect("the client wrote no stats");
    assert_eq!(c.connections(), 2, "client: {}", c.summary());
    check("client", &c);
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
        check("worker", w);
    }
    c
}

/// Over shared memory (both ends shimmed on 127.0.0.1, on every host): see [`on_rings`].
#[test]
fn over_shm() {
    on_rings(Rings::Shm);
}

/// RDMA tier: the same over RDMA rings (both ends on `RDMASHIM_TEST_IP`).
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn over_rdma() {
    on_rings(Rings::Rdma);
}

/// Each worker's connection is dialled at the worker's own listener (rdma_cm's, or its own
/// rendezvous name: the parent holds the port's) and upgraded: the client's two connections
/// and each worker's one are on `rings`, the blocks went through them (counted by the device
/// too, over RDMA), and the parent, which holds the listening socket, accepted nothing.
fn on_rings(rings: Rings) {
    let device = rings.device();
    let c = shimmed(&rings.ip(), |role, st| {
        st.assert_all_upgraded();
        if role == "worker" {
            // (most of the ten 16 KiB rounds each way come after the upgrade, 400 ms apart)
            rings.assert_at_least(st, 16 * 1024, 16 * 1024);
        }
    });
    if let Some(d) = device {
        d.delta().assert_carried(c.ring_bytes());
    }
}
