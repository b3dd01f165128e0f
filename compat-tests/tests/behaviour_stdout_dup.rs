//! A server that writes into its connection through the C library's `stdout`: after the first
//! part of an echo it puts the connection at descriptor 1 (`dup2`), writes a few bytes with
//! `fwrite` + `fflush`, puts its own standard output back and echoes the rest — what bash does
//! for every `printf ... >&3` on a `/dev/tcp` connection, and what a server that serves a
//! connection on its standard descriptors in the same image does.
//!
//! glibc's stdio reads and writes through internal calls that no preload sees, so bytes
//! written that way go onto the TCP socket past the shim. Before, a connection under the
//! upgrade lost its place: the peer's shim found more TCP bytes than the switch declared
//! (`SwitchOverBehindTcp`), and both ends got ECONNRESET (bash's `/dev/tcp`, with the shim on
//! both ends). Now a connection put at a standard descriptor goes back to plain TCP first
//! (reason `stdio`; one on the ring switches back at exact offsets) and one made there never
//! leaves it. The scenario (src/bin/behave.rs, `stdout_dup`) asserts what Linux TCP does:
//! the stdio bytes land exactly between the two parts.

use rdmashim_compat_tests::*;

const BIN: &str = env!("CARGO_BIN_EXE_behave");

#[test]
fn kernel_tcp() {
    behave(BIN, "stdout_dup", None, "127.0.0.1");
}

/// Over shared memory (both ends shimmed on 127.0.0.1, on every host): the connection is on the
/// rings when the server puts it at its standard output; both sides count it switched back, and
/// the rest comes over TCP, whole, with the stdio bytes in their place.
#[test]
fn over_shm() {
    behave_switched_back(BIN, "stdout_dup", Rings::Shm);
}

/// RDMA tier: the same over RDMA rings (both ends on `RDMASHIM_TEST_IP`).
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn over_rdma() {
    behave_switched_back(BIN, "stdout_dup", Rings::Rdma);
}
