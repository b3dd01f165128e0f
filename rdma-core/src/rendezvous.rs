//! The same-host rendezvous: how two processes that hold the two ends of one TCP connection
//! meet and exchange the descriptors of their shared-memory rings ([`crate::shm`]), and get a
//! [`Link`] over them. The server listens on a `SOCK_SEQPACKET` Unix socket of the abstract
//! namespace (so of one network namespace) named after its port; a client connects, sends
//! its request (the key and proofs bound to the TCP connection, as over rdma_cm) with its
//! inbox's descriptors, and gets the server's reply and descriptors, or a rejection. The
//! requester's credentials are read with `SO_PEERCRED`; a request that cannot prove it holds
//! the TCP connection is refused and learns nothing (docs/protocol.md, "Same host").
#![allow(unsafe_code)]

use std::fmt;
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rdmashim_proto::{
    AcceptReply, ConfigError, ConnectRequest, Connection, Proof, Reject, RejectReason,
};

use crate::link::{err, DialError, DialStatus, Link, StreamConfig};
use crate::shm::{os_err, Fd, Inbox, Outbox, ShmEndpoint, CONFIRM, FDS};

/// First byte of a server's answer on the rendezvous socket.
const ANSWER_ACCEPT: u8 = 1;
const ANSWER_REJECT: u8 = 2;

/// Bytes before the `ConnectRequest` in a client's message: the IP address of its end of
/// the TCP connection (IPv6, an IPv4 one mapped), which rdma_cm would have reported. A claim,
/// checked like the ports: the request's tag covers the whole 4-tuple.
const SOURCE_LEN: usize = 16;

/// `sockaddr_un` for the abstract name `name` (no file: of the network namespace), and its
/// length.
fn abstract_addr(name: &[u8]) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: an all-zero sockaddr_un is valid.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if name.is_empty() || name.len() + 1 > a.sun_path.len() {
        return Err(err(
            io::ErrorKind::InvalidInput,
            "an abstract socket name of 1 to 107 bytes",
        ));
    }
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in a.sun_path[1..].iter_mut().zip(name) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::offset_of!(libc::sockaddr_un, sun_path) + 1 + name.len();
    Ok((a, len as libc::socklen_t))
}

fn seqpacket() -> io::Result<Fd> {
    let ty = libc::SOCK_SEQPACKET | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
    // SAFETY: no pointers.
    Fd::made(
        unsafe { crate::raw_syscall!(libc::SYS_socket, libc::AF_UNIX, ty, 0) },
        "socket(AF_UNIX, SOCK_SEQPACKET)",
    )
}

/// A rendezvous socket bound (`nr` = `SYS_bind`) or connected (`SYS_connect`) to the
/// abstract name `name`; `what` names the call in errors.
fn seqpacket_at(name: &[u8], nr: libc::c_long, what: &str) -> io::Result<Fd> {
    let sock = seqpacket()?;
    let (a, len) = abstract_addr(name)?;
    let at = &a as *const libc::sockaddr_un;
    // SAFETY: bind or connect with a valid sockaddr_un of `len` bytes.
    if unsafe { crate::raw_syscall!(nr, sock.raw(), at, len) } != 0 {
        return Err(os_err(what));
    }
    Ok(sock)
}

