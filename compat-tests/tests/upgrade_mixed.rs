//! RDMA tier: the mixed matrix on `RDMASHIM_TEST_IP`. Whoever runs the shim and whoever does
//! not, the application's results are the same; only the stats differ, with these reasons:
//!
//! | client                | server                 | client's stats                          | server's stats       |
//! |-----------------------|------------------------|-----------------------------------------|----------------------|
//! | shim                  | shim                   | upgraded                                | upgraded             |
//! | shim                  | plain                  | `plain_peer`, then `negative_cache`     | —                    |
//! | plain                 | shim                   | —                                       | `plain_peer`         |
//! | `RDMASHIM_DISABLE=1`  | shim                   | `disabled`                              | `plain_peer`         |
//! | shim                  | `RDMASHIM_DISABLE=1`   | `plain_peer`                            | `disabled`           |
//! | shim, no libibverbs   | shim                   | `libraries_missing`                     | `no_upgrade_request` |
//! | shim                  | shim, no libibverbs    | `plain_peer`                            | `libraries_missing`  |
//!
//! A plain end is known without any rdma_cm attempt (`docs/protocol.md` 2.9): a server by the
//! client's unmarked SYN, a client by the server's first bytes, which carry no token (so the
//! client never dials). (`plain_peer` for a process's first connection to a server; later ones
//! within the negative cache's 60 s: `negative_cache`.) And loopback stays
//! `not_upgradable_address`, as on any host.
//!
//! The `behave` program's `echo` scenario (and `nonblocking_connect`/`select`, whose server
//! speaks first) plays each pair; curl and Python's http.server make several connections from
//! one process for the negative cache. No test measures time: a shim client before a plain
//! server must simply complete, as it would without the shim.

use rdmashim_compat_tests::*;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_behave");

/// The `echo` scenario against the kernel and under the shim on loopback (host tier): the
/// scenario the matrix below is built on holds for Linux TCP.
#[test]
fn echo_scenario_on_loopback() {
    behave(BIN, "echo", None, "127.0.0.1");
    behave(BIN, "echo", Some(Via::Preload), "127.0.0.1");
}

fn client_of(r: &RoleStats) -> &Stats {
    let c = r.client.as_ref().expect("the client wrote no stats");
    assert_eq!(c.connections(), 1, "client: {}", c.summary());
    c
}

fn server_of(r: &RoleStats) -> &Stats {
    let s = r.server.as_ref().expect("the server wrote no stats");
    assert_eq!(s.connections(), 1, "server: {}", s.summary());
    s
}

/// Both shimmed: the control case of the matrix.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn both_shimmed_upgrade() {
    let ip = test_ip();
    let device = DeviceCounters::read(&test_device());
    let r = behave_roles(
        BIN,
        "echo",
        Side::Shim(Via::Preload),
        Side::Shim(Via::Launcher),
        &ip,
        Some(SETTLE),
    );
    let (c, s) = (client_of(&r), server_of(&r));
    c.assert_all_upgraded();
    s.assert_all_upgraded();
    // The client's first 64 KiB block left at once (TCP, maybe); after the server's pause
    // everything else went through the rings: 15 blocks up, all 16 back.
    c.assert_ring_at_least(15 << 16, 16 << 16);
    s.assert_ring_at_least(16 << 16, 15 << 16);
    device.delta().assert_carried(c.ring_bytes());
}

/// A shim client, a plain server: the server's first bytes carry no token, so the client
/// never dials and stays on TCP without the application noticing. Also with a server that
/// speaks first, and with a non-blocking connect: the client simply completes. (The two short
/// scenarios may end — the process may exit — before the client read anything of the
/// server's: then the connection counts `closed_early`; it never counts as upgraded or as
/// anything else. In the echo the client reads the server's answer.)
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn shim_client_plain_server() {
    client_stays_tcp(Side::Shim(Via::Preload), Side::Plain, "plain_peer");
}

/// The echo, select and nonblocking_connect scenarios with `client` against `server`, where
/// the client's connection stays on TCP for `reason`: exactly that in the echo (its server
/// pauses after accepting, so the reason is known first), that or `closed_early` in the two
/// short ones (the process may end before), never upgraded. Returns each scenario's stats.
fn client_stays_tcp(client: Side, server: Side, reason: &str) -> Vec<RoleStats> {
    let ip = test_ip();
    let mut all = Vec::new();
    for scenario in ["echo", "select", "nonblocking_connect"] {
        let r = behave_roles(
            BIN,
            scenario,
            client,
            server,
            &ip,
            (scenario == "echo").then_some(SETTLE),
        );
        let c = client_of(&r);
        if scenario == "echo" {
            c.assert_fallback_reasons(&[(reason, 1)]);
        } else {
            assert!(
                c.upgraded == 0 && c.reason(reason) + c.reason("closed_early") == 1,
                "{scenario}: {}",
                c.summary()
            );
        }
        all.push(r);
    }
    all
}

/// A plain client, a shim server: its SYN carried no mark, so the server sends no token and
/// waits for no request.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn plain_client_shim_server() {
    let ip = test_ip();
    for scenario in ["echo", "select"] {
        let r = behave_roles(
            BIN,
            scenario,
            Side::Plain,
            Side::Shim(Via::Preload),
            &ip,
            None,
        );
        server_of(&r).assert_fallback_reasons(&[("plain_peer", 1)]);
    }
}

