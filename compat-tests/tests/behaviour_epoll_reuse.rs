//! An fd number reused while an epoll set still holds a registration made through it (the
//! connection's fd was closed while a duplicate kept it open; a new connection got the
//! number): registering the new connection, or deleting the number from a set where only the
//! old registration is, works on the new connection and leaves nothing of the old one's in
//! the sets (under the shim: no eventfd or completion channel of the old connection, which
//! would keep the set waking for nothing).
//!
//! The scenario (src/bin/behave.rs, `epoll_reuse`) asserts what Linux TCP does; it runs without
//! the shim (the expectations are the kernel's own) and with the shim on both ends.

use rdmashim_compat_tests::*;

const BIN: &str = env!("CARGO_BIN_EXE_behave");

/// The scenario's three connections (A, B, D).
const CONNS: u64 = 3;

#[test]
fn kernel_tcp() {
    behave_conns(BIN, "epoll_reuse", None, "127.0.0.1", CONNS);
}

#[test]
fn under_the_shim() {
    behave_conns(BIN, "epoll_reuse", Some(Via::Preload), "127.0.0.1", CONNS);
}

/// RDMA tier: the old and new connections are upgraded, so their eventfds and completion
/// channels are in the sets.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn over_rdma() {
    behave_conns(BIN, "epoll_reuse", Some(Via::Preload), &test_ip(), CONNS);
}
