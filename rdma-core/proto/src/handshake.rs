//! Handshake codec: the private data of rdma_cm's connect request, accept reply and reject.
//!
//! All three messages start with the same 6-byte header: [`MAGIC`], a version byte and a kind
//! byte. Layouts are fixed per (version, kind); see `docs/protocol.md` for the byte tables.
//!
//! Length and padding: rdma_cm delivers the whole private-data area of the CM message (e.g. 56
//! bytes for a request however few were sent), zero-filled past what the sender wrote. A decoder
//! therefore accepts any input at least as long as the message whose bytes past the message are
//! all zero, and rejects non-zero trailing bytes ([`DecodeError::TrailingBytes`]). An input that
//! is empty or all zero is [`DecodeError::Empty`] (the peer sent no private data).
//!
//! Flags: the low byte of the 16-bit flags field holds "must understand" bits, the high byte
//! "may ignore" bits. A decoder rejects unknown must-understand bits
//! ([`DecodeError::UnknownFlags`]) and keeps unknown may-ignore bits as they are (so re-encoding
//! a decoded message reproduces it byte for byte). Version 2 defines five must-understand
//! flags, [`Flags::NATIVE`], and [`Flags::RECORDS`], [`Flags::SENDS`], [`Flags::READ`] and
//! [`Flags::DUPLEX`] (replies only), and the may-ignore flags [`Flags::SWITCH_BACK`],
//! [`Flags::REDIRECT`], [`Flags::FAILOVER`], [`Flags::RING_MOVES`], and
//! [`Flags::RECORDS_OFFERED`], [`Flags::SENDS_OFFERED`], [`Flags::READ_OFFERED`] and
//! [`Flags::DUPLEX_OFFERED`] (requests only).
//!
//! Version 2 (`docs/protocol.md` 2.9) appends a [`Tag`] to the request and the reply: an HMAC
//! under the key the server sent in-band on the TCP connection ([`crate::binding`]), which
//! binds the upgrade to that connection. A native stream (no TCP connection behind it) sets
//! `NATIVE` and carries a zero tag.

use std::fmt;

use crate::binding::{self, BindingKey, Tag, TcpTuple, TAG_LEN};
use crate::error::DecodeError;
use crate::ring::RingSize;
use crate::wire::{check_padding, Reader, Writer};
use crate::{MAGIC, MIN_RECV_SLOTS, PROTOCOL_VERSION};

/// Kind byte of a [`ConnectRequest`].
pub const KIND_CONNECT_REQUEST: u8 = 1;
/// Kind byte of an [`AcceptReply`].
pub const KIND_ACCEPT_REPLY: u8 = 2;
/// Kind byte of a [`Reject`].
pub const KIND_REJECT: u8 = 3;

/// Where a [`ConnectRequest`]'s tag starts: the bytes before it are what the tag covers.
pub const REQUEST_TAG_AT: usize = 36;
/// Encoded length of a version-2 [`ConnectRequest`] (rdma_cm allows 56 bytes).
pub const CONNECT_REQUEST_LEN: usize = REQUEST_TAG_AT + TAG_LEN;
/// Where an [`AcceptReply`]'s tag starts.
pub const REPLY_TAG_AT: usize = 32;
/// Encoded length of a version-2 [`AcceptReply`] (rdma_cm allows 196 bytes).
pub const ACCEPT_REPLY_LEN: usize = REPLY_TAG_AT + TAG_LEN;
/// Encoded length of a [`Reject`] (rdma_cm allows 148 bytes): bytes 8–9 hold the port of a
/// [`RejectReason::Redirect`] and are zero in every other rejection, so a rejection of any other
/// reason is the 8-byte message older peers send and read.
pub const REJECT_LEN: usize = 10;
/// Length of a [`Reject`] that is not a [`RejectReason::Redirect`].
pub const REJECT_BASE_LEN: usize = 8;

