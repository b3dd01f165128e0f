//! The "magic" receive ring: one memfd mapped twice, back to back, so that the `size` bytes
//! starting at any offset below `size` are contiguous in virtual memory. A peer's RDMA WRITE of
//! up to `size` bytes at `cursor mod size` therefore never has to be split at the end of the
//! ring, and the reader can hand out one contiguous slice for any readable range.
//!
//! ```text
//!   virtual:  [ base ............ base+size ............ base+2*size )
//!   file:     [ 0 .......... size )[ 0 .......... size )
//! ```
//!
//! One RAII type owns the whole reservation; dropping it unmaps both views.
//!
//! Huge pages: a ring whose size is a multiple of the host's huge page size (2 MiB on x86-64)
//! is made of huge pages (a `MFD_HUGETLB` memfd) when the host's pool has enough of them free
//! and not yet promised to another mapping, unless [`set_huge_pages`] turned that off; else of
//! ordinary pages, as every smaller ring. A device translates a registered region page by
//! page (a NIC caches those translations: FaRM measured its throughput falling with the
//! number of pages registered), so a 2 MiB page in place of 512 small ones is one entry in
//! place of 512; the kernel pins it in one step too. Only the pool an administrator set aside
//! (`vm.nr_hugepages`) is used, never more than is free, and a ring that cannot have huge
//! pages (the pool ran dry, the mapping fails) quietly takes ordinary ones.
#![allow(unsafe_code)]

use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::error::Error;
pub use crate::huge::HugePages;
use crate::verbs::{page_size, Access, Mr, Pd};

/// Why a ring could not be made.
#[derive(Debug)]
pub enum RingError {
    /// The size is not a power of two or not a multiple of the page size.
    BadSize(usize),
    /// A system call failed.
    Os(&'static str, io::Error),
}

impl std::fmt::Display for RingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::BadSize(s) => write!(
                f,
                "ring size {s} must be a power of two and a multiple of the page size ({})",
                page_size()
            ),
            Self::Os(call, e) => write!(f, "{call} failed: {e}"),
        }
    }
}

impl std::error::Error for RingError {}

/// A double-mapped ring buffer of `size` bytes (`2 * size` of address space).
pub struct MagicRing {
    base: NonNull<u8>,
    size: usize,
    /// Made of huge pages.
    huge: bool,
}

// SAFETY: the mapping is plain memory owned by this value; shared access hands out only
// byte slices, and mutable access needs &mut self.
unsafe impl Send for MagicRing {}
// SAFETY: see Send.
unsafe impl Sync for MagicRing {}

/// Double-mapped rings of the process ([`rings`]).
static RINGS: AtomicUsize = AtomicUsize::new(0);

/// How many double-mapped rings the process holds now. Each is two of the process's memory
/// mappings (its two views of one file), which the kernel bounds (`vm.max_map_count`).
pub fn rings() -> usize {
    RINGS.load(Ordering::Relaxed)
}

/// Rings of the process made of huge pages now (among [`rings`]).
static HUGE_RINGS: AtomicUsize = AtomicUsize::new(0);
/// Rings may not take huge pages ([`set_huge_pages`]).
static HUGE_OFF: AtomicBool = AtomicBool::new(false);

/// How many of the process's rings are made of huge pages now.
pub fn huge_rings() -> usize {
    HUGE_RINGS.load(Ordering::Relaxed)
}

/// Whether rings of a multiple of the huge page size may be made of huge pages (the default:
/// yes, while the host's pool has them free). Off, every ring takes ordinary pages: for a host
/// whose huge pages belong to an application that allocates them later than its connections.
pub fn set_huge_pages(on: bool) {
    HUGE_OFF.store(!on, Ordering::Relaxed);
}

/// Checks a ring size: a power of two, at least one page, a multiple of the page size.
pub fn check_size(size: usize) -> Result<(), RingError> {
    let page = page_size();
    if size < page || !size.is_power_of_two() || !size.is_multiple_of(page) {
        return Err(RingError::BadSize(size));
    }
    Ok(())
}

