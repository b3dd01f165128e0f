//! One ring connection driven by its owner, without blocking ([`Link`]), and the non-blocking
//! rdma_cm set-up that makes one: [`Dialer`] on the client, [`UpgradeListener`] and
//! [`Incoming`] on the server.
//!
//! A [`Link`] is the sans-IO [`Connection`] of `rdmashim-proto` plus the verbs resources of
//! `endpoint` (private). It never blocks and never waits: its owner drives it, either the preload
//! shim (its event loop, and application threads holding the connection's lock) or a
//! [`Stream`](crate::Stream), which is a `Link` plus blocking calls. The obligations are those
//! of `rdmashim_proto::conn`, split like this:
//!
//! - **The owner talks to the core.** It sends with [`Link::send`] and copies the granted
//!   bytes in with [`Link::stage`]; it reads what `conn().recv()` points at with [`Link::ring`]
//!   and reports it with [`Link::consume`]; it calls `commit_switch`, `note_tcp_read`,
//!   `shutdown_write`, `close`, … on [`Link::conn_mut`] itself. After any of these, it calls
//!   [`Link::progress`] so that the resulting actions are posted.
//! - **[`Link::progress`] is the driving loop**, one non-blocking pass:
//!   1. poll the CQ dry, in order: send completions retire send-queue entries; each receive
//!      completion goes to [`Connection::handle_completion`], and its receive is re-posted
//!      before the credit that returns it is (protocol §5.2), in one batch;
//!   2. read the link's own rdma_cm event channel (at most once per millisecond unless told
//!      to; the CQ is polled dry again before each event): ESTABLISHED completes a server's
//!      handshake, DISCONNECTED and other errors become
//!      [`Connection::handle_transport_error`];
//!   3. expire the handshake deadline;
//!   4. perform the core's actions in order while the send queue has room (an action that could
//!      not be posted stays in the core) — unless the last pass ended with nothing to do and
//!      the core was changed since only by completions and consumes it called inert
//!      (`Connection::take_stirred`; the pass would find nothing again);
//!   5. after `Teardown`: wait until the posted work requests completed (a signaled fence makes
//!      that observable; bounded by [`StreamConfig::close_timeout`]), then `rdma_disconnect`.
//! - **Sleeping is the owner's.** Before it sleeps it calls [`Link::arm`], then
//!   [`Link::progress`] once more (a completion between the last poll and the arm raises no
//!   event); if that saw nothing, it waits for [`Link::comp_fd`] or [`Link::cm_fd`] to become
//!   readable or [`Link::next_timer`] to pass. After waking it calls [`Link::take_events`] and
//!   [`Link::progress`] (with `force_cm` when the rdma_cm fd was readable).
//! - **Resources go when the wire is done.** Once [`Link::is_disconnected`], dropping the link
//!   frees the queue pair and both rings. Dropping it earlier destroys the queue pair at once:
//!   the peer sees its connection fail. A close that cannot finish (the peer takes no data) is
//!   cut short with [`Link::disconnect`].
//!
//! A link is `Send` but not shared: every call takes `&mut self` or runs under the owner's lock.
//!
//! Set-up: the client's [`Dialer`] resolves the address and route, builds the endpoint and
//! sends the `ConnectRequest` with `rdma_connect`, all on events of its own channel, and turns
//! into an established [`Link`] on that same channel. The server's [`UpgradeListener`] hands out
//! each decodable request as an [`Incoming`], which the caller matches (to a TCP connection,
//! for the shim) and then accepts or rejects.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdmashim_proto::{
    Action, Completion, Config, ConfigError, ConnectRequest, Connection, ErrorReason, Imm, Kind,
    LaneWrite, Proof, Reject, RejectReason, RingSize, SendError, SendGrant,
};

use crate::cm::{event_type as et, CmId, ConnParam, Event, EventChannel, MAX_READS};
use crate::endpoint::{Endpoint, EndpointSizes, SEND_TAG};
use crate::error::{Error, Unavailable};
use crate::pull::{Arrival, Pull, Pulls};
use crate::shm::{ShmEndpoint, SockEvent};
use crate::sys::{self, ffi};
use crate::tick;
use crate::verbs::{self, wc_imm_data};

/// Tunables of a ring connection. `Default` gives sensible values for a LAN.
#[derive(Debug, Clone, Copy)]
pub struct StreamConfig {
    /// Receive ring size in bytes: a power of two from 4 KiB to 8 MiB (default 1 MiB).
    pub ring_size: usize,
    /// Receives posted per connection (≥ 4; default 64).
    pub recv_slots: u16,
    /// Send queue depth (≥ 8; default 128).
    pub sq_depth: u32,
    /// Inline size to ask the device for (default 64; control messages fit in 16; with
    /// records at least [`RECORDS_INLINE`]).
    pub max_inline: u32,
    /// Post the receives to a shared receive queue (`ibv_create_srq`) instead of the queue
    /// pair's own (default false): the receiving side of the SRQ kind, a local choice the peer
    /// does not see, with either connection kind. The queue is on the connection's own PD
    /// (crate::pool: a PD per connection), so it serves that connection alone.
    pub srq: bool,
    /// How long a blocking call busy-polls the CQ before it sleeps (default 30 µs).
    pub spin: Duration,
    /// Deadline of address/route resolution and of the handshake (default 5 s).
    pub connect_timeout: Duration,
    /// How long a close waits for queued data and outstanding work requests (default 3 s).
    pub close_timeout: Duration,
    /// The local ACK timeout of the connection's queue pair, as an exponent (a try lasts
    /// 4.096 µs × 2^n; the queue pair fails after seven): 0 (the default) leaves rdma_cm's
    /// (the path's packet lifetime + 1: on RoCE 17 or 19 by kernel, 0.5 s or 2.1 s a try) on
    /// a NIC, and gives [`SOFTWARE_ACK_TIMEOUT`] on a software device.
    pub ack_timeout: u8,
    /// With ring moves (`protocol.ring_moves`): how long a receive ring grown past
    /// `ring_size` may go without a byte arriving or being read before this side offers its
    /// peer a ring of `ring_size` again and gives the larger one back (protocol §6.4: a move
    /// goes either way). Looked at by the owner ([`Link::check_idle`]; a [`Stream`] does so
    /// while one of its calls waits). `None` (the default): a grown ring stays.
    ///
    /// [`Stream`]: crate::Stream
    pub ring_idle: Option<Duration>,
    /// Protocol tunables (credit thresholds, largest write, the connection kind, …). The
    /// default asks for duplex ([`Kind::Duplex`], protocol §17: credits ride on the other
    /// direction's DATA; docs/bench/kinds.md argues it), which a peer asking for another kind
    /// turns into WRITE WITH IMMEDIATE, the kind every side speaks.
    ///
    /// [`Kind::Duplex`]: rdmashim_proto::Kind::Duplex
    pub protocol: Config,
}

/// The ACK timeout exponent to give a queue pair on a device that is software or not, by the
/// setting `ack_timeout` ([`StreamConfig::ack_timeout`]); `None`: rdma_cm's.
fn ack_timeout_for(ack_timeout: u8, software: bool) -> Option<u8> {
    match ack_timeout {
        0 if software => Some(SOFTWARE_ACK_TIMEOUT),
        0 => None,
        n => Some(n.min(31)),
    }
}

/// Sets the ACK timeout [`ack_timeout_for`] gives on the endpoint's queue pair, before its
/// `rdma_connect` or `rdma_accept`. A kernel that does not know the option (before Linux 4.17)
/// keeps rdma_cm's: the connection is as good as without it.
fn apply_ack_timeout(ep: &Endpoint, ack_timeout: u8) {
    if let Some(t) = ack_timeout_for(ack_timeout, ep.software_device()) {
        let _ = ep.id.set_ack_timeout(t);
    }
}

/// The ACK timeout exponent a queue pair on a software device gets by default: 20, 4.3 s a
/// try, 30 s before the queue pair fails (rdma_cm's: 2.1 s, 15 s, on the VM's kernel). A
/// software device acknowledges from the host's CPU, and one carrying a burst of ten thousand
/// connections' set-ups and first bytes (soft-RoCE, under emulation) left writes
/// unacknowledged through all of rdma_cm's tries; a queue pair that fails before its peer
/// confirmed our switch-over cannot fail over, and its connection is reset (protocol 8.6).
/// With 20 (and with 22) the same burst reset none. The price: a dead path is found later on
/// such a device, when the application has not set `TCP_USER_TIMEOUT` (which bounds it
/// whatever this is, see `Link::check_acks`). A NIC acknowledges in its own hardware, in
/// microseconds however loaded its host is, and keeps rdma_cm's.
pub const SOFTWARE_ACK_TIMEOUT: u8 = 20;

/// The inline size a link that offers records asks for at least: a record adds 16 to 23 bytes
/// of framing to its payload (protocol §14), so the 64 bytes of [`StreamConfig::max_inline`]'s
/// default would leave a 64-byte write's record (80 bytes) out. Under soft-RoCE a write that
/// is not inline costs its copy from the registered memory: 64-byte ping-pongs over records
/// took 17.4 µs one way with 64 and 16.7 µs with 128 (median of three runs each, one VM run).
pub const RECORDS_INLINE: u32 = 128;

impl Default for StreamConfig {
    fn default() -> Self {
        Self {
            ring_size: 1 << 20,
            recv_slots: 64,
            sq_depth: 128,
            max_inline: 64,
            srq: false,
            spin: Duration::from_micros(30),
            connect_timeout: Duration::from_secs(5),
            close_timeout: Duration::from_secs(3),
            ack_timeout: 0,
            ring_idle: None,
            protocol: Config {
                kind: rdmashim_proto::Kind::Duplex,
                ..Config::default()
            },
        }
    }
}

impl StreamConfig {
    /// The memory one connection of this configuration registers (and the kernel pins): its
    /// receive ring and its send staging ring (the peer's size, taken to be this one), each
    /// registered over both views of its double mapping, and its receive and control-send
    /// buffers in whole pages (crate::pool's `Kit`).
    pub fn pinned_per_connection(&self) -> usize {
        let page = verbs::page_size();
        let pages = |n: usize| n.div_ceil(page) * page;
        2 * 2 * self.ring_size
            + pages(usize::from(self.recv_slots) * self.recv_buf())
            + pages(self.sq_depth as usize * rdmashim_proto::MAX_CONTROL_LEN)
    }

    /// Bytes of each receive's buffer: a control message's, or with the sends kind a DATA's
    /// (protocol §15).
    fn recv_buf(&self) -> usize {
        if self.protocol.kind == Kind::Sends {
            rdmashim_proto::SENDS_BUF
        } else {
            rdmashim_proto::MAX_CONTROL_LEN
        }
    }

