//! A daemon's close-all loop in the middle of a connection: the client closes every fd below
//! 4096 but its socket (and stdio), then puts `/dev/null` at every number below 256 it now
//! believes free (`dup2`) and closes those, later closes everything around the socket with
//! `close_range`, and goes on echoing. The scenario (src/bin/behave.rs, `close_all`) asserts what Linux TCP does: the
//! stream goes on, intact.
//!
//! Under the shim, an upgraded connection lives on descriptors the program never opened: the
//! shim's eventfds and socket duplicates, librdmacm's event channels, libibverbs' completion
//! channel and device context. They are marked the shim's own (`fdtable::Kind::Private`),
//! and a `close` of one fails with EBADF, as on a kernel where the number is not open;
//! `close_range` closes the gaps between them. Before, both ends got ECONNRESET at the loop.
//! A `dup2` onto one cannot be refused (the number is free on a kernel without the shim), so
//! none may sit where programs put theirs: the transport moves the libraries' descriptors to
//! 1000 and above as soon as they are made, where the shim keeps its own. Before, the
//! libraries kept them at the lowest free numbers and wrote their commands into `/dev/null`
//! once it was put there.

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
