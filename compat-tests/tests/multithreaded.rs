//! A multithreaded program with many sockets (TCP loopback with blocking and non-blocking
//! connects, concurrent reader/writer fds of one socket, socketpair/dup/dup2/dup3/close churn)
//! runs clean under the shim, and every connection and byte is accounted for.

use rdmashim_compat_tests::*;

#[test]
fn many_threads_many_sockets() {
    let s = Scratch::new("mt");
    let out = run_ok(shimmed(env!("CARGO_BIN_EXE_mt_sockets"), &s, "mt"), T);
    let line = out
        .lines()
        .find(|l| l.starts_with("ok "))
        .unwrap_or_else(|| panic!("no ok line: {out}"));
    let field = |k: &str| -> u64 {
        line.split_whitespace()
            .find_map(|f| f.strip_prefix(&format!("{k}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{k} missing in {line}"))
    };
    let conns = field("connections");
    let payload = field("payload_bytes");
    let st = s.one_stats("mt");
    // Both ends live in this process: each connection is counted once on each side.
    assert_eq!(st.connections(), 2 * conns, "{:?}", st.raw);
    st.assert_all_fallback(&expected_reason());
    // Client sends payload, server echoes it: each direction carries it twice in total.
    assert_eq!(st.bytes("tcp_tx"), 2 * payload);
    assert_eq!(st.bytes("tcp_rx"), 2 * payload);
    assert_eq!(st.bytes("ring_tx") + st.bytes("ring_rx"), 0);
    st.assert_fired(&[
        // std's TcpStream uses recv/send; set_nonblocking is ioctl(FIONBIO); try_clone is
        // fcntl(F_DUPFD_CLOEXEC); connect_timeout polls.
        "socket",
        "bind",
        "listen",
        "accept4",
        "connect",
        "poll",
        "ioctl",
        "recv",
        "send",
        "shutdown",
        "close",
        "socketpair",
        "fcntl",
        "dup2",
        "dup3",
    ]);
}

#[test]
fn same_program_without_shim_agrees() {
    let out = run_ok(
        std::process::Command::new(env!("CARGO_BIN_EXE_mt_sockets")),
        T,
    );
    assert!(out.starts_with("ok connections=200 "), "{out}");
}
