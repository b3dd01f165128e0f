//! io_uring set up with inline system calls, liburing's way, which no hook sees
//! (src/bin/behave.rs, `uring_io` and `uring_late`). The engine looks for an instance (an
//! `anon_inode:[io_uring]` descriptor) before it takes up a connection and about once a second
//! while it has some.
//!
//! - `uring_io`: the instance exists before the first accept and carries every byte (receive,
//!   send, close; the third connection's accept too): under the shim every connection the
//!   server sees stays TCP (`io_uring`) and every echo is whole.
//! - `uring_late`: set up mid-connection while it is on the rings: found by the engine's
//!   periodic look (a timer of its own) while the server pauses, the connection goes back to
//!   TCP at exact offsets, the next one stays TCP.

use rdmashim_compat_tests::*;

const BIN: &str = env!("CARGO_BIN_EXE_behave");

#[test]
fn kernel_tcp() {
    behave_conns(BIN, "uring_io", None, "127.0.0.1", 3);
    behave_conns(BIN, "uring_late", None, "127.0.0.1", 2);
}

/// On loopback nothing upgrades: the server counts the two connections its accept hook saw
/// (io_uring's accept is unseen), the client all three.
#[test]
fn under_the_shim() {
    let shim = Side::Shim(Via::Preload);
    let r = behave_roles(BIN, "uring_io", shim, shim, "127.0.0.1", None);
    let c = r.client.as_ref().expect("the client wrote no stats");
    let s = r.server.as_ref().expect("the server wrote no stats");
    assert_eq!(c.connections(), 3, "client: {}", c.summary());
    assert_eq!(s.connections(), 2, "server: {}", s.summary());
    assert_eq!(c.upgraded() + s.upgraded(), 0);
    behave_conns(BIN, "uring_late", Some(Via::Preload), "127.0.0.1", 2);
}

#[test]
fn plain_client() {
    behave_plain_client(BIN, "uring_io");
    behave_plain_client(BIN, "uring_late");
}

/// RDMA tier: the server's engine finds the instance at its first connection, before any
/// upgrade: both connections its hooks saw stay TCP with `io_uring`; nothing went over a ring
/// on either side.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn over_rdma() {
    let shim = Side::Shim(Via::Preload);
    let r = behave_roles(BIN, "uring_io", shim, shim, &test_ip(), Some(SETTLE));
    let c = r.client.as_ref().expect("the client wrote no stats");
    let s = r.server.as_ref().expect("the server wrote no stats");
    assert_eq!(s.connections(), 2, "server: {}", s.summary());
    assert_eq!(s.reason("io_uring"), 2, "server: {}", s.summary());
    assert_eq!(c.connections(), 3, "client: {}", c.summary());
    assert_eq!(c.upgraded(), 0, "client: {}", c.summary());
    assert_eq!(c.ring_bytes() + s.ring_bytes(), 0);
}

/// RDMA tier: found by the engine's periodic look while the server pauses.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn late_over_rdma() {
    behave_rdma_ended(BIN, "uring_late", "io_uring");
}
