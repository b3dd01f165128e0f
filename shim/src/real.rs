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
