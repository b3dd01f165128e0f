//! RDMA tier: the non-blocking link API the preload shim drives ([`Dialer`],
//! [`UpgradeListener`], [`Incoming`], [`Link`]), both ends in one thread and one poll loop.
//!
//! - a dial and an accept complete; each side commits its switch after pretending to have sent
//!   some bytes on TCP, the other side is told to read exactly those from TCP first, then 8 MiB
//!   go each way through the rings in random chunks; then small messages go back and forth
//!   while the receiver sleeps in poll(2) on its armed completion channel (the write's
//!   completion must wake it); both close cleanly;
//! - a dial to a port nobody listens on fails fast;
//! - the request carries the TCP client port given to the dialer, the listener sees the
//!   dialer's address, and a rejection's reason reaches the dialer.

mod support;

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use rdmashim_core::link::SOFTWARE_ACK_TIMEOUT;
use rdmashim_core::verbs::poll_fds;
use rdmashim_core::{DialError, DialStatus, Dialer, Link, StreamConfig, UpgradeListener};
use rdmashim_proto::{
    BindingKey, ConnectRequest, Proof, Recv, RejectReason, SendError, StreamState, TcpTuple,
};
use sha2::{Digest, Sha256};

/// Upper bound for each phase (the VM is emulated and slow).
const PHASE: Duration = Duration::from_secs(120);
const TOTAL: usize = 8 << 20;
const MAX_CHUNK: usize = 256 << 10;

fn cfg() -> StreamConfig {
    StreamConfig {
        ring_size: 256 << 10, // smaller than the data: the rings wrap many times
        ..StreamConfig::default()
    }
}

/// This host's RDMA address with port 0: the dialer's source.
fn src() -> Option<SocketAddr> {
    Some(SocketAddr::new(support::ip(), 0))
}

/// The binding of a test connection from TCP port `client_port` to `dst`: what the shim's
/// token gives both ends (here both ends simply agree on it).
fn proof(client_port: u16, dst: SocketAddr) -> Proof {
    proof_with([0x5a; 16], client_port, dst)
}

fn proof_with(key: [u8; 16], client_port: u16, dst: SocketAddr) -> Proof {
    Proof::Bound {
        key: BindingKey::from_random(key),
        tuple: TcpTuple {
            client: SocketAddr::new(support::ip(), client_port),
            server: dst,
        },
    }
}

/// The request `dialer`'s dial makes at `listener` (the dial still pending meanwhile).
fn next_request(listener: &UpgradeListener, dialer: &mut Dialer) -> rdmashim_core::Incoming {
    let deadline = Instant::now() + PHASE;
    loop {
        if let Some(i) = listener.next().expect("next") {
            return i;
        }
        assert!(matches!(dialer.poll(0), DialStatus::Pending));
        assert!(Instant::now() < deadline, "no request came");
        sleep_on(&[listener.fd(), dialer.fd()], Duration::from_millis(100));
    }
}

/// Sleeps in `poll(2)` on `fds` for at most `timeout` (at least 1 ms).
fn sleep_on(fds: &[RawFd], timeout: Duration) {
    let ms = timeout.as_millis().clamp(1, 1000) as i32;
    poll_fds(fds, ms).expect("poll");
}

/// Runs a dial to completion, sleeping on its fd between polls.
fn finish_dial(dialer: &mut Dialer) -> Result<Link, DialError> {
    loop {
        match dialer.poll(0) {
            DialStatus::Pending => {
                let left = dialer.deadline().saturating_duration_since(Instant::now());
                sleep_on(&[dialer.fd()], left);
            }
            DialStatus::Connected(link) => return Ok(link),
            DialStatus::Failed(e) => return Err(e),
        }
    }
}

/// What the listener saw of the dial.
struct Seen {
    request: ConnectRequest,
    source: Option<SocketAddr>,
}

/// Dials `dst` and accepts at `listener` in one loop; returns (client, server, what the
/// listener saw) once both links are past the handshake.
fn connect_pair(
    listener: &UpgradeListener,
    dst: SocketAddr,
    client_port: u16,
) -> (Link, Link, Seen) {
    connect_pair_with(listener, dst, client_port, &cfg())
}

