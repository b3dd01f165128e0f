//! Targeted scenarios for the `Connection` driver: handshake outcomes, switch-over, every
//! protocol violation, shutdown/close semantics, credits and readiness. Protocol-level only (no
//! ring bytes are copied; `sim_pair.rs` does that).

use std::time::{Duration, Instant};

use rdmashim_proto::*;

mod common;
use common::proof;

const A_RING: u64 = 0x1000_0000;
const B_RING: u64 = 0x2000_0000;

fn local(addr: u64, log2: u8, slots: u16) -> LocalParams {
    LocalParams {
        ring: RingDesc {
            addr,
            rkey: 7,
            size: RingSize::from_log2(log2).unwrap(),
        },
        recv_slots: slots,
    }
}

/// A client's connect and the server's accept of its request, both proving `proof` (4 KiB
/// rings, 4 receives each); neither has seen the other's answer yet.
fn exchange(
    cfg: Config,
    proof: &Proof,
    now: Instant,
) -> (Connection, ConnectRequest, Connection, AcceptReply) {
    let (a, req) = Connection::connect(cfg, local(A_RING, 12, 4), proof, 1, 2, 3, 0, now).unwrap();
    let (b, reply) = Connection::accept(cfg, local(B_RING, 12, 4), &req, proof, 0, now).unwrap();
    (a, req, b, reply)
}

/// Client `a` and server `b`, established (not switched).
fn established(log2: u8, slots: u16, cfg: Config) -> (Connection, Connection) {
    let now = Instant::now();
    let (mut a, req) = Connection::connect(
        cfg,
        local(A_RING, log2, slots),
        &proof(),
        1234,
        80,
        42,
        0,
        now,
    )
    .unwrap();
    let req = ConnectRequest::decode(&req.encode()).unwrap();
    let (mut b, reply) =
        Connection::accept(cfg, local(B_RING, log2, slots), &req, &proof(), 0, now).unwrap();
    a.handle_accept(&reply.encode()).unwrap();
    b.handle_established();
    (a, b)
}

/// Both established and switched with no TCP bytes.
fn open(log2: u8, slots: u16, cfg: Config) -> (Connection, Connection) {
    let (mut a, mut b) = established(log2, slots, cfg);
    a.commit_switch(0).unwrap();
    b.commit_switch(0).unwrap();
    // (each SwitchOver is credited at once: the pair is quiet after a round trip more)
    settle(&mut a, &mut b);
    assert_eq!(a.state(), StreamState::Open);
    assert_eq!(b.state(), StreamState::Open);
    (a, b)
}

/// Performs all of `from`'s actions and hands them to `to` as completions; returns them.
fn flow(from: &mut Connection, to: &mut Connection) -> Result<Vec<Action>, ErrorReason> {
    let mut out = Vec::new();
    while let Some(a) = from.poll_action() {
        out.push(a);
    }
    for a in &out {
        deliver(a, to)?;
    }
    Ok(out)
}

/// Flows both ways until neither side has anything to do; returns what each side did.
fn settle(a: &mut Connection, b: &mut Connection) -> (Vec<Action>, Vec<Action>) {
    let (mut from_a, mut from_b) = (Vec::new(), Vec::new());
    for _ in 0..100 {
        let x = flow(a, b).unwrap();
        let y = flow(b, a).unwrap();
        if x.is_empty() && y.is_empty() {
            return (from_a, from_b);
        }
        from_a.extend(x);
        from_b.extend(y);
    }
    panic!("no quiescence");
}

fn deliver(a: &Action, to: &mut Connection) -> Result<(), ErrorReason> {
    match *a {
        Action::WriteData { len, imm, .. } => to.handle_completion(Completion::WriteImm {
            imm: imm.encode(),
            byte_len: Some(len as u32),
        }),
        Action::WriteCredit { imm, .. } => to.handle_completion(Completion::WriteImm {
            imm: imm.encode(),
            byte_len: Some(0),
        }),
        Action::WriteRecord { .. } | Action::Doorbell { .. } => {
            panic!("records need ring memory: they are tested in sim_pair.rs")
        }
        Action::Send(m) => to.handle_completion(Completion::Recv {
            payload: m.encode().as_bytes(),
        }),
        // (local work for the transport: nothing goes to the peer)
        Action::Teardown
        | Action::NewStaging { .. }
        | Action::ReleaseStaging { .. }
        | Action::ReleaseRing { .. } => Ok(()),
    }
}

fn data_imm(len: u32, credit_wanted: bool) -> Completion<'static> {
    Completion::WriteImm {
        imm: Imm::Data { len, credit_wanted }.encode(),
        byte_len: Some(len),
    }
}

/// An open pair's first side after both shut their write sides on the ring: Closed, cleanly.
fn cleanly_closed() -> Connection {
    let (mut a, mut b) = open(12, 8, Config::default());
    a.shutdown_write().unwrap();
    b.shutdown_write().unwrap();
    flow(&mut a, &mut b).unwrap();
    flow(&mut b, &mut a).unwrap();
    assert_eq!(a.state(), StreamState::Closed);
    a
}

fn teardowns(c: &mut Connection) -> usize {
    std::iter::from_fn(|| c.poll_action())
        .filter(|a| *a == Action::Teardown)
        .count()
}

fn expect_violation(c: &mut Connection, r: Result<(), ErrorReason>, v: Violation) {
    assert_eq!(r, Err(ErrorReason::Protocol(v)));
    assert_eq!(c.state(), StreamState::Error(ErrorReason::Protocol(v)));
    assert_eq!(c.recv(), Recv::Error(ErrorReason::Protocol(v)));
    let r = c.readiness();
    assert!(r.error && r.hup && r.readable && r.writable);
    assert_eq!(teardowns(c), 1);
    assert_eq!(teardowns(c), 0, "Teardown only once");
    assert!(!c.can_fall_back());
}

// ----- handshake ---------------------------------------------------------------------------------

#[test]
fn handshake_then_switch() {
    let (mut a, mut b) = established(12, 4, Config::default());
    assert_eq!(a.state(), StreamState::Switching);
    assert_eq!(a.side(), Side::Client);
    assert_eq!(b.side(), Side::Server);
    assert_eq!(b.nonce(), 42);
    assert_eq!(a.peer_ring().unwrap().addr, B_RING);
    assert_eq!(b.peer_ring().unwrap().addr, A_RING);
    let r = a.readiness();
    assert!(r.read_via_tcp && r.write_via_tcp);
    assert_eq!(a.send(10), Err(SendError::ViaTcp));
    assert_eq!(a.recv(), Recv::Tcp { limit: None });
    a.commit_switch(0).unwrap();
    let acts = flow(&mut a, &mut b).unwrap();
    assert_eq!(
        acts,
        vec![Action::Send(ControlMsg::SwitchOver { tcp_bytes_sent: 0 })]
    );
    assert_eq!(b.rx_state(), RxState::Ring);
    assert_eq!(b.state(), StreamState::Switching, "b still sends on TCP");
    b.commit_switch(0).unwrap();
    flow(&mut b, &mut a).unwrap();
    assert_eq!(a.state(), StreamState::Open);
}

#[test]
fn reject_with_reason_falls_back() {
    let now = Instant::now();
    let (mut a, _) = Connection::connect(
        Config::default(),
        local(A_RING, 12, 4),
        &proof(),
        1,
        2,
        3,
        0,
        now,
    )
    .unwrap();
    a.handle_reject(&Reject::new(RejectReason::NoMatchingTcp).encode());
    assert_eq!(
        a.error(),
        Some(ErrorReason::Rejected(Some(RejectReason::NoMatchingTcp)))
    );
    assert!(a.can_fall_back());
    assert_eq!(a.recv(), Recv::Tcp { limit: None });
    assert_eq!(a.send(1), Err(SendError::ViaTcp));
    let r = a.readiness();
    assert!(r.read_via_tcp && r.write_via_tcp && !r.error);
    assert_eq!(teardowns(&mut a), 1);
}

#[test]
fn reject_without_rdmashim_data() {
    for data in [&[][..], &[0u8; 148][..], &b"garbage from another app"[..]] {
        let (mut a, _) = Connection::connect(
            Config::default(),
            local(A_RING, 12, 4),
            &proof(),
            1,
            2,
            3,
            0,
            Instant::now(),
        )
        .unwrap();
        a.handle_reject(data);
        assert_eq!(a.error(), Some(ErrorReason::Rejected(None)));
        assert!(a.can_fall_back());
    }
}

#[test]
fn bad_replies() {
    let now = Instant::now();
    let cfg = Config::default();
    let (mut a, _req, _b, mut reply) = exchange(cfg, &proof(), now);
    reply.nonce ^= 1;
    assert_eq!(
        a.handle_accept(&reply.encode()),
        Err(ErrorReason::Handshake(HandshakeError::NonceMismatch {
            expected: 3,
            got: 2
        }))
    );
    let (mut a, _) =
        Connection::connect(cfg, local(A_RING, 12, 4), &proof(), 1, 2, 3, 0, now).unwrap();
    assert_eq!(
        a.handle_accept(&[1, 2, 3]),
        Err(ErrorReason::Handshake(HandshakeError::Decode(
            DecodeError::Truncated { need: 4, got: 3 }
        )))
    );
    assert!(a.can_fall_back());
}

#[test]
fn handshake_timeout() {
    let now = Instant::now();
    let cfg = Config {
        handshake_timeout: Duration::from_millis(500),
        ..Config::default()
    };
    let (mut a, _, mut b, _) = exchange(cfg, &proof(), now);
    for c in [&mut a, &mut b] {
        assert_eq!(c.poll_timeout(), Some(now + Duration::from_millis(500)));
        c.handle_timeout(now + Duration::from_millis(499));
        assert_eq!(c.state(), StreamState::Handshaking);
        c.handle_timeout(now + Duration::from_millis(500));
        assert_eq!(c.error(), Some(ErrorReason::HandshakeTimeout));
        assert_eq!(c.poll_timeout(), None);
        assert!(c.can_fall_back());
    }
    let (a, _) = established(12, 4, cfg);
    assert_eq!(a.poll_timeout(), None);
}

