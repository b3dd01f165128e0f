//! Where a ping-pong's round trip goes (cargo feature `timeline`; off by default, and then
//! none of this is compiled).
//!
//! `ring_bench lat` runs both ends of a ping-pong as two threads of one process, so one
//! time-stamp counter times both. With the feature on, each thread says which end it is
//! ([`set_side`]) and the transport stamps three moments of every data message on that end:
//! the post call of a DATA write and its return, and the receive completion of a DATA seen;
//! the bench stamps the fourth, its read returning ([`Mark::ReadReturned`]). [`report`] then
//! gives per-segment medians and means: how much of a round trip is the wire (a post to the
//! peer's completion: under soft-RoCE the device's work, done in the poster's system call)
//! and how much the software on each side. End-to-end figures in an emulated VM flip between a
//! fast and a slow state from run to run; these segments, measured inside one run, do not
//! depend on which state it landed in for what they say about the code.
//!
//! Every stamp is an atomic store into a fixed table (no allocation, no lock): ~0.1 µs each
//! under TCG, four per message per side. A thread that did not call [`set_side`] stamps
//! nothing. Only the first [`CAP`] messages of each kind are kept.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

/// Messages kept per end and kind.
pub const CAP: usize = 1 << 16;
const KINDS: usize = 4;

/// The end of the ping-pong a thread is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Sends first.
    Client = 0,
    /// Answers.
    Server = 1,
}

/// A moment in a data message's life on one end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// The post call of a DATA write begins.
    PostCalled = 0,
    /// That post call returned.
    PostReturned = 1,
    /// A DATA receive completion was polled (with records: a record was found in the ring).
    DataSeen = 2,
    /// The application's read returned (stamped by the bench).
    ReadReturned = 3,
}

static STAMPS: [[AtomicU64; CAP]; 2 * KINDS] =
    [const { [const { AtomicU64::new(0) }; CAP] }; 2 * KINDS];
static COUNTS: [AtomicUsize; 2 * KINDS] = [const { AtomicUsize::new(0) }; 2 * KINDS];

thread_local! {
    static SIDE: Cell<Option<Side>> = const { Cell::new(None) };
}

/// This thread's end of the ping-pong (before its first message).
pub fn set_side(side: Side) {
    SIDE.with(|s| s.set(Some(side)));
}

/// Stamps `m` for this thread's end, if it has one.
#[inline]
pub fn mark(m: Mark) {
    let Some(side) = SIDE.with(Cell::get) else {
        return;
    };
    let k = side as usize * KINDS + m as usize;
    let i = COUNTS[k].fetch_add(1, Relaxed);
    if let (Some(slot), Some(t)) = (STAMPS[k].get(i), crate::sys::cycles()) {
        slot.store(t, Relaxed);
    }
}

/// The stamps of `m` on `side` so far, in order (at most [`CAP`]): for a process that is one
/// end only (the shim's, `RDMASHIM_TIMELINE`), whose stamps are merged with its peer's by
/// `scripts/bench-tools/timeline_merge.py` — the two processes of one host read one counter.
pub fn stamps(side: Side, m: Mark) -> Vec<u64> {
    let k = side as usize * KINDS + m as usize;
    let n = COUNTS[k].load(Relaxed).min(CAP);
    STAMPS[k][..n].iter().map(|s| s.load(Relaxed)).collect()
}

/// A segment of a round trip: its name, from, to, and whether "to" is the next round trip's.
type Segment = (&'static str, (Side, Mark), (Side, Mark), usize);

fn stamp(side: Side, m: Mark, i: usize) -> f64 {
    STAMPS[side as usize * KINDS + m as usize][i].load(Relaxed) as f64
}

/// Per-segment medians and means (µs) over the round trips stamped so far, `ticks_per_us`
/// being the counter's rate; `None` when the ends' counts of some kind disagree (a message
/// was coalesced, or credits were counted as data) or nothing was stamped. Call it after both
/// threads stopped.
pub fn report(ticks_per_us: f64) -> Option<String> {
    use Mark::*;
    use Side::*;
    let counts: Vec<usize> = COUNTS.iter().map(|c| c.load(Relaxed)).collect();
    let n = counts[0];
    if n < 2 || counts.iter().any(|&c| c != n) {
        return None;
    }
    let n = n.min(CAP) - 1;
    // (a round trip: client post, server sees it, server's read returns, server posts, client
    // sees the answer, client's read returns, client's next post)
    let segments: [Segment; 8] = [
        (
            "post call (client)",
            (Client, PostCalled),
            (Client, PostReturned),
            0,
        ),
        (
            "wire: client post -> server sees it",
            (Client, PostCalled),
            (Server, DataSeen),
            0,
        ),
        (
            "server: seen -> read returns",
            (Server, DataSeen),
            (Server, ReadReturned),
            0,
        ),
        (
            "server: read returns -> its post",
            (Server, ReadReturned),
            (Server, PostCalled),
            0,
        ),
        (
            "wire: server post -> client sees it",
            (Server, PostCalled),
            (Client, DataSeen),
            0,
        ),
        (
            "client: seen -> read returns",
            (Client, DataSeen),
            (Client, ReadReturned),
            0,
        ),
        (
            "client: read returns -> next post",
            (Client, ReadReturned),
            (Client, PostCalled),
            1,
        ),
        ("round trip", (Client, PostCalled), (Client, PostCalled), 1),
    ];
    let mut out = format!("timeline: {n} round trips, segment median / mean in us\n");
    for (name, (sa, ma), (sb, mb), next) in segments {
        let mut v: Vec<f64> = (0..n)
            .map(|i| (stamp(sb, mb, i + next) - stamp(sa, ma, i)) / ticks_per_us)
            .collect();
        v.sort_by(f64::total_cmp);
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        out += &format!("  {name:<40} {:>8.1} {:>8.1}\n", v[v.len() / 2], mean);
    }
    Some(out)
}