/// How a connection's bytes travel (protocol §3, §14, §15). Every side can carry
/// [`Kind::WriteImm`]; a client offers the kind it wants in its request, and the server
/// chooses it only if it wants that kind too, else WRITE WITH IMMEDIATE.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Kind {
    /// The ring written by RDMA WRITE WITH IMMEDIATE: a DATA's immediate and its receive
    /// completion tell the receiver of its bytes (protocol §3).
    #[default]
    WriteImm,
    /// Records (protocol §14): the ring written by plain RDMA WRITEs of framed records whose
    /// trailer the receiver polls in ring memory ([`Connection::poll_ring`](crate::Connection::poll_ring)); no completion
    /// per message. A connection that carries records does not (yet) take part in ring moves,
    /// switch-backs or failover, and says so in its handshake. The transport zeroes its
    /// receive ring before it advertises it, and its staging area is double-mapped: a record
    /// is one WRITE, which `split_at_wrap` does not split.
    Records,
    /// Sends (protocol §15): a DATA is a SEND WITH IMMEDIATE of at most [`SENDS_BUF`] bytes
    /// into one of the receiver's posted receives, whose transport copies it into its ring
    /// where the ring's next bytes go ([`Connection::landing`](crate::Connection::landing)) before it hands the completion
    /// over; credits and doorbells are zero-length SENDs WITH IMMEDIATE. Nothing is written
    /// into the peer's memory. Ring moves, switch-backs and failover work as over
    /// [`Kind::WriteImm`]: a ring cursor is still a stream offset.
    Sends,
    /// READ pull (protocol §16): a DATA is an announcement, a zero-length WRITE WITH
    /// IMMEDIATE; its bytes stay in the sender's staging area (registered for the peer to
    /// read, its address sent first in a [`ControlMsg::Source`](crate::ControlMsg::Source)) at
    /// the offset they have in the receiver's ring, and the receiving transport pulls them
    /// with an RDMA READ into its ring ([`Connection::landing_after`](crate::Connection::landing_after))
    /// before it hands the announcement over. No ring moves (a staging area per generation
    /// would need a Source each); switch-backs and failover as over [`Kind::WriteImm`]. A side
    /// whose end went out tears down only once its peer confirmed the end, after its last pull
    /// ([`Connection::peer_pulled`](crate::Connection::peer_pulled)).
    Read,
    /// Duplex (protocol §17): [`Kind::WriteImm`] whose DATA also carry the sender's credit
    /// for the other direction when it owes one ([`Imm::DataCredit`](crate::Imm::DataCredit)):
    /// a side with data to send returns credit in it instead of in a message of its own.
    /// Everything else as over [`Kind::WriteImm`].
    Duplex,
}

impl Kind {
    /// The kinds, in the order the benches list them.
    pub const ALL: [Kind; 5] = [
        Kind::WriteImm,
        Kind::Records,
        Kind::Sends,
        Kind::Read,
        Kind::Duplex,
    ];

    /// The kind's short name (`imm`, `records`, `sends`, `read`, `duplex`), as knobs and
    /// benches spell it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::WriteImm => "imm",
            Kind::Records => "records",
            Kind::Sends => "sends",
            Kind::Read => "read",
            Kind::Duplex => "duplex",
        }
    }

    /// The kind named `name` ([`Self::name`]).
    pub fn from_name(name: &str) -> Option<Kind> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// The receive buffer a side that offers [`Kind::Sends`] posts (each receive, every slot), and
/// so the most one DATA SEND carries.
pub const SENDS_BUF: usize = 16 * 1024;

/// The 16-bit flags field of the handshake messages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Flags(u16);

