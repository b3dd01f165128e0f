//! Ring-buffer byte streams over RC queue pairs: the blocking native Rust API ([`Listener`],
//! [`Stream`], [`barrier`]) on top of the non-blocking [`Link`].
//!
//! A [`Stream`] is a [`Link`] (the sans-IO [`Connection`] of `rdmashim-proto` plus the verbs
//! resources of one connection, see [`crate::link`]) with queues of [`Stream::isend`]/
//! [`Stream::irecv`] operations. Every call drives it with the link's loop, moving queued bytes
//! between the link's inputs (completions, rdma_cm events) and its actions.
//!
//! Blocking calls spin on the CQ for [`StreamConfig::spin`], then arm the CQ, poll it once more
//! and sleep in `poll(2)` on the completion channel and the rdma_cm channel: an idle stream
//! burns no CPU, a busy one pays no interrupts.
//!
//! A native stream has no TCP connection behind it: both sides commit their sending direction
//! to the ring right after the handshake (`commit_switch(0)`).

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{Shutdown, SocketAddr};
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use rdmashim_proto::{Connection, Recv, SendError, Stats, StreamState};

pub use crate::link::StreamConfig;
use crate::link::{
    check_available, err, poll_ms, DialError, DialStatus, Dialer, Incoming, Link, Refused,
    UpgradeListener,
};
use crate::{tick, verbs};

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
    inner: UpgradeListener,
    cfg: StreamConfig,
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
        let inner = UpgradeListener::bind(addr)?;
        Ok(Listener { inner, cfg })
    }

    /// The address listened on.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.inner.local_addr()
    }

    /// Waits for the next client and completes its handshake.
    ///
    /// A request whose private data does not decode as a `ConnectRequest` of a version spoken
    /// here is rejected with a [`Reject`](rdmashim_proto::Reject) stating the reason
    /// (`Malformed`, `UnsupportedVersion`), and the listener goes on waiting; so does a client
    /// that vanishes during the handshake. Only local failures (e.g. no memory for the rings;
    /// the client is then rejected with `Resources`) are returned as errors, and the listener
    /// stays usable.
    pub fn accept(&self) -> io::Result<Stream> {
        loop {
            let Some(incoming) = self.inner.next()? else {
                verbs::poll_readable(self.inner.fd(), -1, "poll(rdma event channel)")?;
                continue;
            };
            match self.handshake(incoming) {
                Ok(s) => return Ok(s),
                Err(Refused::Local(e)) => return Err(e),
                Err(Refused::Peer(_)) => continue,
            }
        }
    }

    fn handshake(&self, incoming: Incoming) -> Result<Stream, Refused> {
        let link = incoming.answer(&self.cfg, 0, &rdmashim_proto::Proof::Native)?;
        Stream::accepted(link, self.cfg)
    }
}

impl Stream {
    /// A server's stream once its answer went out: waits (at most the connect timeout) for
    /// the client to establish the link (rdma_cm's RTU, or the shared-memory confirmation),
    /// then commits this side. A client that left meanwhile is `Refused::Peer`.
    fn accepted(link: Link, cfg: StreamConfig) -> Result<Stream, Refused> {
        let deadline = Instant::now() + cfg.connect_timeout;
        let mut s = Stream::new(link, cfg);
        let gone = || Refused::Peer(err(io::ErrorKind::ConnectionAborted, "the client left"));
        let ok = s
            .block(Some(deadline), |s| {
                s.conn().state() != StreamState::Handshaking || s.conn().error().is_some()
            })
            .unwrap_or(false);
        if !ok || s.conn().error().is_some() {
            return Err(gone());
        }
        if s.link.conn_mut().commit_switch(0).is_err() {
            return Err(gone());
        }
        s.link.perform();
        Ok(s)
    }
}

/// A listener for streams from processes of this host, over shared memory (`crate::shm`):
/// the native API's local twin of [`Listener`].
pub struct LocalListener {
    inner: crate::rendezvous::ShmListener,
    cfg: StreamConfig,
}

