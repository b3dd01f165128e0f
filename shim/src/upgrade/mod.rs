//! The upgrade: moving live TCP connections onto RDMA rings (design: docs/upgrade.md).
//!
//! - [`Conn`]: one TCP connection the shim tries to upgrade (or has upgraded), shared by every
//!   fd that refers to its socket (dup); found from the fd table's slot through the process's
//!   [`World`] (a slab of connections, the epoll registrations, the engine).
//! - `engine`: the thread that runs rdma_cm (dials, listeners, the request/accept rendezvous),
//!   watches completion channels and wakes sleepers; started by the first upgradable
//!   connection, never in a process that has none.
//! - `data`: socket calls on an upgraded fd (read/write families, shutdown, close, FIONREAD).
//! - `ready`: poll/select/epoll for upgraded fds, through one eventfd per direction.
//!
//! Everything here is safe code: system calls go through `crate::net` (raw syscalls that never
//! reach our own hooks) and verbs through `rdmashim-core`.
#![forbid(unsafe_code)]

mod adopt;
mod attrs;
mod binding;
mod board;
pub mod data;
mod engine;
mod hostcache;
pub mod ready;

use crate::config::Level;
use crate::net;
use crate::outcome::Errno;
use crate::reason::FallbackReason;
use crate::shim_log;
use crate::slots::{Key, Slots};
use crate::stats;
use core::ffi::c_int;
use rdmashim_core::link::Link;
use rdmashim_core::StreamConfig;
use rdmashim_core::{Transport, UpgradeDialer};
use rdmashim_proto::{ErrorReason, RejectReason, Side, StreamState};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

pub(crate) use binding::Mark;
pub use engine::Engine;

/// Lowest fd number for the shim's own eventfds, signalfds and private socket duplicates.
const PRIVATE_FD_MIN: c_int = 1000;

/// The free descriptors a connection's upgrade is begun with, at least (`fd_limit` below):
/// what the upgrade may take of its own — a private duplicate of the socket for the token's
/// wait and one kept for failover, its readiness eventfds, for the process's first connection
/// the engine's and the device's — and a margin that stays the application's.
const FD_ROOM: u64 = 32;

/// Whether the process has room under its soft `RLIMIT_NOFILE` for the descriptors of an
/// upgrade of the connection on `fd`, as far as can be told without counting them: the kernel
/// gave the socket the lowest free number, so every number below it was taken then, and of
/// those above it, the shim knows its own. Fewer than [`FD_ROOM`] left: the connection stays
/// on TCP (`fd_limit`), and the shim takes none of the application's last descriptors (a
/// program near its limit would otherwise get EMFILE sooner than without the shim).
pub(crate) fn fd_room(fd: c_int) -> bool {
    let Some(limit) = crate::sys::nofile_limit() else {
        return true;
    };
    let above = limit.saturating_sub(fd as u64 + 1);
    // (far from the limit: no need to look at the shim's own)
    if above >= 64 * FD_ROOM {
        return true;
    }
    let own = crate::fdtable::TABLE.count_private(fd as u32 + 1, limit.saturating_sub(1) as u32);
    above.saturating_sub(own) >= FD_ROOM
}

/// Where one connection's upgrade stands.
pub(crate) enum Phase {
    /// Client: the upgrade's dial under way, over rdma_cm or to a process of this host (the
    /// dialer is driven by the engine).
    Dialing(Box<UpgradeDialer>),
    /// Client: waiting for the engine to start the dial.
    Queued,
    /// Server: waiting for the client's connect request (in the engine's matcher).
    Awaiting,
    /// The engine's setup thread is building the link: a server's answering the matched
    /// request, a client's building the endpoint of its dial (whose route is resolved) and
    /// sending its request. The data goes through the socket meanwhile, as before the upgrade.
    Setup,
    /// The ring connection (in its handshake, established, or ended).
    Linked(Box<Link>),
    /// Stays TCP for good.
    Fallen,
}

/// How far the shim has carried out a return of the connection to TCP (protocol §8.5, asked
/// by either side: [`Conn::hand_back`] here, or the peer's `SwitchBack`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Back {
    /// No switch back (or it was called off: the peer closed on the ring first).
    None,
    /// Started: reads go to the socket, writes wait for the agreement and the continuation.
    /// The eventfds are retired ([`ready::retire_efds`]): every wait on the connection looks
    /// at the socket from now on, and the blocking ones at most [`BACK_NAP`] at a time.
    Switching,
    /// Agreed and the continuation written: writes are the socket's again (its epoll
    /// registrations have EPOLLOUT again), reads too (after a failover, once the peer's record
    /// and what it repeats are read: protocol §8.6); the link is still being torn down, after
    /// which the connection is [`Phase::Fallen`] (counted `switched_back`, or `path_failed`).
    Resumed,
}

/// The longest a blocking wait on a connection that is switching back sleeps before it looks
/// again (its eventfds are retired, and the moment the continuation is written is nobody's
/// event). A switch back takes one round trip, and the connection is then plain TCP.
pub(crate) const BACK_NAP: c_int = 2;

/// The state behind a connection's lock.
pub(crate) struct Inner {
    pub phase: Phase,
    /// Bytes the application wrote to the socket (through us) before this side committed.
    pub tcp_sent: u64,
    /// Bytes the application read from the socket before the link existed (the link's core
    /// counts after that).
    pub tcp_received: u64,
    /// This side's sending direction moved to the ring.
    pub committed: bool,
    /// The application shut down its write side on TCP before the switch.
    pub tcp_wr_shut: bool,
    /// The socket's error (ETIMEDOUT, ECONNRESET), taken off it by a write of the shim's own
    /// (a continuation after a failover): the kernel reports an error once, to whichever
    /// call meets it first, and this one is the application's — its next data call returns it
    /// (then the kernel's EPIPE or EOF follow, as on TCP).
    pub tcp_err: Option<Errno>,
    /// The stream's failure (after the upgrade) was logged.
    pub failure_logged: bool,
    /// This process closed its last fd of the connection while its upgrade was under way
    /// (a dial, an answer being set up, a handshake) and after a fork: a child may hold the
    /// socket and go on with it, and the peer may have switched already. So the new link is
    /// not dropped: once it is up, the connection goes back to TCP ([`Conn::hand_back`],
    /// through the private duplicate `back_sock` kept at the close), as the last close of
    /// one on the ring does.
    pub give_back: bool,
    /// A switch back's continuation the socket did not take whole (`EAGAIN`): when the engine
    /// tries the rest again ([`BACK_NAP`] later; see [`Conn::write_resume`]).
    pub resume_retry: Option<Instant>,
    /// Every fd referring to the connection was closed.
    pub closed: bool,
    /// The eventfds' levels as last set.
    pub rd_set: bool,
    pub wr_set: bool,
    /// `messages_received` at the last read signal (a new arrival re-signals for edge-triggered
    /// waiters).
    pub rd_mark: u64,
    /// The return to TCP, as far as it was carried out.
    pub back: Back,
    /// A private duplicate of the socket, from the start of a switch back until the
    /// connection is plain TCP: the continuation (`Resume`) is written through it by whichever
    /// thread settles the connection — the engine's included, which cannot trust an fd of the
    /// application's (closed and reused meanwhile).
    pub back_sock: Option<c_int>,
    /// Fell back because the peer went away during the handshake, reason not counted yet: if
    /// the connection ends soon (the peer's TCP end, or our close), it simply ended before
    /// its upgrade was decided (`closed_early`); else, at the given time, `reason` holds.
    pub unsure: Option<(FallbackReason, Instant)>,
    /// Client whose TCP connect is still in progress: a private duplicate of the socket that
    /// the engine watches for its outcome (the dial starts once it succeeded).
    pub pending: Option<c_int>,
    /// Client: the wait for the server's token (the first bytes of its direction).
    pub token: binding::TokenWait,
    /// Client: a private duplicate of the socket the engine watches for the token while
    /// it waits; closed once it is decided (by the engine).
    pub token_sock: Option<c_int>,
    /// Client: the token was taken out of the stream and no readiness has been reported since
    /// (an event of its arrival may still be queued in an epoll set: see `ready`).
    pub token_taken: bool,
    /// Since when (coarse clock, ms) the link's CQ has been left unarmed by an application
    /// thread that woke from a blocking wait (see [`Conn::on_wake`]); `None`: armed, or
    /// nobody's business yet.
    pub unarmed: Option<u64>,
    /// What was left unarmed is a CQ (RDMA), counted in [`UNARMED_CQ`] too; else a
    /// shared-memory inbox, which a busy-polling wait looks at without arming it.
    pub unarmed_cq: bool,
    /// The engine does not watch the link's completion channel: an application thread took
    /// it out of the engine's set to wait on it itself, and it stays out until the CQ is next
    /// armed for the engine's sake ([`Conn::on_completions`]). While the CQ is left unarmed
    /// there is nothing to watch, and a ping-pong of blocking calls does not pay two
    /// `epoll_ctl` per message.
    pub comp_unwatched: bool,
}

/// Connections whose CQ an application thread left unarmed ([`Inner::unarmed`]): while there
/// are any, waits in poll/select/epoll arm the ones they cover, and the engine arms those left
/// so for longer than [`UNARMED_MAX`].
pub(crate) static UNARMED: AtomicUsize = AtomicUsize::new(0);

/// The part of [`UNARMED`] that are CQs: a busy-polling epoll wait arms those at each turn
/// (their completions reach it only through the completion channel), and leaves
/// shared-memory inboxes unarmed ([`ready::take_arrivals`] looks at them instead).
pub(crate) static UNARMED_CQ: AtomicUsize = AtomicUsize::new(0);

/// A connection left unarmed ([`Inner::unarmed`]) is armed, or gone.
fn unarmed_done(cq: bool) {
    // (saturating: a fork child zeroes the counts, and may drop its parent's connections)
    let dec = |n: usize| Some(n.saturating_sub(1));
    let _ = UNARMED.fetch_update(Ordering::SeqCst, Ordering::SeqCst, dec);
    if cq {
        let _ = UNARMED_CQ.fetch_update(Ordering::SeqCst, Ordering::SeqCst, dec);
    }
}

/// How long a CQ may stay unarmed after an application thread's blocking wait before the engine
/// arms it (the application went on to something else: completions must be taken again). The
/// engine's looks for such CQs come that often at first, less often while they find the
/// connections still in use ([`crate::cadence`]).
pub(crate) const UNARMED_MAX: std::time::Duration = crate::cadence::BASE;

/// When (coarse clock, ms) a CQ was last left unarmed. For a while after it, the engine wakes
/// at its cadence ([`UNARMED_CADENCE`]) by itself (whether or not a CQ is unarmed at the
/// moment it goes to sleep), so that a connection in a blocking ping-pong, unarmed between each
/// wake-up and the next wait, does not have to wake it each time.
pub(crate) static LAST_UNARMED_MS: AtomicU64 = AtomicU64::new(0);

/// The engine's interval between looks at unarmed CQs ([`crate::cadence`]): a thread that
/// leaves a CQ unarmed wakes the engine only if it would sleep longer than this.
pub(crate) static UNARMED_CADENCE: crate::cadence::Cadence = crate::cadence::Cadence::new();

/// [`Conn::efd_watchers`]'s mark of a connection registered in an epoll set (for good: a
/// registration outlives any call, and edge-triggered waiters need every new arrival's write).
const EFDS_EPOLLED: u32 = 1 << 31;

