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

/// Over shared memory (both ends shimmed on 127.0.0.1, on every host): see [`uring_io`] and
/// [`uring_late`].
#[test]
fn over_shm() {
    uring_io(Rings::Shm);
    uring_late(Rings::Shm);
}

#[test]
fn plain_client() {
    behave_plain_client(BIN, "uring_io");
    behave_plain_client(BIN, "uring_late");
}

/// RDMA tier: `uring_io` over RDMA rings (both ends on `RDMASHIM_TEST_IP`).
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn over_rdma() {
    uring_io(Rings::Rdma);
}

/// RDMA tier: `uring_late` over RDMA rings.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn late_over_rdma() {
    uring_late(Rings::Rdma);
}

/// `uring_io` where connections upgrade to `rings`: the server's engine finds the instance at
/// its first connection, before any upgrade: both connections its hooks saw (io_uring's
/// accept is unseen) stay TCP with `io_uring`; nothing went over a ring on either side.
fn uring_io(rings: Rings) {
    let shim = Side::Shim(Via::Preload);
    let r = behave_roles(BIN, "uring_io", shim, shim, &rings.ip(), Some(SETTLE));
    let c = r.client.as_ref().expect("the client wrote no stats");
    let s = r.server.as_ref().expect("the server wrote no stats");
    assert_eq!(s.connections(), 2, "server: {}", s.summary());
    assert_eq!(s.reason("io_uring"), 2, "server: {}", s.summary());
    assert_eq!(c.connections(), 3, "client: {}", c.summary());
    assert_eq!(c.upgraded(), 0, "client: {}", c.summary());
    assert_eq!(rings.bytes(c) + rings.bytes(s), 0);
}

/// `uring_late` where connections upgrade to `rings`: found by the engine's periodic look
/// while the server pauses ([`behave_upgrades_ended`]).
fn uring_late(rings: Rings) {
    behave_upgrades_ended(BIN, "uring_late", "io_uring", rings);
}
