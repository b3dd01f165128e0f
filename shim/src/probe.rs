//! The host-wide fallback reasons, computed once per process, lazily at the first TCP
//! connection (never at load: a preload library is loaded into every process of a pipeline).
//!
//! Two kinds, since a connection between processes of this host needs no RDMA:
//! - [`process_reason`]: no connection of the process moves off TCP: `disabled`
//!   (`RDMASHIM_DISABLE=1`), `policy` (a rule of the configuration file denies the program,
//!   decided once at load), or a reason [`close_host`] set later (io_uring, a sandbox, ...);
//! - [`rdma_reason`]: a connection to another host stays on TCP: `no_device` if
//!   `/sys/class/infiniband` has no entry (a directory read), else `libraries_missing` once
//!   [`load_libraries`] found them missing;
//! - [`host_reason`]: the first, and the second unless same-host connections may move to
//!   shared memory (`RDMASHIM_LOCAL`): the reason every connection stays TCP.
//!
//! [`load_libraries`] loads libibverbs.so.1 and librdmacm.so.1 through the transport's
//! loader (kept loaded: the transport's calls need them next). Under TCG this is tens of
//! milliseconds (ld.so maps the libraries and their libnl dependencies); the engine thread
//! does it at the process's first RDMA dial, so the connection that started the engine goes
//! on without it, and the engine decides the connections queued meanwhile itself
//! (`libraries_missing`). `listen()` calls it directly (its rdma_cm listener needs the
//! libraries at once).

use crate::config::Level;
use crate::reason::{host_reason_from, FallbackReason};
use crate::shim_log;
use std::sync::atomic::{AtomicU8, Ordering};

/// Where RDMA devices appear.
pub const SYSFS_INFINIBAND: &[u8] = b"/sys/class/infiniband\0";

const UNKNOWN: u8 = 0;
const NONE: u8 = 1;
/// The process-wide verdict: UNKNOWN, NONE, or a reason's [`host_word`] (`disabled`, or a
/// reason [`close_host`] set: every connection of the process stays TCP).
static HOST: AtomicU8 = AtomicU8::new(UNKNOWN);
/// The device check's verdict: UNKNOWN, NONE (a device) or `no_device`'s word: it keeps
/// connections to other hosts on TCP, not those between processes of this one.
static DEVICE: AtomicU8 = AtomicU8::new(UNKNOWN);

/// [`HOST`]'s word for `reason`.
fn host_word(reason: FallbackReason) -> u8 {
    reason as u8 + 2
}
/// Whether the libraries loaded: UNKNOWN, YES or NO.
static LIBS: AtomicU8 = AtomicU8::new(UNKNOWN);
const YES: u8 = 1;
const NO: u8 = 2;

/// The reason every connection of this process stays on TCP, if one is known: the
/// process-wide one ([`process_reason`]), and, unless connections between processes of this
/// host may move to shared memory (`RDMASHIM_LOCAL`), RDMA's ([`rdma_reason`]). No lock; two
/// threads racing on the first call both compute it (idempotent).
pub fn host_reason() -> Option<FallbackReason> {
    process_reason().or_else(|| {
        if crate::config::get().local {
            None
        } else {
            rdma_reason()
        }
    })
}

/// The reason no connection of this process may move off TCP, whatever its transport:
/// `disabled`, `policy` (a rule denies the program), or one [`close_host`] set (io_uring, a
/// sandbox, changed credentials, ...).
pub fn process_reason() -> Option<FallbackReason> {
    match HOST.load(Ordering::Acquire) {
        UNKNOWN => {
            let cfg = crate::config::get();
            let denied = cfg.program_denied();
            let r = if cfg.disabled {
                Some(FallbackReason::Disabled)
            } else {
                denied.map(|_| FallbackReason::Policy)
            };
            let v = r.map_or(NONE, host_word);
            match HOST.compare_exchange(UNKNOWN, v, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    match (r, denied) {
                        (Some(FallbackReason::Policy), Some(rule)) => shim_log!(
                            Level::Info,
                            "connections will stay on TCP (policy: {}:{}: {rule})",
                            String::from_utf8_lossy(cfg.file.path.as_deref().unwrap_or(b"")),
                            rule.line
                        ),
                        (Some(r), _) => shim_log!(
                            Level::Info,
                            "connections will stay on TCP ({}: {})",
                            r.name(),
                            r.describe()
                        ),
                        (None, _) => {}
                    }
                    r
                }
                // (a reason closed meanwhile)
                Err(now) => word_reason(now),
            }
        }
        v => word_reason(v),
    }
}

