//! The spin loop: a blocked call's busy-poll before it sleeps, as its [`SpinGate`] admits it
//! (the gate and the judge of gaps are in the parent module; this is the part that runs on
//! the application's thread, reads the clocks and the context switches, and holds signals
//! back while it spins). Used by the data calls (`upgrade::data`) and by the waits of poll,
//! select and epoll (`upgrade::ready`, `hooks::up`).

use super::{GapJudge, SpinEnd, SpinGate};
use crate::net;
use crate::outcome::Errno;
use crate::signals::SignalsHeld;
use crate::stats::{self, Wait};
use rdmashim_core::tick;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// How many times one of the shim's own threads (the engine, the setup thread) woke up. A
/// spinning application thread that finds a gap in its clock reads (it lost its CPU) and sees
/// this moved meanwhile takes the gap for the shim's own housekeeping (the engine wakes now and
/// then while a CQ is unarmed, [`crate::cadence`], and preempts a spinner on its CPU), not for a
/// peer sharing its CPU: it spins on.
pub(crate) static INTERNAL_WAKES: AtomicU64 = AtomicU64::new(0);

/// The longest a blocked data call busy-polls before it sleeps (`RDMASHIM_SPIN_US`, default
/// 500; 0 never spins). Whether a given wait spins at all is each connection's
/// [`SpinGate`]'s call: it stops spinning where spins do not pay (a CPU shared
/// with the peer, answers slower than this), so a long limit costs little where it does not
/// help. A spin that loses its CPU ends at once (it was keeping the CPU from whoever runs
/// there, maybe the kernel's soft-RoCE work its answer needs).
///
/// Measured in the VM (soft-RoCE, one CPU per end, sockbench ping-pong), one-way latency:
/// 64 B 134 µs without a spin, 22 µs with any limit from 20 µs up; 4 KiB 253 µs without,
/// 300 at 150 µs (most spins missed, so the gate stopped them), 122 at 400 and 1000;
/// 16 KiB 703 µs at 400, 613 at 1000. Both ends on one CPU: the gates stop spinning within
/// a few waits (64 B 159 µs, as without a spin).
pub(crate) fn limit() -> Duration {
    static SPIN: OnceLock<Duration> = OnceLock::new();
    *SPIN.get_or_init(|| Duration::from_micros(crate::config::get().spin_us))
}

/// A gap this long between two clock reads of a spinning thread may mean it lost its CPU to
/// someone else meanwhile (one idle turn of the loop takes well under a microsecond on
/// hardware, a few under qemu TCG); [`GapJudge`] decides from its context switches.
const PREEMPTED_GAP: Duration = Duration::from_micros(40);

/// A spinning thread reads the monotonic clock (for its time limit and [`PREEMPTED_GAP`])
/// every this many turns, and when it finds what it waits for; the calibrated time-stamp
/// counter ([`tick`]), one instruction, every turn.
const CLOCK_EVERY: u32 = 4;

/// A gap at least this long can only be another thread's time slice (the scheduler gives a
/// runnable thread 0.75 ms or more) or a hypervisor's steal: nothing of the spin's own (a post
/// that under emulation runs the peer's side inside the system call, a timer tick's work) lasts
/// that long. See [`GapJudge`].
const SLICE_GAP: Duration = Duration::from_millis(1);

/// This thread's count of involuntary context switches now (`None`: the kernel does not
/// tell), and whether it moved since the thread last asked (or this is its first question):
/// asked when a spinning thread sees a gap of over [`PREEMPTED_GAP`] between its clock reads,
/// not at every spin's start (a getrusage there cost 64 B ping-pong 3 µs of its 19).
fn involuntary_switches() -> (Option<u64>, bool) {
    thread_local! {
        static SEEN: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
    }
    let now = net::involuntary_switches();
    let before = SEEN.with(|s| s.replace(now));
    (now, now.is_none() || before != now)
}

