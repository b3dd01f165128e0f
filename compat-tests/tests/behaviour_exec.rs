//! exec with a live connection: a server echoes part of a large stream, then replaces its
//! image (`execv`) with the socket inherited; the new image echoes the rest. No byte may be
//! lost, repeated or reordered — on TCP, and over the rings, where the shim returns the
//! connection to TCP at exact offsets before the image goes (docs/upgrade.md §7).
//!
//! The scenario (src/bin/behave.rs, `exec`) asserts what Linux TCP does; it runs without the
//! shim, with the shim on both ends and a plain client, and over RDMA.

use rdmashim_compat_tests::*;

const BIN: &str = env!("CARGO_BIN_EXE_behave");

#[test]
fn kernel_tcp() {
    behave(BIN, "exec", None, "127.0.0.1");
}

/// Over shared memory (both ends shimmed on 127.0.0.1, on every host): the connection is on the
/// rings when the server execs; both sides count it switched back, and the new image's bytes
/// reach the client over TCP.
#[test]
fn over_shm() {
    behave_switched_back(BIN, "exec", Rings::Shm);
}

/// The server under the shim, the client plain: the connection stays TCP.
#[test]
fn plain_client() {
    behave_plain_client(BIN, "exec");
}

/// RDMA tier: the same over RDMA rings (both ends on `RDMASHIM_TEST_IP`).
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn over_rdma() {
    behave_switched_back(BIN, "exec", Rings::Rdma);
}
