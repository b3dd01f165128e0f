//! The live view: this process's counters and connections in a small file-backed shared
//! mapping (`RUN_DIR/PID.live`, layout in [`crate::live_layout`]), kept while the process
//! runs, so that `rdmashim ss` / `rdmashim stats` can look at a running process, and the last
//! figures of one killed by a signal survive it.
//!
//! Where the figures come from: the hooks keep counting in the process's own memory
//! (`stats.rs`' shards: the pass-through path is unchanged, not one instruction more); this
//! module copies them into the file — a *publish* — at the events of a connection (made,
//! upgraded, fallen back, switched back, closed; at most every [`PUBLISH_MS`]), on the
//! upgrade engine's tick while it has connections (about once a second, with each one's bytes),
//! and at exit and exec. The listed connections are written at their events.
//!
//! Made lazily, at the process's first TCP connection (a process that never has one — every
//! process of a shell pipeline — makes no file and pays nothing), in the first directory of
//! [`crate::settings::run_dirs`] it may write to. A process that cannot make it (a read-only
//! or full file system, a sandbox, a worker that dropped root) has no live view, says so in one
//! warning line of the shim's log, and is otherwise undisturbed. Removed at a normal exit
//! (and before an exec: the new image makes its own); left by a process killed by a signal,
//! for `rdmashim ss` to show as dead and `rdmashim ss --clean` to remove.
//!
//! errno is preserved by every entry point (the file's system calls are made on the
//! application's threads, in hooks' slow paths).
//!
//! All the state is behind one spin lock taken with a bounded number of tries (a writer that
//! cannot get it skips its update: the live view is best effort, and a hook called from a
//! signal handler that interrupted a writer must not wait for it). A fork child resets the
//! lock, leaves the parent's mapping (unmapped in the child, untouched in the parent), and
//! makes its own file at its first connection event, starting with the connections it
//! inherited ([`after_fork_child`]).
#![allow(unsafe_code)]

use crate::config::{self, Level};
use crate::fmtbuf::FixedBuf;
use crate::hook::Hook;
use crate::live_layout as lay;
use crate::reason::FallbackReason;
use crate::stats::{self, Bytes, Snapshot, Wait};
use crate::{shim_log, sys};
use core::cell::UnsafeCell;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};

/// The shortest time between two publishes made at connection events.
pub const PUBLISH_MS: u64 = 100;

/// Where the live view stands in this process.
const UNTRIED: u8 = 0;
const ON: u8 = 1;
const OFF: u8 = 2;
static STATUS: AtomicU8 = AtomicU8::new(UNTRIED);
static LOCK: AtomicBool = AtomicBool::new(false);
static LAST_PUBLISH_MS: AtomicU64 = AtomicU64::new(0);
/// A fork child holds connections its parent listed, for the file it has not made yet
/// ([`State::pending`]).
static PENDING: AtomicBool = AtomicBool::new(false);
/// An event's counters were left for later ([`PUBLISH_MS`]): the engine's tick publishes
/// them ([`dirty`]).
static DIRTY: AtomicBool = AtomicBool::new(false);

struct State {
    /// The mapping ([`lay::FILE_LEN`] bytes), null when there is none.
    map: *mut u8,
    /// The directory it is in.
    dir: FixedBuf<4096>,
    /// Connection slots ever used in this file: the ones a lookup scans (all 256 would cost
    /// a process of a few connections ~1000 instructions per event).
    hi: usize,
    /// In a fork child without a file yet: the connection slots its parent listed, which it
    /// inherited; they go into its file when it makes one.
    pending: Vec<[u8; lay::CONN_LEN]>,
}

struct Cell(UnsafeCell<State>);
// SAFETY: the state is only reached through `with`, under LOCK.
unsafe impl Sync for Cell {}

static STATE: Cell = Cell(UnsafeCell::new(State {
    map: core::ptr::null_mut(),
    dir: FixedBuf::new(),
    hi: 0,
    pending: Vec::new(),
}));

struct Held;
impl Drop for Held {
    fn drop(&mut self) {
        LOCK.store(false, Ordering::Release);
    }
}