fn word_reason(v: u8) -> Option<FallbackReason> {
    match v {
        UNKNOWN | NONE => None,
        v => FallbackReason::from_index(v - 2),
    }
}

/// The reason a connection to another host stays on TCP, if one is known: `no_device` (no
/// entry in `/sys/class/infiniband`: a directory read, once), or `libraries_missing` once
/// [`load_libraries`] found them missing (until it ran: none).
pub fn rdma_reason() -> Option<FallbackReason> {
    let dev = match DEVICE.load(Ordering::Acquire) {
        UNKNOWN => device_check(),
        v => word_reason(v),
    };
    dev.or_else(|| (LIBS.load(Ordering::Acquire) == NO).then_some(FallbackReason::LibrariesMissing))
}

fn device_check() -> Option<FallbackReason> {
    let r = host_reason_from(false, || {
        crate::sys::dir_has_entries(SYSFS_INFINIBAND).unwrap_or(false)
    });
    let v = r.map_or(NONE, host_word);
    if DEVICE
        .compare_exchange(UNKNOWN, v, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
    {
        match r {
            Some(r) if crate::config::get().local => shim_log!(
                Level::Info,
                "connections to other hosts will stay on TCP ({}: {})",
                r.name(),
                r.describe()
            ),
            Some(r) => shim_log!(
                Level::Info,
                "connections will stay on TCP ({}: {})",
                r.name(),
                r.describe()
            ),
            None => shim_log!(Level::Debug, "RDMA device present"),
        }
    }
    r
}

/// From now on every new connection of this process stays on TCP with `reason` (a process
/// whose credentials changed after it used RDMA: see `upgrade::before_credentials`), unless a
/// host-wide reason already holds. Returns whether it took effect.
pub fn close_host(reason: FallbackReason) -> bool {
    // (nothing of the process can upgrade anyway: the reason that holds stays its reason)
    if host_reason().is_some() {
        return false;
    }
    let v = host_word(reason);
    let mut cur = HOST.load(Ordering::Acquire);
    loop {
        if cur != UNKNOWN && cur != NONE {
            return false;
        }
        match HOST.compare_exchange(cur, v, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return true,
            Err(now) => cur = now,
        }
    }
}

/// In a fork child: a reason that held only for the parent process ([`close_host`]'s) is
/// looked at afresh (the child is one thread that opened nothing yet: RDMA works for it).
pub fn after_fork_child() {
    let closed = host_word(FallbackReason::CredentialsChanged);
    let _ = HOST.compare_exchange(closed, UNKNOWN, Ordering::AcqRel, Ordering::Acquire);
}

/// Loads the RDMA libraries (once per process; they stay loaded) and says whether they are
/// there. Slow the first time: call it off the application's critical path where it can be
/// (the engine thread), and inside a shim section on an application thread (the libraries'
/// constructors may call hooked functions).
pub fn load_libraries() -> bool {
    match LIBS.load(Ordering::Acquire) {
        YES => return true,
        NO => return false,
        _ => {}
    }
    let r = rdmashim_core::sys::lib();
    let v = if r.is_ok() { YES } else { NO };
    if LIBS
        .compare_exchange(UNKNOWN, v, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
    {
        match r {
            Ok(_) => shim_log!(Level::Info, "RDMA device and libraries present"),
            Err(e) => {
                let m = FallbackReason::LibrariesMissing;
                shim_log!(
                    Level::Info,
                    "connections will stay on TCP ({}: {e})",
                    m.name()
                )
            }
        }
    }
    v == YES
}
