//! The connection driver: handshake, switch-over, ring data, credits and shutdown in one
//! sans-IO state machine.
//!
//! Inputs are `handle_*` calls (CM events, completions, TCP events, timer expiry) and the
//! application-facing calls (`commit_switch`, `send`, `consume`, `shutdown_write`, `close`).
//! Outputs are [`Action`]s from [`Connection::poll_action`], which the transport performs in the
//! order they come out. Time is passed in as an [`Instant`]; nothing here reads a clock.
//!
//! Driving loop of a transport (per connection, single-threaded or under the connection's lock):
//!
//! ```text
//! for each work completion (in CQ order; poll the CQ dry before acting on CM/TCP events):
//!     conn.handle_completion(...)        // re-post the receive before a credit returns it
//! while let Some(a) = conn.poll_action() { post it }
//! ```

use std::fmt;
use std::time::{Duration, Instant};

use crate::binding::{BindingKey, Proof, Tag};
use crate::control::ControlMsg;
use crate::credit::{CreditPolicy, RxSlots, TxSlots};
use crate::failover::{Incoming, Next, Record, RECORD_LEN};
use crate::framing;
use crate::handshake::{
    AcceptReply, ConnectRequest, Flags, HandshakeError, Kind, Reject, RingDesc, SENDS_BUF,
};
use crate::imm::Imm;
use crate::records::{Records, MIN_RECORD};
use crate::ring::{Place, RingSize, RxCursors, TxCursors, WriteRange};
use crate::state::{
    ErrorReason, Fin, InvalidTransition, PeerFin, RxEvent, RxState, StreamState, TxEvent, TxState,
    Violation,
};
use crate::wake::{Notice, OnNotice};
use crate::MIN_RECV_SLOTS;

/// Tunables. `Default` gives the documented protocol defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Return byte credit once `local_ring >> credit_byte_shift` consumed bytes are owed
    /// (clamped to 1..=8; default 2: a quarter of the ring).
    pub credit_byte_shift: u8,
    /// Return slot credit once this many receives are owed (default: half the posted receives;
    /// clamped to `2..=min(R-1, 63)`).
    pub credit_slot_threshold: Option<u16>,
    /// Largest DATA write in bytes (0: the peer's ring size).
    pub max_write: u64,
    /// Split DATA writes at the end of the peer ring (needed only if the local staging area is
    /// not double-mapped).
    pub split_at_wrap: bool,
    /// How long the handshake may take before the upgrade is abandoned (default 3 s).
    pub handshake_timeout: Duration,
    /// Announce [`Flags::RING_MOVES`]: the transport can give the peer's writes another ring
    /// ([`Connection::offer_ring`]) and follow the peer's offers ([`Action::NewStaging`]).
    /// Default false.
    pub ring_moves: bool,
    /// With ring moves: the ring size this side asks its peer for ([`ControlMsg::RingWanted`])
    /// when its writes wait for the peer ring's space, that ring is smaller, and the stream
    /// has carried four of its sizes already (a busy connection, not one large message).
    /// `None` (the default): it never asks.
    pub ring_max: Option<RingSize>,
    /// The connection kind this side wants ([`Kind`]; default [`Kind::WriteImm`], which every
    /// side speaks): offered in the request, and used when both sides want the same one.
    pub kind: Kind,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            credit_byte_shift: 2,
            credit_slot_threshold: None,
            max_write: 0,
            split_at_wrap: false,
            handshake_timeout: Duration::from_secs(3),
            ring_moves: false,
            ring_max: None,
            kind: Kind::WriteImm,
        }
    }
}

/// What this side advertises: its receive ring and how many receives it posted before the
/// handshake message went out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalParams {
    /// The local receive ring.
    pub ring: RingDesc,
    /// Receives posted (at least [`MIN_RECV_SLOTS`]).
    pub recv_slots: u16,
}

/// Unusable local parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// Fewer receives than [`MIN_RECV_SLOTS`].
    TooFewRecvSlots(u16),
    /// The request to accept does not prove the binding the server asked for: its tag does
    /// not verify, or it is native where a TCP connection is named (or the other way round).
    /// Answer it with `Reject(Unproven)`.
    Unproven,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::TooFewRecvSlots(n) => {
                write!(f, "{n} receive slots; at least {MIN_RECV_SLOTS} needed")
            }
            ConfigError::Unproven => {
                write!(f, "the request does not prove it holds the TCP connection")
            }
        }
    }
}

impl std::error::Error for ConfigError {}

/// Which end of the rdma_cm connection this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    /// Sent the connect request (the TCP client).
    Client,
    /// Accepted it (the TCP server).
    Server,
}

/// Something for the transport to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// RDMA WRITE WITH IMMEDIATE of the staged stream bytes `[cursor, cursor + len)` to
    /// `remote_addr` (= peer ring address + `ring_offset`), rkey from the peer's [`RingDesc`].
    WriteData {
        /// Stream cursor of the first byte (index the local staging area with it).
        cursor: u64,
        /// Bytes to write.
        len: usize,
        /// The generation of the peer's ring written (0, one more per ring move: §6.4), and of
        /// the staging area the bytes are in.
        gen: u32,
        /// Offset in the peer's ring (`cursor mod peer ring size`).
        ring_offset: usize,
        /// Remote address to write to.
        remote_addr: u64,
        /// The peer ring's remote key.
        rkey: u32,
        /// Immediate: post `imm.encode()` (host order; converted to network order once, where
        /// `ibv_send_wr.imm_data` is filled).
        imm: Imm,
    },
    /// Records (protocol §14): one RDMA WRITE of the whole record, the staged ring bytes
    /// `[cursor, cursor + len)` (index the staging area as for [`Action::WriteData`]), to
    /// `remote_addr`. Before posting it the transport puts `header` (a little-endian word) at
    /// the record's start in the staging area and again at `trailer_at` bytes from it: the
    /// payload was copied in between by the application's sends. A plain WRITE, or with
    /// `imm` a WRITE WITH IMMEDIATE (a wake-up of a sleeping reader, or a request for
    /// credit), which takes a receive at the peer.
    WriteRecord {
        /// Ring cursor of the record's header.
        cursor: u64,
        /// Ring bytes of the whole record (header, payload, pad, trailer).
        len: usize,
        /// The generation of the peer's ring and of the staging area (0: records do not move).
        gen: u32,
        /// Offset in the peer's ring (`cursor mod peer ring size`).
        ring_offset: usize,
        /// Remote address to write to.
        remote_addr: u64,
        /// The peer ring's remote key.
        rkey: u32,
        /// The header word, written at the record's start and at `trailer_at`.
        header: u64,
        /// Offset of the trailer from the record's start.
        trailer_at: usize,
        /// Post as WRITE WITH IMMEDIATE with this immediate (host order), if given.
        imm: Option<Imm>,
    },
    /// Records (protocol §14): a zero-length RDMA WRITE WITH IMMEDIATE that wakes the peer's
    /// sleeping reader (the ring's base is given as the address).
    Doorbell {
        /// Remote address (the peer ring's base).
        remote_addr: u64,
        /// Immediate: post `imm.encode()` (host order).
        imm: Imm,
    },
    /// Zero-length RDMA WRITE WITH IMMEDIATE carrying a CREDIT (any valid remote address; the
    /// ring's base is given).
    WriteCredit {
        /// Remote address (the peer ring's base).
        remote_addr: u64,
        /// Immediate: post `imm.encode()` (host order).
        imm: Imm,
    },
    /// SEND of a control message (`msg.encode().as_bytes()`, inline if possible).
    Send(ControlMsg),
    /// The peer offered a ring of `size` bytes and this side moves its writes there (§6.4):
    /// a staging area of that size for generation `gen`, indexed by `cursor mod size` as the
    /// first one, before any [`Action::WriteData`] of that generation.
    NewStaging {
        /// Its generation.
        gen: u32,
        /// Its size.
        size: RingSize,
    },
    /// The staging area of generation `gen` is needed no more (the peer acknowledged every
    /// byte in it): free it.
    ReleaseStaging {
        /// Its generation.
        gen: u32,
    },
    /// The local receive ring of generation `gen` is read no more (the application read past
    /// the move that replaced it), and the peer writes it no more: free it.
    ReleaseRing {
        /// Its generation.
        gen: u32,
    },
    /// No more messages: once the posted work requests have completed, disconnect and destroy
    /// the queue pair. The local ring stays until the application closes the socket (buffered
    /// data may still be read). Emitted once.
    Teardown,
}

impl Action {
    /// Whether this action returns receive slots to the peer (a credit with `slots > 0`): the
    /// receives it returns must be posted before it is (protocol §5.2). No other action needs
    /// any receive posted, so a transport may re-post consumed receives lazily, just before
    /// such a credit, in one batch.
    pub fn returns_slots(&self) -> bool {
        match self {
            Action::WriteCredit {
                imm: Imm::Credit { slots, .. },
                ..
            } => *slots > 0,
            Action::Send(ControlMsg::CreditUpdate { slots, .. }) => *slots > 0,
            Action::WriteData {
                imm: Imm::DataCredit { slots, .. },
                ..
            } => *slots > 0,
            _ => false,
        }
    }
}

/// What the DATA lane of [`Connection::handle_completion`] takes a DATA for: its length,
/// whether it asks for credit, and the credit it returns over duplex (bytes, slots).
#[derive(Clone, Copy, Debug)]
struct DataPlan {
    len: u32,
    credit_wanted: bool,
    credit: Option<(u64, u8)>,
}

/// A DATA of the write's lane ([`Connection::send_data`]): the bytes granted (at `cursor`,
/// `len` of them, in the staging area of generation `gen` at `offset`) and the DATA that
/// posts them — [`LaneWrite::action`] as the general path would return it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaneWrite {
    /// Stream cursor of the first byte.
    pub cursor: u64,
    /// Bytes granted and written.
    pub len: usize,
    /// The staging area's (and the peer ring's) generation.
    pub gen: u32,
    /// The bytes' offset in both.
    pub offset: usize,
    /// Where the WRITE goes in the peer's ring.
    pub remote_addr: u64,
    /// The peer ring's key.
    pub rkey: u32,
    /// The DATA's immediate.
    pub imm: Imm,
}

impl LaneWrite {
    /// Whether it returns receive slots to the peer: [`Action::returns_slots`] of
    /// [`Self::action`] (a DATA with credit that carries slots).
    pub fn returns_slots(&self) -> bool {
        matches!(self.imm, Imm::DataCredit { slots, .. } if slots > 0)
    }

    /// The DATA as an action.
    pub fn action(&self) -> Action {
        Action::WriteData {
            cursor: self.cursor,
            len: self.len,
            gen: self.gen,
            ring_offset: self.offset,
            remote_addr: self.remote_addr,
            rkey: self.rkey,
            imm: self.imm,
        }
    }
}

/// A work completion for the connection's receive queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completion<'a> {
    /// `IBV_WC_RECV_RDMA_WITH_IMM`: `imm` is `u32::from_be(wc.imm_data)` (host order),
    /// `byte_len` is `wc.byte_len` when the provider reports it (`None` skips the cross-check).
    WriteImm {
        /// The immediate in host order.
        imm: u32,
        /// Bytes written, if known.
        byte_len: Option<u32>,
    },
    /// `IBV_WC_RECV`: a control message (`byte_len` bytes of the receive buffer).
    Recv {
        /// The received bytes.
        payload: &'a [u8],
    },
}

/// Ring space granted by [`Connection::send`]: copy the application's first `len` bytes into
/// the staging area at stream cursor `cursor`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendGrant {
    /// Stream cursor of the first byte.
    pub cursor: u64,
    /// Bytes accepted.
    pub len: usize,
}

/// Why [`Connection::send`] accepted nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendError {
    /// This direction is (still) on TCP: write to the socket.
    ViaTcp,
    /// No ring space now (EAGAIN).
    WouldBlock,
    /// The local write side is shut (EPIPE).
    Shutdown,
    /// The peer closed its read side (EPIPE).
    PeerClosed,
    /// The connection failed.
    Failed(ErrorReason),
}

impl SendError {
    /// The `std::io::ErrorKind` a write should fail with (not meaningful for `ViaTcp`).
    pub fn io_kind(self) -> std::io::ErrorKind {
        match self {
            SendError::ViaTcp | SendError::WouldBlock => std::io::ErrorKind::WouldBlock,
            SendError::Shutdown | SendError::PeerClosed => std::io::ErrorKind::BrokenPipe,
            SendError::Failed(r) => r.io_kind(),
        }
    }
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendError::ViaTcp => write!(f, "send via TCP"),
            SendError::WouldBlock => write!(f, "no ring space"),
            SendError::Shutdown => write!(f, "write side shut down"),
            SendError::PeerClosed => write!(f, "peer closed"),
            SendError::Failed(r) => write!(f, "{r}"),
        }
    }
}

impl std::error::Error for SendError {}

/// Where the next bytes for the application come from ([`Connection::recv`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recv {
    /// Read the TCP socket, at most `limit` bytes if given, and report them with
    /// [`Connection::note_tcp_read`]. With no limit the peer has not switched yet; its
    /// SwitchOver may arrive any time, so wait on the socket *and* the completion channel.
    Tcp {
        /// Most bytes to read from TCP before asking again.
        limit: Option<u64>,
    },
    /// `len` bytes at `offset` in the (double-mapped) local ring; report with
    /// [`Connection::consume`].
    Ring {
        /// The local ring's generation (0 for the handshake's; one more per move, §6.4).
        gen: u32,
        /// Ring offset of the first readable byte.
        offset: usize,
        /// Readable bytes (contiguous thanks to the double mapping).
        len: usize,
    },
    /// The next TCP bytes are the shim's, not the application's (after a path failure, the
    /// peer's failover record and the part of its continuation already read from the ring,
    /// §8.6): read at most `len` into a buffer of the shim's and hand them to
    /// [`Connection::tcp_control`]. Wait on the socket as for [`Recv::Tcp`].
    TcpControl {
        /// Most bytes to read.
        len: u64,
    },
    /// Nothing now (EAGAIN).
    WouldBlock,
    /// End of stream (read returns 0).
    Eof,
    /// The connection failed (e.g. ECONNRESET).
    Error(ErrorReason),
}

/// [`Connection::consume`] was asked for more than is readable from the ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConsumeError {
    /// Bytes asked for.
    pub requested: usize,
    /// Bytes readable from the ring now (0 while TCP bytes come first).
    pub readable: usize,
}

impl fmt::Display for ConsumeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "consume({}) with {} readable ring bytes",
            self.requested, self.readable
        )
    }
}

impl std::error::Error for ConsumeError {}

/// Readiness as Linux `tcp_poll` would report it (see `docs/protocol.md`).
///
/// When `read_via_tcp` (or `write_via_tcp`) is set, that direction is served by the kernel
/// socket and the corresponding flags here are `false`: poll the socket for them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Readiness {
    /// POLLIN: ring data, EOF, or an error.
    pub readable: bool,
    /// POLLOUT: ring space (free ≥ half the bytes in flight, like `sk_stream_is_writeable`),
    /// or a write would fail at once (shut down, peer closed, error).
    pub writable: bool,
    /// POLLRDHUP: the peer's write side ended.
    pub rdhup: bool,
    /// POLLHUP: both directions ended, or the connection failed.
    pub hup: bool,
    /// POLLERR: the connection failed.
    pub error: bool,
    /// The read direction is still on the kernel socket.
    pub read_via_tcp: bool,
    /// The write direction is still on the kernel socket.
    pub write_via_tcp: bool,
}

/// Counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// DATA writes posted.
    pub data_writes: u64,
    /// Bytes in DATA writes.
    pub data_bytes: u64,
    /// DATA writes that asked for credit.
    pub credit_wanted: u64,
    /// Credits posted (immediates and CreditUpdate messages, and with duplex those carried by
    /// DATA).
    pub credits_sent: u64,
    /// Duplex (§17): credits carried by DATA (among `credits_sent`).
    pub credits_piggybacked: u64,
    /// Control SENDs posted (CreditUpdate included).
    pub control_sent: u64,
    /// Messages received.
    pub messages_received: u64,
    /// The ring's path failed and the stream went on over TCP (0 or 1).
    pub failovers: u64,
    /// Ring moves of the sending direction (to a ring the peer offered).
    pub moves_out: u64,
    /// Ring moves of the receiving direction (to a ring this side offered).
    pub moves_in: u64,
    /// Records: wake-ups sent to the peer's sleeping reader (doorbells and records with an
    /// immediate).
    pub wakes_sent: u64,
    /// Records: times this side's reader went to sleep (Sleeping notices).
    pub sleeps: u64,
}

/// Why [`Connection::switch_back`] cannot return the connection to TCP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SwitchBackError {
    /// The peer did not announce [`Flags::SWITCH_BACK`] (an older peer).
    Unsupported,
    /// The upgrade is still in its handshake: fall back instead (nothing reached the ring).
    NotEstablished,
    /// The wire is done (closed, or failed): nothing left to switch back.
    Ended,
    /// The peer closed; what it wrote to the ring before its Close is only in the local ring
    /// and must be read from there.
    PeerClosed,
}

impl fmt::Display for SwitchBackError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SwitchBackError::Unsupported => write!(f, "the peer cannot switch back to TCP"),
            SwitchBackError::NotEstablished => write!(f, "the upgrade is not established"),
            SwitchBackError::Ended => write!(f, "the ring side has ended"),
            SwitchBackError::PeerClosed => write!(f, "the peer closed on the ring"),
        }
    }
}

impl std::error::Error for SwitchBackError {}

/// What the shim must write to the TCP socket, before any application byte, once a switch
/// back is agreed ([`Connection::resume_due`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resume {
    /// First, after a path failure: the failover record's last `len` bytes (`bytes[24 -
    /// len..]`); report with [`Connection::resumed_record`].
    Record {
        /// The whole record.
        bytes: [u8; RECORD_LEN],
        /// Bytes of it still to write.
        len: usize,
    },
    /// The staged stream bytes `[cursor, cursor + len)` (index the staging area with the
    /// cursor, as for [`Action::WriteData`]); report with [`Connection::resumed`].
    Write {
        /// Stream cursor of the first byte.
        cursor: u64,
        /// Bytes still to write.
        len: u64,
    },
    /// Then `shutdown(SHUT_WR)` on the socket: the write side had been shut on the ring;
    /// report with [`Connection::resumed_shutdown`].
    ShutdownWrite,
}

/// A switch back to TCP (protocol §8.5), from its start on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Back {
    /// Our read cursor in the peer's stream when we stopped reading the ring (sent in our
    /// SwitchBack: the peer goes on over TCP from there).
    stopped_at: u64,
    /// Our SwitchBack was handed to the transport.
    posted: bool,
    /// The peer's SwitchBack arrived: its read cursor in our stream, where our continuation
    /// on TCP starts.
    peer_read: Option<u64>,
    /// TCP bytes read past the peer's pre-switch part while stopped: its continuation.
    cont_read: u64,
    /// The shim read EOF from TCP while switching back.
    tcp_eof: bool,
    /// `shutdown(SHUT_WR)` while switching back.
    shut: bool,
    /// Left to write to TCP once agreed: staged bytes from `resume_at` to `resume_end`,
    /// then a shutdown if `resume_shut`.
    resume_at: u64,
    resume_end: u64,
    resume_shut: bool,
    /// After a path failure (§8.6): the record that goes first, and how much of it is left.
    record: [u8; RECORD_LEN],
    record_left: usize,
}

impl Back {
    /// Starts a switch back, reading stopped at `stopped_at`. A SwitchOver not posted yet never
    /// will be: the peer then reads the whole of our stream on TCP.
    fn new(stopped_at: u64, switch_pending: &mut Option<u64>) -> Back {
        *switch_pending = None;
        Back {
            stopped_at,
            posted: false,
            peer_read: None,
            cont_read: 0,
            tcp_eof: false,
            shut: false,
            resume_at: 0,
            resume_end: 0,
            resume_shut: false,
            record: [0; RECORD_LEN],
            record_left: 0,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Life {
    /// Client: connect request sent, waiting for ESTABLISHED (with the reply) or a reject.
    Connecting {
        request: ConnectRequest,
        /// The key the reply's tag must verify under (`None`: a native handshake).
        key: Option<BindingKey>,
        deadline: Instant,
    },
    /// Server: accepted; waiting for ESTABLISHED (or the first completion).
    Accepted {
        deadline: Instant,
    },
    Established,
    /// The wire is done (Teardown emitted); buffered data may still be read.
    Closed,
    Failed(ErrorReason),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Teardown {
    No,
    Pending,
    Done,
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Peer {
    /// The ring written now.
    ring: RingDesc,
    /// The ring before the last move, while bytes before its cursor are still to be written.
    old_ring: Option<RingDesc>,
    tx: TxCursors,
    slots: TxSlots,
}

/// Ring moves (§6.4) as this side takes part in them.
#[derive(Clone, Debug, Default, PartialEq)]
struct Moves {
    /// Both sides announced [`Flags::RING_MOVES`].
    on: bool,
    /// Receiving: the ring this side offered (sent or to send), until the peer's RingMoved.
    offered: Option<RingDesc>,
    /// Receiving: the offer is still to be sent.
    offer_unsent: bool,
    /// Receiving: the ring size the peer asked for ([`ControlMsg::RingWanted`]).
    peer_wants: Option<RingSize>,
    /// Sending: the peer's offer, until the transport has its staging area
    /// ([`Connection::staging_ready`]).
    peer_offer: Option<RingDesc>,
    /// Sending: the RingMoved to send, at this cursor, once every byte before it is posted.
    moved_at: Option<u64>,
    /// Sending: a RingWanted to send.
    want: Option<RingSize>,
    /// Sending: the size last asked for (not asked again until the peer offers something).
    asked: Option<RingSize>,
    /// Actions to hand out first ([`Action::NewStaging`], the releases).
    actions: std::collections::VecDeque<Action>,
}

/// Why [`Connection::offer_ring`] cannot offer a ring now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OfferError {
    /// The peer did not announce [`Flags::RING_MOVES`] (or this side did not).
    Unsupported,
    /// A move is under way (its old ring still in use, or an offer unanswered).
    Busy,
    /// The connection is not established on the ring, or its receiving direction has ended.
    NotNow,
}

impl fmt::Display for OfferError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OfferError::Unsupported => "the peer does not take part in ring moves",
            OfferError::Busy => "a ring move is under way",
            OfferError::NotNow => "the receiving direction is not on the ring",
        })
    }
}

impl std::error::Error for OfferError {}

/// One upgraded (or upgrading) TCP connection. See the module docs.
// (Clone, PartialEq: the simulated pair looks at a copy's next action without taking it, and
// compares a core before and after a step)
#[derive(Clone, Debug, PartialEq)]
pub struct Connection {
    cfg: Config,
    side: Side,
    local: LocalParams,
    nonce: u64,
    life: Life,
    tx_state: TxState,
    rx_state: RxState,
    rx: RxCursors,
    rx_slots: RxSlots,
    policy: CreditPolicy,
    peer: Option<Peer>,
    /// SwitchOver to post before anything else of the stream.
    switch_pending: Option<u64>,
    switch_posted: bool,
    /// The application wanted to send more than was accepted since the last DATA went out.
    send_blocked: bool,
    peer_wants_credit: bool,
    /// A credit is owed at once, and goes out even after our close, before the teardown: the
    /// peer's SwitchOver came and both fail over (the peer holds our end until it has it: see
    /// [`Self::handle_tcp_eof`]), or its end came on a connection we pull from (§16: its
    /// teardown waits for it, [`Self::peer_pulled`]).
    credit_owed: bool,
    /// The peer's TCP EOF came before it confirmed our SwitchOver (see [`Self::handle_tcp_eof`]):
    /// taken once it does; a transport error meanwhile fails the stream.
    eof_held: bool,
    peer_read_closed: bool,
    local_read_shut: bool,
    teardown: Teardown,
    /// Barriers requested locally / posted / received from the peer (epochs, from 1).
    barriers: Barriers,
    /// The peer announced [`Flags::SWITCH_BACK`].
    peer_switch_back: bool,
    /// We announced it (a bound handshake).
    own_switch_back: bool,
    /// The switch back to TCP, once started (by us or by the peer).
    back: Option<Back>,
    /// Both sides announced [`Flags::FAILOVER`].
    failover: bool,
    /// Our SwitchOver was the peer's `n`th message (slots spent when it was posted).
    switch_seq: Option<u64>,
    /// After a path failure: the peer's stream on TCP, until it is plain (§8.6).
    incoming: Option<Incoming>,
    /// Ring moves (§6.4).
    moves: Moves,
    /// Records (§14).
    records: Records,
    /// The kind both sides chose (§14, §15, §16); WRITE WITH IMMEDIATE until the handshake's
    /// end.
    kind: Kind,
    /// READ pull (§16): where the peer reads our DATA from, and whether that went out.
    source: Option<RingDesc>,
    source_sent: bool,
    /// READ pull: where we read the peer's DATA from (its Source).
    peer_source: Option<RingDesc>,
    /// READ pull: our last stream message (ShutdownWrite, Close or SwitchBack) was the peer's
    /// `n`th; it pulled everything before it once it returned that slot.
    end_seq: Option<u64>,
    /// A completion that may have made an action due came since [`Self::take_stirred`] was
    /// last asked (every completion but an inert DATA: see [`Self::handle_completion`]).
    stirred: bool,
    /// See [`Self::nothing_after`].
    nothing_after: bool,
    /// The last [`Self::poll_action`] went past every other kind of action to the DATA (see
    /// [`Self::reached_data`]).
    reached_data: bool,
    stats: Stats,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Barriers {
    requested: u64,
    posted: u64,
    received: u64,
    /// `tx.head` at the latest request: barriers go out once the data before it is posted.
    after: u64,
}

impl Connection {
    fn new(
        cfg: Config,
        side: Side,
        local: LocalParams,
        nonce: u64,
        life: Life,
        tcp_received: u64,
    ) -> Result<Self, ConfigError> {
        if local.recv_slots < MIN_RECV_SLOTS {
            return Err(ConfigError::TooFewRecvSlots(local.recv_slots));
        }
        Ok(Connection {
            cfg,
            side,
            local,
            nonce,
            life,
            tx_state: TxState::Tcp,
            rx_state: RxState::Tcp {
                received: tcp_received,
            },
            rx: RxCursors::new(local.ring.size),
            rx_slots: RxSlots::new(local.recv_slots),
            policy: CreditPolicy::new(
                local.ring.size,
                local.recv_slots,
                cfg.credit_byte_shift,
                cfg.credit_slot_threshold,
            ),
            peer: None,
            switch_pending: None,
            switch_posted: false,
            send_blocked: false,
            peer_wants_credit: false,
            credit_owed: false,
            eof_held: false,
            peer_read_closed: false,
            local_read_shut: false,
            teardown: Teardown::No,
            barriers: Barriers::default(),
            peer_switch_back: false,
            own_switch_back: false,
            back: None,
            failover: false,
            switch_seq: None,
            incoming: None,
            moves: Moves::default(),
            records: Records::new(local.ring.size),
            kind: Kind::WriteImm,
            source: None,
            source_sent: false,
            peer_source: None,
            end_seq: None,
            stirred: true,
            nothing_after: false,
            reached_data: false,
            stats: Stats::default(),
        })
    }

    /// Client side: starts an upgrade of the TCP connection `client_port → server_port`.
    /// `tcp_received` is how many bytes the application has read from the socket so far (the
    /// shim keeps counting with [`Self::note_tcp_read`]). `proof` binds the request to the TCP
    /// connection (its tag), or marks it native; the reply must prove the same. Returns the
    /// request to encode into `rdma_connect`'s private data.
    #[allow(clippy::too_many_arguments)]
    pub fn connect(
        cfg: Config,
        local: LocalParams,
        proof: &Proof,
        client_port: u16,
        server_port: u16,
        nonce: u64,
        tcp_received: u64,
        now: Instant,
    ) -> Result<(Self, ConnectRequest), ConfigError> {
        let request = ConnectRequest {
            flags: Flags::empty(),
            client_port,
            server_port,
            nonce,
            ring: local.ring,
            recv_slots: local.recv_slots,
            tag: Tag::ZERO,
        };
        let mut moves = if cfg.ring_moves {
            Flags::RING_MOVES
        } else {
            Flags::empty()
        };
        match cfg.kind {
            Kind::WriteImm => {}
            Kind::Records => moves = moves.with(Flags::RECORDS_OFFERED),
            Kind::Sends => moves = moves.with(Flags::SENDS_OFFERED),
            Kind::Read => moves = moves.with(Flags::READ_OFFERED),
            Kind::Duplex => moves = moves.with(Flags::DUPLEX_OFFERED),
        }
        let (request, key) = match proof {
            Proof::Native => (
                ConnectRequest {
                    flags: Flags::NATIVE.with(moves),
                    ..request
                },
                None,
            ),
            // (a bound request comes from a shim, which follows a redirect to a fork child)
            Proof::Bound { key, tuple } => (
                ConnectRequest {
                    flags: Flags::SWITCH_BACK
                        .with(Flags::REDIRECT)
                        .with(Flags::FAILOVER)
                        .with(moves),
                    ..request
                }
                .bound(key, tuple),
                Some(*key),
            ),
        };
        let life = Life::Connecting {
            request,
            key,
            deadline: now + cfg.handshake_timeout,
        };
        let mut conn = Self::new(cfg, Side::Client, local, nonce, life, tcp_received)?;
        conn.own_switch_back = request.flags.contains(Flags::SWITCH_BACK);
        Ok((conn, request))
    }

    /// Server side: accepts a decoded request that the shim matched to an accepted TCP
    /// connection, if it proves `proof` (a bound request's tag verifies under the connection's
    /// key; a native request for a native listener): else [`ConfigError::Unproven`]. Returns
    /// the reply to encode into `rdma_accept`'s private data, tagged to match.
    pub fn accept(
        cfg: Config,
        local: LocalParams,
        request: &ConnectRequest,
        proof: &Proof,
        tcp_received: u64,
        now: Instant,
    ) -> Result<(Self, AcceptReply), ConfigError> {
        if !request.proves(proof) {
            return Err(ConfigError::Unproven);
        }
        let life = Life::Accepted {
            deadline: now + cfg.handshake_timeout,
        };
        let mut conn = Self::new(cfg, Side::Server, local, request.nonce, life, tcp_received)?;
        // (records leave out the features not built for them yet: moves, switch-backs and
        // failover count ring cursors as stream offsets; sends keep them all, §15; READ pull
        // all but moves, §16)
        let offered = match cfg.kind {
            Kind::WriteImm => Flags::empty(),
            Kind::Records => Flags::RECORDS_OFFERED,
            Kind::Sends => Flags::SENDS_OFFERED,
            Kind::Read => Flags::READ_OFFERED,
            Kind::Duplex => Flags::DUPLEX_OFFERED,
        };
        if cfg.kind != Kind::WriteImm && request.flags.contains(offered) {
            conn.kind = cfg.kind;
        }
        let records = conn.kind == Kind::Records;
        conn.peer_switch_back = request.flags.contains(Flags::SWITCH_BACK) && !records;
        let peer_failover = request.flags.contains(Flags::FAILOVER);
        conn.peer = Some(Peer {
            ring: request.ring,
            old_ring: None,
            tx: TxCursors::new(request.ring.size),
            slots: TxSlots::new(request.recv_slots),
        });
        let kind = match conn.kind {
            Kind::Sends => Flags::SENDS,
            Kind::Read => Flags::READ,
            Kind::Duplex => Flags::DUPLEX,
            Kind::WriteImm | Kind::Records => Flags::empty(),
        };
        // (a pulling connection announces no moves: its staging area is fixed, §16)
        let moves_here = cfg.ring_moves && conn.kind != Kind::Read;
        let moves = if records {
            Flags::RECORDS
        } else if moves_here {
            Flags::RING_MOVES.with(kind)
        } else {
            kind
        };
        conn.moves.on = moves_here && request.flags.contains(Flags::RING_MOVES) && !records;
        if records {
            conn.records.start(false, request.nonce, local.ring.size);
        }
        let reply = AcceptReply {
            flags: Flags::empty(),
            nonce: request.nonce,
            ring: local.ring,
            recv_slots: local.recv_slots,
            tag: Tag::ZERO,
        };
        let reply = match proof {
            Proof::Native => AcceptReply {
                flags: Flags::NATIVE.with(moves),
                ..reply
            },
            Proof::Bound { key, .. } if records => AcceptReply {
                flags: moves,
                ..reply
            }
            .bound(key, &request.tag),
            Proof::Bound { key, .. } => AcceptReply {
                flags: Flags::SWITCH_BACK.with(Flags::FAILOVER).with(moves),
                ..reply
            }
            .bound(key, &request.tag),
        };
        conn.own_switch_back = reply.flags.contains(Flags::SWITCH_BACK);
        conn.failover = peer_failover && reply.flags.contains(Flags::FAILOVER);
        Ok((conn, reply))
    }

