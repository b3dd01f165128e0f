//! Socket calls on a connection under the upgrade: receive and send (every read/write family
//! member maps onto [`recv`] and [`send`] through the [`RecvBuf`]/[`SendBuf`] views the hooks
//! build of the application's buffers), shutdown, the last close, FIONREAD.
//!
//! Rules (docs/upgrade.md §5):
//! - the connection's lock is never held across a wait: TCP calls made under it are
//!   non-blocking (`MSG_DONTWAIT`), and a call that must block releases the lock, busy-polls the
//!   link for [`crate::spin::wait::limit`], then sleeps in poll(2) on the socket (while that
//!   direction is on TCP) and the direction's eventfd (which the engine sets on a completion);
//! - bytes moved on TCP before the switch are counted exactly (`tcp_sent`, `note_tcp_read`),
//!   so the switch-over offset is exact whichever side writes first;
//! - the kernel's semantics are kept: partial reads, MSG_PEEK, MSG_WAITALL, EAGAIN for
//!   non-blocking sockets and MSG_DONTWAIT, SO_RCVTIMEO/SO_SNDTIMEO (EAGAIN at expiry), EINTR
//!   when a signal handler interrupts a wait (a restart for one with SA_RESTART when the
//!   socket has no timeout), EPIPE + SIGPIPE (unless MSG_NOSIGNAL), ECONNRESET.

use super::{Conn, Inner, Phase};
use crate::net;
use crate::outcome::Errno;
use crate::reason::FallbackReason;
use crate::signals::Delivery;
use crate::spin::wait::{spin_wait, Turn};
use crate::stats::{Bytes, Tally, Wait};
use core::ffi::c_int;
use rdmashim_core::Link;
use rdmashim_proto::{ErrorReason, Recv, SendError, StreamState};
use std::io::ErrorKind;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

/// The application's receive buffer(s).
pub trait RecvBuf {
    /// Total bytes the call can take.
    fn total(&self) -> usize;
    /// Receives from socket `fd` into the buffer from byte `at`, at most `max` bytes.
    fn recv_tcp(&mut self, fd: c_int, at: usize, max: usize, flags: c_int) -> Result<usize, Errno>;
    /// Copies `data` into the buffer at byte `at`.
    fn fill(&mut self, at: usize, data: &[u8]);
}

/// The application's bytes to send.
pub trait SendBuf {
    /// Total bytes of the call.
    fn total(&self) -> usize;
    /// Sends bytes `[at, at + max)` on socket `fd`.
    fn send_tcp(&mut self, fd: c_int, at: usize, max: usize, flags: c_int) -> Result<usize, Errno>;
    /// Copies bytes `[at, at + out.len())` into `out`.
    fn gather(&mut self, at: usize, out: &mut [u8]) -> Result<(), Errno>;
}

/// The pieces of bytes `[at, at + n)` of segments of lengths `lens` (scatter/gather lists),
/// in order: (segment, offset in it, length). Ends early where the segments do.
pub fn spans(
    lens: impl Iterator<Item = usize>,
    mut at: usize,
    mut n: usize,
) -> impl Iterator<Item = (usize, usize, usize)> {
    lens.enumerate().filter_map(move |(i, len)| {
        if n == 0 {
            return None;
        }
        if at >= len {
            at -= len;
            return None;
        }
        let (off, k) = (at, (len - at).min(n));
        at = 0;
        n -= k;
        Some((i, off, k))
    })
}

/// (segment, offset in it) of byte `at` of segments of lengths `lens`.
pub fn locate(lens: impl Iterator<Item = usize>, at: usize) -> Option<(usize, usize)> {
    spans(lens, at, 1).next().map(|(i, off, _)| (i, off))
}

/// One flat send buffer.
pub struct FlatSrc<'a>(pub &'a [u8]);

impl SendBuf for FlatSrc<'_> {
    fn total(&self) -> usize {
        self.0.len()
    }
    fn send_tcp(&mut self, fd: c_int, at: usize, max: usize, flags: c_int) -> Result<usize, Errno> {
        let end = (at + max).min(self.0.len());
        net::send(fd, &self.0[at..end], flags)
    }
    fn gather(&mut self, at: usize, out: &mut [u8]) -> Result<(), Errno> {
        out.copy_from_slice(&self.0[at..at + out.len()]);
        Ok(())
    }
}

/// Gather buffers (writev, sendmsg).
pub struct Gather<'a>(pub Vec<&'a [u8]>);

impl SendBuf for Gather<'_> {
    fn total(&self) -> usize {
        self.0.iter().map(|s| s.len()).sum()
    }
    fn send_tcp(&mut self, fd: c_int, at: usize, max: usize, flags: c_int) -> Result<usize, Errno> {
        // One segment at a time: a short write is always allowed.
        let Some((i, off)) = locate(self.0.iter().map(|s| s.len()), at) else {
            return Ok(0);
        };
        let seg = self.0[i];
        net::send(fd, &seg[off..(off + max).min(seg.len())], flags)
    }
    fn gather(&mut self, at: usize, out: &mut [u8]) -> Result<(), Errno> {
        let mut done = 0;
        for (i, off, k) in spans(self.0.iter().map(|s| s.len()), at, out.len()) {
            out[done..done + k].copy_from_slice(&self.0[i][off..off + k]);
            done += k;
        }
        Ok(())
    }
}

/// A file region (sendfile): read with pread at `offset + at`.
pub struct FileSrc {
    pub fd: c_int,
    pub offset: i64,
    pub count: usize,
}

