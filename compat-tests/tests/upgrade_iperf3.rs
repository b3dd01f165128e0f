//! iperf3 server and client, both under the shim, on `RDMASHIM_TEST_IP` (RDMA tier) or on
//! 127.0.0.1 (shared memory, host tier): the control
//! connection and every data stream are upgraded, and what iperf3 reports as sent and received
//! went through the rings, direction by direction; the device's packet counters grew
//! accordingly. Parallel streams, reverse and bidirectional; through `LD_PRELOAD` and through
//! `rdmashim run`.
//!
//! The upgrade is asynchronous: a data stream's first bytes may go by TCP. iperf3's `-O` omits
//! the first seconds from its report, so the reported *sent* bytes are those written after every
//! connection's upgrade was decided (`-O` ≥ the upgrade deadline): all of them must be ring
//! bytes. The reported *received* bytes may still include the TCP backlog the peer wrote before
//! its switch-over (the receiver reads it first, in order): with `--bidir`, iperf3's one thread
//! writes up to ten blocks forward per block it reads back, so on a slow host the reverse
//! stream's backlog of several megabytes is still being read seconds later. A receiver's ring
//! bytes are therefore bounded below by what it reported beyond everything the peer ever wrote
//! to TCP, and each data-carrying direction's sender must have written through its ring.
//!
//! A ring over RDMA starts small (16 KiB) and grows only as its reader takes bytes from it, so
//! a sender whose peer is still reading the TCP backlog can put little in it. The backlog is
//! what the kernel's socket buffers held at the switch; left to autotuning they reach several
//! megabytes, which the starved reverse stream of `--bidir` took longer than the measured
//! seconds to read on a slow host. The bidirectional cases therefore fix the socket buffers
//! (`-w`), as an application that sizes its buffers does: the backlog is then bounded, and the
//! rest of the test is on the rings.

use rdmashim_compat_tests::*;
use serde_json::Value;
use std::time::{Duration, Instant};

/// Ring bytes a sender must have written in a direction that carries a data stream: far above
/// the control connection's traffic (a few hundred bytes), far below what a stream moves in
/// iperf3's measured seconds over the ring.
const RING_DATA_MIN: u64 = 64 * 1024;

/// The bidirectional cases' socket buffers (iperf3 `-w`, set on both ends' data sockets): the
/// kernel doubles it, so at most about 1 MiB of a direction is on TCP after the switch.
const BIDIR_WINDOW: &str = "256K";