/// How many of this process's threads spin at once, at most: half the CPUs it may run on
/// (at least one). A spinner holds its CPU as a runnable thread would; more spinners than the
/// CPUs can hold keep the very threads they wait for (the peer of the same host, the
/// connections' other threads, the engine) off them, and a latency-bound connection's thread,
/// once woken, waits behind them for a CPU. Measured on a 2-CPU host (shared-memory rings,
/// sockbench `multi`: K busy connections and a 64 B ping-pong among them), unbounded against
/// one spinner: 10 sending, the slowest connection's rate over the fastest's 0.23 → 0.78 and
/// the ping-pong's p99 4.4 ms → 0.36 ms; 100 sending, 0.17 → 0.63, 5.7 → 2.2 ms and the
/// aggregate 77 → 88 Gbit/s; 100 both ways, 0.09 → 0.29; one ping-pong alone unchanged
/// (1.0–1.2 µs one way).
fn spinners_max() -> u32 {
    static N: OnceLock<u32> = OnceLock::new();
    *N.get_or_init(|| {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        u32::try_from(cpus / 2).unwrap_or(u32::MAX).max(1)
    })
}

/// This process's spinning threads ([`spinners_max`]).
static SPINNERS: AtomicU32 = AtomicU32::new(0);

/// A spinner's place among [`SPINNERS`], given back when it is dropped.
struct SpinSlot;

impl SpinSlot {
    fn take() -> Option<SpinSlot> {
        let max = spinners_max();
        SPINNERS
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| SpinSlot)
    }
}

