//! The hooks' side of the upgrade: finding the connection of an fd, and turning the
//! application's raw buffers (pointers, iovecs, msghdrs, fd_sets) into the safe views
//! `crate::upgrade` works on.

use crate::fdtable::{flags, FdEntry, Kind, TABLE};
use crate::guard::Cx;
use crate::net;
use crate::outcome::{Errno, Outcome};
use crate::spin::wait::{spin_wait_interruptible, Turn};
use crate::stats;
use crate::upgrade::data::{self, FileSrc, Gather, RecvBuf};
use crate::upgrade::{self, ready, Conn};
use core::ffi::{c_int, c_void};
use libc::{iovec, msghdr};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// What a data call on an fd should do about the upgrade.
pub(crate) enum Up {
    /// Not under the upgrade (or fell back): the TCP path.
    Tcp,
    /// The upgrade handles it.
    Conn(Arc<Conn>),
    /// A connection inherited from the parent process that could not be had here (its
    /// parent could not give it back from its ring).
    Fail(Errno),
}

/// The upgrade state of `fd` with entry `e`.
pub(crate) fn of(e: FdEntry) -> Up {
    if e.kind() != Kind::Upgraded {
        return Up::Tcp;
    }
    let slot = e.slot();
    if !upgrade::slot_is_ours(slot) {
        // A fork child's copy of its parent's connection: its own if the parent offered it
        // (an accepted connection waiting for its upgrade), else plain TCP once the parent has
        // it on TCP (it switches it back from the ring, if need be, when the child asks).
        if let Some(c) = upgrade::adopt_inherited(slot) {
            return Up::Conn(c);
        }
        return match upgrade::use_inherited(slot) {
            Ok(()) => Up::Tcp,
            Err(e) => Up::Fail(e),
        };
    }
    match upgrade::lookup(slot) {
        Some(c) if !c.fell_back.load(Ordering::Acquire) => {
            if c.offered.load(Ordering::Relaxed) {
                // (offered to a fork child, and used here: this process keeps it, on TCP)
                upgrade::reclaim_offered(&c);
                if c.fell_back.load(Ordering::Acquire) {
                    return Up::Tcp;
                }
            }
            Up::Conn(c)
        }
        _ => Up::Tcp,
    }
}

/// The upgrade state of `fd`.
pub(crate) fn of_fd(fd: c_int) -> Up {
    of(TABLE.get(fd))
}

/// The connection of `fd` if this process has it under the upgrade (for calls that only keep
/// its cached attributes: they ask no parent for an inherited one).
pub(crate) fn own_conn(fd: c_int) -> Option<Arc<Conn>> {
    let e = TABLE.get(fd);
    if e.kind() != Kind::Upgraded || !upgrade::slot_is_ours(e.slot()) {
        return None;
    }
    upgrade::lookup(e.slot())
}

/// For a data hook on `fd`: `Some` when the upgrade decides the call (`f` handles it on the
/// connection, or it fails on a connection inherited from the parent), `None` to go on with
/// the TCP path.
pub(crate) fn route(fd: c_int, f: impl FnOnce(&Conn) -> Outcome<isize>) -> Option<Outcome<isize>> {
    let e = TABLE.get(fd);
    if e.kind() != Kind::Upgraded {
        return None;
    }
    // The usual case — this process's connection, neither fallen back nor offered to a fork
    // child — on the connection borrowed under its slot's pin; anything else as `of` says.
    let mut f = Some(f);
    let steady = |c: &Conn| {
        if c.fell_back.load(Ordering::Acquire) || c.offered.load(Ordering::Relaxed) {
            return None;
        }
        f.take().map(|f| f(c))
    };
    if let Some(Some(r)) = upgrade::with_own(e.slot(), steady) {
        return Some(r);
    }
    let f = f?;
    match of(e) {
        Up::Conn(c) => Some(f(&c)),
        Up::Fail(e) => Some(Outcome::Fail(e)),
        Up::Tcp => None,
    }
}

