//! Counters and the stats JSON.
//!
//! Per-hook call counters and byte counters live in [`SHARDS`] cache-line-aligned shards, so
//! that threads rarely increment the same line. A call costs one relaxed `fetch_add` (correct
//! whoever else shares the shard, only slower then). The shard is chosen without TLS on the
//! hooks' fast path: by fd number for calls on an fd ([`fd_shard`]: threads serving different
//! fds land on different shards), by a pointer argument for fd-less calls ([`ptr_shard`]: e.g.
//! each thread's own `pollfd` array); the slow path uses the thread's shard from its TLS word
//! ([`Cx`]). The first [`OWNED_SHARDS`](crate::guard::OWNED_SHARDS) threads each own a shard
//! of a second array, which no other thread writes: their counts there are a plain load and
//! store ([`Tally`]) — the slow path of an upgraded connection's read and write counts three
//! or four times a message, and an atomic add costs a real CPU several times a plain one. (A
//! signal handler that interrupts such a count and counts the same thing in a hook of its own
//! may have its count overwritten: a count lost in a window of a few instructions.) The JSON
//! sums all shards of both arrays, so where a call was counted does not matter.
//! Connection counters are rare events and live in plain global atomics.
//!
//! The JSON written at exit has exactly this shape (keys may be added, never removed):
//! `{"pid":N,"ppid":N,"program":"<name>"|null,"version":"<crate version>","started_unix_ms":N,
//! "ended_unix_ms":N,"calls":{"<hook>":N,...},"connections":{"upgraded":N,"switched_back":N,"path_failed":N,"fallback":N,
//! "fallback_reasons":{"<reason>":N,...},"kinds":{"imm":N,"records":N,"sends":N,"read":N,"duplex":N}},"bytes":{"ring_tx":N,"ring_rx":N,"tcp_tx":N,"tcp_rx":N,"shm_tx":N,"shm_rx":N},
//! "waits":{"spin_hit":N,"spin_miss":N,"spin_preempted":N,"slept":N,"spin_crowded":N},"output":{"log_dropped":N},
//! "security":{"unproven_requests":N},"fds":{"missed_closes":N}}`
//! Every hook and every reason is always present (zeros included), in a fixed order. The
//! program's name is the only text that comes from outside; it is escaped as JSON needs.

use crate::guard::Cx;
use crate::hook::Hook;
use crate::reason::FallbackReason;
use core::fmt::{self, Write};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

/// Number of counter shards (a power of two).
pub const SHARDS: usize = 64;
const _: () = assert!(SHARDS.is_power_of_two());

/// Byte counters: the application's bytes on RDMA rings (`ring_*`), on plain TCP
/// (`tcp_*`), and on shared-memory rings to a process of this host (`shm_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Bytes {
    RingTx = 0,
    RingRx = 1,
    TcpTx = 2,
    TcpRx = 3,
    ShmTx = 4,
    ShmRx = 5,
}

/// How many byte counters there are.
pub const BYTES: usize = 6;

impl Bytes {
    pub const ALL: [Bytes; BYTES] = [
        Bytes::RingTx,
        Bytes::RingRx,
        Bytes::TcpTx,
        Bytes::TcpRx,
        Bytes::ShmTx,
        Bytes::ShmRx,
    ];
    pub const fn name(self) -> &'static str {
        match self {
            Bytes::RingTx => "ring_tx",
            Bytes::RingRx => "ring_rx",
            Bytes::TcpTx => "tcp_tx",
            Bytes::TcpRx => "tcp_rx",
            Bytes::ShmTx => "shm_tx",
            Bytes::ShmRx => "shm_rx",
        }
    }

    /// The counter of bytes sent (`tx`) or received on a link of `transport`.
    pub const fn on_link(transport: rdmashim_core::Transport, tx: bool) -> Bytes {
        match (transport, tx) {
            (rdmashim_core::Transport::Rdma, true) => Bytes::RingTx,
            (rdmashim_core::Transport::Rdma, false) => Bytes::RingRx,
            (rdmashim_core::Transport::Shm, true) => Bytes::ShmTx,
            (rdmashim_core::Transport::Shm, false) => Bytes::ShmRx,
        }
    }
}

