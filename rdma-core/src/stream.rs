//! Ring-buffer byte streams over RC queue pairs: the driver of one connection, and the native
//! Rust API ([`Listener`], [`Stream`], [`barrier`]).
//!
//! A [`Stream`] is the sans-IO [`Connection`] of `rdmashim-proto` plus the verbs resources of
//! [`crate::endpoint`]. Every call drives it with the same loop (the obligations are those of
//! `rdmashim_proto::conn`):
//!
//! 1. poll the CQ dry, in order: send completions retire send-queue entries; each receive
//!    completion goes to [`Connection::handle_completion`] and its receive is re-posted at
//!    once, before any action is performed;
//! 2. read the connection's own rdma_cm event channel (after polling the CQ dry again):
//!    DISCONNECTED and other errors become [`Connection::handle_transport_error`];
//! 3. move queued [`Stream::isend`]/[`Stream::irecv`] bytes;
//! 4. perform the core's actions in order while the send queue has room (an action that could
//!    not be posted stays in the core);
//! 5. after `Teardown`: wait until the posted work requests completed (bounded by
//!    [`StreamConfig::close_timeout`]), then `rdma_disconnect`.
//!
//! Blocking calls spin on the CQ for [`StreamConfig::spin`], then arm the CQ, poll it once more
//! and sleep in `poll(2)` on the completion channel and the rdma_cm channel: an idle stream
//! burns no CPU, a busy one pays no interrupts.
//!
//! A native stream has no TCP connection behind it: both sides commit their sending direction
//! to the ring right after the handshake (`commit_switch(0)`).

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::net::{Shutdown, SocketAddr};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdmashim_proto::{
    Action, Completion, Config, ConnectRequest, Connection, ErrorReason, Recv, Reject,
    RejectReason, RingSize, SendError, Stats, StreamState,
};

use crate::cm::{event_type as et, CmId, ConnParam, Event, EventChannel};
use crate::endpoint::{Endpoint, EndpointSizes, SEND_TAG};
use crate::error::{Error, Unavailable};
use crate::ring::RegisteredRing;
use crate::sys::{self, ffi};
use crate::verbs::{self, empty_wc, wc_imm_data};

/// Tunables of a stream. `Default` gives sensible values for a LAN.
#[derive(Debug, Clone, Copy)]
pub struct StreamConfig {
    /// Receive ring size in bytes: a power of two from 4 KiB to 8 MiB (default 1 MiB).
    pub ring_size: usize,
    /// Receives posted per connection (≥ 4; default 64).
    pub recv_slots: u16,
    /// Send queue depth (≥ 8; default 128).
    pub sq_depth: u32,
    /// Inline size to ask the device for (default 64; control messages fit in 16).
    pub max_inline: u32,
    /// How long a blocking call busy-polls the CQ before it sleeps (default 30 µs).
    pub spin: Duration,
    /// Deadline of address/route resolution and of the handshake (default 5 s).
    pub connect_timeout: Duration,
    /// How long a close waits for queued data and outstanding work requests (default 3 s).
    pub close_timeout: Duration,
    /// Protocol tunables (credit thresholds, largest write, …).
    pub protocol: Config,
}

impl Default for StreamConfig {
    fn default() -> Self {
        Self {
            ring_size: 1 << 20,
            recv_slots: 64,
            sq_depth: 128,
            max_inline: 64,
            spin: Duration::from_micros(30),
            connect_timeout: Duration::from_secs(5),
            close_timeout: Duration::from_secs(3),
            protocol: Config::default(),
        }
    }
}

impl StreamConfig {
    fn sizes(&self) -> io::Result<EndpointSizes> {
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
            sq_depth: self.sq_depth,
            max_inline: self.max_inline,
        })
    }
}

/// Fails cleanly (an [`Unavailable`] error, kind `Unsupported`) on a host without rdma-core or
/// without an RDMA device. A positive answer is remembered.
fn check_available() -> Result<(), Error> {
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

fn nonce() -> u64 {
    // RandomState is seeded from the OS's random source (and varied per instance).
    let mut h = RandomState::new().build_hasher();
    h.write_u64(Instant::now().elapsed().as_nanos() as u64);
    h.finish()
}

fn err(kind: io::ErrorKind, msg: impl Into<String>) -> io::Error {
    io::Error::new(kind, msg.into())
}

/// A failure kept for handles that complete with an error (`io::Error` is not `Clone`).
#[derive(Debug, Clone)]
struct Failure(io::ErrorKind, String);

impl From<&io::Error> for Failure {
    fn from(e: &io::Error) -> Self {
        Failure(e.kind(), e.to_string())
    }
}

impl From<Failure> for io::Error {
    fn from(f: Failure) -> Self {
        io::Error::new(f.0, f.1)
    }
}

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

struct PendingSend {
    id: u64,
    data: Vec<u8>,
    done: usize,
}

struct PendingRecv {
    id: u64,
    buf: Vec<u8>,
    want: usize,
}

/// A queued [`Stream::isend`]; complete once every byte is in the ring's send path.
#[derive(Debug)]
#[must_use = "wait for the send, or test it"]
pub struct SendHandle(u64);

/// A queued [`Stream::irecv`]; complete once its bytes arrived (or the stream ended).
#[derive(Debug)]
#[must_use = "wait for the receive to get its bytes"]
pub struct RecvHandle(u64);

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::SendHandle {}
    impl Sealed for super::RecvHandle {}
}