impl MagicRing {
    /// Creates a zeroed ring of `size` bytes: of huge pages where it can be (see the module
    /// docs), else of ordinary ones.
    pub fn new(size: usize) -> Result<Self, RingError> {
        check_size(size)?;
        let total = size.checked_mul(2).ok_or(RingError::BadSize(size))?;
        // (no huge page is smaller than 2 MiB where this runs: a smaller ring reads nothing)
        if size >= 1 << 21 && !HUGE_OFF.load(Ordering::Relaxed) {
            if let Some(hp) = HugePages::read().filter(|hp| hp.fit(size)) {
                // (a pool that ran dry meanwhile, or any other failure: ordinary pages)
                if let Ok(r) = Self::create(size, total, libc::MFD_HUGETLB, hp.size) {
                    return Ok(r);
                }
            }
        }
        Self::create(size, total, 0, page_size())
    }

    /// A memfd of `size` bytes with `flags` (besides close-on-exec) mapped twice, at an
    /// address aligned to `align` (its pages' size).
    fn create(
        size: usize,
        total: usize,
        flags: libc::c_uint,
        align: usize,
    ) -> Result<Self, RingError> {
        // SAFETY: the name is a valid C string; MFD_CLOEXEC keeps the fd out of exec'd images.
        let fd =
            unsafe { libc::memfd_create(c"rdmashim-ring".as_ptr(), libc::MFD_CLOEXEC | flags) };
        if fd < 0 {
            return Err(RingError::Os("memfd_create", io::Error::last_os_error()));
        }
        // SAFETY: fd is a fresh memfd.
        let result = if unsafe { libc::ftruncate(fd, size as libc::off_t) } != 0 {
            Err(RingError::Os("ftruncate", io::Error::last_os_error()))
        } else {
            Self::map_views(fd, size, total, align)
        };
        // The mappings keep the file alive; the descriptor is not needed any more.
        // SAFETY: fd is ours and closed once.
        unsafe { libc::close(fd) };
        let mut ring = result?;
        if flags & libc::MFD_HUGETLB != 0 {
            ring.huge = true;
            HUGE_RINGS.fetch_add(1, Ordering::Relaxed);
        }
        Ok(ring)
    }

    /// Maps `fd`, a memfd of exactly `size` bytes that can never change size (a shared-memory
    /// link's ring, its own or its peer's: see `crate::shm`), twice back to back. The
    /// descriptor stays the caller's.
    pub(crate) fn map_shared(fd: i32, size: usize) -> Result<Self, RingError> {
        check_size(size)?;
        let total = size.checked_mul(2).ok_or(RingError::BadSize(size))?;
        Self::map_views(fd, size, total, page_size())
    }

