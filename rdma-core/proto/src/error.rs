//! Error types shared by the codecs.

use std::fmt;

/// Why a decoder refused its input. Every decoder in this crate returns one of these for any
/// input it does not accept; none of them panics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DecodeError {
    /// No bytes, or only zero bytes: the peer sent no message at all (rdma_cm zero-fills the
    /// private-data area when the sender passed none).
    Empty,
    /// The input ends before the message does.
    Truncated {
        /// Bytes the message needs.
        need: usize,
        /// Bytes the input has.
        got: usize,
    },
    /// The input is longer than any message of its kind may be, even counting padding.
    TooLong {
        /// Largest accepted input.
        max: usize,
        /// Bytes the input has.
        got: usize,
    },
    /// The first four bytes are not [`crate::MAGIC`].
    BadMagic([u8; 4]),
    /// A protocol version this implementation does not speak.
    UnsupportedVersion(u8),
    /// A handshake message of another kind than the one expected here (e.g. a reply where a
    /// request belongs).
    WrongKind {
        /// Kind byte expected.
        expected: u8,
        /// Kind byte found.
        got: u8,
    },
    /// A control-message or immediate kind this version does not define.
    UnknownKind(u8),
    /// Flag bits from the "must understand" half that this version does not define.
    UnknownFlags(u16),
    /// A reserved byte is not zero.
    ReservedNonZero {
        /// Offset of the offending byte.
        offset: usize,
    },
    /// A byte after the end of the message is not zero (only zero padding may follow).
    TrailingBytes {
        /// Offset of the first non-zero byte.
        offset: usize,
    },
    /// A ring size (log2) outside [`crate::MIN_RING_LOG2`]..=[`crate::MAX_RING_LOG2`].
    BadRingSize(u8),
    /// A receive-slot count outside [`crate::MIN_RECV_SLOTS`]..=`u16::MAX`.
    BadRecvSlots(u16),
    /// Reject reason code 0, which is never sent.
    BadRejectCode(u8),
    /// An immediate with reserved bits set.
    ImmReservedBits(u32),
    /// A DATA immediate announcing zero bytes.
    ZeroLengthData,
    /// A CREDIT immediate returning neither bytes nor slots.
    EmptyCredit,
    /// A token whose `DIAL_PORT` flag, or a redirect rejection, names port 0.
    ZeroDialPort,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            DecodeError::Empty => write!(f, "empty message"),
            DecodeError::Truncated { need, got } => {
                write!(f, "truncated message: need {need} bytes, got {got}")
            }
            DecodeError::TooLong { max, got } => {
                write!(f, "message too long: at most {max} bytes, got {got}")
            }
            DecodeError::BadMagic(m) => write!(f, "bad magic {m:02x?}"),
            DecodeError::UnsupportedVersion(v) => write!(f, "unsupported protocol version {v}"),
            DecodeError::WrongKind { expected, got } => {
                write!(f, "wrong message kind {got} (expected {expected})")
            }
            DecodeError::UnknownKind(k) => write!(f, "unknown message kind {k}"),
            DecodeError::UnknownFlags(b) => write!(f, "unknown required flag bits {b:#06x}"),
            DecodeError::ReservedNonZero { offset } => {
                write!(f, "reserved byte at offset {offset} is not zero")
            }
            DecodeError::TrailingBytes { offset } => {
                write!(
                    f,
                    "non-zero byte at offset {offset} after the end of the message"
                )
            }
            DecodeError::BadRingSize(l) => write!(f, "ring size 2^{l} out of range"),
            DecodeError::BadRecvSlots(n) => write!(f, "receive slot count {n} out of range"),
            DecodeError::BadRejectCode(c) => write!(f, "invalid reject reason code {c}"),
            DecodeError::ImmReservedBits(i) => {
                write!(f, "immediate {i:#010x} has reserved bits set")
            }
            DecodeError::ZeroLengthData => write!(f, "DATA immediate with zero length"),
            DecodeError::EmptyCredit => write!(f, "CREDIT immediate returning nothing"),
            DecodeError::ZeroDialPort => write!(f, "dial port 0 named"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// Why a record, or the continuation after it, was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FailoverError {
    /// The record does not start with [`crate::failover::RECORD_MAGIC`].
    BadMagic([u8; 4]),
    /// A layout version this crate does not read.
    Version(u8),
    /// Flags or reserved bytes that are not zero.
    Reserved,
    /// The record names another upgrade.
    Nonce,
    /// The continuation starts after what we read from the ring (bytes would be missing),
    /// or more than a ring before it (the sender could not have held them).
    ResumeOutOfRange {
        /// Cursor the record declares.
        declared: u64,
        /// Our read cursor in the sender's ring stream.
        read: u64,
    },
    /// TCP ended inside the part of the continuation we had already read: the sender's
    /// stream ends before bytes it had written to the ring.
    ShortContinuation,
}

impl fmt::Display for FailoverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FailoverError::BadMagic(m) => write!(f, "failover record with bad magic {m:02x?}"),
            FailoverError::Version(v) => write!(f, "failover record version {v}"),
            FailoverError::Reserved => write!(f, "failover record with reserved bits set"),
            FailoverError::Nonce => write!(f, "failover record of another upgrade"),
            FailoverError::ResumeOutOfRange { declared, read } => write!(
                f,
                "continuation from ring byte {declared}, {read} already read"
            ),
            FailoverError::ShortContinuation => {
                write!(
                    f,
                    "TCP ended before the continuation reached the bytes read"
                )
            }
        }
    }
}