/// One TCP connection under the upgrade.
pub struct Conn {
    /// The fd table slot that refers to this connection.
    pub slot: u64,
    pub side: Side,
    pub peer: SocketAddr,
    pub local: SocketAddr,
    /// Where its link goes: shared memory if the peer is a process of this host
    /// ([`transport_for`]), else RDMA.
    pub transport: Transport,
    /// Server: the key sent in the connection's token and the 4-tuple a request must be
    /// tagged for (`docs/protocol.md` 2.9).
    pub(crate) bound: Option<(rdmashim_proto::BindingKey, rdmashim_proto::TcpTuple)>,
    /// Readable when ring data, EOF or an error is there for the reader.
    pub rd_efd: c_int,
    /// Readable when the ring has room for the writer (or writing would fail at once).
    pub wr_efd: c_int,
    /// Open fds of the application that refer to this connection.
    pub fds: AtomicU32,
    /// An fd of the application that referred to this connection when last seen (checked
    /// against the fd table before use: it may have been closed or reused since).
    pub fd_hint: AtomicI32,
    /// The socket's inode (0 if it could not be read): an fd whose entry names this
    /// connection is its socket only if it has this inode ([`Conn::is_socket`]).
    sock_ino: u64,
    /// The decision is final and it is TCP: data calls go straight to the socket.
    pub fell_back: AtomicBool,
    /// Epoll registrations of the socket have EPOLLOUT removed (the write side is on the ring).
    pub out_masked: AtomicBool,
    /// The socket's end (EPOLLRDHUP) was reported to a wait of the shim's and acted on: the
    /// socket's registrations no longer add it for the shim (a socket that ended stays so,
    /// and a level-triggered report of it would wake every wait of a program that did not
    /// ask for it: a spin while it waits for EPOLLOUT).
    pub end_seen: AtomicBool,
    /// Application threads blocked in a data call that wait on the link's completion channel
    /// themselves (the engine then leaves its events to them: one wake-up, not two).
    pub sleepers: AtomicU32,
    /// Data calls made on the connection (counted, not timed: no clock read). The engine arms
    /// a CQ an application thread left unarmed only once this stopped moving
    /// (`engine::State::timers`): a thread that keeps calling polls the CQ itself, and one
    /// that spins on it would otherwise lose its CPU to the engine at every completion.
    /// Bumped with a load and a store ([`bump`]), not an atomic add: two threads' calls at
    /// once may count as one, and the count still moves, which is all the engine asks of it.
    pub uses: AtomicU64,
    /// Who waits on the eventfds: [`EFDS_EPOLLED`] once the connection was registered in an
    /// epoll set, plus one per thread in a poll-family call or a blocking data call's wait.
    /// While nobody does, their levels are not kept ([`Conn::sync_efds`]): that saves an
    /// eventfd write and read per message to a reader that never sleeps on them.
    efd_watchers: AtomicU32,
    /// Epoll sets of the application that hold the link's completion channel (see
    /// [`ready::epoll_ctl`]): while there are any, the engine does not watch it.
    pub(crate) comp_in_app: AtomicU32,
    /// The socket's O_NONBLOCK and timeouts, as the data calls' waits need them.
    pub(crate) attrs: attrs::Attrs,
    /// Server: offered at a fork to the child that serves it ([`adopt`]); cleared when it is
    /// decided.
    pub(crate) offered: AtomicBool,
    /// Server, in a fork child: the inherited connection this one took over ([`adopt`]): its
    /// slot in the parent's world and its birth count there.
    pub(crate) adopted_from: OnceLock<(u64, u32)>,
    /// Whether the blocked data calls on this connection busy-poll before they sleep.
    pub(crate) spin: crate::spin::SpinGate,
    /// Its link's inbox, once it has one over shared memory, as a busy-polling epoll wait
    /// looks at it ([`ready::take_arrivals`]).
    pub(crate) arrivals: OnceLock<rdmashim_core::shm::Arrivals>,
    /// In the registry's list of inboxes left unarmed ([`ready::list_unarmed`]).
    pub(crate) unarmed_listed: AtomicBool,
    /// Bytes the application sent and received on it through the upgrade (either transport),
    /// for the live view's table (`crate::live`). Written only under the connection's lock
    /// ([`bump`]).
    pub(crate) live_tx: AtomicU64,
    pub(crate) live_rx: AtomicU64,
    counted: AtomicBool,
    /// How many of the shim's own threads wait for [`inner`](Self::inner) (see
    /// [`lock`](Self::lock)).
    internal_waits: AtomicU32,
    inner: Mutex<Inner>,
}

/// Keeps `e`, met by a call of the shim's own on the socket, for the application's next call
/// ([`Inner::tcp_err`]) if it is one the kernel reports once — the socket's error (ETIMEDOUT,
/// ECONNRESET, EHOSTUNREACH, …), which the call took off it — and not EPIPE, which every
/// write after the end meets again (and a read never does).
fn keep_tcp_err(g: &mut Inner, e: Errno) {
    if e.0 != libc::EPIPE {
        g.tcp_err.get_or_insert(e);
    }
}

impl Conn {
    /// Whether `fd` is (still) this connection's socket: an entry outlives a close that no
    /// hook saw, and the number may hold another file since, or none. One `fstat`; true when
    /// the socket's identity is unknown.
    pub(crate) fn is_socket(&self, fd: c_int) -> bool {
        self.sock_ino == 0 || net::socket_inode(fd) == self.sock_ino
    }

    #[allow(clippy::too_many_arguments)]
    fn new(
        slot: u64,
        fd: c_int,
        side: Side,
        peer: SocketAddr,
        local: SocketAddr,
        phase: Phase,
        bound: Option<(rdmashim_proto::BindingKey, rdmashim_proto::TcpTuple)>,
        token: binding::TokenWait,
    ) -> Option<Conn> {
        let (rd_efd, wr_efd) = world_if_created()
            .and_then(|w| w.reuse_efds())
            .or_else(new_efds)?;
        crate::fdtable::UPGRADE_CONNS.fetch_add(1, Ordering::Relaxed);
        crate::live::upgrade_conn(fd, local, peer, side == Side::Client);
        Some(Conn {
            slot,
            side,
            peer,
            local,
            transport: transport_for(peer, local),
            bound,
            rd_efd,
            wr_efd,
            fds: AtomicU32::new(1),
            fd_hint: AtomicI32::new(fd),
            sock_ino: net::socket_inode(fd),
            fell_back: AtomicBool::new(false),
            out_masked: AtomicBool::new(false),
            end_seen: AtomicBool::new(false),
            sleepers: AtomicU32::new(0),
            uses: AtomicU64::new(0),
            efd_watchers: AtomicU32::new(0),
            comp_in_app: AtomicU32::new(0),
            attrs: attrs::Attrs::new(),
            offered: AtomicBool::new(false),
            adopted_from: OnceLock::new(),
            spin: crate::spin::SpinGate::default(),
            arrivals: OnceLock::new(),
            unarmed_listed: AtomicBool::new(false),
            live_tx: AtomicU64::new(0),
            live_rx: AtomicU64::new(0),
            counted: AtomicBool::new(false),
            internal_waits: AtomicU32::new(0),
            inner: Mutex::new(Inner {
                phase,
                tcp_sent: 0,
                tcp_received: 0,
                committed: false,
                tcp_wr_shut: false,
                tcp_err: None,
                failure_logged: false,
                give_back: false,
                resume_retry: None,
                closed: false,
                rd_set: false,
                wr_set: false,
                rd_mark: 0,
                back: Back::None,
                back_sock: None,
                unsure: None,
                pending: None,
                token,
                token_sock: None,
                token_taken: false,
                unarmed: None,
                unarmed_cq: false,
                comp_unwatched: false,
            }),
        })
    }

