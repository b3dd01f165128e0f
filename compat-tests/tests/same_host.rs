//! Host tier: processes of one host, both under the shim (same-host upgrades are on by
//! default), move their loopback connections onto shared-memory rings — no RDMA
//! device needed, so this runs on every machine. Proven by the stats: upgraded connections on
//! both sides and bytes counted `shm_*` (a fallback to TCP would also give right answers).

use rdmashim_compat_tests::*;
use std::time::Duration;

/// The behaviour scenarios' program (src/bin/behave.rs).
const BEHAVE: &str = env!("CARGO_BIN_EXE_behave");

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

/// A network namespace of this test's own (`ip netns`), removed when dropped.
struct Netns(String);

impl Netns {
    fn new(name: String) -> Netns {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &name])
            .status();
        ip(&["netns", "add", &name]);
        Netns(name)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.0])
            .status();
    }
}

fn ip(args: &[&str]) {
    let st = std::process::Command::new("ip")
        .args(args)
        .status()
        .expect("run ip");
    assert!(st.success(), "ip {args:?}: {st}");
}

/// Containers on one host: a shimmed server and a shimmed client in two network namespaces
/// joined by a veth pair. The peer's address is not one of the client's namespace, so the
/// connection is judged remote, and the same-host rendezvous (whose abstract socket names live
/// per namespace) is never tried: on this host, without RDMA, it stays TCP with the host's
/// reason, every byte intact, both processes agreeing. (Root only: `ip netns`.)
#[test]
fn separate_network_namespaces_stay_tcp_with_a_reason() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || require("ip").is_none() {
        eprintln!("SKIP: needs root and ip(8)");
        return;
    }
    let has_rdma = std::fs::read_dir("/sys/class/infiniband")
        .map(|mut d| d.next().is_some())
        .unwrap_or(false);
    let id = std::process::id();
    let (a, b) = (
        Netns::new(format!("rdmashim-a-{id}")),
        Netns::new(format!("rdmashim-b-{id}")),
    );
    let (va, vb) = (
        format!("rsa{}", id % 100_000),
        format!("rsb{}", id % 100_000),
    );
    ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb]);
    ip(&["link", "set", &va, "netns", &a.0]);
    ip(&["link", "set", &vb, "netns", &b.0]);
    for (ns, dev, addr) in [(&a.0, &va, "10.213.0.1/24"), (&b.0, &vb, "10.213.0.2/24")] {
        ip(&["-n", ns, "addr", "add", addr, "dev", dev]);
        ip(&["-n", ns, "link", "set", dev, "up"]);
        ip(&["-n", ns, "link", "set", "lo", "up"]);
    }
    let s = Scratch::new("netns");
    let in_ns = |ns: &str, role: &str, args: &[&str]| {
        let mut c = std::process::Command::new("ip");
        c.args(["netns", "exec", ns, "env"])
            .arg(format!("LD_PRELOAD={}", shim().lib.display()))
            .arg(format!(
                "RDMASHIM_STATS={}",
                s.stats_pattern(role).display()
            ))
            .arg(BEHAVE)
            .args(args);
        c.env_remove("RDMASHIM_LOCAL")
            .env_remove("RDMASHIM_DISABLE");
        c
    };
    use std::io::BufRead;
    let mut srv = in_ns(&a.0, "server", &["echo", "server", "10.213.0.1"]);
    srv.stdout(std::process::Stdio::piped());
    let mut server = srv.spawn().expect("spawn the server");
    let mut said = std::io::BufReader::new(server.stdout.take().unwrap());
    let mut line = String::new();
    said.read_line(&mut line).unwrap();
    let port = line
        .trim()
        .strip_prefix("port ")
        .unwrap_or_else(|| panic!("server said {line:?}"))
        .to_string();
    let started = std::time::Instant::now();
    let out = run_ok(
        in_ns(&b.0, "client", &["echo", "client", "10.213.0.1", &port]),
        T,
    );
    let took = started.elapsed();
    assert!(out.contains("ok echo client"), "client: {out}");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut said, &mut rest).unwrap();
    let st = server.wait().unwrap();
    assert!(
        st.success() && rest.contains("ok echo server"),
        "server: {st} {rest}"
    );
    for role in ["client", "server"] {
        let r = s.one_stats(role);
        assert_eq!(r.connections(), 1, "{role}: {}", r.summary());
        assert_eq!(r.upgraded(), 0, "{role}: {}", r.summary());
        assert_eq!(r.shm_bytes(), 0, "{role}: {}", r.summary());
        if !has_rdma {
            r.assert_all_fallback("no_device");
        }
    }
    // (1 MiB echoed in 64 KiB blocks over a veth pair: no wait of the shim's in it)
    assert!(took < Duration::from_secs(5), "the echo took {took:?}");
}
