//! A hostile or broken peer: arbitrary completions (random immediates, random SEND payloads,
//! and mutations of valid ones) interleaved with arbitrary local calls must never panic, must
//! keep the cursor invariants, and once the connection fails it stays failed with one Teardown.
//! With records on, the peer also writes what it likes into the local ring (random words, and
//! records that are well-formed but of any length, anywhere), which the connection polls.

use std::time::Instant;

use proptest::prelude::*;
use rdmashim_proto::*;

mod common;
use common::proof;

#[derive(Clone, Debug)]
enum Op {
    Imm(u32, Option<u32>),
    DataImm(u32, bool),
    CreditImm(u32, u8),
    /// Duplex: a DATA of `.0` bytes carrying `.1` credit units and `.2` slots.
    DataCreditImm(u32, u16, u8),
    Send(Vec<u8>),
    Control(ControlMsg),
    TcpRead(u64),
    TcpEof,
    TcpReset,
    TransportError,
    Commit(u64),
    AppSend(usize),
    Consume(usize),
    ShutdownWrite,
    ShutdownRead,
    Close,
    Abort,
    Poll,
    Timeout(u64),
    /// TCP bytes the shim reads for itself after a failover (garbage, or a record of this
    /// upgrade with a random cursor), and the continuation written.
    TcpControl(Vec<u8>),
    Record(u64),
    Resumed(u64),
    /// Ring moves (§6.4): this side offers a ring of 2^n bytes, reports a staging area of
    /// generation n ready, asks for a ring of 2^n bytes.
    OfferRing(u8),
    StagingReady(u32),
    WantRing(u8),
    /// Records (§14): the peer puts a word into the local ring at this word index, or a
    /// well-formed record of this payload length at the ring cursor given (its header and
    /// trailer carrying the right tag, whatever the credit allows); the transport polls the
    /// ring; the reader prepares to sleep.
    RingWord(u16, u64),
    RingRecord(u64, u32),
    /// A well-formed record of this payload length where the connection looks next.
    RingNext(u32),
    PollRing,
    PrepareSleep,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (any::<u32>(), prop::option::of(any::<u32>())).prop_map(|(i, b)| Op::Imm(i, b)),
        (0u32..20_000, any::<bool>()).prop_map(|(l, w)| Op::DataImm(l, w)),
        (0u32..20_000, 0u8..64).prop_map(|(b, s)| Op::CreditImm(b, s)),
        (1u32..8192, 0u16..300, 0u8..16).prop_map(|(l, u, s)| Op::DataCreditImm(l, u, s)),
        prop::collection::vec(any::<u8>(), 0..80).prop_map(Op::Send),
        prop_oneof![
            (0u64..5000).prop_map(|t| ControlMsg::SwitchOver { tcp_bytes_sent: t }),
            (0u64..20_000).prop_map(|r| ControlMsg::ShutdownWrite { ring_bytes: r }),
            (0u64..20_000, any::<bool>()).prop_map(|(r, reset)| ControlMsg::Close {
                ring_bytes: r,
                reset
            }),
            (0u64..20_000, 0u32..300).prop_map(|(c, s)| ControlMsg::CreditUpdate {
                read_cursor: c,
                slots: s
            }),
            (0u64..4).prop_map(|epoch| ControlMsg::Barrier { epoch }),
            (12u8..=16, any::<u64>()).prop_map(|(l, addr)| ControlMsg::RingOffer {
                ring: RingDesc {
                    addr,
                    rkey: 5,
                    size: RingSize::from_log2(l).unwrap()
                }
            }),
            (12u8..=16, any::<u64>()).prop_map(|(l, addr)| ControlMsg::Source {
                ring: RingDesc {
                    addr,
                    rkey: 6,
                    size: RingSize::from_log2(l).unwrap()
                }
            }),
            (0u64..30_000).prop_map(|at| ControlMsg::RingMoved { at }),
            (0u64..30_000).prop_map(|seen| ControlMsg::Sleeping { seen }),
            (12u8..=23).prop_map(|l| ControlMsg::RingWanted {
                size: RingSize::from_log2(l).unwrap()
            }),
            (130u8..=255).prop_map(|kind| ControlMsg::Ignored { kind }),
        ]
        .prop_map(Op::Control),
        (0u64..5000).prop_map(Op::TcpRead),
        Just(Op::TcpEof),
        Just(Op::TcpReset),
        Just(Op::TransportError),
        (0u64..5000).prop_map(Op::Commit),
        (0usize..20_000).prop_map(Op::AppSend),
        (0usize..20_000).prop_map(Op::Consume),
        Just(Op::ShutdownWrite),
        Just(Op::ShutdownRead),
        Just(Op::Close),
        Just(Op::Abort),
        Just(Op::Poll),
        (0u64..10_000).prop_map(Op::Timeout),
        prop::collection::vec(any::<u8>(), 0..64).prop_map(Op::TcpControl),
        (0u64..20_000).prop_map(Op::Record),
        (0u64..30_000).prop_map(Op::Resumed),
        (12u8..=16).prop_map(Op::OfferRing),
        (0u32..4).prop_map(Op::StagingReady),
        (12u8..=16).prop_map(Op::WantRing),
        (any::<u16>(), any::<u64>()).prop_map(|(i, w)| Op::RingWord(i, w)),
        ((0u64..3000).prop_map(|c| c * 8), 1u32..9000).prop_map(|(at, l)| Op::RingRecord(at, l)),
        (1u32..9000).prop_map(Op::RingNext),
        (1u32..100).prop_map(Op::RingNext),
        Just(Op::PollRing),
        Just(Op::PollRing),
        Just(Op::PrepareSleep),
    ]
}