/// A handle whose completion [`Stream::test`] can check.
pub trait Handle: sealed::Sealed {
    #[doc(hidden)]
    fn is_done(&self, s: &Stream) -> bool;
}

impl Handle for SendHandle {
    fn is_done(&self, s: &Stream) -> bool {
        s.finished_sends.contains_key(&self.0)
    }
}

impl Handle for RecvHandle {
    fn is_done(&self, s: &Stream) -> bool {
        s.finished_recvs.contains_key(&self.0)
    }
}

/// A listening endpoint for ring streams (the RDMA analogue of `TcpListener`).
///
/// ```no_run
/// use rdmashim_core::{Listener, Stream};
/// use std::io::{Read, Write};
///
/// let listener = Listener::bind("10.99.0.1:7471".parse().unwrap())?;
/// std::thread::spawn(|| -> std::io::Result<()> {
///     let mut s = Stream::connect("10.99.0.1:7471".parse().unwrap())?;
///     s.write_all(b"ping")?;
///     Ok(())
/// });
/// let mut s = listener.accept()?;
/// let mut buf = [0u8; 4];
/// s.read_exact(&mut buf)?;
/// assert_eq!(&buf, b"ping");
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct Listener {
    id: CmId,
    ch: Arc<EventChannel>,
    cfg: StreamConfig,
}

/// Why one incoming handshake failed.
enum Refused {
    /// This side's fault (resources): reported to the caller of `accept`.
    Local(io::Error),
    /// The client's (it left, or timed out): the listener goes on with the next request.
    Peer,
}

impl Listener {
    /// Listens with rdma_cm on `addr` (an address of an RDMA device), default configuration.
    pub fn bind(addr: SocketAddr) -> io::Result<Listener> {
        Self::bind_with(addr, StreamConfig::default())
    }

    /// Listens with rdma_cm on `addr`; accepted streams use `cfg`.
    pub fn bind_with(addr: SocketAddr, cfg: StreamConfig) -> io::Result<Listener> {
        check_available()?;
        cfg.sizes()?;
        let ch = EventChannel::new()?;
        let id = CmId::new(&ch)?;
        id.bind(addr)?;
        id.listen(1024)?;
        Ok(Listener { id, ch, cfg })
    }

    /// The address listened on.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.id.local_addr()
    }

    /// Waits for the next client and completes its handshake.
    ///
    /// A request whose private data does not decode as a `ConnectRequest` of a version spoken
    /// here is rejected with a [`Reject`] stating the reason (`Malformed`,
    /// `UnsupportedVersion`), and the listener goes on waiting; so does a client that vanishes
    /// during the handshake. Only local failures (e.g. no memory for the rings; the client is
    /// then rejected with `Resources`) are returned as errors, and the listener stays usable.
    pub fn accept(&self) -> io::Result<Stream> {
        loop {
            let (ev, id) = match self.ch.next_event_owned(Duration::from_secs(3600)) {
                Err(Error::Timeout(_)) => continue,
                r => r?,
            };
            let Some(id) = id else { continue };
            let req = match ConnectRequest::decode(&ev.private_data) {
                Ok(r) => r,
                Err(e) => {
                    let reject = Reject::new(RejectReason::for_decode_error(&e)).encode();
                    let _ = id.reject(&reject);
                    continue;
                }
            };
            match self.handshake(id, &req) {
                Ok(s) => return Ok(s),
                Err(Refused::Local(e)) => return Err(e),
                Err(Refused::Peer) => continue,
            }
        }
    }

    fn handshake(&self, mut id: CmId, req: &ConnectRequest) -> Result<Stream, Refused> {
        let resources = Reject::new(RejectReason::Resources).encode();
        let sizes = self.cfg.sizes().map_err(Refused::Local)?;
        // The connection's events (ESTABLISHED, DISCONNECTED) go to its own channel.
        let ch = match EventChannel::new().and_then(|ch| id.migrate(&ch).map(|()| ch)) {
            Ok(ch) => ch,
            Err(e) => {
                let _ = id.reject(&resources);
                return Err(Refused::Local(e.into()));
            }
        };
        let mut ep = match Endpoint::new(id, ch, sizes) {
            Ok(ep) => ep,
            Err(failed) => {
                let (e, id) = *failed;
                let _ = id.reject(&resources);
                return Err(Refused::Local(e.into()));
            }
        };
        if let Err(e) = ep.set_peer_ring(req.ring.size) {
            let _ = ep.id.reject(&resources);
            return Err(Refused::Local(e.into()));
        }
        let now = Instant::now();
        let (conn, reply) = Connection::accept(self.cfg.protocol, ep.local_params(), req, 0, now)
            .map_err(|e| {
            let _ = ep.id.reject(&resources);
            Refused::Local(err(io::ErrorKind::InvalidInput, e.to_string()))
        })?;
        let param = ConnParam {
            private_data: &reply.encode(),
            ..Default::default()
        };
        if ep.id.accept(&param).is_err() {
            return Err(Refused::Peer);
        }
        let mut s = Stream::new(conn, ep, self.cfg);
        let deadline = now + self.cfg.connect_timeout;
        let ok = s
            .block(Some(deadline), |s| {
                s.conn.state() != StreamState::Handshaking || s.conn.error().is_some()
            })
            .unwrap_or(false);
        if !ok || s.conn.error().is_some() {
            return Err(Refused::Peer);
        }
        if s.conn.commit_switch(0).is_err() {
            return Err(Refused::Peer);
        }
        s.perform();
        Ok(s)
    }
}

