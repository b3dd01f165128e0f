//! The host-wide negative cache (`rdmashim_proto::hostcache`): peer hosts that did not answer
//! an upgrade, shared by this user's processes through `RUN_DIR/silent-hosts`, so that a new
//! process does not try a silent host again either (at most one attempt per host per expiry,
//! host-wide).
//!
//! The table is made by the first process that records a silent host, in the first run
//! directory it may use ([`crate::settings::run_dirs`]); until then nothing is made (a host
//! whose peers all answer never has the file). A process looks for it at a connect to an
//! upgradable address, at most every [`LOOK_AGAIN_MS`] while it is not there, and keeps it
//! mapped once found. Without a usable run directory each process keeps its own cache only,
//! as before (one debug line says why).

use crate::config::{self, Level};
use crate::{shim_log, sys};
use rdmashim_proto::hostcache;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// The table's file in the run directory.
const NAME: &[u8] = b"silent-hosts";
/// How often a process that found no table looks again (another may have made it).
const LOOK_AGAIN_MS: u64 = 10_000;

static TABLE: OnceLock<&'static [AtomicU64]> = OnceLock::new();
static NEXT_LOOK_MS: AtomicU64 = AtomicU64::new(0);

/// The table: found (or, with `create`, made) in the first usable run directory.
fn table(create: bool) -> Option<&'static [AtomicU64]> {
    if let Some(t) = TABLE.get() {
        return Some(t);
    }
    let now = sys::unix_ms();
    if !create && now < NEXT_LOOK_MS.load(Ordering::Relaxed) {
        return None;
    }
    NEXT_LOOK_MS.store(now + LOOK_AGAIN_MS, Ordering::Relaxed);
    let uid = sys::geteuid();
    let mut last = None;
    for dir in crate::settings::run_dirs(config::get(), uid) {
        let mode = if dir == crate::settings::SYSTEM_RUN_DIR.as_bytes() {
            0o755
        } else {
            0o700
        };
        let made = if create {
            sys::make_dir(&dir, mode)
        } else {
            Ok(())
        };
        let found = made.and_then(|_| sys::own_dir(&dir)).and_then(|_| {
            sys::open_shared_table(&dir, NAME, hostcache::WORDS, hostcache::init, create)
        });
        match found {
            Ok(t) if hostcache::valid(t) => {
                let _ = TABLE.set(t);
                return TABLE.get().copied();
            }
            Ok(_) => last = Some((dir, "not a table of this version".to_string())),
            Err(e) => last = Some((dir, e.to_string())),
        }
    }
    if let (true, Some((dir, why))) = (create, last) {
        shim_log!(
            Level::Debug,
            "no host-wide negative cache: {}/silent-hosts: {why}",
            String::from_utf8_lossy(&dir)
        );
    }
    None
}

/// Whether host `ip` is silent now, for this host's processes.
pub fn silent(ip: IpAddr) -> bool {
    table(false).is_some_and(|t| hostcache::silent_until(t, ip, sys::unix_ms()).is_some())
}

/// Host `ip` did not answer: silent for `secs` seconds, host-wide.
pub fn record_silent(ip: IpAddr, secs: u64) {
    if let Some(t) = table(true) {
        let now = sys::unix_ms();
        hostcache::record_silent(t, ip, now.saturating_add(secs.saturating_mul(1000)), now);
    }
}

/// Host `ip` answered: not silent any more.
pub fn forget(ip: IpAddr) {
    if let Some(t) = TABLE.get() {
        hostcache::forget(t, ip);
    }
}