/// [`connect_pair`] with both ends configured by `cfg`.
fn connect_pair_with(
    listener: &UpgradeListener,
    dst: SocketAddr,
    client_port: u16,
    cfg: &StreamConfig,
) -> (Link, Link, Seen) {
    let cfg = *cfg;
    let mut dialer = Dialer::start(src(), dst, client_port, proof(client_port, dst), &cfg)
        .expect("Dialer::start");
    let deadline = Instant::now() + PHASE;
    let (mut client, mut server, mut seen) = (None, None::<Link>, None);
    loop {
        if client.is_none() {
            match dialer.poll(0) {
                DialStatus::Pending => {}
                DialStatus::Connected(link) => client = Some(link),
                DialStatus::Failed(e) => panic!("dial failed: {e}"),
            }
        }
        if server.is_none() {
            if let Some(incoming) = listener.next().expect("UpgradeListener::next") {
                seen = Some(Seen {
                    request: *incoming.request(),
                    source: incoming.source(),
                });
                let p = proof(incoming.request().client_port, dst);
                server = Some(incoming.accept(&cfg, 0, &p).expect("Incoming::accept"));
            }
        }
        if let Some(s) = server.as_mut() {
            s.progress(true);
            if let Some(r) = s.conn().error() {
                panic!("server handshake failed: {}", s.error_for(r));
            }
        }
        let server_up = server
            .as_ref()
            .is_some_and(|s| s.conn().state() != StreamState::Handshaking);
        if client.is_some() && server_up {
            break;
        }
        assert!(Instant::now() < deadline, "the handshake took too long");
        let mut fds = vec![listener.fd()];
        if client.is_none() {
            fds.push(dialer.fd());
        }
        if let Some(s) = server.as_ref() {
            fds.push(s.cm_fd());
        }
        sleep_on(&fds, Duration::from_millis(100));
    }
    // Spent: it must not take the link's events from the channel they now share.
    assert!(matches!(dialer.poll(0), DialStatus::Failed(_)));
    (client.unwrap(), server.unwrap(), seen.unwrap())
}

/// One end of the data exchange.
struct End {
    name: &'static str,
    link: Link,
    rng: StdRng,
    data: Vec<u8>,
    sent: usize,
    /// TCP bytes the peer said it sent before switching (what we must read from TCP first).
    tcp_expected: u64,
    tcp_read: bool,
    received: usize,
    hash: Sha256,
}

impl End {
    fn new(name: &'static str, link: Link, seed: u64, tcp_expected: u64) -> End {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut data = vec![0u8; TOTAL];
        rng.fill_bytes(&mut data);
        End {
            name,
            link,
            rng,
            data,
            sent: 0,
            tcp_expected,
            tcp_read: false,
            received: 0,
            hash: Sha256::new(),
        }
    }

    /// One round of what a shim's data path does: drive, send a random chunk, read what is
    /// readable, drive. Returns whether anything moved.
    fn step(&mut self) -> bool {
        let mut moved = self.link.progress(false);
        if self.sent < TOTAL {
            let n = self.rng.gen_range(1..=MAX_CHUNK).min(TOTAL - self.sent);
            match self.link.conn_mut().send(n) {
                Ok(g) => {
                    self.link
                        .stage(g.cursor, &self.data[self.sent..self.sent + g.len]);
                    self.sent += g.len;
                    moved = true;
                }
                Err(SendError::WouldBlock) => {}
                Err(e) => panic!("{}: send: {e}", self.name),
            }
        }
        loop {
            match self.link.conn().recv() {
                Recv::Tcp { limit: Some(l) } => {
                    assert!(!self.tcp_read, "{}: told to read TCP twice", self.name);
                    assert_eq!(l, self.tcp_expected, "{}: TCP bytes to read", self.name);
                    // (the shim would read them from the socket now)
                    self.link
                        .conn_mut()
                        .note_tcp_read(l)
                        .expect("note_tcp_read");
                    self.tcp_read = true;
                    moved = true;
                }
                Recv::Tcp { limit: None } => {
                    // The peer's SwitchOver is on its way.
                    assert!(
                        !self.tcp_read,
                        "{}: back to TCP after the switch",
                        self.name
                    );
                    break;
                }
                Recv::Ring { gen, offset, len } => {
                    assert!(
                        self.tcp_read,
                        "{}: ring bytes before the TCP bytes",
                        self.name
                    );
                    self.hash.update(self.link.ring(gen, offset, len));
                    self.received += len;
                    self.link.conn_mut().consume(len).expect("consume");
                    moved = true;
                }
                Recv::WouldBlock => break,
                Recv::TcpControl { .. } => panic!("{}: failed over to TCP", self.name),
                Recv::Eof => panic!("{}: EOF after {} bytes", self.name, self.received),
                Recv::Error(r) => panic!("{}: {}", self.name, self.link.error_for(r)),
            }
        }
        moved | self.link.progress(false)
    }
}

