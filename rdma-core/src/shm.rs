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
//! The handshake ([`crate::rendezvous`]) runs over a connected `SOCK_SEQPACKET` Unix socket
//! (abstract name, so of one network namespace): the client's request and descriptors, the server's reply and
//! descriptors, or its rejection. The socket then stands where the RDMA link has its rdma_cm
//! channel: its end (the peer's process gone) is the disconnect. Nothing else of either
//! process is reachable: the peer gets only these descriptors, and a request is accepted only
//! if it proves it holds the TCP connection (the same key and tags as over rdma_cm, both
//! ways, so a squatter on the name learns nothing and takes nothing over).
//!
//! Everything a peer puts in shared memory is read as untrusted: queue positions beyond what
//! the credits allow, unknown entry kinds and oversized control messages fail the link; the
//! core checks every immediate against the ring as it does for RDMA.
#![allow(unsafe_code)]

use std::cell::Cell;
use std::fmt;
use std::io;
use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use rdmashim_proto::{Completion, Connection, LocalParams, RingDesc, RingSize, MAX_CONTROL_LEN};

use crate::fds;
use crate::ring::MagicRing;

/// Bytes of the queue header: the tail (written by the sender) and the asleep flag (set by
/// the receiver, cleared by the sender), a cache line each.
const HEADER: usize = 128;
const TAIL_AT: usize = 0;
const ARMED_AT: usize = 64;
/// Bytes of one queue entry: kind, immediate, length, its sequence number, then a control
/// message's bytes. A write's entry is its first 16 bytes alone, on one cache line.
const ENTRY: usize = 128;
/// The entry's sequence number: the tail its publication made (1 for the first entry).
const SEQ_AT: usize = 12;
const PAYLOAD_AT: usize = 16;
const _: () = assert!(PAYLOAD_AT + MAX_CONTROL_LEN <= ENTRY && SEQ_AT + 4 == PAYLOAD_AT);
const KIND_WRITE_IMM: u32 = 1;
const KIND_CONTROL: u32 = 2;

/// The client's one message after the reply (rdma_cm's RTU): it mapped the server's inbox and
/// goes on over the rings. Until it comes the server's link is not established, so its side
/// commits nothing to a ring the client may never read (a client whose dial timed out, or
/// failed on the reply, closes its end instead).
pub(crate) const CONFIRM: u8 = 3;

/// Descriptors a handshake message carries: ring, queue, eventfd.
pub(crate) const FDS: usize = 3;

const SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// A descriptor of the transport's own: moved above the floor when made, told to the watcher
/// (`crate::fds`), closed with a raw system call (a preload shim's hooks never see it).
pub(crate) struct Fd(RawFd);

