//! RDMA tier: 100 ring streams at once in one process, each moving data both ways, every
//! byte checked — over every connection kind.

mod support;

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use rdmashim_core::{Listener, Stream, StreamConfig};
use support::Variant;

const CONNS: usize = 100;
const LEN: usize = 96 * 1024;

fn cfg(v: Variant) -> StreamConfig {
    StreamConfig {
        ring_size: 64 * 1024, // 100 × 2 × (rx + staging) stays small and pinned memory low
        recv_slots: 16,
        sq_depth: 32,
        connect_timeout: Duration::from_secs(60),
        ..v.config()
    }
}

/// The bytes connection `i` sends from `side` (0 client, 1 server).
fn pattern(i: usize, side: usize) -> Vec<u8> {
    (0..LEN)
        .map(|k| (k.wrapping_mul(7) ^ i.wrapping_mul(131) ^ side.wrapping_mul(61)) as u8)
        .collect()
}

/// Sends our pattern and receives the peer's, both at once; checks it; then closes.
fn exchange(mut s: Stream, i: usize, side: usize) {
    let h = s.isend(pattern(i, side));
    let r = s.irecv(LEN);
    let got = s
        .wait_recv(r)
        .unwrap_or_else(|e| panic!("conn {i} side {side}: recv {e}"));
    s.wait_send(h)
        .unwrap_or_else(|e| panic!("conn {i} side {side}: send {e}"));
    assert!(
        got == pattern(i, 1 - side),
        "conn {i} side {side}: bytes differ"
    );
    // the peer may already have closed: then our own close has nothing left to do
    let _ = s.close();
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn a_hundred_concurrent_streams_each_move_data_both_ways() {
    a_hundred(4, support::IMM);
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn a_hundred_concurrent_streams_each_move_data_both_ways_over_records() {
    a_hundred(5, support::RECORDS);
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn a_hundred_concurrent_streams_each_move_data_both_ways_over_sends() {
    a_hundred(6, support::SENDS);
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn a_hundred_concurrent_streams_each_move_data_both_ways_over_srq() {
    a_hundred(7, support::SRQ);
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn a_hundred_concurrent_streams_each_move_data_both_ways_over_read() {
    a_hundred(8, support::READ);
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn a_hundred_concurrent_streams_each_move_data_both_ways_over_duplex() {
    a_hundred(9, support::DUPLEX);
}

fn a_hundred(port: u16, v: Variant) {
    let _ = support::device();
    let addr = support::addr(port);
    let listener = Arc::new(Listener::bind_with(addr, cfg(v)).expect("bind"));
    let server = thread::spawn(move || {
        let mut handlers = Vec::new();
        for _ in 0..CONNS {
            let mut s = listener.accept().expect("accept");
            v.check(&s);
            // the client tells which connection this is
            let mut idx = [0u8; 2];
            std::io::Read::read_exact(&mut s, &mut idx).expect("read index");
            let i = usize::from(u16::from_be_bytes(idx));
            handlers.push(thread::spawn(move || exchange(s, i, 1)));
        }
        for h in handlers {
            h.join().expect("server handler");
        }
    });
    let clients: Vec<_> = (0..CONNS)
        .map(|i| {
            thread::spawn(move || {
                let mut s = Stream::connect_with(addr, cfg(v))
                    .unwrap_or_else(|e| panic!("connect {i}: {e}"));
                v.check(&s);
                s.write_all(&(i as u16).to_be_bytes()).expect("send index");
                exchange(s, i, 0);
            })
        })
        .collect();
    for c in clients {
        c.join().expect("client thread");
    }
    server.join().expect("server thread");
}
