//! RDMA tier: a ring stream carries 256 MiB each way at once, written and read in random
//! sizes from 1 B to 1 MiB, and every byte arrives in order (SHA-256 of what each side sent
//! equals SHA-256 of what the other received).
//!
//! `RDMASHIM_STREAM_MIB` overrides the size per direction (for quick runs).

mod support;

use std::collections::VecDeque;
use std::thread;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rdmashim_core::{Listener, SendHandle, Stream};
use sha2::{Digest, Sha256};

const MAX_IO: usize = 1 << 20;
/// Bytes queued with isend and not yet taken by the ring, at most.
const WINDOW: usize = 4 << 20;

fn total() -> usize {
    std::env::var("RDMASHIM_STREAM_MIB")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(256)
        << 20
}

/// A size from 1 B to 1 MiB, log-uniform (so small and large I/O are both frequent).
fn io_size(rng: &mut StdRng) -> usize {
    let bits = rng.gen_range(0..=20u32);
    rng.gen_range(1..=(1usize << bits)).min(MAX_IO)
}

/// Fast deterministic bytes (xorshift64*), so generating 256 MiB costs little next to hashing.
struct Bytes(u64);

impl Bytes {
    fn fill(&mut self, out: &mut [u8]) {
        for chunk in out.chunks_mut(8) {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            let v = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// Sends `total` pattern bytes (seeded by `seed`) and receives `total` bytes at once; returns
/// (SHA-256 sent, SHA-256 received).
fn run_side(mut s: Stream, seed: u64, total: usize) -> ([u8; 32], [u8; 32]) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    let mut gen = Bytes(seed | 1);
    let mut sent_hash = Sha256::new();
    let mut recv_hash = Sha256::new();
    let (mut sent, mut received) = (0usize, 0usize);
    let mut queued: VecDeque<(SendHandle, usize)> = VecDeque::new();
    let mut in_flight = 0usize;
    let mut buf = vec![0u8; MAX_IO];
    while received < total || sent < total || !queued.is_empty() {
        // keep the send window full
        while sent < total && in_flight < WINDOW {
            let n = io_size(&mut rng).min(total - sent);
            let mut chunk = vec![0u8; n];
            gen.fill(&mut chunk);
            sent_hash.update(&chunk);
            queued.push_back((s.isend(chunk), n));
            in_flight += n;
            sent += n;
        }
        // retire completed sends
        while let Some((h, _)) = queued.front() {
            if !s.test(h) {
                break;
            }
            let (h, n) = queued.pop_front().unwrap();
            s.wait_send(h).expect("isend failed");
            in_flight -= n;
        }
        if received < total {
            let want = io_size(&mut rng);
            let n = s.recv(&mut buf[..want]).expect("recv failed");
            assert!(n > 0, "EOF after {received} of {total} bytes");
            recv_hash.update(&buf[..n]);
            received += n;
        } else if let Some((h, n)) = queued.pop_front() {
            s.wait_send(h).expect("isend failed");
            in_flight -= n;
        }
    }
    s.shutdown(std::net::Shutdown::Write).expect("shutdown");
    assert_eq!(s.recv(&mut buf).expect("read EOF"), 0, "bytes past the end");
    s.close().expect("close");
    (sent_hash.finalize().into(), recv_hash.finalize().into())
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn random_sized_io_both_ways_arrives_intact() {
    let _ = support::device();
    let addr = support::addr(3);
    let total = total();
    let listener = Listener::bind(addr).expect("Listener::bind");
    let t0 = std::time::Instant::now();
    let server = thread::spawn(move || {
        let s = listener.accept().expect("accept");
        run_side(s, 2, total)
    });
    let c = Stream::connect(addr).expect("Stream::connect");
    let (c_sent, c_recv) = run_side(c, 1, total);
    let (s_sent, s_recv) = server.join().expect("server thread");
    let secs = t0.elapsed().as_secs_f64();
    eprintln!(
        "{} MiB each way in {secs:.1} s ({:.1} MB/s per direction)",
        total >> 20,
        total as f64 / secs / 1e6
    );
    assert_eq!(c_sent, s_recv, "client → server bytes differ");
    assert_eq!(s_sent, c_recv, "server → client bytes differ");
}
