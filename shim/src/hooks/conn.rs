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
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};

type GetpeernameFn = unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int;
type GetsockoptFn = unsafe extern "C" fn(c_int, c_int, c_int, *mut c_void, *mut socklen_t) -> c_int;

/// The peer address of `fd` (real getpeername), errno preserved.
fn peer(fd: c_int) -> Option<SocketAddr> {
    let _e = ErrnoGuard::save();
    // SAFETY: GetpeernameFn is getpeername's prototype.
    let real = unsafe { crate::real::get::<GetpeernameFn>(Hook::Getpeername) }?;
    let mut ss = MaybeUninit::<sockaddr_storage>::zeroed();
    let mut len = size_of::<sockaddr_storage>() as socklen_t;
    // SAFETY: ss/len are valid out-parameters of the declared size.
    let r = unsafe { real(fd, ss.as_mut_ptr().cast(), &mut len) };
    // SAFETY: zero-initialised, and getpeername filled at most `len` bytes of it.
    (r == 0)
        .then(|| unsafe { ss.assume_init() })
        .and_then(|ss| rdmashim_core::sockaddr::from_storage(&ss))
}

fn class_of(a: &SocketAddr) -> PeerClass {
    match a.ip() {
        IpAddr::V4(ip) => reason::classify_v4(ip.octets()),
        IpAddr::V6(ip) => reason::classify_v6(ip.octets()),
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
    let stashed = claimed
        .map(|(old, _)| old)
        .filter(|e| e.kind() == Kind::TcpCandidate && e.slot() != 0)
        .and_then(|e| FallbackReason::from_index((e.slot() - 1) as u8));
    // A reason stashed after the peer's address was classified (not loopback, or not
    // upgradable) is the answer as it stands: no getpeername per connection to a cached peer.
    let classified = matches!(
        stashed,
        Some(
            FallbackReason::NegativeCache
                | FallbackReason::NotUpgradableAddress
                | FallbackReason::NoUpgradeRequest
                | FallbackReason::Policy
                | FallbackReason::FdLimit
        )
    );
    let r: FallbackReason = match (probe::host_reason(), stashed) {
        (Some(r), _) => r,
        (None, Some(s)) if classified => s,
        (None, _) => {
            let class = peer(fd).as_ref().map_or(PeerClass::Other, class_of);
            match (class, probe::rdma_reason()) {
                // (a peer of another host, and no RDMA here)
                (PeerClass::Other, Some(r)) => r,
                // (a loopback peer, with same-host upgrades on: why its own attempt failed)
                (PeerClass::Loopback, _) if crate::config::get().local => {
                    stashed.unwrap_or(FallbackReason::PlainPeer)
                }
                _ => match reason::decide(None, class) {
                    FallbackReason::TransportUnavailable => {
                        stashed.unwrap_or(FallbackReason::TransportUnavailable)
                    }
                    r => r,
                },
            }
        }
    };
    stats::count_fallback(r);
    shim_log!(
        Level::Debug,
        "fd {fd}: connection stays on TCP ({})",
        r.name()
    );
    crate::live::tcp_conn(fd, r);
}

/// Remembers why the upgrade of `fd` was not attempted, for [`account`].
fn stash(fd: c_int, r: FallbackReason) {
    TABLE.update(fd, |e| {
        (e.kind() == Kind::TcpCandidate).then(|| e.with_slot(r as u64 + 1))
    });
}

/// The reason [`stash`] remembered for `fd`, if any.
fn stashed(fd: c_int) -> Option<FallbackReason> {
    let e = TABLE.get(fd);
    (e.kind() == Kind::TcpCandidate && e.slot() != 0)
        .then(|| FallbackReason::from_index((e.slot() - 1) as u8))
        .flatten()
}

/// The socket address the application passed to connect.
fn sockaddr_of(addr: *const sockaddr, len: socklen_t) -> Option<SocketAddr> {
    // SAFETY: connect's contract: `addr` points to `len` readable bytes (or is null).
    unsafe { rdmashim_core::sockaddr::from_raw(addr, len as usize) }
}

/// Before connect() on TCP candidate `fd` (entry `e`) to `addr`: marks the SYN the call will
/// send if the connection may be upgraded (`docs/protocol.md` 2.9). Undo with [`unmark_syn`]
/// right after the call. The configuration's rules are asked here, once per connect: one
/// they deny is remembered (`policy`) and never marked. errno is preserved.
pub(crate) fn mark_syn(
    fd: c_int,
    e: FdEntry,
    addr: *const sockaddr,
    len: socklen_t,
) -> Option<crate::upgrade::Mark> {
    let _e = ErrnoGuard::save();
    if e.has(flags::EPOLLED) || e.has(flags::COUNTED) || probe::host_reason().is_some() {
        return None;
    }
    let peer = sockaddr_of(addr, len)?;
    let _s = crate::guard::Section::enter();
    if !crate::policy::client(fd, peer).allowed() {
        stash(fd, FallbackReason::Policy);
        return None;
    }
    if !crate::upgrade::may_upgrade_to(peer) {
        return None;
    }
    // (no room for the upgrade's own descriptors: an unmarked SYN, the server sees a plain
    // client)
    if !crate::upgrade::fd_room(fd) {
        stash(fd, FallbackReason::FdLimit);
        return None;
    }
    crate::upgrade::mark_syn(fd, peer)
}

/// After the connect() of [`mark_syn`]: the socket's options as the application left them.
/// errno is preserved.
pub(crate) fn unmark_syn(fd: c_int, m: Option<crate::upgrade::Mark>) {
    if let Some(m) = m {
        let _e = ErrnoGuard::save();
        let _s = crate::guard::Section::enter();
        crate::upgrade::unmark_syn(fd, m);
    }
}

/// connect() on TCP candidate `fd` (entry `e`) succeeded or is in progress (`pending`): starts
/// its upgrade (the entry becomes `Upgraded`; the connection counts itself once decided) and
/// returns true, or remembers why not and returns false. `marked`: its SYN carried the mark.
/// errno is preserved.
pub(crate) fn start_client(
    fd: c_int,
    e: FdEntry,
    addr: *const sockaddr,
    len: socklen_t,
    pending: bool,
    marked: bool,
) -> bool {
    let _e = ErrnoGuard::save();
    if probe::host_reason().is_some() {
        return false;
    }
    if is_stdio(fd) {
        stash(fd, FallbackReason::Stdio);
        return false;
    }
    if e.has(flags::EPOLLED) {
        stash(fd, FallbackReason::UnsupportedOption);
        return false;
    }
    // (the rules denied it before its SYN, or there was no room: see `mark_syn`)
    if !marked
        && matches!(
            stashed(fd),
            Some(FallbackReason::Policy | FallbackReason::FdLimit)
        )
    {
        return false;
    }
    let Some(peer) = sockaddr_of(addr, len) else {
        return false;
    };
    let _s = crate::guard::Section::enter();
    match crate::upgrade::start_client_to(fd, peer, pending, marked) {
        Ok(slot) => {
            TABLE.update(fd, |e| {
                (e.kind() == Kind::TcpCandidate).then(|| {
                    e.with_kind(Kind::Upgraded)
                        .with_slot(slot)
                        .with_flags(flags::COUNTED)
                        .without_flags(flags::CONNECTING)
                })
            });
            true
        }
        Err(r) => {
            stash(fd, r);
            false
        }
    }
}

/// Whether `fd` is a standard descriptor (0, 1, 2): glibc's `stdin`/`stdout`/`stderr` streams
/// read and write it with internal calls that no hook sees, so a connection there cannot be
/// moved off TCP (reason `stdio`).
pub(crate) fn is_stdio(fd: c_int) -> bool {
    (0..=2).contains(&fd)
}

/// accept() returned `nfd` on a listener (entry `l`): starts its upgrade if the listener
/// has an rdma_cm side (returns true), else remembers why not (false).
pub(crate) fn start_server(l: FdEntry, nfd: c_int) -> bool {
    let _e = ErrnoGuard::save();
    if probe::host_reason().is_some() {
        return false;
    }
    if is_stdio(nfd) {
        stash(nfd, FallbackReason::Stdio);
        return false;
    }
    if !l.has(flags::RDMA_LISTENER) {
        if peer(nfd).as_ref().map_or(PeerClass::Other, class_of) == PeerClass::Other {
            stash(
                nfd,
                probe::rdma_reason().unwrap_or(FallbackReason::NoUpgradeRequest),
            );
        }
        return false;
    }
    let _s = crate::guard::Section::enter();
    match crate::upgrade::start_server(nfd) {
        Ok(slot) => {
            TABLE.update(nfd, |e| {
                (e.kind() == Kind::TcpCandidate).then(|| {
                    e.with_kind(Kind::Upgraded)
                        .with_slot(slot)
                        .with_flags(flags::COUNTED)
                })
            });
            true
        }
        Err(r) => {
            stash(nfd, r);
            false
        }
    }
}

/// listen() is about to be called on TCP candidate `fd`: if this host can upgrade, the socket
/// keeps its connections' SYNs from now on (for the client's mark; none arrives unsaved).
/// Returns whether it does. errno is preserved.
pub(crate) fn save_syns(fd: c_int) -> bool {
    let _e = ErrnoGuard::save();
    if probe::host_reason().is_some() {
        return false;
    }
    let _s = crate::guard::Section::enter();
    crate::upgrade::save_syns(fd, true)
}

/// listen() succeeded on TCP socket `fd`: listeners for upgrade requests beside it (rdma_cm's,
/// shared memory's), if this host can. `saving`: [`save_syns`] was set; it is cleared again
/// if the socket gets neither.
pub(crate) fn start_listener(fd: c_int, saving: bool) {
    let _e = ErrnoGuard::save();
    let _s = crate::guard::Section::enter();
    let listening = probe::host_reason().is_none()
        && crate::net::local_addr(fd).is_some_and(|addr| crate::upgrade::start_listener(fd, addr));
    if listening {
        TABLE.update(fd, |e| {
            (e.kind() == Kind::Listening).then(|| e.with_flags(flags::RDMA_LISTENER))
        });
    } else if saving {
        crate::upgrade::save_syns(fd, false);
    }
}

/// The first accept on a listening socket whose `listen` no hook saw: one inherited through
/// an exec (systemd's socket activation, a server that re-execs itself to upgrade its binary),
/// received over a unix socket (a hot restart's successor: haproxy `-x`, envoy), or listened
/// by a system call no hook sees. It gets what `listen` would have given it: its connections'
/// SYNs are kept from now on (those already queued came unsaved: their clients see a plain
/// server), and listeners for upgrade requests beside it — its address's own where this
/// process can bind them, else, as a prefork worker's, each connection's token names a port
/// of the process's own (the address's may be held by the process that passed the socket,
/// still serving).
/// One adoption at a time; [`flags::LISTEN_SEEN`] is set once it is complete, so that an
/// accept that finds the flag set finds the listener's upgrade side too.
pub(crate) fn adopt_listener(fd: c_int) {
    let _e = ErrnoGuard::save();
    let _one = Adopting::take();
    let e = TABLE.get(fd);
    if e.kind() != Kind::Listening || e.has(flags::LISTEN_SEEN) {
        return;
    }
    let adopted = probe::host_reason().is_none()
        && crate::net::local_addr(fd).is_some_and(|addr| {
            let _s = crate::guard::Section::enter();
            crate::upgrade::adopt_listener(fd, addr)
        });
    let seen = if adopted {
        flags::LISTEN_SEEN | flags::RDMA_LISTENER
    } else {
        flags::LISTEN_SEEN
    };
    TABLE.update(fd, |e| {
        (e.kind() == Kind::Listening).then(|| e.with_flags(seen))
    });
}

/// Held while a listener is adopted ([`adopt_listener`]): a flag, not a mutex, so that a fork
/// child of a process that forked mid-adoption (its adopting thread gone) can take it again
/// ([`after_fork_child`]).
static ADOPTING: AtomicBool = AtomicBool::new(false);

struct Adopting;

impl Adopting {
    fn take() -> Adopting {
        while ADOPTING
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            crate::net::nap_ms(1);
        }
        Adopting
    }
}