/// One ring-stream connection: a reliable, ordered byte stream like a TCP socket, moved by
/// RDMA WRITE WITH IMMEDIATE into the peer's receive ring.
///
/// Blocking calls ([`send`](Self::send), [`recv`](Self::recv), the `Read`/`Write` impls) wait
/// like a blocking socket; [`isend`](Self::isend)/[`irecv`](Self::irecv) queue an operation and
/// return a handle that completes while any call drives the stream. Blocking calls and queued
/// ones keep their order: a `send` goes after the `isend`s queued before it, a `recv` after the
/// `irecv`s. Dropping a stream closes it gracefully ([`close`](Self::close)).
///
/// ```no_run
/// use rdmashim_core::Stream;
///
/// let mut s = Stream::connect("10.99.0.1:7471".parse().unwrap())?;
/// let h = s.isend(vec![7u8; 1 << 20]);       // queued; progresses in the background of calls
/// let r = s.irecv(16);                       // the next 16 bytes the peer sends
/// s.wait_send(h)?;
/// let reply: Vec<u8> = s.wait_recv(r)?;      // fewer than 16 only at EOF
/// s.shutdown(std::net::Shutdown::Write)?;    // peer reads to EOF, can still answer
/// let mut rest = Vec::new();
/// std::io::Read::read_to_end(&mut s, &mut rest)?;
/// s.close()?;
/// # let _ = reply;
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct Stream {
    conn: Connection,
    ep: Endpoint,
    cfg: StreamConfig,
    teardown: Td,
    /// What the transport reported when the connection failed (the failing call and status).
    failure: Option<String>,
    sends: VecDeque<PendingSend>,
    recvs: VecDeque<PendingRecv>,
    finished_sends: HashMap<u64, Result<(), Failure>>,
    finished_recvs: HashMap<u64, Result<Vec<u8>, Failure>>,
    next_handle: u64,
    close_called: bool,
    /// Next time `progress` reads the rdma_cm channel without being told to (each read is a
    /// system call; a sleeping wait watches the channel's fd anyway).
    next_cm_check: Instant,
}

/// How often a busy stream looks at its rdma_cm channel.
const CM_CHECK_EVERY: Duration = Duration::from_millis(1);

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("state", &self.conn.state())
            .field("local", &self.ep.local_addr())
            .field("peer", &self.ep.peer_addr())
            .finish()
    }
}

impl Stream {
    /// Connects to a [`Listener`] at `addr`, default configuration.
    pub fn connect(addr: SocketAddr) -> io::Result<Stream> {
        Self::connect_with(addr, StreamConfig::default())
    }

