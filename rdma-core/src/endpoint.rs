//! The verbs resources of one ring-stream connection, and the work requests it posts.
//!
//! Per connection (see `docs/protocol.md`, "Transport"):
//!
//! - an RC QP made through rdma_cm, on its own rdma_cm event channel (an accepted id is
//!   migrated off the listener's channel), so that DISCONNECTED and errors of one connection are
//!   seen by that connection;
//! - a protection domain of its own, holding that QP and every registration below, and nothing
//!   else: the rkey of another connection's ring means nothing on it ([`crate::pool`] says why;
//!   the PD and the registrations are pooled together, as one [`Kit`]);
//! - one CQ for sends and receives, with a completion channel whose fd is non-blocking;
//! - with `StreamConfig::srq`, a shared receive queue on the connection's PD that the QP takes
//!   its receives from (the SRQ kind: one connection's, as its PD is);
//! - the receive ring: a [`RegisteredRing`](crate::ring::RegisteredRing) registered with
//!   [`Access::RING`](crate::verbs::Access::RING) (LOCAL_WRITE | REMOTE_WRITE: the only memory
//!   of the connection a peer can touch, and only this connection's peer);
//! - the send staging ring, of the *peer's* ring size, registered
//!   [`Access::LOCAL`](crate::verbs::Access::LOCAL) (on READ pull, protocol §16,
//!   [`Access::READABLE`](crate::verbs::Access::READABLE): the peer reads its DATA from
//!   there, and a reused one is zeroed first) and indexed
//!   by `cursor mod size` (the protocol core never lets a staged byte be overwritten before the
//!   peer has credited it, which implies its write completed);
//! - `R` receive slots of [`MAX_CONTROL_LEN`] bytes (every message consumes one receive; only
//!   control SENDs use its buffer), or of [`SENDS_BUF`](rdmashim_proto::SENDS_BUF) bytes on a link that offers the sends
//!   kind (protocol §15: its peer's DATA arrive there, and are copied into the ring);
//! - a small registered buffer for control SENDs that do not fit the granted inline size.
//!
//! Send-queue accounting: every send WR gets a sequence number (its `wr_id`, tagged with
//! [`SEND_TAG`]); most are unsignaled and every `signal_every`-th is signaled. Send queues
//! complete in order, so the completion of WR `n` retires every WR up to `n`. The driver posts
//! an action only when [`Endpoint::sq_room`] says there is room (one entry is kept for the
//! teardown fence), so `ibv_post_send` never fails for a full queue.

use std::net::SocketAddr;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use rdmashim_proto::{
    Action, ControlMsg, Imm, Kind, LocalParams, RingDesc, RingSize, MAX_CONTROL_LEN,
};

use crate::cm::{CmId, EventChannel, QpCaps, WriteWr};
use crate::error::{Error, Result};
use crate::pool::{self, Kit, KitSizes, Pooled};
use crate::ring::RegisteredRing;
use crate::sys::ffi;
use crate::verbs::{Access, CompChannel, Cq, Mr, Srq};

/// Tag bit of a send work request's `wr_id` (receives carry their slot index).
pub(crate) const SEND_TAG: u64 = 1 << 63;

/// Sizes of one connection's resources.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EndpointSizes {
    /// Receive ring bytes (power of two, 4 KiB … 8 MiB).
    pub ring_size: usize,
    /// Receives posted (≥ 4).
    pub recv_slots: u16,
    /// Bytes of each receive's buffer: [`MAX_CONTROL_LEN`], or [`SENDS_BUF`](rdmashim_proto::SENDS_BUF) on a link that
    /// offers the sends kind.
    pub recv_buf: usize,
    /// Send queue depth.
    pub sq_depth: u32,
    /// Bytes to ask for as `max_inline_data`.
    pub max_inline: u32,
    /// Zero the receive ring before it is advertised (a link that offers records: a pooled
    /// ring may hold its last connection's, protocol §14).
    pub zero_rx: bool,
    /// Post the receives to a shared receive queue instead of the QP's own (the SRQ kind's
    /// receiving side: a local choice, invisible to the peer).
    pub srq: bool,
}

struct Resources {
    kit: Pooled,
    comp: Arc<CompChannel>,
    cq: Arc<Cq>,
    srq: Option<Arc<Srq>>,
    granted: QpCaps,
}

