//! Control messages: small SENDs (at most [`MAX_CONTROL_LEN`] bytes) into the peer's posted
//! receive buffers, for what does not fit in an immediate.
//!
//! ```text
//! offset  size  field
//! 0       1     kind
//! 1       1     flags (per kind; unknown bits rejected)
//! 2       2     reserved, zero
//! 4       ...   body (per kind, big-endian)
//! ```
//!
//! | kind | name          | body                                  | flags       | length |
//! |------|---------------|---------------------------------------|-------------|--------|
//! | 1    | SwitchOver    | tcp_bytes_sent: u64                   | -           | 12     |
//! | 2    | ShutdownWrite | ring_bytes: u64 (final tx cursor)     | -           | 12     |
//! | 3    | Close         | ring_bytes: u64 (final tx cursor)     | bit0 RESET  | 12     |
//! | 4    | CreditUpdate  | read_cursor: u64, slots: u32          | -           | 16     |
//! | 5    | SwitchBack    | ring_bytes: u64, read_cursor: u64     | -           | 20     |
//! | 6    | RingOffer     | addr: u64, rkey: u32, size_log2: u8, 3 reserved | -  | 20     |
//! | 7    | RingMoved     | at: u64 (first stream cursor in the offered ring) | - | 12     |
//! | 8    | Sleeping      | seen: u64 (the reader's ring cursor)  | -           | 12     |
//! | 9    | Source        | addr: u64, rkey: u32, size_log2: u8, 3 reserved | -  | 20     |
//! | 10-127 | (reserved: must understand → [`DecodeError::UnknownKind`]) |     |             |        |
//! | 128   | Barrier       | epoch: u64 (1, 2, … per direction)    | -           | 12     |
//! | 129   | RingWanted    | size_log2: u8, 3 reserved             | -           | 8      |
//! | 130-255 | (may ignore → [`ControlMsg::Ignored`], any body)   |          |             | ≤ 64   |
//!
//! RingOffer, RingMoved and RingWanted (protocol §6.4) go only to a peer that announced
//! [`crate::Flags::RING_MOVES`]; Sleeping (§14) only on a connection that carries records
//! ([`crate::Flags::RECORDS`]); Source (§16) only on a connection whose DATA the receiver pulls
//! ([`crate::Flags::READ`]), once, as the sender's first message.
//!
//! Barrier is a may-ignore kind on purpose: it only means something to a peer that takes part
//! in a barrier itself, and a peer that does not know it loses nothing by ignoring it.
//!
//! The format belongs to the protocol version agreed in the handshake, so a message carries no
//! version byte of its own. Zero padding after a message is accepted, as for the handshake.

use crate::error::DecodeError;
use crate::wire::{check_padding, Reader, Writer};

/// Largest control message, padding included.
pub const MAX_CONTROL_LEN: usize = 64;

const KIND_SWITCH_OVER: u8 = 1;
const KIND_SHUTDOWN_WRITE: u8 = 2;
const KIND_CLOSE: u8 = 3;
const KIND_CREDIT_UPDATE: u8 = 4;
const KIND_SWITCH_BACK: u8 = 5;
const KIND_RING_OFFER: u8 = 6;
const KIND_RING_MOVED: u8 = 7;
const KIND_SLEEPING: u8 = 8;
const KIND_SOURCE: u8 = 9;
const KIND_RING_WANTED: u8 = 129;
/// Kind byte of [`ControlMsg::Barrier`] (a may-ignore kind).
pub const KIND_BARRIER: u8 = 128;
/// Kinds at or above this may be ignored by a receiver that does not know them.
pub const FIRST_IGNORABLE_KIND: u8 = 128;
const CLOSE_RESET: u8 = 0x01;

