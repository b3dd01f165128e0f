//! A server that sets up io_uring mid-connection through `syscall(SYS_io_uring_setup)` (the
//! Rust io-uring crate's and libuv's way), then echoes the rest and serves a second connection
//! (src/bin/behave.rs, `io_uring`). io_uring's I/O on a socket reaches the kernel unseen by any
//! hook, so the shim ends RDMA for the process before the instance exists: the connection on
//! the rings goes back to TCP at exact offsets, the next one stays TCP (`io_uring`).

use rdmashim_compat_tests::*;

const BIN: &str = env!("CARGO_BIN_EXE_behave");

#[test]
fn kernel_tcp() {
    behave_conns(BIN, "io_uring", None, "127.0.0.1", 2);
}

/// Over shared memory (both ends shimmed on 127.0.0.1, on every host): the server sets up
/// io_uring while its first connection is on the rings ([`behave_upgrades_ended`]).
#[test]
fn over_shm() {
    behave_upgrades_ended(BIN, "io_uring", "io_uring", Rings::Shm);
}

#[test]
fn plain_client() {
    behave_plain_client(BIN, "io_uring");
}

/// RDMA tier: the same over RDMA rings (both ends on `RDMASHIM_TEST_IP`).
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn over_rdma() {
    behave_upgrades_ended(BIN, "io_uring", "io_uring", Rings::Rdma);
}
