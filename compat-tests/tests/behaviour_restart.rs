//! A blocking recv/send interrupted by a signal handler is restarted when the handler has
//! SA_RESTART and the socket no timeout, and fails with EINTR otherwise — also when the
//! connection is upgraded and the call sleeps in the shim's own wait.
//!
//! The scenario (src/bin/behave.rs, `restart`) asserts what Linux TCP does; it runs without
//! the shim (so the expectations are the kernel's own) and with the shim on both ends.

use rdmashim_compat_tests::*;

const BIN: &str = env!("CARGO_BIN_EXE_behave");

#[test]
fn kernel_tcp() {
    behave(BIN, "restart", None, "127.0.0.1");
}

#[test]
fn under_the_shim() {
    behave(BIN, "restart", Some(Via::Preload), "127.0.0.1");
}

/// RDMA tier: over an upgraded connection, where the blocked calls sleep in the shim's wait
/// (the alarms arrive there: a sleep must have happened).
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn over_rdma() {
    let r = behave(BIN, "restart", Some(Via::Preload), &test_ip());
    let client = r.client.expect("client stats");
    assert!(
        client.waits("slept") > 0,
        "the client's calls never slept: {}",
        client.raw["waits"]
    );
}
