//! The host-wide fallback reason, computed once per process, lazily at the first TCP connection
//! (never at load: a preload library is loaded into every process of a pipeline).
//!
//! Two parts, so that the first connection does not wait for the slow one:
//! - [`host_reason`], on the application's thread at its first connect/accept/listen:
//!   `disabled` if `RDMASHIM_DISABLE=1`; else `no_device` if `/sys/class/infiniband` has no
//!   entry (a directory read); else `libraries_missing` once [`load_libraries`] found them
//!   missing; else none (the per-connection reason applies).
//! - [`load_libraries`]: loads libibverbs.so.1 and librdmacm.so.1 through the transport's
//!   loader (kept loaded: the transport's calls need them next). Under TCG this is tens of
//!   milliseconds (ld.so maps the libraries and their libnl dependencies); the engine thread
//!   does it at the process's first dial, so the connection that started the engine goes on
//!   without it, and the engine decides the connections queued meanwhile itself
//!   (`libraries_missing`). `listen()` calls it directly (its rdma_cm listener needs the
//!   libraries at once).

use crate::config::Level;
use crate::reason::FallbackReason;
use crate::shim_log;
use std::sync::atomic::{AtomicU8, Ordering};

/// Where RDMA devices appear.
pub const SYSFS_INFINIBAND: &[u8] = b"/sys/class/infiniband\0";

const UNKNOWN: u8 = 0;
const NONE: u8 = 1;
/// The fast checks' verdict: UNKNOWN, NONE, or a reason's [`host_word`].
static HOST: AtomicU8 = AtomicU8::new(UNKNOWN);

/// [`HOST`]'s word for `reason`.
fn host_word(reason: FallbackReason) -> u8 {
    reason as u8 + 2
}
/// Whether the libraries loaded: UNKNOWN, YES or NO.
static LIBS: AtomicU8 = AtomicU8::new(UNKNOWN);
const YES: u8 = 1;
const NO: u8 = 2;

/// The fast checks' decision procedure, with the checks passed in (tested without a host).
pub fn host_reason_from(
    disabled: bool,
    has_device: impl FnOnce() -> bool,
) -> Option<FallbackReason> {
    if disabled {
        Some(FallbackReason::Disabled)
    } else if !has_device() {
        Some(FallbackReason::NoDevice)
    } else {
        None
    }
}

/// The host-wide reason every connection of this process stays on TCP, if one is known.
/// Two threads racing on the first call both compute it (idempotent); no lock. The libraries'
/// verdict is known only once [`load_libraries`] ran: until then, none.
pub fn host_reason() -> Option<FallbackReason> {
    let fast = match HOST.load(Ordering::Acquire) {
        UNKNOWN => fast_checks(),
        NONE => None,
        v => FallbackReason::from_index(v - 2),
    };
    fast.or_else(|| {
        (LIBS.load(Ordering::Acquire) == NO).then_some(FallbackReason::LibrariesMissing)
    })
}

fn fast_checks() -> Option<FallbackReason> {
    let r = host_reason_from(crate::config::get().disabled, || {
        crate::sys::dir_has_entries(SYSFS_INFINIBAND).unwrap_or(false)
    });
    let v = r.map_or(NONE, host_word);
    if HOST
        .compare_exchange(UNKNOWN, v, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
    {
        match r {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order() {
        assert_eq!(
            host_reason_from(true, || panic!()),
            Some(FallbackReason::Disabled)
        );
        assert_eq!(
            host_reason_from(false, || false),
            Some(FallbackReason::NoDevice)
        );
        assert_eq!(host_reason_from(false, || true), None);
    }
}
