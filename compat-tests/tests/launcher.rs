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

/// Doctor's report and exit status on this host: the shim's verdict, same-host upgrades on
/// by default, and exit 1 only when no connection can be upgraded at all.
#[test]
fn doctor_gives_a_verdict() {
    let has_dev = std::fs::read_dir("/sys/class/infiniband")
        .map(|mut d| d.next().is_some())
        .unwrap_or(false);
    let mut c = launcher();
    c.arg("doctor");
    let out = run(c, T);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("RDMA devices (/sys/class/infiniband)"),
        "{text}"
    );
    assert!(text.contains("libibverbs.so.1: "), "{text}");
    assert!(text.contains("RLIMIT_MEMLOCK: "), "{text}");
    assert!(
        text.contains(
            "memory: a connection over RDMA pins 76 KiB at first (64 KiB of rings: its 16 KiB \
             receive ring"
        ),
        "{text}"
    );
    assert_eq!(out.status.code(), Some(0), "{text}");
    let verdict = text.lines().last().unwrap();
    assert!(
        verdict.ends_with("connections between processes of this host move to shared-memory rings"),
        "same-host upgrades are on by default: {verdict}"
    );
    if !has_dev {
        assert!(
            verdict.starts_with(
                "verdict: connections to other hosts will stay on TCP (no_device: no RDMA device"
            ),
            "{verdict}"
        );
        assert!(
            text.contains("to upgrade connections to other hosts: an RDMA device"),
            "{text}"
        );
        // Nothing at all can be upgraded once same-host upgrades are off, by any boolean.
        for off in ["0", "OFF", "no"] {
            let mut c = launcher();
            c.arg("doctor").env("RDMASHIM_LOCAL", off);
            let out = run(c, T);
            let text = String::from_utf8_lossy(&out.stdout);
            assert_eq!(out.status.code(), Some(1), "{off}: {text}");
            let verdict = text.lines().last().unwrap();
            assert!(
                verdict.contains("(no_device: ")
                    && verdict.ends_with("stay on TCP too (RDMASHIM_LOCAL is off)"),
                "{verdict}"
            );
        }
    }
}

/// RDMASHIM_DISABLE, read as the shim reads it: any boolean for true disables everything
/// (exit 1), an unreadable value too, with the warning the shim itself logs.
#[test]
fn doctor_reads_disable_as_the_shim_does() {
    for v in ["1", "Yes"] {
        let mut c = launcher();
        c.arg("doctor").env("RDMASHIM_DISABLE", v);
        let out = run(c, T);
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{v}: {text}");
        let verdict = text.lines().last().unwrap();
        assert!(
            verdict.starts_with("verdict: every connection will stay on TCP (disabled: "),
            "{verdict}"
        );
        assert!(!text.contains("warning:"), "{text}");
    }
    let mut c = launcher();
    c.arg("doctor").env("RDMASHIM_DISABLE", "FALSE");
    assert_eq!(run(c, T).status.code(), Some(0), "FALSE does not disable");

    let mut c = launcher();
    c.arg("doctor").env("RDMASHIM_DISABLE", "banana");
    let out = run(c, T);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.lines().last().unwrap().contains("(disabled: "),
        "{text}"
    );
    let warning = text
        .lines()
        .find_map(|l| l.strip_prefix("warning: "))
        .unwrap_or_else(|| panic!("no warning: {text}"));
    // The library's own line for the same value, at load.
    let mut c = launcher();
    c.args(["run", "--", "true"])
        .env("RDMASHIM_DISABLE", "banana");
    let out = run(c, T);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.lines()
            .any(|l| l.starts_with("rdmashim[") && l.ends_with(&format!("warn: {warning}"))),
        "doctor said {warning:?}, the shim: {err}"
    );
    assert!(
        warning.starts_with("RDMASHIM_DISABLE=banana: not a boolean"),
        "{warning}"
    );
}

