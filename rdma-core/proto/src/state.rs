//! Per-direction stream state machines and the errors that end a connection.
//!
//! A connection has two independent halves: what *we send* ([`TxState`]) and what *we receive*
//! ([`RxState`]). Each is a small `Copy` enum whose transition functions consume the state and
//! return the next one or a typed error; the caller keeps the old value on error, so an illegal
//! transition never corrupts anything. The connection-wide [`StreamState`] is derived from the
//! halves (see [`crate::Connection::state`]).

use std::fmt;

use crate::error::DecodeError;
use crate::framing::FramingError;
use crate::handshake::{HandshakeError, RejectReason};
use crate::ring::{CreditError, OverrunError};

/// How a write side ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fin {
    /// `shutdown(SHUT_WR)`: no more data; we keep reading.
    Shutdown,
    /// `close()`: no more data and no more reading. With `reset`, data was dropped.
    Close {
        /// Abortive close (the peer reports ECONNRESET).
        reset: bool,
    },
}

/// Our sending half.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TxState {
    /// Not switched: the application's bytes go to the TCP socket.
    Tcp,
    /// Switched: a SwitchOver is (or was) the first stream message; bytes go to the ring.
    Ring,
    /// The write side is shut; the final message goes out after the queued bytes.
    Finishing(Fin),
    /// The final message (ShutdownWrite or Close) was handed to the transport.
    Finished(Fin),
}

/// Events of [`TxState`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TxEvent {
    /// The shim stops writing to TCP (`commit_switch`).
    Commit,
    /// `shutdown(SHUT_WR)`.
    Shutdown,
    /// `close()` (or an abort, with `reset`).
    Close {
        /// Abortive.
        reset: bool,
    },
    /// The final message was handed to the transport.
    FinPosted,
}

/// A transition that the current state does not allow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct InvalidTransition {
    /// Name of the state the transition was attempted from.
    pub state: &'static str,
    /// Name of the event.
    pub event: &'static str,
}

impl fmt::Display for InvalidTransition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid transition: {} in state {}",
            self.event, self.state
        )
    }
}

impl std::error::Error for InvalidTransition {}

impl TxEvent {
    fn name(self) -> &'static str {
        match self {
            TxEvent::Commit => "Commit",
            TxEvent::Shutdown => "Shutdown",
            TxEvent::Close { .. } => "Close",
            TxEvent::FinPosted => "FinPosted",
        }
    }
}

impl TxState {
    /// Name of the state (for errors and logs).
    pub fn name(self) -> &'static str {
        match self {
            TxState::Tcp => "Tcp",
            TxState::Ring => "Ring",
            TxState::Finishing(_) => "Finishing",
            TxState::Finished(_) => "Finished",
        }
    }

    /// The write side has been shut (locally).
    pub fn is_shut(self) -> bool {
        matches!(self, TxState::Finishing(_) | TxState::Finished(_))
    }

    /// The transition function.
    ///
    /// | from \ event        | Commit | Shutdown           | Close{r}              | FinPosted   |
    /// |---------------------|--------|--------------------|-----------------------|-------------|
    /// | Tcp                 | Ring   | ✗ (commit first)   | ✗ (commit first)      | ✗           |
    /// | Ring                | ✗      | Finishing(Shut)    | Finishing(Close{r})   | ✗           |
    /// | Finishing(Shut)     | ✗      | same               | Finishing(Close{r})   | Finished(f) |
    /// | Finishing(Close{a}) | ✗      | same               | Finishing(Close{a∨r}) | Finished(f) |
    /// | Finished(Shut)      | ✗      | same               | Finishing(Close{r})   | ✗           |
    /// | Finished(Close)     | ✗      | same               | same                  | ✗           |
    pub fn on(self, ev: TxEvent) -> Result<TxState, InvalidTransition> {
        use TxState::*;
        let next = match (self, ev) {
            (Tcp, TxEvent::Commit) => Ring,
            (Ring, TxEvent::Shutdown) => Finishing(Fin::Shutdown),
            (Ring, TxEvent::Close { reset }) => Finishing(Fin::Close { reset }),
            (Finishing(_) | Finished(_), TxEvent::Shutdown) => self,
            (Finishing(Fin::Shutdown) | Finished(Fin::Shutdown), TxEvent::Close { reset }) => {
                Finishing(Fin::Close { reset })
            }
            (Finishing(Fin::Close { reset: a }), TxEvent::Close { reset: b }) => {
                Finishing(Fin::Close { reset: a || b })
            }
            (Finished(Fin::Close { .. }), TxEvent::Close { .. }) => self,
            (Finishing(f), TxEvent::FinPosted) => Finished(f),
            _ => {
                return Err(InvalidTransition {
                    state: self.name(),
                    event: ev.name(),
                })
            }
        };
        Ok(next)
    }
}