    // ----- handshake -------------------------------------------------------------------------

    /// Client: `RDMA_CM_EVENT_ESTABLISHED` with the server's private data. Hand this over before
    /// any completion of the connection.
    pub fn handle_accept(&mut self, private_data: &[u8]) -> Result<(), ErrorReason> {
        let Life::Connecting { request, key, .. } = self.life else {
            return self.error().map_or(Ok(()), Err);
        };
        let reply = match AcceptReply::decode(private_data) {
            Ok(r) => r,
            Err(e) => return Err(self.fail(ErrorReason::Handshake(HandshakeError::Decode(e)))),
        };
        if reply.nonce != request.nonce {
            return Err(
                self.fail(ErrorReason::Handshake(HandshakeError::NonceMismatch {
                    expected: request.nonce,
                    got: reply.nonce,
                })),
            );
        }
        let proven = match key {
            None => reply.flags.contains(Flags::NATIVE),
            Some(k) => reply.verify(&k, &request.tag),
        };
        if !proven {
            return Err(self.fail(ErrorReason::Handshake(HandshakeError::Unproven)));
        }
        // The kind the reply chose, which the request must have offered (at most one: a reply
        // choosing two offered only one).
        let chosen = [
            (Flags::RECORDS, Flags::RECORDS_OFFERED, Kind::Records),
            (Flags::SENDS, Flags::SENDS_OFFERED, Kind::Sends),
            (Flags::READ, Flags::READ_OFFERED, Kind::Read),
            (Flags::DUPLEX, Flags::DUPLEX_OFFERED, Kind::Duplex),
        ]
        .into_iter()
        .filter(|(flag, _, _)| reply.flags.contains(*flag));
        let mut kind = Kind::WriteImm;
        for (_, offered, k) in chosen {
            if !request.flags.contains(offered) || kind != Kind::WriteImm {
                return Err(self.fail(ErrorReason::Handshake(HandshakeError::Unoffered(k))));
            }
            kind = k;
        }
        let records = kind == Kind::Records;
        self.kind = kind;
        if records {
            self.records
                .start(true, request.nonce, self.local.ring.size);
        }
        self.peer = Some(Peer {
            ring: reply.ring,
            old_ring: None,
            tx: TxCursors::new(reply.ring.size),
            slots: TxSlots::new(reply.recv_slots),
        });
        self.moves.on = !records
            && kind != Kind::Read
            && request.flags.contains(Flags::RING_MOVES)
            && reply.flags.contains(Flags::RING_MOVES);
        self.peer_switch_back =
            !records && key.is_some() && reply.flags.contains(Flags::SWITCH_BACK);
        self.failover = !records
            && key.is_some()
            && request.flags.contains(Flags::FAILOVER)
            && reply.flags.contains(Flags::FAILOVER);
        self.life = Life::Established;
        Ok(())
    }

    /// Client: `RDMA_CM_EVENT_REJECTED` with its private data (possibly none or foreign).
    pub fn handle_reject(&mut self, private_data: &[u8]) {
        if matches!(self.life, Life::Connecting { .. }) {
            let reason = Reject::decode(private_data).ok().map(|r| r.reason);
            self.fail(ErrorReason::Rejected(reason));
        }
    }

    /// Server: `RDMA_CM_EVENT_ESTABLISHED`. (The first completion counts as well.)
    pub fn handle_established(&mut self) {
        if matches!(self.life, Life::Accepted { .. }) {
            self.life = Life::Established;
        }
    }

