//! RDMA tier: ring moves (protocol §6.4) over a real queue pair. Streams start with 16 KiB
//! rings and may grow them to 1 MiB: each side's writes soon wait for the peer ring's space,
//! it asks for the larger ring, the peer registers and offers it, and the writes move there
//! mid-stream. 64 MiB each way at once, in random sizes from 1 B to 1 MiB
//! (`support::exchange`, as `stream_integrity`'s), must arrive intact (SHA-256 of what
//! each side sent equals that of what the other received), both directions must have moved,
//! and the same transfer is timed with rings that stay at 16 KiB (printed; not asserted: the
//! VM's timing is emulated).
//!
//! `RDMASHIM_STREAM_MIB` overrides the size per direction.

mod support;

use std::thread;
use std::time::Instant;

use rdmashim_core::{Listener, Stream, StreamConfig};
use rdmashim_proto::RingSize;

fn total() -> usize {
    std::env::var("RDMASHIM_STREAM_MIB")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(64)
        << 20
}

fn cfg(grow: bool) -> StreamConfig {
    let mut c = StreamConfig {
        ring_size: 16 << 10,
        ..StreamConfig::default()
    };
    c.protocol.ring_moves = grow;
    c.protocol.ring_max = grow.then(|| RingSize::new(1 << 20).unwrap());
    c
}

fn transfer(grow: bool, total: usize) -> (f64, u64, u64) {
    let addr = support::addr(if grow { 11 } else { 12 });
    let listener = Listener::bind_with(addr, cfg(grow)).expect("bind");
    let t0 = Instant::now();
    let server = thread::spawn(move || {
        let mut s = listener.accept().expect("accept");
        let (sent, recv) = support::exchange(&mut s, 2, total);
        let st = s.stats();
        s.close().expect("close");
        (sent, recv, st)
    });
    let mut c = Stream::connect_with(addr, cfg(grow)).expect("connect");
    let (c_sent, c_recv) = support::exchange(&mut c, 1, total);
    let cst = c.stats();
    c.close().expect("close");
    let (s_sent, s_recv, sst) = server.join().expect("server");
    let secs = t0.elapsed().as_secs_f64();
    assert_eq!(c_sent, s_recv, "client → server bytes differ (grow {grow})");
    assert_eq!(s_sent, c_recv, "server → client bytes differ (grow {grow})");
    assert_eq!(cst.moves_out, sst.moves_in, "each move seen by both ends");
    assert_eq!(sst.moves_out, cst.moves_in, "each move seen by both ends");
    (secs, cst.moves_out, sst.moves_out)
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn rings_grow_under_load_and_every_byte_arrives() {
    let _ = support::device();
    let total = total();
    let (fixed, ..) = transfer(false, total);
    let (grown, c_moves, s_moves) = transfer(true, total);
    eprintln!(
        "{} MiB each way: 16 KiB rings {fixed:.2} s, grown to 1 MiB {grown:.2} s ({:.2}x); \
         moves: client {c_moves}, server {s_moves}",
        total >> 20,
        fixed / grown
    );
    assert!(c_moves >= 1 && s_moves >= 1, "both directions moved");
}