fn ret(r: Result<usize, Errno>) -> Outcome<isize> {
    match r {
        Ok(n) => Outcome::Handled(n as isize),
        Err(e) => Outcome::Fail(e),
    }
}

/// One of the application's receive buffers, as a pointer and a length — never a slice:
/// read(2)'s buffer may be uninitialised memory (a `&mut [u8]` over it would claim initialised
/// bytes) and readv's segments may overlap (two `&mut [u8]` over one byte are undefined
/// behaviour). Only the kernel (recv) and copies from the ring write into it.
#[derive(Clone, Copy)]
struct AppSeg {
    ptr: *mut u8,
    len: usize,
}

impl AppSeg {
    /// The `len` bytes at `p` (EFAULT if null and not empty).
    fn new(p: *mut c_void, len: usize) -> Result<AppSeg, Errno> {
        if p.is_null() && len > 0 {
            return Err(Errno(libc::EFAULT));
        }
        Ok(AppSeg { ptr: p.cast(), len })
    }

    /// Receives from socket `fd` into bytes `[off, off + max)` (clipped to the segment).
    fn recv_tcp(self, fd: c_int, off: usize, max: usize, flags: c_int) -> Result<usize, Errno> {
        let n = max.min(self.len.saturating_sub(off));
        // SAFETY: `[off, off + n)` lies inside the segment, which the application passed as
        // writable for its length (read(2)'s contract).
        unsafe { net::recv_raw(fd, self.ptr.wrapping_add(off), n, flags) }
    }

    /// Copies `data` to byte `off` of the segment.
    fn fill(self, off: usize, data: &[u8]) {
        assert!(off <= self.len && data.len() <= self.len - off);
        // SAFETY: inside the segment (checked above), writable per read(2)'s contract; `data`
        // is the shim's (the ring or a token's remainder), never the application's buffer.
        unsafe { core::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(off), data.len()) }
    }
}

/// read/recv's one buffer.
struct AppFlat(AppSeg);

impl RecvBuf for AppFlat {
    fn total(&self) -> usize {
        self.0.len
    }
    fn recv_tcp(&mut self, fd: c_int, at: usize, max: usize, flags: c_int) -> Result<usize, Errno> {
        self.0.recv_tcp(fd, at, max, flags)
    }
    fn fill(&mut self, at: usize, data: &[u8]) {
        self.0.fill(at, data)
    }
}

/// readv/recvmsg's scatter list (a copy of the application's iovecs: its array may lie in
/// one of the buffers).
struct AppScatter(Vec<AppSeg>);

impl RecvBuf for AppScatter {
    fn total(&self) -> usize {
        self.0.iter().map(|s| s.len).sum()
    }
    fn recv_tcp(&mut self, fd: c_int, at: usize, max: usize, flags: c_int) -> Result<usize, Errno> {
        // One segment at a time: a short read is always allowed.
        match data::locate(self.0.iter().map(|s| s.len), at) {
            Some((i, off)) => self.0[i].recv_tcp(fd, off, max, flags),
            None => Ok(0),
        }
    }
    fn fill(&mut self, at: usize, data: &[u8]) {
        let mut done = 0;
        for (i, off, k) in data::spans(self.0.iter().map(|s| s.len), at, data.len()) {
            self.0[i].fill(off, &data[done..done + k]);
            done += k;
        }
    }
}

/// The application's readable buffer of `len` bytes at `p` (EFAULT if null and not empty).
///
/// # Safety
/// `p` must be valid for reads of `len` bytes for `'a` (write(2)'s contract on its buffer).
unsafe fn app_buf<'a>(p: *const c_void, len: usize) -> Result<&'a [u8], Errno> {
    match (len, p.is_null()) {
        (0, _) => Ok(&[]),
        (_, true) => Err(Errno(libc::EFAULT)),
        // SAFETY: per the contract.
        _ => Ok(unsafe { core::slice::from_raw_parts(p.cast::<u8>(), len) }),
    }
}