/// How the peer's write side ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PeerFin {
    /// ShutdownWrite received.
    Shutdown,
    /// Close received (graceful).
    Close,
    /// The TCP connection reached EOF before the peer ever switched: the peer abandoned the ring,
    /// and the TCP stream alone is the whole story.
    TcpFin,
}

/// Our receiving half.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RxState {
    /// The peer has not switched: read TCP. `received` counts bytes read from TCP so far.
    Tcp {
        /// Bytes read from TCP so far.
        received: u64,
    },
    /// The peer switched: read exactly `remaining` more bytes from TCP, then the ring.
    Draining {
        /// TCP bytes still to read.
        remaining: u64,
    },
    /// Read the ring.
    Ring,
    /// The peer will write no more. Read `tcp_remaining` TCP bytes, then the ring, then EOF.
    Finished {
        /// TCP bytes still to read (the peer shut down while we were draining).
        tcp_remaining: u64,
        /// How the peer ended.
        fin: PeerFin,
    },
}

/// Events of [`RxState`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RxEvent {
    /// The shim read `n` bytes from TCP.
    TcpRead(u64),
    /// A SwitchOver arrived.
    SwitchOver {
        /// Total bytes the peer sent on TCP.
        tcp_bytes_sent: u64,
    },
    /// A DATA write arrived.
    Data,
    /// ShutdownWrite or Close arrived.
    Fin(PeerFin),
    /// The shim read EOF on TCP.
    TcpEof,
}

