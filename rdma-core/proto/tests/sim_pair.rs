//! A simulated pair of connections (quinn's `Pair::drive`, adapted): two `Connection`s, each
//! with an in-memory receive ring (writes wrap modulo the size, as the double mapping makes
//! them contiguous), an in-memory staging area, a receive queue with a finite number of posted
//! receives, a TCP byte queue per direction, and in-order (RC) message queues. A seeded random
//! schedule interleaves application writes and reads of random sizes, the switch-over, message
//! deliveries, transport pumping, shutdowns and TCP closes; a deterministic drain phase then
//! runs everything to quiescence.
//!
//! Checked on every run:
//! * each application reads exactly the other's byte stream (no loss, duplication, reordering),
//!   TCP bytes first up to the SwitchOver count, then ring bytes;
//! * no RDMA write lands on bytes the receiving application has not consumed (checked against
//!   the simulator's own count, not the protocol's), and no message arrives without a posted
//!   receive (RNR);
//! * the staging area, indexed by stream cursor modulo the peer ring size, still holds the right
//!   bytes when the "HCA" reads them at delivery time;
//! * with ring moves (§6.5: both sides announce them in about half the runs), each side offers
//!   rings of random sizes at random points and asks for them: every write goes to the ring of
//!   its generation at the right address and key, never over unread bytes of that ring, from a
//!   staging area that is still there; every read comes from a ring that is still there; a
//!   staging area or ring is given back only once nothing can touch it (a later touch fails);
//! * with records (§14: each side offers them in about half the runs, and they are used when
//!   both do), a record's WRITE lands a few bytes at a time in address order, the reader
//!   polling the ring between the pieces: it never takes a record before its last byte landed;
//!   a WRITE without an immediate takes no receive; a reader that found nothing may go to sleep
//!   (`prepare_sleep`), after which it polls nothing until a completion wakes it — a lost
//!   wake-up leaves bytes unread and the run deadlocks;
//! * with sends (§15: offered by either side in about a quarter of the runs, used when both
//!   do), a DATA is never longer than one receive, and the receiver's core places it exactly
//!   where the sender's staged it (the transport copies it there);
//! * with READ pull (§16: offered by either side in about a fifth of the runs, used when both
//!   do), a DATA is an announcement the receiver's transport pulls later (a random number of
//!   steps later, every message after it held back until it is handed over): its bytes are
//!   read from the sender's staging area at pull time, at the place the receiver's core named
//!   when it came (`landing_after`), from the Source the sender sent first; a sender that
//!   tore down may have disconnected only once `peer_pulled` (never while a pull of its
//!   bytes is still to come);
//! * with duplex (§17: in about a fifth of the runs), a DATA returns the credit its sender
//!   owes when all of it fits, and a credit waits for such a DATA instead of going apart;
//! * both ends reach EOF and `Closed`, each emits `Teardown` exactly once, and no run deadlocks.

use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

use proptest::prelude::*;
use rdmashim_proto::*;

mod common;
use common::proof;

/// SplitMix64: a tiny deterministic generator for the schedule.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below((hi - lo + 1) as u64) as usize
    }
}

/// How an application ends its side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Finish {
    /// After writing everything: shutdown(SHUT_WR); after reading EOF: close().
    ShutdownThenClose,
    /// After writing everything and reading EOF: close() (without a shutdown first).
    CloseAfterEof,
    /// Never switches its sending side; after writing everything (on TCP) and reading EOF:
    /// close(), which tears the ring down and closes TCP.
    NeverSwitchClose,
}

#[derive(Clone, Debug)]
struct SideParams {
    ring_log2: u8,
    recv_slots: u16,
    stream_len: usize,
    /// Commit the switch once this many bytes were written (clamped to the stream length).
    commit_at: usize,
    max_chunk: usize,
    max_read: usize,
    cfg: Config,
    finish: Finish,
}

#[derive(Clone, Debug)]
struct Scenario {
    seed: u64,
    a: SideParams,
    b: SideParams,
    random_steps: usize,
    /// A aborts (SO_LINGER 0 close) after this many random steps.
    abort_at: Option<usize>,
    /// Relative weight of the three handshake events in the random schedule (low: the upgrade
    /// finishes late, after much TCP traffic).
    handshake_weight: u64,
    /// Side 0 (A) or 1 (B) returns the connection to TCP from this random step on (as soon as
    /// the protocol lets it); with `both`, the other side starts one too, a few steps later.
    switch_back: Option<(usize, usize, bool)>,
    /// The path between the queue pairs dies once this many events happened: each side's
    /// messages in flight arrive up to a random point, the rest never; each side learns of it
    /// at a random later step (a failed work request, the CM, or its peer's continuation on
    /// TCP). TCP carries on.
    path_fail: Option<usize>,
}

/// What a receiving transport of READ pull holds back (§16): an announcement whose bytes it
/// is still pulling, and every message that came after one.
#[derive(Debug)]
enum Held {
    Pull(Msg),
    After(Msg),
}

#[derive(Debug)]
enum Msg {
    Write {
        cursor: u64,
        gen: u32,
        ring_offset: usize,
        remote_addr: u64,
        rkey: u32,
        len: usize,
        /// A plain WRITE (a record's) makes no completion and takes no receive.
        imm: Option<Imm>,
        /// A record: its payload's length (its bytes land piecemeal).
        record: Option<u64>,
    },
    Credit {
        imm: Imm,
    },
    Send(Vec<u8>),
}

/// A receive ring of one generation.
struct SimRing {
    bytes: Vec<u8>,
    desc: RingDesc,
    /// Its first stream cursor (`u64::MAX` while offered and not moved to).
    start: u64,
}

struct Endpoint {
    name: &'static str,
    p: SideParams,
    conn: Option<Connection>,
    /// rdma-core's link would post this side's next DATA by `Connection::poll_data` alone:
    /// its last pass of the core's actions reached the DATA's branch, and the core has been
    /// changed since only by sends, completions and consumes that did not stir it (checked
    /// against `poll_action` at every pump: `Sim::pump`).
    lane: bool,
    /// Receive rings by generation (given back ones are gone).
    rings: BTreeMap<u32, SimRing>,
    ring_desc: RingDesc,
    /// Staging areas by generation.
    stagings: BTreeMap<u32, Vec<u8>>,
    /// Rings offered and wanted so far (bounded, so that runs end).
    offers: u32,
    wants: u32,
    /// A staging area made for a move, not yet reported ready.
    staging_due: Option<u32>,
    posted_recvs: u32,
    /// DATA completions this side's core took by its DATA lane (each checked against its
    /// general path: [`complete`]).
    data_lanes: u64,
    /// Writes rdma-core's link would make by the core's write lane (`send_data`, checked
    /// against `send` and the DATA's branch: `Sim::app_write`).
    send_lanes: u64,
    /// Receives whose completion was handled and that the transport posts again only before
    /// its next credit that returns slots (rdma-core's `Endpoint::repost_recv`).
    deferred_recvs: u32,
    out_stream: Vec<u8>,
    out_pos: usize,
    tcp_sent: u64,
    committed: bool,
    shut_called: bool,
    close_called: bool,
    in_stream: Vec<u8>,
    tcp_read: u64,
    ring_consumed: u64,
    eof: bool,
    teardowns: u32,
    /// Messages posted by this endpoint, in order (the RC queue towards the peer).
    outbound: VecDeque<Msg>,
    /// TCP bytes written by this endpoint, not yet read by the peer.
    tcp_out: VecDeque<u8>,
    tcp_closed: bool,
    /// The TCP connection was closed with an RST (after an abort).
    tcp_reset: bool,
    tcp_eof_seen: bool,
    aborted: bool,
    /// The link's close timeout passed after its teardown (`Link::drive_teardown`: it
    /// disconnects then whatever the peer pulled); fired only when nothing else can move.
    close_timed_out: bool,
    /// The error the application saw (abort scenarios only).
    failed: Option<ErrorReason>,
    /// This side asked for a switch back to TCP.
    back_asked: bool,
    /// The CM reported DISCONNECTED (the peer destroyed its queue pair).
    disconnected: bool,
    /// Records: the reader sleeps (its notice is out or queued) until a completion comes.
    asleep: bool,
    /// Records delivered to this side and not read whole, oldest first: (ring bytes,
    /// payload bytes) — the simulator's own count of what the reader frees.
    records_in: VecDeque<(u64, u64)>,
    /// Payload bytes of the first of `records_in` read so far.
    record_read: u64,
    /// Records this side posted, and how many of them with an immediate.
    records_out: u64,
    records_imm: u64,
    /// The longest DATA this side posted.
    longest_data: usize,
    /// READ pull: the messages this side's transport holds back, in arrival order.
    held: VecDeque<Held>,
    /// READ pull: announcements this side pulled.
    pulls: u64,
}

impl Endpoint {
    fn new(name: &'static str, p: SideParams, addr: u64, rng: &mut Rng) -> Self {
        let size = RingSize::from_log2(p.ring_log2).unwrap();
        let out_stream = (0..p.stream_len).map(|_| rng.next() as u8).collect();
        let ring_desc = RingDesc {
            addr,
            rkey: 0x1000 + addr as u32,
            size,
        };
        let first = SimRing {
            bytes: vec![0xEE; size.bytes() as usize],
            desc: ring_desc,
            start: 0,
        };
        Endpoint {
            name,
            rings: BTreeMap::from([(0, first)]),
            ring_desc,
            stagings: BTreeMap::new(),
            offers: 0,
            wants: 0,
            staging_due: None,
            posted_recvs: u32::from(p.recv_slots),
            data_lanes: 0,
            send_lanes: 0,
            deferred_recvs: 0,
            out_stream,
            out_pos: 0,
            tcp_sent: 0,
            committed: false,
            shut_called: false,
            close_called: false,
            in_stream: Vec::new(),
            tcp_read: 0,
            ring_consumed: 0,
            eof: false,
            teardowns: 0,
            outbound: VecDeque::new(),
            tcp_out: VecDeque::new(),
            tcp_closed: false,
            tcp_reset: false,
            tcp_eof_seen: false,
            aborted: false,
            close_timed_out: false,
            failed: None,
            back_asked: false,
            disconnected: false,
            asleep: false,
            lane: false,
            records_in: VecDeque::new(),
            record_read: 0,
            records_out: 0,
            records_imm: 0,
            longest_data: 0,
            held: VecDeque::new(),
            pulls: 0,
            conn: None,
            p,
        }
    }

    /// READ pull: the staging area's description the transport gives its core (the sim's
    /// staging areas have no address of their own: one is made up per side).
    fn source(&self, size: RingSize) -> RingDesc {
        RingDesc {
            addr: self.ring_desc.addr + 0x0800_0000,
            rkey: 0x2000 + self.ring_desc.addr as u32,
            size,
        }
    }

    /// READ pull: the bytes of the announcements held back and not pulled yet.
    fn pulling(&self) -> u64 {
        self.held
            .iter()
            .map(|h| match h {
                Held::Pull(Msg::Write { len, .. }) => *len as u64,
                _ => 0,
            })
            .sum()
    }

    fn local(&self) -> LocalParams {
        LocalParams {
            ring: self.ring_desc,
            recv_slots: self.p.recv_slots,
        }
    }

    /// The connection went back to TCP (or is going): the ring is no longer this side's way.
    fn back(&self) -> bool {
        self.conn
            .as_ref()
            .is_some_and(|c| c.switching_back() || c.switched_back() || c.resume_due().is_some())
    }

    /// The upgrade is established and has neither failed nor finished.
    fn established(&self) -> bool {
        self.conn.as_ref().is_some_and(|c| {
            matches!(
                c.state(),
                StreamState::Switching
                    | StreamState::Open
                    | StreamState::LocalShut
                    | StreamState::PeerShut
            )
        })
    }

