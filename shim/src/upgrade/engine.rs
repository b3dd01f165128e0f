//! The engine: one thread per process (started by the first upgradable connection or
//! listener) that runs everything asynchronous about upgrades, so that the application never
//! waits for one:
//!
//! - client dials (rdma_cm address/route resolution, connect, the server's reply or reject);
//! - rdma_cm listeners beside listening sockets, and the rendezvous of their connect requests
//!   with the TCP connections the application accepts ([`Matcher`]);
//! - every link's completion channel and rdma_cm channel: on an event it drives the link
//!   (under the connection's lock) and re-arms the CQ, which sets the eventfds sleepers wait on;
//! - timers (dial and handshake deadlines, matcher expiry, teardown drains);
//! - connections the application closed: the ring is drained and torn down, then the private
//!   duplicate of the TCP socket is closed (the TCP FIN goes out only after the ring's Close),
//!   while that socket is watched for the peer's FIN/RST.
//!
//! The slow part of an upgrade — a queue pair and its registered rings: milliseconds each,
//! tens of milliseconds on a loaded soft-RoCE host — runs on a second thread, the setup thread
//! ([`Job`]): a burst of new connections (50 clients of redis-benchmark) must not stall the
//! completions of the connections already on their rings, nor the application's calls on the
//! connection being set up (no connection's lock is held meanwhile).
//!
//! The engine thread marks itself as shim-internal: the hooks it reaches pass straight through.

use super::adopt::{self, OFFER_HOLD};
use super::binding::TokenWait;
use super::{fallback_reason, link_config, Conn, Inner, Phase, UNARMED_MAX};
use crate::cadence::Look;
use crate::config::Level;
use crate::net;
use crate::reason::FallbackReason;
use crate::shim_log;
use crate::stats;
use core::ffi::c_int;
use rdmashim_core::link::{DialError, DialStatus, Dialer, Link, UpgradeListener};
use rdmashim_core::{Request, RequestListener, ShmDialer, ShmListener, Transport, UpgradeDialer};
use rdmashim_proto::upgrade::{
    Expired, Matcher, MatcherConfig, NegativeCache, NegativeCacheConfig, PeerFailure,
    RequestOutcome, TupleKey,
};
use rdmashim_proto::{Flags, Proof, RejectReason, Side, TcpTuple};
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Token kinds of the engine's epoll set (kind << 48 | value: a listener id, or a slot
/// number of [`crate::fdtable::SLOT_BITS`] bits).
const WAKE: u64 = 0;
const LISTENER: u64 = 1;
const DIAL: u64 = 2;
const COMP: u64 = 3;
const CM: u64 = 4;
const SOCK: u64 = 5;
const PEND: u64 = 6;
/// A client's private socket duplicate, watched for the server's token.
const TOKEN: u64 = 7;
/// The fork board's wake-up pipe (a child asks for a connection).
const BOARD: u64 = 8;
/// An upgraded connection's socket (its private duplicate), watched for bytes that mean the
/// peer failed over to TCP ([`State::tcp_data`]).
const TCPW: u64 = 9;

const TOKEN_SHIFT: u32 = 48;

fn token(kind: u64, value: u64) -> u64 {
    (kind << TOKEN_SHIFT) | value
}

enum Cmd {
    /// Dial a client connection, not before the given time (see [`super::dial_delay`]); with
    /// a private duplicate of its socket if its TCP connect is still in progress (the dial
    /// waits for it); whether it is a probe of its host.
    Dial(Arc<Conn>, Option<c_int>, Instant, bool),
    Accepted(Arc<Conn>),
    /// The application closed the last fd of the connection; the private duplicate of its
    /// socket (if the ring needs a teardown first) comes along.
    Closed(Arc<Conn>, Option<c_int>),
    /// An application thread decided a client's wait for the token (it read the first bytes
    /// of the server's direction): stop watching, and dial if the token came and it is time.
    Token(Arc<Conn>),
    /// A server's connection from the client host `ip` was established at the given time (its
    /// client took up the answer): that host makes progress ([`Matcher::host_progress`]).
    HostProgress(std::net::IpAddr, Instant),
}

/// Work for the setup thread (see the module's documentation). The connection is in
/// [`Phase::Setup`] meanwhile; each job carries the bytes the application had read from the
/// socket when it was handed over (it may read more meanwhile: the link catches up).
enum Job {
    /// Answer a connect request matched to a connection (queued at the given time).
    Accept(Box<Request>, Arc<Conn>, u64, Instant),
    /// Build a client dial's endpoint and send its request ([`UpgradeDialer::build`]): its
    /// route is resolved. Whether the dial is a probe of its host; when it was queued.
    Dial(Box<UpgradeDialer>, Arc<Conn>, bool, Instant),
}

/// A finished [`Job`], for the engine thread.
// (each is moved once, from the setup thread's list to `finish`: boxing the link buys nothing)
#[allow(clippy::large_enum_variant)]
enum Done {
    Accepted(Arc<Conn>, std::io::Result<Link>),
    /// The dialer comes back, its request sent (or the dial failed).
    Dialed(Arc<Conn>, Box<UpgradeDialer>, Result<(), DialError>),
}

/// The longest a dial's set-up may wait in the setup threads' queue; one that waited longer
/// stays TCP (`upgrade_timeout`). The queue's length is no fault of the peer's, and the
/// connection carries its bytes over TCP meanwhile, so the wait is generous: a set-up takes
/// ~8 ms of CPU under emulation, and a burst of ten thousand connections on two threads
/// waits its turn for ~40 s (more while the device and the kernel are busy with the burst:
/// past 300 s, the bound before, on a slower emulated host). As long as the server's matcher
/// waits (`MatcherConfig::accepted_wait_max`).
const DIAL_QUEUE_MAX: Duration = Duration::from_secs(1800);

/// How often, at most, the engine looks at every connection it tracks while events keep it
/// awake ([`State::scan`]): a timer moved by an event is seen that much later at worst.
const SCAN_EVERY: Duration = Duration::from_millis(10);

/// The longest a dial may wait for its answer while its server's host keeps answering this
/// process's other dials (see [`State::answering_until`]): as long as the server's matcher
/// keeps an accepted connection waiting for its request while the client's host keeps
/// sending them (`MatcherConfig::accepted_wait_max`), counted from the dial's start. The
/// waits it bounds end a connect timeout after the work they wait for last moved, so it
/// matters only to a burst whose set-ups go on that long: ten thousand connections, set up
/// at ~45 a second under emulation (the kernel resolves their routes one by one), took
/// ~220 s on one host, and more than 300 s (the bound before, when 60% of them stayed TCP)
/// on a slower one.
const DIAL_ANSWER_MAX: Duration = Duration::from_secs(1800);

/// Until when a dial that started at `since` may wait on, the work it waits for having last
/// been seen to progress at `last`: a connect timeout past that, at most [`DIAL_ANSWER_MAX`]
/// after `since` (see [`State::answering_until`], [`State::resolving_until`]).
fn waits_on_until(last: Instant, since: Instant) -> Instant {
    (last + super::link_config().connect_timeout).min(since + DIAL_ANSWER_MAX)
}

/// Bytes the set-ups over RDMA under way will pin, and memory mappings the set-ups under way
/// will add ([`State::reserve_link`]): given back by the thread that ran the set-up as it
/// ends ([`unreserve_link`]), when what it registered and mapped is counted by the transport
/// itself. (Given back by the engine when it took the finished job up, a burst's finished
/// jobs waiting for a busy engine counted twice, and fewer connections fit under a cap than
/// it allows: 10 of 13 under 1 MiB in one run of `the_clients_pinned_memory_cap`.)
static RESERVED: AtomicUsize = AtomicUsize::new(0);
static RESERVED_MAPS: AtomicUsize = AtomicUsize::new(0);

/// A set-up over `t` ended: its reservation goes back (see [`RESERVED`]).
fn unreserve_link(t: Transport) {
    let sub = |a: &AtomicUsize, n: usize| {
        let _ = a.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
            Some(v.saturating_sub(n))
        });
    };
    if t == Transport::Rdma {
        sub(&RESERVED, link_config().pinned_per_connection());
    }
    sub(&RESERVED_MAPS, t.mappings_per_link());
}

/// Runs a setup job and gives its reservation back ([`RESERVED`]).
fn run_job(job: Job) -> Done {
    let t = match &job {
        Job::Dial(..) => Transport::Rdma,
        Job::Accept(_, c, ..) => c.transport,
    };
    let done = run_setup(job);
    // (what the set-up registered and mapped is among the process's own now, or it failed)
    unreserve_link(t);
    done
}

fn run_setup(job: Job) -> Done {
    // (a shim thread's work on this CPU, whichever runs it: see INTERNAL_WAKES)
    crate::spin::wait::INTERNAL_WAKES.fetch_add(1, Ordering::Relaxed);
    let t0 = Instant::now();
    match job {
        Job::Accept(inc, c, tcp_received, queued) => {
            if c.lock().closed {
                // The application closed it while the request waited its turn (a burst of
                // short connections): a rejection costs nothing, an answer a link to undo.
                inc.reject(RejectReason::NoMatchingTcp);
                let e = std::io::Error::other("closed before its request was answered");
                return Done::Accepted(c, Err(e));
            }
            let peer = c.peer;
            let Some((key, tuple)) = c.bound else {
                inc.reject(RejectReason::Unproven);
                let e = std::io::Error::other("no key for the connection");
                return Done::Accepted(c, Err(e));
            };
            if let Some(d) = crate::fault::answer_delay() {
                std::thread::sleep(d);
            }
            let cfg = match inc.transport() {
                Transport::Rdma => link_config(),
                Transport::Shm => super::shm_config(),
            };
            let r = inc.accept(cfg, tcp_received, &Proof::Bound { key, tuple });
            if let Some(d) = crate::fault::accept_delay() {
                std::thread::sleep(d);
            }
            shim_log!(
                Level::Debug,
                "accept {peer}: {:?} after {:?} queued",
                t0.elapsed(),
                t0.saturating_duration_since(queued)
            );
            Done::Accepted(c, r)
        }
        Job::Dial(mut d, c, probe, queued) => {
            let tcp_received = {
                let g = c.lock();
                // Closed while its set-up waited its turn: no request at all (the engine
                // counts it closed early). Decided meanwhile (the exit): none either.
                let wanted = matches!(g.phase, Phase::Setup) && (!g.closed || probe || g.give_back);
                wanted.then_some(g.tcp_received)
            };
            let Some(tcp_received) = tcp_received else {
                let e = std::io::Error::other("ended before its endpoint was built");
                return Done::Dialed(c, d, Err(DialError::Local(e)));
            };
            if t0.saturating_duration_since(queued) > DIAL_QUEUE_MAX {
                return Done::Dialed(c, d, Err(DialError::Timeout));
            }
            let r = d.build(tcp_received);
            shim_log!(
                Level::Debug,
                "dial {}: endpoint built in {:?} after {:?} queued",
                c.peer,
                t0.elapsed(),
                t0.saturating_duration_since(queued)
            );
            Done::Dialed(c, d, r)
        }
    }
}

/// The setup thread's queue and its finished work.
#[derive(Default)]
struct Setup {
    jobs: Mutex<VecDeque<Job>>,
    more: Condvar,
    done: Mutex<Vec<Done>>,
    /// Setup threads started (the first on the first job; more while jobs wait for one, up to
    /// [`setup_threads`]).
    started: AtomicUsize,
    /// Jobs being run (see [`halt`]).
    busy: AtomicUsize,
}

/// How many setup threads may answer requests at once: one per CPU this process may run on,
/// at most 4. A set-up is mostly the kernel's work (registering and pinning the rings,
/// creating the queue pair: ~8 ms of CPU each under emulation), and one thread made a burst
/// of a thousand connections outlast its clients' dial deadline (issue 28).
fn setup_threads() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, 4)
    })
}

/// Set by [`halt`]: the engine and setup threads stop for good (inherited by fork children,
/// whose RDMA ended with their parent's).
static HALT: AtomicBool = AtomicBool::new(false);
/// The engine thread saw [`HALT`] and stopped.
static HALTED: AtomicBool = AtomicBool::new(false);
/// How long [`halt`] waits for the threads to stop.
const HALT_WAIT: Duration = Duration::from_secs(2);

/// Whether the engine was halted ([`halt`]): no thread of the shim's uses the transport any
/// more, and nothing may be asked of it.
pub(crate) fn halted() -> bool {
    HALT.load(Ordering::Acquire)
}