    /// Handshake deadline, if one is running.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.life {
            Life::Connecting { deadline, .. } | Life::Accepted { deadline } => Some(deadline),
            _ => None,
        }
    }

    /// Moves the handshake's deadline to `until` if that is later (a caller that knows the
    /// peer is slow, not lost: its host keeps working through a queue of set-ups). Returns
    /// whether it moved; never once the handshake is over.
    pub fn wait_longer(&mut self, until: Instant) -> bool {
        match &mut self.life {
            Life::Connecting { deadline, .. } | Life::Accepted { deadline }
                if until > *deadline =>
            {
                *deadline = until;
                true
            }
            _ => false,
        }
    }

    /// Timer expiry: abandons a handshake past its deadline.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.poll_timeout().is_some_and(|d| now >= d) {
            self.fail(ErrorReason::HandshakeTimeout);
        }
    }

    // ----- sending ---------------------------------------------------------------------------

    /// The shim stops writing to TCP after `tcp_bytes_sent` bytes in total and moves this
    /// direction to the ring: a SwitchOver stating that count goes out before any ring data.
    /// Only once established.
    pub fn commit_switch(&mut self, tcp_bytes_sent: u64) -> Result<(), InvalidTransition> {
        if self.back.is_some() {
            return Err(InvalidTransition {
                state: "SwitchingBack",
                event: "Commit",
            });
        }
        if !self.established() {
            return Err(InvalidTransition {
                state: self.life_name(),
                event: "Commit",
            });
        }
        self.tx_state = self.tx_state.on(TxEvent::Commit)?;
        self.switch_pending = Some(tcp_bytes_sent);
        Ok(())
    }

    /// Accepts up to `len` bytes for the ring (as many as the peer's free space allows); the
    /// caller copies that many into its staging area at the grant's cursor. The write itself
    /// comes out of [`Self::poll_action`] (consecutive sends are coalesced).
    pub fn send(&mut self, len: usize) -> Result<SendGrant, SendError> {
        if let Some(b) = self.back {
            // Switching back: nothing more goes to the ring, and the application's bytes go to
            // TCP only after the continuation ([`Self::resume_due`]) — at once if this
            // direction never left TCP.
            let agreed = !self.established();
            if (!agreed && self.tx_state != TxState::Tcp)
                || (agreed && (b.record_left > 0 || b.resume_at < b.resume_end || b.resume_shut))
            {
                return Err(SendError::WouldBlock);
            }
        }
        match self.life {
            Life::Failed(r) if !self.can_fall_back() => return Err(SendError::Failed(r)),
            Life::Connecting { .. } | Life::Accepted { .. } | Life::Failed(_) => {
                return Err(SendError::ViaTcp)
            }
            Life::Established | Life::Closed => {}
        }
        match self.tx_state {
            TxState::Tcp => return Err(SendError::ViaTcp),
            TxState::Finishing(_) | TxState::Finished(_) => return Err(SendError::Shutdown),
            TxState::Ring => {}
        }
        if self.peer_read_closed {
            return Err(SendError::PeerClosed);
        }
        let Some(peer) = self.peer.as_mut() else {
            return Err(SendError::ViaTcp);
        };
        let cursor = peer.tx.head();
        if len == 0 {
            return Ok(SendGrant { cursor, len: 0 });
        }
        let (cursor, n) = if self.records.on {
            // (a record's payload is at most what one WRITE of `max_write` carries)
            let max = u64::from(framing::max_payload(peer.tx.size()));
            let max = match self.cfg.max_write {
                0 => max,
                m => max.min(m.saturating_sub(framing::FRAMING).max(8)),
            };
            let (at, n) = self.records.accept(&mut peer.tx, len as u64, max);
            (at, n as usize)
        } else {
            (cursor, peer.tx.accept(len as u64) as usize)
        };
        if n < len {
            self.send_blocked = true;
            // (the writes wait for the peer ring's space, and the stream has carried four
            // rings' worth: a busy connection, not one large message — ask for a larger ring,
            // once per size)
            let size = peer.tx.size().bytes();
            let busy = peer.tx.head() >= 4 * size;
            if let Some(max) = self.cfg.ring_max.filter(|m| busy && m.bytes() > size) {
                self.want_ring(max);
            }
        }
        // (bytes accepted whole change nothing but what the DATA's branch of poll_action
        // reads; a short grant marks the writer blocked and may ask for a ring, and records
        // go out through a branch of their own: see `reached_data`)
        self.stirred |= n < len || self.records.on;
        if n == 0 {
            return Err(SendError::WouldBlock);
        }
        Ok(SendGrant { cursor, len: n })
    }

    /// The data path's write in one step (the write's lane): accepts all `len` bytes and
    /// returns their DATA ([`LaneWrite`]: the grant and the DATA that [`Self::send`] of them
    /// and then [`Self::poll_data`] return, leaving the same core) for a core whose last pass
    /// of its actions reached the DATA's branch and that was changed since only as
    /// [`Self::poll_data`] requires (the transport knows: rdma-core's link does). `None`,
    /// having changed nothing, where the bytes would not go whole as one DATA of a steady
    /// stream: `len` zero or more than the peer's ring has room for, more than one write takes
    /// (`max_write`, a split at the ring's end), bytes accepted before and not posted yet, no
    /// slot of the peer's for it, a ring move or a barrier under way, or a stream that is not
    /// plainly established and writing to the ring (a switch back, a shut or closed
    /// direction, the peer's read side closed, records, sends, READ pull) — the general path
    /// then. What follows the DATA is as [`Self::nothing_after`] says: under these conditions
    /// only a credit due can.
    pub fn send_data(&mut self, len: usize) -> Option<LaneWrite> {
        if len == 0
            || self.back.is_some()
            || !matches!(self.life, Life::Established)
            || self.tx_state != TxState::Ring
            || self.peer_read_closed
            || !matches!(self.kind, Kind::WriteImm | Kind::Duplex)
            || self.moves.moved_at.is_some()
            || self.barriers.posted < self.barriers.requested
        {
            return None;
        }
        let peer = self.peer.as_mut()?;
        let n = len as u64;
        let head = peer.tx.head();
        if peer.old_ring.is_some()
            || peer.tx.unposted() != 0
            || !peer.slots.can_post_message()
            || peer.tx.free() < n
        {
            return None;
        }
        let place = peer.tx.place(head);
        if n > Self::write_max(&self.cfg, self.kind, place.size)
            || (self.cfg.split_at_wrap && place.offset as u64 + n > place.size.bytes())
        {
            return None;
        }
        peer.tx.accept(n);
        peer.slots.take();
        peer.tx.mark_posted(n);
        let ring = peer.ring;
        let imm = self.data_imm(n);
        self.reached_data = true;
        self.nothing_after = !self.credit_due();
        Some(LaneWrite {
            cursor: head,
            len,
            gen: place.gen,
            offset: place.offset,
            remote_addr: ring.addr.wrapping_add(place.offset as u64),
            rkey: ring.rkey,
            imm,
        })
    }

    /// Enters a barrier: a `Barrier` message goes out after the bytes accepted so far (see
    /// [`ControlMsg::Barrier`]). Returns its epoch; the peer has reached the same barrier once
    /// [`Self::barriers_received`] is at least that epoch. Needs the sending direction on the
    /// ring and not shut down (the errors are those of [`Self::send`]).
    pub fn barrier(&mut self) -> Result<u64, SendError> {
        self.send(0)?;
        let head = self.peer.as_ref().map_or(0, |p| p.tx.head());
        self.barriers.requested += 1;
        self.barriers.after = head;
        Ok(self.barriers.requested)
    }

    /// Barriers received from the peer so far.
    pub fn barriers_received(&self) -> u64 {
        self.barriers.received
    }

    /// `shutdown(SHUT_WR)`: ShutdownWrite goes out after the queued bytes; the peer reads them,
    /// then EOF, and may keep sending. Requires the switch (commit first if still on TCP).
    pub fn shutdown_write(&mut self) -> Result<(), InvalidTransition> {
        if let (Some(b), Life::Established) = (self.back.as_mut(), self.life) {
            // Nothing more goes on the ring: the shutdown follows the continuation on TCP.
            b.shut = true;
            return Ok(());
        }
        match self.life {
            Life::Established => {
                self.tx_state = self.tx_state.on(TxEvent::Shutdown)?;
                self.after_state_change();
                Ok(())
            }
            Life::Closed | Life::Failed(_) => Ok(()),
            _ => Err(InvalidTransition {
                state: self.life_name(),
                event: "Shutdown",
            }),
        }
    }

    /// `close()`. On the ring: Close goes out after the queued bytes (with RESET if unread
    /// data is dropped, as Linux sends an RST then), and the queue pair is torn down right
    /// after it. Incoming data is discarded from now on. If this direction never switched, or
    /// the upgrade is not established, the ring is simply torn down and the shim closes the
    /// TCP socket as usual.
    pub fn close(&mut self) {
        let unread = self.rx.readable() > 0;
        self.close_inner(unread, false);
    }

    /// Abortive close (SO_LINGER 0, or the shim drops unread TCP data): unsent bytes are
    /// dropped and Close with RESET goes out next; the peer reports ECONNRESET.
    pub fn abort(&mut self) {
        self.close_inner(true, true);
    }

    fn close_inner(&mut self, reset: bool, drop_unsent: bool) {
        self.local_read_shut = true;
        if self.back.is_some() {
            // Nothing more goes on the ring; the shim writes the continuation (unless it
            // resets the socket) and closes TCP after it.
            return;
        }
        self.discard_readable();
        match self.life {
            Life::Connecting { .. } | Life::Accepted { .. } => self.enter_closed(),
            Life::Established => {
                if self.tx_state == TxState::Tcp {
                    self.enter_closed();
                    return;
                }
                if drop_unsent {
                    if let Some(p) = self.peer.as_mut() {
                        p.tx.discard_unposted();
                        self.records.discard_unposted();
                    }
                }
                if let Ok(s) = self.tx_state.on(TxEvent::Close { reset }) {
                    self.tx_state = s;
                }
                self.after_state_change();
            }
            Life::Closed | Life::Failed(_) => {}
        }
    }

    // ----- switching back to TCP (protocol §8.5) ---------------------------------------------

    /// Whether the peer announced that it can switch back ([`Flags::SWITCH_BACK`]).
    pub fn peer_can_switch_back(&self) -> bool {
        self.peer_switch_back
    }

    /// Returns the connection to its TCP socket at exact stream offsets, both directions,
    /// with the peer's help: we stop reading the ring (what the peer wrote past our read
    /// cursor comes again on TCP) and post nothing more to it but a `SwitchBack`; once the
    /// peer's arrives, our own stream goes on over TCP from the peer's read cursor
    /// ([`Self::resume_due`]), and the wire is done. Meanwhile sends would block and reads go
    /// to TCP. For a process that must give the ring up while the connection lives on: a fork
    /// child that takes the socket over, an `exec`, a ring that cannot go on.
    pub fn switch_back(&mut self) -> Result<(), SwitchBackError> {
        if self.back.is_some() {
            return Ok(());
        }
        match self.life {
            Life::Connecting { .. } | Life::Accepted { .. } => {
                return Err(SwitchBackError::NotEstablished)
            }
            Life::Closed | Life::Failed(_) => return Err(SwitchBackError::Ended),
            Life::Established => {}
        }
        if !self.peer_switch_back {
            return Err(SwitchBackError::Unsupported);
        }
        if matches!(
            self.rx_state,
            RxState::Finished {
                fin: PeerFin::Close,
                ..
            }
        ) {
            return Err(SwitchBackError::PeerClosed);
        }
        self.back = Some(Back::new(self.rx.tail(), &mut self.switch_pending));
        Ok(())
    }

    /// A switch back was started (by either side) and is not off: from now on until the
    /// connection is plain TCP ([`Self::switched_back`]), the ring is left for good — unless
    /// the peer's ring Close came first and the switch back is off again (8.5's races), or
    /// the connection fails.
    pub fn back_started(&self) -> bool {
        self.back.is_some()
    }

    /// A switch back is under way (started by either side) and not yet agreed by both.
    pub fn switching_back(&self) -> bool {
        self.back.is_some() && self.established()
    }

    /// The connection went back to TCP and the continuation is written: from now on it is a
    /// plain TCP connection (the ring stays only for bytes nobody will read).
    pub fn switched_back(&self) -> bool {
        self.back.is_some()
            && self.closed()
            && self.resume_due().is_none()
            && (self.incoming.is_none_or(|i| i.done())
                || (self.local_read_shut && self.control_due().is_none()))
    }

    /// After a path failure (§8.6): how many bytes of the peer's TCP stream are the shim's to
    /// read next — its record, then what its continuation repeats of what we read from the
    /// ring ([`Recv::TcpControl`]) — whether or not the application still reads (after its
    /// `close()` or `shutdown(SHUT_RD)` too). They are not the application's: a socket closed
    /// with them unread would be reset, and the peer would lose what it had still to read.
    /// `None` once they are read (or where there are none: no failover, or the peer's
    /// pre-switch bytes, the application's, come first).
    pub fn control_due(&self) -> Option<u64> {
        match self.incoming.filter(|i| !i.done())?.next() {
            Next::Control(n) => Some(n),
            Next::App(_) => None,
        }
    }

    /// Our direction is plain TCP again: the switch back (or failover) is agreed and its
    /// continuation written. (The peer's may still be ahead of the application's reads: see
    /// [`Self::switched_back`].)
    pub fn writes_resumed(&self) -> bool {
        self.back.is_some() && self.closed() && self.resume_due().is_none()
    }

    /// What to write to the TCP socket before any application byte, once the switch back is
    /// agreed; `None` before that and once done.
    pub fn resume_due(&self) -> Option<Resume> {
        let b = self.back?;
        if !self.closed() {
            return None;
        }
        if b.record_left > 0 {
            Some(Resume::Record {
                bytes: b.record,
                len: b.record_left,
            })
        } else if b.resume_at < b.resume_end {
            // (a piece never spans a ring move: its bytes are in one staging area)
            let mut len = b.resume_end - b.resume_at;
            if let Some(m) = self.peer.as_ref().and_then(|p| p.tx.moved()) {
                if b.resume_at < m.at {
                    len = len.min(m.at - b.resume_at);
                }
            }
            Some(Resume::Write {
                cursor: b.resume_at,
                len,
            })
        } else if b.resume_shut {
            Some(Resume::ShutdownWrite)
        } else {
            None
        }
    }

    /// `n` bytes of a [`Resume::Record`] went to the socket.
    pub fn resumed_record(&mut self, n: usize) {
        if let Some(b) = self.back.as_mut() {
            b.record_left = b.record_left.saturating_sub(n);
        }
    }

    /// `n` bytes of a [`Resume::Write`] went to the socket.
    pub fn resumed(&mut self, n: u64) {
        if let Some(b) = self.back.as_mut() {
            b.resume_at = (b.resume_at + n).min(b.resume_end);
        }
    }

    /// The [`Resume::ShutdownWrite`] was done.
    pub fn resumed_shutdown(&mut self) {
        if let Some(b) = self.back.as_mut() {
            if b.resume_at == b.resume_end {
                b.resume_shut = false;
            }
        }
    }

    // ----- receiving -------------------------------------------------------------------------

    /// Where the application's next bytes come from.
    // (inline on the data path: a call and a return less a message, each return a block
    // lookup under emulation — docs/bench/kinds.md, session 62)
    #[inline(always)]
    pub fn recv(&self) -> Recv {
        // (the usual case first: the stream read from the ring's cursors alone)
        if self.reading_ring() {
            let r = self.ring_or_end(self.rx.readable() as usize);
            debug_assert_eq!(
                r,
                self.recv_general(),
                "the ring's shortcut names what recv would"
            );
            return r;
        }
        self.recv_general()
    }

    /// [`Self::recv`] in every state, the ring's shortcut aside.
    fn recv_general(&self) -> Recv {
        match self.life {
            Life::Connecting { .. } | Life::Accepted { .. } => {
                return Recv::Tcp { limit: None };
            }
            Life::Failed(r) => {
                return if self.can_fall_back() {
                    Recv::Tcp { limit: None }
                } else {
                    Recv::Error(r)
                };
            }
            Life::Established | Life::Closed => {}
        }
        if self.local_read_shut {
            return Recv::Eof;
        }
        if let Some(i) = self.incoming.filter(|i| !i.done()) {
            return match i.next() {
                Next::App(limit) => Recv::Tcp { limit },
                Next::Control(len) => Recv::TcpControl { len },
            };
        }
        if let (Some(b), Life::Established) = (self.back, self.life) {
            // Stopped: what the peer sent on TCP before its switch, then its continuation, all
            // on TCP. After a TCP EOF, EOF once it is known to end the continuation (not a
            // peer that vanished with our unread bytes in the ring).
            return if !b.tcp_eof {
                Recv::Tcp { limit: None }
            } else if b.peer_read.is_some()
                || b.cont_read > 0
                || matches!(self.rx_state, RxState::Tcp { .. })
            {
                Recv::Eof
            } else {
                Recv::WouldBlock
            };
        }
        match self.rx_state {
            RxState::Tcp { .. } => Recv::Tcp { limit: None },
            RxState::Draining { remaining }
            | RxState::Finished {
                tcp_remaining: remaining @ 1..,
                ..
            } => Recv::Tcp {
                limit: Some(remaining),
            },
            RxState::Ring | RxState::Finished { .. } => {
                if let Some(&rec) = self.records.ready.front() {
                    // (records: the first one's payload, past its header and what was read)
                    let at = self.rx.read_place();
                    let taken = u64::from(self.records.taken);
                    return Recv::Ring {
                        gen: at.gen,
                        offset: self.rx.size().offset(self.rx.tail() + 8 + taken),
                        len: (rec - self.records.taken) as usize,
                    };
                }
                // (records: none whole yet, whatever bytes the ring holds)
                let len = if self.records.on {
                    0
                } else {
                    self.rx.readable() as usize
                };
                self.ring_or_end(len)
            }
        }
    }

    /// The stream read from the ring: its `len` readable bytes at the read cursor's place, or
    /// with none, the end once the peer's stream finished, else nothing yet.
    fn ring_or_end(&self, len: usize) -> Recv {
        if len > 0 {
            let at = self.rx.read_place();
            Recv::Ring {
                gen: at.gen,
                offset: at.offset,
                len,
            }
        } else if self.rx_state.is_finished() {
            Recv::Eof
        } else {
            Recv::WouldBlock
        }
    }

    /// The application consumed `n` ring bytes (after [`Recv::Ring`]). Credit goes back lazily
    /// through [`Self::poll_action`].
    pub fn consume(&mut self, n: usize) -> Result<(), ConsumeError> {
        // (the ring's count as recv's shortcut takes it, without the call)
        let readable = if self.reading_ring() {
            self.rx.readable() as usize
        } else {
            self.ring_readable()
        };
        if n > readable {
            return Err(ConsumeError {
                requested: n,
                readable,
            });
        }
        if self.records.on {
            // (a record's ring bytes are freed, and so credited, once it is read whole)
            if n > 0 {
                self.records.taken += n as u32;
                if let Some(&rec) = self
                    .records
                    .ready
                    .front()
                    .filter(|&&r| r == self.records.taken)
                {
                    self.records.ready.pop_front();
                    self.records.taken = 0;
                    let freed = self.rx.consume(framing::record_bytes(rec));
                    debug_assert!(freed, "a found record's bytes are received");
                }
            }
            self.stirred = true;
            return Ok(());
        }
        if !self.rx.consume(n as u64) {
            return Err(ConsumeError {
                requested: n,
                readable,
            });
        }
        self.release_old_ring();
        // (a consume changes what poll_action reads only through the credit owed and a ring
        // given back: if neither made anything due, it stirs nothing — see take_stirred)
        self.stirred |= self.credit_due() || !self.moves.actions.is_empty();
        Ok(())
    }

    /// The ring bytes [`Self::recv`] names (0 when it names anything else).
    fn ring_readable(&self) -> usize {
        match self.recv() {
            Recv::Ring { len, .. } => len,
            _ => 0,
        }
    }

    /// Whether [`Self::recv`] reads the stream from the ring's cursors alone: established (or
    /// closed), the read side open, no TCP bytes ahead (before the switch, a failover's
    /// continuation, a switch back), the ring's state, no records. Then what it names is the
    /// ring's readable bytes (none: the end once the peer's stream finished, else nothing
    /// yet) — what its general branches would name in these states too: the simulated pair
    /// asks `recv` in every state each step leaves, whose debug build compares the two.
    fn reading_ring(&self) -> bool {
        matches!(self.life, Life::Established | Life::Closed)
            && !self.local_read_shut
            && self.incoming.is_none_or(|i| i.done())
            && !(self.back.is_some() && self.established())
            && matches!(
                self.rx_state,
                RxState::Ring
                    | RxState::Finished {
                        tcp_remaining: 0,
                        ..
                    }
            )
            && !self.records.on
    }

    /// The shim read `n` bytes from the TCP socket (before the upgrade, or while draining up
    /// to the peer's SwitchOver count).
    pub fn note_tcp_read(&mut self, n: u64) -> Result<(), ErrorReason> {
        if let Some(i) = self.incoming.as_mut().filter(|i| !i.done()) {
            i.on_app_read(n);
            return Ok(());
        }
        if let (Some(b), Life::Established) = (self.back.as_mut(), self.life) {
            // Stopped: the peer's pre-switch bytes go through the state machine, what follows
            // them is its continuation.
            let pre = match self.rx_state {
                RxState::Tcp { .. } => n,
                RxState::Draining { remaining }
                | RxState::Finished {
                    tcp_remaining: remaining,
                    ..
                } => n.min(remaining),
                RxState::Ring => 0,
            };
            b.cont_read += n - pre;
            if pre > 0 {
                self.rx_state = self
                    .rx_state
                    .on(RxEvent::TcpRead(pre))
                    .expect("within the pre-switch part");
            }
            return Ok(());
        }
        match self.rx_state.on(RxEvent::TcpRead(n)) {
            Ok(s) => {
                self.rx_state = s;
                Ok(())
            }
            Err(_) if matches!(self.life, Life::Failed(_) | Life::Closed) => Ok(()),
            Err(v) => Err(self.fail(ErrorReason::Protocol(v))),
        }
    }

    /// The shim read `bytes` from the TCP socket for [`Recv::TcpControl`] (at most its `len`):
    /// the peer's failover record, or continuation bytes we had read from the ring already.
    /// `Err` means the connection has just failed: the record or the continuation was not
    /// what it must be.
    pub fn tcp_control(&mut self, bytes: &[u8]) -> Result<(), ErrorReason> {
        let Some(i) = self.incoming.as_mut().filter(|i| !i.done()) else {
            return self.error().map_or(Ok(()), Err);
        };
        match i.on_control(bytes) {
            Ok(()) => Ok(()),
            Err(e) => Err(self.fail(ErrorReason::Protocol(Violation::Failover(e)))),
        }
    }

    /// `shutdown(SHUT_RD)`: reads return EOF from now on; incoming ring data is consumed and
    /// discarded (and credited, so the peer never blocks on us).
    pub fn shutdown_read(&mut self) {
        self.local_read_shut = true;
        self.discard_readable();
    }

    fn discard_readable(&mut self) {
        if matches!(
            self.rx_state,
            RxState::Ring
                | RxState::Finished {
                    tcp_remaining: 0,
                    ..
                }
        ) {
            self.rx.discard_unread();
            self.records.discard_unread();
        }
    }

    // ----- completions and events ------------------------------------------------------------

    /// A receive completion, in CQ order. The transport re-posts the receive afterwards, at the
    /// latest before it posts the credit that returns it ([`Action::returns_slots`]). `Err` means the connection has just failed (or
    /// had failed) with that reason.
    ///
    /// Every completion but an *inert* one stirs the connection ([`Self::take_stirred`]). A
    /// DATA is inert when it can have made no action due that was not due before: it came on
    /// an established connection reading its stream from the ring, with none of the rarer
    /// machinery under way (a switch back, a held EOF, records, READ pull, a shut read side)
    /// and the peer's slots enough for a message before it (so nothing waited for the slots
    /// or the credit it may return), and after it no credit is due (it took a slot of ours,
    /// and may ask for credit) and no ring-move work was queued (its credit may retire the old
    /// staging area). A transport whose last pass of [`Self::poll_action`] found nothing to do
    /// need not make another for such a DATA: the next pass would find nothing either (the
    /// simulated pair checks this on every delivery of every schedule).
    pub fn handle_completion(&mut self, c: Completion<'_>) -> Result<(), ErrorReason> {
        let data = self.steady_data(&c);
        if data {
            if let Completion::WriteImm { imm, byte_len } = c {
                if self.data_lane(imm, byte_len) {
                    return Ok(());
                }
            }
        }
        self.handle_general(c, data)
    }

    /// [`Self::handle_completion`] without its DATA lane ([`Self::data_lane`]): the same
    /// result and the same core after it (the simulated pair compares the two on every DATA
    /// the lane takes).
    #[doc(hidden)]
    pub fn handle_completion_general(&mut self, c: Completion<'_>) -> Result<(), ErrorReason> {
        let data = self.steady_data(&c);
        self.handle_general(c, data)
    }

    /// Whether `c` is a DATA on the steady stream, as [`Self::handle_completion`] says (the
    /// kind first: a credit or a control message stirs whatever the state).
    fn steady_data(&self, c: &Completion<'_>) -> bool {
        matches!(c, Completion::WriteImm { imm, .. } if Imm::is_data(*imm))
            && self.established()
            && matches!(self.rx_state, RxState::Ring)
            && self.back.is_none()
            && !self.eof_held
            && !self.records.on
            && self.kind != Kind::Read
            && !self.local_read_shut
            && self
                .peer
                .as_ref()
                .is_some_and(|p| p.slots.can_post_message())
    }

    /// The general path of [`Self::handle_completion`] (`data`: [`Self::steady_data`]).
    fn handle_general(&mut self, c: Completion<'_>, data: bool) -> Result<(), ErrorReason> {
        let r = self.handle_completion_inner(c);
        let inert = data
            && r.is_ok()
            && self.established()
            && matches!(self.rx_state, RxState::Ring)
            && self.nothing_due_after_data();
        self.stirred |= !inert;
        r
    }

    /// After a DATA on the steady stream: no ring-move work queued and no credit due or
    /// asked for — what makes it inert ([`Self::handle_completion`]).
    fn nothing_due_after_data(&self) -> bool {
        self.moves.actions.is_empty()
            && !self.peer_wants_credit
            && !self.credit_owed
            && !self.credit_due()
    }

    /// [`Self::handle_completion`]'s lane: a DATA the caller found on the steady stream
    /// ([`Self::steady_data`]: established, reading from the ring, none of the rarer machinery
    /// under way, the peer's slots enough), taken in one step where every check of the
    /// general path passes ([`Self::data_lane_plan`]) — what that path does for it, without
    /// its walk through the states such a DATA does not change (the connection stays
    /// established and reading from the ring, and no end follows). `false`, having changed
    /// nothing, where anything else applies: the general path then does what it does, a
    /// violation included.
    fn data_lane(&mut self, imm: u32, byte_len: Option<u32>) -> bool {
        let Some(DataPlan {
            len,
            credit_wanted,
            credit,
        }) = self.data_lane_plan(imm, byte_len)
        else {
            return false;
        };
        if let (Some((bytes, slots)), Some(peer)) = (credit, self.peer.as_mut()) {
            let _ = peer.tx.credit(bytes);
            let _ = peer.slots.restore(u32::from(slots));
            Self::retire_tx_move(peer, &mut self.moves);
        }
        self.stats.messages_received += 1;
        let _ = self.rx_slots.on_message();
        let _ = self.rx.on_data(u64::from(len));
        self.peer_wants_credit |= credit_wanted;
        self.stirred |= !self.nothing_due_after_data();
        true
    }

    /// Whether the DATA lane takes the DATA of immediate `imm` (after
    /// [`Self::steady_data`]), and what it is ([`DataPlan`]). `None` where any check of the general
    /// path would fail or anything but the DATA's own effects follows: this side closing
    /// (its Close ends the connection once the peer's last bytes are in), no receive left for
    /// the message, an immediate that does not decode to a DATA (or returns credit off
    /// duplex), a length unlike the completion's, bytes past the credit returned, or credit
    /// and slots beyond what was sent.
    fn data_lane_plan(&self, imm: u32, byte_len: Option<u32>) -> Option<DataPlan> {
        if matches!(self.tx_state, TxState::Finished(Fin::Close { .. }))
            || !self.rx_slots.has_room()
        {
            return None;
        }
        let (len, credit_wanted, credit) = match Imm::decode(imm).ok()? {
            Imm::Data { len, credit_wanted } => (len, credit_wanted, None),
            Imm::DataCredit {
                len,
                credit_wanted,
                units,
                slots,
            } if self.kind == Kind::Duplex => (
                len,
                credit_wanted,
                Some((u64::from(units) * Imm::CREDIT_UNIT, slots)),
            ),
            _ => return None,
        };
        if byte_len.is_some_and(|b| b != len) || self.rx.landing(0, u64::from(len)).is_err() {
            return None;
        }
        let peer = self.peer.as_ref()?;
        if let Some((bytes, slots)) = credit {
            if !peer.tx.can_credit(bytes) || !peer.slots.can_restore(u32::from(slots)) {
                return None;
            }
        }
        Some(DataPlan {
            len,
            credit_wanted,
            credit,
        })
    }

    /// Whether [`Self::handle_completion`] takes `c` by its DATA lane: for tests, which
    /// check that the lane is taken, and leaves what the general path leaves.
    #[doc(hidden)]
    pub fn takes_data_lane(&self, c: Completion<'_>) -> bool {
        self.steady_data(&c)
            && matches!(c, Completion::WriteImm { imm, byte_len }
                if self.data_lane_plan(imm, byte_len).is_some())
    }

    /// Whether the action [`Self::poll_action`] returned last was a DATA after which nothing
    /// is due: polling again would return `None` (until the core is changed). Meaningful only
    /// right after a `WriteData`; the simulated pair checks it after every one.
    pub fn nothing_after(&self) -> bool {
        self.nothing_after
    }

    /// Whether a completion or a [`Self::consume`] that may have made an action due came
    /// since the last call (see [`Self::handle_completion`]; a consume stirs when it makes a
    /// credit due or gives back a ring, and always with records); clears it. A transport that
    /// performed the core's actions until [`Self::poll_action`] returned `None`, and changed
    /// the core since only by completions and consumes, none of which stirred it, finds
    /// nothing more to do by polling again.
    pub fn take_stirred(&mut self) -> bool {
        std::mem::replace(&mut self.stirred, false)
    }

    fn handle_completion_inner(&mut self, c: Completion<'_>) -> Result<(), ErrorReason> {
        match self.life {
            Life::Connecting { .. } => {
                return Err(self.fail(ErrorReason::Protocol(
                    Violation::CompletionBeforeEstablished,
                )))
            }
            Life::Accepted { .. } => self.life = Life::Established,
            Life::Established => {}
            Life::Closed => {
                self.late_credit(c);
                return Ok(());
            }
            Life::Failed(_) => return Ok(()),
        }
        self.stats.messages_received += 1;
        match self.process(c) {
            Ok(()) => {
                self.after_state_change();
                if self.eof_held && self.switch_confirmed() {
                    self.eof_held = false;
                    return self.handle_tcp_eof();
                }
                Ok(())
            }
            Err(reason) => Err(self.fail(reason)),
        }
    }

    /// A completion after the connection closed: nothing is read any more, but on a
    /// connection we pull from (§16) the peer's credit still says it pulled our last bytes
    /// ([`Self::peer_pulled`]): its slots are counted, anything else is ignored.
    fn late_credit(&mut self, c: Completion<'_>) {
        let Some(peer) = self.peer.as_mut().filter(|_| self.kind == Kind::Read) else {
            return;
        };
        let slots = match c {
            Completion::WriteImm { imm, .. } => match Imm::decode(imm) {
                Ok(Imm::Credit { slots, .. }) => u32::from(slots),
                _ => return,
            },
            Completion::Recv { payload } => match ControlMsg::decode(payload) {
                Ok(ControlMsg::CreditUpdate { slots, .. }) => slots,
                _ => return,
            },
        };
        let _ = peer.slots.restore(slots);
    }

    fn process(&mut self, c: Completion<'_>) -> Result<(), ErrorReason> {
        let v = ErrorReason::Protocol;
        self.rx_slots.on_message().map_err(v)?;
        let peer = self.peer.as_mut().expect("established implies peer");
        match c {
            Completion::WriteImm { imm, byte_len } => {
                match Imm::decode(imm).map_err(|e| v(Violation::Decode(e)))? {
                    data @ (Imm::Data { .. } | Imm::DataCredit { .. }) => {
                        let (len, credit_wanted) = match data {
                            Imm::DataCredit {
                                len,
                                credit_wanted,
                                units,
                                slots,
                            } => {
                                // Duplex (§17): the DATA returns credit, as a CREDIT would.
                                if self.kind != Kind::Duplex {
                                    return Err(v(Violation::UnannouncedDuplex));
                                }
                                peer.tx
                                    .credit(u64::from(units) * Imm::CREDIT_UNIT)
                                    .map_err(|e| v(Violation::BadCredit(e)))?;
                                peer.slots.restore(u32::from(slots)).map_err(v)?;
                                Self::retire_tx_move(peer, &mut self.moves);
                                (len, credit_wanted)
                            }
                            Imm::Data { len, credit_wanted } => (len, credit_wanted),
                            _ => unreachable!("matched above"),
                        };
                        if let Some(b) = byte_len.filter(|&b| b != len) {
                            return Err(v(Violation::ImmLengthMismatch {
                                imm: len,
                                byte_len: b,
                            }));
                        }
                        if self.records.on {
                            // A record with a wake-up or a credit request: its bytes are found
                            // by polling the ring, not counted here. It ends the reader's
                            // notice (one whose notice is not out takes it as a late one).
                            self.records.reader_wake.woken();
                            self.peer_wants_credit |= credit_wanted;
                            return Ok(());
                        }
                        if self.kind == Kind::Read && self.peer_source.is_none() {
                            return Err(v(Violation::DataBeforeSource));
                        }
                        self.rx_state = self.rx_state.on(RxEvent::Data).map_err(v)?;
                        self.rx
                            .on_data(u64::from(len))
                            .map_err(|e| v(Violation::RingOverrun(e)))?;
                        self.peer_wants_credit |= credit_wanted;
                        if self.local_read_shut {
                            self.discard_readable();
                        }
                    }
                    Imm::Credit { bytes, slots } => {
                        if let Some(b) = byte_len.filter(|&b| b != 0) {
                            return Err(v(Violation::ImmLengthMismatch {
                                imm: 0,
                                byte_len: b,
                            }));
                        }
                        peer.tx
                            .credit(u64::from(bytes))
                            .map_err(|e| v(Violation::BadCredit(e)))?;
                        peer.slots.restore(u32::from(slots)).map_err(v)?;
                        Self::retire_tx_move(peer, &mut self.moves);
                    }
                    Imm::Wake => {
                        if let Some(b) = byte_len.filter(|&b| b != 0) {
                            return Err(v(Violation::ImmLengthMismatch {
                                imm: 0,
                                byte_len: b,
                            }));
                        }
                        if !self.records.on {
                            return Err(v(Violation::UnannouncedRecords));
                        }
                        self.records.reader_wake.woken();
                    }
                }
            }
            Completion::Recv { payload } => {
                match ControlMsg::decode(payload).map_err(|e| v(Violation::Decode(e)))? {
                    ControlMsg::SwitchOver { tcp_bytes_sent } => {
                        self.rx_state = match (self.back.as_mut(), self.rx_state) {
                            // Stopped, and already read past the bytes it declares: the rest
                            // was the peer's continuation (it came on TCP before this did).
                            (Some(b), RxState::Tcp { received }) if tcp_bytes_sent < received => {
                                b.cont_read += received - tcp_bytes_sent;
                                RxState::Ring
                            }
                            _ => self
                                .rx_state
                                .on(RxEvent::SwitchOver { tcp_bytes_sent })
                                .map_err(v)?,
                        };
                        // Credit it at once (it owes a slot): the peer knows then that we
                        // expect its stream on the ring, which it must to fail over (§8.6).
                        self.peer_wants_credit |= self.failover;
                        self.credit_owed |= self.failover;
                    }
                    ControlMsg::ShutdownWrite { ring_bytes } => {
                        self.check_fin_cursor(ring_bytes)?;
                        self.rx_state = self
                            .rx_state
                            .on(RxEvent::Fin(PeerFin::Shutdown))
                            .map_err(v)?;
                        self.owe_fin_credit();
                    }
                    ControlMsg::Close { reset: true, .. } => return Err(ErrorReason::Reset),
                    ControlMsg::Close { ring_bytes, .. } => {
                        self.check_fin_cursor(ring_bytes)?;
                        if let Some(b) = self.back {
                            if b.cont_read > 0 || b.peer_read.is_some() {
                                return Err(v(Violation::CloseAfterSwitchBack));
                            }
                            // The peer closed before it saw our SwitchBack: it will send no
                            // continuation, so what it wrote is read from the ring after all.
                            self.back = None;
                        }
                        self.rx_state =
                            self.rx_state.on(RxEvent::Fin(PeerFin::Close)).map_err(v)?;
                        self.owe_fin_credit();
                    }
                    ControlMsg::Source { ring } => {
                        if self.kind != Kind::Read || self.peer_source.is_some() {
                            return Err(v(Violation::UnexpectedSource));
                        }
                        if ring.size != self.local.ring.size {
                            return Err(v(Violation::SourceSize {
                                declared: ring.size.bytes(),
                                ring: self.local.ring.size.bytes(),
                            }));
                        }
                        self.peer_source = Some(ring);
                    }
                    ControlMsg::CreditUpdate { read_cursor, slots } => {
                        peer.tx
                            .credit_to(read_cursor)
                            .map_err(|e| v(Violation::BadCredit(e)))?;
                        peer.slots.restore(slots).map_err(v)?;
                        Self::retire_tx_move(peer, &mut self.moves);
                    }
                    ControlMsg::RingOffer { ring } => {
                        if !self.moves.on {
                            return Err(v(Violation::UnannouncedRingMove));
                        }
                        // (the last move's old ring is done with once every byte in it was
                        // acknowledged; the receiver offers again only after it credited them
                        // all, and its credits come before its offer — or there were none to
                        // credit, the move's cursor acknowledged when it began)
                        Self::retire_tx_move(peer, &mut self.moves);
                        if peer.tx.moved().is_some()
                            || self.moves.moved_at.is_some()
                            || self.moves.peer_offer.is_some()
                        {
                            return Err(v(Violation::RingOfferDuringMove));
                        }
                        self.moves.asked = None;
                        // (a direction that writes no more, or is going back to TCP, has no
                        // use for it: the offer stays unanswered, and the peer frees the ring
                        // with the connection)
                        if Self::moves_writes(self.back, self.tx_state) {
                            // (the move itself once the transport has the staging area for
                            // it: `staging_ready`)
                            self.moves.peer_offer = Some(ring);
                            self.moves.actions.push_back(Action::NewStaging {
                                gen: peer.tx.gen() + 1,
                                size: ring.size,
                            });
                        }
                    }
                    ControlMsg::RingMoved { at } => {
                        if !self.moves.on {
                            return Err(v(Violation::UnannouncedRingMove));
                        }
                        let Some(ring) = self.moves.offered.filter(|_| !self.moves.offer_unsent)
                        else {
                            return Err(v(Violation::UnexpectedRingMoved));
                        };
                        if !self.rx.move_to(at, ring.size) {
                            return Err(v(Violation::RingMovedCursorMismatch {
                                declared: at,
                                received: self.rx.head(),
                            }));
                        }
                        self.moves.offered = None;
                        self.local.ring = ring;
                        self.policy = CreditPolicy::new(
                            ring.size,
                            self.local.recv_slots,
                            self.cfg.credit_byte_shift,
                            self.cfg.credit_slot_threshold,
                        );
                        self.stats.moves_in += 1;
                        self.release_old_ring();
                    }
                    ControlMsg::RingWanted { size } => {
                        if !self.moves.on {
                            return Err(v(Violation::UnannouncedRingMove));
                        }
                        self.moves.peer_wants = Some(size);
                    }
                    ControlMsg::SwitchBack {
                        ring_bytes,
                        read_cursor,
                    } => {
                        if ring_bytes != self.rx.head() {
                            return Err(v(Violation::SwitchBackCursorMismatch {
                                declared: ring_bytes,
                                received: self.rx.head(),
                            }));
                        }
                        if !(peer.tx.acked()..=peer.tx.posted()).contains(&read_cursor) {
                            return Err(v(Violation::SwitchBackReadCursor {
                                declared: read_cursor,
                                acked: peer.tx.acked(),
                                posted: peer.tx.posted(),
                            }));
                        }
                        if self.back.is_some_and(|b| b.peer_read.is_some()) {
                            return Err(v(Violation::DuplicateSwitchBack));
                        }
                        if !self.own_switch_back {
                            return Err(v(Violation::UnannouncedSwitchBack));
                        }
                        let back = self
                            .back
                            .get_or_insert(Back::new(self.rx.tail(), &mut self.switch_pending));
                        back.peer_read = Some(read_cursor);
                        self.owe_fin_credit();
                    }
                    ControlMsg::Barrier { .. } => self.barriers.received += 1,
                    ControlMsg::Sleeping { seen } => {
                        if !self.records.on {
                            return Err(v(Violation::UnannouncedRecords));
                        }
                        let notice = Notice { seen };
                        if self.records.writer_wake.on_notice(notice, peer.tx.posted())
                            == OnNotice::Ring
                        {
                            self.records.doorbell = true;
                        }
                    }
                    ControlMsg::Ignored { .. } => {}
                }
            }
        }
        Ok(())
    }

    /// READ pull (§16): the peer's last stream message (its end, or its SwitchBack) came,
    /// after every pull before it completed; the peer waits for its credit before it tears
    /// down ([`Self::peer_pulled`]).
    fn owe_fin_credit(&mut self) {
        if self.kind == Kind::Read {
            self.peer_wants_credit = true;
            self.credit_owed = true;
        }
    }

    /// Whether this side's writes may move to another ring: it is still writing to the ring
    /// (not shut down or closing, not switching back to TCP). (Fields, not `&self`: asked while
    /// the peer's state is borrowed.)
    fn moves_writes(back: Option<Back>, tx_state: TxState) -> bool {
        back.is_none() && !matches!(tx_state, TxState::Finishing(_) | TxState::Finished(_))
    }

    /// The sender's old staging area goes once the peer acknowledged every byte in it.
    fn retire_tx_move(peer: &mut Peer, moves: &mut Moves) {
        if let Some(gen) = peer.tx.retire_move() {
            peer.old_ring = None;
            moves.actions.push_back(Action::ReleaseStaging { gen });
        }
    }

    /// The receiver's old ring goes once the application read past the move's cursor.
    fn release_old_ring(&mut self) {
        if let Some(gen) = self.rx.release_old() {
            self.moves.actions.push_back(Action::ReleaseRing { gen });
        }
    }

    fn check_fin_cursor(&self, declared: u64) -> Result<(), ErrorReason> {
        if declared != self.rx.head() {
            return Err(ErrorReason::Protocol(Violation::FinCursorMismatch {
                declared,
                received: self.rx.head(),
            }));
        }
        Ok(())
    }

    /// The queue pair failed (error completion, async QP error) or the CM reported
    /// DISCONNECTED/UNREACHABLE/CONNECT_ERROR/… Poll the CQ dry and hand over every successful
    /// completion first: a peer that closed cleanly is then already seen as closed, and this
    /// call changes nothing.
    pub fn handle_transport_error(&mut self) {
        if self.fail_over() {
            return;
        }
        if let (Some(b), Life::Established) = (self.back, self.life) {
            if b.peer_read.is_none()
                && b.cont_read == 0
                && matches!(self.rx_state, RxState::Tcp { .. })
            {
                // Switching back, and the peer, which never moved its stream to the ring, tore
                // its queue pair down without a SwitchBack: it closed (its FIN is or will be
                // on TCP). Nobody will read a continuation; what it sent is all on TCP.
                self.back = None;
                self.peer_read_closed = true;
                self.enter_closed();
                return;
            }
        }
        if !matches!(self.life, Life::Closed | Life::Failed(_)) {
            self.fail(ErrorReason::Transport);
        }
    }

    /// The shim read EOF (0 bytes) from the TCP socket. Poll the CQ dry first.
    ///
    /// If the peer never switched, its TCP stream is complete and this is its EOF (it closed:
    /// our further writes fail with EPIPE). If it switched but the ring did not end, it
    /// vanished ([`ErrorReason::PeerVanished`]). During the handshake, the upgrade is abandoned.
    pub fn handle_tcp_eof(&mut self) -> Result<(), ErrorReason> {
        if let Some(i) = self.incoming.filter(|i| !i.done() && !self.local_read_shut) {
            return match i.on_eof() {
                Ok(()) => Ok(()),
                Err(r) => Err(self.fail(r)),
            };
        }
        if let (Some(b), Life::Established) = (self.back.as_mut(), self.life) {
            // Switching back: the EOF ends the peer's TCP stream, continuation included; reads
            // report it once that is certain ([`Self::recv`]). Our own continuation still
            // needs the peer's SwitchBack, so nothing closes here.
            b.tcp_eof = true;
            return Ok(());
        }
        match self.life {
            Life::Connecting { .. } | Life::Accepted { .. } => {
                Err(self.fail(ErrorReason::TcpClosed))
            }
            // The peer ends TCP without having switched, and has not confirmed our SwitchOver
            // yet (with failover it credits it at once, before its own end). Most likely the
            // confirmation is on its way (the socket and the queue pair are two paths: a FIN
            // may overtake a credit). But the peer may also have fallen back to TCP alone —
            // its queue pair failed before our SwitchOver reached it, so it could not know we
            // had switched — and then it waits on TCP for what we wrote into the ring: ending
            // cleanly would cut its stream short without a word. The EOF is held until the
            // confirmation comes; a transport error first fails the stream (the shim resets
            // TCP: the peer reads ECONNRESET).
            Life::Established
                if self.failover
                    && self.switch_posted
                    && matches!(self.rx_state, RxState::Tcp { .. })
                    && !self.switch_confirmed() =>
            {
                self.eof_held = true;
                Ok(())
            }
            Life::Established => match self.rx_state.on(RxEvent::TcpEof) {
                Ok(s) => {
                    if matches!(self.rx_state, RxState::Tcp { .. }) {
                        self.peer_read_closed = true;
                    }
                    self.rx_state = s;
                    self.after_state_change();
                    Ok(())
                }
                Err(Violation::TcpEofBeforeSwitchOver) if !self.rx_state.is_finished() => {
                    Err(self.fail(ErrorReason::PeerVanished))
                }
                Err(v) => Err(self.fail(ErrorReason::Protocol(v))),
            },
            Life::Closed => {
                if let Ok(s) = self.rx_state.on(RxEvent::TcpEof) {
                    self.rx_state = s;
                }
                Ok(())
            }
            Life::Failed(r) => Err(r),
        }
    }

    /// The TCP connection was reset (ECONNRESET from the socket).
    pub fn handle_tcp_reset(&mut self) {
        if !matches!(self.life, Life::Failed(_)) {
            self.fail(ErrorReason::Reset);
        }
    }

    /// The kernel gave up the TCP connection under the stream (`timed_out`: ETIMEDOUT, its
    /// keepalive probes or its user timeout; otherwise a reset or an unreachable peer), while
    /// the stream is on the ring. Its peer's end is unreachable or gone, and so is the way
    /// back to TCP: the stream fails as the TCP connection would have (reads and writes fail
    /// with the error; bytes not yet read from the ring are dropped with it). After a
    /// failover the stream is TCP's and the application meets the error there itself; this
    /// changes nothing then, nor after a clean end.
    pub fn handle_tcp_error(&mut self, timed_out: bool) {
        if self.failed_over() || !self.established() {
            return;
        }
        self.fail(if timed_out {
            ErrorReason::TcpTimedOut
        } else {
            ErrorReason::Reset
        });
    }

    // ----- output ----------------------------------------------------------------------------

    /// The next action for the transport, or `None` when there is nothing to do until the
    /// next input. Call until `None` after every input.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.reached_data = false;
        if self.teardown == Teardown::Pending && self.credit_owed && self.closed() {
            // (the credit of the peer's SwitchOver first: its confirmation that we read its
            // stream on the ring, which it waits for before it takes our TCP end; or of its end
            // on a connection we pull from, which it waits for before it tears down)
            self.peer_wants_credit = true;
            self.credit_owed = false;
            if let Some(a) = self.poll_credit() {
                return Some(a);
            }
        }
        if self.teardown == Teardown::Pending {
            self.teardown = Teardown::Done;
            return Some(Action::Teardown);
        }
        if !self.established() {
            return None;
        }
        if let Some(ring) = self.source.filter(|_| !self.source_sent) {
            // READ pull (§16): where our DATA is read from, before any of it.
            let peer = self.peer.as_mut()?;
            if !peer.slots.can_post_message() {
                return None;
            }
            peer.slots.take();
            self.source_sent = true;
            self.stats.control_sent += 1;
            return Some(Action::Send(ControlMsg::Source { ring }));
        }
        // (a new staging area before the writes that use it; the releases whenever)
        if let Some(a) = self.moves.actions.pop_front() {
            return Some(a);
        }
        if let Some(a) = self.poll_credit() {
            return Some(a);
        }
        if let Some(a) = self.poll_move_message() {
            return Some(a);
        }
        if let Some(a) = self.poll_sleeping() {
            return Some(a);
        }
        let peer = self.peer.as_mut()?;
        if let Some(b) = self.back.as_mut() {
            // Switching back: the SwitchBack is the last stream message (credits still go
            // out until the peer's arrives). Like a credit it may take the last slot: after
            // it we need nothing from the peer but its own SwitchBack.
            if b.posted || !peer.slots.can_post_credit(true) {
                return None;
            }
            peer.slots.take();
            b.posted = true;
            if self.kind == Kind::Read {
                self.end_seq = Some(peer.slots.spent());
            }
            let msg = ControlMsg::SwitchBack {
                ring_bytes: peer.tx.posted(),
                read_cursor: b.stopped_at,
            };
            self.stats.control_sent += 1;
            self.after_state_change();
            return Some(Action::Send(msg));
        }
        if let Some(tcp_bytes_sent) = self.switch_pending {
            if !peer.slots.can_post_message() {
                return None;
            }
            peer.slots.take();
            self.switch_seq = Some(peer.slots.spent());
            self.switch_pending = None;
            self.switch_posted = true;
            self.stats.control_sent += 1;
            return Some(Action::Send(ControlMsg::SwitchOver { tcp_bytes_sent }));
        }
        if !self.switch_posted {
            return None;
        }
        if self.records.doorbell {
            if !peer.slots.can_post_message() {
                return None;
            }
            peer.slots.take();
            self.records.doorbell = false;
            return Some(Action::Doorbell {
                remote_addr: peer.ring.addr,
                imm: Imm::Wake,
            });
        }
        if self.barriers.posted < self.barriers.requested
            && peer.tx.posted() >= self.barriers.after
            && !matches!(self.tx_state, TxState::Finished(_))
        {
            if !peer.slots.can_post_message() {
                return None;
            }
            peer.slots.take();
            self.barriers.posted += 1;
            self.stats.control_sent += 1;
            return Some(Action::Send(ControlMsg::Barrier {
                epoch: self.barriers.posted,
            }));
        }
        if let Some(at) = self.moves.moved_at {
            // Every byte before the move is written to the old ring before the RingMoved, and
            // none after it before.
            if peer.tx.posted() >= at {
                if !peer.slots.can_post_message() {
                    return None;
                }
                peer.slots.take();
                self.moves.moved_at = None;
                self.stats.moves_out += 1;
                self.stats.control_sent += 1;
                return Some(Action::Send(ControlMsg::RingMoved { at }));
            }
        }
        if let Some(&rec) = self.records.unposted.front() {
            // Records: one WRITE each, sealed first if it is the open one.
            if self.records.unposted.len() == 1 {
                self.records.seal(&mut peer.tx);
            }
            let wake = self.records.writer_wake.armed();
            let credit_wanted = self.send_blocked || peer.tx.free() < MIN_RECORD;
            if (wake || credit_wanted) && !peer.slots.can_post_message() {
                return None;
            }
            let frame = framing::frame(rec.at, rec.len, peer.tx.size(), self.records.tx_salt)
                .expect("records are accepted word-aligned and within the ring");
            let imm = (wake || credit_wanted).then(|| {
                peer.slots.take();
                Imm::Data {
                    len: frame.bytes as u32,
                    credit_wanted,
                }
            });
            self.records.writer_wake.on_post();
            self.records.unposted.pop_front();
            debug_assert_eq!(peer.tx.posted(), rec.at, "records are posted in order");
            peer.tx.mark_posted(frame.bytes);
            if credit_wanted {
                self.send_blocked = false;
                self.stats.credit_wanted += 1;
            }
            self.stats.data_writes += 1;
            self.stats.data_bytes += u64::from(rec.len);
            let place = peer.tx.place(rec.at);
            return Some(Action::WriteRecord {
                cursor: rec.at,
                len: frame.bytes as usize,
                gen: place.gen,
                ring_offset: place.offset,
                remote_addr: peer.ring.addr.wrapping_add(place.offset as u64),
                rkey: peer.ring.rkey,
                header: frame.header,
                trailer_at: frame.trailer_at,
                imm,
            });
        }
        self.reached_data = true;
        self.poll_data()
    }

    /// Whether the last [`Self::poll_action`] went past every other kind of action to the
    /// stream's DATA (and the end after it): nothing else was due or waiting for a slot. Until
    /// the core is changed otherwise than by bytes [`Self::send`] accepted without stirring
    /// it ([`Self::take_stirred`]), or by completions and consumes that did not stir it, the
    /// next `poll_action` goes there again, and [`Self::poll_data`] returns what it would: a
    /// transport that knows its core unchanged but for those posts a write's DATA without the
    /// other branches' tests (rdma-core's link; the simulated pair checks it at every pass).
    pub fn reached_data(&self) -> bool {
        self.reached_data
    }

    /// The last part of [`Self::poll_action`]: the DATA of the bytes sent and not yet posted,
    /// or the end (ShutdownWrite or Close) once all are. Only for a core that
    /// [`reached_data`](Self::reached_data) on its last pass and was changed since only as
    /// that says: then it returns, and changes, exactly what `poll_action` would.
    pub fn poll_data(&mut self) -> Option<Action> {
        self.reached_data = true;
        let peer = self.peer.as_mut()?;
        let place = peer.tx.place(peer.tx.posted());
        let max = Self::write_max(&self.cfg, self.kind, place.size);
        if let Some(w) = peer.tx.next_write(max, self.cfg.split_at_wrap) {
            // (READ pull: nothing to read a DATA from before the peer knows our staging area)
            let unsourced = self.kind == Kind::Read && !self.source_sent;
            if unsourced || !peer.slots.can_post_message() {
                return None;
            }
            return Some(self.data_of(w, place));
        }
        if let TxState::Finishing(fin) = self.tx_state {
            if self.barriers.posted < self.barriers.requested || !peer.slots.can_post_message() {
                return None;
            }
            peer.slots.take();
            if self.kind == Kind::Read {
                self.end_seq = Some(peer.slots.spent());
            }
            let ring_bytes = peer.tx.posted();
            let msg = match fin {
                Fin::Shutdown => ControlMsg::ShutdownWrite { ring_bytes },
                Fin::Close { reset } => ControlMsg::Close { ring_bytes, reset },
            };
            self.tx_state = self
                .tx_state
                .on(TxEvent::FinPosted)
                .expect("Finishing accepts FinPosted");
            self.stats.control_sent += 1;
            self.after_state_change();
            return Some(Action::Send(msg));
        }
        None
    }

    /// The DATA of write `w` (the next bytes to post, at `place`; a slot of the peer's is
    /// free): takes the slot, marks the bytes posted, asks for credit if the writer was held
    /// back or the ring is full, carries the credit owed (duplex), counts it, and says whether
    /// anything follows it ([`Self::nothing_after`]).
    fn data_of(&mut self, w: WriteRange, place: Place) -> Action {
        let peer = self.peer.as_mut().expect("a DATA has a peer");
        peer.slots.take();
        peer.tx.mark_posted(w.len);
        let ring = match peer.old_ring {
            Some(old) if place.gen < peer.tx.gen() => old,
            _ => peer.ring,
        };
        let imm = self.data_imm(w.len);
        // (what this DATA changes that a later poll reads: the bytes posted — more to
        // write, a barrier or a RingMoved behind them, the end after them — and the
        // credit it carried; the branches before the data's found nothing due, and it
        // changes none of their conditions but by taking a slot)
        let unposted = self.peer.as_ref().map_or(0, |p| p.tx.unposted());
        self.nothing_after = unposted == 0
            && self.barriers.posted >= self.barriers.requested
            && self.moves.moved_at.is_none()
            && !matches!(self.tx_state, TxState::Finishing(_))
            && !self.credit_due();
        Action::WriteData {
            cursor: w.cursor,
            len: w.len as usize,
            gen: place.gen,
            ring_offset: place.offset,
            remote_addr: ring.addr.wrapping_add(place.offset as u64),
            rkey: ring.rkey,
            imm,
        }
    }

    /// The immediate of a DATA of `len` bytes whose slot was taken and whose bytes were
    /// marked posted: it asks for credit if the writer was held back or the peer's ring is
    /// full now, and carries the credit owed where it fits (duplex, §17); counted.
    // (inline on the data path: a call and a return less a message, each return a block
    // lookup under emulation — docs/bench/kinds.md, session 62)
    #[inline(always)]
    fn data_imm(&mut self, len: u64) -> Imm {
        let full = self.peer.as_ref().is_some_and(|p| p.tx.free() == 0);
        let credit_wanted = self.send_blocked || full;
        if credit_wanted {
            self.send_blocked = false;
            self.stats.credit_wanted += 1;
        }
        self.stats.data_writes += 1;
        self.stats.data_bytes += len;
        let Some((units, slots)) = Self::piggyback(
            self.kind,
            len,
            &self.policy,
            &mut self.rx,
            &mut self.rx_slots,
        ) else {
            return Imm::Data {
                len: len as u32,
                credit_wanted,
            };
        };
        // Duplex (§17): the credit owed goes with the DATA (what fits of it).
        if self.rx.owed() == 0 && self.rx_slots.owed() == 0 {
            self.peer_wants_credit = false;
            self.credit_owed = false;
        }
        self.stats.credits_sent += 1;
        self.stats.credits_piggybacked += 1;
        Imm::DataCredit {
            len: len as u32,
            credit_wanted,
            units,
            slots,
        }
    }

    /// A RingOffer or RingWanted due (§6.4): control messages, each a slot of the peer's.
    fn poll_move_message(&mut self) -> Option<Action> {
        if !self.moves.on || self.back.is_some() {
            return None;
        }
        let peer = self.peer.as_mut()?;
        let msg = if let Some(ring) = self.moves.offered.filter(|_| self.moves.offer_unsent) {
            ControlMsg::RingOffer { ring }
        } else if let Some(size) = self.moves.want {
            ControlMsg::RingWanted { size }
        } else {
            return None;
        };
        if !peer.slots.can_post_message() {
            return None;
        }
        peer.slots.take();
        match msg {
            ControlMsg::RingOffer { .. } => self.moves.offer_unsent = false,
            _ => self.moves.want = None,
        }
        self.stats.control_sent += 1;
        Some(Action::Send(msg))
    }

    /// Records: the reader's Sleeping notice, due since [`Self::prepare_sleep`] (a control
    /// message, a slot of the peer's).
    fn poll_sleeping(&mut self) -> Option<Action> {
        let seen = self.records.notice_due?;
        let peer = self.peer.as_mut()?;
        if !peer.slots.can_post_message() {
            return None;
        }
        peer.slots.take();
        self.records.notice_due = None;
        self.stats.control_sent += 1;
        Some(Action::Send(ControlMsg::Sleeping { seen }))
    }

    // ----- records (§14) ---------------------------------------------------------------------

    /// Whether both sides write records ([`Kind::Records`]): the transport then polls the
    /// local ring with [`Self::poll_ring`].
    pub fn records(&self) -> bool {
        self.records.on
    }

    /// Whether both sides carry their DATA as SENDs ([`Kind::Sends`]): the transport then
    /// posts a DATA, a credit and a doorbell as a SEND WITH IMMEDIATE, and copies each DATA it
    /// receives into its ring at [`Self::landing`] before it hands the completion over.
    pub fn sends(&self) -> bool {
        self.kind == Kind::Sends
    }

    /// Whether the receiver pulls each DATA's bytes with an RDMA READ ([`Kind::Read`],
    /// protocol §16): the transport then gives the core its staging area
    /// ([`Self::set_source`]), posts a DATA as a zero-length WRITE WITH IMMEDIATE, pulls each
    /// DATA it receives from the peer's [`Self::peer_source`] into its ring at
    /// [`Self::landing_after`] before it hands the completion over (and every later
    /// completion after it), and tears down only once [`Self::peer_pulled`].
    pub fn read(&self) -> bool {
        self.kind == Kind::Read
    }

    /// The kind the connection carries (before the handshake's end: WRITE WITH IMMEDIATE).
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// READ pull (§16): the transport's staging area for the peer to read our DATA from (its
    /// ring's size, registered for the peer to read). It goes out as a Source before any
    /// DATA; the DATA waits for it. Ignored on other kinds and after the first call.
    pub fn set_source(&mut self, staging: RingDesc) {
        if self.kind == Kind::Read && self.source.is_none() {
            self.source = Some(staging);
        }
    }

    /// READ pull (§16): the peer's staging area, from its Source (the first message it sends).
    pub fn peer_source(&self) -> Option<RingDesc> {
        self.peer_source
    }

    /// READ pull (§16): where in the local ring the `len` bytes of a DATA announced now go,
    /// when `ahead` bytes announced before it are still being pulled (not handed over yet):
    /// the place of rx head + `ahead` (at that offset in the peer's staging area too). `None`
    /// as [`Self::landing`]: past the credit returned, or once closed or failed.
    pub fn landing_after(&self, ahead: u64, len: u32) -> Option<Place> {
        if matches!(self.life, Life::Closed | Life::Failed(_)) {
            return None;
        }
        self.rx.landing(ahead, u64::from(len)).ok()
    }

    /// Whether the peer is done with what we staged for it (READ pull, §16: it may still
    /// pull it until it confirmed our last stream message — an end or a SwitchBack, which it
    /// credits at once, after the pulls before it completed): the transport disconnects only
    /// then (or after its close timeout, or when the peer disconnected). Always on other
    /// kinds, and when we posted no such message (the peer's Close or reset ended the
    /// connection: it reads nothing more).
    pub fn peer_pulled(&self) -> bool {
        if self.kind != Kind::Read || self.error().is_some() || self.failed_over() {
            return true;
        }
        match (self.end_seq, self.peer.as_ref()) {
            (Some(n), Some(peer)) => peer.slots.returned() >= n || self.peer_read_closed,
            _ => true,
        }
    }

    /// Sends (§15): where in the local ring the bytes of a DATA of `len` bytes received now
    /// belong (the ring's next bytes), for the transport to copy them there before it hands
    /// the DATA's completion over. `None` when they would not fit the credit this side
    /// returned (the completion then fails the connection as an overrun, and nothing may be
    /// copied: the bytes past the window are unread ones), and once the connection is closed
    /// or failed (its completions are ignored: nothing would read them).
    pub fn landing(&self, len: u32) -> Option<Place> {
        if matches!(self.life, Life::Closed | Life::Failed(_)) {
            return None;
        }
        self.rx.landing(0, u64::from(len)).ok()
    }

    /// Records: looks for whole records in the local ring from where the last look ended, and
    /// makes their payloads readable ([`Self::recv`]). `word(offset)` is the little-endian
    /// word at ring offset `offset` (a multiple of 8 below the ring's size), read once as an
    /// aligned 8-byte load. Returns whether it found any. `Err`: the ring held what the peer
    /// cannot have written, and the connection has just failed.
    ///
    /// Call it in the transport's poll loop, and before every [`Self::handle_completion`]:
    /// a ShutdownWrite or Close states the ring bytes written before it, and only the records
    /// found so far count (the WRITEs before a SEND are placed before its completion).
    pub fn poll_ring(&mut self, word: impl Fn(usize) -> u64) -> Result<bool, ErrorReason> {
        // (the peer's records follow its SwitchOver; none come after its end)
        if !self.records.on
            || !self.established()
            || self.back.is_some()
            || matches!(self.rx_state, RxState::Tcp { .. })
            || self.rx_state.is_finished()
        {
            return Ok(false);
        }
        let v = ErrorReason::Protocol;
        let mut found = false;
        loop {
            let len = match self.records.scan.poll(&word) {
                Err(e) => return Err(self.fail(v(Violation::Framing(e)))),
                Ok(framing::Poll::Empty) => break,
                Ok(framing::Poll::Ready { len, .. }) => len,
            };
            let freed = self
                .records
                .scan
                .consume(len)
                .expect("the whole payload of the record just found");
            if let Err(e) = self.rx.on_data(freed) {
                return Err(self.fail(v(Violation::RingOverrun(e))));
            }
            self.rx_state = match self.rx_state.on(RxEvent::Data) {
                Ok(s) => s,
                Err(e) => return Err(self.fail(v(e))),
            };
            self.records.ready.push_back(len as u32);
            found = true;
        }
        if found && self.local_read_shut {
            self.discard_readable();
        }
        Ok(found)
    }

    /// Records: this side's Sleeping notice is out (queued or sent) and no wake-up has ended
    /// it. The peer answers it only when its owner next drives its end: a transport whose
    /// peer may go idle right after its last write looks at the ring again now and then
    /// while this holds.
    pub fn notice_out(&self) -> bool {
        self.records.on && self.records.reader_wake.asleep()
    }

    /// Records: the reader found nothing to read and is about to wait for the peer's bytes.
    /// Returns whether it may sleep on its completion channel: a Sleeping notice is out or
    /// queued ([`Self::poll_action`]), and the peer's next record, or a doorbell, will make a
    /// completion. The transport polls the ring once more after queueing it and before it
    /// sleeps: the peer may have written just before the notice left. Without records, or
    /// while nothing is due on the ring (the peer's stream is still on TCP, or has ended),
    /// every awaited event makes a completion or is on the socket, and it returns `true`
    /// without a notice. `false`: records are readable already ([`Self::recv`]).
    pub fn prepare_sleep(&mut self) -> bool {
        let reading = self.records.on
            && self.established()
            && self.back.is_none()
            && self.rx_state == RxState::Ring
            && self.records.ready.is_empty();
        if reading {
            if let Some(n) = self.records.reader_wake.sleep(self.rx.head()) {
                self.records.notice_due = Some(n.seen);
            }
        }
        self.records.ready.is_empty()
    }

    // ----- ring moves (§6.4) -----------------------------------------------------------------

    /// Offers the peer another ring for its writes to this side (registered and empty; any
    /// power-of-two size): it moves there at a cursor of its choosing, and the old ring is
    /// handed back with [`Action::ReleaseRing`] once the application read past that cursor.
    /// Returns the offered ring's generation (the one [`Recv::Ring`] names for its bytes).
    pub fn offer_ring(&mut self, ring: RingDesc) -> Result<u32, OfferError> {
        if !self.moves.on {
            return Err(OfferError::Unsupported);
        }
        if !self.established()
            || self.back.is_some()
            || self.rx_state.is_finished()
            || self.local_read_shut
        {
            return Err(OfferError::NotNow);
        }
        if self.moves.offered.is_some() || !self.rx.can_move() {
            return Err(OfferError::Busy);
        }
        self.moves.offered = Some(ring);
        self.moves.offer_unsent = true;
        self.moves.peer_wants = None;
        Ok(self.rx.gen() + 1)
    }

    /// Whether an offer of this side's is unanswered (the ring stays the transport's until
    /// the peer moves to it, or the connection ends).
    pub fn offer_outstanding(&self) -> bool {
        self.moves.offered.is_some()
    }

    /// The ring size the peer asked for ([`ControlMsg::RingWanted`]), until this side offers a
    /// ring or takes the wish ([`Self::take_ring_wanted`]).
    pub fn ring_wanted(&self) -> Option<RingSize> {
        self.moves.peer_wants
    }

    /// Takes the peer's wish ([`Self::ring_wanted`]): the transport decides about it once.
    pub fn take_ring_wanted(&mut self) -> Option<RingSize> {
        self.moves.peer_wants.take()
    }

    /// Asks the peer for a ring of `size` bytes for this side's writes (they wait for the
    /// current one's space): it may offer one. Asked once per size until it offers; `false` if
    /// moves are off, a move is under way, or the peer's ring is that size already.
    pub fn want_ring(&mut self, size: RingSize) -> bool {
        let Some(peer) = self.peer.as_ref() else {
            return false;
        };
        if !self.moves.on
            || !self.established()
            || peer.tx.moved().is_some()
            || peer.tx.size() == size
            || self.moves.asked == Some(size)
        {
            return false;
        }
        self.moves.want = Some(size);
        self.moves.asked = Some(size);
        true
    }

    /// The transport has the staging area [`Action::NewStaging`] asked for (generation `gen`):
    /// the writes move to the peer's offered ring from the bytes accepted so far on (and bytes
    /// accepted from now on are staged there). `false` if there is no such offer any more (the
    /// sending direction ended meanwhile): the staging area is not needed.
    pub fn staging_ready(&mut self, gen: u32) -> bool {
        let writing = self.established() && Self::moves_writes(self.back, self.tx_state);
        let Some(peer) = self.peer.as_mut() else {
            return false;
        };
        let Some(ring) = self.moves.peer_offer.filter(|_| gen == peer.tx.gen() + 1) else {
            return false;
        };
        self.moves.peer_offer = None;
        if !writing {
            return false;
        }
        let Some(at) = peer.tx.begin_move(ring.size) else {
            return false;
        };
        peer.old_ring = Some(peer.ring);
        peer.ring = ring;
        self.moves.moved_at = Some(at);
        // (nothing staged before the move was left unacknowledged: the old area goes now)
        Self::retire_tx_move(peer, &mut self.moves);
        true
    }

    /// The tunables this connection was made with.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Whether both sides announced ring moves.
    pub fn ring_moves(&self) -> bool {
        self.moves.on
    }

    /// Where the staged byte at stream cursor `cursor` is: its staging area's generation and
    /// offset (for a transport that reads staged bytes again, as a failover's repeat does).
    pub fn tx_place(&self, cursor: u64) -> Option<crate::ring::Place> {
        self.peer.as_ref().map(|p| p.tx.place(cursor))
    }

    /// The longest DATA into a ring of `size` bytes: `max_write` if set, and over sends one
    /// receive's worth (one SEND fills at most one of the peer's receives).
    fn write_max(cfg: &Config, kind: Kind, size: RingSize) -> u64 {
        let max = match cfg.max_write {
            0 => size.bytes(),
            m => m.min(size.bytes()),
        };
        match kind {
            Kind::Sends => max.min(SENDS_BUF as u64),
            _ => max,
        }
    }

    /// Duplex (§17): the credit a DATA of `len` bytes about to go carries, taken: the whole
    /// [`Imm::CREDIT_UNIT`]s of the bytes owed, as many as fit, and the slots owed once they
    /// reach the policy's threshold (`None`: nothing, or not duplex, or too long a DATA).
    /// (Fields, not `&mut self`: asked while the peer's state is borrowed.)
    // (inline on the data path: a call and a return less a message, each return a block
    // lookup under emulation — docs/bench/kinds.md, session 62)
    #[inline(always)]
    fn piggyback(
        kind: Kind,
        len: u64,
        policy: &CreditPolicy,
        rx: &mut RxCursors,
        rx_slots: &mut RxSlots,
    ) -> Option<(u16, u8)> {
        if kind != Kind::Duplex || len > u64::from(Imm::MAX_DUPLEX_LEN) {
            return None;
        }
        let (units, slots) = Self::piggyback_size(policy, rx, rx_slots);
        if units == 0 && slots == 0 {
            return None;
        }
        rx.take_credit(units * Imm::CREDIT_UNIT);
        rx_slots.take(slots);
        Some((units as u16, slots as u8))
    }

    /// The credit units and slots a DATA would carry now ([`Self::piggyback`]). Slots go only
    /// in a batch, as a CREDIT returns them: every slot returned is a receive posted before the
    /// DATA that returns it, and a post per message cost a 64 B ping-pong ~3 µs of its 17
    /// (soft-RoCE VM, `scripts/bench-kinds`).
    fn piggyback_size(policy: &CreditPolicy, rx: &RxCursors, rx_slots: &RxSlots) -> (u64, u32) {
        let slots = match rx_slots.owed() {
            n if n >= policy.slot_threshold => n.min(u32::from(Imm::MAX_DUPLEX_SLOTS)),
            _ => 0,
        };
        (
            (rx.owed() / Imm::CREDIT_UNIT).min(u64::from(Imm::MAX_DUPLEX_UNITS)),
            slots,
        )
    }

    /// Duplex (§17): a DATA goes out next, in this same pass, and takes the credit owed so
    /// that what it leaves (less than a unit of bytes, slots past what fits) is not due: the
    /// credit waits for it instead of taking a message of its own.
    fn credit_rides_on_data(&self) -> bool {
        let Some(peer) = self.peer.as_ref() else {
            return false;
        };
        if self.kind != Kind::Duplex
            || !self.switch_posted
            || self.switch_pending.is_some()
            || self.back.is_some()
            || !peer.slots.can_post_message()
        {
            return false;
        }
        let (units, slots) = Self::piggyback_size(&self.policy, &self.rx, &self.rx_slots);
        let rest = self.rx.owed() - units * Imm::CREDIT_UNIT;
        let rest_slots = self.rx_slots.owed() - slots;
        let wanted = self.peer_wants_credit || self.credit_owed || self.rx.move_credit_due();
        // (the DATA the next pass would post: the data branch's own limit, ring and all)
        let size = peer.tx.place(peer.tx.posted()).size;
        let max = Self::write_max(&self.cfg, self.kind, size);
        (units > 0 || slots > 0)
            && !self.policy.due(rest, rest_slots, wanted)
            && peer
                .tx
                .next_write(max, self.cfg.split_at_wrap)
                .is_some_and(|w| w.len <= u64::from(Imm::MAX_DUPLEX_LEN))
    }

    /// Whether the credit policy makes a credit due as a message of its own (before
    /// [`Self::credit_rides_on_data`] has its say).
    // (inline on the data path: a call and a return less a message, each return a block
    // lookup under emulation — docs/bench/kinds.md, session 62)
    #[inline(always)]
    fn credit_due(&self) -> bool {
        let owed_slots = self.rx_slots.owed();
        let wanted = self.peer_wants_credit || self.rx.move_credit_due();
        if self.kind == Kind::Duplex {
            // (duplex: a credit the policy makes due rides on the next DATA; it goes apart
            // only when the peer asks, or it has waited long enough — an application's read
            // makes it due, and its answer, written next, carries it: §17)
            self.policy.due_apart(self.rx.owed(), owed_slots, wanted)
        } else {
            self.policy.due(self.rx.owed(), owed_slots, wanted)
        }
    }

    fn poll_credit(&mut self) -> Option<Action> {
        if !self.credit_due() || self.credit_rides_on_data() {
            return None;
        }
        let owed_slots = self.rx_slots.owed();
        let peer = self.peer.as_mut()?;
        if !peer.slots.can_post_credit(owed_slots > 0) {
            return None;
        }
        peer.slots.take();
        self.peer_wants_credit = false;
        self.credit_owed = false;
        self.stats.credits_sent += 1;
        if owed_slots <= u32::from(Imm::MAX_CREDIT_SLOTS) {
            let slots = self.rx_slots.take(u32::from(Imm::MAX_CREDIT_SLOTS)) as u8;
            // The local ring is at most 2^23 bytes, so everything owed fits the 24-bit field.
            let bytes = self.rx.take_credit(u64::from(Imm::MAX_CREDIT_BYTES)) as u32;
            Some(Action::WriteCredit {
                remote_addr: peer.ring.addr,
                imm: Imm::Credit { bytes, slots },
            })
        } else {
            let slots = self.rx_slots.take(u32::MAX);
            self.rx.take_credit(u64::MAX);
            self.stats.control_sent += 1;
            Some(Action::Send(ControlMsg::CreditUpdate {
                read_cursor: self.rx.credited(),
                slots,
            }))
        }
    }

    // ----- lifecycle helpers -----------------------------------------------------------------

    // (a look at the variant alone: `Life`'s derived `==` compares the handshake's payloads
    // and is a call, several on every poll of the data path)
    fn established(&self) -> bool {
        matches!(self.life, Life::Established)
    }

    fn closed(&self) -> bool {
        matches!(self.life, Life::Closed)
    }

    fn fail(&mut self, reason: ErrorReason) -> ErrorReason {
        if let Life::Failed(r) = self.life {
            return r;
        }
        self.life = Life::Failed(reason);
        if self.teardown == Teardown::No {
            self.teardown = Teardown::Pending;
        }
        reason
    }

    fn enter_closed(&mut self) {
        self.life = Life::Closed;
        if self.teardown == Teardown::No {
            self.teardown = Teardown::Pending;
        }
    }

    /// Applies the consequences of a half-state change: a peer Close (or a peer that left
    /// without switching) makes our sends fail and drops unsent bytes; the wire is done when
    /// we posted Close, when the peer closed, or when both write sides are finished.
    fn after_state_change(&mut self) {
        if !self.established() {
            return;
        }
        if let Some(b) = self.back {
            if let (true, Some(from)) = (b.posted, b.peer_read) {
                self.finish_back(b, from);
                return;
            }
            let both_fins = matches!(self.tx_state, TxState::Finished(_))
                && matches!(self.rx_state, RxState::Finished { fin, .. } if fin != PeerFin::TcpFin);
            if !(both_fins && b.peer_read.is_none() && b.cont_read == 0) {
                return;
            }
            // Both write sides had ended on the ring before the switch back could happen: the
            // peer is done with the wire and will not answer. Nothing moves to TCP; what it
            // wrote is read from the ring after all.
            self.back = None;
        }
        let peer_fin = match self.rx_state {
            RxState::Finished { fin, .. } => Some(fin),
            _ => None,
        };
        if matches!(peer_fin, Some(PeerFin::Close | PeerFin::TcpFin)) {
            self.peer_read_closed = true;
            if let Some(p) = self.peer.as_mut() {
                p.tx.discard_unposted();
                self.records.discard_unposted();
            }
        }
        let done = matches!(self.tx_state, TxState::Finished(Fin::Close { .. }))
            || matches!(peer_fin, Some(PeerFin::Close | PeerFin::TcpFin))
            || (matches!(self.tx_state, TxState::Finished(_)) && peer_fin.is_some());
        if done {
            self.enter_closed();
        }
    }

    /// Both SwitchBacks are through: the ring is done, both directions go on over TCP. Ours
    /// from the peer's read cursor: the staged bytes from there are written to TCP first
    /// (then a shutdown, if our write side was shut).
    fn finish_back(&mut self, mut b: Back, from: u64) {
        b.resume_at = from;
        b.resume_end = self.peer.as_ref().map_or(from, |p| p.tx.head());
        b.resume_shut = b.shut || self.tx_state.is_shut();
        self.back = Some(b);
        // Unread ring bytes are the peer's to send again; nothing is read from the ring now.
        self.rx.discard_unread();
        self.records.discard_unread();
        self.tx_state = TxState::Tcp;
        self.rx_state = if b.tcp_eof {
            RxState::Finished {
                tcp_remaining: 0,
                fin: PeerFin::TcpFin,
            }
        } else {
            RxState::Tcp { received: 0 }
        };
        self.enter_closed();
    }

    /// The queue pair failed: if both sides can, the stream goes on over TCP (§8.6) and this
    /// returns `true`. Our continuation starts at the peer's last credit (`acked`), after a
    /// record that says so, at the TCP offset our SwitchOver declared; we read the peer's
    /// after its pre-switch bytes and its record, dropping what we read from the ring already.
    ///
    /// Only when each side knows the other expects a record: our SwitchOver was received
    /// (the peer credited up to it: it credits a SwitchOver at once) and the peer's arrived.
    /// Otherwise the peer might read our record as data, and the connection fails as before
    /// (ECONNRESET) — in practice only within a round trip of the upgrade. Not after our
    /// `close()` with unread data (the RST is the stream's end), nor while switching back.
    /// The peer received our SwitchOver: it credited up to it (a SwitchOver is credited at
    /// once when both fail over), or acknowledged ring bytes after it.
    fn switch_confirmed(&self) -> bool {
        self.peer.as_ref().is_some_and(|peer| {
            self.switch_seq.is_some_and(|n| peer.slots.returned() >= n) || peer.tx.acked() > 0
        })
    }

    fn fail_over(&mut self) -> bool {
        let Some(peer) = self.peer.as_ref() else {
            return false;
        };
        let confirmed = self.switch_confirmed();
        let pre = match self.rx_state {
            RxState::Tcp { .. } => return false,
            RxState::Ring => 0,
            RxState::Draining { remaining } => remaining,
            RxState::Finished { tcp_remaining, .. } => tcp_remaining,
        };
        let tx_ok = match self.tx_state {
            TxState::Ring
            | TxState::Finishing(Fin::Shutdown)
            | TxState::Finished(Fin::Shutdown) => true,
            TxState::Finishing(Fin::Close { reset }) => !reset,
            TxState::Tcp | TxState::Finished(Fin::Close { .. }) => false,
        };
        if !self.failover || !self.established() || self.back.is_some() || !confirmed || !tx_ok {
            return false;
        }
        let from = peer.tx.acked();
        self.incoming = Some(Incoming::new(
            pre,
            self.rx.tail(),
            self.rx.window(),
            self.nonce,
        ));
        let mut b = Back::new(self.rx.tail(), &mut self.switch_pending);
        b.posted = true;
        b.peer_read = Some(from);
        b.record = Record { resume_from: from }.encode(self.nonce);
        b.record_left = RECORD_LEN;
        self.stats.failovers = 1;
        self.finish_back(b, from);
        true
    }

    /// Both sides announced [`Flags::FAILOVER`]: should the ring's path fail, the stream goes
    /// on over TCP (§8.6). Bytes on the socket while the peer's stream is on the ring are
    /// then its continuation: the path failed on its side (see `Link::fail_path`).
    pub fn fails_over(&self) -> bool {
        self.failover
    }

    /// The ring's path failed and the stream went on (or goes on) over TCP (§8.6).
    pub fn failed_over(&self) -> bool {
        self.stats.failovers > 0
    }

    fn life_name(&self) -> &'static str {
        match self.life {
            Life::Connecting { .. } => "Connecting",
            Life::Accepted { .. } => "Accepted",
            Life::Established => "Established",
            Life::Closed => "Closed",
            Life::Failed(_) => "Failed",
        }
    }

    // ----- queries ---------------------------------------------------------------------------

    /// Connection-wide state (see [`StreamState`]).
    pub fn state(&self) -> StreamState {
        match self.life {
            Life::Connecting { .. } | Life::Accepted { .. } => StreamState::Handshaking,
            Life::Failed(r) => StreamState::Error(r),
            Life::Closed => StreamState::Closed,
            Life::Established => {
                if self.back.is_some() {
                    StreamState::Switching
                } else if self.tx_state.is_shut() {
                    StreamState::LocalShut
                } else if self.rx_state.is_finished() {
                    StreamState::PeerShut
                } else if self.tx_state == TxState::Tcp
                    || matches!(
                        self.rx_state,
                        RxState::Tcp { .. } | RxState::Draining { .. }
                    )
                {
                    StreamState::Switching
                } else {
                    StreamState::Open
                }
            }
        }
    }

    /// Our sending half.
    pub fn tx_state(&self) -> TxState {
        self.tx_state
    }

    /// Our receiving half.
    pub fn rx_state(&self) -> RxState {
        self.rx_state
    }

    /// The failure, if the connection failed.
    pub fn error(&self) -> Option<ErrorReason> {
        match self.life {
            Life::Failed(r) => Some(r),
            _ => None,
        }
    }

    /// Whether the shim can go on with plain TCP as if no upgrade had been tried: the upgrade
    /// is still in its handshake, or it failed (not by a protocol violation) before this side
    /// committed and before any message arrived from the peer.
    ///
    /// This is a local view: a SwitchOver the peer posted may still be in flight. A side that
    /// fails *after* switching therefore resets the TCP connection, so that a peer which fell
    /// back sees ECONNRESET instead of waiting for bytes that went to the ring.
    pub fn can_fall_back(&self) -> bool {
        match self.life {
            Life::Connecting { .. } | Life::Accepted { .. } => true,
            Life::Failed(r) => {
                !matches!(r, ErrorReason::Protocol(_))
                    && self.tx_state == TxState::Tcp
                    && matches!(self.rx_state, RxState::Tcp { .. })
                    && self.stats.messages_received == 0
            }
            Life::Established | Life::Closed => false,
        }
    }

    /// Whether a failed upgrade lost nothing although this side had switched: the failure was
    /// the link's (not a protocol violation), the peer never switched to the ring and nothing
    /// came from it, and no byte this side's application wrote went into it (its SwitchOver
    /// and a Close carry none). The stream can then go on over TCP alone, as if the upgrade
    /// had not happened: a peer that closed before its own side of the upgrade was decided
    /// read and wrote everything over TCP, and its end of the link went with it.
    pub fn failed_unused(&self) -> bool {
        matches!(self.life, Life::Failed(r) if !matches!(r, ErrorReason::Protocol(_)))
            && matches!(self.rx_state, RxState::Tcp { .. })
            && self.stats.messages_received == 0
            && self.peer.as_ref().is_none_or(|p| p.tx.head() == 0)
    }

    /// Whether this side's write side was shut on the ring (a ShutdownWrite or Close queued or
    /// sent).
    pub fn write_shut(&self) -> bool {
        matches!(self.tx_state, TxState::Finishing(_) | TxState::Finished(_))
    }

    /// Poll/epoll readiness (see [`Readiness`]).
    pub fn readiness(&self) -> Readiness {
        if self.back.is_some() && !self.switched_back() && self.error().is_none() {
            // Switching back: reads on TCP (or EOF, once certain); writes wait for the
            // continuation.
            let recv = self.recv();
            return Readiness {
                readable: matches!(recv, Recv::Eof),
                read_via_tcp: matches!(recv, Recv::Tcp { .. } | Recv::TcpControl { .. }),
                write_via_tcp: (self.established() && self.tx_state == TxState::Tcp)
                    || self.writes_resumed(),
                ..Readiness::default()
            };
        }
        if self.can_fall_back() {
            return Readiness {
                read_via_tcp: true,
                write_via_tcp: true,
                ..Readiness::default()
            };
        }
        if let Life::Failed(_) = self.life {
            return Readiness {
                readable: true,
                writable: true,
                rdhup: true,
                hup: true,
                error: true,
                read_via_tcp: false,
                write_via_tcp: false,
            };
        }
        let read_via_tcp = !self.local_read_shut
            && matches!(
                self.rx_state,
                RxState::Tcp { .. }
                    | RxState::Draining { .. }
                    | RxState::Finished {
                        tcp_remaining: 1..,
                        ..
                    }
            );
        let rx_fin = self.rx_state.is_finished();
        let readable = !read_via_tcp && (self.rx.readable() > 0 || rx_fin || self.local_read_shut);
        let write_via_tcp = self.tx_state == TxState::Tcp;
        // (records: room for one more record at least)
        let least = if self.records.on { MIN_RECORD } else { 1 };
        let space = self.peer.as_ref().is_some_and(|p| {
            let free = p.tx.free();
            let used = p.tx.size().bytes() - free;
            free >= least && free * 2 >= used
        });
        let writable = !write_via_tcp
            && (self.tx_state.is_shut() || self.peer_read_closed || self.closed() || space);
        Readiness {
            readable,
            writable,
            rdhup: rx_fin,
            hup: self.tx_state.is_shut() && rx_fin,
            error: false,
            read_via_tcp,
            write_via_tcp,
        }
    }

    /// POLLIN from the ring side (see [`Readiness`]).
    pub fn is_readable(&self) -> bool {
        self.readiness().readable
    }

    /// POLLOUT from the ring side.
    pub fn is_writable(&self) -> bool {
        self.readiness().writable
    }

    /// POLLRDHUP: the peer's write side ended.
    pub fn rdhup(&self) -> bool {
        self.readiness().rdhup
    }

    /// Which end this is.
    pub fn side(&self) -> Side {
        self.side
    }

    /// The handshake nonce.
    pub fn nonce(&self) -> u64 {
        self.nonce
    }

    /// The local parameters.
    pub fn local(&self) -> &LocalParams {
        &self.local
    }

    /// The peer's ring, once known.
    pub fn peer_ring(&self) -> Option<RingDesc> {
        self.peer.map(|p| p.ring)
    }

    /// Sender cursors for the peer's ring, once known.
    pub fn tx_cursors(&self) -> Option<&TxCursors> {
        self.peer.as_ref().map(|p| &p.tx)
    }

    /// Receiver cursors of the local ring.
    pub fn rx_cursors(&self) -> &RxCursors {
        &self.rx
    }

    /// Peer receive slots we may still use, once known.
    pub fn peer_slots(&self) -> Option<u32> {
        self.peer.as_ref().map(|p| p.slots.avail())
    }

    /// The credit policy in force.
    pub fn credit_policy(&self) -> CreditPolicy {
        self.policy
    }

    /// Counters.
    pub fn stats(&self) -> Stats {
        Stats {
            wakes_sent: self.records.writer_wake.wakes(),
            sleeps: self.records.reader_wake.notices(),
            ..self.stats
        }
    }
}
