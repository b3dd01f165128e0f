//! RDMA tier: tinyproxy (1.11: a thread per client, `poll` on both of its sockets,
//! SO_SNDTIMEO/SO_RCVTIMEO set before `connect`, a non-blocking upstream connect,
//! `recv(MSG_PEEK|MSG_DONTWAIT)` probes) relays GETs of a 16 MiB file from a Python HTTP
//! server to curl (64 MiB over shared memory), all three under the shim: four downloads at once, then one whose client
//! reads slowly (`--limit-rate`), so that the proxy stops reading its upstream connection and
//! the server's writes wait for ring credits. Every download is byte-exact; the proxy's
//! connections on both sides and the server's are upgraded, and the file went through the
//! rings (the device's packet counters grew to match).
//!
//! Each connection carries one body and ends: on loopback 16 MiB move in about 10 ms,
//! as long as the shim's default dial delay (10 ms, and up to a tick and 5 ms more), so the
//! dials here start at once (`RDMASHIM_DIAL_DELAY_MS=0`) and the switch comes early in each
//! body, not in a race with its end (it lost that race in CI: a whole body before the switch,
//! `closed_early`; or half of the bodies before their switches). Short connections under the
//! default delay: `upgrade_redis`, `upgrade_curl`.
//!
//! The relay once lost streams at the switch (both ends ECONNRESET after 4–266 KB, issue 25);
//! this keeps it in the matrix.

use rdmashim_compat_tests::*;
use std::time::Duration;

/// The file's size over RDMA rings (in the VM: a body takes about a second).
const FILE: usize = 16 << 20;
/// Over shared memory: a body moves in tens of milliseconds, and what sits in the sockets'
/// buffers at the switch (several MiB on loopback) goes on TCP; a larger body keeps "most of
/// it through the rings" a property of the relay, not of the buffers' fill.
const FILE_SHM: usize = 64 << 20;
const AT_ONCE: usize = 4;

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn tinyproxy_relays_large_gets_over_rdma() {
    tinyproxy_relays(Rings::Rdma);
}

/// The same over shared memory, on 127.0.0.1: every host.
#[test]
fn tinyproxy_relays_large_gets_over_shm() {
    tinyproxy_relays(Rings::Shm);
}

fn tinyproxy_relays(rings: Rings) {
    let ip = rings.ip();
    let Some(curl) = require("curl") else { return };
    let Some(tinyproxy) = require("tinyproxy") else {
        return;
    };
    let s = Scratch::new("up-tinyproxy");
    let www = s.dir.join("www");
    std::fs::create_dir(&www).unwrap();
    let file = match rings {
        Rings::Rdma => FILE,
        Rings::Shm => FILE_SHM,
    };
    let big = random_bytes(file, 11);
    std::fs::write(www.join("big.bin"), &big).unwrap();
    let want = sha256_hex(&big);

    let device = rings.device();
    let (mut httpd, port) = http_server(&s, Via::Preload, &ip, &www, "httpd");

    let proxy_port = free_port_on(&ip);
    let conf = s.dir.join("tinyproxy.conf");
    std::fs::write(
        &conf,
        format!(
            "Port {proxy_port}\nListen {ip}\nTimeout 600\nMaxClients 64\nLogLevel Warning\n\
             LogFile \"{}\"\nPidFile \"{}\"\nAllow {ip}\nAllow 127.0.0.1\n",
            s.dir.join("tinyproxy.log").display(),
            s.dir.join("tinyproxy.pid").display()
        ),
    )
    .unwrap();
    let mut cmd = shimmed(&tinyproxy, &s, "proxy");
    cmd.env("RDMASHIM_DIAL_DELAY_MS", "0")
        .arg("-d")
        .arg("-c")
        .arg(&conf);
    let mut proxy = Server::start(cmd, "tinyproxy", "TERM");
    wait_listening(proxy_port, &mut proxy, Duration::from_secs(30));

    let get = |label: &str, extra: &[&str]| {
        let out = s.dir.join(format!("{label}.bin"));
        let mut c = shimmed(&curl, &s, label);
        c.env("RDMASHIM_DIAL_DELAY_MS", "0")
            .args(["-sS", "--fail", "--max-time", "120", "-x"])
            .arg(format!("http://{ip}:{proxy_port}"))
            .args(extra)
            .arg("-o")
            .arg(&out)
            .arg(format!("http://{ip}:{port}/big.bin"));
        (c, out)
    };
    let runs: Vec<_> = (0..AT_ONCE)
        .map(|i| {
            let (c, out) = get(&format!("curl-{i}"), &[]);
            (
                std::thread::spawn(move || run_ok(c, Duration::from_secs(150))),
                out,
            )
        })
        .collect();
    for (i, (t, out)) in runs.into_iter().enumerate() {
        t.join().unwrap_or_else(|_| panic!("download {i}"));
        assert_eq!(
            sha256_hex(&std::fs::read(&out).unwrap()),
            want,
            "download {i}"
        );
    }
    // (about two seconds at this rate, whichever the size)
    let rate = format!("{}M", (file / 2) >> 20);
    let (c, out) = get("curl-slow", &["--limit-rate", &rate]);
    run_ok(c, Duration::from_secs(150));
    assert_eq!(
        sha256_hex(&std::fs::read(&out).unwrap()),
        want,
        "slow download"
    );

    proxy.stop().expect("tinyproxy status");
    assert!(
        httpd.stop().expect("server status").success(),
        "http server"
    );
    let pst = s.one_stats("proxy");
    let srv = s.one_stats("httpd");
    eprintln!("proxy: {}", pst.summary());
    eprintln!("server: {}", srv.summary());
    let gets = AT_ONCE as u64 + 1;
    // Each download: one connection from curl to the proxy, one from the proxy to the server.
    assert_eq!(pst.connections(), 2 * gets, "{}", pst.summary());
    assert_eq!(srv.connections(), gets, "{}", srv.summary());
    pst.assert_all_upgraded();
    srv.assert_all_upgraded();
    // The response bodies crossed the rings twice in the proxy (in from the server, out to
    // curl), but for what moved on TCP before each switch.
    let half = gets * file as u64 / 2;
    rings.assert_at_least(&pst, half, half);
    // Every byte the server sent, the proxy received.
    assert!(
        rings.tx(&srv) + srv.bytes("tcp_tx") >= gets * file as u64,
        "{}",
        srv.summary()
    );
    if let Some(d) = device {
        d.delta().assert_carried(srv.ring_bytes());
    }
}
