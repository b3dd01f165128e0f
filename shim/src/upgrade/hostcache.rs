//! The host-wide negative cache (`rdmashim_proto::hostcache`): peer hosts that did not answer
//! an upgrade, shared by this user's processes through `RUN_DIR/silent-hosts`, so that a new
//! process does not try a silent host again either (at most one attempt per host per expiry,
//! host-wide). Made or opened at the first look (a connect to an upgradable address), in the
//! first run directory this process may use ([`crate::settings::run_dirs`]); without one,
//! each process keeps its own cache only, as before (one debug line says why).

use crate::config::{self, Level};
use crate::{shim_log, sys};
use rdmashim_proto::hostcache;
use std::net::IpAddr;
use std::sync::atomic::AtomicU64;
use std::sync::OnceLock;

/// The table's file in the run directory.
const NAME: &[u8] = b"silent-hosts";

static TABLE: OnceLock<Option<&'static [AtomicU64]>> = OnceLock::new();

fn table() -> Option<&'static [AtomicU64]> {
    *TABLE.get_or_init(|| {
        let uid = sys::geteuid();
        let mut last = None;
        for dir in crate::settings::run_dirs(config::get(), uid) {
            let mode = if dir == crate::settings::SYSTEM_RUN_DIR.as_bytes() {
                0o755
            } else {
                0o700
            };
            let made = sys::make_dir(&dir, mode)
                .and_then(|_| sys::own_dir(&dir))
                .and_then(|_| {
                    sys::open_shared_table(&dir, NAME, hostcache::WORDS, hostcache::init)
                });
            match made {
                Ok(t) if hostcache::valid(t) => return Some(t),
                Ok(_) => last = Some((dir, "not a table of this version".to_string())),
                Err(e) => last = Some((dir, e.to_string())),
            }
        }
        if let Some((dir, why)) = last {
            shim_log!(
                Level::Debug,
                "no host-wide negative cache: {}/silent-hosts: {why}",
                String::from_utf8_lossy(&dir)
            );
        }
        None
    })
}

/// Whether host `ip` is silent now, for this host's processes.
pub fn silent(ip: IpAddr) -> bool {
    table().is_some_and(|t| hostcache::silent_until(t, ip, sys::unix_ms()).is_some())
}

/// Host `ip` did not answer: silent for `secs` seconds, host-wide.
pub fn record_silent(ip: IpAddr, secs: u64) {
    if let Some(t) = table() {
        let now = sys::unix_ms();
        hostcache::record_silent(t, ip, now.saturating_add(secs.saturating_mul(1000)), now);
    }
}

/// Host `ip` answered: not silent any more.
pub fn forget(ip: IpAddr) {
    if let Some(t) = TABLE.get().copied().flatten() {
        hostcache::forget(t, ip);
    }
}
