//! The descriptors the transport keeps open, told to whoever hosts it, and kept out of the way.
//!
//! librdmacm and libibverbs open descriptors of their own: an event channel's, a completion
//! channel's, a device context's command and async descriptors, at the lowest free numbers.
//! A program that closes every descriptor it did not open (a daemon's `for fd in 3..: close`)
//! would close these under a live connection, and one that puts a file of its own at a number
//! it believes free (`dup2(devnull, 0)` after closing its standard descriptors, a shell's
//! `exec 5>file`) would replace them: the libraries would then write their commands into the
//! program's file. The preload shim hides them from such loops, and to do so it must know
//! them: it registers a watcher here, which is told each such descriptor when it is opened and
//! before it is closed. It also sets a floor: each descriptor is moved at or above it as soon
//! as it is made ([`relocate`]), before anything else sees its number, so that the numbers
//! programs pick stay free.
#![allow(unsafe_code)]

use std::ffi::c_int;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};

/// The watcher (a `fn(RawFd, bool)` as an address; 0: none).
static WATCHER: AtomicUsize = AtomicUsize::new(0);

/// The lowest number the transport's descriptors are moved to (0: they stay where made).
static FLOOR: AtomicI32 = AtomicI32::new(0);

/// Registers `f`, called with `(fd, true)` when the transport has opened a descriptor it keeps,
/// and `(fd, false)` just before it closes one. Replaces any earlier watcher.
pub fn set_watcher(f: fn(RawFd, bool)) {
    WATCHER.store(f as usize, Ordering::Release);
}

/// Moves every descriptor the transport makes from now on to a number at or above `floor`
/// (where the descriptor limit allows; 0: no move, the default).
pub fn set_floor(floor: RawFd) {
    FLOOR.store(floor.max(0), Ordering::Release);
}

/// Set by [`abandon`]: the transport's descriptors may no longer be its own.
static ABANDONED: AtomicBool = AtomicBool::new(false);

/// The host is about to give one of the transport's descriptor numbers to a file of its own
/// (a `dup2` onto it: the call cannot be refused, the number being free on a kernel without
/// the transport), and has stopped every user of the transport first. From now on nothing is
/// released through the libraries — every queue pair, completion queue, registration, channel
/// and device context is leaked until the process ends — because each release is a command
/// written to a descriptor that may now be that file. Irrevocable; inherited by fork
/// children.
pub fn abandon() {
    ABANDONED.store(true, Ordering::Release);
}

/// Whether [`abandon`] was called: every drop leaks instead of calling the libraries.
pub fn abandoned() -> bool {
    ABANDONED.load(Ordering::Acquire)
}

fn tell(fd: RawFd, open: bool) {
    let w = WATCHER.load(Ordering::Acquire);
    if w != 0 && fd >= 0 {
        // SAFETY: the only non-zero values stored are `fn(RawFd, bool)` pointers.
        let f: fn(RawFd, bool) = unsafe { std::mem::transmute::<usize, fn(RawFd, bool)>(w) };
        f(fd, open);
    }
}

/// `fd` was opened and is kept.
pub(crate) fn opened(fd: RawFd) {
    tell(fd, true);
}

/// `fd` is about to be closed.
pub(crate) fn closing(fd: RawFd) {
    tell(fd, false);
}

/// Moves `fd`, just made and not yet used by anyone but the call that made it, at or above
/// the floor: a close-on-exec duplicate there, the original closed. Returns the number to use
/// from now on (`fd` itself if it is already there, there is no floor, or the limit on
/// descriptors leaves no room above it). Raw system calls: a preload shim's hooks do not see
/// them.
pub(crate) fn relocate(fd: RawFd) -> RawFd {
    let floor = FLOOR.load(Ordering::Acquire);
    if fd < 0 || floor == 0 || fd >= floor {
        return fd;
    }
    // SAFETY: no pointers.
    let high = unsafe { crate::raw_syscall!(libc::SYS_fcntl, fd, libc::F_DUPFD_CLOEXEC, floor) };
    if high < 0 {
        return fd;
    }
    // SAFETY: `fd` is the caller's, just replaced by `high` in every place that holds it.
    unsafe { crate::raw_syscall!(libc::SYS_close, fd) };
    high as c_int
}

/// [`relocate`] for a descriptor field of a C struct the transport owns, or that nobody else
/// uses yet (an int the libraries read at each call): the field is rewritten.
///
/// # Safety
/// `field` must point to a live, aligned `int` that no other thread reads or writes during
/// the call.
pub(crate) unsafe fn relocate_field(field: *mut c_int) {
    // SAFETY: per the caller's contract.
    unsafe { *field = relocate(*field) };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_open(fd: RawFd) -> bool {
        // SAFETY: no pointers.
        unsafe { libc::fcntl(fd, libc::F_GETFD) >= 0 }
    }

    #[test]
    fn relocate_moves_above_the_floor_and_closes_the_original() {
        // SAFETY: no pointers.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        assert!(fd >= 0);
        // (a floor of its own: a test thread must not move other tests' descriptors)
        FLOOR.store(0, Ordering::Release);
        assert_eq!(relocate(fd), fd, "no floor: stays");
        FLOOR.store(700, Ordering::Release);
        let high = relocate(fd);
        FLOOR.store(0, Ordering::Release);
        assert!(high >= 700, "moved to {high}");
        assert!(!is_open(fd), "the original is closed");
        assert!(is_open(high));
        // SAFETY: no pointers.
        let fl = unsafe { libc::fcntl(high, libc::F_GETFD) };
        assert!(fl & libc::FD_CLOEXEC != 0, "close-on-exec");
        assert_eq!(relocate(high), high, "already above: stays");
        // SAFETY: ours.
        unsafe { libc::close(high) };
    }
}
