//! The two-host tier, and an RDMA device removed under a test.
//!
//! One test binary (tests/two_hosts.rs) runs in two soft-RoCE VMs at once (scripts/two-host-tier
//! through scripts/two-vm: A on 10.77.0.1, B on 10.77.0.2, rxe0 on each one's eth0), the same
//! tests in the same order (`--test-threads=1`). Each test plays its host's part, chosen by
//! `RDMASHIM_TWO_HOST_ROLE` (`a`: the servers, `b`: the clients), and checks that host's own
//! stats; the two meet at ports agreed per test (`base`: the server's port; `base + 1`: A's
//! flag, up while its server listens; `base + 2`: a flag of B's, for tests that need B to say
//! when). Every wait is bounded, so a test that fails on one host fails on the other too
//! instead of hanging it.

use crate::{under_shim, wait_child, Scratch, Stats, Via};
use std::io::BufRead;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a host waits for the other (its VM may boot later, or be slower).
pub const PEER_WAIT: Duration = Duration::from_secs(300);
/// How long one side of a case may run.
pub const CASE_TIME: Duration = Duration::from_secs(900);

/// Which host this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// 10.77.0.1: the servers.
    A,
    /// 10.77.0.2: the clients.
    B,
}

/// This host's part, from `RDMASHIM_TWO_HOST_ROLE`. Panics outside the two-host tier, and
/// when the link to the other host carries nothing ([`link_alive`]): every test begins here.
pub fn role() -> Role {
    let role = match std::env::var("RDMASHIM_TWO_HOST_ROLE").as_deref() {
        Ok("a") => Role::A,
        Ok("b") => Role::B,
        other => panic!(
            "RDMASHIM_TWO_HOST_ROLE={other:?}: a two-host test runs in scripts/two-host-tier \
             (scripts/test), once as a and once as b"
        ),
    };
    link_alive();
    role
}

/// Set once the link to the other host was found dead: every later test of this run fails at
/// once instead of spending its waits on it (scripts/two-host-tier runs them again in two new
/// VMs).
static LINK_DEAD: AtomicBool = AtomicBool::new(false);

/// How long the other host may give no answer at all before the link counts as dead: longer
/// than any cut a test makes on purpose (two_hosts.rs's `CUT_MAX`, 120 s), so that a host
/// whose peer is still in such a test only waits.
pub const LINK_WAIT: Duration = Duration::from_secs(180);

/// A port no test listens on: a live peer's kernel answers a connect to it with a reset.
const PROBE_PORT: u16 = 9;