impl LocalListener {
    /// Listens on the abstract Unix name `name`; accepted streams use `cfg`.
    pub fn bind(name: &[u8], cfg: StreamConfig) -> io::Result<LocalListener> {
        cfg.sizes()?;
        Ok(LocalListener {
            inner: crate::rendezvous::ShmListener::bind(name)?,
            cfg,
        })
    }

    /// Waits for the next client and completes its handshake. A request that cannot be
    /// accepted is rejected and the listener goes on waiting; local failures are returned.
    pub fn accept(&self) -> io::Result<Stream> {
        loop {
            let Some(incoming) = self.inner.next()? else {
                verbs::poll_readable(self.inner.fd(), -1, "poll(rendezvous socket)")?;
                continue;
            };
            let link = match incoming.accept(&self.cfg, 0, &rdmashim_proto::Proof::Native) {
                Ok(l) => l,
                Err(e) if e.kind() == io::ErrorKind::PermissionDenied => continue,
                Err(e) => return Err(e),
            };
            match Stream::accepted(link, self.cfg) {
                Ok(s) => return Ok(s),
                Err(Refused::Local(e)) => return Err(e),
                Err(Refused::Peer(_)) => continue,
            }
        }
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
    link: Link,
    cfg: StreamConfig,
    sends: VecDeque<PendingSend>,
    recvs: VecDeque<PendingRecv>,
    finished_sends: HashMap<u64, Result<(), Failure>>,
    finished_recvs: HashMap<u64, Result<Vec<u8>, Failure>>,
    next_handle: u64,
    close_called: bool,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("state", &self.conn().state())
            .field("local", &self.link.local_addr())
            .field("peer", &self.link.peer_addr())
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
        // The request carries the rdma_cm source port: no TCP connection behind it.
        let mut dial = Dialer::begin(None, addr, None, rdmashim_proto::Proof::Native, &cfg)?;
        let what = format!("rdma_connect to {addr}");
        Self::dialed(
            || (dial.poll(0), dial.fd(), dial.deadline()),
            "poll(rdma event channel)",
            &what,
            cfg,
        )
    }

    /// Connects to a [`LocalListener`] of this host listening on the abstract Unix name
    /// `name`, over shared memory, with `cfg`. No listener: `ConnectionRefused`.
    pub fn connect_local(name: &[u8], cfg: StreamConfig) -> io::Result<Stream> {
        let mut dial = crate::rendezvous::ShmDialer::start(
            name,
            std::net::SocketAddr::from(([0u8; 16], 0)),
            0,
            rdmashim_proto::Proof::Native,
            0,
            &cfg,
        )?;
        Self::dialed(
            || (dial.poll(), dial.fd(), dial.deadline()),
            "poll(rendezvous socket)",
            "shared-memory connect",
            cfg,
        )
    }

    /// Drives a dial (`poll`: one step, with the dial's fd and deadline) to its end, sleeping
    /// on its fd (`waiting`: the poll's name in errors), and makes the native stream on the
    /// link: the switch committed at 0 (`what` names the dial in a failure's message).
    fn dialed(
        mut poll: impl FnMut() -> (DialStatus, RawFd, Instant),
        waiting: &'static str,
        what: &str,
        cfg: StreamConfig,
    ) -> io::Result<Stream> {
        let link = loop {
            match poll() {
                (DialStatus::Pending, fd, deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    verbs::poll_readable(fd, poll_ms(left), waiting)?;
                }
                (DialStatus::Connected(link), ..) => break link,
                (DialStatus::Failed(DialError::Local(e)), ..) => return Err(e),
                (DialStatus::Failed(e), ..) => {
                    return Err(err(e.io_kind(), format!("{what}: {e}")))
                }
            }
        };
        let mut s = Stream::new(link, cfg);
        s.link
            .conn_mut()
            .commit_switch(0)
            .map_err(|e| err(io::ErrorKind::InvalidData, e.to_string()))?;
        s.progress();
        Ok(s)
    }