/// How many kinds of [`Wait`].
const WAITS: usize = 5;

/// How the blocked data calls on upgraded connections waited: the end of each busy-poll
/// (see `spin::wait::limit`) and each sleep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Wait {
    SpinHit = 0,
    SpinMiss = 1,
    SpinPreempted = 2,
    Slept = 3,
    /// A wait its connection's gate would have spun that did not, since as many of the
    /// process's threads as may were spinning already (`spin::wait::spinners_max`).
    SpinCrowded = 4,
}

impl Wait {
    pub const ALL: [Wait; WAITS] = [
        Wait::SpinHit,
        Wait::SpinMiss,
        Wait::SpinPreempted,
        Wait::Slept,
        Wait::SpinCrowded,
    ];
    pub const fn name(self) -> &'static str {
        match self {
            Wait::SpinHit => "spin_hit",
            Wait::SpinMiss => "spin_miss",
            Wait::SpinPreempted => "spin_preempted",
            Wait::Slept => "slept",
            Wait::SpinCrowded => "spin_crowded",
        }
    }
}

/// One shard of the call, byte and wait counters.
// 128-byte alignment: adjacent-line prefetch pairs lines on x86, so 64 is not always enough.
#[repr(align(128))]
pub struct Shard {
    calls: [AtomicU64; Hook::COUNT],
    bytes: [AtomicU64; BYTES],
    waits: [AtomicU64; WAITS],
}

impl Shard {
    const fn new() -> Self {
        Shard {
            calls: [const { AtomicU64::new(0) }; Hook::COUNT],
            bytes: [const { AtomicU64::new(0) }; BYTES],
            waits: [const { AtomicU64::new(0) }; WAITS],
        }
    }
}

static SHARD_ARR: [Shard; SHARDS] = [const { Shard::new() }; SHARDS];
/// The shards threads own ([`Cx::owned`]): each written by its one thread only.
static OWNED: [Shard; crate::guard::OWNED_SHARDS as usize] =
    [const { Shard::new() }; crate::guard::OWNED_SHARDS as usize];
static UPGRADED: AtomicU64 = AtomicU64::new(0);
static SWITCHED_BACK: AtomicU64 = AtomicU64::new(0);
static PATH_FAILED: AtomicU64 = AtomicU64::new(0);
static FALLBACK: AtomicU64 = AtomicU64::new(0);
static REASONS: [AtomicU64; FallbackReason::COUNT] =
    [const { AtomicU64::new(0) }; FallbackReason::COUNT];
/// How many connection kinds [`KINDS`] counts (`rdmashim_proto::Kind::ALL`).
pub const KIND_COUNT: usize = rdmashim_proto::Kind::ALL.len();
/// Connections upgraded over RDMA, by the kind they carry (protocol §3, §14–§16: what
/// `RDMASHIM_KIND` asked for when the peer's shim asked for the same, else imm), in the order
/// of `rdmashim_proto::Kind::ALL`.
static KINDS: [AtomicU64; KIND_COUNT] = [const { AtomicU64::new(0) }; KIND_COUNT];
/// Log records the shim could not write (a refused or unwritable log file, a full disk,
/// `RLIMIT_FSIZE`, stderr with no reader): dropped quietly, counted here.
static LOG_DROPPED: AtomicU64 = AtomicU64::new(0);
/// Server side: rdma_cm requests for one of this process's connections that could not prove
/// their sender holds it (`docs/protocol.md` 2.8: a forger's), rejected.
static UNPROVEN_REQUESTS: AtomicU64 = AtomicU64::new(0);
/// When this process's record began (the library loaded, or the fork that made this process),
/// ms since the epoch; and the process that was its parent then.
static STARTED_MS: AtomicU64 = AtomicU64::new(0);
static PPID: AtomicU32 = AtomicU32::new(0);

/// The crate version every record carries.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Descriptors of the program's whose close no hook saw (an inline system call, io_uring),
/// found when the number was given out again or by the engine's check of its connections'
/// sockets: released then as their close would have been.
static MISSED_CLOSES: AtomicU64 = AtomicU64::new(0);