/// Stops the engine and setup threads for good, before one of the transport's descriptors
/// is taken over by the program (see [`super::close_for_replaced_fd`]): each leaves what it
/// holds as it is — queue pairs, listeners, connect requests, timers — without a call into
/// the RDMA libraries (whose descriptors may be the program's files from now on). Waits until
/// neither thread is inside a call of the transport's, at most [`HALT_WAIT`] (an engine that
/// never started stops at once); returns whether they stopped in time.
pub(crate) fn halt() -> bool {
    HALT.store(true, Ordering::Release);
    let Some(e) = engine_even_halted() else {
        return true;
    };
    net::eventfd_signal(e.wake);
    e.setup.more.notify_all();
    let deadline = Instant::now() + HALT_WAIT;
    loop {
        if HALTED.load(Ordering::Acquire) && e.setup.busy.load(Ordering::Acquire) == 0 {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        net::nap_ms(1);
    }
}

/// One listener for upgrade requests: rdma_cm's beside a listening socket, or a rendezvous
/// socket for clients of this host.
struct ListenerEntry {
    l: Arc<RequestListener>,
    /// rdma_cm's: the address it is bound to. Shared memory's: the listening socket's address
    /// (the name holds its port), or for this process's own, its address and the number in
    /// its name.
    addr: SocketAddr,
    /// The listening socket it serves, or `None` once the application closed it: the rdma_cm
    /// side then lives on for the matcher's accepted-connection wait, so the connections
    /// accepted just before (a server that accepts once and closes its listener, `nc -l`)
    /// still find it. A new listen() on the same address takes it over.
    fd: Option<c_int>,
    retire_at: Option<Instant>,
    /// This process's own listener (on a port rdma_cm chose, or a name of its own; named in
    /// its tokens), beside no listening socket: for the connections it accepts on a listening
    /// socket whose rdma_cm side or rendezvous name belongs to another process (see
    /// [`Engine::own_port`]). It never retires.
    own: bool,
}

impl ListenerEntry {
    fn transport(&self) -> Transport {
        self.l.transport()
    }

    /// Whether this is a listening socket's listener of `transport` where a connection with
    /// local address `local` is headed: rdma_cm's on its port, on its address or the
    /// wildcard; the port's rendezvous name (one per port, whatever the address).
    fn serves(&self, local: SocketAddr, transport: Transport) -> bool {
        !self.own
            && self.transport() == transport
            && self.addr.port() == local.port()
            && (transport == Transport::Shm
                || self.addr.ip().is_unspecified()
                || net::canonical_ip(self.addr.ip()) == net::canonical_ip(local.ip()))
    }
}

/// Which listeners a listening socket bound to `addr` can have: rdma_cm's (not on a loopback
/// address, which RDMA cannot reach, nor on a host without RDMA) and the rendezvous socket
/// for clients of this host (if same-host connections may move to shared memory).
pub(crate) fn listen_kinds(addr: SocketAddr) -> (bool, bool) {
    let rdma = !net::canonical_ip(addr.ip()).is_loopback() && crate::probe::rdma_reason().is_none();
    (rdma, crate::config::get().local)
}

/// The abstract Unix name of a same-host rendezvous socket (its network namespace's: abstract
/// names are per namespace, as TCP ports are): `port` names the listener of the TCP port
/// where the token names no other; `own` the number a token names.
pub(crate) fn shm_name(n: u16, own: bool) -> Vec<u8> {
    let kind = if own { "own" } else { "tcp" };
    format!("rdmashim/{kind}/{n}").into_bytes()
}

/// The rdma_cm listeners, by internal id (their epoll token); `by_fd` maps the application's
/// listening sockets to them.
#[derive(Default)]
struct Listeners {
    next_id: u32,
    by_id: HashMap<u32, ListenerEntry>,
    by_fd: HashMap<c_int, u32>,
}

/// How late the engine may take up a command that is not urgent (a new connection, or the
/// close of one that was never linked): such commands wake the engine only when it would not
/// wake by itself within this time, and after taking some up it looks again this soon. Under a
/// stream of short connections the engine thus wakes about every `LAZY` (taking up a batch),
/// not twice per connection.
const LAZY: Duration = Duration::from_millis(10);

/// How late the engine may start a delayed dial (see [`super::dial_delay`]): it wakes this
/// long after the earliest one is due and starts every one due by then. Under a stream of
/// short connections to a proven host (one every millisecond, each closed before its dial)
/// the engine woke for every connection's dial time, to find it closed, and took the CPU
/// from the application each time (measured in the VM: 0.85 engine wake-ups and 0.7
/// preemptions of the application per connection).
const DIAL_SLACK: Duration = Duration::from_millis(5);
/// How often the engine looks at requests held for connections offered to a fork child even
/// without an event.
const OFFER_TICK: Duration = Duration::from_millis(50);
/// How often, while it has connections, the engine checks that its connections' fds are
/// still their sockets ([`super::check_sockets`]: finds closes no hook saw).
const SOCKET_CHECK: Duration = Duration::from_secs(1);

/// The engine's handle (shared with application threads).
pub struct Engine {
    epfd: c_int,
    wake: c_int,
    cmds: Mutex<Vec<Cmd>>,
    /// When the engine next wakes by itself, on the coarse clock ([`net::coarse_ms`]: no
    /// system call for the application's thread); `u64::MAX`: not by itself (also until the
    /// engine first publishes it: its thread may sleep once before this handle is reachable
    /// from it); 0: it is awake and takes up the queued commands before it sleeps again.
    next_wake: AtomicU64,
    listeners: Mutex<Listeners>,
    negative: Mutex<NegativeCache>,
    setup: Setup,
}

/// Whether `peer` (canonical address) is in the negative cache of this process's engine, or
/// its host in the host-wide one (a silent host: [`super::hostcache`]; looked at also before
/// this process has an engine, since a new process is what it is for).
pub fn negative_cached(peer: SocketAddr) -> bool {
    if let Some(e) = super::world_if_created().and_then(|w| w.engine_if_started()) {
        let mut n = e.negative.lock().unwrap_or_else(|p| p.into_inner());
        // (on every connect to an upgradable address: the coarse clock, no system call)
        if n.check(peer, net::coarse_instant()).is_some() {
            return true;
        }
    }
    super::hostcache::silent(peer.ip())
}

/// A client still waiting for the server's token: looks for it through the engine's own
/// duplicate of the socket.
fn look_for_token(c: &Conn, g: &mut Inner) {
    if g.token == TokenWait::Awaiting {
        if let Some(fd) = g.token_sock {
            super::see_token(c, g, fd);
        }
    }
}

/// A client's server sent application bytes first, no token: no shim serves that port (or it
/// cannot upgrade). The negative cache keeps later connections to it unmarked for a while, as
/// after a reject.
pub fn plain_peer(peer: SocketAddr) {
    if let Some(e) = super::world_if_created().and_then(|w| w.engine_if_started()) {
        let mut n = e.negative.lock().unwrap_or_else(|p| p.into_inner());
        n.record(
            net::canonical_addr(peer),
            PeerFailure::Rejected,
            net::coarse_instant(),
        );
    }
}

/// A connection to `peer` was upgraded: the negative cache forgets the peer's failures and
/// counts the host as proven.
pub fn upgraded_to(peer: SocketAddr) {
    if let Some(e) = super::world_if_created().and_then(|w| w.engine_if_started()) {
        e.proven(peer);
    }
}

/// A connection from the client `peer` was upgraded on this, its server's side: the client's
/// host took up an answer, so the accepted connections still waiting for its requests wait on
/// ([`Matcher::host_progress`]). Not urgent: the engine takes it up before it next gives up on
/// a wait.
pub fn upgraded_from(peer: SocketAddr) {
    if let Some(e) = super::world_if_created().and_then(|w| w.engine_if_started()) {
        e.push(Cmd::HostProgress(peer.ip(), Instant::now()), false);
    }
}

impl Engine {
    /// Starts the engine thread. `None` if it cannot (no epoll/eventfd/thread), or once the
    /// engine was halted.
    pub fn start() -> Option<Engine> {
        if halted() {
            return None;
        }
        let epfd = net::epoll_create(super::PRIVATE_FD_MIN).ok()?;
        let wake = match net::eventfd(super::PRIVATE_FD_MIN) {
            Ok(fd) => fd,
            Err(_) => {
                net::close(epfd);
                return None;
            }
        };
        if net::epoll_ctl(
            epfd,
            libc::EPOLL_CTL_ADD,
            wake,
            libc::EPOLLIN as u32,
            token(WAKE, 0),
        )
        .is_err()
        {
            net::close(epfd);
            net::close(wake);
            return None;
        }
        let cfg = NegativeCacheConfig::with_override(crate::config::get().negative_cache_secs);
        let e = Engine {
            epfd,
            wake,
            cmds: Mutex::new(Vec::new()),
            next_wake: AtomicU64::new(u64::MAX),
            listeners: Mutex::new(Listeners::default()),
            negative: Mutex::new(NegativeCache::new(cfg)),
            setup: Setup::default(),
        };
        let spawned = crate::signals::spawn_internal("rdmashim-engine", move || {
            crate::guard::mark_internal_thread();
            if std::panic::catch_unwind(|| run(epfd, wake)).is_err() {
                super::failed_by_panic("the engine thread");
            }
        });
        if spawned.is_err() {
            net::close(epfd);
            net::close(wake);
            return None;
        }
        // (a board made before the engine: this process forked before its first dial)
        if let Some(b) = super::world_if_created().and_then(super::World::board) {
            e.watch_board(b);
        }
        Some(e)
    }

    /// Watches the fork board's wake-up pipe.
    pub(crate) fn watch_board(&self, b: &super::board::Board) {
        let _ = net::epoll_ctl(
            self.epfd,
            libc::EPOLL_CTL_ADD,
            b.wake_fd(),
            libc::EPOLLIN as u32,
            token(BOARD, 0),
        );
    }

    /// Queues a command; `urgent`: wake the engine now, else only if it would not wake by
    /// itself within [`LAZY`].
    ///
    /// (The queue's mutex orders this against the engine's `sleep_until` + `has_cmds`: either
    /// the engine sees the command before it sleeps, or this sees its wake-up time.)
    fn push(&self, c: Cmd, urgent: bool) {
        self.cmds.lock().unwrap_or_else(|p| p.into_inner()).push(c);
        if urgent
            || self.next_wake.load(Ordering::SeqCst) > net::coarse_ms() + LAZY.as_millis() as u64
        {
            net::eventfd_signal(self.wake);
        }
    }

    /// Makes sure the engine wakes within `within` (a wake-up now if it would sleep longer).
    fn nudge(&self, within: Duration) {
        if self.next_wake.load(Ordering::SeqCst) > net::coarse_ms() + within.as_millis() as u64 {
            net::eventfd_signal(self.wake);
        }
    }

    /// The engine is about to sleep for `timeout_ms` (-1: until an event).
    fn sleep_until(&self, timeout_ms: c_int) {
        let t = if timeout_ms < 0 {
            u64::MAX
        } else {
            net::coarse_ms() + timeout_ms as u64
        };
        self.next_wake.store(t, Ordering::SeqCst);
    }

    fn has_cmds(&self) -> bool {
        !self
            .cmds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
            || !self
                .setup
                .done
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_empty()
    }

    /// Hands `job` to the setup threads (the first started on the first job; another while
    /// jobs wait and every thread is busy, up to [`setup_threads`]). `Err(job)` if no thread
    /// runs and none can be started: the caller runs it itself.
    fn submit(&'static self, job: Job) -> Result<(), Job> {
        let waiting = {
            let mut q = self.setup.jobs.lock().unwrap_or_else(|p| p.into_inner());
            q.push_back(job);
            q.len()
        };
        let started = self.setup.started.load(Ordering::Acquire);
        let idle = started.saturating_sub(self.setup.busy.load(Ordering::Acquire));
        if started < setup_threads() && waiting > idle && self.spawn_setup(started) {
            return Ok(());
        }
        if self.setup.started.load(Ordering::Acquire) == 0 {
            // (no thread, and none could be started: the job is the caller's)
            let job = self
                .setup
                .jobs
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pop_back();
            if let Some(job) = job {
                return Err(job);
            }
        }
        self.setup.more.notify_one();
        Ok(())
    }

    /// Starts one more setup thread if `started` are running (another caller may have
    /// started it meanwhile). Returns whether one was started.
    fn spawn_setup(&'static self, started: usize) -> bool {
        if self
            .setup
            .started
            .compare_exchange(started, started + 1, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        let spawned = crate::signals::spawn_internal("rdmashim-setup", move || {
            crate::guard::mark_internal_thread();
            if std::panic::catch_unwind(|| self.setup_loop()).is_err() {
                super::failed_by_panic("a setup thread");
            }
        });
        if spawned.is_err() {
            self.setup.started.fetch_sub(1, Ordering::AcqRel);
            return false;
        }
        true
    }

    fn setup_loop(&self) {
        loop {
            let job = {
                let mut q = self.setup.jobs.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    if halted() {
                        // (the engine rejected the queued requests as it stopped: `halt`)
                        drop(q);
                        loop {
                            std::thread::park();
                        }
                    }
                    if let Some(j) = q.pop_front() {
                        // (under the queue's lock: `halt` sees either the job or its run)
                        self.setup.busy.fetch_add(1, Ordering::AcqRel);
                        break j;
                    }
                    q = self.setup.more.wait(q).unwrap_or_else(|p| p.into_inner());
                }
            };
            let done = run_job(job);
            if halted() {
                // (too late for the engine, which may be gone: its link is left as it is)
                std::mem::forget(done);
                self.setup.busy.fetch_sub(1, Ordering::AcqRel);
                continue;
            }
            self.setup.busy.fetch_sub(1, Ordering::AcqRel);
            self.setup
                .done
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(done);
            net::eventfd_signal(self.wake);
        }
    }

    fn take_done(&self) -> Vec<Done> {
        std::mem::take(&mut *self.setup.done.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Queues the dial of a client connection (`watch`: see [`Cmd::Dial`]). To a host that
    /// is proven (or being probed) it starts after the dial delay, and not at all if the
    /// application closes the connection first; to any other host it starts at once, as a
    /// probe (see [`NegativeCache::may_delay`]).
    pub fn dial(&self, c: Arc<Conn>, watch: Option<c_int>) {
        // (on the application's thread, at every connect: the coarse clock, no system call;
        // a delayed dial's time gets a tick more, so that it never comes before the delay)
        let now = net::coarse_instant();
        let wait = self
            .negative
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .may_delay(net::canonical_addr(c.peer), now);
        // (`RDMASHIM_DIAL_DELAY_MS=0`: no delay, so no tick either, and the engine takes the
        // dial up at once, as a probe's — but it stays a delayed dial for the negative cache)
        let delay = super::dial_delay();
        let at = if wait && !delay.is_zero() {
            now + delay + net::coarse_tick()
        } else {
            now
        };
        self.push(Cmd::Dial(c, watch, at, !wait), !wait || delay.is_zero());
    }

    /// An application thread decided `c`'s wait for the server's token (see [`Cmd::Token`]).
    pub fn token_decided(&self, c: Arc<Conn>) {
        self.push(Cmd::Token(c), true);
    }

    /// A probe dial ended.
    fn probe_ended(&self, peer: SocketAddr) {
        let mut n = self.negative.lock().unwrap_or_else(|p| p.into_inner());
        n.probe_ended(net::canonical_addr(peer));
    }

    /// The host of `peer` runs the shim (a connection to it was upgraded, or its shim
    /// declined one): forget its failures, count it as proven.
    fn proven(&self, peer: SocketAddr) {
        let mut n = self.negative.lock().unwrap_or_else(|p| p.into_inner());
        n.record_success(net::canonical_addr(peer), Instant::now());
        super::hostcache::forget(peer.ip());
    }

    /// Hands an accepted connection to the matcher. Not urgent: a connect request for it
    /// wakes the engine, which takes up its commands first.
    pub fn accepted(&self, c: Arc<Conn>) {
        self.push(Cmd::Accepted(c), false);
    }

    /// The last fd of `c` was closed (see [`Cmd::Closed`]); urgent when the ring needs a
    /// teardown (`sock`).
    pub fn closed(&self, c: Arc<Conn>, sock: Option<c_int>) {
        let urgent = sock.is_some();
        self.push(Cmd::Closed(c, sock), urgent);
    }

    /// Binds the listeners for upgrade requests beside listening socket `fd` bound to `addr`
    /// (synchronously, so that a client that connects right after `listen()` returns finds
    /// them), of the transports [`listen_kinds`] allows: rdma_cm's ([`Self::listen_rdma`])
    /// and the rendezvous socket of the port ([`Self::listen_shm`]). Returns whether its
    /// connections can be upgraded at all.
    pub fn listen(&self, fd: c_int, addr: SocketAddr) -> bool {
        let (rdma, shm) = listen_kinds(addr);
        let rdma = rdma && self.listen_rdma(fd, addr);
        let shm = shm && self.listen_shm(addr);
        rdma || shm
    }

    /// The rdma_cm listener beside listening socket `fd`. Returns whether it exists.
    fn listen_rdma(&self, fd: c_int, addr: SocketAddr) -> bool {
        // (the rdma_cm listener needs the libraries now: loaded here if the engine has not yet)
        if !crate::probe::load_libraries() {
            return false;
        }
        let mut ls = self.listeners.lock().unwrap_or_else(|p| p.into_inner());
        // A listener of the same address still retiring (its socket was closed a moment ago):
        // this socket takes it over.
        let retiring = ls
            .by_id
            .iter()
            .find(|(_, e)| {
                e.transport() == Transport::Rdma && e.fd.is_none() && !e.own && e.addr == addr
            })
            .map(|(id, _)| *id);
        if let Some(id) = retiring {
            if let Some(e) = ls.by_id.get_mut(&id) {
                e.fd = Some(fd);
                e.retire_at = None;
            }
            ls.by_fd.insert(fd, id);
            shim_log!(Level::Debug, "listener {addr}: rdma_cm listener taken over");
            return true;
        }
        let l = match UpgradeListener::bind(addr) {
            Ok(l) => l,
            Err(e) => {
                shim_log!(
                    Level::Info,
                    "listener {addr}: no rdma_cm listener beside it ({e}); its connections from other hosts stay on TCP"
                );
                return false;
            }
        };
        let Some(id) = self.add_listener(&mut ls, RequestListener::Rdma(l), addr, Some(fd), false)
        else {
            return false;
        };
        ls.by_fd.insert(fd, id);
        shim_log!(Level::Debug, "listener {addr}: rdma_cm listener beside it");
        true
    }

    /// The rendezvous socket for clients of this host that connect to `addr`'s port, named by
    /// the port alone ([`shm_name`]): one per port and process, kept for the process's life
    /// (a later listen on the port uses it again). If another process holds the name (it
    /// listens on the port too, on another address or through SO_REUSEPORT, or did), this
    /// process's connections on the port are served on a name of its own, which their tokens
    /// name ([`Self::own_port`]). Returns whether the port's connections can be served.
    fn listen_shm(&self, addr: SocketAddr) -> bool {
        let mut ls = self.listeners.lock().unwrap_or_else(|p| p.into_inner());
        if ls.by_id.values().any(|e| e.serves(addr, Transport::Shm)) {
            return true;
        }
        match ShmListener::bind(&shm_name(addr.port(), false)) {
            Ok(l) => {
                let added = self.add_listener(&mut ls, RequestListener::Shm(l), addr, None, false);
                shim_log!(
                    Level::Debug,
                    "listener {addr}: shared-memory rendezvous beside it"
                );
                added.is_some()
            }
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                shim_log!(
                    Level::Debug,
                    "listener {addr}: the port's rendezvous name is another process's; this one's connections are served on a name of its own"
                );
                true
            }
            Err(e) => {
                shim_log!(
                    Level::Info,
                    "listener {addr}: no shared-memory rendezvous beside it ({e}); its connections from this host stay on TCP"
                );
                false
            }
        }
    }

    /// Adds a bound listener to the set the engine watches (`fd`: the listening socket it
    /// serves; `own`: this process's own, see [`Self::own_port`]). Returns its id.
    fn add_listener(
        &self,
        ls: &mut Listeners,
        l: RequestListener,
        addr: SocketAddr,
        fd: Option<c_int>,
        own: bool,
    ) -> Option<u32> {
        let id = ls.next_id;
        if net::epoll_ctl(
            self.epfd,
            libc::EPOLL_CTL_ADD,
            l.fd(),
            libc::EPOLLIN as u32,
            token(LISTENER, u64::from(id)),
        )
        .is_err()
        {
            return None;
        }
        ls.next_id = ls.next_id.wrapping_add(1);
        ls.by_id.insert(
            id,
            ListenerEntry {
                l: Arc::new(l),
                addr,
                fd,
                retire_at: None,
                own,
            },
        );
        Some(id)
    }

    /// The port (or name's number) of this process's own listener of `transport` for
    /// connections accepted with local address `local`, made on first use; `None` if it
    /// cannot be. A process accepting on a listening socket it inherited (a prefork server's
    /// worker) cannot use that socket's rdma_cm side or rendezvous name, which belong to the
    /// process that made it: its connections are dialled here, at what their token names.
    /// The first rdma_cm bind costs the worker's first accept what `listen()` costs its parent
    /// (rdma_cm opens the device), once.
    pub fn own_port(&self, local: SocketAddr, transport: Transport) -> Option<u16> {
        let mut ls = self.listeners.lock().unwrap_or_else(|p| p.into_inner());
        let ip = net::canonical_ip(local.ip());
        if let Some(e) = ls.by_id.values().find(|e| {
            e.own
                && e.transport() == transport
                && (transport == Transport::Shm || net::canonical_ip(e.addr.ip()) == ip)
        }) {
            return Some(e.addr.port());
        }
        let bound = match transport {
            Transport::Rdma => {
                let mut want = local;
                want.set_port(0);
                UpgradeListener::bind(want).and_then(|l| {
                    let addr = l.local_addr().ok_or(std::io::ErrorKind::AddrNotAvailable)?;
                    Ok((RequestListener::Rdma(l), addr))
                })
            }
            Transport::Shm => Self::bind_own_shm(local),
        };
        let (l, addr) = match bound {
            Ok(b) => b,
            Err(e) => {
                shim_log!(
                    Level::Info,
                    "{local}: accepted on a listening socket whose {transport} listener is another process's, and no {transport} listener of this one's ({e}); its connections stay on TCP"
                );
                return None;
            }
        };
        self.add_listener(&mut ls, l, addr, None, true)?;
        shim_log!(
            Level::Debug,
            "{local}: this process's own {transport} listener ({}), for connections accepted on a listening socket whose listener is another process's",
            addr.port()
        );
        Some(addr.port())
    }

    /// A rendezvous socket on a name of this process's own ([`shm_name`]'s `own/N`, N drawn at
    /// random until one is free); its address: `local`'s IP and N.
    fn bind_own_shm(local: SocketAddr) -> std::io::Result<(RequestListener, SocketAddr)> {
        let mut last = std::io::Error::from(std::io::ErrorKind::AddrInUse);
        for _ in 0..32 {
            let mut b = [0u8; 2];
            crate::sys::random(&mut b).map_err(|e| std::io::Error::from_raw_os_error(e.0))?;
            let n = u16::from_ne_bytes(b).max(1);
            match ShmListener::bind(&shm_name(n, true)) {
                Ok(l) => return Ok((RequestListener::Shm(l), SocketAddr::new(local.ip(), n))),
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => last = e,
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }

    /// Whether this engine has a listener of `transport` where a connection accepted with
    /// local address `local` was headed: rdma_cm's on the same port, on its address or the
    /// wildcard; the port's rendezvous name. By address, not by fd: a duplicate of the
    /// listening socket accepts for it too.
    pub fn serves(&self, local: SocketAddr, transport: Transport) -> bool {
        self.listeners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .by_id
            .values()
            .any(|e| e.serves(local, transport))
    }

    /// The listening socket `fd` is being closed: its rdma_cm listener retires (see
    /// [`ListenerEntry::fd`]); the engine drops it after the accepted-connection wait.
    pub fn unlisten(&self, fd: c_int) {
        let mut ls = self.listeners.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(id) = ls.by_fd.remove(&fd) {
            if let Some(e) = ls.by_id.get_mut(&id) {
                e.fd = None;
                e.retire_at = Some(Instant::now() + MatcherConfig::default().accepted_wait);
            }
        }
        drop(ls);
        net::eventfd_signal(self.wake);
    }

    /// Drops every rdma_cm listener (RDMA ends for this process: see
    /// [`super::close_for_credentials`]); clients that dial them are refused and stay TCP.
    pub fn drop_listeners(&self) {
        let mut ls = self.listeners.lock().unwrap_or_else(|p| p.into_inner());
        ls.by_fd.clear();
        let gone = std::mem::take(&mut ls.by_id);
        drop(ls);
        drop(gone);
        net::eventfd_signal(self.wake);
    }

    /// Drops retired listeners whose time is up (closing a channel removes it from the epoll
    /// set); returns when the next one is due.
    fn retire_listeners(&self, now: Instant) -> Option<Instant> {
        let mut ls = self.listeners.lock().unwrap_or_else(|p| p.into_inner());
        ls.by_id.retain(|_, e| e.retire_at.is_none_or(|t| t > now));
        ls.by_id.values().filter_map(|e| e.retire_at).min()
    }

    /// Records a failed dial to `peer` (`remote`: over RDMA, to another host). A silent host
    /// (no answer, or none in time) that this process's cache now holds is held host-wide
    /// too, for as long.
    fn record_failure(&self, peer: SocketAddr, f: PeerFailure, remote: bool) {
        let peer = net::canonical_addr(peer);
        let now = Instant::now();
        let mut n = self.negative.lock().unwrap_or_else(|p| p.into_inner());
        n.record(peer, f, now);
        let silent = matches!(
            n.check(peer, now),
            Some(PeerFailure::Unreachable | PeerFailure::Timeout)
        );
        drop(n);
        if silent && remote {
            let secs = NegativeCacheConfig::with_override(crate::config::get().negative_cache_secs)
                .after_silence
                .as_secs();
            super::hostcache::record_silent(peer.ip(), secs);
        }
    }
}

/// A connection the engine looks after.
struct Tracked {
    conn: Arc<Conn>,
    /// A client connection's dial starts no earlier than this.
    dial_at: Option<Instant>,
    /// Its dial probes the host (see [`NegativeCache::may_delay`]); until the dial ends.
    probe: bool,
    /// After the application closed it: the private socket duplicate and the give-up time.
    closing: Option<(Option<c_int>, Instant)>,
    key: Option<TupleKey>,
    /// [`Conn::uses`] when the engine last looked at an unarmed CQ of the connection.
    uses_seen: u64,
    /// Client: the server redirected the dial to this rdma_cm port (a fork child of the
    /// server's that took the connection over); followed once.
    redirect: Option<u16>,
    /// When the engine took the connection up: the waits that grow with queued work end at
    /// most [`DIAL_ANSWER_MAX`] after this (a server's handshake; a client's dial counts from
    /// its own start, `dial_at`).
    since: Instant,
    /// Since when the engine's looks at every connection found its lock taken, each time
    /// (see [`look`]).
    busy_since: Option<Instant>,
}

/// The longest the engine's looks at every connection pass one by whose lock an application
/// thread holds each time (see [`look`]).
const BUSY_LOOK_MAX: Duration = Duration::from_secs(1);

/// A connection's lock for one of the engine's looks at every connection ([`State::scan`], its
/// ack watch; the reaping only tries the lock): not waited for while an application thread
/// holds it — that thread is using the connection, and the look comes again within
/// [`SCAN_EVERY`] — unless every look found it taken for [`BUSY_LOOK_MAX`]. Under emulation
/// an application thread holds its connection's lock across a TCP send or receive of tens of
/// milliseconds (a system call, and the thread preempted in it): thirty streaming
/// connections made each look wait on one lock after the other, seconds in all, while
/// replies to other upgrades waited in the engine's queue and their servers gave them up.
fn look<'a>(
    conn: &'a Conn,
    busy_since: &mut Option<Instant>,
    now: Instant,
) -> Option<MutexGuard<'a, Inner>> {
    if let Some(g) = conn.try_lock() {
        *busy_since = None;
        return Some(g);
    }
    let since = *busy_since.get_or_insert(now);
    if now.saturating_duration_since(since) < BUSY_LOOK_MAX {
        return None;
    }
    *busy_since = None;
    Some(conn.lock())
}

impl Tracked {
    /// A connection the engine just took up: no dial time, no probe, not closing, no key.
    fn new(conn: Arc<Conn>) -> Tracked {
        Tracked {
            conn,
            dial_at: None,
            probe: false,
            closing: None,
            key: None,
            uses_seen: 0,
            redirect: None,
            since: Instant::now(),
            busy_since: None,
        }
    }
}

struct State {
    epfd: c_int,
    conns: HashMap<u64, Tracked>,
    matcher: Matcher<Request, Arc<Conn>>,
    /// Client connections whose dial waits for its time (see [`super::dial_delay`]).
    delayed: Vec<(Instant, Arc<Conn>)>,
    /// Commands were taken up in the last round: look again within [`LAZY`].
    busy: bool,
    /// Fork children's requests for connections of this process.
    requests: super::board::Requests,
    /// Connect requests held for connections offered to a fork child, until when.
    held: Vec<(Request, Arc<Conn>, Instant)>,
    /// When the connections' sockets are checked next ([`SOCKET_CHECK`]).
    sockets_at: Instant,
    /// When the engine next looks for an io_uring instance ([`Self::look_for_io_uring`]):
    /// before it takes up a new connection and while it has connections, when due.
    uring_at: Instant,
    /// When the engine last looked at every connection it tracks ([`Self::scan`]).
    scanned_at: Instant,
    /// The earliest timer among them at that look (a dial's deadline, a link's, a close's
    /// give-up time), if any.
    conn_next: Option<Instant>,
    /// Events or commands were handled since that look: timers may have moved, and
    /// connections may be done.
    stale: bool,
    /// When a dial of this process's last ended its address or route resolution (or failed
    /// it): while this host's rdma_cm resolves, a dial still waiting for its own waits on
    /// ([`Self::resolving_until`]).
    resolved_at: Option<Instant>,
    /// When each peer host (canonical address) last answered a dial of this process's:
    /// while it answers, a dial still waiting for its own answer waits on
    /// ([`Self::answering_until`]).
    answered: HashMap<std::net::IpAddr, Instant>,
    /// When the engine last found more events waiting for it than it takes at a time (a full
    /// batch from `epoll_wait`): while it is behind, the progress that the waits of dials and
    /// handshakes look for may be sitting in its own queue, unread ([`Self::progress`]).
    backlog_at: Option<Instant>,
    /// How long the last look at every connection took ([`Self::next_scan`]).
    scan_cost: Duration,
}

/// The most bytes this process's connections over RDMA may pin (`RDMASHIM_PINNED_MIB`; by
/// default a quarter of the host's memory), read once; `None`: no cap of the shim's own.
fn pinned_cap() -> Option<usize> {
    static CAP: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *CAP.get_or_init(|| {
        let cap = crate::config::get().pinned_cap(crate::sys::phys_mem_bytes());
        let cap = cap.map(|c| usize::try_from(c).unwrap_or(usize::MAX));
        // (a link that would grow its ring past it keeps the one it has)
        rdmashim_core::set_pinned_limit(cap);
        cap
    })
}

/// The shim's share of the process's memory mappings: half of `vm.max_map_count` (read once;
/// `None` if it cannot be read). The kernel counts the application's mappings against the
/// same bound, and a program whose `mmap` fails (a thread's stack, an allocator's arena)
/// would be worse off than without the shim: past its share, new connections stay TCP
/// (`resources`).
fn mappings_cap() -> Option<usize> {
    static CAP: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *CAP.get_or_init(|| {
        let max = match crate::fault::map_count() {
            Some(n) => n,
            None => {
                let max = std::fs::read_to_string("/proc/sys/vm/max_map_count").ok()?;
                max.trim().parse::<u64>().ok()?
            }
        };
        usize::try_from(max / 2).ok()
    })
}

/// Which of the process's limits one more connection would pass ([`State::reserve_link`]).
#[derive(Clone, Copy, Debug)]
enum Short {
    /// The shim's cap on pinned memory ([`pinned_cap`]).
    Pinned,
    /// The shim's share of the memory mappings ([`mappings_cap`]).
    Mappings,
}

/// What the engine watches on the socket of a connection the application closed ([`SOCK`]):
/// the peer's FIN or RST, and its data while the peer's failover record or repeats are due
/// (`Conn::take_control`).
fn sock_events(control_due: bool) -> u32 {
    let end = (libc::EPOLLRDHUP | libc::EPOLLHUP | libc::EPOLLERR) as u32;
    if control_due {
        end | libc::EPOLLIN as u32
    } else {
        end
    }
}

/// `fd`, a connection's private socket duplicate about to be closed, leaves the engine's set
/// (it is in it while its connection is upgraded: [`TCPW`]; the application's descriptors of
/// the same socket would keep the registration alive after the close).
pub(crate) fn unwatch_sock(fd: c_int) {
    if let Some(e) = engine() {
        let _ = net::epoll_ctl(e.epfd, libc::EPOLL_CTL_DEL, fd, 0, 0);
    }
}

/// An application thread is about to wait on the completion channel of `c`'s link `l`
/// itself (`on == false`), or the last such thread stopped (`on == true`): the engine stops or
/// resumes watching that channel, so that a completion wakes one thread, not two. Call with
/// `c`'s lock held, `l` its link; resume after the thread took the channel's events (an event
/// still pending then is reported to the engine by the ADD).
pub(crate) fn watch_completions(c: &Conn, l: &Link, on: bool) {
    let Some(e) = engine() else { return };
    let (op, ev) = if on {
        (libc::EPOLL_CTL_ADD, (libc::EPOLLIN | libc::EPOLLET) as u32)
    } else {
        (libc::EPOLL_CTL_DEL, 0)
    };
    let _ = net::epoll_ctl(e.epfd, op, l.comp_fd(), ev, token(COMP, c.slot));
}

/// How long after a CQ was last left unarmed the engine keeps waking at its cadence (see
/// [`super::LAST_UNARMED_MS`], [`crate::cadence`]).
const UNARMED_RECENT: Duration = Duration::from_millis(200);

/// Makes sure the engine wakes within `within` (if it runs).
pub(crate) fn nudge(within: Duration) {
    if let Some(e) = engine() {
        e.nudge(within);
    }
}

fn engine() -> Option<&'static Engine> {
    super::world_if_created().and_then(|w| w.engine_if_started())
}

/// The engine if it was started, halted or not.
fn engine_even_halted() -> Option<&'static Engine> {
    super::world_if_created().and_then(|w| w.engine.get().and_then(|e| e.as_ref()))
}

