//! Socket attributes a blocking data call needs on every wait — O_NONBLOCK, SO_RCVTIMEO,
//! SO_SNDTIMEO — cached per connection, so that a would-block does not cost an `fcntl` and a
//! `getsockopt` each time (a ping-pong of blocking calls pays them per message); and
//! TCP_USER_TIMEOUT, which the engine looks at every second for each upgraded connection.
//!
//! Only hooked calls change them in this process (fcntl F_SETFL, ioctl FIONBIO, setsockopt),
//! and those update the cache ([`Attrs::note_nonblocking`], [`Attrs::forget_timeouts`]).
//! Another process sharing the socket's open file description (a fork child) could change
//! O_NONBLOCK behind our back, so a connection that existed when this process forked asks
//! the kernel every time ([`before_fork`]).
//!
//! Each attribute is a [`Versioned`](crate::versioned::Versioned) cell, so that a lazy fill
//! racing with a change does not keep a stale value.

use crate::net;
use crate::versioned::{Versioned as Attr, UNKNOWN};
use core::ffi::c_int;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Forks this process has made (counted by a `pthread_atfork` prepare handler).
static FORKS: AtomicU32 = AtomicU32::new(0);

/// The `pthread_atfork` prepare handler's part: connections that exist now may share their
/// socket with the child from here on.
pub fn before_fork() {
    FORKS.fetch_add(1, Ordering::SeqCst);
}

/// The `pthread_atfork` parent handler's part: connections made from now on are not the
/// child's. With [`before_fork`]'s, every fork counts twice: a connection made while the fork
/// was under way has an odd-one-out count that a child compares on the safe side (see
/// `board`).
pub fn after_fork_parent() {
    FORKS.fetch_add(1, Ordering::SeqCst);
}

/// [`FORKS`] now (in a fork child: as it was at the fork).
pub fn forks() -> u32 {
    FORKS.load(Ordering::SeqCst)
}

/// A connection's cached socket attributes.
pub(crate) struct Attrs {
    /// [`FORKS`] when the connection was created.
    forks: u32,
    /// 0: blocking, 1: non-blocking.
    nonblock: Attr,
    /// Milliseconds, 0: none.
    rcvtimeo: Attr,
    sndtimeo: Attr,
    /// TCP_USER_TIMEOUT in milliseconds, 0: none.
    user_timeout: Attr,
}

impl Attrs {
    pub(crate) fn new() -> Attrs {
        Attrs {
            forks: FORKS.load(Ordering::SeqCst),
            nonblock: Attr::new(),
            rcvtimeo: Attr::new(),
            sndtimeo: Attr::new(),
            user_timeout: Attr::new(),
        }
    }

    /// [`FORKS`] when the connection was made.
    pub(crate) fn born(&self) -> u32 {
        self.forks
    }

    /// Whether the process forked since the connection was made (a child may hold its socket).
    pub(crate) fn shared_by_fork(&self) -> bool {
        !self.usable()
    }

    fn usable(&self) -> bool {
        FORKS.load(Ordering::Relaxed) == self.forks
    }

    /// Whether socket `fd` (of this connection) has O_NONBLOCK.
    pub(crate) fn is_nonblocking(&self, fd: c_int) -> bool {
        if !self.usable() {
            return net::is_nonblocking(fd);
        }
        self.nonblock.get_or(|| u32::from(net::is_nonblocking(fd))) != 0
    }

    /// A hooked call set O_NONBLOCK to `on` on the socket.
    pub(crate) fn note_nonblocking(&self, on: bool) {
        self.nonblock.set(u32::from(on));
    }

    /// SO_RCVTIMEO or SO_SNDTIMEO (`name`) of socket `fd` in milliseconds (None: none).
    pub(crate) fn timeout_ms(&self, fd: c_int, name: c_int) -> Option<c_int> {
        let read = || net::sock_timeout_ms(fd, name).map_or(0, |ms| ms as u32);
        let ms = match (self.usable(), name) {
            (false, _) => read(),
            (true, libc::SO_RCVTIMEO) => self.rcvtimeo.get_or(read),
            (true, _) => self.sndtimeo.get_or(read),
        };
        (ms != 0).then_some(ms as c_int)
    }

    /// TCP_USER_TIMEOUT of socket `fd` (None: none, the kernel's own retransmission limits).
    pub(crate) fn user_timeout(&self, fd: c_int) -> Option<Duration> {
        let read = || {
            net::get_int_opt(fd, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT)
                .map_or(0, |ms| ms.max(0) as u32)
        };
        let ms = if self.usable() {
            self.user_timeout.get_or(read)
        } else {
            read()
        };
        (ms != 0).then(|| Duration::from_millis(u64::from(ms)))
    }

    /// A hooked setsockopt may have changed the timeouts: ask the kernel next time.
    pub(crate) fn forget_timeouts(&self) {
        self.rcvtimeo.set(UNKNOWN);
        self.sndtimeo.set(UNKNOWN);
        self.user_timeout.set(UNKNOWN);
    }
}