/// Runs `f` on the state under the lock; `None` if the lock could not be had after a bounded
/// wait (another thread, or the thread this signal handler interrupted, is writing).
fn with<R>(f: impl FnOnce(&mut State) -> R) -> Option<R> {
    let mut tries = 0u32;
    while LOCK
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        tries += 1;
        if tries > 2000 {
            return None;
        }
        if tries > 100 {
            std::thread::yield_now();
        } else {
            core::hint::spin_loop();
        }
    }
    let _held = Held;
    // SAFETY: LOCK is held: nobody else reaches the state until `_held` is dropped.
    Some(f(unsafe { &mut *STATE.0.get() }))
}

impl State {
    /// The mapping's bytes, if there is one.
    fn bytes(&mut self) -> Option<&mut [u8]> {
        if self.map.is_null() {
            return None;
        }
        // SAFETY: `map` is a live shared mapping of FILE_LEN bytes (made by
        // `sys::create_shared_file`, unmapped only with the lock held and `map` nulled); the lock
        // makes this the only reference in this process (other processes only read it).
        Some(unsafe { core::slice::from_raw_parts_mut(self.map, lay::FILE_LEN) })
    }

    /// Runs `f` on the bytes (and the slots in use) inside an update: the sequence is odd
    /// meanwhile, for readers.
    fn update(&mut self, f: impl FnOnce(&mut [u8], &mut usize)) {
        let mut hi = self.hi;
        if let Some(b) = self.bytes() {
            let seq = lay::get_u64(b, lay::SEQ_OFF).unwrap_or(0) | 1;
            lay::put_u64(b, lay::SEQ_OFF, seq);
            core::sync::atomic::fence(Ordering::Release);
            f(b, &mut hi);
            core::sync::atomic::fence(Ordering::Release);
            lay::put_u64(b, lay::SEQ_OFF, seq.wrapping_add(1));
        }
        self.hi = hi;
    }
}

/// The counters as the file names them: group (index in [`lay::GROUPS`]) and name, in the
/// order of [`values`].
fn names() -> impl Iterator<Item = (usize, &'static str)> {
    let calls = Hook::ALL.iter().map(|h| (0, h.name()));
    let conns = ["upgraded", "switched_back", "path_failed", "fallback"].map(|n| (1, n));
    let reasons = FallbackReason::ALL.iter().map(|r| (2, r.name()));
    let bytes = Bytes::ALL.iter().map(|b| (3, b.name()));
    let waits = Wait::ALL.iter().map(|w| (4, w.name()));
    let rest = [
        (5, "log_dropped"),
        (6, "unproven_requests"),
        (7, "missed_closes"),
    ];
    calls
        .chain(conns)
        .chain(reasons)
        .chain(bytes)
        .chain(waits)
        .chain(rest)
}

/// The counters' values, in the order of [`names`].
fn values(s: &Snapshot) -> impl Iterator<Item = u64> + '_ {
    s.calls
        .iter()
        .copied()
        .chain([s.upgraded, s.switched_back, s.path_failed, s.fallback])
        .chain(s.reasons.iter().copied())
        .chain(s.bytes.iter().copied())
        .chain(s.waits.iter().copied())
        .chain([s.log_dropped, s.unproven_requests, s.missed_closes])
}

/// Whether this process may make its file now. Each reason not to is for good (until a fork
/// child looks again): the live view is then off, and the next event returns after one load.
fn allowed() -> bool {
    let c = config::get();
    let ok = c.live && !crate::log::silenced() && !crate::guard::poisoned();
    if !ok {
        let _ = STATUS.compare_exchange(UNTRIED, OFF, Ordering::AcqRel, Ordering::Relaxed);
    }
    ok
}

