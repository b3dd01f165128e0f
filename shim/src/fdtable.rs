//! The fd table: per-fd shim state, indexed by fd number, lock-free.
//!
//! Two levels, like rdma-core's `index_map`: a static top array of [`TOP_LEN`] chunk pointers
//! (in `.bss`, untouched pages cost nothing) and chunks of [`CHUNK_LEN`] `AtomicU64` entries,
//! mmap'ed on first store of a non-empty entry. Chunk 0 (fds below [`CHUNK_LEN`], where almost
//! every program's fds are) is static, also in `.bss`, so the hooks' fast path finds those
//! entries with one load instead of two dependent ones. Other chunks are mmap'ed (mmap, not malloc: `socket`/`accept` are
//! async-signal-safe and may run in a signal handler). A lookup in a chunk that was never
//! allocated returns [`FdEntry::UNKNOWN`] without touching memory beyond the top array. Chunks
//! are never freed. Fds at or above [`MAX_FDS`] are always unknown (never tracked).
//!
//! Entry layout (`u64`): bits 0..8 [`Kind`], bits 8..24 [`flags`], bits 24..64 a slot number
//! of [`SLOT_BITS`] bits owned by the upgrade layer (0 = none): which connection, and which
//! generation of its slot (`crate::slots`).
//!
//! Ordering with the kernel's fd table: an entry is *cleared before* the real `close` (so a
//! thread that gets the same fd number from `socket` right after the close cannot have its new
//! entry wiped by a late clear) and *set after* the real call that creates the fd. Entries are
//! published with `Release` and read with `Acquire` so that an object the upgrade layer
//! publishes through the slot is visible to whoever reads the entry.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

/// log2 of the chunk length.
pub const CHUNK_BITS: u32 = 12;
/// Entries per chunk (32 KiB of entries).
pub const CHUNK_LEN: usize = 1 << CHUNK_BITS;
/// Chunks in the top array.
pub const TOP_LEN: usize = 1 << 14;
/// First fd that is never tracked (64 Mi; Linux's default `nr_open` is 1 Mi).
pub const MAX_FDS: usize = CHUNK_LEN * TOP_LEN;
const CHUNK_BYTES: usize = CHUNK_LEN * core::mem::size_of::<AtomicU64>();

/// What the shim knows about an fd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Nothing recorded (not a socket the shim saw being created, or closed).
    Unknown = 0,
    /// A socket the shim saw that can never be upgraded (AF_UNIX, UDP, ...).
    Other = 1,
    /// An AF_INET/AF_INET6 SOCK_STREAM TCP socket (created, connecting, connected or accepted).
    TcpCandidate = 2,
    /// A TCP socket after a successful `listen`.
    Listening = 3,
    /// A TCP connection whose bytes flow over RDMA (set by the upgrade layer; unused so far).
    Upgraded = 4,
    /// A descriptor of the shim's own (or of the RDMA libraries it drives): one the program
    /// never opened, and would not have without the shim. Its `close` by the program fails
    /// with EBADF and leaves it open, as it would on a kernel where it does not exist.
    Private = 5,
}

impl Kind {
    fn from_bits(b: u8) -> Kind {
        match b {
            1 => Kind::Other,
            2 => Kind::TcpCandidate,
            3 => Kind::Listening,
            4 => Kind::Upgraded,
            5 => Kind::Private,
            _ => Kind::Unknown,
        }
    }
}

/// Per-fd flags (16 bits).
pub mod flags {
    /// A non-blocking `connect` is in progress (EINPROGRESS) and has not been seen completing.
    pub const CONNECTING: u32 = 1 << 0;
    /// The connection has been counted in the connection stats (exactly once per connection).
    pub const COUNTED: u32 = 1 << 1;
    /// The fd came from `accept`/`accept4`.
    pub const ACCEPTED: u32 = 1 << 2;
    /// O_NONBLOCK as last set through a hooked call (SOCK_NONBLOCK, accept4, fcntl F_SETFL,
    /// ioctl FIONBIO). Note that O_NONBLOCK belongs to the open file description, which
    /// `dup`'ed fds share; the flag is copied on dup but not propagated afterwards.
    pub const NONBLOCK: u32 = 1 << 3;
    /// AF_INET6 socket.
    pub const V6: u32 = 1 << 4;
    /// FD_CLOEXEC as last set through a hooked call.
    pub const CLOEXEC: u32 = 1 << 5;
    /// A listening socket with an rdma_cm listener beside it.
    pub const RDMA_LISTENER: u32 = 1 << 6;
    /// The socket was added to an epoll set before it was connected: its upgrade is not
    /// attempted (the registration predates the shim's knowledge of the connection).
    pub const EPOLLED: u32 = 1 << 7;
    /// An epoll fd (closing it forgets the upgrade's registrations in it).
    pub const EPOLL_FD: u32 = 1 << 8;
    /// A listening socket whose `listen` a hook saw (here, or in the parent before a fork), or
    /// one found listening that its first accept has looked at already: not one to adopt
    /// (`hooks::conn::adopt_listener`).
    pub const LISTEN_SEEN: u32 = 1 << 9;
}

