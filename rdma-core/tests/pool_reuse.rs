//! RDMA tier: connections made one after another reuse the registered rings and buffers of
//! the ones that ended (rdmashim_core::pool), and every byte of every connection is still
//! right: a reused ring never shows a previous connection's bytes.

mod support;

use std::thread;
use std::time::{Duration, Instant};

use rdmashim_core::{pool, Listener, Stream, StreamConfig};

const ROUNDS: usize = 6;
const LEN: usize = 300 * 1024;

fn cfg() -> StreamConfig {
    StreamConfig {
        ring_size: 128 * 1024, // smaller than LEN: the ring wraps within each connection
        connect_timeout: Duration::from_secs(30),
        ..StreamConfig::default()
    }
}

/// The bytes round `r` sends from `side` (0 client, 1 server): different in every round, so
/// a stale byte from an earlier round would be seen.
fn pattern(r: usize, side: usize) -> Vec<u8> {
    (0..LEN)
        .map(|k| (k.wrapping_mul(31) ^ r.wrapping_mul(97) ^ side.wrapping_mul(53) ^ (k >> 9)) as u8)
        .collect()
}

fn exchange(mut s: Stream, r: usize, side: usize) {
    let h = s.isend(pattern(r, side));
    let rh = s.irecv(LEN);
    let got = s
        .wait_recv(rh)
        .unwrap_or_else(|e| panic!("round {r} side {side}: recv {e}"));
    s.wait_send(h)
        .unwrap_or_else(|e| panic!("round {r} side {side}: send {e}"));
    assert!(
        got == pattern(r, 1 - side),
        "round {r} side {side}: bytes differ"
    );
    let _ = s.close();
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn sequential_connections_reuse_registrations_and_stay_intact() {
    let _ = support::device();
    let addr = support::addr(12);
    let listener = Listener::bind_with(addr, cfg()).expect("bind");
    let server = thread::spawn(move || {
        for r in 0..ROUNDS {
            let s = listener.accept().expect("accept");
            exchange(s, r, 1);
        }
    });
    let mut pooled_between = Vec::new();
    for r in 0..ROUNDS {
        let t0 = Instant::now();
        let s = Stream::connect_with(addr, cfg()).unwrap_or_else(|e| panic!("connect {r}: {e}"));
        let set_up = t0.elapsed();
        exchange(s, r, 0);
        // let the server's side of the round end too
        let deadline = Instant::now() + Duration::from_secs(10);
        while pool::pooled().0 < 8 && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
        let p = pool::pooled();
        eprintln!(
            "round {r}: connect {set_up:?}, pool {} items {} bytes",
            p.0, p.1
        );
        pooled_between.push(p);
    }
    server.join().expect("server");
    // After a round both ends' rx ring, staging ring and two buffers are back: 8 items. The
    // next round takes them and gives them back, so the pool does not grow with the rounds.
    for (r, p) in pooled_between.iter().enumerate() {
        assert_eq!(p.0, 8, "round {r}: items pooled {pooled_between:?}");
    }
    assert!(
        pooled_between.windows(2).all(|w| w[0].1 == w[1].1),
        "the pool grew: {pooled_between:?}"
    );
}
