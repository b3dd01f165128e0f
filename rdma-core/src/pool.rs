//! Per-process reuse of the verbs resources a connection is slow to make.
//!
//! A memory registration pins and maps its pages in the device: for a 512 KiB ring under
//! soft-RoCE that is most of the ~15 ms a connection's set-up costs, and a server accepting a
//! burst of connections pays it serially. So the protection domain is one per device context
//! (every connection of the process shares it), and the registered rings and buffers of a
//! connection that ended go back to a bounded pool for the next connection of the same sizes.
//!
//! Safety of reuse: an item goes back only when its [`Pooled`] owner drops, which in an
//! [`Endpoint`](crate::endpoint) happens after the connection's queue pair was destroyed (field
//! order), so no work request of the old connection can still touch it. A receive ring keeps
//! its rkey; the old peer's queue pair was connected to the destroyed one and can no longer
//! reach it. Stale bytes in a reused ring are never read: readers only read what the new
//! connection's cursors say was written.
//!
//! Fork: a child (another pid) must not touch its parent's registrations (they are
//! `MADV_DONTFORK` memory, and deregistering would undo the parent's). The child starts with
//! an empty pool and leaks the inherited one.

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};

use crate::error::Result;
use crate::ring::RegisteredRing;
use crate::verbs::{Access, Context, Pd, RegisteredBuf};

/// Most bytes of registered memory kept idle in the pool (they stay pinned: memlock).
const MAX_POOLED_BYTES: usize = 64 << 20;

/// Something the pool can keep.
pub(crate) trait Poolable: Sized {
    /// Bytes of memory it pins.
    fn pinned(&self) -> usize;
    fn into_item(self) -> Item;
    fn from_item(i: Item) -> Option<Self>;
}

pub(crate) enum Item {
    Ring(RegisteredRing),
    Buf(RegisteredBuf),
}

impl Poolable for RegisteredRing {
    fn pinned(&self) -> usize {
        self.size()
    }
    fn into_item(self) -> Item {
        Item::Ring(self)
    }
    fn from_item(i: Item) -> Option<Self> {
        match i {
            Item::Ring(r) => Some(r),
            Item::Buf(_) => None,
        }
    }
}

impl Poolable for RegisteredBuf {
    fn pinned(&self) -> usize {
        self.len()
    }
    fn into_item(self) -> Item {
        Item::Buf(self)
    }
    fn from_item(i: Item) -> Option<Self> {
        match i {
            Item::Buf(b) => Some(b),
            Item::Ring(_) => None,
        }
    }
}

/// What an item is asked for by: its domain, kind, size and access.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Key {
    pd: usize,
    ring: bool,
    len: usize,
    access: Access,
}

struct Pool {
    pid: u32,
    pds: Vec<(usize, Arc<Pd>)>,
    items: Vec<(Key, Item)>,
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
        pds: Vec::new(),
        items: Vec::new(),
        bytes: 0,
    });
    f(p)
}

/// The process's protection domain on device context `ctx` (allocated on first use).
pub(crate) fn pd_for(ctx: &Arc<Context>) -> Result<Arc<Pd>> {
    let key = ctx.as_ptr() as usize;
    if let Some(pd) = with(|p| {
        p.pds
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, pd)| pd.clone())
    }) {
        return Ok(pd);
    }
    let pd = Pd::new(ctx)?;
    Ok(with(|p| {
        // (another thread may have made one meanwhile: keep the first)
        if let Some((_, first)) = p.pds.iter().find(|(k, _)| *k == key) {
            return first.clone();
        }
        p.pds.push((key, pd.clone()));
        pd
    }))
}

fn key_of(pd: &Arc<Pd>, ring: bool, len: usize, access: Access) -> Key {
    Key {
        pd: pd.as_ptr() as usize,
        ring,
        len,
        access,
    }
}

fn take<T: Poolable>(key: Key) -> Option<T> {
    with(|p| {
        let i = p.items.iter().position(|(k, _)| *k == key)?;
        let (_, item) = p.items.swap_remove(i);
        let t = T::from_item(item)?;
        p.bytes -= t.pinned();
        Some(t)
    })
}

/// A registered ring of `size` bytes with `access` on `pd`: a pooled one, or a new one.
pub(crate) fn ring(pd: &Arc<Pd>, size: usize, access: Access) -> Result<Pooled<RegisteredRing>> {
    let key = key_of(pd, true, size, access);
    let r = match take::<RegisteredRing>(key) {
        Some(r) => r,
        None => RegisteredRing::new(pd, size, access)?,
    };
    Ok(Pooled { item: Some(r), key })
}

/// A registered buffer of at least `len` bytes (whole pages) with `access` on `pd`.
pub(crate) fn buf(pd: &Arc<Pd>, len: usize, access: Access) -> Result<Pooled<RegisteredBuf>> {
    let page = crate::verbs::page_size();
    let len = len.max(1).div_ceil(page) * page;
    let key = key_of(pd, false, len, access);
    let b = match take::<RegisteredBuf>(key) {
        Some(b) => b,
        None => RegisteredBuf::new(pd, len, access)?,
    };
    Ok(Pooled { item: Some(b), key })
}

/// Pooled resources held by the pool right now: (items, bytes).
pub fn pooled() -> (usize, usize) {
    with(|p| (p.items.len(), p.bytes))
}

/// A pooled item: used as the item itself; goes back to the pool when dropped (or is freed if
/// the pool is full).
pub(crate) struct Pooled<T: Poolable> {
    item: Option<T>,
    key: Key,
}

impl<T: Poolable> Deref for Pooled<T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.item.as_ref().expect("present until drop")
    }
}

impl<T: Poolable> DerefMut for Pooled<T> {
    fn deref_mut(&mut self) -> &mut T {
        self.item.as_mut().expect("present until drop")
    }
}

impl<T: Poolable> Drop for Pooled<T> {
    fn drop(&mut self) {
        let Some(t) = self.item.take() else { return };
        let n = t.pinned();
        let key = self.key;
        // Freed here (outside the pool's lock) when there is no room.
        let _spill = with(|p| {
            if p.bytes + n > MAX_POOLED_BYTES {
                return Some(t);
            }
            p.bytes += n;
            p.items.push((key, t.into_item()));
            None
        });
    }
}
