//! The `rdmashim` launcher: `run` preloads the library (appending to LD_PRELOAD), passes the
//! exit status through, sets the configuration; `doctor` gives a verdict.

use rdmashim_compat_tests::*;
use std::process::Command;

fn launcher() -> Command {
    let mut c = Command::new(&shim().launcher);
    c.env_remove("LD_PRELOAD")
        .env_remove("RDMASHIM_STATS")
        .env_remove("RDMASHIM_DISABLE")
        .env_remove("RDMASHIM_LOCAL");
    c
}

#[test]
fn exit_status_passes_through() {
    let mut c = launcher();
    c.args(["run", "--", "sh", "-c", "exit 7"]);
    assert_eq!(run(c, T).status.code(), Some(7));
    let mut c = launcher();
    c.args(["run", "--", "/nonexistent/program"]);
    assert_eq!(run(c, T).status.code(), Some(127));
}

/// A program the loader cannot put the shim into is named on stderr before it runs (and runs
/// all the same); a dynamic one gets no word, and `--log off` silences the warning.
#[test]
fn programs_the_shim_cannot_reach_are_named() {
    let Some(busybox) = require("/bin/busybox") else {
        return;
    };
    let mut c = launcher();
    c.args(["run", "--"])
        .arg(&busybox)
        .args(["sh", "-c", "exit 3"]);
    let out = run(c, T);
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("rdmashim: warning:") && err.contains("is statically linked"),
        "stderr: {err}"
    );
    let mut c = launcher();
    c.args(["run", "--log", "off", "--"])
        .arg(&busybox)
        .arg("true");
    let out = run(c, T);
    assert!(out.status.success() && out.stderr.is_empty(), "{out:?}");
    let mut c = launcher();
    c.args(["run", "--", "sh", "-c", "true"]);
    let out = run(c, T);
    assert!(out.status.success() && out.stderr.is_empty(), "{out:?}");
}

#[test]
fn preload_is_set_and_appended() {
    let lib = shim().lib.canonicalize().unwrap();
    let mut c = launcher();
    c.args(["run", "--", "sh", "-c", "printf %s \"$LD_PRELOAD\""]);
    assert_eq!(run_ok(c, T), lib.to_str().unwrap());
    let mut c = launcher();
    c.args(["run", "--", "sh", "-c", "printf %s \"$LD_PRELOAD\""])
        .env("LD_PRELOAD", "libc.so.6");
    assert_eq!(run_ok(c, T), format!("libc.so.6:{}", lib.display()));
}

#[test]
fn options_reach_the_shim() {
    let s = Scratch::new("launcher");
    let py = python();
    let code = "import socket\n\
                l = socket.socket(); l.bind(('127.0.0.1', 0)); l.listen()\n\
                c = socket.create_connection(l.getsockname()); a, _ = l.accept(); print('ok')";
    let mut c = launcher();
    c.arg("run")
        .arg("--stats")
        .arg(s.stats_pattern("py"))
        .args(["--log", "debug", "--no-local", "--"])
        .arg(&py)
        .args(["-c", code]);
    let out = run(c, T);
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("] debug: loaded"), "debug log missing: {err}");
    assert!(err.contains("connection stays on TCP"), "{err}");
    let st = s.one_stats("py");
    assert_eq!(st.connections(), 2);
    st.assert_all_fallback(&loopback_tcp_reason());

    let mut c = launcher();
    c.arg("run")
        .arg("--stats")
        .arg(s.stats_pattern("dis"))
        .arg("--disable")
        .arg("--")
        .arg(&py)
        .args(["-c", code]);
    run_ok(c, T);
    s.one_stats("dis").assert_all_fallback("disabled");
}

#[test]
fn doctor_gives_a_verdict() {
    let mut c = launcher();
    c.arg("doctor");
    let out = run_ok(c, T);
    assert!(
        out.contains("RDMA devices (/sys/class/infiniband)"),
        "{out}"
    );
    assert!(out.contains("libibverbs.so.1: "), "{out}");
    assert!(out.contains("RLIMIT_MEMLOCK: "), "{out}");
    let verdict = out.lines().last().unwrap();
    assert!(
        verdict.starts_with("verdict: connections to other hosts will stay on TCP ("),
        "{verdict}"
    );
    assert!(
        verdict.ends_with("connections between processes of this host move to shared-memory rings"),
        "same-host upgrades are on by default: {verdict}"
    );
    let mut off = launcher();
    off.arg("doctor").env("RDMASHIM_LOCAL", "0");
    let out = run_ok(off, T);
    let verdict = out.lines().last().unwrap();
    assert!(
        verdict.ends_with("stay on TCP too (RDMASHIM_LOCAL is off)"),
        "{verdict}"
    );
    let has_dev = std::fs::read_dir("/sys/class/infiniband")
        .map(|mut d| d.next().is_some())
        .unwrap_or(false);
    if !has_dev {
        assert!(verdict.contains("(no_device: "), "{verdict}");
    }
}

/// RDMA tier: inside the soft-RoCE VM, doctor finds the device, its active port and its RoCE
/// GID carrying the test address, and says both libraries load.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn doctor_finds_the_rdma_device_in_the_vm() {
    let dev = std::env::var("RDMASHIM_TEST_DEVICE")
        .expect("RDMASHIM_TEST_DEVICE not set: run RDMA tests in the VM tier (scripts/rdma-vm)");
    let ip: std::net::Ipv4Addr = std::env::var("RDMASHIM_TEST_IP")
        .expect("RDMASHIM_TEST_IP not set")
        .parse()
        .expect("RDMASHIM_TEST_IP is an IPv4 address");
    let mut c = launcher();
    c.arg("doctor");
    let out = run_ok(c, T);
    assert!(
        out.contains(&format!("  {dev}: ")),
        "{dev} not listed:\n{out}"
    );
    assert!(out.contains("ACTIVE"), "no active port:\n{out}");
    let o = ip.octets();
    let gid_tail = format!("ffff:{:02x}{:02x}:{:02x}{:02x}", o[0], o[1], o[2], o[3]);
    assert!(
        out.contains(&gid_tail),
        "no GID for {ip} ({gid_tail}):\n{out}"
    );
    assert!(out.contains("libibverbs.so.1: loads"), "{out}");
    assert!(out.contains("librdmacm.so.1: loads"), "{out}");
    let verdict = out.lines().last().unwrap();
    assert!(verdict.starts_with("verdict: "), "{verdict}");
    assert!(!verdict.contains("no_device"), "{verdict}");
    assert!(!verdict.contains("libraries_missing"), "{verdict}");
}