/// Adds `n` to a counter that one writer at a time moves (a thread's own shard, a
/// connection's counter under its lock): a load and a store, where an atomic add would be a
/// locked read-modify-write.
#[inline(always)]
pub(crate) fn bump(counter: &AtomicU64, n: u64) {
    counter.store(counter.load(Relaxed).wrapping_add(n), Relaxed);
}

/// Where a thread's counts go: a shard it owns (a plain load and store: no other thread
/// writes it) or a shared one (an atomic add).
#[derive(Clone, Copy)]
pub struct Tally {
    shard: &'static Shard,
    own: bool,
}

/// The calling thread's [`Tally`], from its hook's context.
#[inline(always)]
pub fn tally(cx: Cx) -> Tally {
    if cx.owned() {
        if let Some(shard) = OWNED.get(cx.shard(OWNED.len())) {
            return Tally { shard, own: true };
        }
    }
    Tally::at(cx.shard(SHARDS))
}

impl Tally {
    /// Shared shard number `shard` (taken modulo [`SHARDS`]).
    #[inline(always)]
    pub fn at(shard: usize) -> Tally {
        Tally {
            shard: shard_at(shard),
            own: false,
        }
    }

    #[inline(always)]
    fn add(self, c: Option<&AtomicU64>, n: u64) {
        let Some(c) = c else { return };
        if self.own {
            bump(c, n);
        } else {
            c.fetch_add(n, Relaxed);
        }
    }

    /// Counts one call of `h`.
    #[inline(always)]
    pub fn count_call(self, h: Hook) {
        self.add(self.shard.calls.get(h as usize), 1);
    }

    /// Adds `n` bytes to counter `b`.
    #[inline(always)]
    pub fn add_bytes(self, b: Bytes, n: u64) {
        self.add(self.shard.bytes.get(b as usize), n);
    }

    /// Counts one wait of kind `w`.
    #[inline(always)]
    pub fn count_wait(self, w: Wait) {
        self.add(self.shard.waits.get(w as usize), 1);
    }
}

/// The shard of calls on `fd` (any value is a valid shard; negative fds included).
#[inline(always)]
pub fn fd_shard(fd: i32) -> usize {
    fd as u32 as usize & (SHARDS - 1)
}

/// The shard of a call keyed by an address (Fibonacci hashing: the top bits of the product).
#[inline(always)]
pub fn ptr_shard(p: usize) -> usize {
    (p as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) as usize
        >> (usize::BITS - SHARDS.trailing_zeros())
}

/// Shard number `shard` (taken modulo [`SHARDS`]).
#[inline(always)]
pub fn shard_at(shard: usize) -> &'static Shard {
    let [first, ..] = &SHARD_ARR;
    SHARD_ARR.get(shard & (SHARDS - 1)).unwrap_or(first)
}

/// Counts one call of `h` on shard `shard` (taken modulo [`SHARDS`]).
#[inline(always)]
pub fn count_call_at(shard: usize, h: Hook) {
    shard_at(shard).count_call(h);
}

impl Shard {
    /// Counts one call of `h`.
    #[inline(always)]
    pub fn count_call(&self, h: Hook) {
        if let Some(c) = self.calls.get(h as usize) {
            c.fetch_add(1, Relaxed);
        }
    }

    /// Adds `n` bytes to counter `b`.
    #[inline(always)]
    pub fn add_bytes(&self, b: Bytes, n: u64) {
        if let Some(c) = self.bytes.get(b as usize) {
            c.fetch_add(n, Relaxed);
        }
    }
}

/// Counts one call of `h` on the calling thread's shard.
#[inline(always)]
pub fn count_call(cx: Cx, h: Hook) {
    tally(cx).count_call(h);
}

/// Adds `n` bytes to counter `b` on the calling thread's shard.
#[inline(always)]
pub fn add_bytes(cx: Cx, b: Bytes, n: u64) {
    tally(cx).add_bytes(b, n);
}

/// Counts one connection that stays on TCP, with its reason.
pub fn count_fallback(r: FallbackReason) {
    FALLBACK.fetch_add(1, Relaxed);
    if let Some(c) = REASONS.get(r as usize) {
        c.fetch_add(1, Relaxed);
    }
}

