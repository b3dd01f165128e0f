//! A ring-stream peer for the RDMA tier's process-death tests (tests/peer_death.rs): connects
//! to ADDR and plays ROLE until it is killed.
//!
//!   stream-peer writer ADDR [KIND]    streams bytes (0x5a) forever
//!   stream-peer sleeper ADDR [KIND]   connects and never reads
//!
//! KIND is the connection kind it asks for: `imm` (the default), `records` (protocol §14) or
//! `sends` (§15).

use std::net::SocketAddr;
use std::time::Duration;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(role), Some(addr)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: stream-peer writer|sleeper ADDR [imm|records|sends]");
        std::process::exit(2);
    };
    let addr: SocketAddr = addr.parse().expect("ADDR is ip:port");
    let mut cfg = rdmashim_core::StreamConfig::default();
    if let Some(k) = args.get(3) {
        cfg.protocol.kind = rdmashim_proto::Kind::from_name(k).unwrap_or_else(|| {
            eprintln!("unknown connection kind {k}");
            std::process::exit(2);
        });
    }
    let mut s = rdmashim_core::Stream::connect_with(addr, cfg).expect("connect");
    match role.as_str() {
        "writer" => {
            let chunk = vec![0x5a; 64 * 1024];
            loop {
                s.write_all(&chunk).expect("write");
            }
        }
        "sleeper" => loop {
            std::thread::sleep(Duration::from_secs(1));
        },
        other => {
            eprintln!("unknown role {other}");
            std::process::exit(2);
        }
    }
}
