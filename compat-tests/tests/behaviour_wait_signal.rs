//! epoll_wait and poll are interrupted by a signal (EINTR) whether or not they busy-poll first, and a
//! signal sent to the process runs its handler on the application's thread, not the shim's.
//!
//! The scenario (src/bin/behave.rs, `wait_signal`) asserts what Linux TCP does; it runs without
//! the shim (so the expectations are the kernel's own) and with the shim on both ends.

use rdmashim_compat_tests::*;

const BIN: &str = env!("CARGO_BIN_EXE_behave");

#[test]
fn kernel_tcp() {
    behave(BIN, "wait_signal", None, "127.0.0.1");
}

#[test]
fn under_the_shim() {
    behave(BIN, "wait_signal", Some(Via::Preload), "127.0.0.1");
}

/// RDMA tier: over an upgraded connection, where the client's waits busy-poll before they
/// sleep (its ping-pongs' spins must have found the replies: spin hits) and the alarms arrive
/// while they do.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn over_rdma() {
    let r = behave(BIN, "wait_signal", Some(Via::Preload), &test_ip());
    let client = r.client.expect("client stats");
    assert!(
        client.waits("spin_hit") > 0,
        "the client's waits never found a reply while spinning: {}",
        client.raw["waits"]
    );
}