impl Drop for Adopting {
    fn drop(&mut self) {
        ADOPTING.store(false, Ordering::Release);
    }
}

/// In a fork child: no adoption is under way (the thread that may have been adopting at the
/// fork is not in the child).
pub(crate) fn after_fork_child() {
    ADOPTING.store(false, Ordering::Relaxed);
}

/// At start: the listening sockets systemd gives a socket-activated service (`LISTEN_PID`
/// this process, `LISTEN_FDS` of them from descriptor 3: sd_listen_fds(3)) keep their
/// connections' SYNs from now on, so that those that come before the service's first accept
/// can be upgraded too (the rest of their adoption is that accept's: [`adopt_listener`]). The
/// ones queued before the process started came unsaved. Nothing else is touched.
pub(crate) fn keep_activated_syns() {
    const FIRST: c_int = 3;
    let var = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u32>().ok());
    let (Some(pid), Some(n)) = (var("LISTEN_PID"), var("LISTEN_FDS")) else {
        return;
    };
    if pid != crate::sys::getpid() || probe::process_reason().is_some() {
        return;
    }
    // (a bound of ours: sd_listen_fds(3) takes any count)
    for fd in FIRST..FIRST.saturating_add(n.min(4096) as c_int) {
        let e = entry_or_classify(fd);
        if e.kind() == Kind::Listening && !e.has(flags::LISTEN_SEEN) {
            let _ = crate::upgrade::save_syns(fd, true);
        }
    }
}