/// One connection's verbs objects. Field order is drop order: the id (and with it the QP)
/// goes first, then the kit — the PD and the memory the device could still address — back to
/// the pool (no QP is left on its PD, and no work request can touch its memory), then the CQ
/// and channels.
///
/// The kit's fields read as the endpoint's own (`ep.rx`, `ep.tx`, `ep.recv_bufs`: `Deref`).
pub(crate) struct Endpoint {
    pub id: CmId,
    /// The shared receive queue the QP takes its receives from, if it has one (after the QP,
    /// which holds it too; before the kit, whose PD it is on).
    srq: Option<Arc<Srq>>,
    /// Ring moves (protocol §6.4), once the connection takes part in one; freed before the
    /// kit goes back to the pool (a REMOTE_WRITE registration must not outlive its connection
    /// on a PD another connection may take).
    moves: Option<Box<Moves>>,
    kit: Pooled,
    pub cq: Arc<Cq>,
    pub comp: Arc<CompChannel>,
    pub ch: Arc<EventChannel>,
    recv_slots: u16,
    /// Bytes of each receive's buffer ([`EndpointSizes::recv_buf`]).
    recv_buf: usize,
    sq_depth: u32,
    signal_every: u64,
    /// Unsignaled send WRs posted since the last signaled one (the next is signaled when
    /// this reaches `signal_every - 1`: a count, where a remainder of the sequence number
    /// would divide on every post).
    unsignaled: u64,
    /// The DATA's WRITE WITH IMMEDIATE, kept from one post to the next ([`Self::post_data`]).
    data_wr: WriteWr,
    /// Sequence number of the next send WR.
    sq_posted: u64,
    /// Every send WR below this has completed.
    sq_done: u64,
    /// Whether the last posted send WR was signaled.
    last_signaled: bool,
    /// Receive slots whose completion was handled and that are not posted again yet: they
    /// are, all in one chained call, before the next credit that returns slots
    /// ([`Self::flush_reposts`]).
    reposts: Vec<u16>,
}

/// An endpoint's rings of other generations than its kit's (protocol §6.4: an offered ring,
/// a ring moved away from, the staging area of the peer's other ring), on the kit's PD: its
/// receive rings, and its staging areas.
#[derive(Default)]
struct Moves {
    rx: Gens,
    tx: Gens,
}

/// One kind of an endpoint's rings by generation: the generation of the kit's own, and the
/// others.
#[derive(Default)]
struct Gens {
    kit: u32,
    more: Vec<(u32, RegisteredRing)>,
}

impl Gens {
    /// The ring of generation `gen`: `kit` (the kit's own ring of this kind) if it is the
    /// kit's generation, else one of the others, if still here.
    fn get<'a>(
        gens: Option<&'a Gens>,
        gen: u32,
        kit: Option<&'a RegisteredRing>,
    ) -> Option<&'a RegisteredRing> {
        match gens {
            Some(g) if gen != g.kit => g.more.iter().find(|(n, _)| *n == gen).map(|(_, r)| r),
            Some(_) => kit,
            None => kit.filter(|_| gen == 0),
        }
    }

    /// [`Self::get`], mutable.
    fn get_mut<'a>(
        gens: Option<&'a mut Gens>,
        gen: u32,
        kit: Option<&'a mut RegisteredRing>,
    ) -> Option<&'a mut RegisteredRing> {
        match gens {
            Some(g) if gen != g.kit => g.more.iter_mut().find(|(n, _)| *n == gen).map(|(_, r)| r),
            Some(_) => kit,
            None => kit.filter(|_| gen == 0),
        }
    }

    /// The ring of generation `gen` is needed no more: freed if it is one of the others; if
    /// it is the kit's, the ring of generation `current` is returned, to take its place in the
    /// kit (so that the kit holds the ring in use).
    fn release(&mut self, gen: u32, current: u32) -> Option<RegisteredRing> {
        if gen != self.kit {
            self.more.retain(|(n, _)| *n != gen);
            return None;
        }
        let i = self.more.iter().position(|(n, _)| *n == current)?;
        let (n, ring) = self.more.swap_remove(i);
        self.kit = n;
        Some(ring)
    }
}

/// Posts receives `ids` (`len`-byte buffers of `bufs`, by slot) to the connection's shared
/// receive queue if it has one, else to its QP's own receive queue.
fn post_receives(
    id: &CmId,
    srq: Option<&Srq>,
    ids: &[u16],
    bufs: &crate::verbs::Mr,
    len: usize,
) -> Result<()> {
    match srq {
        Some(q) => q.post_recvs(ids, bufs, len),
        None => id.post_recvs(ids, bufs, len),
    }
}

impl Endpoint {
    /// Builds the resources on `id` (already bound to a device: after route resolution, or a
    /// connect request's id) and posts all receives. `ch` is the id's own event channel. On
    /// failure the id comes back (a listener still has to reject it).
    pub fn new(
        mut id: CmId,
        ch: Arc<EventChannel>,
        sz: EndpointSizes,
    ) -> std::result::Result<Self, Box<(Error, CmId)>> {
        match Self::resources(&mut id, sz) {
            Ok(mut r) => Ok(Self {
                kit: {
                    if sz.zero_rx {
                        r.kit.rx.ring_mut().zero();
                    }
                    r.kit
                },
                id,
                srq: r.srq,
                moves: None,
                cq: r.cq,
                comp: r.comp,
                ch,
                recv_slots: sz.recv_slots,
                recv_buf: sz.recv_buf,
                sq_depth: sz.sq_depth.min(r.granted.max_send_wr),
                signal_every: u64::from((sz.sq_depth / 4).max(1)),
                unsignaled: 0,
                data_wr: WriteWr::new(),
                sq_posted: 0,
                sq_done: 0,
                last_signaled: true,
                reposts: Vec::with_capacity(usize::from(sz.recv_slots)),
            }),
            Err(e) => Err(Box::new((e, id))),
        }
    }