    fn commit_point(&self) -> usize {
        match self.p.finish {
            Finish::NeverSwitchClose => usize::MAX,
            _ => self.p.commit_at.min(self.out_stream.len()),
        }
    }

    fn app_done_writing(&self) -> bool {
        self.out_pos == self.out_stream.len()
    }

    /// Everything this application had to do is done.
    fn app_finished(&self) -> bool {
        self.aborted
            || self.failed.is_some()
            || (self.app_done_writing() && self.eof && self.close_called)
    }
}

/// [`common::complete`], counting in `lanes` the DATA the lane took.
fn complete(
    conn: &mut Connection,
    c: Completion<'_>,
    who: &str,
    lanes: &mut u64,
) -> Result<(), ErrorReason> {
    let (r, lane) = common::complete(conn, c, who);
    *lanes += u64::from(lane);
    r
}

struct Sim {
    /// Each side's `lane` before the current step (a step leaves it set only where it
    /// changed the side's core in none but those ways).
    lanes_before: [bool; 2],
    /// Passes at which a side's lane was checked against `poll_action`.
    lane_checks: u64,
    rng: Rng,
    a: Endpoint,
    b: Endpoint,
    now: Instant,
    request: Option<Vec<u8>>,
    reply: Option<Vec<u8>>,
    server_cm_established: bool,
    progress: u64,
    handshake_weight: u64,
    /// Applications end their sides (shutdown/close); off for the idle test.
    finishing: bool,
    /// Readers of records go to sleep when they find nothing (else they spin).
    sleeping: bool,
    /// Errors are expected (abort scenarios).
    expect_failure: bool,
    abort_at: Option<usize>,
    switch_back: Option<(usize, usize, bool)>,
    /// Some side switched back: TCP carried more than the SwitchOver counts.
    went_back: bool,
    path_fail: Option<usize>,
    /// The path died; which sides learned of it.
    path_dead: bool,
    qp_error_seen: [bool; 2],
}

/// Picks (this, peer) by index.
fn pair(sim: &mut Sim, i: usize) -> (&mut Endpoint, &mut Endpoint) {
    if i == 0 {
        (&mut sim.a, &mut sim.b)
    } else {
        (&mut sim.b, &mut sim.a)
    }
}

impl Sim {
    fn new(sc: &Scenario) -> Self {
        let mut rng = Rng(sc.seed);
        let a = Endpoint::new("A", sc.a.clone(), 0x1000_0000, &mut rng);
        let b = Endpoint::new("B", sc.b.clone(), 0x2000_0000, &mut rng);
        let mut sim = Sim {
            lanes_before: [false; 2],
            lane_checks: 0,
            rng,
            a,
            b,
            now: Instant::now(),
            request: None,
            reply: None,
            server_cm_established: false,
            progress: 0,
            handshake_weight: sc.handshake_weight,
            finishing: true,
            sleeping: true,
            expect_failure: sc.abort_at.is_some(),
            abort_at: sc.abort_at,
            switch_back: sc.switch_back,
            went_back: false,
            path_fail: sc.path_fail,
            path_dead: false,
            qp_error_seen: [false; 2],
        };
        sim.expect_failure |= sc.path_fail.is_some();
        // The client starts the upgrade right after its TCP connect.
        let (conn, req) = Connection::connect(
            sim.a.p.cfg,
            sim.a.local(),
            &proof(),
            40000,
            6379,
            0xfeed_f00d,
            0,
            sim.now,
        )
        .unwrap();
        sim.a.conn = Some(conn);
        let mut padded = req.encode().to_vec();
        padded.resize(56, 0); // rdma_cm hands over the whole private-data area
        sim.request = Some(padded);
        sim
    }

    // ----- handshake events --------------------------------------------------------------------

    fn server_accept(&mut self) -> bool {
        if self.path_dead {
            return false;
        }
        let Some(bytes) = self.request.take() else {
            return false;
        };
        let req = ConnectRequest::decode(&bytes).expect("valid request");
        assert_eq!((req.client_port, req.server_port), (40000, 6379));
        let (conn, reply) = Connection::accept(
            self.b.p.cfg,
            self.b.local(),
            &req,
            &proof(),
            self.b.tcp_read,
            self.now,
        )
        .unwrap();
        self.b
            .stagings
            .insert(0, vec![0; req.ring.size.bytes() as usize]);
        let mut conn = conn;
        conn.set_source(self.b.source(req.ring.size));
        self.b.conn = Some(conn);
        let mut padded = reply.encode().to_vec();
        padded.resize(196, 0);
        self.reply = Some(padded);
        true
    }

    fn client_established(&mut self) -> bool {
        if self.path_dead {
            return false;
        }
        let Some(bytes) = self.reply.take() else {
            return false;
        };
        let conn = self.a.conn.as_mut().unwrap();
        if conn.state() != StreamState::Handshaking {
            // The client gave up (closed its cm_id) first: the server's CM reports the failure.
            self.b.conn.as_mut().unwrap().handle_transport_error();
            return true;
        }
        conn.handle_accept(&bytes).expect("accept reply");
        let size = conn.peer_ring().unwrap().size;
        self.a.stagings.insert(0, vec![0; size.bytes() as usize]);
        let source = self.a.source(size);
        self.a.conn.as_mut().unwrap().set_source(source);
        true
    }

    fn server_established(&mut self) -> bool {
        // The server's ESTABLISHED event comes after the client's.
        if self.server_cm_established || !self.a.established() || self.path_dead {
            return false;
        }
        self.server_cm_established = true;
        self.b.conn.as_mut().unwrap().handle_established();
        true
    }

    // ----- application -------------------------------------------------------------------------

    fn app_write(&mut self, i: usize) -> bool {
        let max_chunk = pair(self, i).0.p.max_chunk;
        let want = self.rng.range(1, max_chunk);
        let expect_failure = self.expect_failure;
        let lanes = self.lanes_before;
        let (me, _) = pair(self, i);
        if me.app_done_writing() || me.shut_called || me.close_called || me.app_finished() {
            return false;
        }
        let want = want.min(me.out_stream.len() - me.out_pos);
        if me
            .conn
            .as_ref()
            .is_some_and(|c| c.switched_back() || (c.failed_over() && c.resume_due().is_none()))
        {
            // A plain TCP connection now (after a failover, our direction is once its
            // continuation is written, whatever the peer's).
            let bytes = &me.out_stream[me.out_pos..me.out_pos + want];
            me.tcp_out.extend(bytes.iter().copied());
            me.out_pos += want;
            return true;
        }
        if !me.committed {
            if me.established() && !me.back() && me.out_pos >= me.commit_point() {
                me.conn
                    .as_mut()
                    .unwrap()
                    .commit_switch(me.tcp_sent)
                    .unwrap();
                me.committed = true;
                return true;
            }
            // The shim asks the protocol first; `ViaTcp` means: write to the socket.
            if let Some(c) = me.conn.as_mut() {
                match c.send(1) {
                    Err(SendError::ViaTcp) => assert_eq!(c.tx_state(), TxState::Tcp),
                    Err(SendError::WouldBlock) if c.switching_back() => return false,
                    Err(SendError::Failed(e)) if expect_failure => {
                        me.failed = Some(e);
                        return true;
                    }
                    r => panic!("{}: TCP write while the protocol says {r:?}", me.name),
                }
            }
            // Still on TCP: the kernel takes everything (an unbounded send buffer is fine here).
            let want = want.min(me.commit_point().saturating_sub(me.out_pos).max(1));
            let want = want.min(me.out_stream.len() - me.out_pos);
            let bytes = &me.out_stream[me.out_pos..me.out_pos + want];
            me.tcp_out.extend(bytes.iter().copied());
            me.out_pos += want;
            me.tcp_sent += want as u64;
            return true;
        }
        let conn = me.conn.as_mut().unwrap();
        conn.take_stirred();
        if lanes[i] {
            // rdma-core's link would write these bytes by `send_data` (its write's lane): it
            // must accept and post what `send` and then the DATA's branch alone would, and
            // leave the same core — or, refusing, leave the core as it was.
            let (mut by_lane, mut by_parts) = (conn.clone(), conn.clone());
            match by_lane.send_data(want) {
                Some(w) => {
                    me.send_lanes += 1;
                    let (g, a) = (
                        SendGrant {
                            cursor: w.cursor,
                            len: w.len,
                        },
                        w.action(),
                    );
                    assert_eq!(w.returns_slots(), a.returns_slots());
                    assert_eq!(by_parts.send(want), Ok(g), "{}: the write's lane", me.name);
                    assert!(
                        !by_parts.take_stirred(),
                        "{}: a lane's send stirred",
                        me.name
                    );
                    assert_eq!(
                        by_parts.poll_data(),
                        Some(a),
                        "{}: the write's lane",
                        me.name
                    );
                    assert!(
                        by_lane == by_parts,
                        "{}: the write's lane leaves another core than send and the DATA's branch:\n{by_lane:?}\n{by_parts:?}",
                        me.name
                    );
                }
                None => assert!(
                    by_lane == *conn,
                    "{}: the write's lane refused and changed the core",
                    me.name
                ),
            }
        }
        let sent = conn.send(want);
        if !conn.take_stirred() {
            // (bytes accepted whole leave the link's lane as it was: rdma-core's `Link::send`)
            me.lane = lanes[i];
        }
        match sent {
            Ok(g) => {
                for k in 0..g.len {
                    let at = conn.tx_place(g.cursor + k as u64).unwrap();
                    let staging = me.stagings.get_mut(&at.gen).expect("staging area exists");
                    assert_eq!(staging.len() as u64, at.size.bytes());
                    staging[at.offset] = me.out_stream[me.out_pos + k];
                }
                me.out_pos += g.len;
                g.len > 0
            }
            Err(SendError::WouldBlock) => false,
            Err(SendError::ViaTcp) if conn.switched_back() => false,
            Err(SendError::Failed(e)) if expect_failure => {
                me.failed = Some(e);
                true
            }
            Err(SendError::PeerClosed) if expect_failure => {
                // EPIPE: the application stops writing.
                me.out_pos = me.out_stream.len();
                true
            }
            Err(e) => panic!("{}: send failed: {e:?}", me.name),
        }
    }

