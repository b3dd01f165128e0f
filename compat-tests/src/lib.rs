//! Harness for running real programs under the shim.
//!
//! The library under test is built on first use by `cargo build -p rdmashim-shim -p
//! rdmashim-cli` into `<target>/rdmashim-compat/`, where `<target>` is the target directory that
//! built the running test executable (so `CARGO_TARGET_DIR` is honoured and nothing is
//! hard-coded); a separate directory avoids waiting on the lock of the outer `cargo test`.
//! `RDMASHIM_TEST_LIB` / `RDMASHIM_TEST_LAUNCHER` override the paths (e.g. to test a release
//! build).
//!
//! Every spawned process has a deadline and every server is killed when its guard drops; ports
//! are free ephemeral ports on 127.0.0.1 (or, in the RDMA tier, on `RDMASHIM_TEST_IP`).
//!
//! **RDMA tier.** Tests marked `#[ignore]` run inside the soft-RoCE VM (`scripts/test`, which
//! passes `--ignored`), where `RDMASHIM_TEST_IP` and `RDMASHIM_TEST_DEVICE` are set; [`test_ip`]
//! and [`test_device`] read them and fail (never skip) when a test is selected without them.
//! Such a test proves the upgrade happened three ways: the shim's own counters on both sides
//! ([`Stats::assert_upgraded`]), the bytes that went through the rings (`bytes.ring_*`), and the
//! device's packet counters ([`DeviceCounters`]) growing by at least that many bytes' worth of
//! packets.
//!
//! **Asynchronous upgrade.** The application never waits for the upgrade: bytes written before
//! a side switches over go by TCP. A test that wants a lower bound on ring bytes therefore sends
//! that payload on a connection older than [`UPGRADE_DEADLINE`] (by then the upgrade is final:
//! established, or fallen back), and only byte totals (ring + TCP) are asserted for payload
//! sent at once after connecting.
#![forbid(unsafe_code)]

pub mod postgres;
pub mod prefork_http;
pub mod two_host;

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The built artifacts.
pub struct Shim {
    pub lib: PathBuf,
    pub launcher: PathBuf,
}

/// `<target>/<profile>` of the running test executable.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let mut dir = exe.parent().expect("exe dir").to_path_buf();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    dir
}

/// Builds (once per test process) and returns the shim library and launcher.
pub fn shim() -> &'static Shim {
    static SHIM: OnceLock<Shim> = OnceLock::new();
    SHIM.get_or_init(|| {
        if let (Some(lib), Some(launcher)) = (
            std::env::var_os("RDMASHIM_TEST_LIB"),
            std::env::var_os("RDMASHIM_TEST_LAUNCHER"),
        ) {
            return Shim {
                lib: lib.into(),
                launcher: launcher.into(),
            };
        }
        let profile = profile_dir();
        let release = profile.file_name().is_some_and(|n| n == "release");
        let target = profile
            .parent()
            .expect("target dir")
            .join("rdmashim-compat");
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args([
            "build",
            "--quiet",
            "-p",
            "rdmashim-shim",
            "-p",
            "rdmashim-cli",
            "--manifest-path",
        ])
        .arg(&manifest)
        .env("CARGO_TARGET_DIR", &target);
        if release {
            cmd.arg("--release");
        }
        let st = cmd.status().expect("run cargo build for the shim");
        assert!(st.success(), "building the shim failed: {st}");
        let out = target.join(if release { "release" } else { "debug" });
        let shim = Shim {
            lib: out.join("librdmashim.so"),
            launcher: out.join("rdmashim"),
        };
        assert!(shim.lib.is_file(), "{} missing", shim.lib.display());
        assert!(
            shim.launcher.is_file(),
            "{} missing",
            shim.launcher.display()
        );
        shim
    })
}

/// Absolute path of a program on PATH (or the given absolute path). Panics with a clear
/// message if missing (the setup script installs them), unless RDMASHIM_COMPAT_SKIP_MISSING=1,
/// in which case `None` lets the test return early.
pub fn require(prog: &str) -> Option<PathBuf> {
    let found = if prog.contains('/') {
        Some(PathBuf::from(prog)).filter(|p| p.is_file())
    } else {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(prog))
                .find(|p| p.is_file())
        })
    };
    if found.is_none() {
        if std::env::var_os("RDMASHIM_COMPAT_SKIP_MISSING").is_some() {
            eprintln!("SKIP: {prog} not installed");
            return None;
        }
        panic!("{prog} is not installed (scripts/setup installs the programs the tests use)");
    }
    found
}

/// The system python (a pyenv shim on PATH would be a bash script in front of it).
pub fn python() -> PathBuf {
    ["/usr/bin/python3", "/usr/local/bin/python3"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .or_else(|| require("python3"))
        .expect("python3")
}

/// The names in `dir`, sorted.
pub fn dir_names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// A fresh directory for one test's stats files (removed on drop unless the test panicked).
pub struct Scratch {
    pub dir: PathBuf,
}

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("rdmashim-compat-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Scratch { dir }
    }

    /// RDMASHIM_STATS pattern for processes labelled `label`.
    pub fn stats_pattern(&self, label: &str) -> PathBuf {
        self.dir.join(format!("{label}.%p.json"))
    }

    /// All stats files written by processes labelled `label`.
    pub fn stats(&self, label: &str) -> Vec<Stats> {
        let mut v: Vec<Stats> = std::fs::read_dir(&self.dir)
            .expect("read scratch")
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| {
                let n = p.file_name().unwrap().to_string_lossy().to_string();
                n.starts_with(&format!("{label}.")) && n.ends_with(".json")
            })
            .map(|p| Stats::load(&p))
            .collect();
        v.sort_by_key(|s| s.pid);
        v
    }

    /// The stats file of process `pid` labelled `label` (a server whose forked children may
    /// write files of their own under the same label).
    pub fn stats_of(&self, label: &str, pid: u32) -> Stats {
        let all = self.stats(label);
        let pids: Vec<u64> = all.iter().map(|s| s.pid).collect();
        all.into_iter()
            .find(|s| s.pid == u64::from(pid))
            .unwrap_or_else(|| panic!("no stats file for {label} pid {pid} (pids: {pids:?})"))
    }

    /// Exactly one stats file for `label`.
    pub fn one_stats(&self, label: &str) -> Stats {
        let mut v = self.stats(label);
        assert_eq!(
            v.len(),
            1,
            "expected one stats file for {label}, got {}: {v:#?}",
            v.len()
        );
        v.pop().unwrap()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("stats kept in {}", self.dir.display());
        }
    }
}

/// How a program is put under the shim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// `LD_PRELOAD=librdmashim.so` and `RDMASHIM_*` variables set by the test.
    Preload,
    /// The launcher: `rdmashim run --stats PATTERN --log warn -- PROGRAM`.
    Launcher,
}

/// A command that runs under the shim (LD_PRELOAD) with its stats labelled `label`.
pub fn shimmed(prog: impl AsRef<std::ffi::OsStr>, scratch: &Scratch, label: &str) -> Command {
    under_shim(Via::Preload, prog, scratch, label)
}

