//! A forger: what another local user can do against rdmashim's upgrade with nothing but open
//! access to the rdma_cm device (docs/protocol.md 2.8). Run by the RDMA tier's
//! `tests/forgery.rs`, as another user, against shimmed servers on `RDMASHIM_TEST_IP`.
//!
//! ```text
//! forge request IP:PORT ROUNDS INTERVAL_MS   forged ConnectRequests for every live TCP
//!                                            connection to IP:PORT found in /proc/net/tcp*
//!                                            (right ports, a key of the forger's own)
//! forge squat IP:PORT SECONDS                hold the service's rdma_cm port; count requests
//! forge flood IP:PORT COUNT                  raw requests with random or forged private data
//! ```
//! Each prints one summary line `forge: k=v ...` and exits 0 if it could run at all.
#![forbid(unsafe_code)]

use rand::Rng;
use rdmashim_core::cm::{event_type as ev, CmId, ConnParam, EventChannel, QpCaps};
use rdmashim_core::verbs::{Cq, Pd};
use rdmashim_core::{DialError, DialStatus, Dialer, StreamConfig, UpgradeListener};
use rdmashim_proto::{BindingKey, Proof, Reject, RejectReason, TcpTuple};
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

fn usage() -> ! {
    eprintln!("usage: forge request IP:PORT ROUNDS INTERVAL_MS | squat IP:PORT SECONDS | flood IP:PORT COUNT");
    std::process::exit(2)
}

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| a.get(i).cloned().unwrap_or_else(|| usage());
    let dst: SocketAddr = arg(1).parse().unwrap_or_else(|_| usage());
    let n = |i: usize| arg(i).parse::<u64>().unwrap_or_else(|_| usage());
    let out = match arg(0).as_str() {
        "request" => request(dst, n(2), Duration::from_millis(n(3))),
        "squat" => squat(dst, Duration::from_secs(n(2))),
        "flood" => flood(dst, n(2)),
        _ => usage(),
    };
    let line: Vec<String> = out.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!("forge: {}", line.join(" "));
}

/// The local ports of established TCP connections to `dst`, as any user reads them.
fn victims(dst: SocketAddr) -> Vec<(SocketAddr, u16)> {
    let mut v = Vec::new();
    for (file, v6) in [("/proc/net/tcp", false), ("/proc/net/tcp6", true)] {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl local rem st ...; st 01 = ESTABLISHED
            if f.len() < 4 || f[3] != "01" {
                continue;
            }
            let (Some(local), Some(remote)) = (parse(f[1], v6), parse(f[2], v6)) else {
                continue;
            };
            let same_ip = canonical(remote.ip()) == canonical(dst.ip());
            if same_ip && remote.port() == dst.port() {
                v.push((local, local.port()));
            }
        }
    }
    v.sort();
    v.dedup();
    v
}

fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// `0100007F:1F90` (IPv4, host-order words) or the 32-hex-digit IPv6 form.
fn parse(s: &str, v6: bool) -> Option<SocketAddr> {
    let (ip, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let ip = if v6 {
        let mut b = [0u8; 16];
        for (i, w) in b.chunks_mut(4).enumerate() {
            let word = u32::from_str_radix(ip.get(i * 8..i * 8 + 8)?, 16).ok()?;
            w.copy_from_slice(&word.to_le_bytes());
        }
        IpAddr::V6(Ipv6Addr::from(b))
    } else {
        IpAddr::V4(Ipv4Addr::from(
            u32::from_str_radix(ip, 16).ok()?.to_le_bytes(),
        ))
    };
    Some(SocketAddr::new(ip, port))
}

fn bump(m: &mut BTreeMap<String, u64>, k: &str) {
    *m.entry(k.to_string()).or_default() += 1;
}

/// Forged requests: for each live connection to `dst`, a request with its ports and a tag
/// under a key of the forger's own, `rounds` times. The forger gets ready first (the RDMA
/// libraries loaded, the device open: it says `forge: ready`), then waits (up to a minute)
/// for a connection to `dst` to appear and strikes at once, as an attacker watching
/// `/proc/net/tcp` would.
fn request(dst: SocketAddr, rounds: u64, every: Duration) -> BTreeMap<String, u64> {
    let cfg = StreamConfig::default();
    let mut out = BTreeMap::new();
    let mut rng = rand::thread_rng();
    match UpgradeListener::bind(SocketAddr::new(dst.ip(), 0)) {
        Ok(warm) => drop(warm),
        Err(e) => {
            eprintln!("forge: no rdma_cm here: {e}");
            std::process::exit(1);
        }
    }
    println!("forge: ready");
    let end = Instant::now() + Duration::from_secs(60);
    while victims(dst).is_empty() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(2));
    }
    for round in 0..rounds {
        if round > 0 {
            std::thread::sleep(every);
        }
        for (local, port) in victims(dst) {
            bump(&mut out, "sent");
            let proof = Proof::Bound {
                key: BindingKey::from_random(rng.gen()),
                tuple: TcpTuple {
                    client: local,
                    server: dst,
                },
            };
            let src = Some(SocketAddr::new(local.ip(), 0));
            let mut d = match Dialer::start(src, dst, port, proof, &cfg) {
                Ok(d) => d,
                Err(_) => {
                    bump(&mut out, "local_error");
                    continue;
                }
            };
            let outcome = loop {
                match d.poll(0) {
                    DialStatus::Pending => std::thread::sleep(Duration::from_millis(2)),
                    DialStatus::Connected(_) => break "connected".to_string(),
                    DialStatus::Failed(DialError::Rejected(Some(RejectReason::Unproven))) => {
                        break "rejected_unproven".into()
                    }
                    DialStatus::Failed(DialError::Rejected(r)) => {
                        break format!("rejected_{}", reason_name(r))
                    }
                    DialStatus::Failed(DialError::Timeout) => break "timeout".into(),
                    DialStatus::Failed(_) => break "failed".into(),
                }
            };
            bump(&mut out, &outcome);
        }
    }
    out.entry("connected".into()).or_default();
    out
}

fn reason_name(r: Option<RejectReason>) -> String {
    match r {
        None => "none".into(),
        Some(r) => format!("{r:?}").to_lowercase(),
    }
}

