//! Whether a blocked data call busy-polls before it sleeps: an adaptive gate per connection.
//!
//! Spinning pays when the answer comes from another CPU (a peer on its own core, a NIC) within
//! the spin time: the call returns without a sleep and a wake-up. It costs when it does not:
//! the spin time is burnt for nothing, and on a CPU shared with the peer (or with the kernel's
//! soft-RoCE work) the spin delays the very answer it waits for — the peer only runs once the
//! scheduler preempts the spinner. A process's CPU affinity does not tell the two cases apart
//! (a process pinned to a core of its own is the classic low-latency set-up), so each
//! connection learns from its own spins:
//!
//! - a *hit* (the data or the room arrived while spinning) raises the score by one;
//! - a *miss* (the spin time ran out) lowers it by [`MISS_COST`], a *preempted* spin (the
//!   spinning thread lost its CPU to someone else — a gap in its clock reads) by
//!   [`PREEMPT_COST`]: break-even is about two hits per miss;
//! - at score 0 the connection stops spinning, except for a probe every
//!   `PROBE_BASE << backoff` waits; a probe that hits resumes spinning, one that fails doubles
//!   the interval (up to `PROBE_BASE << BACKOFF_MAX` waits). A probe spins for
//!   1/[`PROBE_SHARE`] of the spin time: it asks whether answers come within a spin again,
//!   and those that make spinning pay come within tens of microseconds, while on a CPU shared
//!   with the peer every probe burns all of its time (full-limit probes cost redis with both
//!   ends on one CPU 5–7% of its throughput in hand runs: 0.98× loopback TCP against
//!   1.04–1.05× with a quarter);
//! - a wait whose first look finds what it waits for did not spin: the gate learns nothing
//!   (see `wait::spin_wait`).
//!
//! The transitions are pure functions of a small state ([`State`]) kept packed in one atomic
//! word, so concurrent threads on one connection update it without a lock (a lost race only
//! skews the heuristic by one step).
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

#[cfg(not(test))]
pub(crate) mod wait;

/// How a spin ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpinEnd {
    /// What the call waited for arrived while it spun (and it kept its CPU).
    Hit,
    /// The spin time ran out.
    Miss,
    /// The spinning thread was off its CPU for a while (another thread ran there).
    Preempted,
}

/// The score a connection starts with (it spins until its spins prove useless).
pub const SCORE_MAX: u32 = 8;
/// The score after a successful probe.
pub const SCORE_RESUME: u32 = 4;
/// What a miss costs.
pub const MISS_COST: u32 = 2;
/// What a preempted spin costs.
pub const PREEMPT_COST: u32 = 4;
/// Waits between probes after the score reached 0: `PROBE_BASE << backoff`.
pub const PROBE_BASE: u32 = 4;
/// The largest backoff exponent (a probe every 1024 waits).
pub const BACKOFF_MAX: u32 = 8;
/// A probe spins for the spin time divided by this.
pub const PROBE_SHARE: u32 = 4;

/// Whether a wait spins ([`SpinGate::admit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// It sleeps at once.
    No,
    /// It spins for the spin time.
    Spin,
    /// It probes: a spin of 1/[`PROBE_SHARE`] of the spin time, after which the gate decides
    /// whether spinning resumes.
    Probe,
}

impl Admit {
    /// Whether the wait spins at all.
    pub fn spins(self) -> bool {
        self != Admit::No
    }

    /// How long it spins at most, for a spin time of `full`.
    pub fn limit(self, full: std::time::Duration) -> std::time::Duration {
        match self {
            Admit::No => std::time::Duration::ZERO,
            Admit::Spin => full,
            Admit::Probe => full / PROBE_SHARE,
        }
    }
}

/// The gate's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct State {
    /// 0..=SCORE_MAX; the connection spins while it is above 0.
    pub score: u32,
    /// 0..=BACKOFF_MAX: failed probes in a row.
    pub backoff: u32,
    /// Waits left before the next probe (while score is 0).
    pub countdown: u32,
}

impl State {
    pub const INITIAL: State = State {
        score: SCORE_MAX,
        backoff: 0,
        countdown: 0,
    };

    const fn pack(self) -> u32 {
        (self.score & 0xf) | (self.backoff & 0xf) << 4 | self.countdown << 8
    }

    fn unpack(w: u32) -> State {
        State {
            score: w & 0xf,
            backoff: (w >> 4) & 0xf,
            countdown: w >> 8,
        }
    }