impl Flags {
    /// Bits a receiver must understand: unknown ones make it reject the message.
    pub const REQUIRED_MASK: u16 = 0x00ff;
    /// Must-understand bits defined by this version.
    pub const KNOWN_REQUIRED: u16 =
        Self::NATIVE.0 | Self::RECORDS.0 | Self::SENDS.0 | Self::READ.0 | Self::DUPLEX.0;
    /// A native stream's handshake: no TCP connection behind it, so nothing to bind to and a
    /// zero tag. A shim's listener rejects such a request; a native listener accepts only them.
    pub const NATIVE: Flags = Flags(0x0001);
    /// May ignore: the sender understands `SwitchBack` (protocol §8.5), so the other side may
    /// return the connection to TCP. A side sends a SwitchBack only to a peer that set it.
    pub const SWITCH_BACK: Flags = Flags(0x0100);
    /// May ignore (requests): the sender follows a [`RejectReason::Redirect`] by dialing the
    /// named port once (protocol 2.4). A server redirects only a request that set it, so an
    /// older client never receives a rejection it cannot decode.
    pub const REDIRECT: Flags = Flags(0x0200);
    /// May ignore: the sender goes on over TCP when the ring's path fails, and reads the
    /// peer's continuation there (protocol §8.6). A side fails over only if both set it.
    pub const FAILOVER: Flags = Flags(0x0400);
    /// May ignore: the sender takes part in ring moves (protocol §6.4): it moves its writes
    /// to a ring the peer offers, and may offer its own. Used only if both set it.
    pub const RING_MOVES: Flags = Flags(0x0800);
    /// May ignore (requests): the client can write and read records, the ring kind whose
    /// receiver polls ring memory instead of taking a completion per message (protocol §14).
    /// A server that ignores it answers without [`Flags::RECORDS`], and the connection uses
    /// WRITE WITH IMMEDIATE as before.
    pub const RECORDS_OFFERED: Flags = Flags(0x1000);
    /// Must understand (replies): both directions carry records (protocol §14). A server sets
    /// it only in reply to a request with [`Flags::RECORDS_OFFERED`]; a client that did not
    /// offer them refuses such a reply ([`HandshakeError::Unoffered`]), and one that
    /// cannot read records at all cannot decode it, rather than misread its ring.
    pub const RECORDS: Flags = Flags(0x0002);
    /// May ignore (requests): the client's receives take SENDs of
    /// [`SENDS_BUF`] bytes, and it can carry its DATA as SENDs WITH
    /// IMMEDIATE (protocol §15). A server that ignores it answers without [`Flags::SENDS`].
    pub const SENDS_OFFERED: Flags = Flags(0x2000);
    /// Must understand (replies): both directions carry their DATA as SENDs (protocol §15).
    /// Set only in reply to [`Flags::SENDS_OFFERED`], never with [`Flags::RECORDS`]; a client
    /// that did not offer it refuses the reply ([`HandshakeError::Unoffered`]), and one that
    /// does not know it cannot decode it (its receives are too small for such SENDs).
    pub const SENDS: Flags = Flags(0x0004);
    /// May ignore (requests): the client can pull its peer's DATA with RDMA READs and let its
    /// peer pull its own (protocol §16). A server that ignores it answers without
    /// [`Flags::READ`].
    pub const READ_OFFERED: Flags = Flags(0x4000);
    /// Must understand (replies): both directions carry their DATA as announcements whose
    /// bytes the receiver pulls (protocol §16). Set only in reply to [`Flags::READ_OFFERED`];
    /// a client that did not offer it refuses the reply ([`HandshakeError::Unoffered`]), and
    /// one that does not know it cannot decode it (it would take an announcement's stale ring
    /// bytes for data).
    pub const READ: Flags = Flags(0x0008);
    /// May ignore (requests): the client can take credit in its peer's DATA and return its
    /// own in its DATA (protocol §17). A server that ignores it answers without
    /// [`Flags::DUPLEX`].
    pub const DUPLEX_OFFERED: Flags = Flags(0x8000);
    /// Must understand (replies): both directions' DATA may carry credit (protocol §17). Set
    /// only in reply to [`Flags::DUPLEX_OFFERED`]; a client that did not offer it refuses
    /// the reply, and one that does not know it cannot decode it (it would refuse such a
    /// DATA's immediate).
    pub const DUPLEX: Flags = Flags(0x0010);

    /// No flag set.
    pub const fn empty() -> Self {
        Flags(0)
    }

    /// Flags with exactly these bits, unknown ones included (for tests and forwarding).
    pub const fn from_bits_retain(bits: u16) -> Self {
        Flags(bits)
    }

    /// The raw bits.
    pub const fn bits(self) -> u16 {
        self.0
    }

    /// Whether every bit of `other` is set here.
    pub const fn contains(self, other: Flags) -> bool {
        self.0 & other.0 == other.0
    }

    /// These flags with `other`'s bits added.
    pub const fn with(self, other: Flags) -> Flags {
        Flags(self.0 | other.0)
    }

    fn check(bits: u16) -> Result<Self, DecodeError> {
        let unknown = bits & Self::REQUIRED_MASK & !Self::KNOWN_REQUIRED;
        if unknown != 0 {
            return Err(DecodeError::UnknownFlags(unknown));
        }
        Ok(Flags(bits))
    }
}

/// A receive ring as advertised to the peer: where to RDMA WRITE and with which key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RingDesc {
    /// Remote virtual address of the ring's first byte (the start of the double mapping).
    pub addr: u64,
    /// Remote key of the ring's memory region (REMOTE_WRITE only).
    pub rkey: u32,
    /// Ring size (the double mapping is twice this).
    pub size: RingSize,
}

/// Client → server, in the private data of `rdma_connect`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnectRequest {
    /// Handshake flags.
    pub flags: Flags,
    /// The client's TCP source port of the connection being upgraded.
    pub client_port: u16,
    /// The server's TCP port (the one the client connected to).
    pub server_port: u16,
    /// Random value chosen by the client and echoed in the reply.
    pub nonce: u64,
    /// The client's receive ring.
    pub ring: RingDesc,
    /// Receives the client has posted before connecting: the server's initial message credit.
    pub recv_slots: u16,
    /// [`binding::request_tag`] over the TCP 4-tuple and the bytes before it (zero if
    /// [`Flags::NATIVE`]).
    pub tag: Tag,
}

