//! RDMA tier: rings on huge pages. The VM's kernel gets a pool of huge pages here
//! (`vm.nr_hugepages`, as root: the tier runs as root in its own kernel), then:
//!
//! - a ring of a multiple of the huge page size is made of them (its mapping's
//!   `KernelPageSize` in `/proc/self/smaps` is the huge page's) and is still one ring seen
//!   twice; with the pool empty, or with huge pages turned off, it takes ordinary pages;
//! - a native stream with 8 MiB rings takes its receive rings and staging areas from the pool,
//!   carries 64 MiB each way intact over rxe0, and the same stream on ordinary pages is timed
//!   beside it (set-up and transfer, printed; not asserted: the VM's timing is emulated).
//!
//! Alone in its binary: the pool and the process's ring counts are its own.

mod support;

use std::thread;
use std::time::Instant;

use rdmashim_core::ring::{self, HugePages, MagicRing};
use rdmashim_core::{Listener, Stream, StreamConfig};

const RING: usize = 8 << 20;

fn set_pool(pages: u64) -> HugePages {
    std::fs::write("/proc/sys/vm/nr_hugepages", pages.to_string())
        .expect("vm.nr_hugepages (the RDMA tier runs as root in its VM)");
    HugePages::read().expect("/proc/meminfo has huge pages")
}

/// The page size the kernel maps `addr` with, from `/proc/self/smaps`.
fn kernel_page_size(addr: usize) -> usize {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut inside = false;
    for line in smaps.lines() {
        if let Some((range, _)) = line.split_once(' ') {
            if let Some((a, b)) = range.split_once('-') {
                if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                {
                    inside = (a..b).contains(&addr);
                    continue;
                }
            }
        }
        if inside {
            if let Some(v) = line.strip_prefix("KernelPageSize:") {
                return v
                    .trim()
                    .trim_end_matches(" kB")
                    .trim()
                    .parse::<usize>()
                    .unwrap()
                    * 1024;
            }
        }
    }
    panic!("{addr:#x} is not mapped");
}

/// A stream with `RING` rings carries `total` each way; returns its set-up's and its
/// transfer's seconds and how many of its rings were of huge pages.
/// `recv_slots` differs between calls so that a connection never takes the last one's pooled
/// kit (`crate::pool`: kits are pooled by their sizes), whose rings were made the other way.
fn transfer(total: usize, recv_slots: u16) -> (f64, f64, usize) {
    let cfg = StreamConfig {
        ring_size: RING,
        recv_slots,
        ..StreamConfig::default()
    };
    let addr = support::addr(14);
    let before = ring::huge_rings();
    let listener = Listener::bind_with(addr, cfg).expect("bind");
    let t0 = Instant::now();
    let server = thread::spawn(move || {
        let mut s = listener.accept().expect("accept");
        let hashes = support::exchange(&mut s, 2, total);
        s.close().expect("close");
        hashes
    });
    let mut c = Stream::connect_with(addr, cfg).expect("connect");
    let setup = t0.elapsed().as_secs_f64();
    let huge = ring::huge_rings() - before;
    let t1 = Instant::now();
    let (c_sent, c_recv) = support::exchange(&mut c, 1, total);
    c.close().expect("close");
    let (s_sent, s_recv) = server.join().expect("server");
    assert_eq!(c_sent, s_recv, "client → server bytes differ");
    assert_eq!(s_sent, c_recv, "server → client bytes differ");
    (setup, t1.elapsed().as_secs_f64(), huge)
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn rings_of_huge_pages_where_the_pool_has_them() {
    let _ = support::device();
    let empty = set_pool(0);
    assert_eq!(empty.available, 0);
    let r = MagicRing::new(RING).unwrap();
    assert!(!r.is_huge(), "no pool: ordinary pages");
    drop(r);

    let hp = set_pool(40);
    assert!(hp.available >= 32, "the VM gave its pool: {hp:?}");
    let mut r = MagicRing::new(RING).unwrap();
    assert!(r.is_huge(), "{hp:?}");
    assert_eq!(kernel_page_size(r.as_ptr() as usize), hp.size);
    assert_eq!(kernel_page_size(r.as_ptr() as usize + RING), hp.size);
    assert_eq!(r.as_ptr() as usize % hp.size, 0);
    r.slice_mut(RING - 3, 6).copy_from_slice(b"abcdef");
    assert_eq!(r.slice(0, 3), b"def", "one ring seen twice");
    assert_eq!(
        HugePages::read().unwrap().available,
        hp.available - (RING / hp.size) as u64,
        "its pages came from the pool"
    );
    let small = MagicRing::new(1 << 20).unwrap();
    assert!(!small.is_huge(), "smaller than a huge page: ordinary pages");
    ring::set_huge_pages(false);
    let off = MagicRing::new(RING).unwrap();
    assert!(!off.is_huge(), "turned off");
    ring::set_huge_pages(true);
    drop((r, small, off));

    let total = 64 << 20;
    // both ends' receive rings and staging areas: four rings of the pool
    let (h_setup, h_secs, h_rings) = transfer(total, 64);
    assert_eq!(h_rings, 4, "every ring of the stream on huge pages");
    ring::set_huge_pages(false);
    let (o_setup, o_secs, o_rings) = transfer(total, 128);
    ring::set_huge_pages(true);
    assert_eq!(o_rings, 0);
    eprintln!(
        "8 MiB rings, {} MiB each way: set-up {:.1} ms on huge pages, {:.1} ms on ordinary \
         ({:.2}x); transfer {h_secs:.2} s against {o_secs:.2} s ({:.2}x)",
        total >> 20,
        h_setup * 1e3,
        o_setup * 1e3,
        o_setup / h_setup,
        o_secs / h_secs
    );
    set_pool(0);
}
