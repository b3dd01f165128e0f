//! readv and recvmsg into scatter lists: uninitialised buffers, overlapping segments, an empty
//! list, a bad segment (EFAULT, nothing consumed), the end.
//!
//! The scenario (src/bin/behave.rs, `scatter`) asserts what Linux TCP does; it runs without the
//! shim (so the expectations are the kernel's own) and with the shim on both ends.

use rdmashim_compat_tests::*;

const BIN: &str = env!("CARGO_BIN_EXE_behave");

#[test]
fn kernel_tcp() {
    behave(BIN, "scatter", None, "127.0.0.1");
}

#[test]
fn under_the_shim() {
    behave(BIN, "scatter", Some(Via::Preload), "127.0.0.1");
}

/// RDMA tier: the same scenario with both ends shimmed on `RDMASHIM_TEST_IP`, where the
/// connection is upgraded: the kernel's behaviour must hold over the rings.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn over_rdma() {
    behave(BIN, "scatter", Some(Via::Preload), &test_ip());
}