    /// How a link of this configuration gives a grown ring back, if it does.
    fn shrink(&self) -> Option<Shrink> {
        let to = RingSize::new(self.ring_size as u64).ok()?;
        let after = self.ring_idle.filter(|_| self.protocol.ring_moves)?;
        Some(Shrink {
            to,
            after,
            watch: None,
        })
    }

    pub(crate) fn sizes(&self) -> io::Result<EndpointSizes> {
        if RingSize::new(self.ring_size as u64).is_err() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "ring size {} is not a power of two from 4 KiB to 8 MiB",
                    self.ring_size
                ),
            ));
        }
        if self.recv_slots < rdmashim_proto::MIN_RECV_SLOTS || self.sq_depth < 8 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "recv_slots must be at least 4 and sq_depth at least 8",
            ));
        }
        Ok(EndpointSizes {
            ring_size: self.ring_size,
            recv_slots: self.recv_slots,
            // (a link that offers sends takes its peer's DATA into its receives)
            recv_buf: self.recv_buf(),
            sq_depth: self.sq_depth,
            // (a link that offers records asks for room for a 64-byte write's record inline)
            max_inline: if self.protocol.kind == Kind::Records {
                self.max_inline.max(RECORDS_INLINE)
            } else {
                self.max_inline
            },
            zero_rx: self.protocol.kind == Kind::Records,
            srq: self.srq,
        })
    }
}

/// Fails cleanly (an [`Unavailable`] error, kind `Unsupported`) on a host without rdma-core or
/// without an RDMA device. A positive answer is remembered.
pub(crate) fn check_available() -> Result<(), Error> {
    static AVAILABLE: AtomicBool = AtomicBool::new(false);
    if AVAILABLE.load(Ordering::Relaxed) {
        return Ok(());
    }
    sys::lib().map_err(|e| Unavailable::LibrariesMissing(e.clone()))?;
    if verbs::device_names()?.is_empty() {
        return Err(Unavailable::NoDevice.into());
    }
    AVAILABLE.store(true, Ordering::Relaxed);
    Ok(())
}

pub(crate) fn nonce() -> u64 {
    // RandomState is seeded from the OS's random source (and varied per instance).
    let mut h = RandomState::new().build_hasher();
    h.write_u64(Instant::now().elapsed().as_nanos() as u64);
    h.finish()
}

pub(crate) fn err(kind: io::ErrorKind, msg: impl Into<String>) -> io::Error {
    io::Error::new(kind, msg.into())
}

/// A `poll(2)` timeout in whole milliseconds, rounded up (at least 1).
pub(crate) fn poll_ms(t: Duration) -> i32 {
    t.as_micros().div_ceil(1000).clamp(1, i32::MAX as u128) as i32
}

/// How often a busy link looks at its rdma_cm channel unprompted.
const CM_CHECK_EVERY: Duration = Duration::from_millis(1);
/// How often a draining teardown re-checks its send queue (and the close timeout) when no
/// completion wakes it.
const DRAIN_RECHECK: Duration = Duration::from_millis(10);

/// Where the connection's teardown stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Td {
    /// Before the core's `Teardown`.
    Running,
    /// `Teardown` came out: waiting for the posted work requests.
    Draining { since: Instant, fenced: bool },
    /// `rdma_disconnect` was called (or the connection is dead).
    Disconnected,
}

/// What carries a link's messages: a queue pair through rdma_cm, or memory shared with a
/// process of the same host (`crate::shm`).
// (one per link, inside its boxed `Link`: a box of its own would put a pointer on every data
// call's path to save 200 bytes on a shared-memory link)
#[allow(clippy::large_enum_variant)]
enum Ep {
    Rdma(Endpoint),
    Shm(ShmEndpoint),
}

/// The protocol core, as the link holds it: read freely (`Deref`), changed only through
/// [`Core::touch`] — which says the core may have an action due — or
/// [`Core::judged`], for the changes the core itself tells stirring from inert (completions,
/// the application's consume: `Connection::take_stirred`). A
/// pass of the core's actions (`Link::perform`) that ends with nothing to do clears
/// [`Core::due`]; while it is clear, the next pass would find nothing either, and
/// [`Link::act`] skips it.
struct Core {
    conn: Connection,
    /// An action may be due (see above).
    due: bool,
    /// Bytes were sent ([`Link::send`]) since the last pass: with nothing else due, their
    /// DATA is (`Core::poll_data`).
    sent: bool,
}

impl Core {
    /// The core, for a change that may make an action due.
    fn touch(&mut self) -> &mut Connection {
        self.due = true;
        &mut self.conn
    }

    /// A change the core judges itself (`f` calls `handle_completion` or `consume` and
    /// nothing else that changes it): an action may be due afterwards only if one of them
    /// stirred it.
    fn judged<R>(&mut self, f: impl FnOnce(&mut Connection) -> R) -> R {
        let r = f(&mut self.conn);
        if self.conn.take_stirred() {
            self.due = true;
        }
        r
    }

    /// The core's next action; `None`, or a DATA the core says nothing follows
    /// (`Connection::nothing_after`), clears [`Core::due`]: nothing is due until the core is
    /// changed again (a post that fails does, `Link::transport_failed`).
    fn next_action(&mut self) -> Option<Action> {
        self.sent = false;
        let a = self.conn.poll_action();
        if self.settled_by(&a) {
            self.due = false;
        }
        a
    }

    /// Whether nothing is due after the core returned `a`: nothing, or a DATA after which it
    /// says nothing follows (`Connection::nothing_after`).
    fn settled_by(&self, a: &Option<Action>) -> bool {
        a.is_none() || (matches!(a, Some(Action::WriteData { .. })) && self.conn.nothing_after())
    }

    /// The core's DATA branch alone (`Connection::poll_data`), for a core with nothing due
    /// whose last pass reached that branch (`Connection::reached_data`) and that was changed
    /// since only by judged changes and bytes sent ([`Link::send`]): what a pass would
    /// return. Anything but a DATA the core says nothing follows marks it due.
    fn poll_data(&mut self) -> Option<Action> {
        self.sent = false;
        let a = self.conn.poll_data();
        if !self.settled_by(&a) {
            self.due = true;
        }
        a
    }

    /// `Connection::send_data` (the write's lane), for a core whose last pass reached the
    /// DATA's branch with nothing due since: what `send` and then [`Core::poll_data`] do,
    /// including the mark of a core left with something due after the DATA.
    fn send_data(&mut self, len: usize) -> Option<LaneWrite> {
        let w = self.conn.send_data(len)?;
        self.sent = false;
        if !self.conn.nothing_after() {
            self.due = true;
        }
        Some(w)
    }
}

impl std::ops::Deref for Core {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        &self.conn
    }
}

/// One ring connection driven by its owner, without blocking (see the module docs).
pub struct Link {
    conn: Core,
    ep: Ep,
    teardown: Td,
    /// What the transport reported when the connection failed (the failing call and status).
    failure: Option<String>,
    /// When `progress` reads the rdma_cm channel without being told to: every
    /// [`CM_CHECK_EVERY`] (each read is a system call; a sleeping owner watches the channel's
    /// fd anyway), timed with the spin clock (a busy link calls `progress` for every message,
    /// and where the clocksource has no vDSO reader a monotonic-clock read is a system call).
    cm_check: tick::Periodic,
    /// The owner watches [`Link::cm_fd`] and calls `progress(true)` when it is readable:
    /// `progress(false)` then never reads the channel (nor the clock, once the handshake is
    /// over; under an emulated CPU a clock read can be a system call).
    cm_watched: bool,
    /// The owner acts on the handshake's deadline itself ([`Link::own_handshake_deadline`]):
    /// `progress` leaves it alone.
    deadline_owned: bool,
    /// Arms of the CQ since the completion channel was last read: an arm raises at most one
    /// event, so [`take_events`](Self::take_events) reads that many (at least one) instead
    /// of reading until EAGAIN — the read that finds nothing is a system call per message.
    arms: u8,
    close_timeout: Duration,
    /// [`Link::check_acks`]'s watch: the send WRs known complete when it first found some
    /// outstanding, since when, and the limit it was given.
    acks: Option<AckWatch>,
    /// How a grown receive ring is given back ([`StreamConfig::ring_idle`]); `None`: never.
    shrink: Option<Shrink>,
    /// READ pull (protocol §16): completions held back until the pulls before them complete.
    pulls: Pulls,
}

/// Giving a grown receive ring back when its stream goes idle ([`Link::check_idle`]).
#[derive(Debug, Clone, Copy)]
struct Shrink {
    /// The ring size offered again: the one the link started with.
    to: RingSize,
    /// How long the ring's cursors must stand still first.
    after: Duration,
    /// The receive ring's cursors (head, tail) when last seen to move, and when; kept while
    /// the ring is larger than `to` (from the move that grew it on).
    watch: Option<(u64, u64, Instant)>,
}

/// Work requests outstanding on the queue pair with no completion since `since`
/// ([`Link::check_acks`]).
#[derive(Debug, Clone, Copy)]
struct AckWatch {
    completed: u64,
    since: Instant,
    limit: Duration,
}

impl fmt::Debug for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Link")
            .field("state", &self.conn.state())
            .field("local", &self.local_addr())
            .field("peer", &self.peer_addr())
            .field("shm", &matches!(self.ep, Ep::Shm(_)))
            .finish()
    }
}

// The shim keeps links under per-connection locks, dials and requests in its event loop, and
// listeners in maps shared by every thread.
const _: fn() = || {
    fn send<T: Send>() {}
    fn sync<T: Sync>() {}
    send::<Link>();
    send::<Dialer>();
    send::<Incoming>();
    sync::<UpgradeListener>();
};

/// Most arms [`Link::take_events`] accounts for (more are read on later calls).
const MAX_ARMS: u8 = 4;

impl Link {
    fn new(
        conn: Connection,
        ep: Endpoint,
        close_timeout: Duration,
        shrink: Option<Shrink>,
    ) -> Link {
        let mut conn = conn;
        if let Some(staging) = ep.staging_desc().filter(|_| conn.read()) {
            // READ pull: where the peer reads our DATA from, its first message from us.
            conn.set_source(staging);
        }
        Link {
            shrink,
            ..Self::with(conn, Ep::Rdma(ep), close_timeout)
        }
    }

    /// A link over shared memory (made by `crate::shm`'s handshake).
    pub(crate) fn from_shm(conn: Connection, ep: ShmEndpoint, close_timeout: Duration) -> Link {
        // (its "channel" is the rendezvous socket, read as rdma_cm's is: every millisecond
        // unless the owner watches cm_fd)
        Self::with(conn, Ep::Shm(ep), close_timeout)
    }

    /// Whether this link's peer is a process of this host, over shared memory.
    pub fn is_local(&self) -> bool {
        matches!(self.ep, Ep::Shm(_))
    }