    fn resources(id: &mut CmId, sz: EndpointSizes) -> Result<Resources> {
        let ctx = id.context()?;
        // This connection's kit: a PD of its own with the memory registered on it, pooled or
        // new (crate::pool). The QP goes on that PD, so the only memory its peer can reach is
        // this connection's receive ring.
        let kit = pool::kit(
            &ctx,
            KitSizes {
                ring: sz.ring_size,
                recv: usize::from(sz.recv_slots) * sz.recv_buf,
                ctl: sz.sq_depth as usize * MAX_CONTROL_LEN,
            },
        )?;
        let comp = CompChannel::new(&ctx)?;
        let cqe = (sz.sq_depth + u32::from(sz.recv_slots) + 8) as i32;
        let cq = Cq::new(&ctx, cqe, Some(&comp))?;
        let srq = if sz.srq {
            Some(Srq::new(&kit.pd, u32::from(sz.recv_slots))?)
        } else {
            None
        };
        id.create_qp_srq(
            &kit.pd,
            &cq,
            &cq,
            QpCaps {
                max_send_wr: sz.sq_depth,
                max_recv_wr: u32::from(sz.recv_slots),
                max_inline_data: sz.max_inline,
            },
            srq.as_ref(),
        )?;
        let granted = id.qp_caps().unwrap_or_default();
        let slots: Vec<u16> = (0..sz.recv_slots).collect();
        if let Err(e) = post_receives(id, srq.as_deref(), &slots, kit.recv_bufs.mr(), sz.recv_buf) {
            // The id (and its QP on the kit's PD) goes back to the caller and lives on: the kit
            // must not serve another connection beside it.
            kit.discard();
            return Err(e);
        }
        Ok(Resources {
            kit,
            comp,
            cq,
            srq,
            granted,
        })
    }

    /// What this side advertises in its handshake message.
    pub fn local_params(&self) -> LocalParams {
        LocalParams {
            ring: Self::desc_of(&self.kit.rx),
            recv_slots: self.recv_slots,
        }
    }

    /// Makes the send staging ring `size` bytes (the peer's ring size), keeping one already
    /// registered at that size and access (a dial registers it before the reply, guessing
    /// the peer's size is its own and that the kind it offers is taken: the reply then costs
    /// no registration).
    pub fn ensure_peer_ring(&mut self, size: RingSize, readable: bool) -> Result<()> {
        self.set_peer_ring(size, readable)
    }

    /// Registers the send staging ring once the peer's ring size is known, on the kit's PD
    /// (the QP's), for the peer to read when `readable` (READ pull, protocol §16); a reused
    /// kit's staging ring of that size and access is kept (zeroed, if readable).
    pub fn set_peer_ring(&mut self, size: RingSize, readable: bool) -> Result<()> {
        self.kit.set_tx(size.bytes() as usize, readable)
    }

    /// READ pull (protocol §16): the staging area's description, for the peer to read from.
    pub fn staging_desc(&self) -> Option<RingDesc> {
        self.kit.tx.as_ref().map(Self::desc_of)
    }

    // ----- ring moves (protocol §6.4) ---------------------------------------------------------

    /// Registers a receive ring of `size` bytes to offer the peer ([`Access::RING`] on the
    /// kit's PD: the peer can reach it through this connection's queue pair alone); give it
    /// to [`Self::add_rx`] under the generation the core named, or drop it.
    pub fn new_rx(&self, size: RingSize) -> Result<RegisteredRing> {
        RegisteredRing::new(&self.kit.pd, size.bytes() as usize, Access::RING)
    }

    /// The receive ring of generation `gen` (offered to the peer) is this endpoint's.
    pub fn add_rx(&mut self, gen: u32, ring: RegisteredRing) {
        self.moves.get_or_insert_default().rx.more.push((gen, ring));
    }

    /// A ring's description for the peer.
    pub fn desc_of(ring: &RegisteredRing) -> RingDesc {
        RingDesc {
            addr: ring.mr().addr() as u64,
            rkey: ring.mr().rkey(),
            size: RingSize::new(ring.size() as u64).expect("a mapped ring's size is valid"),
        }
    }

    /// The receive ring of generation `gen`, if it is still here.
    pub fn rx_ring(&self, gen: u32) -> Option<&RegisteredRing> {
        Gens::get(
            self.moves.as_deref().map(|m| &m.rx),
            gen,
            Some(&self.kit.rx),
        )
    }

    /// The receive ring of generation `gen` is read no more: it is freed. If it is the kit's,
    /// the ring of generation `current` takes its place there (so that the kit, when pooled,
    /// holds the ring in use).
    pub fn release_rx(&mut self, gen: u32, current: u32) {
        let Some(m) = self.moves.as_mut() else { return };
        if let Some(ring) = m.rx.release(gen, current) {
            drop(self.kit.replace_rx(ring));
        }
    }

    /// Registers the staging area of generation `gen` (`size` bytes, the peer's offered ring's
    /// size), before any write of that generation.
    pub fn new_tx(&mut self, gen: u32, size: RingSize) -> Result<()> {
        let ring = RegisteredRing::new(&self.kit.pd, size.bytes() as usize, Access::LOCAL)?;
        self.moves.get_or_insert_default().tx.more.push((gen, ring));
        Ok(())
    }

