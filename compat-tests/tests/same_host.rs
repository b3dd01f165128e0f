//! Host tier: processes of one host, both under the shim (same-host upgrades are on by
//! default), move their loopback connections onto shared-memory rings — no RDMA
//! device needed, so this runs on every machine. Proven by the stats: upgraded connections on
//! both sides and bytes counted `shm_*` (a fallback to TCP would also give right answers).

use rdmashim_compat_tests::*;
use std::time::Duration;

/// Values of a few hundred KiB: many times a ring's worth of credits and wraps.
const BIG: usize = 384 * 1024;

fn printable(len: usize, seed: u64) -> Vec<u8> {
    pattern_bytes(len, seed, |x| b'!' + (x % 94) as u8)
}

/// `c` with same-host upgrades left at the shim's default (on), whatever the test's own
/// environment says.
fn local(mut c: std::process::Command) -> std::process::Command {
    c.env_remove("RDMASHIM_LOCAL");
    c
}

/// `rdmashim run -- redis-server` on 127.0.0.1, redis-benchmark (50 connections) and
/// redis-cli under the shim: the benchmark's connections are upgraded on both sides and carry
/// bytes on shared memory; a big value SET and read back whole, the second time on a
/// connection that has been upgraded.
#[test]
fn redis_over_shared_memory() {
    let (Some(server_bin), Some(bench), Some(cli)) = (
        require("redis-server"),
        require("redis-benchmark"),
        require("redis-cli"),
    ) else {
        return;
    };
    let s = Scratch::new("shm-redis");
    let ip = "127.0.0.1";
    let port = free_port_on(ip).to_string();
    let mut cmd = local(under_shim(Via::Launcher, &server_bin, &s, "server"));
    cmd.args(["--port", &port, "--bind", ip])
        .args(["--save", "", "--appendonly", "no"])
        .args(["--daemonize", "no", "--logfile", "", "--dir"])
        .arg(&s.dir);
    let mut server = Server::start(cmd, "redis-server", "TERM");
    wait_listening(port.parse().unwrap(), &mut server, Duration::from_secs(30));

    const N: u64 = 20_000;
    let mut b = local(shimmed(&bench, &s, "bench"));
    b.args(["-h", ip, "-p", &port, "-t", "set,get"]).args([
        "-n",
        &N.to_string(),
        "-d",
        "256",
        "-c",
        "50",
        "-q",
    ]);
    let out = run_ok(b, Duration::from_secs(120));
    for t in ["SET", "GET"] {
        assert!(
            out.split(['\n', '\r'])
                .any(|l| l.trim_start().starts_with(t) && l.contains("requests per second")),
            "{t} missing from redis-benchmark output: {out}"
        );
    }

    // A big value, through stdin, then read back twice on one connection, a second apart:
    // the second reply comes on the rings.
    let big = printable(BIG, 7);
    let file = s.dir.join("big.txt");
    std::fs::write(&file, &big).unwrap();
    let mut set = local(shimmed(&cli, &s, "cli-set"));
    set.args(["-h", ip, "-p", &port, "-x", "set", "rdmashim:big"]);
    assert_eq!(run_ok_with_input(set, &file, T).trim_end(), "OK");
    let mut get = local(shimmed(&cli, &s, "cli-get"));
    get.args([
        "-h",
        ip,
        "-p",
        &port,
        "-r",
        "2",
        "-i",
        "1.5",
        "get",
        "rdmashim:big",
    ]);
    let got = run_ok(get, Duration::from_secs(60));
    let want = [big.as_slice(), b"\n", big.as_slice(), b"\n"].concat();
    assert!(
        got.as_bytes() == want.as_slice(),
        "GET twice: {} bytes, not the value twice",
        got.len()
    );

    let pid = server.pid();
    let st = server.stop().expect("redis-server status");
    assert!(st.success(), "redis-server exited with {st}");
    let srv = s.stats_of("server", pid);
    let bench = s.one_stats("bench");
    let get = s.one_stats("cli-get");
    eprintln!("{}\n{}\n{}", srv.summary(), bench.summary(), get.summary());
    // 100 benchmark connections (50 per test), each upgraded unless it ended first.
    assert!(srv.upgraded() >= 40, "server: {}", srv.summary());
    assert!(bench.upgraded() >= 40, "bench: {}", bench.summary());
    assert!(srv.shm_bytes() > 0 && bench.shm_bytes() > 0);
    assert_eq!(
        srv.ring_bytes() + bench.ring_bytes(),
        0,
        "no RDMA ring here"
    );
    assert_eq!(get.upgraded(), 1, "cli-get: {}", get.summary());
    assert!(
        get.bytes("shm_rx") >= BIG as u64,
        "the second reply on the rings: {}",
        get.summary()
    );
    // Nothing lost or reordered in the benchmark's totals is checked by redis itself (each
    // reply parsed); the server saw no unproven request.
    assert_eq!(srv.raw["security"]["unproven_requests"], 0);
}

/// With same-host upgrades off (`rdmashim run --no-local`, `RDMASHIM_LOCAL=0`) the same-host
/// connections stay TCP, counted with [`loopback_tcp_reason`].
#[test]
fn off_with_the_knob() {
    let Some(cli) = require("redis-cli") else {
        return;
    };
    let Some(server_bin) = require("redis-server") else {
        return;
    };
    let s = Scratch::new("shm-off");
    let ip = "127.0.0.1";
    let port = free_port_on(ip).to_string();
    let mut cmd = std::process::Command::new(&shim().launcher);
    cmd.env_remove("LD_PRELOAD")
        .env_remove("RDMASHIM_LOCAL")
        .arg("run")
        .arg("--stats")
        .arg(s.stats_pattern("server"))
        .args(["--no-local", "--"])
        .arg(&server_bin)
        .args(["--port", &port, "--bind", ip])
        .args([
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--dir",
        ])
        .arg(&s.dir);
    let mut server = Server::start(cmd, "redis-server", "TERM");
    wait_listening(port.parse().unwrap(), &mut server, Duration::from_secs(30));
    let mut c = shimmed(&cli, &s, "cli");
    c.env("RDMASHIM_LOCAL", "0")
        .args(["-h", ip, "-p", &port, "ping"]);
    assert_eq!(run_ok(c, T).trim_end(), "PONG");
    let pid = server.pid();
    server.stop().expect("redis-server status");
    let srv = s.stats_of("server", pid);
    let cl = s.one_stats("cli");
    assert_eq!(srv.upgraded() + cl.upgraded(), 0);
    cl.assert_all_fallback(&loopback_tcp_reason());
    srv.assert_all_fallback(&loopback_tcp_reason());
    assert_eq!(srv.shm_bytes() + cl.shm_bytes(), 0);
}
