//! A lock-free slot array of shared objects with per-slot generations: the upgrade's
//! connection lookup, which every data call on an upgraded fd makes.
//!
//! A [`Key`] names a slot and the generation the slot had when its object was put there;
//! removing the object bumps the generation, so a key kept past the removal (a thread that read
//! an fd's entry just before another thread closed the fd, and a new connection took the slot)
//! finds nothing rather than another connection. Lookups take no lock and write only the slot's
//! own word (no line every thread of the process shares): pin the slot, check its generation,
//! take a reference to the object, unpin. Removal never waits for a pinned reader (a reader may
//! be a signal handler's, interrupting the remover's own thread): if one is pinned, the last one
//! to unpin releases the array's reference.
//!
//! Slots live in chunks made on first use and never freed or moved (a slot's address stays
//! valid for the life of the array); indexes freed are reused first in, first out, so that a
//! slot's generation (which keys keep only [`Slots::gen_bits`] bits of) wraps as late as it can.
//! Inserts and removals take a lock (they are the upgrade's slow path: a connection's start and
//! end); lookups and walks never do, so they are safe where a lock could be held by a thread
//! that no longer exists (a fork child reading its parent's array).
//!
//! This is one of the shim's lock-free tables (as [`crate::fdtable`]): the object pointer is
//! an `Arc` turned raw, whose reference counts the pins protect; hence the `unsafe` here.
#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Readers pinning a slot (the low 30 bits of its state).
const PINS: u64 = (1 << 30) - 1;
const PIN: u64 = 1;
/// The slot holds an object that lookups may take.
const PRESENT: u64 = 1 << 30;
/// The object was removed while readers were pinned: the last unpin releases the array's
/// reference.
const RETIRED: u64 = 1 << 31;
const GEN_SHIFT: u32 = 32;

/// log2 of the slots per chunk.
const CHUNK_BITS: u32 = 10;
const CHUNK_LEN: usize = 1 << CHUNK_BITS;

/// A slot and the generation (low [`Slots::gen_bits`] bits) its object was put there at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Key {
    pub index: u32,
    pub gen: u32,
}

/// A chunk of slots (made on first use, never freed or moved).
type Chunk<T> = OnceLock<Box<[Slot<T>]>>;

struct Slot<T> {
    /// Generation (high 32 bits), [`RETIRED`], [`PRESENT`], pins.
    state: AtomicU64,
    /// The object (`Arc::into_raw`), or null. Not null while [`PRESENT`] or [`RETIRED`].
    obj: AtomicPtr<T>,
}

impl<T> Slot<T> {
    const fn new() -> Self {
        Slot {
            state: AtomicU64::new(0),
            obj: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// Takes the array's reference out of the slot (if it still holds it) and drops it.
    fn release(&self) {
        let p = self.obj.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if !p.is_null() {
            // SAFETY: `p` came from `Arc::into_raw` in `insert`, and the swap made this call
            // the only one to take it: the array's reference is given back exactly once.
            drop(unsafe { Arc::from_raw(p) });
        }
    }

    /// Ends a pin taken with `fetch_add(PIN)`; the last pin of a retired slot releases it.
    fn unpin(&self) {
        let prev = self.state.fetch_sub(PIN, Ordering::AcqRel);
        if prev & PINS == 1 && prev & RETIRED != 0 {
            let now = prev - PIN;
            if self
                .state
                .compare_exchange(now, now & !RETIRED, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                self.release();
            }
            // (else a reader pinned meanwhile: its unpin sees the slot retired and does it)
        }
    }

    /// Pins the slot; if `want(state)` holds, a reference to its object.
    fn take_if(&self, want: impl FnOnce(u64) -> bool) -> Option<Arc<T>> {
        let prev = self.state.fetch_add(PIN, Ordering::Acquire);
        let out = if prev & PRESENT != 0 && want(prev) {
            let p = self.obj.load(Ordering::Acquire);
            // SAFETY: PRESENT was set (Release, after `obj` was stored) by `insert` with a
            // pointer from `Arc::into_raw`; this pin keeps the array's reference alive until
            // it ends (a removal meanwhile retires the slot and leaves the release to the last
            // unpin), so the count is at least one while it is raised here.
            unsafe {
                Arc::increment_strong_count(p);
                Some(Arc::from_raw(p))
            }
        } else {
            None
        };
        self.unpin();
        out
    }
}

/// A pin on a slot while its object is borrowed ([`Slots::with`]): ended when dropped, also
/// when the borrower unwinds.
struct Pinned<'a, T>(&'a Slot<T>);

impl<T> Drop for Pinned<'_, T> {
    fn drop(&mut self) {
        self.0.unpin();
    }
}

