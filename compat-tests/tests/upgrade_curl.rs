//! RDMA tier: curl against a Python HTTP server, both under the shim, on `RDMASHIM_TEST_IP`:
//! GET of a 4 MiB random file (sha256 checked), a 1 MiB POST (the server answers the body's
//! sha256), keep-alive (several requests, one connection). The connections are upgraded, the
//! file and the body went through the rings, and the device's packet counters grew.
//!
//! The upgrade is asynchronous: a GET sent at once after connecting may be answered partly or
//! wholly by TCP, so the first download only has to be right and accounted for. The keep-alive
//! connection waits past the upgrade deadline between its requests (curl's `--rate`), so its
//! download and its upload must go through the rings entirely.

use rdmashim_compat_tests::*;
use std::time::Duration;

const FILE: usize = 4 << 20;
const BODY: usize = 1 << 20;

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn curl_get_post_keepalive_over_rdma() {
    let ip = test_ip();
    let dev = test_device();
    let Some(curl) = require("curl") else { return };
    let s = Scratch::new("up-curl");
    let www = s.dir.join("www");
    std::fs::create_dir(&www).unwrap();
    let big = random_bytes(FILE, 7);
    std::fs::write(www.join("big.bin"), &big).unwrap();
    std::fs::write(www.join("small.txt"), "small file\n").unwrap();
    let body = random_bytes(BODY, 99);
    let body_file = s.dir.join("body.bin");
    std::fs::write(&body_file, &body).unwrap();

    let device = DeviceCounters::read(&dev);
    let (mut httpd, port) = http_server(&s, Via::Launcher, &ip, &www, "httpd");
    let base = format!("http://{ip}:{port}");

    // 1. GET at once after connecting, checksum compared.
    let got = s.dir.join("got.bin");
    let mut c = shimmed(&curl, &s, "curl-get");
    c.args(["-sS", "--fail", "-o"])
        .arg(&got)
        .arg(format!("{base}/big.bin"));
    run_ok(c, Duration::from_secs(120));
    assert_eq!(
        sha256_hex(&std::fs::read(&got).unwrap()),
        sha256_hex(&big),
        "GET"
    );

    // 2. One connection, three requests, each started past the upgrade deadline after the
    //    previous one (--rate): a small GET, the 4 MiB GET, the 1 MiB POST.
    let got2 = s.dir.join("got2.bin");
    let per_minute = (60.0 / SETTLE.as_secs_f64()).floor() as u32;
    let w = ["-w", "%{http_code} %{num_connects}\\n"];
    let mut c = under_shim(Via::Launcher, &curl, &s, "curl-ka");
    c.args(["-sS", "--fail", "--rate", &format!("{per_minute}/m")])
        .args(w)
        .args(["-o", "/dev/null", &format!("{base}/small.txt")])
        .args(w)
        .arg("-o")
        .arg(&got2)
        .arg(format!("{base}/big.bin"))
        .args(["--next", "-sS", "--fail", "-H", "Expect:", "--data-binary"])
        .arg(format!("@{}", body_file.display()))
        .args(w)
        .arg(format!("{base}/upload"));
    let out = run_ok(c, Duration::from_secs(120));
    assert_eq!(
        out,
        format!(
            "200 1\n200 0\n{} {}\n200 0\n",
            body.len(),
            sha256_hex(&body)
        ),
        "keep-alive: one connection, three answers"
    );
    assert_eq!(
        sha256_hex(&std::fs::read(&got2).unwrap()),
        sha256_hex(&big),
        "GET 2"
    );

    assert!(
        httpd.stop().expect("server status").success(),
        "http server"
    );
    let get = s.one_stats("curl-get");
    let ka = s.one_stats("curl-ka");
    let srv = s.one_stats("httpd");
    eprintln!("{}", get.summary());
    eprintln!("{}", ka.summary());
    eprintln!("{}", srv.summary());

    for c in [&get, &ka] {
        assert_eq!(
            c.connections(),
            1,
            "one connection per curl: {}",
            c.summary()
        );
    }
    // The first GET: the whole file arrived, by ring or TCP.
    assert!(
        get.bytes("ring_rx") + get.bytes("tcp_rx") >= FILE as u64,
        "{}",
        get.summary()
    );
    // The keep-alive connection: upgraded; the file and the body went through the rings.
    ka.assert_all_upgraded();
    ka.assert_ring_at_least(BODY as u64, FILE as u64);
    // The server: both connections counted; the keep-alive one upgraded; at least that file
    // and body through its rings. The first GET's connection is upgraded too, unless curl
    // closed it first: before its connect request arrived (`no_upgrade_request`) or while
    // the handshake was under way (`closed_early`; the GET is over in tens of milliseconds
    // here, and curl's process loads the RDMA libraries on its engine thread meanwhile).
    assert_eq!(srv.connections(), 2, "{}", srv.summary());
    srv.assert_upgraded(1, 0);
    assert_eq!(
        srv.reason("no_upgrade_request") + srv.reason("closed_early"),
        srv.fallback,
        "{}",
        srv.summary()
    );
    srv.assert_ring_at_least(FILE as u64, BODY as u64);
    // Every byte one side sent, the other received.
    let total =
        |st: &Stats, k: &str| st.bytes(&format!("ring_{k}")) + st.bytes(&format!("tcp_{k}"));
    assert_eq!(total(&srv, "tx"), total(&get, "rx") + total(&ka, "rx"));
    assert_eq!(total(&srv, "rx"), total(&get, "tx") + total(&ka, "tx"));
    device.delta().assert_carried(srv.ring_bytes());
}
