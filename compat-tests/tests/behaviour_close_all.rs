//! A daemon's close-all loop in the middle of a connection: the client closes every fd below
//! 4096 but its socket (and stdio), later everything around it with `close_range`, and goes on
//! echoing. The scenario (src/bin/behave.rs, `close_all`) asserts what Linux TCP does: the
//! stream goes on, intact.
//!
//! Under the shim, an upgraded connection lives on descriptors the program never opened: the
//! shim's eventfds and socket duplicates, librdmacm's event channels, libibverbs' completion
//! channel and device context. They are marked the shim's own (`fdtable::Kind::Private`),
//! and a `close` of one fails with EBADF, as on a kernel where the number is not open;
//! `close_range` closes the gaps between them. Before, both ends got ECONNRESET at the loop.

use rdmashim_compat_tests::*;

const BIN: &str = env!("CARGO_BIN_EXE_behave");

#[test]
fn kernel_tcp() {
    behave(BIN, "close_all", None, "127.0.0.1");
}

#[test]
fn under_the_shim() {
    behave(BIN, "close_all", Some(Via::Preload), "127.0.0.1");
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn over_rdma() {
    behave(BIN, "close_all", Some(Via::Preload), &test_ip());
}
