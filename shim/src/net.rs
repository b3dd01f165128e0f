//! The upgrade's own system calls on sockets, eventfds, pipes, epoll sets and shared memory:
//! raw `syscall(2)` so that they never reach the library's own hooks (a call from inside the
//! library to `recv` would bind to the library's `recv`). Every function here is a thin, safe wrapper; errors come back as
//! [`Errno`] and errno is left as the call left it (callers that return to the application
//! restore or set it themselves).
#![allow(unsafe_code)]

use crate::outcome::Errno;
use core::ffi::{c_int, c_long, c_void};
use core::mem::{size_of, MaybeUninit};
use libc::{sockaddr_storage, socklen_t};
use std::net::{IpAddr, SocketAddr};

fn check(r: c_long) -> Result<usize, Errno> {
    if r < 0 {
        Err(crate::sys::errno())
    } else {
        Ok(r as usize)
    }
}

/// recvfrom(2) into `buf` with `flags`.
pub fn recv(fd: c_int, buf: &mut [u8], flags: c_int) -> Result<usize, Errno> {
    // SAFETY: buf is a writable slice of its length.
    unsafe { recv_raw(fd, buf.as_mut_ptr(), buf.len(), flags) }
}

/// recv into the `len` bytes at `buf` (an application's buffer, which may be uninitialised
/// memory: no slice is made over it).
///
/// # Safety
/// `buf` must be valid for writes of `len` bytes.
pub unsafe fn recv_raw(fd: c_int, buf: *mut u8, len: usize, flags: c_int) -> Result<usize, Errno> {
    // SAFETY: per the contract; no address is asked for.
    let r = unsafe {
        rdmashim_core::raw_syscall!(
            libc::SYS_recvfrom,
            fd,
            buf,
            len,
            flags,
            core::ptr::null_mut::<c_void>(),
            core::ptr::null_mut::<socklen_t>(),
        )
    };
    check(r)
}

/// sendto(2) of `buf` with `flags`.
pub fn send(fd: c_int, buf: &[u8], flags: c_int) -> Result<usize, Errno> {
    // SAFETY: buf is a readable slice of its length; no address is given.
    let r = unsafe {
        rdmashim_core::raw_syscall!(
            libc::SYS_sendto,
            fd,
            buf.as_ptr(),
            buf.len(),
            flags,
            core::ptr::null::<c_void>(),
            0 as socklen_t,
        )
    };
    check(r)
}

/// pread(2) at `off` (sendfile with an offset pointer).
pub fn pread(fd: c_int, buf: &mut [u8], off: i64) -> Result<usize, Errno> {
    // SAFETY: buf is a writable slice of its length.
    check(unsafe {
        rdmashim_core::raw_syscall!(libc::SYS_pread64, fd, buf.as_mut_ptr(), buf.len(), off)
    })
}

/// Set by [`abandon_private`]: the shim's own descriptors may be the program's files.
static ABANDONED: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

/// The program is about to put a file of its own at the number of one of the shim's
/// descriptors (`upgrade::close_for_replaced_fd`): from now on the shim never reads, writes or
/// closes a descriptor of its own again ([`close`], [`poke`], [`drain`], [`eventfd_signal`]
/// and [`eventfd_clear`] do nothing); they stay open, unused, until the process ends.
pub fn abandon_private() {
    ABANDONED.store(true, core::sync::atomic::Ordering::Release);
}

/// Whether the shim may still use its own descriptors (see [`abandon_private`]).
pub(crate) fn private_usable() -> bool {
    !ABANDONED.load(core::sync::atomic::Ordering::Acquire)
}

/// close(2) of a descriptor of the shim's own (its private mark goes first: see
/// [`private`]).
pub fn close(fd: c_int) {
    if !private_usable() {
        return;
    }
    crate::fdtable::TABLE.unmark_private(fd);
    // SAFETY: the caller owns fd.
    unsafe { rdmashim_core::raw_syscall!(libc::SYS_close, fd) };
}

/// close_range(2) as a raw system call: 0, or -1 with errno set.
pub fn close_range(first: core::ffi::c_uint, last: core::ffi::c_uint, flags: c_int) -> c_int {
    // SAFETY: no pointers.
    unsafe { rdmashim_core::raw_syscall!(libc::SYS_close_range, first, last, flags) as c_int }
}

