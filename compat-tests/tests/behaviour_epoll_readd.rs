//! epoll with EPOLL_CTL_DEL and ADD again (event loops such as redis' `ae`): data that arrived
//! meanwhile is reported after the re-ADD, poll/blocking reads/another set work after a DEL, and
//! hundreds of ADD-write-DEL-ADD-read-DEL rounds neither hang nor lose a byte.
//!
//! The scenario (src/bin/behave.rs, `epoll_readd`) asserts what Linux TCP does; it runs without the
//! shim (so the expectations are the kernel's own) and with the shim on both ends.

use rdmashim_compat_tests::*;

const BIN: &str = env!("CARGO_BIN_EXE_behave");

#[test]
fn kernel_tcp() {
    behave(BIN, "epoll_readd", None, "127.0.0.1");
}

#[test]
fn under_the_shim() {
    behave(BIN, "epoll_readd", Some(Via::Preload), "127.0.0.1");
}

/// RDMA tier: the same scenario with both ends shimmed on `RDMASHIM_TEST_IP`, where the
/// connection is upgraded: the kernel's behaviour must hold over the rings.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn over_rdma() {
    behave(BIN, "epoll_readd", Some(Via::Preload), &test_ip());
}