    /// The staging area of generation `gen`, if it is still here.
    pub fn tx_ring_mut(&mut self, gen: u32) -> Option<&mut RegisteredRing> {
        let gens = self.moves.as_deref_mut().map(|m| &mut m.tx);
        Gens::get_mut(gens, gen, self.kit.tx.as_mut())
    }

    fn tx_ring(&self, gen: u32) -> Option<&RegisteredRing> {
        Gens::get(
            self.moves.as_deref().map(|m| &m.tx),
            gen,
            self.kit.tx.as_ref(),
        )
    }

    /// The staging area of generation `gen` is needed no more: as [`Self::release_rx`].
    pub fn release_tx(&mut self, gen: u32, current: u32) {
        let Some(m) = self.moves.as_mut() else { return };
        if let Some(ring) = m.tx.release(gen, current) {
            drop(self.kit.replace_tx(ring));
        }
    }

    /// Receive `slot` (its buffer is `MAX_CONTROL_LEN` bytes of `recv_bufs`) is free again:
    /// it is posted before the next credit that returns slots (`Action::returns_slots`), not
    /// now. A slot returns to the peer only through a credit, so the peer can never use a
    /// receive that is not posted (protocol §5.2); the receives a credit returns are posted in
    /// one chained call, and a message costs the data path no post of its own (one took
    /// ~1.5 µs of a 64 B ping-pong's critical path in the VM).
    pub fn repost_recv(&mut self, slot: u16) {
        debug_assert!(slot < self.recv_slots && !self.reposts.contains(&slot));
        self.reposts.push(slot);
    }

    /// Posts the receives [`Self::repost_recv`] deferred (called before a credit that returns
    /// slots).
    pub fn flush_reposts(&mut self) -> Result<()> {
        if self.reposts.is_empty() {
            return Ok(());
        }
        let r = post_receives(
            &self.id,
            self.srq.as_deref(),
            &self.reposts,
            self.kit.recv_bufs.mr(),
            self.recv_buf,
        );
        self.reposts.clear();
        r
    }

    /// The bytes a SEND left in receive `slot`: a control message, or a DATA of the sends
    /// kind (at most the buffer's size: the device fails a longer one).
    pub fn recv_payload(&self, slot: u16, len: u32) -> &[u8] {
        &self.kit.recv_bufs.as_slice()[self.recv_range(slot, len)]
    }

    /// Where in `recv_bufs` the first `len` bytes of receive `slot` are (at most its buffer).
    fn recv_range(&self, slot: u16, len: u32) -> std::ops::Range<usize> {
        let start = usize::from(slot) * self.recv_buf;
        start..start + (len as usize).min(self.recv_buf)
    }

    /// Sends (protocol §15): copies the `len` bytes a DATA SEND left in receive `slot` into
    /// the receive ring of generation `gen` at `offset` (where the core says they belong; the
    /// double mapping takes a copy across the ring's end). Returns whether that ring is here.
    pub fn land_send(&mut self, slot: u16, len: u32, gen: u32, offset: usize) -> bool {
        let range = self.recv_range(slot, len);
        let len = range.len();
        let kit: &mut Kit = &mut self.kit;
        let rx = Gens::get_mut(
            self.moves.as_deref_mut().map(|m| &mut m.rx),
            gen,
            Some(&mut kit.rx),
        );
        let Some(rx) = rx else { return false };
        let bytes = &kit.recv_bufs.as_slice()[range];
        rx.ring_mut().slice_mut(offset, len).copy_from_slice(bytes);
        true
    }

    /// Whether `wr_id` belongs to a receive slot of this endpoint.
    pub fn recv_slot(&self, wr_id: u64) -> Option<u16> {
        (wr_id & SEND_TAG == 0 && wr_id < u64::from(self.recv_slots)).then_some(wr_id as u16)
    }

    /// Send WRs that may still be posted (one entry stays free for the teardown fence).
    pub fn sq_room(&self) -> u64 {
        (u64::from(self.sq_depth) - 1).saturating_sub(self.outstanding())
    }

    /// Send WRs posted and not known to be complete.
    pub fn outstanding(&self) -> u64 {
        self.sq_posted - self.sq_done
    }

    /// Send WRs known to be complete (every WR below this sequence number): it moves only when
    /// the peer's device acknowledges what was sent.
    pub fn completed(&self) -> u64 {
        self.sq_done
    }

    /// Whether the most recent send WR asked for a completion (if not, waiting for the send
    /// queue to drain needs a signaled fence behind it).
    pub fn last_signaled(&self) -> bool {
        self.last_signaled
    }

    /// A send completion (successful or flushed) for `wr_id`: it and every WR before it are done.
    pub fn on_send_completion(&mut self, wr_id: u64) {
        let seq = wr_id & !SEND_TAG;
        if seq < self.sq_posted {
            self.sq_done = self.sq_done.max(seq + 1);
        }
    }

    fn next_wr(&mut self, force_signal: bool) -> (u64, bool) {
        let seq = self.sq_posted;
        let signaled = force_signal || self.unsignaled + 1 >= self.signal_every;
        (seq, signaled)
    }

    fn posted(&mut self, signaled: bool) {
        self.sq_posted += 1;
        self.last_signaled = signaled;
        self.unsignaled = if signaled { 0 } else { self.unsignaled + 1 };
    }