/// Makes the file (lock held). On failure: off for this process, one warning.
fn create(st: &mut State, inherited: &[[u8; lay::CONN_LEN]]) -> bool {
    let pid = sys::getpid();
    let (ppid, started_unix_ms) = stats::record_start();
    let mut exe = [0u8; 4096];
    let program = sys::program_name(&mut exe).unwrap_or(&[]);
    let id = lay::Identity {
        pid,
        ppid,
        started_unix_ms,
        proc_start_ticks: sys::proc_start_ticks(),
        program,
        version: stats::VERSION,
    };
    let mut name = FixedBuf::<32>::new();
    let _ = core::fmt::Write::write_fmt(&mut name, format_args!("{pid}.live"));
    let uid = sys::geteuid();
    let mut last: Option<(Vec<u8>, crate::outcome::Errno)> = None;
    for dir in crate::settings::run_dirs(config::get(), uid) {
        // (the last component only, for the owner alone; the system directory readable by all,
        // its files by their owners)
        let mode = if dir == crate::settings::SYSTEM_RUN_DIR.as_bytes() {
            0o755
        } else {
            0o700
        };
        let made = sys::make_dir(&dir, mode)
            .and_then(|_| sys::own_dir(&dir))
            .and_then(|_| {
                sys::create_shared_file(&dir, name.as_bytes(), lay::FILE_LEN, |b| {
                    // (the counters from zero: the event that made the file publishes them)
                    lay::init(b, &id, names());
                    lay::put_u64(b, lay::HEARTBEAT_OFF, sys::unix_ms());
                    for (i, raw) in inherited.iter().take(lay::CONNS).enumerate() {
                        lay::put_conn_raw(b, i, raw);
                    }
                })
            });
        match made {
            Ok(p) => {
                st.map = p;
                st.hi = inherited.len().min(lay::CONNS);
                LAST_PUBLISH_MS.store(0, Ordering::Relaxed);
                st.dir.clear();
                st.dir.push_bytes(&dir);
                STATUS.store(ON, Ordering::Release);
                return true;
            }
            Err(e) => last = Some((dir, e)),
        }
    }
    STATUS.store(OFF, Ordering::Release);
    if let Some((dir, e)) = last {
        shim_log!(
            Level::Warn,
            "no live view for this process: cannot make {}/{pid}.live: {e} ({} names the directory, {}=0 turns this off)",
            String::from_utf8_lossy(&dir),
            config::ENV_RUN_DIR,
            config::ENV_LIVE
        );
    }
    false
}

/// Whether an event that does not list a connection has anything to do: a file, or a fork
/// child's inherited connections that need one.
fn active() -> bool {
    STATUS.load(Ordering::Relaxed) == ON || PENDING.load(Ordering::Relaxed)
}

/// Whether the state has its mapping, made now if this process has none yet and may: for an
/// event that lists a connection (`listing`), or one in a fork child that inherited listed
/// connections (they go into the file).
fn ready(st: &mut State, listing: bool) -> bool {
    if !st.map.is_null() {
        return true;
    }
    if STATUS.load(Ordering::Acquire) != UNTRIED || (!listing && st.pending.is_empty()) {
        return false;
    }
    let pending = core::mem::take(&mut st.pending);
    PENDING.store(false, Ordering::Relaxed);
    allowed() && create(st, &pending)
}

/// The state with its mapping, made first if this process has none yet (and may).
fn with_map(f: impl FnOnce(&mut State)) {
    match STATUS.load(Ordering::Acquire) {
        OFF => return,
        UNTRIED if !allowed() => return,
        _ => {}
    }
    let _e = sys::ErrnoGuard::save();
    with(|st| {
        if ready(st, true) {
            f(st);
        }
    });
}

/// The slot that lists `fd` among the `hi` used so far, or with `free_ok` a free one (`hi`
/// grows if it must; `None`: the table is full).
fn slot_of(b: &[u8], fd: i32, free_ok: bool, hi: &mut usize) -> Option<usize> {
    let mut free = None;
    for i in 0..(*hi).min(lay::CONNS) {
        match lay::conn_slot(b, i) {
            Some((true, f)) if f == fd => return Some(i),
            Some((false, _)) if free.is_none() => free = Some(i),
            _ => {}
        }
    }
    if !free_ok {
        return None;
    }
    free.or_else(|| {
        (*hi < lay::CONNS).then(|| {
            *hi += 1;
            *hi - 1
        })
    })
}

/// The slot listing the connection `local` → `peer` at `fd`: not the slot of a connection that
/// took the number over after this one's fd was closed (this one may still be decided, or
/// publish its bytes, seconds later).
fn slot_of_conn(
    b: &[u8],
    fd: i32,
    (local, peer): (SocketAddr, SocketAddr),
    hi: &mut usize,
) -> Option<usize> {
    slot_of(b, fd, false, hi).filter(|&i| lay::conn_is(b, i, local, peer))
}

