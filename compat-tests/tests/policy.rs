//! The configuration file (`RDMASHIM_CONFIG`, default `/etc/rdmashim.conf`) and its rules,
//! on this host (same-host connections move to shared-memory rings: no RDMA needed).
//!
//! - A port the rules deny stays on TCP, counted `policy` on both ends, while a port they do
//!   not name upgrades beside it, between the same two processes.
//! - A program the rules deny stays on TCP as a whole (`policy`), and `rdmashim doctor
//!   --program` says so; `rdmashim run --config FILE` reads FILE.
//! - A variable overrides the file's key; a bad value in the file gets one warning that
//!   names the file and the line.
//!
//! Before: there was no file; the variables were the only settings, and nothing could keep
//! one program, peer or port on TCP.

use rdmashim_compat_tests::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// An echo server on 127.0.0.1 at the ports in its arguments: one connection each, echoed
/// until it ends.
const ECHO_SERVER: &str = "import socket, sys, threading\n\
    ls = [socket.create_server(('127.0.0.1', int(p))) for p in sys.argv[1:]]\n\
    print('ready', flush=True)\n\
    def serve(l):\n\
    \x20   a, _ = l.accept()\n\
    \x20   while True:\n\
    \x20       d = a.recv(65536)\n\
    \x20       if not d: break\n\
    \x20       a.sendall(d)\n\
    \x20   a.close()\n\
    ts = [threading.Thread(target=serve, args=(l,)) for l in ls]\n\
    for t in ts: t.start()\n\
    for t in ts: t.join()\n";

/// A client of the ports in its arguments: a round trip on each connection, then again after
/// a pause (past the dial delay and the upgrade: on the rings where it was upgraded).
const ECHO_CLIENT: &str = "import socket, sys, time\n\
    cs = [socket.create_connection(('127.0.0.1', int(p))) for p in sys.argv[1:]]\n\
    for r in range(3):\n\
    \x20   for c in cs:\n\
    \x20       m = bytes([65 + r]) * 4000\n\
    \x20       c.sendall(m)\n\
    \x20       got = b''\n\
    \x20       while len(got) < len(m):\n\
    \x20           d = c.recv(65536)\n\
    \x20           assert d, 'closed early'\n\
    \x20           got += d\n\
    \x20       assert got == m\n\
    \x20   time.sleep(1)\n\
    for c in cs: c.close()\n\
    print('ok')\n";

/// One loopback connection in one Python process (both ends), printing `x`.
const ONE_CONNECTION: &str = "import socket\n\
    s = socket.create_server(('127.0.0.1', 0))\n\
    c = socket.create_connection(s.getsockname())\n\
    a, _ = s.accept()\n\
    c.sendall(b'x'); print(a.recv(1).decode())";

fn write_config(s: &Scratch, text: &str) -> PathBuf {
    let p = s.dir.join("rdmashim.conf");
    std::fs::write(&p, text).unwrap();
    p
}

/// `c` with same-host upgrades at the shim's default and `config` as its configuration file.
fn configured(mut c: Command, config: &Path) -> Command {
    c.env_remove("RDMASHIM_LOCAL")
        .env("RDMASHIM_CONFIG", config);
    c
}

#[test]
fn a_denied_port_stays_tcp_while_an_allowed_one_upgrades() {
    let s = Scratch::new("policy-port");
    let (allowed, denied) = (free_port(), free_port());
    let config = write_config(
        &s,
        &format!("# the test's policy\ndeny port = {denied}   # kept on TCP\n"),
    );
    let py = python();
    let mut srv = configured(shimmed(&py, &s, "server"), &config);
    srv.args(["-u", "-c", ECHO_SERVER])
        .arg(allowed.to_string())
        .arg(denied.to_string());
    let mut server = Server::start(srv, "echo server", "TERM");
    wait_listening(denied, &mut server, Duration::from_secs(30));
    wait_listening(allowed, &mut server, Duration::from_secs(30));

    let mut cli = configured(shimmed(&py, &s, "client"), &config);
    cli.args(["-c", ECHO_CLIENT])
        .arg(allowed.to_string())
        .arg(denied.to_string());
    let out = run(cli, T);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "", "no warning");
    // (it ends by itself once both connections have: a signal now would race that)
    let st = server.wait_exit(Duration::from_secs(30));
    assert!(st.is_some_and(|st| st.success()), "server: {st:?}");

    let client = s.one_stats("client");
    let srv = s.one_stats("server");
    for (who, st) in [("client", &client), ("server", &srv)] {
        assert_eq!(st.connections(), 2, "{who}: {}", st.summary());
        assert_eq!(
            st.upgraded(),
            1,
            "{who}: the allowed port: {}",
            st.summary()
        );
        assert_eq!(
            st.nonzero_reasons(),
            BTreeMap::from([("policy", 1)]),
            "{who}: the denied port: {}",
            st.summary()
        );
        assert!(st.shm_bytes() > 0, "{who}: {}", st.summary());
        // (the denied connection's three round trips, all on TCP)
        assert!(st.bytes("tcp_tx") >= 3 * 4000, "{who}: {}", st.summary());
    }
}

