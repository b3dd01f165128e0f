//! Shared-memory rings between two processes of one host: the transport behind a [`Link`]
//! whose peer is local. The protocol core, the cursors, the credits, the switch and the
//! switch back are the RDMA link's; only the carriage differs — memory both processes map
//! instead of memory a device writes (docs/protocol.md, "Same host").
//!
//! Each side makes an *inbox* and passes its three descriptors to the peer in the handshake:
//!
//! - its **receive ring**: a memfd sealed at its size (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`:
//!   the peer can never truncate it under us, which would make our next access fault), mapped
//!   twice back to back by both processes. The receiver reads contiguous slices out of it; the
//!   sender's staging ring *is* this mapping, so a byte is copied once, from the application's
//!   buffer into the peer's ring, where the RDMA link copies it into staging and the device
//!   copies it again;
//! - its **queue**: a sealed memfd holding a header (the sender's tail, the receiver's "asleep"
//!   flag) and one entry per receive slot of the protocol (credits bound what the sender may
//!   have outstanding, exactly as they bound posted receives): a write with immediate (data
//!   or credit, the immediate and the byte count) or a control message's bytes;
//! - its **wake-up eventfd**: the sender writes it after a message when the receiver armed
//!   (said it is about to sleep), and clears the flag: one system call per sleep, none while
//!   the receiver spins.
//!
//! The handshake runs over a connected `SOCK_SEQPACKET` Unix socket (abstract name, so of
//! one network namespace): the client's request and descriptors, the server's reply and
//! descriptors, or its rejection. The socket then stands where the RDMA link has its rdma_cm
//! channel: its end (the peer's process gone) is the disconnect. Nothing else of either
//! process is reachable: the peer gets only these descriptors, and a request is accepted only
//! if it proves it holds the TCP connection (the same key and tags as over rdma_cm, both
//! ways, so a squatter on the name learns nothing and takes nothing over).
//!
//! Everything a peer puts in shared memory is read as untrusted: queue positions beyond what
//! the credits allow, unknown entry kinds and oversized control messages fail the link; the
//! core checks every immediate against the ring as it does for RDMA.

use std::fmt;
use std::io;
use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rdmashim_proto::{
    AcceptReply, Completion, ConfigError, ConnectRequest, Connection, LocalParams, Proof, Reject,
    RejectReason, RingDesc, RingSize, MAX_CONTROL_LEN,
};

use crate::fds;
use crate::link::{err, DialError, DialStatus, Link, StreamConfig};
use crate::ring::MagicRing;

/// Bytes of the queue header: the tail (written by the sender) and the asleep flag (set by
/// the receiver, cleared by the sender), a cache line each.
const HEADER: usize = 128;
const TAIL_AT: usize = 0;
const ARMED_AT: usize = 64;
/// Bytes of one queue entry: kind, immediate, length, then a control message's bytes.
const ENTRY: usize = 128;
const PAYLOAD_AT: usize = 16;
const KIND_WRITE_IMM: u32 = 1;
const KIND_CONTROL: u32 = 2;

/// First byte of a server's answer on the rendezvous socket.
const ANSWER_ACCEPT: u8 = 1;
const ANSWER_REJECT: u8 = 2;
/// The client's one message after the reply (rdma_cm's RTU): it mapped the server's inbox and
/// goes on over the rings. Until it comes the server's link is not established, so its side
/// commits nothing to a ring the client may never read (a client whose dial timed out, or
/// failed on the reply, closes its end instead).
const CONFIRM: u8 = 3;

/// Descriptors a handshake message carries: ring, queue, eventfd.
const FDS: usize = 3;

/// Bytes before the `ConnectRequest` in a client's message: the IP address of its end of
/// the TCP connection (IPv6, an IPv4 one mapped), which rdma_cm would have reported. A claim,
/// checked like the ports: the request's tag covers the whole 4-tuple.
const SOURCE_LEN: usize = 16;

const SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// A descriptor of the transport's own: moved above the floor when made, told to the watcher
/// (`crate::fds`), closed with a raw system call (a preload shim's hooks never see it).
struct Fd(RawFd);

impl Fd {
    /// Takes the result of a raw system call that made a descriptor.
    fn made(r: libc::c_long, what: &str) -> io::Result<Fd> {
        if r < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
        }
        let fd = fds::relocate(r as RawFd);
        fds::opened(fd);
        Ok(Fd(fd))
    }

    fn raw(&self) -> RawFd {
        self.0
    }
}

