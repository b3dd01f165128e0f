//! The live view (issue 24): a shimmed process keeps its counters and connections in a file
//! of the run directory while it runs, `rdmashim ss` lists them, `rdmashim stats PID` shows
//! one process's counters, and a process killed with SIGKILL leaves its last figures, marked
//! dead, until `rdmashim ss --clean`.
//!
//! Here over shared memory between two python processes of this host (no RDMA needed): the
//! client's connection is listed as `shm` on both sides, its byte counts grow while it sends,
//! and after the client stopped sending and was killed its record still has every byte it
//! sent.

use rdmashim_compat_tests::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Echoes one connection until it ends, then sleeps; exits normally at SIGTERM.
const ECHO: &str = "import signal, socket, sys, time\n\
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n\
    s = socket.create_server(('127.0.0.1', int(sys.argv[1])))\n\
    c, _ = s.accept()\n\
    while True:\n\
    \x20   try: d = c.recv(65536)\n\
    \x20   except ConnectionError: break\n\
    \x20   if not d: break\n\
    \x20   c.sendall(d)\n\
    c.close()\n\
    time.sleep(600)\n";

/// Sends 1000 bytes and reads them back every 10 ms until the file `ARGV[2]` exists, then
/// writes the bytes it sent to `ARGV[3]` and sleeps (until it is killed).
const CLIENT: &str = "import os, socket, sys, time\n\
    c = socket.create_connection(('127.0.0.1', int(sys.argv[1])))\n\
    sent = 0\n\
    while not os.path.exists(sys.argv[2]):\n\
    \x20   c.sendall(b'x' * 1000); sent += 1000\n\
    \x20   got = 0\n\
    \x20   while got < 1000:\n\
    \x20       d = c.recv(1000 - got)\n\
    \x20       if not d: sys.exit('the server went away')\n\
    \x20       got += len(d)\n\
    \x20   time.sleep(0.01)\n\
    open(sys.argv[3] + '.tmp', 'w').write(str(sent))\n\
    os.rename(sys.argv[3] + '.tmp', sys.argv[3])\n\
    time.sleep(600)\n";

/// A spawned child, killed (SIGKILL) and reaped when dropped: a failing test leaves no
/// process behind.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn launcher(run_dir: &Path, args: &[&str]) -> (bool, Value, String) {
    let out = Command::new(&shim().launcher)
        .args(args)
        .env("RDMASHIM_RUN_DIR", run_dir)
        .stdin(Stdio::null())
        .output()
        .expect("run rdmashim");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let v = serde_json::from_str(&stdout).unwrap_or(Value::Null);
    (
        out.status.success(),
        v,
        format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)),
    )
}

/// `rdmashim ss --json`'s entry for `pid`.
fn ss_proc(run_dir: &Path, pid: u32) -> Option<Value> {
    let (ok, v, text) = launcher(run_dir, &["ss", "--json"]);
    assert!(ok, "ss failed: {text}");
    v["processes"]
        .as_array()?
        .iter()
        .find(|p| p["pid"] == pid)
        .cloned()
}

