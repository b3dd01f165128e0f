//! Failures on purpose, and the note of the last real one.
//!
//! `RDMASHIM_FAULT=POINT:N` makes the shim panic at the `N`th time it passes `POINT` (a test
//! knob: the failure policy — docs/shim.md, "When the shim itself fails" — is checked by
//! making the shim fail): `ring_recv` (a data call that reads an upgraded connection's ring,
//! on the program's thread) or `engine_link` (the engine thread
//! putting a client's connection onto its new ring). One point fails something else than the
//! shim: `path_fail` fails the ring path of the connection that a data call reads from the
//! ring for the `N`th time (as a dead link or a removed device would), to check that the
//! stream goes on over TCP (protocol §8.6). And one is a setting: `version:N` makes the shim
//! speak binding version `N` (its token, and the tokens it understands), as a shim of another
//! release would, to check that two releases that do not understand each other stay on TCP
//! with every byte. `slow_accept:N` and `slow_answer:N`, settings too, hold each request the
//! setup thread answered `N` ms before the engine takes its link up, or `N` ms before it
//! answers it, to check what a program that forks or closes meanwhile finds (the server's,
//! the client's). `map_count:N` takes the host's `vm.max_map_count` to be `N`, to check the
//! shim's share of the process's mappings. Unset, a point costs one relaxed load.
//!
//! The panic hook: a panic inside the shim is caught (a hook's `catch_unwind`, a thread's)
//! and reported by the shim's own log line. Rust's default hook would print its message and a
//! backtrace hint to the program's stderr; the shim's hook (its own copy of std's: a Rust
//! program's hook is not touched) only keeps the message for that line.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

pub use crate::settings::{Fault, Point};

/// Which point is armed (1 + its index; 0: none) and how many passes are left before it fires.
static ARMED: AtomicU64 = AtomicU64::new(0);
static LEFT: AtomicU64 = AtomicU64::new(0);

/// The binding version `version:N` set (0: none, the shim's own).
static VERSION: core::sync::atomic::AtomicU8 = core::sync::atomic::AtomicU8::new(0);

/// How long the setup thread holds a request after it answered it (`slow_accept:N`, ms), and
/// before (`slow_answer:N`); 0: none.
static SLOW_ACCEPT_MS: AtomicU64 = AtomicU64::new(0);
static SLOW_ANSWER_MS: AtomicU64 = AtomicU64::new(0);

/// The `vm.max_map_count` taken instead of the host's (`map_count:N`); 0: the host's.
static MAP_COUNT: AtomicU64 = AtomicU64::new(0);

/// The `vm.max_map_count` the shim takes instead of the host's
/// (`RDMASHIM_FAULT=map_count:N`), if set.
pub fn map_count() -> Option<u64> {
    Some(MAP_COUNT.load(Relaxed)).filter(|n| *n != 0)
}

fn delay(ms: &AtomicU64) -> Option<std::time::Duration> {
    Some(ms.load(Relaxed))
        .filter(|ms| *ms != 0)
        .map(std::time::Duration::from_millis)
}

/// How long the setup thread holds each request it answered before the engine takes its link
/// up (`RDMASHIM_FAULT=slow_accept:N`), if set.
pub fn accept_delay() -> Option<std::time::Duration> {
    delay(&SLOW_ACCEPT_MS)
}

/// How long the setup thread holds each request before it answers it
/// (`RDMASHIM_FAULT=slow_answer:N`), if set.
pub fn answer_delay() -> Option<std::time::Duration> {
    delay(&SLOW_ANSWER_MS)
}

/// The binding version this shim speaks instead of its own (`RDMASHIM_FAULT=version:N`).
pub fn spoken_version() -> Option<u8> {
    Some(VERSION.load(Relaxed)).filter(|v| *v != 0)
}

/// Arms the configured fault (the constructor, once).
pub fn arm(f: Option<Fault>) {
    let Some(f) = f else { return };
    match f.point {
        // (settings, not points that fire)
        Point::Version => VERSION.store(u8::try_from(f.after).unwrap_or(0), Relaxed),
        Point::SlowAccept => SLOW_ACCEPT_MS.store(f.after, Relaxed),
        Point::SlowAnswer => SLOW_ANSWER_MS.store(f.after, Relaxed),
        Point::MapCount => MAP_COUNT.store(f.after, Relaxed),
        _ => {
            let i = Point::ALL
                .iter()
                .position(|(p, _)| *p == f.point)
                .unwrap_or(0);
            LEFT.store(f.after, Relaxed);
            ARMED.store(i as u64 + 1, Relaxed);
        }
    }
}

/// Passes `p`: panics if it is the armed point and its turn came.
#[inline]
pub fn pass(p: Point) {
    if fires(p) {
        panic!("RDMASHIM_FAULT: {} (a failure on purpose)", p.name());
    }
}

/// Passes `p`: whether it is the armed point and its turn came (once).
#[inline]
pub fn fires(p: Point) -> bool {
    let armed = ARMED.load(Relaxed);
    if armed == 0 || Point::ALL.get(armed as usize - 1).map(|x| x.0) != Some(p) {
        return false;
    }
    if LEFT.fetch_sub(1, Relaxed) == 1 {
        ARMED.store(0, Relaxed);
        return true;
    }
    false
}

/// The last panic's message and place (empty if none was noted).
static LAST: Mutex<String> = Mutex::new(String::new());

/// Installs the panic hook (see the module's documentation).
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        if let Ok(mut last) = LAST.try_lock() {
            last.clear();
            use std::fmt::Write;
            let p = info.payload();
            let msg = p
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| p.downcast_ref::<String>().map(String::as_str))
                .unwrap_or("(no message)");
            let _ = write!(last, "{msg}");
            if let Some(l) = info.location() {
                let _ = write!(last, " ({}:{})", l.file(), l.line());
            }
        }
    }));
}

/// ": MESSAGE" of the last panic noted, for a log line (empty if none).
pub fn last_panic() -> String {
    match LAST.try_lock() {
        Ok(l) if !l.is_empty() => format!(": {}", l.replace('\n', " ")),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fires_on_the_nth_pass_of_its_point_only() {
        arm(Some(Fault {
            point: Point::EngineLink,
            after: 2,
        }));
        pass(Point::RingRecv);
        pass(Point::EngineLink);
        let r = std::panic::catch_unwind(|| pass(Point::EngineLink));
        assert!(r.is_err());
        // (fired once: disarmed)
        pass(Point::EngineLink);
    }
}
