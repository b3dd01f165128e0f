//! Per-process reuse of the verbs resources a connection is slow to make, one connection's
//! worth at a time.
//!
//! A memory registration pins and maps its pages in the device: for a 512 KiB ring under
//! soft-RoCE that is most of the ~15 ms a connection's set-up costs, and a server accepting a
//! burst of connections pays it serially. So what a connection registers — its `Kit`: a
//! protection domain of its own, and on it the receive ring, the receive buffers, the control
//! buffer and (once registered) the send staging ring — goes back to a bounded pool, whole,
//! when the connection ends, and the next connection of the same sizes takes it instead of
//! registering.
//!
//! Why a PD per kit, not one per device: a PD is the scope of an rkey. A peer's RDMA WRITE
//! arrives on our queue pair, and the device checks its rkey and range against the
//! registrations of *that queue pair's* PD. With one PD shared by every connection, the peer of
//! connection B could write into connection A's receive ring through B's queue pair, knowing
//! or guessing A's ring address and rkey (an rkey is an MR index and an 8-bit key; rings are
//! neighbouring mappings). With the queue pair and the registrations of a connection alone on
//! their PD, the one memory its peer can reach is that connection's receive ring (its only
//! REMOTE_WRITE registration); any other rkey fails the check, the writer gets a remote access
//! error, and its own connection (only it) goes to the error state. A PD costs one command to
//! the device; the registrations are the slow part, and they travel with their PD.
//!
//! A kit belongs to one connection at a time. It goes back only when its `Pooled` owner drops,
//! which in an `Endpoint` happens after the connection's queue pair was destroyed (field
//! order): no work request of the old connection can still touch its memory, and the next
//! connection's queue pair is the only one on its PD. The receive ring
//! keeps its rkey; the old peer's queue pair was connected to the destroyed one and can no
//! longer reach the PD. Stale bytes in a reused ring are never read: readers only read what
//! the new connection's cursors say was written (and staging bytes are sent only once staged).
//!
//! Fork: a child (another pid) must not touch its parent's registrations (they are
//! `MADV_DONTFORK` memory, and deregistering would undo the parent's). The child starts with
//! an empty pool and leaks the inherited one.

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};

use crate::error::Result;
use crate::ring::RegisteredRing;
use crate::verbs::{page_size, Access, Context, Pd, RegisteredBuf};

/// Most bytes of registered memory kept idle in the pool (they stay pinned: memlock).
const MAX_POOLED_BYTES: usize = 64 << 20;

/// The sizes a kit is asked for by (buffers in whole pages).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct KitSizes {
    /// Receive ring bytes.
    pub ring: usize,
    /// Receive buffer bytes.
    pub recv: usize,
    /// Control-send buffer bytes.
    pub ctl: usize,
}

/// One connection's protection domain and the memory registered on it.
pub(crate) struct Kit {
    /// The receive ring ([`Access::RING`]): the only memory on this PD a peer can write.
    pub rx: RegisteredRing,
    /// The send staging ring ([`Access::LOCAL`], or [`Access::READABLE`] on READ pull), of
    /// the peer's ring size, once known ([`Kit::set_tx`]); a reused kit brings the one its
    /// last connection had.
    pub tx: Option<RegisteredRing>,
    /// How `tx` is registered.
    tx_access: Access,
    /// `tx` may hold a past connection's bytes (the kit was pooled since it was zeroed).
    tx_used: bool,
    /// Receive buffers ([`Access::LOCAL`]).
    pub recv_bufs: RegisteredBuf,
    /// Control-send buffer ([`Access::LOCAL`]).
    pub ctl_bufs: RegisteredBuf,
    /// This kit's own PD: the connection's queue pair is created on it (every registration
    /// above holds it too).
    pub pd: Arc<Pd>,
}

impl Kit {
    fn new(ctx: &Arc<Context>, sz: KitSizes) -> Result<Self> {
        let pd = Pd::new(ctx)?;
        Ok(Self {
            rx: RegisteredRing::new(&pd, sz.ring, Access::RING)?,
            tx: None,
            tx_access: Access::LOCAL,
            tx_used: false,
            recv_bufs: RegisteredBuf::new(&pd, sz.recv, Access::LOCAL)?,
            ctl_bufs: RegisteredBuf::new(&pd, sz.ctl, Access::LOCAL)?,
            pd,
        })
    }

    /// Makes the send staging ring `size` bytes, on this kit's PD (the queue pair's: a local
    /// key of another PD would not do); one already of that size and access is kept.
    /// `readable`: the peer may read it (READ pull, protocol §16) — one a past connection
    /// used is zeroed first, as the peer could read anything in it.
    pub fn set_tx(&mut self, size: usize, readable: bool) -> Result<()> {
        let access = if readable {
            Access::READABLE
        } else {
            Access::LOCAL
        };
        let kept = self.tx_access == access;
        if let Some(t) = self.tx.as_mut().filter(|t| kept && t.size() == size) {
            if readable && self.tx_used {
                t.ring_mut().zero();
                self.tx_used = false;
            }
            return Ok(());
        }
        self.tx = None; // unpinned before the new one is pinned
        self.tx = Some(RegisteredRing::new(&self.pd, size, access)?);
        self.tx_access = access;
        self.tx_used = false;
        Ok(())
    }