/// recv/read into one buffer.
pub(crate) fn recv_flat(
    cx: Cx,
    c: &Conn,
    fd: c_int,
    buf: *mut c_void,
    len: usize,
    flags: c_int,
) -> Outcome<isize> {
    match AppSeg::new(buf, len) {
        Ok(seg) => ret(data::recv(
            c,
            stats::tally(cx),
            fd,
            &mut AppFlat(seg),
            flags,
        )),
        Err(e) => Outcome::Fail(e),
    }
}

/// The application's iovec array (EINVAL for a bad count, EFAULT for a null array).
///
/// # Safety
/// `iov` must point to `cnt` iovecs (readv/writev's contract).
unsafe fn iovs<'a>(iov: *const iovec, cnt: c_int) -> Result<&'a [iovec], Errno> {
    if !(0..=libc::UIO_MAXIOV).contains(&cnt) {
        return Err(Errno(libc::EINVAL));
    }
    match (cnt, iov.is_null()) {
        (0, _) => Ok(&[]),
        (_, true) => Err(Errno(libc::EFAULT)),
        // SAFETY: per the contract.
        _ => Ok(unsafe { core::slice::from_raw_parts(iov, cnt as usize) }),
    }
}

/// The application's iovec array as receive segments (readv, recvmsg).
///
/// # Safety
/// `iov` must point to `cnt` iovecs (their buffers are not touched here).
unsafe fn iov_segs(iov: *const iovec, cnt: c_int) -> Result<AppScatter, Errno> {
    // SAFETY: per the contract.
    unsafe { iovs(iov, cnt)? }
        .iter()
        .map(|e| AppSeg::new(e.iov_base, e.iov_len))
        .collect::<Result<Vec<_>, _>>()
        .map(AppScatter)
}

/// The application's iovec array as readable slices (writev, sendmsg).
///
/// # Safety
/// `iov` must point to `cnt` iovecs whose buffers are readable for their lengths.
unsafe fn iov_slices<'a>(iov: *const iovec, cnt: c_int) -> Result<Vec<&'a [u8]>, Errno> {
    // SAFETY: per the contract, each iovec describes a readable buffer.
    unsafe { iovs(iov, cnt)? }
        .iter()
        .map(|e| unsafe { app_buf(e.iov_base, e.iov_len) })
        .collect()
}

/// readv.
pub(crate) fn recv_iov(
    cx: Cx,
    c: &Conn,
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    flags: c_int,
) -> Outcome<isize> {
    // SAFETY: readv's contract on the application's arguments.
    match unsafe { iov_segs(iov, cnt) } {
        Ok(mut v) => ret(data::recv(c, stats::tally(cx), fd, &mut v, flags)),
        Err(e) => Outcome::Fail(e),
    }
}

/// recvmsg: the scatter list; no address, no ancillary data (TCP has none to give).
pub(crate) fn recv_msg(
    cx: Cx,
    c: &Conn,
    fd: c_int,
    msg: *mut msghdr,
    flags: c_int,
) -> Outcome<isize> {
    if msg.is_null() {
        return Outcome::Fail(Errno(libc::EFAULT));
    }
    // SAFETY: the application's msghdr (recvmsg's contract).
    let m = unsafe { &mut *msg };
    // SAFETY: msg_iov/msg_iovlen describe the application's buffers.
    let mut v = match unsafe { iov_segs(m.msg_iov, m.msg_iovlen as c_int) } {
        Ok(v) => v,
        Err(e) => return Outcome::Fail(e),
    };
    let r = data::recv(c, stats::tally(cx), fd, &mut v, flags);
    if r.is_ok() {
        m.msg_namelen = 0;
        m.msg_controllen = 0;
        m.msg_flags = 0;
    }
    ret(r)
}

