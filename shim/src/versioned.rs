//! A versioned cache cell (safe, lock-free; see [`Versioned`]).

use std::sync::atomic::{AtomicU64, Ordering};

/// The value of a cell that must be filled from its source.
pub const UNKNOWN: u32 = u32::MAX;
const LOW: u64 = 0xffff_ffff;

/// A cached `u32` that a lazy fill and a concurrent change can both write without the fill
/// keeping a stale value: the word holds a version in its high half and the value (or
/// [`UNKNOWN`]) in its low half; a change bumps the version, so a fill that read its source
/// before the change and stores after it fails its compare-and-swap.
pub struct Versioned(AtomicU64);

impl Versioned {
    pub const fn new() -> Versioned {
        Versioned(AtomicU64::new(UNKNOWN as u64))
    }

    /// The value, or `read()`'s (kept unless a change came meanwhile).
    pub fn get_or(&self, read: impl FnOnce() -> u32) -> u32 {
        let w = self.0.load(Ordering::Acquire);
        if w as u32 != UNKNOWN {
            return w as u32;
        }
        let v = read();
        let _ = self.0.compare_exchange(
            w,
            (w & !LOW) | u64::from(v),
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
        v
    }

    /// A change: `v` (or [`UNKNOWN`]: read the source next time).
    pub fn set(&self, v: u32) {
        let _ = self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                Some((((w >> 32) + 1) << 32) | u64::from(v))
            });
    }
}

impl Default for Versioned {
    fn default() -> Self {
        Versioned::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fill_that_raced_with_a_change_is_not_kept() {
        let a = Versioned::new();
        let v = a.get_or(|| {
            // the change lands between the kernel read and the store
            a.set(7);
            3
        });
        assert_eq!(v, 3, "the call itself uses what it read");
        assert_eq!(
            a.get_or(|| 99),
            7,
            "the cache holds the change, not the stale read"
        );
        a.set(UNKNOWN);
        assert_eq!(a.get_or(|| 5), 5);
        assert_eq!(a.get_or(|| 6), 5, "filled once");
    }

    #[test]
    fn versions_do_not_spill_into_values() {
        let a = Versioned(AtomicU64::new(
            (u64::from(u32::MAX) << 32) | u64::from(UNKNOWN),
        ));
        a.set(1);
        assert_eq!(a.get_or(|| 0), 1);
    }
}