    fn app_read(&mut self, i: usize) -> bool {
        let max_read = pair(self, i).0.p.max_read;
        let n_want = self.rng.range(1, max_read);
        let expect_failure = self.expect_failure;
        let lanes = self.lanes_before;
        let (me, peer) = pair(self, i);
        if me.eof || me.app_finished() {
            return false;
        }
        let Some(conn) = me.conn.as_mut() else {
            // Before the server's connection object exists: plain TCP reads.
            return read_tcp(me, peer, n_want as u64, None) || tcp_read_eof(me, peer, None);
        };
        if !me.asleep {
            // (a reader of records polls its ring; one asleep waits for a completion)
            poll_ring(conn, &me.rings, me.name, expect_failure);
        }
        match conn.recv() {
            Recv::Tcp { limit } if conn.switching_back() => {
                if read_tcp(me, peer, n_want as u64, limit) {
                    return true;
                }
                // read() returned 0: the protocol says whether that is the end yet.
                if peer.tcp_closed && !peer.tcp_reset && peer.tcp_out.is_empty() {
                    let c = me.conn.as_mut().unwrap();
                    c.handle_tcp_eof().unwrap();
                    if c.recv() == Recv::Eof {
                        me.eof = true;
                        return true;
                    }
                }
                false
            }
            Recv::Tcp { limit } => {
                read_tcp(me, peer, n_want as u64, limit) || tcp_read_eof(me, peer, limit)
            }
            Recv::TcpControl { len } => {
                let n = (n_want as u64).min(len).min(peer.tcp_out.len() as u64) as usize;
                if n == 0 {
                    // (EOF while the shim reads for itself: the protocol decides)
                    if peer.tcp_closed && !peer.tcp_reset && peer.tcp_out.is_empty() {
                        let c = me.conn.as_mut().unwrap();
                        if let Err(e) = c.handle_tcp_eof() {
                            assert!(expect_failure, "{}: {e}", me.name);
                            me.failed = Some(e);
                            return true;
                        }
                    }
                    return false;
                }
                let bytes: Vec<u8> = peer.tcp_out.drain(..n).collect();
                if let Err(e) = me.conn.as_mut().unwrap().tcp_control(&bytes) {
                    panic!("{}: failover continuation refused: {e}", me.name);
                }
                true
            }
            Recv::Ring { gen, offset, len } => {
                let n = n_want.min(len);
                let ring = me
                    .rings
                    .get(&gen)
                    .unwrap_or_else(|| panic!("{}: read from ring {gen}, given back", me.name));
                let size = ring.bytes.len();
                assert!(len <= size);
                for k in 0..n {
                    me.in_stream.push(ring.bytes[(offset + k) % size]);
                }
                let c = me.conn.as_mut().unwrap();
                // (as after a completion: a consume that did not stir a core with nothing due
                // leaves nothing due — rdma-core's `Link::consume`)
                c.take_stirred();
                let drained = c.clone().poll_action().is_none();
                c.consume(n).unwrap();
                let stirred = c.take_stirred();
                if !stirred && !c.records() {
                    // (a records reader polled its ring above: that changed its core)
                    me.lane = lanes[i];
                }
                if drained && !stirred {
                    let next = c.clone().poll_action();
                    assert_eq!(
                        next, None,
                        "{}: a consume the core called inert made an action due",
                        me.name
                    );
                }
                if c.records() {
                    // (a record's ring bytes are free once its payload is read whole)
                    me.record_read += n as u64;
                    let (bytes, payload) = me.records_in[0];
                    assert!(me.record_read <= payload, "{}: read past a record", me.name);
                    if me.record_read == payload {
                        me.records_in.pop_front();
                        me.record_read = 0;
                        me.ring_consumed += bytes;
                    }
                } else {
                    me.ring_consumed += n as u64;
                }
                true
            }
            Recv::WouldBlock => false,
            Recv::Eof => {
                me.eof = true;
                true
            }
            Recv::Error(e) if expect_failure => {
                me.failed = Some(e);
                true
            }
            Recv::Error(e) => panic!("{}: recv error {e:?}: {}", me.name, {
                let c = me.conn.as_ref().unwrap();
                format!(
                    "back {} rx {:?} tx {:?} eof {} peer tcp_closed {} peer teardowns {}",
                    me.back_asked,
                    c.rx_state(),
                    c.tx_state(),
                    me.tcp_eof_seen,
                    peer.tcp_closed,
                    peer.teardowns
                )
            }),
        }
    }

    fn app_finish(&mut self, i: usize) -> bool {
        let finishing = self.finishing;
        let expect_failure = self.expect_failure;
        let dead = self.path_dead;
        let (me, _) = pair(self, i);
        if !finishing || !me.app_done_writing() || me.app_finished() {
            return false;
        }
        if let Some(e) = me.conn.as_ref().and_then(|c| c.error()) {
            // shutdown()/close() on a failed connection: the application learns of the error.
            if !me.conn.as_ref().unwrap().can_fall_back() {
                assert!(expect_failure, "{}: {e}", me.name);
                me.failed = Some(e);
                return true;
            }
        }
        // (the path died before any handshake reached this side: nothing ever will, and its
        // connection is plain TCP — the shim's server counts `no_upgrade_request`; or the
        // peer fell back and ended TCP before this side committed: the stream ended, and
        // this side's direction never left TCP)
        let never_upgraded =
            dead && !me.committed
                && me.conn.as_ref().is_none_or(|c| {
                    c.state() == StreamState::Closed && c.tx_state() == TxState::Tcp
                });
        if never_upgraded
            || me
                .conn
                .as_ref()
                .is_some_and(|c| c.error().is_some() && c.can_fall_back())
        {
            // The upgrade failed before anything moved: plain TCP, the kernel's to end.
            if me.p.finish == Finish::ShutdownThenClose && !me.shut_called {
                me.shut_called = true;
                me.tcp_closed = true;
                return true;
            }
            if me.eof && !me.close_called {
                me.close_called = true;
                me.tcp_closed = true;
                return true;
            }
            return false;
        }
        if me.back() || me.conn.as_ref().is_some_and(|c| c.failed_over()) {
            let c = me.conn.as_mut().unwrap();
            if c.resume_due().is_some() {
                return false;
            }
            // (after a failover our direction is plain TCP once the continuation is out)
            let done = c.switched_back() || c.failed_over();
            if me.p.finish == Finish::ShutdownThenClose && !me.shut_called {
                // While switching back the protocol keeps the shutdown for the end of the
                // continuation; after it, it is the kernel's.
                c.shutdown_write().unwrap();
                if done {
                    me.tcp_closed = true;
                }
                me.shut_called = true;
                return true;
            }
            if me.eof && !me.close_called && done {
                c.close();
                me.close_called = true;
                return true;
            }
            return false;
        }
        match me.p.finish {
            Finish::ShutdownThenClose => {
                if !me.shut_called {
                    if !me.committed {
                        if !me.established() {
                            return false;
                        }
                        me.conn
                            .as_mut()
                            .unwrap()
                            .commit_switch(me.tcp_sent)
                            .unwrap();
                        me.committed = true;
                    }
                    me.conn.as_mut().unwrap().shutdown_write().unwrap();
                    me.shut_called = true;
                    let c = me.conn.as_mut().unwrap();
                    assert_eq!(c.send(1), Err(SendError::Shutdown));
                    assert!(c.is_writable(), "EPIPE must be reported as writable");
                    return true;
                }
                if me.eof && !me.close_called {
                    me.conn.as_mut().unwrap().close();
                    me.close_called = true;
                    return true;
                }
                false
            }
            Finish::CloseAfterEof | Finish::NeverSwitchClose => {
                if !me.eof || me.close_called {
                    return false;
                }
                if me.p.finish == Finish::CloseAfterEof && !me.committed {
                    if !me.established() {
                        return false;
                    }
                    me.conn
                        .as_mut()
                        .unwrap()
                        .commit_switch(me.tcp_sent)
                        .unwrap();
                    me.committed = true;
                }
                if !me.established() {
                    // The upgrade never got anywhere; nothing to do on the ring.
                    return false;
                }
                me.conn.as_mut().unwrap().close();
                me.close_called = true;
                true
            }
        }
    }

    // ----- transport ---------------------------------------------------------------------------

    fn pump(&mut self, i: usize) -> bool {
        let chunk = self.rng.range(1, 5000) as u64;
        let dead = self.path_dead;
        let lane = self.lanes_before[i];
        let mut checked = false;
        let (me, _) = pair(self, i);
        let Some(conn) = me.conn.as_mut() else {
            return false;
        };
        if let Some(r) = conn.resume_due() {
            // Back on TCP: the shim writes the continuation before any new byte (a piece at
            // a time, as a socket's free send space allows).
            match r {
                Resume::Record { bytes, len } => {
                    let n = (chunk as usize).min(len);
                    let from = bytes.len() - len;
                    me.tcp_out.extend(&bytes[from..from + n]);
                    conn.resumed_record(n);
                }
                Resume::Write { cursor, len } => {
                    // (a piece is of one staging area: a transport reads it in one go)
                    let place = |k: u64| conn.tx_place(k).unwrap().gen;
                    assert_eq!(place(cursor), place(cursor + len - 1), "{}", me.name);
                    let n = chunk.min(len);
                    for k in cursor..cursor + n {
                        let at = conn.tx_place(k).unwrap();
                        let staging = me.stagings.get(&at.gen).expect("staging area exists");
                        me.tcp_out.push_back(staging[at.offset]);
                    }
                    conn.resumed(n);
                }
                Resume::ShutdownWrite => {
                    me.tcp_closed = true;
                    conn.resumed_shutdown();
                }
            }
            return true;
        }
        if lane {
            checked = true;
            // rdma-core's link would take only the DATA's branch now (`Link::act`): it must
            // return, and leave, what a whole pass would.
            let (mut by_lane, mut by_pass) = (conn.clone(), conn.clone());
            let (x, y) = (by_lane.poll_data(), by_pass.poll_action());
            assert_eq!(
                x, y,
                "{}: the DATA's branch alone differs from a pass",
                me.name
            );
            assert!(
                by_lane == by_pass,
                "{}: the DATA's branch alone leaves another core than a pass:\n{by_lane:?}\n{by_pass:?}",
                me.name
            );
        }
        let mut any = false;
        while let Some(a) = conn.poll_action() {
            any = true;
            if matches!(a, Action::WriteData { .. }) && conn.nothing_after() {
                // (rdma-core's link polls no more after such a DATA, and takes the DATA's
                // branch alone for the next bytes sent)
                let mut copy = conn.clone();
                let next = copy.poll_action();
                assert_eq!(
                    next, None,
                    "{}: an action due after a DATA said to be the last",
                    me.name
                );
                assert!(
                    copy.reached_data(),
                    "{}: a pass after a DATA said to be the last stopped short of the DATA's branch",
                    me.name
                );
            }
            if dead && a != Action::Teardown {
                // (posted to a queue pair whose path is gone: it never arrives)
                continue;
            }
            // The deferred receives are posted before a credit that returns slots, and only
            // then (rdma-core's `Endpoint::post`).
            if a.returns_slots() {
                me.posted_recvs += std::mem::take(&mut me.deferred_recvs);
            }
            match a {
                Action::WriteData {
                    cursor,
                    len,
                    gen,
                    ring_offset,
                    remote_addr,
                    rkey,
                    imm,
                } => {
                    let at = conn.tx_place(cursor).unwrap();
                    assert_eq!((gen, ring_offset), (at.gen, at.offset));
                    assert_eq!(at.gen, conn.tx_place(cursor + len as u64 - 1).unwrap().gen);
                    assert!(len as u64 <= at.size.bytes() && len > 0);
                    if me.p.cfg.split_at_wrap {
                        assert!(ring_offset as u64 + len as u64 <= at.size.bytes());
                    }
                    me.longest_data = me.longest_data.max(len);
                    me.outbound.push_back(Msg::Write {
                        cursor,
                        gen,
                        ring_offset,
                        remote_addr,
                        rkey,
                        len,
                        imm: Some(imm),
                        record: None,
                    });
                }
                Action::WriteRecord {
                    cursor,
                    len,
                    gen,
                    ring_offset,
                    remote_addr,
                    rkey,
                    header,
                    trailer_at,
                    imm,
                } => {
                    assert!(conn.records(), "{}: a record without records", me.name);
                    let at = conn.tx_place(cursor).unwrap();
                    assert_eq!((gen, ring_offset), (at.gen, at.offset));
                    assert!(
                        cursor % 8 == 0 && len % 8 == 0 && len >= 24,
                        "{cursor} {len}"
                    );
                    assert!(len as u64 <= at.size.bytes() && trailer_at == len - 8);
                    let payload = header as u32 as usize;
                    assert_eq!(len, 16 + payload.div_ceil(8) * 8, "{header:#x}");
                    // The transport puts the header and the trailer around the staged payload.
                    let staging = me.stagings.get_mut(&gen).expect("staging area exists");
                    let ssize = staging.len();
                    for (k, b) in header.to_le_bytes().into_iter().enumerate() {
                        staging[(at.offset + k) % ssize] = b;
                        staging[(at.offset + trailer_at + k) % ssize] = b;
                    }
                    me.records_out += 1;
                    me.records_imm += u64::from(imm.is_some());
                    me.outbound.push_back(Msg::Write {
                        cursor,
                        gen,
                        ring_offset,
                        remote_addr,
                        rkey,
                        len,
                        imm,
                        record: Some(u64::from(header as u32)),
                    });
                }
                Action::Doorbell { remote_addr, imm } => {
                    assert!(conn.records(), "{}: a doorbell without records", me.name);
                    assert_eq!(remote_addr, conn.peer_ring().unwrap().addr);
                    assert_eq!(imm, Imm::Wake);
                    me.outbound.push_back(Msg::Credit { imm });
                }
                Action::NewStaging { gen, size } => {
                    // (made at once, or later: `staging_ready`)
                    let old = me.stagings.insert(gen, vec![0; size.bytes() as usize]);
                    assert!(old.is_none(), "{}: staging {gen} twice", me.name);
                    me.staging_due = Some(gen);
                }
                Action::ReleaseStaging { gen } => {
                    assert!(
                        me.stagings.remove(&gen).is_some(),
                        "{}: staging {gen}",
                        me.name
                    );
                }
                Action::ReleaseRing { gen } => {
                    assert!(me.rings.remove(&gen).is_some(), "{}: ring {gen}", me.name);
                }
                Action::WriteCredit { remote_addr, imm } => {
                    assert_eq!(remote_addr, conn.peer_ring().unwrap().addr);
                    me.outbound.push_back(Msg::Credit { imm });
                }
                Action::Send(m) => me
                    .outbound
                    .push_back(Msg::Send(m.encode().as_bytes().to_vec())),
                Action::Teardown => me.teardowns += 1,
            }
        }
        // (the pass ended with nothing to do: the link's lane is open if it reached the
        // DATA's branch)
        me.lane = conn.reached_data();
        self.lane_checks += u64::from(checked);
        any
    }

