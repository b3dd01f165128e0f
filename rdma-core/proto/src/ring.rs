//! Ring cursors: free-running `u64` byte counters and the checks that keep the rings from being
//! overrun.
//!
//! Each direction of a connection has one receive ring, owned by the receiver and written by the
//! sender with RDMA WRITE. Both sides count bytes with cursors that only grow (they never wrap in
//! practice: 2^64 bytes is ~580 years at 1 TB/s); the place in the ring is
//! `cursor mod ring_size` ([`RingSize::offset`]). The ring is double-mapped by the transport, so a
//! write of up to `ring_size` bytes at any offset is contiguous in the receiver's address space.
//!
//! Sender ([`TxCursors`]): `acked <= posted <= head <= acked + size`.
//! Receiver ([`RxCursors`]): `credited <= tail <= head <= credited + size`.
//! Because the sender only learns `acked` from the receiver's credits, and the receiver only
//! credits what its application consumed, `sender.acked <= receiver.credited <= receiver.tail`, so
//! the sender never writes over bytes the application has not read yet.
//!
//! **Ring moves** (protocol §6.4): the receiver may offer another ring (larger for a busy
//! connection, smaller for an idle one); the sender moves at a stream cursor `at` of its
//! choosing — the bytes it had accepted by then — and tells the receiver. Bytes before `at`
//! stay in the old ring, bytes from `at` on go to the new one, at `cursor mod new size`. The
//! new ring holds nothing before `at`, so its space is `max(acked, at) + new size` on the
//! sender's side and `max(credited, at) + new size` on the receiver's: the inequalities above
//! hold with that bound. A write never spans `at`, and a read never crosses it (the reader
//! takes the old ring's bytes, then the new ring's). The old ring is given back once nothing
//! can touch it any more: the sender's staging once `acked >= at`, the receiver's ring once
//! `tail >= at`. One move at a time.

use std::fmt;

/// Smallest ring: 4 KiB (one page).
pub const MIN_RING_LOG2: u8 = 12;
/// Largest ring: 8 MiB. A DATA immediate carries a 24-bit length and a CREDIT immediate a 24-bit
/// byte count, so a whole ring must fit in 24 bits.
pub const MAX_RING_LOG2: u8 = 23;

/// A ring size: a power of two between 2^[`MIN_RING_LOG2`] and 2^[`MAX_RING_LOG2`] bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RingSize {
    log2: u8,
}

/// A ring size that is not a power of two in the supported range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InvalidRingSize(pub u64);

impl fmt::Display for InvalidRingSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ring size {} is not a power of two in 2^{MIN_RING_LOG2}..=2^{MAX_RING_LOG2}",
            self.0
        )
    }
}

impl std::error::Error for InvalidRingSize {}

impl RingSize {
    /// Size from a byte count.
    pub fn new(bytes: u64) -> Result<Self, InvalidRingSize> {
        if !bytes.is_power_of_two() {
            return Err(InvalidRingSize(bytes));
        }
        Self::from_log2(bytes.trailing_zeros() as u8).map_err(|_| InvalidRingSize(bytes))
    }

    /// Size from its base-2 logarithm (the form used on the wire).
    pub fn from_log2(log2: u8) -> Result<Self, InvalidRingSize> {
        if (MIN_RING_LOG2..=MAX_RING_LOG2).contains(&log2) {
            Ok(RingSize { log2 })
        } else {
            Err(InvalidRingSize(
                1u64.checked_shl(u32::from(log2)).unwrap_or(0),
            ))
        }
    }

    /// Base-2 logarithm of the size.
    pub fn log2(self) -> u8 {
        self.log2
    }

    /// Size in bytes.
    pub fn bytes(self) -> u64 {
        1u64 << self.log2
    }

    /// Offset of a cursor in the ring: `cursor mod size`.
    pub fn offset(self, cursor: u64) -> usize {
        // The mask keeps the value below 2^MAX_RING_LOG2, which fits every usize we build for.
        (cursor & (self.bytes() - 1)) as usize
    }
}

/// A peer acknowledged bytes it cannot have received.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CreditError {
    /// The cursor the credit would move `acked` to.
    pub claimed: u64,
    /// The highest cursor written so far.
    pub posted: u64,
}

impl fmt::Display for CreditError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "credit to cursor {} beyond the {} bytes written",
            self.claimed, self.posted
        )
    }
}

/// A range of the sender's stream to write into the peer's ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteRange {
    /// Stream cursor of the first byte.
    pub cursor: u64,
    /// Number of bytes.
    pub len: u64,
}