    /// The connection's lock (a poisoned lock is still usable: the state is kept consistent
    /// by each call before it can panic).
    ///
    /// The shim's own threads go first. An application thread streaming on a connection takes
    /// its lock again right after each call, and a lock does not hand itself over: the engine,
    /// woken when it is let go, finds it taken again, for as long as the stream lasts — and
    /// with it every other connection's upgrade that waits on the engine. (Traced under
    /// emulation, ten connections streaming as their upgrades began: the engine waited on one
    /// of their locks 158 times in 3.4 s, each time woken and beaten to it by the same
    /// application thread, while the replies of six other connections' upgrades waited in
    /// its queue; those not done when the streams ended stayed TCP.) So an application
    /// thread that finds one of the shim's threads waiting lets it go first, for at most
    /// [`YIELD_TO_SHIM_MAX`](Self::YIELD_TO_SHIM_MAX).
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        if crate::guard::internal_thread() {
            if let Some(g) = self.try_lock() {
                return g;
            }
            self.internal_waits.fetch_add(1, Ordering::AcqRel);
            let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            self.internal_waits.fetch_sub(1, Ordering::AcqRel);
            return g;
        }
        self.lock_app()
    }

    /// [`lock`](Self::lock) for an application thread's data call — reached only through the
    /// hooks' slow paths, which pass the shim's own threads straight through — without asking
    /// whether the calling thread is one of the shim's: a thread-local's lookup, a call to
    /// `__tls_get_addr` in a cdylib, two or three times a message otherwise.
    #[inline]
    pub(crate) fn lock_app(&self) -> MutexGuard<'_, Inner> {
        debug_assert!(
            !crate::guard::internal_thread(),
            "the shim's own threads take lock()"
        );
        if self.internal_waits.load(Ordering::Acquire) != 0 {
            self.yield_to_shim();
        }
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The longest an application thread waits for the shim's threads to take the lock
    /// first ([`lock`](Self::lock)): they hold it for microseconds, but may have to wait for a
    /// CPU first on a busy host.
    const YIELD_TO_SHIM_MAX: std::time::Duration = std::time::Duration::from_millis(20);

    /// Gives the CPU away while one of the shim's threads waits for the lock (at most
    /// [`YIELD_TO_SHIM_MAX`](Self::YIELD_TO_SHIM_MAX)).
    #[cold]
    fn yield_to_shim(&self) {
        let until = Instant::now() + Self::YIELD_TO_SHIM_MAX;
        let mut turns = 0u32;
        while self.internal_waits.load(Ordering::Acquire) != 0 {
            turns = turns.wrapping_add(1);
            if turns.is_multiple_of(16) && Instant::now() >= until {
                return;
            }
            std::thread::yield_now();
        }
    }

    /// The connection's lock if nobody holds it.
    pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, Inner>> {
        match self.inner.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Counts the connection as upgraded (once), over RDMA with the kind `link` carries.
    fn count_upgraded(&self, link: Option<&Link>) {
        if !self.counted.swap(true, Ordering::AcqRel) {
            let kind = link
                .filter(|_| self.transport == Transport::Rdma)
                .map(|l| l.conn().kind());
            stats::count_upgraded(kind);
            crate::live::conn_state(
                self.fd_hint.load(Ordering::Relaxed),
                (self.local, self.peer),
                match self.transport {
                    Transport::Rdma => crate::live_layout::Via::Rdma,
                    Transport::Shm => crate::live_layout::Via::Shm,
                },
                crate::live_layout::ConnState::Ring,
                None,
            );
            match self.side {
                Side::Client => engine::upgraded_to(self.peer),
                Side::Server => engine::upgraded_from(self.peer),
            }
            shim_log!(
                Level::Debug,
                "{} {} -> {}: upgraded ({}{})",
                side_name(self.side),
                self.local,
                self.peer,
                match self.transport {
                    Transport::Rdma => "RDMA rings, kind ",
                    Transport::Shm => "shared-memory rings: a process of this host",
                },
                kind.map_or("", rdmashim_proto::Kind::name)
            );
        }
    }

    /// Whether the peer's FIN or RST is already on the connection's socket (seen through an
    /// fd of the application that still refers to it).
    pub(crate) fn tcp_ended(&self) -> bool {
        let fd = self.fd_hint.load(Ordering::Relaxed);
        let e = crate::fdtable::TABLE.get(fd);
        if e.kind() != crate::fdtable::Kind::Upgraded || e.slot() != self.slot {
            return false;
        }
        let ended = libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR;
        net::poll_now(fd, libc::POLLRDHUP) & ended != 0
    }

    /// How long a connection whose peer went away during the handshake waits for its TCP end
    /// before its fallback reason is taken as given.
    const UNSURE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

    /// Falls back at once (data calls go straight to the socket), but counts the reason only
    /// when it is clear whether the connection simply ended early (see `Inner::unsure`).
    pub(crate) fn fall_back_unsure(&self, g: &mut Inner, reason: FallbackReason) {
        if g.closed || self.tcp_ended() {
            self.fall_back(g, FallbackReason::ClosedEarly);
            return;
        }
        self.to_tcp(g);
        if g.unsure.is_none() && !self.counted.load(Ordering::Acquire) {
            g.unsure = Some((reason, Instant::now() + Self::UNSURE_WAIT));
        }
    }

    /// Counts an unsure fallback (see `Inner::unsure`): now if `force` (close, exit) or its
    /// time is up, or earlier if the TCP connection ended meanwhile.
    pub(crate) fn decide(&self, g: &mut Inner, force: bool) {
        let Some((reason, at)) = g.unsure else {
            return;
        };
        let ended = g.closed || self.tcp_ended();
        if !(ended || force || Instant::now() >= at) {
            return;
        }
        g.unsure = None;
        let r = if ended {
            FallbackReason::ClosedEarly
        } else {
            reason
        };
        self.fall_back(g, r);
    }

    /// The connection turned out never to exist (its non-blocking connect failed): it stays
    /// a plain socket and counts as nothing.
    pub(crate) fn abandon(&self, g: &mut Inner) {
        self.to_tcp(g);
        if !self.counted.swap(true, Ordering::AcqRel) {
            shim_log!(
                Level::Debug,
                "{} {} -> {}: connect failed; not a connection",
                side_name(self.side),
                self.local,
                self.peer
            );
        }
    }

    /// Counts the connection as staying on TCP (once) and makes data calls direct.
    pub(crate) fn fall_back(&self, g: &mut Inner, reason: FallbackReason) {
        self.to_tcp(g);
        let first = !self.counted.swap(true, Ordering::AcqRel);
        crate::live::conn_state(
            self.fd_hint.load(Ordering::Relaxed),
            (self.local, self.peer),
            crate::live_layout::Via::Tcp,
            crate::live_layout::ConnState::Tcp,
            first.then_some(reason),
        );
        if first {
            stats::count_fallback(reason);
            shim_log!(
                Level::Debug,
                "{} {} -> {}: stays on TCP ({})",
                side_name(self.side),
                self.local,
                self.peer,
                reason.name()
            );
        }
    }

    /// The connection stays TCP for good (whatever is counted for it): the link, if any, is
    /// dropped and data calls go straight to the socket.
    fn to_tcp(&self, g: &mut Inner) {
        self.armed(g);
        if matches!(g.phase, Phase::Linked(_)) {
            ready::link_down(self);
        }
        g.phase = Phase::Fallen;
        self.fell_back.store(true, Ordering::Release);
        if self.offered.swap(false, Ordering::AcqRel) {
            adopt::withdraw(self);
        }
        if let Some(&(slot, born)) = self.adopted_from.get() {
            adopt::unadopt(slot, born);
        }
        if g.back == Back::None {
            self.clear_efds(g);
        }
        // (else they stay signalled, retired by the switch back: a thread that chose to wait
        // on them before the switch began and goes to sleep only now must wake at once and
        // look at the socket — clearing them here left ssh asleep in poll for ever with the
        // server's bytes in its socket. Cleared when the connection ends, before reuse.)
        if let Some(s) = g.back_sock.take() {
            engine::unwatch_sock(s);
            net::close(s);
        }
    }

    /// The link's completion channel is (or may be) readable: takes its events, re-arms the
    /// CQ, drives the link and applies the consequences. Whoever takes a channel event
    /// re-arms, so the next completion raises one again.
    ///
    /// Arm *before* polling: the notification covers only completions added after the arm,
    /// so a completion that landed between a last poll and the arm would sit in the CQ with
    /// no event, and a peer waiting on its answer would wait for ever (the redis-benchmark
    /// hang of sessions 3–4).
    pub(crate) fn on_completions(&self, g: &mut Inner) {
        self.take_completions(g, true);
    }

    /// An application thread woke from its wait on the completion channel (a blocking data
    /// call): takes the channel's events and drives the link like
    /// [`on_completions`](Self::on_completions), but leaves the CQ *unarmed* when this was the
    /// last such thread. The thread goes on using the connection (the next send or receive
    /// polls the CQ itself, and a blocking one arms before it sleeps), and an armed CQ would
    /// raise an event for each completion meanwhile — a wake-up of the engine thread that
    /// fights this one for the lock, per message. Whoever waits next arms it
    /// ([`Conn::ensure_armed`]), or the engine after [`UNARMED_MAX`].
    pub(crate) fn on_wake(&self, g: &mut Inner, last: bool) {
        self.take_completions(g, !last);
    }

    /// Takes the channel's events, arms the CQ (if `rearm`; else marks it unarmed), drives the
    /// link and applies the consequences.
    fn take_completions(&self, g: &mut Inner, rearm: bool) {
        if rearm {
            self.armed(g);
        }
        let mut cq = false;
        let linked = if let Phase::Linked(l) = &mut g.phase {
            cq = !l.is_local();
            l.take_events();
            if rearm {
                // (no thread waits on the channel: the engine must see the next event)
                if g.comp_unwatched
                    && self.sleepers.load(Ordering::SeqCst) == 0
                    && self.comp_in_app.load(Ordering::SeqCst) == 0
                {
                    engine::watch_completions(self, l, true);
                    g.comp_unwatched = false;
                }
                l.arm();
            }
            l.progress(false);
            true
        } else {
            false
        };
        if linked && !rearm && g.unarmed.is_none() {
            let now = net::coarse_ms();
            g.unarmed = Some(now);
            g.unarmed_cq = cq;
            LAST_UNARMED_MS.store(now, Ordering::Relaxed);
            UNARMED.fetch_add(1, Ordering::SeqCst);
            if cq {
                UNARMED_CQ.fetch_add(1, Ordering::SeqCst);
            } else {
                ready::list_unarmed(self);
            }
            engine::nudge(UNARMED_CADENCE.every());
        }
        self.settle(g);
        ready::after_change(self, g);
    }

    /// Forgets the unarmed mark (the caller arms the CQ).
    fn armed(&self, g: &mut Inner) {
        if g.unarmed.take().is_some() {
            unarmed_done(std::mem::take(&mut g.unarmed_cq));
        }
    }

    /// Arms the CQ if an application thread left it unarmed, then drives the link once (a
    /// completion between the last poll and the arm raised no event). For a thread about to
    /// wait on the connection's readiness by other means than its completion channel.
    pub(crate) fn ensure_armed(&self, g: &mut Inner) {
        if g.unarmed.is_some() {
            self.on_completions(g);
        }
    }

    fn clear_efds(&self, g: &mut Inner) {
        if g.rd_set {
            net::eventfd_clear(self.rd_efd);
            g.rd_set = false;
        }
        if g.wr_set {
            net::eventfd_clear(self.wr_efd);
            g.wr_set = false;
        }
    }

    /// Drives the link once (if there is one) and applies what follows: the commit of this
    /// side's sending direction once the link is established, fallback if the handshake
    /// failed, and the eventfds' levels. Call with the lock held, after every change.
    pub(crate) fn drive(&self, g: &mut Inner, force_cm: bool) {
        if let Phase::Linked(link) = &mut g.phase {
            link.progress(force_cm);
        }
        self.settle(g);
    }

    /// The consequences of the link's state (see [`drive`](Self::drive)).
    ///
    /// The usual case — a committed, healthy link, no switch back or give-back under way,
    /// nobody on the eventfds — has nothing to do and is decided inline: every read and write
    /// of the data path settles (docs/bench/kinds.md, session 62).
    #[inline(always)]
    pub(crate) fn settle(&self, g: &mut Inner) {
        if let Phase::Linked(link) = &g.phase {
            let c = link.conn();
            if g.committed
                && !g.give_back
                && c.error().is_none()
                && !switching_back(g.back, c)
                && !self.efds_to_sync()
            {
                return;
            }
        }
        self.settle_slow(g);
    }

    /// [`settle`](Self::settle) past its usual case. (Each of its cases is one that the usual
    /// case's test rules out: a case added here needs that test to fail for it too.)
    #[inline(never)]
    fn settle_slow(&self, g: &mut Inner) {
        let Phase::Linked(link) = &mut g.phase else {
            return;
        };
        let c = link.conn();
        if let Some(r) = c.error() {
            if g.committed && c.failed_unused() && (g.tcp_wr_shut || !c.write_shut()) {
                self.resume_on_tcp(g);
                return;
            }
            if g.committed && !g.failure_logged {
                // (once: what the application's calls on the connection fail with from now on)
                g.failure_logged = true;
                shim_log!(
                    Level::Info,
                    "{} {} -> {}: the stream failed: {}",
                    side_name(self.side),
                    self.local,
                    self.peer,
                    link.error_for(r)
                );
            }
            if c.can_fall_back() && !g.committed {
                let reason = fallback_reason(r);
                // The handshake broke because the peer went away: a client that closed at
                // once, normally (see `Inner::unsure`).
                if reason == FallbackReason::PeerUnreachable {
                    self.fall_back_unsure(g, reason);
                } else {
                    self.fall_back(g, reason);
                }
                return;
            }
        } else if g.give_back && c.state() != StreamState::Handshaking {
            // (closed here since a fork while it was coming up: see `Inner::give_back`)
            g.give_back = false;
            if !data::give_back(self, g, None) {
                if let Phase::Linked(l) = &mut g.phase {
                    l.conn_mut().close();
                    l.progress(false);
                }
            }
            return;
        } else if !g.committed && c.state() != StreamState::Handshaking {
            let peer_switched = !matches!(c.rx_state(), rdmashim_proto::RxState::Tcp { .. });
            if link.conn_mut().commit_switch(g.tcp_sent).is_ok() {
                g.committed = true;
                if g.tcp_wr_shut {
                    let _ = link.conn_mut().shutdown_write();
                }
                link.progress(false);
                self.count_upgraded(Some(link));
            } else if peer_switched && !link.conn().back_started() {
                // The peer switched, sent and closed before this side could commit (a client
                // that says goodbye at once, as pgbench's vacuum connection does to its
                // backend): its direction went over the ring, so the connection was upgraded.
                self.count_upgraded(Some(link));
            }
        }
        if switching_back(g.back, link.conn()) {
            self.settle_back(g);
        }
        if self.efds_to_sync() {
            self.sync_efds(g);
        }
    }

    /// Whether [`sync_efds`](Self::sync_efds) has anything to do: somebody waits on the
    /// eventfds, or the trace logs readiness (the usual case, nobody, decided without the
    /// call).
    fn efds_to_sync(&self) -> bool {
        self.efd_watchers.load(Ordering::SeqCst) != 0 || trace()
    }

    /// Returns the connection to TCP (protocol §8.5) on this side's initiative: for a process
    /// about to give its ring up while the socket lives on (`exec`, a fork child's use, a
    /// close while a fork child may hold the socket). `fd`: an fd of the application's that
    /// refers to the connection (the continuation is written through a private duplicate of
    /// it), or `None` to find one. Driven to its end by whoever settles the connection (the
    /// engine on its events, the caller through [`Conn::drive`]); done once the phase is
    /// [`Phase::Fallen`].
    pub(crate) fn hand_back(
        &self,
        g: &mut Inner,
        fd: Option<c_int>,
    ) -> Result<(), rdmashim_proto::SwitchBackError> {
        let Phase::Linked(l) = &mut g.phase else {
            return Ok(());
        };
        l.conn_mut().switch_back()?;
        match fd {
            Some(fd) => keep_back_sock(g, fd),
            None => {
                let _ = self.back_fd(g);
            }
        }
        self.drive(g, false);
        Ok(())
    }

    /// An fd of the application's that refers to the connection now, by the fd table: the
    /// one it was last seen through, else any (a scan of the table).
    fn app_fd(&self) -> Option<c_int> {
        let hint = self.fd_hint.load(Ordering::Relaxed);
        if self.holds(crate::fdtable::TABLE.get(hint)) {
            return Some(hint);
        }
        let mut found = None;
        crate::fdtable::TABLE.for_each(0, u32::MAX, |fd, e| {
            if found.is_none() && self.holds(e) {
                found = Some(fd);
            }
        });
        found
    }

    /// Whether fd-table entry `e` says its fd refers to this connection.
    fn holds(&self, e: crate::fdtable::FdEntry) -> bool {
        e.kind() == crate::fdtable::Kind::Upgraded && e.slot() == self.slot
    }

    /// Whether `fd` is a socket with this connection's addresses (the table may be stale for
    /// an fd whose close no hook saw).
    fn is_its_socket(&self, fd: c_int) -> bool {
        let same = |a: Option<SocketAddr>, b: SocketAddr| {
            a.map(net::canonical_addr) == Some(net::canonical_addr(b))
        };
        same(net::peer_addr(fd), self.peer) && same(net::local_addr(fd), self.local)
    }

    /// Carries out a switch back the link has started (either side's; see [`Back`]): retires
    /// the eventfds and gives the socket back to epoll registrations, writes the continuation
    /// once agreed, gives EPOLLOUT back once it is written, and makes the connection plain TCP
    /// once the link is torn down (its last message, our `SwitchBack`, delivered).
    fn settle_back(&self, g: &mut Inner) {
        let Phase::Linked(l) = &g.phase else {
            return;
        };
        if !l.conn().back_started() {
            // Called off (the peer's ring Close came before its SwitchBack): the ring goes on
            // to its end, its readiness through the eventfds again.
            if g.back == Back::Switching {
                g.back = Back::None;
                ready::restore_efds(self, g);
            }
            return;
        }
        self.begin_back(g);
        self.write_resume(g);
        let (resumed, switched, disconnected) = match &g.phase {
            Phase::Linked(l) => (
                l.conn().writes_resumed(),
                l.conn().switched_back(),
                l.is_disconnected(),
            ),
            _ => return,
        };
        if resumed {
            // (after a failover the peer's record may still be ahead of the reads: writes
            // need not wait for it)
            self.writes_resumed(g);
        }
        if !switched {
            return;
        }
        if disconnected {
            // A connection this side had not committed yet (the peer's switch back came
            // first: a fork child that took it over) still went over the ring: counted as
            // upgraded once, so that every switch back is one of the upgraded.
            let link = match &g.phase {
                Phase::Linked(l) => Some(&**l),
                _ => None,
            };
            self.count_upgraded(link);
            self.end_back(g, "");
        }
    }

    /// A switch back begins (once): its eventfds leave the epoll sets, which get the socket
    /// ([`ready::retire_efds`]).
    fn begin_back(&self, g: &mut Inner) {
        if g.back == Back::None {
            g.back = Back::Switching;
            match &g.phase {
                Phase::Linked(l) if l.conn().failed_over() => {
                    // (counted now, when it is decided: the process may end before the
                    // link's teardown does)
                    stats::count_path_failed();
                    shim_log!(
                        Level::Info,
                        "{} {} -> {}: the ring's path failed ({}); the stream goes on over TCP",
                        side_name(self.side),
                        self.local,
                        self.peer,
                        l.failure().unwrap_or("no detail")
                    )
                }
                _ => shim_log!(
                    Level::Debug,
                    "{} {} -> {}: switching back to TCP",
                    side_name(self.side),
                    self.local,
                    self.peer
                ),
            }
            ready::retire_efds(self, g);
        }
    }

    /// The switch back's writes are the socket's again (once): EPOLLOUT comes back to it.
    fn writes_resumed(&self, g: &mut Inner) {
        if g.back == Back::Switching {
            g.back = Back::Resumed;
            ready::unmask_out(self, g);
        }
    }

    /// The switch back is done: counted (a failover was, when it began), logged (`why` after
    /// "back on TCP"), and the connection is plain TCP from now on.
    fn end_back(&self, g: &mut Inner, why: &str) {
        let state = match &g.phase {
            Phase::Linked(l) if l.conn().failed_over() => crate::live_layout::ConnState::PathFailed,
            _ => {
                stats::count_switched_back();
                crate::live_layout::ConnState::SwitchedBack
            }
        };
        crate::live::conn_state(
            self.fd_hint.load(Ordering::Relaxed),
            (self.local, self.peer),
            crate::live_layout::Via::Tcp,
            state,
            None,
        );
        shim_log!(
            Level::Debug,
            "{} {} -> {}: back on TCP{why}",
            side_name(self.side),
            self.local,
            self.peer
        );
        self.to_tcp(g);
    }

    /// The link failed after this side switched, and the ring carried nothing either way
    /// ([`rdmashim_proto::Connection::failed_unused`]): the peer closed before its side of the
    /// upgrade was decided, having read and written everything over TCP. The stream goes on
    /// over TCP as it is, as after a switch back (counted so) — resetting it would cost this
    /// side the bytes the peer wrote before it closed. (Not when this side's write side was
    /// shut on the ring only: its FIN would be missing from TCP.)
    fn resume_on_tcp(&self, g: &mut Inner) {
        self.begin_back(g);
        self.writes_resumed(g);
        g.committed = false;
        self.end_back(
            g,
            " (the peer closed before its upgrade; nothing went over the ring)",
        );
    }

    /// Writes what is due of the continuation ([`rdmashim_proto::Resume`]) through the
    /// private duplicate, without blocking: what the socket does not take now is written by
    /// the next settle — the engine's, [`BACK_NAP`] ms later ([`Inner::resume_retry`]), if
    /// nothing else comes first (a program that waits for EPOLLOUT calls nothing meanwhile).
    fn write_resume(&self, g: &mut Inner) {
        use rdmashim_proto::Resume;
        loop {
            let Phase::Linked(l) = &g.phase else {
                return;
            };
            let Some(due) = l.conn().resume_due() else {
                return;
            };
            let Some(fd) = self.back_fd(g) else {
                resume_later(g);
                return;
            };
            let Phase::Linked(l) = &mut g.phase else {
                return;
            };
            match due {
                Resume::Record { bytes, len } => {
                    let from = bytes.len() - len.min(bytes.len());
                    match net::send(fd, &bytes[from..], libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) {
                        Ok(n) => l.conn_mut().resumed_record(n),
                        Err(e) if e.0 == libc::EAGAIN => {
                            resume_later(g);
                            return;
                        }
                        // (as below: the socket's own error is the application's next)
                        Err(e) => {
                            l.conn_mut().resumed_record(len);
                            keep_tcp_err(g, e);
                        }
                    }
                }
                Resume::Write { cursor, len } => {
                    let len = usize::try_from(len).unwrap_or(usize::MAX);
                    let r = match l.staging(cursor, len) {
                        Some(bytes) => {
                            net::send(fd, bytes, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
                        }
                        None => Err(crate::outcome::Errno(libc::EIO)),
                    };
                    match r {
                        Ok(n) => l.conn_mut().resumed(n as u64),
                        Err(e) if e.0 == libc::EAGAIN => {
                            resume_later(g);
                            return;
                        }
                        Err(e) => {
                            // The TCP connection is gone (reset, timed out): so is what was
                            // left to write; the application's next data call gets the
                            // error this send took off the socket (`Inner::tcp_err`).
                            shim_log!(
                                Level::Debug,
                                "{} -> {}: continuation not written: errno {}",
                                self.local,
                                self.peer,
                                e.0
                            );
                            l.conn_mut().resumed(len as u64);
                            keep_tcp_err(g, e);
                        }
                    }
                }
                Resume::ShutdownWrite => {
                    let _ = net::shutdown(fd, libc::SHUT_WR);
                    l.conn_mut().resumed_shutdown();
                }
            }
        }
    }

    /// The socket error a write of the shim's took off the socket ([`Inner::tcp_err`]), for
    /// the application's `getsockopt(SO_ERROR)`: once.
    pub(crate) fn take_tcp_err(&self) -> Option<Errno> {
        self.lock().tcp_err.take()
    }

    /// The private duplicate of the socket for the continuation, made now (from the
    /// application's fd the connection was last seen through, if the fd table still says so
    /// and the duplicate is the connection's socket) if there is none yet.
    /// Looks at `fd`, a descriptor of this connection's socket, which became readable while
    /// the peer's stream is on the ring (with failover: the engine's watch, a blocking read's;
    /// protocol §8.6). Bytes there are the peer's continuation: its path failed, and this
    /// side's, idle, may never hear of it: taken as failed too. An error pending on the socket
    /// is the kernel's verdict on the TCP connection under the stream — the keepalive probes
    /// or the user timeout the application set went unanswered, or a reset: the stream ends
    /// with that error, as the TCP connection would have (taking the error off the socket is
    /// safe only here, where the application's calls are the ring's). A bare end (FIN) is not
    /// acted on: a peer whose close its shim has not seen yet may end TCP before its ring
    /// Close arrives. Returns whether the socket had ended (then it need not be looked at
    /// again).
    pub(crate) fn look_under_ring(&self, g: &mut Inner, fd: c_int) -> bool {
        let Phase::Linked(l) = &mut g.phase else {
            return false;
        };
        l.progress(true);
        let conn = l.conn();
        let on_ring = !matches!(
            conn.recv(),
            rdmashim_proto::Recv::Tcp { .. } | rdmashim_proto::Recv::TcpControl { .. }
        );
        if !conn.fails_over() || conn.failed_over() || !on_ring {
            return false;
        }
        if net::fionread(fd).is_ok_and(|n| n > 0) {
            l.fail_path("the peer's stream arrived on TCP: its ring path failed");
            return false;
        }
        let rev = net::poll_now(fd, libc::POLLIN);
        if rev & libc::POLLERR != 0 {
            let e = net::get_int_opt(fd, libc::SOL_SOCKET, libc::SO_ERROR).unwrap_or(0);
            if e != 0 {
                shim_log!(
                    Level::Info,
                    "{} -> {}: the TCP connection under the stream failed (errno {e}): the \
                     stream ends with it",
                    self.local,
                    self.peer
                );
                l.conn_mut().handle_tcp_error(e == libc::ETIMEDOUT);
                return true;
            }
        }
        rev & libc::POLLIN != 0
    }

    /// Reads off socket `fd` what the peer's failover continuation owes the shim
    /// ([`rdmashim_proto::Connection::control_due`]: its record, then the bytes it repeats of
    /// what was read from the ring), as far as it is there, whether or not the application
    /// reads: an application that had its EOF from the ring reads no more, and a socket
    /// closed with those bytes unread would be reset, the peer losing what it had not read
    /// yet. `Ok(true)`: more is due and the socket has none now; `Ok(false)`: none is due (any
    /// more); `Err`: the socket failed. The kernel reports a socket's error once, and it is
    /// the application's: unless a reset (which fails the stream itself), it is kept in
    /// [`Inner::tcp_err`] for the application's next call, and nothing more is read — a caller
    /// that hands the error to the application takes it from there.
    pub(crate) fn take_control(&self, g: &mut Inner, fd: c_int) -> Result<bool, Errno> {
        let mut buf = [0u8; 4096];
        let r = loop {
            if let Some(e) = g.tcp_err {
                break Err(e);
            }
            let Phase::Linked(l) = &mut g.phase else {
                break Ok(false);
            };
            let Some(len) = l.conn().control_due() else {
                break Ok(false);
            };
            let max = buf.len().min(usize::try_from(len).unwrap_or(usize::MAX));
            match net::recv(fd, &mut buf[..max], libc::MSG_DONTWAIT) {
                Ok(0) => {
                    let _ = l.conn_mut().handle_tcp_eof();
                    break Ok(false);
                }
                Ok(n) => {
                    let _ = l.conn_mut().tcp_control(&buf[..n]);
                }
                Err(e) if e.0 == libc::EAGAIN => break Ok(true),
                Err(e) if e.0 == libc::ECONNRESET => {
                    l.conn_mut().handle_tcp_reset();
                    break Err(e);
                }
                Err(e) => {
                    keep_tcp_err(g, e);
                    break Err(e);
                }
            }
        };
        self.settle(g);
        r
    }

    /// Why a connection this process closed before its upgrade was decided stays TCP: it
    /// ended early (`closed_early`) — unless the process forked since it was made: then a
    /// child may hold the socket and go on with it, as a PostgreSQL backend does once its
    /// postmaster closed its copy (`forked`: the request was answered before the fork).
    pub(crate) fn closed_reason(&self) -> FallbackReason {
        if self.attrs.shared_by_fork() {
            FallbackReason::Forked
        } else {
            FallbackReason::ClosedEarly
        }
    }

    /// A grown ring of the link is given back once its stream has stood still
    /// (`RDMASHIM_RING_IDLE_SECS`, [`Link::check_idle`]); the engine calls it when the link's
    /// timer is due, before it drives the link (which posts the offer).
    pub(crate) fn check_idle(&self, g: &mut Inner, now: Instant) {
        if let Phase::Linked(l) = &mut g.phase {
            l.check_idle(now);
        }
    }

    /// The application's TCP_USER_TIMEOUT on the ring ([`Link::check_acks`]): with the option
    /// set on the socket, work requests the peer's device has not acknowledged for that long
    /// fail the ring's path, and the stream goes on over TCP, whose own user timeout ends it if
    /// the peer is gone for good — about twice the option in all, where the queue pair's own
    /// retries alone (~16 s on soft-RoCE, the ack timeout × 7 on a NIC) would come first.
    /// Called by the engine every second and when the watch's deadline passes; returns
    /// whether it drove the link (the caller applies the change to readiness).
    pub(crate) fn watch_acks(&self, g: &mut Inner, now: Instant) -> bool {
        if !matches!(&g.phase, Phase::Linked(l) if !l.is_local()) {
            return false;
        }
        let fd = g.back_sock.or_else(|| self.app_fd());
        let limit = fd.and_then(|fd| self.attrs.user_timeout(fd));
        let Phase::Linked(l) = &mut g.phase else {
            return false;
        };
        if limit.is_none() && l.ack_deadline().is_none() {
            return false;
        }
        // (completions the CQ holds count: taken first)
        l.progress(false);
        // (a failed path is logged, with the reason, where the stream turns to TCP)
        l.check_acks(now, limit);
        self.settle(g);
        true
    }

    fn back_fd(&self, g: &mut Inner) -> Option<c_int> {
        if g.back_sock.is_none() && !g.closed {
            if let Some(fd) = self.app_fd() {
                if let Ok(d) = net::dup_private(fd, PRIVATE_FD_MIN) {
                    if self.is_its_socket(d) {
                        g.back_sock = Some(d);
                    } else {
                        net::close(d);
                    }
                }
            }
        }
        g.back_sock
    }

    /// A thread is about to wait on the eventfds (called with the lock held, before it
    /// waits): their levels are set now and kept until [`unwatch_efds`](Self::unwatch_efds).
    pub(crate) fn watch_efds(&self, g: &mut Inner) {
        self.efd_watchers.fetch_add(1, Ordering::SeqCst);
        self.sync_efds(g);
    }

    /// Whether a thread may be waiting on the connection's readiness other than in one of its
    /// blocking data calls (which arm the CQ before they sleep): it is in an epoll set, or a
    /// poll-family call or a data call's wait looks at its eventfds. Such a wait may have begun
    /// before an application thread left the CQ unarmed, and learns of the connection's next
    /// completion only once the CQ is armed again.
    pub(crate) fn readiness_watched(&self) -> bool {
        self.efd_watchers.load(Ordering::SeqCst) != 0
            || self.comp_in_app.load(Ordering::SeqCst) != 0
    }

    /// The thread of a [`watch_efds`](Self::watch_efds) stopped waiting.
    pub(crate) fn unwatch_efds(&self) {
        self.efd_watchers.fetch_sub(1, Ordering::SeqCst);
    }

    /// A poll-family call will look at this connection (each look locks it and sets the
    /// levels, see [`ready`]): the levels are kept until [`unwatch_efds`](Self::unwatch_efds).
    pub(crate) fn watch_efds_unlocked(&self) {
        self.efd_watchers.fetch_add(1, Ordering::SeqCst);
    }

    /// The connection is registered in an epoll set: its eventfds' levels are kept for good
    /// (and set now).
    pub(crate) fn watch_efds_for_epoll(&self, g: &mut Inner) {
        if self.efd_watchers.fetch_or(EFDS_EPOLLED, Ordering::SeqCst) & EFDS_EPOLLED == 0 {
            self.sync_efds(g);
        }
    }

    /// An application's epoll set took the link's completion channel (registry unlocked):
    /// the engine stops watching it, and the CQ is armed (an application thread may have
    /// left it unarmed) so that the next completion makes the channel readable.
    pub(crate) fn comp_to_app(&self, g: &mut Inner) {
        if let Phase::Linked(l) = &g.phase {
            self.comp_off_engine(l, &mut g.comp_unwatched);
        }
        // (an inbox left unarmed and listed is armed by the set's next sleep: event loops
        // that DEL and ADD a connection on every request would arm it each time, and have the
        // peer write the eventfd for each answer, while they busy-poll)
        if self.arrivals.get().is_none() || !self.unarmed_listed.load(Ordering::SeqCst) {
            self.ensure_armed(g);
        }
    }

    /// Takes link `l`'s completion channel out of the engine's set unless it is out already
    /// (`unwatched`: [`Inner::comp_unwatched`], which the caller's lock guards).
    pub(crate) fn comp_off_engine(&self, l: &Link, unwatched: &mut bool) {
        if !*unwatched {
            engine::watch_completions(self, l, false);
            *unwatched = true;
        }
    }

    /// The last application epoll set let the link's completion channel go (registry
    /// unlocked): the engine watches it again (unless a blocked thread waits on it), and
    /// whatever completed meanwhile is taken.
    pub(crate) fn comp_from_app(&self, g: &mut Inner) {
        if self.comp_in_app.load(Ordering::SeqCst) == 0 {
            self.on_completions(g);
        }
    }

    /// Sets the eventfds' levels from the ring side's readiness, if anyone waits on them
    /// ([`Conn::efd_watchers`]; a watcher sets them when it starts, under the lock, so a
    /// change made before that is not missed).
    pub(crate) fn sync_efds(&self, g: &mut Inner) {
        let Phase::Linked(link) = &g.phase else {
            return;
        };
        if g.back != Back::None {
            // (retired: see `Back::Switching`)
            return;
        }
        // (nobody waits on the eventfds: whoever starts to brings them up to date,
        // `watch_efds`; the readiness is not worked out for nothing on every settle)
        let watched = self.efd_watchers.load(Ordering::SeqCst) != 0;
        if !watched && !trace() {
            return;
        }
        let c = link.conn();
        let r = c.readiness();
        let rd = !r.read_via_tcp && (r.readable || r.hup || r.error || r.rdhup);
        // (the hang-up too: a registration for writing only may hold no socket, see
        // `ready::needs_socket`)
        let wr = !r.write_via_tcp && (r.writable || r.error || r.hup);
        let mark = c.stats().messages_received;
        if trace() {
            crate::shim_log!(
                Level::Debug,
                "trace: sync {}->{} rd={rd} wr={wr} st={:?} via_tcp={}/{} r={}{}{} tx={:?} rx={:?} slots={:?} fail={:?}",
                self.local,
                self.peer,
                c.state(),
                r.read_via_tcp,
                r.write_via_tcp,
                if r.readable { "R" } else { "-" },
                if r.writable { "W" } else { "-" },
                if r.rdhup { "H" } else { "-" },
                c.tx_cursors(),
                c.rx_cursors(),
                c.peer_slots(),
                link.failure(),
            );
        }
        if !watched {
            return;
        }
        if rd {
            if !g.rd_set || mark != g.rd_mark {
                net::eventfd_signal(self.rd_efd);
                g.rd_set = true;
                g.rd_mark = mark;
            }
        } else if g.rd_set {
            net::eventfd_clear(self.rd_efd);
            g.rd_set = false;
        }
        if wr {
            if !g.wr_set {
                net::eventfd_signal(self.wr_efd);
                g.wr_set = true;
            }
        } else if g.wr_set {
            net::eventfd_clear(self.wr_efd);
            g.wr_set = false;
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        crate::fdtable::UPGRADE_CONNS.fetch_sub(1, Ordering::Relaxed);
        // Eventfds that were never in an epoll set go back to the pool, at level zero (they
        // are set only through `sync_efds` and `ready::retire_efds`, which record it); nobody
        // else can hold them: a poll of them holds a reference to this connection. One that
        // was in a set may still be, in a duplicate of that set's epoll fd that the registry
        // does not know: closed.
        let inner = self.inner.get_mut().unwrap_or_else(|p| p.into_inner());
        if inner.unarmed.take().is_some() && slot_is_ours(self.slot) {
            unarmed_done(inner.unarmed_cq);
        }
        if let Some(s) = inner.back_sock.take() {
            engine::unwatch_sock(s);
            net::close(s);
        }
        let epolled = self.efd_watchers.load(Ordering::SeqCst) & EFDS_EPOLLED != 0;
        if !epolled && slot_is_ours(self.slot) {
            self.clear_efds(&mut self.lock());
            if let Some(w) = world_if_created() {
                if w.keep_efds(self.rd_efd, self.wr_efd) {
                    return;
                }
            }
        }
        net::close(self.rd_efd);
        net::close(self.wr_efd);
    }
}

/// Makes the private duplicate a switch back writes its continuation through
/// ([`Inner::back_sock`]) from `fd`, an fd of the application's that refers to the connection
/// now, unless there is one.
pub(crate) fn keep_back_sock(g: &mut Inner, fd: c_int) {
    if g.back_sock.is_none() {
        g.back_sock = net::dup_private(fd, PRIVATE_FD_MIN).ok();
    }
}

/// Whether a switch back to TCP is under way, on this side's initiative (`back`,
/// [`Inner::back`]) or the peer's (the core's): what [`Conn::settle`] drives with
/// `settle_back`.
fn switching_back(back: Back, c: &rdmashim_proto::Connection) -> bool {
    back != Back::None || c.back_started()
}

/// The continuation is tried again [`BACK_NAP`] ms from now (see [`Inner::resume_retry`]).
fn resume_later(g: &mut Inner) {
    g.resume_retry = Some(Instant::now() + std::time::Duration::from_millis(BACK_NAP as u64));
}

/// A new pair of eventfds (read, write) above [`PRIVATE_FD_MIN`], or none.
fn new_efds() -> Option<(c_int, c_int)> {
    let rd = net::eventfd(PRIVATE_FD_MIN).ok()?;
    match net::eventfd(PRIVATE_FD_MIN) {
        Ok(wr) => Some((rd, wr)),
        Err(_) => {
            net::close(rd);
            None
        }
    }
}

fn side_name(s: Side) -> &'static str {
    match s {
        Side::Client => "client",
        Side::Server => "server",
    }
}

/// Client, waiting for the server's token: looks at the first bytes of the server's direction
/// on `fd` (an fd of the connection's socket) and records what they said — the key, or the
/// fallback (application bytes first: no shim there). Call with the lock held, before any byte
/// of that direction is read for the application; tell the engine when this decided it
/// ([`Engine::token_decided`]).
pub(crate) fn see_token(c: &Conn, g: &mut Inner, fd: c_int) {
    match binding::look(fd) {
        binding::Seen::Nothing => {}
        binding::Seen::Token(t) => {
            g.token = binding::TokenWait::Got(t.key, t.dial_port);
            g.token_taken = true;
        }
        binding::Seen::Unusable(e) => {
            g.token = binding::TokenWait::None;
            g.token_taken = true;
            c.fall_back(
                g,
                match e {
                    rdmashim_proto::DecodeError::UnsupportedVersion(_) => {
                        FallbackReason::PeerVersion
                    }
                    _ => FallbackReason::ProtocolError,
                },
            );
        }
        binding::Seen::Plain => {
            g.token = binding::TokenWait::None;
            c.fall_back(g, FallbackReason::PlainPeer);
            engine::plain_peer(c.peer);
        }
        binding::Seen::Ended => {
            g.token = binding::TokenWait::None;
            c.fall_back(g, FallbackReason::ClosedEarly);
        }
    }
}

/// While a client waits for the server's token, takes it out of the stream if it is there
/// (see [`see_token`]; `fd`: any fd of the socket) before anything of that direction
/// reaches the application, and tells the engine once the wait is decided.
pub(crate) fn take_token(c: &Conn, g: &mut Inner, fd: c_int) {
    if g.token != binding::TokenWait::Awaiting {
        return;
    }
    // (a connect still in progress, or failed: no byte of the server's yet, and an EOF is
    // the failed connect's, not a plain server's; the engine decides the connect first)
    if g.pending.is_some() && pending_outcome(g) != Some(true) {
        return;
    }
    see_token(c, g, fd);
    if g.token != binding::TokenWait::Awaiting {
        token_decided(c);
    }
}

/// Tells the engine that `c`'s wait for the token was decided by an application thread.
pub(crate) fn token_decided(c: &Conn) {
    let engine = world_if_created().and_then(|w| w.engine_if_started());
    if let (Some(e), Some(arc)) = (engine, lookup(c.slot)) {
        e.token_decided(arc);
    }
}

/// Client: the server's token did not complete in time (a part of one, and no more): what
/// came is the application's, and the connection stays TCP.
pub(crate) fn give_up_token(c: &Conn, g: &mut Inner) {
    if g.token == binding::TokenWait::Awaiting {
        g.token = binding::TokenWait::None;
        c.fall_back(g, FallbackReason::ProtocolError);
    }
}

/// The stats reason for a handshake that failed before anything was committed.
pub(crate) fn fallback_reason(r: ErrorReason) -> FallbackReason {
    match r {
        ErrorReason::Rejected(Some(RejectReason::Resources)) => FallbackReason::Resources,
        ErrorReason::Rejected(Some(RejectReason::Disabled)) => FallbackReason::Disabled,
        ErrorReason::Rejected(Some(RejectReason::UnsupportedVersion)) => {
            FallbackReason::PeerVersion
        }
        ErrorReason::Rejected(_) => FallbackReason::PeerRejected,
        ErrorReason::HandshakeTimeout => FallbackReason::UpgradeTimeout,
        ErrorReason::Handshake(rdmashim_proto::HandshakeError::Unproven) => {
            FallbackReason::UnprovenPeer
        }
        ErrorReason::Handshake(_) | ErrorReason::Protocol(_) => FallbackReason::ProtocolError,
        ErrorReason::TcpClosed => FallbackReason::ClosedEarly,
        ErrorReason::TcpTimedOut => FallbackReason::PeerUnreachable,
        ErrorReason::Transport | ErrorReason::Reset | ErrorReason::PeerVanished => {
            FallbackReason::PeerUnreachable
        }
    }
}

// ----- the process's upgrade state ---------------------------------------------------------

/// Everything the upgrade keeps per process. A forked child starts a new one (the parent's
/// locks may have been held at the fork; its connections are the parent's).
pub struct World {
    /// The connections, by fd-table slot ([`slot_parts`]).
    conns: Slots<Conn>,
    pub(crate) regs: Mutex<ready::Registry>,
    engine: OnceLock<Option<Engine>>,
    /// Eventfd pairs of ended connections, for the next ones: a connection's two eventfds
    /// cost six system calls to make (each is moved above [`PRIVATE_FD_MIN`]) and two to
    /// close, of the ~28 a short upgraded connection makes. A fork child has a world (and a
    /// pool) of its own: the parent's eventfds, which it shares, are never handed out twice.
    efd_pool: Mutex<Vec<(c_int, c_int)>>,
    /// Where fork children ask for this world's connections (made at the first fork; `None`:
    /// it could not be made). See [`board`].
    board: OnceLock<Option<board::Board>>,
}

/// The most eventfd pairs [`World::efd_pool`] keeps.
const EFD_POOL_MAX: usize = 64;

/// One world per process generation (a fork child moves to the next one). A generation's
/// world is created on first use; the parent's stays untouched in the child's memory.
static WORLDS: [OnceLock<World>; 256] = [const { OnceLock::new() }; 256];
/// Generation of this process: bumped in every fork child (saturating at [`LAST_GENERATION`],
/// where upgrades stop). The slot of a connection carries it, so a child recognises its
/// parent's connections without touching them.
static GENERATION: AtomicU32 = AtomicU32::new(1);
const LAST_GENERATION: u32 = 255;

/// A slot number (the fd table's, [`crate::fdtable::SLOT_BITS`] bits): the process
/// generation (8 bits) above the generation of the connection's slot in its world
/// ([`SLOT_GEN_BITS`]) above its index plus one ([`INDEX_BITS`]; 0: no connection).
const INDEX_BITS: u32 = 20;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;
/// Bits of a slot's generation a slot number keeps: a thread that read an fd's slot just
/// before the fd was closed finds no connection, rather than the next one in that slot, unless
/// the slot was used 4096 times meanwhile (freed slots are reused oldest first).
const SLOT_GEN_BITS: u32 = 12;
const PROCESS_SHIFT: u32 = INDEX_BITS + SLOT_GEN_BITS;
/// Connections a process generation can have at once (one more is counted `resources`).
const MAX_CONNS: usize = (1 << INDEX_BITS) - 1;

fn generation() -> u32 {
    GENERATION.load(Ordering::Relaxed)
}

/// The process's world (created on first use); `None` past the last generation.
pub fn world() -> Option<&'static World> {
    let g = generation();
    if g >= LAST_GENERATION {
        return None;
    }
    Some(WORLDS[g as usize].get_or_init(|| {
        // (the transport's descriptors are the shim's: hidden from close-all loops, and moved
        // up where the shim keeps its own, away from the numbers programs pick for theirs)
        rdmashim_core::fds::set_watcher(transport_fd);
        rdmashim_core::fds::set_floor(PRIVATE_FD_MIN);
        World {
            conns: Slots::new(MAX_CONNS, SLOT_GEN_BITS),
            regs: Mutex::new(ready::Registry::default()),
            engine: OnceLock::new(),
            efd_pool: Mutex::new(Vec::new()),
            board: OnceLock::new(),
        }
    }))
}