    /// Whether the next wait spins, and the state after that decision.
    pub fn admit(self) -> (Admit, State) {
        if self.score > 0 {
            (Admit::Spin, self)
        } else if self.countdown == 0 {
            (Admit::Probe, self)
        } else {
            (
                Admit::No,
                State {
                    countdown: self.countdown - 1,
                    ..self
                },
            )
        }
    }

    /// The state after a spin that ended in `end`.
    pub fn record(self, end: SpinEnd) -> State {
        let cost = match end {
            SpinEnd::Hit if self.score == 0 => {
                return State {
                    score: SCORE_RESUME,
                    backoff: 0,
                    countdown: 0,
                }
            }
            SpinEnd::Hit => {
                return State {
                    score: (self.score + 1).min(SCORE_MAX),
                    backoff: 0,
                    ..self
                }
            }
            SpinEnd::Miss => MISS_COST,
            SpinEnd::Preempted => PREEMPT_COST,
        };
        if self.score == 0 {
            // a failed probe: wait twice as long for the next one
            let backoff = (self.backoff + 1).min(BACKOFF_MAX);
            return State {
                score: 0,
                backoff,
                countdown: PROBE_BASE << backoff,
            };
        }
        let score = self.score.saturating_sub(cost);
        State {
            score,
            countdown: if score == 0 {
                PROBE_BASE << self.backoff
            } else {
                0
            },
            ..self
        }
    }
}

/// A connection's spin gate.
pub struct SpinGate(AtomicU32);

impl Default for SpinGate {
    fn default() -> Self {
        SpinGate::new()
    }
}

impl SpinGate {
    /// A gate in its initial state (usable in a `static`).
    pub const fn new() -> Self {
        SpinGate(AtomicU32::new(State::INITIAL.pack()))
    }

    /// Back to the initial state (the gate's owner was replaced, e.g. an fd number reused).
    pub fn reset(&self) {
        self.0.store(State::INITIAL.pack(), Relaxed);
    }

    /// Whether this wait should spin (counts a wait towards the next probe if not).
    pub fn admit(&self) -> Admit {
        let mut spin = Admit::No;
        let _ = self.0.fetch_update(Relaxed, Relaxed, |w| {
            let (s, next) = State::unpack(w).admit();
            spin = s;
            Some(next.pack())
        });
        spin
    }

    /// Learns from a spin that ended in `end`.
    pub fn record(&self, end: SpinEnd) {
        let _ = self.0.fetch_update(Relaxed, Relaxed, |w| {
            Some(State::unpack(w).record(end).pack())
        });
    }

    #[cfg(test)]
    fn state(&self) -> State {
        State::unpack(self.0.load(Relaxed))
    }
}

/// Whether a gap in a spinning thread's clock reads means it lost its CPU to another thread,
/// judged from the thread's count of involuntary context switches (a system call, so read only
/// at gaps). A gap is also what an interrupt, a hypervisor's steal, or the spin's own work
/// (a turn that posts a work request, a system call that under emulation lasts as long as a
/// message's trip) looks like; and the count's last reading may be old (an earlier spin's), so
/// a switch it shows may have come long before. So within one spin:
///
/// - its first gap takes the count as the spin's baseline and counts as a preemption only if
///   it is at least a scheduler time slice long (`long`: nothing else of ours lasts that
///   long) and the count moved since its last reading (`moved_since_last_look`);
/// - every later gap counts as one if the count moved since the spin's baseline (or the
///   kernel does not tell), and takes the new count as the baseline.
///
/// A thread that shares its CPU with the peer it waits for is switched out at every turn of
/// that peer, so its spins still end as preempted, one gap later at most.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GapJudge {
    /// The count at this spin's last gap (`Some(None)`: the kernel did not tell).
    base: Option<Option<u64>>,
}

impl GapJudge {
    /// A judge for a new spin.
    pub const fn new() -> Self {
        GapJudge { base: None }
    }

