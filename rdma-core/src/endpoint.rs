//! The verbs resources of one ring-stream connection, and the work requests it posts.
//!
//! Per connection (see `docs/protocol.md`, "Transport"):
//!
//! - an RC QP made through rdma_cm, on its own rdma_cm event channel (an accepted id is
//!   migrated off the listener's channel), so that DISCONNECTED and errors of one connection are
//!   seen by that connection;
//! - one CQ for sends and receives, with a completion channel whose fd is non-blocking;
//! - the receive ring: a [`RegisteredRing`] registered with [`Access::RING`]
//!   (LOCAL_WRITE | REMOTE_WRITE: the only memory of the process a peer can touch);
//! - the send staging ring, of the *peer's* ring size, registered [`Access::LOCAL`] and indexed
//!   by `cursor mod size` (the protocol core never lets a staged byte be overwritten before the
//!   peer has credited it, which implies its write completed);
//! - `R` receive slots of [`MAX_CONTROL_LEN`] bytes (every message consumes one receive; only
//!   control SENDs use its buffer);
//! - a small registered buffer for control SENDs that do not fit the granted inline size.
//!
//! Send-queue accounting: every send WR gets a sequence number (its `wr_id`, tagged with
//! [`SEND_TAG`]); most are unsignaled and every `signal_every`-th is signaled. Send queues
//! complete in order, so the completion of WR `n` retires every WR up to `n`. The driver posts
//! an action only when [`Endpoint::sq_room`] says there is room (one entry is kept for the
//! teardown fence), so `ibv_post_send` never fails for a full queue.

use std::net::SocketAddr;
use std::sync::Arc;

use rdmashim_proto::{Action, ControlMsg, LocalParams, RingDesc, RingSize, MAX_CONTROL_LEN};

use crate::cm::{CmId, EventChannel, QpCaps};
use crate::error::{Error, Result};
use crate::pool::{self, Pooled};
use crate::ring::RegisteredRing;
use crate::sys::ffi;
use crate::verbs::{Access, CompChannel, Cq, Pd, RegisteredBuf};

/// Tag bit of a send work request's `wr_id` (receives carry their slot index).
pub(crate) const SEND_TAG: u64 = 1 << 63;

/// Sizes of one connection's resources.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EndpointSizes {
    /// Receive ring bytes (power of two, 4 KiB … 8 MiB).
    pub ring_size: usize,
    /// Receives posted (≥ 4).
    pub recv_slots: u16,
    /// Send queue depth.
    pub sq_depth: u32,
    /// Bytes to ask for as `max_inline_data`.
    pub max_inline: u32,
}

struct Resources {
    pd: Arc<Pd>,
    comp: Arc<CompChannel>,
    cq: Arc<Cq>,
    rx: Pooled<RegisteredRing>,
    recv_bufs: Pooled<RegisteredBuf>,
    ctl_bufs: Pooled<RegisteredBuf>,
    granted: QpCaps,
}