#[test]
fn a_handshake_that_waits_longer() {
    let now = Instant::now();
    let ms = Duration::from_millis;
    let cfg = Config {
        handshake_timeout: ms(500),
        ..Config::default()
    };
    let (mut a, _, mut b, _) = exchange(cfg, &proof(), now);
    for c in [&mut a, &mut b] {
        // (never earlier)
        assert!(!c.wait_longer(now + ms(400)));
        assert!(c.wait_longer(now + ms(2000)));
        assert_eq!(c.poll_timeout(), Some(now + ms(2000)));
        c.handle_timeout(now + ms(500));
        assert_eq!(c.state(), StreamState::Handshaking);
        c.handle_timeout(now + ms(2000));
        assert_eq!(c.error(), Some(ErrorReason::HandshakeTimeout));
        // (over: nothing to move)
        assert!(!c.wait_longer(now + ms(9000)));
        assert_eq!(c.poll_timeout(), None);
    }
    let (mut a, _) = established(12, 4, cfg);
    assert!(!a.wait_longer(now + ms(9000)));
    assert_eq!(a.poll_timeout(), None);
}

#[test]
fn tcp_ends_during_handshake() {
    let (mut a, _) = Connection::connect(
        Config::default(),
        local(A_RING, 12, 4),
        &proof(),
        1,
        2,
        3,
        0,
        Instant::now(),
    )
    .unwrap();
    assert_eq!(a.handle_tcp_eof(), Err(ErrorReason::TcpClosed));
    assert!(a.can_fall_back());
}

#[test]
fn too_few_slots() {
    assert_eq!(
        Connection::connect(
            Config::default(),
            local(A_RING, 12, 3),
            &proof(),
            1,
            2,
            3,
            0,
            Instant::now()
        )
        .err(),
        Some(ConfigError::TooFewRecvSlots(3))
    );
}

#[test]
fn server_established_by_first_completion() {
    let now = Instant::now();
    let cfg = Config::default();
    let (mut a, _, mut b, reply) = exchange(cfg, &proof(), now);
    a.handle_accept(&reply.encode()).unwrap();
    assert_eq!(b.state(), StreamState::Handshaking);
    assert!(b.commit_switch(0).is_err(), "no commit before established");
    a.commit_switch(5).unwrap();
    flow(&mut a, &mut b).unwrap();
    assert_eq!(b.rx_state(), RxState::Draining { remaining: 5 });
    assert_eq!(b.state(), StreamState::Switching);
}

#[test]
fn client_completion_before_established() {
    let (mut a, _) = Connection::connect(
        Config::default(),
        local(A_RING, 12, 4),
        &proof(),
        1,
        2,
        3,
        0,
        Instant::now(),
    )
    .unwrap();
    let r = a.handle_completion(data_imm(1, false));
    expect_violation(&mut a, r, Violation::CompletionBeforeEstablished);
}

// ----- switch-over -----------------------------------------------------------------------------

#[test]
fn switch_over_drains_tcp_first() {
    let (mut a, mut b) = established(12, 4, Config::default());
    b.note_tcp_read(3).unwrap(); // 3 of a's TCP bytes read before the SwitchOver arrives
    a.commit_switch(10).unwrap();
    let g = a.send(100).unwrap();
    assert_eq!((g.cursor, g.len), (0, 100));
    flow(&mut a, &mut b).unwrap();
    assert_eq!(b.rx_state(), RxState::Draining { remaining: 7 });
    assert_eq!(b.recv(), Recv::Tcp { limit: Some(7) });
    assert!(b.readiness().read_via_tcp);
    assert_eq!(
        b.consume(1),
        Err(ConsumeError {
            requested: 1,
            readable: 0
        })
    );
    b.note_tcp_read(7).unwrap();
    assert_eq!(
        b.recv(),
        Recv::Ring {
            gen: 0,
            offset: 0,
            len: 100
        }
    );
    assert!(b.is_readable());
    b.consume(60).unwrap();
    assert_eq!(
        b.recv(),
        Recv::Ring {
            gen: 0,
            offset: 60,
            len: 40
        }
    );
}

#[test]
fn switch_over_violations() {
    let (mut a, mut b) = established(12, 4, Config::default());
    b.note_tcp_read(10).unwrap();
    a.commit_switch(9).unwrap();
    let acts = std::iter::from_fn(|| a.poll_action()).collect::<Vec<_>>();
    let r = deliver(&acts[0], &mut b);
    expect_violation(
        &mut b,
        r,
        Violation::SwitchOverBehindTcp {
            declared: 9,
            received: 10,
        },
    );

    let (mut a, mut b) = established(12, 4, Config::default());
    a.commit_switch(4).unwrap();
    flow(&mut a, &mut b).unwrap();
    let r = b.note_tcp_read(5);
    expect_violation(&mut b, r, Violation::TcpBeyondSwitchOver);

    let (_a, mut b) = established(12, 4, Config::default());
    let r = b.handle_completion(data_imm(5, false));
    expect_violation(&mut b, r, Violation::DataBeforeSwitchOver);

    let (mut a, mut b) = open(12, 4, Config::default());
    let sw = ControlMsg::SwitchOver { tcp_bytes_sent: 0 }.encode();
    let r = b.handle_completion(Completion::Recv {
        payload: sw.as_bytes(),
    });
    expect_violation(&mut b, r, Violation::DuplicateSwitchOver);
    let _ = &mut a;

    let (_a, mut b) = established(12, 4, Config::default());
    let sw = ControlMsg::ShutdownWrite { ring_bytes: 0 }.encode();
    let r = b.handle_completion(Completion::Recv {
        payload: sw.as_bytes(),
    });
    expect_violation(&mut b, r, Violation::FinBeforeSwitchOver);
}

#[test]
fn commit_rules() {
    let (mut a, _) = established(12, 4, Config::default());
    assert!(
        a.shutdown_write().is_err(),
        "shutdown needs the switch first"
    );
    a.commit_switch(0).unwrap();
    assert_eq!(
        a.commit_switch(0),
        Err(InvalidTransition {
            state: "Ring",
            event: "Commit"
        })
    );
}

/// A link that fails after this side switched loses nothing if the ring carried nothing:
/// the peer never switched, nothing came from it, no data went into it (a Close does not
/// count). Once a byte of data went in, or a message came, it is lost with the link.
#[test]
fn failed_link_with_an_unused_ring() {
    let (mut a, _) = established(12, 4, Config::default());
    a.commit_switch(10).unwrap();
    assert!(!a.failed_unused(), "not failed");
    assert!(!a.write_shut());
    a.shutdown_write().unwrap();
    assert!(a.write_shut());
    a.handle_transport_error();
    assert!(a.error().is_some());
    assert!(a.failed_unused(), "switched and shut, nothing on the ring");

    let (mut a, _) = established(12, 4, Config::default());
    a.commit_switch(0).unwrap();
    assert_eq!(a.send(1).unwrap().len, 1);
    a.handle_transport_error();
    assert!(!a.failed_unused(), "a byte went into the ring");

    let (mut a, mut b) = established(12, 4, Config::default());
    a.commit_switch(0).unwrap();
    b.commit_switch(0).unwrap();
    flow(&mut b, &mut a).unwrap();
    a.handle_transport_error();
    assert!(!a.failed_unused(), "the peer switched");
}

// ----- ring and credits ------------------------------------------------------------------------

#[test]
fn ring_overrun_and_bad_imm() {
    let (_a, mut b) = open(12, 8, Config::default());
    b.handle_completion(data_imm(4096, false)).unwrap();
    let r = b.handle_completion(data_imm(1, false));
    expect_violation(
        &mut b,
        r,
        Violation::RingOverrun(rdmashim_proto::ring::OverrunError {
            end: 4097,
            limit: 4096,
        }),
    );

    let (_a, mut b) = open(12, 8, Config::default());
    let r = b.handle_completion(Completion::WriteImm {
        imm: 0,
        byte_len: Some(0),
    });
    expect_violation(&mut b, r, Violation::Decode(DecodeError::UnknownKind(0)));

    let (_a, mut b) = open(12, 8, Config::default());
    let r = b.handle_completion(Completion::WriteImm {
        imm: Imm::Data {
            len: 10,
            credit_wanted: false,
        }
        .encode(),
        byte_len: Some(11),
    });
    expect_violation(
        &mut b,
        r,
        Violation::ImmLengthMismatch {
            imm: 10,
            byte_len: 11,
        },
    );

    let (_a, mut b) = open(12, 8, Config::default());
    let r = b.handle_completion(Completion::Recv { payload: &[77; 12] });
    expect_violation(&mut b, r, Violation::Decode(DecodeError::UnknownKind(77)));
}

#[test]
fn slot_overrun() {
    let (_a, mut b) = open(12, 4, Config::default());
    // The SwitchOver used one of b's 4 slots and b has not returned it (not pumped).
    for _ in 0..3 {
        b.handle_completion(data_imm(1, false)).unwrap();
    }
    let r = b.handle_completion(data_imm(1, false));
    expect_violation(&mut b, r, Violation::SlotOverrun);
}

#[test]
fn bad_credits() {
    let (mut a, _b) = open(12, 8, Config::default());
    a.send(10).unwrap();
    let _ = std::iter::from_fn(|| a.poll_action()).count();
    let r = a.handle_completion(Completion::WriteImm {
        imm: Imm::Credit {
            bytes: 11,
            slots: 0,
        }
        .encode(),
        byte_len: Some(0),
    });
    expect_violation(
        &mut a,
        r,
        Violation::BadCredit(rdmashim_proto::ring::CreditError {
            claimed: 11,
            posted: 10,
        }),
    );

    let (mut a, _b) = open(12, 8, Config::default());
    let r = a.handle_completion(Completion::WriteImm {
        imm: Imm::Credit { bytes: 0, slots: 2 }.encode(),
        byte_len: Some(0),
    });
    expect_violation(&mut a, r, Violation::SlotCreditOverflow);
}

#[test]
fn fin_cursor_must_match() {
    let (_a, mut b) = open(12, 8, Config::default());
    b.handle_completion(data_imm(5, false)).unwrap();
    let m = ControlMsg::ShutdownWrite { ring_bytes: 4 }.encode();
    let r = b.handle_completion(Completion::Recv {
        payload: m.as_bytes(),
    });
    expect_violation(
        &mut b,
        r,
        Violation::FinCursorMismatch {
            declared: 4,
            received: 5,
        },
    );
}