    fn with(conn: Connection, ep: Ep, close_timeout: Duration) -> Link {
        Link {
            conn: Core {
                conn,
                due: true,
                sent: false,
            },
            ep,
            teardown: Td::Running,
            failure: None,
            cm_check: tick::Periodic::new(CM_CHECK_EVERY),
            cm_watched: false,
            deadline_owned: false,
            arms: 0,
            close_timeout,
            acks: None,
            shrink: None,
            pulls: Pulls::default(),
        }
    }

    /// The owner watches [`cm_fd`](Self::cm_fd) itself (an event loop) and calls
    /// `progress(true)` whenever it is readable: from now on `progress(false)` leaves the
    /// rdma_cm channel alone, which saves the data path a clock read and a system call.
    pub fn set_cm_watched(&mut self) {
        self.cm_watched = true;
    }

    /// The owner decides when the handshake is past its deadline (it may move the deadline
    /// on, [`Connection::wait_longer`], when it knows the peer is slow, not lost): from now
    /// on `progress` never fails the handshake by its clock; the owner calls
    /// [`expire_handshake`](Self::expire_handshake) once it has decided, with the instant it
    /// decided at. (Two clock reads, one for the decision to wait on and one for the
    /// expiry, let a handshake whose deadline fell between them fail unextended; and a
    /// `progress` by another thread could act on the deadline before the owner looked.)
    pub fn own_handshake_deadline(&mut self) {
        self.deadline_owned = true;
    }

    /// Fails the handshake if it is past its deadline at `now` (see
    /// [`own_handshake_deadline`](Self::own_handshake_deadline)); `progress` then acts on it.
    pub fn expire_handshake(&mut self, now: Instant) {
        self.conn.touch().handle_timeout(now);
    }

    /// The protocol core (state, readiness, `recv()`, counters).
    pub fn conn(&self) -> &Connection {
        &self.conn
    }

    /// The protocol core, for the application-facing calls (`send`, `consume`,
    /// `commit_switch`, `note_tcp_read`, `shutdown_write`, `close`, …). Call
    /// [`progress`](Self::progress) afterwards so that their actions are posted.
    pub fn conn_mut(&mut self) -> &mut Connection {
        self.conn.touch()
    }

    /// One non-blocking pass of the driving loop (see the module docs): poll the CQ dry (each
    /// completion to the core, receives re-posted), read the link's rdma_cm channel (at most
    /// every millisecond unless `force_cm`), expire the handshake deadline, perform the core's
    /// actions while the send queue has room, drive the teardown. Returns whether any
    /// completion or rdma_cm event was seen.
    pub fn progress(&mut self, force_cm: bool) -> bool {
        let any = self.take_inputs(force_cm);
        self.act();
        any
    }

    /// One look of a spinning wait: polls the CQ (and a records ring, or the shared-memory
    /// inbox) and returns whether anything came. Reads neither the rdma_cm channel nor the
    /// clock, and performs nothing: the caller performs the core's actions
    /// ([`push`](Self::push)) if anything came, once it has looked at what — a read that
    /// found bytes consumes them first, and its push then performs what both made due in one
    /// pass. Until that push, nothing the inputs made due is posted. (A wait that outlasts
    /// its spin drives the link in full with [`progress`](Self::progress) before it sleeps.)
    pub fn spin_poll(&mut self) -> bool {
        self.poll_cq()
    }

    /// Performs what the core has queued (the write of bytes just staged, a credit just made
    /// due) without polling the CQ first: for the data path, where that action is what the
    /// peer waits for, and the next [`progress`](Self::progress) polls. Performs nothing
    /// once the teardown has begun (as `progress`).
    pub fn push(&mut self) {
        self.act();
    }

    /// [`progress`](Self::progress) for a caller that has just [`push`](Self::push)ed: the
    /// inputs are taken as `progress` takes them, and the core's actions performed again only
    /// if any came (or the handshake's deadline was looked at, or the teardown is under way).
    /// The push left nothing for a second pass to perform that no input would change: its
    /// pass ran until the core had nothing to do, or until the send queue was full with no
    /// completion to free it. One pass of the core's actions less on every write of the data
    /// path, where that pass found nothing.
    // (inline on the data path: a call and a return less a message, each return a block
    // lookup under emulation — docs/bench/kinds.md, session 62)
    #[inline(always)]
    pub fn progress_after_push(&mut self, force_cm: bool) -> bool {
        let timed = !self.deadline_owned && self.conn.poll_timeout().is_some();
        let any = self.take_inputs(force_cm);
        if any || timed || self.teardown != Td::Running {
            self.act();
        }
        any
    }

    /// `conn_mut().consume(n)`, for the owner's read of `n` ring bytes: the same, except
    /// that a consume that made nothing due (the credit it leaves rides on a later DATA, or
    /// waits for a threshold) does not make the next [`push`](Self::push) or
    /// [`progress`](Self::progress) perform the core's actions again when the last pass found
    /// nothing to do (`Connection::take_stirred`).
    pub fn consume(&mut self, n: usize) -> Result<(), rdmashim_proto::ConsumeError> {
        self.conn.judged(|c| c.consume(n))
    }

    /// `conn_mut().send(len)`, for the owner's write: the same, except that bytes the core
    /// accepts whole (the usual case) leave the core's other actions undisturbed, so that the
    /// next [`push`](Self::push) takes the DATA's branch alone when the last pass found
    /// nothing else to do (`Connection::reached_data`), instead of a whole pass.
    pub fn send(&mut self, len: usize) -> Result<SendGrant, SendError> {
        let r = self.conn.judged(|c| c.send(len));
        if matches!(r, Ok(g) if g.len > 0) {
            self.conn.sent = true;
        }
        r
    }

    /// The data path's write in one step: all of `bytes` accepted by the core, copied into
    /// the send staging ring and their DATA posted — what [`send`](Self::send),
    /// [`stage`](Self::stage) and [`push`](Self::push) do for them — for a link whose last
    /// pass of the core's actions found nothing due but the DATA of the next bytes
    /// (`Connection::send_data`, the core's lane). Returns how many bytes went (all of them);
    /// `None`, having changed nothing, where the lane does not apply: something else is due,
    /// the link is over shared memory, holds READ pulls, is tearing down or has a full send
    /// queue, or the core would not send the bytes whole as one DATA (the caller's general
    /// path then). Like `push`, it leaves the CQ to the next
    /// [`progress_after_push`](Self::progress_after_push).
    pub fn write_lane(&mut self, bytes: &[u8]) -> Option<usize> {
        if self.conn.due
            || !self.conn.reached_data()
            || !self.pulls.is_empty()
            || self.teardown != Td::Running
        {
            return None;
        }
        let Ep::Rdma(ep) = &mut self.ep else {
            return None;
        };
        if ep.sq_room() == 0 {
            return None;
        }
        let w = self.conn.send_data(bytes.len())?;
        // (the staging area has the peer's ring's size: the DATA's offset in one is the
        // bytes' offset in the other)
        let posted = match ep.tx_ring_mut(w.gen) {
            Some(tx) => {
                tx.ring_mut()
                    .slice_mut(w.offset, w.len)
                    .copy_from_slice(bytes);
                #[cfg(feature = "timeline")]
                crate::timeline::mark(crate::timeline::Mark::PostCalled);
                let r = ep.post_lane(&w).map_err(|e| e.to_string());
                #[cfg(feature = "timeline")]
                crate::timeline::mark(crate::timeline::Mark::PostReturned);
                r
            }
            None => Err("no staging area for the bytes granted".to_string()),
        };
        if let Err(e) = posted {
            self.transport_failed(e);
        }
        if self.conn.due {
            self.perform();
        }
        Some(w.len)
    }

    /// Copies `bytes` into the send staging ring at stream cursor `cursor`: the grant of the
    /// [`send`](Self::send) that accepted them (contiguous thanks to the double mapping; the
    /// core grants at most the ring's size).
    pub fn stage(&mut self, cursor: u64, bytes: &[u8]) {
        if let Some(dst) = self.staging(cursor, bytes.len()) {
            dst.copy_from_slice(bytes);
        }
    }

    /// The send staging ring's `len` bytes at stream cursor `cursor`, for a caller that fills
    /// a grant of [`send`](Self::send) in place (saving the copy [`stage`](Self::stage)
    /// makes from a buffer of its own); `None` on a link without a staging ring.
    pub fn staging(&mut self, cursor: u64, len: usize) -> Option<&mut [u8]> {
        let ep = match &mut self.ep {
            Ep::Rdma(ep) => ep,
            Ep::Shm(s) => return Some(s.staging(cursor, len)),
        };
        // (a grant never spans a ring move: its bytes are all of one staging area)
        let at = self.conn.tx_place(cursor)?;
        let tx = ep.tx_ring_mut(at.gen)?;
        Some(tx.ring_mut().slice_mut(at.offset, len))
    }

    /// The readable ring bytes at `offset` of the ring of generation `gen`, after
    /// `conn().recv()` returned `Recv::Ring { gen, offset, len }` (`len` ≤ the ring size;
    /// panics beyond it, or for a ring given back).
    pub fn ring(&self, gen: u32, offset: usize, len: usize) -> &[u8] {
        match &self.ep {
            Ep::Rdma(ep) => ep
                .rx_ring(gen)
                .expect("the ring recv() named is here")
                .ring()
                .slice(offset, len),
            Ep::Shm(s) => s.ring(offset, len),
        }
    }

    /// A look at the shared-memory inbox that needs neither the link nor its lock (see
    /// [`crate::shm::Arrivals`]); `None` over RDMA, whose completions only the CQ knows.
    pub fn arrivals(&self) -> Option<crate::shm::Arrivals> {
        match &self.ep {
            Ep::Shm(s) => Some(s.arrivals()),
            Ep::Rdma(_) => None,
        }
    }

    /// Arms the CQ: the completion channel fd becomes readable at the next completion. Call
    /// [`progress`](Self::progress) once more after arming: a completion between the last poll
    /// and the arm raises no event. With records (protocol §14) the peer's writes make no
    /// completion: arming first queues the reader's Sleeping notice, which that `progress`
    /// posts, and after which the peer's next record or doorbell makes one.
    pub fn arm(&mut self) {
        self.conn.touch().prepare_sleep();
        let ep = match &self.ep {
            Ep::Rdma(ep) => ep,
            Ep::Shm(s) => return s.arm(),
        };
        match ep.cq.arm() {
            Ok(()) => self.arms = self.arms.saturating_add(1).min(MAX_ARMS),
            Err(e) => self.transport_failed(e.to_string()),
        }
    }