impl Drop for Fd {
    fn drop(&mut self) {
        if fds::abandoned() {
            return;
        }
        fds::closing(self.0);
        // SAFETY: our descriptor, closed once.
        unsafe { crate::raw_syscall!(libc::SYS_close, self.0) };
    }
}

impl fmt::Debug for Fd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "fd {}", self.0)
    }
}

fn os_err(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// A sealed memfd of `len` bytes (zeroed).
fn sealed_memfd(len: usize, name: &std::ffi::CStr) -> io::Result<Fd> {
    let flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    // SAFETY: a NUL-terminated name, no other pointers.
    let fd = Fd::made(
        unsafe { crate::raw_syscall!(libc::SYS_memfd_create, name.as_ptr(), flags) },
        "memfd_create",
    )?;
    // SAFETY: no pointers.
    if unsafe { crate::raw_syscall!(libc::SYS_ftruncate, fd.raw(), len) } != 0 {
        return Err(os_err("ftruncate"));
    }
    // SAFETY: no pointers.
    if unsafe { crate::raw_syscall!(libc::SYS_fcntl, fd.raw(), libc::F_ADD_SEALS, SEALS) } != 0 {
        return Err(os_err("fcntl(F_ADD_SEALS)"));
    }
    Ok(fd)
}

/// Checks that `fd`, from the peer, is a memfd of exactly `len` bytes that can never change
/// size (so mapping it cannot fault later).
fn check_sealed(fd: &Fd, len: usize, what: &str) -> io::Result<()> {
    // SAFETY: no pointers.
    let seals = unsafe { crate::raw_syscall!(libc::SYS_fcntl, fd.raw(), libc::F_GET_SEALS) };
    let need = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
    if seals < 0 || (seals as libc::c_int) & need != need {
        return Err(err(
            io::ErrorKind::InvalidData,
            format!("the peer's {what} is not a memfd sealed at its size"),
        ));
    }
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: st is a valid out-pointer for a struct stat.
    if unsafe { crate::raw_syscall!(libc::SYS_fstat, fd.raw(), st.as_mut_ptr()) } != 0 {
        return Err(os_err("fstat"));
    }
    // SAFETY: zero-initialised and filled by the kernel.
    let size = unsafe { st.assume_init() }.st_size;
    if size as u64 != len as u64 {
        return Err(err(
            io::ErrorKind::InvalidData,
            format!("the peer's {what} is {size} bytes, not {len}"),
        ));
    }
    Ok(())
}

/// A shared mapping of a queue memfd.
struct Mapping {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: plain shared memory owned by this value; every access goes through atomics or
// byte copies made by the one owner of the link.
unsafe impl Send for Mapping {}

impl Mapping {
    fn new(fd: &Fd, len: usize) -> io::Result<Mapping> {
        // SAFETY: a fresh shared mapping of the whole memfd at an address the kernel picks.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.raw(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(os_err("mmap(queue)"));
        }
        // A fork child must not share the queue (its copy of the link is not its own).
        // SAFETY: our own mapping.
        unsafe { libc::madvise(p, len, libc::MADV_DONTFORK) };
        let base = NonNull::new(p.cast::<u8>()).ok_or_else(|| os_err("mmap(queue)"))?;
        Ok(Mapping { base, len })
    }

    fn word(&self, at: usize) -> &AtomicU32 {
        debug_assert!(at + 4 <= HEADER && at.is_multiple_of(4));
        // SAFETY: `at` is a 4-aligned offset inside the header of this live, page-aligned
        // mapping; the peer reads and writes these words only atomically.
        unsafe { &*self.base.as_ptr().add(at).cast::<AtomicU32>() }
    }

    fn entry(&self, i: u32) -> *mut u8 {
        let at = HEADER + i as usize * ENTRY;
        assert!(at + ENTRY <= self.len);
        // SAFETY: inside the mapping (checked above).
        unsafe { self.base.as_ptr().add(at) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: our mapping, unmapped once.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

fn ring_err(e: crate::ring::RingError) -> io::Error {
    io::Error::other(e.to_string())
}

fn queue_len(slots: u16) -> usize {
    let page = crate::verbs::page_size();
    (HEADER + usize::from(slots) * ENTRY).div_ceil(page) * page
}

/// This side's inbox: what the peer writes into and wakes.
struct Inbox {
    ring: MagicRing,
    queue: Mapping,
    /// The descriptors, passed to the peer in the handshake, then closed (the mappings
    /// keep the memory; the eventfd stays: it is what this side sleeps on).
    ring_fd: Option<Fd>,
    queue_fd: Option<Fd>,
    wake: Fd,
    slots: u16,
    /// Next entry to read (the sender's tail runs ahead of it by at most `slots`).
    head: u32,
}

impl Inbox {
    fn new(ring_size: usize, slots: u16) -> io::Result<Inbox> {
        crate::ring::check_size(ring_size).map_err(ring_err)?;
        let ring_fd = sealed_memfd(ring_size, c"rdmashim-shm-ring")?;
        let ring = MagicRing::map_shared(ring_fd.raw(), ring_size).map_err(ring_err)?;
        let qlen = queue_len(slots);
        let queue_fd = sealed_memfd(qlen, c"rdmashim-shm-queue")?;
        let queue = Mapping::new(&queue_fd, qlen)?;
        // SAFETY: no pointers.
        let wake = Fd::made(
            unsafe {
                crate::raw_syscall!(
                    libc::SYS_eventfd2,
                    0,
                    libc::EFD_CLOEXEC | libc::EFD_NONBLOCK
                )
            },
            "eventfd",
        )?;
        Ok(Inbox {
            ring,
            queue,
            ring_fd: Some(ring_fd),
            queue_fd: Some(queue_fd),
            wake,
            slots,
            head: 0,
        })
    }

    fn params(&self) -> LocalParams {
        LocalParams {
            ring: RingDesc {
                addr: 0,
                rkey: 0,
                size: RingSize::new(self.ring.size() as u64)
                    .expect("the ring size was checked when it was made"),
            },
            recv_slots: self.slots,
        }
    }

    /// The descriptors to pass, in the handshake's order.
    fn fds(&self) -> [RawFd; FDS] {
        [
            self.ring_fd.as_ref().map_or(-1, Fd::raw),
            self.queue_fd.as_ref().map_or(-1, Fd::raw),
            self.wake.raw(),
        ]
    }

    /// The peer has them (or never will): the mappings are all this side needs.
    fn passed(&mut self) {
        self.ring_fd = None;
        self.queue_fd = None;
    }

    /// Hands every message the peer published to `conn`, in order. Returns whether there was
    /// any, or what the peer did wrong.
    fn poll(&mut self, conn: &mut Connection) -> Result<bool, String> {
        let tail = self.queue.word(TAIL_AT).load(Ordering::Acquire);
        let n = tail.wrapping_sub(self.head);
        if n == 0 {
            return Ok(false);
        }
        if n > u32::from(self.slots) {
            return Err(format!(
                "the peer published {n} messages with {} slots",
                self.slots
            ));
        }
        while self.head != tail {
            let mut e = [0u8; ENTRY];
            // SAFETY: entry `head mod slots` lies inside the queue mapping (`entry` checks);
            // the peer wrote it before the tail we read with Acquire; copied out before use,
            // so a peer writing it meanwhile changes nothing we decided on.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.queue.entry(self.head % u32::from(self.slots)),
                    e.as_mut_ptr(),
                    ENTRY,
                )
            };
            self.head = self.head.wrapping_add(1);
            let word = |at: usize| u32::from_ne_bytes([e[at], e[at + 1], e[at + 2], e[at + 3]]);
            let (kind, imm, len) = (word(0), word(4), word(8));
            match kind {
                KIND_WRITE_IMM => {
                    let _ = conn.handle_completion(Completion::WriteImm {
                        imm,
                        byte_len: Some(len),
                    });
                }
                KIND_CONTROL if len as usize <= MAX_CONTROL_LEN => {
                    let payload = &e[PAYLOAD_AT..PAYLOAD_AT + len as usize];
                    let _ = conn.handle_completion(Completion::Recv { payload });
                }
                _ => return Err(format!("a queue entry of kind {kind}, length {len}")),
            }
        }
        Ok(true)
    }

    /// Says this side is about to sleep: the peer's next message writes the eventfd. Poll
    /// once more afterwards (a message published before the flag was seen raises nothing).
    fn arm(&self) {
        self.queue.word(ARMED_AT).store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    /// Clears the eventfd (non-blocking).
    fn take_events(&self) {
        let mut v = 0u64;
        // SAFETY: an 8-byte out-buffer for the eventfd's counter.
        unsafe { crate::raw_syscall!(libc::SYS_read, self.wake.raw(), &mut v as *mut u64, 8) };
    }
}

/// The peer's inbox, as this side writes into it.
struct Outbox {
    ring: MagicRing,
    queue: Mapping,
    wake: Fd,
    slots: u16,
    tail: u32,
}

impl Outbox {
    /// Maps the peer's inbox from the descriptors it passed, after checking each is what it
    /// must be for the sizes its handshake message announced.
    fn open(fds: [Fd; FDS], ring: RingSize, slots: u16) -> io::Result<Outbox> {
        let [ring_fd, queue_fd, wake] = fds;
        let size = ring.bytes() as usize;
        let qlen = queue_len(slots);
        check_sealed(&ring_fd, size, "ring")?;
        check_sealed(&queue_fd, qlen, "queue")?;
        // The wake-up descriptor must never block us, whatever the peer passed.
        // SAFETY: no pointers.
        let fl = unsafe { crate::raw_syscall!(libc::SYS_fcntl, wake.raw(), libc::F_GETFL) };
        let nb = fl | libc::O_NONBLOCK as libc::c_long;
        // SAFETY: no pointers.
        let set = unsafe { crate::raw_syscall!(libc::SYS_fcntl, wake.raw(), libc::F_SETFL, nb) };
        if fl < 0 || set != 0 {
            return Err(os_err("fcntl(the peer's eventfd, O_NONBLOCK)"));
        }
        Ok(Outbox {
            ring: MagicRing::map_shared(ring_fd.raw(), size).map_err(ring_err)?,
            queue: Mapping::new(&queue_fd, qlen)?,
            wake,
            slots,
            tail: 0,
        })
    }

    /// Publishes one entry (`len`: a write's byte count; a control message's is its
    /// `payload`'s), and wakes the peer if it sleeps.
    fn push(&mut self, kind: u32, imm: u32, len: u32, payload: &[u8]) {
        let mut e = [0u8; ENTRY];
        e[0..4].copy_from_slice(&kind.to_ne_bytes());
        e[4..8].copy_from_slice(&imm.to_ne_bytes());
        e[8..12].copy_from_slice(&len.to_ne_bytes());
        e[PAYLOAD_AT..PAYLOAD_AT + payload.len()].copy_from_slice(payload);
        // SAFETY: entry `tail mod slots` lies inside the peer's queue (`entry` checks); the
        // credits guarantee the peer has read it (it returned the slot).
        unsafe {
            std::ptr::copy_nonoverlapping(
                e.as_ptr(),
                self.queue.entry(self.tail % u32::from(self.slots)),
                ENTRY,
            )
        };
        self.tail = self.tail.wrapping_add(1);
        // The ring bytes and the entry before the tail (the peer reads the tail with Acquire).
        self.queue.word(TAIL_AT).store(self.tail, Ordering::Release);
        // Against the peer's arm (its flag store, fence, then a last poll): one of the two
        // sees the other.
        fence(Ordering::SeqCst);
        let armed = self.queue.word(ARMED_AT);
        if armed.load(Ordering::Relaxed) != 0 && armed.swap(0, Ordering::Relaxed) != 0 {
            let one = 1u64;
            // SAFETY: 8 bytes from a live u64; the descriptor is non-blocking.
            unsafe { crate::raw_syscall!(libc::SYS_write, self.wake.raw(), &one as *const u64, 8) };
        }
    }
}

/// One shared-memory connection's resources (see the module docs).
pub(crate) struct ShmEndpoint {
    inbox: Inbox,
    outbox: Outbox,
    /// The rendezvous socket: its end is the peer's.
    sock: Option<Fd>,
}

impl fmt::Debug for ShmEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShmEndpoint")
            .field("ring", &self.inbox.ring.size())
            .field("peer_ring", &self.outbox.ring.size())
            .finish()
    }
}

impl ShmEndpoint {
    /// The send staging area at stream cursor `cursor`: the peer's ring itself.
    pub(crate) fn staging(&mut self, cursor: u64, len: usize) -> &mut [u8] {
        let off = (cursor % self.outbox.ring.size() as u64) as usize;
        self.outbox.ring.slice_mut(off, len)
    }

    /// This side's ring bytes at `offset`.
    pub(crate) fn ring(&self, offset: usize, len: usize) -> &[u8] {
        self.inbox.ring.slice(offset, len)
    }

    pub(crate) fn poll(&mut self, conn: &mut Connection) -> Result<bool, String> {
        self.inbox.poll(conn)
    }

    pub(crate) fn arm(&self) {
        self.inbox.arm();
    }

    pub(crate) fn take_events(&self) {
        self.inbox.take_events();
    }

    pub(crate) fn comp_fd(&self) -> RawFd {
        self.inbox.wake.raw()
    }

    /// The rendezvous socket (readable when the peer's end closed); -1 once disconnected.
    pub(crate) fn cm_fd(&self) -> RawFd {
        self.sock.as_ref().map_or(-1, Fd::raw)
    }

    /// Posts one action of the core (not `Teardown`): bytes were staged in the peer's ring
    /// already, so a write is its entry alone.
    pub(crate) fn post(&mut self, a: &rdmashim_proto::Action) {
        use rdmashim_proto::Action;
        match *a {
            Action::WriteData { len, imm, .. } => {
                self.outbox
                    .push(KIND_WRITE_IMM, imm.encode(), len as u32, &[])
            }
            Action::WriteCredit { imm, .. } => {
                self.outbox.push(KIND_WRITE_IMM, imm.encode(), 0, &[])
            }
            Action::Send(msg) => {
                let bytes = msg.encode();
                let bytes = bytes.as_bytes();
                self.outbox.push(KIND_CONTROL, 0, bytes.len() as u32, bytes);
            }
            Action::Teardown => {}
        }
    }

    /// What the rendezvous socket says now: the client's [`CONFIRM`] (the server's side is
    /// established), its end (the peer's process gone, or its link dropped; a failed socket
    /// too), or nothing. No other message follows the handshake: one that came anyway is
    /// read and ignored.
    pub(crate) fn sock_event(&mut self) -> SockEvent {
        let Some(s) = &self.sock else {
            return SockEvent::Gone;
        };
        loop {
            let mut b = [0u8; 1];
            // SAFETY: a 1-byte buffer; MSG_DONTWAIT never blocks.
            let r = unsafe {
                crate::raw_syscall!(
                    libc::SYS_recvfrom,
                    s.raw(),
                    b.as_mut_ptr(),
                    1,
                    libc::MSG_DONTWAIT,
                    0,
                    0
                )
            };
            match r {
                1 if b[0] == CONFIRM => return SockEvent::Confirmed,
                1 => continue,
                // (0: the end; an error but "nothing yet", e.g. ECONNRESET: the end as well —
                // the socket would be reported readable for ever)
                0 => return SockEvent::Gone,
                _ if io::Error::last_os_error().kind() == io::ErrorKind::WouldBlock => {
                    return SockEvent::Nothing
                }
                _ => return SockEvent::Gone,
            }
        }
    }

    /// Ends the connection: the peer sees its end of the socket close.
    pub(crate) fn disconnect(&mut self) {
        if let Some(s) = self.sock.take() {
            // SAFETY: no pointers.
            unsafe { crate::raw_syscall!(libc::SYS_shutdown, s.raw(), libc::SHUT_RDWR) };
        }
    }
}

/// See [`ShmEndpoint::sock_event`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SockEvent {
    Nothing,
    Confirmed,
    Gone,
}

