//! A fork child that ends with `_exit` right after writing 4 MiB, its socket still open
//! (Python's `ForkingMixIn` children end so): the client reads all of it, then EOF, as the
//! kernel delivers a TCP socket's buffered bytes after the process is gone.
//!
//! The scenario (src/bin/behave.rs, `fork_quick_exit`) asserts what Linux TCP does. Over the
//! rings the child took the connection over from its parent (docs/upgrade.md §7) and its
//! queue pair dies with the process: the shim's `_exit` gives the ring the time a normal exit
//! gives it to deliver what it accepted and its Close. Before, the client got ECONNRESET
//! with up to the last ring's worth missing (6 of 6 runs by hand with a ForkingTCPServer).

use rdmashim_compat_tests::*;

const BIN: &str = env!("CARGO_BIN_EXE_behave");

#[test]
fn kernel_tcp() {
    behave(BIN, "fork_quick_exit", None, "127.0.0.1");
}

/// The connection on the rings before the fork (the server settles first): the parent's close
/// of its copy switches it back (a child shares it), and the child's 4 MiB go over TCP.
#[test]
fn settled_over_shm() {
    let r = behave_settled_fork(BIN, "fork_quick_exit");
    let c = r.client.as_ref().expect("the client wrote no stats");
    assert!(c.bytes("tcp_rx") >= 4 << 20, "client: {}", c.summary());
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

/// The client dialing a second after its connect so that the fork comes first: the child's
/// connection is upgraded and the 4 MiB go through the rings (the child, which ends in
/// `_exit`, writes no record; the parent counts `handed_to_child`).
fn on_rings(rings: Rings) {
    let r = behave_dial_late(BIN, "fork_quick_exit", rings);
    let c = r.client.as_ref().expect("the client wrote no stats");
    assert_eq!(c.connections(), 1, "client: {}", c.summary());
    c.assert_all_upgraded();
    rings.assert_at_least(c, 0, 1 << 20);
    let s = r.server.as_ref().expect("the server wrote no stats");
    s.assert_all_fallback("handed_to_child");
}