/// Sends one message of `bytes` with descriptors `fds` (none: `&[]`).
fn send_msg(sock: RawFd, bytes: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    let mut cbuf = [0u64; 8];
    // SAFETY: an all-zero msghdr is valid.
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    m.msg_iov = &mut iov;
    m.msg_iovlen = 1;
    if !fds.is_empty() {
        let data = std::mem::size_of_val(fds) as u32;
        // SAFETY: CMSG_* compute sizes and walk the buffer we own, which holds
        // CMSG_SPACE(data) bytes (64 ≥ 16 + 3 * 4 rounded); the header is written in place.
        unsafe {
            m.msg_control = cbuf.as_mut_ptr().cast();
            m.msg_controllen = libc::CMSG_SPACE(data) as usize;
            let c = libc::CMSG_FIRSTHDR(&m);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(data) as usize;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr(),
                libc::CMSG_DATA(c).cast::<RawFd>(),
                fds.len(),
            );
        }
    }
    // SAFETY: m points to live buffers for the call's duration.
    let r = unsafe {
        crate::raw_syscall!(
            libc::SYS_sendmsg,
            sock,
            &m as *const libc::msghdr,
            libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT
        )
    };
    if r < 0 {
        return Err(os_err("sendmsg"));
    }
    if r as usize != bytes.len() {
        return Err(err(io::ErrorKind::WriteZero, "sendmsg: a short message"));
    }
    Ok(())
}

/// What [`recv_msg`] got.
enum Got {
    /// Nothing yet.
    Nothing,
    /// The peer's end closed.
    End,
    /// A message of this many bytes, and the descriptors it carried.
    Message(usize, Vec<Fd>),
}

/// Receives one message without blocking, into `buf`, with the descriptors it carries
/// (close-on-exec, moved above the floor).
fn recv_msg(sock: RawFd, buf: &mut [u8]) -> io::Result<Got> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cbuf = [0u64; 8];
    // SAFETY: an all-zero msghdr is valid.
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    m.msg_iov = &mut iov;
    m.msg_iovlen = 1;
    m.msg_control = cbuf.as_mut_ptr().cast();
    m.msg_controllen = std::mem::size_of_val(&cbuf);
    // SAFETY: m points to live buffers for the call's duration.
    let r = unsafe {
        crate::raw_syscall!(
            libc::SYS_recvmsg,
            sock,
            &mut m as *mut libc::msghdr,
            libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(Got::Nothing),
            _ => Err(io::Error::new(e.kind(), format!("recvmsg: {e}"))),
        };
    }
    let mut fds = Vec::new();
    // SAFETY: the kernel filled msg_control up to msg_controllen; CMSG_* walk it.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&m);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let n = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / 4;
                let p = libc::CMSG_DATA(c).cast::<RawFd>();
                for i in 0..n {
                    fds.push(Fd::made(
                        libc::c_long::from(p.add(i).read_unaligned()),
                        "SCM_RIGHTS",
                    )?);
                }
            }
            c = libc::CMSG_NXTHDR(&m, c);
        }
    }
    if r == 0 && fds.is_empty() {
        return Ok(Got::End);
    }
    if m.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 {
        return Err(err(
            io::ErrorKind::InvalidData,
            "a handshake message too long",
        ));
    }
    Ok(Got::Message(r as usize, fds))
}

fn three(fds: Vec<Fd>) -> io::Result<[Fd; FDS]> {
    <[Fd; FDS]>::try_from(fds).map_err(|v| {
        err(
            io::ErrorKind::InvalidData,
            format!("{} descriptors, not {FDS}", v.len()),
        )
    })
}

/// Server side: the rendezvous socket of one listening name, whose requests the caller
/// matches itself (as [`crate::UpgradeListener`]'s).
pub struct ShmListener {
    sock: Fd,
}

impl fmt::Debug for ShmListener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShmListener")
            .field("fd", &self.sock)
            .finish()
    }
}

/// How long [`ShmListener::next`] waits for the request of a connection it accepted before
/// the client had sent it (it sends right after its connect: a few microseconds).
const REQUEST_WAIT: Duration = Duration::from_millis(50);

impl ShmListener {
    /// Listens on the abstract Unix name `name` (non-blocking). `AddrInUse` if another
    /// socket has it.
    pub fn bind(name: &[u8]) -> io::Result<ShmListener> {
        let sock = seqpacket_at(name, libc::SYS_bind, "bind")?;
        // SAFETY: no pointers.
        if unsafe { crate::raw_syscall!(libc::SYS_listen, sock.raw(), 1024) } != 0 {
            return Err(os_err("listen"));
        }
        Ok(ShmListener { sock })
    }