/// The process that last opened a descriptor of the transport's (0: none yet): in a fork
/// child, its parent until it opens one of its own.
static RDMA_OPENER: AtomicU32 = AtomicU32::new(0);

/// Told by the transport of each descriptor it keeps open, and of each it is about to close
/// (`rdmashim_core::fds`): they are marked the shim's own.
fn transport_fd(fd: c_int, open: bool) {
    if open {
        RDMA_OPENER.store(crate::sys::getpid(), Ordering::Relaxed);
        crate::fdtable::TABLE.mark_private(fd);
    } else {
        crate::fdtable::TABLE.unmark_private(fd);
    }
}

/// The world if it was created (never creates one).
pub fn world_if_created() -> Option<&'static World> {
    world_of(generation())
}

/// The world of process generation `g` (this process's, or in a fork child an ancestor's), if
/// it was created.
fn world_of(g: u32) -> Option<&'static World> {
    WORLDS.get(g as usize).and_then(|w| w.get())
}

/// The process generation a fd-table slot belongs to, and its connection's key in that
/// generation's world (an index no world holds for the empty slot 0).
fn slot_parts(slot: u64) -> (u32, Key) {
    let index = ((slot & INDEX_MASK) as u32).wrapping_sub(1);
    let gen = (slot >> INDEX_BITS) as u32 & ((1 << SLOT_GEN_BITS) - 1);
    ((slot >> PROCESS_SHIFT) as u32, Key { index, gen })
}