    /// Reads and acknowledges the pending completion-channel events (non-blocking); call it
    /// when [`comp_fd`](Self::comp_fd) is readable. Reads as many as the arms since the last
    /// call can have raised (at least one, so an event left over from a miscount is taken
    /// on a later call; the channel stays readable meanwhile, so nobody sleeps through it).
    pub fn take_events(&mut self) {
        let ep = match &self.ep {
            Ep::Rdma(ep) => ep,
            Ep::Shm(s) => return s.take_events(),
        };
        let n = self.arms.max(1);
        self.arms = 0;
        for _ in 0..n {
            match ep.comp.take_event() {
                Ok(Some(_)) => continue,
                Ok(None) => return,
                Err(e) => {
                    self.transport_failed(e.to_string());
                    return;
                }
            }
        }
    }

    /// The completion channel's fd (non-blocking; readable after [`arm`](Self::arm) and a
    /// completion).
    pub fn comp_fd(&self) -> RawFd {
        match &self.ep {
            Ep::Rdma(ep) => ep.comp.fd(),
            Ep::Shm(s) => s.comp_fd(),
        }
    }

    /// The link's own rdma_cm event channel fd (non-blocking; readable when an event is
    /// pending: then call `progress(true)`).
    pub fn cm_fd(&self) -> RawFd {
        match &self.ep {
            Ep::Rdma(ep) => ep.ch.fd(),
            Ep::Shm(s) => s.cm_fd(),
        }
    }

    /// When [`progress`](Self::progress) must run again even without events, if ever: the
    /// handshake deadline, or the next re-check of a draining teardown (every 10 ms); and when
    /// [`check_acks`](Self::check_acks) or [`check_idle`](Self::check_idle) has something to
    /// decide.
    pub fn next_timer(&self) -> Option<Instant> {
        let t = match self.teardown {
            Td::Draining { .. } => Some(Instant::now() + DRAIN_RECHECK),
            _ => self.conn.poll_timeout(),
        };
        [t, self.ack_deadline(), self.idle_deadline()]
            .into_iter()
            .flatten()
            .min()
    }

    /// When a grown receive ring will have stood still long enough to be given back
    /// ([`check_idle`](Self::check_idle)), if it is watched.
    pub fn idle_deadline(&self) -> Option<Instant> {
        let s = self.shrink.as_ref()?;
        s.watch.map(|(_, _, since)| since + s.after)
    }

    /// Gives a grown receive ring back once its stream has gone idle (protocol §6.4; see
    /// [`StreamConfig::ring_idle`]): if nothing arrived in it and nothing was read from it
    /// since the last look for `ring_idle`, this side offers its peer a ring of the size the
    /// link started with (registered here: a few KiB), and the peer's next write moves there;
    /// the larger ring, and the peer's staging area of its size, are released when the move is
    /// over — what the connection pins goes back to what it pinned at its start. The owner calls
    /// it at [`next_timer`](Self::next_timer) (and may call it any time: it decides nothing
    /// before the deadline). A ring that cannot be offered now (another move under way, the
    /// direction ended) is looked at again a whole `ring_idle` later.
    pub fn check_idle(&mut self, now: Instant) {
        let Some(s) = self.shrink.as_mut() else {
            return;
        };
        let Some((head, tail, since)) = s.watch else {
            return;
        };
        let rx = self.conn.rx_cursors();
        let cursors = (rx.head(), rx.tail());
        if rx.size().bytes() <= s.to.bytes() || self.teardown != Td::Running {
            s.watch = None;
            return;
        }
        if cursors != (head, tail) {
            s.watch = Some((cursors.0, cursors.1, now));
            return;
        }
        if now.saturating_duration_since(since) < s.after {
            return;
        }
        let to = s.to;
        s.watch = Some((cursors.0, cursors.1, now));
        // (everything arrived was read: the application holds no bytes of the larger ring)
        if cursors.0 != cursors.1 || self.conn.offer_outstanding() {
            return;
        }
        let Ep::Rdma(ep) = &mut self.ep else { return };
        // (one that cannot be registered now: the connection goes on with the larger one)
        let Ok(ring) = ep.new_rx(to) else { return };
        if let Ok(gen) = self.conn.touch().offer_ring(Endpoint::desc_of(&ring)) {
            ep.add_rx(gen, ring);
            self.act();
        }
    }

    /// When [`check_acks`](Self::check_acks) would find the queue pair's work requests
    /// unacknowledged for its limit, if it watches some.
    pub fn ack_deadline(&self) -> Option<Instant> {
        self.acks.map(|w| w.since + w.limit)
    }

    /// TCP_USER_TIMEOUT's part on the ring: whether the device has acknowledged nothing of
    /// what was posted for `limit` (the peer host is gone, or the path to it), in which case
    /// the path is failed here ([`fail_path`](Self::fail_path)) — the stream goes on over TCP,
    /// whose own user timeout then ends it if the peer is gone for good — and `true` comes
    /// back. The owner calls it from time to time while the application's socket has the
    /// option (and again at [`next_timer`](Self::next_timer)); an interval of a second or
    /// less keeps the detection within a second of `limit`. `None` (the option was cleared)
    /// ends the watch.
    ///
    /// Only the device's acknowledgements count, not the peer's credits: a peer that reads
    /// nothing leaves its ring full but acknowledges every write, as a TCP peer that
    /// advertises a zero window still acknowledges. Most work requests are unsignaled: when
    /// the last one posted is, a signaled fence behind it makes its completion observable
    /// (one zero-length write, only while something is outstanding).
    pub fn check_acks(&mut self, now: Instant, limit: Option<Duration>) -> bool {
        let failed = self.conn.error().is_some() || self.conn.failed_over();
        let Ep::Rdma(ep) = &mut self.ep else {
            return false;
        };
        let Some(limit) = limit.filter(|_| !failed && self.teardown == Td::Running) else {
            self.acks = None;
            return false;
        };
        if ep.outstanding() == 0 {
            self.acks = None;
            return false;
        }
        let completed = ep.completed();
        match self.acks {
            Some(w) if w.completed == completed => {
                self.acks = Some(AckWatch { limit, ..w });
                if now.saturating_duration_since(w.since) >= limit {
                    self.acks = None;
                    let why = format!(
                        "no work request acknowledged for {} ms (TCP_USER_TIMEOUT)",
                        limit.as_millis()
                    );
                    self.fail_path(&why);
                    return true;
                }
            }
            _ => {
                self.acks = Some(AckWatch {
                    completed,
                    since: now,
                    limit,
                })
            }
        }
        if !ep.last_signaled() && ep.sq_room() > 0 {
            if let Some(r) = self.conn.peer_ring() {
                if let Err(e) = ep.post_fence(&r) {
                    self.transport_failed(e.to_string());
                }
            }
        }
        false
    }

    /// The teardown has finished (`rdma_disconnect` was called, or the connection died): the
    /// link can be dropped.
    pub fn is_disconnected(&self) -> bool {
        self.teardown == Td::Disconnected
    }

    /// What the transport reported when the connection failed (the failing call and status),
    /// if it did.
    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    /// The `io::Error` a failed connection surfaces for reason `r` (a transport failure names
    /// what the transport reported).
    pub fn error_for(&self, r: ErrorReason) -> io::Error {
        match (r, &self.failure) {
            (ErrorReason::Transport, Some(m)) => err(r.io_kind(), format!("{r}: {m}")),
            _ => err(r.io_kind(), r.to_string()),
        }
    }

    /// Abandons the connection now: `rdma_disconnect`, whatever is still queued or in flight
    /// (for a close that ran out of time; the peer sees its connection fail unless it had
    /// finished).
    pub fn disconnect(&mut self) {
        if self.teardown != Td::Disconnected {
            match &mut self.ep {
                Ep::Rdma(ep) => {
                    let _ = ep.id.disconnect();
                }
                Ep::Shm(s) => s.disconnect(),
            }
            self.teardown = Td::Disconnected;
        }
    }

