//! Descriptors passed to another process over a unix socket (`SCM_RIGHTS` in `sendmsg`'s
//! ancillary data): a connection-handoff daemon (dovecot's login processes, postfix's
//! postscreen, PgBouncer's online restart) gives an accepted connection to another program,
//! and a hot-restarting server (haproxy `-x`, envoy) gives its listeners to its successor.
//!
//! The other process cannot reach this one's rings: a connection under the upgrade goes back
//! to plain TCP before the message leaves, as before an exec (undecided: it stays TCP,
//! `fd_passed`; on the ring: switched back at exact offsets, `data::hand_back_all`). A
//! listener needs nothing: whoever accepts on it serves its connections with an rdma_cm
//! listener of its own, as a prefork worker does. On the receiving side, a number the kernel
//! gives a received descriptor whose old entry is still in the table (its close was never
//! seen) is forgotten first, as `accept` does for its new one.

use super::conn;
use crate::fdtable::{FdEntry, TABLE};
use core::ffi::c_int;
use libc::{mmsghdr, msghdr};

/// Whether `msg` (sendmsg's argument) may pass descriptors of connections under the upgrade:
/// some are alive and the message has ancillary data. The fast path's test: one load, and
/// then the message's control length.
///
/// # Safety
/// `msg` is null or sendmsg's valid message (its contract).
#[inline(always)]
pub(super) unsafe fn may_send_fds(msg: *const msghdr) -> bool {
    // SAFETY: the caller's valid message (checked non-null first).
    !crate::fdtable::no_upgrades() && !msg.is_null() && unsafe { (*msg).msg_controllen } != 0
}

/// [`may_send_fds`] for sendmmsg's vector of `n` messages.
///
/// # Safety
/// `v` is null or points to `n` valid messages (sendmmsg's contract).
#[inline(always)]
pub(super) unsafe fn may_send_fds_mmsg(v: *const mmsghdr, n: u32) -> bool {
    if crate::fdtable::no_upgrades() || v.is_null() {
        return false;
    }
    // SAFETY: i < n: the caller's valid vector.
    (0..n as usize).any(|i| unsafe { (*v.add(i)).msg_hdr.msg_controllen } != 0)
}

/// Whether `msg` (recvmsg's argument) offers room for ancillary data, in which the kernel may
/// put received descriptors.
///
/// # Safety
/// `msg` is null or recvmsg's valid message.
#[inline(always)]
pub(super) unsafe fn may_receive_fds(msg: *const msghdr) -> bool {
    // SAFETY: the caller's valid message (checked non-null first).
    !msg.is_null() && unsafe { !(*msg).msg_control.is_null() && (*msg).msg_controllen != 0 }
}

/// [`may_receive_fds`] for recvmmsg's vector of `n` messages.
///
/// # Safety
/// `v` is null or points to `n` valid messages.
#[inline(always)]
pub(super) unsafe fn may_receive_fds_mmsg(v: *const mmsghdr, n: u32) -> bool {
    // SAFETY: i < n: the caller's valid vector.
    !v.is_null() && (0..n as usize).any(|i| unsafe { may_receive_fds(&(*v.add(i)).msg_hdr) })
}

/// Calls `f` with every descriptor of the `SCM_RIGHTS` messages in `msg`'s ancillary data.
///
/// # Safety
/// `msg` is a valid message whose control buffer holds `msg_controllen` initialised bytes
/// (as given to sendmsg, or as recvmsg filled it).
unsafe fn each_passed_fd(msg: &msghdr, mut f: impl FnMut(c_int)) {
    if msg.msg_control.is_null() || msg.msg_controllen == 0 {
        return;
    }
    // SAFETY: the kernel's walk over a valid control buffer (the caller's contract); each
    // header it returns lies within the buffer.
    let mut h = unsafe { libc::CMSG_FIRSTHDR(msg) };
    while !h.is_null() {
        // SAFETY: `h` is a header within the buffer (CMSG_FIRSTHDR/CMSG_NXTHDR checked it).
        let c = unsafe { &*h };
        if c.cmsg_level == libc::SOL_SOCKET && c.cmsg_type == libc::SCM_RIGHTS {
            // SAFETY: a length computation, no memory touched.
            let head = unsafe { libc::CMSG_LEN(0) } as usize;
            let n = (c.cmsg_len as usize).saturating_sub(head) / size_of::<c_int>();
            // SAFETY: the header's data follows it within the buffer.
            let data = unsafe { libc::CMSG_DATA(h) }.cast::<c_int>();
            for i in 0..n {
                // SAFETY: within the header's `cmsg_len` bytes; control buffers need not be
                // aligned for c_int, so read unaligned.
                f(unsafe { data.add(i).read_unaligned() });
            }
        }
        // SAFETY: as above.
        h = unsafe { libc::CMSG_NXTHDR(msg, h) };
    }
}

/// Before `msg` is sent: every connection under the upgrade that a descriptor it passes refers
/// to goes back to plain TCP (a fork child's inherited one is asked of its parent), as before
/// an exec: the receiver will use the socket. Not in a vfork child (our memory is its parent's).
///
/// # Safety
/// As [`each_passed_fd`].
pub(super) unsafe fn before_send(msg: &msghdr) {
    let mut fds: Vec<c_int> = Vec::new();
    // SAFETY: the caller's contract.
    unsafe { each_passed_fd(msg, |fd| fds.push(fd)) };
    if fds.is_empty() || super::process::in_foreign_child() {
        return;
    }
    let _s = crate::guard::Section::enter();
    let _e = crate::sys::ErrnoGuard::save();
    let (conns, inherited) = crate::upgrade::upgraded_among(&fds);
    if conns.is_empty() && inherited.is_empty() {
        return;
    }
    super::process::hand_back(
        &conns,
        inherited,
        "fd passing",
        crate::reason::FallbackReason::FdPassed,
    );
}

/// [`before_send`] for each of sendmmsg's `n` messages.
///
/// # Safety
/// `v` points to `n` valid messages.
pub(super) unsafe fn before_send_mmsg(v: *const mmsghdr, n: u32) {
    for i in 0..n as usize {
        // SAFETY: i < n: the caller's valid vector.
        unsafe { before_send(&(*v.add(i)).msg_hdr) };
    }
}

/// After recvmsg filled `msg`: the numbers of the descriptors it received are new, so an entry
/// still there is a missed close's ([`conn::lost`]); the received file is classified at its
/// first use (a connected TCP socket from another process stays plain TCP; a listener serves
/// its connections as any inherited one).
///
/// # Safety
/// As [`each_passed_fd`], for a message recvmsg has just filled.
pub(super) unsafe fn after_receive(msg: &msghdr) {
    let _e = crate::sys::ErrnoGuard::save();
    // SAFETY: the caller's contract.
    unsafe {
        each_passed_fd(msg, |fd| {
            let old = TABLE.set_new(fd, FdEntry::UNKNOWN);
            if !old.is_unknown() {
                conn::lost(fd, old);
            }
        })
    };
}

/// [`after_receive`] for the first `n` messages recvmmsg filled.
///
/// # Safety
/// `v` points to at least `n` messages recvmmsg has just filled.
pub(super) unsafe fn after_receive_mmsg(v: *const mmsghdr, n: c_int) {
    for i in 0..n.max(0) as usize {
        // SAFETY: i < n: the caller's filled vector.
        unsafe { after_receive(&(*v.add(i)).msg_hdr) };
    }
}
