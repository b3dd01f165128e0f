//! The clock of spin loops: the CPU's time-stamp counter once it is calibrated, the monotonic
//! clock until then (or where there is no usable counter).
//!
//! A spinning thread reads a clock for its time limit and to notice when it lost its CPU (a gap
//! between two reads), and once more when it finds what it waited for. Where the kernel's
//! clocksource has a vDSO reader (TSC, kvm-clock) a read costs tens of nanoseconds; where it
//! has none (HPET, as in the soft-RoCE VM, or Xen's `xen` clocksource) every read is a system
//! call: 0.9 µs under TCG, on the critical path of every 64 B ping-pong. The counter is read
//! with one instruction.
//!
//! Its rate is learned, not assumed: every monotonic-clock read of a spin also reads the
//! counter; the first such pair is the anchor, and a pair at least [`CALIBRATE`] later gives
//! the rate (counter ticks per nanosecond, 32-bit fixed point). A pair whose two counter reads
//! straddle more than [`PAIR_SLACK`] ticks (the thread was interrupted between them) is not
//! used. A rate outside 50 MHz–20 GHz, or a counter that went backwards, marks the counter
//! unusable for the process. The counter is not assumed to agree between CPUs: a spin that
//! sees it go backwards, or jump, treats that as a gap (the shim's spin then checks it against
//! the thread's involuntary context switches), and a spin is microseconds long.
//!
//! Users: the shim's spins, the native [`Stream`](crate::Stream)'s spin, and the periodic
//! unprompted look of a [`Link`](crate::Link) at its rdma_cm channel ([`Periodic`]).
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How far apart the anchor and the calibrating pair must be.
pub const CALIBRATE: Duration = Duration::from_millis(20);
/// The most counter ticks the two reads around a clock read may be apart for the pair to
/// count (tens of microseconds at any plausible rate).
pub const PAIR_SLACK: u64 = 100_000;

const UNKNOWN: u64 = 0;
const UNUSABLE: u64 = u64::MAX;
/// Counter ticks per nanosecond, << 32; [`UNKNOWN`] or [`UNUSABLE`].
static RATE: AtomicU64 = AtomicU64::new(UNKNOWN);
/// The anchor pair: counter, and nanoseconds since [`base`] + 1 (0: none yet).
static ANCHOR_TICKS: AtomicU64 = AtomicU64::new(0);
static ANCHOR_NS: AtomicU64 = AtomicU64::new(0);

fn base() -> Instant {
    static B: OnceLock<Instant> = OnceLock::new();
    *B.get_or_init(Instant::now)
}

/// The rate from two (ticks, ns) pairs, if it is plausible: ticks per ns << 32.
pub fn rate_from(t0: u64, ns0: u64, t1: u64, ns1: u64) -> Option<u64> {
    let dt = t1.checked_sub(t0)?;
    let dns = ns1.checked_sub(ns0).filter(|&d| d > 0)?;
    let r = ((u128::from(dt) << 32) / u128::from(dns)) as u64;
    // 0.05 to 20 ticks per nanosecond
    ((1u64 << 32) / 20..=20u64 << 32).contains(&r).then_some(r)
}

/// A spin's clock, chosen at its start.
#[derive(Clone, Copy, Debug)]
pub enum Clock {
    /// The time-stamp counter at this rate (ticks per ns << 32).
    Counter(u64),
    /// Nanoseconds of the monotonic clock (each read also feeds the calibration).
    Mono,
}

impl Clock {
    /// The counter if it is calibrated, else the monotonic clock.
    pub fn pick() -> Clock {
        match RATE.load(Relaxed) {
            UNKNOWN | UNUSABLE => Clock::Mono,
            r => Clock::Counter(r),
        }
    }

    /// Now, in this clock's units.
    #[inline]
    pub fn now(self) -> u64 {
        match (self, crate::sys::cycles()) {
            (Clock::Counter(_), Some(t)) => t,
            _ => mono_now(),
        }
    }

    /// Turns of a busy loop per read of this clock: 1 for the counter (one instruction),
    /// `mono_turns` for the monotonic clock (a read may be a system call that costs more than
    /// the rest of a turn).
    pub fn turns_per_read(self, mono_turns: u32) -> u32 {
        match self {
            Clock::Counter(_) => 1,
            Clock::Mono => mono_turns,
        }
    }

    /// `d` in this clock's units.
    pub fn span(self, d: Duration) -> u64 {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        match self {
            Clock::Counter(r) => {
                u64::try_from((u128::from(ns) * u128::from(r)) >> 32).unwrap_or(u64::MAX)
            }
            Clock::Mono => ns,
        }
    }
}

/// Monotonic-clock reads are made only every this many calls of a loop that checks a time on
/// every turn ([`Periodic::due`]; the native stream's spin): a read may cost more than the
/// rest of the turn. The counter is read on every call.
pub const MONO_EVERY: u32 = 16;

/// Something to do every `period`, asked about on every turn of a busy loop: the counter is
/// read on each call once it is calibrated, the monotonic clock every [`MONO_EVERY`]th call
/// before (so it is due up to that many calls late).
#[derive(Debug, Clone)]
pub struct Periodic {
    period: Duration,
    /// When it is next due, and whether in counter ticks (else nanoseconds); `None`: at once.
    next: Option<(bool, u64)>,
    calls: u32,
}