    /// The peer's HCA delivers one message from `i`'s outbound queue (into a posted receive;
    /// on READ pull its transport may hold it back: [`Self::pull`]).
    fn deliver(&mut self, i: usize) -> bool {
        if self.path_dead {
            return false;
        }
        let expect_failure = self.expect_failure;
        let (me, peer) = pair(self, i);
        let Some(msg) = me.outbound.pop_front() else {
            return false;
        };
        // A plain WRITE (a record's without an immediate) takes no receive.
        let completes = !matches!(msg, Msg::Write { imm: None, .. });
        if completes {
            assert!(
                peer.posted_recvs > 0,
                "{} → {}: RNR, no receive posted",
                me.name,
                peer.name
            );
            peer.posted_recvs -= 1;
        }
        let pulling = peer.pulling();
        let peer_conn = peer.conn.as_mut().expect("peer QP exists");
        if peer_conn.read() {
            if let Msg::Write {
                gen,
                ring_offset,
                len,
                imm: Some(_),
                ..
            } = msg
            {
                // READ pull (§16): an announcement; its bytes are pulled later, from where
                // the receiver's core says they go — where the sender's staged them.
                match peer_conn.landing_after(pulling, len as u32) {
                    Some(at) => assert_eq!(
                        (at.gen, at.offset),
                        (gen, ring_offset),
                        "{} → {}: a pull lands elsewhere than staged",
                        me.name,
                        peer.name
                    ),
                    None => assert!(
                        peer.aborted || peer.close_called || expect_failure,
                        "{} → {}: an announcement with nowhere to land",
                        me.name,
                        peer.name
                    ),
                }
                peer.held.push_back(Held::Pull(msg));
                return true;
            }
            if !peer.held.is_empty() {
                peer.held.push_back(Held::After(msg));
                return true;
            }
        }
        let lane = self.lanes_before[1 - i];
        self.land(i, msg, lane)
    }

    /// READ pull (§16): side `i`'s transport's oldest pull completes: the bytes are read from
    /// the sender's staging area now, and the announcement goes to the core, then every
    /// message held back behind it up to the next pull.
    fn pull(&mut self, i: usize) -> bool {
        if self.path_dead {
            return false;
        }
        let expect_failure = self.expect_failure;
        let (me, sender) = pair(self, i);
        let Some(Held::Pull(msg)) = me.held.pop_front() else {
            assert!(me.held.is_empty(), "{}: held back behind no pull", me.name);
            return false;
        };
        let c = me.conn.as_ref().unwrap();
        let reading = c.state() != StreamState::Closed && c.error().is_none();
        if reading {
            // The sender's memory is still there: its transport disconnects only once the
            // peer is done pulling (a pull from a disconnected peer fails the connection).
            let s = sender.conn.as_ref().unwrap();
            assert!(
                sender.teardowns == 0 || !s.peer_pulled() || expect_failure,
                "{}: pulling from {}, which may have disconnected",
                me.name,
                sender.name
            );
            let size = me.ring_desc.size;
            assert_eq!(c.peer_source(), Some(sender.source(size)), "{}", me.name);
        }
        me.pulls += 1;
        let sender_i = 1 - i;
        self.land(sender_i, msg, false);
        loop {
            let me = if i == 0 { &mut self.a } else { &mut self.b };
            match me.held.front() {
                Some(Held::After(_)) => {
                    let Some(Held::After(msg)) = me.held.pop_front() else {
                        unreachable!()
                    };
                    self.land(sender_i, msg, false);
                }
                _ => return true,
            }
        }
    }

    /// The receiver's transport hands a message of side `i` to its core (a DATA's bytes
    /// placed first: the HCA reads `i`'s staging area now, not at post time).
    /// `lane`: the receiver's before (its link's lane survives a completion that does not
    /// stir its core).
    fn land(&mut self, i: usize, msg: Msg, lane: bool) -> bool {
        let expect_failure = self.expect_failure;
        // (how a record's bytes land: in pieces of random sizes)
        let mut pieces = Rng(self.rng.next());
        let (me, peer) = pair(self, i);
        let completes = !matches!(msg, Msg::Write { imm: None, .. });
        let peer_conn = peer.conn.as_mut().expect("peer QP exists");
        // (the transport skips a pass of the core's actions after completions that did not
        // stir the core, if its last pass found nothing — rdma-core's `Link::act`: checked
        // below for every delivery to a core with nothing due)
        peer_conn.take_stirred();
        let drained = peer_conn.clone().poll_action().is_none();
        let res = match msg {
            Msg::Write {
                cursor,
                gen,
                ring_offset,
                remote_addr,
                rkey,
                len,
                imm,
                record,
            } => {
                // The HCA reads the staging area now, not at post time.
                if peer.aborted || peer.close_called {
                    // A closed application's bytes are discarded (and credited) by the protocol.
                    peer.ring_consumed = peer_conn.rx_cursors().tail();
                }
                let ring = peer.rings.get_mut(&gen).unwrap_or_else(|| {
                    panic!(
                        "{} → {}: write into ring {gen}, given back",
                        me.name, peer.name
                    )
                });
                assert_eq!(
                    (remote_addr, rkey),
                    (ring.desc.addr + ring_offset as u64, ring.desc.rkey),
                    "{} → {}: write to the wrong place",
                    me.name,
                    peer.name
                );
                assert!(cursor >= ring.start, "a write before its ring's start");
                if me.conn.as_ref().is_some_and(Connection::sends) {
                    // Sends (§15): a DATA is a SEND the receiving transport copies in, where
                    // the receiver's core says its ring's next bytes go; it must be where the
                    // sender's core staged them, and fit one receive.
                    assert!(record.is_none() && imm.is_some(), "a record over sends");
                    assert!(len <= SENDS_BUF, "a SEND of {len} bytes");
                    // (none once the receiver's connection closed or failed: it reads no
                    // more, and its transport copies nothing)
                    if let Some(at) = peer_conn.landing(len as u32) {
                        assert_eq!(
                            (at.gen, at.offset),
                            (gen, ring_offset),
                            "{} → {}: a SEND's bytes land elsewhere than staged",
                            me.name,
                            peer.name
                        );
                    } else {
                        assert!(
                            peer.aborted || peer.close_called || expect_failure,
                            "{} → {}: a SEND with nowhere to land",
                            me.name,
                            peer.name
                        );
                    }
                }
                let size = ring.bytes.len();
                let base = peer.ring_consumed.max(ring.start);
                assert!(
                    cursor + len as u64 <= base + size as u64,
                    "{} → {}: write [{cursor}, +{len}) over unread bytes (consumed {})",
                    me.name,
                    peer.name,
                    peer.ring_consumed
                );
                let staging = me.stagings.get(&gen).unwrap_or_else(|| {
                    panic!(
                        "{}: staging {gen} given back before its write went",
                        me.name
                    )
                });
                let ssize = staging.len();
                let mut k = 0;
                while k < len {
                    let piece = if record.is_some() {
                        pieces.range(1, len - k)
                    } else {
                        len
                    };
                    let ring = peer.rings.get_mut(&gen).unwrap();
                    for j in k..k + piece {
                        ring.bytes[(ring_offset + j) % size] =
                            staging[(cursor as usize + j) % ssize];
                    }
                    k += piece;
                    if record.is_some() && k < len && !peer.asleep {
                        // The reader polls between the pieces: it must not take the record
                        // (nor anything after it) before its payload landed — before a byte
                        // of its trailer did (in address order, the payload is whole then).
                        poll_ring(peer_conn, &peer.rings, peer.name, expect_failure);
                        assert!(
                            peer_conn.rx_cursors().head() <= cursor || k > len - 8,
                            "{}: took a record of which {k} of {len} bytes landed",
                            peer.name
                        );
                    }
                }
                if let Some(payload) = record {
                    peer.records_in.push_back((len as u64, payload));
                }
                match imm {
                    Some(imm) => {
                        // (a completion wakes a sleeping reader, which polls its ring first:
                        // what was written before the completion's message is placed)
                        peer.asleep = false;
                        poll_ring(peer_conn, &peer.rings, peer.name, expect_failure);
                        complete(
                            peer_conn,
                            Completion::WriteImm {
                                imm: imm.encode(),
                                byte_len: Some(len as u32),
                            },
                            peer.name,
                            &mut peer.data_lanes,
                        )
                    }
                    None => Ok(()),
                }
            }
            Msg::Credit { imm } => {
                peer.asleep = false;
                poll_ring(peer_conn, &peer.rings, peer.name, expect_failure);
                complete(
                    peer_conn,
                    Completion::WriteImm {
                        imm: imm.encode(),
                        byte_len: Some(0),
                    },
                    peer.name,
                    &mut peer.data_lanes,
                )
            }
            Msg::Send(bytes) => {
                if let Ok(ControlMsg::RingMoved { at }) = ControlMsg::decode(&bytes) {
                    // (the ring the peer offered last: its first cursor is known now)
                    if let Some(r) = peer.rings.values_mut().find(|r| r.start == u64::MAX) {
                        r.start = at;
                    }
                }
                peer.asleep = false;
                poll_ring(peer_conn, &peer.rings, peer.name, expect_failure);
                complete(
                    peer_conn,
                    Completion::Recv { payload: &bytes },
                    peer.name,
                    &mut peer.data_lanes,
                )
            }
        };
        let stirred = peer_conn.take_stirred();
        if !stirred && !peer_conn.records() {
            // (a records reader polled its ring above: that changed its core)
            peer.lane = lane;
        }
        if drained && !stirred {
            let next = peer_conn.clone().poll_action();
            assert_eq!(
                next, None,
                "{} ← {}: a completion the core called inert made an action due",
                peer.name, me.name
            );
        }
        if let Err(e) = res {
            assert!(
                expect_failure && e == ErrorReason::Reset,
                "{} ← {}: completion failed: {e}",
                peer.name,
                me.name
            );
        }
        if completes {
            // The transport re-posts the receive before the next credit that returns slots:
            // the peer can only use the slot after that.
            peer.deferred_recvs += 1;
        }
        assert!(peer.posted_recvs + peer.deferred_recvs <= u32::from(peer.p.recv_slots));
        true
    }

