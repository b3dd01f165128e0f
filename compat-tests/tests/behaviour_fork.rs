//! fork: a child closing its inherited copy leaves the parent's connection intact (redis
//! BGSAVE); a child writing on it is heard on kernel TCP, or (the connection already on the
//! ring) gets EIO and writes nothing, while the parent's connection goes on.
//!
//! The scenario (src/bin/behave.rs, `fork`) asserts what Linux TCP does; it runs without the
//! shim (so the expectations are the kernel's own) and with the shim on both ends.

use rdmashim_compat_tests::*;

const BIN: &str = env!("CARGO_BIN_EXE_behave");

#[test]
fn kernel_tcp() {
    behave(BIN, "fork", None, "127.0.0.1");
}

#[test]
fn under_the_shim() {
    behave(BIN, "fork", Some(Via::Preload), "127.0.0.1");
}

/// RDMA tier: the same scenario with both ends shimmed on `RDMASHIM_TEST_IP`, where the
/// connection is upgraded: the kernel's behaviour must hold over the rings.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn over_rdma() {
    behave(BIN, "fork", Some(Via::Preload), &test_ip());
}

/// Over shared memory (both ends shimmed on 127.0.0.1, on every host): see [`undecided`].
#[test]
fn undecided_over_shm() {
    undecided(Rings::Shm);
}

/// RDMA tier: the same over RDMA rings (both ends on `RDMASHIM_TEST_IP`).
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn over_rdma_undecided() {
    undecided(Rings::Rdma);
}

/// The scenario with the connection undecided at the forks (no settle pause:
/// [`behave_fork_undecided`]). The parent offers it to its first child at the fork
/// (docs/upgrade.md §7), but that child only closes its copy and the parent writes on the
/// connection itself: the offer is withdrawn and the connection stays TCP in every process
/// (`forked`), the client's request held and then rejected — no byte lost or reordered.
///
/// On a loaded host the server may reach its first fork after the client's request (a probe,
/// which goes at once): the request is then accepted, the connection is on the rings at
/// both forks, and the second child's send has the parent switch it back (the scenario's own
/// checks hold the bytes to the order TCP gives). Both outcomes are the shim's to choose; any
/// other (an upgrade without the switch back, a fallback for another reason) fails.
fn undecided(rings: Rings) {
    let r = behave_fork_undecided(BIN, "fork", rings);
    let s = r.server.as_ref().expect("the server wrote no stats");
    assert_eq!(s.connections(), 1, "server: {}", s.summary());
    let c = r.client.as_ref().expect("the client wrote no stats");
    assert_eq!(c.connections(), 1, "client: {}", c.summary());
    if s.upgraded == 0 {
        s.assert_all_fallback("forked");
        assert!(
            c.upgraded == 0 && c.reason("peer_rejected") + c.reason("closed_early") == 1,
            "client: {}",
            c.summary()
        );
    } else {
        for (role, st) in [("server", s), ("client", c)] {
            assert!(
                st.upgraded == 1 && st.switched_back == 1,
                "{role}, upgraded before the forks: then switched back: {}",
                st.summary()
            );
        }
    }
}
