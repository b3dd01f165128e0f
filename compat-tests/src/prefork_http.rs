//! Prefork web servers in the RDMA tier (nginx, lighttpd): a keep-alive HTTP client under the
//! shim, and the checks of the servers' records.

use crate::{
    python, random_bytes, run_ok, sha256_hex, shimmed, wait_listening, Rings, Scratch, Server,
    Stats,
};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The file every server serves.
pub const FILE: usize = 256 << 10;
/// Keep-alive connections the client holds at once.
pub const CONNS: usize = 3;
/// GETs of the file per connection, 100 ms apart.
pub const GETS: usize = 20;

/// `client.py IP PORT PATH SHA256 CONNS GETS`: CONNS threads, each one keep-alive connection
/// making GETS requests 100 ms apart; exits 1 on any error or a body that does not match.
const CLIENT_PY: &str = r#"
import hashlib, http.client, sys, threading, time
ip, port, path, want, conns, gets = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
errors = []
def one(i):
    try:
        c = http.client.HTTPConnection(ip, port, timeout=60)
        for g in range(gets):
            c.request("GET", path)
            r = c.getresponse()
            body = r.read()
            if r.status != 200 or hashlib.sha256(body).hexdigest() != want:
                errors.append(f"connection {i} get {g}: status {r.status}, {len(body)} bytes")
                return
            time.sleep(0.1)
        c.close()
    except Exception as e:
        errors.append(f"connection {i}: {e!r}")
ts = [threading.Thread(target=one, args=(i,)) for i in range(conns)]
for t in ts: t.start()
for t in ts: t.join()
for e in errors: print(e, file=sys.stderr)
sys.exit(1 if errors else 0)
"#;

/// A document root in the scratch dir, readable by the servers' unprivileged workers, holding
/// `f.bin` ([`FILE`] random bytes); returns it and the file's SHA-256. Makes the scratch dir
/// sticky and world-writable, as /tmp is, so that workers that dropped root write their records
/// there (the shim writes into no directory others may rename files in).
pub fn www(s: &Scratch) -> (PathBuf, String) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&s.dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let www = s.dir.join("www");
    std::fs::create_dir(&www).unwrap();
    std::fs::set_permissions(&www, std::fs::Permissions::from_mode(0o755)).unwrap();
    let file = random_bytes(FILE, 23);
    std::fs::write(www.join("f.bin"), &file).unwrap();
    (www, sha256_hex(&file))
}

/// Writes a lighttpd configuration serving `www` on `ip:port` (its error log in the scratch
/// directory, keep-alive connections for 1,000 requests), then `extra` (lines of its own);
/// returns its path.
pub fn lighttpd_conf(s: &Scratch, www: &Path, (ip, port): (&str, u16), extra: &str) -> PathBuf {
    let conf = s.dir.join("lighttpd.conf");
    std::fs::write(
        &conf,
        format!(
            "server.document-root = \"{}\"\nserver.bind = \"{ip}\"\nserver.port = {port}\n\
             server.errorlog = \"{}\"\nserver.max-keep-alive-requests = 1000\n{extra}",
            www.display(),
            s.dir.join("error.log").display()
        ),
    )
    .unwrap();
    conf
}

/// Runs the client under the shim (label `client`) against `ip:port`, every body checked
/// against `want`; returns its record, which must count [`CONNS`] upgraded connections.
pub fn fetch(s: &Scratch, ip: &str, port: u16, want: &str) -> Stats {
    let client = s.dir.join("client.py");
    std::fs::write(&client, CLIENT_PY).unwrap();
    let mut c = shimmed(python(), s, "client");
    c.arg(&client).args([
        ip,
        &port.to_string(),
        "/f.bin",
        want,
        &CONNS.to_string(),
        &GETS.to_string(),
    ]);
    run_ok(c, Duration::from_secs(120));
    let cst = s.one_stats("client");
    eprintln!("client: {}", cst.summary());
    assert_eq!(cst.connections(), CONNS as u64, "{}", cst.summary());
    cst.assert_all_upgraded();
    cst
}

/// Starts `cmd` (a prefork server labelled `name`, listening on `ip:port`; stopped with
/// `stop_signal`, gracefully: its workers exit normally and write their records), runs the
/// client against it ([`fetch`]), stops it; returns the client's record.
pub fn serve_and_fetch(
    s: &Scratch,
    cmd: Command,
    name: &str,
    stop_signal: &'static str,
    (ip, port): (&str, u16),
    want: &str,
) -> Stats {
    let mut server = Server::start(cmd, name, stop_signal);
    wait_listening(port, &mut server, Duration::from_secs(30));
    let cst = fetch(s, ip, port, want);
    assert!(server.stop().expect("server status").success(), "{name}");
    cst
}

/// The server's records (`all`, its parent's and its workers'), against the client's `cst`:
/// only workers accepted, [`CONNS`] in all, each upgraded, and most responses went through
/// their rings (of kind `rings`).
pub fn check_workers(name: &str, all: &[Stats], cst: &Stats, rings: Rings) {
    check_workers_woken(name, all, cst, &[], rings);
}

/// [`check_workers`] for a server that also connects to its own listener (apache's parent
/// wakes each worker blocked in accept so at a graceful stop: its "dummy connection"). Such
/// connections carry a few bytes, end at once and stay TCP with one of `wakeups`' reasons, in
/// whichever process accepted them (a worker that served the client too); every other
/// connection is the client's, upgraded in the worker that accepted it.
pub fn check_workers_woken(name: &str, all: &[Stats], cst: &Stats, wakeups: &[&str], rings: Rings) {
    let mut upgraded = 0;
    let mut ring_tx = 0;
    for st in all {
        eprintln!("{name}: {}", st.summary());
        let woken: u64 = wakeups.iter().map(|r| st.reason(r)).sum();
        assert_eq!(
            st.fallback,
            woken,
            "{name}: only wake-ups stay TCP: {}",
            st.summary()
        );
        if st.upgraded() == 0 && woken > 0 {
            assert!(
                st.bytes("tcp_rx") + st.bytes("tcp_tx") < 4096,
                "{name}: a wake-up carries a few bytes: {}",
                st.summary()
            );
        }
        upgraded += st.upgraded();
        ring_tx += rings.tx(st);
    }
    assert_eq!(
        upgraded, CONNS as u64,
        "{name}: the client's connections, each upgraded in the worker that accepted it"
    );
    // Most responses came after the switch (it takes a fraction of the first 100 ms pause).
    assert!(
        ring_tx >= (CONNS * GETS / 2 * FILE) as u64,
        "the workers sent {ring_tx} bytes through the {rings:?} rings"
    );
    assert!(rings.rx(cst) >= ring_tx, "{}", cst.summary());
}