    /// Connects to a [`Listener`] at `addr` with `cfg`. A rejection is `ConnectionRefused`
    /// (naming the reason the server gave); no RDMA on this host is `Unsupported`.
    pub fn connect_with(addr: SocketAddr, cfg: StreamConfig) -> io::Result<Stream> {
        check_available()?;
        let sizes = cfg.sizes()?;
        let t = cfg.connect_timeout;
        let ch = EventChannel::new()?;
        let id = CmId::new(&ch)?;
        id.resolve_addr(None, addr, t)?;
        ch.expect(
            et::RDMA_CM_EVENT_ADDR_RESOLVED,
            "RDMA_CM_EVENT_ADDR_RESOLVED",
            t,
        )?;
        id.resolve_route(t)?;
        ch.expect(
            et::RDMA_CM_EVENT_ROUTE_RESOLVED,
            "RDMA_CM_EVENT_ROUTE_RESOLVED",
            t,
        )?;
        let mut ep = Endpoint::new(id, ch.clone(), sizes).map_err(|f| f.0)?;
        let local_port = ep.local_addr().map_or(0, |a| a.port());
        let (mut conn, req) = Connection::connect(
            cfg.protocol,
            ep.local_params(),
            local_port,
            addr.port(),
            nonce(),
            0,
            Instant::now(),
        )
        .map_err(|e| err(io::ErrorKind::InvalidInput, e.to_string()))?;
        ep.id.connect(&ConnParam {
            private_data: &req.encode(),
            ..Default::default()
        })?;
        let ev = ch.next_event(t)?;
        match ev.kind {
            et::RDMA_CM_EVENT_ESTABLISHED => {
                conn.handle_accept(&ev.private_data)
                    .map_err(|r| err(r.io_kind(), format!("rdma_connect to {addr}: {r}")))?;
            }
            et::RDMA_CM_EVENT_REJECTED => {
                conn.handle_reject(&ev.private_data);
                let why = conn
                    .error()
                    .map_or_else(|| "rejected".to_owned(), |r| r.to_string());
                return Err(err(
                    io::ErrorKind::ConnectionRefused,
                    format!("rdma_connect to {addr}: {why}"),
                ));
            }
            _ => {
                return Err(Error::UnexpectedEvent {
                    expected: "RDMA_CM_EVENT_ESTABLISHED",
                    got: ev.name(),
                    status: ev.status,
                    private_data: ev.private_data,
                }
                .into())
            }
        }
        let peer = conn
            .peer_ring()
            .ok_or_else(|| err(io::ErrorKind::InvalidData, "no peer ring after the reply"))?;
        ep.set_peer_ring(peer.size)?;
        conn.commit_switch(0)
            .map_err(|e| err(io::ErrorKind::InvalidData, e.to_string()))?;
        let mut s = Stream::new(conn, ep, cfg);
        s.progress();
        Ok(s)
    }

    fn new(conn: Connection, ep: Endpoint, cfg: StreamConfig) -> Stream {
        Stream {
            conn,
            ep,
            cfg,
            teardown: Td::Running,
            failure: None,
            sends: VecDeque::new(),
            recvs: VecDeque::new(),
            finished_sends: HashMap::new(),
            finished_recvs: HashMap::new(),
            next_handle: 1,
            close_called: false,
            next_cm_check: Instant::now(),
        }
    }

    // ----- the driver ------------------------------------------------------------------------

    /// One pass of the driving loop (see the module docs). Never blocks.
    fn progress(&mut self) {
        self.poll_cq();
        let now = Instant::now();
        if now >= self.next_cm_check {
            self.next_cm_check = now + CM_CHECK_EVERY;
            self.poll_cm();
        }
        if self.conn.poll_timeout().is_some() {
            self.conn.handle_timeout(now);
        }
        self.pump();
        self.perform();
        self.drive_teardown();
    }

    /// Polls the CQ dry; returns whether anything completed.
    fn poll_cq(&mut self) -> bool {
        let mut wcs = [empty_wc(); 16];
        let mut any = false;
        loop {
            let n = match self.ep.cq.poll(&mut wcs) {
                Ok(n) => n,
                Err(e) => {
                    self.transport_failed(e.to_string());
                    return any;
                }
            };
            for wc in &wcs[..n] {
                self.on_completion(wc);
            }
            any |= n > 0;
            if n < wcs.len() {
                return any;
            }
        }
    }