/// The fd-table slot of the connection of key `k` in this process generation's world.
fn slot_number(k: Key) -> u64 {
    u64::from(generation()) << PROCESS_SHIFT
        | u64::from(k.gen) << INDEX_BITS
        | u64::from(k.index + 1)
}

impl World {
    /// The engine, started on first use; `None` if it cannot run here (no RDMA, no thread)
    /// or was halted.
    pub fn engine(&self) -> Option<&Engine> {
        self.engine
            .get_or_init(Engine::start)
            .as_ref()
            .filter(|_| !engine::halted())
    }

    /// The engine, if it was started and not halted (`engine::halt`).
    pub fn engine_if_started(&self) -> Option<&Engine> {
        self.engine
            .get()
            .and_then(|e| e.as_ref())
            .filter(|_| !engine::halted())
    }

    /// A pooled eventfd pair (both at level zero, in no epoll set), if any.
    fn reuse_efds(&self) -> Option<(c_int, c_int)> {
        self.efd_pool
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop()
    }

    /// Pools an ended connection's eventfd pair (see [`Conn`]'s drop); false if the pool is
    /// full (the caller closes them).
    fn keep_efds(&self, rd: c_int, wr: c_int) -> bool {
        let mut p = self.efd_pool.lock().unwrap_or_else(|p| p.into_inner());
        if p.len() >= EFD_POOL_MAX {
            return false;
        }
        p.push((rd, wr));
        true
    }