#[test]
fn credit_is_lazy_unless_wanted() {
    let cfg = Config::default();
    let (mut a, mut b) = open(14, 16, cfg); // 16 KiB ring: byte threshold 4 KiB
    assert_eq!(a.send(1000).unwrap().len, 1000);
    let acts = flow(&mut a, &mut b).unwrap();
    assert!(matches!(
        acts[..],
        [Action::WriteData {
            imm,
            ..
        }] if imm == Imm::Data { len: 1000, credit_wanted: false }
    ));
    b.consume(1000).unwrap();
    assert!(flow(&mut b, &mut a).unwrap().is_empty(), "below thresholds");

    // Fill the ring: the write that fills it asks for credit; the receiver then credits at once.
    let g = a.send(1 << 20).unwrap();
    assert_eq!(g.len, (16 << 10) - 1000);
    assert_eq!(a.send(1), Err(SendError::WouldBlock));
    assert!(!a.is_writable());
    let acts = flow(&mut a, &mut b).unwrap();
    let Action::WriteData { imm, .. } = acts[0] else {
        panic!("{acts:?}")
    };
    assert_eq!(
        imm,
        Imm::Data {
            len: (16 << 10) - 1000,
            credit_wanted: true
        }
    );
    b.consume(1).unwrap();
    let acts = flow(&mut b, &mut a).unwrap();
    let [Action::WriteCredit { imm, remote_addr }] = acts[..] else {
        panic!("{acts:?}")
    };
    assert_eq!(remote_addr, A_RING);
    assert_eq!(
        imm,
        Imm::Credit {
            bytes: 1001,
            slots: 3 // SwitchOver + two DATA
        }
    );
    assert_eq!(a.tx_cursors().unwrap().free(), 1001);
}

#[test]
fn large_slot_credit_uses_credit_update() {
    let (mut a, mut b) = open(16, 200, Config::default());
    for _ in 0..100 {
        a.send(1).unwrap();
        let acts = std::iter::from_fn(|| a.poll_action()).collect::<Vec<_>>();
        for x in &acts {
            deliver(x, &mut b).unwrap();
        }
    }
    // b was never pumped: it owes 101 slots (SwitchOver + 100 DATA), more than an immediate holds.
    let acts = flow(&mut b, &mut a).unwrap();
    assert_eq!(
        acts,
        vec![Action::Send(ControlMsg::CreditUpdate {
            read_cursor: 0,
            slots: 101
        })]
    );
    assert_eq!(a.peer_slots(), Some(200));
}

#[test]
fn lowest_thresholds_still_go_quiet() {
    // Thresholds below 2 are clamped to 2: a credit never answers a credit.
    let cfg = Config {
        credit_slot_threshold: Some(0),
        credit_byte_shift: 1,
        ..Config::default()
    };
    let (mut a, mut b) = open(12, 4, cfg);
    assert_eq!(a.credit_policy().slot_threshold, 2);
    for _ in 0..50 {
        a.send(100).unwrap();
        flow(&mut a, &mut b).unwrap();
        b.consume(100).unwrap();
        b.send(7).unwrap();
        flow(&mut b, &mut a).unwrap();
        a.consume(7).unwrap();
    }
    let mut rounds = 0;
    loop {
        let n = flow(&mut a, &mut b).unwrap().len() + flow(&mut b, &mut a).unwrap().len();
        if n == 0 {
            break;
        }
        rounds += 1;
        assert!(rounds < 10, "credits keep answering credits");
    }
}

#[test]
fn ignorable_control_uses_a_slot() {
    let (mut a, mut b) = open(12, 4, Config::default());
    let m = ControlMsg::Ignored { kind: 200 }.encode();
    b.handle_completion(Completion::Recv {
        payload: m.as_bytes(),
    })
    .unwrap();
    assert_eq!(b.state(), StreamState::Open);
    // A's SwitchOver, A's credit of B's SwitchOver, and the ignored message.
    assert_eq!(b.stats().messages_received, 3);
    // The SwitchOver's slot went back at once; the credit's and the ignored message's reach
    // the threshold (2 of 4).
    assert_eq!(
        b.poll_action(),
        Some(Action::WriteCredit {
            remote_addr: A_RING,
            imm: Imm::Credit { bytes: 0, slots: 2 }
        })
    );
    let _ = &mut a;
}

// ----- shutdown, close, failures ----------------------------------------------------------------

#[test]
fn half_close() {
    let (mut a, mut b) = open(12, 8, Config::default());
    a.send(10).unwrap();
    a.shutdown_write().unwrap();
    assert_eq!(a.state(), StreamState::LocalShut);
    assert_eq!(a.send(1), Err(SendError::Shutdown));
    assert_eq!(
        SendError::Shutdown.io_kind(),
        std::io::ErrorKind::BrokenPipe
    );
    assert!(a.is_writable());
    let acts = flow(&mut a, &mut b).unwrap();
    assert_eq!(
        acts.last(),
        Some(&Action::Send(ControlMsg::ShutdownWrite { ring_bytes: 10 }))
    );
    assert_eq!(b.state(), StreamState::PeerShut);
    assert!(b.rdhup() && b.is_readable());
    assert_eq!(
        b.recv(),
        Recv::Ring {
            gen: 0,
            offset: 0,
            len: 10
        }
    );
    b.consume(10).unwrap();
    assert_eq!(b.recv(), Recv::Eof);
    // b can still send the other way.
    assert_eq!(b.send(20).unwrap().len, 20);
    flow(&mut b, &mut a).unwrap();
    assert_eq!(
        a.recv(),
        Recv::Ring {
            gen: 0,
            offset: 0,
            len: 20
        }
    );
    assert!(!a.readiness().hup);
    b.shutdown_write().unwrap();
    let acts = flow(&mut b, &mut a).unwrap();
    assert_eq!(acts.last(), Some(&Action::Teardown));
    assert_eq!(b.state(), StreamState::Closed);
    assert_eq!(a.state(), StreamState::Closed);
    assert!(a.readiness().hup);
    assert_eq!(
        a.recv(),
        Recv::Ring {
            gen: 0,
            offset: 0,
            len: 20
        },
        "data survives teardown"
    );
    a.consume(20).unwrap();
    assert_eq!(a.recv(), Recv::Eof);
    assert_eq!(teardowns(&mut a), 1);
    assert_eq!(teardowns(&mut b), 0, "already emitted");
    // After the teardown the QP errors out and TCP closes: neither is an error now.
    a.handle_transport_error();
    assert_eq!(a.handle_tcp_eof(), Ok(()));
    assert_eq!(a.error(), None);
}

#[test]
fn shutdown_then_close_reads_data_then_eof() {
    // The common client ending: shutdown(SHUT_WR), then close(). The peer gets ShutdownWrite,
    // then Close: both legal, its reader sees every byte and then EOF (no error).
    let (mut a, mut b) = open(12, 8, Config::default());
    a.send(7).unwrap();
    a.shutdown_write().unwrap();
    let acts = flow(&mut a, &mut b).unwrap();
    assert!(acts.contains(&Action::Send(ControlMsg::ShutdownWrite { ring_bytes: 7 })));
    assert_eq!(b.state(), StreamState::PeerShut);
    a.close();
    let (acts, _) = settle(&mut a, &mut b);
    assert!(acts.contains(&Action::Send(ControlMsg::Close {
        ring_bytes: 7,
        reset: false
    })));
    assert_eq!(b.error(), None);
    assert_eq!(b.state(), StreamState::Closed);
    assert_eq!(
        b.recv(),
        Recv::Ring {
            gen: 0,
            offset: 0,
            len: 7
        }
    );
    b.consume(7).unwrap();
    assert_eq!(b.recv(), Recv::Eof);
    assert_eq!(b.send(1), Err(SendError::PeerClosed));
}

#[test]
fn peer_close_makes_sends_fail() {
    let (mut a, mut b) = open(12, 4, Config::default());
    // b queues more than a's ring holds; part of it cannot even be posted.
    assert_eq!(b.send(10_000).unwrap().len, 4096);
    let _ = flow(&mut b, &mut a).unwrap();
    a.consume(4096).unwrap();
    assert_eq!(b.send(10_000), Err(SendError::WouldBlock));
    a.send(5).unwrap();
    a.close();
    let (acts, b_acts) = settle(&mut a, &mut b);
    assert_eq!(b_acts.last(), Some(&Action::Teardown), "{b_acts:?}");
    assert!(acts.contains(&Action::Send(ControlMsg::Close {
        ring_bytes: 5,
        reset: false
    })));
    assert!(
        acts.contains(&Action::Teardown),
        "closer tears down at once"
    );
    assert_eq!(b.state(), StreamState::Closed);
    assert_eq!(b.send(1), Err(SendError::PeerClosed));
    assert!(b.is_writable());
    let tx = b.tx_cursors().unwrap();
    assert_eq!(tx.head(), tx.posted(), "unsent bytes dropped");
    assert_eq!(
        b.recv(),
        Recv::Ring {
            gen: 0,
            offset: 0,
            len: 5
        }
    );
    b.consume(5).unwrap();
    assert_eq!(b.recv(), Recv::Eof);
}

#[test]
fn close_with_unread_data_resets_peer() {
    let (mut a, mut b) = open(12, 8, Config::default());
    b.send(3).unwrap();
    flow(&mut b, &mut a).unwrap();
    a.close(); // 3 unread bytes: like Linux, an abortive close
    let acts = flow(&mut a, &mut b);
    assert_eq!(acts, Err(ErrorReason::Reset));
    assert_eq!(b.recv(), Recv::Error(ErrorReason::Reset));
    assert_eq!(b.send(1), Err(SendError::Failed(ErrorReason::Reset)));
    assert_eq!(
        ErrorReason::Reset.io_kind(),
        std::io::ErrorKind::ConnectionReset
    );
    assert!(b.readiness().error);
}

#[test]
fn abort_drops_unsent() {
    let (mut a, mut b) = open(12, 8, Config::default());
    a.send(100).unwrap();
    a.abort();
    let acts = std::iter::from_fn(|| a.poll_action()).collect::<Vec<_>>();
    assert_eq!(
        acts,
        vec![
            Action::Send(ControlMsg::Close {
                ring_bytes: 0,
                reset: true
            }),
            Action::Teardown
        ]
    );
    assert_eq!(deliver(&acts[0], &mut b), Err(ErrorReason::Reset));
}