    /// Side `i`'s reader of records found nothing and goes to sleep: it queues its notice,
    /// polls its ring once more, and then waits for a completion (`deliver` wakes it).
    fn sleep(&mut self, i: usize) -> bool {
        if !self.sleeping {
            return false;
        }
        let expect_failure = self.expect_failure;
        let (me, _) = pair(self, i);
        if me.asleep || me.eof || me.app_finished() {
            return false;
        }
        let Some(c) = me.conn.as_mut().filter(|c| c.records()) else {
            return false;
        };
        if c.recv() != Recv::WouldBlock {
            return false;
        }
        if !c.prepare_sleep() {
            return false;
        }
        if poll_ring(c, &me.rings, me.name, expect_failure) {
            return true;
        }
        me.asleep = true;
        true
    }

    /// The shim closes its TCP socket once the ring is torn down, its posted messages have
    /// completed, and the application closed.
    fn tcp_close(&mut self, i: usize) -> bool {
        let (me, peer) = pair(self, i);
        let closing = me.close_called || me.aborted || me.failed.is_some();
        let resuming = me.conn.as_ref().is_some_and(|c| c.resume_due().is_some());
        // (READ pull: the transport disconnects once the peer pulled what it staged, or
        // the peer disconnected, or its close timeout passed)
        let pulled = me.conn.as_ref().is_none_or(Connection::peer_pulled)
            || me.close_timed_out
            || gone(peer);
        if me.tcp_closed
            || !closing
            || me.teardowns == 0
            || !me.outbound.is_empty()
            || resuming
            || !pulled
        {
            return false;
        }
        me.tcp_closed = true;
        // An abort (or a failure after switching) resets TCP, so that the peer never waits.
        me.tcp_reset = me.aborted || me.failed.is_some();
        true
    }

    /// The shim watches the kernel socket for EOF (liveness) and reports it once every byte
    /// before it was read.
    fn tcp_liveness(&mut self, i: usize) -> bool {
        let expect_failure = self.expect_failure;
        let (me, peer) = pair(self, i);
        // EOF comes after every byte; an RST does not wait for unread bytes. Once the
        // application has closed (or aborted) the socket, the shim owns it: it sees the peer's
        // FIN through POLLRDHUP, which the kernel reports even with unread bytes before it,
        // and those bytes are discarded.
        let app_gone = me.close_called || me.aborted;
        let unread = !peer.tcp_out.is_empty() && !peer.tcp_reset && !app_gone;
        if me.tcp_eof_seen || !peer.tcp_closed || unread || !peer.outbound.is_empty() {
            return false;
        }
        me.tcp_eof_seen = true;
        if peer.tcp_reset {
            // The kernel socket reports ECONNRESET to the application by itself, whether or
            // not the upgrade got as far as a connection object.
            me.failed.get_or_insert(ErrorReason::Reset);
        }
        if let Some(c) = me.conn.as_mut() {
            if peer.tcp_reset {
                c.handle_tcp_reset();
            } else if let Err(e) = c.handle_tcp_eof() {
                assert!(expect_failure, "{}: TCP EOF treated as error: {e}", me.name);
            }
        }
        true
    }

    /// The CM reports DISCONNECTED once the peer tore its queue pair down and its last
    /// messages arrived (the CQ is polled dry first). Modelled for a side that is switching
    /// back, the one state where it decides something.
    fn disconnect(&mut self, i: usize) -> bool {
        let (me, peer) = pair(self, i);
        if me.disconnected || !gone(peer) || !peer.outbound.is_empty() {
            return false;
        }
        let Some(c) = me.conn.as_mut().filter(|c| c.switching_back()) else {
            return false;
        };
        me.disconnected = true;
        c.handle_transport_error();
        true
    }

    /// The path dies (once the scenario's point has passed): each side's queue towards the
    /// other arrives up to a random message, the rest is lost.
    fn kill_path(&mut self) {
        if self.path_dead
            || self
                .path_fail
                .is_none_or(|at| (self.progress as usize) < at)
        {
            return;
        }
        self.lanes_off();
        for i in 0..2 {
            let queued = pair(self, i).0.outbound.len() as u64;
            let keep = self.rng.below(queued + 1);
            for _ in 0..keep {
                self.deliver(i);
            }
            pair(self, i).0.outbound.clear();
        }
        for i in 0..2 {
            // (READ pull: the pulls under way complete up to a random one, the rest fail, and
            // with them what was held back behind them)
            let held = pair(self, i).0.held.len() as u64;
            let keep = self.rng.below(held + 1);
            for _ in 0..keep {
                self.pull(i);
            }
            pair(self, i).0.held.clear();
        }
        self.path_dead = true;
    }

    /// Side `i` learns that its queue pair failed.
    fn qp_error(&mut self, i: usize) -> bool {
        if !self.path_dead || self.qp_error_seen[i] {
            return false;
        }
        self.qp_error_seen[i] = true;
        let (me, _) = pair(self, i);
        if let Some(c) = me.conn.as_mut() {
            c.handle_transport_error();
            if c.failed_over() {
                self.went_back = true;
            }
        }
        true
    }

    /// Side `i` offers its peer another ring for the peer's writes (a size it asked for, or a
    /// random one), when moves are on and none is under way.
    fn offer(&mut self, i: usize) -> bool {
        let log2 = self.rng.range(12, 14) as u8;
        let (me, _) = pair(self, i);
        if !me.p.cfg.ring_moves || me.offers >= 6 {
            return false;
        }
        let Some(c) = me.conn.as_mut() else {
            return false;
        };
        let size = c
            .ring_wanted()
            .unwrap_or_else(|| RingSize::from_log2(log2).unwrap());
        let addr = me.ring_desc.addr + 0x0100_0000 * u64::from(me.offers + 1);
        let desc = RingDesc {
            addr,
            rkey: 0x1000 + addr as u32,
            size,
        };
        let Ok(gen) = c.offer_ring(desc) else {
            return false;
        };
        me.offers += 1;
        let ring = SimRing {
            bytes: vec![0xEE; size.bytes() as usize],
            desc,
            start: u64::MAX,
        };
        assert!(me.rings.insert(gen, ring).is_none());
        true
    }

    /// Side `i`'s transport reports the staging area of a move ready (some time after the
    /// core asked for it).
    fn staging_ready(&mut self, i: usize) -> bool {
        let (me, _) = pair(self, i);
        let Some(gen) = me.staging_due.take() else {
            return false;
        };
        if !me.conn.as_mut().unwrap().staging_ready(gen) {
            // (the direction ended meanwhile: not needed)
            me.stagings.remove(&gen);
        }
        true
    }

    /// Side `i` asks its peer for a ring of a random size for its writes.
    fn want(&mut self, i: usize) -> bool {
        let log2 = self.rng.range(12, 14) as u8;
        let (me, _) = pair(self, i);
        if me.wants >= 6 {
            return false;
        }
        let Some(c) = me.conn.as_mut() else {
            return false;
        };
        if !c.want_ring(RingSize::from_log2(log2).unwrap()) {
            return false;
        }
        me.wants += 1;
        true
    }

    /// A aborts: SO_LINGER 0 close.
    fn abort(&mut self) {
        self.lanes_off();
        let a = &mut self.a;
        if a.app_finished() {
            return;
        }
        a.aborted = true;
        if let Some(c) = a.conn.as_mut() {
            c.abort();
        }
    }

    /// The scenario's switch back: asked for once the protocol lets it.
    fn ask_back(&mut self, i: usize) -> bool {
        let (me, _) = pair(self, i);
        if me.back_asked || me.app_finished() || me.close_called {
            return false;
        }
        let Some(c) = me.conn.as_mut() else {
            return false;
        };
        match c.switch_back() {
            Ok(()) => {
                me.back_asked = true;
                self.went_back = true;
                true
            }
            Err(SwitchBackError::NotEstablished) => false,
            Err(SwitchBackError::Ended | SwitchBackError::PeerClosed) => {
                me.back_asked = true;
                true
            }
            // (a connection that carries records does not switch back yet: it stays on them)
            Err(SwitchBackError::Unsupported) if c.records() => {
                me.back_asked = true;
                true
            }
            Err(SwitchBackError::Unsupported) => panic!("both sides announce SwitchBack"),
        }
    }

    /// Changes made outside a step (a path's death, an abort, a close timeout): no lane
    /// survives them.
    fn lanes_off(&mut self) {
        self.lanes_before = [false; 2];
        self.a.lane = false;
        self.b.lane = false;
    }

    fn step(&mut self, ev: u64) -> bool {
        self.lanes_before = [self.a.lane, self.b.lane];
        // (a core the step leaves as it was keeps its lane: snapshots of the sides that have
        // one)
        let snap = |e: &Endpoint| e.lane.then(|| e.conn.clone());
        let before = [snap(&self.a), snap(&self.b)];
        self.a.lane = false;
        self.b.lane = false;
        let r = match ev {
            0 => self.server_accept(),
            1 => self.client_established(),
            2 => self.server_established(),
            3 | 4 => self.app_write((ev - 3) as usize),
            5 | 6 => self.app_read((ev - 5) as usize),
            7 | 8 => self.pump((ev - 7) as usize),
            9 | 10 => self.deliver((ev - 9) as usize),
            11 | 12 => self.app_finish((ev - 11) as usize),
            13 | 14 => self.tcp_close((ev - 13) as usize),
            15 | 16 => self.tcp_liveness((ev - 15) as usize),
            17 | 18 => self.wants_back((ev - 17) as usize) && self.ask_back((ev - 17) as usize),
            19 | 20 => self.disconnect((ev - 19) as usize),
            21 | 22 => self.qp_error((ev - 21) as usize),
            23 | 24 => self.offer((ev - 23) as usize),
            25 | 26 => self.want((ev - 25) as usize),
            27 | 28 => self.staging_ready((ev - 27) as usize),
            29 | 30 => self.sleep((ev - 29) as usize),
            31 | 32 => self.pull((ev - 31) as usize),
            _ => unreachable!(),
        };
        // (`recv` names the ring's bytes by a shortcut while the stream is read from the ring
        // alone, and asserts in debug builds that its general branches name the same: checked
        // in every state a step leaves, not only where the application reads; a build
        // without debug assertions has nothing to check)
        if cfg!(debug_assertions) {
            for e in [&self.a, &self.b] {
                if let Some(c) = e.conn.as_ref() {
                    let _ = c.recv();
                }
            }
        }
        for (e, before) in [(&mut self.a, &before[0]), (&mut self.b, &before[1])] {
            if before.as_ref().is_some_and(|b| *b == e.conn) {
                e.lane = true;
            }
        }
        if r {
            self.progress += 1;
        }
        r
    }

    /// Whether side `i` is to switch back by now (the scenario's trigger has passed).
    fn wants_back(&self, i: usize) -> bool {
        match self.switch_back {
            Some((side, at, both)) => {
                let me = if i == 0 { &self.a } else { &self.b };
                (side == i || both) && self.progress >= at as u64 && !me.back_asked
            }
            None => false,
        }
    }

