//! The real libc functions, resolved with `dlsym(RTLD_NEXT, name)`, each by the first call of
//! its hook (whether that happens before or after our constructor, e.g. from another library's
//! constructor). Not pre-resolved by the constructor: see init.rs for the start-up measurement.
//!
//! `dlsym` may allocate, and an allocator may call a hooked function (`read` of a /proc file
//! by jemalloc's init, say). A hook reached while its own thread is inside `dlsym` gets `None`
//! here and uses its raw-syscall fallback: no recursion, no lock.
#![allow(unsafe_code)]

use crate::guard;
use crate::hook::Hook;
use std::sync::atomic::{AtomicUsize, Ordering};

/// 0 = not resolved yet; ABSENT = libc has no such symbol; else the address.
const ABSENT: usize = 1;

static REAL: [AtomicUsize; Hook::COUNT] = [const { AtomicUsize::new(0) }; Hook::COUNT];

/// The real function behind `hook`.
///
/// # Safety
/// `F` must be the `unsafe extern "C" fn` pointer type of the C prototype of `hook`'s symbol.
#[inline(always)]
pub unsafe fn get<F: Copy>(hook: Hook) -> Option<F> {
    const { assert!(core::mem::size_of::<F>() == core::mem::size_of::<usize>()) };
    let cell = REAL.get(hook as usize)?;
    // Acquire pairs with the Release store in `resolve` (the address itself is of code mapped
    // before any thread could call us, so Relaxed would do; Acquire is free on x86).
    let mut a = cell.load(Ordering::Acquire);
    if a == 0 {
        a = resolve(hook, cell);
    }
    if a <= ABSENT {
        return None;
    }
    // SAFETY: `a` is the address dlsym returned for this symbol, and the caller guarantees `F`
    // is a function pointer type of its prototype (size checked above).
    Some(unsafe { core::mem::transmute_copy::<usize, F>(&a) })
}

/// The real function behind `hook` if it is already resolved: one relaxed load, never calls
/// `dlsym` (the hooks' fast path; the slow path resolves).
///
/// # Safety
/// As [`get`].
#[inline(always)]
pub unsafe fn get_resolved<F: Copy>(hook: Hook) -> Option<F> {
    const { assert!(core::mem::size_of::<F>() == core::mem::size_of::<usize>()) };
    // Relaxed: the value is the address of code mapped before any thread could call us (see
    // `get`); a hook that sees 0 takes the slow path, which resolves with Acquire/Release.
    let a = REAL.get(hook as usize)?.load(Ordering::Relaxed);
    if a <= ABSENT {
        return None;
    }
    // SAFETY: as in `get`: a resolved address of this symbol, `F` its prototype.
    Some(unsafe { core::mem::transmute_copy::<usize, F>(&a) })
}

/// The real function behind `hook`, known to be resolved: one load, no check.
///
/// # Safety
/// As [`get`], and [`get_resolved`] (or `get`) must have returned `Some` for `hook` before:
/// a cell, once resolved to an address, never changes again (racing resolvers store the same
/// address; nothing resets it).
#[inline(always)]
pub unsafe fn get_known<F: Copy>(hook: Hook) -> F {
    const { assert!(core::mem::size_of::<F>() == core::mem::size_of::<usize>()) };
    let a = REAL
        .get(hook as usize)
        .map_or(0, |c| c.load(Ordering::Relaxed));
    debug_assert!(a > ABSENT);
    // SAFETY: per the contract, `a` is the resolved address of this symbol, `F` its prototype.
    unsafe { core::mem::transmute_copy::<usize, F>(&a) }
}

#[cold]
#[inline(never)]
fn resolve(hook: Hook, cell: &AtomicUsize) -> usize {
    let Some(_resolving) = guard::Resolving::enter() else {
        // Re-entered from inside dlsym on this thread: the caller falls back to a syscall.
        return 0;
    };
    // SAFETY: c_name is a NUL-terminated static string; RTLD_NEXT finds the next definition
    // after this library in the lookup order (libc's).
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, hook.c_name().as_ptr().cast()) };
    let v = if p.is_null() { ABSENT } else { p as usize };
    cell.store(v, Ordering::Release);
    v
}