    fn on_completion(&mut self, wc: &ffi::ibv_wc) {
        let ok = wc.status == ffi::ibv_wc_status::IBV_WC_SUCCESS;
        if wc.wr_id & SEND_TAG != 0 {
            self.ep.on_send_completion(wc.wr_id);
            if !ok {
                let msg = self.wc_error("send", wc);
                self.transport_failed(msg);
            }
            return;
        }
        let Some(slot) = self.ep.recv_slot(wc.wr_id) else {
            return;
        };
        if !ok {
            let msg = self.wc_error("receive", wc);
            self.transport_failed(msg);
            return;
        }
        if Endpoint::is_write_imm(wc) {
            let Some(raw) = wc_imm_data(wc) else {
                self.transport_failed(
                    "ibv_poll_cq: RECV_RDMA_WITH_IMM without an immediate".into(),
                );
                return;
            };
            // The ring bytes of a DATA are visible once its completion was polled; see
            // "Memory ordering" in docs/protocol.md.
            let _ = self.conn.handle_completion(Completion::WriteImm {
                imm: u32::from_be(raw),
                byte_len: Some(wc.byte_len),
            });
        } else if wc.opcode == ffi::ibv_wc_opcode::IBV_WC_RECV {
            let payload = self.ep.recv_payload(slot, wc.byte_len);
            let _ = self.conn.handle_completion(Completion::Recv { payload });
        }
        // Re-post right after the core saw the completion, before its actions are performed.
        if self.teardown != Td::Disconnected && self.conn.error().is_none() {
            if let Err(e) = self.ep.repost_recv(slot) {
                self.transport_failed(e.to_string());
            }
        }
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
    fn poll_cm(&mut self) {
        loop {
            match self.ep.ch.try_event() {
                Ok(None) => return,
                Ok(Some(ev)) => {
                    self.poll_cq();
                    self.on_cm_event(ev);
                }
                Err(e) => {
                    self.transport_failed(e.to_string());
                    return;
                }
            }
        }
    }

    fn on_cm_event(&mut self, ev: Event) {
        match ev.kind {
            et::RDMA_CM_EVENT_ESTABLISHED => self.conn.handle_established(),
            et::RDMA_CM_EVENT_TIMEWAIT_EXIT | et::RDMA_CM_EVENT_ADDR_CHANGE => {}
            _ => {
                // DISCONNECTED, DEVICE_REMOVAL, …: fatal unless the wire is already done.
                let msg = format!("rdma_get_cm_event: {} (status {})", ev.name(), ev.status);
                self.transport_failed(msg);
            }
        }
    }

    /// The QP or the CM failed: the core decides whether that matters (not after a clean end).
    fn transport_failed(&mut self, msg: String) {
        let before = self.conn.error().is_some();
        self.conn.handle_transport_error();
        if !before && self.conn.error().is_some() && self.failure.is_none() {
            self.failure = Some(msg);
        }
    }

    /// Performs the core's actions while the send queue has room.
    fn perform(&mut self) {
        if self.teardown != Td::Running {
            return;
        }
        while self.ep.sq_room() > 0 {
            let Some(a) = self.conn.poll_action() else {
                return;
            };
            if a == Action::Teardown {
                self.teardown = Td::Draining {
                    since: Instant::now(),
                    fenced: false,
                };
                self.drive_teardown();
                return;
            }
            let rkey = self.conn.peer_ring().map_or(0, |r| r.rkey);
            if let Err(e) = self.ep.post(&a, rkey) {
                self.transport_failed(e.to_string());
            }
        }
    }

    /// After `Teardown`: disconnect once the posted work requests completed (a signaled fence
    /// behind unsignaled ones makes that observable), at once after a failure, or when the
    /// close timeout passed.
    fn drive_teardown(&mut self) {
        let Td::Draining { since, fenced } = self.teardown else {
            return;
        };
        let done = self.ep.outstanding() == 0
            || self.conn.error().is_some()
            || since.elapsed() >= self.cfg.close_timeout;
        if !done && !fenced && !self.ep.last_signaled() {
            let posted = self
                .conn
                .peer_ring()
                .map(|r| self.ep.post_fence(&r).is_ok());
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
        let _ = self.ep.id.disconnect();
        self.teardown = Td::Disconnected;
    }

    /// Moves queued isend/irecv bytes between the application and the rings.
    fn pump(&mut self) {
        while let Some(p) = self.sends.front_mut() {
            let want = p.data.len() - p.done;
            let outcome = if want == 0 {
                Some(Ok(()))
            } else {
                match self.conn.send(want) {
                    Ok(g) => {
                        stage(
                            self.ep.tx.as_mut(),
                            g.cursor,
                            &p.data[p.done..p.done + g.len],
                        );
                        p.done += g.len;
                        (p.done == p.data.len()).then_some(Ok(()))
                    }
                    Err(SendError::WouldBlock) => None,
                    Err(SendError::ViaTcp) if self.conn.error().is_none() => None,
                    Err(e) => Some(Err(Failure::from(&send_error(
                        &self.conn,
                        &self.failure,
                        e,
                    )))),
                }
            };
            match outcome {
                None => break,
                Some(r) => {
                    let id = p.id;
                    self.sends.pop_front();
                    self.finished_sends.insert(id, r);
                }
            }
        }
        while let Some(p) = self.recvs.front_mut() {
            let outcome = if p.buf.len() == p.want {
                Some(Ok(()))
            } else {
                match self.conn.recv() {
                    Recv::Ring { offset, len } => {
                        let n = len.min(p.want - p.buf.len());
                        p.buf.extend_from_slice(self.ep.rx.ring().slice(offset, n));
                        let _ = self.conn.consume(n);
                        (p.buf.len() == p.want).then_some(Ok(()))
                    }
                    Recv::Eof => Some(Ok(())),
                    Recv::Error(r) => Some(Err(Failure::from(&reason_error(&self.failure, r)))),
                    Recv::WouldBlock => None,
                    Recv::Tcp { .. } => self
                        .conn
                        .error()
                        .map(|r| Err(Failure::from(&reason_error(&self.failure, r)))),
                }
            };
            match outcome {
                None => break,
                Some(r) => {
                    let p = self.recvs.pop_front().expect("front exists");
                    self.finished_recvs.insert(p.id, r.map(|()| p.buf));
                }
            }
        }
    }

    /// Blocks until `done` holds or `deadline` passes (`Ok(false)`).
    fn block(
        &mut self,
        deadline: Option<Instant>,
        mut done: impl FnMut(&mut Stream) -> bool,
    ) -> io::Result<bool> {
        block_many(std::slice::from_mut(self), deadline, |ss| done(&mut ss[0]))
    }

    fn reason_error(&self, r: ErrorReason) -> io::Error {
        reason_error(&self.failure, r)
    }

    fn send_error(&self, e: SendError) -> io::Error {
        send_error(&self.conn, &self.failure, e)
    }

    // ----- blocking API ----------------------------------------------------------------------

    /// Sends some of `buf`, blocking until at least one byte is accepted (like a blocking
    /// socket `write`). Returns how many bytes were accepted; they are delivered in order.
    /// Fails with `BrokenPipe` after a shutdown or once the peer closed, `ConnectionReset`
    /// when the connection failed.
    pub fn send(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let mut out = None;
        self.block(None, |s| {
            if !s.sends.is_empty() {
                return false;
            }
            match s.conn.send(buf.len()) {
                Ok(g) => {
                    stage(s.ep.tx.as_mut(), g.cursor, &buf[..g.len]);
                    out = Some(Ok(g.len));
                    true
                }
                Err(SendError::WouldBlock) => false,
                Err(SendError::ViaTcp) if s.conn.error().is_none() => false,
                Err(e) => {
                    out = Some(Err(s.send_error(e)));
                    true
                }
            }
        })?;
        self.perform();
        out.unwrap_or_else(|| Err(err(io::ErrorKind::Other, "send ended without a result")))
    }

    /// Sends all of `buf` (blocking).
    pub fn write_all(&mut self, mut buf: &[u8]) -> io::Result<()> {
        while !buf.is_empty() {
            let n = self.send(buf)?;
            buf = &buf[n..];
        }
        Ok(())
    }

    /// Receives into `buf`, blocking until at least one byte is there. Returns how many bytes
    /// were read; 0 means end of stream (the peer shut down its write side or closed).
    pub fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let mut out = None;
        self.block(None, |s| {
            if !s.recvs.is_empty() {
                return false;
            }
            match s.conn.recv() {
                Recv::Ring { offset, len } => {
                    let n = len.min(buf.len());
                    buf[..n].copy_from_slice(s.ep.rx.ring().slice(offset, n));
                    out = Some(
                        s.conn
                            .consume(n)
                            .map(|()| n)
                            .map_err(|e| err(io::ErrorKind::InvalidData, e.to_string())),
                    );
                    true
                }
                Recv::Eof => {
                    out = Some(Ok(0));
                    true
                }
                Recv::Error(r) => {
                    out = Some(Err(s.reason_error(r)));
                    true
                }
                Recv::WouldBlock => false,
                // No TCP behind a native stream: the peer's SwitchOver is still on its way,
                // unless the connection failed before it came.
                Recv::Tcp { .. } => match s.conn.error() {
                    Some(r) => {
                        out = Some(Err(s.reason_error(r)));
                        true
                    }
                    None => false,
                },
            }
        })?;
        self.perform();
        out.unwrap_or_else(|| Err(err(io::ErrorKind::Other, "recv ended without a result")))
    }

    /// Blocks until every accepted byte has been handed to the device.
    pub fn flush_ring(&mut self) -> io::Result<()> {
        let mut res = Ok(());
        self.block(None, |s| {
            if let Some(r) = s.conn.error() {
                res = Err(s.reason_error(r));
                return true;
            }
            s.sends.is_empty() && s.conn.tx_cursors().is_none_or(|t| t.unposted() == 0)
        })?;
        res
    }

    /// `Shutdown::Write`: the peer reads what was sent, then EOF, and can still send back;
    /// further sends fail with `BrokenPipe`. `Shutdown::Read`: reads return EOF, incoming data
    /// is dropped (and credited). Queued isends go out before the shutdown.
    pub fn shutdown(&mut self, how: Shutdown) -> io::Result<()> {
        if matches!(how, Shutdown::Write | Shutdown::Both) {
            if !self.sends.is_empty() {
                self.block(None, |s| s.sends.is_empty())?;
            }
            if let Some(r) = self.conn.error() {
                return Err(self.reason_error(r));
            }
            self.conn
                .shutdown_write()
                .map_err(|e| err(io::ErrorKind::NotConnected, e.to_string()))?;
        }
        if matches!(how, Shutdown::Read | Shutdown::Both) {
            self.conn.shutdown_read();
        }
        self.progress();
        Ok(())
    }

    /// Closes the stream gracefully: queued isends and accepted bytes go out, then `Close`;
    /// then the queue pair is disconnected. Never waits longer than
    /// [`StreamConfig::close_timeout`] (then it disconnects anyway and reports `TimedOut`).
    /// Unread received data makes it an abortive close (the peer sees `ConnectionReset`), as
    /// with TCP.
    pub fn close(mut self) -> io::Result<()> {
        self.close_inner()
    }

    fn close_inner(&mut self) -> io::Result<()> {
        if self.teardown == Td::Disconnected {
            return Ok(());
        }
        let deadline = Instant::now() + self.cfg.close_timeout;
        if !self.sends.is_empty() {
            let _ = self.block(Some(deadline), |s| {
                s.sends.is_empty() || s.conn.error().is_some()
            });
        }
        if !self.close_called {
            self.close_called = true;
            self.conn.close();
        }
        let done = self
            .block(Some(deadline), |s| s.teardown == Td::Disconnected)
            .unwrap_or(false);
        if !done {
            let _ = self.ep.id.disconnect();
            self.teardown = Td::Disconnected;
            return Err(err(
                io::ErrorKind::TimedOut,
                "close: the peer did not take the queued data in time",
            ));
        }
        Ok(())
    }

    // ----- non-blocking API ------------------------------------------------------------------

    /// Queues `data` for sending and returns at once. The bytes go out in order with
    /// everything else sent on this stream, as the stream is driven by any call.
    pub fn isend(&mut self, data: Vec<u8>) -> SendHandle {
        let id = self.next_handle;
        self.next_handle += 1;
        self.sends.push_back(PendingSend { id, data, done: 0 });
        self.progress();
        SendHandle(id)
    }

    /// Queues a receive of the next `len` bytes of the stream and returns at once. It
    /// completes with exactly `len` bytes, or fewer if the stream ends first.
    pub fn irecv(&mut self, len: usize) -> RecvHandle {
        let id = self.next_handle;
        self.next_handle += 1;
        self.recvs.push_back(PendingRecv {
            id,
            buf: Vec::with_capacity(len),
            want: len,
        });
        self.progress();
        RecvHandle(id)
    }

    /// Drives the stream once and tells whether the handle's operation has completed
    /// (successfully or not: [`wait_send`](Self::wait_send)/[`wait_recv`](Self::wait_recv) then
    /// return at once with its outcome).
    pub fn test(&mut self, h: &impl Handle) -> bool {
        self.progress();
        h.is_done(self)
    }

    /// Waits for a queued send.
    pub fn wait_send(&mut self, h: SendHandle) -> io::Result<()> {
        if !self.finished_sends.contains_key(&h.0) && !self.sends.iter().any(|p| p.id == h.0) {
            return Err(err(
                io::ErrorKind::InvalidInput,
                "not a send of this stream",
            ));
        }
        self.block(None, |s| s.finished_sends.contains_key(&h.0))?;
        match self.finished_sends.remove(&h.0) {
            Some(r) => r.map_err(io::Error::from),
            None => Err(err(io::ErrorKind::Other, "send handle lost")),
        }
    }

    /// Waits for a queued receive and returns its bytes.
    pub fn wait_recv(&mut self, h: RecvHandle) -> io::Result<Vec<u8>> {
        if !self.finished_recvs.contains_key(&h.0) && !self.recvs.iter().any(|p| p.id == h.0) {
            return Err(err(
                io::ErrorKind::InvalidInput,
                "not a receive of this stream",
            ));
        }
        self.block(None, |s| s.finished_recvs.contains_key(&h.0))?;
        match self.finished_recvs.remove(&h.0) {
            Some(r) => r.map_err(io::Error::from),
            None => Err(err(io::ErrorKind::Other, "receive handle lost")),
        }
    }

    // ----- queries ---------------------------------------------------------------------------

    /// The local address.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.ep.local_addr()
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.ep.peer_addr()
    }

