//! Fd life cycle: close, dup, dup2, dup3, close_range, closefrom, and the Rust halves of the
//! C-variadic fcntl/fcntl64/ioctl (csrc/variadic.c).

use super::conn;
use super::hook;
use crate::fdtable::{flags, FdEntry, Kind, TABLE};
use crate::hook::Hook;
use crate::outcome::Errno;
use crate::outcome::Outcome::{self, Fail, Handled, PassThrough};
use crate::{guard, stats, sys, track};
use core::ffi::{c_int, c_uint, c_ulong};

/// CLOSE_RANGE_CLOEXEC from <linux/close_range.h>.
const CLOSE_RANGE_CLOEXEC: c_int = 1 << 2;

hook! {
    /// close(2): the entry is cleared *before* the real close (see fdtable.rs), after resolving
    /// a pending connect. In a vfork child (shared memory, own fd table) the table is left alone,
    /// but for entries whose close only clears them.
    fn close(fd: c_int) -> c_int;
    id: Close;
    fallback: syscall(SYS_close; fd);
    fast: unknown(fd);
    |_real, _cx| {
        let e = TABLE.get(fd);
        if e.kind() == Kind::Private {
            // The shim's own (or its RDMA libraries'): on a kernel without the shim this number
            // is not open, and a daemon's close-all loop must not take it from a connection.
            return Fail(Errno::EBADF);
        }
        if e.close_only_clears() {
            // (no vfork check, which costs a getpid per close: a vfork child clearing such an
            // entry in the table it shares with its parent leaves the parent's fd unknown to
            // the shim, so that its I/O passes straight through, as a TCP connection's does
            // anyway, but is no longer counted in the stats; a connect classifies it again)
            TABLE.take(fd);
        } else if !e.is_unknown() && !super::process::in_foreign_child() {
            conn::forget(fd, e);
        }
        PassThrough
    }
}

/// The entry of `fd` about to be duplicated, with a pending connect resolved first.
fn entry_for_dup(fd: c_int) -> FdEntry {
    let e = TABLE.get(fd);
    if e.has(flags::CONNECTING) {
        conn::complete_if_connected(fd, e);
        return TABLE.get(fd);
    }
    e
}

hook! {
    /// dup(2): the new fd shares the socket; it gets a copy of the entry.
    fn dup(fd: c_int) -> c_int;
    id: Dup;
    fallback: syscall(SYS_dup; fd);
    fast: unknown(fd);
    |real, cx| {
        if TABLE.get(fd).kind() == Kind::Private {
            // (not open, on a kernel without the shim: see `close`)
            return Fail(Errno::EBADF);
        }
        if TABLE.get(fd).is_unknown() || super::process::in_foreign_child() {
            return PassThrough;
        }
        let e = entry_for_dup(fd);
        // SAFETY: the caller's arguments.
        let r = unsafe { real(fd) };
        if r >= 0 {
            conn::share(e, r);
            conn::set_new(r, track::dup_entry(e, false));
            if conn::is_stdio(r) {
                super::process::before_stdio(e, r);
            }
        }
        Handled(r)
    }
}

/// dup2/dup3 logic. `newfd` is implicitly closed by the kernel if open.
fn dup_onto(
    oldfd: c_int,
    newfd: c_int,
    cloexec: bool,
    call: impl FnOnce() -> c_int,
) -> Outcome<c_int> {
    if TABLE.get(oldfd).kind() == Kind::Private {
        // (not open, on a kernel without the shim: see `close`)
        return Fail(Errno::EBADF);
    }
    if oldfd == newfd {
        return PassThrough;
    }
    let en = TABLE.get(newfd);
    if TABLE.get(oldfd).is_unknown() && en.is_unknown() {
        return PassThrough;
    }
    if super::process::in_foreign_child() {
        return PassThrough;
    }
    if en.kind() == Kind::Private && crate::net::is_open(oldfd) {
        // The program puts a file at a number it believes free, one of the shim's: the call
        // cannot be refused (without the shim it would succeed), so the shim stops using its
        // descriptors first.
        super::process::before_private_replaced(newfd);
    }
    let eo = entry_for_dup(oldfd);
    if conn::is_stdio(newfd) {
        super::process::before_stdio(eo, oldfd);
    }
    if !en.is_unknown() {
        // The kernel closes newfd first.
        conn::forget(newfd, en);
    }
    let r = call();
    if r >= 0 {
        conn::share(eo, newfd);
        TABLE.set(newfd, track::dup_entry(eo, cloexec));
    }
    Handled(r)
}

hook! {
    /// dup2(2).
    fn dup2(oldfd: c_int, newfd: c_int) -> c_int;
    id: Dup2;
    fallback: syscall(SYS_dup2; oldfd, newfd);
    |real, cx| {
        // SAFETY: the caller's arguments.
        dup_onto(oldfd, newfd, false, || unsafe { real(oldfd, newfd) })
    }
}