/// The peer broke the protocol. The connection fails with [`ErrorReason::Protocol`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Violation {
    /// An immediate or control message did not decode.
    Decode(DecodeError),
    /// DATA before the peer's SwitchOver.
    DataBeforeSwitchOver,
    /// ShutdownWrite/Close before the peer's SwitchOver.
    FinBeforeSwitchOver,
    /// A second SwitchOver.
    DuplicateSwitchOver,
    /// SwitchOver declares fewer TCP bytes than were already read from TCP.
    SwitchOverBehindTcp {
        /// Bytes declared.
        declared: u64,
        /// Bytes already read.
        received: u64,
    },
    /// More bytes arrived on TCP than the SwitchOver declared.
    TcpBeyondSwitchOver,
    /// TCP reached EOF before the bytes the SwitchOver declared.
    TcpEofBeforeSwitchOver,
    /// DATA after ShutdownWrite/Close.
    DataAfterFin,
    /// A second ShutdownWrite/Close.
    DuplicateFin,
    /// The peer wrote past its byte credit.
    RingOverrun(OverrunError),
    /// The peer sent more messages than we had receives posted.
    SlotOverrun,
    /// The peer returned more receive slots than we ever used.
    SlotCreditOverflow,
    /// The peer acknowledged bytes never written.
    BadCredit(CreditError),
    /// ShutdownWrite/Close states another total than the DATA received.
    FinCursorMismatch {
        /// Total declared.
        declared: u64,
        /// Total received.
        received: u64,
    },
    /// A DATA immediate's length differs from the completion's byte count (or a CREDIT carried
    /// bytes).
    ImmLengthMismatch {
        /// Length from the immediate.
        imm: u32,
        /// The completion's byte count.
        byte_len: u32,
    },
    /// A completion was handed over before the connection was established (client side).
    CompletionBeforeEstablished,
    /// A SwitchBack states another ring total than the DATA received before it.
    SwitchBackCursorMismatch {
        /// Total declared.
        declared: u64,
        /// Total received.
        received: u64,
    },
    /// A SwitchBack's read cursor is outside what we posted and what was acknowledged.
    SwitchBackReadCursor {
        /// Cursor declared.
        declared: u64,
        /// Our stream acknowledged so far.
        acked: u64,
        /// Our stream posted so far.
        posted: u64,
    },
    /// A second SwitchBack.
    DuplicateSwitchBack,
    /// A SwitchBack on a connection whose handshake did not announce it.
    UnannouncedSwitchBack,
    /// A ring Close after the peer began its continuation on TCP.
    CloseAfterSwitchBack,
    /// The peer's continuation on TCP after a path failure (§8.6) was not what it must be.
    Failover(crate::error::FailoverError),
    /// A ring move message (§6.4) on a connection whose handshake did not announce moves.
    UnannouncedRingMove,
    /// A RingOffer while the last move's old ring is still in use.
    RingOfferDuringMove,
    /// A RingMoved without an offer outstanding.
    UnexpectedRingMoved,
    /// A RingMoved whose cursor is not the end of what the old ring received.
    RingMovedCursorMismatch {
        /// The cursor the message declares.
        declared: u64,
        /// Stream bytes received so far.
        received: u64,
    },
    /// A record in the ring that its writer cannot have written (protocol §14).
    Framing(FramingError),
    /// A message of the records kind (a Sleeping, a WAKE immediate) on a connection that does
    /// not carry them.
    UnannouncedRecords,
    /// A Source on a connection whose DATA is not pulled, or a second one (protocol §16).
    UnexpectedSource,
    /// A Source whose staging area is not this side's ring's size (§16: the bytes of a DATA
    /// are at the same offset in both).
    SourceSize {
        /// The size the Source declares.
        declared: u64,
        /// This side's ring's size.
        ring: u64,
    },
    /// A DATA announcement before the Source it is to be pulled from (§16).
    DataBeforeSource,
    /// A DATA carrying credit on a connection that is not duplex (§17).
    UnannouncedDuplex,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Decode(e) => write!(f, "undecodable message: {e}"),
            Violation::DataBeforeSwitchOver => write!(f, "DATA before SwitchOver"),
            Violation::FinBeforeSwitchOver => write!(f, "shutdown/close before SwitchOver"),
            Violation::DuplicateSwitchOver => write!(f, "second SwitchOver"),
            Violation::SwitchOverBehindTcp { declared, received } => write!(
                f,
                "SwitchOver declares {declared} TCP bytes, {received} already received"
            ),
            Violation::TcpBeyondSwitchOver => write!(f, "more TCP bytes than SwitchOver declared"),
            Violation::TcpEofBeforeSwitchOver => {
                write!(f, "TCP EOF before the bytes SwitchOver declared")
            }
            Violation::DataAfterFin => write!(f, "DATA after shutdown/close"),
            Violation::DuplicateFin => write!(f, "second shutdown/close"),
            Violation::RingOverrun(e) => write!(f, "{e}"),
            Violation::SlotOverrun => write!(f, "more messages than posted receives"),
            Violation::SlotCreditOverflow => write!(f, "more receive slots returned than used"),
            Violation::BadCredit(e) => write!(f, "{e}"),
            Violation::FinCursorMismatch { declared, received } => write!(
                f,
                "shutdown/close declares {declared} ring bytes, {received} received"
            ),
            Violation::ImmLengthMismatch { imm, byte_len } => {
                write!(f, "immediate says {imm} bytes, completion says {byte_len}")
            }
            Violation::CompletionBeforeEstablished => {
                write!(f, "completion before the connection was established")
            }
            Violation::SwitchBackCursorMismatch { declared, received } => write!(
                f,
                "SwitchBack declares {declared} ring bytes, {received} received"
            ),
            Violation::SwitchBackReadCursor {
                declared,
                acked,
                posted,
            } => write!(
                f,
                "SwitchBack read cursor {declared} outside [{acked}, {posted}]"
            ),
            Violation::DuplicateSwitchBack => write!(f, "second SwitchBack"),
            Violation::UnannouncedSwitchBack => {
                write!(f, "SwitchBack on a connection that did not announce it")
            }
            Violation::CloseAfterSwitchBack => {
                write!(f, "Close after the continuation began on TCP")
            }
            Violation::Failover(e) => write!(f, "{e}"),
            Violation::UnannouncedRingMove => {
                write!(f, "ring move on a connection that did not announce moves")
            }
            Violation::RingOfferDuringMove => {
                write!(f, "RingOffer while the last move's old ring is in use")
            }
            Violation::UnexpectedRingMoved => write!(f, "RingMoved without an offer"),
            Violation::RingMovedCursorMismatch { declared, received } => write!(
                f,
                "RingMoved at cursor {declared}, {received} bytes received"
            ),
            Violation::Framing(e) => write!(f, "{e}"),
            Violation::UnannouncedRecords => {
                write!(f, "a Sleeping or a wake-up on a connection without records")
            }
            Violation::UnexpectedSource => {
                write!(
                    f,
                    "a Source on a connection without READ pull, or a second one"
                )
            }
            Violation::SourceSize { declared, ring } => {
                write!(f, "a Source of {declared} bytes for a ring of {ring} bytes")
            }
            Violation::DataBeforeSource => write!(f, "a DATA announcement before its Source"),
            Violation::UnannouncedDuplex => {
                write!(
                    f,
                    "a DATA carrying credit on a connection that is not duplex"
                )
            }
        }
    }
}