/// `fd` was just made by the shim for itself: the program's close-all loops must not close
/// it (`fdtable::Kind::Private`). Returns it.
pub fn private(fd: c_int) -> c_int {
    crate::fdtable::TABLE.mark_private(fd);
    fd
}

/// shutdown(2).
pub fn shutdown(fd: c_int, how: c_int) -> Result<(), Errno> {
    // SAFETY: no pointers.
    check(unsafe { rdmashim_core::raw_syscall!(libc::SYS_shutdown, fd, how) }).map(|_| ())
}

/// Resets the TCP connection of socket `fd` as a peer's RST would: `connect` with
/// `AF_UNSPEC` disconnects it (the kernel sends an RST and records ECONNRESET for the socket's
/// next call), on every fd of the same socket; then `shutdown(SHUT_RDWR)`, which fails on the
/// disconnected socket (ENOTCONN) but still marks both directions shut, so that the calls
/// after the first see what they see after a peer's RST — EOF for reads, EPIPE for writes —
/// not ENOTCONN (two threads of a program, one of which takes the ECONNRESET).
pub fn reset_socket(fd: c_int) -> Result<(), Errno> {
    // SAFETY: all-zero is a valid sockaddr; only its family is read.
    let mut sa: libc::sockaddr = unsafe { std::mem::zeroed() };
    sa.sa_family = libc::AF_UNSPEC as libc::sa_family_t;
    let len = std::mem::size_of::<libc::sockaddr>() as libc::socklen_t;
    // SAFETY: `sa` is a valid sockaddr of `len` bytes for the duration of the call.
    check(unsafe {
        rdmashim_core::raw_syscall!(libc::SYS_connect, fd, &sa as *const libc::sockaddr, len)
    })?;
    // (ENOTCONN expected: the marks are set all the same)
    let _ = shutdown(fd, libc::SHUT_RDWR);
    Ok(())
}

/// fcntl(fd, F_DUPFD_CLOEXEC, min): a private duplicate at or above `min` (falls back to any
/// number if `min` is beyond the fd limit).
pub fn dup_private(fd: c_int, min: c_int) -> Result<c_int, Errno> {
    // SAFETY: no pointers.
    let r = unsafe { rdmashim_core::raw_syscall!(libc::SYS_fcntl, fd, libc::F_DUPFD_CLOEXEC, min) };
    match check(r) {
        Ok(n) => Ok(private(n as c_int)),
        Err(e) if e.0 == libc::EINVAL || e.0 == libc::EMFILE => {
            // SAFETY: no pointers.
            let r = unsafe {
                rdmashim_core::raw_syscall!(libc::SYS_fcntl, fd, libc::F_DUPFD_CLOEXEC, 0)
            };
            check(r).map(|n| private(n as c_int))
        }
        Err(e) => Err(e),
    }
}

/// fcntl(fd, F_GETFL) has O_NONBLOCK (the open file description's, shared by dups).
pub fn is_nonblocking(fd: c_int) -> bool {
    // SAFETY: no pointers.
    let r = unsafe { rdmashim_core::raw_syscall!(libc::SYS_fcntl, fd, libc::F_GETFL) };
    r >= 0 && (r as c_int) & libc::O_NONBLOCK != 0
}

/// Whether `fd` is an open descriptor (`fcntl(F_GETFD)` succeeds; errno is left as it was).
pub fn is_open(fd: c_int) -> bool {
    let _e = crate::sys::ErrnoGuard::save();
    // SAFETY: no pointers.
    unsafe { rdmashim_core::raw_syscall!(libc::SYS_fcntl, fd, libc::F_GETFD) >= 0 }
}

/// The inode number of socket `fd`, or 0 if `fd` is not an open socket: on sockfs, where
/// every socket has its own, the socket's identity. One `fstat` (errno left as it was).
pub fn socket_inode(fd: c_int) -> u64 {
    let _e = crate::sys::ErrnoGuard::save();
    let mut st = MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: st is a valid out-pointer for a struct stat; a bad fd fails with EBADF.
    let r = unsafe { rdmashim_core::raw_syscall!(libc::SYS_fstat, fd, st.as_mut_ptr()) };
    if r < 0 {
        return 0;
    }
    // SAFETY: zero-initialised, and filled by the kernel on success.
    let st = unsafe { st.assume_init() };
    if st.st_mode & libc::S_IFMT == libc::S_IFSOCK {
        st.st_ino
    } else {
        0
    }
}