/// A control message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ControlMsg {
    /// The sender's first stream message on the ring: it sent exactly `tcp_bytes_sent` bytes on
    /// TCP before switching, and sends nothing more on TCP. The receiver reads that many bytes
    /// from TCP (in total) before it reads the ring.
    SwitchOver {
        /// Total bytes the sender wrote to the TCP socket.
        tcp_bytes_sent: u64,
    },
    /// The sender will write no more (`shutdown(SHUT_WR)`); it follows all its data.
    ShutdownWrite {
        /// Total bytes the sender wrote into the ring (its final tx cursor).
        ring_bytes: u64,
    },
    /// The sender closed the connection: it writes no more and reads no more. With `reset`, it
    /// dropped data (unread input or unsent output) and the stream is broken, as with a TCP RST.
    Close {
        /// Total bytes the sender wrote into the ring.
        ring_bytes: u64,
        /// Abortive close: the receiver reports ECONNRESET.
        reset: bool,
    },
    /// A credit in absolute form, for slot counts that do not fit a CREDIT immediate.
    CreditUpdate {
        /// The receiver's read cursor (everything before it is consumed).
        read_cursor: u64,
        /// Receives re-posted since the previous credit.
        slots: u32,
    },
    /// The sender returns the connection to TCP (protocol §8.5): it posted `ring_bytes` stream
    /// bytes into the ring in all and posts no more stream messages; it stopped reading the
    /// receiver's ring at `read_cursor`, so the receiver's stream goes on over TCP from that
    /// cursor. Only after it has both sent and received a SwitchBack does a side write its
    /// continuation to TCP. Sent only to a peer that announced [`crate::Flags::SWITCH_BACK`].
    SwitchBack {
        /// Stream bytes the sender wrote into the ring in total (all before this message).
        ring_bytes: u64,
        /// The receiver's stream cursor at which the sender stopped reading the ring.
        read_cursor: u64,
    },
    /// The sender reached a barrier (the native API's `barrier`); `epoch` counts the sender's
    /// barriers on this connection, from 1. It follows the data the sender accepted before it.
    Barrier {
        /// 1 for the first barrier, 2 for the next, …
        epoch: u64,
    },
    /// The receiver of a direction offers another ring for it (protocol §6.4): registered,
    /// empty, the peer's to write from a cursor of its choosing on ([`Self::RingMoved`]).
    RingOffer {
        /// The offered ring.
        ring: crate::RingDesc,
    },
    /// The sender of a direction moved to the ring last offered: its stream bytes from cursor
    /// `at` on are written there (at `cursor mod its size`), every byte before `at` was written
    /// to the old ring before this message.
    RingMoved {
        /// The first stream cursor in the offered ring.
        at: u64,
    },
    /// The sender of a direction asks for a ring of this size: its writes wait for the
    /// current one's space (a may-ignore kind: the receiver decides).
    RingWanted {
        /// The size asked for.
        size: crate::RingSize,
    },
    /// The reader of a direction that carries records stops polling its ring and sleeps until
    /// a completion wakes it (protocol §14, [`crate::wake`]): it found nothing at ring cursor
    /// `seen`. The writer answers with a wake-up once it has written, or has written, past it.
    Sleeping {
        /// The reader's ring cursor (everything before it was found).
        seen: u64,
    },
    /// READ pull (protocol §16): where the sender's DATA can be read, its staging area
    /// (registered for this connection's peer to read, the receiver's ring's size). The
    /// sender's first message on such a connection, before any announcement.
    Source {
        /// The staging area.
        ring: crate::RingDesc,
    },
    /// A may-ignore message from a newer peer; it still used a receive slot.
    Ignored {
        /// Its kind, at least [`FIRST_IGNORABLE_KIND`].
        kind: u8,
    },
}

/// An encoded control message: the bytes to SEND.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ControlBytes {
    buf: [u8; MAX_CONTROL_LEN],
    len: usize,
}