fn run(epfd: c_int, wake: c_int) {
    let mut st = State {
        epfd,
        conns: HashMap::new(),
        matcher: Matcher::new(MatcherConfig::default()),
        delayed: Vec::new(),
        busy: false,
        requests: super::board::Requests::default(),
        held: Vec::new(),
        sockets_at: Instant::now() + SOCKET_CHECK,
        uring_at: Instant::now(),
        scanned_at: Instant::now(),
        conn_next: None,
        stale: false,
        resolved_at: None,
        answered: HashMap::new(),
        backlog_at: None,
        scan_cost: Duration::ZERO,
    };
    let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 64];
    loop {
        if halted() {
            st.halt();
            HALTED.store(true, Ordering::Release);
            return;
        }
        st.commands();
        st.finished();
        let timeout = st.timeout_ms();
        st.busy = false;
        if let Some(e) = engine() {
            e.sleep_until(timeout);
            // (after publishing the wake-up time: an application thread that leaves a CQ
            // unarmed after this reads it and wakes the engine; one that did before is seen here)
            let unarmed = super::UNARMED.load(Ordering::SeqCst) > 0
                && (timeout < 0 || timeout as u128 > super::UNARMED_CADENCE.every().as_millis());
            if e.has_cmds() || unarmed {
                continue;
            }
        }
        let n = net::epoll_wait(epfd, &mut evs, timeout).unwrap_or_default();
        crate::spin::wait::INTERNAL_WAKES.fetch_add(1, Ordering::Relaxed);
        if let Some(e) = engine() {
            e.next_wake.store(0, Ordering::SeqCst);
        }
        // Queued commands before the events: a connect request then finds the connections
        // accepted before it already in the matcher.
        st.commands();
        st.finished();
        st.stale |= n > 0;
        if n == evs.len() {
            st.backlog_at = Some(Instant::now());
        }
        for ev in &evs[..n] {
            let t = ev.u64;
            let (kind, value) = (t >> TOKEN_SHIFT, t & ((1 << TOKEN_SHIFT) - 1));
            match kind {
                WAKE => net::eventfd_clear(wake),
                LISTENER => st.requests(value as u32),
                DIAL => st.dial_event(value),
                COMP => st.comp_event(value),
                CM => st.cm_event(value),
                SOCK => st.sock_event(value),
                TCPW => st.tcp_data(value),
                PEND => st.pend_event(value),
                TOKEN => st.token_event(value),
                BOARD => {
                    if let Some(b) = super::world_if_created().and_then(super::World::board) {
                        b.drain();
                    }
                }
                _ => {}
            }
        }
        st.requests.serve();
        st.offers();
        st.timers();
    }
}

