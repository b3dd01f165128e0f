//! RDMA tier: half-close. The client sends, shuts its write side down and keeps reading; the
//! server reads to EOF, then answers on the still-open direction and closes; the client reads
//! the answer to EOF. Sends after the shutdown fail with BrokenPipe. Over every connection kind.

mod support;

use std::io::{ErrorKind, Read};
use std::net::Shutdown;
use std::thread;

use rdmashim_core::{Listener, Stream};
use support::Variant;

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn shutdown_write_then_read_to_eof_both_ways() {
    half_close(5, support::IMM);
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn shutdown_write_then_read_to_eof_both_ways_over_records() {
    half_close(8, support::RECORDS);
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn shutdown_write_then_read_to_eof_both_ways_over_sends() {
    half_close(9, support::SENDS);
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn shutdown_write_then_read_to_eof_both_ways_over_srq() {
    half_close(10, support::SRQ);
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn shutdown_write_then_read_to_eof_both_ways_over_read() {
    half_close(11, support::READ);
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn shutdown_write_then_read_to_eof_both_ways_over_duplex() {
    half_close(12, support::DUPLEX);
}

fn half_close(port: u16, kind: Variant) {
    let _ = support::device();
    let addr = support::addr(port);
    let request: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let expect = request.clone();
    let listener = Listener::bind_with(addr, kind.config()).expect("bind");
    let server = thread::spawn(move || {
        let mut s = listener.accept().expect("accept");
        kind.check(&s);
        let mut got = Vec::new();
        s.read_to_end(&mut got).expect("server reads to EOF");
        assert!(got == expect, "request bytes differ ({} read)", got.len());
        // EOF is sticky
        assert_eq!(s.recv(&mut [0u8; 16]).unwrap(), 0);
        // the other direction is still open: answer with a digest-like summary
        let answer: Vec<u8> = got.iter().rev().step_by(1000).copied().collect();
        s.write_all(&answer)
            .expect("server answers after the client's shutdown");
        s.close().expect("server close");
        answer
    });
    let mut c = Stream::connect_with(addr, kind.config()).expect("connect");
    kind.check(&c);
    c.write_all(&request).expect("client sends");
    c.shutdown(Shutdown::Write).expect("shutdown(Write)");
    let e = c.send(b"late").expect_err("send after shutdown must fail");
    assert_eq!(e.kind(), ErrorKind::BrokenPipe, "{e}");
    let mut answer = Vec::new();
    c.read_to_end(&mut answer)
        .expect("client reads the answer to EOF");
    let sent = server.join().expect("server thread");
    assert_eq!(answer, sent);
    c.close().expect("client close");
}