    fn done(&self) -> bool {
        if self.path_fail.is_some() {
            // (a side that failed reset TCP: the other's unread bytes are never read; a side
            // that no handshake reached before the path died has nothing to tear down)
            let torn = |e: &Endpoint| e.teardowns >= 1 || e.conn.is_none();
            return self.a.app_finished()
                && self.b.app_finished()
                && self.a.outbound.is_empty()
                && self.b.outbound.is_empty()
                && self.a.held.is_empty()
                && self.b.held.is_empty()
                && torn(&self.a)
                && torn(&self.b)
                && self.a.tcp_closed
                && self.b.tcp_closed;
        }
        if self.expect_failure {
            return self.a.app_finished()
                && self.b.app_finished()
                && self.a.outbound.is_empty()
                && self.b.outbound.is_empty()
                && self.a.held.is_empty()
                && self.b.held.is_empty()
                && self.a.teardowns >= 1
                && self.b.teardowns >= 1
                && self.b.tcp_eof_seen;
        }
        self.a.app_finished()
            && self.b.app_finished()
            && self.a.outbound.is_empty()
            && self.b.outbound.is_empty()
            && self.a.held.is_empty()
            && self.b.held.is_empty()
            && self.a.tcp_closed
            && self.b.tcp_closed
            && self.a.tcp_eof_seen
            && self.b.tcp_eof_seen
    }

    fn run(&mut self, random_steps: usize) {
        self.run_random(random_steps);
        self.drain(100_000);
        assert!(self.done(), "deadlock: {}", self.describe());
    }

    fn run_random(&mut self, random_steps: usize) {
        // Weights per event: handshake ×3, then writes, reads, pumps, deliveries, finishes,
        // TCP closes and TCP liveness checks.
        let hs = self.handshake_weight;
        let weights = [
            hs, hs, hs, 3, 3, 3, 3, 2, 2, 4, 4, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
            1, 1, 1, 2, 2,
        ];
        let total: u64 = weights.iter().sum();
        for step in 0..random_steps {
            if self.done() {
                return;
            }
            if self.abort_at == Some(step) {
                self.abort();
            }
            let mut x = self.rng.below(total);
            let mut ev = 0;
            while x >= weights[ev] {
                x -= weights[ev];
                ev += 1;
            }
            self.step(ev as u64);
            self.kill_path();
        }
        if self.abort_at.is_some() {
            self.abort();
        }
    }

    /// Runs every event in turn until nothing moves (or `done`); returns whether it went quiet
    /// within `max_rounds`.
    fn drain(&mut self, max_rounds: usize) -> bool {
        for _round in 0..max_rounds {
            if self.done() {
                return true;
            }
            let before = self.progress;
            self.kill_path();
            for ev in 0..33 {
                let mut guard = 0;
                while self.step(ev) {
                    guard += 1;
                    assert!(
                        guard < 1_000_000,
                        "event {ev} never stops: {}",
                        self.describe()
                    );
                }
            }
            if self.progress == before {
                if self.close_timeouts() {
                    continue;
                }
                return true;
            }
        }
        false
    }

    /// Nothing else can move: the links torn down but still waiting for their peer to pull
    /// (READ pull) disconnect after their close timeout, as `Link::drive_teardown` does. Only
    /// an abort may need it: a READ-pull side that aborts after its shutdown while its peer
    /// finishes leaves each waiting for the credit of its last message, which neither posts
    /// once torn down (the peer took its own end for the wire's). Returns whether one fired.
    fn close_timeouts(&mut self) -> bool {
        self.lanes_off();
        let expect_failure = self.expect_failure;
        let mut fired = false;
        for me in [&mut self.a, &mut self.b] {
            let waiting = me.teardowns > 0
                && !me.close_timed_out
                && !me.tcp_closed
                && me.conn.as_ref().is_some_and(|c| !c.peer_pulled());
            if waiting {
                let kind = me.conn.as_ref().map(Connection::kind);
                assert!(
                    expect_failure && kind == Some(Kind::Read),
                    "{}: a close timeout needed without an abort, or not over READ pull ({kind:?})",
                    me.name
                );
                me.close_timed_out = true;
                fired = true;
            }
        }
        fired
    }

    fn describe(&self) -> String {
        let d = |e: &Endpoint| {
            format!(
                "{}: written {}/{} committed {} shut {} close {} aborted {} failed {:?} eof {} read {} teardowns {} outbound {} tcp_out {} tcp_closed {} tcp_reset {} tcp_eof_seen {} state {:?} tx {:?} rx {:?} slots {:?} txcur {:?} rxcur {:?}",
                e.name,
                e.out_pos,
                e.out_stream.len(),
                e.committed,
                e.shut_called,
                e.close_called,
                e.aborted,
                e.failed,
                e.eof,
                e.in_stream.len(),
                e.teardowns,
                e.outbound.len(),
                e.tcp_out.len(),
                e.tcp_closed,
                e.tcp_reset,
                e.tcp_eof_seen,
                e.conn.as_ref().map(|c| c.state()),
                e.conn.as_ref().map(|c| c.tx_state()),
                e.conn.as_ref().map(|c| c.rx_state()),
                e.conn.as_ref().and_then(|c| c.peer_slots()),
                e.conn.as_ref().and_then(|c| c.tx_cursors().copied()),
                e.conn.as_ref().map(|c| *c.rx_cursors()),
            )
        };
        format!("\n{}\n{}", d(&self.a), d(&self.b))
    }

    fn check(&self) {
        for (me, peer) in [(&self.a, &self.b), (&self.b, &self.a)] {
            assert_eq!(
                me.in_stream.len(),
                peer.out_stream.len(),
                "{} read a stream of the wrong length",
                me.name
            );
            assert!(
                me.in_stream == peer.out_stream,
                "{}: stream corrupted",
                me.name
            );
            if !self.went_back {
                assert_eq!(
                    me.tcp_read, peer.tcp_sent,
                    "{}: switch-over offset not honoured",
                    me.name
                );
            }
            assert_eq!(
                me.teardowns, 1,
                "{}: Teardown emitted {} times",
                me.name, me.teardowns
            );
            let c = me.conn.as_ref().unwrap();
            assert_eq!(c.state(), StreamState::Closed, "{}", self.describe());
            assert_eq!(c.error(), None);
            assert!(
                c.peer_pulled() || gone(peer),
                "{}: its end never confirmed",
                me.name
            );
            assert!(me.held.is_empty(), "{}: messages held back", me.name);
        }
    }
}

/// Whether `e`'s transport disconnected (its peer's CM says DISCONNECTED): it tore down, and
/// its peer pulled what it staged (READ pull, §16) or went away itself.
fn gone(e: &Endpoint) -> bool {
    e.teardowns > 0 && (e.close_timed_out || e.conn.as_ref().is_none_or(Connection::peer_pulled))
}

/// The transport polls its ring of records (`Connection::poll_ring`, a no-op without them):
/// returns whether it found any.
fn poll_ring(
    c: &mut Connection,
    rings: &BTreeMap<u32, SimRing>,
    name: &str,
    expect_failure: bool,
) -> bool {
    if !c.records() {
        return false;
    }
    let ring = &rings[&c.rx_cursors().gen()].bytes;
    let word = |offset: usize| {
        assert!(
            offset.is_multiple_of(8) && offset < ring.len(),
            "{name}: word at {offset}"
        );
        u64::from_le_bytes(ring[offset..offset + 8].try_into().unwrap())
    };
    match c.poll_ring(word) {
        Ok(found) => found,
        Err(e) => {
            assert!(expect_failure, "{name}: the ring's records refused: {e}");
            false
        }
    }
}

/// Reads up to `want` bytes (and at most `limit`) of the peer's TCP stream.
fn read_tcp(me: &mut Endpoint, peer: &mut Endpoint, want: u64, limit: Option<u64>) -> bool {
    let n = want
        .min(limit.unwrap_or(u64::MAX))
        .min(peer.tcp_out.len() as u64);
    if n == 0 {
        return false;
    }
    me.in_stream.extend(peer.tcp_out.drain(..n as usize));
    me.tcp_read += n;
    if let Some(c) = me.conn.as_mut() {
        c.note_tcp_read(n)
            .unwrap_or_else(|e| panic!("{}: TCP read refused: {e}", me.name));
    }
    true
}

/// A read from the kernel socket returns 0 once the peer closed TCP and every byte it sent was
/// read: with no limit (the peer never switched, or the upgrade fell back) that is the
/// application's EOF. (With a limit the peer owes TCP bytes before its SwitchOver: an EOF then
/// is the protocol core's business, reported through `handle_tcp_eof`.)
fn tcp_read_eof(me: &mut Endpoint, peer: &Endpoint, limit: Option<u64>) -> bool {
    if limit.is_none() && peer.tcp_closed && !peer.tcp_reset && peer.tcp_out.is_empty() {
        me.eof = true;
        return true;
    }
    false
}

fn run_scenario(sc: &Scenario) {
    let mut sim = Sim::new(sc);
    sim.run(sc.random_steps);
    sim.check();
    if std::env::var_os("SIM_DEBUG").is_some() && sc.switch_back.is_some() {
        let st = |e: &Endpoint| {
            let c = e.conn.as_ref().unwrap();
            format!(
                "{}:{}/{}",
                e.back_asked,
                c.switched_back(),
                c.stats().control_sent
            )
        };
        eprintln!(
            "BACK went {} A {} B {} steps {}",
            sim.went_back,
            st(&sim.a),
            st(&sim.b),
            sim.progress
        );
    }
    if std::env::var_os("SIM_DEBUG").is_some() {
        let a = sim.a.conn.as_ref().unwrap();
        let b = sim.b.conn.as_ref().unwrap();
        eprintln!(
            "fin {:?}/{:?} len {}/{} tcp {}/{} A {:?} B {:?}",
            sc.a.finish,
            sc.b.finish,
            sc.a.stream_len,
            sc.b.stream_len,
            sim.a.tcp_sent,
            sim.b.tcp_sent,
            a.stats(),
            b.stats()
        );
    }
}

fn config() -> impl Strategy<Value = Config> {
    (
        1u8..=4,
        prop::option::of(0u16..20),
        prop_oneof![Just(0u64), 1u64..5000],
        any::<bool>(),
        any::<bool>(),
        prop_oneof![
            2 => Just(Kind::WriteImm),
            1 => Just(Kind::Records),
            1 => Just(Kind::Sends),
            1 => Just(Kind::Read),
            1 => Just(Kind::Duplex),
        ],
    )
        .prop_map(|(shift, slot_thr, max_write, split, moves, kind)| Config {
            credit_byte_shift: shift,
            credit_slot_threshold: slot_thr,
            max_write,
            split_at_wrap: split,
            ring_moves: moves,
            kind,
            ..Config::default()
        })
}

fn side(finish: Finish) -> impl Strategy<Value = SideParams> {
    (
        12u8..=13,
        4u16..=12,
        0usize..40_000,
        prop_oneof![Just(0u32), 0u32..=100],
        prop_oneof![1usize..64, 1usize..9000],
        prop_oneof![1usize..64, 1usize..9000],
        config(),
    )
        .prop_map(
            move |(ring_log2, recv_slots, stream_len, commit_pct, max_chunk, max_read, cfg)| {
                SideParams {
                    ring_log2,
                    recv_slots,
                    stream_len,
                    commit_at: stream_len * commit_pct as usize / 100,
                    max_chunk,
                    max_read,
                    cfg,
                    finish,
                }
            },
        )
}

fn finishes() -> impl Strategy<Value = (Finish, Finish)> {
    use Finish::*;
    prop_oneof![
        Just((ShutdownThenClose, ShutdownThenClose)),
        Just((ShutdownThenClose, CloseAfterEof)),
        Just((CloseAfterEof, ShutdownThenClose)),
        Just((ShutdownThenClose, NeverSwitchClose)),
        Just((NeverSwitchClose, ShutdownThenClose)),
    ]
}