/// Connections under the upgrade that are alive in this process. While it is zero, readiness
/// hooks pass straight through on their fast path.
pub static UPGRADE_CONNS: AtomicUsize = AtomicUsize::new(0);

/// Whether no connection is under the upgrade (the readiness hooks' fast-path condition).
#[inline(always)]
pub fn no_upgrades() -> bool {
    UPGRADE_CONNS.load(Ordering::Relaxed) == 0
}

/// Bits of an entry's slot number.
pub const SLOT_BITS: u32 = 40;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;
const FLAG_MASK: u32 = 0xffff;

/// One fd's state, packed in a `u64`.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct FdEntry(u64);

impl core::fmt::Debug for FdEntry {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "FdEntry({:?}, flags={:#x}, slot={})",
            self.kind(),
            self.flags(),
            self.slot()
        )
    }
}

impl FdEntry {
    pub const UNKNOWN: FdEntry = FdEntry(0);

    pub const fn new(kind: Kind, flags: u32, slot: u64) -> FdEntry {
        FdEntry(kind as u64 | (((flags & FLAG_MASK) as u64) << 8) | ((slot & SLOT_MASK) << 24))
    }
    pub const fn from_raw(v: u64) -> FdEntry {
        FdEntry(v)
    }
    pub const fn raw(self) -> u64 {
        self.0
    }
    pub fn kind(self) -> Kind {
        Kind::from_bits(self.0 as u8)
    }
    pub const fn flags(self) -> u32 {
        ((self.0 >> 8) as u32) & FLAG_MASK
    }
    pub const fn slot(self) -> u64 {
        self.0 >> 24
    }
    pub const fn has(self, f: u32) -> bool {
        self.flags() & f == f
    }
    pub const fn is_unknown(self) -> bool {
        self.0 == 0
    }
    /// A TCP candidate with no pending connect: its I/O only needs its bytes counted (the
    /// hooks' fast path). Upgraded fds and pending connects take the slow path.
    #[inline(always)]
    pub const fn is_settled_tcp(self) -> bool {
        self.0 & (0xff | ((flags::CONNECTING as u64) << 8)) == Kind::TcpCandidate as u64
    }
    /// An entry whose close only clears it: a TCP candidate with no pending connect (a
    /// connection that stays on TCP, or a socket not connected yet), or a socket that is
    /// neither TCP nor an epoll fd. Nothing else of the shim's refers to such an fd.
    #[inline(always)]
    pub const fn close_only_clears(self) -> bool {
        self.is_settled_tcp() || (self.0 as u8 == Kind::Other as u8 && !self.has(flags::EPOLL_FD))
    }
    /// A TCP connection whose bytes the shim counts (candidate or upgraded).
    #[inline(always)]
    pub const fn is_tcp_stream(self) -> bool {
        // As `matches!(self.kind(), TcpCandidate | Upgraded)`, on the raw byte.
        matches!(self.0 as u8, 2 | 4)
    }
    pub fn with_kind(self, k: Kind) -> FdEntry {
        FdEntry((self.0 & !0xff) | k as u64)
    }
    pub const fn with_flags(self, f: u32) -> FdEntry {
        FdEntry(self.0 | (((f & FLAG_MASK) as u64) << 8))
    }
    pub const fn without_flags(self, f: u32) -> FdEntry {
        FdEntry(self.0 & !(((f & FLAG_MASK) as u64) << 8))
    }
    pub const fn with_slot(self, slot: u64) -> FdEntry {
        FdEntry((self.0 & 0x00ff_ffff) | ((slot & SLOT_MASK) << 24))
    }
}

