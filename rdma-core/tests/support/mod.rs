//! What the RDMA tier's tests share: the device and address they must use.
//!
//! RDMA tests are `#[ignore]`d, so a plain `cargo test` (the host tier) does not run them;
//! `scripts/test` runs them inside the soft-RoCE VM with `--ignored`, where
//! `RDMASHIM_TEST_DEVICE` and `RDMASHIM_TEST_IP` are set. A test selected without them fails
//! with the reason: it never passes by skipping.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rdmashim_core::{SendHandle, Stream};
use sha2::{Digest, Sha256};

/// The RDMA device the tier runs on (`RDMASHIM_TEST_DEVICE`, e.g. `rxe0`).
pub fn device() -> String {
    match std::env::var("RDMASHIM_TEST_DEVICE") {
        Ok(d) if !d.is_empty() => {
            assert!(
                std::path::Path::new("/sys/class/infiniband")
                    .join(&d)
                    .exists(),
                "RDMASHIM_TEST_DEVICE={d} but /sys/class/infiniband/{d} does not exist"
            );
            d
        }
        _ => panic!(
            "RDMA test selected without RDMASHIM_TEST_DEVICE: run it in the VM tier \
             (scripts/rdma-vm, or scripts/test)"
        ),
    }
}

/// The IP address of the RDMA device's netdev (`RDMASHIM_TEST_IP`).
pub fn ip() -> IpAddr {
    let s = std::env::var("RDMASHIM_TEST_IP")
        .expect("RDMASHIM_TEST_IP not set: run RDMA tests in the VM tier (scripts/rdma-vm)");
    s.parse().expect("RDMASHIM_TEST_IP is not an IP address")
}

/// A port for an rdma_cm listener, distinct per test (and per process).
pub fn port(n: u16) -> u16 {
    20000 + (std::process::id() % 1000) as u16 * 16 + n
}

/// A connection kind as the stream tests run it (they run over every one): the kind both
/// sides ask for (protocol §3, §14–§17), and whether the side under test posts its receives
/// to a shared receive queue (`StreamConfig::srq`, the SRQ kind: a local choice).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    pub kind: rdmashim_proto::Kind,
    pub srq: bool,
}

/// The ring written by WRITE WITH IMMEDIATE (the default).
pub const IMM: Variant = Variant {
    kind: rdmashim_proto::Kind::WriteImm,
    srq: false,
};
/// Records (protocol §14).
pub const RECORDS: Variant = Variant {
    kind: rdmashim_proto::Kind::Records,
    srq: false,
};
/// Sends into posted receives (protocol §15).
pub const SENDS: Variant = Variant {
    kind: rdmashim_proto::Kind::Sends,
    srq: false,
};
/// READ pull (protocol §16): the receiver reads each DATA from the sender's staging area.
pub const READ: Variant = Variant {
    kind: rdmashim_proto::Kind::Read,
    srq: false,
};
/// Duplex (protocol §17): WRITE WITH IMMEDIATE, credits riding on the other direction's DATA.
pub const DUPLEX: Variant = Variant {
    kind: rdmashim_proto::Kind::Duplex,
    srq: false,
};
/// Sends into receives posted to a shared receive queue.
pub const SRQ: Variant = Variant {
    kind: rdmashim_proto::Kind::Sends,
    srq: true,
};

impl Variant {
    /// Its name in test output.
    pub fn name(self) -> String {
        format!("{}{}", self.kind.name(), if self.srq { "+srq" } else { "" })
    }

    /// The default configuration, asking for this kind.
    pub fn config(self) -> rdmashim_core::StreamConfig {
        let mut cfg = rdmashim_core::StreamConfig::default();
        cfg.protocol.kind = self.kind;
        cfg.srq = self.srq;
        cfg
    }

    /// A stream of a configuration of this variant carries its kind, and with `srq` the
    /// process has a shared receive queue.
    pub fn check(self, s: &Stream) {
        assert_eq!(s.kind(), self.kind, "the kind negotiated as asked for");
        assert_eq!(s.config().srq, self.srq);
        if self.srq {
            assert!(
                rdmashim_core::verbs::shared_receive_queues() > 0,
                "no shared receive queue"
            );
        }
    }
}

/// `ip():port`.
pub fn addr(n: u16) -> SocketAddr {
    SocketAddr::new(ip(), port(n))
}

/// A raw rdma_cm client just before `rdma_connect`: address and route resolved to `addr`, an RC
/// QP created on a fresh PD with one CQ (no completion channel).
pub struct RawClient {
    /// The id's event channel.
    pub ch: std::sync::Arc<rdmashim_core::cm::EventChannel>,
    /// The id, with its QP.
    pub id: rdmashim_core::cm::CmId,
    /// The QP's protection domain.
    pub pd: std::sync::Arc<rdmashim_core::verbs::Pd>,
    /// The QP's send and receive CQ.
    pub cq: std::sync::Arc<rdmashim_core::verbs::Cq>,
}

/// See [`RawClient`].
pub fn raw_client(addr: SocketAddr) -> RawClient {
    use rdmashim_core::cm::{CmId, EventChannel, QpCaps};
    use rdmashim_core::verbs::{Cq, Pd};
    use std::time::Duration;
    const T: Duration = Duration::from_secs(20);
    let ch = EventChannel::new().expect("rdma_create_event_channel");
    let mut id = CmId::new(&ch).expect("rdma_create_id");
    id.resolve_blocking(&ch, addr, Duration::from_secs(5), T)
        .expect("address and route resolved");
    let ctx = id.context().expect("the id's device");
    let pd = Pd::new(&ctx).expect("ibv_alloc_pd");
    let cq = Cq::new(&ctx, 64, None).expect("ibv_create_cq");
    id.create_qp(&pd, &cq, &cq, QpCaps::default())
        .expect("rdma_create_qp");
    RawClient { ch, id, pd, cq }
}

// ----- a stream carrying random-sized I/O both ways ------------------------------------------

const MAX_IO: usize = 1 << 20;
/// Bytes queued with isend and not yet taken by the ring, at most.
const WINDOW: usize = 4 << 20;

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

/// Sends `total` pattern bytes (seeded by `seed`) and receives `total` bytes at once, written
/// and read in random sizes from 1 B to 1 MiB (at most 4 MiB queued with isend); returns
/// (SHA-256 sent, SHA-256 received).
pub fn exchange(s: &mut Stream, seed: u64, total: usize) -> ([u8; 32], [u8; 32]) {
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
            // (never past `total`: what the peer sends after its transfer is not the transfer's)
            let want = io_size(&mut rng).min(total - received);
            let n = s.recv(&mut buf[..want]).expect("recv failed");
            assert!(n > 0, "EOF after {received} of {total} bytes");
            recv_hash.update(&buf[..n]);
            received += n;
        } else if let Some((h, n)) = queued.pop_front() {
            s.wait_send(h).expect("isend failed");
            in_flight -= n;
        }
    }
    (sent_hash.finalize().into(), recv_hash.finalize().into())
}