impl Drop for SpinSlot {
    fn drop(&mut self) {
        SPINNERS.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One look of a spinning wait ([`spin_wait`]).
pub(crate) enum Turn<T> {
    /// Nothing yet: look again.
    Again,
    /// What the wait was for: the spin ends as a hit.
    Found(T),
    /// The wait is over for another reason (the connection left its link, the call failed):
    /// the spin ends and the gate learns nothing.
    Leave(T),
}

/// Busy-waits for at most the spin time ([`limit`]), if `gate` lets it: calls `turn`
/// until it returns something other than [`Turn::Again`], and returns that (`None`: the spin
/// did not start, ran out or lost its CPU). Tells `gate` and the stats (by `tally`) how the
/// spin ended.
pub(crate) fn spin_wait<T>(
    gate: &SpinGate,
    tally: stats::Tally,
    mut turn: impl FnMut() -> Turn<T>,
) -> Option<T> {
    // (taken whether this wait spins or not: it says what this thread's last send did)
    let woke_peer = rdmashim_core::shm::take_woke_peer();
    let spin = limit();
    if spin.is_zero() {
        return None;
    }
    let spin = gate.admit().limit(spin);
    if spin.is_zero() {
        return None;
    }
    let Some(_slot) = SpinSlot::take() else {
        tally.count_wait(Wait::SpinCrowded);
        return None;
    };
    if woke_peer {
        // This thread's last send woke a sleeping peer of this host, which the kernel may
        // have queued on this CPU: it runs now rather than after the spin. (An echo on one
        // of a thousand idle shared-memory connections: 0.6 ms at the median, the peer's
        // thread waiting out a 500 µs spin beside an idle CPU; scripts/bench-scale --local.)
        net::yield_cpu();
    }
    // The clock is read only once there is something to spin on (before, nothing can change
    // without a system call, and a clock read may be one). A counter that went backwards
    // (another CPU's) reads as a gap.
    let clock = tick::Clock::pick();
    let gap = clock.span(PREEMPTED_GAP);
    let slice = clock.span(SLICE_GAP);
    let every = clock.turns_per_read(CLOCK_EVERY);
    let mut end = None;
    let mut last: Option<u64> = None;
    let mut internal = INTERNAL_WAKES.load(Ordering::Relaxed);
    let mut judge = GapJudge::new();
    // (a gap during which the shim's own threads woke was theirs: see INTERNAL_WAKES)
    let mut off_cpu = |last: Option<u64>, now: u64| {
        let before = std::mem::replace(&mut internal, INTERNAL_WAKES.load(Ordering::Relaxed));
        let Some(span) = last.map(|l| now.wrapping_sub(l)) else {
            return false;
        };
        span > gap && internal == before && {
            let (switches, moved) = involuntary_switches();
            judge.preempted(switches, moved, span >= slice)
        }
    };
    let end_with = |e: SpinEnd| {
        gate.record(e);
        tally.count_wait(match e {
            SpinEnd::Hit => Wait::SpinHit,
            SpinEnd::Miss => Wait::SpinMiss,
            SpinEnd::Preempted => Wait::SpinPreempted,
        });
    };
    let mut n = 0u32;
    loop {
        match turn() {
            Turn::Again => {}
            Turn::Leave(v) => return Some(v),
            // (found at the first look: it was there before the spin began — typically
            // because the peer ran on this CPU during the call that came before, a send whose
            // wake-up handed it the CPU — so the spin neither paid nor cost, and the gate
            // learns nothing: counted a hit, such finds kept a CPU shared with the peer
            // spinning, each miss then burning the whole spin time the peer needed)
            Turn::Found(v) if last.is_none() => return Some(v),
            Turn::Found(v) => {
                // (a thread that lost its CPU meanwhile may find the answer only because
                // whoever ran instead produced it: that spin did not pay)
                end_with(if off_cpu(last, clock.now()) {
                    SpinEnd::Preempted
                } else {
                    SpinEnd::Hit
                });
                return Some(v);
            }
        }
        // (the monotonic clock every few turns: a read may cost as much as the rest of a
        // turn; the counter every turn)
        n = n.wrapping_add(1);
        if last.is_some() && !n.is_multiple_of(every) {
            std::hint::spin_loop();
            continue;
        }
        let now = clock.now();
        if off_cpu(last, now) {
            end_with(SpinEnd::Preempted);
            return None;
        }
        if now >= *end.get_or_insert(now.saturating_add(clock.span(spin))) {
            end_with(SpinEnd::Miss);
            return None;
        }
        last = Some(now);
        std::hint::spin_loop();
    }
}

/// [`spin_wait`] in place of a wait that a signal interrupts and that is never restarted
/// (epoll_wait, poll, select): the asynchronous signals are held back while it spins
/// ([`SignalsHeld`]), since a handler run between two of its looks would go
/// unseen. `Err(EINTR)` if the spin found nothing and one arrived that the thread's mask lets
/// through and that is not ignored, as the wait would have failed; `own_mask` is false for a
/// call with a signal mask of its own (epoll_pwait, ppoll, pselect), whose real wait after
/// the spin applies that mask and delivers such a signal.
///
/// If the spin found nothing and the call waits under the thread's own mask, the signals are
/// still held when this returns them: the caller's wait must apply [`SignalsHeld::mask`]
/// (ppoll's or epoll_pwait's mask, set with the sleep in one step), then release them. A
/// signal that arrives after the spin's last look then interrupts that wait; were they
/// released first, its handler would run in between, unseen, and the wait would sleep on.
pub(crate) fn spin_wait_interruptible<T>(
    gate: &SpinGate,
    tally: stats::Tally,
    own_mask: bool,
    turn: impl FnMut() -> Turn<T>,
) -> (Result<Option<T>, Errno>, Option<SignalsHeld>) {
    let held = SignalsHeld::hold();
    let found = spin_wait(gate, tally, turn);
    if found.is_some() || !own_mask {
        if let Some(h) = held {
            h.release();
        }
        return (Ok(found), None);
    }
    match held {
        Some(h) if h.interrupted() => {
            h.release();
            (Err(Errno(libc::EINTR)), None)
        }
        h => (Ok(None), h),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_more_spinners_than_half_the_cpus() {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let max = spinners_max();
        assert_eq!(max as usize, (cpus / 2).max(1));
        let slots: Vec<SpinSlot> = (0..max).map(|_| SpinSlot::take().expect("room")).collect();
        assert!(SpinSlot::take().is_none(), "one spinner past the bound");
        // (a wait that would spin sleeps at once: it never looks)
        let gate = SpinGate::new();
        let crowded = || stats::Snapshot::take(0).waits[Wait::SpinCrowded as usize];
        let before = crowded();
        let found = spin_wait(&gate, stats::Tally::at(0), || -> Turn<()> {
            panic!("a crowded wait looked")
        });
        assert!(found.is_none());
        assert!(crowded() > before);
        drop(slots);
        let again = SpinSlot::take();
        assert!(again.is_some(), "a slot given back is free again");
    }
}