    fn insert(&self, make: impl FnOnce(u64) -> Option<Conn>) -> Option<Arc<Conn>> {
        let (_, c) = self.conns.insert(|k| {
            let c = make(slot_number(k))?;
            // (under the inserts' lock: a board being made now either sees this connection
            // or is seen here)
            if let Some(b) = self.board() {
                b.took(k.index as usize, c.attrs.born());
            }
            Some(c)
        })?;
        Some(c)
    }

    /// The connection of fd-table slot `slot`, if it belongs to this process generation.
    #[inline]
    pub fn get(&self, slot: u64) -> Option<Arc<Conn>> {
        if !slot_is_ours(slot) {
            return None;
        }
        self.conns.get(slot_parts(slot).1)
    }

    /// `f` on the connection of fd-table slot `slot`, borrowed while it runs (no reference
    /// taken: [`Slots::with`]), if it belongs to this process generation.
    #[inline]
    fn with<R>(&self, slot: u64, f: impl FnOnce(&Conn) -> R) -> Option<R> {
        if !slot_is_ours(slot) {
            return None;
        }
        self.conns.with(slot_parts(slot).1, f)
    }

    /// Removes the connection of `slot` (its last fd was closed and the engine is done with it).
    fn remove(&self, slot: u64) {
        if slot_is_ours(slot) {
            self.conns.remove(slot_parts(slot).1);
        }
    }

    /// The connection in slot index `index` (of any fd-table slot of this generation).
    fn at(&self, index: usize) -> Option<Arc<Conn>> {
        self.conns.at(index)
    }

    /// Slot indexes in use or free (one past the highest ever used).
    fn slots(&self) -> usize {
        self.conns.len()
    }

    /// The fork board, if one was made.
    fn board(&self) -> Option<&board::Board> {
        self.board.get().and_then(Option::as_ref)
    }

    /// Every live connection (for the exit flush).
    fn all(&self) -> Vec<Arc<Conn>> {
        self.conns.all().into_iter().map(|(_, c)| c).collect()
    }
}

/// A connection's counters that one writer at a time moves (the lock's holder, or a count
/// whose racing writers may lose an increment) are added to by [`crate::stats::bump`].
pub(crate) use crate::stats::bump;

/// `f` on the connection of `slot` in this process, borrowed while it runs (the data calls'
/// way: no reference counted up and down), if there is one.
#[inline]
pub fn with_own<R>(slot: u64, f: impl FnOnce(&Conn) -> R) -> Option<R> {
    world_if_created()?.with(slot, f)
}

/// The connection of `slot` in this process, if any.
pub fn lookup(slot: u64) -> Option<Arc<Conn>> {
    world_if_created()?.get(slot)
}

/// In a fork child, the program uses a connection of `slot`, which its parent made: this
/// process's own connection for it if the parent offered it at the fork and it takes it over
/// ([`adopt`]); `None` to go on as [`use_inherited`] says.
pub fn adopt_inherited(slot: u64) -> Option<Arc<Conn>> {
    adopt::adopt(slot)
}

/// This process used `c`, which it offered to a fork child ([`Conn::offered`]): it keeps the
/// connection, on TCP.
pub fn reclaim_offered(c: &Conn) {
    adopt::reclaim(c);
}

/// In a fork child, about to use (or exec with) a connection of `slot`, which its parent (or an
/// older ancestor) made: makes it plain TCP, asking its owner to switch it back if it is on a
/// ring ([`board`]), and waits for that. `Ok`: the socket has the whole stream; `Err`: the
/// connection could not be had (ECONNRESET).
pub fn use_inherited(slot: u64) -> Result<(), crate::outcome::Errno> {
    board::inherited(slot)
}

/// In a fork child: whether the parent's connection of `slot` had settled on TCP (then the
/// child can use the socket as plain TCP). Never waits on a lock the parent may have held.
fn inherited_fell_back(slot: u64) -> bool {
    let (g, k) = slot_parts(slot);
    world_of(g)
        .and_then(|w| w.conns.get(k))
        .is_some_and(|c| c.fell_back.load(Ordering::Acquire))
}

/// The outcome of a connection's pending TCP connect: `Some(true)` connected (even if the
/// connection is over since), `Some(false)` failed, `None` still in progress (or no connect
/// pending). `getpeername`, not `SO_ERROR`:
/// reading SO_ERROR would take the error from the application, which reads it itself.
pub(crate) fn pending_outcome(g: &Inner) -> Option<bool> {
    let fd = g.pending?;
    if net::peer_addr(fd).is_some() {
        Some(true)
    } else if net::poll_now(fd, libc::POLLOUT) & (libc::POLLERR | libc::POLLHUP) != 0 {
        // (failed, or connected and over already: a short exchange the engine looks at
        // late, when a burst of connections keeps it busy, or at exit)
        Some(net::ever_connected(fd) == Some(true))
    } else {
        None
    }
}

/// Whether `slot` names a connection of this process (not one inherited from a parent).
pub fn slot_is_ours(slot: u64) -> bool {
    slot & INDEX_MASK != 0 && slot >> PROCESS_SHIFT == u64::from(generation())
}

/// Before a fork (the `pthread_atfork` prepare handler, in the forking thread): connections
/// from now on may share their socket with the child, and whichever process goes on with one
/// must find TCP's semantics. A server's accepted connection waiting for its client's request
/// is offered to the child ([`adopt`]): a server that accepts, then forks a process to serve
/// the connection (inetd-style servers, PostgreSQL's backends, git and rsync daemons) has the
/// child take its upgrade over. One that cannot be offered (offered at an earlier fork
/// already, or no board) settles on TCP now (reason `forked`), so that the child's copy of
/// this process's memory already says so and the child uses the socket as plain TCP; so does
/// a client's connection whose dial has not started and whose server token is already out of
/// the stream (a client that connects, then forks, dials nobody; a token still on its way
/// must be taken out by this process's shim: it stays as it is).
/// Connections past that point (a request being answered, a dial under way, the ring) are left
/// to the child's own handling (docs/upgrade.md, process models). Never waits for a lock: one
/// held elsewhere (the engine, a thread of a forking signal handler) leaves its connection as
/// it is.
pub fn before_fork() {
    attrs::before_fork();
    let Some(w) = world_if_created() else {
        return;
    };
    if w.board.get().is_none()
        && !w.conns.is_empty()
        && retry(|| w.conns.try_exclusive(|| make_board(w))).is_none()
    {
        return;
    }
    for c in w.all() {
        let Some(mut g) = retry(|| c.try_lock()) else {
            continue;
        };
        let settle = match g.phase {
            Phase::Awaiting => g.closed || !adopt::offer(&c),
            Phase::Queued => g.token != binding::TokenWait::Awaiting && g.pending.is_none(),
            _ => false,
        };
        if settle && !g.closed {
            c.fall_back(&mut g, FallbackReason::Forked);
        }
    }
}

/// The shim failed (a panic in a hook, or in the engine or setup thread; the caller poisoned
/// the shim first, so that every later call passes straight through to the kernel). Every
/// connection that is not plain TCP for good fails as a reset TCP connection would, rather
/// than fall through to a socket the peer no longer writes to (a hang) or that still holds
/// the token (a corrupt stream): one on the ring is aborted (the peer reads ECONNRESET), one
/// still undecided stops there (its dial or request is dropped), and the socket of every fd
/// of the program's that refers to it is reset (`net::reset_socket`, checked to be the same
/// socket by its addresses): the program's next call on it gets ECONNRESET from the kernel.
/// Counted once per connection not counted before (`internal_error`).
fn fail_all() {
    let Some(w) = world_if_created() else {
        return;
    };
    for c in w.all() {
        c.fail();
    }
}

impl Conn {
    /// See [`fail_all`].
    fn fail(&self) {
        let mut g = self.lock();
        if matches!(g.phase, Phase::Fallen) {
            return;
        }
        if let Phase::Linked(l) = &mut g.phase {
            l.conn_mut().abort();
            l.progress(false);
            self.sync_efds(&mut g);
        } else {
            self.to_tcp(&mut g);
        }
        if !self.counted.swap(true, Ordering::AcqRel) {
            stats::count_fallback(FallbackReason::InternalError);
        }
        drop(g);
        crate::fdtable::TABLE.for_each(0, u32::MAX, |fd, e| {
            if self.holds(e) && self.is_its_socket(fd) {
                let _ = net::reset_socket(fd);
            }
        });
    }
}

/// The shim panicked in `place` (a hook, or one of its threads): the shim is poisoned (every
/// later call passes through), the panic logged, and every connection not on plain TCP reset
/// ([`fail_all`]).
pub fn failed_by_panic(place: &str) {
    crate::guard::poison();
    let _ = std::panic::catch_unwind(|| {
        shim_log!(
            Level::Error,
            "internal error (panic) in {place}{}: connections not on plain TCP are reset, everything else passes through from now on",
            crate::fault::last_panic()
        );
        fail_all();
    });
}

/// Before this process changes its credentials (`setuid` and its kin, see
/// `hooks/process.rs`). The kernel refuses rdma_cm and verbs commands on a descriptor opened
/// under other credentials than the caller's (`ib_safe_file_access`), and a change gives each
/// thread credentials of its own (glibc makes every thread change them itself). So if this
/// process has opened RDMA descriptors, or runs more than one thread (the shim's engine, or
/// the program's: whichever thread later opened them, the others could not use them), RDMA
/// ends here for it: new connections stay TCP (reason `credentials_changed`), its rdma_cm
/// listeners are dropped while that is still allowed, and the caller returns its connections
/// to TCP. A process of one thread that never used RDMA (a prefork worker dropping root before
/// its first accept) changes nothing. Returns whether RDMA ended now.
pub fn close_for_credentials() -> bool {
    if crate::probe::host_reason().is_some() {
        return false;
    }
    let opened = RDMA_OPENER.load(Ordering::Relaxed) == crate::sys::getpid();
    let engine = world_if_created().and_then(World::engine_if_started);
    if !opened && engine.is_none() && !several_threads() {
        return false;
    }
    end_rdma_saying(
        FallbackReason::CredentialsChanged,
        format_args!("the process changes its credentials after using RDMA (or with several threads): the kernel would refuse its RDMA commands, so"),
        "",
    )
}

/// Before this process installs a seccomp filter (see `hooks/process.rs`): RDMA ends for it
/// for good (reason `sandboxed`, kept by its fork children, which inherit the filter), its
/// rdma_cm listeners are dropped, and the caller returns its connections to TCP. Returns
/// whether RDMA ended now (not if it had already, or never started: no device, say).
pub fn close_for_sandbox() -> bool {
    end_rdma_saying(
        FallbackReason::Sandboxed,
        format_args!("the process installs a seccomp filter:"),
        "; the shim writes nothing more",
    )
}