/// A move to another ring (see the module documentation): from stream cursor `at` on, the
/// bytes are in the ring of the current size; before it, in the old one (`old`, generation
/// `gen - 1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Move {
    /// The first stream cursor in the new ring.
    pub at: u64,
    /// The old ring's size.
    pub old: RingSize,
}

impl Move {
    /// Where `cursor` is, with the current ring of generation `gen` and `size`, and this
    /// move (if any) before it.
    fn place(moved: Option<Move>, gen: u32, size: RingSize, cursor: u64) -> Place {
        match moved {
            Some(m) if cursor < m.at => Place {
                gen: gen - 1,
                size: m.old,
                offset: m.old.offset(cursor),
            },
            _ => Place {
                gen,
                size,
                offset: size.offset(cursor),
            },
        }
    }
}

/// Which ring a stream cursor is in, and where: its generation (0 for the handshake's, one
/// more per move), its size, and the offset (`cursor mod size`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    /// The ring's generation.
    pub gen: u32,
    /// The ring's size.
    pub size: RingSize,
    /// The cursor's offset in it.
    pub offset: usize,
}

/// Sender-side cursors for the peer's ring.
///
/// * `head`: bytes the application handed over (staged locally, not necessarily written yet).
/// * `posted`: bytes for which an RDMA WRITE has been handed to the transport.
/// * `acked`: the peer's read cursor as known from its credits.
///
/// `acked <= posted <= head <= acked + size`: the bytes `[acked, head)` are the sender's
/// outstanding data. A local staging area of `size` bytes indexed by `cursor mod size` therefore
/// never overwrites a byte that may still be read by an in-flight write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxCursors {
    size: RingSize,
    head: u64,
    posted: u64,
    acked: u64,
    /// The current ring's generation.
    gen: u32,
    /// A move whose old ring may still be needed (`acked < at`).
    moved: Option<Move>,
}

impl TxCursors {
    /// Fresh cursors for a peer ring of `size` bytes.
    pub fn new(size: RingSize) -> Self {
        TxCursors {
            size,
            head: 0,
            posted: 0,
            acked: 0,
            gen: 0,
            moved: None,
        }
    }

    /// Size of the peer's (current) ring.
    pub fn size(&self) -> RingSize {
        self.size
    }

    /// The current ring's generation.
    pub fn gen(&self) -> u32 {
        self.gen
    }

    /// The move under way, if its old ring may still be needed.
    pub fn moved(&self) -> Option<Move> {
        self.moved
    }

    /// Where stream cursor `cursor` goes (or went).
    pub fn place(&self, cursor: u64) -> Place {
        Move::place(self.moved, self.gen, self.size, cursor)
    }

    /// Moves to a ring of `size` bytes from the bytes accepted so far on: returns the cursor
    /// of the move (`head`), or `None` while the previous move's old ring may still be needed.
    pub fn begin_move(&mut self, size: RingSize) -> Option<u64> {
        if self.moved.is_some() {
            return None;
        }
        self.moved = Some(Move {
            at: self.head,
            old: self.size,
        });
        self.size = size;
        self.gen += 1;
        Some(self.head)
    }

    /// Ends the move once the old ring is no longer needed (the peer acknowledged every byte
    /// in it): returns the old ring's generation, which can be given back.
    pub fn retire_move(&mut self) -> Option<u32> {
        let m = self.moved?;
        if self.acked < m.at {
            return None;
        }
        self.moved = None;
        Some(self.gen - 1)
    }

    /// The first cursor the current ring's space is counted from: `acked`, or the move's
    /// cursor while the peer has not acknowledged that far.
    fn base(&self) -> u64 {
        self.moved.map_or(self.acked, |m| self.acked.max(m.at))
    }

    /// Bytes accepted from the application so far.
    pub fn head(&self) -> u64 {
        self.head
    }

    /// Bytes handed to the transport as writes so far.
    pub fn posted(&self) -> u64 {
        self.posted
    }

    /// The peer's read cursor as known from credits.
    pub fn acked(&self) -> u64 {
        self.acked
    }

    /// Bytes that may be accepted now: `size - (head - acked)` (after a move, counted in the
    /// new ring from the move's cursor on).
    pub fn free(&self) -> u64 {
        self.size.bytes() - (self.head - self.base())
    }

    /// Accepted bytes not yet written.
    pub fn unposted(&self) -> u64 {
        self.head - self.posted
    }

    /// Accepts up to `want` bytes; returns how many were accepted.
    pub fn accept(&mut self, want: u64) -> u64 {
        let n = want.min(self.free());
        self.head += n;
        n
    }

