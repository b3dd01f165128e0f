//! Readiness: poll, ppoll, select, pselect, epoll_*. Pass-through for now: no fd is upgraded, so
//! the kernel's answer is exact. This is where the upgrade translates readiness of upgraded fds
//! (docs/shim.md, "Where the upgrade plugs in").

use super::hook;
use crate::fdtable::FdEntry;
use crate::fdtable::TABLE;
use crate::outcome::Outcome::{Handled, PassThrough};
use core::ffi::c_int;
use libc::{epoll_event, fd_set, nfds_t, pollfd, sigset_t, timespec, timeval};

hook! {
    /// poll(2).
    fn poll(fds: *mut pollfd, nfds: nfds_t, timeout: c_int) -> c_int;
    id: Poll;
    fallback: syscall(SYS_poll; fds, nfds, timeout);
    fast: always(crate::stats::ptr_shard(fds as usize));
    |_real, _cx| { PassThrough }
}

hook! {
    /// ppoll(2).
    fn ppoll(fds: *mut pollfd, nfds: nfds_t, tmo: *const timespec, ss: *const sigset_t) -> c_int;
    id: Ppoll;
    fallback: syscall(SYS_ppoll; fds, nfds, tmo, ss, 8usize);
    fast: always(crate::stats::ptr_shard(fds as usize));
    |_real, _cx| { PassThrough }
}

hook! {
    /// select(2).
    fn select(n: c_int, r: *mut fd_set, w: *mut fd_set, x: *mut fd_set, tv: *mut timeval) -> c_int;
    id: Select;
    fallback: syscall(SYS_select; n, r, w, x, tv);
    fast: always(crate::stats::ptr_shard(r as usize ^ w as usize ^ x as usize));
    |_real, _cx| { PassThrough }
}

hook! {
    /// pselect(2).
    fn pselect(n: c_int, r: *mut fd_set, w: *mut fd_set, x: *mut fd_set, tmo: *const timespec, ss: *const sigset_t) -> c_int;
    id: Pselect;
    fallback: enosys;
    fast: always(crate::stats::ptr_shard(r as usize ^ w as usize ^ x as usize));
    |_real, _cx| { PassThrough }
}

hook! {
    /// epoll_create(2): the new fd number clears any stale table entry.
    fn epoll_create(size: c_int) -> c_int;
    id: EpollCreate;
    fallback: syscall(SYS_epoll_create; size);
    |real, cx| {
        // SAFETY: the caller's arguments.
        let fd = unsafe { real(size) };
        if fd >= 0 {
            TABLE.set(fd, FdEntry::UNKNOWN);
        }
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
        if fd >= 0 {
            TABLE.set(fd, FdEntry::UNKNOWN);
        }
        Handled(fd)
    }
}

hook! {
    /// epoll_ctl(2): where the upgrade will register an upgraded fd's own wake-up source.
    fn epoll_ctl(epfd: c_int, op: c_int, fd: c_int, ev: *mut epoll_event) -> c_int;
    id: EpollCtl;
    fallback: syscall(SYS_epoll_ctl; epfd, op, fd, ev);
    fast: always(crate::stats::fd_shard(epfd));
    |_real, _cx| { PassThrough }
}

hook! {
    /// epoll_wait(2).
    fn epoll_wait(epfd: c_int, ev: *mut epoll_event, max: c_int, timeout: c_int) -> c_int;
    id: EpollWait;
    fallback: syscall(SYS_epoll_wait; epfd, ev, max, timeout);
    fast: always(crate::stats::fd_shard(epfd));
    |_real, _cx| { PassThrough }
}

hook! {
    /// epoll_pwait(2).
    fn epoll_pwait(epfd: c_int, ev: *mut epoll_event, max: c_int, timeout: c_int, ss: *const sigset_t) -> c_int;
    id: EpollPwait;
    fallback: syscall(SYS_epoll_pwait; epfd, ev, max, timeout, ss, 8usize);
    fast: always(crate::stats::fd_shard(epfd));
    |_real, _cx| { PassThrough }
}

hook! {
    /// epoll_pwait2(2) (glibc 2.35+).
    fn epoll_pwait2(epfd: c_int, ev: *mut epoll_event, max: c_int, tmo: *const timespec, ss: *const sigset_t) -> c_int;
    id: EpollPwait2;
    fallback: syscall(SYS_epoll_pwait2; epfd, ev, max, tmo, ss, 8usize);
    fast: always(crate::stats::fd_shard(epfd));
    |_real, _cx| { PassThrough }
}