/// The array. See the module documentation.
pub struct Slots<T> {
    chunks: Box<[Chunk<T>]>,
    /// One past the highest index ever used.
    high: AtomicUsize,
    /// Freed indexes, oldest first; inserts and removals hold it.
    free: Mutex<VecDeque<u32>>,
    capacity: usize,
    gen_mask: u32,
    /// The array owns `Arc<T>`s (and so is `Send`/`Sync` only as they are).
    _owns: PhantomData<Arc<T>>,
}

impl<T> Slots<T> {
    /// An array of at most `capacity` slots, whose keys keep `gen_bits` bits of generation.
    pub fn new(capacity: usize, gen_bits: u32) -> Self {
        let chunks = capacity.div_ceil(CHUNK_LEN);
        Slots {
            chunks: (0..chunks).map(|_| OnceLock::new()).collect(),
            high: AtomicUsize::new(0),
            free: Mutex::new(VecDeque::new()),
            capacity,
            gen_mask: if gen_bits >= 32 {
                u32::MAX
            } else {
                (1 << gen_bits) - 1
            },
            _owns: PhantomData,
        }
    }

    /// The bits of generation a key keeps.
    pub fn gen_bits(&self) -> u32 {
        self.gen_mask.count_ones()
    }

    fn slot(&self, index: usize) -> Option<&Slot<T>> {
        let chunk = self.chunks.get(index >> CHUNK_BITS)?.get()?;
        chunk.get(index & (CHUNK_LEN - 1))
    }

    fn key_gen(&self, state: u64) -> u32 {
        (state >> GEN_SHIFT) as u32 & self.gen_mask
    }

    /// Puts the object `make` returns (given its key) in a free slot; `None` if the array is
    /// full or `make` returned `None`. `make` runs under the inserts' lock (see
    /// [`Slots::try_exclusive`]).
    pub fn insert(&self, make: impl FnOnce(Key) -> Option<T>) -> Option<(Key, Arc<T>)> {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let index = self.free_index(&mut free)?;
        let slot = self.slot(index as usize)?;
        let st = slot.state.load(Ordering::Acquire);
        let key = Key {
            index,
            gen: self.key_gen(st),
        };
        let Some(obj) = make(key) else {
            free.push_front(index);
            return None;
        };
        let obj = Arc::new(obj);
        slot.obj
            .store(Arc::into_raw(obj.clone()).cast_mut(), Ordering::Relaxed);
        // (Release: whoever sees PRESENT sees `obj`; stray pins of lookups with stale keys may
        // be counted in the state meanwhile, and stay counted)
        slot.state.fetch_or(PRESENT, Ordering::Release);
        Some((key, obj))
    }

    /// A free index whose slot exists and holds nothing (a retired one still releasing is
    /// passed over).
    fn free_index(&self, free: &mut VecDeque<u32>) -> Option<u32> {
        for _ in 0..free.len() {
            let i = free.pop_front()?;
            let empty = self.slot(i as usize).is_some_and(|s| {
                s.state.load(Ordering::Acquire) & (PRESENT | RETIRED) == 0
                    && s.obj.load(Ordering::Acquire).is_null()
            });
            if empty {
                return Some(i);
            }
            free.push_back(i);
        }
        let i = self.high.load(Ordering::Relaxed);
        if i >= self.capacity {
            return None;
        }
        let chunk = &self.chunks[i >> CHUNK_BITS];
        chunk.get_or_init(|| (0..CHUNK_LEN).map(|_| Slot::new()).collect());
        self.high.store(i + 1, Ordering::Release);
        Some(i as u32)
    }

    /// The object of `key`, if it is still there.
    #[inline]
    pub fn get(&self, key: Key) -> Option<Arc<T>> {
        let slot = self.slot(key.index as usize)?;
        slot.take_if(|st| self.key_gen(st) == key.gen)
    }

