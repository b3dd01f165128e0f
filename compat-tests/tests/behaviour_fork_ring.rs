//! fork per connection with the connection on the ring: a server echoes part of a large
//! stream, then forks; the child echoes the rest while the parent closes its copy at once
//! (PostgreSQL backends, inetd-style servers after a first exchange). No byte may be lost,
//! repeated or reordered — on TCP, and over the rings, where the parent switches the
//! connection back to TCP at exact offsets when it closes its copy or when the child asks
//! for it (docs/upgrade.md §7).
//!
//! The scenario (src/bin/behave.rs, `fork_ring`) asserts what Linux TCP does; it runs without the
//! shim, with the shim on both ends and a plain client, and over RDMA.

use rdmashim_compat_tests::*;

const BIN: &str = env!("CARGO_BIN_EXE_behave");

#[test]
fn kernel_tcp() {
    behave(BIN, "fork_ring", None, "127.0.0.1");
}

/// Over shared memory (both ends shimmed on 127.0.0.1, on every host): the connection is on the
/// rings when the server forks; both sides count it switched back, and the child's bytes reach
/// the client over TCP.
#[test]
fn over_shm() {
    behave_switched_back(BIN, "fork_ring", Rings::Shm);
}

/// The server under the shim, the client plain: the connection stays TCP.
#[test]
fn plain_client() {
    behave_plain_client(BIN, "fork_ring");
}

/// RDMA tier: the same over RDMA rings (both ends on `RDMASHIM_TEST_IP`).
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn over_rdma() {
    behave_switched_back(BIN, "fork_ring", Rings::Rdma);
}