/// A command that runs under the shim `via` the preload variable or the launcher, with its
/// stats labelled `label`. Arguments added to the command go to `prog`.
///
/// Its log level is `warn`, unless `RDMASHIM_TEST_LOG` names another (`debug` to follow a
/// failure); with `RDMASHIM_TEST_LOG_DIR` too, its log lines go to `DIR/LABEL.PID.log`
/// instead of its stderr (a test may set its own log after this; that one wins).
pub fn under_shim(
    via: Via,
    prog: impl AsRef<std::ffi::OsStr>,
    scratch: &Scratch,
    label: &str,
) -> Command {
    let level = std::env::var("RDMASHIM_TEST_LOG").unwrap_or_else(|_| "warn".into());
    let log_file = std::env::var_os("RDMASHIM_TEST_LOG_DIR")
        .map(|d| PathBuf::from(d).join(format!("{label}.%p.log")));
    let mut c = match via {
        Via::Preload => {
            let mut c = Command::new(prog);
            c.env("LD_PRELOAD", &shim().lib)
                .env("RDMASHIM_STATS", scratch.stats_pattern(label))
                .env("RDMASHIM_LOG", &level)
                .env_remove("RDMASHIM_DISABLE");
            c
        }
        Via::Launcher => {
            let mut c = Command::new(&shim().launcher);
            c.env_remove("LD_PRELOAD")
                .env_remove("RDMASHIM_STATS")
                .env_remove("RDMASHIM_DISABLE")
                .arg("run")
                .arg("--stats")
                .arg(scratch.stats_pattern(label))
                .args(["--log", &level, "--"])
                .arg(prog);
            c
        }
    };
    if let Some(f) = log_file {
        c.env("RDMASHIM_LOG_FILE", f);
    }
    c
}

/// Runs `cmd` to completion within `timeout` (killed after), capturing output.
pub fn run(cmd: Command, timeout: Duration) -> Output {
    run_stdin(cmd, Stdio::null(), timeout)
}

fn run_stdin(mut cmd: Command, stdin: Stdio, timeout: Duration) -> Output {
    cmd.stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    wait_child_of(child, timeout, &format!("{cmd:?}"))
}

/// Waits for a spawned `child` (its piped output collected) for at most `timeout`; killed and
/// a panic after that.
pub fn wait_child(child: Child, timeout: Duration) -> Output {
    let desc = format!("pid {}", child.id());
    wait_child_of(child, timeout, &desc)
}

fn wait_child_of(child: Child, timeout: Duration, desc: &str) -> Output {
    let deadline = Instant::now() + timeout;
    let id = child.id();
    // Wait in a helper thread so that pipes are drained while we wait.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        Ok(out) => out.expect("wait"),
        Err(_) => {
            signal(id, "KILL");
            panic!("{desc} did not finish within {timeout:?}");
        }
    }
}

/// Asserts `out` (of the command described by `desc`) succeeded; returns stdout.
fn ok_stdout(desc: &str, out: Output) -> String {
    assert!(
        out.status.success(),
        "{desc} failed: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `cmd` and asserts it succeeded; returns stdout.
pub fn run_ok(cmd: Command, timeout: Duration) -> String {
    let desc = format!("{cmd:?}");
    ok_stdout(&desc, run(cmd, timeout))
}

/// Like [`run_ok`], with stdin read from the file `input` (e.g. `redis-cli -x`, for arguments
/// longer than the 128 KiB an argv string may have).
pub fn run_ok_with_input(cmd: Command, input: &Path, timeout: Duration) -> String {
    let desc = format!("{cmd:?} < {}", input.display());
    let f = std::fs::File::open(input).unwrap_or_else(|e| panic!("{}: {e}", input.display()));
    ok_stdout(&desc, run_stdin(cmd, f.into(), timeout))
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status();
}

/// A background server; on drop (or `stop`) it gets `stop_signal`, then SIGKILL after a grace
/// period.
pub struct Server {
    child: Option<Child>,
    name: String,
    stop_signal: &'static str,
}

impl Server {
    pub fn start(mut cmd: Command, name: &str, stop_signal: &'static str) -> Server {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        Server {
            child: Some(child),
            name: name.to_string(),
            stop_signal,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, |c| c.id())
    }

    /// Fails if the server died.
    pub fn assert_running(&mut self) {
        if let Some(c) = self.child.as_mut() {
            if let Ok(Some(st)) = c.try_wait() {
                panic!("{} exited early: {st}", self.name);
            }
        }
    }

    /// Waits up to `timeout` for a server that ends by itself (its clients gone) and returns
    /// its exit status; `None` if it was still running then (it is left running, for `stop`).
    /// `stop` right after the last client would race the server's own exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let c = self.child.as_mut()?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(st)) = c.try_wait() {
                self.child = None;
                return Some(st);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the server gracefully (so it writes its stats) and returns its exit status.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        let mut c = self.child.take()?;
        signal(c.id(), self.stop_signal);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(st)) = c.try_wait() {
                return Some(st);
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                return c.wait().ok();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A currently free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    free_port_on("127.0.0.1")
}

/// A currently free TCP port on `ip` (an address of this host), for a server started later.
///
/// Taken below the kernel's ephemeral range (`ip_local_port_range`), never from it: a port
/// that `bind(0)` handed out and gave back is the first one the next `bind(0)` gets, so a
/// test running beside this one (a scenario server on port 0, a client's source port) took
/// it before this test's server started (seen in CI: a curl reached another test's server).
/// Each process starts at its own offset, and a port is only returned once per process.
pub fn free_port_on(ip: &str) -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    if low > 12_000 {
        let span = low - 10_000;
        let start = std::process::id().wrapping_mul(7919) % span;
        for _ in 0..span {
            let port = 10_000 + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
            if std::net::TcpListener::bind((ip, port as u16)).is_ok() {
                return port as u16;
            }
        }
    }
    let l = std::net::TcpListener::bind((ip, 0)).unwrap_or_else(|e| panic!("bind {ip}:0: {e}"));
    l.local_addr().unwrap().port()
}