hook! {
    /// dup3(2).
    fn dup3(oldfd: c_int, newfd: c_int, fl: c_int) -> c_int;
    id: Dup3;
    fallback: syscall(SYS_dup3; oldfd, newfd, fl);
    |real, cx| {
        if fl & !libc::O_CLOEXEC != 0 {
            // (EINVAL, nothing changes)
            return PassThrough;
        }
        // SAFETY: the caller's arguments.
        dup_onto(oldfd, newfd, fl & libc::O_CLOEXEC != 0, || unsafe { real(oldfd, newfd, fl) })
    }
}

/// close_range/closefrom: clear every tracked entry in the range first (the shim's own
/// descriptors excepted: see [`close_around_private`]).
fn forget_range(first: c_uint, last: c_uint, fl: c_int) {
    if fl & CLOSE_RANGE_CLOEXEC != 0 || first > last || super::process::in_foreign_child() {
        return;
    }
    TABLE.for_each(first, last, |fd, e| {
        if e.kind() != Kind::Private {
            conn::forget(fd, e);
        }
    });
}

/// close_range over `first..=last` that leaves the shim's own descriptors open (as `close`
/// does: on a kernel without the shim they are not there to close). `None` if there are none
/// in the range (the caller makes the one call itself); else the result of closing the gaps
/// between them, the first failure if any.
fn close_around_private(first: c_uint, last: c_uint, fl: c_int) -> Option<c_int> {
    if fl & CLOSE_RANGE_CLOEXEC != 0 || first > last {
        return None;
    }
    // (stack space for the private fds met in one sweep; more are taken in further sweeps)
    let mut private = [0 as c_uint; 64];
    let mut from = first;
    let mut any = false;
    let mut result = 0;
    loop {
        let mut n = 0;
        let mut more = false;
        TABLE.for_each(from, last, |fd, e| {
            if e.kind() == Kind::Private {
                if n < private.len() {
                    private[n] = fd as c_uint;
                    n += 1;
                } else {
                    more = true;
                }
            }
        });
        if n == 0 && !any {
            return None;
        }
        any = true;
        let mut lo = from;
        for &p in &private[..n] {
            if p > lo {
                result = result.min(crate::net::close_range(lo, p - 1, fl));
            }
            lo = p.saturating_add(1);
        }
        if !more || n == 0 {
            if lo <= last && (n == 0 || private[n - 1] < last) {
                result = result.min(crate::net::close_range(lo, last, fl));
            }
            return Some(result);
        }
        from = lo;
    }
}

hook! {
    /// close_range(2) (glibc 2.34+). With CLOSE_RANGE_CLOEXEC nothing is closed.
    fn close_range(first: c_uint, last: c_uint, fl: c_int) -> c_int;
    id: CloseRange;
    fallback: syscall(SYS_close_range; first, last, fl);
    |_real, _cx| {
        forget_range(first, last, fl);
        match close_around_private(first, last, fl) {
            Some(r) if r < 0 => Fail(sys::errno()),
            Some(r) => Handled(r),
            None => PassThrough,
        }
    }
}

hook! {
    /// closefrom(3) (glibc 2.34+).
    fn closefrom(lowfd: c_int) -> ();
    id: Closefrom;
    fallback: void_syscall(SYS_close_range; lowfd.max(0) as c_uint, c_uint::MAX, 0 as c_int);
    |_real, _cx| {
        let first = lowfd.max(0) as c_uint;
        forget_range(first, c_uint::MAX, 0);
        match close_around_private(first, c_uint::MAX, 0) {
            Some(_) => Handled(()),
            None => PassThrough,
        }
    }
}

type FcntlFn = unsafe extern "C" fn(c_int, c_int, ...) -> c_int;
type IoctlFn = unsafe extern "C" fn(c_int, c_ulong, ...) -> c_int;

fn fcntl_logic(real: FcntlFn, fd: c_int, cmd: c_int, arg: usize) -> Outcome<c_int> {
    let probe = matches!(
        cmd,
        libc::F_GETFD | libc::F_SETFD | libc::F_DUPFD | libc::F_DUPFD_CLOEXEC
    );
    if probe && TABLE.get(fd).kind() == Kind::Private {
        // A descriptor of the shim's, which the program did not open: on a kernel without the
        // shim that number is not open, and programs ask `F_GETFD` to learn whether it is
        // (bash saves and later restores a number it finds open before `exec 1000>file`).
        // (not `F_GETFL`/`F_SETFL`, which the RDMA libraries use on their own descriptors)
        return Fail(Errno::EBADF);
    }
    match cmd {
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => {
            if TABLE.get(fd).is_unknown() || super::process::in_foreign_child() {
                return PassThrough;
            }
            let e = entry_for_dup(fd);
            // SAFETY: the caller's arguments.
            let r = unsafe { real(fd, cmd, arg) };
            if r >= 0 {
                conn::share(e, r);
                conn::set_new(r, track::dup_entry(e, cmd == libc::F_DUPFD_CLOEXEC));
                if conn::is_stdio(r) {
                    super::process::before_stdio(e, r);
                }
            }
            Handled(r)
        }
        libc::F_SETFL | libc::F_SETFD => {
            if TABLE.get(fd).is_unknown() {
                return PassThrough;
            }
            // SAFETY: the caller's arguments.
            let r = unsafe { real(fd, cmd, arg) };
            if r == 0 {
                let (flag, on) = if cmd == libc::F_SETFL {
                    (flags::NONBLOCK, arg as c_int & libc::O_NONBLOCK != 0)
                } else {
                    (flags::CLOEXEC, arg as c_int & libc::FD_CLOEXEC != 0)
                };
                if cmd == libc::F_SETFL {
                    if let Some(c) = super::up::own_conn(fd) {
                        c.attrs.note_nonblocking(on);
                    }
                }
                TABLE.update(fd, |e| {
                    (!e.is_unknown()).then(|| {
                        if on {
                            e.with_flags(flag)
                        } else {
                            e.without_flags(flag)
                        }
                    })
                });
            }
            Handled(r)
        }
        _ => PassThrough,
    }
}