impl ControlBytes {
    /// The message bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl ControlMsg {
    /// Encodes the message.
    pub fn encode(&self) -> ControlBytes {
        let mut w = Writer::<MAX_CONTROL_LEN>::new();
        match *self {
            ControlMsg::SwitchOver { tcp_bytes_sent } => {
                w.u8(KIND_SWITCH_OVER).u8(0).u16(0).u64(tcp_bytes_sent);
            }
            ControlMsg::ShutdownWrite { ring_bytes } => {
                w.u8(KIND_SHUTDOWN_WRITE).u8(0).u16(0).u64(ring_bytes);
            }
            ControlMsg::Close { ring_bytes, reset } => {
                let flags = if reset { CLOSE_RESET } else { 0 };
                w.u8(KIND_CLOSE).u8(flags).u16(0).u64(ring_bytes);
            }
            ControlMsg::CreditUpdate { read_cursor, slots } => {
                w.u8(KIND_CREDIT_UPDATE)
                    .u8(0)
                    .u16(0)
                    .u64(read_cursor)
                    .u32(slots);
            }
            ControlMsg::SwitchBack {
                ring_bytes,
                read_cursor,
            } => {
                w.u8(KIND_SWITCH_BACK)
                    .u8(0)
                    .u16(0)
                    .u64(ring_bytes)
                    .u64(read_cursor);
            }
            ControlMsg::Barrier { epoch } => {
                w.u8(KIND_BARRIER).u8(0).u16(0).u64(epoch);
            }
            ControlMsg::RingOffer { ring } | ControlMsg::Source { ring } => {
                let kind = match self {
                    ControlMsg::Source { .. } => KIND_SOURCE,
                    _ => KIND_RING_OFFER,
                };
                w.u8(kind)
                    .u8(0)
                    .u16(0)
                    .u64(ring.addr)
                    .u32(ring.rkey)
                    .u8(ring.size.log2())
                    .u8(0)
                    .u16(0);
            }
            ControlMsg::RingMoved { at } => {
                w.u8(KIND_RING_MOVED).u8(0).u16(0).u64(at);
            }
            ControlMsg::Sleeping { seen } => {
                w.u8(KIND_SLEEPING).u8(0).u16(0).u64(seen);
            }
            ControlMsg::RingWanted { size } => {
                w.u8(KIND_RING_WANTED)
                    .u8(0)
                    .u16(0)
                    .u8(size.log2())
                    .u8(0)
                    .u16(0);
            }
            ControlMsg::Ignored { kind } => {
                debug_assert!(kind > KIND_RING_WANTED);
                w.u8(kind).u8(0).u16(0);
            }
        }
        let (buf, len) = w.finish();
        ControlBytes { buf, len }
    }