/// If a non-blocking connect on `fd` is pending, checks whether it has completed (real
/// getpeername; or the connection is over already, its SYN acknowledged) and counts it if so.
pub(crate) fn complete_if_connected(fd: c_int, e: FdEntry) {
    if e.has(flags::CONNECTING)
        && !e.has(flags::COUNTED)
        && (peer(fd).is_some() || crate::net::ever_connected(fd) == Some(true))
    {
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
/// release its share of an upgraded connection or an rdma_cm listener, forget an epoll set's
/// registrations, then clear its entry. Not in a foreign child (see `process::in_foreign_child`).
pub(crate) fn forget(fd: c_int, e: FdEntry) {
    complete_if_connected(fd, e);
    release(fd, e);
    TABLE.take(fd);
}

/// Releases what entry `e` of `fd` names, the fd being closed (or closed already, unseen: see
/// [`lost`]): its share of an upgraded connection ([`crate::upgrade::release_share`]), an
/// rdma_cm listener, an epoll set's registrations.
fn release(fd: c_int, e: FdEntry) {
    if matches!(e.kind(), Kind::TcpCandidate | Kind::Upgraded) {
        crate::live::conn_closed(fd);
    }
    match e.kind() {
        Kind::Upgraded if crate::upgrade::slot_is_ours(e.slot()) => {
            let _s = crate::guard::Section::enter();
            let _e = ErrnoGuard::save();
            crate::upgrade::release_share(e.slot(), fd);
        }
        Kind::Listening if e.has(flags::RDMA_LISTENER) => {
            let _s = crate::guard::Section::enter();
            crate::upgrade::stop_listener(fd);
        }
        Kind::Other if e.has(flags::EPOLL_FD) => crate::upgrade::ready::forget_epoll(fd),
        _ => {}
    }
}

/// A hooked call has just made `fd` (socket, socketpair, accept, a duplicate of a tracked fd,
/// epoll_create): records its entry `e`. An entry already there means that the close of the
/// number's previous file was never seen ([`lost`]).
#[inline]
pub(crate) fn set_new(fd: c_int, e: FdEntry) {
    let old = TABLE.set_new(fd, e);
    if !old.is_unknown() {
        lost(fd, old);
    }
}

/// The file that entry `e` of `fd` was made for is gone: closed where no hook saw it (an
/// inline system call, io_uring), and the number given out again. The entry is already
/// replaced; what it referred to is released as its close would have, without touching `fd`
/// (the new file's), by [`release`]: the last share of a connection ends it on its ring (its
/// peer reads what was written, then EOF). A descriptor of the shim's gone that way: RDMA ends for the process
/// as when a `dup2` replaces one. Counted (`fds.missed_closes`). Not in a vfork child (its
/// closes leave the parent's entries, on purpose: see `close`).
#[cold]
#[inline(never)]
pub(crate) fn lost(fd: c_int, e: FdEntry) {
    if super::process::in_foreign_child() {
        return;
    }
    stats::count_missed_close();
    if e.kind() == Kind::Private {
        super::process::before_private_replaced(fd);
    } else {
        release(fd, e);
    }
}

/// A new fd `nfd` refers to the connection of entry `e` (dup): one more share.
pub(crate) fn share(e: FdEntry, nfd: c_int) {
    if e.kind() == Kind::Upgraded && crate::upgrade::slot_is_ours(e.slot()) {
        if let Some(c) = crate::upgrade::lookup(e.slot()) {
            c.fds.fetch_add(1, Ordering::AcqRel);
            c.fd_hint.store(nfd, Ordering::Relaxed);
        }
    }
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
