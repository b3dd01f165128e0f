//! Records: the on-ring format of the polled kind (protocol §14; docs/bench/kinds.md, "What
//! the figures decide"), with which a receiver learns of new bytes by polling ring memory,
//! without a receive completion. One RDMA WRITE carries one record; the receiver polls the
//! word at its read position, then the word at the end that word gives. [`crate::Connection`]
//! writes and reads them when both ends offer them ([`crate::Kind::Records`]); the RDMA
//! link offers them when its configuration asks (the native API; the shim not yet).
//!
//! ```text
//!  at                  at + 8                      at + 8 + pad8(len)
//!  | header (8 bytes)  | payload (len bytes), pad  | trailer (8 bytes) |
//!    tag(at) << 32 | len                            the header's word again
//! ```
//!
//! `at` is the record's ring cursor (a multiple of 8; the next record starts right after the
//! trailer), `len` is `1..=`[`max_payload`] bytes, words are little-endian `u64`s in ring
//! memory, and `tag(at)` is the low 32 bits of `at / 8` mixed with the ring's salt (`salt`, a
//! value both ends derive per ring). What makes a record ready:
//! - the header at the read position carries the tag of that position and a length — a word
//!   left there by an earlier lap of the ring carries an earlier position's tag (two positions
//!   less than a ring apart never share one), and zeroed memory no length (`len` is never 0);
//! - the trailer, the last word the WRITE places, equals the header. The format relies on a
//!   WRITE's bytes becoming visible in address order, as last-byte polling does everywhere
//!   (FaRM's rings, perftest's `ib_write_lat`): until the trailer is there the record is not
//!   read, so a partly placed record is never delivered. (A trailer partly placed may already
//!   match, its last bytes those of a word an earlier lap left at that offset, whose high
//!   bytes a new trailer's share; in address order the payload is whole before the trailer's
//!   first byte lands, so that is harmless.)
//!
//! A ring's memory must be zeroed before its first record: memory reused from another ring
//! could hold that ring's records, the salt making a match unlikely but not impossible.
//! A header or trailer with the right tag and a wrong length is a protocol violation (only the
//! peer's writer puts that tag there), reported as [`FramingError`].

use crate::ring::RingSize;

/// Bytes of framing a record adds to its payload (header and trailer), before padding.
pub const FRAMING: u64 = 16;

/// Ring bytes a record of `len` payload bytes takes: header, payload padded to 8, trailer.
pub fn record_bytes(len: u32) -> u64 {
    FRAMING + pad8(u64::from(len))
}

/// The largest payload of one record in a ring of `size` (the whole ring but its framing).
pub fn max_payload(size: RingSize) -> u32 {
    u32::try_from(size.bytes() - FRAMING).unwrap_or(u32::MAX)
}

fn pad8(n: u64) -> u64 {
    (n + 7) & !7
}

/// The salt of the records the client (`client_writes`) or the server writes on the
/// connection of `nonce`: both ends derive it, the two directions differ, and another
/// connection's records left in reused ring memory carry another salt.
pub fn salt(nonce: u64, client_writes: bool) -> u32 {
    let n = (nonce ^ (nonce >> 32)) as u32;
    if client_writes {
        n
    } else {
        !n.rotate_left(16)
    }
}

/// The tag of a record at ring cursor `at` in a ring salted `salt`.
fn tag(at: u64, salt: u32) -> u32 {
    ((at >> 3) as u32) ^ salt
}

/// The header (and trailer) word of a record of `len` bytes at `at`: the tag in the high half,
/// the bytes placed last of each word, so that a word seen half-placed (bytes land in address
/// order, the low half first) has its new length and an old tag — never the new tag with an
/// old length.
fn word(at: u64, len: u32, salt: u32) -> u64 {
    (u64::from(tag(at, salt)) << 32) | u64::from(len)
}

/// How the writer lays out one record: the words to put around the payload, and where.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The header word, at the record's start (little-endian).
    pub header: u64,
    /// Offset of the payload from the record's start (always 8).
    pub payload_at: usize,
    /// Offset of the trailer from the record's start; it holds [`Frame::header`] again.
    pub trailer_at: usize,
    /// Ring bytes of the whole record: one WRITE of this many bytes from the record's start.
    pub bytes: u64,
}

/// Why [`frame`] cannot lay out a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// The cursor is not a multiple of 8 (records start on words).
    Unaligned(u64),
    /// No payload, or more than [`max_payload`] of the ring.
    BadLength(u32),
}

/// The layout of a record of `len` payload bytes at ring cursor `at` in a ring of `size`
/// salted `salt`.
pub fn frame(at: u64, len: u32, size: RingSize, salt: u32) -> Result<Frame, FrameError> {
    if !at.is_multiple_of(8) {
        return Err(FrameError::Unaligned(at));
    }
    if len == 0 || len > max_payload(size) {
        return Err(FrameError::BadLength(len));
    }
    let bytes = record_bytes(len);
    Ok(Frame {
        header: word(at, len, salt),
        payload_at: 8,
        trailer_at: (bytes - 8) as usize,
        bytes,
    })
}

/// A violation a reader found in ring memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FramingError {
    /// A header with this position's tag whose length does not fit the ring.
    BadLength {
        /// The record's ring cursor.
        at: u64,
        /// The length it gives.
        len: u32,
    },
    /// The trailer carries this position's tag but not the header's length.
    TrailerMismatch {
        /// The record's ring cursor.
        at: u64,
        /// The header's word.
        header: u64,
        /// The trailer's word.
        trailer: u64,
    },
}

