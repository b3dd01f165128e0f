//! rdma_cm: event channels, connection identifiers, RC queue pairs created through them, and
//! the work requests rdmashim posts (RDMA WRITE, WRITE WITH IMMEDIATE, SEND, RECV).
//!
//! In a fork child of a process that had started librdmacm, librdmacm's device contexts are
//! the parent's, which the kernel refuses to the child ([`inherited_state`]). There the
//! queue pair is the child's own: made with `ibv_create_qp` on a device context the child
//! opened ([`CmId::context`]) and moved through its states here (`rdma_init_qp_attr`), the
//! client completing the connection with `rdma_establish` ([`CmId::establish`]); rdma_cm
//! carries only the connection's management, on the child's own event channels.
#![allow(unsafe_code)]

use std::ffi::c_int;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result, Unavailable};
use crate::sys::{self, ffi, Lib};
use crate::verbs::{self, Context, Cq, Mr, Pd, Srq};

pub use ffi::rdma_cm_event_type as event_type;

/// The largest private_data rdma_cm carries on a connect request over RoCE/IB (RDMA_PS_TCP:
/// 56 bytes; the CM's 92 less its own 36-byte header).
pub const MAX_CONNECT_PRIVATE_DATA: usize = 56;
/// The largest private_data on an accept (REP: 196 bytes).
pub const MAX_ACCEPT_PRIVATE_DATA: usize = 196;
/// The largest private_data on a reject (REJ: 148 bytes).
pub const MAX_REJECT_PRIVATE_DATA: usize = 148;
pub use crate::verbs::RECV_BATCH;

/// Queue pairs this process holds ([`queue_pairs`]).
static QUEUE_PAIRS: AtomicUsize = AtomicUsize::new(0);

/// How many queue pairs the process holds now (made by [`CmId::create_qp`], not yet
/// destroyed), whatever state they are in.
pub fn queue_pairs() -> usize {
    QUEUE_PAIRS.load(Ordering::Relaxed)
}

/// An rdma_cm event channel. Its fd is non-blocking, so it can sit in an event loop.
pub struct EventChannel {
    raw: NonNull<ffi::rdma_event_channel>,
    lib: &'static Lib,
}

// SAFETY: librdmacm's calls on a channel are thread-safe (it serialises internally); the channel
// is destroyed only when the last Arc (held by every id using it) goes.
unsafe impl Send for EventChannel {}
// SAFETY: see Send.
unsafe impl Sync for EventChannel {}

/// One rdma_cm event, copied out and already acknowledged.
#[derive(Debug)]
pub struct Event {
    /// `RDMA_CM_EVENT_*`.
    pub kind: ffi::rdma_cm_event_type::Type,
    /// The event's status (0, a negative errno, or a reject reason code).
    pub status: i32,
    /// The id the event is about. For `CONNECT_REQUEST` this is a *new* id that the receiver
    /// now owns: wrap it with [`CmId::from_request`] (or reject and destroy it).
    pub id: *mut ffi::rdma_cm_id,
    /// For `CONNECT_REQUEST`: the listening id it arrived on.
    pub listen_id: *mut ffi::rdma_cm_id,
    /// The private_data that came with it (connect request, accept, reject), as delivered:
    /// transports may pad it with zeroes up to their maximum.
    pub private_data: Vec<u8>,
    /// For connection events: the peer's `initiator_depth`/`responder_resources` etc. are not
    /// needed by rdmashim; only the QP number is kept.
    pub qp_num: u32,
    /// With status -1: the errno librdmacm left when its own processing of the event failed
    /// (a CONNECT_RESPONSE whose queue pair transitions or RTU failed becomes CONNECT_ERROR).
    pub errno: Option<i32>,
}

impl Event {
    /// The event's name, e.g. `RDMA_CM_EVENT_ESTABLISHED`.
    pub fn name(&self) -> String {
        match sys::lib() {
            Ok(lib) => sys::event_str(lib, self.kind),
            Err(_) => format!("event {}", self.kind),
        }
    }
}

/// The process that first made an event channel (0: none yet). librdmacm keeps the device
/// contexts it opens for the process's life, and a fork child inherits them: the kernel
/// refuses that child's verbs commands on them (a context belongs to the credentials of the
/// process that opened it: `ib_safe_file_access`), so a queue pair made there is set up and
/// then fails at its first post (measured in the VM: `ibv_post_send` EACCES on rxe).
static CM_OWNER: AtomicU32 = AtomicU32::new(0);

/// Whether librdmacm's device contexts are this process's (and, if nobody used librdmacm
/// yet, claims it for this one): false in a fork child of a process that had started it
/// (see [`CM_OWNER`]).
fn usable_here() -> bool {
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() } as u32;
    match CM_OWNER.compare_exchange(0, me, Ordering::SeqCst, Ordering::SeqCst) {
        Ok(_) => true,
        Err(owner) => owner == me,
    }
}

/// Whether this process inherited librdmacm's state from a process it was forked from that
/// had started it: then its queue pairs go on device contexts of its own (module docs).
pub fn inherited_state() -> bool {
    let owner = CM_OWNER.load(Ordering::SeqCst);
    // SAFETY: getpid has no preconditions.
    owner != 0 && owner != unsafe { libc::getpid() } as u32
}