/// fcntl(fd, F_GETFD) has FD_CLOEXEC.
pub fn is_cloexec(fd: c_int) -> bool {
    // SAFETY: no pointers.
    let r = unsafe { rdmashim_core::raw_syscall!(libc::SYS_fcntl, fd, libc::F_GETFD) };
    r >= 0 && (r as c_int) & libc::FD_CLOEXEC != 0
}

/// A non-blocking, close-on-exec eventfd, moved to a number at or above `min` so that it does
/// not take the low numbers applications use with select(2).
pub fn eventfd(min: c_int) -> Result<c_int, Errno> {
    // SAFETY: no pointers.
    let r = unsafe {
        rdmashim_core::raw_syscall!(
            libc::SYS_eventfd2,
            0,
            libc::EFD_NONBLOCK | libc::EFD_CLOEXEC,
        )
    };
    Ok(private_at_or_above(check(r)? as c_int, min))
}

/// `fd`, just made by the shim for itself, marked private and moved at or above `min` as far
/// as the descriptor limit allows (a private duplicate, the original closed; `fd` itself if
/// no duplicate can be made).
pub(crate) fn private_at_or_above(fd: c_int, min: c_int) -> c_int {
    if fd >= min {
        return private(fd);
    }
    match dup_private(fd, min) {
        Ok(high) => {
            close(fd);
            high
        }
        Err(_) => private(fd),
    }
}

