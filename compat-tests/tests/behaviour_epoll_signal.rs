//! epoll_wait is interrupted by a signal (EINTR) whether or not it busy-polls first, and a
//! signal sent to the process runs its handler on the application's thread, not the shim's.
//!
//! The scenario (src/bin/behave.rs, `epoll_signal`) asserts what Linux TCP does; it runs without
//! the shim (so the expectations are the kernel's own) and with the shim on both ends.

use rdmashim_compat_tests::*;

const BIN: &str = env!("CARGO_BIN_EXE_behave");

#[test]
fn kernel_tcp() {
    behave(BIN, "epoll_signal", None, "127.0.0.1");
}

#[test]
fn under_the_shim() {
    behave(BIN, "epoll_signal", Some(Via::Preload), "127.0.0.1");
}

/// RDMA tier: over an upgraded connection, where the client's waits on its epoll set
/// busy-poll the set (its ping-pong's spins must have found the replies: spin hits) and the
/// alarms arrive while it does.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn over_rdma() {
    let r = behave_roles(
        BIN,
        "epoll_signal",
        Side::Shim(Via::Preload),
        Side::Shim(Via::Preload),
        &test_ip(),
        Some(SETTLE),
    );
    let client = r.client.expect("client stats");
    client.assert_all_upgraded();
    r.server.expect("server stats").assert_all_upgraded();
    assert!(
        client.waits("spin_hit") > 0,
        "the client's epoll waits never found a reply while spinning: {}",
        client.raw["waits"]
    );
}