impl EventChannel {
    /// `rdma_create_event_channel`, made non-blocking (in a fork child too: the channel is
    /// the child's own).
    pub fn new() -> Result<Arc<Self>> {
        let lib = sys::lib().map_err(|e| Unavailable::LibrariesMissing(e.clone()))?;
        // (claims librdmacm for this process if it is the first to use it)
        let _ = usable_here();
        // SAFETY: no preconditions.
        let raw = unsafe { (lib.cm.rdma_create_event_channel)() };
        let raw = NonNull::new(raw).ok_or_else(|| Error::last("rdma_create_event_channel"))?;
        // SAFETY: a channel just made, seen by no other thread; its fd is a plain int.
        unsafe { crate::fds::relocate_field(std::ptr::addr_of_mut!((*raw.as_ptr()).fd)) };
        let ch = Arc::new(Self { raw, lib });
        crate::fds::opened(ch.fd());
        verbs::set_nonblocking(ch.fd(), "fcntl(rdma event channel)")?;
        Ok(ch)
    }

    /// The channel's fd (readable when an event is pending).
    pub fn fd(&self) -> RawFd {
        // SAFETY: live channel.
        unsafe { (*self.raw.as_ptr()).fd }
    }

    /// Takes one pending event without blocking.
    pub fn try_event(&self) -> Result<Option<Event>> {
        let mut ev = std::ptr::null_mut();
        // SAFETY: live channel, valid out-pointer.
        let rc = unsafe { (self.lib.cm.rdma_get_cm_event)(self.raw.as_ptr(), &mut ev) };
        // (read for an event too: librdmacm leaves it when its own processing failed)
        let os = std::io::Error::last_os_error();
        if rc != 0 {
            if os.kind() == std::io::ErrorKind::WouldBlock {
                return Ok(None);
            }
            return Err(Error::Call {
                call: "rdma_get_cm_event",
                source: os,
            });
        }
        // SAFETY: ev is a valid event until acked; we copy everything we keep.
        let out = unsafe {
            let e = &*ev;
            let conn = &e.param.conn;
            let pd = if conn.private_data.is_null() || conn.private_data_len == 0 {
                Vec::new()
            } else {
                std::slice::from_raw_parts(
                    conn.private_data.cast::<u8>(),
                    conn.private_data_len as usize,
                )
                .to_vec()
            };
            Event {
                kind: e.event,
                status: e.status,
                id: e.id,
                listen_id: e.listen_id,
                private_data: pd,
                qp_num: conn.qp_num,
                errno: if e.status == -1 {
                    os.raw_os_error()
                } else {
                    None
                },
            }
        };
        // SAFETY: acked exactly once, after the copy.
        unsafe { (self.lib.cm.rdma_ack_cm_event)(ev) };
        Ok(Some(out))
    }

    /// Waits up to `timeout` for the next event.
    pub fn next_event(&self, timeout: Duration) -> Result<Event> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(ev) = self.try_event()? {
                return Ok(ev);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout("an rdma_cm event"));
            }
            verbs::poll_readable(
                self.fd(),
                left.as_millis().clamp(1, i32::MAX as u128) as i32,
                "poll(rdma event channel)",
            )?;
        }
    }

    /// Waits up to `timeout` for the next event; for a `CONNECT_REQUEST`, also returns the new
    /// id it carries, owned (on this channel). The safe way for a listener to take requests.
    pub fn next_event_owned(self: &Arc<Self>, timeout: Duration) -> Result<(Event, Option<CmId>)> {
        let ev = self.next_event(timeout)?;
        self.own(ev)
    }

    /// [`Self::next_event_owned`] without blocking: `None` when no event is pending.
    pub fn try_event_owned(self: &Arc<Self>) -> Result<Option<(Event, Option<CmId>)>> {
        self.try_event()?.map(|ev| self.own(ev)).transpose()
    }

    /// Wraps the new id of a `CONNECT_REQUEST` just read from this channel.
    fn own(self: &Arc<Self>, ev: Event) -> Result<(Event, Option<CmId>)> {
        if ev.kind != ffi::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST || ev.id.is_null() {
            return Ok((ev, None));
        }
        // SAFETY: a CONNECT_REQUEST just read from this channel; its id is wrapped here once
        // and the event (which the caller gets back) is only data.
        let id = unsafe { CmId::from_request(self, &ev)? };
        Ok((ev, Some(id)))
    }

    /// Waits for an event of kind `want`; any other event is an error carrying what came.
    pub fn expect(
        &self,
        want: ffi::rdma_cm_event_type::Type,
        what: &'static str,
        timeout: Duration,
    ) -> Result<Event> {
        let ev = self.next_event(timeout)?;
        if ev.kind == want && ev.status == 0 {
            return Ok(ev);
        }
        Err(Error::UnexpectedEvent {
            expected: what,
            got: ev.name(),
            status: ev.status,
            private_data: ev.private_data,
        })
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        if crate::fds::abandoned() {
            return;
        }
        crate::fds::closing(self.fd());
        // SAFETY: every id on this channel holds an Arc of us, so all are destroyed.
        unsafe { (self.lib.cm.rdma_destroy_event_channel)(self.raw.as_ptr()) };
    }
}

/// The size of an RC queue pair.
#[derive(Debug, Clone, Copy)]
pub struct QpCaps {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Bytes that may be posted inline (copied into the WQE; no lkey needed).
    pub max_inline_data: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        Self {
            max_send_wr: 128,
            max_recv_wr: 128,
            max_inline_data: 64,
        }
    }
}

/// A WRITE WITH IMMEDIATE work request kept from one post to the next
/// ([`CmId::post_write_imm`]): its opcode and chain stay, and a post writes only the fields a
/// DATA changes, where [`CmId::post_write`] zeroes and fills a new one (128 bytes) each time.
pub struct WriteWr {
    wr: ffi::ibv_send_wr,
    sge: ffi::ibv_sge,
}

