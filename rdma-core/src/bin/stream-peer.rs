//! A ring-stream peer for the RDMA tier's process-death tests (tests/peer_death.rs): connects
//! to ADDR and plays ROLE until it is killed.
//!
//!   stream-peer writer ADDR [records]    streams bytes (0x5a) forever
//!   stream-peer sleeper ADDR [records]   connects and never reads
//!
//! With `records` it offers records (protocol §14).

use std::net::SocketAddr;
use std::time::Duration;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(role), Some(addr)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: stream-peer writer|sleeper ADDR [records]");
        std::process::exit(2);
    };
    let addr: SocketAddr = addr.parse().expect("ADDR is ip:port");
    let mut cfg = rdmashim_core::StreamConfig::default();
    cfg.protocol.records = args.get(3).is_some_and(|a| a == "records");
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