    /// Decodes a received SEND payload.
    pub fn decode(input: &[u8]) -> Result<Self, DecodeError> {
        if input.len() > MAX_CONTROL_LEN {
            return Err(DecodeError::TooLong {
                max: MAX_CONTROL_LEN,
                got: input.len(),
            });
        }
        if input.is_empty() {
            return Err(DecodeError::Empty);
        }
        let mut r = Reader::new(input);
        let kind = r.u8()?;
        if kind > KIND_RING_WANTED {
            return Ok(ControlMsg::Ignored { kind });
        }
        let (len, allowed_flags) = match kind {
            KIND_SWITCH_OVER | KIND_SHUTDOWN_WRITE | KIND_BARRIER | KIND_RING_MOVED
            | KIND_SLEEPING => (12, 0),
            KIND_CLOSE => (12, CLOSE_RESET),
            KIND_CREDIT_UPDATE => (16, 0),
            KIND_SWITCH_BACK | KIND_RING_OFFER | KIND_SOURCE => (20, 0),
            KIND_RING_WANTED => (8, 0),
            0 if input.iter().all(|&b| b == 0) => return Err(DecodeError::Empty),
            k => return Err(DecodeError::UnknownKind(k)),
        };
        check_padding(input, len)?;
        let flags = r.u8()?;
        if flags & !allowed_flags != 0 {
            return Err(DecodeError::UnknownFlags(u16::from(flags & !allowed_flags)));
        }
        r.reserved(2)?;
        Ok(match kind {
            KIND_SWITCH_OVER => ControlMsg::SwitchOver {
                tcp_bytes_sent: r.u64()?,
            },
            KIND_SHUTDOWN_WRITE => ControlMsg::ShutdownWrite {
                ring_bytes: r.u64()?,
            },
            KIND_CLOSE => ControlMsg::Close {
                ring_bytes: r.u64()?,
                reset: flags & CLOSE_RESET != 0,
            },
            KIND_BARRIER => ControlMsg::Barrier { epoch: r.u64()? },
            KIND_SWITCH_BACK => ControlMsg::SwitchBack {
                ring_bytes: r.u64()?,
                read_cursor: r.u64()?,
            },
            KIND_RING_OFFER | KIND_SOURCE => {
                let (addr, rkey, log2) = (r.u64()?, r.u32()?, r.u8()?);
                r.reserved(3)?;
                let size =
                    crate::RingSize::from_log2(log2).map_err(|_| DecodeError::BadRingSize(log2))?;
                let ring = crate::RingDesc { addr, rkey, size };
                match kind {
                    KIND_SOURCE => ControlMsg::Source { ring },
                    _ => ControlMsg::RingOffer { ring },
                }
            }
            KIND_RING_MOVED => ControlMsg::RingMoved { at: r.u64()? },
            KIND_SLEEPING => ControlMsg::Sleeping { seen: r.u64()? },
            KIND_RING_WANTED => {
                let log2 = r.u8()?;
                r.reserved(3)?;
                ControlMsg::RingWanted {
                    size: crate::RingSize::from_log2(log2)
                        .map_err(|_| DecodeError::BadRingSize(log2))?,
                }
            }
            _ => ControlMsg::CreditUpdate {
                read_cursor: r.u64()?,
                slots: r.u32()?,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts() {
        let b = ControlMsg::SwitchOver {
            tcp_bytes_sent: 0x0102_0304_0506_0708,
        }
        .encode();
        assert_eq!(b.as_bytes(), &[1, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]);
        let b = ControlMsg::Close {
            ring_bytes: 5,
            reset: true,
        }
        .encode();
        assert_eq!(b.as_bytes(), &[3, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5]);
        let b = ControlMsg::CreditUpdate {
            read_cursor: 1,
            slots: 2,
        }
        .encode();
        assert_eq!(b.as_bytes().len(), 16);
        assert!(b.as_bytes().len() <= MAX_CONTROL_LEN);
        let b = ControlMsg::SwitchBack {
            ring_bytes: 0x0102,
            read_cursor: 0x0304,
        }
        .encode();
        assert_eq!(
            b.as_bytes(),
            &[5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 0, 0, 3, 4]
        );
        assert_eq!(
            ControlMsg::decode(&[5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2]),
            Err(DecodeError::Truncated { need: 20, got: 12 })
        );
        let b = ControlMsg::Barrier { epoch: 0x0102 }.encode();
        assert_eq!(b.as_bytes(), &[128, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2]);
        assert_eq!(
            ControlMsg::decode(b.as_bytes()),
            Ok(ControlMsg::Barrier { epoch: 0x0102 })
        );
    }

    #[test]
    fn ring_moves() {
        let ring = crate::RingDesc {
            addr: 0x0102,
            rkey: 0x0304,
            size: crate::RingSize::new(1 << 16).unwrap(),
        };
        let b = ControlMsg::RingOffer { ring }.encode();
        assert_eq!(
            b.as_bytes(),
            &[6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 0, 0, 3, 4, 16, 0, 0, 0]
        );
        assert_eq!(
            ControlMsg::decode(b.as_bytes()),
            Ok(ControlMsg::RingOffer { ring })
        );
        let mut bad = *b.as_bytes().first_chunk::<20>().unwrap();
        bad[16] = 30;
        assert_eq!(ControlMsg::decode(&bad), Err(DecodeError::BadRingSize(30)));
        bad[16] = 16;
        bad[19] = 1;
        assert_eq!(
            ControlMsg::decode(&bad),
            Err(DecodeError::ReservedNonZero { offset: 19 })
        );
        let b = ControlMsg::RingMoved { at: 7 }.encode();
        assert_eq!(b.as_bytes(), &[7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7]);
        assert_eq!(
            ControlMsg::decode(b.as_bytes()),
            Ok(ControlMsg::RingMoved { at: 7 })
        );
        let b = ControlMsg::Source { ring }.encode();
        assert_eq!(
            b.as_bytes(),
            &[9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 0, 0, 3, 4, 16, 0, 0, 0]
        );
        assert_eq!(
            ControlMsg::decode(b.as_bytes()),
            Ok(ControlMsg::Source { ring })
        );
        assert_eq!(
            ControlMsg::decode(&b.as_bytes()[..12]),
            Err(DecodeError::Truncated { need: 20, got: 12 })
        );
        let size = crate::RingSize::new(1 << 20).unwrap();
        let b = ControlMsg::RingWanted { size }.encode();
        assert_eq!(b.as_bytes(), &[129, 0, 0, 0, 20, 0, 0, 0]);
        assert_eq!(
            ControlMsg::decode(b.as_bytes()),
            Ok(ControlMsg::RingWanted { size })
        );
        assert_eq!(
            ControlMsg::decode(&[129, 0, 0, 0, 3, 0, 0, 0]),
            Err(DecodeError::BadRingSize(3))
        );
    }

    #[test]
    fn barrier_rejects() {
        assert_eq!(
            ControlMsg::decode(&[128, 0, 0, 0, 0]),
            Err(DecodeError::Truncated { need: 12, got: 5 })
        );
        assert_eq!(
            ControlMsg::decode(&[128, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]),
            Err(DecodeError::UnknownFlags(1))
        );
        assert_eq!(
            ControlMsg::decode(&[128, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1]),
            Err(DecodeError::ReservedNonZero { offset: 2 })
        );
        assert_eq!(
            ControlMsg::decode(&[128, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 9]),
            Err(DecodeError::TrailingBytes { offset: 13 })
        );
        // the next may-ignore kinds are still ignored
        assert_eq!(
            ControlMsg::decode(&[130]),
            Ok(ControlMsg::Ignored { kind: 130 })
        );
    }

    #[test]
    fn rejects() {
        assert_eq!(ControlMsg::decode(&[]), Err(DecodeError::Empty));
        assert_eq!(ControlMsg::decode(&[0; 12]), Err(DecodeError::Empty));
        assert_eq!(
            ControlMsg::decode(&[0; 65]),
            Err(DecodeError::TooLong { max: 64, got: 65 })
        );
        assert_eq!(
            ControlMsg::decode(&[10, 0, 0, 0]),
            Err(DecodeError::UnknownKind(10))
        );
        assert_eq!(
            ControlMsg::decode(&[1, 0, 0, 0, 0]),
            Err(DecodeError::Truncated { need: 12, got: 5 })
        );
        assert_eq!(
            ControlMsg::decode(&[2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
            Err(DecodeError::UnknownFlags(1))
        );
        assert_eq!(
            ControlMsg::decode(&[3, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
            Err(DecodeError::UnknownFlags(2))
        );
        assert_eq!(
            ControlMsg::decode(&[1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]),
            Err(DecodeError::ReservedNonZero { offset: 3 })
        );
        assert_eq!(
            ControlMsg::decode(&[1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7]),
            Err(DecodeError::TrailingBytes { offset: 13 })
        );
        assert_eq!(
            ControlMsg::decode(&[200, 1, 2, 3, 4]),
            Ok(ControlMsg::Ignored { kind: 200 })
        );
    }
}