    /// Calls `f` with the object of `key`, borrowed for as long as `f` runs under the slot's
    /// pin, which keeps the array's reference alive (a removal meanwhile retires the slot and
    /// leaves the release to the last unpin): two atomic operations on the slot's word, where
    /// [`Slots::get`] makes four with the reference it hands out (pin, count up, unpin, and the
    /// count down when the reference is dropped). `None` if the object is not there.
    #[inline]
    pub fn with<R>(&self, key: Key, f: impl FnOnce(&T) -> R) -> Option<R> {
        let slot = self.slot(key.index as usize)?;
        let prev = slot.state.fetch_add(PIN, Ordering::Acquire);
        let pin = Pinned(slot);
        if prev & PRESENT == 0 || self.key_gen(prev) != key.gen {
            return None;
        }
        let p = slot.obj.load(Ordering::Acquire);
        // SAFETY: PRESENT was set (Release, after `obj` was stored) by `insert` with a pointer
        // from `Arc::into_raw`, so `p` points at a live `T`; the pin, which `pin` ends only
        // after `f` returns, keeps the array's reference — and so the `T` — alive meanwhile.
        let r = f(unsafe { &*p });
        drop(pin);
        Some(r)
    }

    /// The object in slot `index`, whatever its generation.
    pub fn at(&self, index: usize) -> Option<Arc<T>> {
        self.slot(index)?.take_if(|_| true)
    }

    /// Removes the object of `key` (its slot's generation moves on); false if it was not
    /// there.
    pub fn remove(&self, key: Key) -> bool {
        let Some(slot) = self.slot(key.index as usize) else {
            return false;
        };
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let mut st = slot.state.load(Ordering::Acquire);
        let pinned = loop {
            if st & PRESENT == 0 || self.key_gen(st) != key.gen {
                return false;
            }
            let next_gen = ((st >> GEN_SHIFT) + 1) << GEN_SHIFT;
            let pins = st & PINS;
            let retired = if pins == 0 { 0 } else { RETIRED };
            match slot.state.compare_exchange_weak(
                st,
                next_gen | retired | pins,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break pins != 0,
                Err(now) => st = now,
            }
        };
        free.push_back(key.index);
        drop(free);
        if !pinned {
            slot.release();
        }
        true
    }

    /// Indexes in use or free (one past the highest ever used).
    pub fn len(&self) -> usize {
        self.high.load(Ordering::Acquire)
    }

    /// Whether no slot was ever used.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every object in the array with its slot index (a snapshot: objects inserted or removed
    /// meanwhile may or may not be in it).
    pub fn all(&self) -> Vec<(usize, Arc<T>)> {
        (0..self.len())
            .filter_map(|i| self.at(i).map(|o| (i, o)))
            .collect()
    }

    /// Runs `f` while no insert or removal can run, if the lock is free now (it never waits:
    /// its holder may be a thread that is not there any more, in a fork child).
    pub fn try_exclusive<R>(&self, f: impl FnOnce() -> R) -> Option<R> {
        let _g = self.free.try_lock().ok()?;
        Some(f())
    }
}

