//! Records (protocol §14) as one side of a [`crate::Connection`] writes and reads them: the
//! records accepted and not posted yet, the records found in the local ring and not read
//! whole, and both ends of the sleeping reader's wake-up ([`crate::wake`]). The connection
//! drives it; the format is [`crate::framing`]'s.

use std::collections::VecDeque;

use crate::framing::{self, FrameReader};
use crate::ring::{RingSize, TxCursors};
use crate::wake::{ReaderWake, WriterWake};

/// The smallest record: header, one payload byte padded to a word, trailer.
pub(crate) const MIN_RECORD: u64 = framing::FRAMING + 8;
/// Ring bytes an open record keeps free beyond its payload: its trailer and the largest pad.
const SEAL_RESERVE: u64 = 8 + 7;

/// A record accepted for the peer's ring and not posted yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TxRecord {
    /// Ring cursor of its header.
    pub at: u64,
    /// Payload bytes.
    pub len: u32,
}

/// Records as this side writes and reads them.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Records {
    /// Both sides use them.
    pub on: bool,
    /// Sending: the salt of this side's records.
    pub tx_salt: u32,
    /// Sending: records accepted and not posted, oldest first.
    pub unposted: VecDeque<TxRecord>,
    /// Sending: the last of `unposted` takes more payload (its pad and trailer are not
    /// accepted yet).
    open: bool,
    /// Sending: the peer reader's sleep, as its notices tell it.
    pub writer_wake: WriterWake,
    /// Sending: a doorbell is due (the reader slept before records it had not seen).
    pub doorbell: bool,
    /// Receiving: finds whole records from the ring's received end (`rx.head()`) on.
    pub scan: FrameReader,
    /// Receiving: payload lengths of the records found and not wholly read, oldest first (the
    /// first one's header is at `rx.tail()`).
    pub ready: VecDeque<u32>,
    /// Receiving: payload bytes of the first ready record read already.
    pub taken: u32,
    /// Receiving: this side's reader's sleep.
    pub reader_wake: ReaderWake,
    /// Receiving: a Sleeping notice to send, with the reader's cursor.
    pub notice_due: Option<u64>,
}

impl Records {
    /// Records off, for a local ring of `local_ring` bytes.
    pub fn new(local_ring: RingSize) -> Self {
        Records {
            on: false,
            tx_salt: 0,
            unposted: VecDeque::new(),
            open: false,
            writer_wake: WriterWake::default(),
            doorbell: false,
            scan: FrameReader::new(local_ring, 0, 0),
            ready: VecDeque::new(),
            taken: 0,
            reader_wake: ReaderWake::default(),
            notice_due: None,
        }
    }

    /// Both sides write records from now on; this side is the client (`client`) or the
    /// server of the connection of `nonce`.
    pub fn start(&mut self, client: bool, nonce: u64, local_ring: RingSize) {
        self.on = true;
        self.tx_salt = framing::salt(nonce, client);
        self.scan = FrameReader::new(local_ring, framing::salt(nonce, !client), 0);
    }

    /// Accepts up to `want` payload bytes into the open record, or a new one: returns the ring
    /// cursor of the first and how many. A record takes at most `max` payload bytes, and an
    /// open one keeps its trailer's and pad's space free.
    pub fn accept(&mut self, tx: &mut TxCursors, want: u64, max: u64) -> (u64, u64) {
        if self.open
            && self
                .unposted
                .back()
                .is_some_and(|r| u64::from(r.len) >= max)
        {
            self.seal(tx);
        }
        if !self.open {
            if tx.free() < MIN_RECORD {
                return (tx.head(), 0);
            }
            let at = tx.head();
            tx.accept(8);
            self.unposted.push_back(TxRecord { at, len: 0 });
            self.open = true;
        }
        let Some(last) = self.unposted.back_mut() else {
            return (tx.head(), 0);
        };
        let room = tx
            .free()
            .saturating_sub(SEAL_RESERVE)
            .min(max - u64::from(last.len));
        let n = want.min(room);
        let cursor = tx.head();
        tx.accept(n);
        last.len += n as u32;
        (cursor, n)
    }

    /// Closes the open record: its pad and trailer take the space it kept for them.
    pub fn seal(&mut self, tx: &mut TxCursors) {
        if let (true, Some(last)) = (self.open, self.unposted.back()) {
            let rest = framing::record_bytes(last.len) - 8 - u64::from(last.len);
            let n = tx.accept(rest);
            debug_assert_eq!(n, rest, "an open record keeps its trailer's space");
        }
        self.open = false;
    }

    /// Drops what was accepted and not posted (with `TxCursors::discard_unposted`).
    pub fn discard_unposted(&mut self) {
        self.unposted.clear();
        self.open = false;
    }

    /// Drops what was found and not read (with `RxCursors::discard_unread`).
    pub fn discard_unread(&mut self) {
        self.ready.clear();
        self.taken = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tx(log2: u8) -> TxCursors {
        TxCursors::new(RingSize::from_log2(log2).unwrap())
    }

    #[test]
    fn sends_join_the_open_record_and_keep_its_trailer_room() {
        let mut r = Records::new(RingSize::from_log2(12).unwrap());
        let mut t = tx(12);
        // the first send opens a record: its payload starts after the header
        assert_eq!(r.accept(&mut t, 5, 1000), (8, 5));
        assert_eq!(r.accept(&mut t, 3, 1000), (13, 3));
        assert_eq!(r.unposted.len(), 1);
        // the record is full at `max`: the next send seals it and opens another
        assert_eq!(r.accept(&mut t, 2000, 1000), (16, 992));
        assert_eq!(r.accept(&mut t, 1, 1000), (8 + 1000 + 8 + 8, 1));
        assert_eq!(
            r.unposted.iter().map(|x| (x.at, x.len)).collect::<Vec<_>>(),
            [(0, 1000), (1016, 1)]
        );
        // a ring nearly full: what is left but the trailer's and the pad's room
        let mut r = Records::new(RingSize::from_log2(12).unwrap());
        let mut t = tx(12);
        assert_eq!(r.accept(&mut t, 1 << 20, 1 << 20), (8, 4096 - 8 - 15));
        r.seal(&mut t);
        assert_eq!(t.head(), 8 + 4073 + 7 + 8);
        assert!(t.free() < MIN_RECORD);
        assert_eq!(
            r.accept(&mut t, 1, 100),
            (t.head(), 0),
            "no room for a record"
        );
    }
}
