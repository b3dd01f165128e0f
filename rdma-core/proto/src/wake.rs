//! The wake-up of a reader that stops polling, for the polled kind (protocol §14): its records
//! make no completion, so a reader asleep on its completion channel must be told to wake by
//! one that does. Neither end spends anything on it while the reader polls.
//!
//! - The reader, having found nothing at its read position `seen` (a ring cursor), goes to
//!   sleep: it sends a [`Notice`] (a control message, which takes a receive at the writer and
//!   so reaches a writer that sleeps itself), then waits on its completion channel.
//! - The writer, when the notice arrives, compares it with what it has posted: past `seen`,
//!   the bytes may have landed after the reader's last look, so it rings at once (a zero-length
//!   WRITE WITH IMMEDIATE); else its next record goes with an immediate, whose completion wakes
//!   the reader. A notice is good for one wake-up; a reader that sleeps again sends another.
//!
//! Every record posted before the notice arrived is behind the cursor the writer compares, and
//! the first posted after it carries the wake-up; the writer's WRITEs reach the reader in the
//! order they were posted, so the ring or the doorbell it woke for holds every byte. A late
//! wake-up (of an earlier notice) only makes a reader look once more and sleep again.
//!
//! Only a wake-up (a record with an immediate, a doorbell) ends a notice. Another completion
//! (a credit, a control message) wakes the reader's thread too, but the writer still owes the
//! wake-up the notice asked for, so the reader sleeps again without a new notice: if it sent
//! one, that notice would wake the peer's own sleeping reader, whose new notice would wake
//! this one, and two idle peers would trade notices for ever.
//! `tests/wake_model.rs` checks this against every interleaving of a small model.

/// The reader's word that it sleeps, having read the ring up to `seen`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Notice {
    /// The reader's ring cursor when it found nothing more.
    pub seen: u64,
}

/// What the writer does about the reader's sleep.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct WriterWake {
    /// A notice came and nothing was posted past it since: the next record wakes.
    armed: bool,
    /// Doorbells rung and records posted with a wake-up (for the stats).
    wakes: u64,
}

/// What [`WriterWake::on_notice`] asks of the writer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnNotice {
    /// Post a zero-length WRITE WITH IMMEDIATE now: bytes past the reader's cursor are posted.
    Ring,
    /// Nothing now; the next record carries the wake-up.
    Armed,
}

impl WriterWake {
    /// The reader's notice arrived; the writer has posted records up to ring cursor `posted`.
    pub fn on_notice(&mut self, n: Notice, posted: u64) -> OnNotice {
        if posted > n.seen {
            self.armed = false;
            self.wakes += 1;
            OnNotice::Ring
        } else {
            self.armed = true;
            OnNotice::Armed
        }
    }

    /// The writer posts a record: whether it goes as a WRITE WITH IMMEDIATE (a wake-up).
    pub fn on_post(&mut self) -> bool {
        let wake = std::mem::take(&mut self.armed);
        self.wakes += u64::from(wake);
        wake
    }

    /// Whether the next record carries a wake-up.
    pub fn armed(&self) -> bool {
        self.armed
    }

    /// Wake-ups sent so far (doorbells and records with an immediate).
    pub fn wakes(&self) -> u64 {
        self.wakes
    }
}

/// What the reader knows of its own sleep.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ReaderWake {
    /// Its notice is out, and no wake-up came since.
    asleep: bool,
    /// Notices sent so far (for the stats).
    notices: u64,
}

impl ReaderWake {
    /// The reader found nothing at ring cursor `seen` and goes to sleep: send this notice,
    /// then wait on the completion channel. `None`: it already sleeps (its notice is out).
    pub fn sleep(&mut self, seen: u64) -> Option<Notice> {
        if self.asleep {
            return None;
        }
        self.asleep = true;
        self.notices += 1;
        Some(Notice { seen })
    }

    /// A wake-up came (a doorbell, or a record with an immediate): the reader polls again,
    /// and must send a new notice before it sleeps again. (Other completions leave the notice
    /// out: see the module's docs.)
    pub fn woken(&mut self) {
        self.asleep = false;
    }

    /// Whether the reader sleeps (its notice sent, no completion since).
    pub fn asleep(&self) -> bool {
        self.asleep
    }

    /// Notices sent so far.
    pub fn notices(&self) -> u64 {
        self.notices
    }
}