/// Holds the rdma_cm port of `addr` for `secs`: every request that comes is counted and
/// rejected.
fn squat(addr: SocketAddr, secs: Duration) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let l = match UpgradeListener::bind(addr) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("forge: cannot squat {addr}: {e}");
            std::process::exit(1);
        }
    };
    // (the test waits for this line before it starts the service)
    println!("forge: squatting {addr}");
    let end = Instant::now() + secs;
    out.insert("requests".into(), 0);
    while Instant::now() < end {
        while let Ok(Some(inc)) = l.next() {
            bump(&mut out, "requests");
            inc.reject(RejectReason::NoMatchingTcp);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    out
}

/// `count` raw rdma_cm requests to `dst`: random bytes of random length, truncated and
/// bit-flipped well-formed requests, and well-formed ones with a forged tag for random ports.
/// All are sent first, then every answer is collected (a well-formed one waits out the
/// server's request wait).
fn flood(dst: SocketAddr, count: u64) -> BTreeMap<String, u64> {
    // At most this many requests are open at once (each holds an event channel, a queue
    // pair and its memory until answered: ten thousand at once would exhaust a small host
    // before the server): the oldest's answer is awaited before the next goes out.
    const WINDOW: usize = 64;
    let mut out = BTreeMap::new();
    let mut rng = rand::thread_rng();
    let mut open = std::collections::VecDeque::new();
    let mut sent = 0u64;
    let answer = |out: &mut BTreeMap<String, u64>, r: Raw| {
        let name = match r.ch.next_event(Duration::from_secs(15)) {
            Ok(e) if e.kind == ev::RDMA_CM_EVENT_REJECTED => {
                let r = Reject::decode(&e.private_data).ok().map(|r| r.reason);
                format!("rejected_{}", reason_name(r))
            }
            Ok(e) if e.kind == ev::RDMA_CM_EVENT_ESTABLISHED => "accepted".into(),
            Ok(e) => format!("event_{}", e.name()),
            Err(_) => "no_answer".into(),
        };
        bump(out, &name);
    };
    for i in 0..count {
        if open.len() >= WINDOW {
            answer(&mut out, open.pop_front().expect("a full window"));
        }
        match raw_request(dst, &forged_bytes(&mut rng, i)) {
            Ok(r) => {
                open.push_back(r);
                sent += 1;
            }
            Err(e) => bump(&mut out, &e),
        }
    }
    while let Some(r) = open.pop_front() {
        answer(&mut out, r);
    }
    out.insert("sent".into(), sent);
    out.entry("accepted".into()).or_default();
    out
}

/// A raw rdma_cm connect under way (its resources live until it is answered).
struct Raw {
    ch: std::sync::Arc<EventChannel>,
    _id: CmId,
    _pd: std::sync::Arc<Pd>,
    _cq: std::sync::Arc<Cq>,
}

fn forged_bytes(rng: &mut impl Rng, i: u64) -> Vec<u8> {
    let proof = Proof::Bound {
        key: BindingKey::from_random(rng.gen()),
        tuple: TcpTuple {
            client: SocketAddr::new(Ipv4Addr::new(10, 99, 0, 1).into(), rng.gen()),
            server: SocketAddr::new(Ipv4Addr::new(10, 99, 0, 1).into(), rng.gen()),
        },
    };
    let ring = rdmashim_proto::LocalParams {
        ring: rdmashim_proto::RingDesc {
            addr: rng.gen(),
            rkey: rng.gen(),
            size: rdmashim_proto::RingSize::from_log2(16).expect("64 KiB"),
        },
        recv_slots: 8,
    };
    let (_, req) = rdmashim_proto::Connection::connect(
        rdmashim_proto::Config::default(),
        ring,
        &proof,
        rng.gen(),
        rng.gen(),
        rng.gen(),
        0,
        Instant::now(),
    )
    .expect("a request");
    let mut b = req.encode().to_vec();
    match i % 4 {
        0 => b,
        1 => {
            b.truncate(rng.gen_range(0..b.len()));
            b
        }
        2 => {
            let j = rng.gen_range(0..b.len());
            b[j] ^= 1 << rng.gen_range(0..8);
            b
        }
        _ => {
            let mut r = vec![0u8; rng.gen_range(0..=56)];
            rng.fill_bytes(&mut r);
            r
        }
    }
}

/// Sends one raw request with `private_data` (with a QP of its own, as a real client).
fn raw_request(dst: SocketAddr, private_data: &[u8]) -> Result<Raw, String> {
    fn err<E>(what: &'static str) -> impl Fn(E) -> String {
        move |_| format!("local_{what}")
    }
    let t = Duration::from_secs(10);
    let ch = EventChannel::new().map_err(err("channel"))?;
    let mut id = CmId::new(&ch).map_err(err("id"))?;
    id.resolve_blocking(&ch, dst, Duration::from_secs(5), t)
        .map_err(err("resolve"))?;
    let ctx = id.context().map_err(err("context"))?;
    let pd = Pd::new(&ctx).map_err(err("pd"))?;
    let cq = Cq::new(&ctx, 16, None).map_err(err("cq"))?;
    id.create_qp(&pd, &cq, &cq, QpCaps::default())
        .map_err(err("qp"))?;
    id.connect(&ConnParam {
        private_data,
        ..Default::default()
    })
    .map_err(err("connect"))?;
    Ok(Raw {
        ch,
        _id: id,
        _pd: pd,
        _cq: cq,
    })
}
