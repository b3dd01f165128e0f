//! RDMA tier: a forger — another user on the same host, with nothing but the rdma_cm device
//! (`src/bin/forge.rs`) — against shimmed servers (docs/protocol.md 2.8–2.9). Whatever it does,
//! the real connection's bytes arrive intact, on TCP or on its own ring; the forgery is rejected
//! and counted; the forger never gets a connection.
//!
//! The service is a small Python echo server; its client holds its connection open for a few
//! seconds (the forger strikes meanwhile), then echoes random bytes and checks them.

use rdmashim_compat_tests::*;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const FORGE: &str = env!("CARGO_BIN_EXE_forge");

const SERVER: &str = "import socket, sys, threading
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(16)
def serve(c):
    with c:
        while True:
            d = c.recv(65536)
            if not d:
                return
            c.sendall(d)
try:
    while True:
        c, _ = s.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()
except KeyboardInterrupt:
    pass
";

const CLIENT: &str = "import socket, sys, time, random, hashlib
c = socket.create_connection((sys.argv[1], int(sys.argv[2])))
print('connected', c.getsockname()[1], flush=True)
time.sleep(float(sys.argv[3]))
data = random.Random(7).randbytes(int(sys.argv[4]))
got = bytearray()
for i in range(0, len(data), 4096):
    chunk = data[i:i + 4096]
    c.sendall(chunk)
    want = len(chunk)
    while want:
        b = c.recv(want)
        if not b:
            sys.exit('EOF before the echo')
        got += b
        want -= len(b)
print('ok' if bytes(got) == data else 'MISMATCH', hashlib.sha256(got).hexdigest(), flush=True)
c.close()
";

/// Bytes the client echoes.
const SIZE: usize = 256 << 10;

/// The forger as user `nobody` (another user than the service and its client).
fn forger(args: &[&str]) -> Command {
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(FORGE)
        .args(args)
        .env_remove("LD_PRELOAD");
    c
}

/// The forger started, once it says it is ready (for a request: it watches for the victim's
/// connection).
fn ready_forger(args: &[&str]) -> Child {
    let mut c = forger(args);
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("spawn the forger");
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().expect("stdout"))
        .read_line(&mut line)
        .expect("read");
    assert!(line.starts_with("forge: "), "forger said {line:?}");
    child
}

/// The forger's output, once it finished (successfully).
fn forger_output(child: Child) -> String {
    let out = wait_child(child, Duration::from_secs(120));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "forger: {}\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The `forge: k=v ...` summary.
fn summary(out: &str) -> BTreeMap<String, u64> {
    let line = out
        .lines()
        .rfind(|l| l.starts_with("forge: ") && l.contains('='))
        .unwrap_or_else(|| panic!("no summary in {out:?}"));
    line["forge: ".len()..]
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.parse().unwrap_or(0)))
        .collect()
}

fn echo_server(s: &Scratch, ip: &str, port: u16, shim: bool) -> Server {
    let py = python();
    let mut cmd = if shim {
        shimmed(&py, s, "server")
    } else {
        let mut c = Command::new(&py);
        c.env_remove("LD_PRELOAD");
        c
    };
    cmd.args(["-c", SERVER, ip, &port.to_string()]);
    let mut srv = Server::start(cmd, "echo server", "INT");
    wait_listening(port, &mut srv, Duration::from_secs(30));
    srv
}

/// A client that connects, holds `hold` seconds, then echoes [`SIZE`] bytes; started, with its
/// "connected" line read.
fn echo_client(s: &Scratch, ip: &str, port: u16, hold: f64, shim: bool) -> Child {
    let py = python();
    let mut cmd = if shim {
        let mut c = shimmed(&py, s, "client");
        // (its upgrade waits this long after the token: the forger strikes before it)
        c.env("RDMASHIM_DIAL_DELAY_MS", "1000");
        c
    } else {
        let mut c = Command::new(&py);
        c.env_remove("LD_PRELOAD");
        c
    };
    cmd.args(["-c", CLIENT, ip, &port.to_string(), &hold.to_string()])
        .arg(SIZE.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn the client");
    let mut line = String::new();
    let stdout = child.stdout.as_mut().expect("stdout");
    BufReader::new(stdout).read_line(&mut line).expect("read");
    assert!(line.starts_with("connected "), "client said {line:?}");
    child
}

/// Waits for the client and checks its bytes came back intact.
fn finish_client(child: Child) {
    let out = wait_child(child, Duration::from_secs(120));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("ok "),
        "client: {}\nstdout: {text}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A forged request, right ports and a key of the forger's own, for a shimmed client's live
/// connection while its server waits for the real request: rejected `Unproven` and counted; the
/// real request then upgrades the connection, and the bytes go over the rings, intact.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn forged_requests_for_a_live_connection_are_rejected() {
    let ip = test_ip();
    let s = Scratch::new("forge-request");
    let port = free_port_on(&ip);
    let mut srv = echo_server(&s, &ip, port, true);
    let target = format!("{ip}:{port}");
    let forge = ready_forger(&["request", &target, "3", "100"]);
    let client = echo_client(&s, &ip, port, 4.0, true);
    let out = forger_output(forge);
    let f = summary(&out);
    assert_eq!(f["connected"], 0, "{out}");
    let unproven = f.get("rejected_unproven").copied().unwrap_or(0);
    assert!(
        unproven >= 1,
        "no forged request met the waiting connection: {out}"
    );
    // (one that came after the real upgrade finds no waiting connection: NoMatchingTcp)
    let late = f.get("rejected_nomatchingtcp").copied().unwrap_or(0);
    assert_eq!(
        f.get("sent").copied().unwrap_or(0),
        unproven + late,
        "every forged request was refused: {out}"
    );
    finish_client(client);
    srv.stop();
    let c = s.one_stats("client");
    c.assert_upgraded(1, SIZE as u64);
    let srv_stats = s.one_stats("server");
    srv_stats.assert_upgraded(1, SIZE as u64);
    assert_eq!(
        srv_stats.raw["security"]["unproven_requests"].as_u64(),
        Some(unproven),
        "{}",
        srv_stats.raw
    );
}

/// The same against a plain client's connection to a shimmed server: the server sent no token
/// (the SYN was not marked), so nothing can match; the forger gets nothing, the connection
/// stays TCP, the bytes are intact.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn forged_requests_for_a_plain_clients_connection_get_nothing() {
    let ip = test_ip();
    let s = Scratch::new("forge-plain");
    let port = free_port_on(&ip);
    let mut srv = echo_server(&s, &ip, port, true);
    let forge = ready_forger(&["request", &format!("{ip}:{port}"), "1", "0"]);
    let client = echo_client(&s, &ip, port, 1.0, false);
    let out = forger_output(forge);
    let f = summary(&out);
    assert_eq!(f["connected"], 0, "{out}");
    assert!(f.get("sent").copied().unwrap_or(0) >= 1, "{out}");
    finish_client(client);
    srv.stop();
    let st = s.one_stats("server");
    st.assert_fallback_reasons(&[("plain_peer", 1)]);
    assert_eq!(st.ring_bytes(), 0);
}