/// Before this process sets up an io_uring instance (see `hooks/syscall.rs`): io_uring's
/// reads, writes and closes of a socket reach the kernel without any call the shim sees, so
/// RDMA ends for the process for good (reason `io_uring`, kept by its fork children, which
/// share the instance), its rdma_cm listeners are dropped, and the caller returns its
/// connections to TCP while the instance does not exist yet. Returns whether RDMA ended now.
pub fn close_for_io_uring() -> bool {
    end_rdma_saying(
        FallbackReason::IoUring,
        format_args!("the process sets up io_uring, whose I/O the shim cannot see:"),
        "",
    )
}

/// The shim's descriptors were given up ([`close_for_replaced_fd`]).
static FDS_GIVEN_UP: AtomicBool = AtomicBool::new(false);

/// Before the program puts a file of its own at `fd`, a descriptor of the shim's or of the
/// RDMA libraries' (see `hooks/process.rs`): RDMA ends for the process for good (reason
/// `fd_replaced`, kept by its fork children), its rdma_cm listeners are dropped, and the caller
/// returns its connections to TCP, then calls [`abandon_descriptors`]. Returns false if this
/// was done before (nothing of the shim's is used any more).
pub fn close_for_replaced_fd(fd: c_int) -> bool {
    if FDS_GIVEN_UP.swap(true, Ordering::AcqRel) {
        return false;
    }
    end_rdma(FallbackReason::FdReplaced);
    log_rdma_ended(
        FallbackReason::FdReplaced,
        format_args!("the program puts a file of its own at descriptor {fd}, one of the shim's:"),
        "; the shim's descriptors are left unused from now on",
    );
    true
}

/// After [`close_for_replaced_fd`] and the return of the connections to TCP: connections the
/// application closed get a bounded time to finish on their rings (as at exit), the engine
/// stops ([`engine::halt`]: what it still holds is finished or rejected), and from then on
/// nothing is released or used through the RDMA libraries (`rdmashim_core::fds::abandon`) and
/// no descriptor of the shim's is read, written or closed (`net::abandon_private`): any of
/// them may be the program's file.
pub fn abandon_descriptors() {
    if let Some(w) = world_if_created() {
        let deadline = Instant::now() + std::time::Duration::from_secs(2);
        for c in w.all() {
            if c.lock().closed {
                data::flush_before_exit(&c, deadline);
            }
        }
    }
    if !engine::halt() {
        shim_log!(
            Level::Warn,
            "the shim's threads did not stop in time: what they hold is left as it is"
        );
    }
    rdmashim_core::fds::abandon();
    net::abandon_private();
}

/// RDMA ends for this process: new connections stay TCP with `reason` (unless a host-wide
/// reason already holds) and its rdma_cm listeners are dropped; the caller returns its
/// connections to TCP. Returns whether it ended now.
fn end_rdma(reason: FallbackReason) -> bool {
    if !crate::probe::close_host(reason) {
        return false;
    }
    if let Some(e) = world_if_created().and_then(World::engine_if_started) {
        e.drop_listeners();
    }
    true
}

/// [`end_rdma`], and if it ended now, the log line that says why (`why`, then what follows
/// for the connections, then `more`). Returns whether it ended now.
fn end_rdma_saying(reason: FallbackReason, why: core::fmt::Arguments<'_>, more: &str) -> bool {
    if !end_rdma(reason) {
        return false;
    }
    log_rdma_ended(reason, why, more);
    true
}

/// The log line of RDMA's end for this process: `why`, what becomes of its connections (and
/// the reason they count), then `more`.
fn log_rdma_ended(reason: FallbackReason, why: core::fmt::Arguments<'_>, more: &str) {
    shim_log!(
        Level::Info,
        "{why} its connections go back to TCP and new ones stay there ({}){more}",
        reason.name()
    );
}

/// Whether the process runs more than one thread (when it cannot be told: yes).
fn several_threads() -> bool {
    std::fs::read_dir("/proc/self/task").map_or(true, |d| d.take(2).count() > 1)
}

/// The first fork of a process with connections: the board its children will ask on, with
/// the connections that exist now (under the inserts' lock, which every new one takes), watched
/// by the engine if it runs (else it watches it from its start).
fn make_board(w: &World) {
    let b = w.board.get_or_init(board::Board::create).as_ref();
    let Some(b) = b else {
        shim_log!(
            Level::Warn,
            "fork: no board for the children (no memory or fds): a child that uses a connection on RDMA gets ECONNRESET"
        );
        return;
    };
    for (i, c) in w.conns.all() {
        b.took(i, c.attrs.born());
    }
    if let Some(e) = w.engine_if_started() {
        e.watch_board(b);
    }
}

/// A connection that fork children may hold was reset or closed on the ring (it could not go
/// back to TCP): a child that asks for it is told so.
fn board_reset(c: &Conn) {
    if !slot_is_ours(c.slot) {
        return;
    }
    if let Some(b) = world_if_created().and_then(World::board) {
        b.answer(
            slot_parts(c.slot).1.index as usize,
            c.attrs.born(),
            board::RESET,
        );
    }
}

/// After a fork, in the parent: connections made from now on are not the child's.
pub fn after_fork_parent() {
    attrs::after_fork_parent();
}

/// `f` until it gives something, a few hundred times at most (a lock held for a moment by
/// another thread).
fn retry<T>(mut f: impl FnMut() -> Option<T>) -> Option<T> {
    for _ in 0..200 {
        if let Some(v) = f() {
            return Some(v);
        }
        std::thread::yield_now();
    }
    None
}

/// In a fork child: the next generation's world (created lazily); the parent's connections
/// are inherited fds the child can only close (or use while they are plain TCP).
pub fn after_fork_child() {
    let g = generation();
    board::left_generation(g);
    GENERATION.store((g + 1).min(LAST_GENERATION), Ordering::Relaxed);
    // (the parent's unarmed CQs are not the child's business)
    UNARMED.store(0, Ordering::SeqCst);
    UNARMED_CQ.store(0, Ordering::SeqCst);
    // (the child's engine starts its looks at their base)
    UNARMED_CADENCE.reset();
    // The parent's private socket duplicates (connections it was closing at the moment of the
    // fork) stay open in the child until it execs (they are close-on-exec) or exits: their
    // numbers live in the engine thread's state, which did not survive the fork.
}

pub(crate) fn trace() -> bool {
    crate::config::get().trace
}

// ----- configuration -------------------------------------------------------------------------

/// The ring an RDMA connection starts with (or `RDMASHIM_RING_KIB`'s, if smaller): what an
/// idle connection pins is four times this (its ring and its staging area of the peer's, each
/// registered over both views) and 12 KiB, 76 KiB in all; a connection whose writes wait for
/// ring space grows to `RDMASHIM_RING_KIB`'s (protocol §6.4). Registering the rings is most
/// of a set-up's cost: a burst of 1,000 connections at 512 KiB each took the VM's two CPUs
/// for 35 s, at 32 KiB 13 s (docs/bench/scale.md).
pub(crate) const START_RING: usize = 16 << 10;

/// Tunables of the shim's links over RDMA (environment, read once): rings start at
/// [`START_RING`] and grow to `RDMASHIM_RING_KIB`'s (ring moves, protocol §6.4) when the
/// peer's shim takes part in moves, and go back to [`START_RING`] once their stream has stood
/// still for `RDMASHIM_RING_IDLE_SECS` (the engine looks at the link's timer:
/// `Link::check_idle`).
pub(crate) fn link_config() -> &'static StreamConfig {
    static CFG: OnceLock<StreamConfig> = OnceLock::new();
    CFG.get_or_init(|| {
        let mut c = *shm_config();
        c.ring_size = START_RING.min(c.ring_size);
        c.protocol.ring_moves = true;
        c.protocol.ring_max = rdmashim_proto::RingSize::new(shm_config().ring_size as u64).ok();
        // (0..=31 by the setting's range)
        c.ack_timeout = crate::config::get().ack_timeout as u8;
        use crate::settings::LinkKind;
        use rdmashim_proto::Kind;
        let kind = crate::config::get().kind;
        // (every kind named here: the transport's default is not necessarily the shim's)
        c.protocol.kind = match kind {
            LinkKind::Imm => Kind::WriteImm,
            LinkKind::Sends | LinkKind::Srq => {
                // (protocol §15: a DATA arrives in a 16 KiB receive, as many as the largest
                // ring holds: 32 of them, 512 KiB, with the default ring; 4 to 64 by
                // `receives`; srq: in a shared receive queue of the connection's own)
                c.recv_slots = kind.receives(shm_config().ring_size as u64).0 as u16;
                c.srq = kind == LinkKind::Srq;
                Kind::Sends
            }
            // (protocol §17: as imm, its DATA carrying the credit owed)
            LinkKind::Duplex => Kind::Duplex,
            LinkKind::Read => {
                // (protocol §16: the peer reads from a staging area fixed for the connection's
                // life, so no ring moves: the rings start at their full size)
                c.protocol.ring_moves = false;
                c.ring_size = shm_config().ring_size;
                Kind::Read
            }
        };
        let idle = crate::config::get().ring_idle_secs;
        c.ring_idle = (idle > 0).then(|| std::time::Duration::from_secs(idle));
        // (before the first ring over RDMA is made: this is read on the way to it)
        rdmashim_core::ring::set_huge_pages(crate::config::get().huge_pages);
        c
    })
}

/// Tunables of the shim's links over shared memory, and the largest ring of a link over RDMA:
/// `RDMASHIM_RING_KIB`'s ring from the start (a shared-memory ring pins nothing, and its
/// pages are touched only as the stream reaches them).
pub(crate) fn shm_config() -> &'static StreamConfig {
    static CFG: OnceLock<StreamConfig> = OnceLock::new();
    CFG.get_or_init(|| {
        let mut c = StreamConfig::default();
        let kib = crate::config::get().ring_kib as usize;
        let bytes = (kib * 1024).next_power_of_two();
        c.ring_size = bytes.min(8 << 20);
        // The dial (resolution, request, the server's reply) and the handshake: longer than
        // the server's wait for the application's accept() (3 s), so a busy server that
        // accepts late still upgrades; the application never waits for it.
        c.connect_timeout = std::time::Duration::from_secs(5);
        c.protocol.handshake_timeout = std::time::Duration::from_secs(5);
        c
    })
}

/// How long a connected client waits before it starts its dial (`RDMASHIM_DIAL_DELAY_MS`,
/// default 10, at most 1000): a connection that ends within milliseconds (a short request
/// and its answer) is not worth an upgrade, and not dialing for it saves both ends the
/// rdma_cm work. 0 dials at once.
pub(crate) fn dial_delay() -> std::time::Duration {
    static D: OnceLock<std::time::Duration> = OnceLock::new();
    *D.get_or_init(|| std::time::Duration::from_millis(crate::config::get().dial_delay_ms))
}

// ----- entry points for the hooks -----------------------------------------------------------

/// Which transport a connection between `local` and `peer` uses: shared memory when the peer
/// is a process of this host — a loopback address, or, with same-host upgrades on
/// (`RDMASHIM_LOCAL`), this host's own address (the kernel then gives the socket that same
/// address at its end) — else RDMA (with them off, a connection to the host's own RDMA
/// address goes over the device's loopback, as the soft-RoCE test tier's do).
pub fn transport_for(peer: SocketAddr, local: SocketAddr) -> Transport {
    let p = net::canonical_ip(peer.ip());
    if p.is_loopback() || (crate::config::get().local && p == net::canonical_ip(local.ip())) {
        Transport::Shm
    } else {
        Transport::Rdma
    }
}

/// Whether a connection over `transport` to a peer at `ip` (canonical) may be upgraded on
/// this host: shared memory if `RDMASHIM_LOCAL` allows it, RDMA if this host has it and the
/// address is one RDMA can reach. `Err` is the reason it stays on TCP.
fn transport_verdict(transport: Transport, ip: std::net::IpAddr) -> Result<(), FallbackReason> {
    match transport {
        Transport::Shm if crate::config::get().local => Ok(()),
        Transport::Shm => Err(FallbackReason::NotUpgradableAddress),
        Transport::Rdma => {
            if let Some(r) = crate::probe::rdma_reason() {
                return Err(r);
            }
            rdmashim_proto::upgrade::upgradable(ip)
                .map_err(|_| FallbackReason::NotUpgradableAddress)
        }
    }
}

/// Whether a connection to/from `peer` is worth an upgrade attempt at all (address class,
/// the transport it would use, the negative cache); `Err` is the reason it stays on TCP.
/// Before the connect, only a loopback peer is known to be of this host: a connect to the
/// host's own address is judged as RDMA's here, and as shared memory's once connected.
pub fn peer_verdict(peer: SocketAddr) -> Result<(), FallbackReason> {
    let ip = net::canonical_ip(peer.ip());
    let transport = if ip.is_loopback() {
        Transport::Shm
    } else {
        Transport::Rdma
    };
    transport_verdict(transport, ip)?;
    if engine::negative_cached(SocketAddr::new(ip, peer.port())) {
        return Err(FallbackReason::NegativeCache);
    }
    Ok(())
}