/// A new link's core counted the socket bytes read when its request or reply was built; the
/// application may have read more since (`tcp_received`).
fn catch_up(link: &mut Link, tcp_received: u64) {
    if let rdmashim_proto::RxState::Tcp { received } = link.conn().rx_state() {
        if tcp_received > received {
            let _ = link.conn_mut().note_tcp_read(tcp_received - received);
        }
    }
}

fn key_of(c: &Conn) -> TupleKey {
    TupleKey {
        peer_ip: net::canonical_ip(c.peer.ip()),
        peer_port: c.peer.port(),
        local_port: c.local.port(),
    }
}

/// When the connection's dial or link next needs the engine without an event.
/// Why a server-side connection waited for its client's RDMA request in vain: RDMA ended for
/// the process meanwhile (its listeners are gone: io_uring found, a sandbox), or none came.
fn no_request_reason() -> FallbackReason {
    crate::probe::host_reason().unwrap_or(FallbackReason::NoUpgradeRequest)
}

fn phase_timer(g: &Inner) -> Option<Instant> {
    match &g.phase {
        Phase::Dialing(d) => Some(d.deadline()),
        Phase::Linked(l) => {
            let t = l.next_timer();
            if l.conn().resume_due().is_some() {
                // (a switch back's continuation the socket did not take whole: again at its
                // retry time, a fixed instant — one computed from now here would never be
                // due, and a program waiting for EPOLLOUT would wait for the link's teardown;
                // none yet: at once)
                let again = g.resume_retry.unwrap_or_else(Instant::now);
                Some(t.map_or(again, |t| t.min(again)))
            } else {
                t
            }
        }
        Phase::Fallen => g.unsure.map(|(_, at)| at),
        _ => None,
    }
}

