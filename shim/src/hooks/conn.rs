//! Connection accounting: which fds are TCP connections, when a connection is established, and
//! counting each one exactly once with its fallback reason. Uses the real functions directly
//! (never the hooks) and preserves errno.

use crate::fdtable::{flags, FdEntry, Kind, TABLE};
use crate::hook::Hook;
use crate::reason::{self, FallbackReason, PeerClass};
use crate::stats::{self, Bytes};
use crate::sys::ErrnoGuard;
use crate::{config::Level, probe, shim_log};
use core::ffi::{c_int, c_void};
use core::mem::{size_of, MaybeUninit};
use libc::{sockaddr, sockaddr_storage, socklen_t};
use std::sync::atomic::{AtomicU32, Ordering};

type GetpeernameFn = unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int;
type GetsockoptFn = unsafe extern "C" fn(c_int, c_int, c_int, *mut c_void, *mut socklen_t) -> c_int;

/// The pid the shim state belongs to (set by the constructor and the fork child handler).
pub(crate) static PID: AtomicU32 = AtomicU32::new(0);

/// Whether we run in a child that shares our memory but not our fd table (a `vfork` child, or a
/// `clone` child without CLONE_FILES): such a child must not change the fd table or write stats.
/// Costs one getpid(2); call it only where the table would change.
pub(crate) fn in_foreign_child() -> bool {
    let me = crate::sys::getpid();
    match PID.load(Ordering::Relaxed) {
        0 => {
            // Constructor not run yet: this is the process that loaded us.
            PID.store(me, Ordering::Relaxed);
            false
        }
        p => p != me,
    }
}

/// The peer address of `fd` (real getpeername), errno preserved.
fn peer(fd: c_int) -> Option<sockaddr_storage> {
    let _e = ErrnoGuard::save();
    // SAFETY: GetpeernameFn is getpeername's prototype.
    let real = unsafe { crate::real::get::<GetpeernameFn>(Hook::Getpeername) }?;
    let mut ss = MaybeUninit::<sockaddr_storage>::zeroed();
    let mut len = size_of::<sockaddr_storage>() as socklen_t;
    // SAFETY: ss/len are valid out-parameters of the declared size.
    let r = unsafe { real(fd, ss.as_mut_ptr().cast(), &mut len) };
    // SAFETY: zero-initialised, and getpeername filled at most `len` bytes of it.
    (r == 0).then(|| unsafe { ss.assume_init() })
}

fn class_of(ss: &sockaddr_storage) -> PeerClass {
    match c_int::from(ss.ss_family) {
        libc::AF_INET => {
            // SAFETY: family AF_INET means the storage holds a sockaddr_in.
            let sin = unsafe { &*(ss as *const sockaddr_storage).cast::<libc::sockaddr_in>() };
            reason::classify_v4(sin.sin_addr.s_addr.to_ne_bytes())
        }
        libc::AF_INET6 => {
            // SAFETY: family AF_INET6 means the storage holds a sockaddr_in6.
            let sin6 = unsafe { &*(ss as *const sockaddr_storage).cast::<libc::sockaddr_in6>() };
            reason::classify_v6(sin6.sin6_addr.s6_addr)
        }
        _ => PeerClass::Other,
    }
}

/// Counts the connection on `fd` (once: the first caller to set COUNTED does it).
pub(crate) fn account(fd: c_int) {
    let claimed = TABLE.update(fd, |e| {
        (e.is_tcp_stream() && !e.has(flags::COUNTED)).then(|| {
            e.with_flags(flags::COUNTED)
                .without_flags(flags::CONNECTING)
        })
    });
    if claimed.is_none() {
        return;
    }
    let _e = ErrnoGuard::save();
    let r: FallbackReason = match probe::host_reason() {
        Some(r) => r,
        None => reason::decide(None, peer(fd).as_ref().map_or(PeerClass::Other, class_of)),
    };
    stats::count_fallback(r);
    shim_log!(
        Level::Debug,
        "fd {fd}: connection stays on TCP ({})",
        r.name()
    );
}