/// Counts one upgraded connection; over RDMA, the `kind` it carries too.
pub fn count_upgraded(kind: Option<rdmashim_proto::Kind>) {
    UPGRADED.fetch_add(1, Relaxed);
    if let Some(k) = kind {
        let i = rdmashim_proto::Kind::ALL.iter().position(|&x| x == k);
        if let Some(c) = i.and_then(|i| KINDS.get(i)) {
            c.fetch_add(1, Relaxed);
        }
    }
}

/// Counts one upgraded connection returned to TCP (protocol §8.5), either side's doing.
pub fn count_switched_back() {
    SWITCHED_BACK.fetch_add(1, Relaxed);
}

/// Counts one upgraded connection whose ring path failed and that went on over TCP
/// (protocol §8.6).
pub fn count_path_failed() {
    PATH_FAILED.fetch_add(1, Relaxed);
}

/// Counts one rejected request that could not prove the binding.
pub fn count_unproven_request() {
    UNPROVEN_REQUESTS.fetch_add(1, Relaxed);
}

/// Counts one close that no hook saw (see [`MISSED_CLOSES`]).
pub fn count_missed_close() {
    MISSED_CLOSES.fetch_add(1, Relaxed);
}

/// Counts one log record that could not be written.
pub fn count_log_dropped() {
    LOG_DROPPED.fetch_add(1, Relaxed);
}

/// Begins this process's record: at load, and in a fork child (with [`reset`]). `ppid` is the
/// parent then, `now_ms` the wall-clock time.
pub fn start_record(ppid: u32, now_ms: u64) {
    PPID.store(ppid, Relaxed);
    STARTED_MS.store(now_ms, Relaxed);
}

/// The parent and start time given to [`start_record`] (no counter is summed).
pub fn record_start() -> (u32, u64) {
    (PPID.load(Relaxed), STARTED_MS.load(Relaxed))
}

/// Zeroes every counter (the child after fork starts its own record).
pub fn reset() {
    for s in SHARD_ARR.iter().chain(OWNED.iter()) {
        s.calls
            .iter()
            .chain(s.bytes.iter())
            .chain(s.waits.iter())
            .for_each(|c| c.store(0, Relaxed));
    }
    UPGRADED.store(0, Relaxed);
    SWITCHED_BACK.store(0, Relaxed);
    PATH_FAILED.store(0, Relaxed);
    FALLBACK.store(0, Relaxed);
    REASONS.iter().for_each(|c| c.store(0, Relaxed));
    KINDS.iter().for_each(|c| c.store(0, Relaxed));
    LOG_DROPPED.store(0, Relaxed);
    UNPROVEN_REQUESTS.store(0, Relaxed);
    MISSED_CLOSES.store(0, Relaxed);
}

/// The longest program name kept (a file name's limit, `NAME_MAX`); a longer one is cut.
pub const PROGRAM_MAX: usize = 255;

/// A program's name: bytes as the file system has them (not necessarily UTF-8), in a fixed
/// buffer. Empty: unknown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Program {
    bytes: [u8; PROGRAM_MAX],
    len: usize,
}

impl Program {
    /// Unknown.
    pub const fn unknown() -> Self {
        Program {
            bytes: [0; PROGRAM_MAX],
            len: 0,
        }
    }

    /// `name`, cut to [`PROGRAM_MAX`] bytes.
    pub fn new(name: &[u8]) -> Self {
        let mut p = Program::unknown();
        let n = name.len().min(PROGRAM_MAX);
        if let (Some(dst), Some(src)) = (p.bytes.get_mut(..n), name.get(..n)) {
            dst.copy_from_slice(src);
            p.len = n;
        }
        p
    }

    pub fn as_bytes(&self) -> &[u8] {
        self.bytes.get(..self.len).unwrap_or(&[])
    }
}