/// Server → client, in the private data of `rdma_accept`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AcceptReply {
    /// Handshake flags.
    pub flags: Flags,
    /// The request's nonce, echoed.
    pub nonce: u64,
    /// The server's receive ring.
    pub ring: RingDesc,
    /// Receives the server has posted before accepting: the client's initial message credit.
    pub recv_slots: u16,
    /// [`binding::reply_tag`] over the request's tag and the bytes before it (zero if
    /// [`Flags::NATIVE`]).
    pub tag: Tag,
}

/// Why a server refused an upgrade.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RejectReason {
    /// No accepted TCP connection matches the request's address and ports.
    NoMatchingTcp,
    /// The request's protocol version is not spoken here (see [`Reject::max_version`]).
    UnsupportedVersion,
    /// The request could not be decoded.
    Malformed,
    /// Out of memory, queue pairs, registrations or similar.
    Resources,
    /// Upgrades are disabled by configuration or policy on the server.
    Disabled,
    /// The TCP connection is already upgraded or being upgraded.
    Duplicate,
    /// The request does not prove that its sender holds the TCP connection (its tag does not
    /// verify, the connection got no key, or a native request where a TCP connection is named).
    Unproven,
    /// The connection is served by another rdma_cm listener of the same host, on this port
    /// (a fork child that took over the connection from the process that accepted it): dial
    /// there with the same request. Sent only to a request with [`Flags::REDIRECT`].
    Redirect(u16),
    /// A code this version does not know (sent by a newer peer); still a rejection.
    Other(u8),
}

impl RejectReason {
    /// The wire code (never 0).
    pub fn code(self) -> u8 {
        match self {
            RejectReason::NoMatchingTcp => 1,
            RejectReason::UnsupportedVersion => 2,
            RejectReason::Malformed => 3,
            RejectReason::Resources => 4,
            RejectReason::Disabled => 5,
            RejectReason::Duplicate => 6,
            RejectReason::Unproven => 7,
            RejectReason::Redirect(_) => 8,
            RejectReason::Other(c) => c,
        }
    }

    /// What bytes 8–9 of the rejection hold: a redirect's port, else 0.
    pub fn port(self) -> u16 {
        match self {
            RejectReason::Redirect(p) => p,
            _ => 0,
        }
    }

    /// The reason for a code and the port in bytes 8–9 (used only by a redirect, which must
    /// name one); 0 is invalid, unknown codes become [`RejectReason::Other`].
    pub fn from_wire(code: u8, port: u16) -> Result<Self, DecodeError> {
        Ok(match code {
            0 => return Err(DecodeError::BadRejectCode(0)),
            8 if port == 0 => return Err(DecodeError::ZeroDialPort),
            8 => RejectReason::Redirect(port),
            1 => RejectReason::NoMatchingTcp,
            2 => RejectReason::UnsupportedVersion,
            3 => RejectReason::Malformed,
            4 => RejectReason::Resources,
            5 => RejectReason::Disabled,
            6 => RejectReason::Duplicate,
            7 => RejectReason::Unproven,
            c => RejectReason::Other(c),
        })
    }

    /// The reason a server should give for a request that failed to decode.
    pub fn for_decode_error(e: &DecodeError) -> Self {
        match e {
            DecodeError::UnsupportedVersion(_) => RejectReason::UnsupportedVersion,
            _ => RejectReason::Malformed,
        }
    }
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RejectReason::NoMatchingTcp => write!(f, "no matching TCP connection"),
            RejectReason::UnsupportedVersion => write!(f, "unsupported protocol version"),
            RejectReason::Malformed => write!(f, "malformed request"),
            RejectReason::Resources => write!(f, "out of resources"),
            RejectReason::Disabled => write!(f, "upgrades disabled"),
            RejectReason::Duplicate => write!(f, "connection already upgraded"),
            RejectReason::Unproven => write!(f, "no proof of holding the TCP connection"),
            RejectReason::Redirect(p) => write!(f, "served on rdma_cm port {p}"),
            RejectReason::Other(c) => write!(f, "reject reason {c}"),
        }
    }
}

/// Server → client, in the private data of `rdma_reject`. Its layout is the same in every
/// protocol version, so any peer can read a rejection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Reject {
    /// Why.
    pub reason: RejectReason,
    /// The highest protocol version the rejecting side speaks (sent in the version byte).
    pub max_version: u8,
}

impl Reject {
    /// A rejection from this implementation.
    pub fn new(reason: RejectReason) -> Self {
        Reject {
            reason,
            max_version: PROTOCOL_VERSION,
        }
    }
}

/// A handshake reply that does not fit the request it answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HandshakeError {
    /// The reply did not decode.
    Decode(DecodeError),
    /// The reply echoes another nonce than the request's.
    NonceMismatch {
        /// The request's nonce.
        expected: u64,
        /// The nonce in the reply.
        got: u64,
    },
    /// The reply's tag does not verify: its sender is not the server that holds the TCP
    /// connection (or a native reply answered a bound request, or the other way round).
    Unproven,
    /// The reply chose a connection kind ([`Flags::RECORDS`], [`Flags::SENDS`]) the request
    /// did not offer.
    Unoffered(Kind),
}