    /// The next write to perform, at most `max_len` bytes; with `split_at_wrap` it also stops at
    /// the end of the ring (for a transport whose staging area is not double-mapped).
    /// A write never spans a move's cursor (its bytes are in two rings).
    pub fn next_write(&self, max_len: u64, split_at_wrap: bool) -> Option<WriteRange> {
        let mut len = self.unposted().min(max_len);
        if let Some(m) = self.moved.filter(|m| self.posted < m.at) {
            len = len.min(m.at - self.posted);
        }
        if split_at_wrap {
            let p = self.place(self.posted);
            let to_end = p.size.bytes() - p.offset as u64;
            len = len.min(to_end);
        }
        (len > 0).then_some(WriteRange {
            cursor: self.posted,
            len,
        })
    }

    /// Records that `len` more bytes were handed to the transport.
    ///
    /// # Panics
    /// If `len` exceeds [`Self::unposted`]: that is a bug in the caller, not a peer's doing.
    pub fn mark_posted(&mut self, len: u64) {
        assert!(len <= self.unposted(), "posting more than was accepted");
        self.posted += len;
    }

    /// Whether [`Self::credit`] of `bytes` would succeed.
    pub fn can_credit(&self, bytes: u64) -> bool {
        self.acked.saturating_add(bytes) <= self.posted
    }

    /// Applies a byte credit: the peer freed `bytes` more bytes.
    pub fn credit(&mut self, bytes: u64) -> Result<(), CreditError> {
        let claimed = self.acked.saturating_add(bytes);
        self.credit_to(claimed)
    }

    /// Applies an absolute read cursor from the peer. A cursor behind the known one is stale and
    /// ignored; one beyond what was written is an error.
    pub fn credit_to(&mut self, cursor: u64) -> Result<(), CreditError> {
        if cursor > self.posted {
            return Err(CreditError {
                claimed: cursor,
                posted: self.posted,
            });
        }
        self.acked = self.acked.max(cursor);
        Ok(())
    }

    /// Drops accepted bytes that were not written yet (the peer closed its read side).
    pub fn discard_unposted(&mut self) {
        self.head = self.posted;
    }
}

/// The peer wrote past the space it was granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OverrunError {
    /// Cursor the write would end at.
    pub end: u64,
    /// Highest cursor the credits returned so far allow.
    pub limit: u64,
}

impl fmt::Display for OverrunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "peer write ends at cursor {} beyond the granted {}",
            self.end, self.limit
        )
    }
}

/// Receiver-side cursors for the local ring.
///
/// * `head`: bytes the peer wrote (advanced by DATA completions, which RC delivers in order).
/// * `tail`: bytes the application consumed.
/// * `credited`: the read cursor last returned to the peer.
///
/// `credited <= tail <= head <= credited + size`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RxCursors {
    size: RingSize,
    head: u64,
    tail: u64,
    credited: u64,
    /// The current ring's generation.
    gen: u32,
    /// A move whose old ring may still hold unread bytes, or whose cursor is not credited yet.
    moved: Option<Move>,
    /// The old ring of `moved` was given back (nothing reads it any more).
    old_released: bool,
    /// The size of the ring before the last move (0: none).
    prev: u64,
}

impl RxCursors {
    /// Fresh cursors for a local ring of `size` bytes.
    pub fn new(size: RingSize) -> Self {
        RxCursors {
            size,
            head: 0,
            tail: 0,
            credited: 0,
            gen: 0,
            moved: None,
            old_released: false,
            prev: 0,
        }
    }

    /// Size of the local (current) ring.
    pub fn size(&self) -> RingSize {
        self.size
    }

    /// The current ring's generation.
    pub fn gen(&self) -> u32 {
        self.gen
    }

    /// Whether a move may begin: the last one's old ring is given back and its cursor
    /// credited.
    pub fn can_move(&self) -> bool {
        self.moved.is_none()
    }

    /// The peer moved to the ring of `size` bytes from cursor `at` on. It must be every byte
    /// written so far (`at == head`: the peer's move message follows its last write to the old
    /// ring), and no move may be under way.
    pub fn move_to(&mut self, at: u64, size: RingSize) -> bool {
        if at != self.head || self.moved.is_some() {
            return false;
        }
        self.moved = Some(Move { at, old: self.size });
        self.old_released = false;
        self.prev = self.size.bytes();
        self.size = size;
        self.gen += 1;
        true
    }

    /// The most stream bytes the peer may have written and not had acknowledged: the current
    /// ring's size, and the last one's (after a move the peer's unacknowledged bytes may span
    /// both; never more, as a move waits until the one before it was acknowledged in full).
    pub fn window(&self) -> u64 {
        self.size.bytes() + self.prev
    }