/// Client: `fd` was connected (or its non-blocking connect started) to `peer`, the address
/// the application gave to connect. Creates the connection and queues its dial. Returns the
/// fd-table slot, or the reason it stays on TCP.
///
/// `pending`: the connect is still in progress (EINPROGRESS/EINTR). The dial then waits for
/// the TCP handshake to succeed (watched on a private duplicate of the socket): a refused or
/// timed-out connect never touches rdma_cm, counts as no connection and leaves the negative
/// cache alone.
///
/// `marked`: the connect's SYN carried the mark ([`mark_syn`]); a connection whose SYN did not
/// (its TTL or PMTU mode could not be set) stays TCP. The dial also waits for the
/// server's token (the first bytes of its direction; `docs/protocol.md` 2.9), watched on a
/// second private duplicate of the socket; a server that sends application bytes first runs
/// no shim, and is never dialed.
pub fn start_client_to(
    fd: c_int,
    peer: SocketAddr,
    pending: bool,
    marked: bool,
) -> Result<u64, FallbackReason> {
    // (the cheap verdict first: a connection to a cached peer costs no system call here)
    peer_verdict(peer)?;
    if !marked {
        return Err(FallbackReason::UnsupportedOption);
    }
    let local = net::local_addr(fd).ok_or(FallbackReason::UnsupportedSocket)?;
    // (a connect to this host's own address: shared memory, if allowed)
    transport_verdict(transport_for(peer, local), net::canonical_ip(peer.ip()))?;
    let w = world().ok_or(FallbackReason::Resources)?;
    let engine = w.engine().ok_or(FallbackReason::Resources)?;
    let dup = || net::dup_private(fd, PRIVATE_FD_MIN).map_err(|_| FallbackReason::Resources);
    let token_sock = dup()?;
    let watch = if pending {
        match dup() {
            Ok(d) => Some(d),
            Err(r) => {
                net::close(token_sock);
                return Err(r);
            }
        }
    } else {
        None
    };
    let Some(conn) = w.insert(|slot| {
        Conn::new(
            slot,
            fd,
            Side::Client,
            peer,
            local,
            Phase::Queued,
            None,
            binding::TokenWait::Awaiting,
        )
    }) else {
        for d in watch.into_iter().chain([token_sock]) {
            net::close(d);
        }
        return Err(FallbackReason::Resources);
    };
    // Known at once (not only once the engine has the command): a process that exits before
    // then still sees that the connect was pending (and a refused one is no connection).
    {
        let mut g = conn.lock();
        g.pending = watch;
        g.token_sock = Some(token_sock);
    }
    engine.dial(conn.clone(), watch);
    Ok(conn.slot)
}

/// Client: whether a connect of a TCP candidate to `peer` may be upgraded at all (the peer's
/// address and the negative cache), so that its SYN is worth marking.
pub fn may_upgrade_to(peer: SocketAddr) -> bool {
    peer_verdict(peer).is_ok()
}

/// Client: marks the SYN of the connect of `fd` to `peer` that is about to be made (see
/// `docs/protocol.md` 2.9); the marker comes off with [`unmark_syn`] right after the call.
pub(crate) fn mark_syn(fd: c_int, peer: SocketAddr) -> Option<binding::Mark> {
    binding::mark(fd, peer)
}

/// Client: the connect call returned; the socket's options are as the application left them.
pub(crate) fn unmark_syn(fd: c_int, m: binding::Mark) {
    binding::unmark(fd, m)
}

/// Server: `listen()` is about to be called on `fd`: keep the SYNs of its connections (for the
/// marker), or (`on = false`) stop, when it got no rdma_cm side after all.
pub fn save_syns(fd: c_int, on: bool) -> bool {
    binding::save_syns(fd, on)
}

/// Server: `nfd` was accepted on a listening socket that has an rdma_cm side. Creates the
/// connection and hands it to the matcher. Returns the slot, or why it stays on TCP.
///
/// The listening socket had an rdma_cm side when it was made; if this process's engine has
/// none for its address, that side belongs to the process that made it, before a fork (a
/// prefork server's worker): a request sent there could never be matched here. Such a process
/// serves its connections on an rdma_cm listener of its own, on a port rdma_cm chooses, and
/// its token tells the client to dial that port (docs/protocol.md 2.9).
pub fn start_server(nfd: c_int) -> Result<u64, FallbackReason> {
    let w = world().ok_or(FallbackReason::Resources)?;
    let peer = net::peer_addr(nfd).ok_or(FallbackReason::UnsupportedSocket)?;
    let local = net::local_addr(nfd).ok_or(FallbackReason::UnsupportedSocket)?;
    // (the configuration's rules: a connection they deny gets no token, its client sees a
    // plain server)
    if !crate::policy::server(peer, local).allowed() {
        return Err(FallbackReason::Policy);
    }
    let transport = transport_for(peer, local);
    transport_verdict(transport, net::canonical_ip(peer.ip()))?;
    if !fd_room(nfd) {
        return Err(FallbackReason::FdLimit);
    }
    let engine = w.engine().ok_or(FallbackReason::Resources)?;
    let dial_port = || {
        if engine.serves(local, transport) {
            Ok(None)
        } else {
            engine
                .own_port(local, transport)
                .map(Some)
                .ok_or(FallbackReason::InheritedListener)
        }
    };
    // (a client shim marked the SYN; the token goes out before the application sees the fd)
    let bound = binding::on_accept(nfd, peer, local, dial_port)?;
    let conn = w
        .insert(|slot| {
            Conn::new(
                slot,
                nfd,
                Side::Server,
                peer,
                local,
                Phase::Awaiting,
                Some(bound),
                binding::TokenWait::None,
            )
        })
        .ok_or(FallbackReason::Resources)?;
    engine.accepted(conn.clone());
    Ok(conn.slot)
}

/// `listen()` succeeded on `fd`, bound to `addr`: listeners for upgrade requests beside it
/// (rdma_cm's, unless the address is loopback or the host has no RDMA; shared memory's for
/// clients of this host, if allowed). Returns whether it has any.
pub fn start_listener(fd: c_int, addr: SocketAddr) -> bool {
    // (neither transport can serve it: no engine is started for it)
    if engine::listen_kinds(addr) == (false, false) {
        return false;
    }
    match world().and_then(|w| w.engine()) {
        Some(e) => e.listen(fd, addr),
        None => false,
    }
}

/// A listening socket `fd` on `addr` that this process did not see listen (see
/// `hooks::conn::adopt_listener`): keeps its connections' SYNs (unless it does already: a
/// shimmed process made it) and gets listeners for upgrade requests beside it where they can
/// be bound. Returns whether any transport can serve its connections (each served, if the
/// address's own listeners are another process's, on one of this process's own).
pub fn adopt_listener(fd: c_int, addr: SocketAddr) -> bool {
    if engine::listen_kinds(addr) == (false, false) {
        return false;
    }
    let Some(e) = world().and_then(|w| w.engine()) else {
        return false;
    };
    let saves = net::get_int_opt(fd, libc::IPPROTO_TCP, libc::TCP_SAVE_SYN) == Ok(1)
        || binding::save_syns(fd, true);
    if !saves {
        return false;
    }
    if !e.listen(fd, addr) {
        shim_log!(
            Level::Debug,
            "listener {addr} (not made here): its address's upgrade listeners are another process's; each connection names one of this process's own"
        );
    }
    true
}

/// The listening socket `fd` is being closed: drop its rdma_cm listener.
pub fn stop_listener(fd: c_int) {
    if let Some(e) = world_if_created().and_then(|w| w.engine_if_started()) {
        e.unlisten(fd);
    }
}

/// Fd `fd`, whose entry names the connection of `slot`, is being closed, or was closed where
/// no hook saw it (the number may hold another file now, which is left alone: see
/// [`data::close_last`]): its share of the connection is released; the last one closes it.
pub fn release_share(slot: u64, fd: c_int) {
    if let Some(c) = lookup(slot) {
        if c.fds.fetch_sub(1, Ordering::AcqRel) == 1 {
            data::close_last(&c, fd);
        }
    }
}

/// Finds fds of upgraded connections whose socket is gone (closed where no hook saw it: an
/// inline system call, io_uring) and releases them ([`release_share`]), counted as missed
/// closes. The engine runs it about once a second while it has connections: a close that is
/// not followed by a hooked call that gets the same number (which finds it at once) is found
/// within that time. One `fstat` per such fd.
pub(crate) fn check_sockets() {
    let mut gone = Vec::new();
    crate::fdtable::TABLE.for_each(0, u32::MAX, |fd, e| {
        if e.kind() == crate::fdtable::Kind::Upgraded
            && slot_is_ours(e.slot())
            && lookup(e.slot()).is_some_and(|c| !c.is_socket(fd))
        {
            gone.push((fd, e));
        }
    });
    for (fd, e) in gone {
        // (unless a hook dealt with the number meanwhile)
        if crate::fdtable::TABLE.take_if(fd, e) {
            stats::count_missed_close();
            shim_log!(
                Level::Debug,
                "fd {fd}: its connection's socket was closed where no hook saw it; the connection is released"
            );
            release_share(e.slot(), fd);
        }
    }
}

/// This process's upgraded connections (with an fd of the application's for each) and the
/// inherited slots of a fork child's, among the fds without FD_CLOEXEC, or among all fds with
/// `all`.
pub fn upgraded_conns(all: bool) -> (Vec<(Arc<Conn>, c_int)>, Vec<u64>) {
    let mut found = Upgraded::default();
    if crate::fdtable::UPGRADE_CONNS.load(core::sync::atomic::Ordering::Relaxed) == 0 {
        return (found.conns, found.inherited);
    }
    crate::fdtable::TABLE.for_each(0, u32::MAX, |fd, e| {
        if all || !net::is_cloexec(fd) {
            found.add(fd, e);
        }
    });
    (found.conns, found.inherited)
}

/// [`upgraded_conns`] among the fds `fds` (those a message passes to another process).
pub fn upgraded_among(fds: &[c_int]) -> (Vec<(Arc<Conn>, c_int)>, Vec<u64>) {
    let mut found = Upgraded::default();
    for &fd in fds {
        found.add(fd, crate::fdtable::TABLE.get(fd));
    }
    (found.conns, found.inherited)
}

/// The upgraded connections some fds refer to: this process's own (each once, with one of
/// its fds) and a fork child's inherited slots (each once).
#[derive(Default)]
struct Upgraded {
    conns: Vec<(Arc<Conn>, c_int)>,
    inherited: Vec<u64>,
}

impl Upgraded {
    fn add(&mut self, fd: c_int, e: crate::fdtable::FdEntry) {
        if e.kind() != crate::fdtable::Kind::Upgraded {
            return;
        }
        if !slot_is_ours(e.slot()) {
            if !self.inherited.contains(&e.slot()) {
                self.inherited.push(e.slot());
            }
        } else if let Some(c) = lookup(e.slot()) {
            if !self.conns.iter().any(|(k, _)| Arc::ptr_eq(k, &c)) {
                self.conns.push((c, fd));
            }
        }
    }
}

/// io_uring set up where no hook saw it (inline system calls: liburing, the io-uring crates)
/// and found by [`crate::sys::holds_io_uring`], as the engine looks before it takes up a
/// new connection and about once a second while it has some: RDMA ends for the process as
/// when the `syscall` hook sees the setup ([`close_for_io_uring`]), and its connections go back
/// to TCP at exact offsets on a thread of their own (the engine drives the dials they may
/// wait for; without that thread they are reset). Seen late, an instance may already have moved bytes on a socket whose stream
/// is on the ring: the window is about a second (docs/upgrade.md §7).
pub(crate) fn check_io_uring() {
    if !crate::sys::holds_io_uring() || !close_for_io_uring() {
        return;
    }
    let (conns, _) = upgraded_conns(true);
    if conns.is_empty() {
        return;
    }
    let conns = Arc::new(conns);
    let theirs = conns.clone();
    let spawned = crate::signals::spawn_internal("rdmashim-back", move || {
        crate::guard::mark_internal_thread();
        if std::panic::catch_unwind(|| {
            data::hand_back_all(&theirs, "io_uring", FallbackReason::IoUring);
        })
        .is_err()
        {
            failed_by_panic("the thread returning connections to TCP");
        }
    });
    if spawned.is_err() {
        // (the engine cannot wait for them itself: it drives their dials)
        for (c, fd) in conns.iter() {
            data::reset_shared(c, Some(*fd), "io_uring", "no thread to return it to TCP");
        }
    }
}

/// The engine's tick: the live view's counters, and the bytes of each connection still under
/// the upgrade.
pub(crate) fn publish_live() {
    let Some(w) = world_if_created() else {
        return;
    };
    let conns = w.all();
    crate::live::publish(
        conns
            .iter()
            .filter(|c| !c.fell_back.load(Ordering::Relaxed))
            .map(|c| {
                (
                    c.fd_hint.load(Ordering::Relaxed),
                    (c.local, c.peer),
                    c.live_tx.load(Ordering::Relaxed),
                    c.live_rx.load(Ordering::Relaxed),
                )
            }),
    );
}

/// At exit: give upgraded connections a bounded time to deliver what they accepted.
pub fn flush_at_exit() {
    let Some(w) = world_if_created() else {
        return;
    };
    let deadline = Instant::now() + std::time::Duration::from_secs(2);
    for c in w.all() {
        data::flush_before_exit(&c, deadline);
    }
}