/// `doctor --json` is one JSON object saying what the report says; its memory figure is the
/// transport's own sizes (its default stream configuration, the control message length).
#[test]
fn doctor_json() {
    let mut c = launcher();
    c.args(["doctor", "--json"]).env("RDMASHIM_RING_KIB", "600");
    let out = run(c, T);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().count(), 1, "{text}");
    let j: serde_json::Value = serde_json::from_str(&text).expect("doctor --json is JSON");
    assert_eq!(
        j["exit"].as_u64(),
        Some(u64::from(out.status.code().unwrap() as u8))
    );
    assert_eq!(j["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(j["settings"]["ring_kib"], 600);
    assert_eq!(j["same_host"], true);
    assert!(
        j["devices"].is_array() && j["libraries"].as_array().unwrap().len() == 2,
        "{j}"
    );
    // 600 KiB is made a 1 MiB ring; the send staging ring is the peer's (as big); both are
    // registered over their two views; the receive and control buffers in whole pages.
    let cfg = rdmashim_core::StreamConfig::default();
    let page: u64 = run_ok(
        {
            let mut c = std::process::Command::new("getconf");
            c.arg("PAGESIZE");
            c
        },
        T,
    )
    .trim()
    .parse()
    .unwrap();
    let pages = |n: u64| n.div_ceil(page) * page;
    let ctl = rdmashim_proto::MAX_CONTROL_LEN as u64;
    let ring = 1u64 << 20;
    let want = 2 * 2 * ring
        + pages(u64::from(cfg.recv_slots) * ctl)
        + pages(u64::from(cfg.sq_depth) * ctl);
    assert_eq!(j["per_connection_bytes"]["rdma"], want, "{j}");
    assert_eq!(j["per_connection_bytes"]["ring"], ring, "{j}");
    if !std::path::Path::new("/sys/class/infiniband").exists()
        || j["devices"].as_array().unwrap().is_empty()
    {
        assert_eq!(j["verdict"], "same_host_only", "{j}");
        assert_eq!(j["reason"], "no_device", "{j}");
        assert_eq!(j["exit"], 0, "{j}");
    }
    let mut c = launcher();
    c.args(["doctor", "--json"]).env("RDMASHIM_DISABLE", "1");
    let out = run(c, T);
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (&j["verdict"], &j["reason"], &j["exit"]),
        (&"tcp".into(), &"disabled".into(), &1.into())
    );
    assert_eq!(out.status.code(), Some(1));
}

/// `--help` and `-h` answer for every command (exit 0, nothing run), `--version` names the
/// workspace's version, and a wrong argument is a usage error (exit 2).
#[test]
fn help_and_version() {
    for (args, want) in [
        (&["--help"][..], "rdmashim doctor [--json]"),
        (&["-h"], "RDMASHIM_RING_KIB=N"),
        (&["run", "--help"], "rdmashim run [--stats PATH]"),
        (&["run", "-h"], "--lib PATH"),
        (&["doctor", "--help"], "rdmashim doctor [--json]"),
        (
            &["doctor", "-h"],
            "Exit status: 0 if connections can be upgraded",
        ),
    ] {
        let mut c = launcher();
        c.args(args);
        let out = run(c, T);
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {out:?}");
        assert!(text.contains(want), "{args:?}: {text}");
        assert!(!text.contains("verdict:"), "{args:?} ran doctor: {text}");
    }
    for v in ["--version", "-V"] {
        let mut c = launcher();
        c.arg(v);
        assert_eq!(
            run_ok(c, T).trim(),
            format!("rdmashim {}", env!("CARGO_PKG_VERSION"))
        );
    }
    for args in [
        &["doctor", "--verbose"][..],
        &["run", "--bogus", "true"],
        &["bogus"],
    ] {
        let mut c = launcher();
        c.args(args);
        assert_eq!(run(c, T).status.code(), Some(2), "{args:?}");
    }
}