/// The table. Use the process-wide [`TABLE`].
pub struct FdTable {
    /// Chunk 0, always present. `top[0]` stays null.
    first: [AtomicU64; CHUNK_LEN],
    /// Set before the first non-UNKNOWN store into chunk 0: until then [`FdTable::for_each`]
    /// skips it (the exit sweep of a program without sockets costs nothing).
    first_used: AtomicBool,
    /// 1 + the highest `top` index ever published: [`FdTable::for_each`] looks no further (the
    /// exit sweep does not scan 16 Ki null pointers).
    top_end: AtomicUsize,
    top: [AtomicPtr<AtomicU64>; TOP_LEN],
}

/// The process-wide fd table.
pub static TABLE: FdTable = FdTable::new();

#[inline(always)]
fn split(fd: i32) -> Option<(usize, usize)> {
    let fd = usize::try_from(fd).ok()?;
    if fd >= MAX_FDS {
        return None;
    }
    Some((fd >> CHUNK_BITS, fd & (CHUNK_LEN - 1)))
}

impl Default for FdTable {
    fn default() -> Self {
        Self::new()
    }
}

impl FdTable {
    pub const fn new() -> FdTable {
        FdTable {
            first: [const { AtomicU64::new(0) }; CHUNK_LEN],
            first_used: AtomicBool::new(false),
            top_end: AtomicUsize::new(1),
            top: [const { AtomicPtr::new(core::ptr::null_mut()) }; TOP_LEN],
        }
    }

    /// The entry cell of `fd` if its chunk exists.
    #[inline(always)]
    fn cell(&self, fd: i32) -> Option<&AtomicU64> {
        // Negative fds become >= 2^31, past chunk 0 (and past MAX_FDS in `split`).
        if let Some(c) = self.first.get(fd as u32 as usize) {
            return Some(c);
        }
        self.cell_upper(fd)
    }

    /// The entry cell of `fd >= CHUNK_LEN` if its chunk exists.
    #[inline]
    fn cell_upper(&self, fd: i32) -> Option<&AtomicU64> {
        let (hi, lo) = split(fd)?;
        let chunk = self.top.get(hi)?.load(Ordering::Acquire);
        if chunk.is_null() {
            return None;
        }
        // SAFETY: a non-null chunk pointer was published (Release, in `cell_alloc`) after
        // mapping CHUNK_LEN zeroed AtomicU64s, which are never unmapped; lo < CHUNK_LEN.
        Some(unsafe { &*chunk.add(lo) })
    }

    /// The entry cell of `fd`, mapping its chunk if needed. `None` if out of range or mmap fails.
    fn cell_alloc(&self, fd: i32) -> Option<&AtomicU64> {
        if let Some(c) = self.cell(fd) {
            return Some(c);
        }
        let (hi, _) = split(fd)?;
        let top = self.top.get(hi)?;
        let fresh = crate::sys::map_zeroed(CHUNK_BYTES)? as *mut AtomicU64;
        if let Err(_winner) = top.compare_exchange(
            core::ptr::null_mut(),
            fresh,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            // SAFETY: `fresh` came from map_zeroed(CHUNK_BYTES) and was never published.
            unsafe { crate::sys::unmap(fresh as *mut u8, CHUNK_BYTES) };
        } else {
            self.top_end.fetch_max(hi + 1, Ordering::AcqRel);
        }
        self.cell(fd)
    }

    /// The entry of `fd` (UNKNOWN if never set, cleared, or out of range).
    #[inline(always)]
    pub fn get(&self, fd: i32) -> FdEntry {
        // Chunk 0 first, as its own load (the hooks' fast path: one compare, one load).
        if let Some(c) = self.first.get(fd as u32 as usize) {
            return FdEntry(c.load(Ordering::Acquire));
        }
        match self.cell_upper(fd) {
            Some(c) => FdEntry(c.load(Ordering::Acquire)),
            None => FdEntry::UNKNOWN,
        }
    }

    /// Stores the entry of `fd`. Storing UNKNOWN never allocates. Returns false if the entry
    /// could not be stored (fd out of range, or no memory for the chunk).
    pub fn set(&self, fd: i32, e: FdEntry) -> bool {
        self.swap(fd, e).is_some() || e.is_unknown()
    }

