//! Programs that never touch sockets run unchanged under the shim (same output, same exit
//! status), and leave a stats file with no connection.

use rdmashim_compat_tests::*;
use std::process::Command;

fn compare(prog: &str, args: &[&str], label: &str) {
    let s = Scratch::new(label);
    let mut plain = Command::new(prog);
    plain.args(args).env_remove("LD_PRELOAD");
    let a = run(plain, T);
    let mut sh = shimmed(prog, &s, label);
    sh.args(args);
    let b = run(sh, T);
    assert_eq!(
        a.status.code(),
        b.status.code(),
        "{prog} {args:?}: exit status differs"
    );
    assert_eq!(a.stdout, b.stdout, "{prog} {args:?}: stdout differs");
    assert_eq!(
        String::from_utf8_lossy(&a.stderr),
        String::from_utf8_lossy(&b.stderr),
        "{prog} {args:?}: stderr differs"
    );
    for st in s.stats(label) {
        assert_eq!(st.connections(), 0);
    }
}

#[test]
fn ls_unchanged() {
    compare("ls", &["-la", "/usr/bin", "/etc"], "ls");
    compare("ls", &["/nonexistent-rdmashim"], "ls-fail");
    let s = Scratch::new("ls-stats");
    run_ok(shimmed("ls", &s, "ls"), T);
    let st = s.one_stats("ls");
    assert_eq!(st.connections(), 0);
    // Debian's ls imports only ioctl among the hooks (TIOCGWINSZ, when stdout is a terminal):
    // with stdout a pipe it makes no hooked call at all, and still gets its (empty) record.
    assert_eq!(
        st.nonzero_calls().keys().filter(|h| **h != "ioctl").count(),
        0
    );
}

#[test]
fn python_unchanged() {
    let py = python();
    let py = py.to_str().unwrap();
    let code = "import hashlib, os, socket, fcntl\n\
                a, b = socket.socketpair()\n\
                a.sendall(b'x' * 100000); a.shutdown(socket.SHUT_WR)\n\
                d = b''\n\
                while True:\n    c = b.recv(65536)\n    if not c: break\n    d += c\n\
                fd = os.dup(b.fileno()); os.dup2(fd, 100); os.close(100); os.close(fd)\n\
                fcntl.fcntl(a.fileno(), fcntl.F_GETFL)\n\
                print(len(d), hashlib.sha256(d).hexdigest())";
    compare(py, &["-c", code], "py");
    compare(
        py,
        &[
            "-c",
            "import sys; print('err', file=sys.stderr); sys.exit(3)",
        ],
        "py-exit",
    );
    let s = Scratch::new("py-stats");
    let mut c = shimmed(py, &s, "py");
    c.args(["-c", code]);
    let out = run_ok(c, T);
    assert!(out.starts_with("100000 "), "{out}");
    let st = s.one_stats("py");
    assert_eq!(st.connections(), 0);
    assert_eq!(
        st.bytes("tcp_tx") + st.bytes("tcp_rx"),
        0,
        "AF_UNIX bytes are not TCP bytes"
    );
    // CPython is built with large-file support: fcntl() is fcntl64, and os.dup() is
    // fcntl64(F_DUPFD_CLOEXEC).
    st.assert_fired(&[
        "socketpair",
        "send",
        "shutdown",
        "recv",
        "dup2",
        "close",
        "fcntl64",
    ]);
}

#[test]
fn disabled_still_passes_through_and_counts() {
    let s = Scratch::new("disabled");
    let py = python();
    let code = "import socket\n\
                l = socket.socket(); l.bind(('127.0.0.1', 0)); l.listen()\n\
                c = socket.create_connection(l.getsockname()); a, _ = l.accept()\n\
                c.sendall(b'hello'); print(a.recv(5).decode())";
    let mut c = shimmed(&py, &s, "py");
    c.args(["-c", code]).env("RDMASHIM_DISABLE", "1");
    assert_eq!(run_ok(c, T).trim(), "hello");
    let st = s.one_stats("py");
    assert_eq!(st.connections(), 2);
    st.assert_all_fallback("disabled");
    assert_eq!(st.bytes("tcp_tx"), 5);
    assert_eq!(st.bytes("tcp_rx"), 5);
}