impl SendBuf for FileSrc {
    fn total(&self) -> usize {
        self.count
    }
    fn send_tcp(
        &mut self,
        sock: c_int,
        at: usize,
        max: usize,
        flags: c_int,
    ) -> Result<usize, Errno> {
        let mut tmp = vec![0u8; max.min(256 << 10)];
        let n = net::pread(self.fd, &mut tmp, self.offset + at as i64)?;
        if n == 0 {
            return Ok(0);
        }
        net::send(sock, &tmp[..n], flags)
    }
    fn gather(&mut self, at: usize, out: &mut [u8]) -> Result<(), Errno> {
        let mut done = 0;
        while done < out.len() {
            let n = net::pread(self.fd, &mut out[done..], self.offset + (at + done) as i64)?;
            if n == 0 {
                return Err(Errno(libc::EIO));
            }
            done += n;
        }
        Ok(())
    }
}

/// The errno a call fails with when the connection failed for `r`.
pub fn errno_of(r: ErrorReason) -> Errno {
    Errno(match r.io_kind() {
        ErrorKind::ConnectionRefused => libc::ECONNREFUSED,
        ErrorKind::TimedOut => libc::ETIMEDOUT,
        ErrorKind::BrokenPipe => libc::EPIPE,
        _ => libc::ECONNRESET,
    })
}

enum Src {
    Tcp(Option<u64>),
    /// TCP bytes that are the shim's (after a path failure: the peer's failover record, and
    /// what its continuation repeats of what was read from the ring).
    Control,
    /// A ring's generation, the offset of the readable bytes in it, how many.
    Ring(u32, usize, usize),
    WouldBlock,
    Eof,
    Error(ErrorReason),
}

// (inline on the data path: a call and a return less a message, each return a block
// lookup under emulation — docs/bench/kinds.md, session 62)
#[inline(always)]
fn source(g: &Inner) -> Src {
    match &g.phase {
        Phase::Linked(l) => match l.conn().recv() {
            Recv::Tcp { limit } => Src::Tcp(limit),
            Recv::TcpControl { .. } => Src::Control,
            Recv::Ring { gen, offset, len } => Src::Ring(gen, offset, len),
            Recv::WouldBlock => Src::WouldBlock,
            Recv::Eof => Src::Eof,
            Recv::Error(r) => Src::Error(r),
        },
        _ => Src::Tcp(None),
    }
}

/// How a sleep that did not fail ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slept {
    /// Something may be ready (or the wait was spurious): look again.
    Woke,
    /// A handler installed with `SA_RESTART` ran: the call returns what it has moved so far,
    /// or, if nothing, goes on waiting, as the kernel restarts it.
    Restart,
}

/// What a blocked call that has moved `moved` bytes does after a sleep: `None` to look
/// again, or what it returns — the bytes moved, if any, in place of an error or a restart
/// (the kernel returns a partial count then too).
fn after_sleep(slept: Result<Slept, Errno>, moved: usize) -> Option<Result<usize, Errno>> {
    match slept {
        Ok(Slept::Woke) => None,
        Ok(Slept::Restart) if moved == 0 => None,
        Ok(Slept::Restart) => Some(Ok(moved)),
        Err(e) => Some(if moved > 0 { Ok(moved) } else { Err(e) }),
    }
}

/// How a blocked call waits.
struct Waiter {
    deadline: Option<Option<Instant>>,
    opt: c_int,
    /// Where the call's waits are counted.
    tally: Tally,
}

impl Waiter {
    fn new(opt: c_int, tally: Tally) -> Self {
        Waiter {
            deadline: None,
            opt,
            tally,
        }
    }