fn conn(server: bool, log2: u8, slots: u16, moves: bool, kind: Kind) -> Connection {
    let now = Instant::now();
    let local = |addr| LocalParams {
        ring: RingDesc {
            addr,
            rkey: 1,
            size: RingSize::from_log2(log2).unwrap(),
        },
        recv_slots: slots,
    };
    let cfg = Config {
        ring_moves: moves,
        ring_max: moves.then(|| RingSize::from_log2(16).unwrap()),
        kind,
        ..Config::default()
    };
    let (mut a, req) = Connection::connect(cfg, local(0x1000), &proof(), 1, 2, 3, 0, now).unwrap();
    let (b, reply) = Connection::accept(cfg, local(0x2000), &req, &proof(), 0, now).unwrap();
    // (READ pull: the transport's staging area, for the peer to read from)
    let staging = RingDesc {
        addr: 0x3000,
        rkey: 7,
        size: req.ring.size,
    };
    let mut c = if server {
        b
    } else {
        a.handle_accept(&reply.encode()).unwrap();
        a
    };
    c.set_source(staging);
    c
}

/// What a hostile peer can do to the local ring of records, and what the application and
/// the transport do meanwhile (a narrower mix than [`op`], so that runs get far with records).
fn ring_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (any::<u16>(), any::<u64>()).prop_map(|(i, w)| Op::RingWord(i, w)),
        ((0u64..3000).prop_map(|c| c * 8), 1u32..9000).prop_map(|(at, l)| Op::RingRecord(at, l)),
        (1u32..9000).prop_map(Op::RingNext),
        (1u32..100).prop_map(Op::RingNext),
        (1u32..100).prop_map(Op::RingNext),
        Just(Op::PollRing),
        Just(Op::PollRing),
        Just(Op::PrepareSleep),
        (0usize..20_000).prop_map(Op::Consume),
        (0usize..200).prop_map(Op::Consume),
        (0usize..20_000).prop_map(Op::AppSend),
        Just(Op::Poll),
        Just(Op::ShutdownRead),
        (0u32..20_000, 0u8..64).prop_map(|(b, s)| Op::CreditImm(b, s)),
        Just(Op::Imm(0xc000_0000, Some(0))),
        (0u64..20_000).prop_map(|r| Op::Control(ControlMsg::ShutdownWrite { ring_bytes: r })),
        (0u64..30_000).prop_map(|seen| Op::Control(ControlMsg::Sleeping { seen })),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn never_panics(server in any::<bool>(), log2 in 12u8..=13, slots in 4u16..10,
                    moves in any::<bool>(), kind in prop::sample::select(Kind::ALL.to_vec()),
                    switched in any::<bool>(), ops in prop::collection::vec(op(), 0..80)) {
        run(server, log2, slots, moves, kind, switched, ops)?;
    }

    #[test]
    fn a_hostile_ring_of_records_never_panics(server in any::<bool>(), log2 in 12u8..=13,
                    slots in 4u16..10, ops in prop::collection::vec(ring_op(), 0..120)) {
        run(server, log2, slots, false, Kind::Records, true, ops)?;
    }
}