/// A consistent-enough copy of all counters (each counter is read once; counters of different
/// threads are not synchronised with each other).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub pid: u32,
    /// The parent when the record began ([`start_record`]).
    pub ppid: u32,
    /// The executable's base name (filled in by the writer: it reads `/proc`).
    pub program: Program,
    /// When the record began and when it was written, ms since the epoch (`ended_unix_ms` is
    /// filled in by the writer).
    pub started_unix_ms: u64,
    pub ended_unix_ms: u64,
    pub calls: [u64; Hook::COUNT],
    pub upgraded: u64,
    pub switched_back: u64,
    pub path_failed: u64,
    pub fallback: u64,
    pub reasons: [u64; FallbackReason::COUNT],
    /// Connections upgraded over RDMA by kind ([`KINDS`]).
    pub kinds: [u64; KIND_COUNT],
    pub bytes: [u64; BYTES],
    pub waits: [u64; WAITS],
    pub log_dropped: u64,
    pub unproven_requests: u64,
    pub missed_closes: u64,
}

impl Snapshot {
    /// All zero.
    pub fn empty(pid: u32) -> Self {
        Snapshot {
            pid,
            ppid: 0,
            program: Program::unknown(),
            started_unix_ms: 0,
            ended_unix_ms: 0,
            calls: [0; Hook::COUNT],
            upgraded: 0,
            switched_back: 0,
            path_failed: 0,
            fallback: 0,
            reasons: [0; FallbackReason::COUNT],
            kinds: [0; KIND_COUNT],
            bytes: [0; BYTES],
            waits: [0; WAITS],
            log_dropped: 0,
            unproven_requests: 0,
            missed_closes: 0,
        }
    }

    /// Reads the live counters, and the parent and start time of the record.
    pub fn take(pid: u32) -> Self {
        let mut s = Snapshot::empty(pid);
        s.ppid = PPID.load(Relaxed);
        s.started_unix_ms = STARTED_MS.load(Relaxed);
        for sh in SHARD_ARR.iter().chain(OWNED.iter()) {
            for (d, c) in s.calls.iter_mut().zip(sh.calls.iter()) {
                *d = d.wrapping_add(c.load(Relaxed));
            }
            for (d, c) in s.bytes.iter_mut().zip(sh.bytes.iter()) {
                *d = d.wrapping_add(c.load(Relaxed));
            }
            for (d, c) in s.waits.iter_mut().zip(sh.waits.iter()) {
                *d = d.wrapping_add(c.load(Relaxed));
            }
        }
        s.upgraded = UPGRADED.load(Relaxed);
        s.switched_back = SWITCHED_BACK.load(Relaxed);
        s.path_failed = PATH_FAILED.load(Relaxed);
        s.fallback = FALLBACK.load(Relaxed);
        for (d, c) in s.reasons.iter_mut().zip(REASONS.iter()) {
            *d = c.load(Relaxed);
        }
        for (d, c) in s.kinds.iter_mut().zip(KINDS.iter()) {
            *d = c.load(Relaxed);
        }
        s.log_dropped = LOG_DROPPED.load(Relaxed);
        s.unproven_requests = UNPROVEN_REQUESTS.load(Relaxed);
        s.missed_closes = MISSED_CLOSES.load(Relaxed);
        s
    }

    pub fn calls_of(&self, h: Hook) -> u64 {
        self.calls.get(h as usize).copied().unwrap_or(0)
    }