    /// The connection's state as the protocol core sees it.
    pub fn state(&self) -> StreamState {
        self.conn.state()
    }

    /// Protocol counters (writes, credits, messages).
    pub fn stats(&self) -> Stats {
        self.conn.stats()
    }

    /// The configuration in force.
    pub fn config(&self) -> &StreamConfig {
        &self.cfg
    }

    /// Changes how long blocking calls busy-poll before they sleep.
    pub fn set_spin(&mut self, spin: Duration) {
        self.cfg.spin = spin;
    }

    /// The fds a blocking call sleeps on (completion channel, rdma_cm channel), for event
    /// loops. They are non-blocking; after they become readable, call [`test`](Self::test) or
    /// any other call to drive the stream.
    pub fn wait_fds(&self) -> [RawFd; 2] {
        [self.ep.comp.fd(), self.ep.ch.fd()]
    }
}

/// Copies `bytes` into the staging ring at stream cursor `cursor` (contiguous thanks to the
/// double mapping: the core grants at most the ring's size).
fn stage(tx: Option<&mut RegisteredRing>, cursor: u64, bytes: &[u8]) {
    if let Some(tx) = tx {
        let off = (cursor % tx.size() as u64) as usize;
        tx.ring_mut()
            .slice_mut(off, bytes.len())
            .copy_from_slice(bytes);
    }
}

