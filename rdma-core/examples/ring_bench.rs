//! Ring-stream micro-benchmark, the counterpart of perftest's `ib_write_lat`/`ib_write_bw`
//! (used by `scripts/bench-transport`; run it in the VM tier).
//!
//! ```text
//! ring_bench lat ADDR [ITERS] [SIZE]   ping-pong of SIZE (64) bytes; prints the median one-way
//!                                      latency (round trip / 2, as ib_write_lat's t_typical)
//! ring_bench bw ADDR [MIB] [SIZE]      streams MIB (256) MiB in SIZE (65536)-byte sends; prints
//!                                      MiB/s (2^20 bytes, as perftest's MB/sec)
//! ```
//!
//! Server and client are two threads of one process (perftest runs two processes on the same
//! device: the data path is the same). Both busy-poll (`spin` = 10 s), as perftest does;
//! `RING_BENCH_SPIN_US` overrides that. `RING_BENCH_RING` (bytes), `RING_BENCH_SQ` (the send
//! queue's depth) and `RING_BENCH_MAX_WRITE` set the stream's; `RING_BENCH_KIND` the connection
//! kind (`imm`, `records`, `sends`, `read`, `duplex`; `RING_BENCH_RECORDS=1` is `records`; unset,
//! the transport's default, duplex), `RING_BENCH_SRQ=1`
//! receives in a shared receive queue, `RING_BENCH_INLINE` the inline size.
//!
//! Built with `--features timeline`, `lat` also prints where its round trips went (the wire
//! each way, each side's software; see `rdma-core/src/timeline.rs`).

use std::io::Read;
use std::net::SocketAddr;
use std::thread;
use std::time::{Duration, Instant};

use rdmashim_core::sys::cycles;
#[cfg(feature = "timeline")]
use rdmashim_core::timeline;
use rdmashim_core::{Listener, Stream, StreamConfig};
use rdmashim_proto::Kind;

fn cfg() -> StreamConfig {
    let spin = std::env::var("RING_BENCH_SPIN_US")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_secs(10), Duration::from_micros);
    let mut c = StreamConfig {
        spin,
        ..StreamConfig::default()
    };
    if let Some(r) = std::env::var("RING_BENCH_RING")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        c.ring_size = r;
    }
    if let Some(q) = std::env::var("RING_BENCH_SQ")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        c.sq_depth = q;
    }
    if let Some(m) = std::env::var("RING_BENCH_MAX_WRITE")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        c.protocol.max_write = m;
    }
    if let Some(i) = std::env::var("RING_BENCH_INLINE")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        c.max_inline = i;
    }
    // (the connection kind: RING_BENCH_KIND imm, records (protocol §14), sends (§15), read
    // (§16) or duplex (§17); RING_BENCH_RECORDS=1 is records; unset, the transport's default)
    c.protocol.kind = match std::env::var("RING_BENCH_KIND") {
        Ok(k) => Kind::from_name(&k).unwrap_or_else(|| panic!("unknown kind {k}")),
        Err(_) if std::env::var("RING_BENCH_RECORDS").is_ok_and(|v| v == "1") => Kind::Records,
        Err(_) => c.protocol.kind,
    };
    // (RING_BENCH_SRQ=1: both ends post their receives to a shared receive queue)
    c.srq = std::env::var("RING_BENCH_SRQ").is_ok_and(|v| v == "1");
    c
}

fn pair(addr: SocketAddr) -> (Stream, Stream) {
    let l = Listener::bind_with(addr, cfg()).expect("bind");
    let t = thread::spawn(move || l.accept().expect("accept"));
    let c = Stream::connect_with(addr, cfg()).expect("connect");
    let s = t.join().unwrap();
    assert_eq!(
        c.kind(),
        cfg().protocol.kind,
        "the connection kind asked for was not negotiated"
    );
    (c, s)
}