/// send/write of one buffer.
pub(crate) fn send_flat(
    cx: Cx,
    c: &Conn,
    fd: c_int,
    buf: *const c_void,
    len: usize,
    flags: c_int,
) -> Outcome<isize> {
    // SAFETY: the application passed a readable buffer of `len` bytes (as write(2) requires).
    match unsafe { app_buf(buf, len) } {
        Ok(slice) => ret(data::send_bytes(c, stats::tally(cx), fd, slice, flags)),
        Err(e) => Outcome::Fail(e),
    }
}

/// writev.
pub(crate) fn send_iov(
    cx: Cx,
    c: &Conn,
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    flags: c_int,
) -> Outcome<isize> {
    // SAFETY: writev's contract on the application's arguments.
    match unsafe { iov_slices(iov, cnt) } {
        Ok(v) => ret(data::send(c, stats::tally(cx), fd, &mut Gather(v), flags)),
        Err(e) => Outcome::Fail(e),
    }
}

/// sendmsg (a destination address on a connected TCP socket is ignored, as by the kernel;
/// ancillary data is not supported on TCP).
pub(crate) fn send_msg(
    cx: Cx,
    c: &Conn,
    fd: c_int,
    msg: *const msghdr,
    flags: c_int,
) -> Outcome<isize> {
    if msg.is_null() {
        return Outcome::Fail(Errno(libc::EFAULT));
    }
    // SAFETY: the application's msghdr (sendmsg's contract).
    let m = unsafe { &*msg };
    send_iov(cx, c, fd, m.msg_iov, m.msg_iovlen as c_int, flags)
}

/// sendfile from `in_fd` to the upgraded socket `fd`.
pub(crate) fn send_file(
    cx: Cx,
    c: &Conn,
    fd: c_int,
    in_fd: c_int,
    off: *mut i64,
    count: usize,
) -> Outcome<isize> {
    let (offset, own_pos) = if off.is_null() {
        // SAFETY: lseek with no pointers.
        let pos = unsafe {
            rdmashim_core::raw_syscall!(libc::SYS_lseek, in_fd, 0 as libc::off_t, libc::SEEK_CUR)
        };
        if pos < 0 {
            return Outcome::Fail(crate::sys::errno());
        }
        (pos, true)
    } else {
        // SAFETY: the application's offset pointer (sendfile's contract).
        (unsafe { *off }, false)
    };
    let mut src = FileSrc {
        fd: in_fd,
        offset,
        count,
    };
    let r = data::send(c, stats::tally(cx), fd, &mut src, 0);
    if let Ok(n) = r {
        if own_pos {
            // SAFETY: lseek with no pointers.
            unsafe {
                rdmashim_core::raw_syscall!(
                    libc::SYS_lseek,
                    in_fd,
                    offset + n as i64,
                    libc::SEEK_SET
                )
            };
        } else {
            // SAFETY: as above: the application's offset pointer.
            unsafe { *off = offset + n as i64 };
        }
    }
    ret(r)
}

/// The connections of a pollfd array's fds, or `None` if none is under the upgrade (the
/// call then passes through untouched).
pub(crate) fn poll_conns(fds: *const libc::pollfd, n: usize) -> Option<Vec<Option<Arc<Conn>>>> {
    if fds.is_null() || n == 0 {
        return None;
    }
    // SAFETY: poll's contract: `fds` points to `n` pollfds.
    let arr = unsafe { core::slice::from_raw_parts(fds, n) };
    let mut any = false;
    for p in arr {
        let e = TABLE.get(p.fd);
        any |= e.kind() == Kind::Upgraded;
        if e.has(flags::EPOLL_FD) {
            // (an epoll set polled: its registrations must all be the kernel's)
            ready::observe_set(p.fd);
        }
    }
    if !any {
        return None;
    }
    let v: Vec<Option<Arc<Conn>>> = arr
        .iter()
        .map(|p| match of_fd(p.fd) {
            Up::Conn(c) => Some(c),
            _ => None,
        })
        .collect();
    v.iter().any(Option::is_some).then_some(v)
}

