//! Descriptors passed to another program over a unix socket (`SCM_RIGHTS`), and a listener
//! inherited through an exec:
//! - `pass_fd`: the server echoes the first 2 MiB of a 6 MiB stream, passes the connection to
//!   another program (a connection-handoff daemon: dovecot's login processes, postfix's
//!   postscreen, PgBouncer's online restart) and closes its copy; the receiver echoes the rest.
//! - `pass_fd_early`: the connection is passed as soon as it is accepted (its upgrade
//!   undecided); the receiver serves all of it.
//! - `pass_listener`: the listening socket is passed (haproxy `-x`, envoy's hot restart) and
//!   the receiver accepts and serves the client's connection.
//! - `activated_listener`: the listening socket is inherited through an exec (a server that
//!   re-execs itself); the new image accepts and serves.
//! - `systemd_listener`: as systemd's socket activation: the listening socket is made without
//!   the shim's upgrades and given to the service at descriptor 3 with `LISTEN_PID` and
//!   `LISTEN_FDS`; the service sets itself up for 1.5 s, then accepts and serves a client
//!   whose connection came at 1 s (queued before any accept: only a socket that keeps SYNs
//!   from the service's start can upgrade it).
//!
//! The scenarios (src/bin/behave.rs, module `passing`) assert what Linux TCP does: every byte
//! echoed, in order. Under the shim a connection on the rings goes back to TCP at exact offsets
//! before the message that passes it leaves, and an undecided one stays TCP (`fd_passed`): the
//! receiver cannot reach the sender's rings. A passed or inherited listener's connections are
//! upgraded in the process that accepts them.
//!
//! Before: the sender's close of its copy closed the connection on its ring; the receiver read
//! EOF at once and the client's next write got EPIPE (a Python handoff server, tried by hand).

use rdmashim_compat_tests::*;

const BIN: &str = env!("CARGO_BIN_EXE_behave");

const SCENARIOS: [&str; 5] = [
    "pass_fd",
    "pass_fd_early",
    "pass_listener",
    "activated_listener",
    "systemd_listener",
];

#[test]
fn kernel_tcp() {
    for sc in SCENARIOS {
        behave_roles(BIN, sc, Side::Plain, Side::Plain, "127.0.0.1", None);
    }
}

/// The server under the shim, the client plain: nothing upgrades, every byte is echoed.
#[test]
fn plain_client() {
    for sc in SCENARIOS {
        behave_plain_client(BIN, sc);
    }
}

/// Over shared memory: the connection is on the rings when it is passed (the server settles
/// first); both sides count it switched back, and the client read the rest from TCP.
#[test]
fn passed_on_the_rings_over_shm() {
    behave_switched_back(BIN, "pass_fd", Rings::Shm);
}

/// RDMA tier: the same over RDMA rings.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn passed_on_the_rings_over_rdma() {
    behave_switched_back(BIN, "pass_fd", Rings::Rdma);
}

/// Passed undecided: the server's side stays TCP (`fd_passed`) and the client's never leaves
/// it — or, where the client's request was already being answered when the message left, both
/// went onto the rings and back. Either way the scenario checked every byte.
fn passed_undecided(rings: Rings) {
    let shim = Side::Shim(Via::Preload);
    let r = behave_roles(BIN, "pass_fd_early", shim, shim, &rings.ip(), None);
    let s = r.server.as_ref().expect("the server wrote no stats");
    let c = r.client.as_ref().expect("the client wrote no stats");
    if answered_before_the_fork(s, c) {
        return;
    }
    assert_eq!(s.connections(), 1, "server: {}", s.summary());
    assert_eq!(s.reason("fd_passed"), 1, "server: {}", s.summary());
    assert_eq!(c.connections(), 1, "client: {}", c.summary());
    assert_eq!(c.upgraded(), 0, "client: {}", c.summary());
    assert_eq!(
        s.shm_bytes() + s.ring_bytes() + c.shm_bytes() + c.ring_bytes(),
        0,
        "no ring bytes: {} / {}",
        s.summary(),
        c.summary()
    );
}

#[test]
fn passed_undecided_over_shm() {
    passed_undecided(Rings::Shm);
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn passed_undecided_over_rdma() {
    passed_undecided(Rings::Rdma);
}

/// A listener passed or inherited: the process that accepts serves the connection on rings of
/// its own (its own rdma_cm listener or rendezvous name: the sender's holds the port), and the
/// echo went through them (counted by the device too, over RDMA); the sender accepted nothing.
fn listener_upgrades(scenario: &str, rings: Rings) {
    let device = rings.device();
    let shim = Side::Shim(Via::Preload);
    // (systemd, which makes the socket, runs without the shim's upgrades)
    let sender = match scenario {
        "systemd_listener" => Side::Disabled,
        _ => shim,
    };
    let r = behave_roles(BIN, scenario, shim, sender, &rings.ip(), Some(SETTLE));
    let sender = r.server.as_ref().expect("the server wrote no stats");
    assert_eq!(
        sender.connections(),
        0,
        "{scenario} sender: {}",
        sender.summary()
    );
    assert_eq!(
        r.server_forks.len(),
        1,
        "{scenario}: the receiver's record: {:#?}",
        r.server_forks
    );
    let c = r.client.as_ref().expect("the client wrote no stats");
    for (role, st) in [("client", c), ("receiver", &r.server_forks[0])] {
        assert_eq!(st.connections(), 1, "{scenario} {role}: {}", st.summary());
        st.assert_all_upgraded();
        assert_eq!(st.switched_back, 0, "{scenario} {role}: {}", st.summary());
        // (most of the 6 MiB echo comes after the settle pause)
        rings.assert_at_least(st, 1 << 20, 1 << 20);
    }
    if let Some(d) = device {
        d.delta().assert_carried(c.ring_bytes());
    }
}

#[test]
fn a_passed_listener_upgrades_over_shm() {
    listener_upgrades("pass_listener", Rings::Shm);
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn a_passed_listener_upgrades_over_rdma() {
    listener_upgrades("pass_listener", Rings::Rdma);
}

#[test]
fn an_activated_listener_upgrades_over_shm() {
    listener_upgrades("activated_listener", Rings::Shm);
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn an_activated_listener_upgrades_over_rdma() {
    listener_upgrades("activated_listener", Rings::Rdma);
}

/// Before: the service's connections never upgraded (its clients counted `plain_peer`): the
/// socket kept no SYNs and had no listener for upgrade requests beside it. With the adoption
/// at the first accept alone, this connection, queued before it, still did not.
#[test]
fn a_systemd_activated_listener_upgrades_over_shm() {
    listener_upgrades("systemd_listener", Rings::Shm);
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn a_systemd_activated_listener_upgrades_over_rdma() {
    listener_upgrades("systemd_listener", Rings::Rdma);
}