// ----- the rendezvous -------------------------------------------------------------------------

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
            cfg.protocol,
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
        let ep = ShmEndpoint {
            inbox,
            outbox,
            sock: Some(sock),
        };
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
            cfg.protocol,
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

    /// Takes the answer if it came: the reply (checked by the core, then the server's inbox
    /// mapped) gives the established [`Link`]; a rejection, the server's end closing, an
    /// unusable reply or the deadline fail the dial. Spent once it returned `Connected` or
    /// `Failed`.
    pub fn poll(&mut self) -> DialStatus {
        let Some((_, _, sock)) = &self.state else {
            return DialStatus::Failed(DialError::Local(err(
                io::ErrorKind::InvalidInput,
                "the dial has ended",
            )));
        };
        let mut buf = [0u8; 256];
        let got = recv_msg(sock.raw(), &mut buf);
        let (n, fds) = match got {
            Ok(Got::Nothing) if Instant::now() < self.deadline => return DialStatus::Pending,
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
            Err(e) => return self.end(DialError::Local(e)),
        };
        let (mut conn, inbox, sock) = self.state.take().expect("checked above");
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
                        let ep = ShmEndpoint {
                            inbox,
                            outbox,
                            sock: Some(sock),
                        };
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
        self.state = None;
        DialStatus::Failed(e)
    }
}