impl std::error::Error for Violation {}

impl RxState {
    /// Name of the state (for logs).
    pub fn name(self) -> &'static str {
        match self {
            RxState::Tcp { .. } => "Tcp",
            RxState::Draining { .. } => "Draining",
            RxState::Ring => "Ring",
            RxState::Finished { .. } => "Finished",
        }
    }

    /// The peer's write side has ended.
    pub fn is_finished(self) -> bool {
        matches!(self, RxState::Finished { .. })
    }

    /// The transition function. Events come from the peer (directly, or through the TCP bytes
    /// it sent), so every refusal is a [`Violation`].
    ///
    /// | from \ event  | TcpRead(n)                 | SwitchOver(t)                  | Data  | Fin(f)          | TcpEof        |
    /// |---------------|----------------------------|--------------------------------|-------|-----------------|---------------|
    /// | Tcp{r}        | Tcp{r+n}                   | t<r ✗, t=r Ring, else Draining{t-r} | ✗ | ✗           | Finished{0,TcpFin} |
    /// | Draining{m}   | n>m ✗, n=m Ring, else Draining{m-n} | ✗                     | same  | Finished{m,f}   | ✗             |
    /// | Ring          | ✗                          | ✗                              | same  | Finished{0,f}   | ✗             |
    /// | Finished{m,f} | n>m ✗, else Finished{m-n,f}| ✗                              | ✗     | Shutdown→Close: Finished{m,Close}; else ✗ | m=0: same; else ✗ |
    pub fn on(self, ev: RxEvent) -> Result<RxState, Violation> {
        use RxState::*;
        let next = match (self, ev) {
            (Tcp { received }, RxEvent::TcpRead(n)) => Tcp {
                received: received.saturating_add(n),
            },
            (Tcp { received }, RxEvent::SwitchOver { tcp_bytes_sent }) => {
                if tcp_bytes_sent < received {
                    return Err(Violation::SwitchOverBehindTcp {
                        declared: tcp_bytes_sent,
                        received,
                    });
                }
                Self::draining(tcp_bytes_sent - received)
            }
            (Tcp { .. }, RxEvent::Data) => return Err(Violation::DataBeforeSwitchOver),
            (Tcp { .. }, RxEvent::Fin(_)) => return Err(Violation::FinBeforeSwitchOver),
            (Tcp { .. }, RxEvent::TcpEof) => Finished {
                tcp_remaining: 0,
                fin: PeerFin::TcpFin,
            },
            (Draining { remaining }, RxEvent::TcpRead(n)) => {
                if n > remaining {
                    return Err(Violation::TcpBeyondSwitchOver);
                }
                Self::draining(remaining - n)
            }
            (Draining { .. } | Ring, RxEvent::Data) => self,
            (Draining { remaining }, RxEvent::Fin(fin)) => Finished {
                tcp_remaining: remaining,
                fin,
            },
            (Ring, RxEvent::Fin(fin)) => Finished {
                tcp_remaining: 0,
                fin,
            },
            (Ring, RxEvent::TcpRead(_)) => return Err(Violation::TcpBeyondSwitchOver),
            (Draining { .. } | Ring | Finished { .. }, RxEvent::SwitchOver { .. }) => {
                return Err(Violation::DuplicateSwitchOver)
            }
            (Draining { .. } | Ring, RxEvent::TcpEof) => {
                return Err(Violation::TcpEofBeforeSwitchOver)
            }
            (Finished { tcp_remaining, fin }, RxEvent::TcpRead(n)) => {
                if n > tcp_remaining {
                    return Err(Violation::TcpBeyondSwitchOver);
                }
                Finished {
                    tcp_remaining: tcp_remaining - n,
                    fin,
                }
            }
            (Finished { .. }, RxEvent::Data) => return Err(Violation::DataAfterFin),
            // shutdown(SHUT_WR) then close(): the Close after the ShutdownWrite says the
            // peer is gone for good (its reads are closed too).
            (
                Finished {
                    tcp_remaining,
                    fin: PeerFin::Shutdown,
                },
                RxEvent::Fin(PeerFin::Close),
            ) => Finished {
                tcp_remaining,
                fin: PeerFin::Close,
            },
            (Finished { .. }, RxEvent::Fin(_)) => return Err(Violation::DuplicateFin),
            (Finished { tcp_remaining, .. }, RxEvent::TcpEof) => {
                if tcp_remaining > 0 {
                    return Err(Violation::TcpEofBeforeSwitchOver);
                }
                self
            }
        };
        Ok(next)
    }

    fn draining(remaining: u64) -> RxState {
        if remaining == 0 {
            RxState::Ring
        } else {
            RxState::Draining { remaining }
        }
    }
}