/// Both shimmed, the client with `RDMASHIM_DISABLE=1`.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn disabled_client() {
    let ip = test_ip();
    let r = behave_roles(
        BIN,
        "echo",
        Side::Disabled,
        Side::Shim(Via::Preload),
        &ip,
        None,
    );
    client_of(&r).assert_fallback_reasons(&[("disabled", 1)]);
    server_of(&r).assert_fallback_reasons(&[("plain_peer", 1)]);
}

/// Both shimmed, the server with `RDMASHIM_DISABLE=1`: it has no rdma_cm listener, so it
/// sends no token, and the client never dials.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn disabled_server() {
    server_without_rdma(Side::Disabled, "disabled");
}

/// The echo against a shimmed `server` that has no rdma_cm listener: no token comes, the
/// client counts `plain_peer`, the server `reason`.
fn server_without_rdma(server: Side, reason: &str) {
    let ip = test_ip();
    let r = behave_roles(
        BIN,
        "echo",
        Side::Shim(Via::Preload),
        server,
        &ip,
        Some(SETTLE),
    );
    client_of(&r).assert_fallback_reasons(&[("plain_peer", 1)]);
    server_of(&r).assert_fallback_reasons(&[(reason, 1)]);
}

/// Both shimmed, the client on a host without libibverbs (hidden in its mount namespace):
/// the engine finds the libraries missing after the connection was queued, and decides it
/// (`libraries_missing`) — the connection simply stays TCP. (As with a plain server, the
/// two short scenarios may end before that verdict: then `closed_early`.)
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn libraries_missing_client() {
    let runs = client_stays_tcp(
        Side::NoLibraries,
        Side::Shim(Via::Preload),
        "libraries_missing",
    );
    for r in &runs {
        server_of(r).assert_fallback_reasons(&[("no_upgrade_request", 1)]);
    }
}

/// Both shimmed, the server without libibverbs: its listen() finds the libraries missing, so
/// there is no rdma_cm listener and no token.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn libraries_missing_server() {
    server_without_rdma(Side::NoLibraries, "libraries_missing");
}

/// Loopback is never upgraded, also where there is an RDMA device.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn loopback_stays_tcp() {
    let _ = test_device();
    let r = behave_roles(
        BIN,
        "echo",
        Side::Shim(Via::Preload),
        Side::Shim(Via::Preload),
        "127.0.0.1",
        None,
    );
    client_of(&r).assert_fallback_reasons(&[("not_upgradable_address", 1)]);
    server_of(&r).assert_fallback_reasons(&[("not_upgradable_address", 1)]);
}

/// Files for http.server: three small ones, each with its own content.
fn www(s: &Scratch) -> std::path::PathBuf {
    let www = s.dir.join("www");
    std::fs::create_dir(&www).unwrap();
    for i in 0..3 {
        std::fs::write(www.join(format!("f{i}.txt")), format!("file {i}\n")).unwrap();
    }
    www
}

/// `python3 -m http.server` on `ip` (HTTP/1.0: one connection per request), plain or shimmed.
fn http_server(s: &Scratch, ip: &str, shim: bool) -> (Server, String) {
    let py = python();
    let port = free_port_on(ip).to_string();
    let mut cmd = if shim {
        shimmed(&py, s, "httpd")
    } else {
        let mut c = std::process::Command::new(&py);
        c.env_remove("LD_PRELOAD");
        c
    };
    cmd.args(["-m", "http.server", "--bind", ip, "--directory"])
        .arg(www(s))
        .arg(&port);
    let mut srv = Server::start(cmd, "http.server", "INT");
    wait_listening(port.parse().unwrap(), &mut srv, Duration::from_secs(30));
    (srv, format!("http://{ip}:{port}"))
}

/// One shim curl, three connections to a plain http.server, each started past the upgrade
/// deadline after the one before (`--rate`): the first learns from the server's first bytes
/// that it runs no shim, the later ones are not even marked (negative cache). The answers are
/// right either way.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn negative_cache_after_a_plain_server() {
    let ip = test_ip();
    let Some(curl) = require("curl") else { return };
    let s = Scratch::new("up-mixed-negcache");
    let (mut srv, base) = http_server(&s, &ip, false);
    let per_minute = (60.0 / SETTLE.as_secs_f64()).floor() as u32;
    let mut c = shimmed(&curl, &s, "curl");
    c.args(["-sS", "--fail", "--rate", &format!("{per_minute}/m")])
        .args(["-w", "%{num_connects}\\n"])
        .args((0..3).map(|i| format!("{base}/f{i}.txt")));
    let out = run_ok(c, Duration::from_secs(120));
    assert_eq!(out, "file 0\n1\nfile 1\n1\nfile 2\n1\n");
    srv.stop();
    s.one_stats("curl")
        .assert_fallback_reasons(&[("plain_peer", 1), ("negative_cache", 2)]);
}

/// A plain curl against a shim http.server: every accepted connection falls back with
/// `plain_peer` (no mark on its SYN).
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn plain_curl_shim_http_server() {
    let ip = test_ip();
    let Some(curl) = require("curl") else { return };
    let s = Scratch::new("up-mixed-plaincurl");
    let (mut srv, base) = http_server(&s, &ip, true);
    let mut c = std::process::Command::new(curl);
    c.env_remove("LD_PRELOAD")
        .args(["-sS", "--fail", "-w", "%{num_connects}\\n"])
        .args((0..2).map(|i| format!("{base}/f{i}.txt")));
    assert_eq!(run_ok(c, T), "file 0\n1\nfile 1\n1\n");
    assert!(srv.stop().expect("http.server status").success());
    s.one_stats("httpd")
        .assert_fallback_reasons(&[("plain_peer", 2)]);
}