    fn new(link: Link, cfg: StreamConfig) -> Stream {
        Stream {
            link,
            cfg,
            sends: VecDeque::new(),
            recvs: VecDeque::new(),
            finished_sends: HashMap::new(),
            finished_recvs: HashMap::new(),
            next_handle: 1,
            close_called: false,
        }
    }

    fn conn(&self) -> &Connection {
        self.link.conn()
    }

    // ----- the driver ------------------------------------------------------------------------

    /// One pass of the link's driving loop, with queued bytes moved between its inputs and its
    /// actions. Never blocks.
    fn progress(&mut self) {
        self.link.take_inputs(false);
        self.pump();
        self.link.act();
    }

    /// Moves queued isend/irecv bytes between the application and the rings.
    fn pump(&mut self) {
        while let Some(p) = self.sends.front_mut() {
            let want = p.data.len() - p.done;
            let outcome = if want == 0 {
                Some(Ok(()))
            } else {
                match self.link.send(want) {
                    Ok(g) => {
                        self.link.stage(g.cursor, &p.data[p.done..p.done + g.len]);
                        p.done += g.len;
                        (p.done == p.data.len()).then_some(Ok(()))
                    }
                    Err(SendError::WouldBlock) => None,
                    Err(SendError::ViaTcp) if self.link.conn().error().is_none() => None,
                    Err(e) => Some(Err(Failure::from(&self.link.send_error(e)))),
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
                match self.link.conn().recv() {
                    Recv::Ring { .. } => {
                        // (records come one at a time: take as many as the receive wants)
                        while let Recv::Ring { gen, offset, len } = self.link.conn().recv() {
                            let n = len.min(p.want - p.buf.len());
                            p.buf.extend_from_slice(self.link.ring(gen, offset, n));
                            let _ = self.link.consume(n);
                            if p.buf.len() == p.want || !self.link.conn().records() {
                                break;
                            }
                        }
                        (p.buf.len() == p.want).then_some(Ok(()))
                    }
                    Recv::Eof => Some(Ok(())),
                    Recv::Error(r) => Some(Err(Failure::from(&self.link.error_for(r)))),
                    Recv::WouldBlock => None,
                    // (a native stream never fails over to TCP: it has none)
                    Recv::Tcp { .. } | Recv::TcpControl { .. } => self
                        .link
                        .conn()
                        .error()
                        .map(|r| Err(Failure::from(&self.link.error_for(r)))),
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
            match s.link.send(buf.len()) {
                Ok(g) => {
                    s.link.stage(g.cursor, &buf[..g.len]);
                    out = Some(Ok(g.len));
                    true
                }
                Err(SendError::WouldBlock) => false,
                Err(SendError::ViaTcp) if s.conn().error().is_none() => false,
                Err(e) => {
                    out = Some(Err(s.link.send_error(e)));
                    true
                }
            }
        })?;
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
            match s.conn().recv() {
                Recv::Ring { .. } => {
                    // (records come one at a time: a read takes as many as it has room for)
                    let mut n = 0;
                    while let Recv::Ring { gen, offset, len } = s.conn().recv() {
                        let k = len.min(buf.len() - n);
                        buf[n..n + k].copy_from_slice(s.link.ring(gen, offset, k));
                        if let Err(e) = s.link.consume(k) {
                            out = Some(Err(err(io::ErrorKind::InvalidData, e.to_string())));
                            return true;
                        }
                        n += k;
                        if n == buf.len() || !s.conn().records() {
                            break;
                        }
                    }
                    out = Some(Ok(n));
                    true
                }
                Recv::Eof => {
                    out = Some(Ok(0));
                    true
                }
                Recv::Error(r) => {
                    out = Some(Err(s.link.error_for(r)));
                    true
                }
                Recv::WouldBlock => false,
                // No TCP behind a native stream: the peer's SwitchOver is still on its way,
                // unless the connection failed before it came. (It never fails over: no TCP.)
                Recv::Tcp { .. } | Recv::TcpControl { .. } => match s.conn().error() {
                    Some(r) => {
                        out = Some(Err(s.link.error_for(r)));
                        true
                    }
                    None => false,
                },
            }
        })?;
        out.unwrap_or_else(|| Err(err(io::ErrorKind::Other, "recv ended without a result")))
    }