    /// Writes the stats JSON (one line, newline-terminated). Hook and reason names are plain
    /// ASCII identifiers, so no escaping is needed; the program's name is escaped.
    pub fn write_json<W: Write>(&self, w: &mut W) -> fmt::Result {
        write!(
            w,
            "{{\"pid\":{},\"ppid\":{},\"program\":",
            self.pid, self.ppid
        )?;
        match self.program.as_bytes() {
            [] => w.write_str("null")?,
            name => write_json_string(w, name)?,
        }
        write!(
            w,
            ",\"version\":\"{VERSION}\",\"started_unix_ms\":{},\"ended_unix_ms\":{},\"calls\":{{",
            self.started_unix_ms, self.ended_unix_ms
        )?;
        write_pairs(w, Hook::ALL.iter().map(|h| (h.name(), self.calls_of(*h))))?;
        write!(
            w,
            "}},\"connections\":{{\"upgraded\":{},\"switched_back\":{},\"path_failed\":{},\"fallback\":{},\"fallback_reasons\":{{",
            self.upgraded, self.switched_back, self.path_failed, self.fallback
        )?;
        write_pairs(
            w,
            named(FallbackReason::ALL, FallbackReason::name, &self.reasons),
        )?;
        w.write_str("},\"kinds\":{")?;
        write_pairs(
            w,
            named(
                &rdmashim_proto::Kind::ALL,
                rdmashim_proto::Kind::name,
                &self.kinds,
            ),
        )?;
        w.write_str("}},\"bytes\":{")?;
        write_pairs(w, named(&Bytes::ALL, Bytes::name, &self.bytes))?;
        w.write_str("},\"waits\":{")?;
        write_pairs(w, named(&Wait::ALL, Wait::name, &self.waits))?;
        writeln!(
            w,
            "}},\"output\":{{\"log_dropped\":{}}},\"security\":{{\"unproven_requests\":{}}},\"fds\":{{\"missed_closes\":{}}}}}",
            self.log_dropped, self.unproven_requests, self.missed_closes
        )
    }
}

/// Writes `bytes` as a JSON string: quoted, `"` and `\` escaped, control characters as
/// `\u00XX`, bytes that are not UTF-8 as U+FFFD (a file name is bytes; JSON is Unicode).
fn write_json_string<W: Write>(w: &mut W, bytes: &[u8]) -> fmt::Result {
    w.write_char('"')?;
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '"' => w.write_str("\\\"")?,
                '\\' => w.write_str("\\\\")?,
                c if (c as u32) < 0x20 || c == '\u{7f}' => write!(w, "\\u{:04x}", c as u32)?,
                c => w.write_char(c)?,
            }
        }
        if !chunk.invalid().is_empty() {
            w.write_str("\\ufffd")?;
        }
    }
    w.write_char('"')
}

