//! Readiness: poll, ppoll, select, pselect, epoll_*. While no connection of the process is
//! under the upgrade, every call passes straight through (the fast path's condition). Otherwise
//! calls that involve such a connection are translated (`crate::upgrade::ready`): the kernel's
//! answer for the rest is exact and kept as is.

use super::hook;
use super::up;
use crate::fdtable::{flags, FdEntry, Kind, TABLE};
use crate::outcome::Outcome::{Handled, PassThrough};
use crate::upgrade::ready::Timeout;
use core::ffi::c_int;
use libc::{epoll_event, fd_set, nfds_t, pollfd, sigset_t, timespec, timeval};

hook! {
    /// poll(2).
    fn poll(fds: *mut pollfd, nfds: nfds_t, timeout: c_int) -> c_int;
    id: Poll;
    fallback: syscall(SYS_poll; fds, nfds, timeout);
    fast: when(crate::fdtable::no_upgrades(), crate::stats::ptr_shard(fds as usize));
    |_real, _cx| {
        match up::poll_conns(fds, nfds as usize) {
            Some(conns) => up::poll(fds, nfds as usize, &conns, Timeout::Ms(timeout)),
            None => PassThrough,
        }
    }
}

hook! {
    /// ppoll(2).
    fn ppoll(fds: *mut pollfd, nfds: nfds_t, tmo: *const timespec, ss: *const sigset_t) -> c_int;
    id: Ppoll;
    fallback: syscall(SYS_ppoll; fds, nfds, tmo, ss, 8usize);
    fast: when(crate::fdtable::no_upgrades(), crate::stats::ptr_shard(fds as usize));
    |_real, _cx| {
        match up::poll_conns(fds, nfds as usize) {
            Some(conns) => {
                // SAFETY: the caller's timeout pointer (null or a valid timespec).
                let t = if tmo.is_null() { None } else { Some(unsafe { *tmo }) };
                up::poll(fds, nfds as usize, &conns, Timeout::Ts(t, ss))
            }
            None => PassThrough,
        }
    }
}

fn tv_ms(tv: *mut timeval) -> c_int {
    if tv.is_null() {
        return -1;
    }
    // SAFETY: the caller's timeval (select's contract).
    let t = unsafe { *tv };
    let ms = t.tv_sec.saturating_mul(1000) + t.tv_usec.div_euclid(1000);
    ms.clamp(0, i32::MAX as i64) as c_int
}

hook! {
    /// select(2).
    fn select(n: c_int, r: *mut fd_set, w: *mut fd_set, x: *mut fd_set, tv: *mut timeval) -> c_int;
    id: Select;
    fallback: syscall(SYS_select; n, r, w, x, tv);
    fast: when(crate::fdtable::no_upgrades(), crate::stats::ptr_shard(r as usize ^ w as usize ^ x as usize));
    |_real, _cx| {
        match up::select(n, r, w, x, || Timeout::Ms(tv_ms(tv))) {
            Some(o) => o,
            None => PassThrough,
        }
    }
}

hook! {
    /// pselect(2).
    fn pselect(n: c_int, r: *mut fd_set, w: *mut fd_set, x: *mut fd_set, tmo: *const timespec, ss: *const sigset_t) -> c_int;
    id: Pselect;
    fallback: enosys;
    fast: when(crate::fdtable::no_upgrades(), crate::stats::ptr_shard(r as usize ^ w as usize ^ x as usize));
    |_real, _cx| {
        // SAFETY: the caller's timeout pointer (null or a valid timespec).
        let t = if tmo.is_null() { None } else { Some(unsafe { *tmo }) };
        match up::select(n, r, w, x, || Timeout::Ts(t, ss)) {
            Some(o) => o,
            None => PassThrough,
        }
    }
}

/// A new epoll fd: recorded so that its close forgets the upgrade's registrations in it.
fn new_epoll_fd(fd: c_int) {
    if fd >= 0 {
        super::conn::set_new(fd, FdEntry::new(Kind::Other, flags::EPOLL_FD, 0));
    }
}

hook! {
    /// epoll_create(2).
    fn epoll_create(size: c_int) -> c_int;
    id: EpollCreate;
    fallback: syscall(SYS_epoll_create; size);
    |real, cx| {
        // SAFETY: the caller's arguments.
        let fd = unsafe { real(size) };
        new_epoll_fd(fd);
        Handled(fd)
    }
}

hook! {
    /// epoll_create1(2): as epoll_create.
    fn epoll_create1(fl: c_int) -> c_int;
    id: EpollCreate1;
    fallback: syscall(SYS_epoll_create1; fl);
    |real, cx| {
        // SAFETY: the caller's arguments.
        let fd = unsafe { real(fl) };
        new_epoll_fd(fd);
        Handled(fd)
    }
}

