//! iperf3 server and client, both under the shim: parallel streams, reverse, bidirectional,
//! zero-copy (sendfile); some cases through `LD_PRELOAD`, others through `rdmashim run`.
//!
//! Same-host upgrades are off for every process here (`RDMASHIM_LOCAL=0`): this checks the
//! shim's TCP path — every hook the program needs fires and every byte is counted — which
//! must hold for any connection that stays TCP. (Over shared memory: tests/upgrade_*.rs and
//! tests/same_host.rs.)

use rdmashim_compat_tests::*;
use serde_json::Value;
use std::time::Duration;

fn case(name: &str, client_args: &[&str], data_streams: u64, via: Via) {
    let Some(iperf) = require("iperf3") else {
        return;
    };
    let s = Scratch::new(&format!("iperf3-{name}"));
    let port = free_port().to_string();
    // -1: serve one test and exit normally (writing its stats).
    let mut cmd = under_shim(via, &iperf, &s, "server");
    cmd.env("RDMASHIM_LOCAL", "0");
    cmd.args(["-s", "-1", "-B", "127.0.0.1", "-p", &port]);
    let mut server = Server::start(cmd, "iperf3 -s", "TERM");
    wait_listening(port.parse().unwrap(), &mut server, Duration::from_secs(20));

    let mut c = under_shim(via, &iperf, &s, "client");
    c.env("RDMASHIM_LOCAL", "0");
    c.args(["-c", "127.0.0.1", "-p", &port, "-t", "2", "-J"])
        .args(client_args);
    let out = run_ok(c, Duration::from_secs(60));
    let j: Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("iperf3 -J output: {e}: {out}"));
    assert!(j.get("error").is_none(), "iperf3 error: {}", j["error"]);
    let received = j["end"]["sum_received"]["bytes"].as_u64().unwrap_or(0);
    assert!(
        received > 1_000_000,
        "{name}: only {received} bytes received"
    );

    // The one-off server exits by itself.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while s.stats("server").is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "iperf3 server wrote no stats"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(server);

    let reason = loopback_tcp_reason();
    let srv = s.one_stats("server");
    let cli = s.one_stats("client");
    // One control connection plus the data streams, on both sides.
    assert_eq!(cli.connections(), 1 + data_streams, "client: {:?}", cli.raw);
    assert_eq!(srv.connections(), 1 + data_streams, "server: {:?}", srv.raw);
    cli.assert_all_fallback(&reason);
    srv.assert_all_fallback(&reason);
    // Bytes: nobody receives more than the other side sent (iperf3 closes its data streams
    // with bytes still in flight, so no equality), and the shim saw at least what iperf3
    // itself reports as sent and received (data streams; the control connection adds more).
    assert!(srv.bytes("tcp_rx") <= cli.bytes("tcp_tx"), "{name}");
    assert!(cli.bytes("tcp_rx") <= srv.bytes("tcp_tx"), "{name}");
    let sum = |k: &str| -> u64 {
        [k.to_string(), format!("{k}_bidir_reverse")]
            .iter()
            .filter_map(|k| j["end"][k]["bytes"].as_u64())
            .sum()
    };
    let shim_rx = srv.bytes("tcp_rx") + cli.bytes("tcp_rx");
    let shim_tx = srv.bytes("tcp_tx") + cli.bytes("tcp_tx");
    assert!(
        shim_rx >= sum("sum_received"),
        "{name}: shim rx {shim_rx} < iperf3 {}",
        sum("sum_received")
    );
    assert!(
        shim_tx >= sum("sum_sent"),
        "{name}: shim tx {shim_tx} < iperf3 {}",
        sum("sum_sent")
    );
    // libiperf's select loop uses the fortified FD_SET (__fdelt_chk).
    srv.assert_fired(&[
        "socket",
        "bind",
        "listen",
        "accept",
        "read",
        "write",
        "select",
        "__fdelt_chk",
        "setsockopt",
        "getsockopt",
        "close",
        "fcntl",
    ]);
    cli.assert_fired(&[
        "socket",
        "connect",
        "read",
        "write",
        "select",
        "__fdelt_chk",
        "close",
    ]);
    if client_args.contains(&"-Z") {
        cli.assert_fired(&["sendfile"]);
    }
}

#[test]
fn parallel_4() {
    case("p4", &["-P", "4"], 4, Via::Preload);
}

#[test]
fn reverse() {
    case("reverse", &["-R"], 1, Via::Launcher);
}

#[test]
fn bidir() {
    case("bidir", &["--bidir"], 2, Via::Launcher);
}

#[test]
fn zerocopy_sendfile() {
    case("zerocopy", &["-Z"], 1, Via::Preload);
}