/// Sends `msg` from `tx` while `rx` sleeps in `poll(2)` on its armed completion channel: the
/// completion of the write must wake it (never the 5 s timeout).
fn wake_on_data(tx: &mut Link, rx: &mut Link, msg: &[u8]) {
    rx.arm();
    rx.progress(false); // look once more after arming
    let g = tx
        .conn_mut()
        .send(msg.len())
        .expect("ring space for a message");
    assert_eq!(g.len, msg.len());
    tx.stage(g.cursor, msg);
    tx.progress(false);
    let mut got = Vec::new();
    while got.len() < msg.len() {
        if let Recv::Ring { gen, offset, len } = rx.conn().recv() {
            got.extend_from_slice(rx.ring(gen, offset, len));
            rx.conn_mut().consume(len).expect("consume");
            continue;
        }
        let ready = poll_fds(&[rx.comp_fd()], 5000).expect("poll");
        assert_eq!(ready, 1, "the completion raised no event on the armed CQ");
        rx.take_events();
        rx.arm();
        rx.progress(false);
        tx.progress(false);
    }
    assert_eq!(got, msg);
}

/// Arms both links, looks once more, and sleeps on their fds (until the earliest timer) if
/// that saw nothing; then takes the channel events. Returns whether it slept.
fn idle(ends: &mut [&mut Link]) -> bool {
    let mut any = false;
    for l in ends.iter_mut() {
        l.arm();
        any |= l.progress(false);
    }
    if any {
        return false;
    }
    let now = Instant::now();
    let timeout = ends
        .iter()
        .filter_map(|l| l.next_timer())
        .map(|t| t.saturating_duration_since(now))
        .min()
        .unwrap_or(Duration::from_secs(1));
    let fds: Vec<RawFd> = ends.iter().flat_map(|l| [l.comp_fd(), l.cm_fd()]).collect();
    sleep_on(&fds, timeout);
    for l in ends.iter_mut() {
        l.take_events();
        l.progress(true);
    }
    true
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn dial_accept_switch_and_stream_both_ways_then_close() {
    let _ = support::device();
    let dst = support::addr(9);
    let listener = UpgradeListener::bind(dst).expect("UpgradeListener::bind");
    let (client, server, _) = connect_pair(&listener, dst, 41000);
    assert_eq!(client.conn().state(), StreamState::Switching);
    assert_eq!(server.conn().state(), StreamState::Switching);

    // The client "sent" 5 bytes on TCP before switching, the server 7.
    let mut c = End::new("client", client, 1, 7);
    let mut s = End::new("server", server, 2, 5);
    c.link.conn_mut().commit_switch(5).expect("client commit");
    s.link.conn_mut().commit_switch(7).expect("server commit");

    let deadline = Instant::now() + PHASE;
    let mut sleeps = 0;
    while c.sent < TOTAL || s.sent < TOTAL || c.received < TOTAL || s.received < TOTAL {
        assert!(
            Instant::now() < deadline,
            "stuck: client sent {} received {}, server sent {} received {}",
            c.sent,
            c.received,
            s.sent,
            s.received
        );
        let moved = c.step() | s.step();
        if !moved && idle(&mut [&mut c.link, &mut s.link]) {
            sleeps += 1;
        }
    }
    assert!(c.tcp_read && s.tcp_read);
    assert_eq!(c.received, TOTAL);
    assert_eq!(s.received, TOTAL);
    let digest = |d: &[u8]| Sha256::digest(d).to_vec();
    assert_eq!(
        s.hash.clone().finalize().to_vec(),
        digest(&c.data),
        "client → server"
    );
    assert_eq!(
        c.hash.clone().finalize().to_vec(),
        digest(&s.data),
        "server → client"
    );
    eprintln!("8 MiB each way; the loop slept {sleeps} times");

    for i in 0..10u8 {
        let msg: Vec<u8> = (0..100u8).map(|b| b ^ i).collect();
        wake_on_data(&mut c.link, &mut s.link, &msg);
        wake_on_data(&mut s.link, &mut c.link, &msg);
    }

    c.link.conn_mut().close();
    s.link.conn_mut().close();
    let deadline = Instant::now() + PHASE;
    while !(c.link.is_disconnected() && s.link.is_disconnected()) {
        assert!(Instant::now() < deadline, "the close did not finish");
        let moved = c.link.progress(false) | s.link.progress(false);
        if !moved {
            idle(&mut [&mut c.link, &mut s.link]);
        }
    }
    for e in [&c, &s] {
        assert_eq!(
            e.link.conn().error(),
            None,
            "{}: {:?}",
            e.name,
            e.link.failure()
        );
        assert_eq!(e.link.conn().state(), StreamState::Closed, "{}", e.name);
    }
}

/// `StreamConfig::ack_timeout` reaches both ends' queue pairs (`rdma_set_option` before the
/// connect and the accept; read back with `ibv_query_qp`); left at 0, a software device (the
/// tier's soft-RoCE) gets `SOFTWARE_ACK_TIMEOUT` instead of rdma_cm's (the path's packet
/// lifetime + 1: 17 or 19 on RoCE, by kernel).
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn the_configured_ack_timeout_is_the_queue_pairs() {
    let _ = support::device();
    let dst = support::addr(13);
    let listener = UpgradeListener::bind(dst).expect("UpgradeListener::bind");
    let (client, server, _) = connect_pair(&listener, dst, 41201);
    assert_eq!(client.ack_timeout(), Some(SOFTWARE_ACK_TIMEOUT), "client");
    assert_eq!(server.ack_timeout(), Some(SOFTWARE_ACK_TIMEOUT), "server");
    drop((client, server));
    for t in [14, 21] {
        let c = StreamConfig {
            ack_timeout: t,
            ..cfg()
        };
        let (client, server, _) = connect_pair_with(&listener, dst, 41202 + u16::from(t), &c);
        assert_eq!(client.ack_timeout(), Some(t), "client");
        assert_eq!(server.ack_timeout(), Some(t), "server");
    }
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn dial_to_a_port_without_listener_fails_fast() {
    let _ = support::device();
    let dst = support::addr(10);
    let t0 = Instant::now();
    let mut dialer =
        Dialer::start(src(), dst, 41001, proof(41001, dst), &cfg()).expect("Dialer::start");
    let e = finish_dial(&mut dialer).expect_err("nobody listens there");
    let took = t0.elapsed();
    assert!(
        matches!(e, DialError::Rejected(_) | DialError::Unreachable(_)),
        "{e:?}"
    );
    assert!(took < Duration::from_secs(3), "took {took:?}");
    // The dialer is spent.
    assert!(matches!(dialer.poll(0), DialStatus::Failed(_)));
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn request_names_the_tcp_port_and_the_dialer_and_rejects_reach_it() {
    let _ = support::device();
    let dst = support::addr(11);
    let listener = UpgradeListener::bind(dst).expect("UpgradeListener::bind");

    // Rejected with a reason, and dropped unanswered: the dialer learns why.
    for (port, reason) in [
        (41002, Some(RejectReason::NoMatchingTcp)),
        (41003, None), // dropped: Resources
    ] {
        let mut dialer =
            Dialer::start(src(), dst, port, proof(port, dst), &cfg()).expect("Dialer::start");
        let incoming = next_request(&listener, &mut dialer);
        assert_eq!(incoming.request().client_port, port);
        assert_eq!(incoming.request().server_port, dst.port());
        assert_eq!(
            incoming.source().map(|a| a.ip()),
            Some(support::ip()),
            "source"
        );
        match reason {
            Some(r) => incoming.reject(r),
            None => drop(incoming),
        }
        let e = finish_dial(&mut dialer).expect_err("rejected");
        let want = reason.unwrap_or(RejectReason::Resources);
        assert!(
            matches!(e, DialError::Rejected(Some(r)) if r == want),
            "{e:?}"
        );
    }

    // And accepted: the client's link and what the listener saw agree.
    let (client, server, seen) = connect_pair(&listener, dst, 41004);
    assert_eq!(seen.request.client_port, 41004);
    assert_eq!(seen.source.map(|a| a.ip()), Some(support::ip()));
    assert_eq!(
        seen.source,
        client.local_addr(),
        "the rdma_cm address of the client"
    );
    assert_eq!(server.peer_addr(), client.local_addr());
    assert_eq!(client.conn().state(), StreamState::Switching);
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn a_request_that_cannot_prove_the_binding_is_rejected_unproven() {
    let _ = support::device();
    let dst = support::addr(12);
    let listener = UpgradeListener::bind(dst).expect("UpgradeListener::bind");
    // A forger's request for TCP port 41010: right ports, a key of its own (it never read
    // the connection's token), and a native request naming the same connection.
    for forged in [
        proof_with([0xa5; 16], 41010, dst),
        proof_with([0x5a; 16], 41011, dst), // the real key, another connection's port
        Proof::Native,
    ] {
        let mut dialer = Dialer::start(src(), dst, 41010, forged, &cfg()).expect("Dialer::start");
        let incoming = next_request(&listener, &mut dialer);
        assert_eq!(incoming.request().client_port, 41010);
        let e = incoming
            .accept(&cfg(), 0, &proof(41010, dst))
            .expect_err("a forged request is never accepted");
        assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
        let e = finish_dial(&mut dialer).expect_err("rejected");
        assert!(
            matches!(e, DialError::Rejected(Some(RejectReason::Unproven))),
            "{e:?}"
        );
    }
    // The real client, after all that, still upgrades.
    let (client, _server, seen) = connect_pair(&listener, dst, 41010);
    assert_eq!(seen.request.client_port, 41010);
    assert_eq!(client.conn().state(), StreamState::Switching);
}