impl State {
    fn timeout_ms(&self) -> c_int {
        let now = Instant::now();
        let mut next: Option<Instant> = self.matcher.poll_timeout();
        if self.busy {
            let t = now + LAZY;
            next = Some(next.map_or(t, |n| n.min(t)));
        }
        if let Some(t) = self.delayed.iter().map(|(t, _)| *t).min() {
            let t = t + DIAL_SLACK;
            next = Some(next.map_or(t, |n| n.min(t)));
        }
        let recent = net::coarse_ms()
            < super::LAST_UNARMED_MS.load(Ordering::Relaxed) + UNARMED_RECENT.as_millis() as u64;
        if super::UNARMED.load(Ordering::SeqCst) > 0 || recent {
            let t = now + super::UNARMED_CADENCE.every();
            next = Some(next.map_or(t, |n| n.min(t)));
        }
        if let Some(t) = engine().and_then(|e| e.retire_listeners(now)) {
            next = Some(next.map_or(t, |n| n.min(t)));
        }
        if let Some(t) = self.held.iter().map(|(_, _, t)| *t).min() {
            // (a child's adoption and this process's close wake the engine; the tick is a
            // safety net)
            let t = t.min(now + OFFER_TICK);
            next = Some(next.map_or(t, |n| n.min(t)));
        }
        if !self.conns.is_empty() {
            let t = self.sockets_at.min(self.uring_at);
            next = Some(next.map_or(t, |n| n.min(t)));
        } else if crate::live::dirty() {
            // (the live view's counters of a last event, published at the next tick)
            next = Some(next.map_or(self.sockets_at, |n| n.min(self.sockets_at)));
        }
        if self.requests.pending() {
            let t = now + Duration::from_millis(super::BACK_NAP as u64);
            next = Some(next.map_or(t, |n| n.min(t)));
        }
        // (the connections' timers as of the last look at them all; after events, another
        // look within SCAN_EVERY; neither before the looks' spacing allows)
        if let Some(d) = self.conn_next {
            let d = d.max(self.next_scan());
            next = Some(next.map_or(d, |n| n.min(d)));
        }
        if self.stale {
            let t = (self.scanned_at + SCAN_EVERY).max(self.next_scan());
            next = Some(next.map_or(t, |n| n.min(t)));
        }
        match next {
            None => -1,
            Some(t) => {
                let ms = t.saturating_duration_since(now).as_micros().div_ceil(1000);
                ms.min(60_000) as c_int
            }
        }
    }

    fn commands(&mut self) {
        let Some(e) = engine() else { return };
        let cmds = std::mem::take(&mut *e.cmds.lock().unwrap_or_else(|p| p.into_inner()));
        self.busy |= !cmds.is_empty();
        self.stale |= !cmds.is_empty();
        let now = Instant::now();
        if now >= self.uring_at
            && cmds
                .iter()
                .any(|c| matches!(c, Cmd::Dial(..) | Cmd::Accepted(_)))
        {
            self.look_for_io_uring(now);
        }
        for c in cmds {
            match c {
                Cmd::Dial(c, watch, at, probe) => self.start_dial(c, watch, at, probe),
                Cmd::Accepted(c) => {
                    if let Some(r) = crate::probe::host_reason() {
                        // (RDMA ended for the process since its accept hook ran: io_uring
                        // found just now, a sandbox; its listeners are gone, no request comes)
                        let mut g = c.lock();
                        if matches!(g.phase, Phase::Awaiting) {
                            c.fall_back(&mut g, r);
                        }
                    }
                    let key = key_of(&c);
                    self.conns.insert(
                        c.slot,
                        Tracked {
                            key: Some(key),
                            ..Tracked::new(c.clone())
                        },
                    );
                    // An older connection still waiting under the same tuple can no longer be
                    // matched (that client port is this connection's now): decided here.
                    if let Some(old) = self.matcher.forget_accepted(&key) {
                        let mut g = old.lock();
                        if matches!(g.phase, Phase::Awaiting) {
                            old.fall_back(&mut g, FallbackReason::NoUpgradeRequest);
                        }
                    }
                    if let Some((inc, c)) = self.matcher.on_accepted(key, c, Instant::now()) {
                        self.accept(inc, c);
                    }
                }
                Cmd::Closed(c, sock) => self.on_closed(c, sock),
                Cmd::Token(c) => self.token_event(c.slot),
                Cmd::HostProgress(ip, at) => self.matcher.host_progress(net::canonical_ip(ip), at),
            }
        }
    }

    fn start_dial(&mut self, c: Arc<Conn>, watch: Option<c_int>, at: Instant, probe: bool) {
        self.conns.insert(
            c.slot,
            Tracked {
                dial_at: Some(at),
                probe,
                ..Tracked::new(c.clone())
            },
        );
        // The server's token: watched from now on (edge-triggered: each arrival once), and
        // looked for at once (it may be there already).
        {
            let mut g = c.lock();
            if let Some(fd) = g.token_sock {
                let ev = (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLET) as u32;
                if net::epoll_ctl(self.epfd, libc::EPOLL_CTL_ADD, fd, ev, token(TOKEN, c.slot))
                    .is_err()
                {
                    self.end_token_watch(&mut g);
                    self.end_pending(&mut g);
                    c.fall_back(&mut g, FallbackReason::Resources);
                    return;
                }
            }
        }
        self.token_event(c.slot);
        if let Some(fd) = watch {
            let mut g = c.lock();
            g.pending = Some(fd);
            let ev = (libc::EPOLLOUT | libc::EPOLLERR | libc::EPOLLHUP) as u32;
            if net::epoll_ctl(self.epfd, libc::EPOLL_CTL_ADD, fd, ev, token(PEND, c.slot)).is_err()
            {
                self.end_pending(&mut g);
                c.fall_back(&mut g, FallbackReason::Resources);
                return;
            }
            drop(g);
            // It may have completed already.
            self.pend_event(c.slot);
            return;
        }
        self.begin_dial(&c, at);
    }

    /// Stops watching a private duplicate of a connection's socket, if `sock` holds one, and
    /// closes it (it must never keep the connection open after the application closed it).
    fn unwatch(&self, sock: &mut Option<c_int>) {
        if let Some(fd) = sock.take() {
            let _ = net::epoll_ctl(self.epfd, libc::EPOLL_CTL_DEL, fd, 0, 0);
            net::close(fd);
        }
    }

    /// Stops watching a client's socket for the token.
    fn end_token_watch(&self, g: &mut Inner) {
        self.unwatch(&mut g.token_sock);
    }

    /// The server's direction of client `slot` may have its first bytes (or an application
    /// thread read them): looks for the token while the wait lasts; once it is decided, stops
    /// watching, and dials if the token came and the dial is due (`dial_now` waited for it).
    fn token_event(&mut self, slot: u64) {
        let Some(t) = self.conns.get(&slot) else {
            return;
        };
        let c = t.conn.clone();
        let at = t.dial_at;
        let mut g = c.lock();
        if g.pending.is_some() {
            // (its connect's outcome first: `pend_event` looks again once it succeeded)
            return;
        }
        look_for_token(&c, &mut g);
        if g.token == TokenWait::Awaiting && !g.closed && !c.fell_back.load(Ordering::Acquire) {
            return;
        }
        self.end_token_watch(&mut g);
        let due = matches!(g.token, TokenWait::Got(..))
            && matches!(g.phase, Phase::Queued)
            && g.pending.is_none()
            && at.is_some_and(|a| a <= net::coarse_instant());
        drop(g);
        if due {
            self.dial_now(&c);
        }
    }

    /// Stops watching the pending connect of a connection.
    fn end_pending(&self, g: &mut Inner) {
        self.unwatch(&mut g.pending);
    }

    /// The pending TCP connect of `slot` made progress: connected (dial now), failed (the
    /// connection never existed), or not yet.
    fn pend_event(&mut self, slot: u64) {
        let Some(t) = self.conns.get(&slot) else {
            return;
        };
        let c = t.conn.clone();
        let at = t.dial_at.unwrap_or_else(Instant::now);
        let mut g = c.lock();
        match super::pending_outcome(&g) {
            None => {}
            Some(true) => {
                self.end_pending(&mut g);
                drop(g);
                self.token_event(slot);
                self.begin_dial(&c, at);
            }
            Some(false) => {
                self.end_pending(&mut g);
                self.end_token_watch(&mut g);
                c.abandon(&mut g);
            }
        }
    }

    /// Starts the dial of a connected client at time `at` (now if that has passed): a
    /// connection the application closes before then (a short request and its answer) costs
    /// no rdma_cm work on either end.
    fn begin_dial(&mut self, c: &Arc<Conn>, at: Instant) {
        // (`at` was read on the coarse clock: compared on it)
        if at > net::coarse_instant() {
            self.delayed.push((at, c.clone()));
        } else {
            self.dial_now(c);
        }
    }

    fn dial_now(&mut self, c: &Arc<Conn>) {
        // A probe dials even after the application closed the connection: its outcome teaches
        // the negative cache about the host (and is the connection's reason).
        let probe = self.conns.get(&c.slot).is_some_and(|t| t.probe);
        let still_wanted = |g: &mut Inner| {
            if !matches!(g.phase, Phase::Queued) {
                return false; // (decided meanwhile: closed before its dial, or the exit)
            }
            if g.closed && !probe {
                c.fall_back(g, FallbackReason::ClosedEarly);
                return false;
            }
            // (RDMA ended for the process meanwhile: io_uring found, a sandbox)
            if let Some(r) = crate::probe::host_reason() {
                c.fall_back(g, r);
                return false;
            }
            true
        };
        // The request is tagged with the key of the server's token: no token yet, no dial (the
        // token's arrival dials, `token_event`); no token at all, no dial ever.
        // The token may name the rdma_cm port to dial (a prefork worker's own listener).
        // (a redirect from the server names the port of a fork child that took it over)
        let redirect = self.conns.get(&c.slot).and_then(|t| t.redirect);
        let (proof, dst, own, tcp_received) = {
            let mut g = c.lock();
            if !still_wanted(&mut g) {
                return;
            }
            look_for_token(c, &mut g);
            match g.token {
                TokenWait::Got(key, port) => {
                    let mut dst = c.peer;
                    let own = redirect.or(port);
                    if let Some(p) = own {
                        dst.set_port(p);
                    }
                    let tuple = TcpTuple {
                        client: c.local,
                        server: c.peer,
                    };
                    (
                        Proof::Bound { key, tuple },
                        dst,
                        own.is_some(),
                        g.tcp_received,
                    )
                }
                TokenWait::Awaiting | TokenWait::None => return,
            }
        };
        // Outside the connection's lock, so that the application's calls on it go on (over
        // TCP) meanwhile: the process's first dial loads the libraries (here, not in the
        // application's connect; the connections queued before the verdict learn it here,
        // later ones from `probe::host_reason` at their connect) and rdma_cm opens the
        // devices, tens of milliseconds under TCG.
        // A peer of this host is dialled on the rendezvous name of its port (or the one its
        // token names), and the request goes at once with the bytes read so far (the link
        // catches up with later reads, as an RDMA dial's does).
        // (a dial to a process of this host maps its rings as it starts, on this thread: the
        // shim's share of the mappings is looked at here; an RDMA dial's, before its build)
        if c.transport == Transport::Shm {
            if let Err(short) = self.room_for(Transport::Shm) {
                shim_log!(Level::Info, "dial {}: {}", c.peer, self.short(short));
                c.fall_back(&mut c.lock(), FallbackReason::Resources);
                return;
            }
        }
        let t0 = Instant::now();
        let started = match c.transport {
            Transport::Rdma => crate::probe::load_libraries().then(|| {
                // (the local address as the socket has it: a link-local one keeps its
                // interface, without which rdma_cm cannot resolve the route)
                let mut src = c.local;
                src.set_port(0);
                Dialer::start(Some(src), dst, c.local.port(), proof, link_config())
                    .map(UpgradeDialer::Rdma)
            }),
            Transport::Shm => Some(
                ShmDialer::start(
                    &shm_name(dst.port(), own),
                    c.local,
                    c.peer.port(),
                    proof,
                    tcp_received,
                    super::shm_config(),
                )
                .map(UpgradeDialer::Shm),
            ),
        };
        if super::trace() {
            shim_log!(
                Level::Debug,
                "trace: dial start {} took {:?}",
                c.local,
                t0.elapsed()
            );
        }
        let mut g = c.lock();
        if !still_wanted(&mut g) {
            return; // (a dialer started meanwhile is dropped: its request is withdrawn)
        }
        let Some(started) = started else {
            c.fall_back(&mut g, FallbackReason::LibrariesMissing);
            return;
        };
        match started {
            Ok(mut d) => {
                // An RDMA dial's endpoint is built by a setup thread (`Job::Dial`), and its
                // channel watched edge-triggered meanwhile: its events wait for the dialer's
                // return, when `dial_event` takes them all.
                d.defer_build();
                let edge = match d.transport() {
                    Transport::Rdma => libc::EPOLLET as u32,
                    Transport::Shm => 0,
                };
                let ok = net::epoll_ctl(
                    self.epfd,
                    libc::EPOLL_CTL_ADD,
                    d.fd(),
                    libc::EPOLLIN as u32 | edge,
                    token(DIAL, c.slot),
                )
                .is_ok();
                g.phase = Phase::Dialing(Box::new(d));
                if !ok {
                    c.fall_back(&mut g, FallbackReason::Resources);
                    return;
                }
                // Events may already be pending.
                drop(g);
                self.dial_event(c.slot);
            }
            Err(e) => {
                let r = if e.kind() == std::io::ErrorKind::Unsupported {
                    FallbackReason::NoDevice
                } else {
                    FallbackReason::PeerUnreachable
                };
                shim_log!(Level::Info, "dial {} ({}): {e}", c.peer, c.transport);
                c.fall_back(&mut g, r);
            }
        }
    }