    /// The local address of the connection.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        match &self.ep {
            Ep::Rdma(ep) => ep.local_addr(),
            Ep::Shm(_) => None,
        }
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        match &self.ep {
            Ep::Rdma(ep) => ep.peer_addr(),
            Ep::Shm(_) => None,
        }
    }

    /// The local ACK timeout exponent of the connection's queue pair, as the device has it
    /// (see [`StreamConfig::ack_timeout`]); `None` over shared memory or if the device does
    /// not say.
    pub fn ack_timeout(&self) -> Option<u8> {
        match &self.ep {
            Ep::Rdma(ep) => ep.ack_timeout().ok(),
            Ep::Shm(_) => None,
        }
    }

    // ----- the driver, in pieces (a Stream moves its queued bytes between them) --------------

    /// Steps 1–3 of the driving loop: completions, rdma_cm events, handshake deadline.
    pub(crate) fn take_inputs(&mut self, force_cm: bool) -> bool {
        let mut any = self.poll_cq();
        if force_cm || (!self.cm_watched && self.cm_check.due()) {
            any |= self.poll_cm();
        }
        if !self.deadline_owned && self.conn.poll_timeout().is_some() {
            self.conn.touch().handle_timeout(Instant::now());
        }
        any
    }

    /// Steps 4–5: perform the core's actions, drive the teardown.
    // (inline on the data path: a call and a return less a message, each return a block
    // lookup under emulation — docs/bench/kinds.md, session 62)
    #[inline(always)]
    pub(crate) fn act(&mut self) {
        // (nothing due since the last pass found nothing: this one would find nothing either;
        // held READ pulls are the link's, not the core's, and are posted all the same)
        if self.conn.due || !self.pulls.is_empty() {
            self.consider_offer();
            self.perform();
        } else if self.conn.sent && self.conn.reached_data() {
            // (nothing else due since a pass that reached the DATA's branch: that branch
            // alone, for the bytes sent since)
            self.perform_data();
        }
        self.drive_teardown();
    }

    /// [`Self::act`]'s lane: the DATA of the bytes sent since the last pass (or the end after
    /// them), when nothing else is due (`Core::poll_data`), posted with room in the send
    /// queue; a whole pass otherwise, or if the DATA leaves something due.
    fn perform_data(&mut self) {
        if self.teardown != Td::Running {
            return;
        }
        if self.sq_room() == 0 {
            // (a pass polls the CQ for room first)
            self.perform();
            return;
        }
        let Some(a) = self.conn.poll_data() else {
            return;
        };
        if self.carry(a) && self.conn.due {
            self.perform();
        }
    }

    /// The peer asked for a ring of another size for its writes (protocol §6.4): this side
    /// offers one, of that size but at most its own `ring_max`, if that differs from the ring
    /// it has (registered here and now: a move is rare, once per connection that turns busy).
    fn consider_offer(&mut self) {
        // (taken only when there is one: taking is a change, which marks the core due)
        let Some(wanted) = self.conn.ring_wanted() else {
            return;
        };
        self.conn.touch().take_ring_wanted();
        let Ep::Rdma(ep) = &mut self.ep else { return };
        let max = self.conn.config().ring_max.map_or(0, |m| m.bytes());
        let size = wanted.bytes().min(max);
        if size <= self.conn.local().ring.size.bytes() || self.conn.offer_outstanding() {
            return;
        }
        let Ok(size) = rdmashim_proto::RingSize::new(size) else {
            return;
        };
        // (the ring registered over both its views; the process's cap on pinned memory)
        if !verbs::may_pin(2 * size.bytes() as usize) {
            return;
        }
        // (a ring that cannot be registered now is not offered: the connection goes on)
        let Ok(ring) = ep.new_rx(size) else { return };
        if let Ok(gen) = self.conn.touch().offer_ring(Endpoint::desc_of(&ring)) {
            ep.add_rx(gen, ring);
        }
    }

    /// A ring move's local work (protocol §6.4): the staging area a move needs, and the
    /// rings and staging areas nothing touches any more.
    fn move_work(&mut self, a: Action) -> Result<(), String> {
        let Ep::Rdma(ep) = &mut self.ep else {
            return Err("ring moves over shared memory".into());
        };
        match a {
            Action::NewStaging { gen, size } => {
                ep.new_tx(gen, size).map_err(|e| e.to_string())?;
                if !self.conn.touch().staging_ready(gen) {
                    // (the direction ended meanwhile: not needed)
                    let current = self.conn.tx_cursors().map_or(0, |t| t.gen());
                    ep.release_tx(gen, current);
                }
            }
            Action::ReleaseStaging { gen } => {
                let current = self.conn.tx_cursors().map_or(0, |t| t.gen());
                ep.release_tx(gen, current);
            }
            Action::ReleaseRing { gen } => {
                let rx = self.conn.rx_cursors();
                ep.release_rx(gen, rx.gen());
                // (a ring grown past the link's first size is watched from now on, to be
                // given back once idle: check_idle)
                if let Some(s) = self.shrink.as_mut() {
                    s.watch = (rx.size().bytes() > s.to.bytes())
                        .then(|| (rx.head(), rx.tail(), Instant::now()));
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Makes the next [`Self::take_inputs`] read the rdma_cm channel (after a sleep on its fd).
    pub(crate) fn cm_due(&mut self) {
        self.cm_check.now();
    }

    /// Records (protocol §14): looks for the peer's records in the receive ring (one word
    /// read when there is none); returns whether it found any, or the ring failed the
    /// connection. Inlined to its test of the kind: it is asked once or more on every poll of
    /// the CQ, and most connections have no records.
    #[inline]
    fn poll_records(&mut self) -> bool {
        self.conn.records() && self.poll_records_ring()
    }

    /// [`Self::poll_records`] on a connection of records.
    fn poll_records_ring(&mut self) -> bool {
        let Ep::Rdma(ep) = &self.ep else { return false };
        let Some(rx) = ep.rx_ring(self.conn.rx_cursors().gen()) else {
            return false;
        };
        let ring = rx.ring();
        let found = self
            .conn
            .touch()
            .poll_ring(|offset| ring.load_word(offset))
            .unwrap_or(true);
        #[cfg(feature = "timeline")]
        if found {
            crate::timeline::mark(crate::timeline::Mark::DataSeen);
        }
        found
    }

    /// Polls the CQ dry, and the receive ring where records arrive; returns whether anything
    /// completed or arrived (or the poll failed, which fails the connection).
    // (inline on the data path: a call and a return less a message, each return a block
    // lookup under emulation — docs/bench/kinds.md, session 62)
    #[inline(always)]
    pub(crate) fn poll_cq(&mut self) -> bool {
        if let Ep::Shm(s) = &mut self.ep {
            return match self.conn.judged(|c| s.poll(c)) {
                Ok(any) => any,
                Err(m) => {
                    self.transport_failed(format!("shared memory: {m}"));
                    true
                }
            };
        }
        const BATCH: usize = 16;
        let mut wcs = [const { std::mem::MaybeUninit::uninit() }; BATCH];
        let mut any = self.poll_records();
        loop {
            let Ep::Rdma(ep) = &self.ep else { return any };
            let got = match ep.cq.poll_uninit(&mut wcs) {
                Ok(got) => got,
                Err(e) => {
                    // (the failure is news too, as over shared memory: the caller acts on it)
                    self.transport_failed(e.to_string());
                    return true;
                }
            };
            let n = got.len();
            for wc in got {
                self.on_completion(wc);
            }
            any |= n > 0;
            if n < BATCH {
                return any;
            }
        }
    }

    // (inline on the data path: a call and a return less a message, each return a block
    // lookup under emulation — docs/bench/kinds.md, session 62)
    #[inline(always)]
    fn on_completion(&mut self, wc: &ffi::ibv_wc) {
        if wc.wr_id & SEND_TAG == 0 {
            // (records: the WRITEs before a message are placed before its completion, and a
            // ShutdownWrite or Close counts them: the ring is looked at first)
            self.poll_records();
        }
        let Ep::Rdma(ep) = &mut self.ep else { return };
        let ok = wc.status == ffi::ibv_wc_status::IBV_WC_SUCCESS;
        if wc.wr_id & SEND_TAG != 0 {
            ep.on_send_completion(wc.wr_id);
            if !ok {
                let msg = self.wc_error("send", wc);
                self.transport_failed(msg);
            } else if !self.pulls.is_empty() {
                self.release_pulls();
            }
            return;
        }
        let Some(slot) = ep.recv_slot(wc.wr_id) else {
            return;
        };
        if !ok {
            let msg = self.wc_error("receive", wc);
            self.transport_failed(msg);
            return;
        }
        let a = Arrival {
            slot,
            imm: wc_imm_data(wc),
            byte_len: wc.byte_len,
            write_imm: Endpoint::is_write_imm(wc),
            send: wc.opcode == ffi::ibv_wc_opcode::IBV_WC_RECV,
        };
        if self.conn.read() && self.hold(a) {
            return;
        }
        self.arrive(a, None);
    }

    /// Hands a receive completion to the core (`pulled`: the bytes a READ pulled for it, an
    /// announcement's), and posts its receive again.
    // (inline on the data path: a call and a return less a message, each return a block
    // lookup under emulation — docs/bench/kinds.md, session 62)
    #[inline(always)]
    fn arrive(&mut self, a: Arrival, pulled: Option<u32>) {
        let Ep::Rdma(ep) = &mut self.ep else { return };
        if let Some(raw) = a.imm.filter(|_| a.write_imm || a.send) {
            let len = pulled.unwrap_or(a.byte_len);
            if !a.write_imm {
                // Sends (protocol §15): a SEND WITH IMMEDIATE is a DATA, a credit or a
                // doorbell; a DATA's bytes go into the ring where its next ones belong (the
                // core says where, inside the credit it returned) before the core hears of
                // them, as a WRITE would have left them.
                if len > 0 && !self.conn.sends() {
                    // (a peer that did not choose sends has no business sending bytes with an
                    // immediate: the core would take stale ring bytes for them)
                    self.transport_failed(format!(
                        "a SEND WITH IMMEDIATE of {len} bytes on a connection of the {} kind",
                        self.conn.kind().name()
                    ));
                    return;
                }
                if let Some(at) = self.conn.landing(len).filter(|_| len > 0) {
                    ep.land_send(a.slot, len, at.gen, at.offset);
                }
            }
            #[cfg(feature = "timeline")]
            if len > 0 {
                crate::timeline::mark(crate::timeline::Mark::DataSeen);
            }
            // The ring bytes of a DATA are visible once its completion was polled (or its
            // READ's); see "Memory ordering" in docs/protocol.md.
            let _ = self.conn.judged(|c| {
                c.handle_completion(Completion::WriteImm {
                    imm: u32::from_be(raw),
                    byte_len: Some(len),
                })
            });
        } else if a.write_imm {
            self.transport_failed("ibv_poll_cq: RECV_RDMA_WITH_IMM without an immediate".into());
            return;
        } else if a.send {
            let payload = ep.recv_payload(a.slot, a.byte_len);
            let _ = self
                .conn
                .judged(|c| c.handle_completion(Completion::Recv { payload }));
        }
        // Re-posted after the core saw the completion, before the credit that returns it.
        if self.teardown != Td::Disconnected && self.conn.error().is_none() {
            if let Ep::Rdma(ep) = &mut self.ep {
                ep.repost_recv(a.slot);
            }
        }
    }

    /// READ pull (protocol §16): holds a receive completion back if it is an announcement
    /// (its READ is posted, to where the core says its bytes go after those still being
    /// pulled) or comes after one still held; returns whether it did.
    fn hold(&mut self, a: Arrival) -> bool {
        let announced = match a.imm.map(|raw| Imm::decode(u32::from_be(raw))) {
            Some(Ok(Imm::Data { len, .. })) if a.write_imm && a.byte_len == 0 && len > 0 => len,
            _ => {
                if self.pulls.is_empty() {
                    return false;
                }
                self.pulls.hold(a, None);
                return true;
            }
        };
        // (none before the peer's Source, past the credit, or once closed: the core refuses
        // or ignores it, in its turn)
        let pull = self
            .conn
            .peer_source()
            .and_then(|_| self.conn.landing_after(self.pulls.ahead(), announced))
            .map(|at| Pull {
                gen: at.gen,
                offset: at.offset,
                len: announced,
                seq: None,
            });
        if pull.is_none() && self.pulls.is_empty() {
            return false;
        }
        self.pulls.hold(a, pull);
        self.post_pulls();
        true
    }

    /// Posts the READs of held announcements while the send queue has room (the core's
    /// actions wait for theirs: a pull frees ring space the peer may be waiting for).
    fn post_pulls(&mut self) {
        let Ep::Rdma(ep) = &mut self.ep else { return };
        let Some(src) = self.conn.peer_source() else {
            return;
        };
        while ep.sq_room() > 0 {
            let Some(p) = self.pulls.unposted() else {
                return;
            };
            match ep.post_read(p.gen, p.offset, p.len as usize, &src) {
                Ok(seq) => p.seq = Some(seq),
                Err(e) => {
                    self.transport_failed(format!("READ pull: {e}"));
                    return;
                }
            }
        }
    }

    /// Hands over the held completions whose pulls completed, in order.
    fn release_pulls(&mut self) {
        loop {
            let Ep::Rdma(ep) = &self.ep else { return };
            let Some(h) = self.pulls.ready(ep.completed()) else {
                break;
            };
            self.arrive(h.arrival, h.pull.map(|p| p.len));
        }
        self.post_pulls();
    }

    fn wc_error(&self, what: &str, wc: &ffi::ibv_wc) -> String {
        let status = sys::lib()
            .map(|l| sys::wc_status_str(l, wc.status))
            .unwrap_or_else(|_| format!("status {}", wc.status));
        format!(
            "ibv_poll_cq: {what} completed with error: {status} (vendor error {:#x})",
            wc.vendor_err
        )
    }

    /// Reads the connection's rdma_cm events; the CQ is polled dry before each is handled.
    /// Returns whether there was any.
    fn poll_cm(&mut self) -> bool {
        let ch = match &mut self.ep {
            Ep::Rdma(ep) => ep.ch.clone(),
            Ep::Shm(s) => {
                let mut any = false;
                loop {
                    match s.sock_event() {
                        SockEvent::Nothing => return any,
                        SockEvent::Confirmed => {
                            any = true;
                            self.conn.touch().handle_established();
                        }
                        SockEvent::Gone => {
                            self.poll_cq();
                            self.transport_failed("shared memory: the peer's end closed".into());
                            self.disconnect();
                            return true;
                        }
                    }
                }
            }
        };
        let mut any = false;
        loop {
            match ch.try_event() {
                Ok(None) => return any,
                Ok(Some(ev)) => {
                    any = true;
                    self.poll_cq();
                    self.on_cm_event(ev);
                }
                Err(e) => {
                    self.transport_failed(e.to_string());
                    return any;
                }
            }
        }
    }

    fn on_cm_event(&mut self, ev: Event) {
        match ev.kind {
            et::RDMA_CM_EVENT_ESTABLISHED => self.conn.touch().handle_established(),
            et::RDMA_CM_EVENT_TIMEWAIT_EXIT | et::RDMA_CM_EVENT_ADDR_CHANGE => {}
            _ => {
                // DISCONNECTED, DEVICE_REMOVAL, …: fatal unless the wire is already done.
                let msg = format!("rdma_get_cm_event: {} (status {})", ev.name(), ev.status);
                self.transport_failed(msg);
                if ev.kind == et::RDMA_CM_EVENT_DISCONNECTED {
                    // The peer is gone (after its Close, normally): what is still queued can
                    // never complete but by a retry timeout. Disconnect now, which flushes it
                    // (its completions were polled before this event was handled).
                    self.disconnect();
                }
            }
        }
    }

    /// The QP or the CM failed: the core decides whether that matters (not after a clean end).
    fn transport_failed(&mut self, msg: String) {
        // (READ pull: no pull completes on a failed queue pair, nor goes anything behind it)
        self.pulls.clear();
        let before = self.conn.error().is_some() || self.conn.failed_over();
        self.conn.touch().handle_transport_error();
        let after = self.conn.error().is_some() || self.conn.failed_over();
        if !before && after && self.failure.is_none() {
            self.failure = Some(msg);
        }
    }

    /// The ring's path is to be taken as failed (`why` is kept as the failure's message): the
    /// peer went on over TCP already (its bytes arrived on the socket while ours were on the
    /// ring), or a test fails the path on purpose. The core fails over if both sides can
    /// (protocol §8.6), else the connection fails as on any transport error.
    pub fn fail_path(&mut self, why: &str) {
        self.poll_cq();
        self.transport_failed(why.to_owned());
        self.act();
    }

    /// Performs the core's actions while the send queue has room; when it has none, polls the
    /// CQ for the completions that free some (a caller that performs without polling first,
    /// as a send that found ring room at once, relies on this).
    pub(crate) fn perform(&mut self) {
        if self.teardown != Td::Running {
            return;
        }
        if !self.pulls.is_empty() {
            self.post_pulls();
        }
        loop {
            // (after a failover nothing but the Teardown comes out, which posts nothing: it
            // must not wait for room that a failed queue pair may never give back)
            if let Ep::Rdma(ep) = &self.ep {
                if ep.sq_room() == 0
                    && !self.conn.failed_over()
                    && (!self.poll_cq() || self.sq_room() == 0)
                {
                    return;
                }
            }
            let Some(a) = self.conn.next_action() else {
                return;
            };
            if !self.carry(a) || !self.conn.due {
                // (the teardown began, or the DATA just posted was the last action due: no
                // poll to find nothing)
                return;
            }
        }
    }

    /// Carries out one action of the core: the teardown begins (then `false`: nothing more
    /// is performed), local work is done, or a work request is posted.
    fn carry(&mut self, a: Action) -> bool {
        if a == Action::Teardown {
            self.teardown = Td::Draining {
                since: Instant::now(),
                fenced: false,
            };
            self.drive_teardown();
            return false;
        }
        if matches!(
            a,
            Action::NewStaging { .. } | Action::ReleaseStaging { .. } | Action::ReleaseRing { .. }
        ) {
            if let Err(e) = self.move_work(a) {
                self.transport_failed(e);
            }
            return true;
        }
        let rkey = self.conn.peer_ring().map_or(0, |r| r.rkey);
        #[cfg(feature = "timeline")]
        let data = matches!(a, Action::WriteData { .. } | Action::WriteRecord { .. });
        #[cfg(feature = "timeline")]
        if data {
            crate::timeline::mark(crate::timeline::Mark::PostCalled);
        }
        let posted = match &mut self.ep {
            Ep::Rdma(ep) => ep.post(&a, rkey, self.conn.kind()),
            Ep::Shm(s) => {
                s.post(&a);
                Ok(())
            }
        };
        #[cfg(feature = "timeline")]
        if data {
            crate::timeline::mark(crate::timeline::Mark::PostReturned);
        }
        if let Err(e) = posted {
            self.transport_failed(e.to_string());
        }
        true
    }

    /// After `Teardown`: disconnect once the posted work requests completed (a signaled fence
    /// behind unsignaled ones makes that observable), at once after a failure, or when the
    /// close timeout passed. Inlined to its test of the state: every pass of the core's
    /// actions asks, and a running link has nothing to drain.
    #[inline]
    fn drive_teardown(&mut self) {
        if let Td::Draining { since, fenced } = self.teardown {
            self.drive_draining(since, fenced);
        }
    }

    /// [`Self::drive_teardown`] while draining, since `since` (`fenced`: the fence posted).
    fn drive_draining(&mut self, since: Instant, fenced: bool) {
        let Ep::Rdma(ep) = &mut self.ep else {
            // (shared memory: everything posted is in the peer's queue already)
            self.disconnect();
            return;
        };
        // (READ pull: and the peer pulled what we staged for it — it confirms our last
        // message — or disconnected, which disconnects this side at once)
        let done = (ep.outstanding() == 0 && self.conn.peer_pulled())
            || self.conn.error().is_some()
            || self.conn.failed_over()
            || since.elapsed() >= self.close_timeout;
        if !done && !fenced && !ep.last_signaled() {
            let posted = self.conn.peer_ring().map(|r| ep.post_fence(&r).is_ok());
            if posted == Some(true) {
                self.teardown = Td::Draining {
                    since,
                    fenced: true,
                };
                return;
            }
        } else if !done {
            return;
        }
        self.disconnect();
    }

    fn sq_room(&self) -> u64 {
        match &self.ep {
            Ep::Rdma(ep) => ep.sq_room(),
            Ep::Shm(_) => u64::MAX,
        }
    }

    /// The `io::Error` for a send the core refused.
    pub(crate) fn send_error(&self, e: SendError) -> io::Error {
        match e {
            SendError::Failed(r) => self.error_for(r),
            SendError::Shutdown => err(io::ErrorKind::BrokenPipe, "send after shutdown(Write)"),
            SendError::PeerClosed => err(io::ErrorKind::BrokenPipe, "the peer closed the stream"),
            SendError::WouldBlock => err(io::ErrorKind::WouldBlock, "no ring space"),
            SendError::ViaTcp => match self.conn.error() {
                Some(r) => self.error_for(r),
                None => err(io::ErrorKind::NotConnected, "the stream is not on the ring"),
            },
        }
    }
}

// ----- server side ---------------------------------------------------------------------------

/// Server side: an rdma_cm listener whose connect requests the caller matches itself (the
/// shim, to an accepted TCP connection; [`Listener`](crate::Listener), to nothing).
pub struct UpgradeListener {
    id: CmId,
    ch: Arc<EventChannel>,
}

impl fmt::Debug for UpgradeListener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpgradeListener")
            .field("local", &self.local_addr())
            .finish()
    }
}

impl UpgradeListener {
    /// `rdma_bind_addr` and `rdma_listen` (backlog 1024) on `addr`, which may be a wildcard
    /// (`0.0.0.0:port`, `[::]:port`), with a non-blocking event channel. Fails cleanly (kind
    /// `Unsupported`) on a host without rdma-core or without an RDMA device.
    pub fn bind(addr: SocketAddr) -> io::Result<UpgradeListener> {
        check_available()?;
        let ch = EventChannel::new()?;
        let id = CmId::new(&ch)?;
        id.bind(addr)?;
        id.listen(1024)?;
        Ok(UpgradeListener { id, ch })
    }

    /// The event channel's fd: readable when events are pending (then call
    /// [`next`](Self::next) until it returns `None`).
    pub fn fd(&self) -> RawFd {
        self.ch.fd()
    }

    /// The address listened on.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.id.local_addr()
    }

    /// The next connect request, without blocking (`Ok(None)` when none is pending).
    ///
    /// A request whose private data does not decode as a `ConnectRequest` of a version spoken
    /// here is rejected at once with a [`Reject`] stating the reason (`Malformed`,
    /// `UnsupportedVersion`) and skipped; other events on the listener's channel are ignored.
    pub fn next(&self) -> io::Result<Option<Incoming>> {
        loop {
            let Some((ev, id)) = self.ch.try_event_owned()? else {
                return Ok(None);
            };
            let Some(id) = id else { continue };
            match ConnectRequest::decode(&ev.private_data) {
                Ok(request) => {
                    return Ok(Some(Incoming {
                        id: Some(id),
                        request,
                    }))
                }
                Err(e) => {
                    let _ = id.reject(&Reject::new(RejectReason::for_decode_error(&e)).encode());
                }
            }
        }
    }
}

