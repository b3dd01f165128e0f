//! Every `extern "C"` entry point of the library.
//!
//! Each hook: (1) gets the real function (or, if unresolvable right now, a raw-syscall
//! fallback); (2) if the call comes from the shim itself or the shim is poisoned, calls the real
//! function directly; (3) counts the call; (4) runs its logic, which returns an
//! [`Outcome`](crate::outcome::Outcome), inside `catch_unwind`; (5) converts the outcome with
//! `Outcome::into_ret` — the one place errno is set by the shim.
//!
//! The pass-through path allocates nothing, takes no lock, formats nothing and leaves errno to
//! the real function: the logic reads the fd table (two atomic loads) and returns `PassThrough`.
#![allow(unsafe_code)]

use crate::outcome::{CRet, Errno, Outcome};
use crate::shim_log;

mod conn;
mod fd;
mod fortify;
mod io;
mod poll;
mod process;
mod socket;

pub(crate) use conn::{sweep_pending_connects, PID};

/// Runs a hook's logic; a panic poisons the shim (every later call passes through) and fails
/// this call with EIO. Never lets a panic cross the `extern "C"` boundary.
#[inline(always)]
fn run<T>(f: impl FnOnce() -> Outcome<T>) -> Outcome<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(o) => o,
        Err(_) => {
            on_panic();
            Outcome::Fail(Errno::EIO)
        }
    }
}

#[cold]
#[inline(never)]
fn on_panic() {
    crate::guard::poison();
    let _ = std::panic::catch_unwind(|| {
        shim_log!(
            crate::config::Level::Error,
            "internal error (panic) in a hook; passing everything through from now on"
        )
    });
}

/// The failure value with errno ENOSYS (a fallback for functions without a syscall equivalent).
fn enosys<T: CRet>() -> T {
    crate::sys::set_errno(Errno::ENOSYS);
    T::FAILURE.unwrap_or_else(|| unreachable_void())
}

fn unreachable_void<T>() -> T {
    // Only `()` has no failure value, and `enosys::<()>` is never instantiated.
    std::process::abort()
}

/// Defines one hook. Syntax:
/// ```text
/// hook! {
///     fn read(fd: c_int, buf: *mut c_void, count: size_t) -> ssize_t;
///     id: Read;
///     fallback: syscall(SYS_read; fd, buf, count);   // or: enosys
///     |real, cx| { ...logic returning Outcome<ssize_t>... }   // cx: the thread's guard::Cx
/// }
/// ```
macro_rules! hook {
    (
        $(#[$attr:meta])*
        fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty ;
        id: $id:ident ;
        fallback: $kind:ident $( ( $nr:ident ; $($farg:expr),* ) )? ;
        |$real:ident, $cx:ident| $body:block
    ) => {
        $(#[$attr])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            type Real = unsafe extern "C" fn($($ty),*) -> $ret;
            // SAFETY: `Real` is this symbol's C prototype (the one this function has).
            let Some($real) = (unsafe { crate::real::get::<Real>(crate::hook::Hook::$id) }) else {
                return hook!(@fallback $ret, $kind $( ($nr; $($farg),*) )?);
            };
            let Some($cx) = crate::guard::hook_entry() else {
                // SAFETY: the caller's arguments, unchanged, to the real function.
                return unsafe { $real($($arg),*) };
            };
            crate::stats::count_call($cx, crate::hook::Hook::$id);
            let outcome: crate::outcome::Outcome<$ret> = crate::hooks::run(move || $body);
            // SAFETY: the caller's arguments, unchanged, to the real function.
            outcome.into_ret(|| unsafe { $real($($arg),*) }, crate::sys::set_errno)
        }
    };
    (@fallback $ret:ty, syscall ($nr:ident; $($farg:expr),*)) => {
        // SAFETY: the raw system call behind this libc wrapper, with the caller's arguments.
        (unsafe { libc::syscall(libc::$nr, $($farg),*) }) as $ret
    };
    (@fallback $ret:ty, void_syscall ($nr:ident; $($farg:expr),*)) => {
        // SAFETY: the raw system call behind this libc wrapper, with the caller's arguments.
        { unsafe { libc::syscall(libc::$nr, $($farg),*) }; }
    };
    (@fallback $ret:ty, enosys) => {
        crate::hooks::enosys::<$ret>()
    };
}
pub(crate) use hook;
