//! Per-thread shim state without destructors: the reentrancy guard, the "resolving a real
//! function" flag and the thread's stats shard, packed into one `const`-initialised
//! `thread_local!` `Cell<u32>` (no allocation, no destructor registration, one TLS access).
//!
//! The reentrancy guard is set only around the shim's own work that may call back into hooked
//! functions (logging, the host probe's `dlopen`, writing stats). It is *never* held across the
//! application's real call, so a signal handler that runs while a hook blocks in `read` still
//! sees a normal hook.
//!
//! The hooks' fast path (see `hooks/mod.rs`) reads no TLS at all: it checks one process-wide
//! word, [`GATE`], which is zero unless the shim is poisoned or some thread is inside a
//! [`Section`] (logging, the host probe, writing stats: rare and short). While it is non-zero
//! every hook takes the slow path, whose per-thread check keeps "calls made by the shim itself
//! pass through uncounted" exact.

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

const IN_SHIM: u32 = 1 << 31;
const RESOLVING: u32 = 1 << 30;
/// One of the shim's own threads (the engine, a setup thread): see [`internal_thread`].
const INTERNAL: u32 = 1 << 29;
const SHARD_MASK: u32 = 0xffff;
/// The thread's shard is its own ([`Cx::owned`]).
const OWN: u32 = 1 << 28;

/// How many threads get a stats shard of their own: the first this many to reach a hook's
/// slow path (a shard is never given back — no TLS destructor says when a thread ends — so
/// a process that keeps making threads shares shards among the later ones).
pub const OWNED_SHARDS: u32 = 64;

thread_local! {
    static TLS: Cell<u32> = const { Cell::new(0) };
}

/// Bit of [`GATE`] set when a hook body panicked: from then on every hook passes straight
/// through.
const GATE_POISONED: u32 = 1 << 31;
/// `GATE_POISONED` | the number of threads currently inside a [`Section`]. Zero almost always.
static GATE: AtomicU32 = AtomicU32::new(0);
static NEXT_SHARD: AtomicU32 = AtomicU32::new(0);

#[inline(always)]
fn load() -> u32 {
    // `try_with` only fails after the TLS slot is destroyed, which never happens for a
    // destructor-less const-initialised slot; treat it as "inside the shim" (pass through).
    TLS.try_with(|c| c.get()).unwrap_or(IN_SHIM | RESOLVING)
}

#[inline(always)]
fn store(v: u32) {
    let _ = TLS.try_with(|c| c.set(v));
}

/// Whether a hook must pass straight through without any bookkeeping: the call comes from the
/// shim itself, or the shim is poisoned.
#[inline(always)]
pub fn bypass() -> bool {
    load() & IN_SHIM != 0 || poisoned()
}

/// Whether a hook may take its TLS-free fast path: the shim is not poisoned and no thread is
/// inside a [`Section`]. One relaxed load of a read-mostly word. A thread that entered a
/// section sees its own increment (program order); other threads may see a stale value, which
/// only decides whether *their* (application) calls take the fast or the slow path, and both
/// count them.
#[inline(always)]
pub fn fast_ok() -> bool {
    GATE.load(Relaxed) == 0
}

/// Marks the shim as broken (a hook body panicked): every later call passes through untouched.
pub fn poison() {
    GATE.fetch_or(GATE_POISONED, Relaxed);
}

pub fn poisoned() -> bool {
    GATE.load(Relaxed) & GATE_POISONED != 0
}

/// In the child of a fork: only the forking thread exists, so the section count is this
/// thread's own (0 or 1); the poison bit is inherited.
pub fn after_fork_child() {
    let mine = u32::from(load() & IN_SHIM != 0);
    GATE.store((GATE.load(Relaxed) & GATE_POISONED) | mine, Relaxed);
}

/// Marks the calling thread (the engine) as shim-internal for good: the hooks' slow paths pass
/// its calls straight through. Unlike a [`Section`] it does not close the fast path of other
/// threads: the fast paths it may still take only pass through fds the table does not track
/// as upgraded (the engine's own calls on its own fds), at the cost of being counted.
pub fn mark_internal_thread() {
    store(load() | IN_SHIM | INTERNAL);
}

/// Whether the calling thread is one of the shim's own ([`mark_internal_thread`]), not an
/// application's thread inside a [`Section`].
pub fn internal_thread() -> bool {
    load() & INTERNAL != 0
}

/// RAII: the current thread is running shim-internal code; hooks it reaches pass through.
pub struct Section {
    was_set: bool,
}