    /// Busy-polls the connection for at most the spin time, if its [`crate::spin::SpinGate`] lets it;
    /// returns the connection's lock, still held, as soon as `ready` holds (the caller goes on
    /// under it: a second lock and look would cost the data that just arrived a few hundred
    /// nanoseconds more). Tells the gate how the spin ended.
    ///
    /// `reads_ring`: the caller, given the lock with ring bytes readable, reads and consumes
    /// them at once, then performs the core's actions and settles (a read's consume does):
    /// a turn that finds such bytes leaves both to it rather than doing them first, on the
    /// data's path, and again after the consume — one pass of the core's actions less
    /// between a message's arrival and the application's answer. It returns their source
    /// with the lock, which nothing changed since (the read need not ask the core again).
    fn spin<'c>(
        &self,
        c: &'c Conn,
        reads_ring: bool,
        mut ready: impl FnMut(&Inner) -> bool,
    ) -> Option<(MutexGuard<'c, Inner>, Option<Src>)> {
        let turn = || {
            let mut g = c.lock_app();
            let Phase::Linked(l) = &mut g.phase else {
                return Turn::Leave(None);
            };
            // (the CQ only: what a sleep drives in full — the rdma_cm channel, timers —
            // waits the spin out, and a turn is on the path of the data it waits for)
            if l.spin_poll() {
                if reads_ring && g.committed {
                    if let src @ Src::Ring(..) = source(&g) {
                        return Turn::Found(Some((g, Some(src))));
                    }
                }
                if let Phase::Linked(l) = &mut g.phase {
                    l.push();
                }
                c.settle(&mut g);
            }
            if ready(&g) {
                Turn::Found(Some((g, None)))
            } else {
                Turn::Again
            }
        };
        spin_wait(&c.spin, self.tally, turn).flatten()
    }

    /// Sleeps on `sock` (for `sock_events`, if any), `efd` and the link's completion channel
    /// until one is ready, the socket timeout passes (EAGAIN) or a signal handler runs: EINTR,
    /// or [`Slept::Restart`] for a handler installed with `SA_RESTART` when the socket has no
    /// timeout for the call — where the kernel restarts a blocking socket call (signal(7)).
    /// Such a sleep holds the signals back and waits on a signalfd too, so that it knows which
    /// signal ended it before its handler runs; without one (no descriptor to spare) every
    /// handler interrupts, as a wait for readiness would.
    ///
    /// Waiting on the completion channel here, not only on `efd`, saves the hop through the
    /// engine thread (its wake-up, then ours) on every blocking read and write: while this
    /// thread waits (`Conn::sleepers`), the engine does not watch the channel
    /// ([`super::engine::watch_completions`]) and leaves any event it already had to it. Whatever
    /// woke it, the channel is drained before it returns, so an event the engine left is never
    /// lost; the CQ is left unarmed while this thread goes on with the connection
    /// ([`Conn::on_wake`]), so the completions it causes (the reply, the credits) raise no event
    /// for the engine to take.
    fn sleep(&mut self, c: &Conn, fd: c_int, sock_events: i16, efd: c_int) -> Result<Slept, Errno> {
        let deadline = *self.deadline.get_or_insert_with(|| {
            c.attrs
                .timeout_ms(fd, self.opt)
                .map(|ms| Instant::now() + Duration::from_millis(ms as u64))
        });
        let timeout = match deadline {
            None => -1,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(Errno(libc::EAGAIN));
                }
                left.as_millis().clamp(1, i32::MAX as u128) as c_int
            }
        };
        // Arm, then look once more (a completion between the last look and the arm raises no
        // event): if that found something, the caller re-checks instead of sleeping.
        let (comp, backing) = {
            let mut guard = c.lock();
            let g = &mut *guard;
            c.armed(g);
            let comp = match &mut g.phase {
                Phase::Linked(l) => {
                    l.arm();
                    if l.progress(false) {
                        c.settle(g);
                        return Ok(Slept::Woke);
                    }
                    if c.sleepers.fetch_add(1, Ordering::SeqCst) == 0 {
                        c.comp_off_engine(l, &mut g.comp_unwatched);
                    }
                    Some(l.comp_fd())
                }
                _ => None,
            };
            // (from here on, whoever changes the connection's readiness wakes `efd`)
            c.watch_efds(g);
            (comp, g.back != super::Back::None)
        };
        // Switching back to TCP: the eventfds are retired (signaled for good), and the end of
        // the switch is nobody's event: a nap, then a look.
        let (efd, timeout) = if backing {
            let nap = super::BACK_NAP;
            (-1, if timeout < 0 { nap } else { timeout.min(nap) })
        } else {
            (efd, timeout)
        };
        let watch = deadline
            .is_none()
            .then(|| crate::signals::SignalWatch::start(super::PRIVATE_FD_MIN))
            .flatten();
        let mut p = [
            libc::pollfd {
                fd: efd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: comp.unwrap_or(-1),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: watch.as_ref().map_or(-1, |w| w.fd()),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd,
                events: sock_events,
                revents: 0,
            },
        ];
        let n = if sock_events != 0 { 4 } else { 3 };
        self.tally.count_wait(Wait::Slept);
        let r = net::poll(&mut p[..n], timeout);
        // (what a signal that arrived does, read before its handler runs; a poll that
        // returned with the signalfd not readable saw none)
        let quiet = r.is_ok() && p[2].revents == 0;
        let signal = watch.map(|w| w.finish(quiet));
        c.unwatch_efds();
        if comp.is_some() {
            let mut g = c.lock();
            let last = c.sleepers.fetch_sub(1, Ordering::SeqCst) == 1;
            // (the last one leaves the CQ unarmed and the channel out of the engine's set;
            // whoever arms it for the engine puts it back: `Conn::on_completions`)
            c.on_wake(&mut g, last);
        }
        match (r, signal) {
            (_, Some(Delivery::Interrupting)) => Err(Errno(libc::EINTR)),
            (_, Some(Delivery::Restarting)) => Ok(Slept::Restart),
            (Ok(0), _) if deadline.is_some_and(|d| Instant::now() >= d) => Err(Errno(libc::EAGAIN)),
            (Ok(_), _) => Ok(Slept::Woke),
            (Err(e), _) => Err(e),
        }
    }
}

fn nonblocking(c: &Conn, fd: c_int, flags: c_int) -> bool {
    flags & libc::MSG_DONTWAIT != 0 || c.attrs.is_nonblocking(fd)
}