// SAFETY: the pointers in `wr` are `next`, always null, and `sg_list`, which a post sets to
// this value's own `sge` just before the provider reads it, within that call; between posts it
// is never read, so the value may move to, and be used from, another thread.
unsafe impl Send for WriteWr {}

impl WriteWr {
    /// An RDMA WRITE WITH IMMEDIATE, not yet filled (each post writes the rest).
    pub fn new() -> WriteWr {
        // SAFETY: all-zero is a valid ibv_send_wr (null next, no flags) and ibv_sge.
        let (mut wr, sge): (ffi::ibv_send_wr, ffi::ibv_sge) =
            unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        wr.opcode = ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
        WriteWr { wr, sge }
    }
}

impl Default for WriteWr {
    fn default() -> Self {
        Self::new()
    }
}

struct QpParts {
    /// The QP (`id->qp` when rdma_cm made it).
    raw: NonNull<ffi::ibv_qp>,
    /// Made here with `ibv_create_qp` on this process's own context (a fork child, see the
    /// module docs): its states are moved here, and it is destroyed with `ibv_destroy_qp`.
    own: bool,
    _pd: Arc<Pd>,
    _send_cq: Arc<Cq>,
    _recv_cq: Arc<Cq>,
    /// The shared receive queue its receives come from, if any (kept while the QP lives).
    _srq: Option<Arc<Srq>>,
    caps: QpCaps,
}

/// The device contexts a fork child opened for itself, by the device they are for (and the
/// process that opened them: a grandchild opens its own again).
static OWN_CONTEXTS: std::sync::Mutex<Vec<(u32, usize, Arc<Context>)>> =
    std::sync::Mutex::new(Vec::new());

/// This process's own context on `device` (opened on first use, kept for the process's life:
/// the pool's kits are keyed by it).
fn own_context(lib: &'static Lib, device: *mut ffi::ibv_device) -> Result<Arc<Context>> {
    let pid = std::process::id();
    let mut g = OWN_CONTEXTS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, _, c)) = g
        .iter()
        .find(|(p, d, _)| *p == pid && *d == device as usize)
    {
        return Ok(c.clone());
    }
    // SAFETY: `device` is a device of libibverbs' list (librdmacm's context names it), which
    // stays valid for the process's life.
    let c = unsafe { Context::open_device(lib, device) }?;
    g.push((pid, device as usize, c.clone()));
    Ok(c)
}

/// Parameters of `rdma_connect`/`rdma_accept`.
#[derive(Debug, Clone, Default)]
pub struct ConnParam<'a> {
    /// Carried to the peer (≤ [`MAX_CONNECT_PRIVATE_DATA`] on connect,
    /// ≤ [`MAX_ACCEPT_PRIVATE_DATA`] on accept).
    pub private_data: &'a [u8],
    /// Outstanding RDMA READs we accept (0 but on READ pull, protocol §16;
    /// [`MAX_READS`]: as many as the device takes).
    pub responder_resources: u8,
    /// Outstanding RDMA READs we issue (as `responder_resources`).
    pub initiator_depth: u8,
}

/// `responder_resources` / `initiator_depth` for as many outstanding READs as the device
/// takes (librdmacm's `RDMA_MAX_RESP_RES` / `RDMA_MAX_INIT_DEPTH`: it puts in the device's
/// limit, and on accept the lesser of that and the peer's).
pub const MAX_READS: u8 = 0xff;

/// An rdma_cm identifier (the RDMA analogue of a socket), with its RC QP once created.
pub struct CmId {
    raw: NonNull<ffi::rdma_cm_id>,
    channel: Arc<EventChannel>,
    qp: Option<QpParts>,
}

// SAFETY: librdmacm ids may be used from any thread; posting to the QP is thread-safe per the
// verbs threading model.
unsafe impl Send for CmId {}
// SAFETY: see Send.
unsafe impl Sync for CmId {}

/// The address in one of rdma_cm's address unions (sockaddr_storage-sized).
///
/// # Safety
/// `sa` must be the start of a `sockaddr_storage`-sized readable buffer.
unsafe fn storage_addr(sa: &libc::sockaddr) -> Option<SocketAddr> {
    let len = std::mem::size_of::<libc::sockaddr_storage>();
    // SAFETY: per the caller's contract, `len` readable bytes.
    unsafe { crate::sockaddr::from_raw(sa, len) }
}