fn reason_error(failure: &Option<String>, r: ErrorReason) -> io::Error {
    match (r, failure) {
        (ErrorReason::Transport, Some(m)) => err(r.io_kind(), format!("{r}: {m}")),
        _ => err(r.io_kind(), r.to_string()),
    }
}

fn send_error(conn: &Connection, failure: &Option<String>, e: SendError) -> io::Error {
    match e {
        SendError::Failed(r) => reason_error(failure, r),
        SendError::Shutdown => err(io::ErrorKind::BrokenPipe, "send after shutdown(Write)"),
        SendError::PeerClosed => err(io::ErrorKind::BrokenPipe, "the peer closed the stream"),
        SendError::WouldBlock => err(io::ErrorKind::WouldBlock, "no ring space"),
        SendError::ViaTcp => match conn.error() {
            Some(r) => reason_error(failure, r),
            None => err(io::ErrorKind::NotConnected, "the stream is not on the ring"),
        },
    }
}

/// The blocking engine shared by single-stream calls and [`barrier`]: drive every stream,
/// spin on their CQs, then arm and sleep on all their fds.
fn block_many(
    ss: &mut [Stream],
    deadline: Option<Instant>,
    mut done: impl FnMut(&mut [Stream]) -> bool,
) -> io::Result<bool> {
    let spin = ss.iter().map(|s| s.cfg.spin).max().unwrap_or_default();
    loop {
        for s in ss.iter_mut() {
            s.progress();
        }
        if done(ss) {
            return Ok(true);
        }
        let spin_end = Instant::now() + spin;
        while Instant::now() < spin_end {
            let mut any = false;
            for s in ss.iter_mut() {
                if s.poll_cq() {
                    any = true;
                    s.pump();
                    s.perform();
                    s.drive_teardown();
                }
            }
            if any && done(ss) {
                return Ok(true);
            }
            std::hint::spin_loop();
        }
        // Arm, then look once more: a completion between the last poll and the arm raised no
        // event.
        for s in ss.iter_mut() {
            if let Err(e) = s.ep.cq.arm() {
                s.transport_failed(e.to_string());
            }
            s.progress();
        }
        if done(ss) {
            return Ok(true);
        }
        let now = Instant::now();
        let mut timeout: Option<Duration> = deadline.map(|d| d.saturating_duration_since(now));
        if timeout == Some(Duration::ZERO) {
            return Ok(false);
        }
        for s in ss.iter() {
            let wake = match s.teardown {
                Td::Draining { .. } => Some(Duration::from_millis(10)),
                _ => s
                    .conn
                    .poll_timeout()
                    .map(|t| t.saturating_duration_since(now)),
            };
            if let Some(w) = wake {
                timeout = Some(timeout.map_or(w, |t| t.min(w)));
            }
        }
        let ms = timeout.map_or(-1, |t| {
            (t.as_micros().div_ceil(1000)).clamp(1, i32::MAX as u128) as i32
        });
        let fds: Vec<RawFd> = ss.iter().flat_map(|s| s.wait_fds()).collect();
        verbs::poll_fds(&fds, ms)?;
        for s in ss.iter_mut() {
            s.next_cm_check = Instant::now();
            loop {
                match s.ep.comp.take_event() {
                    Ok(Some(_)) => continue,
                    Ok(None) => break,
                    Err(e) => {
                        s.transport_failed(e.to_string());
                        break;
                    }
                }
            }
        }
    }
}

