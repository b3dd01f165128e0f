//! inetd style with the connection on the ring: a server echoes part of a large stream, then
//! forks, and the child execs the program that serves the rest (`behave exec_image FD`)
//! while the parent closes its copy. The child asks its parent for the connection before the
//! exec; the parent switches it back to TCP at exact offsets (docs/upgrade.md §7). No byte
//! may be lost, repeated or reordered.
//!
//! The scenario (src/bin/behave.rs, `fork_exec`) asserts what Linux TCP does; it runs without the
//! shim, with the shim on both ends and a plain client, and over RDMA.

use rdmashim_compat_tests::*;

const BIN: &str = env!("CARGO_BIN_EXE_behave");

#[test]
fn kernel_tcp() {
    behave(BIN, "fork_exec", None, "127.0.0.1");
}

/// Over shared memory (both ends shimmed on 127.0.0.1, on every host): see [`on_rings`].
#[test]
fn over_shm() {
    on_rings(Rings::Shm);
}

/// The server under the shim, the client plain: the connection stays TCP.
#[test]
fn plain_client() {
    behave_plain_client(BIN, "fork_exec");
}

/// RDMA tier: the same over RDMA rings (both ends on `RDMASHIM_TEST_IP`).
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn over_rdma() {
    on_rings(Rings::Rdma);
}

/// The connection is on `rings` when the server forks; both sides count it switched back, and
/// the child's bytes reach the client over TCP.
fn on_rings(rings: Rings) {
    let r = behave_switched_back(BIN, "fork_exec", rings);
    // The child's record (written at its exec, then by the new image at its exit): the new
    // image read the rest through hooked calls, none of it from a ring. (Its bytes are not
    // counted: an inherited socket no hook has classified yet passes through uncounted.)
    let [child] = r.server_forks.as_slice() else {
        panic!("one record of the server's child: {:#?}", r.server_forks);
    };
    assert!(
        child.calls("recv") > 0 && rings.bytes(child) == 0,
        "the child served the rest over TCP: {} {:?}",
        child.summary(),
        child.calls
    );
}