/// recv/read/readv/recvmsg on a connection under the upgrade. `flags` are the application's
/// MSG_* flags; the call's bytes and waits are counted by `tally` (the calling thread's).
pub fn recv(
    c: &Conn,
    tally: Tally,
    fd: c_int,
    buf: &mut dyn RecvBuf,
    flags: c_int,
) -> Result<usize, Errno> {
    super::bump(&c.uses, 1);
    c.fd_hint.store(fd, Ordering::Relaxed);
    let total = buf.total();
    let peek = flags & libc::MSG_PEEK != 0;
    let waitall = flags & libc::MSG_WAITALL != 0 && !peek;
    let tcp_flags = (flags & !libc::MSG_WAITALL) | libc::MSG_DONTWAIT;
    let mut got = 0usize;
    let mut waiter = Waiter::new(libc::SO_RCVTIMEO, tally);
    if total == 0 {
        return Ok(0);
    }
    // (the lock of a spin that found something, which had just driven the link: not again)
    let mut held = None;
    let mut naps = 0u32;
    // (the last sleep watched the socket for a failed-over peer's bytes; the socket read as
    // ended, with nothing to read: not watched again by this call)
    let mut tcp_watched = false;
    let mut tcp_ended = false;
    loop {
        // (the source as this turn or the spin found it, while nothing has changed it since)
        let mut known = None;
        let mut g = match held.take() {
            Some((g, src)) => {
                known = src;
                g
            }
            None => {
                let mut g = c.lock_app();
                // Ring bytes the core already knows of are read without polling first: in a
                // ping-pong the answer often lands during the previous write's post, and that
                // write's drive after the post has seen it.
                match source(&g) {
                    src @ Src::Ring(..) => known = Some(src),
                    _ => c.drive(&mut g, false),
                }
                g
            }
        };
        // A client's first bytes from the server may be its token: out of the stream first.
        if g.token == super::binding::TokenWait::Awaiting {
            known = None;
        }
        super::take_token(c, &mut g, fd);
        if g.token == super::binding::TokenWait::Awaiting && net::readable_now(fd) {
            // Part of a token (it is written whole and arrives in one segment, so this is a
            // moment at most): its bytes are not the application's; the rest follows. A
            // peer that never sends it gets its bytes read as data after TOKEN_PATIENCE.
            naps += 1;
            if naps > TOKEN_PATIENCE_MS {
                super::give_up_token(c, &mut g);
                super::token_decided(c);
                continue;
            }
            drop(g);
            if nonblocking(c, fd, flags) {
                return if got > 0 {
                    Ok(got)
                } else {
                    Err(Errno(libc::EAGAIN))
                };
            }
            net::nap_ms(1);
            continue;
        }
        let src = known.unwrap_or_else(|| source(&g));
        if matches!(src, Src::Ring(..)) {
            crate::fault::pass(crate::fault::Point::RingRecv);
            if crate::fault::fires(crate::fault::Point::PathFail) {
                if let Phase::Linked(l) = &mut g.phase {
                    l.fail_path("RDMASHIM_FAULT=path_fail (a failure on purpose)");
                }
                c.settle(&mut g);
                continue;
            }
        }
        let sock_events: i16;
        match src {
            // Nothing of the server's yet: the token may land between that look and a read
            // of the socket, so the socket is not read until the token is out of the stream
            // (the wait wakes when it is readable, and the loop looks again).
            Src::Tcp(_) if token_ahead(&g) => sock_events = libc::POLLIN | libc::POLLRDHUP,
            Src::Tcp(limit) => {
                let max = (total - got).min(limit.map_or(usize::MAX, |l| l as usize));
                match buf.recv_tcp(fd, got, max, tcp_flags) {
                    Ok(0) => {
                        if let Some(r) = pending_tcp_err(&mut g, got) {
                            return r;
                        }
                        if peek {
                            return Ok(got);
                        }
                        // TCP's end: the peer's EOF, or (after its SwitchOver) a vanished peer.
                        let Phase::Linked(l) = &mut g.phase else {
                            return Ok(got);
                        };
                        l.progress(true);
                        let _ = l.conn_mut().handle_tcp_eof();
                        c.settle(&mut g);
                        if matches!(source(&g), Src::Tcp(_)) {
                            return Ok(got);
                        }
                        continue;
                    }
                    Ok(n) => {
                        if !peek {
                            match &mut g.phase {
                                Phase::Linked(l) => {
                                    let _ = l.conn_mut().note_tcp_read(n as u64);
                                }
                                _ => g.tcp_received += n as u64,
                            }
                        }
                        tally.add_bytes(Bytes::TcpRx, n as u64);
                        super::bump(&c.live_rx, n as u64);
                        got += n;
                        if !waitall || got == total {
                            c.settle(&mut g);
                            return Ok(got);
                        }
                        continue;
                    }
                    Err(e) => match tcp_read_failed(c, &mut g, e, got) {
                        None => sock_events = libc::POLLIN | libc::POLLRDHUP,
                        Some(r) => return r,
                    },
                }
            }
            Src::Control => {
                // (not the application's bytes: read into the shim's own buffer, never
                // peeked — a peek must see the application's data behind them)
                let e = match c.take_control(&mut g, fd) {
                    Ok(false) => continue,
                    Ok(true) => Errno(libc::EAGAIN),
                    // (this call returns the socket's error: no longer kept for the next)
                    Err(e) => {
                        g.tcp_err = None;
                        e
                    }
                };
                match tcp_read_failed(c, &mut g, e, got) {
                    None => sock_events = libc::POLLIN | libc::POLLRDHUP,
                    Some(r) => return r,
                }
            }
            Src::Ring(gen, off, len) => {
                let Phase::Linked(l) = &mut g.phase else {
                    return Ok(got);
                };
                let n = len.min(total - got);
                buf.fill(got, l.ring(gen, off, n));
                got += n;
                if peek {
                    return Ok(got);
                }
                let _ = l.consume(n);
                // (a credit this made due goes now, and whatever an earlier pass left for want
                // of room in the send queue; the CQ waits for the next call)
                l.push();
                tally.add_bytes(Bytes::on_link(l.transport(), false), n as u64);
                super::bump(&c.live_rx, n as u64);
                c.settle(&mut g);
                if !waitall || got == total {
                    #[cfg(feature = "timeline")]
                    crate::timeline::read_returned();
                    return Ok(got);
                }
                continue;
            }
            Src::Eof => return Ok(got),
            Src::Error(r) => return if got > 0 { Ok(got) } else { Err(errno_of(r)) },
            Src::WouldBlock => {
                // The peer's stream is on the ring and nothing is there. With failover, a
                // blocking read also watches the socket (`Conn::look_under_ring`): bytes on
                // it now are the peer's continuation, an error the TCP connection's end.
                // Looked at only after a sleep; once ended, the socket is not watched again.
                let watch = !tcp_ended
                    && match &g.phase {
                        Phase::Linked(l) => l.conn().fails_over() && !l.conn().failed_over(),
                        _ => false,
                    };
                if watch && tcp_watched {
                    tcp_watched = false;
                    tcp_ended = c.look_under_ring(&mut g, fd);
                    c.settle(&mut g);
                    continue;
                }
                sock_events = if watch { libc::POLLIN } else { 0 };
            }
        }
        drop(g);
        if super::trace() {
            crate::shim_log!(
                crate::config::Level::Debug,
                "trace: recv fd={fd} would block (tcp={}) got={got}",
                sock_events != 0
            );
        }
        if got > 0 && !waitall {
            return Ok(got);
        }
        if nonblocking(c, fd, flags) {
            return if got > 0 {
                Ok(got)
            } else {
                Err(Errno(libc::EAGAIN))
            };
        }
        let tcp = sock_events != 0;
        held = waiter.spin(c, !peek, |g| match source(g) {
            Src::Tcp(_) | Src::Control => !tcp,
            Src::WouldBlock => false,
            _ => true,
        });
        if held.is_some() {
            continue;
        }
        tcp_watched = sock_events == libc::POLLIN;
        if let Some(r) = after_sleep(waiter.sleep(c, fd, sock_events, c.rd_efd), got) {
            return r;
        }
    }
}

