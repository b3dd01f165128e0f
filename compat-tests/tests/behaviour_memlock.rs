//! RLIMIT_MEMLOCK too low on one end (the client drops CAP_IPC_LOCK and allows 64 KiB of locked
//! memory: less than one connection's rings): its connection stays on TCP and works (24 MiB
//! each way, every byte checked), counted `memlock` — the reason decided for that connection
//! when its rings could not be registered, not guessed for the process.
//!
//! Shared-memory rings register nothing: the limit matters only over RDMA (the RDMA tier).

use rdmashim_compat_tests::*;

const BIN: &str = env!("CARGO_BIN_EXE_behave");

#[test]
fn kernel_tcp_with_the_limit() {
    // (the scenario's own expectations hold under the limit without the shim)
    let r = behave_roles_env(
        BIN,
        "duplex",
        Side::Plain,
        Side::Plain,
        "127.0.0.1",
        None,
        &[("BEHAVE_MEMLOCK_KIB", "64")],
    );
    assert!(r.client.is_none() && r.server.is_none());
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn over_rdma() {
    let shim = Side::Shim(Via::Preload);
    let r = behave_roles_env(
        BIN,
        "duplex",
        shim,
        shim,
        &test_ip(),
        None,
        &[("BEHAVE_MEMLOCK_KIB", "64")],
    );
    let c = r.client.as_ref().expect("the client wrote no stats");
    let s = r.server.as_ref().expect("the server wrote no stats");
    assert_eq!(c.connections(), 1, "client: {}", c.summary());
    assert_eq!(c.upgraded(), 0, "client: {}", c.summary());
    assert_eq!(c.reason("memlock"), 1, "client: {}", c.summary());
    assert_eq!(s.upgraded(), 0, "server: {}", s.summary());
    assert_eq!(c.bytes("tcp_rx"), 24 << 20, "client: {}", c.summary());
}
