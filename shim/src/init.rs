//! Constructor, destructor and fork handlers.
//!
//! The constructor (an `.init_array` entry) reads the configuration, records the pid and
//! registers the fork handlers. It does no RDMA work (the host probe runs at the first TCP
//! connection) and does not pre-resolve the real functions: each hook resolves its own symbol
//! at its first call. Measured with scripts/bench-passthrough's start-up loop, resolving all 60
//! symbols eagerly cost ~150 us per process start (/bin/true: 1180 us vs 1020 us lazily, 939 us
//! under an empty preload) — paid by every process of every shell pipeline. The destructor (`.fini_array`, run by exit(3) after the
//! atexit handlers) writes the stats file. A process that ends in `_exit(2)` or by a signal
//! writes none.
#![allow(unsafe_code)]

use crate::config::{self, Level};
use crate::fmtbuf::FixedBuf;
use crate::hooks::{keep_activated_syns, sweep_pending_connects, PID};
use crate::stats::{Program, Snapshot, JSON_MAX};
use crate::{guard, shim_log, sys};
use core::ffi::{c_char, c_int};
use std::sync::atomic::Ordering;

type InitFn = extern "C" fn(c_int, *const *const c_char, *const *const c_char);

#[used]
#[link_section = ".init_array"]
static CONSTRUCTOR: InitFn = constructor;

#[used]
#[link_section = ".fini_array"]
static DESTRUCTOR: extern "C" fn() = destructor;

extern "C" fn constructor(_argc: c_int, _argv: *const *const c_char, _envp: *const *const c_char) {
    let _ = std::panic::catch_unwind(|| {
        let _s = guard::Section::enter();
        let _e = sys::ErrnoGuard::save();
        crate::fault::install_panic_hook();
        let cfg = config::get();
        crate::fault::arm(cfg.fault);
        PID.store(sys::getpid(), Ordering::Relaxed);
        sys::remember_exec_name();
        crate::stats::start_record(sys::getppid(), sys::unix_ms());
        // SAFETY: registers static functions as the fork prepare, parent and child handlers.
        unsafe {
            libc::pthread_atfork(
                Some(before_fork),
                Some(after_fork_parent),
                Some(after_fork_child),
            )
        };
        keep_activated_syns();
        #[cfg(feature = "timeline")]
        crate::timeline::start();
        for w in &cfg.warnings {
            shim_log!(Level::Warn, "{w}");
        }
        shim_log!(
            Level::Debug,
            "loaded (disabled={}, stats={})",
            cfg.disabled,
            cfg.stats_path
                .as_deref()
                .map_or("none".into(), String::from_utf8_lossy)
        );
    });
}

extern "C" fn destructor() {
    let _ = std::panic::catch_unwind(|| {
        if guard::poisoned() {
            return;
        }
        sweep_pending_connects();
        {
            let _s = guard::Section::enter();
            crate::upgrade::flush_at_exit();
        }
        write_stats();
        crate::live::end(false);
        #[cfg(feature = "timeline")]
        crate::timeline::finish();
    });
}

/// Before a fork: the connections that exist now may share their sockets with the child.
unsafe extern "C" fn before_fork() {
    crate::upgrade::before_fork();
}

/// After a fork, in the parent.
unsafe extern "C" fn after_fork_parent() {
    crate::upgrade::after_fork_parent();
}

/// The child of a fork: its own pid and counters, and a record that starts now, of the
/// process that forked it (the pid it had: one system call fewer, and right even if that
/// parent has already gone).
unsafe extern "C" fn after_fork_child() {
    let parent = match PID.load(Ordering::Relaxed) {
        0 => sys::getppid(),
        p => p,
    };
    PID.store(sys::getpid(), Ordering::Relaxed);
    guard::after_fork_child();
    crate::stats::reset();
    crate::stats::start_record(parent, sys::unix_ms());
    crate::live::after_fork_child();
    crate::probe::after_fork_child();
    crate::upgrade::after_fork_child();
    crate::hooks::after_fork_child();
}

/// Writes the stats JSON to `RDMASHIM_STATS` (with `%p` expanded) if set: the counters, and
/// whose record it is (the program's name is read now, from `/proc`). errno preserved.
pub(crate) fn write_stats() {
    let cfg = config::get();
    let Some(pattern) = cfg.stats_path.as_deref() else {
        return;
    };
    if crate::log::silenced() {
        // (a sandboxed process: see `log::silence`)
        return;
    }
    let _s = guard::Section::enter();
    let _e = sys::ErrnoGuard::save();
    let pid = sys::getpid();
    let mut path = FixedBuf::<4200>::new();
    if !config::expand_path(pattern, pid, &mut path) {
        shim_log!(Level::Warn, "{}: path too long", config::ENV_STATS);
        return;
    }
    let mut json = FixedBuf::<JSON_MAX>::new();
    let mut snap = Snapshot::take(pid);
    let mut exe = [0u8; 4096];
    if let Some(name) = sys::program_name(&mut exe) {
        snap.program = Program::new(name);
    }
    snap.ended_unix_ms = sys::unix_ms();
    let _ = snap.write_json(&mut json);
    if json.overflowed() {
        shim_log!(
            Level::Error,
            "stats JSON does not fit its buffer; not written"
        );
        return;
    }
    if let Err(e) = sys::write_file_atomic(path.as_bytes(), json.as_bytes()) {
        shim_log!(
            Level::Warn,
            "cannot write stats to {}: {e}",
            String::from_utf8_lossy(path.as_bytes().strip_suffix(b"\0").unwrap_or(&[]))
        );
    }
}
