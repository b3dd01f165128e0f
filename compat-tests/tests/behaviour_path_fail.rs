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

/// The client has read the server's whole stream (256 KiB, its end too) from the ring and had
/// its EOF, and goes on writing its own 24 MiB, when the server's path fails (at its 300th
/// ring read): the server's record and the bytes it repeats of what the client read arrive
/// on a socket the client's program reads no more. The shim reads them itself; before, the
/// client's close left them unread, its kernel reset the connection, and the server lost the
/// end of the client's stream (ECONNRESET: found across two hosts, `t14`).
fn after_the_readers_end(rings: Rings) {
    let shim = Side::Shim(Via::Preload);
    let short = ("BEHAVE_DUPLEX_SERVER_KIB", "256");
    let r = behave_roles_envs(
        BIN,
        "duplex",
        (shim, &[short]),
        (shim, &[short, ("RDMASHIM_FAULT", "path_fail:300")]),
        &rings.ip(),
        // (the server's stream starts on the ring)
        Some(SETTLE),
    );
    for (role, st) in [("client", &r.client), ("server", &r.server)] {
        let st = st.as_ref().expect("stats");
        assert_eq!(st.connections(), 1, "{role}: {}", st.summary());
        assert_eq!(st.upgraded(), 1, "{role}: {}", st.summary());
        assert_eq!(st.path_failed, 1, "{role}: path failed: {}", st.summary());
    }
    let c = r.client.as_ref().expect("stats");
    assert!(
        rings.rx(c) == 256 << 10 && c.bytes("tcp_rx") == 0,
        "the client read all of the server's stream from the ring: {}",
        c.summary()
    );
}

#[test]
fn after_the_readers_end_over_shm() {
    after_the_readers_end(Rings::Shm);
}

/// RDMA tier: the same over soft-RoCE.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn after_the_readers_end_over_rdma() {
    after_the_readers_end(Rings::Rdma);
}
