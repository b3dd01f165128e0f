//! Per-thread shim state without destructors: the reentrancy guard, the "resolving a real
//! function" flag and the thread's stats shard, packed into one `const`-initialised
//! `thread_local!` `Cell<u32>` (no allocation, no destructor registration, one TLS access).
//!
//! The reentrancy guard is set only around the shim's own work that may call back into hooked
//! functions (logging, the host probe's `dlopen`, writing stats). It is *never* held across the
//! application's real call, so a signal handler that runs while a hook blocks in `read` still
//! sees a normal hook.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};

const IN_SHIM: u32 = 1 << 31;
const RESOLVING: u32 = 1 << 30;
const SHARD_MASK: u32 = 0xffff;

thread_local! {
    static TLS: Cell<u32> = const { Cell::new(0) };
}

/// Set when a hook body panicked: from then on every hook passes straight through.
static POISONED: AtomicBool = AtomicBool::new(false);
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
    load() & IN_SHIM != 0 || POISONED.load(Relaxed)
}

/// Marks the shim as broken (a hook body panicked): every later call passes through untouched.
pub fn poison() {
    POISONED.store(true, Relaxed);
}

pub fn poisoned() -> bool {
    POISONED.load(Relaxed)
}

/// RAII: the current thread is running shim-internal code; hooks it reaches pass through.
pub struct Section {
    was_set: bool,
}

impl Section {
    pub fn enter() -> Self {
        let v = load();
        store(v | IN_SHIM);
        Section {
            was_set: v & IN_SHIM != 0,
        }
    }
}

impl Drop for Section {
    fn drop(&mut self) {
        if !self.was_set {
            store(load() & !IN_SHIM);
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

/// What a hook learns from its one TLS access: this thread's stats shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cx {
    shard: u32,
}

impl Cx {
    /// This thread's stats shard, in `0..n`.
    #[inline(always)]
    pub fn shard(self, n: usize) -> usize {
        self.shard as usize % n.max(1)
    }

    /// The context of the current thread (one TLS access), for callers outside a hook.
    pub fn current() -> Cx {
        cx_from(load())
    }
}

#[inline(always)]
fn cx_from(v: u32) -> Cx {
    let s = v & SHARD_MASK;
    let s = if s != 0 {
        s
    } else {
        // Shards are handed out round-robin at a thread's first hook.
        let s = NEXT_SHARD.fetch_add(1, Relaxed) % (SHARD_MASK - 1) + 1;
        store(v | s);
        s
    };
    Cx { shard: s - 1 }
}

/// Hook entry: `None` if the hook must pass straight through (see [`bypass`]), else the
/// thread's context. One TLS access.
#[inline(always)]
pub fn hook_entry() -> Option<Cx> {
    let v = load();
    if v & IN_SHIM != 0 || POISONED.load(Relaxed) {
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
            {
                let _b = Section::enter();
                assert!(bypass());
            }
            assert!(bypass());
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
}