/// poll/ppoll over the application's array with connections under the upgrade.
pub(crate) fn poll(
    fds: *mut libc::pollfd,
    n: usize,
    conns: &[Option<Arc<Conn>>],
    t: ready::Timeout,
) -> Outcome<c_int> {
    // SAFETY: poll's contract: `fds` points to `n` writable pollfds.
    let arr = unsafe { core::slice::from_raw_parts_mut(fds, n) };
    match ready::poll(arr, conns, t) {
        Ok(k) => Outcome::Handled(k as c_int),
        Err(e) => Outcome::Fail(e),
    }
}

fn fd_isset(set: *const libc::fd_set, fd: c_int) -> bool {
    // SAFETY: `set` is a valid fd_set of the application and fd < FD_SETSIZE (caller).
    !set.is_null() && unsafe { libc::FD_ISSET(fd, set) }
}

/// select/pselect when an fd in the sets is under the upgrade: rebuilt as a poll. `None`: no
/// such fd (pass through).
pub(crate) fn select(
    n: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    x: *mut libc::fd_set,
    t: impl FnOnce() -> ready::Timeout,
) -> Option<Outcome<c_int>> {
    let n = n.clamp(0, libc::FD_SETSIZE as c_int);
    let mut any = false;
    for fd in 0..n {
        if fd_isset(r, fd) || fd_isset(w, fd) || fd_isset(x, fd) {
            let e = TABLE.get(fd);
            any |= e.kind() == Kind::Upgraded;
            if e.has(flags::EPOLL_FD) {
                // (as in `poll_conns`)
                ready::observe_set(fd);
            }
        }
    }
    if !any {
        return None;
    }
    let mut pfds = Vec::new();
    for fd in 0..n {
        let mut ev = 0i16;
        if fd_isset(r, fd) {
            ev |= libc::POLLIN;
        }
        if fd_isset(w, fd) {
            ev |= libc::POLLOUT;
        }
        if fd_isset(x, fd) {
            ev |= libc::POLLPRI;
        }
        if ev != 0 {
            pfds.push(libc::pollfd {
                fd,
                events: ev,
                revents: 0,
            });
        }
    }
    let conns: Vec<Option<Arc<Conn>>> = pfds
        .iter()
        .map(|p| match of_fd(p.fd) {
            Up::Conn(c) => Some(c),
            _ => None,
        })
        .collect();
    if let Err(e) = ready::poll(&mut pfds, &conns, t()) {
        return Some(Outcome::Fail(e));
    }
    for p in &pfds {
        if p.revents & libc::POLLNVAL != 0 {
            return Some(Outcome::Fail(Errno(libc::EBADF)));
        }
    }
    let mut count = 0;
    for set in [r, w, x] {
        if !set.is_null() {
            // SAFETY: the application's fd_set.
            unsafe { libc::FD_ZERO(set) };
        }
    }
    for p in &pfds {
        let rd = p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR | libc::POLLRDHUP) != 0;
        let wr = p.revents & (libc::POLLOUT | libc::POLLERR) != 0;
        let ex = p.revents & libc::POLLPRI != 0;
        for (want, set, hit) in [
            (libc::POLLIN, r, rd),
            (libc::POLLOUT, w, wr),
            (libc::POLLPRI, x, ex),
        ] {
            if p.events & want != 0 && hit && !set.is_null() {
                // SAFETY: the application's fd_set and fd < n <= FD_SETSIZE.
                unsafe { libc::FD_SET(p.fd, set) };
                count += 1;
            }
        }
    }
    Some(Outcome::Handled(count))
}

/// epoll_ctl for an fd under the upgrade, or for another whose data could be taken for a tag
/// (`Some`), or `None` to pass through.
pub(crate) fn epoll_ctl(
    epfd: c_int,
    op: c_int,
    fd: c_int,
    ev: *mut libc::epoll_event,
) -> Option<Outcome<c_int>> {
    let e = if ev.is_null() || op == libc::EPOLL_CTL_DEL {
        None
    } else {
        // SAFETY: the application's epoll_event (epoll_ctl's contract).
        let v = unsafe { *ev };
        Some((v.events, v.u64))
    };
    let r = match of_fd(fd) {
        Up::Conn(c) => ready::epoll_ctl(&c, epfd, op, fd, e),
        _ => ready::epoll_ctl_app(epfd, op, fd, e)?,
    };
    Some(match r {
        Ok(()) => Outcome::Handled(0),
        Err(e) => Outcome::Fail(e),
    })
}