impl Fd {
    /// Takes the result of a raw system call that made a descriptor.
    pub(crate) fn made(r: libc::c_long, what: &str) -> io::Result<Fd> {
        if r < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
        }
        let fd = fds::relocate(r as RawFd);
        fds::opened(fd);
        Ok(Fd(fd))
    }

    pub(crate) fn raw(&self) -> RawFd {
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

pub(crate) fn os_err(what: &str) -> io::Error {
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
        return Err(io::Error::new(
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
        return Err(io::Error::new(
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
// SAFETY: shared between threads only as an inbox's queue seen through [`Arrivals`], which
// reads its header words atomically and nothing else.
unsafe impl Sync for Mapping {}

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

    /// Entry `i`'s sequence word.
    fn seq(&self, i: u32) -> &AtomicU32 {
        // SAFETY: `entry` checked that the whole entry lies inside this live mapping; the
        // word is 4-aligned (the mapping is page-aligned, HEADER, ENTRY and SEQ_AT are
        // multiples of 4), and the peer reads and writes it only atomically.
        unsafe { &*self.entry(i).add(SEQ_AT).cast::<AtomicU32>() }
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

/// The inbox's queue with the position this side has read up to: what [`Arrivals`] looks
/// at from other threads.
struct Queue {
    map: Mapping,
    /// A copy of [`Inbox::head`], stored after each poll.
    head: AtomicU32,
    /// The inbox is gone (its link dropped): nothing will be taken from it any more.
    closed: AtomicBool,
}

/// Whether the peer published anything into an inbox that its link has not taken yet, told
/// without the link (nor its lock): one atomic load of the tail the peer writes. A thread that
/// busy-polls an epoll set looks at its connections' inboxes this way, without arming them,
/// so the peer's messages meanwhile cost no wake-up system call on either side.
#[derive(Clone)]
pub struct Arrivals(Arc<Queue>);

impl Arrivals {
    /// Something is there to take (or was: another thread may be taking it right now).
    pub fn pending(&self) -> bool {
        let q = &self.0;
        !q.closed.load(Ordering::Relaxed)
            && q.map.word(TAIL_AT).load(Ordering::Acquire) != q.head.load(Ordering::Relaxed)
    }
}

impl fmt::Debug for Arrivals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Arrivals")
            .field("pending", &self.pending())
            .finish()
    }
}

/// This side's inbox: what the peer writes into and wakes.
pub(crate) struct Inbox {
    ring: MagicRing,
    queue: Arc<Queue>,
    /// The descriptors, passed to the peer in the handshake, then closed (the mappings
    /// keep the memory; the eventfd stays: it is what this side sleeps on).
    ring_fd: Option<Fd>,
    queue_fd: Option<Fd>,
    wake: Fd,
    slots: u16,
    /// Next entry to read (the sender's tail runs ahead of it by at most `slots`).
    head: u32,
    /// The peer numbers its entries (`SEQ_AT`): the next one is looked for by its own
    /// sequence word, not by the tail. Learnt from its first entry that carries one: a
    /// sender of an older shim writes a zero there, and is read by the tail throughout.
    numbered: bool,
    /// This side set the queue's asleep flag since it last took the eventfd's events.
    armed: Cell<bool>,
    /// The peer took the flag (so it writes the eventfd, or is about to) and the eventfd
    /// was not read empty of that write yet.
    owed: Cell<bool>,
}

impl Inbox {
    pub(crate) fn new(ring_size: usize, slots: u16) -> io::Result<Inbox> {
        crate::ring::check_size(ring_size).map_err(ring_err)?;
        let ring_fd = sealed_memfd(ring_size, c"rdmashim-shm-ring")?;
        let ring = MagicRing::map_shared(ring_fd.raw(), ring_size).map_err(ring_err)?;
        let qlen = queue_len(slots);
        let queue_fd = sealed_memfd(qlen, c"rdmashim-shm-queue")?;
        let queue = Arc::new(Queue {
            map: Mapping::new(&queue_fd, qlen)?,
            head: AtomicU32::new(0),
            closed: AtomicBool::new(false),
        });
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
            numbered: false,
            armed: Cell::new(false),
            owed: Cell::new(false),
        })
    }

    fn arrivals(&self) -> Arrivals {
        Arrivals(self.queue.clone())
    }

    pub(crate) fn params(&self) -> LocalParams {
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
    pub(crate) fn fds(&self) -> [RawFd; FDS] {
        [
            self.ring_fd.as_ref().map_or(-1, Fd::raw),
            self.queue_fd.as_ref().map_or(-1, Fd::raw),
            self.wake.raw(),
        ]
    }

    /// The peer has them (or never will): the mappings are all this side needs.
    pub(crate) fn passed(&mut self) {
        self.ring_fd = None;
        self.queue_fd = None;
    }

    /// Hands every message the peer published to `conn`, in order. Returns whether there was
    /// any, or what the peer did wrong.
    ///
    /// A peer that numbers its entries is read by them: the next entry's sequence word says
    /// whether it was published, so a message costs the reader the cache lines of its entry
    /// (and of its bytes) alone, where reading the tail first was one more line to wait for
    /// from the writer's CPU, before the entry's. At most `slots` entries a call (a peer that
    /// kept publishing would otherwise keep it here); the next call takes the rest.
    fn poll(&mut self, conn: &mut Connection) -> Result<bool, String> {
        self.poll_with(|c| {
            let _ = conn.handle_completion(c);
        })
    }

    /// [`poll`](Self::poll), each message handed to `deliver`.
    #[inline(always)]
    fn poll_with(&mut self, mut deliver: impl FnMut(Completion<'_>)) -> Result<bool, String> {
        let slots = u32::from(self.slots);
        if self.numbered {
            let mut any = false;
            for _ in 0..slots {
                let want = self.head.wrapping_add(1);
                // (Acquire: the entry's words and its ring bytes were stored before it)
                let seq = self
                    .queue
                    .map
                    .seq(self.head % slots)
                    .load(Ordering::Acquire);
                if seq != want {
                    break;
                }
                self.take(&mut deliver)?;
                any = true;
            }
            if any {
                self.queue.head.store(self.head, Ordering::Relaxed);
            }
            return Ok(any);
        }
        let tail = self.queue.map.word(TAIL_AT).load(Ordering::Acquire);
        let n = tail.wrapping_sub(self.head);
        if n == 0 {
            return Ok(false);
        }
        if n > slots {
            return Err(format!(
                "the peer published {n} messages with {} slots",
                self.slots
            ));
        }
        while self.head != tail {
            let want = self.head.wrapping_add(1);
            // (a numbered entry proves the peer numbers them all from now on; 0 is also an
            // older sender's, so its number is not taken as proof)
            if self.take(&mut deliver)? == want && want != 0 {
                self.numbered = true;
            }
        }
        self.queue.head.store(self.head, Ordering::Relaxed);
        Ok(true)
    }

    /// Takes the entry at `head` (published: the caller saw its tail or its number) and hands
    /// it to `deliver`; returns its sequence word.
    #[inline(always)]
    fn take(&mut self, deliver: &mut impl FnMut(Completion<'_>)) -> Result<u32, String> {
        let at = self.queue.map.entry(self.head % u32::from(self.slots));
        let mut h = [0u8; PAYLOAD_AT];
        // SAFETY: the entry lies inside the queue mapping (`entry` checks); the peer wrote it
        // before the tail or sequence word we read with Acquire; copied out before use, so a
        // peer writing it meanwhile changes nothing we decided on.
        unsafe { std::ptr::copy_nonoverlapping(at, h.as_mut_ptr(), PAYLOAD_AT) };
        self.head = self.head.wrapping_add(1);
        let word = |at: usize| u32::from_ne_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]);
        let (kind, imm, len, seq) = (word(0), word(4), word(8), word(SEQ_AT));
        match kind {
            KIND_WRITE_IMM => {
                #[cfg(feature = "timeline")]
                if len > 0 {
                    crate::timeline::mark(crate::timeline::Mark::DataSeen);
                }
                deliver(Completion::WriteImm {
                    imm,
                    byte_len: Some(len),
                });
            }
            KIND_CONTROL if len as usize <= MAX_CONTROL_LEN => {
                let mut payload = [0u8; MAX_CONTROL_LEN];
                let payload = &mut payload[..len as usize];
                // SAFETY: `len` ≤ MAX_CONTROL_LEN bytes from PAYLOAD_AT lie inside the entry
                // (PAYLOAD_AT + MAX_CONTROL_LEN ≤ ENTRY, asserted with the constants); copied
                // out as above.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        at.add(PAYLOAD_AT),
                        payload.as_mut_ptr(),
                        payload.len(),
                    )
                };
                deliver(Completion::Recv { payload });
            }
            _ => return Err(format!("a queue entry of kind {kind}, length {len}")),
        }
        Ok(seq)
    }

    /// Says this side is about to sleep: the peer's next message writes the eventfd. Poll
    /// once more afterwards (a message published before the flag was seen raises nothing).
    ///
    /// Armed already (a sleep that found a message in its last poll and did not sleep), the
    /// peer may have taken the flag since: its eventfd write is then owed, and is taken with
    /// the next events. Stored over instead, the write was left in the eventfd, which nothing
    /// read again until the peer's next message: every sleep meanwhile returned at once — an
    /// idle connection's thread spun (a thousand held connections over shared memory kept
    /// both CPUs busy, and a round trip among them took 12 ms; issue 28).
    fn arm(&self) {
        let was = self.queue.map.word(ARMED_AT).swap(1, Ordering::AcqRel);
        if self.armed.replace(true) && was == 0 {
            self.owed.set(true);
        }
        fence(Ordering::SeqCst);
    }

    /// Takes back the asleep flag and clears the eventfd (non-blocking) — with a system call
    /// only if the peer took the flag, that is, wrote the eventfd or is about to. A side that
    /// keeps busy-polling its inbox without arming it never makes one.
    fn take_events(&self) {
        if self.armed.replace(false) && self.queue.map.word(ARMED_AT).swap(0, Ordering::AcqRel) == 0
        {
            self.owed.set(true);
        }
        if !self.owed.get() {
            return;
        }
        let mut v = 0u64;
        // SAFETY: an 8-byte out-buffer for the eventfd's counter.
        let r =
            unsafe { crate::raw_syscall!(libc::SYS_read, self.wake.raw(), &mut v as *mut u64, 8) };
        // (read empty: the peer's write is still to come, and is taken next time — else the
        // eventfd would stay readable, and every sleep on it return at once)
        if r == 8 {
            self.owed.set(false);
        }
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        self.queue.closed.store(true, Ordering::Relaxed);
    }
}

/// The peer's inbox, as this side writes into it.
pub(crate) struct Outbox {
    ring: MagicRing,
    queue: Mapping,
    wake: Fd,
    slots: u16,
    tail: u32,
}

impl Outbox {
    /// Maps the peer's inbox from the descriptors it passed, after checking each is what it
    /// must be for the sizes its handshake message announced.
    pub(crate) fn open(fds: [Fd; FDS], ring: RingSize, slots: u16) -> io::Result<Outbox> {
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
    /// `payload`'s), and wakes the peer if it sleeps. Only the entry's words and the payload
    /// are written (a write's entry is one cache line), its sequence word last; then the tail,
    /// which a reader of an older shim looks at instead.
    fn push(&mut self, kind: u32, imm: u32, len: u32, payload: &[u8]) {
        let slot = self.tail % u32::from(self.slots);
        self.tail = self.tail.wrapping_add(1);
        let mut h = [0u8; SEQ_AT];
        h[0..4].copy_from_slice(&kind.to_ne_bytes());
        h[4..8].copy_from_slice(&imm.to_ne_bytes());
        h[8..12].copy_from_slice(&len.to_ne_bytes());
        let at = self.queue.entry(slot);
        let payload = &payload[..payload.len().min(ENTRY - PAYLOAD_AT)];
        // SAFETY: the entry lies inside the peer's queue (`entry` checks), and so do
        // `payload`'s bytes from PAYLOAD_AT (cut to the entry above); the credits guarantee
        // the peer has read the entry (it returned the slot).
        unsafe {
            std::ptr::copy_nonoverlapping(h.as_ptr(), at, SEQ_AT);
            std::ptr::copy_nonoverlapping(payload.as_ptr(), at.add(PAYLOAD_AT), payload.len());
        }
        // The ring bytes and the entry's words before its number and the tail (the peer
        // reads either with Acquire).
        self.queue.seq(slot).store(self.tail, Ordering::Release);
        self.queue.word(TAIL_AT).store(self.tail, Ordering::Release);
        // Against the peer's arm (its flag store, fence, then a last poll): one of the two
        // sees the other.
        fence(Ordering::SeqCst);
        let armed = self.queue.word(ARMED_AT);
        if armed.load(Ordering::Relaxed) != 0 && armed.swap(0, Ordering::Relaxed) != 0 {
            let one = 1u64;
            // SAFETY: 8 bytes from a live u64; the descriptor is non-blocking.
            unsafe { crate::raw_syscall!(libc::SYS_write, self.wake.raw(), &one as *const u64, 8) };
            WOKE_PEER.with(|w| w.set(true));
        }
    }
}

thread_local! {
    /// This thread woke a sleeping peer (wrote its eventfd) since it last asked
    /// ([`take_woke_peer`]).
    static WOKE_PEER: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread woke a sleeping peer since it last asked (and forgets it). A thread
/// about to wait for that peer's answer may give it its CPU first: the kernel often queues the
/// woken thread on the CPU of the thread that woke it.
pub fn take_woke_peer() -> bool {
    WOKE_PEER.with(|w| w.replace(false))
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
    /// An endpoint of this side's `inbox` (its descriptors passed to the peer) and the
    /// peer's, mapped as `outbox`, whose end of the rendezvous socket `sock` is.
    pub(crate) fn new(inbox: Inbox, outbox: Outbox, sock: Fd) -> ShmEndpoint {
        ShmEndpoint {
            inbox,
            outbox,
            sock: Some(sock),
        }
    }

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

    pub(crate) fn arrivals(&self) -> Arrivals {
        self.inbox.arrivals()
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
            // (a shared-memory link does not announce ring moves or offer records: the core
            // never asks for these)
            Action::NewStaging { .. }
            | Action::ReleaseStaging { .. }
            | Action::ReleaseRing { .. }
            | Action::WriteRecord { .. }
            | Action::Doorbell { .. } => {}
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

#[cfg(test)]
mod tests {
    use super::*;

    /// An inbox and the peer's view of it, in one process.
    fn pair() -> (Inbox, Outbox) {
        let inbox = Inbox::new(64 * 1024, 8).expect("inbox");
        let dup = |fd: RawFd| {
            // SAFETY: no pointers.
            Fd::made(unsafe { crate::raw_syscall!(libc::SYS_dup, fd) }, "dup")
        };
        let [r, q, w] = inbox.fds();
        let fds = [dup(r).unwrap(), dup(q).unwrap(), dup(w).unwrap()];
        let ring = RingSize::new(64 * 1024).unwrap();
        let outbox = Outbox::open(fds, ring, 8).expect("outbox");
        (inbox, outbox)
    }

    /// What the eventfd holds now (and clears it); 0 if empty.
    fn drain(inbox: &Inbox) -> u64 {
        let mut v = 0u64;
        // SAFETY: an 8-byte out-buffer.
        let r =
            unsafe { crate::raw_syscall!(libc::SYS_read, inbox.wake.raw(), &mut v as *mut u64, 8) };
        if r == 8 {
            v
        } else {
            0
        }
    }

    /// What `inbox` takes now: each entry as (immediate or control byte count, kind).
    fn taken(inbox: &mut Inbox) -> Vec<(u32, u32)> {
        let mut got = Vec::new();
        inbox
            .poll_with(|c| match c {
                Completion::WriteImm { imm, .. } => got.push((imm, KIND_WRITE_IMM)),
                Completion::Recv { payload } => got.push((payload.len() as u32, KIND_CONTROL)),
            })
            .expect("a well-formed queue");
        got
    }

    #[test]
    fn numbered_entries_are_read_without_the_tail() {
        let (mut inbox, mut outbox) = pair();
        outbox.push(KIND_WRITE_IMM, 1, 0, &[]);
        outbox.push(KIND_CONTROL, 0, 5, &[9; 5]);
        assert_eq!(taken(&mut inbox), [(1, KIND_WRITE_IMM), (5, KIND_CONTROL)]);
        assert!(inbox.numbered, "the first numbered entry is proof");
        // From now on the tail is not looked at: entries published while it stays behind are
        // taken, in order, a lap of the queue and more.
        for round in 0..3u32 {
            let tail = outbox.queue.word(TAIL_AT).load(Ordering::Relaxed);
            for i in 0..5 {
                outbox.push(KIND_WRITE_IMM, 100 * round + i, 0, &[]);
            }
            outbox.queue.word(TAIL_AT).store(tail, Ordering::Relaxed);
            let want: Vec<_> = (0..5).map(|i| (100 * round + i, KIND_WRITE_IMM)).collect();
            assert_eq!(taken(&mut inbox), want);
        }
        assert!(taken(&mut inbox).is_empty(), "nothing is taken twice");
    }

    /// Publishes an entry as a sender of an older shim does: the whole entry, its sequence
    /// word zero, then the tail.
    fn push_unnumbered(outbox: &mut Outbox, imm: u32) {
        let mut e = [0u8; ENTRY];
        e[0..4].copy_from_slice(&KIND_WRITE_IMM.to_ne_bytes());
        e[4..8].copy_from_slice(&imm.to_ne_bytes());
        let at = outbox.queue.entry(outbox.tail % u32::from(outbox.slots));
        // SAFETY: a whole entry of the queue (`entry` checks).
        unsafe { std::ptr::copy_nonoverlapping(e.as_ptr(), at, ENTRY) };
        outbox.tail = outbox.tail.wrapping_add(1);
        outbox
            .queue
            .word(TAIL_AT)
            .store(outbox.tail, Ordering::Release);
    }

    #[test]
    fn an_older_sender_is_read_by_the_tail() {
        let (mut inbox, mut outbox) = pair();
        // (three laps of the 8-entry queue)
        for lap in 0..3u32 {
            for i in 0..8 {
                push_unnumbered(&mut outbox, 10 * lap + i);
            }
            let want: Vec<_> = (0..8).map(|i| (10 * lap + i, KIND_WRITE_IMM)).collect();
            assert_eq!(taken(&mut inbox), want);
            assert!(!inbox.numbered, "zero is no number");
        }
    }

    #[test]
    fn a_sender_that_keeps_publishing_is_taken_a_queue_at_a_time() {
        let (mut inbox, mut outbox) = pair();
        outbox.push(KIND_WRITE_IMM, 0, 0, &[]);
        assert_eq!(taken(&mut inbox).len(), 1);
        // Each delivery publishes another entry (as a peer on another CPU could): the poll
        // returns after one queue's worth, and the next takes the rest.
        let mut n = 0u32;
        outbox.push(KIND_WRITE_IMM, 1, 0, &[]);
        inbox
            .poll_with(|_| {
                n += 1;
                outbox.push(KIND_WRITE_IMM, n + 1, 0, &[]);
            })
            .unwrap();
        assert_eq!(n, 8, "one queue's worth a call");
        assert_eq!(taken(&mut inbox), [(9, KIND_WRITE_IMM)]);
    }

    #[test]
    fn arrivals_are_seen_without_the_link() {
        let (inbox, mut outbox) = pair();
        let look = inbox.arrivals();
        assert!(!look.pending());
        outbox.push(KIND_WRITE_IMM, 7, 0, &[]);
        assert!(look.pending(), "a published entry is pending");
        drop(inbox);
        assert!(!look.pending(), "a dropped inbox has nothing to take");
    }

    #[test]
    fn an_unarmed_inbox_costs_the_sender_no_wake_up() {
        let (inbox, mut outbox) = pair();
        outbox.push(KIND_WRITE_IMM, 1, 0, &[]);
        assert_eq!(drain(&inbox), 0, "nobody slept: no eventfd write");
        inbox.arm();
        outbox.push(KIND_WRITE_IMM, 2, 0, &[]);
        outbox.push(KIND_WRITE_IMM, 3, 0, &[]);
        // (one write per sleep: the sender took the flag with the first)
        inbox.take_events();
        assert_eq!(drain(&inbox), 0, "take_events cleared the eventfd");
        // Armed, then awake again before any message: the flag is taken back, the next
        // message writes nothing.
        inbox.arm();
        inbox.take_events();
        outbox.push(KIND_WRITE_IMM, 4, 0, &[]);
        assert_eq!(drain(&inbox), 0);
    }

    #[test]
    fn a_wake_up_for_an_arm_that_did_not_sleep_is_taken_with_the_next() {
        let (inbox, mut outbox) = pair();
        // Armed; the last poll before the sleep found the message the peer published (and
        // woke the eventfd for): no sleep, no events taken.
        inbox.arm();
        outbox.push(KIND_WRITE_IMM, 1, 0, &[]);
        // The next wait arms again, and wakes at once for that write: its events must take
        // it, or every later sleep returns at once too.
        inbox.arm();
        inbox.take_events();
        assert_eq!(drain(&inbox), 0, "the earlier write was taken");
        assert!(!inbox.owed.get());
        // And the flag works as before: armed, a message, one write, taken.
        inbox.arm();
        outbox.push(KIND_WRITE_IMM, 2, 0, &[]);
        inbox.take_events();
        assert_eq!(drain(&inbox), 0);
    }

    #[test]
    fn a_wake_up_written_late_is_taken_next_time() {
        let (inbox, outbox) = pair();
        inbox.arm();
        // The sender took the flag but has not written the eventfd yet.
        assert_eq!(outbox.queue.word(ARMED_AT).swap(0, Ordering::Relaxed), 1);
        inbox.take_events();
        let one = 1u64;
        // SAFETY: 8 bytes from a live u64.
        unsafe { crate::raw_syscall!(libc::SYS_write, outbox.wake.raw(), &one as *const u64, 8) };
        // Not armed since, but the write was owed: taken, so no sleep returns at once for it.
        inbox.take_events();
        assert_eq!(drain(&inbox), 0, "the late write was taken");
        assert!(!inbox.owed.get());
    }
}