    /// Maps `size` bytes of `fd` twice, back to back, at an address aligned to `align` (a
    /// multiple of the page size that divides `size`: a huge page's size for a hugetlb file).
    fn map_views(fd: i32, size: usize, total: usize, align: usize) -> Result<Self, RingError> {
        // Reserve 2*size of address space first (and `align` more, to align it), so both views
        // land back to back.
        let slack = align - page_size();
        let reserved = total.checked_add(slack).ok_or(RingError::BadSize(size))?;
        // SAFETY: an anonymous PROT_NONE reservation at an address the kernel picks.
        let start = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                reserved,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if start == libc::MAP_FAILED {
            return Err(RingError::Os("mmap(reserve)", io::Error::last_os_error()));
        }
        let head = (start as usize).next_multiple_of(align) - start as usize;
        // SAFETY: `head` ≤ `slack`, so the aligned base and its `total` bytes lie inside the
        // reservation.
        let base = unsafe { start.cast::<u8>().add(head) }.cast::<libc::c_void>();
        // The reservation's parts before and after the aligned range go back at once.
        // SAFETY: both ranges are parts of our own reservation, outside [base, base+total).
        unsafe {
            if head > 0 {
                libc::munmap(start, head);
            }
            if slack > head {
                libc::munmap(base.cast::<u8>().add(total).cast(), slack - head);
            }
        }
        for (i, what) in [(0, "mmap(first view)"), (size, "mmap(second view)")] {
            // SAFETY: MAP_FIXED over our own reservation (base..base+total), each view exactly
            // `size` bytes of the memfd, so nothing else of the process is replaced.
            let p = unsafe {
                libc::mmap(
                    base.cast::<u8>().add(i).cast(),
                    size,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    fd,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                let e = io::Error::last_os_error();
                // SAFETY: our reservation, unmapped once on this error path.
                unsafe { libc::munmap(base, total) };
                return Err(RingError::Os(what, e));
            }
        }
        // Registered memory must not be shared with a forked child (the device would keep
        // writing pages the child also maps). MADV_DONTFORK leaves the child without the ring.
        // SAFETY: our own mapping.
        if unsafe { libc::madvise(base, total, libc::MADV_DONTFORK) } != 0 {
            let e = io::Error::last_os_error();
            // SAFETY: our mapping, unmapped once on this error path.
            unsafe { libc::munmap(base, total) };
            return Err(RingError::Os("madvise(MADV_DONTFORK)", e));
        }
        let base = NonNull::new(base.cast::<u8>()).ok_or(RingError::BadSize(size))?;
        RINGS.fetch_add(1, Ordering::Relaxed);
        Ok(Self {
            base,
            size,
            huge: false,
        })
    }

    /// Whether the ring is made of huge pages.
    pub fn is_huge(&self) -> bool {
        self.huge
    }

    /// The ring's size in bytes (the length of one view).
    pub fn size(&self) -> usize {
        self.size
    }

    /// Start of the first view. The registration covers both views: `2 * size` bytes.
    pub fn as_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// Bytes of address space to register (both views).
    pub fn mapped_len(&self) -> usize {
        self.size * 2
    }

    fn check(&self, offset: usize, len: usize) {
        assert!(
            offset < self.size && len <= self.size,
            "ring range {offset}+{len} outside a ring of {}",
            self.size
        );
    }

    /// `len` contiguous bytes starting at ring offset `offset` (`offset < size`, `len <= size`).
    /// Panics outside those bounds.
    pub fn slice(&self, offset: usize, len: usize) -> &[u8] {
        self.check(offset, len);
        // SAFETY: offset + len <= 2 * size, inside our live mapping.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(offset), len) }
    }

    /// Mutable version of [`slice`](Self::slice).
    // (inline on the data path: a call and a return less a message, each return a block
    // lookup under emulation — docs/bench/kinds.md, session 62)
    #[inline(always)]
    pub fn slice_mut(&mut self, offset: usize, len: usize) -> &mut [u8] {
        self.check(offset, len);
        // SAFETY: as in `slice`; &mut self excludes other slices of this ring.
        unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr().add(offset), len) }
    }

    /// The little-endian word at ring offset `offset` (a multiple of 8 below the size), read
    /// as one aligned load with acquire ordering: the way a reader of records (protocol §14)
    /// polls what its peer's RDMA WRITEs place, so that no read of the payload after it is
    /// moved before it. Panics outside those bounds.
    pub fn load_word(&self, offset: usize) -> u64 {
        assert!(
            offset.is_multiple_of(8) && offset < self.size,
            "ring word at {offset} in a ring of {}",
            self.size
        );
        // SAFETY: offset + 8 <= size, inside our live mapping, and 8-aligned (the mapping is
        // page-aligned); the word may change under us (the device, another process), which an
        // atomic load allows.
        let word = unsafe { AtomicU64::from_ptr(self.base.as_ptr().add(offset).cast::<u64>()) };
        u64::from_le(word.load(Ordering::Acquire))
    }

    /// Fills the ring with zeros (a ring of records must hold no earlier ring's: protocol
    /// §14).
    pub fn zero(&mut self) {
        self.slice_mut(0, self.size).fill(0);
    }
}

impl Drop for MagicRing {
    fn drop(&mut self) {
        RINGS.fetch_sub(1, Ordering::Relaxed);
        if self.huge {
            HUGE_RINGS.fetch_sub(1, Ordering::Relaxed);
        }
        // SAFETY: both views and the reservation are ours; unmapped once.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.size * 2) };
    }
}

impl From<RingError> for Error {
    fn from(e: RingError) -> Self {
        match e {
            RingError::BadSize(_) => Error::InvalidArgument(
                "ring size must be a power of two and a multiple of the page size",
            ),
            RingError::Os(call, source) => Error::Call { call, source },
        }
    }
}

/// A [`MagicRing`] with a registration covering both views (`2 * size` bytes), so that any
/// RDMA access of up to `size` bytes at an offset below `size` lies inside the MR.
///
/// Field order matters: the registration is dropped (deregistered) before the mapping it
/// covers is unmapped.
pub struct RegisteredRing {
    mr: Mr,
    ring: MagicRing,
}

