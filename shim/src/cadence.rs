//! How often the engine looks at the CQs that application threads left unarmed.
//!
//! A thread that woke from a sleep on a connection's completion channel leaves the CQ unarmed
//! and goes on polling it itself (`upgrade::Conn::on_wake`); the engine arms it again once the
//! connection's data calls stopped moving for [`BASE`] — the application went on to something
//! else, and the peer's data and credits must raise events again. Finding that out takes a
//! look, and a look is a wake-up of the engine thread: on a process pinned to one CPU it
//! preempts the very thread that keeps the connection busy (a ping-pong that spins without
//! ever sleeping again keeps its CQ unarmed for good, and the engine looked every 10 ms at a
//! connection it had nothing to do for: 64 B p99 98–118 µs in the VM, against 78–87 µs with
//! those looks a second apart, the median unchanged; with the back-off below, 110–146 →
//! 89–112 µs over eight alternating rounds, the engine's wake-ups 143–195 → 20–34 in 2 s).
//!
//! So the looks back off while they find nothing to do: each look that finds the connections
//! left unarmed still in use doubles the time to the next, up to [`BUSY_MAX`]; a look that
//! armed one (an application stopped calling: its pattern changed), or that found one in use
//! whose readiness another wait may be watching (an epoll set, a poll-family call: such a wait
//! may have begun before the CQ was left unarmed), brings it back to [`BASE`]. A thread that
//! leaves a CQ unarmed makes sure the engine looks within the current interval
//! (`upgrade::UNARMED_CADENCE`), not sooner: a blocking ping-pong leaves its CQ unarmed at
//! every wake-up, and a wake-up of the engine per message is what leaving it unarmed saves. A
//! connection whose application stopped calling is armed within [`BUSY_MAX`] plus [`BASE`] at
//! worst — and only where nothing else arms it first: a blocking call arms before it sleeps,
//! and `poll`/`select`/`epoll_wait` arm the sets they wait on.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::Duration;

/// The looks' first interval, and theirs again after one armed a CQ; also how long a CQ stays
/// unarmed without data calls before the engine arms it.
pub const BASE: Duration = Duration::from_millis(10);

/// The longest interval between two looks that find every unarmed connection still in use.
pub const BUSY_MAX: Duration = Duration::from_millis(160);

/// What one look at the connections left unarmed found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Look {
    /// Connections unarmed for [`BASE`] or more whose data calls moved since the last look.
    pub busy: usize,
    /// Such connections whose readiness a thread may be waiting on besides (in an epoll set, a
    /// poll-family call): that wait may have begun before the CQ was left unarmed, and learns of
    /// the next completion only once it is armed again — their looks stay at [`BASE`].
    pub watched: usize,
    /// Connections it armed (unarmed for [`BASE`] or more, and idle).
    pub armed: usize,
}

/// The engine's cadence of looks at unarmed CQs: set by the engine after each look, read by
/// the threads that leave a CQ unarmed (one shared value, in milliseconds; a `static`).
#[derive(Debug)]
pub struct Cadence {
    every_ms: AtomicU64,
}

impl Default for Cadence {
    fn default() -> Self {
        Cadence::new()
    }
}

impl Cadence {
    pub const fn new() -> Cadence {
        Cadence {
            every_ms: AtomicU64::new(BASE.as_millis() as u64),
        }
    }

    /// How long after this look the next one comes.
    pub fn every(&self) -> Duration {
        Duration::from_millis(self.every_ms.load(SeqCst))
    }

    /// Back to [`BASE`] (a fork child's engine starts afresh).
    pub fn reset(&self) {
        self.every_ms.store(BASE.as_millis() as u64, SeqCst);
    }

    /// What a look found: it armed one (the application's pattern changed: looks at [`BASE`]
    /// again) or found one in use whose readiness is watched (at [`BASE`] too), or found every
    /// connection it could judge still in use (twice as long to the next look, up to
    /// [`BUSY_MAX`]); a look with nothing to judge (every unarmed CQ newer than [`BASE`], or
    /// its connection's lock taken) changes nothing. (The engine is its only writer.)
    pub fn looked(&self, look: Look) {
        if look.armed > 0 || look.watched > 0 {
            self.reset();
        } else if look.busy > 0 {
            let next = (self.every() * 2).min(BUSY_MAX);
            self.every_ms.store(next.as_millis() as u64, SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn busy() -> Look {
        Look {
            busy: 1,
            ..Look::default()
        }
    }

    #[test]
    fn looks_at_a_connection_that_stays_busy_back_off_to_the_cap() {
        let c = Cadence::new();
        let mut seen = vec![c.every()];
        for _ in 0..8 {
            c.looked(busy());
            seen.push(c.every());
        }
        let ms: Vec<u128> = seen.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [10, 20, 40, 80, 160, 160, 160, 160, 160]);
    }

    #[test]
    fn a_look_that_armed_a_cq_comes_back_at_the_base() {
        let c = Cadence::new();
        c.looked(busy());
        c.looked(busy());
        assert_eq!(c.every(), Duration::from_millis(40));
        c.looked(Look {
            busy: 3,
            armed: 1,
            ..Look::default()
        });
        assert_eq!(c.every(), BASE);
    }

    #[test]
    fn a_connection_whose_readiness_is_watched_keeps_the_looks_at_the_base() {
        let c = Cadence::new();
        c.looked(busy());
        c.looked(busy());
        c.looked(Look {
            busy: 5,
            watched: 1,
            armed: 0,
        });
        assert_eq!(c.every(), BASE);
        c.looked(Look {
            watched: 1,
            ..Look::default()
        });
        assert_eq!(c.every(), BASE);
    }

    #[test]
    fn a_look_with_nothing_to_judge_keeps_the_cadence() {
        let c = Cadence::new();
        c.looked(busy());
        c.looked(Look::default());
        assert_eq!(c.every(), Duration::from_millis(20));
    }

    #[test]
    fn the_back_off_survives_a_cq_left_unarmed_anew() {
        // (a blocking ping-pong, or a spinning one whose spin sometimes runs out: the
        // connection is left unarmed anew at each wake-up and stays in use; only a look that
        // arms something resets the interval)
        let c = Cadence::new();
        for _ in 0..6 {
            c.looked(busy());
        }
        assert_eq!(c.every(), BUSY_MAX);
        c.looked(Look::default());
        assert_eq!(c.every(), BUSY_MAX);
    }
}