    /// Once the application has read past the move's cursor, the old ring is read no more:
    /// returns its generation, once, to be given back.
    pub fn release_old(&mut self) -> Option<u32> {
        let m = self.moved?;
        if self.old_released || self.tail < m.at {
            return None;
        }
        self.old_released = true;
        self.end_move();
        Some(self.gen - 1)
    }

    /// The move is over once its old ring is given back and its cursor credited (until then
    /// the peer may count the new ring's space from the cursor: [`Self::on_data`]).
    fn end_move(&mut self) {
        if self.old_released && self.moved.is_some_and(|m| self.credited >= m.at) {
            self.moved = None;
        }
    }

    /// Whether bytes before the last move's cursor are read and not credited yet: their
    /// credit is due at once, whatever the thresholds (the peer's old staging area stays
    /// registered, and no further move can begin, until the move's cursor is credited; on a
    /// connection that goes idle after the move a lazy credit might never come).
    pub fn move_credit_due(&self) -> bool {
        self.moved
            .is_some_and(|m| self.credited < m.at && self.tail > self.credited)
    }

    /// Where stream cursor `cursor` is.
    pub fn place(&self, cursor: u64) -> Place {
        Move::place(self.moved, self.gen, self.size, cursor)
    }

    /// Bytes the peer has written.
    pub fn head(&self) -> u64 {
        self.head
    }

    /// Bytes the application has consumed.
    pub fn tail(&self) -> u64 {
        self.tail
    }

    /// Read cursor last returned to the peer.
    pub fn credited(&self) -> u64 {
        self.credited
    }

    /// Records a DATA completion of `len` bytes, checking the peer stayed inside its credit.
    pub fn on_data(&mut self, len: u64) -> Result<(), OverrunError> {
        self.landing(0, len)?;
        self.head += len;
        Ok(())
    }

    /// Where the `len` bytes of a DATA go when `ahead` bytes received before it are not
    /// recorded yet (the place of `head + ahead`), if they stay inside the credit returned:
    /// what [`Self::on_data`] checks, without recording them.
    pub fn landing(&self, ahead: u64, len: u64) -> Result<Place, OverrunError> {
        let at = self.head.saturating_add(ahead);
        let end = at.saturating_add(len);
        let base = self
            .moved
            .map_or(self.credited, |m| self.credited.max(m.at));
        let limit = base + self.size.bytes();
        if end > limit {
            return Err(OverrunError { end, limit });
        }
        Ok(self.place(at))
    }

    /// Bytes written by the peer and not consumed yet, in the ring the next one is in (the old
    /// ring's until its last byte is read).
    pub fn readable(&self) -> u64 {
        match self.moved {
            Some(m) if self.tail < m.at => m.at - self.tail,
            _ => self.head - self.tail,
        }
    }

    /// Ring offset of the first readable byte (in its ring: [`Self::read_place`]).
    pub fn read_offset(&self) -> usize {
        self.place(self.tail).offset
    }

    /// Where the first readable byte is.
    pub fn read_place(&self) -> Place {
        self.place(self.tail)
    }

    /// Consumes `n` readable bytes; returns `false` (and changes nothing) if fewer are readable.
    pub fn consume(&mut self, n: u64) -> bool {
        if n > self.readable() {
            return false;
        }
        self.tail += n;
        true
    }

    /// Consumes every byte written so far, in whichever ring (the peer sends them again some
    /// other way: a switch back, a read side shut).
    pub fn discard_unread(&mut self) {
        self.tail = self.head;
    }

    /// Bytes consumed but not yet returned to the peer.
    pub fn owed(&self) -> u64 {
        self.tail - self.credited
    }