/// Returns when every peer of `streams` has reached the barrier too (called `barrier` on its
/// end of the same connection).
///
/// Each stream sends a `Barrier` control message behind the data sent before it, then this
/// waits for the peers' barriers. A peer that ends its stream or fails before reaching the
/// barrier makes this fail (`UnexpectedEof`, `ConnectionReset`) instead of waiting forever.
///
/// ```no_run
/// use rdmashim_core::{barrier, Stream};
///
/// let mut peers: Vec<Stream> = ["10.99.0.1:7471", "10.99.0.1:7472"]
///     .iter()
///     .map(|a| Stream::connect(a.parse().unwrap()))
///     .collect::<Result<_, _>>()?;
/// barrier(&mut peers)?; // every peer called barrier on its side
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn barrier(streams: &mut [Stream]) -> io::Result<()> {
    let mut epochs = Vec::with_capacity(streams.len());
    for s in streams.iter_mut() {
        if !s.sends.is_empty() {
            s.block(None, |s| s.sends.is_empty() || s.conn.error().is_some())?;
        }
        let e = s.conn.barrier().map_err(|e| s.send_error(e))?;
        epochs.push(e);
        s.perform();
    }
    let mut failed = None;
    block_many(streams, None, |ss| {
        for (s, &e) in ss.iter().zip(&epochs) {
            if s.conn.barriers_received() >= e {
                continue;
            }
            if let Some(r) = s.conn.error() {
                failed = Some(s.reason_error(r));
                return true;
            }
            if s.conn.rdhup() {
                failed = Some(err(
                    io::ErrorKind::UnexpectedEof,
                    "a peer ended its stream before reaching the barrier",
                ));
                return true;
            }
            return false;
        }
        true
    })?;
    failed.map_or(Ok(()), Err)
}

impl io::Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.recv(buf)
    }
}

impl io::Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.send(buf)
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        Stream::write_all(self, buf)
    }

    /// Waits until every accepted byte was handed to the device ([`Stream::flush_ring`]).
    fn flush(&mut self) -> io::Result<()> {
        self.flush_ring()
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _ = self.close_inner();
    }
}
