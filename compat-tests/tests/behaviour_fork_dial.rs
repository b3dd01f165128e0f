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

#[test]
fn under_the_shim() {
    let shim = Side::Shim(Via::Preload);
    let r = behave_roles(BIN, "fork_dial", shim, shim, "127.0.0.1", None);
    let s = r.server.as_ref().expect("the server wrote no stats");
    assert_eq!(s.connections(), 2, "server: {}", s.summary());
    s.assert_all_fallback(&expected_reason());
    let c = r.client.as_ref().expect("the client wrote no stats");
    c.assert_all_fallback(&expected_reason());
    assert_eq!(
        r.client_forks.len(),
        1,
        "the child's record: {:#?}",
        r.client_forks
    );
    r.client_forks[0].assert_all_fallback(&expected_reason());
}

/// RDMA tier: the parent's connection A and the child's B both go over rings; B's 256 KiB
/// each way through them, counted by the device too.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn over_rdma() {
    let shim = Side::Shim(Via::Preload);
    let device = DeviceCounters::read(&test_device());
    let r = behave_roles(BIN, "fork_dial", shim, shim, &test_ip(), Some(SETTLE));
    let c = r.client.as_ref().expect("the client wrote no stats");
    assert_eq!(c.connections(), 1, "client (the parent): {}", c.summary());
    c.assert_all_upgraded();
    c.assert_ring_at_least(32 * 4096, 32 * 4096);
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
    assert!(child.bytes("ring_rx") > 0, "child: {}", child.summary());
    device
        .delta()
        .assert_carried(c.ring_bytes() + child.ring_bytes());
}
