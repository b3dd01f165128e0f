//! Receive-slot credits and the lazy credit-return policy.
//!
//! Every message a side sends (DATA, CREDIT, or a control SEND) consumes one receive the peer
//! posted. The transport re-posts each receive after it has handed the completion to
//! [`crate::Connection::handle_completion`], at the latest before the credit that returns the
//! slot ([`crate::Action::returns_slots`]), and the receiver returns those slots to the sender
//! in its credits, together with the ring bytes its application consumed.
//!
//! Deadlock freedom rests on two rules (argued in `docs/protocol.md`):
//!
//! 1. **Reserve**: a sender posts DATA or a control SEND only while it holds at least two peer
//!    slots; the last slot is kept for a credit, and a credit may use the last slot only if it
//!    returns at least one slot.
//! 2. **Thresholds**: the slot threshold `T` satisfies `2 <= T <= R - 1` (`R` = receives posted,
//!    at least 4). `T >= 2` stops two credits from answering each other forever (one credit
//!    consumes one slot, below the threshold); `T <= R - 1` guarantees that a sender stuck on its
//!    reserve always gets a credit back.

use crate::imm::Imm;
use crate::ring::RingSize;
use crate::state::Violation;

/// When a receiver returns credit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CreditPolicy {
    /// Return credit once this many consumed bytes are owed.
    pub byte_threshold: u64,
    /// Return credit once this many receive slots are owed.
    pub slot_threshold: u32,
    /// Duplex (protocol §17): a credit waits for a DATA to carry it until this many bytes are
    /// owed (or the peer asks), then it goes as a message of its own: twice the byte
    /// threshold, at most half the ring.
    pub patient_byte_threshold: u64,
    /// Duplex: the same for slots, half-way from the slot threshold to all the receives.
    pub patient_slot_threshold: u32,
}

impl CreditPolicy {
    /// The policy for a local ring of `ring` bytes with `recv_slots` posted receives:
    /// bytes ≥ `ring >> byte_shift` (`byte_shift` clamped to 1..=8, default 2 → ring/4), slots ≥
    /// `slot_threshold` clamped to `2..=min(R-1, 63)` (default `R/2`).
    pub fn new(
        ring: RingSize,
        recv_slots: u16,
        byte_shift: u8,
        slot_threshold: Option<u16>,
    ) -> Self {
        let r = u32::from(recv_slots.max(crate::MIN_RECV_SLOTS));
        let max = (r - 1).min(u32::from(Imm::MAX_CREDIT_SLOTS));
        let want = slot_threshold.map_or(r / 2, u32::from);
        let byte_threshold = ring.bytes() >> byte_shift.clamp(1, 8);
        let slot_threshold = want.clamp(2, max);
        CreditPolicy {
            byte_threshold,
            slot_threshold,
            patient_byte_threshold: (2 * byte_threshold)
                .min(ring.bytes() / 2)
                .max(byte_threshold),
            patient_slot_threshold: (slot_threshold + (r - slot_threshold) / 2)
                .clamp(slot_threshold, max),
        }
    }

    /// Whether credit is due: a threshold is reached, or the sender asked and something is owed.
    /// Never when nothing is owed.
    pub fn due(&self, owed_bytes: u64, owed_slots: u32, peer_wants: bool) -> bool {
        if owed_bytes == 0 && owed_slots == 0 {
            return false;
        }
        peer_wants || owed_bytes >= self.byte_threshold || owed_slots >= self.slot_threshold
    }

    /// Duplex (protocol §17): whether a credit is due as a message of its own — the peer asked
    /// and something is owed, or a patient threshold is reached. Below them it waits for the
    /// next DATA, which carries it (the peer still has half its receives and ring, or more).
    pub fn due_apart(&self, owed_bytes: u64, owed_slots: u32, peer_wants: bool) -> bool {
        if owed_bytes == 0 && owed_slots == 0 {
            return false;
        }
        peer_wants
            || owed_bytes >= self.patient_byte_threshold
            || owed_slots >= self.patient_slot_threshold
    }
}

/// Sender-side view of the peer's posted receives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxSlots {
    avail: u32,
    total: u32,
    /// Messages sent so far (slots taken), and slots the peer returned so far: a peer that
    /// returned `k` slots has received our first `k` messages (it returns only slots of
    /// messages it consumed, and RC delivers in order).
    spent: u64,
    returned: u64,
}

impl TxSlots {
    /// The peer posted `total` receives.
    pub fn new(total: u16) -> Self {
        TxSlots {
            avail: u32::from(total),
            total: u32::from(total),
            spent: 0,
            returned: 0,
        }
    }