impl RegisteredRing {
    /// Maps a ring of `size` bytes and registers it with `access` ([`Access::RING`] for a
    /// receive ring, [`Access::LOCAL`] for a send staging area).
    pub fn new(pd: &Arc<Pd>, size: usize, access: Access) -> Result<Self, Error> {
        let ring = MagicRing::new(size)?;
        // SAFETY: the mapping lives in `ring`, which this value owns and drops only after
        // `mr` (field order), so the memory stays mapped for the registration's whole life.
        let mr = unsafe { Mr::register(pd, ring.as_ptr(), ring.mapped_len(), access)? };
        Ok(Self { mr, ring })
    }

    /// The registration (lkey/rkey, address of the first view).
    pub fn mr(&self) -> &Mr {
        &self.mr
    }

    /// The ring.
    pub fn ring(&self) -> &MagicRing {
        &self.ring
    }

    /// The ring, mutably.
    pub fn ring_mut(&mut self) -> &mut MagicRing {
        &mut self.ring
    }

    /// Ring size in bytes.
    pub fn size(&self) -> usize {
        self.ring.size()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_checked() {
        let page = page_size();
        for bad in [0, 1, page - 1, page + 1, 3 * page, page * 6] {
            assert!(
                matches!(MagicRing::new(bad), Err(RingError::BadSize(_))),
                "{bad}"
            );
        }
        assert!(MagicRing::new(page).is_ok());
    }

    #[test]
    fn a_write_across_the_end_appears_at_the_start() {
        let size = 4 * page_size();
        let mut r = MagicRing::new(size).unwrap();
        let data: Vec<u8> = (0..100u8).collect();
        r.slice_mut(size - 40, 100).copy_from_slice(&data);
        assert_eq!(r.slice(size - 40, 40), &data[..40]);
        assert_eq!(r.slice(0, 60), &data[40..]);
        // and a write at the start is visible through the second view
        r.slice_mut(0, 3).copy_from_slice(b"abc");
        assert_eq!(r.slice(size - 1, 4), &[data[39], b'a', b'b', b'c']);
    }

    #[test]
    fn every_offset_sees_the_same_ring() {
        let size = page_size();
        let mut r = MagicRing::new(size).unwrap();
        for (i, b) in r.slice_mut(0, size).iter_mut().enumerate() {
            *b = (i * 7 % 251) as u8;
        }
        for off in (0..size).step_by(97) {
            let s = r.slice(off, size);
            for (k, &b) in s.iter().enumerate() {
                assert_eq!(b, ((off + k) % size * 7 % 251) as u8);
            }
        }
    }

    /// The views of a ring aligned to more than a page (as a huge page ring's must be) start at
    /// that alignment and are still one ring seen twice.
    #[test]
    fn an_aligned_ring_is_aligned_and_still_double_mapped() {
        let size = 16 * page_size();
        for align in [page_size(), 1 << 16, 1 << 21] {
            let mut r = MagicRing::create(size, 2 * size, 0, align).unwrap();
            assert_eq!(r.as_ptr() as usize % align, 0, "aligned to {align}");
            assert!(!r.is_huge());
            r.slice_mut(size - 2, 4).copy_from_slice(b"wxyz");
            assert_eq!(r.slice(0, 2), b"yz");
            assert_eq!(r.slice(size - 2, 4), b"wxyz");
        }
    }

    #[test]
    #[should_panic(expected = "outside a ring")]
    fn out_of_range_slices_panic() {
        let r = MagicRing::new(page_size()).unwrap();
        let _ = r.slice(page_size(), 1);
    }

    #[test]
    fn a_forked_child_does_not_inherit_the_ring() {
        let r = MagicRing::new(page_size()).unwrap();
        let addr = r.as_ptr() as usize;
        // SAFETY: the child only calls async-signal-safe functions (mincore-free probe via
        // msync, which fails with ENOMEM on an unmapped range) and _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: msync on a page-aligned address; ENOMEM means "not mapped".
            let rc = unsafe { libc::msync(addr as *mut libc::c_void, 1, libc::MS_ASYNC) };
            let unmapped =
                rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOMEM);
            // SAFETY: _exit is async-signal-safe.
            unsafe { libc::_exit(if unmapped { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status));
        assert_eq!(
            libc::WEXITSTATUS(status),
            0,
            "the child still maps the ring"
        );
    }
}
