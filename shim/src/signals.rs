//! Signals and the shim's own waits and threads. A busy-poll that stands in for a wait a
//! signal would interrupt holds the asynchronous signals back while it spins
//! ([`SignalsHeld`]), so that one arriving meanwhile is seen and the call can fail with EINTR as
//! the wait would have; the shim's threads block them for good ([`spawn_internal`]), so that
//! a signal sent to the process always lands on one of the application's threads.
#![allow(unsafe_code)]

use crate::sys::ErrnoGuard;
use core::ffi::c_int;

/// The calling thread's signal mask, saved while it busy-polls in place of a wait that a
/// signal would interrupt.
pub struct SignalsHeld {
    old: libc::sigset_t,
}

/// Signals a fault raises in the faulting thread: never held back (a held one kills).
const SYNCHRONOUS: [c_int; 6] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGFPE,
    libc::SIGILL,
    libc::SIGTRAP,
    libc::SIGSYS,
];

/// Signals whose default action is to do nothing: with that disposition they interrupt no
/// wait.
const IGNORED_BY_DEFAULT: [c_int; 4] = [libc::SIGCHLD, libc::SIGCONT, libc::SIGURG, libc::SIGWINCH];

impl SignalsHeld {
    /// Blocks the asynchronous signals in the calling thread until [`release`](Self::release),
    /// so that one arriving while it busy-polls stays pending instead of running its handler
    /// unseen (a wait it stands for would have returned EINTR). `None` if the mask could not
    /// be changed.
    pub fn hold() -> Option<SignalsHeld> {
        let _e = ErrnoGuard::save();
        // SAFETY: sigset_t is plain data; sigfillset/sigdelset initialise and edit it, and
        // pthread_sigmask writes the old mask into a valid sigset_t.
        unsafe {
            let mut set: libc::sigset_t = core::mem::zeroed();
            libc::sigfillset(&mut set);
            for s in SYNCHRONOUS {
                libc::sigdelset(&mut set, s);
            }
            let mut old: libc::sigset_t = core::mem::zeroed();
            (libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old) == 0)
                .then_some(SignalsHeld { old })
        }
    }

    /// Whether a signal that the thread's own mask lets through, and whose disposition is not
    /// to ignore it, is pending now: it arrived while held, and the wait this thread stands
    /// for would have been interrupted by it.
    pub fn interrupted(&self) -> bool {
        let _e = ErrnoGuard::save();
        // SAFETY: sigpending writes a valid sigset_t; sigismember reads initialised sets;
        // sigaction with a null new action only reads the disposition into `act`.
        unsafe {
            let mut pending: libc::sigset_t = core::mem::zeroed();
            if libc::sigpending(&mut pending) != 0 {
                return false;
            }
            (1..=libc::SIGRTMAX()).any(|s| {
                if libc::sigismember(&pending, s) != 1 || libc::sigismember(&self.old, s) == 1 {
                    return false;
                }
                let mut act: libc::sigaction = core::mem::zeroed();
                if libc::sigaction(s, core::ptr::null(), &mut act) != 0 {
                    return true;
                }
                let h = act.sa_sigaction;
                !(h == libc::SIG_IGN || (h == libc::SIG_DFL && IGNORED_BY_DEFAULT.contains(&s)))
            })
        }
    }

    /// Restores the mask: a signal held back is delivered now (its handler runs before this
    /// returns).
    pub fn release(self) {
        let _e = ErrnoGuard::save();
        // SAFETY: restores the mask saved by `hold`.
        unsafe {
            libc::pthread_sigmask(libc::SIG_SETMASK, &self.old, core::ptr::null_mut());
        }
    }
}

/// Starts one of the shim's own threads (named `name`) with the asynchronous signals blocked
/// in it from its first instruction (it inherits the mask [`SignalsHeld`] sets in the caller
/// around the spawn): a signal sent to the process is then always delivered to one of the
/// application's threads, as without the shim, where its handler runs and interrupts the
/// application's blocking call (EINTR), and never on a thread that is not the application's.
pub fn spawn_internal(
    name: &str,
    f: impl FnOnce() + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let held = SignalsHeld::hold();
    let r = std::thread::Builder::new()
        .name(name.into())
        .stack_size(256 << 10)
        .spawn(f);
    if let Some(h) = held {
        h.release();
    }
    r
}