/// `(local port, state, inode)` of every TCP socket of this network namespace, from
/// /proc/net/tcp{,6} (state as the kernel's hex code: `0A` listening, `01` established).
fn tcp_sockets() -> Vec<(u16, String, u64)> {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .flat_map(|f| {
            std::fs::read_to_string(f)
                .unwrap_or_default()
                .lines()
                .skip(1)
                .filter_map(|l| {
                    let cols: Vec<&str> = l.split_whitespace().collect();
                    let port = cols.get(1)?.rsplit(':').next()?;
                    let port = u16::from_str_radix(port, 16).ok()?;
                    let inode = cols.get(9)?.parse().ok()?;
                    Some((port, cols.get(3)?.to_string(), inode))
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The inodes of the sockets open in process `pid` and its descendants (a server's listener
/// may be in a child it started), from /proc.
fn socket_inodes(pid: u32) -> std::collections::HashSet<u64> {
    let mut out = std::collections::HashSet::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        if let Ok(fds) = std::fs::read_dir(format!("/proc/{p}/fd")) {
            for fd in fds.flatten() {
                let link = std::fs::read_link(fd.path()).unwrap_or_default();
                let link = link.to_string_lossy();
                if let Some(ino) = link
                    .strip_prefix("socket:[")
                    .and_then(|s| s.strip_suffix(']'))
                    .and_then(|s| s.parse().ok())
                {
                    out.insert(ino);
                }
            }
        }
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) {
            for t in tasks.flatten() {
                let kids = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
                todo.extend(
                    kids.split_whitespace()
                        .filter_map(|k| k.parse::<u32>().ok()),
                );
            }
        }
    }
    out
}

/// A figure of process `pid`'s `/proc/PID/status` given in kB (`VmPin`, `VmRSS`, ...), in KiB;
/// `None` if the process or the field is gone.
pub fn proc_status_kib(pid: u32, field: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Number of established TCP connections whose local port is `port` (a server's accepted
/// connections, including those still in its backlog), without making one.
pub fn count_established(port: u16) -> usize {
    tcp_sockets()
        .iter()
        .filter(|(p, st, _)| *p == port && st == "01")
        .count()
}

/// Waits until something listens on port `port` (any address), reading /proc/net/tcp (no
/// connection is made, so servers' connection counts are not disturbed).
pub fn wait_listening(port: u16, server: &mut Server, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        // (the server's own: another test's listener may have been given the same free port,
        // and this server then failed to bind it)
        let ours = socket_inodes(server.pid());
        let listening = tcp_sockets()
            .iter()
            .any(|(p, st, ino)| *p == port && st == "0A" && ours.contains(ino));
        if listening {
            return;
        }
        server.assert_running();
        assert!(
            Instant::now() < deadline,
            "nothing listening on port {port} after {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One process's stats file.
#[derive(Debug, Clone)]
pub struct Stats {
    pub pid: u64,
    pub calls: BTreeMap<String, u64>,
    pub upgraded: u64,
    /// Upgraded connections that went back to TCP (a switch back, protocol §8.5).
    pub switched_back: u64,
    /// Upgraded connections whose ring path failed and that went on over TCP (protocol §8.6).
    pub path_failed: u64,
    pub fallback: u64,
    pub reasons: BTreeMap<String, u64>,
    /// Connections upgraded over RDMA by the kind they carry (`imm`, `records`, `sends`,
    /// `read`, `duplex`).
    pub kinds: BTreeMap<String, u64>,
    pub bytes: BTreeMap<String, u64>,
    pub raw: Value,
    /// The label of the process (see [`Scratch::stats_pattern`]); empty if not loaded from a
    /// file.
    pub label: String,
}

impl Stats {
    pub fn load(p: &Path) -> Stats {
        let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        let v: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}: {text}", p.display()));
        let mut s = Stats::from_value(v);
        // "LABEL.PID.json", as Scratch::stats_pattern names them
        let name = p.file_name().unwrap_or_default().to_string_lossy();
        s.label = name.split('.').next().unwrap_or_default().to_string();
        s
    }

    /// Parses and checks the schema (every key of the documented shape present, numbers).
    pub fn from_value(v: Value) -> Stats {
        let map = |x: &Value, what: &str| -> BTreeMap<String, u64> {
            x.as_object()
                .unwrap_or_else(|| panic!("{what} is not an object: {v}"))
                .iter()
                .map(|(k, n)| {
                    (
                        k.clone(),
                        n.as_u64().unwrap_or_else(|| panic!("{what}.{k} not a u64")),
                    )
                })
                .collect()
        };
        let conns = &v["connections"];
        let s = Stats {
            pid: v["pid"].as_u64().expect("pid"),
            calls: map(&v["calls"], "calls"),
            upgraded: conns["upgraded"].as_u64().expect("connections.upgraded"),
            switched_back: conns["switched_back"]
                .as_u64()
                .expect("connections.switched_back"),
            path_failed: conns["path_failed"]
                .as_u64()
                .expect("connections.path_failed"),
            fallback: conns["fallback"].as_u64().expect("connections.fallback"),
            reasons: map(&conns["fallback_reasons"], "fallback_reasons"),
            kinds: map(&conns["kinds"], "kinds"),
            bytes: map(&v["bytes"], "bytes"),
            raw: v.clone(),
            label: String::new(),
        };
        for k in ["ring_tx", "ring_rx", "tcp_tx", "tcp_rx", "shm_tx", "shm_rx"] {
            assert!(s.bytes.contains_key(k), "bytes.{k} missing");
        }
        for k in ["imm", "records", "sends", "read", "duplex"] {
            assert!(s.kinds.contains_key(k), "connections.kinds.{k} missing");
        }
        assert!(
            s.kinds.values().sum::<u64>() <= s.upgraded,
            "more connections by kind than upgraded: {v}"
        );
        assert_eq!(
            s.reasons.values().sum::<u64>(),
            s.fallback,
            "reasons do not add up: {v}"
        );
        s
    }

    pub fn calls(&self, hook: &str) -> u64 {
        *self
            .calls
            .get(hook)
            .unwrap_or_else(|| panic!("hook {hook} missing from stats"))
    }

    pub fn connections(&self) -> u64 {
        self.upgraded + self.fallback
    }

    pub fn bytes(&self, k: &str) -> u64 {
        self.bytes[k]
    }

    /// Connections upgraded over RDMA that carried kind `k` (`imm`, `sends`, `read`, …).
    pub fn kind(&self, k: &str) -> u64 {
        *self
            .kinds
            .get(k)
            .unwrap_or_else(|| panic!("kind {k} missing from stats"))
    }

    /// Asserts each hook fired at least once.
    pub fn assert_fired(&self, hooks: &[&str]) {
        let missing: Vec<_> = hooks.iter().filter(|h| self.calls(h) == 0).collect();
        assert!(
            missing.is_empty(),
            "hooks that did not fire in pid {}: {missing:?}\n{:?}",
            self.pid,
            self.nonzero_calls()
        );
    }

    pub fn nonzero_calls(&self) -> BTreeMap<&str, u64> {
        self.calls
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(k, n)| (k.as_str(), *n))
            .collect()
    }

    /// Asserts every connection stayed on TCP with `reason`.
    pub fn assert_all_fallback(&self, reason: &str) {
        assert_eq!(
            self.upgraded, 0,
            "pid {}: upgraded connections on a host without RDMA",
            self.pid
        );
        assert_eq!(
            self.reasons.get(reason).copied().unwrap_or(0),
            self.fallback,
            "pid {}: not every fallback has reason {reason}: {:?}",
            self.pid,
            self.reasons
        );
    }
}

impl Stats {
    /// The process's parent when it started (0 if the record has none).
    pub fn ppid(&self) -> u64 {
        self.raw["ppid"].as_u64().unwrap_or(0)
    }

    /// Connections this process moved onto RDMA rings.
    pub fn upgraded(&self) -> u64 {
        self.upgraded
    }

    /// Connections counted with fallback reason `name` (0 for a reason this build of the shim
    /// does not know).
    pub fn reason(&self, name: &str) -> u64 {
        self.reasons.get(name).copied().unwrap_or(0)
    }

    /// The fallback reasons that occurred, with their counts.
    pub fn nonzero_reasons(&self) -> BTreeMap<&str, u64> {
        self.reasons
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(k, n)| (k.as_str(), *n))
            .collect()
    }

    /// How often this process's blocked calls ended their waits as `kind` (`spin_hit`,
    /// `spin_miss`, `spin_preempted`, `slept`).
    pub fn waits(&self, kind: &str) -> u64 {
        self.raw["waits"][kind]
            .as_u64()
            .unwrap_or_else(|| panic!("waits.{kind} missing from stats: {}", self.raw))
    }

    /// Bytes that went through the RDMA rings, both directions.
    pub fn ring_bytes(&self) -> u64 {
        self.bytes("ring_tx") + self.bytes("ring_rx")
    }

    /// Bytes that went through shared-memory rings (a peer of this host), both directions.
    pub fn shm_bytes(&self) -> u64 {
        self.bytes("shm_tx") + self.bytes("shm_rx")
    }

    /// One line for assertion messages: connections, reasons, bytes.
    pub fn summary(&self) -> String {
        format!(
            "{} pid {}: upgraded {}, switched back {}, path failed {}, fallback {} {:?}, ring_tx {}, ring_rx {}, shm_tx {}, shm_rx {}, tcp_tx {}, tcp_rx {}",
            self.label,
            self.pid,
            self.upgraded,
            self.switched_back,
            self.path_failed,
            self.fallback,
            self.nonzero_reasons(),
            self.bytes("ring_tx"),
            self.bytes("ring_rx"),
            self.bytes("shm_tx"),
            self.bytes("shm_rx"),
            self.bytes("tcp_tx"),
            self.bytes("tcp_rx")
        )
    }

    /// Asserts at least `min_conns` connections were upgraded and at least `min_ring_bytes`
    /// bytes went through the rings (sent and received together), and that the connections
    /// upgraded over RDMA carried the kind shims ask for by default ([`default_kind`]).
    pub fn assert_upgraded(&self, min_conns: u64, min_ring_bytes: u64) {
        assert!(
            self.upgraded >= min_conns,
            "expected at least {min_conns} upgraded connections: {}",
            self.summary()
        );
        assert!(
            self.ring_bytes() >= min_ring_bytes,
            "expected at least {min_ring_bytes} ring bytes: {}",
            self.summary()
        );
        self.assert_default_kind();
    }

    /// Asserts every connection of this process (at least one) was upgraded, those over RDMA
    /// of the default kind ([`default_kind`]).
    pub fn assert_all_upgraded(&self) {
        assert!(
            self.upgraded >= 1 && self.fallback == 0,
            "expected every connection upgraded: {}",
            self.summary()
        );
        self.assert_default_kind();
    }

    /// Asserts every connection counted by kind (the upgrades over RDMA) carried
    /// [`default_kind`], and that bytes over RDMA rings came with one at least: the programs
    /// of a test that set no kind on either side speak the shims' default.
    pub fn assert_default_kind(&self) {
        let want = default_kind();
        let all: u64 = self.kinds.values().sum();
        assert!(
            self.kind(want) == all && (self.ring_bytes() == 0 || all > 0),
            "{}: connections over RDMA of the default kind {want} expected: {:?}",
            self.summary(),
            self.kinds
        );
    }

    /// Asserts at least `min_tx` bytes were sent and `min_rx` received through the rings.
    pub fn assert_ring_at_least(&self, min_tx: u64, min_rx: u64) {
        Rings::Rdma.assert_at_least(self, min_tx, min_rx);
    }

    /// Asserts every connection of this process ended on TCP: each one upgraded went back
    /// (`switched_back`), and every fallback has one of the `allowed` reasons (for programs
    /// whose process models decide by timing which of these happens).
    pub fn assert_ends_on_tcp(&self, allowed: &[&str]) {
        assert_eq!(
            self.switched_back,
            self.upgraded,
            "back on TCP: {}",
            self.summary()
        );
        let named: u64 = allowed.iter().map(|a| self.reason(a)).sum();
        assert_eq!(
            self.fallback,
            named,
            "reasons among {allowed:?}: {}",
            self.summary()
        );
    }

    /// Asserts nothing was upgraded and the fallback reasons are exactly `expected` (reason,
    /// count); reasons not listed must not occur.
    pub fn assert_fallback_reasons(&self, expected: &[(&str, u64)]) {
        let want: BTreeMap<&str, u64> = expected.iter().filter(|(_, n)| *n > 0).copied().collect();
        assert!(
            self.upgraded == 0 && self.nonzero_reasons() == want,
            "expected no upgrade and fallback reasons {want:?}: {}",
            self.summary()
        );
    }
}

/// Sum of a bytes counter over several processes.
pub fn sum_bytes(v: &[Stats], k: &str) -> u64 {
    v.iter().map(|s| s.bytes(k)).sum()
}

/// Sum of connections over several processes.
pub fn sum_connections(v: &[Stats]) -> u64 {
    v.iter().map(Stats::connections).sum()
}

/// How long the shim gives an upgrade attempt (docs/upgrade.md §3.4, §4: connect request,
/// reply, or the server's wait for a request): after that the connection is either upgraded
/// or has fallen back for good.
pub const UPGRADE_DEADLINE: Duration = Duration::from_secs(5);

/// A pause past [`UPGRADE_DEADLINE`]: bytes an application writes on a connection at least this
/// old go through the ring if the connection was upgraded (never through TCP), so tests pause
/// this long where they want a lower bound on ring bytes. (A pause the application makes; the
/// tests never assert how long anything took.)
pub const SETTLE: Duration = Duration::from_millis(5500);

/// `RDMASHIM_TEST_IP`, the address of the RDMA device's netdev (10.99.0.1 in the VM). Panics
/// when unset: an RDMA-tier test selected outside the VM fails with the reason, it never skips.
pub fn test_ip() -> String {
    let ip = std::env::var("RDMASHIM_TEST_IP").unwrap_or_default();
    assert!(
        !ip.is_empty(),
        "RDMA test selected without RDMASHIM_TEST_IP: run it in the VM tier \
         (scripts/test, or scripts/rdma-vm with RDMASHIM_TEST_LIB/RDMASHIM_TEST_LAUNCHER)"
    );
    ip.parse::<std::net::IpAddr>()
        .unwrap_or_else(|e| panic!("RDMASHIM_TEST_IP={ip}: {e}"));
    ip
}

/// Whether shimmed processes of this run upgrade connections between processes of one host
/// (`RDMASHIM_LOCAL` as the shim reads it: on unless a boolean says off, and off for anything
/// that is not a boolean). The VM tier turns it off (scripts/vm-tier): both ends of its tests
/// share the VM's one address, and their connections are to go over rdma_cm.
pub fn local_upgrades() -> bool {
    std::env::var_os("RDMASHIM_LOCAL").is_none_or(|v| {
        matches!(
            v.to_str().map(str::to_ascii_lowercase).as_deref(),
            Some("1" | "true" | "yes" | "on")
        )
    })
}

/// The rings a connection between two shimmed processes moves to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rings {
    /// RDMA rings: to `RDMASHIM_TEST_IP`, in the VM tier.
    Rdma,
    /// Shared-memory rings: to a loopback address, with same-host upgrades on.
    Shm,
}

impl Rings {
    /// Where both ends of a scenario meet, if their connections are to upgrade: `Rdma` on
    /// `RDMASHIM_TEST_IP`, `Shm` on loopback with [`local_upgrades`]; `None` elsewhere.
    pub fn at(ip: &str) -> Option<Rings> {
        let test_ip = std::env::var("RDMASHIM_TEST_IP").unwrap_or_default();
        if !test_ip.is_empty() && test_ip == ip {
            return Some(Rings::Rdma);
        }
        let loopback = ip
            .parse::<std::net::IpAddr>()
            .is_ok_and(|a| a.is_loopback());
        (loopback && local_upgrades()).then_some(Rings::Shm)
    }

    /// The address tests of this kind listen on: [`test_ip`], or 127.0.0.1.
    pub fn ip(self) -> String {
        match self {
            Rings::Rdma => test_ip(),
            Rings::Shm => "127.0.0.1".to_string(),
        }
    }

    /// The bytes `st` moved over rings of this kind, both directions.
    pub fn bytes(self, st: &Stats) -> u64 {
        self.tx(st) + self.rx(st)
    }

    /// The bytes `st` sent over rings of this kind.
    pub fn tx(self, st: &Stats) -> u64 {
        st.bytes(match self {
            Rings::Rdma => "ring_tx",
            Rings::Shm => "shm_tx",
        })
    }

    /// The bytes `st` received over rings of this kind.
    pub fn rx(self, st: &Stats) -> u64 {
        st.bytes(match self {
            Rings::Rdma => "ring_rx",
            Rings::Shm => "shm_rx",
        })
    }

    /// Asserts `st` sent at least `min_tx` and received at least `min_rx` bytes over rings of
    /// this kind.
    pub fn assert_at_least(self, st: &Stats, min_tx: u64, min_rx: u64) {
        assert!(
            self.tx(st) >= min_tx && self.rx(st) >= min_rx,
            "expected at least {min_tx} bytes sent and {min_rx} received over {self:?} rings: {}",
            st.summary()
        );
    }

    /// A delta of the RDMA device's packet counters from now, on the RDMA rings (`None` on
    /// shared memory, which no device carries): see [`DeviceCounters::assert_carried`].
    pub fn device(self) -> Option<DeviceCounters> {
        (self == Rings::Rdma).then(|| DeviceCounters::read(&test_device()))
    }

    /// Asserts some of `st`'s bytes went over rings of this kind and none over the other.
    pub fn assert_carried(self, st: &Stats, what: &str) {
        let other = match self {
            Rings::Rdma => st.shm_bytes(),
            Rings::Shm => st.ring_bytes(),
        };
        assert!(
            self.bytes(st) > 0 && other == 0,
            "{what}: bytes over {self:?} rings expected, and none over others: {}",
            st.summary()
        );
    }
}

/// The connection kind two shims of the tests' environment carry over RDMA when no test sets
/// one: `RDMASHIM_KIND` of that environment (the tier run with one exported to every shimmed
/// program), as the shim reads it — srq carries sends, and records (refused) or a value it
/// does not know give the default — else the shim's default, duplex.
pub fn default_kind() -> &'static str {
    match std::env::var("RDMASHIM_KIND")
        .map(|k| k.trim().to_ascii_lowercase())
        .as_deref()
    {
        Ok("imm") => "imm",
        Ok("sends" | "srq") => "sends",
        Ok("read") => "read",
        _ => "duplex",
    }
}

/// `RDMASHIM_TEST_DEVICE` (rxe0 in the VM), checked to exist. Panics when unset or missing.
pub fn test_device() -> String {
    let dev = std::env::var("RDMASHIM_TEST_DEVICE").unwrap_or_default();
    assert!(
        !dev.is_empty(),
        "RDMA test selected without RDMASHIM_TEST_DEVICE: run it in the VM tier \
         (scripts/test, or scripts/rdma-vm)"
    );
    assert!(
        Path::new("/sys/class/infiniband").join(&dev).exists(),
        "RDMASHIM_TEST_DEVICE={dev} but /sys/class/infiniband/{dev} does not exist"
    );
    dev
}

/// The packet counters of an RDMA device's port 1
/// (`/sys/class/infiniband/DEV/ports/1/hw_counters/{sent_pkts,rcvd_pkts,rdma_sends}`, as rxe
/// names them). Device-wide: other tests running at the same time can only make them larger.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceCounters {
    pub dev: String,
    pub sent_pkts: u64,
    pub rcvd_pkts: u64,
    /// Work requests of the SEND opcodes the device carried (rxe counts a SEND, with or
    /// without an immediate, and not a WRITE): measured in the VM, 8 for 1,000 64-byte round
    /// trips of the native stream over WRITE WITH IMMEDIATE (its control messages), 2,298
    /// over sends.
    pub rdma_sends: u64,
}

impl DeviceCounters {
    /// The counters now.
    pub fn read(dev: &str) -> DeviceCounters {
        let dir = Path::new("/sys/class/infiniband")
            .join(dev)
            .join("ports/1/hw_counters");
        let get = |name: &str| -> u64 {
            let p = dir.join(name);
            let text = std::fs::read_to_string(&p)
                .unwrap_or_else(|e| panic!("{}: {e} (is {dev} an rxe device?)", p.display()));
            text.trim()
                .parse()
                .unwrap_or_else(|e| panic!("{}: {e}: {text:?}", p.display()))
        };
        DeviceCounters {
            dev: dev.to_string(),
            sent_pkts: get("sent_pkts"),
            rcvd_pkts: get("rcvd_pkts"),
            rdma_sends: get("rdma_sends"),
        }
    }

    /// How much the counters grew since `self` was read.
    pub fn delta(&self) -> DeviceCounters {
        let now = DeviceCounters::read(&self.dev);
        DeviceCounters {
            dev: self.dev.clone(),
            sent_pkts: now.sent_pkts.saturating_sub(self.sent_pkts),
            rcvd_pkts: now.rcvd_pkts.saturating_sub(self.rcvd_pkts),
            rdma_sends: now.rdma_sends.saturating_sub(self.rdma_sends),
        }
    }

    /// The fewest packets that can carry `bytes` of payload: one per 4096 bytes, the largest
    /// RoCE MTU (rxe0 in the VM runs at 1024, so the real count is at least 4 times that).
    pub fn min_packets(bytes: u64) -> u64 {
        bytes / 4096
    }

    /// On a delta: asserts the device sent and received at least the packets `ring_bytes` of
    /// payload need. In the VM the peers share one device (rxe loops the traffic back), so
    /// every packet is counted as sent and as received: pass the ring bytes of both directions
    /// as one side counted them (its `ring_tx + ring_rx`).
    pub fn assert_carried(&self, ring_bytes: u64) {
        let min = Self::min_packets(ring_bytes);
        assert!(
            self.sent_pkts >= min && self.rcvd_pkts >= min,
            "{}: {} ring bytes need at least {min} packets each way, the device counted {} sent \
             and {} received",
            self.dev,
            ring_bytes,
            self.sent_pkts,
            self.rcvd_pkts
        );
    }
}

/// The fallback reason connections between shimmed processes on 127.0.0.1 get on this host
/// with same-host upgrades off (`RDMASHIM_LOCAL=0`: tests of the shim's TCP path set it on
/// their commands), from `rdmashim doctor`: a host-wide reason (disabled, no_device,
/// libraries_missing) if there is one, else not_upgradable_address (loopback).
pub fn loopback_tcp_reason() -> String {
    static R: OnceLock<String> = OnceLock::new();
    R.get_or_init(|| {
        let mut c = Command::new(&shim().launcher);
        c.args(["doctor", "--json"])
            .env_remove("LD_PRELOAD")
            .env_remove("RDMASHIM_DISABLE")
            .env("RDMASHIM_LOCAL", "0");
        // (exit 1: nothing upgrades on this host, as when it has no RDMA device)
        let out = run(c, Duration::from_secs(30));
        assert!(
            matches!(out.status.code(), Some(0 | 1)),
            "doctor failed: {out:?}"
        );
        let j: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("doctor --json prints JSON");
        let reason = j["reason"].as_str().unwrap_or_default().to_string();
        match reason.as_str() {
            "disabled" | "no_device" | "libraries_missing" => reason,
            _ => "not_upgradable_address".to_string(),
        }
    })
    .clone()
}

/// Hooked symbols that `binary` (and the given libraries) import, per `nm -D --undefined-only`.
pub fn imported_hooks(objects: &[&Path], hooks: &[&str]) -> Vec<String> {
    let mut out = vec![];
    for o in objects {
        let nm = Command::new("nm")
            .args(["-D", "--undefined-only"])
            .arg(o)
            .output()
            .expect("nm");
        for line in String::from_utf8_lossy(&nm.stdout).lines() {
            let sym = line
                .split_whitespace()
                .last()
                .unwrap_or("")
                .split('@')
                .next()
                .unwrap_or("");
            if hooks.contains(&sym) && !out.iter().any(|s| s == sym) {
                out.push(sym.to_string());
            }
        }
    }
    out.sort();
    out
}

/// The shared library `soname_part` that `binary` links (via ldd).
pub fn linked_lib(binary: &Path, soname_part: &str) -> Option<PathBuf> {
    let out = Command::new("ldd").arg(binary).output().ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.contains(soname_part))
        .and_then(|l| l.split("=>").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .map(PathBuf::from)
}

/// Default per-command deadline.
pub const T: Duration = Duration::from_secs(60);

/// How one role of a `behave` run is started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// Without the shim: a peer that knows nothing of RDMA.
    Plain,
    /// Under the shim, `via` the preload variable or the launcher.
    Shim(Via),
    /// Under the shim (`LD_PRELOAD`) with `RDMASHIM_DISABLE=1`.
    Disabled,
    /// Under the shim (`LD_PRELOAD`) on a host whose libibverbs.so.1 cannot be loaded: in a
    /// private mount namespace (`unshare -m`, root) where /dev/null is bound over it.
    NoLibraries,
}

/// The file `soname` resolves to through the loader's cache (`ldconfig -p`).
pub fn resolved_lib(soname: &str) -> PathBuf {
    let out = Command::new("ldconfig")
        .arg("-p")
        .output()
        .expect("run ldconfig -p");
    let text = String::from_utf8_lossy(&out.stdout);
    let path = text
        .lines()
        .filter(|l| l.trim_start().starts_with(&format!("{soname} ")))
        .filter_map(|l| l.split("=>").nth(1))
        .map(|p| PathBuf::from(p.trim()))
        .next()
        .unwrap_or_else(|| panic!("{soname} is not in the loader's cache"));
    path.canonicalize()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `cmd` (as built, with its environment) re-made to run in a private mount namespace where
/// `hide` reads as an empty file: `unshare -m sh -c 'mount --bind /dev/null HIDE && exec env
/// VARS… PROG ARGS…'`. Only the final program gets `cmd`'s variables (`LD_PRELOAD` too), so
/// unshare, sh and mount neither run the shim nor write stats. Arguments added later go to
/// the program.
pub fn with_hidden_file(cmd: &Command, hide: &Path) -> Command {
    let mut c = Command::new("unshare");
    c.env_remove("LD_PRELOAD").args([
        "-m",
        "sh",
        "-c",
        "mount --bind /dev/null \"$0\" && exec env \"$@\"",
    ]);
    c.arg(hide);
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => {
                let mut kv = k.to_os_string();
                kv.push("=");
                kv.push(v);
                c.arg(kv);
            }
            None => {
                c.env_remove(k);
            }
        }
    }
    c.arg(cmd.get_program()).args(cmd.get_args());
    c
}