/// The peer's TCP FIN comes before its confirmation of our SwitchOver (two paths: a FIN may
/// overtake a credit): the EOF is held until the credit comes, then taken. If the path fails
/// instead — the peer may have fallen back to TCP alone before our SwitchOver reached it, and
/// wait there for what we wrote into the ring — the stream fails (the shim resets TCP: the
/// peer reads ECONNRESET, never an early EOF with our bytes lost).
#[test]
fn peer_fin_before_its_confirmation_is_held() {
    // The credit comes after the FIN: the EOF is taken then.
    let (mut a, mut b) = established(12, 8, Config::default());
    a.commit_switch(0).unwrap();
    assert_eq!(a.send(100).unwrap().len, 100);
    let acts = std::iter::from_fn(|| a.poll_action()).collect::<Vec<_>>();
    for x in &acts {
        deliver(x, &mut b).unwrap();
    }
    assert_eq!(a.handle_tcp_eof(), Ok(()));
    assert_ne!(a.state(), StreamState::Closed, "held until b confirms");
    assert!(a.error().is_none());
    flow(&mut b, &mut a).unwrap();
    assert_eq!(
        a.state(),
        StreamState::Closed,
        "a peer that never switched: it closed"
    );
    assert_eq!(a.recv(), Recv::Eof);

    // No credit ever comes: the path failed and b fell back to TCP alone.
    let (mut a, _b) = established(12, 8, Config::default());
    a.commit_switch(0).unwrap();
    assert_eq!(a.send(100).unwrap().len, 100);
    while a.poll_action().is_some() {}
    assert_eq!(a.handle_tcp_eof(), Ok(()));
    assert!(a.error().is_none());
    a.handle_transport_error();
    assert!(!a.failed_over(), "b never confirmed: it may read no record");
    assert_eq!(a.error(), Some(ErrorReason::Transport));
    assert!(!a.can_fall_back());
}

#[test]
fn close_before_switch_tears_down() {
    let (mut a, mut b) = established(12, 4, Config::default());
    b.commit_switch(0).unwrap();
    flow(&mut b, &mut a).unwrap();
    a.close(); // a never switched: ring goes, the shim closes TCP as usual
    assert_eq!(a.state(), StreamState::Closed);
    // (first the credit a owes for b's SwitchOver: b's confirmation that a read it)
    let acts = std::iter::from_fn(|| a.poll_action()).collect::<Vec<_>>();
    assert!(
        matches!(acts[..], [Action::WriteCredit { .. }, Action::Teardown]),
        "{acts:?}"
    );
    assert_eq!(deliver(&acts[0], &mut b), Ok(()));
    // b sees the TCP FIN (a's TCP stream is complete) and treats a as closed.
    assert_eq!(b.handle_tcp_eof(), Ok(()));
    assert_eq!(b.recv(), Recv::Eof);
    assert_eq!(b.send(1), Err(SendError::PeerClosed));
    assert_eq!(b.state(), StreamState::Closed);
}

#[test]
fn shutdown_read_discards_and_credits() {
    let (mut a, mut b) = open(12, 8, Config::default());
    b.shutdown_read();
    assert_eq!(b.recv(), Recv::Eof);
    a.send(4096).unwrap();
    flow(&mut a, &mut b).unwrap();
    assert_eq!(b.rx_cursors().readable(), 0);
    flow(&mut b, &mut a).unwrap();
    assert_eq!(a.tx_cursors().unwrap().free(), 4096);
}

#[test]
fn peer_death() {
    // TCP EOF after the peer switched, without a ring shutdown: ring data may be lost.
    let (mut a, mut b) = open(12, 8, Config::default());
    a.send(10).unwrap();
    flow(&mut a, &mut b).unwrap();
    assert_eq!(b.handle_tcp_eof(), Err(ErrorReason::PeerVanished));
    assert_eq!(b.recv(), Recv::Error(ErrorReason::PeerVanished));

    // A queue-pair failure right after the switch, before the peer credited our SwitchOver:
    // the peer may not expect our stream on the ring, so no failover (§8.6).
    let (mut a, mut b) = established(12, 8, Config::default());
    a.commit_switch(0).unwrap();
    b.commit_switch(0).unwrap();
    flow(&mut a, &mut b).unwrap();
    b.handle_transport_error();
    assert_eq!(b.error(), Some(ErrorReason::Transport));
    assert!(!b.failed_over());
    assert_eq!(teardowns(&mut b), 1);

    // A TCP reset, even after a clean teardown (reads fail after an RST).
    let mut a = cleanly_closed();
    a.handle_tcp_reset();
    assert_eq!(a.error(), Some(ErrorReason::Reset));
    assert_eq!(teardowns(&mut a), 1, "one Teardown in total");
    assert_eq!(teardowns(&mut a), 0);
}

/// The kernel gives up the TCP connection under an upgraded stream (the application's
/// keepalive probes went unanswered: ETIMEDOUT; or a reset): the stream fails with it, as the
/// TCP connection would have, and is torn down. Not after a failover (the stream is TCP's:
/// the application meets the error there itself), nor after a clean end.
#[test]
fn tcp_error_under_the_ring_ends_the_stream() {
    let (mut a, mut b) = open(12, 8, Config::default());
    assert_eq!(a.send(100).unwrap().len, 100);
    settle(&mut a, &mut b);
    b.handle_tcp_error(true);
    assert_eq!(b.error(), Some(ErrorReason::TcpTimedOut));
    assert_eq!(b.recv(), Recv::Error(ErrorReason::TcpTimedOut));
    assert_eq!(
        ErrorReason::TcpTimedOut.io_kind(),
        std::io::ErrorKind::TimedOut
    );
    assert_eq!(teardowns(&mut b), 1);
    // (a second verdict changes nothing)
    b.handle_tcp_error(false);
    assert_eq!(b.error(), Some(ErrorReason::TcpTimedOut));

    let (mut a, _b) = open(12, 8, Config::default());
    a.handle_tcp_error(false);
    assert_eq!(a.error(), Some(ErrorReason::Reset));

    // After a failover: nothing (the socket's error is the application's to read).
    let (mut a, _b) = open(12, 8, Config::default());
    a.handle_transport_error();
    assert!(a.failed_over());
    a.handle_tcp_error(true);
    assert_eq!(a.error(), None);

    // After a clean end: nothing.
    let mut a = cleanly_closed();
    a.handle_tcp_error(true);
    assert_eq!(a.error(), None);
}

/// A queue-pair failure mid-stream (§8.6): the stream goes on over TCP. Each side writes its
/// record and its continuation from the peer's last credit, and reads the peer's pre-switch
/// bytes, record and continuation, dropping what it read from the ring already.
#[test]
fn path_failure_goes_on_over_tcp() {
    let (mut a, mut b) = open(12, 8, Config::default());
    // 3000 bytes each way; B reads 1000 of A's, A reads all of B's; credits are lazy (a
    // quarter ring), so the peers' acked cursors stay behind.
    assert_eq!(a.send(3000).unwrap().len, 3000);
    assert_eq!(b.send(3000).unwrap().len, 3000);
    settle(&mut a, &mut b);
    b.consume(1000).unwrap();
    a.consume(3000).unwrap();
    settle(&mut a, &mut b);
    let a_acked = a.tx_cursors().unwrap().acked();
    let b_acked = b.tx_cursors().unwrap().acked();
    assert!(a_acked <= 1000 && b_acked <= 3000);

    a.handle_transport_error();
    assert!(a.failed_over());
    assert_eq!(a.error(), None);
    assert_eq!(a.state(), StreamState::Closed);
    assert_eq!(teardowns(&mut a), 1);
    // Our continuation: the record, then the staged bytes from the peer's last credit.
    let Some(Resume::Record { bytes, len: 24 }) = a.resume_due() else {
        panic!("{:?}", a.resume_due());
    };
    assert_eq!(
        Record::decode(&bytes, a.nonce()),
        Ok(Record {
            resume_from: a_acked
        })
    );
    assert_eq!(a.send(1), Err(SendError::WouldBlock));
    a.resumed_record(24);
    assert_eq!(
        a.resume_due(),
        Some(Resume::Write {
            cursor: a_acked,
            len: 3000 - a_acked
        })
    );
    a.resumed(3000 - a_acked);
    assert_eq!(a.resume_due(), None);
    assert_eq!(a.send(5), Err(SendError::ViaTcp));
    // The peer's stream: the record first (the shim's), then what we had not read.
    assert_eq!(a.recv(), Recv::TcpControl { len: 24 });
    assert!(a.readiness().read_via_tcp);
    assert!(!a.switched_back());

    // B learns of it later (its own failed work request, the CM, or A's bytes on TCP).
    b.handle_transport_error();
    assert!(b.failed_over());
    let Some(Resume::Record { bytes: b_rec, .. }) = b.resume_due() else {
        panic!()
    };
    b.resumed_record(24);
    b.resumed(3000 - b_acked);
    // A reads B's record (in two pieces) and drops the 3000 − b_acked bytes it had.
    a.tcp_control(&b_rec[..10]).unwrap();
    assert_eq!(a.recv(), Recv::TcpControl { len: 14 });
    a.tcp_control(&b_rec[10..]).unwrap();
    if b_acked < 3000 {
        assert_eq!(
            a.recv(),
            Recv::TcpControl {
                len: 3000 - b_acked
            }
        );
        a.tcp_control(&vec![0; (3000 - b_acked) as usize]).unwrap();
    }
    assert_eq!(a.recv(), Recv::Tcp { limit: None });
    assert!(a.switched_back());
    // B: A's record, then 1000 − a_acked bytes to drop, then the 2000 it never read.
    let Recv::TcpControl { len: 24 } = b.recv() else {
        panic!("{:?}", b.recv())
    };
    b.tcp_control(&bytes).unwrap();
    if a_acked < 1000 {
        b.tcp_control(&vec![0; (1000 - a_acked) as usize]).unwrap();
    }
    assert_eq!(b.recv(), Recv::Tcp { limit: None });
    b.note_tcp_read(2000).unwrap();
    assert!(b.switched_back());
    assert_eq!(b.handle_tcp_eof(), Ok(()));
}