    /// Posts one action of the protocol core (not `Teardown`). The caller checked
    /// [`Self::sq_room`]. `kind`: the connection's; over sends (protocol §15) a DATA, a credit
    /// and a doorbell are SENDs WITH IMMEDIATE instead of WRITEs; over READ pull (§16) a DATA
    /// is a zero-length WRITE WITH IMMEDIATE, its bytes left in staging for the peer to read.
    pub fn post(&mut self, action: &Action, peer_rkey: u32, kind: Kind) -> Result<()> {
        let sends = kind == Kind::Sends;
        // (the receives a credit returns are posted before it is; nothing else needs them, and
        // a ping-pong would pay a post per message on its critical path)
        if action.returns_slots() {
            self.flush_reposts()?;
        }
        match *action {
            Action::WriteData {
                len,
                gen,
                ring_offset,
                imm,
                ..
            } if sends => self.post_from(Some(gen), ring_offset, len, None, Some(imm))?,
            Action::WriteData {
                remote_addr,
                rkey,
                imm,
                ..
            } if kind == Kind::Read => {
                self.post_from(None, 0, 0, Some((remote_addr, rkey)), Some(imm))?
            }
            Action::WriteData {
                len,
                gen,
                ring_offset,
                remote_addr,
                rkey,
                imm,
                ..
            } => self.post_data(gen, ring_offset, len, remote_addr, rkey, imm)?,
            Action::WriteRecord {
                len,
                gen,
                ring_offset,
                remote_addr,
                rkey,
                header,
                trailer_at,
                imm,
                ..
            } => {
                // The header and the trailer around the payload the sends staged (the double
                // mapping keeps a record that wraps contiguous for the WRITE; the trailer of one
                // that wraps is written in the first view); the trailer is the last word the
                // WRITE places, and the receiver reads nothing before it.
                let tx = self
                    .tx_ring_mut(gen)
                    .ok_or(Error::InvalidArgument("no send staging ring"))?
                    .ring_mut();
                let word = header.to_le_bytes();
                let trailer = (ring_offset + trailer_at) % tx.size();
                tx.slice_mut(ring_offset, 8).copy_from_slice(&word);
                tx.slice_mut(trailer, 8).copy_from_slice(&word);
                self.post_from(Some(gen), ring_offset, len, Some((remote_addr, rkey)), imm)?;
            }
            // (zero-length: a WRITE WITH IMMEDIATE to the peer's ring, a SEND over sends)
            Action::WriteCredit { remote_addr, imm } | Action::Doorbell { remote_addr, imm } => {
                let to = (!sends).then_some((remote_addr, peer_rkey));
                self.post_from(None, 0, 0, to, Some(imm))?
            }
            Action::Send(msg) => self.post_control(&msg)?,
            Action::Teardown => {
                return Err(Error::InvalidArgument("Teardown is not a work request"))
            }
            // (local work, done by the link: nothing to post)
            Action::NewStaging { .. }
            | Action::ReleaseStaging { .. }
            | Action::ReleaseRing { .. } => {
                return Err(Error::InvalidArgument("not a work request"))
            }
        }
        Ok(())
    }

    /// `len` bytes at `offset` of the staging area of generation `gen` (the peer's ring's
    /// offset too), or without `gen` none of the control buffer (a zero-length message): one
    /// RDMA WRITE to `to` = (remote address, rkey), or without `to` one SEND (the sends kind),
    /// either WITH IMMEDIATE when `imm` is given.
    fn post_from(
        &mut self,
        gen: Option<u32>,
        offset: usize,
        len: usize,
        to: Option<(u64, u32)>,
        imm: Option<Imm>,
    ) -> Result<()> {
        let (seq, signaled) = self.next_wr(false);
        // (an error made only when it is returned: an `ok_or` would build one and drop it,
        // a call, on every post)
        let mr = match gen {
            Some(gen) => self.staging_mr(gen)?,
            None => self.kit.ctl_bufs.mr(),
        };
        let (wr_id, imm) = (SEND_TAG | seq, imm.map(Imm::encode));
        match to {
            Some((addr, rkey)) => self
                .id
                .post_write(wr_id, mr, offset, len, addr, rkey, imm, signaled)?,
            None => self.id.post_send(wr_id, mr, offset, len, imm, signaled)?,
        }
        self.posted(signaled);
        Ok(())
    }

    /// The registration of the staging area of generation `gen`.
    fn staging_mr(&self, gen: u32) -> Result<&Mr> {
        // (an error made only when it is returned: an `ok_or` would build one and drop it,
        // a call, on every post)
        match self.tx_ring(gen) {
            Some(tx) => Ok(tx.mr()),
            None => Err(Error::InvalidArgument("no send staging ring")),
        }
    }

    /// Posts the DATA of the write's lane (`Connection::send_data`): as [`Self::post`] posts
    /// its action, the receives it returns posted first.
    // (inline on the data path: a call and a return less a message, each return a block
    // lookup under emulation — docs/bench/kinds.md, session 62)
    #[inline(always)]
    pub fn post_lane(&mut self, w: &rdmashim_proto::LaneWrite) -> Result<()> {
        if w.returns_slots() {
            self.flush_reposts()?;
        }
        self.post_data(w.gen, w.offset, w.len, w.remote_addr, w.rkey, w.imm)
    }