/// One connection's verbs objects. Field order is drop order: the id (and with it the QP)
/// goes first, then the memory the device could still address, then the CQ and channels.
pub(crate) struct Endpoint {
    pub id: CmId,
    pub rx: Pooled<RegisteredRing>,
    pub tx: Option<Pooled<RegisteredRing>>,
    pub recv_bufs: Pooled<RegisteredBuf>,
    ctl_bufs: Pooled<RegisteredBuf>,
    pub cq: Arc<Cq>,
    pub comp: Arc<CompChannel>,
    _pd: Arc<Pd>,
    pub ch: Arc<EventChannel>,
    recv_slots: u16,
    sq_depth: u32,
    signal_every: u64,
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
            Ok(r) => Ok(Self {
                id,
                rx: r.rx,
                tx: None,
                recv_bufs: r.recv_bufs,
                ctl_bufs: r.ctl_bufs,
                cq: r.cq,
                comp: r.comp,
                _pd: r.pd,
                ch,
                recv_slots: sz.recv_slots,
                sq_depth: sz.sq_depth.min(r.granted.max_send_wr),
                signal_every: u64::from((sz.sq_depth / 4).max(1)),
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
        // One protection domain per device for the whole process, so that registrations can
        // be reused from connection to connection (crate::pool).
        let pd = pool::pd_for(&ctx)?;
        let comp = CompChannel::new(&ctx)?;
        let cqe = (sz.sq_depth + u32::from(sz.recv_slots) + 8) as i32;
        let cq = Cq::new(&ctx, cqe, Some(&comp))?;
        id.create_qp(
            &pd,
            &cq,
            &cq,
            QpCaps {
                max_send_wr: sz.sq_depth,
                max_recv_wr: u32::from(sz.recv_slots),
                max_inline_data: sz.max_inline,
            },
        )?;
        let granted = id.qp_caps().unwrap_or_default();
        let rx = pool::ring(&pd, sz.ring_size, Access::RING)?;
        let recv_bufs = pool::buf(
            &pd,
            usize::from(sz.recv_slots) * MAX_CONTROL_LEN,
            Access::LOCAL,
        )?;
        let ctl_bufs = pool::buf(&pd, sz.sq_depth as usize * MAX_CONTROL_LEN, Access::LOCAL)?;
        let slots: Vec<u16> = (0..sz.recv_slots).collect();
        id.post_recvs(&slots, recv_bufs.mr(), MAX_CONTROL_LEN)?;
        Ok(Resources {
            pd,
            comp,
            cq,
            rx,
            recv_bufs,
            ctl_bufs,
            granted,
        })
    }

    /// What this side advertises in its handshake message.
    pub fn local_params(&self) -> LocalParams {
        LocalParams {
            ring: RingDesc {
                addr: self.rx.mr().addr() as u64,
                rkey: self.rx.mr().rkey(),
                size: RingSize::new(self.rx.size() as u64)
                    .expect("the ring size was checked when it was mapped"),
            },
            recv_slots: self.recv_slots,
        }
    }

    /// Makes the send staging ring `size` bytes (the peer's ring size), keeping one already
    /// registered at that size (a dial registers it before the reply, guessing the peer's size
    /// is its own: the reply then costs no registration).
    pub fn ensure_peer_ring(&mut self, size: RingSize) -> Result<()> {
        if self
            .tx
            .as_ref()
            .is_some_and(|t| t.size() as u64 == size.bytes())
        {
            return Ok(());
        }
        self.tx = None;
        self.set_peer_ring(size)
    }

    /// Maps and registers the send staging ring once the peer's ring size is known.
    pub fn set_peer_ring(&mut self, size: RingSize) -> Result<()> {
        let pd = self.rx.mr().pd().clone();
        self.tx = Some(pool::ring(&pd, size.bytes() as usize, Access::LOCAL)?);
        Ok(())
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
        let r = self
            .id
            .post_recvs(&self.reposts, self.recv_bufs.mr(), MAX_CONTROL_LEN);
        self.reposts.clear();
        r
    }

    /// The payload of a control message received in `slot`.
    pub fn recv_payload(&self, slot: u16, len: u32) -> &[u8] {
        let start = usize::from(slot) * MAX_CONTROL_LEN;
        &self.recv_bufs.as_slice()[start..start + (len as usize).min(MAX_CONTROL_LEN)]
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
        let signaled = force_signal || seq % self.signal_every == self.signal_every - 1;
        (seq, signaled)
    }

    fn posted(&mut self, signaled: bool) {
        self.sq_posted += 1;
        self.last_signaled = signaled;
    }

    /// Posts one action of the protocol core (not `Teardown`). The caller checked
    /// [`Self::sq_room`].
    pub fn post(&mut self, action: &Action, peer_rkey: u32) -> Result<()> {
        // (the receives a credit returns are posted before it is; nothing else needs them, and
        // a ping-pong would pay a post per message on its critical path)
        if action.returns_slots() {
            self.flush_reposts()?;
        }
        match *action {
            Action::WriteData {
                len,
                ring_offset,
                remote_addr,
                imm,
                ..
            } => {
                let (seq, signaled) = self.next_wr(false);
                let tx = self
                    .tx
                    .as_ref()
                    .ok_or(Error::InvalidArgument("no send staging ring"))?;
                self.id.post_write(
                    SEND_TAG | seq,
                    tx.mr(),
                    ring_offset,
                    len,
                    remote_addr,
                    peer_rkey,
                    Some(imm.encode()),
                    signaled,
                )?;
                self.posted(signaled);
            }
            Action::WriteCredit { remote_addr, imm } => {
                let (seq, signaled) = self.next_wr(false);
                self.id.post_write(
                    SEND_TAG | seq,
                    self.ctl_bufs.mr(),
                    0,
                    0,
                    remote_addr,
                    peer_rkey,
                    Some(imm.encode()),
                    signaled,
                )?;
                self.posted(signaled);
            }
            Action::Send(msg) => self.post_control(&msg)?,
            Action::Teardown => {
                return Err(Error::InvalidArgument("Teardown is not a work request"))
            }
        }
        Ok(())
    }

    /// A control SEND: inline when it fits the granted `max_inline_data` (copied into the WQE
    /// at post time), else from the control buffer's slot `seq mod sq_depth`, which cannot be
    /// reused before this WR completed because at most `sq_depth` WRs are outstanding.
    fn post_control(&mut self, msg: &ControlMsg) -> Result<()> {
        let bytes = msg.encode();
        let bytes = bytes.as_bytes();
        let (seq, signaled) = self.next_wr(false);
        let off = (seq % u64::from(self.sq_depth)) as usize * MAX_CONTROL_LEN;
        self.ctl_bufs.as_mut_slice()[off..off + bytes.len()].copy_from_slice(bytes);
        // post_send posts inline by itself when the length fits the granted inline size.
        self.id.post_send(
            SEND_TAG | seq,
            self.ctl_bufs.mr(),
            off,
            bytes.len(),
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
            self.ctl_bufs.mr(),
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