/// One connection under the shim with configuration file `config` and `vars`: stderr and
/// the stats.
fn one_connection(
    s: &Scratch,
    label: &str,
    config: &Path,
    vars: &[(&str, &str)],
) -> (String, Stats) {
    let mut c = configured(shimmed(python(), s, label), config);
    c.args(["-c", ONE_CONNECTION]);
    for (k, v) in vars {
        c.env(k, v);
    }
    let out = run(c, T);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "x\n");
    (
        String::from_utf8_lossy(&out.stderr).into_owned(),
        s.one_stats(label),
    )
}

#[test]
fn the_environment_overrides_the_file_and_a_bad_line_is_named() {
    let s = Scratch::new("policy-env");
    let config = write_config(&s, "disable = yes\nring_kib = banana\n");
    let shown = config.display().to_string();
    // the file's `disable`
    let (err, st) = one_connection(&s, "file", &config, &[]);
    assert_eq!(st.reason("disabled"), 2, "{}", st.summary());
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one warning: {err}");
    let want = format!(
        "{shown}:2: ring_kib = banana: not a whole number from 4 to 8192; using the default, 512"
    );
    assert!(
        lines[0].starts_with("rdmashim[") && lines[0].ends_with(&want),
        "{}",
        lines[0]
    );
    // the variable's, over it
    let (_, st) = one_connection(&s, "env", &config, &[("RDMASHIM_DISABLE", "0")]);
    assert_eq!(st.connections(), 2);
    assert_eq!(st.reason("disabled"), 0, "{}", st.summary());
    // no file at all
    let (err, st) = one_connection(&s, "none", Path::new("none"), &[]);
    assert_eq!((err.as_str(), st.reason("disabled")), ("", 0));
}

#[test]
fn a_denied_program_stays_tcp_and_doctor_says_so() {
    let s = Scratch::new("policy-program");
    // python3 runs as /usr/bin/python3, a link to a versioned file: a glob names both
    let config = write_config(&s, "deny program = python3*\n");
    let (err, st) = one_connection(&s, "denied", &config, &[]);
    assert_eq!(err, "");
    st.assert_fallback_reasons(&[("policy", 2)]);
    assert_eq!(st.upgraded(), 0);

    // rdmashim run --config FILE
    let mut c = Command::new(&shim().launcher);
    c.env_remove("LD_PRELOAD")
        .env_remove("RDMASHIM_CONFIG")
        .env_remove("RDMASHIM_DISABLE")
        .arg("run")
        .arg("--config")
        .arg(&config)
        .arg("--stats")
        .arg(s.stats_pattern("run"))
        .args(["--", python().to_str().unwrap(), "-c", ONE_CONNECTION]);
    assert_eq!(run_ok(c, T), "x\n");
    s.one_stats("run").assert_fallback_reasons(&[("policy", 2)]);

    // doctor: the file, its rule, and the verdict for python3
    let mut d = Command::new(&shim().launcher);
    d.env_remove("RDMASHIM_DISABLE")
        .env("RDMASHIM_CONFIG", &config)
        .args(["doctor", "--program"])
        .arg(python());
    let out = run(d, T);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(&format!("config file: {} (read)", config.display())),
        "{text}"
    );
    assert!(text.contains("  line 1: deny program = python3*"), "{text}");
    let verdict = text.lines().last().unwrap();
    assert!(
        verdict.starts_with(&format!(
            "verdict: every connection of {} will stay on TCP (policy: {}:1: deny program = python3*)",
            python().display(),
            config.display()
        )),
        "{verdict}"
    );
    // and for another program, the host's verdict
    let mut d = Command::new(&shim().launcher);
    d.env_remove("RDMASHIM_DISABLE")
        .env_remove("RDMASHIM_LOCAL")
        .env("RDMASHIM_CONFIG", &config)
        .args(["doctor", "--program", "curl"]);
    let out = run(d, T);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("program curl: every connection allowed"),
        "{text}"
    );
    assert!(!text.lines().last().unwrap().contains("policy"), "{text}");
}