/// `--lib` must name the shim library: another file is refused before anything runs.
#[test]
fn lib_must_be_the_shim() {
    let s = Scratch::new("launcher-lib");
    let marker = s.dir.join("ran");
    let touch = format!("touch {}", marker.display());
    let libc = std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.ends_with("/libc.so.6"))
        .expect("libc.so.6 mapped")
        .to_string();
    for (lib, why) in [
        ("/etc/hostname", "it is not an ELF file"),
        ("/bin/sh", "not the shim"),
        (
            libc.as_str(),
            "not the shim (it does not define rdmashim_syscall)",
        ),
    ] {
        let mut c = launcher();
        c.args(["run", "--lib", lib, "--", "sh", "-c", &touch]);
        let out = run(c, T);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(127), "{lib}: {err}");
        assert!(
            err.contains("is not librdmashim.so: ") && err.contains(why),
            "{lib}: {err}"
        );
        assert!(!marker.exists(), "{lib}: the program ran");
    }
    let lib = shim().lib.canonicalize().unwrap();
    let mut c = launcher();
    c.args(["run", "--lib"])
        .arg(&lib)
        .args(["--", "sh", "-c", "printf %s \"$LD_PRELOAD\""]);
    assert_eq!(run_ok(c, T), lib.to_str().unwrap());
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
    assert!(
        verdict.starts_with(&format!(
            "verdict: connections to peers running rdmashim will be upgraded over {dev} (port 1 ACTIVE, RoCE v2, address"
        )),
        "{verdict}"
    );
    assert!(verdict.contains(&ip.to_string()), "{verdict}");
    assert!(
        verdict.ends_with("connections between processes of this host move to shared-memory rings"),
        "{verdict}"
    );
    // As the RDMA tier runs: same-host upgrades off, the host's own address over the device.
    let mut c = launcher();
    c.arg("doctor").env("RDMASHIM_LOCAL", "0");
    let out = run(c, T);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    let verdict = text.lines().last().unwrap();
    assert!(
        verdict.contains(&format!("will be upgraded over {dev} ("))
            && verdict.ends_with("those to this host's own RDMA address go over the device)"),
        "{verdict}"
    );
    let mut c = launcher();
    c.args(["doctor", "--json"]);
    let j: serde_json::Value = serde_json::from_str(&run_ok(c, T)).unwrap();
    assert_eq!(j["verdict"], "upgrade", "{j}");
    assert_eq!(j["upgrade_devices"][0], dev.as_str(), "{j}");
    assert_eq!(j["reason"], serde_json::Value::Null, "{j}");
    assert_eq!(j["exit"], 0, "{j}");
}

/// RDMA tier: doctor's memory figures are what an upgraded connection pins. One process holds
/// both ends of a connection over rxe0 (same-host upgrades off); once both are upgraded, the
/// kernel's count of its pinned memory (`VmPin`, what RLIMIT_MEMLOCK limits) is twice
/// doctor's per-connection bytes at the start; after a bulk transfer each way has grown both
/// directions' rings (ring moves), twice its bytes grown — at two ring sizes; and once the
/// connection has stood still for `RDMASHIM_RING_IDLE_SECS` (1 s here), both grown rings are
/// given back, with the staging areas of their size, and it pins what it pinned at the start.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn doctor_memory_is_what_a_connection_pins() {
    let ip = std::env::var("RDMASHIM_TEST_IP")
        .expect("RDMASHIM_TEST_IP not set: run RDMA tests in the VM tier (scripts/rdma-vm)");
    let code = "import socket, sys, threading, time\n\
                start, grown = int(sys.argv[1]), int(sys.argv[2])\n\
                def pinned():\n\
                \x20   for l in open('/proc/self/status'):\n\
                \x20       if l.startswith('VmPin:'): return int(l.split()[1]) * 1024\n\
                s = socket.create_server((sys.argv[3], 0))\n\
                c = socket.create_connection(s.getsockname()); a, _ = s.accept()\n\
                def ping_until(want):\n\
                \x20   end = time.time() + 20\n\
                \x20   while pinned() != want and time.time() < end:\n\
                \x20       c.sendall(b'x'); a.recv(1); a.sendall(b'y'); c.recv(1); time.sleep(0.02)\n\
                \x20   time.sleep(0.2); return pinned()\n\
                def take(sock, n):\n\
                \x20   while n: n -= len(sock.recv(min(n, 65536)))\n\
                first = ping_until(start)\n\
                n = 4 << 20\n\
                readers = [threading.Thread(target=take, args=(x, n)) for x in (a, c)]\n\
                for r in readers: r.start()\n\
                w = threading.Thread(target=a.sendall, args=(b's' * n,)); w.start()\n\
                c.sendall(b'c' * n); w.join()\n\
                for r in readers: r.join()\n\
                def quiet_until(want):\n\
                \x20   end = time.time() + 15\n\
                \x20   while pinned() != want and time.time() < end: time.sleep(0.1)\n\
                \x20   return pinned()\n\
                print(first, ping_until(grown), quiet_until(start))";
    for kib in ["512", "64"] {
        let mut c = launcher();
        c.args(["doctor", "--json"]).env("RDMASHIM_RING_KIB", kib);
        let j: serde_json::Value = serde_json::from_str(&run_ok(c, T)).unwrap();
        let start = j["per_connection_bytes"]["rdma_start"].as_u64().unwrap();
        let grown = j["per_connection_bytes"]["rdma"].as_u64().unwrap();
        let s = Scratch::new("doctor-pin");
        let mut c = launcher();
        c.arg("run")
            .arg("--stats")
            .arg(s.stats_pattern("pin"))
            .args(["--no-local", "--"])
            .arg(python())
            .args(["-c", code])
            .arg((2 * start).to_string())
            .arg((2 * grown).to_string())
            .arg(&ip)
            .env("RDMASHIM_RING_KIB", kib)
            .env("RDMASHIM_RING_IDLE_SECS", "1");
        let out = run_ok(c, T);
        let pinned: Vec<u64> = out.split_whitespace().map(|v| v.parse().unwrap()).collect();
        assert_eq!(s.one_stats("pin").upgraded(), 2, "both ends upgraded");
        assert_eq!(
            pinned,
            [2 * start, 2 * grown, 2 * start],
            "RDMASHIM_RING_KIB={kib}: VmPin at the start, grown and after the quiet, doctor \
             says {start} and {grown} per connection"
        );
    }
}