/// epoll_wait-family: the real wait, then the translation of tagged events, waiting again
/// (for the rest of the timeout) if none is left. `wait(events, max, timeout_ms)` is the real
/// call.
///
/// A wait that may block on a set holding a connection under the upgrade first busy-polls
/// the set for the spin time, if the set's spin gate lets it ([`ready::spin_gate`]): real
/// waits with timeout 0 (which the application could have made itself), each taking what
/// the set's completion channels and eventfds raised, until something is left for the
/// application. Each turn first looks at the shared-memory inboxes of the set's connections
/// itself, without arming them ([`ready::take_arrivals`]): the peers' messages meanwhile
/// write no eventfd. A completion then reaches the application without the sleep and wake-up
/// that cost an emulated CPU more than the message's whole transfer.
///
/// Signals: a signal the thread lets through interrupts a real wait (EINTR, never
/// restarted), but would run its handler unseen between two spinning waits; the spin holds
/// them back and fails with EINTR as the wait would have ([`spin_wait_interruptible`]).
/// `own_mask` is false for an epoll_pwait with a mask of its own.
pub(crate) fn epoll_wait(
    epfd: c_int,
    ev: *mut libc::epoll_event,
    max: c_int,
    timeout_ms: c_int,
    own_mask: bool,
    wait: impl Fn(*mut libc::epoll_event, c_int, c_int) -> c_int,
) -> Outcome<c_int> {
    // (the clock only for a finite, non-zero timeout: under clocksources without a vDSO
    // reader, as HPET in the soft-RoCE VM, a read is a system call, and an event loop calls
    // this for every turn)
    let start = (timeout_ms > 0).then(std::time::Instant::now);
    let elapsed_ms = || {
        start.map_or(0, |s| {
            s.elapsed().as_millis().min(c_int::MAX as u128) as c_int
        })
    };
    let mut left = timeout_ms;
    let mut held = None;
    if timeout_ms != 0 {
        if let Some(gate) = ready::spin_gate(epfd) {
            let tally = crate::stats::Tally::at(crate::stats::fd_shard(epfd));
            let (found, h) = spin_wait_interruptible(gate, tally, own_mask, || {
                if let Some(r) = user_turn(epfd, ev, max, &wait) {
                    return match r {
                        Ok(k) => Turn::Found(Ok(k)),
                        Err(e) => Turn::Leave(Err(e)),
                    };
                }
                ready::take_arrivals(epfd);
                ready::arm_for_spin(epfd);
                let n = wait(ev, max, 0);
                if n < 0 {
                    return Turn::Leave(Err(crate::sys::errno()));
                }
                if n == 0 {
                    return Turn::Again;
                }
                // SAFETY: the kernel filled `n` events of the application's array.
                let arr = unsafe { core::slice::from_raw_parts_mut(ev, n as usize) };
                match ready::translate_epoll(epfd, arr, n as usize) {
                    0 => Turn::Again,
                    k => Turn::Found(Ok(k as c_int)),
                }
            });
            match found {
                Ok(Some(Ok(n))) => return Outcome::Handled(n),
                Ok(Some(Err(e))) | Err(e) => return Outcome::Fail(e),
                Ok(None) => {}
            }
            held = h;
            if timeout_ms > 0 {
                left = (timeout_ms - elapsed_ms()).max(0);
            }
        }
    }
    // (the signals the spin held are let through by the wait itself: see
    // `spin_wait_interruptible`)
    let r = match &held {
        Some(h) => {
            let mask = h.mask();
            // SAFETY: the application's event array of `max` entries (epoll_wait's contract)
            // and a valid signal set of the kernel's size.
            epoll_sleep(
                epfd,
                ev,
                max,
                timeout_ms,
                left,
                &elapsed_ms,
                |e, m, t| unsafe {
                    rdmashim_core::raw_syscall!(libc::SYS_epoll_pwait, epfd, e, m, t, mask, 8usize)
                        as c_int
                },
            )
        }
        None => epoll_sleep(epfd, ev, max, timeout_ms, left, &elapsed_ms, wait),
    };
    if let Some(h) = held {
        h.release();
    }
    r
}

