//! curl against local HTTP servers, everything under the shim: `python3 -m http.server` (GET of
//! a generated file with a sha256 check; keep-alive with several URLs in one curl) and the
//! test HTTP server of the library (`HTTP_SERVER_PY`) for a POST (the body's sha256 comes back).
//!
//! Same-host upgrades are off for every process here (`RDMASHIM_LOCAL=0`): this checks the
//! shim's TCP path — every hook the program needs fires and every byte is counted — which
//! must hold for any connection that stays TCP. (Over shared memory: tests/upgrade_*.rs and
//! tests/same_host.rs.)

use rdmashim_compat_tests::*;
use std::time::Duration;

#[test]
fn curl_get_post_keepalive() {
    let Some(curl) = require("curl") else { return };
    let py = python();
    let s = Scratch::new("curl");
    let www = s.dir.join("www");
    std::fs::create_dir(&www).unwrap();
    let big = random_bytes(3 << 20, 7);
    std::fs::write(www.join("big.bin"), &big).unwrap();
    for i in 0..3 {
        std::fs::write(
            www.join(format!("small{i}.txt")),
            format!("small file {i}\n"),
        )
        .unwrap();
    }

    // GET server: the stock http.server, HTTP/1.1 so connections stay open.
    let http_port = free_port().to_string();
    let mut cmd = shimmed(&py, &s, "httpd");
    cmd.env("RDMASHIM_LOCAL", "0");
    cmd.args([
        "-m",
        "http.server",
        "--bind",
        "127.0.0.1",
        "--protocol",
        "HTTP/1.1",
        "--directory",
    ])
    .arg(&www)
    .arg(&http_port);
    let mut httpd = Server::start(cmd, "http.server", "INT");
    // POST server.
    let post_port = free_port().to_string();
    let script = s.dir.join("post_server.py");
    std::fs::write(&script, HTTP_SERVER_PY).unwrap();
    let mut cmd = under_shim(Via::Launcher, &py, &s, "postd");
    cmd.env("RDMASHIM_LOCAL", "0");
    cmd.arg(&script).args(["127.0.0.1", &post_port]).arg(&www);
    let mut postd = Server::start(cmd, "post server", "INT");
    wait_listening(
        http_port.parse().unwrap(),
        &mut httpd,
        Duration::from_secs(20),
    );
    wait_listening(
        post_port.parse().unwrap(),
        &mut postd,
        Duration::from_secs(20),
    );
    let base = format!("http://127.0.0.1:{http_port}");

    // 1. GET of the generated file, checksum compared.
    let got = s.dir.join("got.bin");
    let mut c = shimmed(&curl, &s, "curl-get");
    c.env("RDMASHIM_LOCAL", "0");
    c.args(["-sS", "--fail", "-o"])
        .arg(&got)
        .arg(format!("{base}/big.bin"));
    run_ok(c, T);
    assert_eq!(sha256_hex(&std::fs::read(&got).unwrap()), sha256_hex(&big));

    // 2. Keep-alive: three URLs, one connection (curl reports 1 new connect, then 0, 0).
    let mut c = shimmed(&curl, &s, "curl-ka");
    c.env("RDMASHIM_LOCAL", "0");
    c.args([
        "-sS",
        "--fail",
        "-o",
        "/dev/null",
        "-o",
        "/dev/null",
        "-o",
        "/dev/null",
    ])
    .args(["-w", "%{http_code} %{num_connects}\\n"])
    .args((0..3).map(|i| format!("{base}/small{i}.txt")));
    let out = run_ok(c, T);
    assert_eq!(out, "200 1\n200 0\n200 0\n", "keep-alive");

    // 3. POST of 1 MiB; the server answers length and sha256 of what it received.
    let body = random_bytes(1 << 20, 99);
    let body_file = s.dir.join("body.bin");
    std::fs::write(&body_file, &body).unwrap();
    let mut c = under_shim(Via::Launcher, &curl, &s, "curl-post");
    c.env("RDMASHIM_LOCAL", "0");
    c.args(["-sS", "--fail", "-H", "Expect:", "--data-binary"])
        .arg(format!("@{}", body_file.display()))
        .arg(format!("http://127.0.0.1:{post_port}/upload"));
    assert_eq!(
        run_ok(c, T),
        format!("{} {}\n", body.len(), sha256_hex(&body))
    );

    assert!(httpd.stop().expect("httpd status").success(), "http.server");
    postd.stop();

    let reason = loopback_tcp_reason();
    let get = s.one_stats("curl-get");
    let ka = s.one_stats("curl-ka");
    let post = s.one_stats("curl-post");
    let httpd_st = s.one_stats("httpd");
    let postd_st = s.one_stats("postd");
    for c in [&get, &ka, &post] {
        assert_eq!(c.connections(), 1, "one connection per curl: {:?}", c.raw);
        c.assert_all_fallback(&reason);
        c.assert_fired(&[
            "socket",
            "connect",
            "getsockopt",
            "setsockopt",
            "poll",
            "recv",
            "send",
            "close",
        ]);
    }
    assert_eq!(httpd_st.connections(), 2, "{:?}", httpd_st.raw);
    assert_eq!(postd_st.connections(), 1, "{:?}", postd_st.raw);
    httpd_st.assert_all_fallback(&reason);
    postd_st.assert_all_fallback(&reason);
    // Bytes: every byte sent by one side was received by the other.
    assert_eq!(
        httpd_st.bytes("tcp_tx"),
        get.bytes("tcp_rx") + ka.bytes("tcp_rx")
    );
    assert_eq!(
        httpd_st.bytes("tcp_rx"),
        get.bytes("tcp_tx") + ka.bytes("tcp_tx")
    );
    assert_eq!(postd_st.bytes("tcp_rx"), post.bytes("tcp_tx"));
    assert_eq!(postd_st.bytes("tcp_tx"), post.bytes("tcp_rx"));
    assert!(get.bytes("tcp_rx") > big.len() as u64);
    assert!(post.bytes("tcp_tx") > body.len() as u64);
    for srv in [&httpd_st, &postd_st] {
        srv.assert_fired(&[
            "socket", "bind", "listen", "accept4", "recv", "send", "close",
        ]);
    }
}
