//! What one connection over RDMA costs its process, part by part: both ends of N connections
//! in this process (native streams with the shim's sizes: 16 KiB rings, 64 receives, a send
//! queue of 128), then, per connection, the memory mappings by kind (the rings' views, the
//! device's queues as its provider maps them), their resident and pinned bytes, and the
//! descriptors. It measures what shared receive queues or completion queues, or connections
//! multiplexed on one queue pair, could save (docs/bench/scale.md, "Shared resources").
//!
//!     cargo build --release -p rdmashim-core --example conn_cost
//!     scripts/rdma-vm 'target/release/examples/conn_cost 200'
//!
//! Optional second and third arguments: the receives per connection and the send queue's
//! depth (defaults 64 and 128), to see what each part of the queues costs.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::thread;

use rdmashim_core::{Listener, Stream, StreamConfig};

/// One kind of mapping: how many, their size, resident and pinned kB.
#[derive(Default, Debug)]
struct Kind {
    count: usize,
    size_kb: u64,
    rss_kb: u64,
}

fn status(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The process's mappings grouped by what they map (`/proc/self/smaps`).
fn mappings() -> BTreeMap<String, Kind> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut out: BTreeMap<String, Kind> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in smaps.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.first()
            .is_some_and(|a| a.contains('-') && !a.ends_with(':'))
            && f.len() >= 5
        {
            let name = f[5..].join(" ");
            let kind = if name.contains("rdmashim-ring") {
                "ring views (memfd)".to_string()
            } else if name.contains("uverbs") {
                format!(
                    "device queues ({})",
                    name.trim_start_matches("/dev/infiniband/")
                )
            } else if name.is_empty() {
                "anonymous".to_string()
            } else {
                "other".to_string()
            };
            out.entry(kind.clone()).or_default().count += 1;
            current = Some(kind);
        } else if let (Some(k), Some(&key)) = (&current, f.first()) {
            let v: u64 = f.get(1).and_then(|v| v.parse().ok()).unwrap_or(0);
            let e = out.get_mut(k).unwrap();
            match key {
                "Size:" => e.size_kb += v,
                "Rss:" => e.rss_kb += v,
                _ => {}
            }
        }
    }
    out
}

fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args.get(1).and_then(|v| v.parse().ok()).unwrap_or(100);
    let recv_slots: u16 = args.get(2).and_then(|v| v.parse().ok()).unwrap_or(64);
    let sq_depth: u32 = args.get(3).and_then(|v| v.parse().ok()).unwrap_or(128);
    let ip: IpAddr = std::env::var("RDMASHIM_TEST_IP")
        .expect("RDMASHIM_TEST_IP: run it in the VM (scripts/rdma-vm)")
        .parse()
        .unwrap();
    let addr = SocketAddr::new(ip, 24000 + (std::process::id() % 1000) as u16);
    let cfg = StreamConfig {
        ring_size: 16 << 10,
        recv_slots,
        sq_depth,
        connect_timeout: std::time::Duration::from_secs(120),
        ..StreamConfig::default()
    };
    let before = (mappings(), status("VmRSS:"), status("VmPin:"), fds());
    let listener = Listener::bind_with(addr, cfg).expect("bind");
    let server = thread::spawn(move || {
        (0..n)
            .map(|_| listener.accept().expect("accept"))
            .collect::<Vec<_>>()
    });
    let mut clients: Vec<Stream> = (0..n)
        .map(|_| Stream::connect_with(addr, cfg).expect("connect"))
        .collect();
    let mut servers = server.join().unwrap();
    // one byte each way on each, so that every ring and queue has been touched once
    for (c, s) in clients.iter_mut().zip(servers.iter_mut()) {
        c.write_all(b"c").unwrap();
        s.write_all(b"s").unwrap();
        let mut b = [0u8; 1];
        assert_eq!(s.recv(&mut b).unwrap(), 1);
        assert_eq!(c.recv(&mut b).unwrap(), 1);
    }
    let after = (mappings(), status("VmRSS:"), status("VmPin:"), fds());
    let ends = (2 * n) as f64;
    println!(
        "{n} connections, both ends here ({} ends); per end: receives {recv_slots}, send queue \
         {sq_depth}, rings 16 KiB",
        2 * n
    );
    println!("| part | mappings per end | mapped KiB per end | resident KiB per end |");
    println!("|---|---|---|---|");
    for (kind, a) in &after.0 {
        let b = before.0.get(kind);
        let d = |f: fn(&Kind) -> u64| (f(a) - b.map_or(0, f)) as f64 / ends;
        let count = (a.count - b.map_or(0, |b| b.count)) as f64 / ends;
        if count == 0.0 && d(|k| k.rss_kb) < 0.5 {
            continue;
        }
        println!(
            "| {kind} | {count:.1} | {:.1} | {:.1} |",
            d(|k| k.size_kb),
            d(|k| k.rss_kb)
        );
    }
    println!(
        "| whole process | {:.1} | | {:.1} (VmRSS) |",
        after.0.values().map(|k| k.count).sum::<usize>() as f64 / ends
            - before.0.values().map(|k| k.count).sum::<usize>() as f64 / ends,
        (after.1 - before.1) as f64 / ends
    );
    println!(
        "pinned (VmPin) per end: {:.1} KiB; descriptors per end: {:.1}",
        (after.2 - before.2) as f64 / ends,
        (after.3 - before.3) as f64 / ends
    );
    drop(clients);
    drop(servers);
}