    /// Blocks until every accepted byte has been handed to the device.
    pub fn flush_ring(&mut self) -> io::Result<()> {
        let mut res = Ok(());
        self.block(None, |s| {
            if let Some(r) = s.conn().error() {
                res = Err(s.link.error_for(r));
                return true;
            }
            s.sends.is_empty() && s.conn().tx_cursors().is_none_or(|t| t.unposted() == 0)
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
            if let Some(r) = self.conn().error() {
                return Err(self.link.error_for(r));
            }
            self.link
                .conn_mut()
                .shutdown_write()
                .map_err(|e| err(io::ErrorKind::NotConnected, e.to_string()))?;
        }
        if matches!(how, Shutdown::Read | Shutdown::Both) {
            self.link.conn_mut().shutdown_read();
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
        if self.link.is_disconnected() {
            return Ok(());
        }
        let deadline = Instant::now() + self.cfg.close_timeout;
        if !self.sends.is_empty() {
            let _ = self.block(Some(deadline), |s| {
                s.sends.is_empty() || s.conn().error().is_some()
            });
        }
        if !self.close_called {
            self.close_called = true;
            self.link.conn_mut().close();
        }
        let done = self
            .block(Some(deadline), |s| s.link.is_disconnected())
            .unwrap_or(false);
        if !done {
            self.link.disconnect();
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
        self.link.local_addr()
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.link.peer_addr()
    }

    /// The connection's state as the protocol core sees it.
    pub fn state(&self) -> StreamState {
        self.conn().state()
    }

    /// Protocol counters (writes, credits, messages).
    pub fn stats(&self) -> Stats {
        self.conn().stats()
    }

    /// Whether the connection carries records (both sides offered them: protocol §14), the
    /// ring kind whose reader polls ring memory instead of taking a completion per write.
    pub fn records(&self) -> bool {
        self.conn().records()
    }

    /// The connection kind it carries ([`Kind`](rdmashim_proto::Kind): the one both sides
    /// asked for in `protocol.kind`, else WRITE WITH IMMEDIATE).
    pub fn kind(&self) -> rdmashim_proto::Kind {
        self.conn().kind()
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
        [self.link.comp_fd(), self.link.cm_fd()]
    }
}

/// The longest nap of a reader of records whose notice is out (see `block_many`).
const RECORDS_NAP_MAX_MS: u64 = 64;

/// The blocking engine shared by single-stream calls and [`barrier`]: drive every stream,
/// spin on their CQs, then arm and sleep on all their fds.
fn block_many(
    ss: &mut [Stream],
    deadline: Option<Instant>,
    mut done: impl FnMut(&mut [Stream]) -> bool,
) -> io::Result<bool> {
    let spin = ss.iter().map(|s| s.cfg.spin).max().unwrap_or_default();
    // `done` is asked first of all without polling: the bytes a read wants may have arrived
    // during the previous call's spin, a write may find ring room at once (an unpolled CQ
    // cannot hold back work requests: `Link::perform` polls it when the send queue is full).
    // Whenever `done` holds, the core's actions are performed once more before returning:
    // what it did itself (bytes staged by a send, a credit made due by a read) goes out now.
    let act = |ss: &mut [Stream]| ss.iter_mut().for_each(|s| s.link.act());
    let mut finished = |ss: &mut [Stream]| {
        let d = done(ss);
        if d {
            act(ss);
        }
        d
    };
    if finished(ss) {
        return Ok(true);
    }
    let mut nap = 1u64;
    loop {
        for s in ss.iter_mut() {
            s.progress();
        }
        if finished(ss) {
            return Ok(true);
        }
        // (timed with the spin clock, tick::Clock: the counter on every turn, or the monotonic
        // clock every MONO_EVERY turns, where a read may be a system call that costs more
        // than the rest of a turn, and the time from an arrival to its being seen; the spin
        // starts counting at its first read)
        let clock = tick::Clock::pick();
        let every = clock.turns_per_read(tick::MONO_EVERY);
        let mut end = None;
        let mut turn = 0u32;
        while !spin.is_zero() {
            turn = turn.wrapping_add(1);
            if turn.is_multiple_of(every) {
                let now = clock.now();
                if now >= *end.get_or_insert(now.saturating_add(clock.span(spin))) {
                    break;
                }
            }
            let mut any = false;
            for s in ss.iter_mut() {
                if s.link.poll_cq() {
                    any = true;
                    s.pump();
                }
            }
            if any {
                if finished(ss) {
                    return Ok(true);
                }
                act(ss);
                // (what the act did may finish the wait too: a teardown it completed)
                if finished(ss) {
                    return Ok(true);
                }
            }
            std::hint::spin_loop();
        }
        // Arm, then look once more: a completion between the last poll and the arm raised no
        // event. (With records the arm tells the peer first that this side sleeps, and the
        // look catches a record written before the notice left: protocol §14.)
        for s in ss.iter_mut() {
            s.link.arm();
            s.progress();
        }
        if finished(ss) {
            return Ok(true);
        }
        let now = Instant::now();
        let mut timeout: Option<Duration> = deadline.map(|d| d.saturating_duration_since(now));
        if timeout == Some(Duration::ZERO) {
            return Ok(false);
        }
        // (a grown ring whose stream stood still long enough is given back; what that posted
        // wakes the sleep below when it completes)
        for s in ss.iter_mut() {
            s.link.check_idle(now);
        }
        for s in ss.iter() {
            if let Some(w) = s
                .link
                .next_timer()
                .map(|t| t.saturating_duration_since(now))
            {
                timeout = Some(timeout.map_or(w, |t| t.min(w)));
            }
        }
        // (records: the peer answers our Sleeping notice only when its owner next drives its
        // end; one that wrote its last record and went idle before the notice came never
        // does. A reader with its notice out looks at its ring again after a nap that doubles
        // from 1 ms to 64 ms while nothing comes: never a hang, and a bounded delay in that
        // case alone — protocol §14)
        if ss.iter().any(|s| s.conn().notice_out()) {
            let n = Duration::from_millis(nap);
            timeout = Some(timeout.map_or(n, |t| t.min(n)));
            nap = (nap * 2).min(RECORDS_NAP_MAX_MS);
        }
        let ms = timeout.map_or(-1, poll_ms);
        let fds: Vec<RawFd> = ss.iter().flat_map(|s| s.wait_fds()).collect();
        verbs::poll_fds(&fds, ms)?;
        for s in ss.iter_mut() {
            s.link.cm_due();
            s.link.take_events();
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
            s.block(None, |s| s.sends.is_empty() || s.conn().error().is_some())?;
        }
        let e = s
            .link
            .conn_mut()
            .barrier()
            .map_err(|e| s.link.send_error(e))?;
        epochs.push(e);
        s.link.perform();
    }
    let mut failed = None;
    block_many(streams, None, |ss| {
        for (s, &e) in ss.iter().zip(&epochs) {
            if s.conn().barriers_received() >= e {
                continue;
            }
            if let Some(r) = s.conn().error() {
                failed = Some(s.link.error_for(r));
                return true;
            }
            if s.conn().rdhup() {
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
        if crate::fds::abandoned() {
            return;
        }
        let _ = self.close_inner();
    }
}
