//! glibc FORTIFY_SOURCE entry points. A `-D_FORTIFY_SOURCE` build calls `__read_chk` instead of
//! `read` whenever the buffer size is known at compile time; glibc's implementation then calls its
//! internal `__read`, which no preload can see (rsocket's preload misses them). Each hook does
//! the buffer check first, exactly as glibc does (`__chk_fail` if the length exceeds the buffer),
//! then the same logic as the plain function.

use super::conn;
use super::hook;
use super::up;
use crate::outcome::Outcome::PassThrough;
use crate::stats::Bytes;
use core::ffi::{c_int, c_long, c_void};
use libc::{
    nfds_t, off64_t, off_t, pollfd, sigset_t, size_t, sockaddr, socklen_t, ssize_t, timespec,
};

extern "C" {
    /// glibc's fortify failure: prints "*** buffer overflow detected ***" and aborts.
    fn __chk_fail() -> !;
}

#[inline(always)]
fn check(len: usize, buflen: usize) {
    if len > buflen {
        // SAFETY: __chk_fail takes no arguments and never returns.
        unsafe { __chk_fail() }
    }
}

hook! {
    /// __read_chk: read(2) with a known buffer size.
    fn __read_chk(fd: c_int, buf: *mut c_void, nbytes: size_t, buflen: size_t) -> ssize_t;
    id: ReadChk;
    fallback: syscall(SYS_read; fd, buf, nbytes);
    pre: check(nbytes, buflen);
    fast: io(fd, TcpRx);
    |real, cx| {
        // SAFETY: the caller's arguments, unchanged, to the real function.
        if let Some(o) = up::route(fd, |c| up::recv_flat(cx, c, fd, buf, nbytes, 0)) {
            return o;
        }
        // SAFETY: the caller's arguments, unchanged, to the real function.
        conn::tcp_io(cx, fd, Bytes::TcpRx, || unsafe { real(fd, buf, nbytes, buflen) })
    }
}

hook! {
    /// __pread_chk: ESPIPE on sockets; counted only.
    fn __pread_chk(fd: c_int, buf: *mut c_void, nbytes: size_t, off: off_t, buflen: size_t) -> ssize_t;
    id: PreadChk;
    fallback: syscall(SYS_pread64; fd, buf, nbytes, off);
    pre: check(nbytes, buflen);
    fast: always(crate::stats::fd_shard(fd));
    |_real, _cx| {
        PassThrough
    }
}

hook! {
    /// __pread64_chk: as __pread_chk.
    fn __pread64_chk(fd: c_int, buf: *mut c_void, nbytes: size_t, off: off64_t, buflen: size_t) -> ssize_t;
    id: Pread64Chk;
    fallback: syscall(SYS_pread64; fd, buf, nbytes, off);
    pre: check(nbytes, buflen);
    fast: always(crate::stats::fd_shard(fd));
    |_real, _cx| {
        PassThrough
    }
}

hook! {
    /// __recv_chk: recv(2) with a known buffer size.
    fn __recv_chk(fd: c_int, buf: *mut c_void, len: size_t, buflen: size_t, fl: c_int) -> ssize_t;
    id: RecvChk;
    fallback: syscall(SYS_recvfrom; fd, buf, len, fl, core::ptr::null_mut::<sockaddr>(), core::ptr::null_mut::<socklen_t>());
    pre: check(len, buflen);
    fast: io(fd, TcpRx);
    |real, cx| {
        // SAFETY: the caller's arguments, unchanged, to the real function.
        if let Some(o) = up::route(fd, |c| up::recv_flat(cx, c, fd, buf, len, fl)) {
            return o;
        }
        // SAFETY: the caller's arguments, unchanged, to the real function.
        conn::tcp_io(cx, fd, Bytes::TcpRx, || unsafe { real(fd, buf, len, buflen, fl) })
    }
}

hook! {
    /// __recvfrom_chk: recvfrom(2) with a known buffer size.
    fn __recvfrom_chk(fd: c_int, buf: *mut c_void, len: size_t, buflen: size_t, fl: c_int, addr: *mut sockaddr, alen: *mut socklen_t) -> ssize_t;
    id: RecvfromChk;
    fallback: syscall(SYS_recvfrom; fd, buf, len, fl, addr, alen);
    pre: check(len, buflen);
    fast: io(fd, TcpRx);
    |real, cx| {
        // SAFETY: the caller's arguments, unchanged, to the real function.
        if let Some(o) = up::route(fd, |c| {
            if !alen.is_null() {
                // SAFETY: the caller's address-length out-parameter: TCP reports no address.
                unsafe { *alen = 0 };
            }
            up::recv_flat(cx, c, fd, buf, len, fl)
        }) {
            return o;
        }
        // SAFETY: the caller's arguments, unchanged, to the real function.
        conn::tcp_io(cx, fd, Bytes::TcpRx, || unsafe { real(fd, buf, len, buflen, fl, addr, alen) })
    }
}

hook! {
    /// __poll_chk: poll(2) with a known array size (pass-through; readiness of upgraded fds will
    /// be translated here as in poll).
    fn __poll_chk(fds: *mut pollfd, nfds: nfds_t, timeout: c_int, fdslen: size_t) -> c_int;
    id: PollChk;
    fallback: syscall(SYS_poll; fds, nfds, timeout);
    pre: check((nfds as usize).saturating_mul(core::mem::size_of::<pollfd>()), fdslen);
    fast: when(crate::fdtable::no_upgrades(), crate::stats::ptr_shard(fds as usize));
    |_real, _cx| {
        match up::poll_conns(fds, nfds as usize) {
            Some(conns) => up::poll(fds, nfds as usize, &conns, crate::upgrade::ready::Timeout::Ms(timeout)),
            None => PassThrough,
        }
    }
}

hook! {
    /// __ppoll_chk: ppoll(2) with a known array size.
    fn __ppoll_chk(fds: *mut pollfd, nfds: nfds_t, tmo: *const timespec, ss: *const sigset_t, fdslen: size_t) -> c_int;
    id: PpollChk;
    fallback: syscall(SYS_ppoll; fds, nfds, tmo, ss, 8usize);
    pre: check((nfds as usize).saturating_mul(core::mem::size_of::<pollfd>()), fdslen);
    fast: when(crate::fdtable::no_upgrades(), crate::stats::ptr_shard(fds as usize));
    |_real, _cx| {
        match up::poll_conns(fds, nfds as usize) {
            Some(conns) => {
                // SAFETY: the caller's timeout pointer (null or a valid timespec).
                let t = if tmo.is_null() { None } else { Some(unsafe { *tmo }) };
                up::poll(fds, nfds as usize, &conns, crate::upgrade::ready::Timeout::Ts(t, ss))
            }
            None => PassThrough,
        }
    }
}

hook! {
    /// __fdelt_chk: the FD_SET/FD_ISSET index check of fortified select(2) users (curl,
    /// iperf3). No I/O; hooked so the stats show which programs use select-style fd sets, and
    /// so the upgrade can see fd numbers handed to select.
    fn __fdelt_chk(d: c_long) -> c_long;
    id: FdeltChk;
    fallback: enosys;
    fast: always(crate::stats::fd_shard(d as c_int));
    |_real, _cx| { PassThrough }
}
