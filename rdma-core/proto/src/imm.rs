//! The 32-bit immediate of RDMA WRITE WITH IMMEDIATE.
//!
//! ```text
//!  31 30 | 29 | 28 ........ 24 | 23 ...................... 0
//!  0  1  | W  | reserved (0)   | len: bytes just written        DATA
//!  1  0  | slots (0..=63)      | bytes freed (0..=2^24-1)       CREDIT
//!  1  1  | 0 ..................................................0  WAKE
//!  0  0  | W  | len (28..16) | slots (15..10) | units (9..0)     DATA + CREDIT (duplex)
//! ```
//!
//! * DATA: `len` bytes were written at the sender's tx cursor, i.e. the receiver's `rx_head`
//!   advances by `len`. `W` ("credit wanted") says the sender is blocked (or about to be) on
//!   credit and asks the receiver to return what it can at once instead of waiting for its
//!   thresholds.
//! * CREDIT (a zero-length write): the receiver consumed `bytes` more bytes and re-posted `slots`
//!   more receives since its previous credit. At least one of them is non-zero.
//! * WAKE (a zero-length write, records only, protocol §14): a doorbell for a reader that
//!   sleeps — its completion is the message. Its other bits are zero.
//! * DATA + CREDIT (duplex, protocol §17): a DATA of `len` bytes (1..=8191) that carries the
//!   sender's credit for the other direction: `units` × [`Imm::CREDIT_UNIT`] bytes consumed
//!   (0..=1023) and `slots` receives re-posted (0..=63) since its previous credit, not both
//!   zero. An all-zero
//!   immediate is never valid.
//! * With records, a DATA immediate comes with a record's WRITE (a wake-up, or `W`): `len` is
//!   the record's ring bytes, which the receiver finds by polling its ring, not by counting
//!   immediates.
//!
//! On the verbs boundary the immediate is big-endian (`__be32`). [`Imm::encode`] and
//! [`Imm::decode`] work on the host-order value; the transport converts exactly once, where it
//! fills `ibv_send_wr.imm_data` (`encode().to_be()`) and reads `ibv_wc.imm_data`
//! (`u32::from_be`). [`WireImm`] names the raw field form for code that moves it untouched.

use crate::error::DecodeError;

const KIND_SHIFT: u32 = 30;
const KIND_DATA: u32 = 0b01;
const KIND_CREDIT: u32 = 0b10;
const KIND_WAKE: u32 = 0b11;
const KIND_DATA_CREDIT: u32 = 0b00;
const DC_LEN_SHIFT: u32 = 16;
const DC_LEN_MASK: u32 = 0x1fff;
const DC_SLOTS_SHIFT: u32 = 10;
const DC_SLOTS_MASK: u32 = 0x3f;
const DC_UNITS_MASK: u32 = 0x3ff;
const WANT_BIT: u32 = 1 << 29;
const DATA_RESERVED: u32 = 0x1f << 24;
const SLOTS_SHIFT: u32 = 24;
const LOW24: u32 = (1 << 24) - 1;

/// An immediate as it appears in `ibv_send_wr.imm_data` and `ibv_wc.imm_data`: network byte
/// order, stored in a `u32`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WireImm(pub u32);

/// A decoded immediate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Imm {
    /// `len` bytes were written into the receiver's ring at its `rx_head`.
    Data {
        /// Bytes written, `1..=`[`Imm::MAX_DATA_LEN`].
        len: u32,
        /// The sender asks for credit now.
        credit_wanted: bool,
    },
    /// The receiver freed ring space and/or re-posted receives.
    Credit {
        /// Ring bytes freed since the previous credit, `0..=`[`Imm::MAX_CREDIT_BYTES`].
        bytes: u32,
        /// Receives re-posted since the previous credit, `0..=`[`Imm::MAX_CREDIT_SLOTS`].
        slots: u8,
    },
    /// Records: the writer wakes the reader that told it it sleeps.
    Wake,
    /// Duplex (protocol §17): a DATA of `len` bytes that returns credit for the other
    /// direction, as a CREDIT of `units` × [`Imm::CREDIT_UNIT`] bytes and `slots` would.
    DataCredit {
        /// Bytes written, `1..=`[`Imm::MAX_DUPLEX_LEN`].
        len: u32,
        /// The sender asks for credit now.
        credit_wanted: bool,
        /// Ring bytes freed since the previous credit, in [`Imm::CREDIT_UNIT`]s,
        /// `0..=`[`Imm::MAX_DUPLEX_UNITS`].
        units: u16,
        /// Receives re-posted since the previous credit, `0..=`[`Imm::MAX_DUPLEX_SLOTS`].
        slots: u8,
    },
}