    /// Readable when a request is pending (then call [`Self::next`] until `None`).
    pub fn fd(&self) -> RawFd {
        self.sock.raw()
    }

    /// The next request, without blocking (but for a request still on its way from a
    /// client that has connected: up to [`REQUEST_WAIT`]). One that is not a decodable
    /// `ConnectRequest` with three descriptors is rejected (`Malformed`, `UnsupportedVersion`)
    /// and skipped.
    pub fn next(&self) -> io::Result<Option<ShmIncoming>> {
        loop {
            let flags = libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
            // SAFETY: no address wanted.
            let r = unsafe { crate::raw_syscall!(libc::SYS_accept4, self.sock.raw(), 0, 0, flags) };
            if r < 0 {
                let e = io::Error::last_os_error();
                return match e.kind() {
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
                    io::ErrorKind::ConnectionAborted => continue,
                    _ => Err(io::Error::new(e.kind(), format!("accept4: {e}"))),
                };
            }
            let sock = Fd::made(r, "accept4")?;
            let mut buf = [0u8; 256];
            let deadline = Instant::now() + REQUEST_WAIT;
            let got = loop {
                match recv_msg(sock.raw(), &mut buf) {
                    Ok(Got::Nothing) if Instant::now() < deadline => {
                        let mut p = libc::pollfd {
                            fd: sock.raw(),
                            events: libc::POLLIN,
                            revents: 0,
                        };
                        let ts = libc::timespec {
                            tv_sec: 0,
                            tv_nsec: 5_000_000,
                        };
                        // SAFETY: one valid pollfd and timespec; a raw ppoll with a timeout.
                        unsafe {
                            crate::raw_syscall!(
                                libc::SYS_ppoll,
                                &mut p as *mut libc::pollfd,
                                1,
                                &ts as *const libc::timespec,
                                0,
                                8
                            )
                        };
                    }
                    other => break other,
                }
            };
            let Ok(Got::Message(n, fds)) = got else {
                continue;
            };
            let Some((ip, req)) = buf[..n].split_first_chunk::<SOURCE_LEN>() else {
                let _ = answer_reject(&sock, RejectReason::Malformed);
                continue;
            };
            let ip = std::net::Ipv6Addr::from(*ip);
            let ip = ip
                .to_ipv4_mapped()
                .map_or(std::net::IpAddr::V6(ip), std::net::IpAddr::V4);
            let request = match ConnectRequest::decode(req) {
                Ok(r) => r,
                Err(e) => {
                    let _ = answer_reject(&sock, RejectReason::for_decode_error(&e));
                    continue;
                }
            };
            let Ok(fds) = three(fds) else {
                let _ = answer_reject(&sock, RejectReason::Malformed);
                continue;
            };
            return Ok(Some(ShmIncoming {
                sock: Some(sock),
                source: std::net::SocketAddr::new(ip, request.client_port),
                request,
                fds: Some(fds),
            }));
        }
    }
}

fn answer_reject(sock: &Fd, reason: RejectReason) -> io::Result<()> {
    let r = Reject::new(reason).encode();
    let mut msg = Vec::with_capacity(1 + r.len());
    msg.push(ANSWER_REJECT);
    msg.extend_from_slice(&r);
    send_msg(sock.raw(), &msg, &[])
}

/// The credentials of the process at the other end of `sock` (`SO_PEERCRED`, as of its
/// connect): for logs, and for a caller's own policy.
fn peer_cred(sock: &Fd) -> Option<libc::ucred> {
    let mut c = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: c and len are valid out-pointers of the sizes given.
    let r = unsafe {
        crate::raw_syscall!(
            libc::SYS_getsockopt,
            sock.raw(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut c as *mut libc::ucred,
            &mut len as *mut libc::socklen_t
        )
    };
    (r == 0).then_some(c)
}

/// A decoded request not answered yet. Dropping it rejects it (`Resources`).
pub struct ShmIncoming {
    sock: Option<Fd>,
    /// The client's end of the TCP connection, as it claims (its tag proves it or not).
    source: std::net::SocketAddr,
    request: ConnectRequest,
    fds: Option<[Fd; FDS]>,
}

impl fmt::Debug for ShmIncoming {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShmIncoming")
            .field("source", &self.source)
            .field("request", &self.request)
            .finish()
    }
}