impl<T> Drop for Slots<T> {
    fn drop(&mut self) {
        for chunk in self.chunks.iter().filter_map(OnceLock::get) {
            for s in chunk.iter() {
                s.release();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// Counts its live instances.
    struct Probe<'a>(u32, &'a AtomicUsize);
    impl<'a> Probe<'a> {
        fn new(v: u32, live: &'a AtomicUsize) -> Self {
            live.fetch_add(1, Ordering::SeqCst);
            Probe(v, live)
        }
    }
    impl Drop for Probe<'_> {
        fn drop(&mut self) {
            self.1.fetch_sub(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_key_finds_its_object_until_it_is_removed() {
        let live = AtomicUsize::new(0);
        let s = Slots::new(8, 4);
        let (k, o) = s.insert(|_| Some(Probe::new(7, &live))).unwrap();
        assert_eq!(s.get(k).unwrap().0, 7);
        drop(o);
        assert_eq!(
            live.load(Ordering::SeqCst),
            1,
            "the array keeps its reference"
        );
        assert!(s.remove(k));
        assert!(s.get(k).is_none());
        assert!(!s.remove(k), "removed once");
        assert_eq!(
            live.load(Ordering::SeqCst),
            0,
            "the last reference went with it"
        );
    }

    #[test]
    fn a_stale_key_does_not_find_the_next_object_of_its_slot() {
        let live = AtomicUsize::new(0);
        let s = Slots::new(1, 12);
        let (k1, _) = s.insert(|_| Some(Probe::new(1, &live))).unwrap();
        assert!(s.remove(k1));
        let (k2, _) = s.insert(|_| Some(Probe::new(2, &live))).unwrap();
        assert_eq!(k1.index, k2.index);
        assert_ne!(k1.gen, k2.gen);
        assert!(s.get(k1).is_none());
        assert!(!s.remove(k1), "a stale key removes nothing");
        assert_eq!(s.get(k2).unwrap().0, 2);
    }

    #[test]
    fn generations_wrap_within_the_bits_keys_keep() {
        let live = AtomicUsize::new(0);
        let s = Slots::new(1, 2);
        assert_eq!(s.gen_bits(), 2);
        let gens: Vec<u32> = (0..6)
            .map(|i| {
                let (k, _) = s.insert(|_| Some(Probe::new(i, &live))).unwrap();
                assert_eq!(s.get(k).unwrap().0, i);
                assert!(s.remove(k));
                k.gen
            })
            .collect();
        assert_eq!(gens, [0, 1, 2, 3, 0, 1]);
    }

    #[test]
    fn full_array_and_refused_objects_leave_no_slot_taken() {
        let live = AtomicUsize::new(0);
        let s = Slots::new(2, 8);
        assert!(s.insert(|_| None::<Probe>).is_none());
        let (a, _) = s.insert(|_| Some(Probe::new(1, &live))).unwrap();
        let (b, _) = s.insert(|_| Some(Probe::new(2, &live))).unwrap();
        assert!(s.insert(|_| Some(Probe::new(3, &live))).is_none(), "full");
        assert_eq!(s.len(), 2);
        assert!(s.remove(a));
        let (c, _) = s.insert(|_| Some(Probe::new(4, &live))).unwrap();
        assert_eq!(c.index, a.index);
        let mut all: Vec<u32> = s.all().iter().map(|(_, o)| o.0).collect();
        all.sort();
        assert_eq!(all, [2, 4]);
        assert!(s.remove(b) && s.remove(c));
        assert!(s.all().is_empty());
        assert_eq!(live.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn freed_slots_are_reused_oldest_first() {
        let live = AtomicUsize::new(0);
        let s = Slots::new(3, 8);
        let keys: Vec<Key> = (0..3)
            .map(|i| s.insert(|_| Some(Probe::new(i, &live))).unwrap().0)
            .collect();
        assert!(s.remove(keys[2]));
        assert!(s.remove(keys[0]));
        let (k, _) = s.insert(|_| Some(Probe::new(9, &live))).unwrap();
        assert_eq!(k.index, keys[2].index);
    }

    /// A removal under a pin (a reader between its pin and its unpin, as one a signal
    /// interrupted) leaves the release to the last unpin, and the slot unused until then.
    #[test]
    fn a_removal_while_pinned_leaves_the_release_to_the_last_unpin() {
        let live = AtomicUsize::new(0);
        let s = Slots::new(1, 8);
        let (k, o) = s.insert(|_| Some(Probe::new(1, &live))).unwrap();
        drop(o);
        let slot = s.slot(0).unwrap();
        slot.state.fetch_add(PIN, Ordering::Acquire);
        assert!(s.remove(k));
        assert!(s.get(k).is_none());
        assert_eq!(live.load(Ordering::SeqCst), 1, "not released under a pin");
        // (a lookup meanwhile pins and unpins without releasing it)
        assert!(s.at(0).is_none());
        assert!(
            s.insert(|_| Some(Probe::new(2, &live))).is_none(),
            "the slot is not reused while it is still releasing"
        );
        assert_eq!(live.load(Ordering::SeqCst), 1);
        slot.unpin();
        assert_eq!(live.load(Ordering::SeqCst), 0, "released by the last unpin");
        assert_eq!(slot.state.load(Ordering::SeqCst) & (PINS | RETIRED), 0);
        let (k2, _) = s.insert(|_| Some(Probe::new(3, &live))).unwrap();
        assert_eq!((k2.index, k2.gen), (0, k.gen + 1));
        assert_eq!(s.get(k2).unwrap().0, 3);
    }

    #[test]
    fn a_borrow_keeps_its_object_through_a_removal_and_unpins_even_when_it_unwinds() {
        let live = AtomicUsize::new(0);
        let s = Slots::new(2, 8);
        let (k, o) = s.insert(|_| Some(Probe::new(5, &live))).unwrap();
        drop(o);
        let slot = s.slot(k.index as usize).unwrap();
        assert_eq!(s.with(k, |p| p.0), Some(5));
        assert_eq!(
            slot.state.load(Ordering::SeqCst) & PINS,
            0,
            "unpinned after"
        );
        // (removed while borrowed: the object lives until the borrow ends, then goes)
        let v = s.with(k, |p| {
            assert!(s.remove(k));
            assert!(s.get(k).is_none() && s.with(k, |_| ()).is_none());
            assert_eq!(
                live.load(Ordering::SeqCst),
                1,
                "not released under the borrow"
            );
            p.0
        });
        assert_eq!(v, Some(5));
        assert_eq!(
            live.load(Ordering::SeqCst),
            0,
            "released when the borrow ended"
        );
        assert_eq!(slot.state.load(Ordering::SeqCst) & (PINS | RETIRED), 0);
        // (a key of a removed object borrows nothing and leaves no pin)
        assert!(s.with(k, |_| ()).is_none());
        assert_eq!(slot.state.load(Ordering::SeqCst) & PINS, 0);
        // (a borrower that panics: the pin ends as it unwinds)
        let (k2, _) = s.insert(|_| Some(Probe::new(6, &live))).unwrap();
        let slot2 = s.slot(k2.index as usize).unwrap();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            s.with(k2, |_| panic!("a borrower's panic"))
        }));
        assert!(r.is_err());
        assert_eq!(
            slot2.state.load(Ordering::SeqCst) & PINS,
            0,
            "unpinned by the unwind"
        );
        assert!(s.remove(k2));
        assert_eq!(live.load(Ordering::SeqCst), 0);
    }

    fn pack(k: Key) -> u64 {
        u64::from(k.index) << 12 | u64::from(k.gen)
    }
    fn unpack(v: u64) -> Key {
        Key {
            index: (v >> 12) as u32,
            gen: v as u32 & 0xfff,
        }
    }

    /// Readers on every slot while others insert and remove: a lookup finds the object its key
    /// was made for or nothing, and every object is dropped exactly once.
    #[test]
    fn readers_racing_removals_see_their_object_or_nothing() {
        let live = AtomicUsize::new(0);
        let s: Slots<Probe> = Slots::new(32, 12);
        let keys: Vec<AtomicU64> = (0..16).map(|_| AtomicU64::new(u64::MAX)).collect();
        let stop = AtomicBool::new(false);
        let found = AtomicUsize::new(0);
        std::thread::scope(|sc| {
            for _ in 0..3 {
                sc.spawn(|| {
                    while !stop.load(Ordering::Relaxed) {
                        for k in &keys {
                            let v = k.load(Ordering::Acquire);
                            if v == u64::MAX {
                                continue;
                            }
                            let key = unpack(v);
                            if let Some(o) = s.get(key) {
                                // (each object carries the key it was made for)
                                assert_eq!(o.0, pack(key) as u32);
                                found.fetch_add(1, Ordering::Relaxed);
                            }
                            // (and so does one borrowed, for as long as it is borrowed)
                            if let Some(got) = s.with(key, |o| {
                                std::hint::spin_loop();
                                o.0
                            }) {
                                assert_eq!(got, pack(key) as u32);
                                found.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                });
            }
            sc.spawn(|| {
                for round in 0..20_000u32 {
                    let slot = (round as usize * 7) % 16;
                    let old = keys[slot].swap(u64::MAX, Ordering::AcqRel);
                    if old != u64::MAX {
                        assert!(s.remove(unpack(old)));
                    }
                    let (k, _) = s
                        .insert(|k| Some(Probe::new(pack(k) as u32, &live)))
                        .unwrap();
                    keys[slot].store(pack(k), Ordering::Release);
                }
                stop.store(true, Ordering::Relaxed);
            });
        });
        assert!(found.load(Ordering::Relaxed) > 0);
        let left = s.all().len();
        assert_eq!(live.load(Ordering::SeqCst), left);
        drop(s);
        assert_eq!(live.load(Ordering::SeqCst), 0);
    }
}