/// The Rust half of `fcntl`/`fcntl64` (csrc/variadic.c reads the optional argument per command).
/// `which`: 0 = fcntl, 1 = fcntl64.
///
/// # Safety
/// Called only from the C entry points with the application's arguments.
#[no_mangle]
pub unsafe extern "C" fn rdmashim_fcntl(fd: c_int, cmd: c_int, arg: usize, which: c_int) -> c_int {
    let id = if which == 1 {
        Hook::Fcntl64
    } else {
        Hook::Fcntl
    };
    // SAFETY: FcntlFn is the prototype of fcntl and fcntl64.
    let Some(real) = (unsafe { crate::real::get::<FcntlFn>(id) }) else {
        // SAFETY: the raw fcntl system call with the caller's arguments.
        return unsafe { rdmashim_core::raw_syscall!(libc::SYS_fcntl, fd, cmd, arg) } as c_int;
    };
    let Some(cx) = guard::hook_entry() else {
        // SAFETY: the caller's arguments, unchanged, to the real function.
        return unsafe { real(fd, cmd, arg) };
    };
    stats::count_call(cx, id);
    let outcome = super::run(id, move || fcntl_logic(real, fd, cmd, arg));
    // SAFETY: the caller's arguments, unchanged, to the real function.
    outcome.into_ret(|| unsafe { real(fd, cmd, arg) }, sys::set_errno)
}

fn ioctl_logic(real: IoctlFn, fd: c_int, req: c_ulong, arg: usize) -> Outcome<c_int> {
    if req == libc::FIONREAD {
        let super::up::Up::Conn(c) = super::up::of_fd(fd) else {
            return PassThrough;
        };
        if arg == 0 {
            return Outcome::Fail(crate::outcome::Errno(libc::EFAULT));
        }
        return match crate::upgrade::data::fionread(&c, fd) {
            Ok(n) => {
                // SAFETY: FIONREAD's argument points to an int (the application's).
                unsafe { (arg as *mut c_int).write_unaligned(n) };
                Handled(0)
            }
            Err(e) => Outcome::Fail(e),
        };
    }
    if req != libc::FIONBIO || TABLE.get(fd).is_unknown() {
        return PassThrough;
    }
    // SAFETY: the caller's arguments.
    let r = unsafe { real(fd, req, arg) };
    if r == 0 && arg != 0 {
        // SAFETY: FIONBIO succeeded, so arg points to a readable int.
        let on = unsafe { (arg as *const c_int).read_unaligned() } != 0;
        if let Some(c) = super::up::own_conn(fd) {
            c.attrs.note_nonblocking(on);
        }
        TABLE.update(fd, |e| {
            (!e.is_unknown()).then(|| {
                if on {
                    e.with_flags(flags::NONBLOCK)
                } else {
                    e.without_flags(flags::NONBLOCK)
                }
            })
        });
    }
    Handled(r)
}

/// The Rust half of `ioctl` (csrc/variadic.c).
///
/// # Safety
/// Called only from the C entry point with the application's arguments.
#[no_mangle]
pub unsafe extern "C" fn rdmashim_ioctl(fd: c_int, req: c_ulong, arg: usize) -> c_int {
    // SAFETY: IoctlFn is ioctl's prototype.
    let Some(real) = (unsafe { crate::real::get::<IoctlFn>(Hook::Ioctl) }) else {
        // SAFETY: the raw ioctl system call with the caller's arguments.
        return unsafe { rdmashim_core::raw_syscall!(libc::SYS_ioctl, fd, req, arg) } as c_int;
    };
    let Some(cx) = guard::hook_entry() else {
        // SAFETY: the caller's arguments, unchanged, to the real function.
        return unsafe { real(fd, req, arg) };
    };
    stats::count_call(cx, Hook::Ioctl);
    let outcome = super::run(Hook::Ioctl, move || ioctl_logic(real, fd, req, arg));
    // SAFETY: the caller's arguments, unchanged, to the real function.
    outcome.into_ret(|| unsafe { real(fd, req, arg) }, sys::set_errno)
}