    fn dial_event(&mut self, slot: u64) {
        let Some(t) = self.conns.get(&slot) else {
            return;
        };
        let c = t.conn.clone();
        let since = t.dial_at;
        let mut g = c.lock();
        let tcp_received = g.tcp_received;
        let Phase::Dialing(d) = &mut g.phase else {
            return;
        };
        // Late, but the work it waits for is queued, not lost: this host's rdma_cm resolves
        // others' addresses and routes (one after another), or its server's host answers
        // others (a queue of set-ups there) — a burst. The dial waits on.
        let now = Instant::now();
        let resolving = d.resolving();
        if now >= d.deadline() {
            let since = since.unwrap_or(now);
            let until = if resolving {
                self.resolving_until(since)
            } else {
                self.answering_until(c.peer.ip(), since)
            };
            if let Some(until) = until {
                if d.wait_longer(until) {
                    shim_log!(
                        Level::Debug,
                        "dial {}: others' {} go on: waits until {:?} from now",
                        c.peer,
                        if resolving { "resolutions" } else { "answers" },
                        until.saturating_duration_since(now)
                    );
                }
            }
        }
        let waiting = d.waiting_for();
        // (judged at the instant the wait was decided at: see `UpgradeDialer::poll_at`)
        let status = d.poll_at(tcp_received, now);
        if resolving
            && !matches!(&g.phase, Phase::Dialing(d) if d.resolving())
            && !matches!(status, DialStatus::Failed(DialError::Timeout))
        {
            // (this one's resolution ended, by an event: this host's rdma_cm makes progress)
            self.resolved_at = Some(Instant::now());
        }
        if matches!(status, DialStatus::Failed(DialError::Timeout)) {
            shim_log!(
                Level::Debug,
                "dial {}: timed out waiting for {waiting}, {:?} after its start",
                c.peer,
                since.map(|s| now.saturating_duration_since(s))
            );
        }
        self.dial_status(&c, &mut g, status);
        // Its route resolved: the endpoint is built by a setup thread (see `Job::Dial`), if
        // the process may pin its rings.
        if matches!(&g.phase, Phase::Dialing(d) if d.needs_build()) {
            if let Err(short) = self.reserve_link(Transport::Rdma) {
                shim_log!(Level::Info, "dial {}: {}", c.peer, self.short(short));
                c.fall_back(&mut g, FallbackReason::Resources);
                return;
            }
            if let Phase::Dialing(d) = std::mem::replace(&mut g.phase, Phase::Setup) {
                drop(g);
                let probe = self.conns.get(&slot).is_some_and(|t| t.probe);
                self.hand_over(Job::Dial(d, c, probe, Instant::now()));
            }
        }
    }

    /// Until when a dial to `ip` that started at `since` may wait for its answer: a
    /// connect timeout past the host's last answer to a dial of this process, at most
    /// [`DIAL_ANSWER_MAX`] after `since`; `None` if the host never answered.
    fn answering_until(&self, ip: std::net::IpAddr, since: Instant) -> Option<Instant> {
        let last = self.answered.get(&net::canonical_ip(ip)).copied();
        Some(waits_on_until(self.progress(last)?, since))
    }

    /// The later of `last` (when the work a wait looks at last moved) and the last time the
    /// engine was behind on its events ([`Self::backlog_at`]): a burst of thousands of
    /// connections queues their rdma_cm events faster than one engine thread takes them up
    /// (under emulation), and the resolutions, answers and establishments it waits for may
    /// have come and be waiting there. Measured in the VM with ten thousand: dials whose
    /// progress sat in the engine's queue timed out (4,515), and servers gave up on links
    /// whose clients took their answers up late (4,705: the clients' rdma_cm then refused the
    /// late establishment, `CONNECT_ERROR` EINVAL).
    fn progress(&self, last: Option<Instant>) -> Option<Instant> {
        match (last, self.backlog_at) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }

    /// A link whose handshake is past its deadline at `now` fails (the engine owns the
    /// deadline: [`Link::own_handshake_deadline`]), unless it is a server's that waits on: its
    /// client has not taken up the answer yet (no ESTABLISHED), and the client's host keeps
    /// making progress (the matcher's record of its requests and of its connections
    /// established) or this engine is behind on its events — up to a connect timeout past
    /// that, at most [`DIAL_ANSWER_MAX`] after `since`. A client working through a burst's
    /// set-ups takes each answer up late, and one given up on here is lost on both sides
    /// (the client's rdma_cm refuses the late establishment). The wait and the expiry are
    /// judged at the same instant, here only: a deadline cannot pass unextended between
    /// two clock reads, nor be acted on by an application thread's drive first.
    fn handshake_deadline(&self, c: &Conn, g: &mut Inner, since: Instant, now: Instant) {
        let Phase::Linked(l) = &mut g.phase else {
            return;
        };
        if l.conn().poll_timeout().is_none_or(|d| d > now) {
            return;
        }
        if c.side == Side::Server {
            let host = self
                .matcher
                .last_progress_of(net::canonical_ip(c.peer.ip()));
            if let Some(last) = self.progress(host) {
                let until = waits_on_until(last, since);
                if l.conn_mut().wait_longer(until) {
                    shim_log!(
                        Level::Debug,
                        "server {} <- {}: its client goes on with others: the handshake waits until {:?} from now",
                        c.local,
                        c.peer,
                        until.saturating_duration_since(now)
                    );
                }
            }
        }
        l.expire_handshake(now);
    }

    /// Until when a dial that started at `since` may wait for this host's rdma_cm to resolve
    /// its address or route: a connect timeout past the last resolution this process saw
    /// end, at most [`DIAL_ANSWER_MAX`] after `since`; `None` if none ended yet.
    fn resolving_until(&self, since: Instant) -> Option<Instant> {
        Some(waits_on_until(self.progress(self.resolved_at)?, since))
    }

    /// The host of `peer` answered a dial (accepted it, or its shim declined it).
    fn host_answered(&mut self, peer: SocketAddr) {
        let now = Instant::now();
        if self.answered.len() >= 1024 {
            // (hosts silent for longer than any dial waits are forgotten)
            self.answered
                .retain(|_, t| now.saturating_duration_since(*t) < DIAL_ANSWER_MAX);
        }
        self.answered.insert(net::canonical_ip(peer.ip()), now);
    }

    /// Acts on what a dial's poll found.
    fn dial_status(&mut self, c: &Arc<Conn>, g: &mut Inner, status: DialStatus) {
        let tcp_received = g.tcp_received;
        if matches!(
            status,
            DialStatus::Connected(_) | DialStatus::Failed(DialError::Rejected(_))
        ) {
            self.host_answered(c.peer);
        }
        // (a probe that ends some other way goes stale: `PROBE_STALE`)
        if !matches!(status, DialStatus::Pending) {
            if let Some(t) = self.conns.get_mut(&c.slot) {
                if std::mem::take(&mut t.probe) {
                    if let Some(e) = engine() {
                        e.probe_ended(c.peer);
                    }
                }
            }
        }
        match status {
            DialStatus::Pending => {}
            DialStatus::Connected(mut link) => {
                // The request counted the TCP bytes read when it was built; the application
                // may have read more since.
                catch_up(&mut link, tcp_received);
                if g.closed && !g.give_back {
                    // The application closed the connection while it was dialing (the dial
                    // went on to learn about the peer): dropping the link disconnects it.
                    // (Unless a fork child may go on with the socket: `Inner::give_back`.)
                    c.fall_back(g, FallbackReason::ClosedEarly);
                    return;
                }
                // The dial's channel (registered as DIAL) is the link's rdma_cm channel now.
                self.watch(c, g, link, libc::EPOLL_CTL_MOD);
            }
            DialStatus::Failed(DialError::Rejected(Some(RejectReason::Redirect(port))))
                if self.follow_redirect(c, g, port) => {}
            DialStatus::Failed(e) => {
                // A shim that declined this one connection (no matching TCP connection yet, a
                // duplicate, short of resources) will take others: not cached, and its host
                // is proven. So is a rejection from a process's own rdma_cm port (the server
                // redirected the dial to a fork child, or its token named a prefork worker's
                // listener): it speaks for that one process, which may be gone or not
                // listening yet, not for the service. After a redirect nothing is cached: the
                // service's shim answered, over rdma_cm, so its host is reachable.
                let redirected = self
                    .conns
                    .get(&c.slot)
                    .is_some_and(|t| t.redirect.is_some());
                let shim_declined = redirected
                    || matches!(g.token, TokenWait::Got(_, Some(_)))
                    || matches!(
                        e,
                        DialError::Rejected(Some(
                            RejectReason::NoMatchingTcp
                                | RejectReason::Duplicate
                                | RejectReason::Resources
                                | RejectReason::Redirect(_)
                        ))
                    );
                let (reason, failure) = match &e {
                    DialError::Rejected(r) => (
                        fallback_reason(rdmashim_proto::ErrorReason::Rejected(*r)),
                        (!shim_declined).then_some(PeerFailure::Rejected),
                    ),
                    DialError::Unreachable(_) => (
                        FallbackReason::PeerUnreachable,
                        Some(PeerFailure::Unreachable),
                    ),
                    // (the server's shim answered: its host is proven)
                    DialError::Broken(_) => (FallbackReason::PeerUnreachable, None),
                    DialError::Timeout => (
                        FallbackReason::UpgradeTimeout,
                        Some(PeerFailure::Unreachable),
                    ),
                    // (a registration over RLIMIT_MEMLOCK: this connection's own reason,
                    // decided per connection — the next may fit)
                    DialError::Local(e) if rdmashim_core::error::is_memlock(e) => {
                        (FallbackReason::Memlock, None)
                    }
                    DialError::Local(_) => (FallbackReason::Resources, None),
                };
                shim_log!(Level::Debug, "dial {}: {e:?}", c.peer);
                let failure = failure.filter(|_| !redirected);
                if let Some(en) = engine() {
                    if let Some(f) = failure {
                        en.record_failure(c.peer, f, c.transport == Transport::Rdma);
                    } else if shim_declined || matches!(e, DialError::Broken(_)) {
                        en.proven(c.peer);
                    }
                }
                // The application closed the connection while it was dialing, and the
                // server's shim found no TCP connection for the request: gone on its side too.
                let gone = matches!(
                    e,
                    DialError::Rejected(Some(
                        RejectReason::NoMatchingTcp | RejectReason::Duplicate
                    ))
                );
                let broken = matches!(e, DialError::Broken(_));
                if g.closed && (gone || broken) {
                    c.fall_back(g, FallbackReason::ClosedEarly);
                } else if broken {
                    // The server undid its accept: its application closed the connection,
                    // normally, and the socket's end follows (`Inner::unsure`).
                    c.fall_back_unsure(g, reason);
                } else {
                    c.fall_back(g, reason);
                }
            }
        }
    }

    /// The server redirected `c`'s dial to rdma_cm port `port` of its host (a fork child of
    /// its took the connection over: protocol 2.4): the connection dials again, there, with
    /// the same request, right away. Only once per connection, and not once the application
    /// closed it; false if not followed (the redirect then counts as any rejection).
    fn follow_redirect(&mut self, c: &Arc<Conn>, g: &mut Inner, port: u16) -> bool {
        let Some(t) = self.conns.get_mut(&c.slot) else {
            return false;
        };
        if t.redirect.is_some() || g.closed {
            return false;
        }
        t.redirect = Some(port);
        shim_log!(
            Level::Debug,
            "client {} -> {}: redirected to rdma_cm port {port} (the server's fork child serves it)",
            c.local,
            c.peer
        );
        // (dropping the dialer withdraws what is left of the first dial)
        g.phase = Phase::Queued;
        self.delayed.push((net::coarse_instant(), c.clone()));
        true
    }

    /// Whether one more connection over `t` may be set up: under the process's cap on pinned
    /// memory ([`pinned_cap`], RDMA only): what its registrations hold now (idle pooled kits
    /// aside, which the next set-up takes over), what the set-ups under way will add, and what
    /// one connection pins; and under the shim's share of the process's memory mappings
    /// ([`mappings_cap`]), counted likewise. If so, its share of both is reserved until its
    /// set-up ends ([`unreserve_link`], by the setup thread as the job ends): set-ups run on
    /// several threads at once, and none has registered or mapped anything when the next is
    /// decided.
    fn reserve_link(&self, t: Transport) -> Result<(), Short> {
        self.room_for(t)?;
        if t == Transport::Rdma {
            RESERVED.fetch_add(link_config().pinned_per_connection(), Ordering::AcqRel);
        }
        RESERVED_MAPS.fetch_add(t.mappings_per_link(), Ordering::AcqRel);
        Ok(())
    }

    /// Whether one more connection over `t` fits (see [`Self::reserve_link`]), without
    /// reserving anything.
    fn room_for(&self, t: Transport) -> Result<(), Short> {
        if let (Some(cap), Transport::Rdma) = (pinned_cap(), t) {
            let idle = rdmashim_core::pool::pooled().1;
            let held = rdmashim_core::registered_bytes().saturating_sub(idle);
            let reserved = RESERVED.load(Ordering::Acquire);
            if held + reserved + link_config().pinned_per_connection() > cap {
                return Err(Short::Pinned);
            }
        }
        if let Some(cap) = mappings_cap() {
            let reserved = RESERVED_MAPS.load(Ordering::Acquire);
            if rdmashim_core::mappings() + reserved + t.mappings_per_link() > cap {
                return Err(Short::Mappings);
            }
        }
        Ok(())
    }