impl ShmIncoming {
    /// The decoded request.
    pub fn request(&self) -> &ConnectRequest {
        &self.request
    }

    /// The client's end of the TCP connection, as the request claims it (the IP beside the
    /// request, its `client_port`): a claim that [`Self::accept`]'s proof checks.
    pub fn source(&self) -> Option<std::net::SocketAddr> {
        Some(self.source)
    }

    /// The requesting process's pid, uid and gid (`SO_PEERCRED`).
    pub fn peer(&self) -> Option<libc::ucred> {
        self.sock.as_ref().and_then(peer_cred)
    }

    /// Rejects the request with `reason`.
    pub fn reject(mut self, reason: RejectReason) {
        self.refuse(reason);
    }

    fn refuse(&mut self, reason: RejectReason) {
        if let Some(s) = self.sock.take() {
            let _ = answer_reject(&s, reason);
        }
    }

    /// Accepts the request if it proves `proof` (as [`crate::Incoming::accept`]): maps the
    /// client's inbox from its descriptors (checked against the sizes it announced), makes
    /// this side's, starts the core and sends the reply with this side's descriptors. The
    /// link is established when the client's [`CONFIRM`] comes (its link watches the socket).
    pub fn accept(
        mut self,
        cfg: &StreamConfig,
        tcp_received: u64,
        proof: &Proof,
    ) -> io::Result<Link> {
        if !self.request.proves(proof) {
            self.refuse(RejectReason::Unproven);
            return Err(err(
                io::ErrorKind::PermissionDenied,
                "the request does not prove it holds the TCP connection",
            ));
        }
        let sizes = match cfg.sizes() {
            Ok(s) => s,
            Err(e) => {
                self.refuse(RejectReason::Resources);
                return Err(e);
            }
        };
        let fds = self
            .fds
            .take()
            .expect("an unanswered request has its descriptors");
        let built =
            Outbox::open(fds, self.request.ring.size, self.request.recv_slots).and_then(|out| {
                Inbox::new(sizes.ring_size, sizes.recv_slots).map(|inbox| (inbox, out))
            });
        let (mut inbox, outbox) = match built {
            Ok(b) => b,
            Err(e) => {
                let reason = if e.kind() == io::ErrorKind::InvalidData {
                    RejectReason::Malformed
                } else {
                    RejectReason::Resources
                };
                self.refuse(reason);
                return Err(e);
            }
        };
        let (conn, reply) = match Connection::accept(
            shm_protocol(cfg),
            inbox.params(),
            &self.request,
            proof,
            tcp_received,
            Instant::now(),
        ) {
            Ok(r) => r,
            Err(e) => {
                self.refuse(match e {
                    ConfigError::Unproven => RejectReason::Unproven,
                    _ => RejectReason::Resources,
                });
                return Err(err(io::ErrorKind::InvalidInput, e.to_string()));
            }
        };
        let sock = self
            .sock
            .take()
            .expect("an unanswered request has its socket");
        let r = reply.encode();
        let mut msg = Vec::with_capacity(1 + r.len());
        msg.push(ANSWER_ACCEPT);
        msg.extend_from_slice(&r);
        send_msg(sock.raw(), &msg, &inbox.fds())?;
        inbox.passed();
        let ep = ShmEndpoint::new(inbox, outbox, sock);
        Ok(Link::from_shm(conn, ep, cfg.close_timeout))
    }
}

