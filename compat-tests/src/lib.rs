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
//! are free ephemeral ports on 127.0.0.1.
#![forbid(unsafe_code)]

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
        panic!("{prog} is not installed (apt-get install redis-server redis-tools iperf3 curl python3)");
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
pub fn under_shim(
    via: Via,
    prog: impl AsRef<std::ffi::OsStr>,
    scratch: &Scratch,
    label: &str,
) -> Command {
    match via {
        Via::Preload => {
            let mut c = Command::new(prog);
            c.env("LD_PRELOAD", &shim().lib)
                .env("RDMASHIM_STATS", scratch.stats_pattern(label))
                .env("RDMASHIM_LOG", "warn")
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
                .args(["--log", "warn", "--"])
                .arg(prog);
            c
        }
    }
}

/// Runs `cmd` to completion within `timeout` (killed after), capturing output.
pub fn run(mut cmd: Command, timeout: Duration) -> Output {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
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
            panic!("{cmd:?} did not finish within {timeout:?}");
        }
    }
}

/// Runs `cmd` and asserts it succeeded; returns stdout.
pub fn run_ok(cmd: Command, timeout: Duration) -> String {
    let desc = format!("{cmd:?}");
    let out = run(cmd, timeout);
    assert!(
        out.status.success(),
        "{desc} failed: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
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
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().unwrap().port()
}

/// Waits until something listens on 127.0.0.1:`port`, reading /proc/net/tcp (no connection is
/// made, so servers' connection counts are not disturbed).
pub fn wait_listening(port: u16, server: &mut Server, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    let needle = format!(":{port:04X} ");
    loop {
        let listening = ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
            std::fs::read_to_string(f)
                .unwrap_or_default()
                .lines()
                .skip(1)
                .any(|l| {
                    let cols: Vec<&str> = l.split_whitespace().collect();
                    cols.len() > 3 && format!("{} ", cols[1]).ends_with(&needle) && cols[3] == "0A"
                })
        });
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
    pub fallback: u64,
    pub reasons: BTreeMap<String, u64>,
    pub bytes: BTreeMap<String, u64>,
    pub raw: Value,
}

impl Stats {
    pub fn load(p: &Path) -> Stats {
        let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        let v: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}: {text}", p.display()));
        Stats::from_value(v)
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
            fallback: conns["fallback"].as_u64().expect("connections.fallback"),
            reasons: map(&conns["fallback_reasons"], "fallback_reasons"),
            bytes: map(&v["bytes"], "bytes"),
            raw: v.clone(),
        };
        for k in ["ring_tx", "ring_rx", "tcp_tx", "tcp_rx"] {
            assert!(s.bytes.contains_key(k), "bytes.{k} missing");
        }
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

/// Sum of a bytes counter over several processes.
pub fn sum_bytes(v: &[Stats], k: &str) -> u64 {
    v.iter().map(|s| s.bytes(k)).sum()
}

/// Sum of connections over several processes.
pub fn sum_connections(v: &[Stats]) -> u64 {
    v.iter().map(Stats::connections).sum()
}

/// The fallback reason connections to 127.0.0.1 get on this host, from `rdmashim doctor`:
/// a host-wide reason (disabled, no_device, libraries_missing) if there is one, else
/// not_upgradable_address (loopback).
pub fn expected_reason() -> String {
    static R: OnceLock<String> = OnceLock::new();
    R.get_or_init(|| {
        let mut c = Command::new(&shim().launcher);
        c.arg("doctor")
            .env_remove("LD_PRELOAD")
            .env_remove("RDMASHIM_DISABLE");
        let out = run_ok(c, Duration::from_secs(30));
        let verdict = out
            .lines()
            .find(|l| l.starts_with("verdict:"))
            .expect("doctor prints a verdict");
        let reason = verdict
            .split('(')
            .nth(1)
            .and_then(|r| r.split(':').next())
            .expect("verdict has (reason: ...)")
            .to_string();
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

/// Runs one scenario of the `behave` program (src/bin/behave.rs): its server role on `ip`, then
/// its client role against it, both under the shim `via` the given way, or both without it
/// (`None`: the kernel's own behaviour, which the scenario asserts). Both roles must succeed
/// (`peer_death`'s server must die of SIGKILL); under the shim each side's stats must account
/// for exactly one connection, with the host's fallback reason.
pub fn behave(bin: &str, scenario: &str, via: Option<Via>, ip: &str) {
    use std::io::BufRead;
    let s = Scratch::new(&format!("behave-{scenario}"));
    let cmd = |role: &str| -> Command {
        let mut c = match via {
            Some(v) => under_shim(v, bin, &s, role),
            None => {
                let mut c = Command::new(bin);
                c.env_remove("LD_PRELOAD");
                c
            }
        };
        c.args([scenario, role, ip]);
        c
    };
    let mut srv = cmd("server");
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
    let mut cli = cmd("client");
    cli.arg(&port);
    let client_out = run(cli, T);
    // the server's remaining output and status
    let (tx, rx) = std::sync::mpsc::channel();
    let id = child.id();
    std::thread::spawn(move || {
        let rest: Vec<String> = lines.map_while(Result::ok).collect();
        let out = child.wait_with_output();
        let _ = tx.send((rest, out));
    });
    let (rest, out) = rx.recv_timeout(T).unwrap_or_else(|_| {
        signal(id, "KILL");
        panic!("{scenario}: server did not finish");
    });
    let out = out.expect("wait server");
    let server_err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        client_out.status.success(),
        "{scenario} client ({via:?}) failed: {}\nstdout: {}\nstderr: {}\nserver stderr: {server_err}",
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
            "{scenario} server ({via:?}) failed: {}\nstdout: {rest:?}\nstderr: {server_err}",
            out.status
        );
    }
    if via.is_some() {
        let c = s.one_stats("client");
        assert_eq!(c.connections(), 1, "{scenario} client: {:?}", c.raw);
        c.assert_all_fallback(&expected_reason());
        if scenario != "peer_death" {
            // (a process killed by a signal writes no stats)
            let sv = s.one_stats("server");
            assert_eq!(sv.connections(), 1, "{scenario} server: {:?}", sv.raw);
            sv.assert_all_fallback(&expected_reason());
        }
    }
}
