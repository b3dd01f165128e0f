//! A multithreaded program with many sockets (TCP loopback with blocking and non-blocking
//! connects, concurrent reader/writer fds of one socket, socketpair/dup/dup2/dup3/close churn)
//! runs clean under the shim, and every connection and byte is accounted for (the echo whole
//! and in order on each connection, whichever of them moved to shared memory mid-stream).

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
    // Both ends live in this process: each connection is counted once on each side. They
    // are short (up to 96 KiB each way): most end before their upgrade is decided, some
    // finish over shared memory (same-host upgrades are on by default).
    assert_eq!(st.connections(), 2 * conns, "{}", st.summary());
    // Client sends payload, server echoes it: each direction carries it twice in total,
    // over TCP and the shared-memory rings together, none over RDMA.
    assert_eq!(
        st.bytes("tcp_tx") + st.bytes("shm_tx"),
        2 * payload,
        "{}",
        st.summary()
    );
    assert_eq!(
        st.bytes("tcp_rx") + st.bytes("shm_rx"),
        2 * payload,
        "{}",
        st.summary()
    );
    assert_eq!(st.ring_bytes(), 0, "{}", st.summary());
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