    /// Marks up to `max` owed bytes as returned; returns how many.
    pub fn take_credit(&mut self, max: u64) -> u64 {
        let n = self.owed().min(max);
        self.credited += n;
        self.end_move();
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_size_bounds() {
        assert!(RingSize::new(4096).is_ok());
        assert!(RingSize::new(1 << 23).is_ok());
        assert_eq!(RingSize::new(2048), Err(InvalidRingSize(2048)));
        assert_eq!(RingSize::new(1 << 24), Err(InvalidRingSize(1 << 24)));
        assert_eq!(RingSize::new(6000), Err(InvalidRingSize(6000)));
        assert_eq!(RingSize::new(0), Err(InvalidRingSize(0)));
        assert!(RingSize::from_log2(11).is_err());
        assert!(RingSize::from_log2(255).is_err());
        assert_eq!(RingSize::from_log2(12).unwrap().bytes(), 4096);
    }

    #[test]
    fn offsets_wrap() {
        let s = RingSize::new(4096).unwrap();
        assert_eq!(s.offset(0), 0);
        assert_eq!(s.offset(4095), 4095);
        assert_eq!(s.offset(4096), 0);
        assert_eq!(s.offset(u64::MAX), 4095);
    }

    #[test]
    fn tx_never_overcommits() {
        let s = RingSize::new(4096).unwrap();
        let mut tx = TxCursors::new(s);
        assert_eq!(tx.accept(5000), 4096);
        assert_eq!(tx.free(), 0);
        assert_eq!(tx.accept(1), 0);
        let w = tx.next_write(u64::MAX, false).unwrap();
        assert_eq!((w.cursor, w.len), (0, 4096));
        tx.mark_posted(w.len);
        assert!(tx.credit(4097).is_err());
        tx.credit(100).unwrap();
        assert_eq!(tx.free(), 100);
        tx.credit_to(50).unwrap(); // stale cursor: ignored
        assert_eq!(tx.acked(), 100);
    }

    #[test]
    fn tx_split_at_wrap() {
        let s = RingSize::new(4096).unwrap();
        let mut tx = TxCursors::new(s);
        tx.accept(4000);
        tx.mark_posted(4000);
        tx.credit(4000).unwrap();
        tx.accept(1000);
        let w = tx.next_write(u64::MAX, true).unwrap();
        assert_eq!((w.cursor, w.len), (4000, 96));
        let w = tx.next_write(u64::MAX, false).unwrap();
        assert_eq!((w.cursor, w.len), (4000, 1000));
    }

    #[test]
    fn moves_count_the_new_ring_from_the_move() {
        let small = RingSize::new(4096).unwrap();
        let big = RingSize::new(16384).unwrap();
        let mut tx = TxCursors::new(small);
        let mut rx = RxCursors::new(small);
        tx.accept(3000);
        tx.mark_posted(1000);
        // the move at 3000: 2000 bytes still to write to the old ring, then the new one's
        assert_eq!(tx.begin_move(big), Some(3000));
        assert_eq!(tx.begin_move(small), None, "one move at a time");
        assert_eq!(tx.free(), 16384);
        assert_eq!(tx.accept(20_000), 16384);
        let w = tx.next_write(u64::MAX, false).unwrap();
        assert_eq!((w.cursor, w.len), (1000, 2000), "never across the move");
        assert_eq!(tx.place(2999).gen, 0);
        assert_eq!(
            tx.place(3000),
            Place {
                gen: 1,
                size: big,
                offset: 3000
            }
        );
        tx.mark_posted(2000);
        let w = tx.next_write(u64::MAX, true).unwrap();
        assert_eq!(
            (w.cursor, w.len),
            (3000, 16384 - 3000),
            "split at the new ring's end"
        );
        // the receiver: 3000 in the old ring, the move, then the new ring's
        rx.on_data(3000).unwrap();
        assert!(
            !rx.move_to(2999, big),
            "the move is where the old ring's bytes end"
        );
        assert!(rx.move_to(3000, big));
        rx.on_data(16384).unwrap();
        assert!(rx.on_data(1).is_err(), "the new ring is full");
        assert_eq!(rx.window(), 16384 + 4096);
        assert_eq!((rx.readable(), rx.read_place().gen), (3000, 0));
        assert!(rx.consume(3000));
        assert_eq!(rx.release_old(), Some(0));
        assert_eq!(rx.release_old(), None);
        assert!(!rx.can_move(), "not before the move's cursor is credited");
        assert_eq!((rx.readable(), rx.read_place().gen), (16384, 1));
        assert_eq!(rx.take_credit(u64::MAX), 3000);
        assert!(rx.can_move());
        // the sender's old staging goes once the credit comes
        assert_eq!(tx.retire_move(), None);
        tx.credit(3000).unwrap();
        assert_eq!(tx.retire_move(), Some(0));
        assert_eq!(
            tx.free(),
            0,
            "the new ring is full until its own bytes are credited"
        );
        tx.mark_posted(3000);
        tx.credit(100).unwrap();
        assert_eq!(tx.free(), 100);
    }

    #[test]
    fn rx_detects_overrun() {
        let s = RingSize::new(4096).unwrap();
        let mut rx = RxCursors::new(s);
        rx.on_data(4096).unwrap();
        assert!(rx.on_data(1).is_err());
        assert!(rx.consume(10));
        assert!(rx.on_data(1).is_err(), "consumed but not credited yet");
        assert_eq!(rx.take_credit(4), 4);
        rx.on_data(4).unwrap();
        assert!(!rx.consume(5000));
        assert_eq!(rx.readable(), 4090);
    }
}