    /// A DATA of the ring kinds: `len` bytes at `offset` of the staging area of generation
    /// `gen`, one WRITE WITH IMMEDIATE to `remote_addr`/`rkey`, through the connection's kept
    /// work request ([`WriteWr`]: the fields a DATA changes are written, the rest stays).
    fn post_data(
        &mut self,
        gen: u32,
        offset: usize,
        len: usize,
        remote_addr: u64,
        rkey: u32,
        imm: Imm,
    ) -> Result<()> {
        let (seq, signaled) = self.next_wr(false);
        let sge = self.staging_mr(gen)?.sge(offset, len)?;
        self.id.post_write_imm(
            &mut self.data_wr,
            SEND_TAG | seq,
            sge,
            (remote_addr, rkey),
            imm.encode(),
            signaled,
        )?;
        self.posted(signaled);
        Ok(())
    }

    /// READ pull (protocol §16): a signaled RDMA READ of `len` bytes at `offset` of the
    /// peer's staging area `src` into the receive ring of generation `gen` at the same
    /// offset (the double mappings keep a piece across either ring's end contiguous, and
    /// both registrations cover both views). Returns its sequence number: it has completed
    /// once [`Self::completed`] is past it.
    pub fn post_read(
        &mut self,
        gen: u32,
        offset: usize,
        len: usize,
        src: &RingDesc,
    ) -> Result<u64> {
        let (seq, _) = self.next_wr(true);
        let mr = self
            .rx_ring(gen)
            .ok_or(Error::InvalidArgument("no receive ring of that generation"))?
            .mr();
        let from = src.addr.wrapping_add(offset as u64);
        self.id
            .post_read(SEND_TAG | seq, mr, offset, len, from, src.rkey)?;
        self.posted(true);
        Ok(seq)
    }

    /// A control SEND: inline when it fits the granted `max_inline_data` (copied into the WQE
    /// at post time), else from the control buffer's slot `seq mod sq_depth`, which cannot be
    /// reused before this WR completed because at most `sq_depth` WRs are outstanding.
    fn post_control(&mut self, msg: &ControlMsg) -> Result<()> {
        let bytes = msg.encode();
        let bytes = bytes.as_bytes();
        let (seq, signaled) = self.next_wr(false);
        let off = (seq % u64::from(self.sq_depth)) as usize * MAX_CONTROL_LEN;
        self.kit.ctl_bufs.as_mut_slice()[off..off + bytes.len()].copy_from_slice(bytes);
        // post_send posts inline by itself when the length fits the granted inline size.
        self.id.post_send(
            SEND_TAG | seq,
            self.kit.ctl_bufs.mr(),
            off,
            bytes.len(),
            None,
            signaled,
        )?;
        self.posted(signaled);
        Ok(())
    }

    /// A signaled zero-length RDMA WRITE (no immediate: it consumes no receive at the peer and
    /// is invisible to the protocol) behind unsignaled WRs, so that their completion can be
    /// observed before the connection is disconnected.
    pub fn post_fence(&mut self, peer: &RingDesc) -> Result<()> {
        let (seq, _) = self.next_wr(true);
        self.id.post_write(
            SEND_TAG | seq,
            self.kit.ctl_bufs.mr(),
            0,
            0,
            peer.addr,
            peer.rkey,
            None,
            true,
        )?;
        self.posted(true);
        Ok(())
    }

    /// Whether the connection's device is software (see [`crate::verbs::Context::is_software`]).
    pub fn software_device(&self) -> bool {
        self.kit.pd.context().is_software()
    }

    /// The queue pair's local ACK timeout exponent, as the device has it.
    pub fn ack_timeout(&self) -> Result<u8> {
        self.id.ack_timeout()
    }

    /// Local address of the connection.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.id.local_addr()
    }

    /// Peer address of the connection.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.id.peer_addr()
    }

    /// `true` when the completion's opcode is a receive with immediate.
    pub fn is_write_imm(wc: &ffi::ibv_wc) -> bool {
        wc.opcode == ffi::ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM
    }
}

impl Deref for Endpoint {
    type Target = Kit;
    fn deref(&self) -> &Kit {
        &self.kit
    }
}

impl DerefMut for Endpoint {
    fn deref_mut(&mut self) -> &mut Kit {
        &mut self.kit
    }
}

/// RDMA tier (in the soft-RoCE VM): the peer of one connection cannot reach another
/// connection's receive ring, whatever it knows of it. Built from endpoints directly (the
/// forged write needs a queue pair the test can post on), connected through rdma_cm.
#[cfg(test)]
mod isolation {
    use std::collections::HashSet;
    use std::net::SocketAddr;
    use std::sync::Arc;
    use std::time::Duration;

    use rdmashim_proto::RingSize;

    use super::{Endpoint, EndpointSizes};
    use crate::cm::{event_type as ev, CmId, ConnParam, EventChannel};
    use crate::sys::ffi;
    use crate::verbs::{empty_wc, Cq};

    const T: Duration = Duration::from_secs(20);
    const RING: usize = 64 * 1024;
    const LEN: usize = 4096;