/// The stats files of a `behave` run's roles: `None` for a role without the shim, and for one
/// that wrote none (killed by a signal: `peer_death`'s server).
#[derive(Debug)]
pub struct RoleStats {
    pub client: Option<Stats>,
    pub server: Option<Stats>,
    /// Those of the processes the server forked that exit normally (prefork workers), by pid.
    pub server_forks: Vec<Stats>,
    /// Those of the processes the client forked that exit normally.
    pub client_forks: Vec<Stats>,
}

/// Runs one scenario of the `behave` program (src/bin/behave.rs): its server role on `ip`, then
/// its client role against it, each started as its [`Side`] says. Both roles must succeed
/// (`peer_death`'s server must die of SIGKILL). With `settle`, the server waits that long after
/// accepting before it plays its part (`BEHAVE_SETTLE_MS`), so that the connection's upgrade is
/// decided before the scenario's data moves (see [`SETTLE`]). Returns the roles' stats.
pub fn behave_roles(
    bin: &str,
    scenario: &str,
    client: Side,
    server: Side,
    ip: &str,
    settle: Option<Duration>,
) -> RoleStats {
    behave_roles_env(bin, scenario, client, server, ip, settle, &[])
}

/// [`behave_roles`] with a plain client against a shimmed server on loopback: the server's
/// side of a scenario, where no upgrade can happen, behaves as on TCP.
pub fn behave_plain_client(bin: &str, scenario: &str) -> RoleStats {
    let server = Side::Shim(Via::Preload);
    behave_roles(bin, scenario, Side::Plain, server, "127.0.0.1", None)
}