/// A non-blocking, close-on-exec pipe (read end, write end), both moved at or above `min`.
pub fn pipe_private(min: c_int) -> Result<(c_int, c_int), Errno> {
    let mut fds = [0 as c_int; 2];
    // SAFETY: fds is a writable array of two ints.
    let r = unsafe {
        rdmashim_core::raw_syscall!(
            libc::SYS_pipe2,
            fds.as_mut_ptr(),
            libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    check(r)?;
    Ok((
        private_at_or_above(fds[0], min),
        private_at_or_above(fds[1], min),
    ))
}

/// The file `fd` refers to, as (device, inode): two fds with the same identity refer to the
/// same pipe, socket or file.
pub fn file_id(fd: c_int) -> Option<(u64, u64)> {
    // SAFETY: an all-zero stat is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: st is a valid out-pointer; a bad fd fails with EBADF.
    let r = unsafe { rdmashim_core::raw_syscall!(libc::SYS_fstat, fd, &mut st as *mut libc::stat) };
    (r == 0).then_some((st.st_dev, st.st_ino))
}

/// Writes one byte to `fd` (a non-blocking pipe): a wake-up; a full pipe already is one.
pub fn poke(fd: c_int) {
    if !private_usable() {
        return;
    }
    let b = 1u8;
    // SAFETY: writes one byte from `b`.
    unsafe { rdmashim_core::raw_syscall!(libc::SYS_write, fd, &b as *const u8, 1usize) };
}

/// Reads whatever is in the non-blocking pipe `fd` (its wake-ups), until it is empty.
pub fn drain(fd: c_int) {
    if !private_usable() {
        return;
    }
    let mut buf = [0u8; 256];
    loop {
        // SAFETY: reads at most buf.len() bytes into buf.
        let r =
            unsafe { rdmashim_core::raw_syscall!(libc::SYS_read, fd, buf.as_mut_ptr(), buf.len()) };
        if r < buf.len() as c_long {
            return;
        }
    }
}

/// `n` zeroed 64-bit words in an anonymous *shared* mapping: a fork child shares them with
/// this process (and with its other children), each word an atomic. Never unmapped. Pages
/// never written cost nothing.
pub fn shared_words(n: usize) -> Option<&'static [core::sync::atomic::AtomicU64]> {
    let len = n.checked_mul(8)?;
    // SAFETY: anonymous shared mapping, no fd, no fixed address.
    let p = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    // SAFETY: the mapping is `len` bytes of zeroes, page-aligned (so aligned for AtomicU64,
    // whose zero is a valid value), never unmapped, and only ever accessed atomically.
    Some(unsafe { core::slice::from_raw_parts(p as *const core::sync::atomic::AtomicU64, n) })
}

/// Adds one to an eventfd (it becomes readable; a new edge for edge-triggered waiters).
pub fn eventfd_signal(fd: c_int) {
    if !private_usable() {
        return;
    }
    let one: u64 = 1;
    // SAFETY: writes the 8 bytes of `one`.
    unsafe { rdmashim_core::raw_syscall!(libc::SYS_write, fd, &one as *const u64, 8usize) };
}

/// Resets an eventfd to zero (not readable).
pub fn eventfd_clear(fd: c_int) {
    if !private_usable() {
        return;
    }
    let mut v: u64 = 0;
    // SAFETY: reads at most 8 bytes into `v`.
    unsafe { rdmashim_core::raw_syscall!(libc::SYS_read, fd, &mut v as *mut u64, 8usize) };
}

/// poll(2) through ppoll with a millisecond timeout (-1: forever). Returns the number of ready
/// entries.
pub fn poll(fds: &mut [libc::pollfd], timeout_ms: c_int) -> Result<usize, Errno> {
    let ts = (timeout_ms >= 0).then(|| libc::timespec {
        tv_sec: (timeout_ms / 1000) as libc::time_t,
        tv_nsec: ((timeout_ms % 1000) as libc::c_long) * 1_000_000,
    });
    // (no signal mask: the kernel ignores the mask size then)
    ppoll_raw(fds, ts.as_ref(), core::ptr::null())
}

/// ppoll(2) with the caller's timeout and signal mask pointers (passed through unchanged).
///
/// The pointers come from the application's own ppoll call; `sigmask` may be null.
pub fn ppoll_raw(
    fds: &mut [libc::pollfd],
    tmo: Option<&libc::timespec>,
    sigmask: *const libc::sigset_t,
) -> Result<usize, Errno> {
    let tsp = tmo.map_or(core::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: fds is valid for its length; tsp is null or a live reference; the signal mask
    // pointer is the application's (null or a valid sigset_t, as its ppoll call requires).
    let r = unsafe {
        rdmashim_core::raw_syscall!(
            libc::SYS_ppoll,
            fds.as_mut_ptr(),
            fds.len() as libc::nfds_t,
            tsp,
            sigmask,
            8usize,
        )
    };
    check(r)
}

/// epoll_create1(EPOLL_CLOEXEC), marked private and moved at or above `min` (as [`eventfd`]).
pub fn epoll_create(min: c_int) -> Result<c_int, Errno> {
    // SAFETY: no pointers.
    check(unsafe { rdmashim_core::raw_syscall!(libc::SYS_epoll_create1, libc::EPOLL_CLOEXEC) })
        .map(|v| private_at_or_above(v as c_int, min))
}

/// epoll_ctl(2).
pub fn epoll_ctl(epfd: c_int, op: c_int, fd: c_int, events: u32, data: u64) -> Result<(), Errno> {
    let mut ev = libc::epoll_event { events, u64: data };
    // SAFETY: ev is a valid epoll_event for the duration of the call.
    check(unsafe {
        rdmashim_core::raw_syscall!(libc::SYS_epoll_ctl, epfd, op, fd, &mut ev as *mut _)
    })
    .map(|_| ())
}

/// epoll_pwait(2) without a signal mask.
pub fn epoll_wait(
    epfd: c_int,
    out: &mut [libc::epoll_event],
    timeout_ms: c_int,
) -> Result<usize, Errno> {
    // SAFETY: out is a writable array of its length.
    let r = unsafe {
        rdmashim_core::raw_syscall!(
            libc::SYS_epoll_pwait,
            epfd,
            out.as_mut_ptr(),
            out.len() as c_int,
            timeout_ms,
            core::ptr::null::<c_void>(),
            8usize,
        )
    };
    check(r)
}

/// Whether a read of `fd` would not block now (data, or the end of the stream, or an error).
pub fn readable_now(fd: c_int) -> bool {
    poll_now(fd, libc::POLLIN) & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0
}

/// Sleeps `ms` milliseconds (poll(2) on nothing).
pub fn nap_ms(ms: c_int) {
    let _ = poll(&mut [], ms);
}

/// getsockopt(2) into `buf`; returns how many bytes the kernel wrote.
fn getsockopt_buf(fd: c_int, level: c_int, name: c_int, buf: &mut [u8]) -> Result<usize, Errno> {
    let mut len = buf.len() as socklen_t;
    // SAFETY: buf/len are a valid out-buffer of that length.
    let r = unsafe {
        rdmashim_core::raw_syscall!(
            libc::SYS_getsockopt,
            fd,
            level,
            name,
            buf.as_mut_ptr(),
            &mut len as *mut socklen_t,
        )
    };
    check(r).map(|_| (len as usize).min(buf.len()))
}

/// An `int` socket option.
pub fn get_int_opt(fd: c_int, level: c_int, name: c_int) -> Result<c_int, Errno> {
    let mut b = [0u8; size_of::<c_int>()];
    getsockopt_buf(fd, level, name, &mut b)?;
    Ok(c_int::from_ne_bytes(b))
}

/// Sets an `int` socket option.
pub fn set_int_opt(fd: c_int, level: c_int, name: c_int, v: c_int) -> Result<(), Errno> {
    // SAFETY: v is a valid int for the option's length.
    let r = unsafe {
        rdmashim_core::raw_syscall!(
            libc::SYS_setsockopt,
            fd,
            level,
            name,
            &v as *const c_int,
            size_of::<c_int>() as socklen_t,
        )
    };
    check(r).map(|_| ())
}

/// Whether a TCP socket's connect ever succeeded, even if the connection has ended since (its
/// state is then `CLOSE`, as a refused connect's is, and `getpeername` fails for both): the
/// peer acknowledged its SYN (`tcpi_bytes_acked`, offset 120 of `struct tcp_info` since
/// Linux 4.1, counts the SYN's sequence number; a refused or timed-out connect has none).
/// `None` if the kernel does not say.
pub fn ever_connected(fd: c_int) -> Option<bool> {
    const BYTES_ACKED: usize = 120;
    let mut b = [0u8; 256];
    let n = getsockopt_buf(fd, libc::IPPROTO_TCP, libc::TCP_INFO, &mut b).ok()?;
    let field = b
        .get(BYTES_ACKED..BYTES_ACKED + 8)
        .filter(|_| n >= BYTES_ACKED + 8)?;
    Some(u64::from_ne_bytes(field.try_into().ok()?) > 0)
}

/// `TCP_SAVED_SYN` of an accepted socket: the SYN's IP and TCP headers, copied into `buf`
/// (the kernel frees its copy). Returns the length; 0 if no SYN was saved.
pub fn saved_syn(fd: c_int, buf: &mut [u8]) -> Result<usize, Errno> {
    getsockopt_buf(fd, libc::IPPROTO_TCP, libc::TCP_SAVED_SYN, buf)
}

/// SO_RCVTIMEO / SO_SNDTIMEO as milliseconds (None: no timeout).
pub fn sock_timeout_ms(fd: c_int, name: c_int) -> Option<c_int> {
    let mut tv = libc::timeval {
        tv_sec: 0,
        tv_usec: 0,
    };
    let mut len = size_of::<libc::timeval>() as socklen_t;
    // SAFETY: tv/len are valid out-parameters for a timeval option.
    let r = unsafe {
        rdmashim_core::raw_syscall!(
            libc::SYS_getsockopt,
            fd,
            libc::SOL_SOCKET,
            name,
            &mut tv as *mut libc::timeval,
            &mut len as *mut socklen_t,
        )
    };
    if r < 0 || (tv.tv_sec == 0 && tv.tv_usec == 0) {
        return None;
    }
    let ms = tv.tv_sec * 1000 + (tv.tv_usec + 999) / 1000;
    Some(ms.clamp(1, i32::MAX as i64) as c_int)
}

/// FIONREAD of a socket.
pub fn fionread(fd: c_int) -> Result<c_int, Errno> {
    let mut v: c_int = 0;
    // SAFETY: FIONREAD writes an int to the pointer.
    check(unsafe {
        rdmashim_core::raw_syscall!(libc::SYS_ioctl, fd, libc::FIONREAD, &mut v as *mut c_int)
    })
    .map(|_| v)
}

fn name_of(fd: c_int, nr: c_long) -> Option<SocketAddr> {
    let mut ss = MaybeUninit::<sockaddr_storage>::zeroed();
    let mut len = size_of::<sockaddr_storage>() as socklen_t;
    // SAFETY: ss/len are valid out-parameters of the declared size.
    let r =
        unsafe { rdmashim_core::raw_syscall!(nr, fd, ss.as_mut_ptr(), &mut len as *mut socklen_t) };
    if r < 0 {
        return None;
    }
    // SAFETY: zero-initialised, and the kernel filled at most `len` bytes of it.
    rdmashim_core::sockaddr::from_storage(unsafe { &ss.assume_init() })
}

/// The peer address of a connected socket.
pub fn peer_addr(fd: c_int) -> Option<SocketAddr> {
    name_of(fd, libc::SYS_getpeername)
}

/// The local address of a socket.
pub fn local_addr(fd: c_int) -> Option<SocketAddr> {
    name_of(fd, libc::SYS_getsockname)
}

/// A v4-mapped IPv6 address as the IPv4 address it maps (rdma_cm and TCP may report the same
/// peer either way).
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// A socket address with its IP as [`canonical_ip`] gives it.
pub fn canonical_addr(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(canonical_ip(a.ip()), a.port())
}

/// Raises SIGPIPE in the calling thread (what a failed write without MSG_NOSIGNAL does).
pub fn raise_sigpipe() {
    // SAFETY: tgkill to our own thread with a valid signal number.
    unsafe {
        rdmashim_core::raw_syscall!(
            libc::SYS_tgkill,
            libc::getpid(),
            rdmashim_core::raw_syscall!(libc::SYS_gettid),
            libc::SIGPIPE,
        )
    };
}

/// A socket's O_NONBLOCK-independent readiness right now (`poll` with a zero timeout).
pub fn poll_now(fd: c_int, events: i16) -> i16 {
    let mut p = [libc::pollfd {
        fd,
        events,
        revents: 0,
    }];
    match poll(&mut p, 0) {
        Ok(_) => p[0].revents,
        Err(_) => 0,
    }
}

/// Gives the CPU to another runnable thread of this CPU's, if any (`sched_yield`; it returns
/// at once when there is none).
pub fn yield_cpu() {
    // SAFETY: no arguments.
    unsafe { rdmashim_core::raw_syscall!(libc::SYS_sched_yield) };
}

/// The calling thread's involuntary context switches so far (getrusage RUSAGE_THREAD), if
/// the kernel tells.
pub fn involuntary_switches() -> Option<u64> {
    let mut ru = core::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: writes one rusage we own.
    let r = unsafe { libc::getrusage(libc::RUSAGE_THREAD, ru.as_mut_ptr()) };
    // SAFETY: zero-initialised and filled by the kernel on success.
    (r == 0).then(|| unsafe { ru.assume_init() }.ru_nivcsw as u64)
}

/// An `Instant` read from the coarse clock ([`coarse_ms`]): no system call, a tick of error
/// at most (the coarse clock is the precise one's value at the last tick). For checks against
/// deadlines seconds away, made on every connection (the negative cache's).
pub fn coarse_instant() -> std::time::Instant {
    static BASE: std::sync::OnceLock<(std::time::Instant, u64)> = std::sync::OnceLock::new();
    let (at, ms) = *BASE.get_or_init(|| (std::time::Instant::now(), coarse_ms()));
    at + std::time::Duration::from_millis(coarse_ms().saturating_sub(ms))
}

/// The CPU time the calling thread has used (`CLOCK_THREAD_CPUTIME_ID`): for the cost of a
/// piece of the engine's own work, which time the thread spent preempted (a loaded host, an
/// emulated one) must not inflate. Zero where the clock cannot be read.
pub fn thread_cpu_time() -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec we own; the clock id is valid on every Linux since 2.6.12.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if r == 0 {
        std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    } else {
        std::time::Duration::ZERO
    }
}

/// The coarse clock's resolution (a tick; 4 ms where HZ is 250), for deadlines read on it that
/// must not come early: add it.
pub fn coarse_tick() -> std::time::Duration {
    static TICK: std::sync::OnceLock<std::time::Duration> = std::sync::OnceLock::new();
    *TICK.get_or_init(|| {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: writes one timespec we own; the clock id is valid on every Linux since 2.6.32.
        let r = unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
        if r == 0 {
            std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
        } else {
            std::time::Duration::from_millis(10)
        }
    })
}

/// The coarse monotonic clock in milliseconds (`CLOCK_MONOTONIC_COARSE`: served from the
/// vDSO at tick resolution, never a system call, even where the precise clock needs one, as
/// under emulation). For deadlines that tolerate a tick of error.
pub fn coarse_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec we own; the clock id is valid on every Linux since 2.6.32.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}