/// A side that had read the peer's whole stream (its ring Fin included) and closed when the
/// path fails still owes the peer's failover record and the bytes it repeats a read: they
/// are the shim's, and a socket closed with them unread is reset — the peer would lose what
/// it had not read yet. The connection is switched back only once they are read.
#[test]
fn path_failure_after_the_peers_end_still_takes_its_record() {
    let (mut a, mut b) = open(12, 8, Config::default());
    assert_eq!(b.send(3000).unwrap().len, 3000);
    b.shutdown_write().unwrap();
    assert_eq!(a.send(3000).unwrap().len, 3000);
    settle(&mut a, &mut b);
    a.consume(3000).unwrap();
    assert_eq!(a.recv(), Recv::Eof);
    let b_acked = b.tx_cursors().unwrap().acked();
    assert!(b_acked < 3000, "credits are lazy: {b_acked}");

    // B's path fails (A's credits never arrive); A learns of it from B's record on TCP.
    b.handle_transport_error();
    assert!(b.failed_over());
    let Some(Resume::Record { bytes: b_rec, .. }) = b.resume_due() else {
        panic!("{:?}", b.resume_due())
    };
    a.handle_transport_error();
    assert!(a.failed_over());
    a.resumed_record(24);
    let a_acked = a.tx_cursors().unwrap().acked();
    a.resumed(3000 - a_acked);
    assert_eq!(a.control_due(), Some(24));
    // The application, which had its EOF, closes.
    a.close();
    assert_eq!(a.recv(), Recv::Eof);
    assert_eq!(a.control_due(), Some(24), "still the shim's to read");
    assert!(!a.switched_back());
    a.tcp_control(&b_rec).unwrap();
    assert_eq!(a.control_due(), Some(3000 - b_acked));
    assert!(!a.switched_back());
    a.tcp_control(&vec![0; (3000 - b_acked) as usize]).unwrap();
    assert_eq!(a.control_due(), None);
    assert!(a.switched_back());
}

/// What the peer's TCP bytes must be after a path failure, or the connection fails: a record
/// of this upgrade, starting no later than what we read; not an EOF before it.
#[test]
fn path_failure_refuses_a_bad_continuation() {
    let bad = |f: &dyn Fn(&mut Connection) -> Result<(), ErrorReason>| {
        let (mut a, mut b) = open(12, 8, Config::default());
        b.send(100).unwrap();
        settle(&mut a, &mut b);
        a.consume(100).unwrap();
        a.handle_transport_error();
        assert!(a.failed_over());
        let r = f(&mut a);
        assert!(r.is_err());
        assert_eq!(a.recv(), Recv::Error(r.unwrap_err()));
    };
    // another upgrade's record
    bad(&|a| a.tcp_control(&Record { resume_from: 0 }.encode(a.nonce() ^ 1)));
    // a continuation that starts after what we read
    bad(&|a| a.tcp_control(&Record { resume_from: 101 }.encode(a.nonce())));
    // TCP ends before the record: the peer vanished
    bad(&|a| a.handle_tcp_eof());
    // TCP ends inside the part we had read
    bad(&|a| {
        a.tcp_control(&Record { resume_from: 0 }.encode(a.nonce()))?;
        a.tcp_control(&[0; 50])?;
        a.handle_tcp_eof()
    });
}

#[test]
fn late_completions_after_teardown_are_ignored() {
    let (mut a, mut b) = open(12, 8, Config::default());
    a.close();
    flow(&mut a, &mut b).unwrap();
    assert_eq!(a.handle_completion(data_imm(10, false)), Ok(()));
    assert_eq!(a.state(), StreamState::Closed);
}

#[test]
fn readiness_mirrors_tcp_poll() {
    let (mut a, mut b) = open(12, 8, Config::default());
    let r = b.readiness();
    assert!(!r.readable && r.writable && !r.rdhup && !r.hup && !r.error);
    assert!(!r.read_via_tcp && !r.write_via_tcp);
    // Writable needs free >= half the bytes in flight (sk_stream_is_writeable).
    a.send(2730).unwrap();
    assert!(a.is_writable());
    a.send(2).unwrap();
    assert!(!a.is_writable(), "1364 free < 2732/2");
    flow(&mut a, &mut b).unwrap();
    assert!(b.is_readable());
}

#[test]
fn barrier_follows_earlier_data_and_is_counted() {
    let (mut a, mut b) = open(12, 8, Config::default());
    let g = a.send(100).unwrap();
    assert_eq!(g.len, 100);
    assert_eq!(a.barrier(), Ok(1));
    let out = flow(&mut a, &mut b).unwrap();
    assert!(
        matches!(out[0], Action::WriteData { len: 100, .. }),
        "{out:?}"
    );
    assert_eq!(out[1], Action::Send(ControlMsg::Barrier { epoch: 1 }));
    assert_eq!(b.barriers_received(), 1);
    assert_eq!(a.barriers_received(), 0);
    assert_eq!(b.barrier(), Ok(1));
    assert_eq!(b.barrier(), Ok(2));
    settle(&mut a, &mut b);
    assert_eq!(a.barriers_received(), 2);
    // a barrier after shutdown is refused like a send
    a.shutdown_write().unwrap();
    assert_eq!(a.barrier(), Err(SendError::Shutdown));
}

#[test]
fn pending_barrier_goes_out_before_the_fin() {
    let (mut a, mut b) = open(12, 8, Config::default());
    a.barrier().unwrap();
    a.shutdown_write().unwrap();
    let out = flow(&mut a, &mut b).unwrap();
    assert_eq!(out[0], Action::Send(ControlMsg::Barrier { epoch: 1 }));
    assert!(
        matches!(out[1], Action::Send(ControlMsg::ShutdownWrite { .. })),
        "{out:?}"
    );
    assert_eq!(b.barriers_received(), 1);
}

#[test]
fn only_credits_with_slots_return_slots() {
    let credit = |bytes, slots| Action::WriteCredit {
        remote_addr: A_RING,
        imm: Imm::Credit { bytes, slots },
    };
    assert!(credit(0, 1).returns_slots());
    assert!(credit(4096, 63).returns_slots());
    assert!(!credit(4096, 0).returns_slots());
    let update = |slots| {
        Action::Send(ControlMsg::CreditUpdate {
            read_cursor: 1 << 20,
            slots,
        })
    };
    assert!(update(64).returns_slots());
    assert!(!update(0).returns_slots());
    let data = Action::WriteData {
        cursor: 0,
        len: 64,
        gen: 0,
        ring_offset: 0,
        remote_addr: B_RING,
        rkey: 0,
        imm: Imm::Data {
            len: 64,
            credit_wanted: true,
        },
    };
    assert!(!data.returns_slots());
    assert!(!Action::Send(ControlMsg::SwitchOver { tcp_bytes_sent: 3 }).returns_slots());
    assert!(!Action::Teardown.returns_slots());
    // What a receiver actually emits: after 32 messages of a 64-slot pair, a credit that
    // returns them.
    let (mut a, mut b) = open(16, 64, Config::default());
    for _ in 0..32 {
        let g = a.send(1).unwrap();
        assert_eq!(g.len, 1);
        for act in flow(&mut a, &mut b).unwrap() {
            assert!(!act.returns_slots());
        }
        if let Recv::Ring { len, .. } = b.recv() {
            b.consume(len).unwrap();
        }
    }
    let acts: Vec<Action> = std::iter::from_fn(|| b.poll_action()).collect();
    assert!(acts.iter().any(Action::returns_slots), "{acts:?}");
}

/// A proof with another key: what a forger or a squatter has (it never saw the token).
fn forged() -> Proof {
    match proof() {
        Proof::Bound { tuple, .. } => Proof::Bound {
            key: BindingKey::from_random([0xa5; 16]),
            tuple,
        },
        Proof::Native => unreachable!(),
    }
}

#[test]
fn a_request_that_cannot_prove_the_binding_is_not_accepted() {
    let now = Instant::now();
    let cfg = Config::default();
    // A forger's request (its own key) for the connection: the server refuses it.
    let (_f, forged_req) =
        Connection::connect(cfg, local(A_RING, 12, 4), &forged(), 1, 2, 3, 0, now).unwrap();
    assert_eq!(
        Connection::accept(cfg, local(B_RING, 12, 4), &forged_req, &proof(), 0, now).err(),
        Some(ConfigError::Unproven)
    );
    // The same request for another 4-tuple (the real key, another connection's ports).
    let other = match proof() {
        Proof::Bound { key, tuple } => Proof::Bound {
            key,
            tuple: TcpTuple {
                client: "10.0.0.1:1235".parse().unwrap(),
                ..tuple
            },
        },
        Proof::Native => unreachable!(),
    };
    let (_o, other_req) =
        Connection::connect(cfg, local(A_RING, 12, 4), &other, 1, 2, 3, 0, now).unwrap();
    assert!(Connection::accept(cfg, local(B_RING, 12, 4), &other_req, &proof(), 0, now).is_err());
    // A native request where a TCP connection is named, and a bound one at a native listener.
    let (_n, native_req) =
        Connection::connect(cfg, local(A_RING, 12, 4), &Proof::Native, 1, 2, 3, 0, now).unwrap();
    assert!(native_req.is_native());
    assert!(Connection::accept(cfg, local(B_RING, 12, 4), &native_req, &proof(), 0, now).is_err());
    let (_r, real_req) =
        Connection::connect(cfg, local(A_RING, 12, 4), &proof(), 1, 2, 3, 0, now).unwrap();
    assert!(
        Connection::accept(cfg, local(B_RING, 12, 4), &real_req, &Proof::Native, 0, now).is_err()
    );
    // Natively, both ends agree.
    let (mut a, _) =
        Connection::connect(cfg, local(A_RING, 12, 4), &Proof::Native, 1, 2, 3, 0, now).unwrap();
    let (_b, reply) = Connection::accept(
        cfg,
        local(B_RING, 12, 4),
        &native_req,
        &Proof::Native,
        0,
        now,
    )
    .unwrap();
    a.handle_accept(&reply.encode()).unwrap();
}

#[test]
fn a_reply_that_cannot_prove_the_binding_leaves_the_client_on_tcp() {
    let now = Instant::now();
    let cfg = Config::default();
    // A squatter answers the real client's request with a reply under a key of its own.
    let (mut a, req, _q, mut reply) = exchange(cfg, &proof(), now);
    reply = reply.bound(&BindingKey::from_random([0xa5; 16]), &req.tag);
    assert_eq!(
        a.handle_accept(&reply.encode()),
        Err(ErrorReason::Handshake(HandshakeError::Unproven))
    );
    assert!(a.can_fall_back(), "nothing was committed: TCP goes on");
    assert_eq!(a.send(1), Err(SendError::ViaTcp));
    // A native reply to a bound request proves nothing either.
    let (mut a, _, _q, reply) = exchange(cfg, &proof(), now);
    let native = AcceptReply {
        flags: Flags::NATIVE,
        tag: Tag::ZERO,
        ..reply
    };
    assert_eq!(
        a.handle_accept(&native.encode()),
        Err(ErrorReason::Handshake(HandshakeError::Unproven))
    );
    assert!(a.can_fall_back());
}

