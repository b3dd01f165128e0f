//! A client that hands its connection to a fork child and closes its own copy at once (a
//! daemon's helper, a pipeline stage): the child reads the server's answer, sends more and
//! reads the server's 2 MiB to the end. The scenario (src/bin/behave.rs, `fork_client`)
//! asserts what Linux TCP does.
//!
//! Under the shim the client's dial is under way when its process forks (1 s after the
//! connect: over RDMA the dial starts only after its address is resolved, and a fork before
//! that settles the connection on TCP, `forked`) and closes its copy: the server's shim holds
//! the request two seconds before it answers (`RDMASHIM_FAULT=slow_answer:2000`, a loaded
//! host). The server switches to the ring once
//! the link is up and sends its 2 MiB there; the client's process, which no longer holds the
//! connection but whose child does, switches it back to TCP once the link is up
//! (docs/upgrade.md §7, `Inner::give_back`), and the child reads every byte from the socket.
//! Before, the client's engine dropped the new link, as for a connection that ended: the
//! server's stream broke under the child in one of two runs.

use rdmashim_compat_tests::*;

const BIN: &str = env!("CARGO_BIN_EXE_behave");

#[test]
fn kernel_tcp() {
    behave_roles(
        BIN,
        "fork_client",
        Side::Plain,
        Side::Plain,
        "127.0.0.1",
        None,
    );
}

#[test]
fn dial_under_way_over_shm() {
    dial_under_way(Rings::Shm);
}

/// RDMA tier: the same over RDMA rings.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn dial_under_way_over_rdma() {
    dial_under_way(Rings::Rdma);
}

fn dial_under_way(rings: Rings) {
    let shim = Side::Shim(Via::Preload);
    let r = behave_roles_envs(
        BIN,
        "fork_client",
        (shim, &[]),
        (shim, &[("RDMASHIM_FAULT", "slow_answer:2000")]),
        &rings.ip(),
        None,
    );
    let c = r.client.as_ref().expect("the client wrote no stats");
    let s = r.server.as_ref().expect("the server wrote no stats");
    assert_switched_back(c, s, "");
}