/// RDMA tier: with a pool of huge pages on the host (`vm.nr_hugepages`, set here: the tier
/// runs as root in its VM) and rings of 2 MiB, doctor says grown rings will be made of them,
/// and they are: one process holds both ends of a connection over rxe0, a transfer each way
/// grows both directions' rings, and then its four rings (each side's receive ring and staging
/// area) are eight mappings of 2 MiB pages (`KernelPageSize` in `/proc/self/smaps`: both views
/// of each), the bytes intact; with `RDMASHIM_HUGE_PAGES=0`, none are.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn grown_rings_are_made_of_huge_pages_where_the_host_has_them() {
    let ip = std::env::var("RDMASHIM_TEST_IP")
        .expect("RDMASHIM_TEST_IP not set: run RDMA tests in the VM tier (scripts/rdma-vm)");
    std::fs::write("/proc/sys/vm/nr_hugepages", "32")
        .expect("vm.nr_hugepages (the RDMA tier runs as root in its VM)");
    let code = "import hashlib, socket, sys, threading\n\
                s = socket.create_server((sys.argv[1], 0))\n\
                c = socket.create_connection(s.getsockname()); a, _ = s.accept()\n\
                n = 16 << 20\n\
                got = {}\n\
                def take(name, sock):\n\
                \x20   h, left = hashlib.sha256(), n\n\
                \x20   while left:\n\
                \x20       b = sock.recv(min(left, 65536)); h.update(b); left -= len(b)\n\
                \x20   got[name] = h.hexdigest()\n\
                readers = [threading.Thread(target=take, args=x) for x in (('a', a), ('c', c))]\n\
                for r in readers: r.start()\n\
                w = threading.Thread(target=a.sendall, args=(b's' * n,)); w.start()\n\
                c.sendall(b'c' * n); w.join()\n\
                for r in readers: r.join()\n\
                assert got['a'] == hashlib.sha256(b'c' * n).hexdigest(), 'client to server'\n\
                assert got['c'] == hashlib.sha256(b's' * n).hexdigest(), 'server to client'\n\
                huge, name = 0, ''\n\
                for l in open('/proc/self/smaps'):\n\
                \x20   f = l.split()\n\
                \x20   if '-' in f[0] and len(f) >= 5: name = ' '.join(f[5:])\n\
                \x20   elif f[0] == 'KernelPageSize:' and 'rdmashim-ring' in name and f[1] == '2048':\n\
                \x20       huge += 1\n\
                print(huge)";
    for (setting, want) in [("1", 8), ("0", 0)] {
        let mut c = launcher();
        c.args(["doctor", "--json"])
            .env("RDMASHIM_RING_KIB", "2048")
            .env("RDMASHIM_HUGE_PAGES", setting);
        let j: serde_json::Value = serde_json::from_str(&run_ok(c, T)).unwrap();
        assert_eq!(
            j["huge_pages"]["grown_rings_use_them"],
            setting == "1",
            "{}",
            j["huge_pages"]
        );
        let s = Scratch::new("huge-pages");
        let mut c = launcher();
        c.arg("run")
            .arg("--stats")
            .arg(s.stats_pattern("huge"))
            .args(["--no-local", "--"])
            .arg(python())
            .args(["-c", code])
            .arg(&ip)
            .env("RDMASHIM_RING_KIB", "2048")
            .env("RDMASHIM_HUGE_PAGES", setting);
        let out = run_ok(c, T);
        assert_eq!(s.one_stats("huge").upgraded(), 2, "both ends upgraded");
        assert_eq!(
            out.trim(),
            want.to_string(),
            "RDMASHIM_HUGE_PAGES={setting}: mappings of the rings on 2 MiB pages"
        );
    }
    std::fs::write("/proc/sys/vm/nr_hugepages", "0").unwrap();
}