impl CmId {
    /// `rdma_create_id` in the TCP port space (RDMA_PS_TCP: reliable-connected, ports separate
    /// from the kernel's TCP ports).
    pub fn new(channel: &Arc<EventChannel>) -> Result<Self> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: live channel, valid out-pointer.
        let rc = unsafe {
            (channel.lib.cm.rdma_create_id)(
                channel.raw.as_ptr(),
                &mut raw,
                std::ptr::null_mut(),
                ffi::rdma_port_space::RDMA_PS_TCP,
            )
        };
        if rc != 0 {
            return Err(Error::last("rdma_create_id"));
        }
        let raw = NonNull::new(raw).ok_or_else(|| Error::last("rdma_create_id"))?;
        Ok(Self {
            raw,
            channel: channel.clone(),
            qp: None,
        })
    }

    /// Takes ownership of the new id a `CONNECT_REQUEST` event carries.
    ///
    /// # Safety
    /// `ev` must be a `CONNECT_REQUEST` from `channel`, and its id not yet wrapped.
    pub unsafe fn from_request(channel: &Arc<EventChannel>, ev: &Event) -> Result<Self> {
        let raw = NonNull::new(ev.id).ok_or(Error::InvalidArgument("event without an id"))?;
        Ok(Self {
            raw,
            channel: channel.clone(),
            qp: None,
        })
    }

    fn lib(&self) -> &'static Lib {
        self.channel.lib
    }

    /// The raw pointer.
    pub fn as_ptr(&self) -> *mut ffi::rdma_cm_id {
        self.raw.as_ptr()
    }

    /// The protection domain of the id's queue pair, as an address (tests compare it with
    /// the ring's).
    #[cfg(test)]
    pub(crate) fn qp_pd_addr(&self) -> usize {
        // SAFETY: a live id; its QP (made by create_qp, which every caller has done) is read
        // for its pd field only.
        unsafe { (*(*self.as_ptr()).qp).pd as usize }
    }

    /// The channel this id reports to.
    pub fn channel(&self) -> &Arc<EventChannel> {
        &self.channel
    }

    fn check(rc: c_int, call: &'static str) -> Result<()> {
        if rc == 0 {
            Ok(())
        } else {
            Err(Error::last(call))
        }
    }

    /// `rdma_bind_addr`.
    pub fn bind(&self, addr: SocketAddr) -> Result<()> {
        let (mut ss, _) = crate::sockaddr::to_raw(addr);
        // SAFETY: live id; ss holds a valid sockaddr of the right family.
        let rc = unsafe {
            (self.lib().cm.rdma_bind_addr)(
                self.as_ptr(),
                (&mut ss as *mut libc::sockaddr_storage).cast(),
            )
        };
        Self::check(rc, "rdma_bind_addr")
    }

    /// `rdma_listen`.
    pub fn listen(&self, backlog: i32) -> Result<()> {
        // SAFETY: live, bound id.
        let rc = unsafe { (self.lib().cm.rdma_listen)(self.as_ptr(), backlog) };
        Self::check(rc, "rdma_listen")
    }

    /// `rdma_resolve_addr` (the event `ADDR_RESOLVED` follows on the channel).
    pub fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<()> {
        let mut s = src.map(|a| crate::sockaddr::to_raw(a).0);
        let (mut d, _) = crate::sockaddr::to_raw(dst);
        let sp = s.as_mut().map_or(std::ptr::null_mut(), |s| {
            (s as *mut libc::sockaddr_storage).cast()
        });
        // SAFETY: live id; the sockaddrs are valid for the call.
        let rc = unsafe {
            (self.lib().cm.rdma_resolve_addr)(
                self.as_ptr(),
                sp,
                (&mut d as *mut libc::sockaddr_storage).cast(),
                timeout.as_millis().min(i32::MAX as u128) as c_int,
            )
        };
        Self::check(rc, "rdma_resolve_addr")
    }

    /// `rdma_resolve_route` (the event `ROUTE_RESOLVED` follows).
    pub fn resolve_route(&self, timeout: Duration) -> Result<()> {
        // SAFETY: live id with a resolved address.
        let rc = unsafe {
            (self.lib().cm.rdma_resolve_route)(
                self.as_ptr(),
                timeout.as_millis().min(i32::MAX as u128) as c_int,
            )
        };
        Self::check(rc, "rdma_resolve_route")
    }

    /// Address, then route, resolution, each waited for on `ch` (this id's channel) for at
    /// most `wait`; `op_timeout` is rdma_cm's own for each. The blocking form of a dial's
    /// first two steps, for tools and tests that set up a connection by hand (the shim's
    /// dialer drives them without blocking).
    pub fn resolve_blocking(
        &self,
        ch: &EventChannel,
        dst: SocketAddr,
        op_timeout: Duration,
        wait: Duration,
    ) -> Result<()> {
        self.resolve_addr(None, dst, op_timeout)?;
        ch.expect(
            event_type::RDMA_CM_EVENT_ADDR_RESOLVED,
            "ADDR_RESOLVED",
            wait,
        )?;
        self.resolve_route(op_timeout)?;
        ch.expect(
            event_type::RDMA_CM_EVENT_ROUTE_RESOLVED,
            "ROUTE_RESOLVED",
            wait,
        )?;
        Ok(())
    }

    /// The device context to make this id's resources on (after address resolution, or on a
    /// connect request's id): the one rdma_cm bound it to, or, in a fork child of a process
    /// that had started librdmacm, this process's own on the same device.
    pub fn context(&self) -> Result<Arc<Context>> {
        // SAFETY: live id.
        let verbs = unsafe { (*self.as_ptr()).verbs };
        let verbs =
            NonNull::new(verbs).ok_or(Error::InvalidArgument("cm id not bound to a device"))?;
        if inherited_state() {
            // SAFETY: a live context's `device` is valid.
            let device = unsafe { (*verbs.as_ptr()).device };
            return own_context(self.lib(), device);
        }
        // SAFETY: librdmacm owns the context for the process' life.
        Ok(unsafe { Context::from_cm(self.lib(), verbs) })
    }

    /// `rdma_create_qp`: an RC QP on `pd` with the given CQs.
    pub fn create_qp(
        &mut self,
        pd: &Arc<Pd>,
        send_cq: &Arc<Cq>,
        recv_cq: &Arc<Cq>,
        caps: QpCaps,
    ) -> Result<()> {
        self.create_qp_srq(pd, send_cq, recv_cq, caps, None)
    }

    /// [`Self::create_qp`], its receives taken from `srq` when given (a shared receive queue
    /// on the same PD: the QP then has no receive queue of its own, and `caps.max_recv_wr` is
    /// not used).
    pub fn create_qp_srq(
        &mut self,
        pd: &Arc<Pd>,
        send_cq: &Arc<Cq>,
        recv_cq: &Arc<Cq>,
        caps: QpCaps,
        srq: Option<&Arc<Srq>>,
    ) -> Result<()> {
        if self.qp.is_some() {
            return Err(Error::InvalidArgument("the id already has a QP"));
        }
        // SAFETY: all-zero is a valid ibv_qp_init_attr.
        let mut attr: ffi::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        attr.send_cq = send_cq.as_ptr();
        attr.recv_cq = recv_cq.as_ptr();
        attr.qp_type = ffi::ibv_qp_type::IBV_QPT_RC;
        attr.sq_sig_all = 0;
        attr.cap.max_send_wr = caps.max_send_wr;
        attr.cap.max_recv_wr = if srq.is_some() { 0 } else { caps.max_recv_wr };
        attr.srq = srq.map_or(std::ptr::null_mut(), |q| q.as_ptr());
        attr.cap.max_send_sge = 1;
        attr.cap.max_recv_sge = 1;
        attr.cap.max_inline_data = caps.max_inline_data;
        let own = !pd.context().is_librdmacms();
        let raw = if own {
            // SAFETY: live PD; attr is fully initialised.
            let qp = unsafe { (self.lib().verbs.ibv_create_qp)(pd.as_ptr(), &mut attr) };
            NonNull::new(qp).ok_or_else(|| Error::last("ibv_create_qp"))?
        } else {
            // SAFETY: live id bound to pd's device; attr is fully initialised.
            let rc =
                unsafe { (self.lib().cm.rdma_create_qp)(self.as_ptr(), pd.as_ptr(), &mut attr) };
            Self::check(rc, "rdma_create_qp")?;
            // SAFETY: live id; rdma_create_qp succeeded, so it set `qp`.
            NonNull::new(unsafe { (*self.as_ptr()).qp })
                .ok_or(Error::InvalidArgument("rdma_create_qp left no QP"))?
        };
        QUEUE_PAIRS.fetch_add(1, Ordering::Relaxed);
        self.qp = Some(QpParts {
            raw,
            own,
            _pd: pd.clone(),
            _send_cq: send_cq.clone(),
            _recv_cq: recv_cq.clone(),
            _srq: srq.cloned(),
            // the provider may round the capacities up: keep what it granted
            caps: QpCaps {
                max_send_wr: attr.cap.max_send_wr,
                max_recv_wr: attr.cap.max_recv_wr,
                max_inline_data: attr.cap.max_inline_data,
            },
        });
        if own {
            // (rdma_create_qp moves its QP to INIT, which receives may be posted in: ours too)
            if let Err(e) = self.move_qp(ffi::ibv_qp_state::IBV_QPS_INIT) {
                self.destroy_qp();
                return Err(e);
            }
        }
        Ok(())
    }

    /// Whether the id's QP is this process's own (made with `ibv_create_qp`: see the module
    /// docs), whose states are moved here.
    fn own_qp(&self) -> bool {
        self.qp.as_ref().is_some_and(|q| q.own)
    }

    /// Moves this process's own QP to `state` with the attributes rdma_cm gives for this id
    /// (`rdma_init_qp_attr`: the path, the peer's QP number, the PSNs, as the CM agreed them).
    fn move_qp(&self, state: ffi::ibv_qp_state::Type) -> Result<()> {
        let qp = self.qp_ptr()?;
        // SAFETY: all-zero is a valid ibv_qp_attr.
        let mut attr: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = state;
        let mut mask: c_int = 0;
        // SAFETY: live id; valid out-pointers.
        let rc = unsafe { (self.lib().cm.rdma_init_qp_attr)(self.as_ptr(), &mut attr, &mut mask) };
        Self::check(rc, "rdma_init_qp_attr")?;
        // SAFETY: live QP; attr and mask as rdma_cm filled them.
        let rc = unsafe { (self.lib().verbs.ibv_modify_qp)(qp, &mut attr, mask) };
        if rc != 0 {
            return Err(Error::returned("ibv_modify_qp", rc));
        }
        Ok(())
    }

    /// INIT again (now that the CM knows the connection: an active side's QP got no remote
    /// access at its first INIT, before its request went out, and its peer's WRITEs would fail
    /// with a remote invalid request), then RTR and RTS: what librdmacm does for its QPs.
    fn move_qp_to_rts(&self) -> Result<()> {
        self.move_qp(ffi::ibv_qp_state::IBV_QPS_INIT)?;
        self.move_qp(ffi::ibv_qp_state::IBV_QPS_RTR)?;
        self.move_qp(ffi::ibv_qp_state::IBV_QPS_RTS)
    }

    /// Moves this process's own QP to the error state (which flushes its work requests), as
    /// librdmacm does for its QPs at a disconnect.
    fn fail_qp(&self) {
        let Some(q) = self.qp.as_ref().filter(|_| self.own_qp()) else {
            return;
        };
        // SAFETY: all-zero is a valid ibv_qp_attr.
        let mut attr: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ffi::ibv_qp_state::IBV_QPS_ERR;
        // SAFETY: live QP; only the state is set.
        let _ = unsafe {
            (self.lib().verbs.ibv_modify_qp)(
                q.raw.as_ptr(),
                &mut attr,
                ffi::ibv_qp_attr_mask::IBV_QP_STATE.0 as c_int,
            )
        };
    }

    /// Destroys the QP (before the CQs and PD it holds are released).
    fn destroy_qp(&mut self) {
        let lib = self.lib();
        if let Some(parts) = self.qp.take() {
            QUEUE_PAIRS.fetch_sub(1, Ordering::Relaxed);
            if parts.own {
                // SAFETY: a live QP made by ibv_create_qp, destroyed once.
                unsafe { (lib.verbs.ibv_destroy_qp)(parts.raw.as_ptr()) };
            } else {
                // SAFETY: live id with a QP created by rdma_create_qp; destroyed once.
                unsafe { (lib.cm.rdma_destroy_qp)(self.as_ptr()) };
            }
            drop(parts);
        }
    }

    /// Client: the server accepted (the event `CONNECT_RESPONSE`, which librdmacm hands over
    /// only for a QP it did not make): moves this process's own QP to RTR and RTS and
    /// completes the connection (`rdma_establish`). Nothing to do for rdma_cm's QPs
    /// (`ESTABLISHED` comes instead).
    pub fn establish(&self) -> Result<()> {
        if !self.own_qp() {
            return Ok(());
        }
        self.move_qp_to_rts()?;
        // SAFETY: live id in the connect-response state.
        let rc = unsafe { (self.lib().cm.rdma_establish)(self.as_ptr()) };
        Self::check(rc, "rdma_establish")
    }

    /// The local ACK timeout of the id's queue pair (`rdma_set_option`,
    /// `RDMA_OPTION_ID_ACK_TIMEOUT`): a work request the peer's device has not acknowledged
    /// within 4.096 µs × 2^`exponent` is sent again, and the queue pair fails after its retries
    /// (seven tries). Set before `rdma_connect`/`rdma_accept`: rdma_cm applies it when it moves
    /// the queue pair to RTS (ours too, through `rdma_init_qp_attr`). Without it rdma_cm takes
    /// the path's packet lifetime + 1 (on RoCE a kernel constant: 17 or 19, 0.5 s or 2.1 s).
    pub fn set_ack_timeout(&self, exponent: u8) -> Result<()> {
        /// `RDMA_OPTION_ID` (rdma/rdma_cma.h).
        const LEVEL_ID: c_int = 0;
        /// `RDMA_OPTION_ID_ACK_TIMEOUT`.
        const ACK_TIMEOUT: c_int = 3;
        let mut v: u8 = exponent.min(31);
        // SAFETY: live id; the option's value is one byte, read during the call.
        let rc = unsafe {
            (self.lib().cm.rdma_set_option)(
                self.as_ptr(),
                LEVEL_ID,
                ACK_TIMEOUT,
                (&mut v as *mut u8).cast(),
                1,
            )
        };
        Self::check(rc, "rdma_set_option(ACK_TIMEOUT)")
    }

    /// `rdma_migrate_id`: from now on this id's events (ESTABLISHED, DISCONNECTED, …) arrive
    /// on `channel` instead of the one it was created on (typically: an accepted connection
    /// leaves its listener's channel for one of its own).
    pub fn migrate(&mut self, channel: &Arc<EventChannel>) -> Result<()> {
        // SAFETY: live id and live channel; librdmacm moves the id's pending events with it.
        let rc = unsafe { (self.lib().cm.rdma_migrate_id)(self.as_ptr(), channel.raw.as_ptr()) };
        Self::check(rc, "rdma_migrate_id")?;
        self.channel = channel.clone();
        Ok(())
    }

    /// The local address of the id (after bind or address resolution; on an accepted id, the
    /// address the request came to).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        // SAFETY: live id; route.addr.src_addr is a sockaddr_storage-sized union that
        // librdmacm keeps filled (zero family when unset).
        unsafe { storage_addr(ffi::rdma_get_local_addr(&*self.as_ptr())) }
    }

    /// The peer's address (after address resolution, or on an accepted id).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: as in local_addr, for route.addr.dst_addr.
        unsafe { storage_addr(ffi::rdma_get_peer_addr(&*self.as_ptr())) }
    }

    /// The capacities the provider granted the QP.
    pub fn qp_caps(&self) -> Option<QpCaps> {
        self.qp.as_ref().map(|q| q.caps)
    }

    /// Whether a WRITE or SEND of `len` bytes goes inline (copied into the WQE, its buffer
    /// free at once): not empty, and within the `max_inline_data` the provider granted — the
    /// one place every post decides it.
    fn fits_inline(&self, len: usize) -> bool {
        len > 0
            && self
                .qp
                .as_ref()
                .is_some_and(|q| len <= q.caps.max_inline_data as usize)
    }

    /// The QP number.
    pub fn qp_num(&self) -> Option<u32> {
        let q = self.qp.as_ref()?;
        // SAFETY: a live QP.
        Some(unsafe { (*q.raw.as_ptr()).qp_num })
    }

    fn conn_param(p: &ConnParam<'_>, max: usize) -> Result<ffi::rdma_conn_param> {
        if p.private_data.len() > max {
            return Err(Error::InvalidArgument("private_data too long"));
        }
        Ok(ffi::rdma_conn_param {
            private_data: if p.private_data.is_empty() {
                std::ptr::null()
            } else {
                p.private_data.as_ptr().cast()
            },
            private_data_len: p.private_data.len() as u8,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            flow_control: 0,
            // RC retries on a lost packet, then the QP fails and the stream fails over to its
            // TCP connection (protocol §8.6). Not 7: soft-RoCE takes 7 as "retry forever", and
            // a writer on a dead link would wait for ever, its own TCP_USER_TIMEOUT unheeded.
            retry_count: 6,
            // 7 = retry forever on receiver-not-ready: the credit protocol keeps receives posted.
            rnr_retry_count: 7,
            srq: 0,
            qp_num: 0,
        })
    }

    /// [`Self::conn_param`] naming this id's QP when it is this process's own (rdma_cm knows
    /// of no QP then).
    fn conn_param_for_qp(&self, p: &ConnParam<'_>, max: usize) -> Result<ffi::rdma_conn_param> {
        let mut c = Self::conn_param(p, max)?;
        if self.own_qp() {
            c.qp_num = self.qp_num().unwrap_or(0);
        }
        Ok(c)
    }

    /// `rdma_connect` with `param.private_data` (the event `ESTABLISHED`, `REJECTED` or
    /// `UNREACHABLE` follows).
    pub fn connect(&self, param: &ConnParam<'_>) -> Result<()> {
        let mut p = self.conn_param_for_qp(param, MAX_CONNECT_PRIVATE_DATA)?;
        // SAFETY: live id with a resolved route and a QP; p points at private_data, which
        // outlives the call (librdmacm copies it).
        let rc = unsafe { (self.lib().cm.rdma_connect)(self.as_ptr(), &mut p) };
        Self::check(rc, "rdma_connect")
    }

    /// `rdma_accept` with `param.private_data`. This process's own QP is moved to RTR and RTS
    /// first (as librdmacm does for its QPs inside `rdma_accept`).
    pub fn accept(&self, param: &ConnParam<'_>) -> Result<()> {
        let mut p = self.conn_param_for_qp(param, MAX_ACCEPT_PRIVATE_DATA)?;
        if self.own_qp() {
            self.move_qp_to_rts()?;
        }
        // SAFETY: live connect-request id with a QP; private_data outlives the call.
        let rc = unsafe { (self.lib().cm.rdma_accept)(self.as_ptr(), &mut p) };
        Self::check(rc, "rdma_accept")
    }

    /// `rdma_reject` with a reason in private_data.
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        if private_data.len() > MAX_REJECT_PRIVATE_DATA {
            return Err(Error::InvalidArgument("reject private_data too long"));
        }
        // SAFETY: live connect-request id; the slice outlives the call.
        let rc = unsafe {
            (self.lib().cm.rdma_reject)(
                self.as_ptr(),
                private_data.as_ptr().cast(),
                private_data.len() as u8,
            )
        };
        Self::check(rc, "rdma_reject")
    }

    /// `rdma_disconnect` (this process's own QP goes to the error state first, as librdmacm
    /// moves its QPs).
    pub fn disconnect(&self) -> Result<()> {
        self.fail_qp();
        // SAFETY: live id.
        let rc = unsafe { (self.lib().cm.rdma_disconnect)(self.as_ptr()) };
        Self::check(rc, "rdma_disconnect")
    }

    /// The local ACK timeout exponent of the id's queue pair as the device has it
    /// (`ibv_query_qp`; meaningful from RTS on: see [`Self::set_ack_timeout`]).
    pub fn ack_timeout(&self) -> Result<u8> {
        let qp = self.qp_ptr()?;
        // SAFETY: all-zero is a valid ibv_qp_attr and ibv_qp_init_attr.
        let (mut attr, mut init): (ffi::ibv_qp_attr, ffi::ibv_qp_init_attr) =
            unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        // SAFETY: live QP; both out-structures are writable and sized as the library expects.
        let rc = unsafe {
            (self.lib().verbs.ibv_query_qp)(
                qp,
                &mut attr,
                ffi::ibv_qp_attr_mask::IBV_QP_TIMEOUT.0 as c_int,
                &mut init,
            )
        };
        if rc != 0 {
            return Err(Error::returned("ibv_query_qp", rc));
        }
        Ok(attr.timeout)
    }

    fn qp_ptr(&self) -> Result<*mut ffi::ibv_qp> {
        // (not `ok_or`: that builds the error, and drops it with a call, on every post)
        match &self.qp {
            Some(q) => Ok(q.raw.as_ptr()),
            None => Err(Error::InvalidArgument("the id has no QP")),
        }
    }

    fn post(&self, wr: &mut ffi::ibv_send_wr) -> Result<()> {
        let qp = self.qp_ptr()?;
        let mut bad = std::ptr::null_mut();
        // SAFETY: live QP; wr and its sg_list are valid for the duration of the call (the
        // provider copies the WQE; the data itself is covered by the caller's MR).
        let rc = unsafe { ffi::ibv_post_send(qp, wr, &mut bad) };
        if rc != 0 {
            return Err(Error::returned("ibv_post_send", rc));
        }
        Ok(())
    }

    /// Posts an RDMA WRITE (with an immediate when `imm` is given) of `len` bytes at `offset`
    /// in `local` to `remote_addr`/`rkey`. `signaled` asks for a send completion.
    #[allow(clippy::too_many_arguments)]
    pub fn post_write(
        &self,
        wr_id: u64,
        local: &Mr,
        offset: usize,
        len: usize,
        remote_addr: u64,
        rkey: u32,
        imm: Option<u32>,
        signaled: bool,
    ) -> Result<()> {
        let mut sge = local.sge(offset, len)?;
        self.post_write_sge(wr_id, &mut sge, remote_addr, rkey, imm, signaled)
    }

    /// Posts `w` as an RDMA WRITE WITH IMMEDIATE `imm` of the bytes `sge` names to
    /// `to` = (remote address, rkey), inline when they fit; `signaled` asks for a send
    /// completion. Only the fields a DATA changes are written into `w`.
    pub fn post_write_imm(
        &self,
        w: &mut WriteWr,
        wr_id: u64,
        sge: ffi::ibv_sge,
        to: (u64, u32),
        imm: u32,
        signaled: bool,
    ) -> Result<()> {
        w.sge = sge;
        let inline = self.fits_inline(sge.length as usize);
        write_fields(&mut w.wr, wr_id, &mut w.sge, to, signaled, inline);
        w.wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
        self.post(&mut w.wr)
    }

    #[allow(clippy::too_many_arguments)]
    fn post_write_sge(
        &self,
        wr_id: u64,
        sge: &mut ffi::ibv_sge,
        remote_addr: u64,
        rkey: u32,
        imm: Option<u32>,
        signaled: bool,
    ) -> Result<()> {
        let inline = self.fits_inline(sge.length as usize);
        // SAFETY: all-zero is a valid ibv_send_wr (null next, no flags).
        let mut wr: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.opcode = match imm {
            Some(_) => ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM,
            None => ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
        };
        if let Some(imm) = imm {
            wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
        }
        write_fields(&mut wr, wr_id, sge, (remote_addr, rkey), signaled, inline);
        self.post(&mut wr)
    }

    /// Posts a signaled RDMA READ of `len` bytes from `remote_addr`/`rkey` into `local` at
    /// `offset` (READ pull, protocol §16: the queue pair was connected with READs allowed).
    pub fn post_read(
        &self,
        wr_id: u64,
        local: &Mr,
        offset: usize,
        len: usize,
        remote_addr: u64,
        rkey: u32,
    ) -> Result<()> {
        let mut sge = local.sge(offset, len)?;
        // SAFETY: all-zero is a valid ibv_send_wr (null next, no flags).
        let mut wr: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = ffi::ibv_wr_opcode::IBV_WR_RDMA_READ;
        wr.send_flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        wr.wr.rdma = ffi::rdma_t { remote_addr, rkey };
        self.post(&mut wr)
    }

    /// Posts a SEND of `len` bytes at `offset` in `local` (WITH IMMEDIATE when `imm` is
    /// given; `len` may then be 0), inline when it fits the granted inline size.
    pub fn post_send(
        &self,
        wr_id: u64,
        local: &Mr,
        offset: usize,
        len: usize,
        imm: Option<u32>,
        signaled: bool,
    ) -> Result<()> {
        let mut sge = local.sge(offset, len)?;
        // SAFETY: all-zero is a valid ibv_send_wr.
        let mut wr: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = if len == 0 { 0 } else { 1 };
        wr.opcode = match imm {
            Some(imm) => {
                wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
                ffi::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM
            }
            None => ffi::ibv_wr_opcode::IBV_WR_SEND,
        };
        let mut flags = 0;
        if signaled {
            flags |= ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        if self.fits_inline(len) {
            flags |= ffi::ibv_send_flags::IBV_SEND_INLINE.0;
        }
        wr.send_flags = flags;
        self.post(&mut wr)
    }

    /// Posts a RECV of `len` bytes for each `wr_id` in `ids`, the receive of `wr_id` at offset
    /// `wr_id * len` in `local` (`len` may be 0 for receives that only absorb WRITE WITH
    /// IMMEDIATE completions), as chained work requests: one `ibv_post_recv` call (and one
    /// turn of the provider's queue lock) per [`RECV_BATCH`] receives.
    pub fn post_recvs(&self, ids: &[u16], local: &Mr, len: usize) -> Result<()> {
        let qp = self.qp_ptr()?;
        verbs::post_recv_batches(ids, local, len, "ibv_post_recv", |wr, bad| {
            // SAFETY: live QP; the chain is valid for the call (post_recv_batches).
            unsafe { ffi::ibv_post_recv(qp, wr, bad) }
        })
    }
}