    /// Bytes of memory it pins: its registrations' lengths (a ring's covers both views of
    /// its double mapping, and the kernel counts each page of it), as
    /// [`crate::verbs::registered_bytes`] counts them.
    fn pinned(&self) -> usize {
        self.rx.mr().len()
            + self.tx.as_ref().map_or(0, |t| t.mr().len())
            + self.recv_bufs.mr().len()
            + self.ctl_bufs.mr().len()
    }

    /// Memory registrations it holds.
    fn registrations(&self) -> usize {
        3 + usize::from(self.tx.is_some())
    }
}

/// What a kit is asked for by: its device context and sizes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Key {
    ctx: usize,
    sizes: KitSizes,
}

struct Pool {
    pid: u32,
    kits: Vec<(Key, Kit)>,
    bytes: usize,
}

static POOL: Mutex<Option<Pool>> = Mutex::new(None);

/// Runs `f` on this process's pool (a fork child's inherited pool is leaked, not used).
fn with<R>(f: impl FnOnce(&mut Pool) -> R) -> R {
    let mut g = POOL.lock().unwrap_or_else(|p| p.into_inner());
    let pid = std::process::id();
    if g.as_ref().is_some_and(|p| p.pid != pid) {
        if let Some(inherited) = g.take() {
            std::mem::forget(inherited);
        }
    }
    let p = g.get_or_insert_with(|| Pool {
        pid,
        kits: Vec::new(),
        bytes: 0,
    });
    f(p)
}

/// A kit for one connection on device context `ctx`: a pooled one of the same sizes, or a new
/// one (a new PD and new registrations). It is this connection's alone until it drops.
pub(crate) fn kit(ctx: &Arc<Context>, sizes: KitSizes) -> Result<Pooled> {
    let page = page_size();
    let pages = |len: usize| len.max(1).div_ceil(page) * page;
    let key = Key {
        ctx: ctx.as_ptr() as usize,
        sizes: KitSizes {
            ring: sizes.ring,
            recv: pages(sizes.recv),
            ctl: pages(sizes.ctl),
        },
    };
    let pooled = with(|p| {
        let i = p.kits.iter().position(|(k, _)| *k == key)?;
        let (_, kit) = p.kits.swap_remove(i);
        p.bytes -= kit.pinned();
        Some(kit)
    });
    let kit = match pooled {
        Some(kit) => kit,
        None => Kit::new(ctx, key.sizes)?,
    };
    Ok(Pooled {
        kit: Some(kit),
        key,
        reshaped: false,
    })
}

/// What the pool holds right now: (memory registrations in its kits, bytes they pin). Those
/// bytes are among [`crate::verbs::registered_bytes`], and the next connection of the same
/// sizes takes them over instead of pinning more.
pub fn pooled() -> (usize, usize) {
    with(|p| {
        let regs = p.kits.iter().map(|(_, k)| k.registrations()).sum();
        (regs, p.bytes)
    })
}

/// A kit in use: used as the kit itself; goes back to the pool when dropped (or is freed if
/// the pool is full).
pub(crate) struct Pooled {
    kit: Option<Kit>,
    key: Key,
    /// Its rings were replaced (ring moves): freed, not pooled.
    reshaped: bool,
}

impl Pooled {
    /// Replaces the kit's receive ring with `ring` (a ring move, protocol §6.4), returning the
    /// old one. A kit whose rings were replaced is freed when its connection ends, not pooled:
    /// connections start with the small rings, and a grown kit would pin its large ones idle
    /// in the pool for a connection that never asks for them.
    pub fn replace_rx(&mut self, ring: RegisteredRing) -> RegisteredRing {
        self.reshaped = true;
        std::mem::replace(&mut self.deref_mut().rx, ring)
    }

    /// Replaces the kit's send staging ring with `ring`, returning the old one (as
    /// [`Self::replace_rx`]).
    pub fn replace_tx(&mut self, ring: RegisteredRing) -> Option<RegisteredRing> {
        self.reshaped = true;
        self.deref_mut().tx.replace(ring)
    }

    /// Frees the kit instead of pooling it: for a kit whose PD may still have a queue pair on
    /// it (a failed set-up that hands its id back), which no other connection may share.
    pub fn discard(mut self) {
        self.kit = None;
    }
}

impl Deref for Pooled {
    type Target = Kit;
    fn deref(&self) -> &Kit {
        self.kit.as_ref().expect("present until drop")
    }
}

impl DerefMut for Pooled {
    fn deref_mut(&mut self) -> &mut Kit {
        self.kit.as_mut().expect("present until drop")
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let Some(mut kit) = self.kit.take() else {
            return;
        };
        if self.reshaped {
            return;
        }
        kit.tx_used = true;
        let n = kit.pinned();
        let key = self.key;
        // Freed here (outside the pool's lock) when there is no room.
        let _spill = with(|p| {
            if p.bytes + n > MAX_POOLED_BYTES {
                return Some(kit);
            }
            p.bytes += n;
            p.kits.push((key, kit));
            None
        });
    }
}