impl Section {
    pub fn enter() -> Self {
        let v = load();
        let was_set = v & IN_SHIM != 0;
        if !was_set {
            store(v | IN_SHIM);
            GATE.fetch_add(1, Relaxed);
        }
        Section { was_set }
    }
}

impl Drop for Section {
    fn drop(&mut self) {
        if !self.was_set {
            store(load() & !IN_SHIM);
            GATE.fetch_sub(1, Relaxed);
        }
    }
}

/// RAII: the current thread is resolving a real function with `dlsym`.
pub struct Resolving(());

impl Resolving {
    /// `None` if this thread is already resolving (a hook reached from inside `dlsym`, e.g.
    /// through a custom allocator): the caller must then use its raw-syscall fallback.
    pub fn enter() -> Option<Self> {
        let v = load();
        if v & RESOLVING != 0 {
            return None;
        }
        store(v | RESOLVING);
        Some(Resolving(()))
    }
}

impl Drop for Resolving {
    fn drop(&mut self) {
        store(load() & !RESOLVING);
    }
}

/// What a hook learns from its one TLS access: this thread's stats shard, and whether the
/// thread owns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cx {
    shard: u32,
    own: bool,
}

impl Cx {
    /// This thread's stats shard, in `0..n`.
    #[inline(always)]
    pub fn shard(self, n: usize) -> usize {
        self.shard as usize % n.max(1)
    }

    /// Whether no other thread counts on this thread's shard: its shard number is below
    /// [`OWNED_SHARDS`] and was given to this thread alone.
    #[inline(always)]
    pub fn owned(self) -> bool {
        self.own
    }

    /// The context of the current thread (one TLS access), for callers outside a hook.
    pub fn current() -> Cx {
        cx_from(load())
    }
}

#[inline(always)]
fn cx_from(v: u32) -> Cx {
    let s = v & SHARD_MASK;
    if s != 0 {
        return Cx {
            shard: s - 1,
            own: v & OWN != 0,
        };
    }
    // Shards are handed out in turn at a thread's first hook: the first OWNED_SHARDS
    // threads each own one; later ones share, round-robin. (A fork child's one thread keeps
    // its own; the counter is not reset, so the child's new threads never take a number a
    // parent's thread had.)
    let n = NEXT_SHARD.fetch_add(1, Relaxed);
    let own = n < OWNED_SHARDS;
    let s = n % (SHARD_MASK - 1) + 1;
    store(v | s | if own { OWN } else { 0 });
    Cx { shard: s - 1, own }
}

/// Hook entry: `None` if the hook must pass straight through (see [`bypass`]), else the
/// thread's context. One TLS access.
#[inline(always)]
pub fn hook_entry() -> Option<Cx> {
    let v = load();
    if v & IN_SHIM != 0 || poisoned() {
        return None;
    }
    Some(cx_from(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn section_nests() {
        assert!(!bypass());
        {
            let _a = Section::enter();
            assert!(bypass());
            assert!(!fast_ok());
            {
                let _b = Section::enter();
                assert!(bypass());
            }
            assert!(bypass());
            assert!(!fast_ok());
        }
        assert!(!bypass());
    }

    #[test]
    fn resolving_is_exclusive() {
        let r = Resolving::enter();
        assert!(r.is_some());
        assert!(Resolving::enter().is_none());
        drop(r);
        assert!(Resolving::enter().is_some());
    }

    #[test]
    fn shard_is_stable() {
        let a = hook_entry().unwrap().shard(16);
        assert_eq!(a, Cx::current().shard(16));
        assert!(a < 16);
        let _s = Section::enter();
        assert!(hook_entry().is_none());
    }

    #[test]
    fn the_first_threads_own_their_shards_and_no_two_the_same() {
        // (other tests' threads take numbers too: enough threads that some share)
        let cxs: Vec<Cx> = (0..2 * OWNED_SHARDS)
            .map(|_| std::thread::spawn(Cx::current).join().unwrap())
            .collect();
        let owned: Vec<usize> = cxs
            .iter()
            .filter(|c| c.owned())
            .map(|c| c.shard(usize::MAX))
            .collect();
        assert!(cxs.iter().any(|c| !c.owned()), "later threads share");
        let mut seen = std::collections::HashSet::new();
        for s in &owned {
            assert!(
                *s < OWNED_SHARDS as usize,
                "an owned shard is one of the owned array's"
            );
            assert!(seen.insert(*s), "shard {s} owned twice");
        }
        // (a thread keeps what it was given)
        let c = Cx::current();
        assert_eq!(c, Cx::current());
    }
}