/// Why answering one connect request failed.
pub(crate) enum Refused {
    /// This side's fault (resources); the request was rejected with `Resources`.
    Local(io::Error),
    /// The client's: `rdma_accept` failed (it is gone, or going), or it left during the
    /// handshake.
    Peer(io::Error),
}

impl From<Refused> for io::Error {
    fn from(r: Refused) -> Self {
        match r {
            Refused::Local(e) | Refused::Peer(e) => e,
        }
    }
}

/// A decoded connect request not answered yet. Dropping it rejects it (`Resources`).
pub struct Incoming {
    /// `None` once answered.
    id: Option<CmId>,
    request: ConnectRequest,
}

impl fmt::Debug for Incoming {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Incoming")
            .field("request", &self.request)
            .field("source", &self.source())
            .finish()
    }
}

impl Incoming {
    /// The decoded request (its `client_port`/`server_port` name the TCP connection).
    pub fn request(&self) -> &ConnectRequest {
        &self.request
    }

    /// The requester's address as rdma_cm reports it (its IP is the client's; the port is the
    /// rdma_cm one, not the TCP one).
    pub fn source(&self) -> Option<SocketAddr> {
        self.id.as_ref().and_then(|id| id.peer_addr())
    }

    /// Rejects the request with `reason` (the client's dial fails with `Rejected(reason)`).
    pub fn reject(mut self, reason: RejectReason) {
        self.refuse(reason);
    }

