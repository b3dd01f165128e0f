//! Sans-IO protocol core of rdmashim (see `docs/protocol.md`).
//!
//! This crate holds everything about the upgrade of a TCP connection to RDMA ring buffers that
//! can be decided without touching the OS: the rdma_cm private-data codec ([`handshake`]), the
//! immediate encoding of RDMA WRITE WITH IMMEDIATE ([`imm`]), control messages ([`control`]),
//! ring cursors ([`ring`]), the records of the polled ring kind ([`framing`]) and the wake-up of its sleeping
//! readers ([`wake`]), receive-slot credits ([`credit`]), the per-direction stream state
//! machines ([`state`]), the [`Connection`] driver that ties them together ([`conn`]), and the
//! upgrade's own decisions: upgradable addresses, the negative cache, request matching
//! ([`upgrade`]), and the binding of an upgrade to its TCP connection ([`binding`]: the
//! in-band token, the SYN marker, the handshake's tags). It performs no I/O, reads no clock and contains no `unsafe`: the transport
//! (verbs/rdma_cm, in `rdmashim-core`) feeds it events and performs the [`Action`]s it emits.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod binding;
pub mod conn;
pub mod control;
pub mod credit;
pub mod error;
pub mod failover;
pub mod framing;
pub mod handshake;
pub mod hostcache;
pub mod imm;
mod records;
pub mod ring;
pub mod state;
pub mod upgrade;
pub mod wake;
mod wire;

pub use binding::{BindingKey, Proof, Tag, TcpTuple};
pub use conn::{
    Action, Completion, Config, ConfigError, Connection, ConsumeError, LaneWrite, LocalParams,
    OfferError, Readiness, Recv, Resume, SendError, SendGrant, Side, Stats, SwitchBackError,
};
pub use control::{ControlBytes, ControlMsg, MAX_CONTROL_LEN};
pub use credit::CreditPolicy;
pub use error::{DecodeError, FailoverError};
pub use failover::{Record, RECORD_LEN};
pub use handshake::{
    AcceptReply, ConnectRequest, Flags, HandshakeError, Kind, Reject, RejectReason, RingDesc,
    SENDS_BUF,
};
pub use imm::{Imm, WireImm};
pub use ring::{Move, Place, RingSize, RxCursors, TxCursors, MAX_RING_LOG2, MIN_RING_LOG2};
pub use state::{
    ErrorReason, Fin, InvalidTransition, PeerFin, RxState, StreamState, TxState, Violation,
};

/// First four bytes of every handshake message.
pub const MAGIC: [u8; 4] = *b"RDSH";
/// The protocol version this crate speaks.
pub const PROTOCOL_VERSION: u8 = 2;
/// Fewest receives a side may post (the credit rules need at least 4; see [`credit`]).
pub const MIN_RECV_SLOTS: u16 = 4;
