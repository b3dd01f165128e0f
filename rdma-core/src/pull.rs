//! READ pull (protocol §16), the receiving side: what arrived and waits for a pull.
//!
//! A DATA of a connection of the READ kind is an announcement (a zero-length WRITE WITH
//! IMMEDIATE); its bytes are still in the sender's staging area. The link pulls them with an
//! RDMA READ into its ring, at the place the core names ([`Connection::landing_after`]), and
//! hands the announcement to the core only once that READ completed — and every receive
//! completion that came after it only after that, so that the core sees the stream in the
//! order it was sent (a ShutdownWrite states the bytes before it; a credit or a SwitchBack
//! follows the data before it). A held completion keeps its receive slot: it is posted again
//! once the completion was handed over, as any other.
//!
//! [`Connection::landing_after`]: rdmashim_proto::Connection::landing_after

use std::collections::VecDeque;

/// A receive completion, as the link hands it to the core.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Arrival {
    /// The receive slot it consumed.
    pub slot: u16,
    /// Its immediate, as the completion has it (network order).
    pub imm: Option<u32>,
    /// Bytes it placed (a SEND's in the slot's buffer, a WRITE's in the ring).
    pub byte_len: u32,
    /// A WRITE WITH IMMEDIATE's (`IBV_WC_RECV_RDMA_WITH_IMM`).
    pub write_imm: bool,
    /// A SEND's (`IBV_WC_RECV`), with or without an immediate.
    pub send: bool,
}

/// One announcement's READ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pull {
    /// The receive ring's generation and offset it goes to (the same offset in the peer's
    /// staging area).
    pub gen: u32,
    pub offset: usize,
    pub len: u32,
    /// Its send-queue sequence number, once posted.
    pub seq: Option<u64>,
}

/// A completion held back: an announcement with its pull, or one that came after a pull
/// (`pull: None`; also an announcement with nowhere to land, which the core refuses or
/// ignores, in its turn).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Held {
    pub arrival: Arrival,
    pub pull: Option<Pull>,
}

/// The completions held back, oldest first.
#[derive(Debug, Default)]
pub(crate) struct Pulls {
    held: VecDeque<Held>,
}

impl Pulls {
    /// Nothing is held back: a completion goes to the core at once.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Bytes announced and not handed over yet (the next announcement lands after them).
    pub fn ahead(&self) -> u64 {
        self.held
            .iter()
            .filter_map(|h| h.pull)
            .map(|p| u64::from(p.len))
            .sum()
    }

    /// Holds `arrival` back behind everything held, with its pull if it is an announcement.
    pub fn hold(&mut self, arrival: Arrival, pull: Option<Pull>) {
        self.held.push_back(Held { arrival, pull });
    }

    /// The oldest pull not posted yet (pulls are posted in order).
    pub fn unposted(&mut self) -> Option<&mut Pull> {
        self.held
            .iter_mut()
            .filter_map(|h| h.pull.as_mut())
            .find(|p| p.seq.is_none())
    }

    /// The oldest held completion, if it can go to the core now: it is no announcement, or
    /// its READ completed (every send WR below `completed` has).
    pub fn ready(&mut self, completed: u64) -> Option<Held> {
        let front = self.held.front()?;
        if let Some(p) = front.pull {
            if p.seq.is_none_or(|seq| seq >= completed) {
                return None;
            }
        }
        self.held.pop_front()
    }

    /// The queue pair failed: no pull completes, and nothing held goes to the core.
    pub fn clear(&mut self) {
        self.held.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arrival(slot: u16) -> Arrival {
        Arrival {
            slot,
            imm: None,
            byte_len: 0,
            write_imm: true,
            send: false,
        }
    }

    fn pull(offset: usize, len: u32) -> Option<Pull> {
        Some(Pull {
            gen: 0,
            offset,
            len,
            seq: None,
        })
    }

    /// Completions go to the core in arrival order, each announcement only after its READ
    /// completed, and what came after it only after that.
    #[test]
    fn held_completions_leave_in_order_behind_their_pulls() {
        let mut q = Pulls::default();
        q.hold(arrival(0), pull(0, 100));
        q.hold(arrival(1), None);
        q.hold(arrival(2), pull(100, 50));
        q.hold(arrival(3), None);
        assert_eq!(q.ahead(), 150);
        assert!(q.ready(u64::MAX).is_none(), "not posted yet");
        q.unposted().unwrap().seq = Some(7);
        q.unposted().unwrap().seq = Some(9);
        assert!(q.unposted().is_none());
        assert!(
            q.ready(7).is_none(),
            "READ 7 not complete while only WRs below 7 are"
        );
        assert_eq!(q.ready(8).unwrap().arrival.slot, 0);
        assert_eq!(q.ready(8).unwrap().arrival.slot, 1);
        assert!(q.ready(8).is_none(), "the second READ is still out");
        assert_eq!(q.ahead(), 50);
        assert_eq!(q.ready(10).unwrap().arrival.slot, 2);
        assert_eq!(q.ready(10).unwrap().arrival.slot, 3);
        assert!(q.is_empty() && q.ready(10).is_none());
    }
}
