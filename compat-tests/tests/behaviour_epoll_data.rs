//! epoll returns every event with the application's own data, also data shaped like the
//! shim's tags for its own registrations (which it must not take for its own, nor give out
//! as the application's): a socket, two pipes and an eventfd in one set.
//!
//! The scenario (src/bin/behave.rs, `epoll_data`) asserts what Linux does; it runs without
//! the shim (so the expectations are the kernel's own) and with the shim on both ends.

use rdmashim_compat_tests::*;

const BIN: &str = env!("CARGO_BIN_EXE_behave");

#[test]
fn kernel_tcp() {
    behave(BIN, "epoll_data", None, "127.0.0.1");
}

#[test]
fn under_the_shim() {
    behave(BIN, "epoll_data", Some(Via::Preload), "127.0.0.1");
}

/// RDMA tier: the socket is upgraded, so the set holds registrations of the shim's (tagged)
/// beside the application's tag-shaped ones.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn over_rdma() {
    behave(BIN, "epoll_data", Some(Via::Preload), &test_ip());
}
