//! The ring path of an upgraded connection fails mid-stream (protocol §8.6): the stream goes
//! on over its TCP connection at the exact byte both ends agree on — 24 MiB each way at once,
//! every byte checked — and both sides count the connection's path failed, not a fallback.
//!
//! The scenario (src/bin/behave.rs, `duplex`) runs on kernel TCP first (its expectations are
//! the kernel's), then under the shim with the client's path failed on purpose at its 40th
//! ring read (`RDMASHIM_FAULT=path_fail:40`): over shared memory on every host, over RDMA in
//! the VM tier. (A device removed for real is in the RDMA tier's `rdma_failover` test.)

use rdmashim_compat_tests::*;

const BIN: &str = env!("CARGO_BIN_EXE_behave");

#[test]
fn kernel_tcp() {
    behave(BIN, "duplex", None, "127.0.0.1");
}

#[test]
fn over_shm() {
    behave_path_failed(BIN, Rings::Shm, 40);
}

/// RDMA tier: the same over soft-RoCE, the queue pair torn down under both streams.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn over_rdma() {
    behave_path_failed(BIN, Rings::Rdma, 40);
}