impl Imm {
    /// Largest DATA length.
    pub const MAX_DATA_LEN: u32 = LOW24;
    /// Largest byte count in one CREDIT.
    pub const MAX_CREDIT_BYTES: u32 = LOW24;
    /// Largest slot count in one CREDIT.
    pub const MAX_CREDIT_SLOTS: u8 = 63;
    /// Largest DATA that carries a credit (duplex).
    pub const MAX_DUPLEX_LEN: u32 = DC_LEN_MASK;
    /// The bytes of a duplex credit's unit.
    pub const CREDIT_UNIT: u64 = 64;
    /// Most units in one duplex credit.
    pub const MAX_DUPLEX_UNITS: u16 = DC_UNITS_MASK as u16;
    /// Most slots in one duplex credit.
    pub const MAX_DUPLEX_SLOTS: u8 = DC_SLOTS_MASK as u8;

    /// The host-order value. Fields must be in range (see the constants); values produced by
    /// [`crate::Connection`] always are.
    pub fn encode(self) -> u32 {
        match self {
            Imm::Data { len, credit_wanted } => {
                debug_assert!((1..=Self::MAX_DATA_LEN).contains(&len));
                (KIND_DATA << KIND_SHIFT) | if credit_wanted { WANT_BIT } else { 0 } | (len & LOW24)
            }
            Imm::Credit { bytes, slots } => {
                debug_assert!(bytes <= Self::MAX_CREDIT_BYTES);
                debug_assert!(slots <= Self::MAX_CREDIT_SLOTS);
                debug_assert!(bytes > 0 || slots > 0);
                (KIND_CREDIT << KIND_SHIFT)
                    | (u32::from(slots & 0x3f) << SLOTS_SHIFT)
                    | (bytes & LOW24)
            }
            Imm::Wake => KIND_WAKE << KIND_SHIFT,
            Imm::DataCredit {
                len,
                credit_wanted,
                units,
                slots,
            } => {
                debug_assert!((1..=Self::MAX_DUPLEX_LEN).contains(&len));
                debug_assert!(units <= Self::MAX_DUPLEX_UNITS && slots <= Self::MAX_DUPLEX_SLOTS);
                debug_assert!(units > 0 || slots > 0);
                (KIND_DATA_CREDIT << KIND_SHIFT)
                    | if credit_wanted { WANT_BIT } else { 0 }
                    | ((len & DC_LEN_MASK) << DC_LEN_SHIFT)
                    | ((u32::from(slots) & DC_SLOTS_MASK) << DC_SLOTS_SHIFT)
                    | (u32::from(units) & DC_UNITS_MASK)
            }
        }
    }

    /// Whether host-order `v` is of a DATA's kind (with a credit or without), by its kind
    /// bits alone: no validation, which [`Self::decode`] does.
    pub fn is_data(v: u32) -> bool {
        matches!(v >> KIND_SHIFT, KIND_DATA | KIND_DATA_CREDIT)
    }