fn lat(addr: SocketAddr, iters: usize, size: usize) {
    let (mut c, mut s) = pair(addr);
    let warm = iters / 10 + 10;
    #[cfg(feature = "timeline")]
    timeline::set_side(timeline::Side::Client);
    let server = thread::spawn(move || {
        #[cfg(feature = "timeline")]
        timeline::set_side(timeline::Side::Server);
        let mut buf = vec![0u8; size];
        for _ in 0..iters + warm {
            s.read_exact(&mut buf).unwrap();
            #[cfg(feature = "timeline")]
            timeline::mark(timeline::Mark::ReadReturned);
            s.write_all(&buf).unwrap();
        }
        s
    });
    let mut buf = vec![0u8; size];
    let mut rtts = Vec::with_capacity(iters);
    // Round trips in time-stamp counter ticks where there is one (as perftest times
    // ib_write_lat; under the VM's HPET clocksource a clock read is a system call, two per
    // round trip), else in nanoseconds of the monotonic clock; the stamps' rate is taken from
    // the monotonic clock over the counted run.
    let origin = Instant::now();
    let stamp = || cycles().unwrap_or_else(|| origin.elapsed().as_nanos() as u64);
    let mut start = (origin, 0);
    for i in 0..iters + warm {
        if i == warm {
            start = (Instant::now(), stamp());
        }
        let k = stamp();
        c.write_all(&buf).unwrap();
        c.read_exact(&mut buf).unwrap();
        #[cfg(feature = "timeline")]
        timeline::mark(timeline::Mark::ReadReturned);
        if i >= warm {
            rtts.push(stamp().wrapping_sub(k) as f64);
        }
    }
    let per_sec = stamp().wrapping_sub(start.1) as f64 / start.0.elapsed().as_secs_f64();
    let s = server.join().unwrap();
    #[cfg(feature = "timeline")]
    match timeline::report(per_sec / 1e6) {
        Some(t) => eprint!("{t}"),
        None => eprintln!("timeline: the two ends' stamp counts differ; no report"),
    }
    rtts.sort_by(f64::total_cmp);
    let med = rtts[rtts.len() / 2] / per_sec * 1e6 / 2.0;
    let p99 = rtts[rtts.len() * 99 / 100] / per_sec * 1e6 / 2.0;
    eprintln!(
        "ring lat: {iters} round trips of {size} B, one-way median {med:.2} us, p99 {p99:.2} us"
    );
    eprintln!("ring lat: client {:?}", c.stats());
    println!("lat_us={med:.3}");
    println!("p99_us={p99:.3}");
    drop((c, s));
}

fn bw(addr: SocketAddr, mib: usize, size: usize) {
    let (mut c, mut s) = pair(addr);
    let total = mib << 20;
    let server = thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0;
        let mut t0 = None;
        while got < total {
            let n = s.recv(&mut buf).unwrap();
            assert!(n > 0, "early EOF");
            t0.get_or_insert_with(Instant::now);
            got += n;
        }
        // one byte back: the client's clock stops when everything arrived
        s.write_all(&[1]).unwrap();
        (s, t0.unwrap().elapsed())
    });
    let msg = vec![0xabu8; size];
    let t = Instant::now();
    let mut sent = 0;
    while sent < total {
        let n = size.min(total - sent);
        c.write_all(&msg[..n]).unwrap();
        sent += n;
    }
    c.read_exact(&mut [0u8]).unwrap();
    let secs = t.elapsed().as_secs_f64();
    let (s, _recv_time) = server.join().unwrap();
    let mibs = total as f64 / (1u64 << 20) as f64 / secs;
    let st = c.stats();
    eprintln!(
        "ring bw: {mib} MiB in {size} B sends, {secs:.2} s, {mibs:.1} MiB/s ({} writes, {} credits received by peer)",
        st.data_writes, s.stats().credits_sent
    );
    println!("bw_mibs={mibs:.2}");
    drop((c, s));
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: ring_bench lat|bw ADDR [N] [SIZE]";
    let mode = args.get(1).expect(usage);
    let addr: SocketAddr = args.get(2).expect(usage).parse().expect("ADDR ip:port");
    let n: Option<usize> = args.get(3).map(|v| v.parse().expect("N"));
    let size: Option<usize> = args.get(4).map(|v| v.parse().expect("SIZE"));
    match mode.as_str() {
        "lat" => lat(addr, n.unwrap_or(10_000), size.unwrap_or(64)),
        "bw" => bw(addr, n.unwrap_or(256), size.unwrap_or(65536)),
        _ => panic!("{usage}"),
    }
}