    /// [`set`](Self::set) for a number the kernel has just given out: returns the entry it
    /// replaced, which is UNKNOWN unless the close of the number's previous file was never
    /// seen (the caller deals with that). UNKNOWN too if the entry could not be stored.
    pub fn set_new(&self, fd: i32, e: FdEntry) -> FdEntry {
        self.swap(fd, e).unwrap_or(FdEntry::UNKNOWN)
    }

    /// Stores the entry of `fd` and returns the one it replaced; `None` if it could not be
    /// stored (fd out of range, or no memory for the chunk). Storing UNKNOWN never allocates.
    fn swap(&self, fd: i32, e: FdEntry) -> Option<FdEntry> {
        let cell = if e.is_unknown() {
            self.cell(fd)
        } else {
            self.cell_alloc(fd)
        };
        cell.map(|c| {
            if !e.is_unknown() {
                self.mark_used(fd);
            }
            FdEntry(c.swap(e.0, Ordering::AcqRel))
        })
    }

    /// Notes that chunk 0 holds (or is about to hold) a non-UNKNOWN entry, if `fd` is in it.
    #[inline]
    fn mark_used(&self, fd: i32) {
        if (fd as u32 as usize) < CHUNK_LEN && !self.first_used.load(Ordering::Relaxed) {
            self.first_used.store(true, Ordering::Release);
        }
    }

    /// Clears the entry of `fd` and returns what it was.
    #[inline]
    pub fn take(&self, fd: i32) -> FdEntry {
        match self.cell(fd) {
            Some(c) => FdEntry(c.swap(0, Ordering::AcqRel)),
            None => FdEntry::UNKNOWN,
        }
    }