impl Drop for ShmIncoming {
    fn drop(&mut self) {
        self.refuse(RejectReason::Resources);
    }
}

/// Client side: the request sent on a connected rendezvous socket, the reply awaited
/// without blocking (as [`crate::Dialer`]).
pub struct ShmDialer {
    /// `None` once the dial has ended.
    state: Option<(Connection, Inbox, Fd)>,
    deadline: Instant,
    close_timeout: Duration,
}

/// Dials to a process of this host under way ([`dials`]).
static DIALS: AtomicUsize = AtomicUsize::new(0);

/// How many of this process's dials to a process of this host are under way: each has mapped
/// its own ring and maps its peer's when answered (see [`crate::mappings`]).
pub fn dials() -> usize {
    DIALS.load(Ordering::Relaxed)
}

impl Drop for ShmDialer {
    fn drop(&mut self) {
        if self.state.is_some() {
            DIALS.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl fmt::Debug for ShmDialer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShmDialer")
            .field("pending", &self.state.is_some())
            .finish()
    }
}

/// Whether a send on a rendezvous socket failed because the other end closed it (the dial's
/// confirmation, the server's answer): that end's application closed the connection during
/// the handshake.
pub fn peer_gone(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
    )
}

impl ShmDialer {
    /// Connects to the abstract name `name` and sends the request for the TCP connection
    /// `client` → `server_port` bound by `proof` (`tcp_received`: bytes the application has
    /// read from the socket so far), with this side's inbox. The reply must come by now +
    /// `cfg.connect_timeout`. No listener on the name: `ConnectionRefused`.
    pub fn start(
        name: &[u8],
        client: std::net::SocketAddr,
        server_port: u16,
        proof: Proof,
        tcp_received: u64,
        cfg: &StreamConfig,
    ) -> io::Result<ShmDialer> {
        let sizes = cfg.sizes()?;
        let sock = seqpacket_at(name, libc::SYS_connect, "connect")?;
        let mut inbox = Inbox::new(sizes.ring_size, sizes.recv_slots)?;
        let (conn, req) = Connection::connect(
            shm_protocol(cfg),
            inbox.params(),
            &proof,
            client.port(),
            server_port,
            crate::link::nonce(),
            tcp_received,
            Instant::now(),
        )
        .map_err(|e| err(io::ErrorKind::InvalidInput, e.to_string()))?;
        let ip = match client.ip() {
            std::net::IpAddr::V4(a) => a.to_ipv6_mapped(),
            std::net::IpAddr::V6(a) => a,
        };
        let mut msg = ip.octets().to_vec();
        msg.extend_from_slice(&req.encode());
        send_msg(sock.raw(), &msg, &inbox.fds())?;
        inbox.passed();
        DIALS.fetch_add(1, Ordering::Relaxed);
        Ok(ShmDialer {
            state: Some((conn, inbox, sock)),
            deadline: Instant::now() + cfg.connect_timeout,
            close_timeout: cfg.close_timeout,
        })
    }

    /// Readable when the answer came (or the server went away); -1 once ended.
    pub fn fd(&self) -> RawFd {
        self.state.as_ref().map_or(-1, |s| s.2.raw())
    }

    /// When the dial times out.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Moves the deadline to `until` if that is later, while the request waits for its
    /// answer (see [`crate::link::Dialer::wait_longer`]). Returns whether it moved.
    pub fn wait_longer(&mut self, until: Instant) -> bool {
        if self.state.is_some() && until > self.deadline {
            self.deadline = until;
            return true;
        }
        false
    }

    /// Takes the answer if it came: the reply (checked by the core, then the server's inbox
    /// mapped) gives the established [`Link`]; a rejection, the server's end closing, an
    /// unusable reply or the deadline fail the dial. Spent once it returned `Connected` or
    /// `Failed`.
    pub fn poll(&mut self) -> DialStatus {
        self.poll_at(Instant::now())
    }

