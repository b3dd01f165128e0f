//! RDMA tier: a peer *process* killed mid-stream. The survivor's blocked recv (or send) must
//! end with an error or EOF within a second: never a hang.
//!
//! The peer is a separate process, `stream-peer` (src/bin/stream-peer.rs), SIGKILLed by the test.
//! Over every connection kind.

mod support;

use std::io::Write;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdmashim_core::Listener;
use support::Variant;

const LIMIT: Duration = Duration::from_secs(1);

/// The peer process (src/bin/stream-peer.rs): `writer` streams bytes forever, `sleeper`
/// connects and never reads.
fn spawn_helper(role: &str, addr: SocketAddr, kind: Variant) -> Child {
    Command::new(env!("CARGO_BIN_EXE_stream-peer"))
        .args([role, &addr.to_string(), kind.kind.name()])
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn stream-peer")
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn reader_sees_error_or_eof_within_a_second_of_the_writer_dying() {
    writer_dies(6, support::IMM);
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn reader_sees_error_or_eof_within_a_second_of_the_writer_dying_over_records() {
    writer_dies(8, support::RECORDS);
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn reader_sees_error_or_eof_within_a_second_of_the_writer_dying_over_sends() {
    writer_dies(10, support::SENDS);
}

/// (the survivor's receives in a shared receive queue: a dead peer flushes none of them)
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn reader_sees_error_or_eof_within_a_second_of_the_writer_dying_over_srq() {
    writer_dies(12, support::SRQ);
}

/// (the survivor pulls: a READ from a dead peer fails as a WRITE to one does)
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn reader_sees_error_or_eof_within_a_second_of_the_writer_dying_over_read() {
    writer_dies(14, support::READ);
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn reader_sees_error_or_eof_within_a_second_of_the_writer_dying_over_duplex() {
    writer_dies(4, support::DUPLEX);
}

fn writer_dies(port: u16, kind: Variant) {
    let _ = support::device();
    let addr = support::addr(port);
    let listener = Listener::bind_with(addr, kind.config()).expect("bind");
    let mut child = spawn_helper("writer", addr, kind);
    let mut s = listener.accept().expect("accept the helper");
    kind.check(&s);
    let mut buf = vec![0u8; 256 * 1024];
    let mut got = 0usize;
    while got < 4 << 20 {
        let n = s.recv(&mut buf).expect("recv while the helper lives");
        assert!(n > 0);
        assert!(buf[..n].iter().all(|&b| b == 0x5a));
        got += n;
    }
    child.kill().expect("SIGKILL the helper");
    let killed = Instant::now();
    child.wait().unwrap();
    let outcome = loop {
        match s.recv(&mut buf) {
            Ok(0) => break "EOF".to_owned(),
            Ok(_) => {
                assert!(
                    killed.elapsed() < LIMIT,
                    "still reading data {:?} after the kill",
                    killed.elapsed()
                );
                continue;
            }
            Err(e) => break format!("{:?}: {e}", e.kind()),
        }
    };
    let took = killed.elapsed();
    eprintln!("reader: {outcome} {took:?} after SIGKILL");
    assert!(took < LIMIT, "the reader took {took:?} ({outcome})");
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn blocked_writer_sees_an_error_within_a_second_of_the_reader_dying() {
    reader_dies(7, support::IMM);
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn blocked_writer_sees_an_error_within_a_second_of_the_reader_dying_over_records() {
    reader_dies(9, support::RECORDS);
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn blocked_writer_sees_an_error_within_a_second_of_the_reader_dying_over_sends() {
    reader_dies(11, support::SENDS);
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn blocked_writer_sees_an_error_within_a_second_of_the_reader_dying_over_srq() {
    reader_dies(13, support::SRQ);
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn blocked_writer_sees_an_error_within_a_second_of_the_reader_dying_over_read() {
    reader_dies(15, support::READ);
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn blocked_writer_sees_an_error_within_a_second_of_the_reader_dying_over_duplex() {
    reader_dies(5, support::DUPLEX);
}

fn reader_dies(port: u16, kind: Variant) {
    let _ = support::device();
    let addr = support::addr(port);
    let listener = Listener::bind_with(addr, kind.config()).expect("bind");
    let mut child = spawn_helper("sleeper", addr, kind);
    let mut s = listener.accept().expect("accept the helper");
    kind.check(&s);
    // Fill the helper's ring (it never reads) to within a chunk, so that sends block on credit
    // soon. (Records take a little of the ring for their framing: the payload that fits is a
    // little less than the ring's size.)
    let chunk = vec![1u8; 64 * 1024];
    let t = Instant::now();
    let mut sent = 0usize;
    while sent + chunk.len() <= s.config().ring_size {
        sent += s.send(&chunk).expect("send while the helper lives");
        assert!(t.elapsed() < Duration::from_secs(30), "ring never filled");
    }
    child.kill().expect("SIGKILL the helper");
    let killed = Instant::now();
    child.wait().unwrap();
    let e = loop {
        match s.write_all(&chunk) {
            Ok(()) => assert!(killed.elapsed() < LIMIT, "writes still succeed"),
            Err(e) => break e,
        }
    };
    let took = killed.elapsed();
    eprintln!("writer: {:?}: {e} {took:?} after SIGKILL", e.kind());
    assert!(took < LIMIT, "the writer took {took:?} ({e})");
    assert!(
        matches!(
            e.kind(),
            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
        ),
        "{e}"
    );
    let _ = s.flush();
}