hook! {
    /// epoll_ctl(2): an fd under the upgrade is registered with its eventfds (tagged); a TCP
    /// socket added before it is connected is marked (its upgrade is not attempted); any
    /// other fd whose data could be taken for a tag is registered under one of the
    /// application's own (`ready::epoll_ctl_app`).
    fn epoll_ctl(epfd: c_int, op: c_int, fd: c_int, ev: *mut epoll_event) -> c_int;
    id: EpollCtl;
    fallback: syscall(SYS_epoll_ctl; epfd, op, fd, ev);
    fast: when(
        plain_target(fd) && plain_data(op, ev),
        crate::stats::fd_shard(fd)
    );
    |_real, _cx| {
        let e = TABLE.get(fd);
        if e.has(flags::EPOLL_FD) && op != libc::EPOLL_CTL_DEL {
            // (a set nested in another: its registrations must all be the kernel's)
            crate::upgrade::ready::observe_set(fd);
        }
        if e.kind() == Kind::TcpCandidate && op == libc::EPOLL_CTL_ADD && !e.has(flags::COUNTED) {
            TABLE.update(fd, |e| (e.kind() == Kind::TcpCandidate).then(|| e.with_flags(flags::EPOLLED)));
        }
        match up::epoll_ctl(epfd, op, fd, ev) {
            Some(o) => o,
            None => PassThrough,
        }
    }
}

/// Whether an epoll_ctl's target fd needs nothing of the shim: neither a TCP socket nor an
/// epoll set (one nested in another is watched by other means than its own waits).
fn plain_target(fd: c_int) -> bool {
    let e = TABLE.get(fd);
    !e.is_tcp_stream() && !e.has(flags::EPOLL_FD)
}

/// Whether an epoll_wait needs no translation: no connection is under the upgrade and no
/// registration of the application's is under a tag.
fn wait_plain() -> bool {
    crate::fdtable::no_upgrades() && crate::upgrade::ready::no_app_tags()
}

/// Whether an epoll_ctl needs nothing of the shim for a plain fd: its data cannot be taken
/// for a tag, and no registration is under one.
fn plain_data(op: c_int, ev: *const epoll_event) -> bool {
    if !crate::upgrade::ready::no_app_tags() {
        return false;
    }
    if op == libc::EPOLL_CTL_DEL || ev.is_null() {
        return true;
    }
    // SAFETY: the application's epoll_event for an ADD or MOD (epoll_ctl's contract: the
    // kernel reads it too); read unaligned, as the struct is packed.
    let data = unsafe { core::ptr::read_unaligned(ev) }.u64;
    !crate::upgrade::ready::looks_tagged(data)
}

type EpollPwaitFn =
    unsafe extern "C" fn(c_int, *mut epoll_event, c_int, c_int, *const sigset_t) -> c_int;

hook! {
    /// epoll_wait(2).
    fn epoll_wait(epfd: c_int, ev: *mut epoll_event, max: c_int, timeout: c_int) -> c_int;
    id: EpollWait;
    fallback: syscall(SYS_epoll_wait; epfd, ev, max, timeout);
    fast: when(wait_plain(), crate::stats::fd_shard(epfd));
    |real, _cx| {
        // SAFETY: the caller's arguments with a possibly shorter timeout.
        up::epoll_wait(epfd, ev, max, timeout, true, |e, m, t| unsafe { real(epfd, e, m, t) })
    }
}

hook! {
    /// epoll_pwait(2).
    fn epoll_pwait(epfd: c_int, ev: *mut epoll_event, max: c_int, timeout: c_int, ss: *const sigset_t) -> c_int;
    id: EpollPwait;
    fallback: syscall(SYS_epoll_pwait; epfd, ev, max, timeout, ss, 8usize);
    fast: when(wait_plain(), crate::stats::fd_shard(epfd));
    |real, _cx| {
        let real: EpollPwaitFn = real;
        // SAFETY: the caller's arguments with a possibly shorter timeout.
        up::epoll_wait(epfd, ev, max, timeout, ss.is_null(), |e, m, t| unsafe { real(epfd, e, m, t, ss) })
    }
}

hook! {
    /// epoll_pwait2(2) (glibc 2.35+).
    fn epoll_pwait2(epfd: c_int, ev: *mut epoll_event, max: c_int, tmo: *const timespec, ss: *const sigset_t) -> c_int;
    id: EpollPwait2;
    fallback: syscall(SYS_epoll_pwait2; epfd, ev, max, tmo, ss, 8usize);
    fast: when(wait_plain(), crate::stats::fd_shard(epfd));
    |real, _cx| {
        let ms = if tmo.is_null() {
            -1
        } else {
            // SAFETY: the caller's timespec.
            let t = unsafe { *tmo };
            (t.tv_sec.saturating_mul(1000) + t.tv_nsec / 1_000_000).clamp(0, i32::MAX as i64) as c_int
        };
        up::epoll_wait(epfd, ev, max, ms, ss.is_null(), |e, m, t| {
            let ts = timespec { tv_sec: (t / 1000) as libc::time_t, tv_nsec: ((t % 1000) as libc::c_long) * 1_000_000 };
            let p = if t < 0 { core::ptr::null() } else { &ts as *const timespec };
            // SAFETY: the caller's arguments with a possibly shorter timeout.
            unsafe { real(epfd, e, m, p, ss) }
        })
    }
}
