//! Socket life cycle: socket, socketpair, bind, listen, accept, accept4, connect, getsockopt,
//! setsockopt, getsockname, getpeername, shutdown.

use super::conn;
use super::hook;
use crate::fdtable::{flags, FdEntry, Kind, TABLE};
use crate::outcome::Outcome::{Handled, PassThrough};
use crate::track;
use core::ffi::{c_int, c_void};
use libc::{sockaddr, socklen_t};

hook! {
    /// socket(2): AF_INET/AF_INET6 + SOCK_STREAM (+ protocol 0/TCP) becomes a TCP candidate;
    /// every other socket is recorded as `Other` (which also overwrites any stale entry).
    fn socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int;
    id: Socket;
    fallback: syscall(SYS_socket; domain, ty, protocol);
    |real, cx| {
        // SAFETY: the caller's arguments.
        let fd = unsafe { real(domain, ty, protocol) };
        if fd >= 0 {
            conn::set_new(fd, track::socket_entry(domain, ty, protocol));
        }
        Handled(fd)
    }
}

hook! {
    /// socketpair(2): AF_UNIX (or other local) pairs are never upgraded; both fds are `Other`.
    fn socketpair(domain: c_int, ty: c_int, protocol: c_int, sv: *mut c_int) -> c_int;
    id: Socketpair;
    fallback: syscall(SYS_socketpair; domain, ty, protocol, sv);
    |real, cx| {
        // SAFETY: the caller's arguments.
        let r = unsafe { real(domain, ty, protocol, sv) };
        if r == 0 && !sv.is_null() {
            // SAFETY: on success the kernel wrote two fds to the caller's sv[2].
            let (a, b) = unsafe { (*sv, *sv.add(1)) };
            let e = FdEntry::new(Kind::Other, 0, 0);
            conn::set_new(a, e);
            conn::set_new(b, e);
        }
        Handled(r)
    }
}

hook! {
    /// bind(2): pass-through (the upgrade will note the address of future listeners).
    fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int;
    id: Bind;
    fallback: syscall(SYS_bind; fd, addr, len);
    fast: always(crate::stats::fd_shard(fd));
    |_real, _cx| { PassThrough }
}

hook! {
    /// listen(2): a TCP candidate becomes a listener (where the upgrade will start its rdma_cm
    /// listener on the same address and port).
    fn listen(fd: c_int, backlog: c_int) -> c_int;
    id: Listen;
    fallback: syscall(SYS_listen; fd, backlog);
    |real, cx| {
        let candidate = conn::entry_or_classify(fd).kind() == Kind::TcpCandidate;
        let saving = candidate && conn::save_syns(fd);
        // SAFETY: the caller's arguments.
        let r = unsafe { real(fd, backlog) };
        if r == 0 {
            let e = conn::entry_or_classify(fd);
            if e.kind() == Kind::TcpCandidate {
                TABLE.update(fd, |e| {
                    (e.kind() == Kind::TcpCandidate)
                        .then(|| e.with_kind(Kind::Listening).with_flags(flags::LISTEN_SEEN))
                });
                conn::start_listener(fd, saving);
            }
        } else if saving {
            let _e = crate::sys::ErrnoGuard::save();
            crate::upgrade::save_syns(fd, false);
        }
        Handled(r)
    }
}

/// Before accept/accept4 on `lfd`: a listening socket whose `listen` no hook saw is adopted
/// at its first accept, before the call (a connection that comes while it waits has its SYN
/// kept: see [`conn::adopt_listener`]). Accepts of other threads on it wait for the adoption
/// (haproxy's threads all accept on each listener: one of them, let through while another
/// adopted it, took the first connection past the upgrade).
fn before_accept(lfd: c_int) {
    let l = conn::entry_or_classify(lfd);
    if l.kind() == Kind::Listening && !l.has(flags::LISTEN_SEEN) {
        conn::adopt_listener(lfd);
    }
}

/// After accept/accept4 returned `nfd` on listener `lfd`: record and count the connection.
fn accepted(lfd: c_int, nfd: c_int, accept_flags: c_int) {
    let l = conn::entry_or_classify(lfd);
    let e = track::accepted_entry(l, accept_flags);
    conn::set_new(nfd, e);
    if e.kind() == Kind::TcpCandidate && !conn::start_server(l, nfd) {
        conn::account(nfd);
    }
}

hook! {
    /// accept(2): each accepted TCP connection is counted once.
    fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    id: Accept;
    fallback: syscall(SYS_accept; fd, addr, len);
    |real, cx| {
        before_accept(fd);
        // SAFETY: the caller's arguments.
        let nfd = unsafe { real(fd, addr, len) };
        if nfd >= 0 {
            accepted(fd, nfd, 0);
        }
        Handled(nfd)
    }
}

hook! {
    /// accept4(2): as accept, with SOCK_NONBLOCK/SOCK_CLOEXEC recorded.
    fn accept4(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, fl: c_int) -> c_int;
    id: Accept4;
    fallback: syscall(SYS_accept4; fd, addr, len, fl);
    |real, cx| {
        before_accept(fd);
        // SAFETY: the caller's arguments.
        let nfd = unsafe { real(fd, addr, len, fl) };
        if nfd >= 0 {
            accepted(fd, nfd, fl);
        }
        Handled(nfd)
    }
}

