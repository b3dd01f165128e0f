//! redis-server under the shim, driven by redis-benchmark and redis-cli under the shim.
//!
//! Same-host upgrades are off for every process here (`RDMASHIM_LOCAL=0`): this checks the
//! shim's TCP path — every hook the program needs fires and every byte is counted — which
//! must hold for any connection that stays TCP. (Over shared memory: tests/upgrade_*.rs and
//! tests/same_host.rs.)

use rdmashim_compat_tests::*;
use std::path::Path;
use std::time::Duration;

const HOOKS: &[&str] = &[
    "socket",
    "socketpair",
    "bind",
    "listen",
    "accept",
    "accept4",
    "connect",
    "getsockopt",
    "setsockopt",
    "getsockname",
    "getpeername",
    "shutdown",
    "close",
    "read",
    "write",
    "readv",
    "writev",
    "recv",
    "recvfrom",
    "send",
    "sendto",
    "poll",
    "select",
    "epoll_create",
    "epoll_create1",
    "epoll_ctl",
    "epoll_wait",
    "fcntl",
    "fcntl64",
    "ioctl",
    "dup",
    "dup2",
    "fork",
    "execve",
    "__read_chk",
    "__recv_chk",
    "__fdelt_chk",
    "__poll_chk",
];

#[test]
fn redis_benchmark_and_cli() {
    let (Some(server_bin), Some(bench_bin), Some(cli_bin)) = (
        require("redis-server"),
        require("redis-benchmark"),
        require("redis-cli"),
    ) else {
        return;
    };
    let s = Scratch::new("redis");
    let port = free_port().to_string();
    let mut cmd = shimmed(&server_bin, &s, "server");
    cmd.env("RDMASHIM_LOCAL", "0");
    cmd.args([
        "--port",
        &port,
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
    ])
    .args(["--daemonize", "no", "--logfile", "", "--dir"])
    .arg(&s.dir);
    let mut server = Server::start(cmd, "redis-server", "TERM");
    wait_listening(port.parse().unwrap(), &mut server, Duration::from_secs(20));

    let mut b = shimmed(&bench_bin, &s, "bench");
    b.env("RDMASHIM_LOCAL", "0");
    b.args([
        "-h",
        "127.0.0.1",
        "-p",
        &port,
        "-t",
        "set,get,lpush,lrange_100",
        "-P",
        "16",
        "-c",
        "50",
    ])
    .args(["-n", "20000", "-q"]);
    let out = run_ok(b, Duration::from_secs(120));
    for t in ["SET", "GET", "LPUSH", "LRANGE_100"] {
        assert!(
            out.split(['\n', '\r'])
                .any(|l| l.trim_start().starts_with(t) && l.contains("requests per second")),
            "{t} missing from redis-benchmark output: {out}"
        );
    }

    let cli = |label: &str, args: &[&str]| -> String {
        // redis-cli goes through the launcher, server and benchmark through LD_PRELOAD
        let mut c = under_shim(Via::Launcher, &cli_bin, &s, label);
        c.env("RDMASHIM_LOCAL", "0");
        c.args(["-h", "127.0.0.1", "-p", &port]).args(args);
        run_ok(c, T).trim().to_string()
    };
    assert_eq!(cli("cli", &["ping"]), "PONG");
    assert_eq!(cli("cli", &["set", "rdmashim:k", "v1"]), "OK");
    assert_eq!(cli("cli", &["get", "rdmashim:k"]), "v1");
    assert_eq!(cli("cli", &["incrby", "rdmashim:n", "41"]), "41");
    assert_eq!(cli("cli", &["incr", "rdmashim:n"]), "42");
    let big = "x".repeat(100_000); // one argv string is limited to 128 KiB
    assert_eq!(cli("cli", &["set", "rdmashim:big", &big]), "OK");
    assert_eq!(cli("cli", &["strlen", "rdmashim:big"]), "100000");
    assert_eq!(cli("cli", &["get", "rdmashim:big"]), big);
    let st = server.stop().expect("server status");
    assert!(st.success(), "redis-server exited with {st}");

    let reason = loopback_tcp_reason();
    let srv = s.one_stats("server");
    let bench = s.one_stats("bench");
    let clis = s.stats("cli");
    assert_eq!(clis.len(), 8);
    for c in &clis {
        assert_eq!(
            c.connections(),
            1,
            "one connection per redis-cli: {:?}",
            c.raw
        );
        c.assert_all_fallback(&reason);
        // hiredis: non-blocking connect, poll, then connect again (EISCONN).
        c.assert_fired(&["socket", "connect", "poll", "send", "recv"]);
    }
    assert!(bench.connections() >= 50, "{:?}", bench.raw);
    bench.assert_all_fallback(&reason);
    srv.assert_all_fallback(&reason);
    // Every connection is counted once on each side.
    assert_eq!(
        srv.connections(),
        bench.connections() + sum_connections(&clis)
    );
    // Every byte one side sent, the other received.
    assert_eq!(
        srv.bytes("tcp_rx"),
        bench.bytes("tcp_tx") + sum_bytes(&clis, "tcp_tx")
    );
    assert_eq!(
        srv.bytes("tcp_tx"),
        bench.bytes("tcp_rx") + sum_bytes(&clis, "tcp_rx")
    );
    assert!(srv.bytes("tcp_rx") > 1_000_000);

    let imports = |bin: &Path| imported_hooks(&[bin], HOOKS);
    let must = |st: &Stats, bin: &Path, fired: &[&str]| {
        let imp = imports(bin);
        for h in fired {
            assert!(
                imp.iter().any(|i| i == h),
                "{} does not import {h} (imports {imp:?})",
                bin.display()
            );
        }
        st.assert_fired(fired);
    };
    must(
        &srv,
        &server_bin,
        &[
            "socket",
            "bind",
            "listen",
            "accept4",
            "read",
            "write",
            "close",
            "setsockopt",
            "getpeername",
            "epoll_create",
            "epoll_ctl",
            "epoll_wait",
            "fcntl64",
        ],
    );
    must(
        &bench,
        &bench_bin,
        &[
            "socket",
            "connect",
            "recv",
            "send",
            "close",
            "epoll_ctl",
            "epoll_wait",
            "fcntl",
        ],
    );
}
