//! The host-wide fallback reason, computed once per process, lazily at the first TCP connection
//! (never at load: a preload library is loaded into every process of a pipeline).
//!
//! Until the transport crate's RDMA probe is wired in, this is: `disabled` if
//! `RDMASHIM_DISABLE=1`; else `no_device` if `/sys/class/infiniband` has no entry; else
//! `libraries_missing` if libibverbs.so.1 or librdmacm.so.1 cannot be dlopen'ed; else none (the
//! per-connection reason applies).

use crate::config::Level;
use crate::reason::FallbackReason;
use crate::shim_log;
use std::sync::atomic::{AtomicU8, Ordering};

/// Where RDMA devices appear.
pub const SYSFS_INFINIBAND: &[u8] = b"/sys/class/infiniband\0";
/// The run-time libraries an upgrade needs.
pub const LIBIBVERBS: &[u8] = b"libibverbs.so.1\0";
pub const LIBRDMACM: &[u8] = b"librdmacm.so.1\0";

const UNKNOWN: u8 = 0;
const NONE: u8 = 1;
static HOST: AtomicU8 = AtomicU8::new(UNKNOWN);

/// The decision procedure, with the checks passed in (tested without a host).
pub fn host_reason_from(
    disabled: bool,
    has_device: impl FnOnce() -> bool,
    libraries_load: impl FnOnce() -> bool,
) -> Option<FallbackReason> {
    if disabled {
        Some(FallbackReason::Disabled)
    } else if !has_device() {
        Some(FallbackReason::NoDevice)
    } else if !libraries_load() {
        Some(FallbackReason::LibrariesMissing)
    } else {
        None
    }
}

/// The host-wide reason every connection of this process stays on TCP, if there is one.
/// Two threads racing on the first call both compute it (idempotent); no lock.
pub fn host_reason() -> Option<FallbackReason> {
    match HOST.load(Ordering::Acquire) {
        UNKNOWN => {}
        NONE => return None,
        v => return FallbackReason::from_index(v - 2),
    }
    let r = host_reason_from(
        crate::config::get().disabled,
        || crate::sys::dir_has_entries(SYSFS_INFINIBAND).unwrap_or(false),
        || crate::sys::can_dlopen(LIBIBVERBS) && crate::sys::can_dlopen(LIBRDMACM),
    );
    let v = r.map_or(NONE, |r| r as u8 + 2);
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
            None => shim_log!(Level::Info, "RDMA device and libraries present"),
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order() {
        assert_eq!(
            host_reason_from(true, || panic!(), || panic!()),
            Some(FallbackReason::Disabled)
        );
        assert_eq!(
            host_reason_from(false, || false, || panic!()),
            Some(FallbackReason::NoDevice)
        );
        assert_eq!(
            host_reason_from(false, || true, || false),
            Some(FallbackReason::LibrariesMissing)
        );
        assert_eq!(host_reason_from(false, || true, || true), None);
    }
}