fn publish_counters(b: &mut [u8]) {
    DIRTY.store(false, Ordering::Relaxed);
    let snap = Snapshot::take(0);
    lay::set_counters(b, values(&snap));
    lay::put_u64(b, lay::HEARTBEAT_OFF, sys::unix_ms());
}

/// After a connection event: the counters too, unless they were published within
/// [`PUBLISH_MS`].
fn maybe_counters(b: &mut [u8]) {
    let now = crate::net::coarse_ms();
    if now >= LAST_PUBLISH_MS.load(Ordering::Relaxed) + PUBLISH_MS {
        LAST_PUBLISH_MS.store(now, Ordering::Relaxed);
        publish_counters(b);
    } else {
        DIRTY.store(true, Ordering::Relaxed);
    }
}

/// Whether the counters of an event were left for later: the upgrade engine, if the
/// process has one, publishes them within a second even when it has no connection left (the
/// last close of a transfer comes right after the engine's last publish).
pub fn dirty() -> bool {
    DIRTY.load(Ordering::Relaxed) && STATUS.load(Ordering::Relaxed) == ON
}

fn list(fd: i32, c: lay::Conn) {
    with_map(|st| {
        st.update(|b, hi| {
            if let Some(i) = slot_of(b, fd, true, hi) {
                lay::put_conn(b, i, &c);
            }
            maybe_counters(b);
        })
    });
}

/// A connection that stays on plain TCP, counted with `reason` (`conn::account`): listed with
/// its addresses (two system calls, made only while the live view is on).
#[inline]
pub fn tcp_conn(fd: i32, reason: FallbackReason) {
    // (a process without a live view pays one load per connection)
    if STATUS.load(Ordering::Relaxed) != OFF {
        list_tcp(fd, reason);
    }
}

#[inline(never)]
fn list_tcp(fd: i32, reason: FallbackReason) {
    if STATUS.load(Ordering::Relaxed) == UNTRIED && !allowed() {
        return;
    }
    let _e = sys::ErrnoGuard::save();
    let e = crate::fdtable::TABLE.get(fd);
    list(
        fd,
        lay::Conn {
            fd,
            via: lay::Via::Tcp,
            state: lay::ConnState::Tcp,
            client: Some(!e.has(crate::fdtable::flags::ACCEPTED)),
            local: crate::net::local_addr(fd),
            peer: crate::net::peer_addr(fd),
            tx: None,
            rx: None,
            since_unix_ms: sys::unix_ms(),
            reason: reason.name().into(),
        },
    );
}

/// A connection under the upgrade (its bytes counted by the upgrade from now on).
pub fn upgrade_conn(fd: i32, local: SocketAddr, peer: SocketAddr, client: bool) {
    match STATUS.load(Ordering::Relaxed) {
        OFF => return,
        UNTRIED if !allowed() => return,
        _ => {}
    }
    list(
        fd,
        lay::Conn {
            fd,
            via: lay::Via::Tcp,
            state: lay::ConnState::Upgrading,
            client: Some(client),
            local: Some(local),
            peer: Some(peer),
            tx: Some(0),
            rx: Some(0),
            since_unix_ms: sys::unix_ms(),
            reason: "".into(),
        },
    );
}

/// The connection `local` → `peer` listed at `fd` changed: on the rings of `transport`, back
/// on TCP (`reason` if it fell back), or switched back. Nothing changes if `fd` lists another
/// connection now: one decided after its fd was closed (a server's accepted connection whose
/// client never asked for the upgrade is decided seconds later) must not mark the connection
/// that took the number over.
pub fn conn_state(
    fd: i32,
    addrs: (SocketAddr, SocketAddr),
    via: lay::Via,
    state: lay::ConnState,
    reason: Option<FallbackReason>,
) {
    if !active() {
        return;
    }
    let _e = sys::ErrnoGuard::save();
    with(|st| {
        if !ready(st, false) {
            return;
        }
        st.update(|b, hi| {
            if let Some(i) = slot_of_conn(b, fd, addrs, hi) {
                lay::set_conn_state(b, i, via, state);
                if let Some(r) = reason {
                    lay::set_reason(b, i, r.name());
                    // (its bytes go past the upgrade from now on: not counted)
                    lay::set_conn_bytes(b, i, u64::MAX, u64::MAX);
                }
            }
            maybe_counters(b);
        })
    });
}