/// A squatter holds the service's rdma_cm port before the service starts: the shimmed server
/// has no rdma_cm side, sends no token, and its shimmed clients never dial — the squatter gets
/// no request at all; the bytes stay on TCP, intact.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn a_squatter_on_the_services_rdma_port_gets_nothing() {
    let ip = test_ip();
    let s = Scratch::new("forge-squat");
    let port = free_port_on(&ip);
    let sq = ready_forger(&["squat", &format!("{ip}:{port}"), "12"]);
    let mut srv = echo_server(&s, &ip, port, true);
    let client = echo_client(&s, &ip, port, 2.0, true);
    finish_client(client);
    srv.stop();
    let text = forger_output(sq);
    assert_eq!(summary(&text)["requests"], 0, "{text}");
    let c = s.one_stats("client");
    c.assert_fallback_reasons(&[("plain_peer", 1)]);
    assert_eq!(c.ring_bytes(), 0);
}

/// A flood of raw requests — random bytes, truncated and bit-flipped requests, well-formed ones
/// with forged tags — at a shimmed server while a real client waits to upgrade: every one is
/// rejected, none accepted; the server goes on serving, and the real connection upgrades.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn a_flood_of_bogus_requests_is_rejected() {
    let ip = test_ip();
    let s = Scratch::new("forge-flood");
    let port = free_port_on(&ip);
    let mut srv = echo_server(&s, &ip, port, true);
    let client = echo_client(&s, &ip, port, 7.0, true);
    let out = run_ok(
        forger(&["flood", &format!("{ip}:{port}"), "120"]),
        Duration::from_secs(120),
    );
    let f = summary(&out);
    assert_eq!(f["accepted"], 0, "{out}");
    assert_eq!(f.get("no_answer").copied().unwrap_or(0), 0, "{out}");
    let rejected: u64 = f
        .iter()
        .filter(|(k, _)| k.starts_with("rejected_"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(
        rejected, f["sent"],
        "every request answered with a reject: {out}"
    );
    assert!(f["sent"] >= 100, "{out}");
    finish_client(client);
    srv.assert_running();
    srv.stop();
    // (upgraded while the server was busy with the flood: its bytes went over the ring from
    // then on)
    s.one_stats("client").assert_upgraded(1, 1);
}

/// The SYN's mark is the shim's business only: a client that set its own TTL and PMTU mode
/// before connecting finds them as it set them afterwards, and one that did not finds the
/// defaults — and the connection still upgrades.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn the_syn_mark_leaves_the_applications_options_as_they_were() {
    let ip = test_ip();
    let s = Scratch::new("forge-options");
    let port = free_port_on(&ip);
    let mut srv = echo_server(&s, &ip, port, true);
    let code = "import socket, sys, time
def opts(c):
    return (c.getsockopt(socket.IPPROTO_IP, socket.IP_TTL),
            c.getsockopt(socket.IPPROTO_IP, 10))  # IP_MTU_DISCOVER
plain = socket.socket()
default = opts(plain)
c = socket.socket()
c.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, 33)
c.setsockopt(socket.IPPROTO_IP, 10, 3)  # IP_PMTUDISC_PROBE
c.connect((sys.argv[1], int(sys.argv[2])))
d = socket.create_connection((sys.argv[1], int(sys.argv[2])))
time.sleep(2)
for s in (c, d):
    s.sendall(b'x' * 1000)
    got = b''
    while len(got) < 1000:
        got += s.recv(1000)
print(opts(c) == (33, 3), opts(d) == default, default, flush=True)
";
    let mut cmd = shimmed(python(), &s, "client");
    cmd.args(["-c", code, &ip, &port.to_string()]);
    let out = run_ok(cmd, T);
    assert!(out.starts_with("True True"), "{out}");
    srv.stop();
    let c = s.one_stats("client");
    c.assert_upgraded(2, 2000);
}
