//! rdma_cm: event channels, connection identifiers, RC queue pairs created through them, and
//! the work requests rdmashim posts (RDMA WRITE, WRITE WITH IMMEDIATE, SEND, RECV).

use std::ffi::c_int;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result, Unavailable};
use crate::sys::{self, ffi, Lib};
use crate::verbs::{self, Context, Cq, Mr, Pd};

pub use ffi::rdma_cm_event_type as event_type;

/// The largest private_data rdma_cm carries on a connect request over RoCE/IB (RDMA_PS_TCP:
/// 56 bytes; the CM's 92 less its own 36-byte header).
pub const MAX_CONNECT_PRIVATE_DATA: usize = 56;
/// The largest private_data on an accept (REP: 196 bytes).
pub const MAX_ACCEPT_PRIVATE_DATA: usize = 196;
/// The largest private_data on a reject (REJ: 148 bytes).
pub const MAX_REJECT_PRIVATE_DATA: usize = 148;
/// Receives chained into one `ibv_post_recv` call by [`CmId::post_recvs`].
pub const RECV_BATCH: usize = 32;

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

/// Whether this process can use rdma_cm and verbs (and, if nobody did yet, claims librdmacm
/// for it): true unless a process it was forked from had started librdmacm (then its state
/// here is the parent's; see [`CM_OWNER`]).
fn usable_here() -> bool {
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() } as u32;
    match CM_OWNER.compare_exchange(0, me, Ordering::SeqCst, Ordering::SeqCst) {
        Ok(_) => true,
        Err(owner) => owner == me,
    }
}

/// Whether this process inherited librdmacm's state from a process it was forked from that
/// had started it: then nothing RDMA can be done here ([`Unavailable::ForkedState`]).
pub fn inherited_state() -> bool {
    let owner = CM_OWNER.load(Ordering::SeqCst);
    // SAFETY: getpid has no preconditions.
    owner != 0 && owner != unsafe { libc::getpid() } as u32
}

impl EventChannel {
    /// `rdma_create_event_channel`, made non-blocking. Fails ([`Unavailable::ForkedState`])
    /// in a fork child of a process that had made one.
    pub fn new() -> Result<Arc<Self>> {
        let lib = sys::lib().map_err(|e| Unavailable::LibrariesMissing(e.clone()))?;
        if !usable_here() {
            return Err(Unavailable::ForkedState.into());
        }
        // SAFETY: no preconditions.
        let raw = unsafe { (lib.cm.rdma_create_event_channel)() };
        let raw = NonNull::new(raw).ok_or_else(|| Error::last("rdma_create_event_channel"))?;
        let ch = Arc::new(Self { raw, lib });
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

struct QpParts {
    _pd: Arc<Pd>,
    _send_cq: Arc<Cq>,
    _recv_cq: Arc<Cq>,
    caps: QpCaps,
}

/// Parameters of `rdma_connect`/`rdma_accept`.
#[derive(Debug, Clone, Default)]
pub struct ConnParam<'a> {
    /// Carried to the peer (≤ [`MAX_CONNECT_PRIVATE_DATA`] on connect,
    /// ≤ [`MAX_ACCEPT_PRIVATE_DATA`] on accept).
    pub private_data: &'a [u8],
    /// Outstanding RDMA READs we accept (rdmashim uses none; 0 is fine).
    pub responder_resources: u8,
    /// Outstanding RDMA READs we issue.
    pub initiator_depth: u8,
}

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

fn sockaddr_of(addr: SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
        }
    }
    ss
}

