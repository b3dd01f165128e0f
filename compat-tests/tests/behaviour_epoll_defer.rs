//! epoll registrations made and dropped on every request (event loops such as redis' `ae`),
//! and the sets that hold them: a sleeper wakes for an fd added meanwhile, readiness at the
//! ADD is reported at once and while it lasts, data that arrives while the fd is out of the
//! set is reported after the re-ADD, sets watched by poll(2) or nested in another set report
//! what they hold, and EEXIST/ENOENT are the kernel's.
//!
//! The scenario (src/bin/behave.rs, `epoll_defer`) asserts what Linux TCP does; it runs without
//! the shim (so the expectations are the kernel's own), with the shim on both ends on
//! 127.0.0.1 (over shared memory), and in the RDMA tier over the rings.

use rdmashim_compat_tests::*;

const BIN: &str = env!("CARGO_BIN_EXE_behave");

#[test]
fn kernel_tcp() {
    behave(BIN, "epoll_defer", None, "127.0.0.1");
}

#[test]
fn under_the_shim() {
    behave(BIN, "epoll_defer", Some(Via::Preload), "127.0.0.1");
}

/// RDMA tier: the same scenario with both ends shimmed on `RDMASHIM_TEST_IP`, where the
/// connection is upgraded: the kernel's behaviour must hold over the rings.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn over_rdma() {
    behave(BIN, "epoll_defer", Some(Via::Preload), &test_ip());
}