    /// Judges a gap: `switches` is the count now (`None`: unknown), `moved_since_last_look`
    /// whether it differs from its last reading before this spin, `long` whether the gap
    /// lasted at least a time slice.
    pub fn preempted(
        &mut self,
        switches: Option<u64>,
        moved_since_last_look: bool,
        long: bool,
    ) -> bool {
        match self.base.replace(switches) {
            None => long && moved_since_last_look,
            Some(base) => switches.is_none() || switches != base,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_first_short_gap_is_the_baseline_not_a_preemption() {
        let mut j = GapJudge::new();
        assert!(!j.preempted(Some(7), true, false));
        // the next gap with no switch since: an interrupt or our own work
        assert!(!j.preempted(Some(7), true, false));
        // one with a switch since the baseline: another thread ran here
        assert!(j.preempted(Some(8), false, false));
        assert!(!j.preempted(Some(8), false, true));
    }

    #[test]
    fn a_first_long_gap_with_a_switch_is_a_preemption() {
        assert!(GapJudge::new().preempted(Some(3), true, true));
        assert!(!GapJudge::new().preempted(Some(3), false, true));
    }

    #[test]
    fn an_unknown_count_is_judged_conservatively_after_the_first_gap() {
        let mut j = GapJudge::new();
        assert!(!j.preempted(None, true, false));
        assert!(j.preempted(None, true, false));
        assert!(j.preempted(Some(1), false, false));
    }

    /// Runs `ends` through a gate: how many of the waits it admitted.
    fn drive(g: &SpinGate, ends: impl IntoIterator<Item = SpinEnd>) -> usize {
        let mut spun = 0;
        for e in ends {
            if g.admit().spins() {
                spun += 1;
                g.record(e);
            }
        }
        spun
    }

    #[test]
    fn hits_keep_it_spinning() {
        let g = SpinGate::default();
        assert_eq!(drive(&g, [SpinEnd::Hit; 1000]), 1000);
        assert_eq!(g.state(), State::INITIAL);
    }

    #[test]
    fn mostly_hits_keep_it_spinning() {
        // one miss in five (break-even is one in three)
        let g = SpinGate::default();
        let ends = (0..1000).map(|i| {
            if i % 5 == 4 {
                SpinEnd::Miss
            } else {
                SpinEnd::Hit
            }
        });
        assert_eq!(drive(&g, ends), 1000);
        assert!(g.state().score > 0);
    }

    #[test]
    fn misses_stop_it_and_probes_back_off() {
        let g = SpinGate::default();
        // 4 misses take the score from 8 to 0
        assert_eq!(drive(&g, [SpinEnd::Miss; 4]), 4);
        assert_eq!(g.state().score, 0);
        // then probes after 4 waits, 8, 16, ... 1024 (2044 waits), then every 1024: about 16
        // spins in 10000 waits
        let spun = drive(&g, std::iter::repeat_n(SpinEnd::Miss, 10_000));
        assert!(
            spun <= 17,
            "{spun} spins in 10000 waits of a hopeless connection"
        );
        assert!(
            spun >= 15,
            "{spun}: probes go on (at most every 1024 waits)"
        );
        assert_eq!(g.state().backoff, BACKOFF_MAX);
    }

    #[test]
    fn a_preemption_costs_more_than_a_miss() {
        let g = SpinGate::default();
        drive(&g, [SpinEnd::Preempted, SpinEnd::Preempted]);
        assert_eq!(g.state().score, 0);
    }

    #[test]
    fn a_successful_probe_resumes() {
        let g = SpinGate::default();
        drive(&g, [SpinEnd::Miss; 64]);
        assert_eq!(g.state().score, 0);
        // the next probe hits: spinning resumes for every wait
        let mut admitted = 0;
        for _ in 0..10_000 {
            let a = g.admit();
            if a.spins() {
                // (the first is a probe, of a share of the spin time; the next a full spin)
                assert_eq!(a == Admit::Probe, admitted == 0);
                g.record(SpinEnd::Hit);
                admitted += 1;
                if admitted > 1 {
                    break;
                }
            }
        }
        assert_eq!(g.state().score, SCORE_RESUME + 1);
        assert_eq!(g.state().backoff, 0);
        assert_eq!(g.admit(), Admit::Spin);
    }

    proptest! {
        #[test]
        fn state_stays_in_range_and_packs(ends in proptest::collection::vec(0u8..3, 0..400)) {
            let mut s = State::INITIAL;
            for e in ends {
                let (_, next) = s.admit();
                s = next;
                s = s.record(match e { 0 => SpinEnd::Hit, 1 => SpinEnd::Miss, _ => SpinEnd::Preempted });
                prop_assert!(s.score <= SCORE_MAX);
                prop_assert!(s.backoff <= BACKOFF_MAX);
                prop_assert!(s.countdown <= PROBE_BASE << BACKOFF_MAX);
                prop_assert_eq!(State::unpack(s.pack()), s);
                // a spinning connection never waits for a probe
                prop_assert!(s.score == 0 || s.countdown == 0);
            }
        }
    }
}