fn case(name: &str, client_args: &[&str], data_streams: u64, via: Via, rings: Rings) {
    let ip = rings.ip();
    let Some(iperf) = require("iperf3") else {
        return;
    };
    let s = Scratch::new(&format!("up-iperf3-{name}"));
    let device = rings.device();
    let port = free_port_on(&ip).to_string();
    // -1: serve one test and exit normally (writing its stats).
    let mut cmd = under_shim(via, &iperf, &s, "server");
    cmd.args(["-s", "-1", "-B", &ip, "-p", &port]);
    let mut server = Server::start(cmd, "iperf3 -s", "TERM");
    wait_listening(port.parse().unwrap(), &mut server, Duration::from_secs(30));

    let omit = SETTLE.as_secs_f64().ceil().to_string();
    let mut c = under_shim(via, &iperf, &s, "client");
    c.args(["-c", &ip, "-p", &port, "-t", "3", "-O", &omit, "-J"])
        .args(client_args);
    let out = run_ok(c, Duration::from_secs(120));
    let j: Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("iperf3 -J output: {e}: {out}"));
    assert!(j.get("error").is_none(), "iperf3 error: {}", j["error"]);

    let deadline = Instant::now() + Duration::from_secs(30);
    while s.stats("server").is_empty() {
        assert!(Instant::now() < deadline, "iperf3 server wrote no stats");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(server);

    let srv = s.one_stats("server");
    let cli = s.one_stats("client");
    eprintln!("{name}: {}", srv.summary());
    eprintln!("{name}: {}", cli.summary());
    // iperf3's report (omitted seconds excluded), per direction: (sent, received).
    let rep = |k: &str| -> u64 { j["end"][k]["bytes"].as_u64().unwrap_or(0) };
    let reported = (rep("sum_sent"), rep("sum_received"));
    let (up, down) = if client_args.contains(&"-R") {
        ((0, 0), reported)
    } else if client_args.contains(&"--bidir") {
        let back = (
            rep("sum_sent_bidir_reverse"),
            rep("sum_received_bidir_reverse"),
        );
        (reported, back)
    } else {
        (reported, (0, 0))
    };
    eprintln!("{name}: iperf3 reports client->server {up:?}, server->client {down:?}");
    assert!(
        up.1 + down.1 > 1_000_000,
        "{name}: iperf3 reports only {} bytes received",
        up.1 + down.1
    );

    // One control connection plus the data streams on each side, all upgraded.
    for (side, st) in [("client", &cli), ("server", &srv)] {
        assert_eq!(
            st.connections(),
            1 + data_streams,
            "{name} {side}: {}",
            st.summary()
        );
        st.assert_all_upgraded();
        assert_eq!(
            st.upgraded(),
            1 + data_streams,
            "{name} {side}: {}",
            st.summary()
        );
        rings.assert_carried(st, &format!("{name} {side}"));
    }
    // What iperf3 counted as sent after the omitted seconds went through the rings; what it
    // counted as received did too, apart from at most the peer's whole TCP part (its backlog).
    rings.assert_at_least(&cli, up.0, down.1.saturating_sub(srv.bytes("tcp_tx")));
    rings.assert_at_least(&srv, down.0, up.1.saturating_sub(cli.bytes("tcp_tx")));
    // Every direction that carries a data stream carried it through the sender's ring (beyond
    // the control connection's few hundred bytes).
    for (dir, reported, sender, receiver) in [
        ("client->server", up, &cli, &srv),
        ("server->client", down, &srv, &cli),
    ] {
        if reported.1 > 0 {
            assert!(
                rings.tx(sender) >= RING_DATA_MIN,
                "{name} {dir}: the sender wrote only {} ring bytes (the receiver read {} of its \
                 {} TCP bytes): {}",
                rings.tx(sender),
                receiver.bytes("tcp_rx"),
                sender.bytes("tcp_tx"),
                sender.summary()
            );
        }
    }
    // Nobody received more than the other side sent (ring and TCP together).
    let rx = |st: &Stats| rings.rx(st) + st.bytes("tcp_rx");
    let tx = |st: &Stats| rings.tx(st) + st.bytes("tcp_tx");
    assert!(rx(&srv) <= tx(&cli), "{name}");
    assert!(rx(&cli) <= tx(&srv), "{name}");
    // The device carried at least those ring bytes (RDMA).
    if let Some(d) = device {
        d.delta().assert_carried(cli.ring_bytes());
    }
}

/// Over shared memory (both ends on 127.0.0.1, on every host): four parallel streams.
#[test]
fn parallel_4_over_shm() {
    case("p4-shm", &["-P", "4"], 4, Via::Preload, Rings::Shm);
}

/// Over shared memory: reverse (the server sends), through the launcher.
#[test]
fn reverse_over_shm() {
    case("reverse-shm", &["-R"], 1, Via::Launcher, Rings::Shm);
}

/// Over shared memory: both directions at once.
#[test]
fn bidir_over_shm() {
    case(
        "bidir-shm",
        &["--bidir", "-w", BIDIR_WINDOW],
        2,
        Via::Launcher,
        Rings::Shm,
    );
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn parallel_4_over_rdma() {
    case("p4", &["-P", "4"], 4, Via::Preload, Rings::Rdma);
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn reverse_over_rdma() {
    case("reverse", &["-R"], 1, Via::Launcher, Rings::Rdma);
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn bidir_over_rdma() {
    case(
        "bidir",
        &["--bidir", "-w", BIDIR_WINDOW],
        2,
        Via::Launcher,
        Rings::Rdma,
    );
}