    fn refuse(&mut self, reason: RejectReason) {
        if let Some(id) = self.id.take() {
            let _ = id.reject(&Reject::new(reason).encode());
        }
    }

    /// Accepts the request if it proves `proof` (its tag verifies under the TCP connection's
    /// key; or it is native, for a native listener): moves its id to an event channel of its
    /// own, builds the endpoint with `cfg`'s sizes, sets the peer's ring, starts the core with
    /// `Connection::accept(cfg.protocol, .., proof, tcp_received, now)` and calls
    /// `rdma_accept` with the reply. Does not wait: the link is in the handshake
    /// (`StreamState::Handshaking`) until [`Link::progress`] sees ESTABLISHED (or the first
    /// completion). A request that proves nothing is rejected with `Unproven` (kind
    /// `PermissionDenied`) before anything is built; on a local failure it is rejected with
    /// `Resources` and the error returned.
    pub fn accept(self, cfg: &StreamConfig, tcp_received: u64, proof: &Proof) -> io::Result<Link> {
        self.answer(cfg, tcp_received, proof)
            .map_err(io::Error::from)
    }

    /// [`Self::accept`], telling this side's failures from the client's.
    pub(crate) fn answer(
        mut self,
        cfg: &StreamConfig,
        tcp_received: u64,
        proof: &Proof,
    ) -> Result<Link, Refused> {
        if !self.request.proves(proof) {
            self.refuse(RejectReason::Unproven);
            return Err(Refused::Peer(err(
                io::ErrorKind::PermissionDenied,
                "the request does not prove it holds the TCP connection",
            )));
        }
        let mut id = self.id.take().expect("an unanswered request has its id");
        let refuse = |id: &CmId, e: io::Error| {
            let _ = id.reject(&Reject::new(RejectReason::Resources).encode());
            Refused::Local(e)
        };
        let sizes = cfg.sizes().map_err(|e| refuse(&id, e))?;
        // The connection's events (ESTABLISHED, DISCONNECTED) go to its own channel.
        let ch = match EventChannel::new().and_then(|ch| id.migrate(&ch).map(|()| ch)) {
            Ok(ch) => ch,
            Err(e) => return Err(refuse(&id, e.into())),
        };
        let mut ep = match Endpoint::new(id, ch, sizes) {
            Ok(ep) => ep,
            Err(failed) => {
                let (e, id) = *failed;
                return Err(refuse(&id, e.into()));
            }
        };
        // (READ pull, if both want it: the peer reads our staging area)
        let read = cfg.protocol.kind == Kind::Read
            && self
                .request
                .flags
                .contains(rdmashim_proto::Flags::READ_OFFERED);
        if let Err(e) = ep.set_peer_ring(self.request.ring.size, read) {
            return Err(refuse(&ep.id, e.into()));
        }
        let (conn, reply) = Connection::accept(
            cfg.protocol,
            ep.local_params(),
            &self.request,
            proof,
            tcp_received,
            Instant::now(),
        )
        .map_err(|e| match e {
            // (checked above; kept exact should the two checks ever differ)
            ConfigError::Unproven => {
                let _ = ep.id.reject(&Reject::new(RejectReason::Unproven).encode());
                Refused::Peer(err(io::ErrorKind::PermissionDenied, e.to_string()))
            }
            e => refuse(&ep.id, err(io::ErrorKind::InvalidInput, e.to_string())),
        })?;
        let reads = if conn.read() { MAX_READS } else { 0 };
        let param = ConnParam {
            private_data: &reply.encode(),
            responder_resources: reads,
            initiator_depth: reads,
        };
        apply_ack_timeout(&ep, cfg.ack_timeout);
        ep.id.accept(&param).map_err(|e| Refused::Peer(e.into()))?;
        Ok(Link::new(conn, ep, cfg.close_timeout, cfg.shrink()))
    }
}

impl Drop for Incoming {
    fn drop(&mut self) {
        if crate::fds::abandoned() {
            return;
        }
        self.refuse(RejectReason::Resources);
    }
}

// ----- client side ---------------------------------------------------------------------------

/// Client side: a non-blocking rdma_cm connect whose request carries the TCP ports.
pub struct Dialer {
    state: Dial,
    ch: Arc<EventChannel>,
    dst: SocketAddr,
    /// The `client_port` of the request; `None`: the rdma_cm source port (native streams).
    client_port: Option<u16>,
    /// What binds the request (and what the reply must prove).
    proof: Proof,
    sizes: EndpointSizes,
    protocol: Config,
    close_timeout: Duration,
    /// `StreamConfig::ack_timeout`.
    ack_timeout: u8,
    /// How the link gives a grown ring back (`StreamConfig::ring_idle`).
    shrink: Option<Shrink>,
    deadline: Instant,
    /// The whole dial's budget (`cfg.connect_timeout`).
    timeout: Duration,
    /// The endpoint is built by [`Dialer::build`], not by `poll` ([`Dialer::defer_build`]).
    deferred: bool,
}

/// Where a dial stands; each state but `Routed` waits for one rdma_cm event.
enum Dial {
    /// `rdma_resolve_addr` issued.
    Address(CmId),
    /// `rdma_resolve_route` issued.
    Route(CmId),
    /// The route is resolved; the endpoint waits to be built ([`Dialer::build`]).
    Routed(CmId),
    /// `rdma_connect` issued with the request.
    Connect(Box<(Connection, Endpoint)>),
    /// The outcome was returned.
    Ended,
}

impl Dial {
    fn waiting_for(&self) -> &'static str {
        match self {
            Dial::Address(_) => "RDMA_CM_EVENT_ADDR_RESOLVED",
            Dial::Route(_) => "RDMA_CM_EVENT_ROUTE_RESOLVED",
            Dial::Routed(_) => "nothing (the endpoint is to be built)",
            Dial::Connect(_) => "RDMA_CM_EVENT_ESTABLISHED",
            Dial::Ended => "nothing (the dial has ended)",
        }
    }
}

/// What [`Dialer::poll`] found.
#[derive(Debug)]
// Returned once per dial and moved straight into its owner: boxing the link buys nothing.
#[allow(clippy::large_enum_variant)]
pub enum DialStatus {
    /// Still under way: poll again when [`Dialer::fd`] is readable or at [`Dialer::deadline`].
    Pending,
    /// The server accepted: the link's core is established and neither direction is
    /// committed (the caller commits the switch itself).
    Connected(Link),
    /// The dial failed; the dialer is spent.
    Failed(DialError),
}

/// Why a dial failed.
#[derive(Debug)]
pub enum DialError {
    /// The server rejected the request, with the reason its `Reject` named (`None`: no or a
    /// foreign message, typically no rdma_cm listener on that port).
    Rejected(Option<RejectReason>),
    /// rdma_cm could not reach the server (address, route or connection error), as reported.
    Unreachable(String),
    /// The server answered (its rdma_cm accepted the request), but librdmacm could not
    /// complete the connection on this side (`RDMA_CM_EVENT_CONNECT_ERROR`): typically the
    /// server undid its accept before this side processed it (its application closed the
    /// connection meanwhile), which leaves the connection's CM state unusable (EINVAL).
    Broken(String),
    /// The dial did not finish before its deadline.
    Timeout,
    /// This side failed (resources, a verbs call), or the server's reply was unusable.
    Local(io::Error),
}

impl DialError {
    /// The `io::ErrorKind` a connect failing this way reports.
    pub fn io_kind(&self) -> io::ErrorKind {
        match self {
            DialError::Rejected(_) => io::ErrorKind::ConnectionRefused,
            DialError::Unreachable(_) => io::ErrorKind::HostUnreachable,
            DialError::Broken(_) => io::ErrorKind::ConnectionAborted,
            DialError::Timeout => io::ErrorKind::TimedOut,
            DialError::Local(e) => e.kind(),
        }
    }
}

impl fmt::Display for DialError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DialError::Rejected(r) => ErrorReason::Rejected(*r).fmt(f),
            DialError::Unreachable(m) => write!(f, "unreachable: {m}"),
            DialError::Broken(m) => write!(f, "accepted, then broken: {m}"),
            DialError::Timeout => f.write_str("timed out"),
            DialError::Local(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for DialError {}

impl From<DialError> for io::Error {
    fn from(e: DialError) -> Self {
        match e {
            DialError::Local(e) => e,
            e => io::Error::new(e.io_kind(), e),
        }
    }
}

impl fmt::Debug for Dialer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dialer")
            .field("dst", &self.dst)
            .field("waiting_for", &self.state.waiting_for())
            .finish()
    }
}

impl Dialer {
    /// Starts `rdma_resolve_addr` from `src` (the TCP socket's local IP with port 0; `None`:
    /// any) to `dst` (the TCP peer's IP and the rdma_cm port the server listens on: its TCP
    /// port, or the one its token named). `client_port` is the TCP source port the request
    /// carries (not the rdma_cm one), and the server port it carries is that of `proof`'s
    /// TCP connection; `proof` binds the request to
    /// that TCP connection (`docs/protocol.md` 2.9), and the reply must prove the same key or
    /// the dial fails (`Unproven`). The whole dial must finish by now + `cfg.connect_timeout`.
    /// Fails cleanly (kind `Unsupported`) without RDMA.
    pub fn start(
        src: Option<SocketAddr>,
        dst: SocketAddr,
        client_port: u16,
        proof: Proof,
        cfg: &StreamConfig,
    ) -> io::Result<Dialer> {
        Self::begin(src, dst, Some(client_port), proof, cfg)
    }

    /// [`Self::start`]; `client_port` `None` puts the rdma_cm source port in the request.
    pub(crate) fn begin(
        src: Option<SocketAddr>,
        dst: SocketAddr,
        client_port: Option<u16>,
        proof: Proof,
        cfg: &StreamConfig,
    ) -> io::Result<Dialer> {
        check_available()?;
        let sizes = cfg.sizes()?;
        let deadline = Instant::now() + cfg.connect_timeout;
        let ch = EventChannel::new()?;
        let id = CmId::new(&ch)?;
        id.resolve_addr(src, dst, cfg.connect_timeout)?;
        Ok(Dialer {
            state: Dial::Address(id),
            ch,
            dst,
            client_port,
            proof,
            sizes,
            protocol: cfg.protocol,
            close_timeout: cfg.close_timeout,
            ack_timeout: cfg.ack_timeout,
            shrink: cfg.shrink(),
            deadline,
            timeout: cfg.connect_timeout,
            deferred: false,
        })
    }

    /// Leaves the costly part of the dial — the endpoint: its queue pair, completion queue
    /// and registered rings, milliseconds of CPU each (tens under emulation) — to the caller,
    /// who may run it on another thread: once the route is resolved, `poll` returns `Pending`
    /// and [`Self::needs_build`] holds until [`Self::build`] ran. A process that dials a
    /// thousand connections at once then sets them up on as many threads as it has CPUs,
    /// instead of one after another on its event loop.
    pub fn defer_build(&mut self) {
        self.deferred = true;
    }