/// Waits until `f` holds (polled every 100 ms), or panics after `secs` with `what`.
fn until<T>(secs: u64, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn conn_tx(p: &Value) -> Option<u64> {
    let c = p["connections"].as_array()?.first()?.clone();
    (c["transport"] == "shm" && c["state"] == "ring").then(|| c["tx_bytes"].as_u64())?
}

fn live_files(run_dir: &Path) -> Vec<String> {
    dir_names(run_dir)
        .into_iter()
        .filter(|n| n.ends_with(".live"))
        .collect()
}

fn shimmed_python(s: &Scratch, run_dir: &PathBuf, label: &str) -> Command {
    let mut c = shimmed(python(), s, label);
    c.env("RDMASHIM_RUN_DIR", run_dir)
        .env("RDMASHIM_LOCAL", "1")
        .env("RDMASHIM_LOG_FILE", s.dir.join(format!("{label}.log")));
    c
}

#[test]
fn ss_lists_live_connections_and_a_killed_process_keeps_its_last_figures() {
    if !local_upgrades() {
        eprintln!("SKIP: same-host upgrades are off here");
        return;
    }
    let s = Scratch::new("live-view");
    let run_dir = s.dir.join("run");
    let port = free_port();
    let mut server = shimmed_python(&s, &run_dir, "server");
    server.args(["-c", ECHO, &port.to_string()]);
    let mut server = Server::start(server, "echo server", "TERM");
    wait_listening(port, &mut server, T);
    let stop = s.dir.join("stop");
    let done = s.dir.join("done");
    let mut client = shimmed_python(&s, &run_dir, "client");
    client
        .args(["-c", CLIENT, &port.to_string()])
        .arg(&stop)
        .arg(&done)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut client = Killed(client.spawn().expect("spawn the client"));
    let cpid = client.0.id();

    // Both ends are listed, on shared memory, and the client's bytes grow.
    let first = until(30, "the client listed on shm with bytes", || {
        ss_proc(&run_dir, cpid)
            .and_then(|p| conn_tx(&p))
            .filter(|tx| *tx > 0)
    });
    let sp = until(10, "the server listed on shm", || {
        ss_proc(&run_dir, server.pid()).filter(|p| conn_tx(p).is_some())
    });
    assert_eq!(sp["status"], "running", "{sp}");
    assert_eq!(sp["connections"][0]["side"], "server", "{sp}");
    assert_eq!(
        sp["connections"][0]["local"].as_str().unwrap(),
        format!("127.0.0.1:{port}"),
        "{sp}"
    );
    until(15, "the client's byte count growing", || {
        ss_proc(&run_dir, cpid)
            .and_then(|p| conn_tx(&p))
            .filter(|tx| *tx > first)
    });
    let (ok, _, text) = launcher(&run_dir, &["ss"]);
    assert!(
        ok && text.contains("shm") && text.contains("ring"),
        "{text}"
    );

    // Traffic stops; once the last figures are published, the client is killed.
    std::fs::write(&stop, b"").unwrap();
    let sent: u64 = until(15, "the client's total", || {
        std::fs::read_to_string(&done).ok()?.trim().parse().ok()
    });
    let published = |v: &Value| {
        v["bytes"]["shm_tx"].as_u64().unwrap_or(0) + v["bytes"]["tcp_tx"].as_u64().unwrap_or(0)
    };
    let before = until(10, "the client's last figures published", || {
        let (ok, v, _) = launcher(&run_dir, &["stats", &cpid.to_string(), "--json"]);
        (ok && published(&v) == sent).then_some(v)
    });
    assert_eq!(before["status"], "running", "{before}");
    assert_eq!(before["connections"]["upgraded"], 1, "{before}");
    client.0.kill().expect("SIGKILL the client");
    let _ = client.0.wait();

    let (ok, after, text) = launcher(&run_dir, &["stats", &cpid.to_string(), "--json"]);
    assert!(ok, "{text}");
    assert_eq!(after["status"], "dead", "{after}");
    assert_eq!(published(&after), sent, "{after}");
    assert!(after["bytes"]["shm_tx"].as_u64().unwrap() > 0, "{after}");
    assert_eq!(
        after["bytes"], before["bytes"],
        "the last figures survive the kill"
    );
    assert_eq!(after["calls"]["send"], before["calls"]["send"]);
    assert!(
        after["program"].as_str().unwrap().starts_with("python"),
        "{after}"
    );
    let (ok, _, text) = launcher(&run_dir, &["stats", &cpid.to_string()]);
    assert!(
        ok && text.contains("dead") && text.contains("shm_tx"),
        "{text}"
    );
    let dead = ss_proc(&run_dir, cpid).expect("the killed client is still listed");
    assert_eq!(dead["status"], "dead", "{dead}");
    assert_eq!(conn_tx(&dead), Some(sent), "{dead}");

    // --clean removes the dead process's record, not the running server's.
    let (ok, _, text) = launcher(&run_dir, &["ss", "--clean"]);
    assert!(ok && text.contains(&format!("{cpid}.live")), "{text}");
    assert_eq!(live_files(&run_dir), vec![format!("{}.live", server.pid())]);
    let (ok, _, text) = launcher(&run_dir, &["stats", &cpid.to_string()]);
    assert!(!ok && text.contains("no live record"), "{text}");

    // A normal exit removes the process's own record.
    server.stop();
    until(10, "the server's record removed at its exit", || {
        live_files(&run_dir).is_empty().then_some(())
    });
    for l in ["server", "client"] {
        let log = std::fs::read_to_string(s.dir.join(format!("{l}.log"))).unwrap_or_default();
        assert!(!log.contains("live view"), "{l}: {log}");
    }
}

/// A short client: connects to `ARGV[1]`, sends a byte, closes.
const ONE: &str = "import socket, sys\n\
    c = socket.create_connection(('127.0.0.1', int(sys.argv[1])))\n\
    c.sendall(b'x'); c.close()\n";

#[test]
fn no_live_view_when_off_or_impossible_and_the_program_is_undisturbed() {
    let s = Scratch::new("live-off");
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port().to_string();
    let accept = std::thread::spawn(move || {
        for _ in 0..2 {
            let _ = l.accept();
        }
    });
    // RDMASHIM_LIVE=0: nothing made.
    let run_dir = s.dir.join("run");
    let mut c = shimmed_python(&s, &run_dir, "off");
    c.env("RDMASHIM_LIVE", "0").args(["-c", ONE, &port]);
    let out = run(c, T);
    assert!(out.status.success(), "{out:?}");
    assert!(
        !run_dir.exists(),
        "RDMASHIM_LIVE=0 made {}",
        run_dir.display()
    );
    // A run directory that cannot be made: one line in the shim's log, nothing on stderr.
    let mut c = shimmed_python(&s, &run_dir, "impossible");
    c.env("RDMASHIM_RUN_DIR", "/proc/rdmashim-no-such-dir/run")
        .args(["-c", ONE, &port]);
    let out = run(c, T);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
    let log = std::fs::read_to_string(s.dir.join("impossible.log")).unwrap();
    assert_eq!(log.matches("no live view").count(), 1, "{log}");
    assert!(log.contains("/proc/rdmashim-no-such-dir/run"), "{log}");
    accept.join().unwrap();
}

/// Connects to `ARGV[1]`, forks; the child makes a second connection there; the parent
/// prints the child's pid; both then sleep.
const FORK: &str = "import os, socket, sys, time\n\
    c = socket.create_connection(('127.0.0.1', int(sys.argv[1])))\n\
    pid = os.fork()\n\
    if pid: print(pid, flush=True)\n\
    else: d = socket.create_connection(('127.0.0.1', int(sys.argv[1])))\n\
    time.sleep(600)\n";

#[test]
fn a_fork_child_makes_a_record_of_its_own_with_the_connections_it_inherited() {
    let s = Scratch::new("live-fork");
    let run_dir = s.dir.join("run");
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let mut c = shimmed_python(&s, &run_dir, "fork");
    c.args(["-c", FORK, &port.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut parent = Killed(c.spawn().expect("spawn"));
    let (_conn, _) = l.accept().unwrap();
    let (_second, _) = l.accept().unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(parent.0.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let child: u32 = line.trim().parse().expect("the child's pid");
    // (killed if the test fails before it does)
    struct KillPid(u32);
    impl Drop for KillPid {
        fn drop(&mut self) {
            if !std::thread::panicking() {
                return;
            }
            let _ = Command::new("kill")
                .args(["-KILL", &self.0.to_string()])
                .status();
        }
    }
    let _child_guard = KillPid(child);
    let peer = format!("127.0.0.1:{port}");
    let pp = until(10, "the parent listed", || ss_proc(&run_dir, parent.0.id()));
    assert_eq!(pp["connections"].as_array().unwrap().len(), 1, "{pp}");
    assert_eq!(pp["connections"][0]["peer"], peer.as_str(), "{pp}");
    // The child's file, made at its own connection, lists the one it inherited first.
    let cp = until(10, "the child listed with two connections", || {
        ss_proc(&run_dir, child)
            .filter(|p| p["connections"].as_array().is_some_and(|c| c.len() == 2))
    });
    assert_eq!(cp["status"], "running", "{cp}");
    assert_eq!(cp["ppid"], parent.0.id(), "{cp}");
    assert_eq!(
        cp["connections"][0]["fd"], pp["connections"][0]["fd"],
        "{cp}"
    );
    assert_eq!(
        cp["connections"][0]["local"], pp["connections"][0]["local"],
        "{cp}"
    );
    assert_eq!(cp["connections"][1]["peer"], peer.as_str(), "{cp}");
    assert_ne!(
        cp["connections"][1]["local"], cp["connections"][0]["local"],
        "{cp}"
    );
    Command::new("kill")
        .args(["-KILL", &child.to_string()])
        .status()
        .unwrap();
    parent.0.kill().unwrap();
    let _ = parent.0.wait();
    until(10, "both dead", || {
        [parent.0.id(), child]
            .iter()
            .all(|p| ss_proc(&run_dir, *p).is_some_and(|v| v["status"] == "dead"))
            .then_some(())
    });
    let (ok, _, text) = launcher(&run_dir, &["ss", "--clean"]);
    assert!(ok, "{text}");
    assert!(live_files(&run_dir).is_empty(), "{text}");
}