impl fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandshakeError::Decode(e) => write!(f, "bad accept reply: {e}"),
            HandshakeError::NonceMismatch { expected, got } => {
                write!(
                    f,
                    "reply nonce {got:#x} does not match request {expected:#x}"
                )
            }
            HandshakeError::Unproven => {
                write!(f, "the reply does not prove it comes from the TCP peer")
            }
            HandshakeError::Unoffered(kind) => {
                write!(
                    f,
                    "the reply chose the connection kind {}, which the request did not offer",
                    kind.name()
                )
            }
        }
    }
}

impl std::error::Error for HandshakeError {}

/// Reads the common header; returns (version, kind) and a reader positioned after it.
fn header(input: &[u8]) -> Result<(u8, u8, Reader<'_>), DecodeError> {
    if input.iter().all(|&b| b == 0) {
        return Err(DecodeError::Empty);
    }
    let mut r = Reader::new(input);
    let magic = r.bytes4()?;
    if magic != MAGIC {
        return Err(DecodeError::BadMagic(magic));
    }
    let version = r.u8()?;
    let kind = r.u8()?;
    Ok((version, kind, r))
}

/// Header checks for a versioned (request/reply) message of `kind` and length `len`.
fn versioned_header(input: &[u8], kind: u8, len: usize) -> Result<Reader<'_>, DecodeError> {
    let (version, got, r) = header(input)?;
    if version != PROTOCOL_VERSION {
        return Err(DecodeError::UnsupportedVersion(version));
    }
    if got != kind {
        return Err(DecodeError::WrongKind {
            expected: kind,
            got,
        });
    }
    check_padding(input, len)?;
    Ok(r)
}

fn read_ring(r: &mut Reader<'_>) -> Result<(RingDesc, u16), DecodeError> {
    let addr = r.u64()?;
    let rkey = r.u32()?;
    let log2 = r.u8()?;
    r.reserved(1)?;
    let recv_slots = r.u16()?;
    let size = RingSize::from_log2(log2).map_err(|_| DecodeError::BadRingSize(log2))?;
    if recv_slots < MIN_RECV_SLOTS {
        return Err(DecodeError::BadRecvSlots(recv_slots));
    }
    Ok((RingDesc { addr, rkey, size }, recv_slots))
}

fn write_ring<const N: usize>(w: &mut Writer<N>, ring: &RingDesc, recv_slots: u16) {
    w.u64(ring.addr)
        .u32(ring.rkey)
        .u8(ring.size.log2())
        .zeros(1)
        .u16(recv_slots);
}

fn read_tag(r: &mut Reader<'_>) -> Result<Tag, DecodeError> {
    let mut t = [0u8; TAG_LEN];
    for b in t.iter_mut() {
        *b = r.u8()?;
    }
    Ok(Tag(t))
}

impl ConnectRequest {
    /// The request with its tag computed: under `key` for the TCP connection `tuple`.
    pub fn bound(mut self, key: &BindingKey, tuple: &TcpTuple) -> Self {
        self.tag = binding::request_tag(key, tuple, &self.encode()[..REQUEST_TAG_AT]);
        self
    }

    /// Whether the tag verifies under `key` for `tuple` (constant-time). A native request
    /// never does.
    pub fn verify(&self, key: &BindingKey, tuple: &TcpTuple) -> bool {
        !self.flags.contains(Flags::NATIVE)
            && binding::request_tag(key, tuple, &self.encode()[..REQUEST_TAG_AT]).verify(&self.tag)
    }

    /// Whether the request proves `proof`: for a TCP connection, its tag verifies under the
    /// connection's key and 4-tuple; for a native listener, it is native.
    pub fn proves(&self, proof: &crate::binding::Proof) -> bool {
        match proof {
            crate::binding::Proof::Native => self.is_native(),
            crate::binding::Proof::Bound { key, tuple } => self.verify(key, tuple),
        }
    }

    /// Whether this is a native stream's request (no TCP connection behind it).
    pub fn is_native(&self) -> bool {
        self.flags.contains(Flags::NATIVE)
    }

    /// Encodes the request (version 2 layout).
    pub fn encode(&self) -> [u8; CONNECT_REQUEST_LEN] {
        let mut w = Writer::<CONNECT_REQUEST_LEN>::new();
        w.bytes(&MAGIC)
            .u8(PROTOCOL_VERSION)
            .u8(KIND_CONNECT_REQUEST)
            .u16(self.flags.bits())
            .u16(self.client_port)
            .u16(self.server_port)
            .u64(self.nonce);
        write_ring(&mut w, &self.ring, self.recv_slots);
        w.bytes(&self.tag.0);
        let (buf, len) = w.finish();
        debug_assert_eq!(len, CONNECT_REQUEST_LEN);
        buf
    }