/// The socket's error a write of the shim's took off it (`Inner::tcp_err`), where the kernel
/// would have returned it to this call: the bytes the call moved first, if any (the error
/// stays for the next call), else the error, once.
fn pending_tcp_err(g: &mut Inner, moved: usize) -> Option<Result<usize, Errno>> {
    let e = g.tcp_err?;
    if moved > 0 {
        return Some(Ok(moved));
    }
    g.tcp_err = None;
    Some(Err(e))
}

/// A read of an upgraded connection's socket failed with `e`: `None` for EAGAIN (the read
/// waits for the socket), else what the call returns — the bytes it got, or the error (a reset
/// ends the connection too).
fn tcp_read_failed(c: &Conn, g: &mut Inner, e: Errno, got: usize) -> Option<Result<usize, Errno>> {
    if e.0 == libc::EAGAIN {
        return pending_tcp_err(g, got);
    }
    if e.0 == libc::ECONNRESET {
        if let Phase::Linked(l) = &mut g.phase {
            l.conn_mut().handle_tcp_reset();
        }
        c.settle(g);
    }
    Some(if got > 0 { Ok(got) } else { Err(e) })
}

/// send/write of one buffer, `bytes`, on a connection under the upgrade: on a connection that
/// sends on the ring, its link's lane first (`Link::write_lane`: all the bytes copied into the
/// staging ring and their DATA posted, where the link's next action is that DATA), then what
/// the general path does after its post — the CQ polled, the bytes counted, the connection
/// settled; anything else goes the general way ([`send`]).
pub fn send_bytes(
    c: &Conn,
    tally: Tally,
    fd: c_int,
    bytes: &[u8],
    flags: c_int,
) -> Result<usize, Errno> {
    let mut g = c.lock_app();
    // (before the commit the general path drives the link first: that is what commits)
    if g.committed {
        if let Phase::Linked(l) = &mut g.phase {
            if let Some(n) = l.write_lane(bytes) {
                super::bump(&c.uses, 1);
                c.fd_hint.store(fd, Ordering::Relaxed);
                after_ring_write(c, l, tally, n);
                c.settle(&mut g);
                return Ok(n);
            }
        }
    }
    drop(g);
    send(c, tally, fd, &mut FlatSrc(bytes), flags)
}

/// After `n` bytes of a write went to the ring and their DATA was posted: the CQ (its
/// completions are not what anyone waits for; the core's actions again only if something
/// came), then the bytes counted by `tally` and in the live view.
fn after_ring_write(c: &Conn, l: &mut Link, tally: Tally, n: usize) {
    l.progress_after_push(false);
    tally.add_bytes(Bytes::on_link(l.transport(), true), n as u64);
    super::bump(&c.live_tx, n as u64);
}