fn scenario() -> impl Strategy<Value = Scenario> {
    finishes().prop_flat_map(|(fa, fb)| {
        (any::<u64>(), side(fa), side(fb), 0usize..6000, 1u64..=12).prop_map(
            |(seed, a, b, random_steps, handshake_weight)| Scenario {
                seed,
                a,
                b,
                random_steps,
                abort_at: None,
                handshake_weight,
                switch_back: None,
                path_fail: None,
            },
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Both directions at once, random switch points, random interleavings, half-close.
    #[test]
    fn streams_survive_any_schedule(sc in scenario()) {
        run_scenario(&sc);
    }

    /// A aborts at a random point: B reads a prefix of A's stream, then either finishes
    /// normally (the abort came after everything) or sees ECONNRESET; nobody hangs.
    #[test]
    fn abort_never_hangs(sc in scenario(), at in 0usize..3000) {
        let sc = Scenario { abort_at: Some(at.min(sc.random_steps)), ..sc };
        let mut sim = Sim::new(&sc);
        sim.run(sc.random_steps);
        let (a, b) = (&sim.a, &sim.b);
        prop_assert!(a.out_stream.starts_with(&b.in_stream), "B read something A never sent");
        prop_assert!(b.out_stream.starts_with(&a.in_stream), "A read something B never sent");
        let bc = b.conn.as_ref().unwrap();
        if std::env::var_os("SIM_DEBUG").is_some() {
            eprintln!("abort: B {:?} failed {:?} read {}/{} A-stats {:?}", bc.state(), b.failed, b.in_stream.len(), a.out_stream.len(), a.conn.as_ref().unwrap().stats());
        }
        match bc.state() {
            StreamState::Closed => {}
            StreamState::Error(e) => prop_assert!(
                matches!(e, ErrorReason::Reset | ErrorReason::Transport | ErrorReason::PeerVanished),
                "{e:?}"
            ),
            s => prop_assert!(b.app_finished() || sim.done(), "B stuck in {s:?}: {}", sim.describe()),
        }
        prop_assert_eq!(a.teardowns, 1);
        prop_assert_eq!(b.teardowns, 1);
    }

    /// One side (or both, one after the other or at once) returns the live connection to TCP
    /// at a random point — before the handshake ends, while switching, on the ring, after a
    /// shutdown, with rings full or empty — and every byte still arrives once, in order; both
    /// ends finish cleanly over TCP.
    #[test]
    fn switch_back_keeps_every_byte(
        sc in scenario(),
        side in 0usize..2,
        at in 0usize..4000,
        both in any::<bool>(),
    ) {
        let sc = Scenario { switch_back: Some((side, at, both)), ..sc };
        run_scenario(&sc);
    }

    /// The path between the queue pairs dies at a random point (messages in flight lost from a
    /// random one on, each side told at a random later step): nothing read is ever wrong, and
    /// where both sides went on over TCP (§8.6) every byte arrives once, in order, and both
    /// finish cleanly; where one could not (its SwitchOver not yet credited), both end in an
    /// error instead — never a hang.
    #[test]
    fn path_failure_keeps_every_byte(sc in scenario(), at in 0usize..4000) {
        let sc = Scenario { path_fail: Some(at), ..sc };
        let mut sim = Sim::new(&sc);
        sim.run(sc.random_steps);
        let (a, b) = (&sim.a, &sim.b);
        prop_assert!(a.out_stream.starts_with(&b.in_stream), "B read something A never sent");
        prop_assert!(b.out_stream.starts_with(&a.in_stream), "A read something B never sent");
        let over = |e: &Endpoint| e.conn.as_ref().is_some_and(|c| c.failed_over());
        if over(a) && over(b) && a.failed.is_none() && b.failed.is_none() {
            sim.check();
        }
        if std::env::var_os("SIM_DEBUG").is_some() {
            eprintln!("path: dead {} over {}/{} failed {:?}/{:?}", sim.path_dead, over(a), over(b), a.failed, b.failed);
        }
    }

    /// With the applications idle (all written and read, nobody shutting down), the pair goes
    /// quiet: no credit answers a credit forever.
    #[test]
    fn idle_pair_goes_quiet(sc in scenario()) {
        let mut sim = Sim::new(&sc);
        sim.finishing = false;
        sim.run_random(sc.random_steps);
        // Rounds enough for the slowest legal schedule to finish the streams (1-byte writes
        // through 4 receive slots move about one byte a round), then to go quiet.
        let rounds = 10_000 + 4 * (sc.a.stream_len + sc.b.stream_len);
        prop_assert!(sim.drain(rounds), "no quiescence: {}", sim.describe());
        for (me, peer) in [(&sim.a, &sim.b), (&sim.b, &sim.a)] {
            prop_assert!(me.in_stream == peer.out_stream, "{}: not everything delivered", me.name);
            prop_assert!(me.outbound.is_empty());
            let c = me.conn.as_ref().unwrap();
            prop_assert!(!c.readiness().hup && c.error().is_none());
        }
    }
}

fn fixed(finish_a: Finish, finish_b: Finish, ring_log2: u8, slots: u16, len: usize) -> Scenario {
    let side = |finish, commit_at| SideParams {
        ring_log2,
        recv_slots: slots,
        stream_len: len,
        commit_at,
        max_chunk: 3000,
        max_read: 5000,
        cfg: Config::default(),
        finish,
    };
    Scenario {
        seed: 7,
        a: side(finish_a, 1000),
        b: side(finish_b, 0),
        random_steps: 3000,
        abort_at: None,
        handshake_weight: 10,
        switch_back: None,
        path_fail: None,
    }
}

/// A path that dies well after the upgrade, with both streams in full flow and rings of 4
/// slots: both sides go on over TCP and every byte arrives, whatever was in flight.
#[test]
fn path_failure_mid_stream_fails_over() {
    for seed in 0..40 {
        for at in [300, 900, 2000] {
            let mut sc = fixed(
                Finish::ShutdownThenClose,
                Finish::ShutdownThenClose,
                12,
                MIN_RECV_SLOTS,
                100_000,
            );
            sc.seed = seed;
            sc.handshake_weight = 12;
            sc.a.commit_at = 0;
            sc.a.max_chunk = 300;
            sc.b.max_chunk = 300;
            sc.a.max_read = 400;
            sc.b.max_read = 400;
            sc.path_fail = Some(at);
            let mut sim = Sim::new(&sc);
            sim.run(sc.random_steps);
            assert!(
                sim.path_dead,
                "seed {seed} at {at}: finished before the path died"
            );
            for e in [&sim.a, &sim.b] {
                let c = e.conn.as_ref().unwrap();
                assert!(
                    c.failed_over(),
                    "seed {seed} at {at}: {} did not fail over: {}",
                    e.name,
                    sim.describe()
                );
            }
            sim.check();
        }
    }
}

#[test]
fn smallest_ring_fewest_slots_large_transfer() {
    run_scenario(&fixed(
        Finish::ShutdownThenClose,
        Finish::ShutdownThenClose,
        12,
        MIN_RECV_SLOTS,
        200_000,
    ));
}

#[test]
fn one_side_never_switches() {
    run_scenario(&fixed(
        Finish::NeverSwitchClose,
        Finish::ShutdownThenClose,
        12,
        4,
        50_000,
    ));
}

#[test]
fn close_after_eof() {
    run_scenario(&fixed(
        Finish::CloseAfterEof,
        Finish::ShutdownThenClose,
        13,
        8,
        50_000,
    ));
}

#[test]
fn nothing_to_send() {
    run_scenario(&fixed(
        Finish::ShutdownThenClose,
        Finish::ShutdownThenClose,
        12,
        4,
        0,
    ));
}

#[test]
fn credits_are_batched() {
    // One direction, small writes each sent at once, a reader that consumes everything as soon
    // as it arrives: credits must come in batches (thresholds), not one per message.
    let mut sc = fixed(
        Finish::ShutdownThenClose,
        Finish::ShutdownThenClose,
        16,
        64,
        100_000,
    );
    sc.a.max_chunk = 50;
    sc.a.commit_at = 0;
    sc.b.stream_len = 0;
    sc.b.max_read = 1 << 20;
    sc.random_steps = 0;
    let mut sim = Sim::new(&sc);
    sim.server_accept();
    sim.client_established();
    sim.server_established();
    for _ in 0..100_000 {
        if sim.a.app_done_writing() {
            break;
        }
        sim.app_write(0);
        sim.pump(0);
        while sim.deliver(0) {}
        while sim.app_read(1) {}
        sim.pump(1);
        while sim.deliver(1) {}
    }
    sim.run(0);
    sim.check();
    let a = sim.a.conn.as_ref().unwrap().stats();
    let b = sim.b.conn.as_ref().unwrap().stats();
    if std::env::var_os("SIM_DEBUG").is_some() {
        eprintln!("batched: A {a:?}\nB {b:?}");
    }
    assert!(a.data_writes >= 2000, "{a:?}");
    // Slot threshold 32 of 64 receives: about one credit per 32 messages.
    assert!(
        b.credits_sent * 20 <= a.data_writes,
        "credits not batched: {b:?} for {a:?}"
    );
}

/// Both sides take part in ring moves, with long streams in both directions: rings of every
/// size from 4 to 16 KiB are offered and moved to in the middle of the flow, asked for or not,
/// with the staging area ready at once or some steps later; every byte arrives once, in
/// order, and the moves did happen (both directions, several each, over the seeds).
#[test]
fn ring_moves_keep_every_byte() {
    let (mut moves_out, mut moves_in, mut lane_checks) = (0, 0, 0);
    for seed in 0..60 {
        let mut sc = fixed(
            Finish::ShutdownThenClose,
            Finish::ShutdownThenClose,
            12,
            8,
            60_000,
        );
        sc.seed = seed;
        sc.a.commit_at = 0;
        sc.random_steps = 6000;
        for side in [&mut sc.a, &mut sc.b] {
            side.cfg.ring_moves = true;
            // (half the runs: a writer held back by a full ring asks for a larger one itself)
            side.cfg.ring_max = (seed % 2 == 1).then(|| RingSize::from_log2(14).unwrap());
            side.max_chunk = 2000;
            side.max_read = 2000;
        }
        let mut sim = Sim::new(&sc);
        sim.run(sc.random_steps);
        sim.check();
        lane_checks += sim.lane_checks;
        for e in [&sim.a, &sim.b] {
            let st = e.conn.as_ref().unwrap().stats();
            moves_out += st.moves_out;
            moves_in += st.moves_in;
        }
    }
    // (the lane is checked where it would be taken: often, across the moves)
    assert!(
        lane_checks >= 1000,
        "only {lane_checks} lane checks in 60 runs"
    );
    assert_eq!(moves_out, moves_in, "every move is seen by both ends");
    assert!(moves_out >= 60, "only {moves_out} moves in 60 runs");
}

/// One side announces ring moves, the other does not: no move happens, and a RingOffer or
/// RingMoved from a side that should not send one is a protocol violation.
#[test]
fn ring_moves_need_both_sides() {
    let mut sc = fixed(
        Finish::ShutdownThenClose,
        Finish::ShutdownThenClose,
        12,
        8,
        20_000,
    );
    sc.a.cfg.ring_moves = true;
    let mut sim = Sim::new(&sc);
    sim.run(sc.random_steps);
    sim.check();
    for e in [&sim.a, &sim.b] {
        let c = e.conn.as_ref().unwrap();
        assert!(!c.ring_moves());
        assert_eq!((c.stats().moves_in, c.stats().moves_out), (0, 0));
    }
}

/// Both sides offer records, with streams both ways, small and large writes, readers that go
/// to sleep whenever they find nothing (or, in every other run, spin): every byte arrives
/// once, in order, over records; a record carries an immediate only to wake a reader or to ask
/// for credit, so spinning readers take no wake-up at all and most records make no completion.
#[test]
fn records_keep_every_byte_and_wake_their_readers() {
    let (mut writes, mut wakes, mut sleeps, mut plain) = (0, 0, 0, 0);
    for seed in 0..60 {
        let mut sc = fixed(
            Finish::ShutdownThenClose,
            Finish::ShutdownThenClose,
            12,
            8,
            60_000,
        );
        sc.seed = seed;
        sc.a.commit_at = (seed as usize * 997) % 60_000;
        sc.random_steps = 6000;
        for side in [&mut sc.a, &mut sc.b] {
            side.cfg.kind = Kind::Records;
            side.max_chunk = if seed % 3 == 0 { 40 } else { 3000 };
            side.max_read = if seed % 5 == 0 { 7 } else { 2000 };
        }
        let mut sim = Sim::new(&sc);
        sim.sleeping = seed % 2 == 0;
        sim.run(sc.random_steps);
        sim.check();
        for e in [&sim.a, &sim.b] {
            let c = e.conn.as_ref().unwrap();
            assert!(c.records(), "{}: records not negotiated", e.name);
            assert!(!c.ring_moves() && !c.peer_can_switch_back() && !c.fails_over());
            let st = c.stats();
            assert_eq!(st.data_writes, e.records_out);
            // (a record with an immediate woke the reader, asked for credit, or both)
            assert!(e.records_imm <= st.wakes_sent + st.credit_wanted, "{st:?}");
            if !sim.sleeping {
                assert_eq!((st.sleeps, st.wakes_sent), (0, 0), "spinning readers");
                assert_eq!(e.records_imm, st.credit_wanted, "{st:?}");
            }
            writes += st.data_writes;
            wakes += st.wakes_sent;
            sleeps += st.sleeps;
            plain += e.records_out - e.records_imm;
        }
    }
    assert!(writes >= 2_000, "only {writes} records");
    assert!(
        sleeps >= 100 && wakes >= 100,
        "{sleeps} sleeps, {wakes} wake-ups"
    );
    assert!(
        plain * 2 > writes,
        "{plain} of {writes} records without an immediate"
    );
}

/// Both sides offer sends, with rings larger than a receive and writes larger than both: every
/// byte arrives once, in order; no DATA is longer than [`SENDS_BUF`] and the long writes do
/// fill receives; the connection keeps ring moves, switch-backs and failover (its cursors are
/// stream offsets, as over WRITE WITH IMMEDIATE, and a DATA lands in the ring of its cursor).
#[test]
fn sends_keep_every_byte_in_receive_sized_pieces() {
    let (mut full, mut moves) = (0, 0);
    for seed in 0..30 {
        let mut sc = fixed(
            Finish::ShutdownThenClose,
            Finish::CloseAfterEof,
            15,
            8,
            300_000,
        );
        sc.seed = seed;
        sc.a.commit_at = (seed as usize * 7919) % 300_000;
        sc.random_steps = 6000;
        for side in [&mut sc.a, &mut sc.b] {
            side.cfg.kind = Kind::Sends;
            side.cfg.ring_moves = true;
            side.max_chunk = if seed % 3 == 0 { 64 } else { 40_000 };
        }
        let mut sim = Sim::new(&sc);
        sim.run(sc.random_steps);
        sim.check();
        for e in [&sim.a, &sim.b] {
            let c = e.conn.as_ref().unwrap();
            assert_eq!(c.kind(), Kind::Sends, "{}", e.name);
            assert!(c.sends() && !c.records());
            assert!(c.ring_moves() && c.peer_can_switch_back() && c.fails_over());
            assert!(e.longest_data <= SENDS_BUF, "{}", e.longest_data);
            full += usize::from(e.longest_data == SENDS_BUF);
            moves += c.stats().moves_in;
        }
    }
    assert!(full >= 20, "only {full} sides filled a receive");
    assert!(moves >= 10, "only {moves} ring moves");
}

/// A fixed scenario (A shuts down first, B finishes as `finish_b`) with both sides asking for
/// `kind`, its commit point and its events by `seed`: a quarter of the seeds switch back to
/// TCP (either side, or both), a quarter lose the path well after the upgrade (both sides
/// can fail over then), the rest run to their end.
fn of_kind(kind: Kind, seed: u64, finish_b: Finish, log2: u8, slots: u16, len: usize) -> Scenario {
    let mut sc = fixed(Finish::ShutdownThenClose, finish_b, log2, slots, len);
    sc.seed = seed;
    sc.a.commit_at = (seed as usize * 7919) % len.max(1);
    sc.random_steps = 6000;
    match seed % 4 {
        1 => sc.switch_back = Some(((seed / 4 % 2) as usize, 700, seed % 8 == 1)),
        3 => {
            sc.a.commit_at = 0;
            sc.handshake_weight = 12;
            sc.path_fail = Some(900 + (seed as usize * 37) % 1500);
        }
        _ => {}
    }
    sc.a.cfg.kind = kind;
    sc.b.cfg.kind = kind;
    sc
}

/// Both sides pull (READ pull, §16), with pulls that complete late and messages held back
/// behind them: every byte arrives once, in order, pulled from staging the sender has not
/// overwritten (the credit rules keep it); the sides take no ring moves; each side's end is
/// confirmed before it may disconnect; switch-backs and failovers keep every byte too.
#[test]
fn read_pulls_every_byte_from_staging_the_sender_keeps() {
    let (mut pulls, mut back, mut over) = (0, 0, 0);
    for seed in 0..60 {
        let finish = if seed % 2 == 0 {
            Finish::ShutdownThenClose
        } else {
            Finish::CloseAfterEof
        };
        let mut sc = of_kind(Kind::Read, seed, finish, 12, 6, 120_000);
        sc.random_steps = 5000;
        for side in [&mut sc.a, &mut sc.b] {
            side.cfg.ring_moves = true;
            side.max_chunk = if seed % 3 == 0 { 64 } else { 9000 };
        }
        let mut sim = Sim::new(&sc);
        sim.run(sc.random_steps);
        sim.check();
        for e in [&sim.a, &sim.b] {
            let c = e.conn.as_ref().unwrap();
            assert_eq!(c.kind(), Kind::Read, "{}", e.name);
            assert!(c.read() && !c.sends() && !c.records());
            assert!(!c.ring_moves(), "no moves over READ pull");
            assert!(c.peer_can_switch_back() && c.fails_over());
            assert_eq!(c.stats().moves_in, 0);
            assert!(!sim.path_dead || c.failed_over(), "seed {seed}");
            pulls += e.pulls;
            back += u32::from(c.switched_back());
            over += u32::from(c.failed_over());
        }
    }
    assert!(pulls >= 1000, "only {pulls} pulls");
    assert!(
        back >= 4 && over >= 4,
        "{back} switched back, {over} failed over"
    );
}

/// Both sides duplex (§17), writing small messages both ways at once: every byte arrives
/// once, in order, with ring moves, switch-backs and failovers as over WRITE WITH IMMEDIATE,
/// and credits ride on the other direction's DATA: the same scenarios over WRITE WITH
/// IMMEDIATE send a fifth more credits of their own, per DATA, than duplex does at least.
#[test]
fn duplex_credits_ride_on_the_other_directions_data() {
    // (per kind: DATA sent, credits that went apart, credits that rode)
    let mut tally = [(0u64, 0u64, 0u64); 2];
    // (per kind: DATA the receiving core took by its lane, writes the sending one would
    // make by its own)
    let (mut lanes, mut writes) = ([0u64; 2], [0u64; 2]);
    for seed in 0..40 {
        for (k, kind) in [Kind::Duplex, Kind::WriteImm].into_iter().enumerate() {
            let mut sc = of_kind(kind, seed, Finish::CloseAfterEof, 13, 8, 60_000);
            for side in [&mut sc.a, &mut sc.b] {
                side.cfg.ring_moves = seed % 2 == 0;
                side.max_chunk = if seed % 3 == 0 { 64 } else { 3000 };
                side.max_read = 2000;
            }
            let mut sim = Sim::new(&sc);
            sim.run(sc.random_steps);
            sim.check();
            lanes[k] += sim.a.data_lanes + sim.b.data_lanes;
            writes[k] += sim.a.send_lanes + sim.b.send_lanes;
            for e in [&sim.a, &sim.b] {
                let c = e.conn.as_ref().unwrap();
                assert_eq!(c.kind(), kind, "{}", e.name);
                assert!(c.peer_can_switch_back() && c.fails_over());
                assert_eq!(c.ring_moves(), seed % 2 == 0);
                let st = c.stats();
                tally[k].0 += st.data_writes;
                tally[k].1 += st.credits_sent - st.credits_piggybacked;
                tally[k].2 += st.credits_piggybacked;
            }
        }
    }
    let [(d_data, d_apart, d_rode), (i_data, i_apart, i_rode)] = tally;
    // (the DATA lane takes nearly every DATA of either kind — 96–98% when written; the rest
    // come with the switch, a ring move or the end under way — and every one was checked
    // against the general path)
    for (k, (data, name)) in [(d_data, "duplex"), (i_data, "imm")]
        .into_iter()
        .enumerate()
    {
        assert!(
            lanes[k] * 5 > data * 4,
            "{name}: the DATA lane took {} of {data} DATA",
            lanes[k]
        );
        // (the write's lane, likewise, makes most writes — 59–63% when written: the random
        // schedules often write again before the last write's DATA went)
        assert!(
            writes[k] * 2 > data,
            "{name}: the write's lane made {} of {data} DATA",
            writes[k]
        );
    }
    assert_eq!(i_rode, 0, "credits rode on DATA over WRITE WITH IMMEDIATE");
    assert!(d_rode > 0);
    // (credits apart per 1,000 DATA: the random schedules often find a credit due with no
    // DATA to go in the same pass — 439 against 606 when written; a strict ping-pong sends
    // none apart, connection.rs's `duplex_answers_carry_the_credit`)
    let (d, i) = (d_apart * 1000 / d_data, i_apart * 1000 / i_data);
    assert!(
        d * 5 < i * 4,
        "credits apart per 1,000 DATA: {d} over duplex ({d_rode} rode), {i} over imm"
    );
}

/// A kind (records, sends, READ pull, duplex) is used only when both sides want it: otherwise
/// the connection keeps the WRITE WITH IMMEDIATE kind, and the streams still arrive whole.
#[test]
fn a_kind_needs_both_sides() {
    for offer in [
        (Kind::Records, Kind::WriteImm),
        (Kind::WriteImm, Kind::Records),
        (Kind::Records, Kind::Sends),
        (Kind::Sends, Kind::Records),
        (Kind::Sends, Kind::WriteImm),
        (Kind::WriteImm, Kind::Sends),
        (Kind::Read, Kind::WriteImm),
        (Kind::WriteImm, Kind::Read),
        (Kind::Read, Kind::Sends),
        (Kind::Records, Kind::Read),
        (Kind::Duplex, Kind::WriteImm),
        (Kind::Read, Kind::Duplex),
    ] {
        let mut sc = fixed(
            Finish::ShutdownThenClose,
            Finish::CloseAfterEof,
            12,
            8,
            20_000,
        );
        sc.a.cfg.kind = offer.0;
        sc.b.cfg.kind = offer.1;
        let mut sim = Sim::new(&sc);
        sim.run(sc.random_steps);
        sim.check();
        for e in [&sim.a, &sim.b] {
            let c = e.conn.as_ref().unwrap();
            assert_eq!(c.kind(), Kind::WriteImm, "{offer:?}");
            assert!(c.peer_can_switch_back(), "today's kind keeps its features");
            assert_eq!((c.stats().sleeps, c.stats().wakes_sent), (0, 0));
        }
    }
}