    /// Decodes a request from rdma_cm private data (padding rules in the module docs).
    pub fn decode(input: &[u8]) -> Result<Self, DecodeError> {
        let mut r = versioned_header(input, KIND_CONNECT_REQUEST, CONNECT_REQUEST_LEN)?;
        let flags = Flags::check(r.u16()?)?;
        let client_port = r.u16()?;
        let server_port = r.u16()?;
        let nonce = r.u64()?;
        let (ring, recv_slots) = read_ring(&mut r)?;
        let tag = read_tag(&mut r)?;
        Ok(ConnectRequest {
            flags,
            client_port,
            server_port,
            nonce,
            ring,
            recv_slots,
            tag,
        })
    }
}

impl AcceptReply {
    /// The reply with its tag computed: under `key`, answering a request tagged `request_tag`.
    pub fn bound(mut self, key: &BindingKey, request_tag: &Tag) -> Self {
        self.tag = binding::reply_tag(key, request_tag, &self.encode()[..REPLY_TAG_AT]);
        self
    }

    /// Whether the tag verifies under `key` for the request tagged `request_tag`
    /// (constant-time). A native reply never does.
    pub fn verify(&self, key: &BindingKey, request_tag: &Tag) -> bool {
        !self.flags.contains(Flags::NATIVE)
            && binding::reply_tag(key, request_tag, &self.encode()[..REPLY_TAG_AT])
                .verify(&self.tag)
    }

    /// Encodes the reply (version 2 layout).
    pub fn encode(&self) -> [u8; ACCEPT_REPLY_LEN] {
        let mut w = Writer::<ACCEPT_REPLY_LEN>::new();
        w.bytes(&MAGIC)
            .u8(PROTOCOL_VERSION)
            .u8(KIND_ACCEPT_REPLY)
            .u16(self.flags.bits())
            .u64(self.nonce);
        write_ring(&mut w, &self.ring, self.recv_slots);
        w.bytes(&self.tag.0);
        let (buf, len) = w.finish();
        debug_assert_eq!(len, ACCEPT_REPLY_LEN);
        buf
    }

    /// Decodes a reply from rdma_cm private data.
    pub fn decode(input: &[u8]) -> Result<Self, DecodeError> {
        let mut r = versioned_header(input, KIND_ACCEPT_REPLY, ACCEPT_REPLY_LEN)?;
        let flags = Flags::check(r.u16()?)?;
        let nonce = r.u64()?;
        let (ring, recv_slots) = read_ring(&mut r)?;
        let tag = read_tag(&mut r)?;
        Ok(AcceptReply {
            flags,
            nonce,
            ring,
            recv_slots,
            tag,
        })
    }
}

impl Reject {
    /// Encodes the rejection.
    pub fn encode(&self) -> [u8; REJECT_LEN] {
        let mut w = Writer::<REJECT_LEN>::new();
        w.bytes(&MAGIC)
            .u8(self.max_version)
            .u8(KIND_REJECT)
            .u8(self.reason.code())
            .zeros(1)
            .u16(self.reason.port());
        w.finish().0
    }