/// send/write/writev/sendmsg/sendfile on a connection under the upgrade.
pub fn send(
    c: &Conn,
    tally: Tally,
    fd: c_int,
    buf: &mut dyn SendBuf,
    flags: c_int,
) -> Result<usize, Errno> {
    super::bump(&c.uses, 1);
    c.fd_hint.store(fd, Ordering::Relaxed);
    let total = buf.total();
    let tcp_flags = flags | libc::MSG_DONTWAIT;
    let mut sent = 0usize;
    let mut waiter = Waiter::new(libc::SO_SNDTIMEO, tally);
    if total == 0 {
        return net::send(fd, &[], flags);
    }
    let grant_of = |g: &mut Inner, want: usize| match &mut g.phase {
        Phase::Linked(l) => l.send(want),
        _ => Err(SendError::ViaTcp),
    };
    // (the lock of a spin that found room)
    let mut held = None;
    loop {
        let mut g = held.take().unwrap_or_else(|| c.lock_app());
        let want = total - sent;
        // Once this side sends on the ring, the link is driven after the bytes are staged
        // (which polls the CQ, performs the write and whatever else is due); before, only if
        // the ring has no room (its credits may be waiting in the CQ). Until then (the
        // handshake, TCP), first: that is what commits the switch.
        let grant = if g.committed {
            match grant_of(&mut g, want) {
                Err(SendError::WouldBlock) => {
                    c.drive(&mut g, false);
                    grant_of(&mut g, want)
                }
                other => other,
            }
        } else {
            c.drive(&mut g, false);
            grant_of(&mut g, want)
        };
        let sock_events: i16;
        match grant {
            Err(SendError::ViaTcp) => {
                if let Some(r) = pending_tcp_err(&mut g, sent) {
                    return r;
                }
                match buf.send_tcp(fd, sent, want, tcp_flags) {
                    Ok(n) => {
                        g.tcp_sent += n as u64;
                        tally.add_bytes(Bytes::TcpTx, n as u64);
                        super::bump(&c.live_tx, n as u64);
                        sent += n;
                        if sent == total {
                            return Ok(sent);
                        }
                        continue;
                    }
                    Err(e) if e.0 == libc::EAGAIN => sock_events = libc::POLLOUT,
                    Err(e) => return if sent > 0 { Ok(sent) } else { Err(e) },
                }
            }
            Ok(gr) => {
                let Phase::Linked(l) = &mut g.phase else {
                    return Ok(sent);
                };
                // (straight into the staging ring: no copy of our own)
                let staged = match l.staging(gr.cursor, gr.len) {
                    Some(dst) => buf.gather(sent, dst),
                    None => Err(Errno(libc::EIO)),
                };
                if let Err(e) = staged {
                    // The bytes were granted; the stream must not have a hole: abort it.
                    l.conn_mut().abort();
                    l.progress(false);
                    c.settle(&mut g);
                    return if sent > 0 { Ok(sent) } else { Err(e) };
                }
                // (the write first, then the CQ)
                l.push();
                after_ring_write(c, l, tally, gr.len);
                sent += gr.len;
                c.settle(&mut g);
                if sent == total {
                    return Ok(sent);
                }
                continue;
            }
            Err(SendError::WouldBlock) => sock_events = 0,
            Err(SendError::Shutdown) | Err(SendError::PeerClosed) => {
                if sent > 0 {
                    return Ok(sent);
                }
                if flags & libc::MSG_NOSIGNAL == 0 {
                    net::raise_sigpipe();
                }
                return Err(Errno(libc::EPIPE));
            }
            Err(SendError::Failed(r)) => {
                if sent > 0 {
                    return Ok(sent);
                }
                let e = errno_of(r);
                if e.0 == libc::EPIPE && flags & libc::MSG_NOSIGNAL == 0 {
                    net::raise_sigpipe();
                }
                return Err(e);
            }
        }
        drop(g);
        if nonblocking(c, fd, flags) {
            return if sent > 0 {
                Ok(sent)
            } else {
                Err(Errno(libc::EAGAIN))
            };
        }
        let tcp = sock_events != 0;
        if super::trace() {
            crate::shim_log!(
                crate::config::Level::Debug,
                "trace: send fd={fd} would block (tcp={tcp}) sent={sent}/{total}"
            );
        }
        if !tcp {
            held = waiter
                .spin(c, false, |g| match &g.phase {
                    Phase::Linked(l) => l.conn().readiness().writable,
                    _ => true,
                })
                .map(|(g, _)| g);
            if held.is_some() {
                continue;
            }
        }
        if let Some(r) = after_sleep(waiter.sleep(c, fd, sock_events, c.wr_efd), sent) {
            return r;
        }
    }
}

/// shutdown(2) on a connection under the upgrade.
pub fn shutdown(c: &Conn, fd: c_int, how: c_int) -> Result<(), Errno> {
    let mut g = c.lock();
    c.drive(&mut g, false);
    let wr = how == libc::SHUT_WR || how == libc::SHUT_RDWR;
    let rd = how == libc::SHUT_RD || how == libc::SHUT_RDWR;
    if how != libc::SHUT_WR && how != libc::SHUT_RD && how != libc::SHUT_RDWR {
        return Err(Errno(libc::EINVAL));
    }
    let committed = g.committed;
    match &mut g.phase {
        Phase::Linked(l) if committed => {
            if wr {
                let _ = l.conn_mut().shutdown_write();
            }
            if rd {
                l.conn_mut().shutdown_read();
            }
            l.progress(false);
        }
        Phase::Linked(l) => {
            // Still in the handshake: TCP carries this side's bytes and its FIN; a link that
            // establishes later commits and shuts its ring side at once.
            net::shutdown(fd, how)?;
            if rd {
                l.conn_mut().shutdown_read();
            }
            if wr {
                g.tcp_wr_shut = true;
            }
        }
        _ => {
            net::shutdown(fd, how)?;
            if wr {
                g.tcp_wr_shut = true;
            }
        }
    }
    c.settle(&mut g);
    super::ready::after_change(c, &mut g);
    Ok(())
}