/// The registrations of set `epfd` kept in user space that are ready now
/// ([`ready::user_events`]), reported with what the kernel has ready for the room left (a
/// wait with timeout 0); `None` if none is (and then none is kept there any more: the wait
/// that follows may sleep).
fn user_turn(
    epfd: c_int,
    ev: *mut libc::epoll_event,
    max: c_int,
    wait: &impl Fn(*mut libc::epoll_event, c_int, c_int) -> c_int,
) -> Option<Result<c_int, Errno>> {
    if max <= 0 {
        // (the kernel's EINVAL)
        return None;
    }
    let mut user = ready::user_events(epfd);
    if user.is_empty() {
        return None;
    }
    let max = max as usize;
    // (one place at least for the kernel's events, unless there is only one: its wait also
    // checks the array the application gave)
    if max > 1 {
        user.truncate(max - 1);
    }
    let room = max.saturating_sub(user.len());
    let mut seen = Vec::new();
    let k = if room > 0 {
        let n = wait(ev, room as c_int, 0);
        if n < 0 {
            return Some(Err(crate::sys::errno()));
        }
        // SAFETY: the kernel filled `n` events of the application's array.
        let arr = unsafe { core::slice::from_raw_parts_mut(ev, n as usize) };
        ready::translate_seen(epfd, arr, n as usize, &mut seen)
    } else {
        0
    };
    // SAFETY: the application's event array of `max` entries (epoll_wait's contract).
    let all = unsafe { core::slice::from_raw_parts_mut(ev, max) };
    Some(Ok(ready::merge_user(all, k, &seen, &user) as c_int))
}

/// The waits of [`epoll_wait`] after its spin: `wait` until an event of the application's is
/// left after the translation, or the time is up (`left` of `timeout_ms`).
fn epoll_sleep(
    epfd: c_int,
    ev: *mut libc::epoll_event,
    max: c_int,
    timeout_ms: c_int,
    mut left: c_int,
    elapsed_ms: &dyn Fn() -> c_int,
    wait: impl Fn(*mut libc::epoll_event, c_int, c_int) -> c_int,
) -> Outcome<c_int> {
    let mut looked_again = false;
    loop {
        ready::arm_for_epoll(epfd);
        let sleep = ready::Sleep::begin(epfd);
        if let Some(r) = user_turn(epfd, ev, max, &wait) {
            return match r {
                Ok(k) => Outcome::Handled(k),
                Err(e) => Outcome::Fail(e),
            };
        }
        let n = wait(ev, max, left);
        drop(sleep);
        if n <= 0 {
            return Outcome::Handled(n);
        }
        // SAFETY: the kernel filled `n` events of the application's array.
        let arr = unsafe { core::slice::from_raw_parts_mut(ev, n as usize) };
        let k = ready::translate_epoll(epfd, arr, n as usize);
        if k > 0 {
            return Outcome::Handled(k as c_int);
        }
        if timeout_ms >= 0 {
            left = (timeout_ms - elapsed_ms()).max(0);
            if left == 0 {
                // The events taken may have set an eventfd just now (an edge-triggered
                // registration learns of completions that way): one more look, without
                // waiting, before the time is up (else a poll with timeout 0 would see the
                // data only on its next call).
                if looked_again {
                    return Outcome::Handled(0);
                }
                looked_again = true;
            }
        }
    }
}