/// [`behave_roles`] with variables set in the client's environment (the shim's own, say).
pub fn behave_roles_env(
    bin: &str,
    scenario: &str,
    client: Side,
    server: Side,
    ip: &str,
    settle: Option<Duration>,
    client_env: &[(&str, &str)],
) -> RoleStats {
    behave_roles_envs(
        bin,
        scenario,
        (client, client_env),
        (server, &[]),
        ip,
        settle,
    )
}

/// [`behave_roles`] with variables set in each role's environment.
pub fn behave_roles_envs(
    bin: &str,
    scenario: &str,
    (client, client_env): (Side, &[(&str, &str)]),
    (server, server_env): (Side, &[(&str, &str)]),
    ip: &str,
    settle: Option<Duration>,
) -> RoleStats {
    use std::io::BufRead;
    let s = Scratch::new(&format!("behave-{scenario}"));
    let cmd = |role: &str, side: Side| -> Command {
        let mut c = match side {
            Side::Shim(v) => under_shim(v, bin, &s, role),
            Side::Disabled => {
                let mut c = under_shim(Via::Preload, bin, &s, role);
                c.env("RDMASHIM_DISABLE", "1");
                c
            }
            Side::Plain => {
                let mut c = Command::new(bin);
                c.env_remove("LD_PRELOAD");
                c
            }
            Side::NoLibraries => {
                let c = under_shim(Via::Preload, bin, &s, role);
                with_hidden_file(&c, &resolved_lib("libibverbs.so.1"))
            }
        };
        c.args([scenario, role, ip]).env_remove("BEHAVE_SETTLE_MS");
        c
    };
    let sides = format!("client {client:?}, server {server:?}, {ip}");
    let mut srv = cmd("server", server);
    srv.envs(server_env.iter().copied());
    if let Some(d) = settle {
        srv.env("BEHAVE_SETTLE_MS", d.as_millis().to_string());
    }
    srv.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = srv.spawn().expect("spawn behave server");
    let mut lines = std::io::BufReader::new(child.stdout.take().expect("server stdout")).lines();
    let port = match lines.next() {
        Some(Ok(l)) if l.starts_with("port ") => l[5..].to_string(),
        other => {
            let _ = child.kill();
            let out = child.wait_with_output().expect("wait");
            panic!(
                "{scenario}: server gave no port ({other:?}): {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    };
    let mut cli = cmd("client", client);
    cli.arg(&port)
        .envs(client_env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let client_child = cli.spawn().unwrap_or_else(|e| panic!("spawn {cli:?}: {e}"));
    let client_pid = u64::from(client_child.id());
    let client_out = wait_child(client_child, T);
    let id = child.id();
    if !client_out.status.success() {
        // (a server left waiting for a connection or a byte the failed client never sent
        // would only time out: the client's failure is the news)
        signal(id, "KILL");
        let out = child.wait_with_output().expect("wait server");
        panic!(
            "{scenario} client ({sides}) failed: {}\nstdout: {}\nstderr: {}\nserver stderr: {}",
            client_out.status,
            String::from_utf8_lossy(&client_out.stdout),
            String::from_utf8_lossy(&client_out.stderr),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // the server's remaining output and status
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rest: Vec<String> = lines.map_while(Result::ok).collect();
        let out = child.wait_with_output();
        let _ = tx.send((rest, out));
    });
    let (rest, out) = rx.recv_timeout(T).unwrap_or_else(|_| {
        signal(id, "KILL");
        panic!("{scenario}: server did not finish ({sides})");
    });
    let out = out.expect("wait server");
    let server_err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        client_out.status.success(),
        "{scenario} client ({sides}) failed: {}\nstdout: {}\nstderr: {}\nserver stderr: {server_err}",
        client_out.status,
        String::from_utf8_lossy(&client_out.stdout),
        String::from_utf8_lossy(&client_out.stderr)
    );
    if scenario == "peer_death" {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            out.status.signal(),
            Some(9),
            "{scenario}: server should die of SIGKILL"
        );
    } else {
        assert!(
            out.status.success() && rest.iter().any(|l| l == &format!("ok {scenario} server")),
            "{scenario} server ({sides}) failed: {}\nstdout: {rest:?}\nstderr: {server_err}",
            out.status
        );
    }
    // Each role's own file, and those of the processes it forked (prefork workers,
    // `fork_dial`'s child).
    let own_and_forks = |side: Side, label: &str, pid: u64| -> (Option<Stats>, Vec<Stats>) {
        if side == Side::Plain {
            return (None, Vec::new());
        }
        let (own, forks): (Vec<Stats>, Vec<Stats>) =
            s.stats(label).into_iter().partition(|st| st.pid == pid);
        (own.into_iter().next(), forks)
    };
    let (client, client_forks) = own_and_forks(client, "client", client_pid);
    let (server, server_forks) = own_and_forks(server, "server", u64::from(id));
    RoleStats {
        client,
        server,
        server_forks,
        client_forks,
    }
}

/// Runs one scenario of the `behave` program (src/bin/behave.rs): its server role on `ip`, then
/// its client role against it, both under the shim `via` the given way, or both without it
/// (`None`: the kernel's own behaviour, which the scenario asserts). Both roles must succeed
/// (`peer_death`'s server must die of SIGKILL). Under the shim each side's stats must account
/// for exactly one connection ([`behave_conns`] for scenarios with more):
/// - where [`Rings::at`] says they upgrade (`RDMASHIM_TEST_IP` in the RDMA tier, loopback with
///   same-host upgrades on), upgraded on both sides, with bytes through rings of that kind
///   (the server settles first, so that its part of the scenario runs on the upgraded
///   connection; `peer_death`'s killed server writes no stats);
/// - elsewhere (loopback with same-host upgrades off), with [`loopback_tcp_reason`].
pub fn behave(bin: &str, scenario: &str, via: Option<Via>, ip: &str) -> RoleStats {
    behave_conns(bin, scenario, via, ip, 1)
}

/// A scenario over `rings` (both ends shimmed where they upgrade: [`Rings::ip`]) whose server
/// forks as soon as it accepted, its connection's upgrade undecided. The client's first dial
/// to a host is a probe and goes at once (the dial delay is for hosts it knows): its request
/// mostly comes after the fork, and the parent holds it for the child that takes the
/// connection over (docs/upgrade.md §7); on a loaded host it may come first, and the
/// connection is being set up, or on the rings, at the fork. The scenario's own checks hold
/// the bytes to what TCP gives either way; the caller checks which way the shim went.
pub fn behave_fork_undecided(bin: &str, scenario: &str, rings: Rings) -> RoleStats {
    let shim = Side::Shim(Via::Preload);
    behave_roles(bin, scenario, shim, shim, &rings.ip(), None)
}

/// Whether a fork-per-connection server's parent ([`behave_fork_undecided`]) had the
/// connection on the rings, or being set up, when it forked and closed its copy: it switched
/// it back to TCP for the child (and so did the client), counted so on both sides, or the
/// test fails here. `false`: the parent handed it over undecided (`handed_to_child`).
pub fn answered_before_the_fork(server: &Stats, client: &Stats) -> bool {
    if server.switched_back == 0 {
        return false;
    }
    assert_switched_back(client, server, "answered before the fork: ");
    true
}

/// Both ends of a scenario's one connection counted it upgraded, then switched back to TCP
/// (and nothing else), or the test fails here (`what` heads the message).
pub fn assert_switched_back(client: &Stats, server: &Stats, what: &str) {
    for (role, st) in [("client", client), ("server", server)] {
        assert!(
            st.connections() == 1 && st.upgraded == 1 && st.switched_back == 1,
            "{what}{role}: upgraded, then switched back: {}",
            st.summary()
        );
    }
}

/// Over shared memory, a scenario whose server forks and hands its connection to the child
/// (`fork_serve`, `fork_quick_exit`), with the connection on the rings before the fork (the
/// server settles first): the parent's close of its copy switches it back, since a child
/// shares it. Both sides count it upgraded and switched back; the parent moved no byte.
pub fn behave_settled_fork(bin: &str, scenario: &str) -> RoleStats {
    let shim = Side::Shim(Via::Preload);
    let r = behave_roles(bin, scenario, shim, shim, "127.0.0.1", Some(SETTLE));
    let s = r.server.as_ref().expect("the server wrote no stats");
    let c = r.client.as_ref().expect("the client wrote no stats");
    assert_switched_back(c, s, &format!("{scenario} "));
    assert_eq!(
        s.shm_bytes() + s.bytes("tcp_tx"),
        0,
        "{scenario} server: {}",
        s.summary()
    );
    r
}

/// [`behave`] over `rings` for a scenario whose one connection goes back to TCP mid-stream
/// (an exec, a spawn: a switch back, protocol 8.5): both sides must count it switched back,
/// and the client must have read bytes from TCP after it (its first bytes came before the
/// upgrade, in the handshake's small exchange, which the scenario's server checks separately).
pub fn behave_switched_back(bin: &str, scenario: &str, rings: Rings) -> RoleStats {
    let r = behave(bin, scenario, Some(Via::Preload), &rings.ip());
    for (role, st) in [("client", &r.client), ("server", &r.server)] {
        let st = st.as_ref().expect("stats");
        assert_eq!(st.switched_back, 1, "{scenario} {role}: {}", st.summary());
    }
    let c = r.client.as_ref().expect("client stats");
    assert!(
        c.bytes("tcp_rx") > rings.rx(c).min(1 << 20),
        "{scenario}: the client read little from TCP after the switch back: {}",
        c.summary()
    );
    r
}

/// Over `rings`, the `duplex` scenario (both directions streaming at once, every byte
/// checked) with the client's ring path failed on purpose at its `at`th ring read
/// (`RDMASHIM_FAULT=path_fail:AT`): both sides count the connection upgraded and its path
/// failed, nothing fell back, each moved bytes over the rings before the failure and read
/// bytes from TCP after it. (A side may have read none of the peer's stream from its ring:
/// the peer sends again whatever it has not credited.)
pub fn behave_path_failed(bin: &str, rings: Rings, at: u32) -> RoleStats {
    let shim = Side::Shim(Via::Preload);
    let fault = format!("path_fail:{at}");
    let r = behave_roles_env(
        bin,
        "duplex",
        shim,
        shim,
        &rings.ip(),
        None,
        &[("RDMASHIM_FAULT", fault.as_str())],
    );
    for (role, st) in [("client", &r.client), ("server", &r.server)] {
        let st = st.as_ref().expect("stats");
        assert_eq!(st.connections(), 1, "{role}: {}", st.summary());
        assert_eq!(st.upgraded(), 1, "{role}: {}", st.summary());
        assert_eq!(st.path_failed, 1, "{role}: path failed: {}", st.summary());
        let ring = rings.rx(st)
            + st.bytes(match rings {
                Rings::Rdma => "ring_tx",
                Rings::Shm => "shm_tx",
            });
        assert!(
            ring > 0 && st.bytes("tcp_rx") > 0,
            "{role}: the rings, then TCP: {}",
            st.summary()
        );
    }
    r
}

/// Over `rings`, a scenario whose server ends upgrades for its process mid-connection
/// (`setuid`, `dup2_high`, io_uring): its first connection, on the rings at that moment, is
/// counted upgraded and switched back by both sides, the client read the rest from TCP, and
/// the second connection, made after, stays TCP with `reason` at the server.
pub fn behave_upgrades_ended(bin: &str, scenario: &str, reason: &str, rings: Rings) -> RoleStats {
    let shim = Side::Shim(Via::Preload);
    let r = behave_roles(bin, scenario, shim, shim, &rings.ip(), Some(SETTLE));
    let c = r.client.as_ref().expect("the client wrote no stats");
    let s = r.server.as_ref().expect("the server wrote no stats");
    for (role, st) in [("client", c), ("server", s)] {
        assert_eq!(st.connections(), 2, "{scenario} {role}: {}", st.summary());
        assert_eq!(st.upgraded(), 1, "{scenario} {role}: {}", st.summary());
        assert_eq!(st.switched_back, 1, "{scenario} {role}: {}", st.summary());
    }
    assert_eq!(s.reason(reason), 1, "{scenario} server: {}", s.summary());
    assert!(
        c.bytes("tcp_rx") > rings.rx(c).min(1 << 20),
        "{scenario}: the client read little from TCP after the switch back: {}",
        c.summary()
    );
    r
}

/// [`behave`] for a scenario that makes `conns` connections (each side's stats must account
/// for that many). Returns the roles' stats, for checks of the scenario's own.
pub fn behave_conns(
    bin: &str,
    scenario: &str,
    via: Option<Via>,
    ip: &str,
    conns: u64,
) -> RoleStats {
    let side = via.map_or(Side::Plain, Side::Shim);
    let rings = via.and(Rings::at(ip));
    let device = rings.and_then(Rings::device);
    let r = behave_roles(bin, scenario, side, side, ip, rings.map(|_| SETTLE));
    if via.is_none() {
        return r;
    }
    let check = |role: &str, st: &Stats| {
        assert_eq!(
            st.connections(),
            conns,
            "{scenario} {role}: {conns} connection(s): {}",
            st.summary()
        );
        if let Some(rings) = rings {
            st.assert_all_upgraded();
            // every scenario's server writes after the settle pause: over the ring
            rings.assert_carried(st, &format!("{scenario} {role}"));
        } else {
            st.assert_all_fallback(&loopback_tcp_reason());
        }
    };
    check(
        "client",
        r.client.as_ref().expect("the client wrote no stats"),
    );
    match (&r.server, scenario) {
        // (a process killed by a signal writes no stats)
        (None, "peer_death") => {}
        (Some(sv), _) => check("server", sv),
        (None, _) => panic!("{scenario}: the server wrote no stats"),
    }
    // (a child that execs writes a record, as every exec does: `fork_exec`'s; so does one
    // that exits normally: `fork_serve`'s)
    assert!(
        r.server_forks.is_empty() || scenario == "fork_exec" || scenario == "fork_serve",
        "{scenario}: stats files of processes the server forked: {:#?}",
        r.server_forks
    );
    assert!(
        r.client_forks.is_empty(),
        "{scenario}: stats files of processes the client forked: {:#?}",
        r.client_forks
    );
    if let (Some(before), Some(c)) = (device, &r.client) {
        before.delta().assert_carried(c.ring_bytes());
    }
    r
}

/// `len` pseudo-random bytes from `seed` (xorshift64), each made by `byte` from the generator's
/// next state: test payloads that are the same in every run and never compress.
pub fn pattern_bytes(len: usize, seed: u64, byte: impl Fn(u64) -> u8) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            byte(x)
        })
        .collect()
}