/// The connection listed at `fd` is gone from it (closed, or the number reused).
pub fn conn_closed(fd: i32) {
    if !active() {
        return;
    }
    with(|st| {
        if st.map.is_null() {
            // (an inherited connection the child closes before it has a file: no file for it)
            st.pending
                .retain(|raw| lay::get_u32(raw, 4).map(|f| f as i32) != Some(fd));
            return;
        }
        st.update(|b, hi| {
            if let Some(i) = slot_of(b, fd, false, hi) {
                lay::clear_conn(b, i);
            }
            maybe_counters(b);
        })
    });
}

/// The engine's tick: the counters, and each connection's bytes (`conns`: fd, its local and
/// peer addresses, sent, received).
pub fn publish(conns: impl Iterator<Item = (i32, (SocketAddr, SocketAddr), u64, u64)>) {
    if !active() {
        return;
    }
    let _e = sys::ErrnoGuard::save();
    with(|st| {
        if !ready(st, false) {
            return;
        }
        st.update(|b, hi| {
            for (fd, addrs, tx, rx) in conns {
                if let Some(i) = slot_of_conn(b, fd, addrs, hi) {
                    lay::set_conn_bytes(b, i, tx, rx);
                }
            }
            LAST_PUBLISH_MS.store(crate::net::coarse_ms(), Ordering::Relaxed);
            publish_counters(b);
        })
    });
}

/// The record ends: at exit (the destructor, `_exit`) or before an exec. The last figures are
/// published and the file removed; the mapping stays (other threads may still be writing)
/// except before an exec, which is left with no mapping, so that an exec that fails makes a
/// new file at the next event.
pub fn end(exec: bool) {
    if STATUS.load(Ordering::Relaxed) != ON {
        return;
    }
    let _e = sys::ErrnoGuard::save();
    with(|st| {
        let state = if exec {
            lay::RecordState::Exec
        } else {
            lay::RecordState::Ended
        };
        st.update(|b, _| {
            publish_counters(b);
            lay::put_u32(b, lay::STATE_OFF, state as u32);
        });
        if !crate::log::silenced() {
            let mut name = FixedBuf::<32>::new();
            let _ = core::fmt::Write::write_fmt(&mut name, format_args!("{}.live", sys::getpid()));
            sys::remove_own_file(st.dir.as_bytes(), name.as_bytes());
        }
        if exec {
            // SAFETY: the mapping is ours; the lock is held and `map` nulled at once.
            unsafe { sys::unmap_shared(st.map, lay::FILE_LEN) };
            st.map = core::ptr::null_mut();
            STATUS.store(UNTRIED, Ordering::Release);
        } else {
            STATUS.store(OFF, Ordering::Release);
        }
    });
}

/// In a fork child (single-threaded): the parent's mapping is left (its file is the
/// parent's); the child makes its own file at its first event that concerns a connection —
/// one it makes or accepts, or one it inherited, whose listing the parent's file gave and the
/// child's starts with (byte counts from zero, as its counters). A child that only execs or
/// exits makes none: a file costs a fork child ~0.2 ms of CPU here (measured: tmpfs file,
/// fallocate, page faults), more than many fork + exec take.
pub fn after_fork_child() {
    LOCK.store(false, Ordering::Release);
    LAST_PUBLISH_MS.store(0, Ordering::Relaxed);
    PENDING.store(false, Ordering::Relaxed);
    let had = STATUS.load(Ordering::Acquire) == ON;
    with(|st| {
        let hi = st.hi;
        st.pending = match st.bytes() {
            Some(b) if had => (0..hi).filter_map(|i| lay::conn_raw(b, i)).collect(),
            _ => Vec::new(),
        };
        PENDING.store(!st.pending.is_empty(), Ordering::Relaxed);
        if !st.map.is_null() {
            // SAFETY: the child's copy of the parent's mapping; the lock is held and `map`
            // nulled at once (the parent's stays mapped in the parent).
            unsafe { sys::unmap_shared(st.map, lay::FILE_LEN) };
            st.map = core::ptr::null_mut();
        }
        STATUS.store(UNTRIED, Ordering::Release);
    });
}