// ----- switching back to TCP (protocol §8.5) ----------------------------------------------------

/// `a` sends `n` bytes on the ring (accepted and posted), `b` receives them.
fn ring_bytes(a: &mut Connection, b: &mut Connection, n: usize) {
    let g = a.send(n).unwrap();
    assert_eq!(g.len, n);
    flow(a, b).unwrap();
}

#[test]
fn switch_back_returns_both_directions_at_the_read_cursors() {
    let (mut a, mut b) = open(12, 8, Config::default());
    ring_bytes(&mut a, &mut b, 100);
    ring_bytes(&mut b, &mut a, 50);
    // b's application read 30 of a's 100 bytes; a's read all 50 of b's.
    b.consume(30).unwrap();
    a.consume(50).unwrap();
    // a accepted 10 more bytes it has not posted yet.
    assert_eq!(a.send(10).unwrap().len, 10);
    a.switch_back().unwrap();
    assert!(a.switching_back());
    assert_eq!(a.state(), StreamState::Switching);
    assert_eq!(
        a.send(1),
        Err(SendError::WouldBlock),
        "nothing before the continuation"
    );
    assert_eq!(a.recv(), Recv::Tcp { limit: None });
    let r = a.readiness();
    assert!(r.read_via_tcp && !r.writable && !r.write_via_tcp);

    let out = flow(&mut a, &mut b).unwrap();
    assert_eq!(
        out,
        vec![Action::Send(ControlMsg::SwitchBack {
            ring_bytes: 100,
            read_cursor: 50
        })],
        "no data after the switch back started"
    );
    assert!(b.switching_back(), "the peer joins in");
    let out = flow(&mut b, &mut a).unwrap();
    assert!(out.contains(&Action::Send(ControlMsg::SwitchBack {
        ring_bytes: 50,
        read_cursor: 30
    })));
    assert!(out.contains(&Action::Teardown));
    assert_eq!(teardowns(&mut a), 1);
    // a goes on from b's read cursor: 70 posted and 10 unposted bytes, then new ones.
    assert_eq!(
        a.resume_due(),
        Some(Resume::Write {
            cursor: 30,
            len: 80
        })
    );
    assert_eq!(a.send(1), Err(SendError::WouldBlock));
    a.resumed(80);
    assert_eq!(a.resume_due(), None);
    assert!(a.switched_back());
    assert_eq!(a.send(1), Err(SendError::ViaTcp));
    // b read everything of a's stream: nothing to send again.
    assert_eq!(b.resume_due(), None);
    assert!(b.switched_back());
    for c in [&a, &b] {
        assert_eq!(c.state(), StreamState::Closed);
        assert_eq!(c.recv(), Recv::Tcp { limit: None });
        let r = c.readiness();
        assert!(r.read_via_tcp && r.write_via_tcp && !r.hup && !r.error);
    }
}

#[test]
fn switch_back_after_shutdown_shuts_tcp_after_the_continuation() {
    let (mut a, mut b) = open(12, 8, Config::default());
    ring_bytes(&mut a, &mut b, 20);
    a.shutdown_write().unwrap();
    flow(&mut a, &mut b).unwrap();
    b.switch_back().unwrap();
    settle(&mut a, &mut b);
    // b read none of a's 20 bytes: a sends them again on TCP, then shuts TCP down.
    assert_eq!(a.resume_due(), Some(Resume::Write { cursor: 0, len: 20 }));
    a.resumed(20);
    assert_eq!(a.resume_due(), Some(Resume::ShutdownWrite));
    a.resumed_shutdown();
    assert!(a.switched_back() && b.switched_back());
    assert_eq!(b.recv(), Recv::Tcp { limit: None });
}

#[test]
fn switch_back_before_switch_over_is_posted() {
    let (mut a, mut b) = established(12, 8, Config::default());
    a.commit_switch(7).unwrap();
    assert_eq!(a.send(5).unwrap().len, 5);
    a.switch_back().unwrap();
    assert!(
        a.commit_switch(7).is_err(),
        "no second switch while switching back"
    );
    let (from_a, _) = settle(&mut a, &mut b);
    assert!(
        !from_a
            .iter()
            .any(|x| matches!(x, Action::Send(ControlMsg::SwitchOver { .. }))),
        "the pending SwitchOver is dropped"
    );
    // b never saw a switch: a's 5 staged bytes follow its 7 TCP bytes on TCP.
    assert_eq!(a.resume_due(), Some(Resume::Write { cursor: 0, len: 5 }));
    assert_eq!(b.rx_state(), RxState::Tcp { received: 0 });
}

#[test]
fn switch_back_needs_an_established_peer_that_announced_it() {
    let (mut a, _b) = established(12, 8, Config::default());
    assert!(a.peer_can_switch_back());
    let (mut c, req, _b, reply) = exchange(Config::default(), &proof(), Instant::now());
    assert_eq!(c.switch_back(), Err(SwitchBackError::NotEstablished));
    a.close();
    assert_eq!(a.switch_back(), Err(SwitchBackError::Ended));

    // A reply without the flag (an older peer): no switch back with it.
    assert!(req.flags.contains(Flags::SWITCH_BACK));
    let Proof::Bound { key, .. } = proof() else {
        unreachable!()
    };
    let old = AcceptReply {
        flags: Flags::empty(),
        ..reply
    }
    .bound(&key, &req.tag);
    c.handle_accept(&old.encode()).unwrap();
    assert!(!c.peer_can_switch_back());
    assert_eq!(c.switch_back(), Err(SwitchBackError::Unsupported));
}

#[test]
fn peer_close_before_its_switch_back_is_read_from_the_ring() {
    let (mut a, mut b) = open(12, 8, Config::default());
    ring_bytes(&mut b, &mut a, 40);
    a.consume(10).unwrap();
    a.switch_back().unwrap();
    // b closes before it sees a's SwitchBack: it will send no continuation.
    b.close();
    flow(&mut b, &mut a).unwrap();
    assert!(!a.switching_back(), "the switch back is off");
    assert_eq!(
        a.recv(),
        Recv::Ring {
            gen: 0,
            offset: 10,
            len: 30
        }
    );
    a.consume(30).unwrap();
    assert_eq!(a.recv(), Recv::Eof);
    assert_eq!(a.send(1), Err(SendError::PeerClosed));
}

#[test]
fn tcp_eof_while_switching_back_waits_for_certainty() {
    let (mut a, mut b) = open(12, 8, Config::default());
    ring_bytes(&mut b, &mut a, 40);
    a.switch_back().unwrap();
    flow(&mut a, &mut b).unwrap();
    // The peer's TCP ended, but its SwitchBack has not arrived: 40 bytes may be its
    // continuation's or lost with a vanished peer. Not EOF yet.
    a.handle_tcp_eof().unwrap();
    assert_eq!(a.recv(), Recv::WouldBlock);
    assert!(!a.readiness().readable);
    flow(&mut b, &mut a).unwrap();
    assert!(a.switched_back());
    assert!(matches!(a.recv(), Recv::Eof));
}

#[test]
fn switch_back_violations() {
    // Declares more ring bytes than arrived.
    let (mut a, mut b) = open(12, 8, Config::default());
    ring_bytes(&mut b, &mut a, 10);
    let bad = ControlMsg::SwitchBack {
        ring_bytes: 11,
        read_cursor: 0,
    };
    let r = deliver(&Action::Send(bad), &mut a);
    expect_violation(
        &mut a,
        r,
        Violation::SwitchBackCursorMismatch {
            declared: 11,
            received: 10,
        },
    );
    // A read cursor beyond what we posted.
    let (mut a, mut b) = open(12, 8, Config::default());
    ring_bytes(&mut a, &mut b, 10);
    let bad = ControlMsg::SwitchBack {
        ring_bytes: 0,
        read_cursor: 11,
    };
    let r = deliver(&Action::Send(bad), &mut a);
    expect_violation(
        &mut a,
        r,
        Violation::SwitchBackReadCursor {
            declared: 11,
            acked: 0,
            posted: 10,
        },
    );
    // Twice.
    let (mut a, _b) = open(12, 8, Config::default());
    a.switch_back().unwrap();
    let once = ControlMsg::SwitchBack {
        ring_bytes: 0,
        read_cursor: 0,
    };
    deliver(&Action::Send(once), &mut a).unwrap();
    let (mut a, _b) = open(12, 8, Config::default());
    deliver(&Action::Send(once), &mut a).unwrap();
    let r = deliver(&Action::Send(once), &mut a);
    expect_violation(&mut a, r, Violation::DuplicateSwitchBack);
}

#[test]
fn native_streams_never_switch_back() {
    let now = Instant::now();
    let cfg = Config::default();
    let (mut a, req, mut b, reply) = exchange(cfg, &Proof::Native, now);
    assert!(!req.flags.contains(Flags::SWITCH_BACK));
    a.handle_accept(&reply.encode()).unwrap();
    b.handle_established();
    assert_eq!(a.switch_back(), Err(SwitchBackError::Unsupported));
    let msg = ControlMsg::SwitchBack {
        ring_bytes: 0,
        read_cursor: 0,
    };
    let r = deliver(&Action::Send(msg), &mut b);
    expect_violation(&mut b, r, Violation::UnannouncedSwitchBack);
}

// ----- ring moves (§6.5) -------------------------------------------------------------------------

fn moves() -> Config {
    Config {
        ring_moves: true,
        ..Config::default()
    }
}

fn ring(addr: u64, log2: u8) -> RingDesc {
    RingDesc {
        addr,
        rkey: 9,
        size: RingSize::from_log2(log2).unwrap(),
    }
}

