//! A process that used a connection forks, and its child connects on its own (a prefork
//! worker connecting to its backend, a daemon's helper). The scenario (src/bin/behave.rs,
//! `fork_dial`) asserts what Linux TCP does: both connections carry their bytes intact.
//!
//! Over RDMA the parent's connection is upgraded, which starts librdmacm in the parent; the
//! child inherits that state, whose device contexts the kernel refuses to another process (a
//! queue pair made on them failed at its first post, EACCES, and reset the connection). The
//! child's queue pairs go on a device context of its own (rdma-core's `cm` module), and its
//! connection is upgraded too.

use rdmashim_compat_tests::*;

const BIN: &str = env!("CARGO_BIN_EXE_behave");

#[test]
fn kernel_tcp() {
    behave_roles(
        BIN,
        "fork_dial",
        Side::Plain,
        Side::Plain,
        "127.0.0.1",
        None,
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

/// The parent's connection A and the child's B both go over `rings`; B's 256 KiB each way
/// through them (counted by the device too, over RDMA).
fn on_rings(rings: Rings) {
    let shim = Side::Shim(Via::Preload);
    let device = rings.device();
    let r = behave_roles(BIN, "fork_dial", shim, shim, &rings.ip(), Some(SETTLE));
    let c = r.client.as_ref().expect("the client wrote no stats");
    assert_eq!(c.connections(), 1, "client (the parent): {}", c.summary());
    c.assert_all_upgraded();
    rings.assert_at_least(c, 32 * 4096, 32 * 4096);
    let s = r.server.as_ref().expect("the server wrote no stats");
    assert_eq!(s.connections(), 2, "server: {}", s.summary());
    s.assert_all_upgraded();
    assert_eq!(
        r.client_forks.len(),
        1,
        "the child's record: {:#?}",
        r.client_forks
    );
    let child = &r.client_forks[0];
    assert_eq!(child.connections(), 1, "child: {}", child.summary());
    child.assert_all_upgraded();
    // (its first bytes may go before the upgrade, its echo's last ones surely after)
    assert!(rings.rx(child) > 0, "child: {}", child.summary());
    if let Some(d) = device {
        d.delta()
            .assert_carried(c.ring_bytes() + child.ring_bytes());
    }
}