    /// Decodes a rejection. Any non-zero version byte is accepted: the layout never changes.
    pub fn decode(input: &[u8]) -> Result<Self, DecodeError> {
        let (version, kind, mut r) = header(input)?;
        if version == 0 {
            return Err(DecodeError::UnsupportedVersion(0));
        }
        if kind != KIND_REJECT {
            return Err(DecodeError::WrongKind {
                expected: KIND_REJECT,
                got: kind,
            });
        }
        let code = r.u8()?;
        // (only a redirect has bytes 8–9: any other rejection is the 8-byte message)
        let redirect = code == RejectReason::Redirect(0).code();
        check_padding(
            input,
            if redirect {
                REJECT_LEN
            } else {
                REJECT_BASE_LEN
            },
        )?;
        r.reserved(1)?;
        let port = if redirect { r.u16()? } else { 0 };
        let reason = RejectReason::from_wire(code, port)?;
        Ok(Reject {
            reason,
            max_version: version,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> ConnectRequest {
        ConnectRequest {
            flags: Flags::empty(),
            client_port: 40000,
            server_port: 6379,
            nonce: 0x0123_4567_89ab_cdef,
            ring: RingDesc {
                addr: 0x7f00_dead_b000,
                rkey: 0x1234_5678,
                size: RingSize::new(1 << 16).unwrap(),
            },
            recv_slots: 64,
            tag: Tag([0xee; TAG_LEN]),
        }
    }

    #[test]
    fn connect_request_layout() {
        let b = req().encode();
        assert_eq!(&b[0..4], b"RDSH");
        assert_eq!(b[4], 2);
        assert_eq!(b[5], KIND_CONNECT_REQUEST);
        assert_eq!(&b[6..8], &[0, 0]);
        assert_eq!(&b[8..10], &40000u16.to_be_bytes());
        assert_eq!(&b[10..12], &6379u16.to_be_bytes());
        assert_eq!(&b[12..20], &0x0123_4567_89ab_cdefu64.to_be_bytes());
        assert_eq!(&b[20..28], &0x7f00_dead_b000u64.to_be_bytes());
        assert_eq!(&b[28..32], &0x1234_5678u32.to_be_bytes());
        assert_eq!(b[32], 16);
        assert_eq!(b[33], 0);
        assert_eq!(&b[34..36], &64u16.to_be_bytes());
        assert_eq!(&b[36..52], &[0xee; 16]);
        assert_eq!(b.len(), 52);
        assert!(b.len() <= 56);
    }

    #[test]
    fn tags_bind_request_and_reply() {
        let key = BindingKey::from_random([3; 16]);
        let tuple = TcpTuple {
            client: "10.0.0.1:40000".parse().unwrap(),
            server: "10.0.0.2:6379".parse().unwrap(),
        };
        let r = req().bound(&key, &tuple);
        assert!(r.verify(&key, &tuple));
        let decoded = ConnectRequest::decode(&r.encode()).unwrap();
        assert!(decoded.verify(&key, &tuple), "the tag survives the wire");
        assert!(!r.verify(&BindingKey::from_random([4; 16]), &tuple));
        // Any field changed after tagging breaks it: the port of another connection, the ring.
        assert!(!ConnectRequest {
            client_port: 40001,
            ..r
        }
        .verify(&key, &tuple));
        assert!(!ConnectRequest {
            ring: RingDesc { rkey: 9, ..r.ring },
            ..r
        }
        .verify(&key, &tuple));
        // A native request proves nothing, whatever its tag.
        let native = ConnectRequest {
            flags: Flags::NATIVE,
            ..r
        };
        assert!(native.is_native() && !native.verify(&key, &tuple));
        let reply = AcceptReply {
            flags: Flags::empty(),
            nonce: r.nonce,
            ring: r.ring,
            recv_slots: 8,
            tag: Tag::ZERO,
        }
        .bound(&key, &r.tag);
        assert!(reply.verify(&key, &r.tag));
        assert!(
            !reply.verify(&key, &Tag::ZERO),
            "bound to the request's tag"
        );
        assert!(!AcceptReply { nonce: 1, ..reply }.verify(&key, &r.tag));
        assert_eq!(AcceptReply::decode(&reply.encode()), Ok(reply));
    }

    #[test]
    fn connect_request_padding() {
        let mut padded = [0u8; 56];
        padded[..CONNECT_REQUEST_LEN].copy_from_slice(&req().encode());
        assert_eq!(ConnectRequest::decode(&padded), Ok(req()));
        padded[54] = 1;
        assert_eq!(
            ConnectRequest::decode(&padded),
            Err(DecodeError::TrailingBytes { offset: 54 })
        );
    }

    #[test]
    fn connect_request_rejections() {
        let good = req().encode();
        assert_eq!(ConnectRequest::decode(&[]), Err(DecodeError::Empty));
        assert_eq!(ConnectRequest::decode(&[0; 56]), Err(DecodeError::Empty));
        assert_eq!(
            ConnectRequest::decode(&good[..51]),
            Err(DecodeError::Truncated { need: 52, got: 51 })
        );
        assert!(matches!(
            ConnectRequest::decode(&good[..3]),
            Err(DecodeError::Truncated { .. })
        ));
        let mut b = good;
        b[0] = b'X';
        assert!(matches!(
            ConnectRequest::decode(&b),
            Err(DecodeError::BadMagic(_))
        ));
        // A version-1 request (no tag) is refused: it could prove nothing.
        let mut b = good;
        b[4] = 1;
        assert_eq!(
            ConnectRequest::decode(&b),
            Err(DecodeError::UnsupportedVersion(1))
        );
        let mut b = good;
        b[5] = KIND_ACCEPT_REPLY;
        assert_eq!(
            ConnectRequest::decode(&b),
            Err(DecodeError::WrongKind {
                expected: 1,
                got: 2
            })
        );
        let mut b = good;
        b[7] = 0x20; // must-understand bit 5 (0 NATIVE, 1 RECORDS, 2 SENDS, 3 READ, 4 DUPLEX)
        assert_eq!(
            ConnectRequest::decode(&b),
            Err(DecodeError::UnknownFlags(0x20))
        );
        let mut b = good;
        b[7] = 0x01;
        assert!(ConnectRequest::decode(&b).unwrap().is_native());
        let mut b = good;
        b[6] = 0x80; // may-ignore bit 15: kept
        let d = ConnectRequest::decode(&b).unwrap();
        assert_eq!(d.flags.bits(), 0x8000);
        assert_eq!(d.encode(), b);
        let mut b = good;
        b[32] = 11;
        assert_eq!(
            ConnectRequest::decode(&b),
            Err(DecodeError::BadRingSize(11))
        );
        let mut b = good;
        b[33] = 1;
        assert_eq!(
            ConnectRequest::decode(&b),
            Err(DecodeError::ReservedNonZero { offset: 33 })
        );
        let mut b = good;
        b[34..36].copy_from_slice(&1u16.to_be_bytes());
        assert_eq!(
            ConnectRequest::decode(&b),
            Err(DecodeError::BadRecvSlots(1))
        );
    }

    #[test]
    fn accept_reply_round_trip_and_layout() {
        let r = AcceptReply {
            flags: Flags::empty(),
            nonce: 7,
            ring: RingDesc {
                addr: 1,
                rkey: 2,
                size: RingSize::new(4096).unwrap(),
            },
            recv_slots: 4,
            tag: Tag([0x11; TAG_LEN]),
        };
        let b = r.encode();
        assert_eq!(b.len(), 48);
        assert_eq!(&b[32..48], &[0x11; 16]);
        assert_eq!(b[5], KIND_ACCEPT_REPLY);
        assert_eq!(&b[8..16], &7u64.to_be_bytes());
        assert_eq!(b[28], 12);
        assert_eq!(AcceptReply::decode(&b), Ok(r));
        let mut padded = [0u8; 196];
        padded[..b.len()].copy_from_slice(&b);
        assert_eq!(AcceptReply::decode(&padded), Ok(r));
        // A request is not a reply.
        assert_eq!(
            AcceptReply::decode(&req().encode()),
            Err(DecodeError::WrongKind {
                expected: 2,
                got: 1
            })
        );
    }

    #[test]
    fn reject_codes() {
        for reason in [
            RejectReason::NoMatchingTcp,
            RejectReason::UnsupportedVersion,
            RejectReason::Malformed,
            RejectReason::Resources,
            RejectReason::Disabled,
            RejectReason::Duplicate,
            RejectReason::Unproven,
            RejectReason::Redirect(40123),
            RejectReason::Other(200),
        ] {
            let m = Reject::new(reason);
            let b = m.encode();
            assert_eq!(Reject::decode(&b), Ok(m));
            let mut padded = [0u8; 148];
            padded[..REJECT_LEN].copy_from_slice(&b);
            assert_eq!(Reject::decode(&padded), Ok(m));
            if !matches!(reason, RejectReason::Redirect(_)) {
                // (what an older peer sends and reads: 8 bytes, the rest zero)
                assert_eq!(b[REJECT_BASE_LEN..], [0, 0]);
                assert_eq!(Reject::decode(&b[..REJECT_BASE_LEN]), Ok(m));
            }
        }
        // A redirect names a port, in bytes 8–9; without them, or with port 0, it is malformed.
        let b = Reject::new(RejectReason::Redirect(0x1234)).encode();
        assert_eq!(b[6..], [8, 0, 0x12, 0x34]);
        assert!(matches!(
            Reject::decode(&b[..REJECT_BASE_LEN]),
            Err(DecodeError::Truncated { .. })
        ));
        let mut z = b;
        z[8..].fill(0);
        assert_eq!(Reject::decode(&z), Err(DecodeError::ZeroDialPort));
        // Bytes 8–9 of any other rejection must be zero.
        let mut t = Reject::new(RejectReason::Duplicate).encode();
        t[9] = 1;
        assert_eq!(
            Reject::decode(&t),
            Err(DecodeError::TrailingBytes { offset: 9 })
        );
        let mut b = Reject::new(RejectReason::Malformed).encode();
        b[6] = 0;
        assert_eq!(Reject::decode(&b), Err(DecodeError::BadRejectCode(0)));
        // A newer peer's rejection is still readable.
        let mut b = Reject::new(RejectReason::UnsupportedVersion).encode();
        b[4] = 9;
        assert_eq!(Reject::decode(&b).unwrap().max_version, 9);
        assert_eq!(
            RejectReason::for_decode_error(&DecodeError::UnsupportedVersion(3)),
            RejectReason::UnsupportedVersion
        );
    }
}