    fn sizes() -> EndpointSizes {
        EndpointSizes {
            ring_size: RING,
            recv_slots: 16,
            recv_buf: rdmashim_proto::MAX_CONTROL_LEN,
            sq_depth: 16,
            max_inline: 64,
            zero_rx: false,
            srq: false,
        }
    }

    /// `RDMASHIM_TEST_IP` on the port this test owns; fails (never skips) outside the VM tier.
    fn test_addr() -> SocketAddr {
        let dev = std::env::var("RDMASHIM_TEST_DEVICE").unwrap_or_default();
        assert!(
            !dev.is_empty()
                && std::path::Path::new("/sys/class/infiniband")
                    .join(&dev)
                    .exists(),
            "RDMA test selected without a device (RDMASHIM_TEST_DEVICE={dev:?}): run it in the \
             VM tier (scripts/rdma-vm, or scripts/test)"
        );
        let ip = std::env::var("RDMASHIM_TEST_IP")
            .expect("RDMASHIM_TEST_IP not set: run RDMA tests in the VM tier (scripts/rdma-vm)");
        let ip = ip.parse().expect("RDMASHIM_TEST_IP is not an IP address");
        SocketAddr::new(ip, 20000 + (std::process::id() % 1000) as u16 * 16 + 15)
    }

    /// One connection: both endpoints made as a dial and an accept make them (the server's id
    /// migrated to a channel of its own), with staging rings of the peer's size.
    struct Pair {
        client: Endpoint,
        server: Endpoint,
    }

    fn connect(listen_ch: &Arc<EventChannel>, addr: SocketAddr) -> Pair {
        let ch = EventChannel::new().expect("event channel");
        let id = CmId::new(&ch).expect("rdma_create_id");
        id.resolve_blocking(&ch, addr, Duration::from_secs(5), T)
            .expect("address and route resolved");
        let mut client = Endpoint::new(id, ch.clone(), sizes())
            .unwrap_or_else(|f| panic!("client endpoint: {}", f.0));
        client
            .set_peer_ring(RingSize::new(RING as u64).unwrap(), false)
            .unwrap();
        client
            .id
            .connect(&ConnParam::default())
            .expect("rdma_connect");

        let (req, id) = listen_ch.next_event_owned(T).expect("connect request");
        assert_eq!(
            req.kind,
            ev::RDMA_CM_EVENT_CONNECT_REQUEST,
            "{}",
            req.name()
        );
        let mut id = id.expect("a request carries its id");
        let sch = EventChannel::new().expect("event channel");
        id.migrate(&sch).expect("rdma_migrate_id");
        let mut server = Endpoint::new(id, sch.clone(), sizes())
            .unwrap_or_else(|f| panic!("server endpoint: {}", f.0));
        server
            .set_peer_ring(RingSize::new(RING as u64).unwrap(), false)
            .unwrap();
        server
            .id
            .accept(&ConnParam::default())
            .expect("rdma_accept");
        ch.expect(ev::RDMA_CM_EVENT_ESTABLISHED, "ESTABLISHED", T)
            .expect("established (client)");
        sch.expect(ev::RDMA_CM_EVENT_ESTABLISHED, "ESTABLISHED", T)
            .expect("established (server)");
        Pair { client, server }
    }