/// [`common::complete`]: the hostile immediates and lengths meet the DATA lane too.
fn complete(c: &mut Connection, comp: Completion<'_>) -> Result<(), ErrorReason> {
    common::complete(c, comp, "hostile peer's").0
}

fn run(
    server: bool,
    log2: u8,
    slots: u16,
    moves: bool,
    kind: Kind,
    switched: bool,
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    let start = Instant::now();
    let mut c = conn(server, log2, slots, moves, kind);
    prop_assert_eq!(c.kind(), kind);
    let size = RingSize::from_log2(log2).unwrap();
    let mut ring = vec![0u8; size.bytes() as usize];
    // (the peer's records carry the salt of the peer's side)
    let salt = framing::salt(c.nonce(), server);
    if switched {
        // (the peer's stream on the ring from its first byte: its records are read)
        let m = ControlMsg::SwitchOver { tcp_bytes_sent: 0 };
        c.handle_completion(Completion::Recv {
            payload: m.encode().as_bytes(),
        })
        .unwrap();
    }
    let mut failed: Option<ErrorReason> = None;
    let mut teardowns = 0;
    for op in ops {
        match op.clone() {
            Op::Imm(i, b) => {
                let _ = complete(
                    &mut c,
                    Completion::WriteImm {
                        imm: i,
                        byte_len: b,
                    },
                );
            }
            Op::DataImm(l, w) => {
                if c.sends() || c.read() {
                    // (sends: where the transport would copy the DATA's bytes, READ pull:
                    // where it would pull them to, with `ahead` bytes still being pulled —
                    // after the ring's next ones, inside the credit returned, or nowhere)
                    let ahead = u64::from(l % 7) * 64;
                    if let Some(at) = c.landing_after(ahead, l) {
                        let rx = c.rx_cursors();
                        prop_assert_eq!(at.offset, size.offset(rx.head() + ahead));
                        prop_assert!(
                            rx.head() + ahead + u64::from(l) <= rx.credited() + size.bytes()
                        );
                    }
                }
                let imm = if l == 0 {
                    0x4000_0000
                } else {
                    Imm::Data {
                        len: l,
                        credit_wanted: w,
                    }
                    .encode()
                };
                let _ = complete(
                    &mut c,
                    Completion::WriteImm {
                        imm,
                        byte_len: Some(l),
                    },
                );
            }
            Op::DataCreditImm(l, u, s) => {
                // (duplex: a DATA that returns credit; refused on every other kind)
                let imm = if u == 0 && s == 0 {
                    l << 16
                } else {
                    Imm::DataCredit {
                        len: l,
                        credit_wanted: false,
                        units: u,
                        slots: s,
                    }
                    .encode()
                };
                let r = complete(
                    &mut c,
                    Completion::WriteImm {
                        imm,
                        byte_len: Some(l),
                    },
                );
                if c.kind() != Kind::Duplex && c.state() != StreamState::Handshaking {
                    prop_assert!(
                        r.is_err() || c.error().is_some() || c.state() == StreamState::Closed
                    );
                }
            }
            Op::CreditImm(b, s) => {
                let imm = if b == 0 && s == 0 {
                    0x8000_0000
                } else {
                    Imm::Credit { bytes: b, slots: s }.encode()
                };
                let _ = complete(
                    &mut c,
                    Completion::WriteImm {
                        imm,
                        byte_len: Some(0),
                    },
                );
            }
            Op::Send(p) => {
                let _ = c.handle_completion(Completion::Recv { payload: &p });
            }
            Op::Control(m) => {
                let _ = c.handle_completion(Completion::Recv {
                    payload: m.encode().as_bytes(),
                });
            }
            Op::TcpRead(n) => {
                let _ = c.note_tcp_read(n);
            }
            Op::TcpEof => {
                let _ = c.handle_tcp_eof();
            }
            Op::TcpReset => c.handle_tcp_reset(),
            Op::TransportError => c.handle_transport_error(),
            Op::Commit(n) => {
                let _ = c.commit_switch(n);
            }
            Op::AppSend(n) => {
                let _ = c.send(n);
            }
            Op::Consume(n) => {
                let _ = c.consume(n);
            }
            Op::ShutdownWrite => {
                let _ = c.shutdown_write();
            }
            Op::ShutdownRead => c.shutdown_read(),
            Op::Close => c.close(),
            Op::Abort => c.abort(),
            Op::Poll => {
                while let Some(a) = c.poll_action() {
                    if a == Action::Teardown {
                        teardowns += 1;
                    }
                    if let Action::WriteData {
                        cursor,
                        len,
                        gen,
                        ring_offset,
                        ..
                    } = a
                    {
                        let p = c.tx_place(cursor).unwrap();
                        prop_assert!(len > 0 && len as u64 <= p.size.bytes());
                        prop_assert_eq!((gen, ring_offset), (p.gen, p.offset));
                    }
                }
            }
            Op::Timeout(ms) => c.handle_timeout(start + std::time::Duration::from_millis(ms)),
            Op::TcpControl(b) => {
                let _ = c.tcp_control(&b);
            }
            Op::Record(from) => {
                let r = Record { resume_from: from }.encode(c.nonce());
                let _ = c.tcp_control(&r);
            }
            Op::Resumed(n) => match c.resume_due() {
                Some(Resume::Record { len, .. }) => c.resumed_record((n as usize).min(len)),
                Some(Resume::Write { .. }) => c.resumed(n),
                Some(Resume::ShutdownWrite) => c.resumed_shutdown(),
                None => {}
            },
            Op::OfferRing(l) => {
                let ring = RingDesc {
                    addr: 0x9000,
                    rkey: 3,
                    size: RingSize::from_log2(l).unwrap(),
                };
                let _ = c.offer_ring(ring);
            }
            Op::StagingReady(g) => {
                let _ = c.staging_ready(g);
            }
            Op::WantRing(l) => {
                let _ = c.want_ring(RingSize::from_log2(l).unwrap());
            }
            Op::RingWord(i, w) => {
                let o = (usize::from(i) * 8) % ring.len();
                ring[o..o + 8].copy_from_slice(&w.to_le_bytes());
            }
            Op::RingRecord(_, len) | Op::RingNext(len) => {
                let at = match op {
                    Op::RingRecord(at, _) => at,
                    _ => c.rx_cursors().head(),
                };
                let len = len.min(framing::max_payload(size));
                // (without records the ring's cursors need not be words)
                let Ok(f) = framing::frame(at, len, size, salt) else {
                    continue;
                };
                let n = ring.len();
                for (k, b) in f.header.to_le_bytes().into_iter().enumerate() {
                    ring[(size.offset(at) + k) % n] = b;
                    ring[(size.offset(at) + f.trailer_at + k) % n] = b;
                }
            }
            Op::PollRing => {
                let _ = c.poll_ring(|o| {
                    assert!(o % 8 == 0 && o < ring.len(), "a word read at {o}");
                    u64::from_le_bytes(ring[o..o + 8].try_into().unwrap())
                });
                if let Recv::Ring { offset, len, .. } = c.recv() {
                    prop_assert!(len >= 1 && len <= framing::max_payload(size) as usize);
                    prop_assert!(offset < ring.len());
                }
            }
            Op::PrepareSleep => {
                let _ = c.prepare_sleep();
            }
        }
        // Readiness and queries never panic either.
        let _ = (c.readiness(), c.recv(), c.state(), c.can_fall_back());
        let rx = c.rx_cursors();
        prop_assert!(rx.credited() <= rx.tail() && rx.tail() <= rx.head());
        // (after a ring move the bound spans the old ring and the new one: §6.4)
        prop_assert!(rx.head() <= rx.credited() + rx.window());
        if let Some(tx) = c.tx_cursors() {
            prop_assert!(tx.acked() <= tx.posted() && tx.posted() <= tx.head());
            let old = tx.moved().map_or(0, |m| m.old.bytes());
            prop_assert!(tx.head() <= tx.acked() + old + tx.size().bytes());
        }
        if let Some(f) = failed {
            prop_assert_eq!(c.error(), Some(f), "a failure is final");
        }
        failed = c.error();
    }
    while let Some(a) = c.poll_action() {
        if a == Action::Teardown {
            teardowns += 1;
        }
    }
    prop_assert!(teardowns <= 1);
    if c.error().is_some() {
        prop_assert_eq!(teardowns, 1);
    }
    Ok(())
}