/// Each of `keys` by its name, with its counter in `values` (the same order; 0 if missing).
fn named<'a, K: Copy>(
    keys: &'a [K],
    name: fn(K) -> &'static str,
    values: &'a [u64],
) -> impl Iterator<Item = (&'static str, u64)> + 'a {
    keys.iter()
        .enumerate()
        .map(move |(i, k)| (name(*k), values.get(i).copied().unwrap_or(0)))
}

/// Writes `"name":value` pairs, comma-separated: the inside of a JSON object. Names are plain
/// ASCII identifiers, so no escaping is needed.
fn write_pairs<W: Write>(
    w: &mut W,
    pairs: impl Iterator<Item = (&'static str, u64)>,
) -> fmt::Result {
    for (i, (k, v)) in pairs.enumerate() {
        let sep = if i == 0 { "" } else { "," };
        write!(w, "{sep}\"{k}\":{v}")?;
    }
    Ok(())
}

/// Upper bound of the JSON size, for the fixed buffer the writer uses: the counters, and who
/// the record is of (each byte of the name at most 6 characters escaped, `\u00XX`).
pub const JSON_MAX: usize = 64
    + (Hook::COUNT + FallbackReason::COUNT + KIND_COUNT + 10) * (24 + 21)
    + 180
    + (128 + PROGRAM_MAX * 6 + VERSION.len());

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fmtbuf::FixedBuf;

    fn parse(s: &Snapshot) -> serde_json::Value {
        let mut out = String::new();
        s.write_json(&mut out).unwrap();
        assert!(out.ends_with('\n'));
        assert!(out.len() < JSON_MAX, "{} >= {}", out.len(), JSON_MAX);
        serde_json::from_str(&out).unwrap()
    }

    #[test]
    fn json_shape() {
        let mut s = Snapshot::empty(1234);
        s.calls[Hook::Read as usize] = 7;
        s.calls[Hook::RecvChk as usize] = 2;
        s.fallback = 3;
        s.reasons[FallbackReason::NoDevice as usize] = 3;
        s.bytes[Bytes::TcpTx as usize] = u64::MAX;
        s.waits[Wait::Slept as usize] = 5;
        s.kinds[3] = 2;
        let v = parse(&s);
        let top: Vec<_> = v.as_object().unwrap().keys().cloned().collect();
        for k in ["pid", "calls", "connections", "bytes"] {
            assert!(top.contains(&k.to_string()), "{k}");
        }
        assert_eq!(v["pid"], 1234);
        assert_eq!(v["calls"]["read"], 7);
        assert_eq!(v["calls"]["__recv_chk"], 2);
        assert_eq!(v["calls"]["socket"], 0);
        assert_eq!(v["calls"].as_object().unwrap().len(), Hook::COUNT);
        assert_eq!(v["connections"]["upgraded"], 0);
        assert_eq!(v["connections"]["fallback"], 3);
        assert_eq!(v["connections"]["fallback_reasons"]["no_device"], 3);
        let kinds = v["connections"]["kinds"].as_object().unwrap();
        assert_eq!(kinds.len(), KIND_COUNT);
        assert_eq!(
            (&kinds["imm"], &kinds["sends"], &kinds["read"]),
            (&0.into(), &0.into(), &2.into())
        );
        assert_eq!(
            v["connections"]["fallback_reasons"]
                .as_object()
                .unwrap()
                .len(),
            FallbackReason::COUNT
        );
        assert_eq!(v["bytes"]["tcp_tx"], u64::MAX);
        for k in ["ring_tx", "ring_rx", "tcp_tx", "tcp_rx", "shm_tx", "shm_rx"] {
            assert!(v["bytes"][k].is_u64());
        }
        for k in ["spin_hit", "spin_miss", "spin_preempted"] {
            assert_eq!(v["waits"][k], 0, "{k}");
        }
        assert_eq!(v["waits"]["slept"], 5);
        assert_eq!(v["output"]["log_dropped"], 0);
        assert_eq!(v["security"]["unproven_requests"], 0);
    }

    #[test]
    fn json_says_whose_record_it_is() {
        let mut s = Snapshot::empty(1234);
        s.ppid = 1;
        s.program = Program::new(b"redis-server");
        s.started_unix_ms = 1_700_000_000_000;
        s.ended_unix_ms = 1_700_000_000_250;
        let v = parse(&s);
        assert_eq!(v["ppid"], 1);
        assert_eq!(v["program"], "redis-server");
        assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
        assert!(!VERSION.is_empty());
        assert_eq!(v["started_unix_ms"], 1_700_000_000_000u64);
        assert_eq!(v["ended_unix_ms"], 1_700_000_000_250u64);
        // The counters are all still there.
        assert_eq!(v["calls"].as_object().unwrap().len(), Hook::COUNT);
        // A name that could not be read is null, not an empty string.
        assert!(parse(&Snapshot::empty(1))["program"].is_null());
    }

    #[test]
    fn program_names_are_escaped() {
        for (raw, want) in [
            (&b"a\"b"[..], "a\"b"),
            (b"back\\slash", "back\\slash"),
            (
                b"tab\tnl\ncr\r\x01\x1f\x7f",
                "tab\tnl\ncr\r\u{1}\u{1f}\u{7f}",
            ),
            ("café-☕".as_bytes(), "café-☕"),
            (b"bad\xff\xfeutf8", "bad\u{fffd}\u{fffd}utf8"),
            (b"cut\xe2\x98", "cut\u{fffd}"),
            (b"}\",\"pid\":0,\"x", "}\",\"pid\":0,\"x"),
        ] {
            let mut s = Snapshot::empty(7);
            s.program = Program::new(raw);
            let v = parse(&s);
            assert_eq!(v["program"], want, "{raw:?}");
            assert_eq!(want, String::from_utf8_lossy(raw), "as std reads bytes");
            assert_eq!(v["pid"], 7, "{raw:?}: the name escaped its string");
        }
        // The raw text: control characters as \u00XX, nothing unescaped.
        let mut out = String::new();
        Snapshot {
            program: Program::new(b"x\x01\"\\"),
            ..Snapshot::empty(1)
        }
        .write_json(&mut out)
        .unwrap();
        assert!(out.contains(r#""program":"x\u0001\"\\""#), "{out}");
        assert_eq!(Program::new(&[b'n'; 300]).as_bytes().len(), PROGRAM_MAX);
    }

    #[test]
    fn json_fits_fixed_buffer_with_max_values() {
        let mut s = Snapshot::empty(u32::MAX);
        s.calls = [u64::MAX; Hook::COUNT];
        s.reasons = [u64::MAX; FallbackReason::COUNT];
        s.bytes = [u64::MAX; BYTES];
        s.waits = [u64::MAX; WAITS];
        s.upgraded = u64::MAX;
        s.fallback = u64::MAX;
        s.log_dropped = u64::MAX;
        s.unproven_requests = u64::MAX;
        s.missed_closes = u64::MAX;
        s.switched_back = u64::MAX;
        s.path_failed = u64::MAX;
        s.ppid = u32::MAX;
        s.started_unix_ms = u64::MAX;
        s.ended_unix_ms = u64::MAX;
        // The longest name, every byte escaped to six characters.
        s.program = Program::new(&[0x01; PROGRAM_MAX + 1]);
        let mut b = FixedBuf::<JSON_MAX>::new();
        s.write_json(&mut b).unwrap();
        assert!(!b.overflowed());
        let v: serde_json::Value = serde_json::from_slice(b.as_bytes()).unwrap();
        assert_eq!(v["calls"]["execve"], u64::MAX);
        assert_eq!(v["program"].as_str().unwrap().len(), PROGRAM_MAX);
    }

    #[test]
    fn a_record_starts_when_told() {
        // (the only test in this binary that starts a record)
        start_record(4321, 1_234_567);
        let s = Snapshot::take(9);
        assert_eq!((s.pid, s.ppid, s.started_unix_ms), (9, 4321, 1_234_567));
        assert_eq!(s.ended_unix_ms, 0, "the writer fills in the end");
    }

    #[test]
    fn counters_from_many_threads() {
        // Other tests in this binary do not count calls of `Splice`/`Sendfile64`. Twice as
        // many threads as own a shard: the owners' plain stores and the later threads' atomic
        // adds at once (two threads given one owned shard would lose counts here).
        let before = Snapshot::take(0);
        let n = 2 * crate::guard::OWNED_SHARDS as u64;
        // (all counting at once: a thread that ran alone would lose nothing to a sharer)
        let start = std::sync::Arc::new(std::sync::Barrier::new(n as usize));
        let threads: Vec<_> = (0..n)
            .map(|_| {
                let start = start.clone();
                std::thread::spawn(move || {
                    let cx = Cx::current();
                    start.wait();
                    for _ in 0..100_000 {
                        count_call(cx, Hook::Splice);
                        add_bytes(cx, Bytes::RingRx, 3);
                    }
                })
            })
            .collect();
        // ... and keyed by fd / pointer, as the hooks' fast path counts.
        let keyed: Vec<_> = (0..8)
            .map(|t| {
                std::thread::spawn(move || {
                    let local = 0u8;
                    for i in 0..10_000i32 {
                        count_call_at(fd_shard(i % 7 - 1), Hook::Splice);
                        count_call_at(ptr_shard(&local as *const u8 as usize + t), Hook::Splice);
                        shard_at(fd_shard(i)).add_bytes(Bytes::RingRx, 1);
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        keyed.into_iter().for_each(|t| t.join().unwrap());
        let after = Snapshot::take(0);
        assert_eq!(
            after.calls_of(Hook::Splice) - before.calls_of(Hook::Splice),
            n * 100_000 + 160_000
        );
        assert_eq!(
            after.bytes[Bytes::RingRx as usize] - before.bytes[Bytes::RingRx as usize],
            n * 300_000 + 80_000
        );
    }

    #[test]
    fn shard_keys_in_range() {
        for fd in [-1, 0, 1, 63, 64, i32::MAX, i32::MIN] {
            assert!(fd_shard(fd) < SHARDS);
        }
        assert_ne!(fd_shard(3), fd_shard(4));
        for p in [0usize, 1, 0x7fff_ffff_f000, usize::MAX] {
            assert!(ptr_shard(p) < SHARDS);
        }
    }
}
