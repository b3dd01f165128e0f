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
}

impl TxCursors {
    /// Fresh cursors for a peer ring of `size` bytes.
    pub fn new(size: RingSize) -> Self {
        TxCursors {
            size,
            head: 0,
            posted: 0,
            acked: 0,
        }
    }

    /// Size of the peer's ring.
    pub fn size(&self) -> RingSize {
        self.size
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

    /// Bytes that may be accepted now: `size - (head - acked)`.
    pub fn free(&self) -> u64 {
        self.size.bytes() - (self.head - self.acked)
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
    pub fn next_write(&self, max_len: u64, split_at_wrap: bool) -> Option<WriteRange> {
        let mut len = self.unposted().min(max_len);
        if split_at_wrap {
            let to_end = self.size.bytes() - self.size.offset(self.posted) as u64;
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
}

impl RxCursors {
    /// Fresh cursors for a local ring of `size` bytes.
    pub fn new(size: RingSize) -> Self {
        RxCursors {
            size,
            head: 0,
            tail: 0,
            credited: 0,
        }
    }

    /// Size of the local ring.
    pub fn size(&self) -> RingSize {
        self.size
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
        let end = self.head.saturating_add(len);
        let limit = self.credited + self.size.bytes();
        if end > limit {
            return Err(OverrunError { end, limit });
        }
        self.head = end;
        Ok(())
    }

    /// Bytes written by the peer and not consumed yet.
    pub fn readable(&self) -> u64 {
        self.head - self.tail
    }

    /// Ring offset of the first readable byte.
    pub fn read_offset(&self) -> usize {
        self.size.offset(self.tail)
    }

    /// Consumes `n` readable bytes; returns `false` (and changes nothing) if fewer are readable.
    pub fn consume(&mut self, n: u64) -> bool {
        if n > self.readable() {
            return false;
        }
        self.tail += n;
        true
    }

    /// Bytes consumed but not yet returned to the peer.
    pub fn owed(&self) -> u64 {
        self.tail - self.credited
    }

    /// Marks up to `max` owed bytes as returned; returns how many.
    pub fn take_credit(&mut self, max: u64) -> u64 {
        let n = self.owed().min(max);
        self.credited += n;
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