/// The application closed the last fd of `c` (called before the real close): the ring gets
/// its Close after the queued bytes; the socket stays open (privately) until the ring is torn
/// down, so the peer sees the TCP FIN only after the ring's end. A connection that existed
/// when this process forked may still be open in a child (fork-per-connection servers close
/// their copy at once and the child serves it): it is switched back to TCP instead, and the
/// kernel ends the stream when the last process closes the socket, as on TCP.
///
/// `fd` may no longer be the socket (a close no hook saw, found later: the number may hold
/// another file now, or none): then nothing is done with it, and the connection ends on its
/// ring (its peer reads what was written, then EOF; a fork child that asks for it is told it
/// was reset).
pub fn close_last(c: &Arc<Conn>, fd: c_int) {
    #[cfg(feature = "timeline")]
    crate::timeline::finish();
    let fd = c.is_socket(fd).then_some(fd);
    let mut g = c.lock();
    g.closed = true;
    let shared = fd.is_some() && c.attrs.shared_by_fork();
    let coming_up = match &g.phase {
        Phase::Queued | Phase::Dialing(_) | Phase::Setup => true,
        Phase::Linked(l) => l.conn().state() == StreamState::Handshaking,
        _ => false,
    };
    if let (true, true, Some(fd)) = (shared, coming_up, fd) {
        // Its upgrade under way, and a fork child may hold the socket: the link is not
        // dropped when it comes up (the peer may have switched by then, and the child would
        // never see what it sent on the ring), but goes back to TCP (`Inner::give_back`).
        g.give_back = true;
        super::keep_back_sock(&mut g, fd);
    } else if !g.committed && matches!(g.phase, Phase::Linked(_)) && !shared {
        // Closed during the handshake: the connection ended before its upgrade completed.
        // Nothing was committed on this side, so the TCP close is the whole story (the link
        // is dropped; a peer that had already switched sees it fail, as a TCP peer would see
        // an RST after writing to a closed socket).
        c.fall_back(&mut g, c.closed_reason());
    }
    let back = g.give_back || (shared && give_back(c, &mut g, fd));
    let drain = match &mut g.phase {
        Phase::Linked(l) if !back => {
            l.conn_mut().close();
            l.progress(false);
            !l.is_disconnected()
        }
        _ => false,
    };
    // (after a path failure: the peer's record and repeats are read, now and as they come,
    // before the socket is let go — see `Conn::take_control`)
    let control = match fd {
        Some(fd) if !back => matches!(c.take_control(&mut g, fd), Ok(true)),
        _ => false,
    };
    let drain = drain || control;
    if let Some(fd) = fd.filter(|_| matches!(&g.phase, Phase::Linked(l) if l.conn().back_started()))
    {
        // Closed while switching back: the continuation still goes out (the socket is closed
        // after it, when the engine lets its own duplicate go).
        super::keep_back_sock(&mut g, fd);
    }
    c.settle(&mut g);
    drop(g);
    super::ready::forget_conn(c, fd.unwrap_or(-1));
    let sock = match fd {
        Some(fd) if drain => net::dup_private(fd, super::PRIVATE_FD_MIN).ok(),
        _ => None,
    };
    match super::world_if_created().and_then(|w| w.engine_if_started()) {
        Some(e) => e.closed(c.clone(), sock),
        None => {
            if let Some(s) = sock {
                net::close(s);
            }
        }
    }
}

/// The last close (or the exit) of a connection on the ring that a fork child may hold:
/// starts its switch back, or goes on with one under way (`fd`: the application's fd, whose
/// private duplicate writes the continuation; `None` to find one). False if it is not on the
/// ring or cannot go back: then it closes on the ring as usual, and a child that asks for it
/// is told it was reset.
pub(super) fn give_back(c: &Conn, g: &mut Inner, fd: Option<c_int>) -> bool {
    if !matches!(g.phase, Phase::Linked(_)) {
        return false;
    }
    match c.hand_back(g, fd) {
        Ok(()) => true,
        Err(e) => {
            crate::shim_log!(
                crate::config::Level::Debug,
                "{} -> {}: shared with a fork child, cannot go back to TCP ({e}); closed on the ring",
                c.local,
                c.peer
            );
            super::board_reset(c);
            false
        }
    }
}

/// How many 1 ms naps a blocked read waits for the rest of a token that began to arrive.
const TOKEN_PATIENCE_MS: u32 = 200;

/// Whether the server's token may still come at the head of a client's socket, so that
/// nothing of it may be read for the application: the wait is not decided (and the connect,
/// if it was still in progress, did not fail: a failed one's socket reads its error).
fn token_ahead(g: &Inner) -> bool {
    g.token == super::binding::TokenWait::Awaiting
        && (g.pending.is_none() || super::pending_outcome(g) != Some(false))
}

/// FIONREAD: bytes a read would return now.
pub fn fionread(c: &Conn, fd: c_int) -> Result<c_int, Errno> {
    let mut g = c.lock();
    super::take_token(c, &mut g, fd);
    c.drive(&mut g, false);
    match source(&g) {
        // (what came since the look may be the token's)
        Src::Tcp(_) if token_ahead(&g) => Ok(0),
        Src::Tcp(limit) => {
            let n = net::fionread(fd)?;
            Ok(limit.map_or(n, |l| (n as u64).min(l) as c_int))
        }
        Src::Ring(_, _, len) => Ok(len.min(i32::MAX as usize) as c_int),
        _ => Ok(0),
    }
}

/// At exit: close the ring side of a connection the application left open, and wait (until
/// `deadline`) for its teardown, so the bytes it accepted reach the peer before the process's
/// queue pairs are destroyed (the kernel then closes the socket, as it would have anyway).
pub fn flush_before_exit(c: &Conn, deadline: Instant) {
    {
        let mut g = c.lock();
        // Not decided yet: the process ends first. Counted once, like every connection (a
        // connect that never completed is none).
        if g.pending.is_some() && super::pending_outcome(&g) != Some(true) {
            c.abandon(&mut g);
            return;
        }
        let undecided = match &g.phase {
            Phase::Awaiting => Some(FallbackReason::NoUpgradeRequest),
            Phase::Queued | Phase::Dialing(_) | Phase::Setup => Some(FallbackReason::ClosedEarly),
            Phase::Linked(l) if !g.committed && l.conn().state() == StreamState::Handshaking => {
                Some(FallbackReason::ClosedEarly)
            }
            _ => None,
        };
        if let Some(r) = undecided {
            c.fall_back(&mut g, r);
            return;
        }
        c.decide(&mut g, true);
        let closed = g.closed;
        // (a fork child may hold the socket and go on with it: back to TCP, not closed)
        let back = matches!(&g.phase, Phase::Linked(l) if l.conn().back_started())
            || (!closed && c.attrs.shared_by_fork() && give_back(c, &mut g, None));
        if let Phase::Linked(l) = &mut g.phase {
            if !closed && !back {
                l.conn_mut().close();
            }
        } else {
            return;
        }
    }
    loop {
        let mut g = c.lock();
        c.drive(&mut g, true);
        // (after a path failure: the peer's record and repeats, see `Conn::take_control`)
        let due = matches!(&g.phase, Phase::Linked(l) if l.conn().control_due().is_some());
        let control = match due.then(|| c.back_fd(&mut g)).flatten() {
            Some(fd) => matches!(c.take_control(&mut g, fd), Ok(true)),
            None => false,
        };
        let done = match &g.phase {
            Phase::Linked(l) => l.is_disconnected() && l.conn().resume_due().is_none() && !control,
            _ => true,
        };
        drop(g);
        if done || Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(Duration::from_micros(500));
    }
}