    /// As [`poll`](Self::poll), the deadline judged at `now` (see [`Dialer::poll_at`]).
    ///
    /// [`Dialer::poll_at`]: crate::link::Dialer::poll_at
    pub fn poll_at(&mut self, now: Instant) -> DialStatus {
        let Some((_, _, sock)) = &self.state else {
            return DialStatus::Failed(DialError::Local(err(
                io::ErrorKind::InvalidInput,
                "the dial has ended",
            )));
        };
        let mut buf = [0u8; 256];
        let got = recv_msg(sock.raw(), &mut buf);
        let (n, fds) = match got {
            Ok(Got::Nothing) if now < self.deadline => return DialStatus::Pending,
            Ok(Got::Nothing) => return self.end(DialError::Timeout),
            // (the name had a listener, which closed the request unanswered: its shim gave up
            // on it, typically as its application closed the connection; not a host without
            // the shim, which refuses the connect itself)
            Ok(Got::End) => {
                return self.end(DialError::Broken(
                    "the server closed the rendezvous unanswered".into(),
                ))
            }
            Ok(Got::Message(n, fds)) => (n, fds),
            // (the same, when the server's end went with bytes of ours unread: the kernel
            // reports ECONNRESET rather than the end — not a failure of this side's)
            Err(e) if peer_gone(&e) => {
                return self.end(DialError::Broken(format!(
                    "the server closed the rendezvous unanswered ({e})"
                )))
            }
            Err(e) => return self.end(DialError::Local(e)),
        };
        let (mut conn, inbox, sock) = self.state.take().expect("checked above");
        DIALS.fetch_sub(1, Ordering::Relaxed);
        // (the server's side is established only by the confirmation, sent once this side
        // has everything it needs: a failure below closes the socket instead)
        match buf[..n].split_first() {
            Some((&ANSWER_REJECT, r)) => DialStatus::Failed(DialError::Rejected(
                Reject::decode(r).ok().map(|r| r.reason),
            )),
            Some((&ANSWER_ACCEPT, reply)) => {
                let link = conn
                    .handle_accept(reply)
                    .map_err(|r| err(r.io_kind(), format!("shared-memory upgrade: {r}")))
                    .and_then(|()| {
                        AcceptReply::decode(reply)
                            .map_err(|e| err(io::ErrorKind::InvalidData, e.to_string()))
                    })
                    .and_then(|a| Outbox::open(three(fds)?, a.ring.size, a.recv_slots))
                    .and_then(|outbox| send_msg(sock.raw(), &[CONFIRM], &[]).map(|()| outbox))
                    .map(|outbox| {
                        let ep = ShmEndpoint::new(inbox, outbox, sock);
                        Link::from_shm(conn, ep, self.close_timeout)
                    });
                match link {
                    Ok(l) => DialStatus::Connected(l),
                    // (the server accepted, then its end went away before the confirmation:
                    // its application closed the connection meanwhile)
                    Err(e) if peer_gone(&e) => DialStatus::Failed(DialError::Broken(e.to_string())),
                    Err(e) => DialStatus::Failed(DialError::Local(e)),
                }
            }
            _ => DialStatus::Failed(DialError::Local(err(
                io::ErrorKind::InvalidData,
                "an answer of an unknown kind",
            ))),
        }
    }

    fn end(&mut self, e: DialError) -> DialStatus {
        if self.state.take().is_some() {
            DIALS.fetch_sub(1, Ordering::Relaxed);
        }
        DialStatus::Failed(e)
    }
}

/// The protocol configuration of a shared-memory link: `cfg`'s, asking for the WRITE WITH
/// IMMEDIATE kind whatever `cfg` asks for (the other kinds are ways of using an RDMA device;
/// shared memory has its own carriage, and its peer is told nothing else).
fn shm_protocol(cfg: &StreamConfig) -> rdmashim_proto::Config {
    rdmashim_proto::Config {
        kind: rdmashim_proto::Kind::WriteImm,
        ..cfg.protocol
    }
}
