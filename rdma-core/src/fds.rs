//! The descriptors the transport keeps open, told to whoever hosts it.
//!
//! librdmacm and libibverbs open descriptors of their own: an event channel's, a completion
//! channel's, a device context's command and async descriptors, at the lowest free numbers.
//! A program that closes every descriptor it did not open (a daemon's `for fd in 3..: close`)
//! would close these under a live connection. The preload shim hides them from such a loop,
//! and to do so it must know them: it registers a watcher here, which is told each such
//! descriptor when it is opened and before it is closed.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The watcher (a `fn(RawFd, bool)` as an address; 0: none).
static WATCHER: AtomicUsize = AtomicUsize::new(0);

/// Registers `f`, called with `(fd, true)` when the transport has opened a descriptor it keeps,
/// and `(fd, false)` just before it closes one. Replaces any earlier watcher.
pub fn set_watcher(f: fn(RawFd, bool)) {
    WATCHER.store(f as usize, Ordering::Release);
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