/// How long an exec (or a spawn) waits for its connections to be back on TCP before it resets
/// those that are not.
pub(crate) const HAND_BACK_WAIT: Duration = Duration::from_secs(2);

/// Before an exec, a spawn whose child inherits the sockets, or a change of credentials
/// (`what`, for the log): returns each connection of `conns` (with an fd of the application's
/// that refers to it) to plain TCP, so that whatever image uses the socket next finds the
/// stream where it is. A connection whose upgrade is undecided stays TCP (`reason`); one in
/// its handshake or being set up is waited for, then switched back; one on the ring switches
/// back (protocol §8.5: one round trip, then the continuation is written). Waits until all
/// are plain TCP, at most [`HAND_BACK_WAIT`] (longer while a dial is under way: until its own
/// deadline, and the whole wait again from then); a connection that cannot go back (its peer cannot switch back, or closed on the
/// ring, or it failed) or did not in time is reset: the new image sees a dead socket rather
/// than a stream with a hole.
pub fn hand_back_all(conns: &[(Arc<Conn>, c_int)], what: &str, reason: FallbackReason) {
    let mut deadline = Instant::now() + HAND_BACK_WAIT;
    let mut left: Vec<&(Arc<Conn>, c_int)> = conns.iter().collect();
    loop {
        let mut dialing = false;
        left.retain(|(c, fd)| {
            let step = back_step(c, &mut c.lock(), Some(*fd), reason);
            dialing |= matches!(step, Step::Dialing);
            match step {
                Step::Tcp => false,
                Step::Wait | Step::Dialing => true,
                Step::Cannot(why) => {
                    reset_shared(c, Some(*fd), what, &why);
                    false
                }
            }
        });
        if left.is_empty() {
            break;
        }
        // (a connection whose dial is under way gets the whole wait for its switch back once
        // the dial has ended: a dial that outlasted the wait would otherwise leave it none)
        if dialing {
            deadline = Instant::now() + HAND_BACK_WAIT;
        } else if Instant::now() >= deadline {
            break;
        }
        net::nap_ms(1);
    }
    for (c, fd) in left {
        reset_shared(c, Some(*fd), what, "not back on TCP in time");
    }
}

/// Where a return to plain TCP stands (see [`back_step`]).
pub(crate) enum Step {
    /// The connection is plain TCP: the socket has the whole stream.
    Tcp,
    /// Not yet (a handshake, a setup, a connect or token to wait for, a switch back under way).
    Wait,
    /// Not yet: a dial is under way. It ends by its own deadline, on the ring or on TCP, and
    /// is waited for past the caller's: resetting it would break a stream that nothing has
    /// moved off TCP yet.
    Dialing,
    /// It cannot go back (why): the peer cannot switch back, or the ring has ended.
    Cannot(String),
}

/// One step of returning `c` to plain TCP for another image or process that will use the
/// socket: an undecided connection stays TCP (`reason`); one in its handshake or being set
/// up is waited for; one on the ring is switched back (protocol §8.5; `fd`: an fd of the
/// application's for it, or `None` to find one). Call again while it says [`Step::Wait`].
pub(crate) fn back_step(
    c: &Conn,
    g: &mut Inner,
    fd: Option<c_int>,
    reason: FallbackReason,
) -> Step {
    c.drive(g, true);
    match &g.phase {
        Phase::Fallen => Step::Tcp,
        // (a client's connect still in progress, or the server's token still to come: the
        // engine takes the token out of the stream first, or the other user would read it)
        Phase::Queued if g.pending.is_some() || g.token == super::binding::TokenWait::Awaiting => {
            Step::Wait
        }
        Phase::Queued | Phase::Awaiting => {
            c.fall_back(g, reason);
            Step::Tcp
        }
        // (a client's set-up is its dial's: its endpoint being built, its request to go)
        Phase::Dialing(_) => Step::Dialing,
        Phase::Setup if c.side == rdmashim_proto::Side::Client => Step::Dialing,
        Phase::Setup => Step::Wait,
        Phase::Linked(l) if l.conn().back_started() => Step::Wait,
        Phase::Linked(l) if l.conn().state() == StreamState::Handshaking => Step::Wait,
        Phase::Linked(_) => match c.hand_back(g, fd) {
            Ok(()) if matches!(g.phase, Phase::Fallen) => Step::Tcp,
            Ok(()) => Step::Wait,
            Err(e) => Step::Cannot(e.to_string()),
        },
    }
}

/// A connection that another image or process will use (an exec's new image, a spawned or
/// forked child: `what`) and that cannot go back to TCP: reset, so that whoever uses the
/// socket sees ECONNRESET, not a stream with a hole. `fd`: an fd of the application's for
/// it, if the caller has one.
pub(crate) fn reset_shared(c: &Conn, fd: Option<c_int>, what: &str, why: &str) {
    let mut g = c.lock();
    let sock = fd.or_else(|| c.back_fd(&mut g));
    if let Phase::Linked(l) = &mut g.phase {
        l.conn_mut().abort();
        l.progress(false);
        drop(g);
        if let Some(fd) = sock {
            let _ = net::shutdown(fd, libc::SHUT_RDWR);
        }
        crate::shim_log!(
            crate::config::Level::Warn,
            "{what}: {} -> {} is on RDMA and is shared with another image or process, and cannot go back to TCP ({why}); reset",
            c.local,
            c.peer
        );
    }
}