/// If a non-blocking connect on `fd` is pending, checks whether it has completed (real
/// getpeername) and counts it if so.
pub(crate) fn complete_if_connected(fd: c_int, e: FdEntry) {
    if e.has(flags::CONNECTING) && !e.has(flags::COUNTED) && peer(fd).is_some() {
        account(fd);
    }
}

/// After an I/O call on a TCP fd returned `n`: byte counters, and a pending connect that data
/// moved on is established.
#[inline]
pub(crate) fn on_io(cx: crate::guard::Cx, fd: c_int, e: FdEntry, n: isize, dir: Bytes) {
    if n > 0 {
        stats::add_bytes(cx, dir, n as u64);
    }
    if n >= 0 && e.has(flags::CONNECTING) && !e.has(flags::COUNTED) {
        account(fd);
    }
}

/// The slow path of a data call on `fd` that moves bytes in direction `dir`: passes through
/// unless `fd` is a TCP stream; otherwise makes the call and accounts its result ([`on_io`]).
#[inline]
pub(crate) fn tcp_io(
    cx: crate::guard::Cx,
    fd: c_int,
    dir: Bytes,
    call: impl FnOnce() -> isize,
) -> crate::outcome::Outcome<isize> {
    let e = TABLE.get(fd);
    if !e.is_tcp_stream() {
        return crate::outcome::Outcome::PassThrough;
    }
    let n = call();
    on_io(cx, fd, e, n, dir);
    crate::outcome::Outcome::Handled(n)
}

/// The fd is about to be closed (close, dup2 target, close_range): resolve a pending connect,
/// then clear its entry. Not in a foreign child (see `in_foreign_child`).
pub(crate) fn forget(fd: c_int, e: FdEntry) {
    complete_if_connected(fd, e);
    TABLE.take(fd);
}

/// Classifies an fd the shim did not see being created (inherited, or created by a direct
/// syscall) with getsockopt(SO_DOMAIN/SO_TYPE/SO_PROTOCOL/SO_ACCEPTCONN), stores and returns the
/// entry. A connected TCP socket found this way is marked counted (it was not made by this
/// process image). Non-sockets stay UNKNOWN.
pub(crate) fn classify(fd: c_int) -> FdEntry {
    let _e = ErrnoGuard::save();
    // SAFETY: GetsockoptFn is getsockopt's prototype.
    let Some(real) = (unsafe { crate::real::get::<GetsockoptFn>(Hook::Getsockopt) }) else {
        return FdEntry::UNKNOWN;
    };
    let opt = |name: c_int| -> Option<c_int> {
        let mut v: c_int = 0;
        let mut len = size_of::<c_int>() as socklen_t;
        // SAFETY: v/len are valid out-parameters for an int option.
        let r = unsafe {
            real(
                fd,
                libc::SOL_SOCKET,
                name,
                (&mut v as *mut c_int).cast(),
                &mut len,
            )
        };
        (r == 0).then_some(v)
    };
    let (Some(domain), Some(ty), Some(proto)) = (
        opt(libc::SO_DOMAIN),
        opt(libc::SO_TYPE),
        opt(libc::SO_PROTOCOL),
    ) else {
        return FdEntry::UNKNOWN;
    };
    let mut e = crate::track::socket_entry(domain, ty, proto);
    if e.kind() == Kind::TcpCandidate {
        if opt(libc::SO_ACCEPTCONN) == Some(1) {
            e = e.with_kind(Kind::Listening);
        } else if peer(fd).is_some() {
            e = e.with_flags(flags::COUNTED);
        }
    }
    TABLE.set(fd, e);
    e
}

/// The entry of `fd`, classifying it if the shim has never seen it.
pub(crate) fn entry_or_classify(fd: c_int) -> FdEntry {
    let e = TABLE.get(fd);
    if e.is_unknown() {
        classify(fd)
    } else {
        e
    }
}

/// At exit: count connections whose non-blocking connect completed but that nobody looked at.
pub(crate) fn sweep_pending_connects() {
    TABLE.for_each(0, u32::MAX, complete_if_connected);
}