    /// Whether the endpoint waits for [`Self::build`] (only after [`Self::defer_build`]).
    pub fn needs_build(&self) -> bool {
        matches!(self.state, Dial::Routed(_))
    }

    /// Builds the endpoint and sends the request (see [`Self::defer_build`]); `tcp_received`
    /// as for [`Self::poll`]. The time the dial waited for this call does not count against
    /// it: the server's answer gets the dial's whole budget (`connect_timeout`) from now, as
    /// a dial queued behind others' set-ups is no sign of a peer that does not answer. Poll
    /// again afterwards (events may have come meanwhile). A failure ends the dial.
    pub fn build(&mut self, tcp_received: u64) -> Result<(), DialError> {
        match std::mem::replace(&mut self.state, Dial::Ended) {
            Dial::Routed(id) => match self.request(id, tcp_received) {
                Ok(state) => {
                    self.state = state;
                    self.deadline = Instant::now() + self.timeout;
                    Ok(())
                }
                Err(e) => Err(DialError::Local(e)),
            },
            state => {
                let expected = state.waiting_for();
                self.state = state;
                Err(DialError::Local(err(
                    io::ErrorKind::InvalidInput,
                    format!("no endpoint to build: the dial waits for {expected}"),
                )))
            }
        }
    }

    /// The event channel's fd (non-blocking): poll again when it is readable.
    pub fn fd(&self) -> RawFd {
        self.ch.fd()
    }

    /// When the dial times out.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// What the dial waits for now (an rdma_cm event's name, or nothing), for logs.
    pub fn waiting_for(&self) -> &'static str {
        self.state.waiting_for()
    }

    /// Whether the dial waits for this host's rdma_cm to resolve the address or the route
    /// (rather than for the server's answer).
    pub fn resolving(&self) -> bool {
        matches!(self.state, Dial::Address(_) | Dial::Route(_))
    }

    /// Moves the deadline to `until` if that is later, while the dial waits for an rdma_cm
    /// event (the resolutions, or the server's answer to its request). For a caller that
    /// knows the work is queued, not lost: this host's rdma_cm resolves others' addresses
    /// and routes one after another (its work queue is ordered), and a server works through
    /// its set-ups in order (its other dials to that host are being answered). The kernel's
    /// own resolution timeout (the budget given to `rdma_resolve_addr`) still fails an
    /// address it cannot resolve. Returns whether the deadline moved.
    pub fn wait_longer(&mut self, until: Instant) -> bool {
        let waiting = matches!(
            self.state,
            Dial::Address(_) | Dial::Route(_) | Dial::Connect(_)
        );
        if waiting && until > self.deadline {
            self.deadline = until;
            return true;
        }
        false
    }

    /// Advances on the pending rdma_cm events, without blocking: ADDR_RESOLVED starts route
    /// resolution; ROUTE_RESOLVED builds the endpoint and the core
    /// (`Connection::connect(.., client_port, dst.port(), nonce, tcp_received, now)`) and calls
    /// `rdma_connect` with the request; ESTABLISHED hands the reply to the core and returns the
    /// [`Link`] (on this dialer's event channel); REJECTED, address/route/connect errors and
    /// the deadline fail it. `tcp_received` (bytes the application has read from the TCP
    /// socket so far) is used only when the request is built. Once it returned `Connected` or
    /// `Failed` the dialer is spent: it fails at once and never reads the channel again (a
    /// connected link owns it).
    pub fn poll(&mut self, tcp_received: u64) -> DialStatus {
        self.poll_at(tcp_received, Instant::now())
    }

    /// As [`poll`](Self::poll), the deadline judged at `now`: the instant a caller decided
    /// at whether to let the dial wait longer ([`wait_longer`](Self::wait_longer)). (Read
    /// again here, the clock could pass a deadline the caller saw ahead and did not move.)
    pub fn poll_at(&mut self, tcp_received: u64, now: Instant) -> DialStatus {
        if matches!(self.state, Dial::Ended) {
            // The channel is the link's now: its events are not ours to take.
            return DialStatus::Failed(DialError::Local(err(
                io::ErrorKind::InvalidInput,
                "the dial has ended",
            )));
        }
        loop {
            let ev = match self.ch.try_event() {
                Ok(Some(ev)) => ev,
                Ok(None) if now >= self.deadline => return self.end(DialError::Timeout),
                Ok(None) => return DialStatus::Pending,
                Err(e) => return self.end(DialError::Local(e.into())),
            };
            if let Some(done) = self.on_event(ev, tcp_received) {
                return done;
            }
        }
    }

    fn end(&mut self, e: DialError) -> DialStatus {
        self.state = Dial::Ended;
        DialStatus::Failed(e)
    }

    /// One event; `Some` when the dial is over.
    fn on_event(&mut self, ev: Event, tcp_received: u64) -> Option<DialStatus> {
        let expected = self.state.waiting_for();
        let state = std::mem::replace(&mut self.state, Dial::Ended);
        let failed = match (state, ev.kind) {
            (state, et::RDMA_CM_EVENT_ADDR_CHANGE | et::RDMA_CM_EVENT_TIMEWAIT_EXIT) => {
                self.state = state;
                return None;
            }
            (Dial::Address(id), et::RDMA_CM_EVENT_ADDR_RESOLVED) => {
                let left = self.deadline.saturating_duration_since(Instant::now());
                match id.resolve_route(left.max(Duration::from_millis(1))) {
                    Ok(()) => {
                        self.state = Dial::Route(id);
                        return None;
                    }
                    Err(e) => DialError::Local(e.into()),
                }
            }
            (Dial::Route(id), et::RDMA_CM_EVENT_ROUTE_RESOLVED) if self.deferred => {
                self.state = Dial::Routed(id);
                return None;
            }
            (Dial::Route(id), et::RDMA_CM_EVENT_ROUTE_RESOLVED) => {
                match self.request(id, tcp_received) {
                    Ok(state) => {
                        self.state = state;
                        return None;
                    }
                    Err(e) => DialError::Local(e),
                }
            }
            (Dial::Connect(c), et::RDMA_CM_EVENT_ESTABLISHED) => {
                let (conn, ep) = *c;
                return Some(match self.established(conn, ep, &ev.private_data) {
                    Ok(link) => DialStatus::Connected(link),
                    Err(e) => DialStatus::Failed(DialError::Local(e)),
                });
            }
            // (a QP of this process's own, in a fork child: librdmacm hands the reply over
            // and the connection is completed here; `CmId::establish`)
            (Dial::Connect(c), et::RDMA_CM_EVENT_CONNECT_RESPONSE) => {
                let (conn, ep) = *c;
                let done = ep
                    .id
                    .establish()
                    .map_err(io::Error::from)
                    .and_then(|()| self.established(conn, ep, &ev.private_data));
                return Some(match done {
                    Ok(link) => DialStatus::Connected(link),
                    Err(e) => DialStatus::Failed(DialError::Local(e)),
                });
            }
            (_, et::RDMA_CM_EVENT_REJECTED) => {
                DialError::Rejected(Reject::decode(&ev.private_data).ok().map(|r| r.reason))
            }
            (
                _,
                et::RDMA_CM_EVENT_ADDR_ERROR
                | et::RDMA_CM_EVENT_ROUTE_ERROR
                | et::RDMA_CM_EVENT_UNREACHABLE,
            ) => DialError::Unreachable(self.describe(&ev)),
            // (librdmacm's own processing of the server's reply failed: the reply came)
            (_, et::RDMA_CM_EVENT_CONNECT_ERROR) => DialError::Broken(self.describe(&ev)),
            _ => DialError::Local(
                Error::UnexpectedEvent {
                    expected,
                    got: ev.name(),
                    status: ev.status,
                    private_data: ev.private_data,
                }
                .into(),
            ),
        };
        Some(DialStatus::Failed(failed))
    }

    /// An error event, for a [`DialError`]'s message.
    fn describe(&self, ev: &Event) -> String {
        format!(
            "{} (status {}{}) connecting to {}",
            ev.name(),
            ev.status,
            ev.errno
                .map(|e| format!(": {}", io::Error::from_raw_os_error(e)))
                .unwrap_or_default(),
            self.dst
        )
    }

    /// The TCP server port the request names: the bound connection's (its rdma_cm listener
    /// may be on another port, the one the server's token told), or a native stream's.
    fn server_port(&self) -> u16 {
        match &self.proof {
            Proof::Bound { tuple, .. } => tuple.server.port(),
            Proof::Native => self.dst.port(),
        }
    }

    /// Route resolved: endpoint, core, `rdma_connect` with the request.
    fn request(&self, id: CmId, tcp_received: u64) -> io::Result<Dial> {
        let mut ep = Endpoint::new(id, self.ch.clone(), self.sizes).map_err(|f| f.0)?;
        // The staging ring now, at the likely size (the server's is normally ours), rather
        // than when the reply comes: the reply is handled on the caller's event loop.
        let guess = ep.local_params().ring.size;
        let read = self.protocol.kind == Kind::Read;
        ep.set_peer_ring(guess, read)?;
        let client_port = self
            .client_port
            .unwrap_or_else(|| ep.local_addr().map_or(0, |a| a.port()));
        let (conn, req) = Connection::connect(
            self.protocol,
            ep.local_params(),
            &self.proof,
            client_port,
            self.server_port(),
            nonce(),
            tcp_received,
            Instant::now(),
        )
        .map_err(|e| err(io::ErrorKind::InvalidInput, e.to_string()))?;
        apply_ack_timeout(&ep, self.ack_timeout);
        // (READ pull offered: the queue pair may take and serve READs, as many as the device
        // allows; the server's accept settles the numbers)
        let reads = if read { MAX_READS } else { 0 };
        ep.id.connect(&ConnParam {
            private_data: &req.encode(),
            responder_resources: reads,
            initiator_depth: reads,
        })?;
        Ok(Dial::Connect(Box::new((conn, ep))))
    }

    /// ESTABLISHED: the server's reply goes to the core, the staging ring gets the peer's size.
    fn established(
        &self,
        mut conn: Connection,
        mut ep: Endpoint,
        reply: &[u8],
    ) -> io::Result<Link> {
        conn.handle_accept(reply)
            .map_err(|r| err(r.io_kind(), format!("rdma_connect to {}: {r}", self.dst)))?;
        let peer = conn
            .peer_ring()
            .ok_or_else(|| err(io::ErrorKind::InvalidData, "no peer ring after the reply"))?;
        ep.ensure_peer_ring(peer.size, conn.read())?;
        Ok(Link::new(conn, ep, self.close_timeout, self.shrink))
    }
}