/// A step by step move of `a`'s writes to a larger ring `b` offers: the bytes before the move
/// in the old ring, the ones after it in the new one, each read from the right ring; the old
/// staging and ring go back once nothing can touch them.
#[test]
fn a_move_step_by_step() {
    let (mut a, mut b) = open(12, 8, moves());
    assert!(a.ring_moves() && b.ring_moves());
    // 3000 bytes accepted on a's side, not yet written
    assert_eq!(a.send(3000).unwrap().len, 3000);
    // b asks for nothing; it offers a 16 KiB ring (generation 1)
    assert_eq!(b.offer_ring(ring(0x9000, 14)), Ok(1));
    assert_eq!(b.offer_ring(ring(0xa000, 14)), Err(OfferError::Busy));
    assert!(b.offer_outstanding());
    let offer = b.poll_action().unwrap();
    assert!(matches!(offer, Action::Send(ControlMsg::RingOffer { .. })));
    deliver(&offer, &mut a).unwrap();
    // a asks its transport for a staging area; until it has one, nothing moves
    assert_eq!(
        a.poll_action(),
        Some(Action::NewStaging {
            gen: 1,
            size: RingSize::from_log2(14).unwrap()
        })
    );
    assert_eq!(
        a.send(2000).unwrap().len,
        1096,
        "still the old ring's space"
    );
    assert!(a.staging_ready(1));
    assert!(!a.staging_ready(1), "once");
    // the move is at 4096 (what was accepted): those bytes go to the old ring, then RingMoved
    let w = a.poll_action().unwrap();
    let Action::WriteData {
        cursor: 0,
        len: 4096,
        gen: 0,
        remote_addr: B_RING,
        rkey: 7,
        ..
    } = w
    else {
        panic!("{w:?}")
    };
    let moved = a.poll_action().unwrap();
    assert_eq!(moved, Action::Send(ControlMsg::RingMoved { at: 4096 }));
    // the new ring's space counts from the move: 16 KiB more
    assert_eq!(a.send(20_000).unwrap().len, 16384);
    let w = a.poll_action().unwrap();
    let Action::WriteData {
        cursor: 4096,
        len: 16384,
        gen: 1,
        ring_offset: 4096,
        remote_addr: 0xa000,
        rkey: 9,
        ..
    } = w
    else {
        panic!("{w:?}")
    };
    for act in [w_old(), moved, w] {
        deliver(&act, &mut b).unwrap();
    }
    // b reads the old ring's bytes, then the new ring's
    assert_eq!(
        b.recv(),
        Recv::Ring {
            gen: 0,
            offset: 0,
            len: 4096
        }
    );
    b.consume(4000).unwrap();
    b.consume(96).unwrap();
    assert_eq!(b.poll_action(), Some(Action::ReleaseRing { gen: 0 }));
    assert_eq!(
        b.recv(),
        Recv::Ring {
            gen: 1,
            offset: 4096,
            len: 16384
        }
    );
    b.consume(16384).unwrap();
    // b's credits reach a: its old staging goes
    let (from_b, from_a) = {
        let (x, y) = settle(&mut b, &mut a);
        (x, y)
    };
    assert!(from_b
        .iter()
        .any(|x| matches!(x, Action::WriteCredit { .. })));
    assert!(
        from_a.contains(&Action::ReleaseStaging { gen: 0 }),
        "{from_a:?}"
    );
    assert_eq!((a.stats().moves_out, b.stats().moves_in), (1, 1));
    // and another move may begin
    assert_eq!(b.offer_ring(ring(0xb000, 12)), Ok(2));

    fn w_old() -> Action {
        Action::WriteData {
            cursor: 0,
            len: 4096,
            gen: 0,
            ring_offset: 0,
            remote_addr: B_RING,
            rkey: 7,
            imm: Imm::Data {
                len: 4096,
                credit_wanted: false,
            },
        }
    }
}

/// A move to a smaller ring on a quiet stream (a grown ring given back): the few bytes before
/// the move are below every credit threshold, yet once read they are credited at once, so the
/// writer's old staging area goes and the next move may begin — on a stream that then stays
/// idle no lazy credit would ever come.
#[test]
fn a_moves_cursor_is_credited_once_read_whatever_the_threshold() {
    let (mut a, mut b) = open(14, 8, moves());
    assert_eq!(a.send(100).unwrap().len, 100);
    let w = a.poll_action().unwrap();
    assert!(matches!(w, Action::WriteData { len: 100, .. }), "{w:?}");
    deliver(&w, &mut b).unwrap();
    assert_eq!(b.offer_ring(ring(0x9000, 12)), Ok(1));
    let (_, from_a) = settle(&mut b, &mut a);
    let size = RingSize::from_log2(12).unwrap();
    assert!(
        from_a.contains(&Action::NewStaging { gen: 1, size }),
        "{from_a:?}"
    );
    assert!(a.staging_ready(1));
    let (from_b, from_a) = settle(&mut b, &mut a);
    assert!(from_a.contains(&Action::Send(ControlMsg::RingMoved { at: 100 })));
    assert!(
        !from_b
            .iter()
            .any(|x| matches!(x, Action::WriteCredit { .. })),
        "nothing read yet: nothing owed ({from_b:?})"
    );
    assert_eq!(b.offer_ring(ring(0xa000, 12)), Err(OfferError::Busy));
    // the application reads the 100 bytes: far below a 16 KiB ring's threshold
    b.consume(100).unwrap();
    let (from_b, from_a) = settle(&mut b, &mut a);
    assert!(
        from_b.contains(&Action::ReleaseRing { gen: 0 }),
        "{from_b:?}"
    );
    assert!(
        from_b.iter().any(|x| matches!(
            x,
            Action::WriteCredit {
                imm: Imm::Credit { bytes: 100, .. },
                ..
            }
        )),
        "the move's cursor credited: {from_b:?}"
    );
    assert!(
        from_a.contains(&Action::ReleaseStaging { gen: 0 }),
        "{from_a:?}"
    );
    assert_eq!(b.rx_cursors().size(), size);
    assert_eq!(b.offer_ring(ring(0xb000, 14)), Ok(2), "the move is over");
}

/// Ring move messages a side must refuse: any of them when moves were not both announced, a
/// second offer while one is under way, a RingMoved without an offer or at the wrong cursor.
#[test]
fn ring_move_violations() {
    let offer = |c: &mut Connection| {
        c.handle_completion(Completion::Recv {
            payload: ControlMsg::RingOffer {
                ring: ring(0x9000, 13),
            }
            .encode()
            .as_bytes(),
        })
    };
    let moved = |c: &mut Connection, at: u64| {
        c.handle_completion(Completion::Recv {
            payload: ControlMsg::RingMoved { at }.encode().as_bytes(),
        })
    };
    // not announced (one side alone announcing is `sim_pair`'s `ring_moves_need_both_sides`)
    let (mut a, mut b) = open(12, 8, Config::default());
    assert!(!a.ring_moves());
    assert_eq!(a.offer_ring(ring(0x9000, 13)), Err(OfferError::Unsupported));
    let r = offer(&mut b);
    expect_violation(&mut b, r, Violation::UnannouncedRingMove);
    // a second offer while the first is not answered
    let (mut a, _b) = open(12, 8, moves());
    offer(&mut a).unwrap();
    let r = offer(&mut a);
    expect_violation(&mut a, r, Violation::RingOfferDuringMove);
    // a RingMoved without an offer
    let (mut a, _b) = open(12, 8, moves());
    let r = moved(&mut a, 0);
    expect_violation(&mut a, r, Violation::UnexpectedRingMoved);
    // at a cursor that is not the end of what came
    let (_a, mut b) = open(12, 8, moves());
    b.offer_ring(ring(0x9000, 13)).unwrap();
    assert!(matches!(
        b.poll_action(),
        Some(Action::Send(ControlMsg::RingOffer { .. }))
    ));
    let r = moved(&mut b, 10);
    expect_violation(
        &mut b,
        r,
        Violation::RingMovedCursorMismatch {
            declared: 10,
            received: 0,
        },
    );
    // a RingWanted is a wish: it changes nothing until this side offers
    let (_a, mut b) = open(12, 8, moves());
    let size = RingSize::from_log2(15).unwrap();
    b.handle_completion(Completion::Recv {
        payload: ControlMsg::RingWanted { size }.encode().as_bytes(),
    })
    .unwrap();
    assert_eq!(b.ring_wanted(), Some(size));
    b.offer_ring(ring(0x9000, 15)).unwrap();
    assert_eq!(b.ring_wanted(), None);
}

// ----- connection kinds ----------------------------------------------------------------------

fn read_pull() -> Config {
    Config {
        kind: Kind::Read,
        ring_moves: true,
        ..Config::default()
    }
}

fn source(addr: u64, log2: u8) -> RingDesc {
    RingDesc {
        addr,
        rkey: 9,
        size: RingSize::from_log2(log2).unwrap(),
    }
}

fn control(c: &mut Connection, m: ControlMsg) -> Result<(), ErrorReason> {
    c.handle_completion(Completion::Recv {
        payload: m.encode().as_bytes(),
    })
}

/// A reply may choose only the kind its request offered, and one at most: else the client
/// refuses it (`Unoffered`), before anything of the connection is used.
#[test]
fn a_reply_chooses_only_the_kind_offered() {
    let now = Instant::now();
    for (offer, flag, chosen) in [
        (Kind::WriteImm, Flags::READ, Kind::Read),
        (Kind::Sends, Flags::READ, Kind::Read),
        (Kind::Read, Flags::SENDS, Kind::Sends),
        (Kind::WriteImm, Flags::RECORDS, Kind::Records),
        (Kind::Records, Flags::SENDS, Kind::Sends),
    ] {
        let cfg = Config {
            kind: offer,
            ..Config::default()
        };
        let (mut a, _req, _b, mut reply) = exchange(cfg, &Proof::Native, now);
        reply.flags = reply.flags.with(flag);
        assert_eq!(
            a.handle_accept(&reply.encode()),
            Err(ErrorReason::Handshake(HandshakeError::Unoffered(chosen))),
            "{offer:?} answered with {flag:?}"
        );
        assert!(a.can_fall_back());
    }
    // (a reply choosing the kind offered and another besides)
    let (mut a, _req, _b, mut reply) = exchange(read_pull(), &Proof::Native, now);
    assert!(reply.flags.contains(Flags::READ));
    reply.flags = reply.flags.with(Flags::SENDS);
    assert!(matches!(
        a.handle_accept(&reply.encode()),
        Err(ErrorReason::Handshake(HandshakeError::Unoffered(_)))
    ));
}