    /// Peer receives we may still consume.
    pub fn avail(&self) -> u32 {
        self.avail
    }

    /// A DATA or control SEND may be posted (one slot stays in reserve).
    pub fn can_post_message(&self) -> bool {
        self.avail >= 2
    }

    /// A credit may be posted; `returns_slots` says whether it returns at least one slot.
    pub fn can_post_credit(&self, returns_slots: bool) -> bool {
        self.avail >= 2 || (self.avail == 1 && returns_slots)
    }

    /// Consumes one slot.
    ///
    /// # Panics
    /// If none is left (a bug in this crate's callers of `can_post_*`).
    // (inline on the data path: a call and a return less a message, each return a block
    // lookup under emulation — docs/bench/kinds.md, session 62)
    #[inline(always)]
    pub fn take(&mut self) {
        self.avail = self.avail.checked_sub(1).expect("no receive slot left");
        self.spent += 1;
    }

    /// Messages sent so far.
    pub fn spent(&self) -> u64 {
        self.spent
    }

    /// Slots the peer returned so far.
    pub fn returned(&self) -> u64 {
        self.returned
    }

    /// Whether [`Self::restore`] of `n` would succeed.
    pub fn can_restore(&self, n: u32) -> bool {
        self.avail.saturating_add(n) <= self.total
    }

    /// The peer returned `n` slots.
    pub fn restore(&mut self, n: u32) -> Result<(), Violation> {
        let next = self.avail.saturating_add(n);
        if next > self.total {
            return Err(Violation::SlotCreditOverflow);
        }
        self.avail = next;
        self.returned += u64::from(n);
        Ok(())
    }
}

/// Receiver-side count of consumed (and re-posted) receives not yet returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RxSlots {
    owed: u32,
    posted: u32,
}

impl RxSlots {
    /// We posted `posted` receives.
    pub fn new(posted: u16) -> Self {
        RxSlots {
            owed: 0,
            posted: u32::from(posted),
        }
    }

    /// Slots owed to the peer.
    pub fn owed(&self) -> u32 {
        self.owed
    }

    /// Whether a message may come now: [`Self::on_message`] would succeed.
    pub fn has_room(&self) -> bool {
        self.owed < self.posted
    }

    /// A message arrived (and its receive is re-posted by the transport).
    pub fn on_message(&mut self) -> Result<(), Violation> {
        if self.owed >= self.posted {
            return Err(Violation::SlotOverrun);
        }
        self.owed += 1;
        Ok(())
    }

    /// Marks up to `max` owed slots as returned; returns how many.
    pub fn take(&mut self, max: u32) -> u32 {
        let n = self.owed.min(max);
        self.owed -= n;
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_clamps() {
        let ring = RingSize::new(1 << 16).unwrap();
        let p = CreditPolicy::new(ring, 4, 2, None);
        assert_eq!(p.byte_threshold, 1 << 14);
        assert_eq!(p.slot_threshold, 2);
        let p = CreditPolicy::new(ring, 4, 2, Some(100));
        assert_eq!(p.slot_threshold, 3);
        let p = CreditPolicy::new(ring, 1000, 2, None);
        assert_eq!(p.slot_threshold, 63);
        let p = CreditPolicy::new(ring, 64, 0, Some(0));
        assert_eq!(p.slot_threshold, 2);
        assert_eq!(p.byte_threshold, 1 << 15);
    }

    #[test]
    fn policy_is_lazy() {
        let p = CreditPolicy::new(RingSize::new(4096).unwrap(), 16, 2, None);
        assert!(!p.due(0, 0, true));
        assert!(!p.due(1023, 7, false));
        assert!(p.due(1024, 0, false));
        assert!(p.due(0, 8, false));
        assert!(p.due(1, 0, true));
    }

    #[test]
    fn reserve_rule() {
        let mut s = TxSlots::new(4);
        s.take();
        s.take();
        assert!(s.can_post_message());
        s.take();
        assert!(!s.can_post_message());
        assert!(s.can_post_credit(true));
        assert!(!s.can_post_credit(false));
        s.restore(3).unwrap();
        assert_eq!(s.restore(1), Err(Violation::SlotCreditOverflow));
    }

    #[test]
    fn rx_slot_overrun() {
        let mut s = RxSlots::new(4);
        for _ in 0..4 {
            s.on_message().unwrap();
        }
        assert_eq!(s.on_message(), Err(Violation::SlotOverrun));
        assert_eq!(s.take(3), 3);
        s.on_message().unwrap();
        assert_eq!(s.owed(), 2);
    }
}