    /// Decodes a host-order value.
    pub fn decode(v: u32) -> Result<Self, DecodeError> {
        match v >> KIND_SHIFT {
            KIND_DATA => {
                if v & DATA_RESERVED != 0 {
                    return Err(DecodeError::ImmReservedBits(v));
                }
                let len = v & LOW24;
                if len == 0 {
                    return Err(DecodeError::ZeroLengthData);
                }
                Ok(Imm::Data {
                    len,
                    credit_wanted: v & WANT_BIT != 0,
                })
            }
            KIND_CREDIT => {
                let bytes = v & LOW24;
                let slots = ((v >> SLOTS_SHIFT) & 0x3f) as u8;
                if bytes == 0 && slots == 0 {
                    return Err(DecodeError::EmptyCredit);
                }
                Ok(Imm::Credit { bytes, slots })
            }
            KIND_WAKE if v == KIND_WAKE << KIND_SHIFT => Ok(Imm::Wake),
            KIND_WAKE => Err(DecodeError::ImmReservedBits(v)),
            _ => {
                // KIND_DATA_CREDIT (an all-zero immediate is none)
                if v == 0 {
                    return Err(DecodeError::UnknownKind(0));
                }
                let len = (v >> DC_LEN_SHIFT) & DC_LEN_MASK;
                if len == 0 {
                    return Err(DecodeError::ZeroLengthData);
                }
                let units = (v & DC_UNITS_MASK) as u16;
                let slots = ((v >> DC_SLOTS_SHIFT) & DC_SLOTS_MASK) as u8;
                if units == 0 && slots == 0 {
                    return Err(DecodeError::EmptyCredit);
                }
                Ok(Imm::DataCredit {
                    len,
                    credit_wanted: v & WANT_BIT != 0,
                    units,
                    slots,
                })
            }
        }
    }

    /// The immediate in verbs (network) byte order.
    pub fn to_wire(self) -> WireImm {
        WireImm(self.encode().to_be())
    }

    /// Decodes an immediate taken from a work completion.
    pub fn from_wire(w: WireImm) -> Result<Self, DecodeError> {
        Self::decode(u32::from_be(w.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_layout() {
        let v = Imm::Data {
            len: 0x12_3456,
            credit_wanted: false,
        }
        .encode();
        assert_eq!(v, 0x4012_3456);
        let v = Imm::Data {
            len: 1,
            credit_wanted: true,
        }
        .encode();
        assert_eq!(v, 0x6000_0001);
    }

    #[test]
    fn credit_layout() {
        let v = Imm::Credit {
            bytes: 4096,
            slots: 63,
        }
        .encode();
        assert_eq!(v, 0x8000_0000 | (63 << 24) | 4096);
        assert_eq!(
            Imm::decode(v),
            Ok(Imm::Credit {
                bytes: 4096,
                slots: 63
            })
        );
    }

    #[test]
    fn data_credit_layout() {
        let i = Imm::DataCredit {
            len: 64,
            credit_wanted: true,
            units: 1,
            slots: 1,
        };
        let v = i.encode();
        assert_eq!(v, 0x2000_0000 | (64 << 16) | (1 << 10) | 1);
        assert_eq!(Imm::decode(v), Ok(i));
        let max = Imm::DataCredit {
            len: Imm::MAX_DUPLEX_LEN,
            credit_wanted: false,
            units: Imm::MAX_DUPLEX_UNITS,
            slots: Imm::MAX_DUPLEX_SLOTS,
        };
        assert_eq!(max.encode(), 0x1fff_ffff);
        assert_eq!(Imm::decode(0x1fff_ffff), Ok(max));
        assert_eq!(Imm::decode(0x0000_0401), Err(DecodeError::ZeroLengthData));
        assert_eq!(Imm::decode(0x0001_0000), Err(DecodeError::EmptyCredit));
    }

    #[test]
    fn rejects() {
        assert_eq!(Imm::decode(0), Err(DecodeError::UnknownKind(0)));
        assert_eq!(
            Imm::decode(0xc000_0001),
            Err(DecodeError::ImmReservedBits(0xc000_0001))
        );
        assert_eq!(Imm::decode(0xc000_0000), Ok(Imm::Wake));
        assert_eq!(Imm::Wake.encode(), 0xc000_0000);
        assert_eq!(Imm::decode(0x4000_0000), Err(DecodeError::ZeroLengthData));
        assert_eq!(
            Imm::decode(0x4100_0001),
            Err(DecodeError::ImmReservedBits(0x4100_0001))
        );
        assert_eq!(Imm::decode(0x8000_0000), Err(DecodeError::EmptyCredit));
    }

    #[test]
    fn wire_is_big_endian() {
        let i = Imm::Data {
            len: 0x0102,
            credit_wanted: false,
        };
        let w = i.to_wire();
        assert_eq!(w.0.to_ne_bytes(), [0x40, 0x00, 0x01, 0x02]);
        assert_eq!(Imm::from_wire(w), Ok(i));
    }
}