/// Why a connection failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorReason {
    /// The server rejected the upgrade; `None` when the rejection carried no rdmashim message
    /// (typically no rdma_cm listener on that port: the peer has no shim).
    Rejected(Option<RejectReason>),
    /// The accept reply was unusable.
    Handshake(HandshakeError),
    /// The handshake did not finish before its deadline.
    HandshakeTimeout,
    /// The peer broke the protocol.
    Protocol(Violation),
    /// The queue pair failed or the CM reported a disconnect or unreachable peer before the
    /// stream ended cleanly.
    Transport,
    /// The peer aborted (Close with RESET) or the TCP connection was reset.
    Reset,
    /// The peer switched to the ring, then its TCP connection ended without a ring shutdown:
    /// the peer died and ring data may be lost.
    PeerVanished,
    /// The TCP connection ended while the handshake was still running: the upgrade is
    /// abandoned and the socket goes on as plain TCP.
    TcpClosed,
    /// The TCP connection under an upgraded stream timed out, by the kernel's verdict on it
    /// (keepalive probes the application asked for went unanswered; its TCP_USER_TIMEOUT): as
    /// on TCP, the stream ends with ETIMEDOUT.
    TcpTimedOut,
}

impl ErrorReason {
    /// The `std::io::ErrorKind` a socket call should fail with (ECONNRESET for most; the shim
    /// maps it to an errno at its one boundary).
    pub fn io_kind(self) -> std::io::ErrorKind {
        match self {
            ErrorReason::Rejected(_) => std::io::ErrorKind::ConnectionRefused,
            ErrorReason::HandshakeTimeout | ErrorReason::TcpTimedOut => {
                std::io::ErrorKind::TimedOut
            }
            _ => std::io::ErrorKind::ConnectionReset,
        }
    }
}

impl fmt::Display for ErrorReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorReason::Rejected(Some(r)) => write!(f, "upgrade rejected: {r}"),
            ErrorReason::Rejected(None) => write!(f, "upgrade rejected (no rdmashim peer)"),
            ErrorReason::Handshake(e) => write!(f, "handshake failed: {e}"),
            ErrorReason::HandshakeTimeout => write!(f, "handshake timed out"),
            ErrorReason::Protocol(v) => write!(f, "protocol violation: {v}"),
            ErrorReason::Transport => write!(f, "transport failure"),
            ErrorReason::Reset => write!(f, "connection reset by peer"),
            ErrorReason::PeerVanished => write!(f, "peer vanished"),
            ErrorReason::TcpClosed => write!(f, "TCP connection ended during the handshake"),
            ErrorReason::TcpTimedOut => write!(f, "the TCP connection under the stream timed out"),
        }
    }
}

impl std::error::Error for ErrorReason {}