/// `len` pseudo-random bytes (see [`pattern_bytes`]).
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    pattern_bytes(len, seed, |x| x as u8)
}

/// The SHA-256 of `d` in lowercase hex (as `sha256sum` and the test servers print it).
pub fn sha256_hex(d: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(d)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Starts the Python HTTP server ([`HTTP_SERVER_PY`]) on `ip`, serving `www`, under the shim
/// by `via` (its records labelled `label`; stopped with SIGINT), and waits until it listens;
/// returns it and its port.
pub fn http_server(s: &Scratch, via: Via, ip: &str, www: &Path, label: &str) -> (Server, u16) {
    let script = s.dir.join(format!("{label}.py"));
    std::fs::write(&script, HTTP_SERVER_PY).unwrap();
    let port = free_port_on(ip);
    let mut cmd = under_shim(via, python(), s, label);
    cmd.arg(&script).args([ip, &port.to_string()]).arg(www);
    let mut server = Server::start(cmd, label, "INT");
    wait_listening(port, &mut server, Duration::from_secs(30));
    (server, port)
}

/// A Python HTTP server for the curl tests (`python3 SCRIPT IP PORT DIR`): the stock
/// `http.server` handler for GET of DIR, HTTP/1.1 (connections stay open), plus a POST that
/// answers "LENGTH SHA256\n" of the body.
pub const HTTP_SERVER_PY: &str = r#"
import hashlib, sys
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

class H(SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        out = ("%d %s\n" % (len(body), hashlib.sha256(body).hexdigest())).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)
    def log_message(self, *a):
        pass

srv = ThreadingHTTPServer((sys.argv[1], int(sys.argv[2])), partial(H, directory=sys.argv[3]))
try:
    srv.serve_forever()
except KeyboardInterrupt:
    pass
"#;