/// Converts a sockaddr of family AF_INET/AF_INET6 (anything else: `None`).
///
/// # Safety
/// `sa` must be the start of a buffer large enough for the address of its family (rdma_cm's
/// address unions are sockaddr_storage-sized).
unsafe fn sockaddr_to_std(sa: &libc::sockaddr) -> Option<SocketAddr> {
    let p = (sa as *const libc::sockaddr).cast::<u8>();
    match i32::from(sa.sa_family) {
        libc::AF_INET => {
            // SAFETY: AF_INET means a sockaddr_in lies here (per the caller's contract);
            // read_unaligned does not assume its alignment.
            let sin = unsafe { std::ptr::read_unaligned(p.cast::<libc::sockaddr_in>()) };
            let ip = std::net::Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::from((ip, u16::from_be(sin.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 = unsafe { std::ptr::read_unaligned(p.cast::<libc::sockaddr_in6>()) };
            let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::V6(std::net::SocketAddrV6::new(
                ip,
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
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
        let mut ss = sockaddr_of(addr);
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
        let mut s = src.map(sockaddr_of);
        let mut d = sockaddr_of(dst);
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

    /// The device context rdma_cm bound this id to (after address resolution, or on a
    /// connect request's id).
    pub fn context(&self) -> Result<Arc<Context>> {
        // SAFETY: live id.
        let verbs = unsafe { (*self.as_ptr()).verbs };
        let verbs =
            NonNull::new(verbs).ok_or(Error::InvalidArgument("cm id not bound to a device"))?;
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
        attr.cap.max_recv_wr = caps.max_recv_wr;
        attr.cap.max_send_sge = 1;
        attr.cap.max_recv_sge = 1;
        attr.cap.max_inline_data = caps.max_inline_data;
        // SAFETY: live id bound to pd's device; attr is fully initialised.
        let rc = unsafe { (self.lib().cm.rdma_create_qp)(self.as_ptr(), pd.as_ptr(), &mut attr) };
        Self::check(rc, "rdma_create_qp")?;
        self.qp = Some(QpParts {
            _pd: pd.clone(),
            _send_cq: send_cq.clone(),
            _recv_cq: recv_cq.clone(),
            // the provider may round the capacities up: keep what it granted
            caps: QpCaps {
                max_send_wr: attr.cap.max_send_wr,
                max_recv_wr: attr.cap.max_recv_wr,
                max_inline_data: attr.cap.max_inline_data,
            },
        });
        Ok(())
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
        unsafe { sockaddr_to_std(ffi::rdma_get_local_addr(&*self.as_ptr())) }
    }

    /// The peer's address (after address resolution, or on an accepted id).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: as in local_addr, for route.addr.dst_addr.
        unsafe { sockaddr_to_std(ffi::rdma_get_peer_addr(&*self.as_ptr())) }
    }

    /// The capacities the provider granted the QP.
    pub fn qp_caps(&self) -> Option<QpCaps> {
        self.qp.as_ref().map(|q| q.caps)
    }

    /// The QP number.
    pub fn qp_num(&self) -> Option<u32> {
        self.qp.as_ref()?;
        // SAFETY: live id with a QP.
        Some(unsafe { (*(*self.as_ptr()).qp).qp_num })
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
            // RC retries on a lost packet; the link's liveness is watched by TCP beside us.
            retry_count: 7,
            // 7 = retry forever on receiver-not-ready: the credit protocol keeps receives posted.
            rnr_retry_count: 7,
            srq: 0,
            qp_num: 0,
        })
    }

    /// `rdma_connect` with `param.private_data` (the event `ESTABLISHED`, `REJECTED` or
    /// `UNREACHABLE` follows).
    pub fn connect(&self, param: &ConnParam<'_>) -> Result<()> {
        let mut p = Self::conn_param(param, MAX_CONNECT_PRIVATE_DATA)?;
        // SAFETY: live id with a resolved route and a QP; p points at private_data, which
        // outlives the call (librdmacm copies it).
        let rc = unsafe { (self.lib().cm.rdma_connect)(self.as_ptr(), &mut p) };
        Self::check(rc, "rdma_connect")
    }

    /// `rdma_accept` with `param.private_data`.
    pub fn accept(&self, param: &ConnParam<'_>) -> Result<()> {
        let mut p = Self::conn_param(param, MAX_ACCEPT_PRIVATE_DATA)?;
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

    /// `rdma_disconnect`.
    pub fn disconnect(&self) -> Result<()> {
        // SAFETY: live id.
        let rc = unsafe { (self.lib().cm.rdma_disconnect)(self.as_ptr()) };
        Self::check(rc, "rdma_disconnect")
    }

    fn qp_ptr(&self) -> Result<*mut ffi::ibv_qp> {
        if self.qp.is_none() {
            return Err(Error::InvalidArgument("the id has no QP"));
        }
        // SAFETY: live id with a QP.
        Ok(unsafe { (*self.as_ptr()).qp })
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
        let inline = self
            .qp_caps()
            .is_some_and(|c| len <= c.max_inline_data as usize);
        self.post_write_sge(wr_id, &mut sge, remote_addr, rkey, imm, signaled, inline)
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
        inline: bool,
    ) -> Result<()> {
        // SAFETY: all-zero is a valid ibv_send_wr (null next, no flags).
        let mut wr: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = sge;
        wr.num_sge = if sge.length == 0 { 0 } else { 1 };
        wr.opcode = match imm {
            Some(_) => ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM,
            None => ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
        };
        if let Some(imm) = imm {
            wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
        }
        let mut flags = 0;
        if signaled {
            flags |= ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        if inline && sge.length > 0 {
            flags |= ffi::ibv_send_flags::IBV_SEND_INLINE.0;
        }
        wr.send_flags = flags;
        wr.wr.rdma = ffi::rdma_t { remote_addr, rkey };
        self.post(&mut wr)
    }

    /// Posts a SEND of `len` bytes at `offset` in `local`.
    pub fn post_send(
        &self,
        wr_id: u64,
        local: &Mr,
        offset: usize,
        len: usize,
        signaled: bool,
    ) -> Result<()> {
        let mut sge = local.sge(offset, len)?;
        // SAFETY: all-zero is a valid ibv_send_wr.
        let mut wr: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = ffi::ibv_wr_opcode::IBV_WR_SEND;
        let mut flags = 0;
        if signaled {
            flags |= ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        if self
            .qp_caps()
            .is_some_and(|c| len <= c.max_inline_data as usize)
        {
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
        for chunk in ids.chunks(RECV_BATCH) {
            let mut sges = [ffi::ibv_sge {
                addr: 0,
                length: 0,
                lkey: 0,
            }; RECV_BATCH];
            for (sge, &id) in sges.iter_mut().zip(chunk) {
                *sge = local.sge(usize::from(id) * len, len)?;
            }
            let mut wrs = [ffi::ibv_recv_wr {
                wr_id: 0,
                next: std::ptr::null_mut(),
                sg_list: std::ptr::null_mut(),
                num_sge: 0,
            }; RECV_BATCH];
            for ((wr, &id), sge) in wrs.iter_mut().zip(chunk).zip(sges.iter_mut()) {
                wr.wr_id = u64::from(id);
                wr.sg_list = sge;
                wr.num_sge = if len == 0 { 0 } else { 1 };
            }
            let base = wrs.as_mut_ptr();
            for i in 1..chunk.len() {
                // SAFETY: i < chunk.len() <= RECV_BATCH: both are elements of `wrs`, which
                // outlives the call below.
                unsafe { (*base.add(i - 1)).next = base.add(i) };
            }
            let mut bad = std::ptr::null_mut();
            // SAFETY: live QP; the chain (wrs[..chunk.len()], each with its sge) is valid for
            // the call; the buffers are registered in `local`.
            let rc = unsafe { ffi::ibv_post_recv(qp, base, &mut bad) };
            if rc != 0 {
                return Err(Error::returned("ibv_post_recv", rc));
            }
        }
        Ok(())
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        let lib = self.lib();
        if let Some(parts) = self.qp.take() {
            // SAFETY: live id with a QP created by rdma_create_qp; destroyed once, before the
            // CQs and PD it uses (held by `parts`) are released.
            unsafe { (lib.cm.rdma_destroy_qp)(self.as_ptr()) };
            drop(parts);
        }
        // SAFETY: live id; every event referring to it was acked when it was read (Event
        // copies and acks at once), so rdma_destroy_id cannot wait forever.
        unsafe { (lib.cm.rdma_destroy_id)(self.as_ptr()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The process that claims librdmacm keeps it; a fork child of it is refused, and knows.
    #[test]
    fn a_fork_child_of_the_owner_is_refused() {
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