/// READ pull, asked for by both: neither takes part in ring moves; the Source is the first
/// message once the transport gave it, and a DATA waits for it; the receiver's pulls land at
/// its ring's next bytes, after those still being pulled, inside the credit.
#[test]
fn read_pull_sends_its_source_first_and_takes_no_moves() {
    let (mut a, mut b) = established(12, 8, read_pull());
    assert_eq!((a.kind(), b.kind()), (Kind::Read, Kind::Read));
    assert!(a.read() && b.read() && !a.sends());
    assert!(!a.ring_moves() && !b.ring_moves());
    assert!(a.peer_can_switch_back() && a.fails_over());
    a.commit_switch(0).unwrap();
    b.commit_switch(0).unwrap();
    let g = a.send(100).unwrap();
    assert_eq!(g.len, 100);
    let acts: Vec<_> = std::iter::from_fn(|| a.poll_action()).collect();
    assert!(
        !acts.iter().any(|x| matches!(x, Action::WriteData { .. })),
        "a DATA before the Source: {acts:?}"
    );
    for x in &acts {
        deliver(x, &mut b).unwrap();
    }
    let src = source(0x5000, 12);
    a.set_source(src);
    a.set_source(source(0x6000, 12)); // (the first one stands)
    let acts: Vec<_> = std::iter::from_fn(|| a.poll_action()).collect();
    assert_eq!(
        acts.first(),
        Some(&Action::Send(ControlMsg::Source { ring: src }))
    );
    assert!(
        matches!(
            acts.get(1),
            Some(Action::WriteData {
                len: 100,
                ring_offset: 0,
                ..
            })
        ),
        "{acts:?}"
    );
    deliver(&acts[0], &mut b).unwrap();
    assert_eq!(b.peer_source(), Some(src));
    let at = |b: &Connection, ahead, len| b.landing_after(ahead, len).map(|p| p.offset);
    assert_eq!(at(&b, 0, 100), Some(0));
    assert_eq!(at(&b, 100, 50), Some(100));
    assert_eq!(at(&b, 4000, 96), Some(4000));
    assert_eq!(at(&b, 4000, 97), None, "past the credit");
    deliver(&acts[1], &mut b).unwrap();
    assert_eq!(b.rx_cursors().head(), 100);
    assert_eq!(at(&b, 0, 10), Some(100));
    // (a kind's Source means nothing elsewhere: set_source is ignored)
    let (mut c, _d) = open(12, 8, Config::default());
    c.set_source(src);
    assert!(!std::iter::from_fn(|| c.poll_action())
        .any(|x| matches!(x, Action::Send(ControlMsg::Source { .. }))));
}

/// What a peer of READ pull can get wrong: a Source on another kind or twice, of the wrong
/// size, and a DATA before its Source.
#[test]
fn read_pull_violations() {
    let src = source(0x5000, 12);
    let (_a, mut b) = open(12, 8, Config::default());
    let r = control(&mut b, ControlMsg::Source { ring: src });
    expect_violation(&mut b, r, Violation::UnexpectedSource);
    let (_a, mut b) = open(12, 8, read_pull());
    let r = b.handle_completion(data_imm(10, false));
    expect_violation(&mut b, r, Violation::DataBeforeSource);
    let (_a, mut b) = open(12, 8, read_pull());
    let r = control(
        &mut b,
        ControlMsg::Source {
            ring: source(0x5000, 13),
        },
    );
    expect_violation(
        &mut b,
        r,
        Violation::SourceSize {
            declared: 8192,
            ring: 4096,
        },
    );
    let (_a, mut b) = open(12, 8, read_pull());
    control(&mut b, ControlMsg::Source { ring: src }).unwrap();
    b.handle_completion(data_imm(10, false)).unwrap();
    let r = control(&mut b, ControlMsg::Source { ring: src });
    expect_violation(&mut b, r, Violation::UnexpectedSource);
}

/// READ pull: the peer may pull a side's bytes until it handled that side's last message, so
/// an end (or a SwitchBack) is credited at once — even by a peer that closed meanwhile — and a
/// side counts that credit after its own close: only then is it done with its staging area.
#[test]
fn read_pull_credits_an_end_at_once() {
    let (mut a, mut b) = open(12, 8, read_pull());
    a.set_source(source(0x5000, 12));
    b.set_source(source(0x6000, 12));
    settle(&mut a, &mut b);
    assert!(a.peer_pulled() && b.peer_pulled(), "nothing ended yet");
    a.shutdown_write().unwrap();
    flow(&mut a, &mut b).unwrap();
    assert!(!a.peer_pulled(), "its ShutdownWrite is not confirmed yet");
    let back = flow(&mut b, &mut a).unwrap();
    assert!(
        back.iter().any(|x| matches!(
            x,
            Action::WriteCredit { .. } | Action::Send(ControlMsg::CreditUpdate { .. })
        )),
        "no credit at once: {back:?}"
    );
    assert!(a.peer_pulled());
    // b ends too: it is Closed (both ends went) before its end's credit comes
    b.shutdown_write().unwrap();
    let out: Vec<_> = std::iter::from_fn(|| b.poll_action()).collect();
    assert!(out.contains(&Action::Teardown));
    assert_eq!(b.state(), StreamState::Closed);
    assert!(!b.peer_pulled());
    for x in &out {
        deliver(x, &mut a).unwrap();
    }
    // a, Closed by b's end, credits it before its own teardown
    let out: Vec<_> = std::iter::from_fn(|| a.poll_action()).collect();
    assert_eq!(a.state(), StreamState::Closed);
    assert_eq!(out.last(), Some(&Action::Teardown), "{out:?}");
    for x in &out {
        deliver(x, &mut b).unwrap();
    }
    assert!(b.peer_pulled(), "a credit after the close counts");
    // (on other kinds nothing waits)
    let mut c = cleanly_closed();
    assert!(c.peer_pulled());
    assert_eq!(teardowns(&mut c), 1);
}

/// A ping-pong's turn: `from` reads what is waiting for it (so it owes those bytes and that
/// receive), answers with 64 bytes, and they reach `to`; returns what `from` posted.
fn answer(from: &mut Connection, to: &mut Connection) -> Vec<Action> {
    if let Recv::Ring { len, .. } = from.recv() {
        from.consume(len).unwrap();
    }
    from.send(64).unwrap();
    flow(from, to).unwrap()
}

/// Duplex: in a ping-pong, each answer returns the bytes of the message it answers, and the
/// receives they took in batches of the slot threshold; no credit goes apart, however low the
/// thresholds; a DATA with credit on another kind is a violation.
#[test]
fn duplex_answers_carry_the_credit() {
    let cfg = Config {
        kind: Kind::Duplex,
        credit_byte_shift: 8,
        credit_slot_threshold: Some(1),
        ..Config::default()
    };
    let (mut a, mut b) = open(12, 8, cfg);
    assert_eq!((a.kind(), b.kind()), (Kind::Duplex, Kind::Duplex));
    let before = (a.stats().credits_sent, b.stats().credits_sent);
    for round in 0..50 {
        let (from, to) = if round % 2 == 0 {
            (&mut a, &mut b)
        } else {
            (&mut b, &mut a)
        };
        let out = answer(from, to);
        assert_eq!(out.len(), 1, "round {round}: one message, {out:?}");
        match out[0] {
            // (the first two: no credit yet, or the set-up's receives with the first)
            Action::WriteData { imm, .. } if round < 2 => {
                assert!(matches!(imm, Imm::Data { .. } | Imm::DataCredit { .. }))
            }
            Action::WriteData {
                imm:
                    Imm::DataCredit {
                        len: 64,
                        units: 1,
                        slots: 0 | 2,
                        ..
                    },
                ..
            } => {}
            ref x => panic!("round {round}: {x:?}"),
        }
    }
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!(sa.credits_sent - before.0, sa.credits_piggybacked);
    assert_eq!(sb.credits_sent - before.1, sb.credits_piggybacked);
    assert!(sa.credits_piggybacked >= 24 && sb.credits_piggybacked >= 24);
    // (a credit that does not fit a DATA goes apart: 100 bytes owed are no whole unit)
    if let Recv::Ring { len, .. } = b.recv() {
        b.consume(len).unwrap();
    }
    a.send(100).unwrap();
    flow(&mut a, &mut b).unwrap();
    b.consume(100).unwrap();
    b.send(10).unwrap();
    let out = flow(&mut b, &mut a).unwrap();
    assert!(
        matches!(
            out[..],
            [
                Action::WriteCredit { .. },
                Action::WriteData {
                    imm: Imm::Data { .. },
                    ..
                }
            ]
        ),
        "{out:?}"
    );
    // on another kind
    let (_a, mut b) = open(12, 8, Config::default());
    let imm = Imm::DataCredit {
        len: 8,
        credit_wanted: false,
        units: 1,
        slots: 0,
    };
    let r = b.handle_completion(Completion::WriteImm {
        imm: imm.encode(),
        byte_len: Some(8),
    });
    expect_violation(&mut b, r, Violation::UnannouncedDuplex);
}

/// Duplex with the default thresholds: a 64 B ping-pong of 300 rounds sends no credit as a
/// message of its own — the read that makes one due is followed by the answer that carries it
/// (over WRITE WITH IMMEDIATE the same ping-pong sends one every 32 messages, each posted on
/// the answer's path before the answer).
#[test]
fn a_duplex_ping_pong_sends_no_credit_apart() {
    for kind in [Kind::Duplex, Kind::WriteImm] {
        let cfg = Config {
            kind,
            ..Config::default()
        };
        let (mut a, mut b) = open(16, 64, cfg);
        let before = (a.stats(), b.stats());
        for round in 0..300 {
            let (from, to) = if round % 2 == 0 {
                (&mut a, &mut b)
            } else {
                (&mut b, &mut a)
            };
            answer(from, to);
        }
        let apart = |s: Stats, s0: Stats| {
            (s.credits_sent - s.credits_piggybacked) - (s0.credits_sent - s0.credits_piggybacked)
        };
        let (sa, sb) = (a.stats(), b.stats());
        let n = apart(sa, before.0) + apart(sb, before.1);
        match kind {
            Kind::Duplex => {
                assert_eq!(n, 0, "credits apart over duplex");
                assert!(sa.credits_piggybacked >= 140 && sb.credits_piggybacked >= 140);
            }
            _ => assert!(n >= 8, "{n} credits apart over WRITE WITH IMMEDIATE"),
        }
    }
}
