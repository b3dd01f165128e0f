//! Every `extern "C"` entry point of the library.
//!
//! Data-path and readiness hooks start with a TLS-free fast path (see [`hook!`]'s `fast:`
//! clause): real function (one load), the guard gate (one load), the fd's table entry, the call
//! counter, then a tail call to the real function — or, on a settled TCP candidate, the real
//! call and its byte count. Everything else takes the slow path, the full wrapper: (1) gets the
//! real function (or, if unresolvable right now, a raw-syscall fallback); (2) if the call comes
//! from the shim itself or the shim is poisoned, calls the real function directly; (3) counts
//! the call; (4) runs its logic, which returns an [`Outcome`](crate::outcome::Outcome), inside
//! `catch_unwind`; (5) converts the outcome with `Outcome::into_ret` — the one place errno is
//! set by the shim.
//!
//! The pass-through path allocates nothing, takes no lock, formats nothing and leaves errno to
//! the real function.
#![allow(unsafe_code)]

use crate::outcome::{CRet, Errno, Outcome};

mod conn;
mod fd;
mod fortify;
mod io;
mod passing;
mod poll;
mod process;
mod socket;
mod stdio;
mod syscall;
mod up;

pub(crate) use conn::{after_fork_child, keep_activated_syns, sweep_pending_connects};
pub(crate) use process::PID;

/// Runs hook `h`'s logic. A panic poisons the shim (every later call passes through to the
/// kernel) after every connection not on plain TCP was reset (`upgrade::fail_all`: the
/// program's next call on one gets ECONNRESET from the kernel), and fails this call: a data
/// call with ECONNRESET, as on a reset TCP connection, any other with EIO. Never lets a panic
/// cross the `extern "C"` boundary (docs/shim.md, "When the shim itself fails").
#[inline(always)]
fn run<T>(h: crate::hook::Hook, f: impl FnOnce() -> Outcome<T>) -> Outcome<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(o) => o,
        Err(_) => {
            on_panic(h);
            Outcome::Fail(panic_errno(h))
        }
    }
}

/// The error of a hook call whose logic panicked (see [`run`]).
fn panic_errno(h: crate::hook::Hook) -> Errno {
    use crate::hook::Hook::*;
    match h {
        Read | Write | Readv | Writev | Recv | Recvfrom | Recvmsg | Recvmmsg | Send | Sendto
        | Sendmsg | Sendmmsg | Sendfile | Sendfile64 | Splice | ReadChk | RecvChk | RecvfromChk => {
            Errno::ECONNRESET
        }
        _ => Errno::EIO,
    }
}