/// The fields of an RDMA WRITE work request that change from one post to the next: `wr_id`,
/// the one scatter-gather entry `sge` (none if empty), the target `to` = (remote address,
/// rkey) and the flags (`signaled`; inline when `inline`, which `CmId::fits_inline` decided).
fn write_fields(
    wr: &mut ffi::ibv_send_wr,
    wr_id: u64,
    sge: &mut ffi::ibv_sge,
    to: (u64, u32),
    signaled: bool,
    inline: bool,
) {
    let mut flags = 0;
    if signaled {
        flags |= ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
    }
    if inline {
        flags |= ffi::ibv_send_flags::IBV_SEND_INLINE.0;
    }
    wr.wr_id = wr_id;
    wr.num_sge = i32::from(sge.length != 0);
    wr.sg_list = sge;
    wr.send_flags = flags;
    wr.wr.rdma = ffi::rdma_t {
        remote_addr: to.0,
        rkey: to.1,
    };
}

impl Drop for CmId {
    fn drop(&mut self) {
        if crate::fds::abandoned() {
            return;
        }
        let lib = self.lib();
        // (before the CQs and PD it uses, which its parts hold, are released)
        self.destroy_qp();
        // SAFETY: live id; every event referring to it was acked when it was read (Event
        // copies and acks at once), so rdma_destroy_id cannot wait forever.
        unsafe { (lib.cm.rdma_destroy_id)(self.as_ptr()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The process that claims librdmacm keeps it; a fork child of it knows it inherited it
    /// (and makes its queue pairs on a context of its own).
    #[test]
    fn a_fork_child_of_the_owner_knows_it_inherited() {
        assert!(usable_here(), "the test process claims it first");
        assert!(usable_here(), "and keeps it");
        assert!(!inherited_state());
        // SAFETY: the child only reads an atomic, calls getpid and _exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let code = if inherited_state() && !usable_here() {
                0
            } else {
                1
            };
            // SAFETY: _exit in the fork child, no unwinding into the test harness.
            unsafe { libc::_exit(code) };
        }
        let mut st = 0;
        // SAFETY: our child.
        unsafe { libc::waitpid(pid, &mut st, 0) };
        assert!(
            libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
            "status {st:#x}"
        );
        assert!(usable_here(), "the parent still owns it");
    }
}
