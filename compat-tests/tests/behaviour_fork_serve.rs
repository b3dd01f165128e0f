//! A fork-per-connection server (inetd-style servers, PostgreSQL's postmaster, git and rsync
//! daemons): it accepts, forks at once, and the child serves the connection — an echo of
//! 256 KiB — while the parent closes its copy.
//!
//! The scenario (src/bin/behave.rs, `fork_serve`) asserts what Linux TCP does: the child
//! reads and writes the connection as its own, every byte comes back in order. Under the shim,
//! with the client shimmed too, the fork comes while the connection's upgrade is undecided
//! (the server waits for its client's request): the parent offers it to the child, which takes
//! it over at its first use (it used to get EIO there, then stayed on TCP), and the parent
//! redirects the client's request to the child (docs/upgrade.md §7).

use rdmashim_compat_tests::*;

const BIN: &str = env!("CARGO_BIN_EXE_behave");

#[test]
fn kernel_tcp() {
    behave(BIN, "fork_serve", None, "127.0.0.1");
}

/// The connection on the rings before the fork (the server settles first): the parent's close
/// of its copy switches it back (a child shares it), and the child's echo goes over TCP.
#[test]
fn settled_over_shm() {
    let r = behave_settled_fork(BIN, "fork_serve");
    let [child] = &r.server_forks[..] else {
        panic!(
            "one record from the child that served: {:#?}",
            r.server_forks
        );
    };
    assert!(
        child.connections() == 0 && child.bytes("tcp_tx") >= 256 * 1024,
        "the child served the inherited socket over TCP: {}",
        child.summary()
    );
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

/// The server forks at once ([`behave_fork_undecided`]): the parent offered the connection
/// at the fork, the child took it over at its first read, and the parent, once it had closed
/// its copy, redirected the client's request to the child's own listener (rdma_cm's, or its
/// own rendezvous name): the client's connection is upgraded, the echo went through the rings
/// (counted by the device too, over RDMA), the child's record counts the upgrade and the
/// parent's `handed_to_child`. (If the request came before the fork, the parent switched the
/// connection back for the child instead: [`answered_before_the_fork`].)
fn on_rings(rings: Rings) {
    let device = rings.device();
    let r = behave_fork_undecided(BIN, "fork_serve", rings);
    let c = r.client.as_ref().expect("the client wrote no stats");
    if answered_before_the_fork(r.server.as_ref().expect("the server wrote no stats"), c) {
        return;
    }
    assert_eq!(c.connections(), 1, "client: {}", c.summary());
    c.assert_all_upgraded();
    // (the 256 KiB echo starts 1.5 s after the greeting, after the switch)
    rings.assert_at_least(c, 64 * 1024, 64 * 1024);
    let s = r.server.as_ref().expect("the server wrote no stats");
    assert_eq!(s.connections(), 1, "server: {}", s.summary());
    s.assert_all_fallback("handed_to_child");
    let [child] = &r.server_forks[..] else {
        panic!(
            "one record from the child that served: {:#?}",
            r.server_forks
        );
    };
    child.assert_all_upgraded();
    rings.assert_at_least(child, 64 * 1024, 64 * 1024);
    if let Some(d) = device {
        d.delta().assert_carried(c.ring_bytes());
    }
}