hook! {
    /// connect(2): always to the kernel. Success counts the connection; EINPROGRESS (or EINTR,
    /// after which the connect continues asynchronously) marks it pending until its completion
    /// is seen (SO_ERROR = 0, getpeername, I/O, a second connect, or at close/exit).
    fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int;
    id: Connect;
    fallback: syscall(SYS_connect; fd, addr, len);
    |real, cx| {
        let e = conn::entry_or_classify(fd);
        if e.kind() != Kind::TcpCandidate {
            return PassThrough;
        }
        let mark = conn::mark_syn(fd, e, addr, len);
        let marked = mark.is_some();
        // SAFETY: the caller's arguments.
        let r = unsafe { real(fd, addr, len) };
        conn::unmark_syn(fd, mark);
        let started = matches!(crate::sys::errno().0, libc::EINPROGRESS | libc::EINTR);
        if (r == 0 || started)
            && !e.has(flags::COUNTED)
            && conn::start_client(fd, e, addr, len, r != 0, marked)
        {
            return Handled(r);
        }
        if r == 0 {
            conn::account(fd);
        } else {
            match crate::sys::errno().0 {
                libc::EINPROGRESS | libc::EINTR => {
                    TABLE.update(fd, |e| {
                        (e.kind() == Kind::TcpCandidate && !e.has(flags::COUNTED))
                            .then(|| e.with_flags(flags::CONNECTING))
                    });
                }
                libc::EISCONN => conn::account(fd),
                _ => {}
            }
        }
        Handled(r)
    }
}

hook! {
    /// getsockopt(2): SO_ERROR = 0 on a pending connect may mean it completed (checked with
    /// getpeername); on an upgraded connection, it is the socket error a write of the shim's
    /// took off the socket, if any (`Inner::tcp_err`: the application's, reported once).
    fn getsockopt(fd: c_int, level: c_int, name: c_int, val: *mut c_void, len: *mut socklen_t) -> c_int;
    id: Getsockopt;
    fallback: syscall(SYS_getsockopt; fd, level, name, val, len);
    |real, cx| {
        if level != libc::SOL_SOCKET || name != libc::SO_ERROR {
            return PassThrough;
        }
        // SAFETY: the caller's arguments.
        let r = unsafe { real(fd, level, name, val, len) };
        if r == 0 && !val.is_null() {
            let e = TABLE.get(fd);
            // SAFETY: SO_ERROR succeeded, so val points to at least an int the kernel wrote.
            let none = unsafe { (val as *const c_int).read_unaligned() } == 0;
            if none && e.has(flags::CONNECTING) {
                conn::complete_if_connected(fd, e);
            } else if none && e.kind() == crate::fdtable::Kind::Upgraded {
                // SAFETY: the caller's length pointer, non-null as the call succeeded.
                let whole = unsafe { len.read_unaligned() } as usize >= core::mem::size_of::<c_int>();
                // (taken only where it can be handed over: else the next data call has it)
                if let Some(err) = super::up::own_conn(fd)
                    .filter(|_| whole)
                    .and_then(|c| c.take_tcp_err())
                {
                    // SAFETY: val holds at least an int (the length says so).
                    unsafe { (val as *mut c_int).write_unaligned(err.0) };
                }
            }
        }
        Handled(r)
    }
}

/// SO_RCVTIMEO/SO_SNDTIMEO and their 64-bit-time variants (asm-generic/socket.h), and
/// TCP_USER_TIMEOUT.
fn is_timeout_opt(level: c_int, name: c_int) -> bool {
    const SO_RCVTIMEO_NEW: c_int = 66;
    const SO_SNDTIMEO_NEW: c_int = 67;
    (level == libc::SOL_SOCKET
        && matches!(
            name,
            libc::SO_RCVTIMEO | libc::SO_SNDTIMEO | SO_RCVTIMEO_NEW | SO_SNDTIMEO_NEW
        ))
        || (level == libc::IPPROTO_TCP && name == libc::TCP_USER_TIMEOUT)
}

hook! {
    /// setsockopt(2): pass-through; a connection under the upgrade forgets its cached
    /// timeouts when they change.
    fn setsockopt(fd: c_int, level: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int;
    id: Setsockopt;
    fallback: syscall(SYS_setsockopt; fd, level, name, val, len);
    fast: not_tcp(fd);
    |real, _cx| {
        if !is_timeout_opt(level, name) {
            return PassThrough;
        }
        // SAFETY: the caller's arguments.
        let r = unsafe { real(fd, level, name, val, len) };
        if r == 0 {
            if let Some(c) = super::up::own_conn(fd) {
                c.attrs.forget_timeouts();
            }
        }
        Handled(r)
    }
}

hook! {
    /// getsockname(2): pass-through (the fd is always the real kernel socket).
    fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    id: Getsockname;
    fallback: syscall(SYS_getsockname; fd, addr, len);
    fast: always(crate::stats::fd_shard(fd));
    |_real, _cx| { PassThrough }
}

hook! {
    /// getpeername(2): success on a pending connect means it completed.
    fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    id: Getpeername;
    fallback: syscall(SYS_getpeername; fd, addr, len);
    |real, cx| {
        // SAFETY: the caller's arguments.
        let r = unsafe { real(fd, addr, len) };
        if r == 0 {
            let e = TABLE.get(fd);
            if e.has(flags::CONNECTING) && !e.has(flags::COUNTED) {
                conn::account(fd);
            }
        }
        Handled(r)
    }
}

hook! {
    /// shutdown(2): on an upgraded connection, ShutdownWrite/local read shut on the ring.
    fn shutdown(fd: c_int, how: c_int) -> c_int;
    id: Shutdown;
    fallback: syscall(SYS_shutdown; fd, how);
    fast: not_tcp(fd);
    |_real, _cx| {
        match super::up::of_fd(fd) {
            super::up::Up::Conn(c) => match crate::upgrade::data::shutdown(&c, fd, how) {
                Ok(()) => Handled(0),
                Err(e) => crate::outcome::Outcome::Fail(e),
            },
            _ => PassThrough,
        }
    }
}