#[cold]
#[inline(never)]
fn on_panic(h: crate::hook::Hook) {
    crate::upgrade::failed_by_panic(h.name());
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
///     pre: check(count, buflen);                      // optional: runs first, on every path
///     fast: io(fd, TcpRx);                            // optional: the TLS-free fast path
///     |real, cx| { ...logic returning Outcome<ssize_t>... }   // cx: the thread's guard::Cx
/// }
/// ```
/// The exported function is the fast path; everything else is the nested `slow` function,
/// reached by a tail call. Fast paths (each needs the real function already resolved and
/// [`guard::fast_ok`](crate::guard::fast_ok), i.e. no thread inside the shim's own code and not
/// poisoned; otherwise the slow path decides):
/// - `always(shard)`: the logic is pure pass-through: count the call, tail-call the real function.
/// - `when(cond, shard)`: pure pass-through while `cond` holds (the readiness hooks: while no
///   connection is under the upgrade).
/// - `unknown(fd)`: pass-through when the fd table knows nothing about `fd`.
/// - `not_tcp(fd)`: pass-through when `fd` is not a TCP stream (what the logic would do).
/// - `io(fd, Bytes)`: as `not_tcp`, and on a settled TCP candidate (no pending connect) the real
///   call is made and its byte count added, in a second small function (`tcp`), so that the
///   pass-through route stays a frame-less tail call.
/// - `not_tcp_unless(cond, fd)`, `io_unless(cond, fd, Bytes)`: as `not_tcp` and `io` while
///   `cond` is false (the message hooks: while the message can pass no descriptor the shim
///   must look at, see `passing`).
///
/// A fast path calls nothing that can panic (no indexing, no unwrap) and does nothing that can
/// change errno; the slow path is the original wrapper (guard, `catch_unwind`, Outcome).
macro_rules! hook {
    (
        $(#[$attr:meta])*
        fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty ;
        id: $id:ident ;
        fallback: $kind:ident $( ( $nr:ident ; $($farg:expr),* ) )? ;
        $( pre: $pre:expr ; )?
        $( fast: $fast:ident $fargs:tt ; )?
        |$real:ident, $cx:ident| $body:block
    ) => {
        $(#[$attr])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            type Real = unsafe extern "C" fn($($ty),*) -> $ret;

            /// The full wrapper: resolution, guard, counting, the logic under `catch_unwind`.
            #[inline(never)]
            unsafe extern "C" fn slow($($arg: $ty),*) -> $ret {
                // SAFETY: `Real` is this symbol's C prototype (the one this function has).
                let Some($real) = (unsafe { crate::real::get::<Real>(crate::hook::Hook::$id) }) else {
                    return hook!(@fallback $ret, $kind $( ($nr; $($farg),*) )?);
                };
                let Some($cx) = crate::guard::hook_entry() else {
                    // SAFETY: the caller's arguments, unchanged, to the real function.
                    return unsafe { $real($($arg),*) };
                };
                crate::stats::count_call($cx, crate::hook::Hook::$id);
                let outcome: crate::outcome::Outcome<$ret> = crate::hooks::run(crate::hook::Hook::$id, move || $body);
                // SAFETY: the caller's arguments, unchanged, to the real function.
                outcome.into_ret(|| unsafe { $real($($arg),*) }, crate::sys::set_errno)
            }

            $( $pre; )?
            hook!(@maybe_fast [$($fast $fargs)?], $id, $ret, ($($arg : $ty),*));
            // SAFETY: the caller's arguments, unchanged, to the full wrapper of this hook.
            unsafe { slow($($arg),*) }
        }
    };
    (@maybe_fast [], $id:ident, $ret:ty, $sig:tt) => {};
    (@maybe_fast [$fast:ident ($($fa:tt)*)], $id:ident, $ret:ty, $sig:tt) => {
        hook!(@fast $fast, $id, $ret, $sig, $($fa)*);
    };
    (@fast always, $id:ident, $ret:ty, ($($arg:ident : $ty:ty),*), $shard:expr) => {
        // SAFETY: `Real` is this symbol's C prototype.
        if let Some(real) = unsafe { crate::real::get_resolved::<Real>(crate::hook::Hook::$id) } {
            if crate::guard::fast_ok() {
                crate::stats::count_call_at($shard, crate::hook::Hook::$id);
                // SAFETY: the caller's arguments, unchanged, to the real function.
                return unsafe { real($($arg),*) };
            }
        }
    };
    (@fast when, $id:ident, $ret:ty, ($($arg:ident : $ty:ty),*), $cond:expr, $shard:expr) => {
        // SAFETY: `Real` is this symbol's C prototype.
        if let Some(real) = unsafe { crate::real::get_resolved::<Real>(crate::hook::Hook::$id) } {
            if crate::guard::fast_ok() && $cond {
                crate::stats::count_call_at($shard, crate::hook::Hook::$id);
                // SAFETY: the caller's arguments, unchanged, to the real function.
                return unsafe { real($($arg),*) };
            }
        }
    };
    (@fast unknown, $id:ident, $ret:ty, ($($arg:ident : $ty:ty),*), $fd:expr) => {
        // SAFETY: `Real` is this symbol's C prototype.
        if let Some(real) = unsafe { crate::real::get_resolved::<Real>(crate::hook::Hook::$id) } {
            if crate::guard::fast_ok() && crate::fdtable::TABLE.get($fd).is_unknown() {
                crate::stats::count_call_at(crate::stats::fd_shard($fd), crate::hook::Hook::$id);
                // SAFETY: the caller's arguments, unchanged, to the real function.
                return unsafe { real($($arg),*) };
            }
        }
    };
    (@fast not_tcp, $id:ident, $ret:ty, ($($arg:ident : $ty:ty),*), $fd:expr) => {
        hook!(@fast not_tcp_unless, $id, $ret, ($($arg : $ty),*), false, $fd);
    };
    (@fast not_tcp_unless, $id:ident, $ret:ty, ($($arg:ident : $ty:ty),*), $cond:expr, $fd:expr) => {
        // SAFETY: `Real` is this symbol's C prototype.
        if let Some(real) = unsafe { crate::real::get_resolved::<Real>(crate::hook::Hook::$id) } {
            if crate::guard::fast_ok() && !$cond && !crate::fdtable::TABLE.get($fd).is_tcp_stream() {
                crate::stats::count_call_at(crate::stats::fd_shard($fd), crate::hook::Hook::$id);
                // SAFETY: the caller's arguments, unchanged, to the real function.
                return unsafe { real($($arg),*) };
            }
        }
    };
    (@fast io, $id:ident, $ret:ty, ($($arg:ident : $ty:ty),*), $fd:expr, $dir:ident) => {
        hook!(@fast io_unless, $id, $ret, ($($arg : $ty),*), false, $fd, $dir);
    };
    (@fast io_unless, $id:ident, $ret:ty, ($($arg:ident : $ty:ty),*), $cond:expr, $fd:expr, $dir:ident) => {
        /// A settled TCP candidate: the real call, then its bytes (no errno change: only
        /// atomic adds follow the real call).
        ///
        /// # Safety
        /// The real function of this hook must be resolved (the caller saw it).
        #[inline(never)]
        unsafe extern "C" fn tcp($($arg: $ty),*) -> $ret {
            // SAFETY: `Real` is this symbol's C prototype, and the caller saw it resolved.
            let real = unsafe { crate::real::get_known::<Real>(crate::hook::Hook::$id) };
            let shard = crate::stats::shard_at(crate::stats::fd_shard($fd));
            shard.count_call(crate::hook::Hook::$id);
            // SAFETY: the caller's arguments, unchanged, to the real function.
            let n = unsafe { real($($arg),*) };
            if n > 0 {
                shard.add_bytes(crate::stats::Bytes::$dir, n as u64);
            }
            n
        }
        // SAFETY: `Real` is this symbol's C prototype.
        if let Some(real) = unsafe { crate::real::get_resolved::<Real>(crate::hook::Hook::$id) } {
            if crate::guard::fast_ok() && !$cond {
                let e = crate::fdtable::TABLE.get($fd);
                if e.is_settled_tcp() {
                    // SAFETY: the caller's arguments, unchanged; `real` is resolved.
                    return unsafe { tcp($($arg),*) };
                }
                if !e.is_tcp_stream() {
                    crate::stats::count_call_at(crate::stats::fd_shard($fd), crate::hook::Hook::$id);
                    // SAFETY: the caller's arguments, unchanged, to the real function.
                    return unsafe { real($($arg),*) };
                }
            }
        }
    };
    (@fallback $ret:ty, syscall ($nr:ident; $($farg:expr),*)) => {
        // SAFETY: the raw system call behind this libc wrapper, with the caller's arguments.
        (unsafe { rdmashim_core::raw_syscall!(libc::$nr, $($farg),*) }) as $ret
    };
    (@fallback $ret:ty, void_syscall ($nr:ident; $($farg:expr),*)) => {
        // SAFETY: the raw system call behind this libc wrapper, with the caller's arguments.
        { unsafe { rdmashim_core::raw_syscall!(libc::$nr, $($farg),*) }; }
    };
    (@fallback $ret:ty, enosys) => {
        crate::hooks::enosys::<$ret>()
    };
}
pub(crate) use hook;