impl Periodic {
    /// Due on the first call, then every `period`.
    pub fn new(period: Duration) -> Periodic {
        Periodic {
            period,
            next: None,
            calls: 0,
        }
    }

    /// Makes the next [`due`](Self::due) return true.
    pub fn now(&mut self) {
        self.next = None;
    }

    /// Whether `period` passed since it was last due (then it counts from now). A counter
    /// that went backwards by more than a period (another CPU's) makes it due.
    pub fn due(&mut self) -> bool {
        let clock = Clock::pick();
        let counter = matches!(clock, Clock::Counter(_));
        self.calls += 1;
        if self.next.is_some() && self.calls < clock.turns_per_read(MONO_EVERY) {
            return false;
        }
        self.calls = 0;
        let now = clock.now();
        let span = clock.span(self.period);
        match self.next {
            Some((c, next)) if c == counter && now < next && next - now <= span => false,
            _ => {
                self.next = Some((counter, now.saturating_add(span)));
                true
            }
        }
    }
}

/// Nanoseconds since [`base`], and a calibration step while the rate is unknown.
fn mono_now() -> u64 {
    let Some(t0) = crate::sys::cycles().filter(|_| RATE.load(Relaxed) == UNKNOWN) else {
        return base().elapsed().as_nanos() as u64;
    };
    let ns = base().elapsed().as_nanos() as u64;
    if let Some(t1) = crate::sys::cycles() {
        if t1.wrapping_sub(t0) <= PAIR_SLACK {
            calibrate(t0, ns);
        }
    }
    ns
}

fn calibrate(t: u64, ns: u64) {
    let a_ns = ANCHOR_NS.load(Relaxed);
    if a_ns == 0 {
        // (two threads racing here: one anchor wins, the other's pair is dropped)
        if ANCHOR_NS
            .compare_exchange(0, ns + 1, Relaxed, Relaxed)
            .is_ok()
        {
            ANCHOR_TICKS.store(t, Relaxed);
        }
        return;
    }
    let a_t = ANCHOR_TICKS.load(Relaxed);
    if a_t == 0 || ns + 1 < a_ns + CALIBRATE.as_nanos() as u64 {
        return; // (the anchor's counter not stored yet, or too soon)
    }
    let r = rate_from(a_t, a_ns - 1, t, ns).unwrap_or(UNUSABLE);
    let _ = RATE.compare_exchange(UNKNOWN, r, Relaxed, Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The learned rate: `Some(ticks per ns)` once calibrated.
    fn rate() -> Option<f64> {
        match RATE.load(Relaxed) {
            UNKNOWN | UNUSABLE => None,
            r => Some(r as f64 / (1u64 << 32) as f64),
        }
    }

    #[test]
    fn rates() {
        // 3 GHz over 20 ms
        let r = rate_from(1_000, 0, 1_000 + 60_000_000, 20_000_000).unwrap();
        assert_eq!(r, 3 << 32);
        assert_eq!(Clock::Counter(r).span(Duration::from_micros(40)), 120_000);
        assert_eq!(Clock::Mono.span(Duration::from_micros(40)), 40_000);
        // backwards, no time, implausible
        assert_eq!(rate_from(10, 0, 5, 20_000_000), None);
        assert_eq!(rate_from(0, 5, 100, 5), None);
        assert_eq!(rate_from(0, 0, 100, 20_000_000), None);
        assert_eq!(rate_from(0, 0, 1 << 40, 20_000_000), None);
    }

    #[test]
    fn periodic() {
        let mut p = Periodic::new(Duration::from_millis(30));
        assert!(p.due(), "due on the first call");
        let start = Instant::now();
        let mut seen = 0;
        // (whichever clock: the counter may calibrate meanwhile, which makes it due once)
        while start.elapsed() < Duration::from_millis(100) {
            if p.due() {
                seen += 1;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            (1..=5).contains(&seen),
            "due {seen} times in 100 ms of a 30 ms period"
        );
        p.now();
        assert!(p.due(), "due at once after now()");
        assert!(!p.due(), "not again before its period");
    }

    #[test]
    fn calibrates_from_spins_reads() {
        // (the process-wide state: this test owns it in this binary)
        let start = Instant::now();
        while rate().is_none() && start.elapsed() < Duration::from_secs(2) {
            let _ = Clock::pick().now();
            std::thread::sleep(Duration::from_millis(5));
        }
        if crate::sys::cycles().is_none() {
            assert_eq!(rate(), None);
            return;
        }
        let r = rate().expect("calibrated within 2 s");
        // the counter and the clock agree over 50 ms within 2 %
        let c = Clock::pick();
        let (t0, i0) = (c.now(), Instant::now());
        std::thread::sleep(Duration::from_millis(50));
        let (t1, ns) = (c.now(), i0.elapsed().as_nanos() as f64);
        let measured = (t1 - t0) as f64 / ns;
        assert!(
            (measured / r - 1.0).abs() < 0.02,
            "rate {r}, measured {measured}"
        );
    }
}