impl std::fmt::Display for FramingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FramingError::BadLength { at, len } => {
                write!(
                    f,
                    "record at ring cursor {at} gives a length of {len} bytes"
                )
            }
            FramingError::TrailerMismatch {
                at,
                header,
                trailer,
            } => write!(
                f,
                "record at ring cursor {at}: trailer {trailer:#x} differs from header {header:#x}"
            ),
        }
    }
}

impl std::error::Error for FramingError {}

/// What the reader's position holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Poll {
    /// No record there yet (or one not wholly placed).
    Empty,
    /// Payload bytes to read: `len` of them at ring offset `offset` (contiguous in the ring's
    /// double mapping).
    Ready {
        /// Ring offset of the first unread payload byte.
        offset: usize,
        /// Unread payload bytes of the record.
        len: usize,
    },
}

/// The receiving end of a ring of records: where it reads, and how much of the open record's
/// payload it has taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameReader {
    size: RingSize,
    salt: u32,
    /// Ring cursor of the record being read (or of the next one).
    at: u64,
    /// The open record: its payload length and the bytes of it consumed.
    open: Option<(u32, u32)>,
}

impl FrameReader {
    /// A reader of a ring of `size` salted `salt` whose first record is at cursor `at` (a
    /// multiple of 8).
    pub fn new(size: RingSize, salt: u32, at: u64) -> Self {
        debug_assert!(at.is_multiple_of(8));
        FrameReader {
            size,
            salt,
            at,
            open: None,
        }
    }

    /// The ring cursor of the record being read, or of the next one (a multiple of 8).
    pub fn cursor(&self) -> u64 {
        self.at
    }

    /// Looks at the read position: `word(offset)` is the little-endian word at ring offset
    /// `offset` (a multiple of 8, below the ring's size; the transport reads it once, as an
    /// aligned 8-byte load). An open record's rest is returned without a read.
    pub fn poll(&mut self, word: impl Fn(usize) -> u64) -> Result<Poll, FramingError> {
        if self.open.is_none() {
            let header = word(self.size.offset(self.at));
            if (header >> 32) as u32 != tag(self.at, self.salt) {
                return Ok(Poll::Empty);
            }
            let len = header as u32;
            if len == 0 {
                // (zeroed memory where the tag happens to be 0: the writer never writes 0)
                return Ok(Poll::Empty);
            }
            if len > max_payload(self.size) {
                return Err(FramingError::BadLength { at: self.at, len });
            }
            let end = self.at + record_bytes(len) - 8;
            let trailer = word(self.size.offset(end));
            if trailer != header {
                // (a word of this tag and a length is the writer's; zeroed memory has none)
                if (trailer >> 32) as u32 == tag(self.at, self.salt) && trailer as u32 != 0 {
                    return Err(FramingError::TrailerMismatch {
                        at: self.at,
                        header,
                        trailer,
                    });
                }
                return Ok(Poll::Empty);
            }
            self.open = Some((len, 0));
        }
        let (len, taken) = self.open.expect("opened above");
        Ok(Poll::Ready {
            offset: self.size.offset(self.at + 8 + u64::from(taken)),
            len: (len - taken) as usize,
        })
    }

    /// Takes `n` payload bytes of the open record (at most what [`poll`](Self::poll) gave).
    /// Returns the ring bytes freed: the whole record's once its last payload byte is taken,
    /// else 0; the reader then looks at the next record.
    pub fn consume(&mut self, n: usize) -> Result<u64, ConsumeTooMuch> {
        let Some((len, taken)) = self.open else {
            return if n == 0 {
                Ok(0)
            } else {
                Err(ConsumeTooMuch { n, left: 0 })
            };
        };
        let left = (len - taken) as usize;
        if n > left {
            return Err(ConsumeTooMuch { n, left });
        }
        if n < left {
            self.open = Some((len, taken + n as u32));
            return Ok(0);
        }
        let freed = record_bytes(len);
        self.at += freed;
        self.open = None;
        Ok(freed)
    }
}

/// [`FrameReader::consume`] was asked for more than the open record holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConsumeTooMuch {
    /// Bytes asked for.
    pub n: usize,
    /// Unread payload bytes of the open record.
    pub left: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn size(log2: u8) -> RingSize {
        RingSize::from_log2(log2).unwrap()
    }

    #[test]
    fn layout_of_a_record() {
        let f = frame(64, 5, size(12), 0).unwrap();
        assert_eq!((f.payload_at, f.trailer_at, f.bytes), (8, 16, 24));
        assert_eq!(f.header, (8 << 32) | 5);
        assert_eq!(record_bytes(8), 24);
        assert_eq!(record_bytes(9), 32);
        assert_eq!(frame(4, 5, size(12), 0), Err(FrameError::Unaligned(4)));
        assert_eq!(frame(0, 0, size(12), 0), Err(FrameError::BadLength(0)));
        assert_eq!(max_payload(size(12)), 4096 - 16);
        assert!(frame(0, 4096 - 16, size(12), 7).is_ok());
        assert_eq!(
            frame(0, 4096 - 15, size(12), 7),
            Err(FrameError::BadLength(4081))
        );
    }

    #[test]
    fn zeroed_memory_holds_no_record_at_any_position() {
        for salt in [0, 1, u32::MAX] {
            for at in (0..1 << 16).step_by(8) {
                let mut r = FrameReader::new(size(12), salt, at);
                // (where the tag is 0 the zero length still says empty)
                assert_eq!(r.poll(|_| 0), Ok(Poll::Empty), "{at} {salt}");
            }
        }
    }
}
