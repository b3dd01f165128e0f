//! dup2/F_DUPFD_CLOEXEC copies share the connection; closing one keeps it; closing the last gives the peer EOF.
//!
//! The scenario (src/bin/behave.rs, `dup2`) asserts what Linux TCP does; it runs without the
//! shim (so the expectations are the kernel's own) and with the shim on both ends.

use rdmashim_compat_tests::*;

const BIN: &str = env!("CARGO_BIN_EXE_behave");

#[test]
fn kernel_tcp() {
    behave(BIN, "dup2", None, "127.0.0.1");
}

#[test]
fn under_the_shim() {
    behave(BIN, "dup2", Some(Via::Preload), "127.0.0.1");
}

/// RDMA tier: the same scenario with both ends shimmed on `RDMASHIM_TEST_IP`, where the
/// connection is upgraded: the kernel's behaviour must hold over the rings.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn over_rdma() {
    behave(BIN, "dup2", Some(Via::Preload), &test_ip());
}
