//! Signals and the shim's own waits and threads. A busy-poll that stands in for a wait a
//! signal would interrupt holds the asynchronous signals back while it spins
//! ([`SignalsHeld`]), so that one arriving meanwhile is seen and the call can fail with EINTR as
//! the wait would have; a blocking socket call's sleep holds them too and wakes on a signalfd,
//! so that it knows before the handler runs whether the kernel would restart the call
//! ([`Delivery`]: SA_RESTART); the shim's threads block them for good ([`spawn_internal`]), so that
//! a signal sent to the process always lands on one of the application's threads.
#![allow(unsafe_code)]

use crate::sys::ErrnoGuard;
use core::ffi::c_int;
use std::sync::{Mutex, TryLockError};

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

/// What a pending signal does to a blocking call when it is delivered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// No handler runs (ignored, or a default action — nothing, stop, or the end of the
    /// process): a wait goes on as if nothing happened.
    Unseen,
    /// A handler runs, installed with `SA_RESTART`: a blocking socket call without a timeout
    /// is restarted by the kernel (a wait for readiness never is).
    Restarting,
    /// A handler runs, without `SA_RESTART`: the call fails with EINTR.
    Interrupting,
}

/// How signal `s` is delivered now (its disposition, read with sigaction).
fn delivery(s: c_int) -> Delivery {
    // SAFETY: sigaction with a null new action only reads the disposition into `act`.
    let act = unsafe {
        let mut act: libc::sigaction = core::mem::zeroed();
        if libc::sigaction(s, core::ptr::null(), &mut act) != 0 {
            return Delivery::Unseen;
        }
        act
    };
    if act.sa_sigaction == libc::SIG_IGN || act.sa_sigaction == libc::SIG_DFL {
        Delivery::Unseen
    } else if act.sa_flags & libc::SA_RESTART != 0 {
        Delivery::Restarting
    } else {
        Delivery::Interrupting
    }
}

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

    /// Whether a signal that the thread's own mask lets through, and that runs a handler, is
    /// pending now: it arrived while held, and the wait this thread stands for would have been
    /// interrupted by it.
    pub fn interrupted(&self) -> bool {
        self.pending() != Delivery::Unseen
    }

    /// What the signals pending now, among those the thread's own mask lets through, do to a
    /// blocking call once they are let go: [`Delivery::Interrupting`] if any of them runs a
    /// handler without `SA_RESTART`, else [`Delivery::Restarting`] if any runs one with it.
    pub fn pending(&self) -> Delivery {
        let _e = ErrnoGuard::save();
        // SAFETY: sigpending writes a valid sigset_t; sigismember reads initialised sets.
        let pending = unsafe {
            let mut pending: libc::sigset_t = core::mem::zeroed();
            if libc::sigpending(&mut pending) != 0 {
                return Delivery::Unseen;
            }
            pending
        };
        let mut worst = Delivery::Unseen;
        for s in 1..=libc::SIGRTMAX() {
            // SAFETY: both sets are initialised.
            let let_through = unsafe {
                libc::sigismember(&pending, s) == 1 && libc::sigismember(&self.old, s) != 1
            };
            if !let_through {
                continue;
            }
            match delivery(s) {
                Delivery::Interrupting => return Delivery::Interrupting,
                Delivery::Restarting => worst = Delivery::Restarting,
                Delivery::Unseen => {}
            }
        }
        worst
    }

    /// The asynchronous signals the thread's own mask lets through (bit `s - 1` for signal
    /// `s`): those a signalfd of [`SignalWatch`] watches.
    fn let_through(&self) -> u64 {
        let mut bits = 0u64;
        for s in 1..=libc::SIGRTMAX().min(64) {
            // SAFETY: `old` is an initialised set.
            if unsafe { libc::sigismember(&self.old, s) } != 1 && !SYNCHRONOUS.contains(&s) {
                bits |= 1 << (s - 1);
            }
        }
        bits
    }

    /// The thread's own mask, as it was before the signals were held: for a wait that
    /// applies it while it sleeps (ppoll's or epoll_pwait's mask), so that a signal held
    /// meanwhile interrupts that wait.
    pub fn mask(&self) -> *const libc::sigset_t {
        &self.old
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

/// The asynchronous signals held back, and a signalfd of those the thread's own mask lets
/// through: a wait that includes [`fd`](Self::fd) ends when one arrives, and
/// [`finish`](Self::finish) tells what it does before letting it go (its handler runs then).
pub struct SignalWatch {
    held: SignalsHeld,
    watcher: Watcher,
}

/// The signalfd of a [`SignalWatch`]: one of the shim's own descriptors (moved high and marked
/// private, as its eventfds are), taken from [`POOL`] and given back to it, or — when the shim
/// may not keep descriptors of its own (`net::abandon_private`) — one of this wait only.
struct Watcher {
    fd: c_int,
    set: u64,
    private: bool,
}

/// Signalfds of finished waits, each with the set it watches (fixed when it was made: one
/// process's threads, or a fork child and its parent, may poll the same one at once, and
/// poll reads the pending signals of whoever polls). A blocking call on an upgraded
/// connection sleeps once per message it waits for; a signalfd made and closed for each
/// sleep cost two system calls and a deferred file release of the ~8 a sleep makes, and it
/// took the lowest free descriptor number, where a program that closes 0 and opens a file
/// expects that file. Only `try_lock`ed: a fork child whose parent held the lock at the fork
/// makes its own signalfds (and closes them) instead of waiting for it forever.
static POOL: Mutex<Vec<(c_int, u64)>> = Mutex::new(Vec::new());

/// The most signalfds [`POOL`] keeps (one per thread that sleeps at the same time, and
/// per signal mask those threads have).
const POOL_MAX: usize = 16;

fn pool() -> Option<std::sync::MutexGuard<'static, Vec<(c_int, u64)>>> {
    match POOL.try_lock() {
        Ok(g) => Some(g),
        Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

impl Watcher {
    /// A signalfd watching `set`: a pooled one, or a new one moved at or above `min`.
    fn take(set: u64, min: c_int) -> Option<Watcher> {
        let private = crate::net::private_usable();
        if private {
            if let Some(mut p) = pool() {
                if let Some(i) = p.iter().position(|&(_, s)| s == set) {
                    let (fd, _) = p.swap_remove(i);
                    return Some(Watcher { fd, set, private });
                }
            }
        }
        let _e = ErrnoGuard::save();
        // SAFETY: sigset_t is plain data, initialised by sigemptyset and edited by sigaddset;
        // signalfd(-1, ..) only reads the set and makes a new descriptor.
        let fd = unsafe {
            let mut mask: libc::sigset_t = core::mem::zeroed();
            libc::sigemptyset(&mut mask);
            for s in 1..=64 {
                if set & (1 << (s - 1)) != 0 {
                    libc::sigaddset(&mut mask, s);
                }
            }
            libc::signalfd(-1, &mask, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC)
        };
        if fd < 0 {
            return None;
        }
        let fd = if private {
            crate::net::private_at_or_above(fd, min)
        } else {
            fd
        };
        Some(Watcher { fd, set, private })
    }

    /// Back to the pool, or closed.
    fn give_back(self) {
        if self.private && crate::net::private_usable() {
            if let Some(mut p) = pool() {
                if p.len() < POOL_MAX {
                    p.push((self.fd, self.set));
                    return;
                }
            }
            crate::net::close(self.fd);
        } else if !self.private {
            let _e = ErrnoGuard::save();
            // SAFETY: the signalfd this wait made, closed once.
            unsafe { libc::close(self.fd) };
        }
        // (a private one after the shim gave its descriptors up: its number may be the
        // program's now; left alone)
    }
}

impl SignalWatch {
    /// Holds the signals and takes a signalfd (made at or above `min` if a new one is
    /// needed); `None` (nothing held) if either fails.
    pub fn start(min: c_int) -> Option<SignalWatch> {
        let held = SignalsHeld::hold()?;
        match Watcher::take(held.let_through(), min) {
            Some(watcher) => Some(SignalWatch { held, watcher }),
            None => {
                held.release();
                None
            }
        }
    }

    /// The signalfd, to wait on.
    pub fn fd(&self) -> c_int {
        self.watcher.fd
    }

    /// What the signals that arrived do to a blocking call ([`SignalsHeld::pending`]); then
    /// gives the signalfd back and lets them go. (Nothing is read from the signalfd: the
    /// signals stay pending until they are let go, and their handlers run then.) `quiet`:
    /// the wait saw the signalfd not readable when it ended (its poll's `revents`), so no
    /// signal had come by then and the pending set is not read — one system call less on
    /// every sleep that data or readiness ended; one arriving since is let go as if it came
    /// just after the call.
    pub fn finish(self, quiet: bool) -> Delivery {
        let d = if quiet {
            Delivery::Unseen
        } else {
            self.held.pending()
        };
        self.watcher.give_back();
        self.held.release();
        d
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