/// Connection-wide state, derived from the lifecycle and the two halves.
///
/// ```text
///  Handshaking ──established──▶ Switching ──both halves on the ring──▶ Open
///       │                          │                                   │
///       │                          ├──── shutdown/close (local) ───────┼──▶ LocalShut ─┐
///       │                          └──── ShutdownWrite/Close (peer) ───┴──▶ PeerShut ──┼──▶ Closed
///       └──────────── any state ── reject / timeout / violation / QP error / reset ──▶ Error(reason)
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StreamState {
    /// rdma_cm handshake in progress; everything still flows over TCP.
    Handshaking,
    /// Established; at least one direction is still on TCP (or draining it).
    Switching,
    /// Both directions on the ring.
    Open,
    /// Our write side is shut (ShutdownWrite or Close queued or sent); the peer may still send.
    LocalShut,
    /// The peer's write side is shut; we may still send.
    PeerShut,
    /// Both write sides ended (or one side closed): the queue pair can go. Buffered data may
    /// still be read.
    Closed,
    /// Failed.
    Error(ErrorReason),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tx_table() {
        use TxState::*;
        assert_eq!(Tcp.on(TxEvent::Commit), Ok(Ring));
        assert!(Tcp.on(TxEvent::Shutdown).is_err());
        assert!(Tcp.on(TxEvent::Close { reset: false }).is_err());
        assert!(Ring.on(TxEvent::Commit).is_err());
        assert!(Ring.on(TxEvent::FinPosted).is_err());
        let s = Ring.on(TxEvent::Shutdown).unwrap();
        assert_eq!(s, Finishing(Fin::Shutdown));
        assert_eq!(s.on(TxEvent::Shutdown), Ok(s));
        let s = s.on(TxEvent::FinPosted).unwrap();
        assert_eq!(s, Finished(Fin::Shutdown));
        assert!(s.on(TxEvent::FinPosted).is_err());
        let s = s.on(TxEvent::Close { reset: false }).unwrap();
        assert_eq!(s, Finishing(Fin::Close { reset: false }));
        let s = s.on(TxEvent::Close { reset: true }).unwrap();
        assert_eq!(s, Finishing(Fin::Close { reset: true }));
        let s = s.on(TxEvent::FinPosted).unwrap();
        assert_eq!(s.on(TxEvent::Close { reset: false }), Ok(s));
        assert_eq!(
            Ring.on(TxEvent::FinPosted),
            Err(InvalidTransition {
                state: "Ring",
                event: "FinPosted"
            })
        );
    }

    #[test]
    fn rx_switch_over() {
        use RxState::*;
        let s = Tcp { received: 0 }.on(RxEvent::TcpRead(10)).unwrap();
        assert_eq!(s, Tcp { received: 10 });
        assert_eq!(
            s.on(RxEvent::SwitchOver { tcp_bytes_sent: 5 }),
            Err(Violation::SwitchOverBehindTcp {
                declared: 5,
                received: 10
            })
        );
        assert_eq!(s.on(RxEvent::SwitchOver { tcp_bytes_sent: 10 }), Ok(Ring));
        let d = s.on(RxEvent::SwitchOver { tcp_bytes_sent: 15 }).unwrap();
        assert_eq!(d, Draining { remaining: 5 });
        assert_eq!(d.on(RxEvent::Data), Ok(d));
        assert_eq!(
            d.on(RxEvent::TcpRead(6)),
            Err(Violation::TcpBeyondSwitchOver)
        );
        assert_eq!(d.on(RxEvent::TcpRead(5)), Ok(Ring));
        assert_eq!(s.on(RxEvent::Data), Err(Violation::DataBeforeSwitchOver));
        assert_eq!(
            Ring.on(RxEvent::SwitchOver { tcp_bytes_sent: 0 }),
            Err(Violation::DuplicateSwitchOver)
        );
    }

    #[test]
    fn rx_fin() {
        use RxState::*;
        let f = Draining { remaining: 3 }
            .on(RxEvent::Fin(PeerFin::Shutdown))
            .unwrap();
        assert_eq!(
            f,
            Finished {
                tcp_remaining: 3,
                fin: PeerFin::Shutdown
            }
        );
        assert_eq!(f.on(RxEvent::Data), Err(Violation::DataAfterFin));
        assert_eq!(
            f.on(RxEvent::TcpEof),
            Err(Violation::TcpEofBeforeSwitchOver)
        );
        let f = f.on(RxEvent::TcpRead(3)).unwrap();
        assert_eq!(f.on(RxEvent::TcpEof), Ok(f));
        assert_eq!(
            f.on(RxEvent::Fin(PeerFin::Shutdown)),
            Err(Violation::DuplicateFin)
        );
        // shutdown(SHUT_WR), then close(): the Close is legal and final.
        let c = f.on(RxEvent::Fin(PeerFin::Close)).unwrap();
        assert_eq!(
            c,
            Finished {
                tcp_remaining: 0,
                fin: PeerFin::Close
            }
        );
        for again in [PeerFin::Close, PeerFin::Shutdown] {
            assert_eq!(c.on(RxEvent::Fin(again)), Err(Violation::DuplicateFin));
        }
        assert_eq!(
            Tcp { received: 9 }.on(RxEvent::TcpEof),
            Ok(Finished {
                tcp_remaining: 0,
                fin: PeerFin::TcpFin
            })
        );
        assert_eq!(
            Ring.on(RxEvent::TcpEof),
            Err(Violation::TcpEofBeforeSwitchOver)
        );
    }
}
