//! A file opened while another thread sleeps in a blocking recv gets the lowest free descriptor
//! number — also when the connection is on the rings and the recv sleeps in the shim's own
//! wait, whose signalfd is one of the shim's descriptors, kept high and reused.
//!
//! The scenario (src/bin/behave.rs, `lowest_fd`) asserts what Linux TCP does; it runs without
//! the shim (so the expectations are the kernel's own), over shared memory and over RDMA.

use rdmashim_compat_tests::*;

const BIN: &str = env!("CARGO_BIN_EXE_behave");

#[test]
fn kernel_tcp() {
    behave(BIN, "lowest_fd", None, "127.0.0.1");
}

/// Checks the client's connection went over `rings` and its recvs slept in the shim's wait.
fn check(rings: Rings) {
    let r = behave(BIN, "lowest_fd", Some(Via::Preload), &rings.ip());
    let client = r.client.expect("client stats");
    assert!(
        rings.bytes(&client) > 0,
        "the connection did not go over the rings: {}",
        client.summary()
    );
    assert!(
        client.waits("slept") >= 3,
        "the client's recvs did not sleep in the shim's wait: {}",
        client.raw["waits"]
    );
}

/// Over shared memory (both ends shimmed on 127.0.0.1, on every host).
#[test]
fn over_shm() {
    check(Rings::Shm);
}

/// RDMA tier: the same over RDMA rings.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn over_rdma() {
    check(Rings::Rdma);
}