    fn pattern(seed: u8) -> Vec<u8> {
        (0..LEN)
            .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed) ^ (i >> 8) as u8)
            .collect()
    }

    fn wait_wc(cq: &Cq, what: &str) -> ffi::ibv_wc {
        let mut wc = [empty_wc()];
        let n = cq
            .wait(&mut wc, T.as_millis() as u64)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(n, 1, "{what}");
        wc[0]
    }

    /// `from` stages `bytes` and RDMA-WRITEs them (signaled) to `to`'s ring at `offset` with
    /// the address and rkey `to` advertises; returns the sender's completion status.
    fn write(from: &mut Endpoint, to: &Endpoint, offset: usize, bytes: &[u8], imm: bool) -> u32 {
        let ring = to.local_params().ring;
        write_to(from, ring.addr + offset as u64, ring.rkey, bytes, imm)
    }

    fn write_to(from: &mut Endpoint, addr: u64, rkey: u32, bytes: &[u8], imm: bool) -> u32 {
        let tx = from.tx.as_mut().expect("staging ring");
        tx.ring_mut()
            .slice_mut(0, bytes.len())
            .copy_from_slice(bytes);
        let tx = from.tx.as_ref().expect("staging ring");
        let imm = imm.then_some(0x5EED_0001);
        from.id
            .post_write(7, tx.mr(), 0, bytes.len(), addr, rkey, imm, true)
            .expect("ibv_post_send");
        wait_wc(&from.cq, "the writer's completion").status
    }

    /// A checked delivery on a healthy connection: the write completes, the receiver gets its
    /// immediate, and the bytes are in its ring.
    fn deliver(from: &mut Endpoint, to: &Endpoint, offset: usize, bytes: &[u8]) {
        let st = write(from, to, offset, bytes, true);
        assert_eq!(
            st,
            ffi::ibv_wc_status::IBV_WC_SUCCESS,
            "delivery: send status"
        );
        let wc = wait_wc(&to.cq, "delivery: receive");
        assert_eq!(
            wc.status,
            ffi::ibv_wc_status::IBV_WC_SUCCESS,
            "delivery: receive status"
        );
        assert_eq!(wc.opcode, ffi::ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM);
        assert!(
            to.rx.ring().slice(offset, bytes.len()) == bytes,
            "delivered bytes differ"
        );
    }

    fn pd_of(ep: &Endpoint) -> usize {
        ep.rx.mr().pd().as_ptr() as usize
    }

    #[test]
    #[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
    fn a_peer_cannot_write_into_another_connections_ring() {
        let addr = test_addr();
        let listen_ch = EventChannel::new().expect("event channel");
        let listener = CmId::new(&listen_ch).expect("rdma_create_id");
        listener.bind(addr).expect("rdma_bind_addr");
        listener.listen(8).expect("rdma_listen");

        let mut c1 = connect(&listen_ch, addr);
        let mut c2 = connect(&listen_ch, addr);
        let (a, b) = (pattern(1), pattern(2));
        deliver(&mut c1.client, &c1.server, 0, &a);
        deliver(&mut c1.server, &c1.client, 0, &b);

        // The attacker: connection 2's client, the peer of c2.server. It knows connection 1's
        // server ring (address and rkey, as c1.client was told them) and writes into it
        // through its own queue pair.
        let victim = c1.server.local_params().ring;
        let target = 2 * LEN;
        let before = c1.server.rx.ring().slice(target, LEN).to_vec();
        let forged = vec![0xEE; LEN];
        let st = write_to(
            &mut c2.client,
            victim.addr + target as u64,
            victim.rkey,
            &forged,
            false,
        );
        assert_eq!(
            st,
            ffi::ibv_wc_status::IBV_WC_REM_ACCESS_ERR,
            "the forged write completed with status {st} (0 = success: it landed in \
             connection 1's ring)"
        );
        assert!(
            c1.server.rx.ring().slice(target, LEN) == &before[..],
            "connection 1's ring was written by connection 2's peer"
        );

        // Only the attacker's connection is dead, at both ends: the queue pair it wrote
        // through went to the error state (its receives are flushed: a link fails on that),
        // and its own is in error too (what it posts next is flushed). Connection 1 goes on
        // carrying bytes, intact, both ways.
        let wc = wait_wc(
            &c2.server.cq,
            "connection 2's server, after the forged write",
        );
        assert_eq!(
            wc.status,
            ffi::ibv_wc_status::IBV_WC_WR_FLUSH_ERR,
            "connection 2's server: {:?}",
            (wc.status, wc.opcode)
        );
        let st = write(&mut c2.client, &c2.server, 0, &a, true);
        assert_eq!(
            st,
            ffi::ibv_wc_status::IBV_WC_WR_FLUSH_ERR,
            "the attacker's connection still works"
        );
        let (c, d) = (pattern(3), pattern(4));
        deliver(&mut c1.client, &c1.server, LEN, &c);
        deliver(&mut c1.server, &c1.client, LEN, &d);
        assert!(
            c1.server.rx.ring().slice(0, LEN) == &a[..],
            "connection 1's first bytes"
        );
        assert!(
            c1.client.rx.ring().slice(0, LEN) == &b[..],
            "connection 1's first bytes"
        );
        assert!(c1.server.rx.ring().slice(target, LEN) == &before[..]);
        let mut wcs = [empty_wc(); 4];
        assert_eq!(
            c1.server.cq.poll(&mut wcs).unwrap(),
            0,
            "connection 1: stray completion"
        );
        assert_eq!(
            c1.client.cq.poll(&mut wcs).unwrap(),
            0,
            "connection 1: stray completion"
        );

        // Connection 2 ends; its resources go back to the pool and the next connection takes
        // them: each endpoint in a protection domain of its own, no live connection's.
        let pooled_rings: HashSet<usize> = [&c2.client, &c2.server]
            .iter()
            .map(|e| e.rx.mr().addr() as usize)
            .collect();
        drop(c2);
        let c3 = connect(&listen_ch, addr);
        for ep in [&c3.client, &c3.server] {
            assert!(
                pooled_rings.contains(&(ep.rx.mr().addr() as usize)),
                "connection 3 did not reuse connection 2's registrations"
            );
        }
        let live = [
            pd_of(&c1.client),
            pd_of(&c1.server),
            pd_of(&c3.client),
            pd_of(&c3.server),
        ];
        let distinct: HashSet<usize> = live.iter().copied().collect();
        assert_eq!(
            distinct.len(),
            live.len(),
            "live connections share a PD: {live:x?}"
        );
        for ep in [&c3.client, &c3.server] {
            let qp_pd = ep.id.qp_pd_addr();
            assert_eq!(qp_pd, pd_of(ep), "the queue pair is not on its ring's PD");
        }

        // And the reused kits carry connection 3 as well, while connection 1 still works.
        let mut c3 = c3;
        deliver(&mut c3.client, &c3.server, 0, &c);
        deliver(&mut c3.server, &c3.client, 0, &d);
        deliver(&mut c1.client, &c1.server, 2 * LEN, &d);
    }
}