/// Checks, at a test's start, that the other host's kernel answers (a connect to a closed
/// port is refused, or succeeds): the virtual link has been seen to stop carrying anything
/// for good on a loaded machine, and then every test after would wait out its bounds. Waits
/// up to [`LINK_WAIT`]; on a dead link, prints what this host's side of it looks like and
/// panics (as does every later call).
pub fn link_alive() {
    assert!(
        !LINK_DEAD.load(Ordering::Relaxed),
        "the link to the other host died in an earlier test of this run: not run here \
         (scripts/two-host-tier runs it again in two new VMs)"
    );
    let addr: SocketAddr = format!("{}:{PROBE_PORT}", peer_ip()).parse().unwrap();
    let until = Instant::now() + LINK_WAIT;
    let last = loop {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            Ok(_) => return,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return,
            Err(e) if Instant::now() >= until => break e,
            Err(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    };
    link_died(&format!(
        "the other host gave no answer for {LINK_WAIT:?} (a connect to {addr}: {last})"
    ));
}

/// Marks the link dead for the rest of this run and panics with `why` and this host's view of
/// its link (interface counters, queueing, the kernel's last messages) — what tells a guest's
/// stuck queue from a host's lost datagrams.
fn link_died(why: &str) -> ! {
    LINK_DEAD.store(true, Ordering::Relaxed);
    let show = |cmd: &str, args: &[&str]| {
        Command::new(cmd).args(args).output().map_or_else(
            |e| format!("$ {cmd} {}: {e}", args.join(" ")),
            |o| {
                format!(
                    "$ {cmd} {}\n{}{}",
                    args.join(" "),
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                )
            },
        )
    };
    let dmesg = show("dmesg", &["--ctime"]);
    // (rxe asks the link's speed at every turn: the kernel's answer fills the log)
    let tail: Vec<&str> = (dmesg.lines().rev())
        .filter(|l| !l.contains("speed is unknown"))
        .take(30)
        .collect();
    panic!(
        "the link to the other host is dead: {why}\n{}\n{}\n{}\n$ dmesg (last lines)\n{}",
        show("ip", &["-s", "link", "show", "eth0"]),
        show("tc", &["-s", "qdisc", "show", "dev", "eth0"]),
        show("ip", &["neigh", "show", "dev", "eth0"]),
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    );
}

fn env_ip(name: &str) -> String {
    let ip = std::env::var(name).unwrap_or_default();
    ip.parse::<std::net::IpAddr>()
        .unwrap_or_else(|e| panic!("{name}={ip:?}: {e} (run in scripts/two-host-tier)"));
    ip
}

/// This host's address (`RDMASHIM_TEST_IP`).
pub fn own_ip() -> String {
    env_ip("RDMASHIM_TEST_IP")
}

/// The other host's address (`RDMASHIM_TEST_PEER_IP`).
pub fn peer_ip() -> String {
    env_ip("RDMASHIM_TEST_PEER_IP")
}

/// A flag for the other host: a TCP listener on `port` that accepts and closes every
/// connection until dropped.
pub struct Flag {
    stop: Arc<AtomicBool>,
}

impl Flag {
    /// Raises the flag on this host's address.
    pub fn raise(port: u16) -> Flag {
        let ip: std::net::IpAddr = own_ip().parse().unwrap();
        let l = TcpListener::bind(SocketAddr::new(ip, port))
            .unwrap_or_else(|e| panic!("flag port {port}: {e}"));
        l.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((c, _)) => drop(c),
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        Flag { stop }
    }
}

impl Drop for Flag {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Whether the other host's flag on `port` is up now (a connect succeeds).
pub fn flag_up(port: u16) -> bool {
    let addr: SocketAddr = format!("{}:{port}", peer_ip()).parse().unwrap();
    TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok()
}

/// Waits until the other host's flag on `port` is up (a connect succeeds), at most `within`.
pub fn wait_flag(port: u16, within: Duration) {
    let addr: SocketAddr = format!("{}:{port}", peer_ip()).parse().unwrap();
    let until = Instant::now() + within;
    // (since when every connect went unanswered: a refusal means the other host is alive,
    // only not there yet)
    let mut silent_since = None;
    loop {
        let e = match TcpStream::connect_timeout(&addr, Duration::from_millis(500)) {
            Ok(_) => return,
            Err(e) => e,
        };
        if e.kind() == std::io::ErrorKind::ConnectionRefused {
            silent_since = None;
        } else if silent_since.get_or_insert_with(Instant::now).elapsed() >= LINK_WAIT {
            link_died(&format!(
                "waiting for its flag {addr}, no connect was answered for {LINK_WAIT:?} (the \
                 last: {e})"
            ));
        }
        assert!(
            Instant::now() < until,
            "the other host's flag {addr} did not come up within {within:?} (the last \
             connect: {e})"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// How long a server may take to say that it listens.
const LISTEN_WAIT: Duration = Duration::from_secs(60);

/// What each thread of process `pid` is doing (state, kernel wait channel, system call), for
/// a failure's message.
fn threads_of(pid: u32) -> String {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return "(gone)".into();
    };
    let mut out = Vec::new();
    for t in dir.flatten() {
        let p = t.path();
        let read = |f: &str| std::fs::read_to_string(p.join(f)).unwrap_or_default();
        let stat = read("stat");
        let state = stat
            .rsplit_once(')')
            .map_or("?", |(_, r)| r.trim_start())
            .get(..1);
        out.push(format!(
            "[{} {} {} wchan={} syscall={}]",
            t.file_name().to_string_lossy(),
            read("comm").trim(),
            state.unwrap_or("?"),
            read("wchan").trim(),
            read("syscall").trim()
        ));
    }
    out.join(" ")
}

/// How a role of a case ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ends {
    /// It prints "ok SCENARIO ROLE" and exits 0.
    Ok,
    /// It is killed by SIGKILL (`peer_death`'s server).
    Killed,
}

/// Checks how a program of a case ended; on success, passes on its stderr lines that begin
/// with "measured: " (a scenario's own figures: scripts/two-host-tier runs the tests with
/// `--nocapture`, so that they reach the tier's output).
fn checked(out: std::process::Output, what: &str, ends: Ends) {
    use std::os::unix::process::ExitStatusExt;
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    if out.status.success() {
        for l in text(&out.stderr).lines() {
            if let Some(m) = l.strip_prefix("measured: ") {
                eprintln!("{what}: {m}");
            }
        }
    }
    match ends {
        Ends::Ok => assert!(
            out.status.success(),
            "{what} failed: {}\nstdout: {}\nstderr: {}",
            out.status,
            text(&out.stdout),
            text(&out.stderr)
        ),
        Ends::Killed => assert_eq!(
            out.status.signal(),
            Some(9),
            "{what} should die of SIGKILL: {}\nstderr: {}",
            out.status,
            text(&out.stderr)
        ),
    }
}

fn own_stats(s: &Scratch, label: &str, pid: u32) -> Option<Stats> {
    s.stats(label)
        .into_iter()
        .find(|st| st.pid == u64::from(pid))
}

/// Whether a role runs under the shim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Under {
    /// `LD_PRELOAD` of the shim under test, stats in a scratch dir.
    Shim,
    /// Without it: a peer that knows nothing of RDMA.
    Plain,
}

/// Host A's part of a case: the `behave` program's `scenario` server on port `base`, run
/// `under` the shim or not, with `env`; A's flag `base + 1` is up while it listens;
/// `meanwhile` runs once it listens (with the server's pid). Returns the server's stats (none
/// if it was killed or ran plain).
pub fn serve(
    bin: &str,
    scenario: &str,
    base: u16,
    env: &[(&str, &str)],
    how: (Under, Ends),
    meanwhile: impl FnOnce(u32),
) -> Option<Stats> {
    serve_at(bin, scenario, &own_ip(), base, env, how, meanwhile)
}

/// [`serve`] on address `ip` of this host (another than [`own_ip`]: an IPv6 one, a link-local
/// one with its interface, `fe80::1%eth0`); the flag stays on [`own_ip`].
pub fn serve_at(
    bin: &str,
    scenario: &str,
    ip: &str,
    base: u16,
    env: &[(&str, &str)],
    (under, ends): (Under, Ends),
    meanwhile: impl FnOnce(u32),
) -> Option<Stats> {
    let s = Scratch::new(&format!("two-host-{scenario}-a"));
    let mut c = match under {
        Under::Shim => under_shim(Via::Preload, bin, &s, "server"),
        Under::Plain => {
            let mut c = Command::new(bin);
            c.env_remove("LD_PRELOAD");
            c
        }
    };
    c.args([scenario, "server", ip])
        .env("BEHAVE_PORT", base.to_string())
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("spawn the behave server");
    let pid = child.id();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    // (bounded like every wait here: a server that never says it listens fails the test,
    // with what its threads are doing, instead of leaving the other host waiting for a flag)
    let (tx, rx) = std::sync::mpsc::channel();
    let rest = std::thread::spawn(move || {
        let _ = tx.send(lines.next());
        lines.map_while(Result::ok).collect::<Vec<_>>()
    });
    let first = match rx.recv_timeout(LISTEN_WAIT) {
        Ok(first) => first,
        Err(_) => {
            let threads = threads_of(pid);
            let _ = child.kill();
            let out = wait_child(child, Duration::from_secs(10));
            panic!(
                "{scenario} server: not listening after {LISTEN_WAIT:?}; its threads: \
                 {threads}\nstderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    };
    assert!(
        matches!(&first, Some(Ok(l)) if *l == format!("port {base}")),
        "{scenario} server: {first:?}"
    );
    let flag = Flag::raise(base + 1);
    meanwhile(pid);
    let out = wait_child(child, CASE_TIME);
    drop(flag);
    let rest = rest.join().unwrap_or_default();
    checked(out, &format!("{scenario} server on A"), ends);
    if ends == Ends::Ok {
        assert!(
            rest.iter().any(|l| *l == format!("ok {scenario} server")),
            "{scenario} server: {rest:?}"
        );
    }
    own_stats(&s, "server", pid)
}

/// Host B's part of a case: once A's flag is up, the `scenario` client against A's port
/// `base`, under the shim with `env`, while `meanwhile` runs (with the client's pid). Returns
/// the client's stats.
pub fn dial(
    bin: &str,
    scenario: &str,
    base: u16,
    env: &[(&str, &str)],
    meanwhile: impl FnOnce(u32),
) -> Stats {
    dial_to(bin, scenario, &peer_ip(), base, env, meanwhile)
}

/// [`dial`] to address `ip` of the other host (see [`serve_at`]); the flag is looked for on
/// [`peer_ip`].
pub fn dial_to(
    bin: &str,
    scenario: &str,
    ip: &str,
    base: u16,
    env: &[(&str, &str)],
    meanwhile: impl FnOnce(u32),
) -> Stats {
    wait_flag(base + 1, PEER_WAIT);
    let s = Scratch::new(&format!("two-host-{scenario}-b"));
    let mut c = under_shim(Via::Preload, bin, &s, "client");
    c.args([scenario, "client", ip, &base.to_string()])
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = c.spawn().expect("spawn the behave client");
    let pid = child.id();
    meanwhile(pid);
    checked(
        wait_child(child, CASE_TIME),
        &format!("{scenario} client on B"),
        Ends::Ok,
    );
    own_stats(&s, "client", pid).expect("the client wrote no stats")
}

/// An RDMA device being removed (`rdma link delete DEV`, started by [`DeviceRemoval::start`]).
/// soft-RoCE cannot take a device from a process that holds it open: the removal completes
/// once those have exited. Dropping this waits for that (at most a minute), then adds the
/// device back on `RDMA_NETDEV` and waits for its port to be ACTIVE: later tests need it.
pub struct DeviceRemoval {
    dev: String,
    delete: Option<Child>,
}

impl DeviceRemoval {
    /// Starts removing `dev` (it returns at once; the removal goes on in the background).
    pub fn start(dev: &str) -> DeviceRemoval {
        let delete = Command::new("rdma")
            .args(["link", "delete", dev])
            .stdin(Stdio::null())
            .spawn()
            .expect("rdma link delete");
        DeviceRemoval {
            dev: dev.to_string(),
            delete: Some(delete),
        }
    }
}

impl Drop for DeviceRemoval {
    fn drop(&mut self) {
        if let Some(mut d) = self.delete.take() {
            let until = Instant::now() + Duration::from_secs(60);
            while d.try_wait().ok().flatten().is_none() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = d.kill();
            let _ = d.wait();
        }
        let sys = Path::new("/sys/class/infiniband").join(&self.dev);
        if !sys.exists() {
            let netdev = std::env::var("RDMA_NETDEV").unwrap_or_else(|_| "dummy0".into());
            let st = Command::new("rdma")
                .args(["link", "add", &self.dev, "type", "rxe", "netdev", &netdev])
                .status();
            eprintln!("rdma link add {} netdev {netdev}: {st:?}", self.dev);
        }
        let state = sys.join("ports/1/state");
        let until = Instant::now() + Duration::from_secs(20);
        while Instant::now() < until {
            if std::fs::read_to_string(&state).is_ok_and(|s| s.contains("ACTIVE")) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!("{} not ACTIVE again after its removal", self.dev);
    }
}
