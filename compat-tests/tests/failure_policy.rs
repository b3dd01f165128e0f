//! RDMA tier: when the shim itself fails, an upgraded connection fails as a reset TCP
//! connection would — never a hang, never a byte of another stream, never a fall through to
//! a socket the peer no longer writes to (docs/shim.md, "When the shim itself fails").
//!
//! The failures are made on purpose with `RDMASHIM_FAULT` (shim/src/fault.rs): a panic in a
//! data call that reads the ring, on the program's thread, and a panic of the engine thread as
//! it puts a connection onto its ring.
//! An echo pair of Python programs, both under the shim: the client greets, waits until the
//! connection is on the ring, then streams 64 MiB and checks every byte of the echo it reads.
//! Whichever end failed, both programs must see the connection end (ECONNRESET, EPIPE, or EOF
//! for the end that did not fail) within seconds, and what the client read must be an exact
//! prefix of what it sent.

use rdmashim_compat_tests::*;
use std::process::{Command, Stdio};
use std::time::Duration;

const ECHO_PY: &str = r#"
import socket, sys, threading, time
mode, ip, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
def name(e):
    return type(e).__name__
if mode == "server":
    l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind((ip, port)); l.listen(1)
    print("listening", flush=True)
    s, _ = l.accept()
    n = 0
    try:
        while True:
            b = s.recv(65536)
            if not b:
                print("server: eof after", n, flush=True); break
            s.sendall(b); n += len(b)
    except OSError as e:
        print("server:", name(e), "after", n, flush=True)
    sys.exit(0)
TOTAL = 64 << 20
def pattern(i, k):
    # byte j of the stream is (j * 7 + j // 65536) % 251: any shift or loss shows
    return bytes(((j * 7 + j // 65536) % 251) for j in range(i, i + k))
s = socket.create_connection((ip, port))
s.sendall(b"hello"); assert s.recv(5) == b"hello"
time.sleep(2.0)  # (the connection goes onto the ring meanwhile)
block = pattern(0, 1 << 20)
def writer():
    sent = 0
    try:
        while sent < TOTAL:
            s.sendall(block); sent += len(block)
        s.shutdown(socket.SHUT_WR)
    except OSError as e:
        print("client writer:", name(e), "after", sent, flush=True)
w = threading.Thread(target=writer, daemon=True); w.start()
got = 0; bad = None
try:
    while got < TOTAL:
        b = s.recv(65536)
        if not b:
            print("client: eof after", got, flush=True); break
        if bad is None:
            off = got % len(block)
            # (the block repeats every MiB: compare against it, wrapping)
            want = (block + block)[off:off + len(b)]
            if b != want:
                bad = got
        got += len(b)
    else:
        print("client: whole", flush=True)
except OSError as e:
    print("client:", name(e), "after", got, flush=True)
print("prefix", "ok" if bad is None else "differs at %d" % bad, flush=True)
# (the writer ends with the connection; one still printing when the interpreter shuts down
# makes it abort: "could not acquire lock for <stdout>")
w.join(20)
"#;

/// Runs the pair with `fault` (and `env`) in the environment of `faulty` ("server" or
/// "client"); returns
/// (server's stdout+stderr, client's stdout+stderr).
fn pair(fault: &str, faulty: &str, env: &[(&str, &str)]) -> (String, String) {
    let ip = test_ip();
    let s = Scratch::new(&format!("fault-{faulty}"));
    let script = s.dir.join("echo.py");
    std::fs::write(&script, ECHO_PY).unwrap();
    let port = free_port_on(&ip);
    let cmd = |role: &str| -> Command {
        let mut c = shimmed(python(), &s, role);
        c.arg(&script).args([role, &ip, &port.to_string()]);
        if role == faulty {
            c.env("RDMASHIM_FAULT", fault).envs(env.iter().copied());
        }
        c
    };
    let mut srv = cmd("server");
    srv.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut srv = srv.spawn().expect("spawn the server");
    // (its first line says it listens)
    let mut out = std::io::BufReader::new(srv.stdout.take().unwrap());
    let mut first = String::new();
    std::io::BufRead::read_line(&mut out, &mut first).unwrap();
    assert_eq!(first.trim(), "listening", "the server's first line");
    let rest = std::thread::spawn(move || {
        let mut v = String::new();
        let _ = std::io::Read::read_to_string(&mut out, &mut v);
        v
    });
    let cli = run(cmd("client"), Duration::from_secs(60));
    let srv = wait_child(srv, Duration::from_secs(20));
    let text = |o: &std::process::Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    let st = format!("{}{}", rest.join().unwrap(), text(&srv));
    let ct = text(&cli);
    eprintln!("server:\n{st}\nclient:\n{ct}");
    assert!(
        srv.status.success() && cli.status.success(),
        "both programs end normally"
    );
    (st, ct)
}

/// Both ends saw the connection end early, as after a reset, and the client's bytes are an
/// exact prefix; the faulty end's shim said why.
fn check(st: &str, ct: &str, faulty_out: &str, place: &str) {
    assert!(ct.contains("prefix ok"), "the client's bytes are a prefix");
    assert!(
        !ct.contains("client: whole"),
        "the stream cannot have completed"
    );
    assert!(
        st.contains("server: ConnectionResetError")
            || st.contains("server: BrokenPipeError")
            || st.contains("server: eof"),
        "the server saw the connection end"
    );
    assert!(
        ct.contains("client: ConnectionResetError")
            || ct.contains("client: BrokenPipeError")
            || ct.contains("client: eof"),
        "the client saw the connection end"
    );
    assert!(
        faulty_out.contains(&format!("internal error (panic) in {place}"))
            && faulty_out.contains("RDMASHIM_FAULT"),
        "the failing shim logs what happened, in one line of its own"
    );
    assert!(
        !faulty_out.contains("panicked at") && !faulty_out.contains("RUST_BACKTRACE"),
        "Rust's default panic message never reaches the program's stderr"
    );
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn a_panic_in_a_ring_read_resets_the_connection() {
    let (st, ct) = pair("ring_recv:40", "server", &[]);
    check(&st, &ct, &st, "recv");
    // (the failing call itself fails as on a reset TCP connection)
    assert!(
        st.contains("server: ConnectionResetError"),
        "recv: ECONNRESET"
    );
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn a_panic_of_the_engine_thread_resets_the_connection() {
    // (the engine panics as it puts the client's connection onto its ring: the program is in
    // its pause then, and its next calls find the connection reset)
    let (st, ct) = pair("engine_link:1", "client", &[]);
    check(&st, &ct, &ct, "the engine thread");
}
