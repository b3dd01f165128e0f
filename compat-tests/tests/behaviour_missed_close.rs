//! Closes no named hook sees: `syscall(SYS_close)` (libuv's way, so every Node.js program's),
//! and the system call instruction itself (a static helper, io_uring's close), each followed
//! by a new file or socket at the same number (src/bin/behave.rs, `missed_close`).
//!
//! Before: the closed connections stayed open on their rings — the server waited for an EOF
//! that never came — and their numbers' entries still named them, so a file opened at one
//! had its writes carried to the peer. Now `syscall()` runs the close hook, a hooked call that
//! gets a number with an entry still there releases what the entry named (without touching the
//! number's new file), and the engine checks its connections' sockets about once a second for
//! the rest; each of the last two is counted in `fds.missed_closes`.

use rdmashim_compat_tests::*;

const BIN: &str = env!("CARGO_BIN_EXE_behave");
const CONNS: u64 = 5;

fn missed_closes(r: &RoleStats) -> u64 {
    let c = r.client.as_ref().expect("the client wrote no stats");
    c.raw["fds"]["missed_closes"]
        .as_u64()
        .expect("fds.missed_closes")
}

#[test]
fn kernel_tcp() {
    behave_conns(BIN, "missed_close", None, "127.0.0.1", CONNS);
}

/// Over shared memory (both ends shimmed on 127.0.0.1, on every host): see [`on_rings`].
#[test]
fn over_shm() {
    on_rings(Rings::Shm);
}

/// With same-host upgrades off, nothing upgrades on loopback: the connections are TCP
/// candidates, and the one whose number the next socket got is the only close found (the
/// other's entry is a TCP one, harmless).
#[test]
fn loopback_tcp() {
    let shim = Side::Shim(Via::Preload);
    let r = behave_roles_env(
        BIN,
        "missed_close",
        shim,
        shim,
        "127.0.0.1",
        None,
        &[("RDMASHIM_LOCAL", "0")],
    );
    let c = r.client.as_ref().expect("the client wrote no stats");
    assert_eq!(c.connections(), CONNS, "client: {}", c.summary());
    assert_eq!(c.upgraded(), 0, "client: {}", c.summary());
    assert_eq!(missed_closes(&r), 1);
}

#[test]
fn plain_client() {
    behave_plain_client(BIN, "missed_close");
}

/// RDMA tier: the same over RDMA rings (both ends on `RDMASHIM_TEST_IP`).
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn over_rdma() {
    on_rings(Rings::Rdma);
}

/// Every connection upgraded on both sides; the two unseen closes found, one by the next
/// socket and one by the engine's check (the server reads each connection's end, and the
/// files hold only their own bytes).
fn on_rings(rings: Rings) {
    let r = behave_conns(BIN, "missed_close", Some(Via::Preload), &rings.ip(), CONNS);
    assert_eq!(missed_closes(&r), 2);
}