    /// Why one more connection may not be set up, for the log.
    fn short(&self, short: Short) -> String {
        match short {
            Short::Pinned => format!(
                "its rings would take the process's pinned memory past {} ({} registered, {} idle in the pool, {} being set up)",
                crate::settings::PINNED_MIB.name,
                rdmashim_core::registered_bytes(),
                rdmashim_core::pool::pooled().1,
                RESERVED.load(Ordering::Acquire)
            ),
            Short::Mappings => format!(
                "its rings would take the process's memory mappings past the shim's share, half of vm.max_map_count ({} held, {} being set up, {} allowed)",
                rdmashim_core::mappings(),
                RESERVED_MAPS.load(Ordering::Acquire),
                mappings_cap().unwrap_or(0)
            ),
        }
    }

    /// Runs `job` on the setup thread (or here, if that thread cannot be started).
    fn hand_over(&mut self, job: Job) {
        let Some(e) = engine() else { return };
        if let Err(job) = e.submit(job) {
            let done = run_job(job);
            self.finish(done);
        }
    }

    /// Takes up the setup thread's finished work.
    fn finished(&mut self) {
        let Some(e) = engine() else { return };
        for d in e.take_done() {
            self.finish(d);
        }
    }

    /// A connection's setup job ended. Unless it was decided meanwhile (still in
    /// [`Phase::Setup`]; else dropping the link undoes it on both ends), its link is watched.
    fn finish(&mut self, done: Done) {
        self.stale = true;
        match done {
            Done::Dialed(c, d, built) => {
                let mut g = c.lock();
                if !matches!(g.phase, Phase::Setup) {
                    return; // (decided meanwhile: dropping the dialer withdraws its request)
                }
                g.phase = Phase::Dialing(d);
                match built {
                    Ok(()) => {
                        drop(g);
                        // (events that came meanwhile: the reply may be there already)
                        self.dial_event(c.slot);
                    }
                    Err(DialError::Local(_)) if g.closed => {
                        c.fall_back(&mut g, FallbackReason::ClosedEarly)
                    }
                    Err(e) => self.dial_status(&c, &mut g, DialStatus::Failed(e)),
                }
            }
            Done::Accepted(c, accepted) => {
                let mut g = c.lock();
                if !matches!(g.phase, Phase::Setup) {
                    return;
                }
                match accepted {
                    Ok(mut link) => {
                        if g.closed && !g.give_back {
                            // Closed while its request was answered: dropping the link
                            // disconnects the client, which stays on TCP too. (Unless a
                            // fork child may go on with the socket: `Inner::give_back`.)
                            c.fall_back(&mut g, c.closed_reason());
                            return;
                        }
                        catch_up(&mut link, g.tcp_received);
                        self.watch(&c, &mut g, link, libc::EPOLL_CTL_ADD);
                    }
                    Err(_) if g.closed => c.fall_back(&mut g, c.closed_reason()),
                    // (the client's end of a same-host rendezvous is gone: its application
                    // closed the connection during the handshake)
                    Err(e) if rdmashim_core::rendezvous::peer_gone(&e) => {
                        c.fall_back_unsure(&mut g, FallbackReason::ClosedEarly)
                    }
                    Err(e) => {
                        // The client may have given up already (its application closed the
                        // connection, which destroyed its rdma_cm id; the request is then
                        // gone: EINVAL): then the connection simply ended early.
                        shim_log!(Level::Info, "accept upgrade from {}: {e}", c.peer);
                        let reason = if rdmashim_core::error::is_memlock(&e) {
                            FallbackReason::Memlock
                        } else {
                            FallbackReason::Resources
                        };
                        c.fall_back_unsure(&mut g, reason);
                    }
                }
            }
        }
    }

    /// Makes `link` the connection's, registers its rdma_cm channel (`cm_op`: ADD, or MOD for
    /// a dial's channel already in the set) and its completion channel, arms its CQ and drives
    /// it once.
    fn watch(&self, c: &Conn, g: &mut Inner, link: Link, cm_op: c_int) {
        let _ = net::epoll_ctl(
            self.epfd,
            cm_op,
            link.cm_fd(),
            libc::EPOLLIN as u32,
            token(CM, c.slot),
        );
        // The completion channel goes to the application's epoll sets that hold the
        // connection, if any (`ready::epoll_ctl`), else to the engine's, edge-triggered: an
        // event the engine leaves to a blocked application thread (see `comp_event`) must
        // not wake it again and again.
        if let Some(a) = link.arrivals() {
            let _ = c.arrivals.set(a);
        }
        if super::ready::link_up(c, link.comp_fd()) {
            g.comp_unwatched = true;
        } else {
            let _ = net::epoll_ctl(
                self.epfd,
                libc::EPOLL_CTL_ADD,
                link.comp_fd(),
                (libc::EPOLLIN | libc::EPOLLET) as u32,
                token(COMP, c.slot),
            );
        }
        // With failover, bytes on the socket while the peer's stream is on the ring are its
        // continuation: the path failed on its side, and this side's queue pair, idle, may
        // never hear of it. Watched edge-triggered: nothing arrives there in steady state.
        if link.conn().fails_over() {
            if let Some(fd) = c.back_fd(g) {
                let _ = net::epoll_ctl(
                    self.epfd,
                    libc::EPOLL_CTL_ADD,
                    fd,
                    (libc::EPOLLIN | libc::EPOLLET) as u32,
                    token(TCPW, c.slot),
                );
            }
        }
        let mut link = Box::new(link);
        // The engine reads the rdma_cm channel whenever it is readable (`cm_event`), and
        // decides when the handshake is past its deadline (`State::handshake_deadline`).
        link.set_cm_watched();
        link.own_handshake_deadline();
        link.arm();
        g.phase = Phase::Linked(link);
        c.drive(g, true);
        super::ready::after_change(c, g);
        crate::fault::pass(crate::fault::Point::EngineLink);
    }

    fn requests(&mut self, id: u32) {
        let Some(e) = engine() else { return };
        let l = e
            .listeners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .by_id
            .get(&id)
            .map(|e| e.l.clone());
        let Some(l) = l else { return };
        loop {
            let inc = match l.next() {
                Ok(Some(i)) => i,
                Ok(None) | Err(_) => return,
            };
            let Some(src) = inc.source() else {
                inc.reject(RejectReason::NoMatchingTcp);
                continue;
            };
            let key = TupleKey {
                peer_ip: net::canonical_ip(src.ip()),
                peer_port: inc.request().client_port,
                local_port: inc.request().server_port,
            };
            match self.matcher.on_request(key, inc, Instant::now()) {
                RequestOutcome::Matched { req, conn } => self.accept(req, conn),
                RequestOutcome::Pending => {}
                RequestOutcome::Duplicate(i) => i.reject(RejectReason::Duplicate),
                RequestOutcome::Full(i) => i.reject(RejectReason::Resources),
            }
        }
    }

    /// A connect request matched connection `c`: the setup thread answers it (see [`Job`]) if
    /// it proves the binding — its tag verifies under the key of the token this side wrote on
    /// the connection. One that does not (a forger's, or one for a connection that got no
    /// token) is rejected `Unproven` and counted, and the connection waits on for the real
    /// request (the next pending one is offered at once).
    fn accept(&mut self, inc: Request, c: Arc<Conn>) {
        // (over the connection's own transport only: a same-host connection's request comes
        // through the rendezvous socket, a remote one's through rdma_cm)
        let proven = inc.transport() == c.transport
            && c.bound
                .is_some_and(|(key, tuple)| inc.request().proves(&Proof::Bound { key, tuple }));
        if !proven {
            stats::count_unproven_request();
            shim_log!(
                Level::Info,
                "server {} <- {}: a request for this connection from {:?} could not prove it holds it; rejected",
                c.local,
                c.peer,
                inc.source()
            );
            inc.reject(RejectReason::Unproven);
            let key = self.conns.get(&c.slot).and_then(|t| t.key);
            let waiting = !c.lock().closed;
            if let (Some(key), true) = (key, waiting) {
                if let Some((next, c)) = self.matcher.on_accepted(key, c, Instant::now()) {
                    self.accept(next, c);
                }
            }
            return;
        }
        let mut g = c.lock();
        let offered = c.offered.load(Ordering::Acquire);
        if !matches!(g.phase, Phase::Awaiting) || (g.closed && !offered) {
            inc.reject(RejectReason::NoMatchingTcp);
            return;
        }
        if let Some(r) = crate::probe::host_reason() {
            // (RDMA ended for the process meanwhile: io_uring found, a sandbox)
            c.fall_back(&mut g, r);
            inc.reject(RejectReason::Disabled);
            return;
        }
        if offered {
            // (offered to a fork child: decided by `offers`, once this process closed it and a
            // child took it over, or not)
            drop(g);
            self.held.push((inc, c, Instant::now() + OFFER_HOLD));
            self.offers();
            return;
        }
        if let Err(short) = self.reserve_link(c.transport) {
            shim_log!(
                Level::Info,
                "server {} <- {}: {}",
                c.local,
                c.peer,
                self.short(short)
            );
            c.fall_back(&mut g, FallbackReason::Resources);
            inc.reject(RejectReason::Resources);
            return;
        }
        g.phase = Phase::Setup;
        let tcp_received = g.tcp_received;
        drop(g);
        self.hand_over(Job::Accept(Box::new(inc), c, tcp_received, Instant::now()));
    }

    /// Requests held for connections this process offered to a fork child (see
    /// [`super::adopt`]): redirected to the child that took one over once this process closed
    /// it, rejected once it stays TCP (used here, withdrawn, or not taken within
    /// [`OFFER_HOLD`]).
    fn offers(&mut self) {
        if self.held.is_empty() {
            return;
        }
        let now = Instant::now();
        let held = std::mem::take(&mut self.held);
        for (inc, c, until) in held {
            let mut g = c.lock();
            let follows = inc.request().flags.contains(Flags::REDIRECT);
            let verdict = if matches!(g.phase, Phase::Awaiting) {
                adopt::verdict(&c, g.closed, follows, now >= until)
            } else {
                adopt::Verdict::Refuse
            };
            match verdict {
                adopt::Verdict::Wait => {
                    drop(g);
                    self.held.push((inc, c, until));
                }
                adopt::Verdict::Redirect(port) => {
                    inc.reject(RejectReason::Redirect(port));
                    c.fall_back(&mut g, FallbackReason::HandedToChild);
                }
                adopt::Verdict::Refuse => {
                    inc.reject(RejectReason::NoMatchingTcp);
                    if matches!(g.phase, Phase::Awaiting) {
                        c.fall_back(&mut g, FallbackReason::Forked);
                    }
                }
            }
        }
    }

    fn comp_event(&mut self, slot: u64) {
        let Some(t) = self.conns.get(&slot) else {
            return;
        };
        let c = t.conn.clone();
        if c.sleepers.load(Ordering::SeqCst) > 0 {
            // A blocked application thread waits on this channel itself and takes the event
            // (it re-checks the channel after it stops waiting, so none is lost).
            return;
        }
        c.on_completions(&mut c.lock());
    }

    fn cm_event(&mut self, slot: u64) {
        let Some(t) = self.conns.get(&slot) else {
            return;
        };
        let c = t.conn.clone();
        let mut g = c.lock();
        c.drive(&mut g, true);
        super::ready::after_change(&c, &mut g);
    }

    /// The socket of an upgraded connection became readable (see [`TCPW`]): the peer's
    /// failover continuation, or the kernel's end of the TCP connection
    /// ([`Conn::look_under_ring`]).
    fn tcp_data(&mut self, slot: u64) {
        let Some(t) = self.conns.get(&slot) else {
            return;
        };
        let c = t.conn.clone();
        let mut g = c.lock();
        let Some(fd) = g.back_sock else {
            return;
        };
        c.look_under_ring(&mut g, fd);
        c.settle(&mut g);
        // (once failed over: the peer's record and repeats, whether or not the application
        // still reads — see `Conn::take_control`; edge-triggered, so read until none is there)
        let _ = c.take_control(&mut g, fd);
        super::ready::after_change(&c, &mut g);
    }