    /// Clears the entry of `fd` if it is still `e`; returns whether it did.
    pub fn take_if(&self, fd: i32, e: FdEntry) -> bool {
        self.cell(fd).is_some_and(|c| {
            c.compare_exchange(e.0, 0, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        })
    }

    /// Atomically replaces the entry with `f(old)` unless `f` returns `None` (compare-and-swap
    /// loop). Returns `(old, new)` if it changed. Never allocates (a missing chunk means UNKNOWN,
    /// which `f` sees).
    pub fn update(
        &self,
        fd: i32,
        mut f: impl FnMut(FdEntry) -> Option<FdEntry>,
    ) -> Option<(FdEntry, FdEntry)> {
        let c = self.cell(fd)?;
        let mut cur = c.load(Ordering::Acquire);
        loop {
            let new = f(FdEntry(cur))?;
            if !new.is_unknown() {
                self.mark_used(fd);
            }
            match c.compare_exchange_weak(cur, new.0, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some((FdEntry(cur), new)),
                Err(actual) => cur = actual,
            }
        }
    }

    /// Marks `fd`, just opened by the shim for itself, [`Kind::Private`] (an entry the program
    /// made for that number, which cannot be a live one of its own, is left alone).
    pub fn mark_private(&self, fd: i32) {
        if self.get(fd).is_unknown() {
            self.set(fd, FdEntry::new(Kind::Private, 0, 0));
        }
    }

    /// Clears the [`Kind::Private`] mark of `fd`, which the shim is about to close.
    pub fn unmark_private(&self, fd: i32) {
        self.update(fd, |e| {
            (e.kind() == Kind::Private).then_some(FdEntry::UNKNOWN)
        });
    }

    /// Sets `flag` on a known entry; returns true if this call set it (it was clear before).
    /// The "exactly once" primitive: of many racing callers, exactly one gets true.
    pub fn claim_flag(&self, fd: i32, flag: u32) -> bool {
        self.update(fd, |e| {
            (!e.is_unknown() && !e.has(flag)).then(|| e.with_flags(flag))
        })
        .is_some()
    }

    /// How many descriptors with `first <= fd <= last` are the shim's own ([`Kind::Private`]).
    pub fn count_private(&self, first: u32, last: u32) -> u64 {
        let mut n = 0;
        self.for_each(first, last, |_, e| {
            if e.kind() == Kind::Private {
                n += 1;
            }
        });
        n
    }

    /// Calls `f(fd, entry)` for every non-UNKNOWN entry with `first <= fd <= last`, visiting
    /// only allocated chunks.
    pub fn for_each(&self, first: u32, last: u32, mut f: impl FnMut(i32, FdEntry)) {
        let last = (last as usize).min(MAX_FDS - 1);
        let first = first as usize;
        if first > last {
            return;
        }
        let hi_last = (last >> CHUNK_BITS).min(self.top_end.load(Ordering::Acquire) - 1);
        for hi in (first >> CHUNK_BITS)..=hi_last {
            let chunk: &[AtomicU64] = if hi == 0 {
                if !self.first_used.load(Ordering::Acquire) {
                    continue;
                }
                &self.first
            } else {
                let Some(top) = self.top.get(hi) else { break };
                let p = top.load(Ordering::Acquire);
                if p.is_null() {
                    continue;
                }
                // SAFETY: a non-null chunk pointer was published (Release, in `cell_alloc`)
                // after mapping CHUNK_LEN zeroed AtomicU64s, which are never unmapped.
                unsafe { core::slice::from_raw_parts(p, CHUNK_LEN) }
            };
            let lo_start = if hi == first >> CHUNK_BITS {
                first & (CHUNK_LEN - 1)
            } else {
                0
            };
            let lo_end = if hi == last >> CHUNK_BITS {
                last & (CHUNK_LEN - 1)
            } else {
                CHUNK_LEN - 1
            };
            let base = (hi << CHUNK_BITS) | lo_start;
            let cells = chunk.get(lo_start..=lo_end).unwrap_or(&[]);
            for (i, c) in cells.iter().enumerate() {
                let v = c.load(Ordering::Acquire);
                if v != 0 {
                    f((base + i) as i32, FdEntry(v));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    fn table() -> &'static FdTable {
        Box::leak(Box::new(FdTable::new()))
    }

    #[test]
    fn entry_packing() {
        let e = FdEntry::new(Kind::Listening, flags::NONBLOCK | flags::V6, 0xab_dead_beef);
        assert_eq!(e.kind(), Kind::Listening);
        assert!(e.has(flags::NONBLOCK) && e.has(flags::V6) && !e.has(flags::COUNTED));
        assert_eq!(e.slot(), 0xab_dead_beef);
        let e2 = e
            .with_kind(Kind::TcpCandidate)
            .without_flags(flags::V6)
            .with_flags(flags::COUNTED);
        assert_eq!(e2.kind(), Kind::TcpCandidate);
        assert_eq!(e2.flags(), flags::NONBLOCK | flags::COUNTED);
        assert_eq!(e2.slot(), 0xab_dead_beef);
        assert_eq!(
            e2.with_slot(u64::MAX).slot(),
            (1 << SLOT_BITS) - 1,
            "40 bits"
        );
        assert_eq!(e2.with_slot(u64::MAX).flags(), e2.flags());
        assert_eq!(e2.with_slot(7).slot(), 7);
        assert!(FdEntry::UNKNOWN.is_unknown());
        assert!(
            FdEntry::new(Kind::TcpCandidate, flags::COUNTED | flags::NONBLOCK, 9).is_settled_tcp()
        );
        assert!(!FdEntry::new(Kind::TcpCandidate, flags::CONNECTING, 0).is_settled_tcp());
        assert!(!FdEntry::new(Kind::Upgraded, 0, 0).is_settled_tcp());
        assert!(!FdEntry::new(Kind::Listening, 0, 0).is_settled_tcp());
        assert!(!FdEntry::UNKNOWN.is_settled_tcp());
        for raw in 0..=255u64 {
            let e = FdEntry::from_raw(raw | (0xabc << 8));
            assert_eq!(
                e.is_tcp_stream(),
                matches!(e.kind(), Kind::TcpCandidate | Kind::Upgraded),
                "{raw}"
            );
        }
        assert_eq!(FdEntry::new(Kind::Unknown, 0, 0), FdEntry::UNKNOWN);
    }

    #[test]
    fn basic_and_bounds() {
        let t = table();
        assert_eq!(t.get(5), FdEntry::UNKNOWN);
        assert!(t.set(5, FdEntry::UNKNOWN)); // no chunk allocated for UNKNOWN
        assert!(t.top[0].load(Ordering::Relaxed).is_null());
        let e = FdEntry::new(Kind::TcpCandidate, 0, 0);
        assert!(t.set(5, e));
        assert_eq!(t.get(5), e);
        assert_eq!(t.take(5), e);
        assert_eq!(t.get(5), FdEntry::UNKNOWN);
        assert_eq!(t.take(5), FdEntry::UNKNOWN);
        assert!(!t.set(-1, e));
        assert!(!t.set(MAX_FDS as i32, e));
        assert_eq!(t.get(-1), FdEntry::UNKNOWN);
        assert_eq!(t.get(i32::MAX), FdEntry::UNKNOWN);
        assert!(t.set(MAX_FDS as i32 - 1, e));
        assert_eq!(t.get(MAX_FDS as i32 - 1), e);
        assert!(
            t.update(20_000, |_| Some(e)).is_none(),
            "no chunk: nothing to update"
        );
        assert_eq!(t.update(9, |_| Some(e)), Some((FdEntry::UNKNOWN, e)));
        assert_eq!(t.update(9, |_| None), None);
    }

    #[test]
    fn for_each_ranges() {
        let t = table();
        let fds = [0, 1, 4095, 4096, 4097, 100_000, 2_000_000];
        for fd in fds {
            t.set(fd, FdEntry::new(Kind::Other, 0, fd as u64));
        }
        let mut seen = vec![];
        t.for_each(0, u32::MAX, |fd, e| {
            assert_eq!(e.slot(), fd as u64);
            seen.push(fd)
        });
        assert_eq!(seen, fds);
        let mut mid = vec![];
        t.for_each(1, 4096, |fd, _| mid.push(fd));
        assert_eq!(mid, [1, 4095, 4096]);
        let mut none = vec![];
        t.for_each(5, 4, |fd, _| none.push(fd));
        assert!(none.is_empty());
    }

    #[test]
    fn concurrent_chunk_allocation_and_disjoint_fds() {
        let t = table();
        let threads = 16;
        let per = 2000;
        let hs: Vec<_> = (0..threads)
            .map(|i| {
                std::thread::spawn(move || {
                    for r in 0..20 {
                        for k in 0..per {
                            // Interleaved fds: every thread writes into the same fresh chunks.
                            let fd = k * threads + i + 50_000;
                            let e = FdEntry::new(Kind::TcpCandidate, 0, (i * 1_000_000 + r) as u64);
                            assert!(t.set(fd, e));
                            assert_eq!(t.get(fd), e);
                            if r % 2 == 1 {
                                assert_eq!(t.take(fd), e);
                            }
                        }
                    }
                })
            })
            .collect();
        hs.into_iter().for_each(|h| h.join().unwrap());
        let mut n = 0;
        t.for_each(0, u32::MAX, |_, _| n += 1);
        assert_eq!(n, 0, "every entry was taken in the last (odd) round");
    }

    #[test]
    fn claim_flag_exactly_once() {
        let t = table();
        for round in 0..50 {
            let fd = 7 + round;
            t.set(fd, FdEntry::new(Kind::TcpCandidate, flags::CONNECTING, 0));
            let winners = Arc::new(AtomicUsize::new(0));
            let hs: Vec<_> = (0..8)
                .map(|_| {
                    let w = winners.clone();
                    std::thread::spawn(move || {
                        if t.claim_flag(fd, flags::COUNTED) {
                            w.fetch_add(1, Ordering::Relaxed);
                        }
                    })
                })
                .collect();
            hs.into_iter().for_each(|h| h.join().unwrap());
            assert_eq!(winners.load(Ordering::Relaxed), 1);
            assert!(t.get(fd).has(flags::COUNTED | flags::CONNECTING));
        }
        // Never on an unknown entry.
        assert!(!t.claim_flag(3000, flags::COUNTED));
        assert!(t.get(3000).is_unknown());
    }

    #[test]
    fn readers_never_see_torn_or_foreign_entries() {
        // Writers cycle an fd through states while readers check every value they see is one
        // of the values some writer stored.
        let t = table();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let valid = |e: FdEntry| {
            e.is_unknown() || (e.kind() == Kind::TcpCandidate && e.slot() == u64::from(e.flags()))
        };
        let writers: Vec<_> = (0..4)
            .map(|i| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut k = 0u32;
                    while !stop.load(Ordering::Relaxed) {
                        let f = (k + i) & 0xff;
                        t.set(11, FdEntry::new(Kind::TcpCandidate, f, u64::from(f)));
                        t.take(11);
                        k = k.wrapping_add(1);
                    }
                })
            })
            .collect();
        for _ in 0..200_000 {
            assert!(valid(t.get(11)));
        }
        stop.store(true, Ordering::Relaxed);
        writers.into_iter().for_each(|h| h.join().unwrap());
    }
}