    /// The peer's FIN or RST on the socket of a connection the application closed.
    fn sock_event(&mut self, slot: u64) {
        let Some(t) = self.conns.get(&slot) else {
            return;
        };
        let Some((Some(fd), _)) = t.closing else {
            return;
        };
        let c = t.conn.clone();
        let mut g = c.lock();
        // After a path failure, the peer's record and repeats come first (the shim's to read:
        // `Conn::take_control`); while more of them is due, the socket is watched for data too.
        let due = matches!(c.take_control(&mut g, fd), Ok(true));
        let rev = net::poll_now(fd, libc::POLLIN | libc::POLLRDHUP);
        if rev & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) == 0 {
            let _ = net::epoll_ctl(
                self.epfd,
                libc::EPOLL_CTL_MOD,
                fd,
                sock_events(due),
                token(SOCK, c.slot),
            );
            return;
        }
        let _ = net::epoll_ctl(self.epfd, libc::EPOLL_CTL_DEL, fd, 0, 0);
        if let Phase::Linked(l) = &mut g.phase {
            l.progress(true);
            if rev & libc::POLLERR != 0 {
                l.conn_mut().handle_tcp_reset();
            } else {
                let _ = l.conn_mut().handle_tcp_eof();
            }
        }
        c.drive(&mut g, false);
    }

    fn on_closed(&mut self, c: Arc<Conn>, sock: Option<c_int>) {
        // (seconds away: the coarse clock, no system call per connection)
        let deadline = net::coarse_instant() + link_config().close_timeout + Duration::from_secs(1);
        let t = self
            .conns
            .entry(c.slot)
            .or_insert_with(|| Tracked::new(c.clone()));
        t.closing = Some((sock, deadline));
        let probe = t.probe;
        {
            let mut g = c.lock();
            self.end_token_watch(&mut g);
            if g.pending.is_some() {
                // Closed while its TCP connect was in progress: a connection if the connect
                // had succeeded (closed before its upgrade), else none.
                let connected = super::pending_outcome(&g) == Some(true);
                self.end_pending(&mut g);
                if connected {
                    c.fall_back(&mut g, FallbackReason::ClosedEarly);
                } else {
                    c.abandon(&mut g);
                }
            }
            // Closed before its dial started: it never will (unless it probes its host).
            if matches!(g.phase, Phase::Queued) && !probe {
                c.fall_back(&mut g, FallbackReason::ClosedEarly);
            }
            // (a dial under way goes on: its outcome is the connection's reason, and teaches
            // the negative cache about the peer; see `dial_event`)
            c.decide(&mut g, true);
            // The teardown is the engine's now: it needs the completions' events.
            c.ensure_armed(&mut g);
        }
        let Some(t) = self.conns.get_mut(&c.slot) else {
            return;
        };
        if let Some(fd) = sock {
            let due =
                matches!(&c.lock().phase, Phase::Linked(l) if l.conn().control_due().is_some());
            let _ = net::epoll_ctl(
                self.epfd,
                libc::EPOLL_CTL_ADD,
                fd,
                sock_events(due),
                token(SOCK, c.slot),
            );
        }
        if let Some(key) = t.key {
            if let Some(conn) = self
                .matcher
                // (one offered to a fork child waits on: its request may be the child's)
                .forget_accepted_if(&key, |w| {
                    Arc::ptr_eq(w, &c) && !c.offered.load(Ordering::Acquire)
                })
            {
                let mut g = conn.lock();
                if matches!(g.phase, Phase::Awaiting) {
                    conn.fall_back(&mut g, no_request_reason());
                }
            }
        }
    }

    /// [`super::check_io_uring`], next due after [`SOCKET_CHECK`] or, where the look is costly
    /// (a process of many descriptors: about 1 µs each), after 1000 times the CPU time it
    /// took, so that it never takes more than a thousandth of the engine's time. (CPU time,
    /// not the clock's: a look preempted for a few milliseconds on a loaded or emulated host
    /// once put the next look seconds away, and an io_uring instance set up meanwhile went
    /// unseen that long.)
    fn look_for_io_uring(&mut self, now: Instant) {
        let cpu = net::thread_cpu_time();
        super::check_io_uring();
        let cost = net::thread_cpu_time().saturating_sub(cpu);
        self.uring_at = now + SOCKET_CHECK.max(cost * 1000);
    }

    fn timers(&mut self) {
        let now = Instant::now();
        if now >= self.sockets_at {
            self.sockets_at = now + SOCKET_CHECK;
            if !self.conns.is_empty() {
                super::check_sockets();
                self.watch_acks(now);
                super::publish_live();
                // (and a look at every connection's timers below: a link's timer may have been
                // set by an application thread since the last look — a grown ring's idle watch
                // starts in whichever thread drives the move that grew it — and no event of
                // the engine's would bring it to the engine's notice)
                self.stale = true;
            } else if crate::live::dirty() {
                super::publish_live();
            }
        }
        // (a timer of its own: its interval grows with its cost, see `look_for_io_uring`)
        if !self.conns.is_empty() && now >= self.uring_at {
            self.look_for_io_uring(now);
        }
        if !self.delayed.is_empty() {
            let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.delayed)
                .into_iter()
                .partition(|(t, _)| *t <= now);
            self.delayed = later;
            for (_, c) in due {
                self.dial_now(&c);
            }
        }
        for ex in self.matcher.expire(now) {
            match ex {
                Expired::Request(_, inc) => inc.reject(RejectReason::NoMatchingTcp),
                Expired::Accepted(_, c) => {
                    let mut g = c.lock();
                    if matches!(g.phase, Phase::Awaiting) {
                        c.fall_back(&mut g, no_request_reason());
                    }
                }
            }
        }
        if super::UNARMED.load(Ordering::SeqCst) > 0 {
            // CQs an application thread left unarmed and did not come back to: completions
            // (the peer's data, the credits a blocked send waits for) must raise events again.
            let ms = net::coarse_ms();
            let mut look = Look::default();
            for t in self.conns.values_mut() {
                let c = &t.conn;
                // (a connection whose lock is taken is in use: not left alone; next round)
                let Some(mut g) = c.try_lock() else { continue };
                let stale = g
                    .unarmed
                    .is_some_and(|at| ms >= at + UNARMED_MAX.as_millis() as u64);
                // (nor one that had data calls since the last look: its threads poll the CQ
                // themselves, and arm it before they wait on it)
                let uses = c.uses.load(Ordering::Relaxed);
                let idle = std::mem::replace(&mut t.uses_seen, uses) == uses;
                if stale && idle && c.sleepers.load(Ordering::SeqCst) == 0 {
                    c.on_completions(&mut g);
                    look.armed += 1;
                } else if stale && !idle && c.readiness_watched() {
                    look.watched += 1;
                } else if stale && !idle {
                    look.busy += 1;
                }
            }
            // (fewer looks while they find the connections still in use: each one wakes this
            // thread, and on a pinned process's CPU preempts the thread that keeps them busy)
            super::UNARMED_CADENCE.looked(look);
        }
        // Every connection looked at (each one's lock taken): when the earliest timer of the
        // last look is due, or events came since it, at most every SCAN_EVERY — not at every
        // wake, which under a burst of thousands of connections came thousands of times a
        // second and took every connection's lock twice (issue 28).
        let due_now = self.conn_next.is_some_and(|d| d <= now);
        if now >= self.next_scan()
            && (due_now || (self.stale && now >= self.scanned_at + SCAN_EVERY))
        {
            let t0 = Instant::now();
            self.scan(now);
            self.scan_cost = t0.elapsed();
        }
    }

    /// The earliest the next look at every connection may come: the looks take at most a
    /// fifth of the engine's time. With ten thousand connections one look takes milliseconds
    /// (tens under emulation) and, each dial having its deadline, one timer or another is
    /// always due: looks back to back would leave the events — the resolutions, answers and
    /// establishments the dials wait for — queued. A timer is acted on that much later at
    /// worst (a fraction of a millisecond with a few hundred connections).
    fn next_scan(&self) -> Instant {
        self.scanned_at + self.scan_cost * 4
    }

    /// One look at every tracked connection: acts on the timers that are due, forgets the
    /// connections that are done ([`Self::reap`]), and notes the earliest timer left.
    fn scan(&mut self, now: Instant) {
        self.stale = false;
        self.scanned_at = now;
        let mut next: Option<Instant> = None;
        let mut due = Vec::new();
        for (slot, t) in self.conns.iter_mut() {
            // (one in use: its timer unread, looked at again at the next look)
            let d = match look(&t.conn, &mut t.busy_since, now) {
                Some(g) => phase_timer(&g),
                None => Some(now + SCAN_EVERY),
            };
            if d.is_some_and(|d| d <= now) {
                due.push(*slot);
                continue;
            }
            let d = match (d, t.closing) {
                (a, Some((_, b))) => Some(a.map_or(b, |a| a.min(b))),
                (a, None) => a,
            };
            if let Some(d) = d {
                next = Some(next.map_or(d, |n| n.min(d)));
            }
        }
        self.conn_next = next;
        // (those acted on have new timers: looked at again within SCAN_EVERY)
        self.stale |= !due.is_empty();
        for slot in due {
            let Some(t) = self.conns.get(&slot) else {
                continue;
            };
            let (c, since) = (t.conn.clone(), t.since);
            let dialing = matches!(c.lock().phase, Phase::Dialing(_));
            let unsure = c.lock().unsure.is_some();
            if unsure {
                c.decide(&mut c.lock(), false);
            } else if dialing {
                self.dial_event(slot);
            } else {
                let mut g = c.lock();
                self.handshake_deadline(&c, &mut g, since, now);
                c.watch_acks(&mut g, now);
                c.check_idle(&mut g, now);
                c.drive(&mut g, true);
                super::ready::after_change(&c, &mut g);
            }
        }
        self.reap();
    }

    /// TCP_USER_TIMEOUT on the ring, for every upgraded connection ([`Conn::watch_acks`]).
    fn watch_acks(&mut self, now: Instant) {
        for t in self.conns.values_mut() {
            let c = &t.conn;
            // (one in use is watched at the next check)
            let Some(mut g) = look(c, &mut t.busy_since, now) else {
                continue;
            };
            if c.watch_acks(&mut g, now) {
                super::ready::after_change(c, &mut g);
            }
        }
    }

    /// Forgets connections that are done: closed by the application and either never linked
    /// or torn down (or past their close deadline).
    fn reap(&mut self) {
        let now = Instant::now();
        // (slot, whether to forget it entirely or only stop tracking it)
        let ended: Vec<(u64, bool)> = self
            .conns
            .iter()
            .filter_map(|(slot, t)| {
                // (one in use is not done: looked at again at the next look)
                let g = t.conn.try_lock()?;
                match t.closing {
                    // Closed by the application: done once torn down (or past its deadline).
                    Some((_, deadline)) => {
                        let live = match &g.phase {
                            // (and a switch back's continuation written first)
                            // (and, after a path failure, the peer's record and repeats read)
                            Phase::Linked(l) => {
                                !l.is_disconnected()
                                    || l.conn().resume_due().is_some()
                                    || l.conn().control_due().is_some()
                            }
                            // (a dial goes on after close; it ends by its own deadline)
                            Phase::Dialing(_) | Phase::Queued => g.closed,
                            // (the setup thread's job comes back)
                            Phase::Setup => true,
                            // (offered to a fork child: until its request is decided)
                            Phase::Awaiting => t.conn.offered.load(Ordering::Acquire),
                            _ => false,
                        };
                        (!live || now >= deadline).then_some((*slot, true))
                    }
                    // Fell back and still open: needs no engine (closing it later needs nothing
                    // from the engine either).
                    None => (matches!(g.phase, Phase::Fallen) && g.unsure.is_none())
                        .then_some((*slot, false)),
                }
            })
            .collect();
        for (slot, forget) in ended {
            if let Some(t) = self.conns.remove(&slot) {
                if forget {
                    self.forget(t);
                }
            }
        }
    }

    /// The engine stops for good ([`halt`]), while the transport's descriptors are still the
    /// shim's: each connection the application closed whose ring is still being torn down is
    /// aborted (its peer reads ECONNRESET; the caller gave it time to finish first), and every
    /// connection is forgotten as at the end of its close (its link destroyed, the private
    /// duplicate of its socket closed); queued commands and jobs are dropped, connect requests
    /// rejected. Nothing is left that calls the transport afterwards.
    fn halt(mut self) {
        let Some(e) = engine_even_halted() else {
            return;
        };
        drop(std::mem::take(
            &mut *e.setup.jobs.lock().unwrap_or_else(|p| p.into_inner()),
        ));
        drop(std::mem::take(
            &mut *e.cmds.lock().unwrap_or_else(|p| p.into_inner()),
        ));
        drop(std::mem::take(
            &mut *e.setup.done.lock().unwrap_or_else(|p| p.into_inner()),
        ));
        let slots: Vec<u64> = self.conns.keys().copied().collect();
        for slot in slots {
            let Some(t) = self.conns.remove(&slot) else {
                continue;
            };
            if t.closing.is_none() {
                // (the application's: back on TCP already, or reset: `close_for_replaced_fd`)
                continue;
            }
            if let Phase::Linked(l) = &mut t.conn.lock().phase {
                if !l.is_disconnected() {
                    l.conn_mut().abort();
                    l.progress(false);
                }
            }
            self.forget(t);
        }
    }

    fn forget(&mut self, t: Tracked) {
        let c = t.conn;
        {
            let mut g = c.lock();
            self.end_pending(&mut g);
            self.end_token_watch(&mut g);
            if let Phase::Dialing(_) | Phase::Queued | Phase::Setup = g.phase {
                c.fall_back(
                    &mut g,
                    fallback_reason(rdmashim_proto::ErrorReason::TcpClosed),
                );
            }
            if let Phase::Awaiting = g.phase {
                // (normally decided when it was closed; never left uncounted)
                c.fall_back(&mut g, no_request_reason());
            }
            if let Phase::Linked(l) = &g.phase {
                if !l.is_disconnected() {
                    shim_log!(
                        Level::Info,
                        "{} -> {}: ring not drained within the close timeout; torn down",
                        c.local,
                        c.peer
                    );
                }
                // Dropping the link destroys the QP and closes its channels (which leaves
                // the epoll set with them).
                c.armed(&mut g);
                g.phase = Phase::Fallen;
            }
        }
        if let Some((Some(fd), _)) = t.closing {
            let _ = net::epoll_ctl(self.epfd, libc::EPOLL_CTL_DEL, fd, 0, 0);
            net::close(fd);
        }
        if let Some(w) = super::world_if_created() {
            w.remove(c.slot);
        }
    }
}
