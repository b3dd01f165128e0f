//! Safe owners of verbs objects: device context, protection domain, completion channel,
//! completion queue, memory region.
//!
//! Each object holds an `Arc` of its parent, so the parent outlives it and destruction runs in
//! the order verbs requires (MR and CQ before PD and channel, all before the context). Drop
//! never panics: a failed destroy is reported to the log sink, not unwound.
#![allow(unsafe_code)]

use std::ffi::c_int;
use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::error::{Error, Result, Unavailable};
use crate::sys::{self, ffi, Lib};

/// The device list as libibverbs reports it.
pub fn device_names() -> Result<Vec<String>> {
    let lib = sys::lib().map_err(|e| Unavailable::LibrariesMissing(e.clone()))?;
    let mut n: c_int = 0;
    // SAFETY: n is a valid out-pointer; the list is freed below.
    let list = unsafe { (lib.verbs.ibv_get_device_list)(&mut n) };
    if list.is_null() {
        return Err(device_list_error());
    }
    let mut names = Vec::with_capacity(n.max(0) as usize);
    for i in 0..n.max(0) as usize {
        // SAFETY: the list holds n valid device pointers.
        let dev = unsafe { *list.add(i) };
        // SAFETY: dev is valid while the list is; the name is a NUL-terminated string in it.
        names.push(unsafe { sys::cstr_lossy((lib.verbs.ibv_get_device_name)(dev)) });
    }
    // SAFETY: list came from ibv_get_device_list and is freed once.
    unsafe { (lib.verbs.ibv_free_device_list)(list) };
    Ok(names)
}

/// `ibv_get_device_list` returned NULL: ENOSYS means the kernel has no RDMA (uverbs) support
/// at all, which is the same as having no device.
fn device_list_error() -> Error {
    let e = Error::last("ibv_get_device_list");
    match &e {
        Error::Call { source, .. } if source.raw_os_error() == Some(libc::ENOSYS) => {
            Unavailable::NoDevice.into()
        }
        _ => e,
    }
}

/// A device context.
///
/// Either opened here ([`Context::open`], closed on drop) or borrowed from rdma_cm
/// ([`Context::from_cm`]: librdmacm opens every device itself and keeps the contexts for the
/// life of the process, so those are never closed by us).
pub struct Context {
    raw: NonNull<ffi::ibv_context>,
    owned: bool,
    lib: &'static Lib,
}

// SAFETY: ibv_context is thread-safe per libibverbs' documented threading model (all verbs may be
// called from any thread); this type only hands out the pointer to verbs calls.
unsafe impl Send for Context {}
// SAFETY: see Send.
unsafe impl Sync for Context {}

impl Context {
    /// Opens the device called `name` (e.g. `"rxe0"`).
    pub fn open(name: &str) -> Result<Arc<Self>> {
        let lib = sys::lib().map_err(|e| Unavailable::LibrariesMissing(e.clone()))?;
        let mut n: c_int = 0;
        // SAFETY: n is a valid out-pointer; the list is freed below on every path.
        let list = unsafe { (lib.verbs.ibv_get_device_list)(&mut n) };
        if list.is_null() {
            return Err(device_list_error());
        }
        if n <= 0 {
            // SAFETY: list came from ibv_get_device_list.
            unsafe { (lib.verbs.ibv_free_device_list)(list) };
            return Err(Unavailable::NoDevice.into());
        }
        let mut found = None;
        for i in 0..n as usize {
            // SAFETY: the list holds n valid device pointers.
            let dev = unsafe { *list.add(i) };
            // SAFETY: dev is valid while the list is.
            let dev_name = unsafe { sys::cstr_lossy((lib.verbs.ibv_get_device_name)(dev)) };
            if dev_name == name {
                found = Some(dev);
                break;
            }
        }
        let result = match found {
            None => Err(Error::NoSuchDevice(name.to_owned())),
            // SAFETY: dev is a valid device from the (still allocated) list.
            Some(dev) => unsafe { Self::open_device(lib, dev) },
        };
        // SAFETY: list came from ibv_get_device_list and is freed once; an opened context
        // stays valid after the list is freed (libibverbs keeps the device referenced).
        unsafe { (lib.verbs.ibv_free_device_list)(list) };
        result
    }

    /// Opens `dev` (`ibv_open_device`): a context of this process's own, closed on drop.
    ///
    /// # Safety
    /// `dev` must be a valid device of libibverbs (from its device list, or a live context's
    /// `device`).
    pub unsafe fn open_device(lib: &'static Lib, dev: *mut ffi::ibv_device) -> Result<Arc<Self>> {
        // SAFETY: per the caller's contract.
        let raw = unsafe { (lib.verbs.ibv_open_device)(dev) };
        let raw = NonNull::new(raw).ok_or_else(|| Error::last("ibv_open_device"))?;
        // SAFETY: a context just opened, not yet seen by any other thread.
        unsafe { relocate_fds(raw.as_ptr()) };
        let c = Arc::new(Self {
            raw,
            owned: true,
            lib,
        });
        c.tell_fds();
        Ok(c)
    }

    /// The context's descriptors (its command and async fds).
    fn fds(&self) -> [RawFd; 2] {
        // SAFETY: a live context; both fields are plain ints.
        unsafe {
            let c = self.raw.as_ptr();
            [(*c).cmd_fd, (*c).async_fd]
        }
    }

    /// Tells the watcher of [`crate::fds`] this context's descriptors (again: idempotent).
    fn tell_fds(&self) {
        for fd in self.fds() {
            crate::fds::opened(fd);
        }
    }

    /// Whether librdmacm owns this context ([`Self::from_cm`]).
    pub fn is_librdmacms(&self) -> bool {
        !self.owned
    }

    /// Wraps a context that librdmacm owns (`cm_id->verbs`).
    ///
    /// # Safety
    /// `raw` must be a live context from librdmacm, which keeps it open for the process' life.
    pub unsafe fn from_cm(lib: &'static Lib, raw: NonNull<ffi::ibv_context>) -> Arc<Self> {
        {
            // librdmacm opened it for the id just bound (its first use by this crate: the
            // lock makes two first uses one); ours are the only verbs calls on it from now.
            static MOVING: std::sync::Mutex<()> = std::sync::Mutex::new(());
            let _g = MOVING.lock().unwrap_or_else(|p| p.into_inner());
            // SAFETY: per the caller's contract; see above for the other threads.
            unsafe { relocate_fds(raw.as_ptr()) };
        }
        let c = Arc::new(Self {
            raw,
            owned: false,
            lib,
        });
        // (librdmacm keeps it open for the process's life: never closed by us)
        c.tell_fds();
        c
    }

    /// The raw pointer, for verbs calls.
    pub fn as_ptr(&self) -> *mut ffi::ibv_context {
        self.raw.as_ptr()
    }

    /// The bound libraries.
    pub fn lib(&self) -> &'static Lib {
        self.lib
    }

    /// The device's name.
    pub fn name(&self) -> String {
        // SAFETY: a live context's `device` is valid; the name is a NUL-terminated string.
        unsafe {
            let dev = (*self.raw.as_ptr()).device;
            sys::cstr_lossy((self.lib.verbs.ibv_get_device_name)(dev))
        }
    }

    /// Whether the device is software (soft-RoCE, `rxe`; soft-iWARP, `siw`: by the vendor id
    /// their drivers give, 0xffffff and 0x626d74): a host CPU, not the NIC's silicon, sends its
    /// packets and acknowledges its peers', so under load (a burst of set-ups, a busy CPU) its
    /// acknowledgements may lag by seconds. Asked of the device once per process.
    pub fn is_software(&self) -> bool {
        /// (the device, as an address; whether it is software)
        static SEEN: std::sync::Mutex<Vec<(usize, bool)>> = std::sync::Mutex::new(Vec::new());
        // SAFETY: a live context's `device` is valid for the process's life (libibverbs' list).
        let dev = unsafe { (*self.raw.as_ptr()).device } as usize;
        let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&(_, soft)) = seen.iter().find(|(d, _)| *d == dev) {
            return soft;
        }
        let soft = self
            .query_device()
            .is_ok_and(|a| matches!(a.vendor_id, 0x00ff_ffff | 0x0062_6d74));
        seen.push((dev, soft));
        soft
    }

    /// `ibv_query_device`.
    pub fn query_device(&self) -> Result<ffi::ibv_device_attr> {
        // SAFETY: all-zero is a valid value of this plain C struct.
        let mut attr: ffi::ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: live context, valid out-pointer.
        let rc = unsafe { (self.lib.verbs.ibv_query_device)(self.as_ptr(), &mut attr) };
        if rc != 0 {
            return Err(Error::returned("ibv_query_device", rc));
        }
        Ok(attr)
    }

    /// `ibv_query_port` (ports are numbered from 1).
    pub fn query_port(&self, port: u8) -> Result<ffi::ibv_port_attr> {
        // SAFETY: all-zero is a valid value of this plain C struct.
        let mut attr: ffi::ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: live context; the exported (compat) ibv_query_port fills a prefix of
        // struct ibv_port_attr, which is at least as large as what it writes.
        let rc = unsafe { (self.lib.verbs.ibv_query_port)(self.as_ptr(), port, &mut attr) };
        if rc != 0 {
            return Err(Error::returned("ibv_query_port", rc));
        }
        Ok(attr)
    }

    /// `ibv_query_gid`: the raw 16 bytes of GID `index` on `port`.
    pub fn query_gid(&self, port: u8, index: i32) -> Result<[u8; 16]> {
        // SAFETY: all-zero is a valid union value.
        let mut gid: ffi::ibv_gid = unsafe { std::mem::zeroed() };
        // SAFETY: live context, valid out-pointer.
        let rc = unsafe { (self.lib.verbs.ibv_query_gid)(self.as_ptr(), port, index, &mut gid) };
        if rc != 0 {
            return Err(Error::last("ibv_query_gid"));
        }
        // SAFETY: every bit pattern of the union is a valid [u8; 16].
        Ok(unsafe { gid.raw })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if crate::fds::abandoned() {
            return;
        }
        if self.owned {
            for fd in self.fds() {
                crate::fds::closing(fd);
            }
            // SAFETY: we opened it and every child holds an Arc of us, so none is left.
            unsafe { (self.lib.verbs.ibv_close_device)(self.as_ptr()) };
        }
    }
}

/// Moves a context's command and async descriptors at or above the transport's floor
/// ([`crate::fds::relocate`]; those already there stay).
///
/// # Safety
/// `raw` must be a live context whose descriptors no other thread uses during the call.
unsafe fn relocate_fds(raw: *mut ffi::ibv_context) {
    // SAFETY: per the caller's contract; both fields are aligned ints of the live context.
    unsafe {
        crate::fds::relocate_field(std::ptr::addr_of_mut!((*raw).cmd_fd));
        crate::fds::relocate_field(std::ptr::addr_of_mut!((*raw).async_fd));
    }
}

/// A protection domain.
pub struct Pd {
    raw: NonNull<ffi::ibv_pd>,
    ctx: Arc<Context>,
}

// SAFETY: verbs objects may be used from any thread (libibverbs threading model).
unsafe impl Send for Pd {}
// SAFETY: see Send.
unsafe impl Sync for Pd {}

impl Pd {
    /// `ibv_alloc_pd`.
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<Self>> {
        // SAFETY: live context.
        let raw = unsafe { (ctx.lib.verbs.ibv_alloc_pd)(ctx.as_ptr()) };
        let raw = NonNull::new(raw).ok_or_else(|| Error::last("ibv_alloc_pd"))?;
        Ok(Arc::new(Self {
            raw,
            ctx: ctx.clone(),
        }))
    }

    /// The raw pointer, for verbs calls.
    pub fn as_ptr(&self) -> *mut ffi::ibv_pd {
        self.raw.as_ptr()
    }

    /// The device context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        if crate::fds::abandoned() {
            return;
        }
        // SAFETY: children (MRs, QPs) hold an Arc of us, so none is left.
        unsafe { (self.ctx.lib.verbs.ibv_dealloc_pd)(self.as_ptr()) };
    }
}

/// A completion channel: a file descriptor that becomes readable when an armed CQ completes.
/// Its fd is made non-blocking, so it can sit in an event loop (poll/epoll).
pub struct CompChannel {
    raw: NonNull<ffi::ibv_comp_channel>,
    ctx: Arc<Context>,
}

// SAFETY: verbs objects may be used from any thread.
unsafe impl Send for CompChannel {}
// SAFETY: see Send.
unsafe impl Sync for CompChannel {}

impl CompChannel {
    /// `ibv_create_comp_channel`, with the fd switched to O_NONBLOCK.
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<Self>> {
        // SAFETY: live context.
        let raw = unsafe { (ctx.lib.verbs.ibv_create_comp_channel)(ctx.as_ptr()) };
        let raw = NonNull::new(raw).ok_or_else(|| Error::last("ibv_create_comp_channel"))?;
        // SAFETY: a channel just made, seen by no other thread; its fd is a plain int.
        unsafe { crate::fds::relocate_field(std::ptr::addr_of_mut!((*raw.as_ptr()).fd)) };
        let ch = Arc::new(Self {
            raw,
            ctx: ctx.clone(),
        });
        crate::fds::opened(ch.fd());
        set_nonblocking(ch.fd(), "fcntl(comp_channel)")?;
        Ok(ch)
    }

    /// The channel's file descriptor (readable when a CQ event is pending).
    pub fn fd(&self) -> RawFd {
        // SAFETY: live channel.
        unsafe { (*self.raw.as_ptr()).fd }
    }

    /// Takes one pending CQ event, if any (non-blocking), and acknowledges it.
    /// Returns the CQ's raw pointer, or `None` when no event was pending.
    pub fn take_event(&self) -> Result<Option<*mut ffi::ibv_cq>> {
        let mut cq = std::ptr::null_mut();
        let mut cq_ctx = std::ptr::null_mut();
        // SAFETY: live channel, valid out-pointers.
        let rc =
            unsafe { (self.ctx.lib.verbs.ibv_get_cq_event)(self.as_ptr(), &mut cq, &mut cq_ctx) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::WouldBlock {
                return Ok(None);
            }
            return Err(Error::Call {
                call: "ibv_get_cq_event",
                source: e,
            });
        }
        // SAFETY: cq was just returned by ibv_get_cq_event; every event is acked once.
        unsafe { (self.ctx.lib.verbs.ibv_ack_cq_events)(cq, 1) };
        Ok(Some(cq))
    }

    /// Waits up to `timeout_ms` (−1: forever) for the channel to become readable.
    pub fn wait_readable(&self, timeout_ms: i32) -> Result<bool> {
        poll_readable(self.fd(), timeout_ms, "poll(comp_channel)")
    }

    /// The raw pointer, for verbs calls.
    pub fn as_ptr(&self) -> *mut ffi::ibv_comp_channel {
        self.raw.as_ptr()
    }
}

impl Drop for CompChannel {
    fn drop(&mut self) {
        if crate::fds::abandoned() {
            return;
        }
        crate::fds::closing(self.fd());
        // SAFETY: every CQ using this channel holds an Arc of us, so none is left.
        unsafe { (self.ctx.lib.verbs.ibv_destroy_comp_channel)(self.as_ptr()) };
    }
}

/// Receives chained into one post call ([`crate::cm::CmId::post_recvs`], [`Srq::post_recvs`]).
pub const RECV_BATCH: usize = 32;

/// Posts a RECV of `len` bytes for each `wr_id` in `ids`, the receive of `wr_id` at offset
/// `wr_id * len` in `local` (`len` may be 0: receives that only absorb WRITE WITH IMMEDIATE
/// completions), as chains of up to [`RECV_BATCH`] work requests, each handed to `post` (one
/// call, and one turn of the provider's queue lock, per chain). `post(chain, bad)` must pass
/// both to a post call of a live queue (`ibv_post_recv`, `ibv_post_srq_recv`) and return its
/// result; `what` names that call in an error.
pub(crate) fn post_recv_batches(
    ids: &[u16],
    local: &Mr,
    len: usize,
    what: &'static str,
    mut post: impl FnMut(*mut ffi::ibv_recv_wr, &mut *mut ffi::ibv_recv_wr) -> c_int,
) -> Result<()> {
    for chunk in ids.chunks(RECV_BATCH) {
        let mut sges = [ffi::ibv_sge {
            addr: 0,
            length: 0,
            lkey: 0,
        }; RECV_BATCH];
        for (sge, &id) in sges.iter_mut().zip(chunk) {
            *sge = local.sge(usize::from(id) * len, len)?;
        }
        let mut wrs = [ffi::ibv_recv_wr {
            wr_id: 0,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
        }; RECV_BATCH];
        for ((wr, &id), sge) in wrs.iter_mut().zip(chunk).zip(sges.iter_mut()) {
            wr.wr_id = u64::from(id);
            wr.sg_list = sge;
            wr.num_sge = if len == 0 { 0 } else { 1 };
        }
        let base = wrs.as_mut_ptr();
        for i in 1..chunk.len() {
            // SAFETY: i < chunk.len() <= RECV_BATCH: both are elements of `wrs`, which
            // outlives the post below.
            unsafe { (*base.add(i - 1)).next = base.add(i) };
        }
        // (the chain, wrs[..chunk.len()] each with its sge, lives until `post` returns; the
        // buffers are registered in `local`)
        let mut bad = std::ptr::null_mut();
        let rc = post(base, &mut bad);
        if rc != 0 {
            return Err(Error::returned(what, rc));
        }
    }
    Ok(())
}

/// A shared receive queue (`ibv_create_srq`): receives posted once, taken by the messages of
/// every queue pair made with it ([`crate::cm::CmId::create_qp_srq`]). It is on one PD, and so
/// serves the queue pairs of that PD alone: with a PD per connection (crate::pool), one
/// connection's.
pub struct Srq {
    raw: NonNull<ffi::ibv_srq>,
    pd: Arc<Pd>,
}

/// Shared receive queues alive in this process.
static SHARED_RECEIVE_QUEUES: AtomicUsize = AtomicUsize::new(0);

/// How many shared receive queues are alive in this process (tests: a link asked for one has
/// one).
pub fn shared_receive_queues() -> usize {
    SHARED_RECEIVE_QUEUES.load(Ordering::Relaxed)
}

// SAFETY: verbs objects may be used from any thread.
unsafe impl Send for Srq {}
// SAFETY: see Send.
unsafe impl Sync for Srq {}

impl Srq {
    /// A shared receive queue on `pd` with room for `max_wr` receives of one buffer each.
    pub fn new(pd: &Arc<Pd>, max_wr: u32) -> Result<Arc<Self>> {
        // SAFETY: all-zero is a valid ibv_srq_init_attr (no context, no limit).
        let mut attr: ffi::ibv_srq_init_attr = unsafe { std::mem::zeroed() };
        attr.attr.max_wr = max_wr;
        attr.attr.max_sge = 1;
        // SAFETY: live PD; attr is fully initialised.
        let raw = unsafe { (pd.context().lib.verbs.ibv_create_srq)(pd.as_ptr(), &mut attr) };
        let raw = NonNull::new(raw).ok_or_else(|| Error::last("ibv_create_srq"))?;
        SHARED_RECEIVE_QUEUES.fetch_add(1, Ordering::Relaxed);
        Ok(Arc::new(Self {
            raw,
            pd: pd.clone(),
        }))
    }

    /// The raw pointer, for verbs calls.
    pub fn as_ptr(&self) -> *mut ffi::ibv_srq {
        self.raw.as_ptr()
    }

    /// Posts receives as [`crate::cm::CmId::post_recvs`] does, to this queue.
    pub fn post_recvs(&self, ids: &[u16], local: &Mr, len: usize) -> Result<()> {
        let srq = self.as_ptr();
        post_recv_batches(ids, local, len, "ibv_post_srq_recv", |wr, bad| {
            // SAFETY: live SRQ; the chain is valid for the call (post_recv_batches).
            unsafe { ffi::ibv_post_srq_recv(srq, wr, bad) }
        })
    }
}

impl Drop for Srq {
    fn drop(&mut self) {
        SHARED_RECEIVE_QUEUES.fetch_sub(1, Ordering::Relaxed);
        if crate::fds::abandoned() {
            return;
        }
        // SAFETY: live SRQ; every queue pair made with it holds an Arc of it, so none is left.
        unsafe { (self.pd.context().lib.verbs.ibv_destroy_srq)(self.as_ptr()) };
    }
}

/// A completion queue, optionally attached to a completion channel.
pub struct Cq {
    raw: NonNull<ffi::ibv_cq>,
    ctx: Arc<Context>,
    channel: Option<Arc<CompChannel>>,
}

// SAFETY: verbs objects may be used from any thread.
unsafe impl Send for Cq {}
// SAFETY: see Send.
unsafe impl Sync for Cq {}

impl Cq {
    /// `ibv_create_cq` with room for `entries` completions.
    pub fn new(
        ctx: &Arc<Context>,
        entries: i32,
        channel: Option<&Arc<CompChannel>>,
    ) -> Result<Arc<Self>> {
        let ch_ptr = channel.map_or(std::ptr::null_mut(), |c| c.as_ptr());
        // SAFETY: live context and (optional) channel of the same context.
        let raw = unsafe {
            (ctx.lib.verbs.ibv_create_cq)(ctx.as_ptr(), entries, std::ptr::null_mut(), ch_ptr, 0)
        };
        let raw = NonNull::new(raw).ok_or_else(|| Error::last("ibv_create_cq"))?;
        Ok(Arc::new(Self {
            raw,
            ctx: ctx.clone(),
            channel: channel.cloned(),
        }))
    }

    /// The raw pointer, for verbs calls.
    pub fn as_ptr(&self) -> *mut ffi::ibv_cq {
        self.raw.as_ptr()
    }

    /// The channel this CQ reports to.
    pub fn channel(&self) -> Option<&Arc<CompChannel>> {
        self.channel.as_ref()
    }

    /// `ibv_poll_cq`: fills `out` and returns how many completions were taken.
    pub fn poll(&self, out: &mut [ffi::ibv_wc]) -> Result<usize> {
        let n = out.len().min(i32::MAX as usize) as i32;
        // SAFETY: live CQ; out has room for n entries.
        let rc = unsafe { ffi::ibv_poll_cq(self.as_ptr(), n, out.as_mut_ptr()) };
        if rc < 0 {
            return Err(Error::returned("ibv_poll_cq", -rc));
        }
        Ok(rc as usize)
    }

    /// `ibv_poll_cq` into room that need not be initialised: returns the completions taken,
    /// the first entries of `out`. A spinning wait polls on every turn, and zeroing a batch of
    /// work completions first (768 bytes for 16) cost more than the poll of an empty CQ.
    pub fn poll_uninit<'a>(
        &self,
        out: &'a mut [std::mem::MaybeUninit<ffi::ibv_wc>],
    ) -> Result<&'a [ffi::ibv_wc]> {
        let n = out.len().min(i32::MAX as usize) as i32;
        // SAFETY: live CQ; out has room for n entries (MaybeUninit<T> has T's layout), which
        // the provider only writes.
        let rc = unsafe { ffi::ibv_poll_cq(self.as_ptr(), n, out.as_mut_ptr().cast()) };
        if rc < 0 {
            return Err(Error::returned("ibv_poll_cq", -rc));
        }
        // SAFETY: ibv_poll_cq wrote the first rc (≤ n) entries whole.
        Ok(unsafe { std::slice::from_raw_parts(out.as_ptr().cast(), rc as usize) })
    }

    /// `ibv_req_notify_cq`: arm the CQ so its next completion signals the channel.
    pub fn arm(&self) -> Result<()> {
        // SAFETY: live CQ.
        let rc = unsafe { ffi::ibv_req_notify_cq(self.as_ptr(), 0) };
        if rc != 0 {
            return Err(Error::returned("ibv_req_notify_cq", rc));
        }
        Ok(())
    }

    /// Polls until at least one completion arrives or `timeout_ms` passes: busy-polls briefly,
    /// then arms the CQ and sleeps on its channel (if it has one). Returns how many were taken.
    pub fn wait(&self, out: &mut [ffi::ibv_wc], timeout_ms: u64) -> Result<usize> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(timeout_ms);
        let spin_until = std::time::Instant::now() + std::time::Duration::from_micros(50);
        loop {
            let n = self.poll(out)?;
            if n > 0 {
                return Ok(n);
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return Err(Error::Timeout("a work completion"));
            }
            if now < spin_until {
                std::hint::spin_loop();
                continue;
            }
            match &self.channel {
                None => std::thread::yield_now(),
                Some(ch) => {
                    self.arm()?;
                    // A completion that landed between the poll and the arm raised no event:
                    // poll once more before sleeping.
                    let n = self.poll(out)?;
                    if n > 0 {
                        return Ok(n);
                    }
                    let left = deadline.saturating_duration_since(std::time::Instant::now());
                    ch.wait_readable(left.as_millis().min(i32::MAX as u128) as i32)?;
                    while ch.take_event()?.is_some() {}
                }
            }
        }
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        if crate::fds::abandoned() {
            return;
        }
        // SAFETY: QPs using this CQ hold an Arc of us, so none is left.
        unsafe { (self.ctx.lib.verbs.ibv_destroy_cq)(self.as_ptr()) };
    }
}

/// An all-zero work completion, to fill with [`Cq::poll`].
pub fn empty_wc() -> ffi::ibv_wc {
    // SAFETY: ibv_wc is a plain C struct (integers and an integer union); all-zero is valid.
    unsafe { std::mem::zeroed() }
}

/// The immediate of a work completion as the provider stored it (`__be32`: pass it through
/// `u32::from_be` once), or `None` when `wc_flags` lacks `IBV_WC_WITH_IMM`.
pub fn wc_imm_data(wc: &ffi::ibv_wc) -> Option<u32> {
    if wc.wc_flags & ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0 == 0 {
        return None;
    }
    // SAFETY: both members of the union are u32; any bit pattern is a valid u32.
    Some(unsafe { wc.imm_data_invalidated_rkey_union.imm_data })
}

/// Access rights of a memory registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access(pub u32);

impl Access {
    /// Local use only (send staging areas).
    pub const LOCAL: Self = Self(ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0);
    /// A send staging area of READ pull (protocol §16): the peer may RDMA-READ from it (the
    /// bytes staged for it), and nothing else.
    pub const READABLE: Self = Self(
        ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0,
    );
    /// A receive ring: the peer may RDMA-WRITE into it, and nothing else.
    pub const RING: Self = Self(
        ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0,
    );
}

/// A registered memory region over memory that something else owns.
pub struct Mr {
    raw: NonNull<ffi::ibv_mr>,
    pd: Arc<Pd>,
}

/// Bytes registered by live [`Mr`]s of this process, and the process they count for: a fork
/// child's inherited registrations pin pages for its parent, not for it, so the count starts
/// again at a child's first registration (and a child's drop of an inherited one does not
/// count).
static REGISTERED: AtomicUsize = AtomicUsize::new(0);
static REGISTERED_PID: AtomicU32 = AtomicU32::new(0);

/// The most bytes the process's registrations may reach when a link grows a ring (ring moves,
/// protocol §6.4); 0: no limit. See [`set_pinned_limit`].
static PINNED_LIMIT: AtomicUsize = AtomicUsize::new(0);

/// Sets the most bytes a link may take the process's registrations to when it offers its
/// peer a larger ring (`None`: no limit but the kernel's RLIMIT_MEMLOCK). A link over the
/// limit keeps the ring it has.
pub fn set_pinned_limit(limit: Option<usize>) {
    PINNED_LIMIT.store(limit.unwrap_or(0), Ordering::Release);
}

/// Whether `more` bytes of registrations fit under [`set_pinned_limit`]'s limit.
pub fn may_pin(more: usize) -> bool {
    match PINNED_LIMIT.load(Ordering::Acquire) {
        0 => true,
        limit => registered_bytes().saturating_add(more) <= limit,
    }
}

/// Bytes of memory this process has registered with RDMA devices right now (every live memory
/// registration's length; the kernel pins them and counts them in `VmPin`). A double-mapped
/// ring registered over both its views counts twice, as the kernel counts it.
pub fn registered_bytes() -> usize {
    if REGISTERED_PID.load(Ordering::Acquire) == std::process::id() {
        REGISTERED.load(Ordering::Acquire)
    } else {
        0
    }
}

// SAFETY: verbs objects may be used from any thread.
unsafe impl Send for Mr {}
// SAFETY: see Send.
unsafe impl Sync for Mr {}

impl Mr {
    /// `ibv_reg_mr` over `len` bytes at `addr`.
    ///
    /// # Safety
    /// The memory must stay mapped (and not be handed to another allocation) until this `Mr`
    /// is dropped; the device may write it at any time if `access` allows remote writes.
    pub unsafe fn register(
        pd: &Arc<Pd>,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Self> {
        // SAFETY: live PD; the range is valid per the caller's contract.
        let raw = unsafe {
            (pd.ctx.lib.verbs.ibv_reg_mr)(pd.as_ptr(), addr.cast(), len, access.0 as c_int)
        };
        let raw = NonNull::new(raw).ok_or_else(|| Error::last("ibv_reg_mr"))?;
        let pid = std::process::id();
        if REGISTERED_PID.swap(pid, Ordering::AcqRel) != pid {
            REGISTERED.store(0, Ordering::Release); // (a fork child's first)
        }
        REGISTERED.fetch_add(len, Ordering::AcqRel);
        Ok(Self {
            raw,
            pd: pd.clone(),
        })
    }

    /// Start address.
    pub fn addr(&self) -> *mut u8 {
        // SAFETY: live MR.
        unsafe { (*self.raw.as_ptr()).addr.cast() }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        // SAFETY: live MR.
        unsafe { (*self.raw.as_ptr()).length }
    }

    /// Whether the registration is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Local key.
    pub fn lkey(&self) -> u32 {
        // SAFETY: live MR.
        unsafe { (*self.raw.as_ptr()).lkey }
    }

    /// Remote key.
    pub fn rkey(&self) -> u32 {
        // SAFETY: live MR.
        unsafe { (*self.raw.as_ptr()).rkey }
    }

    /// The PD it belongs to.
    pub fn pd(&self) -> &Arc<Pd> {
        &self.pd
    }

    /// A scatter/gather entry for `len` bytes at `offset`, checked against the registration.
    pub fn sge(&self, offset: usize, len: usize) -> Result<ffi::ibv_sge> {
        if offset.checked_add(len).is_none_or(|end| end > self.len()) || len > u32::MAX as usize {
            return Err(Error::InvalidArgument(
                "range outside the memory registration",
            ));
        }
        Ok(ffi::ibv_sge {
            addr: self.addr() as u64 + offset as u64,
            length: len as u32,
            lkey: self.lkey(),
        })
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        if crate::fds::abandoned() {
            return;
        }
        // (the length `register` counted, read before the registration goes)
        let len = self.len();
        // SAFETY: live MR, deregistered once.
        unsafe { (self.pd.ctx.lib.verbs.ibv_dereg_mr)(self.raw.as_ptr()) };
        if REGISTERED_PID.load(Ordering::Acquire) == std::process::id() {
            let _ = REGISTERED.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                Some(n.saturating_sub(len))
            });
        }
    }
}

/// Page-aligned anonymous memory with its registration: send staging areas and simple
/// receive buffers (the double-mapped receive ring has its own type).
pub struct RegisteredBuf {
    mr: std::mem::ManuallyDrop<Mr>,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer is plain memory owned by this value; access goes through &/&mut self.
unsafe impl Send for RegisteredBuf {}
// SAFETY: see Send.
unsafe impl Sync for RegisteredBuf {}

impl RegisteredBuf {
    /// Maps `len` bytes (rounded up to pages), zeroed, and registers them with `access`.
    pub fn new(pd: &Arc<Pd>, len: usize, access: Access) -> Result<Self> {
        let page = page_size();
        let len = len.max(1).div_ceil(page) * page;
        // SAFETY: anonymous private mapping; checked for MAP_FAILED below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::last("mmap"));
        }
        let ptr =
            NonNull::new(p.cast::<u8>()).ok_or(Error::InvalidArgument("mmap returned NULL"))?;
        // Registered memory must not be shared copy-on-write with a forked child: the device
        // would keep writing the parent's pages while the child sees stale copies.
        // SAFETY: the range is our own fresh mapping.
        unsafe { libc::madvise(p, len, libc::MADV_DONTFORK) };
        // SAFETY: the mapping lives until Drop, which deregisters before unmapping.
        match unsafe { Mr::register(pd, ptr.as_ptr(), len, access) } {
            Ok(mr) => Ok(Self {
                mr: std::mem::ManuallyDrop::new(mr),
                ptr,
                len,
            }),
            Err(e) => {
                // SAFETY: our mapping, not registered.
                unsafe { libc::munmap(p, len) };
                Err(e)
            }
        }
    }

    /// The registration.
    pub fn mr(&self) -> &Mr {
        &self.mr
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr..ptr+len is our live mapping. The device writes into it only where the
        // registration allows and the protocol says so; readers synchronise through completions.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice, and &mut self excludes other references from this side.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Length in bytes (page multiple).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty (never, but clippy likes the pair).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for RegisteredBuf {
    fn drop(&mut self) {
        // SAFETY: the registration is dropped exactly once, here, before the memory it covers
        // is unmapped; the field is not used afterwards.
        unsafe { std::mem::ManuallyDrop::drop(&mut self.mr) };
        // SAFETY: our own mapping, no longer registered.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// The system page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p <= 0 {
        4096
    } else {
        p as usize
    }
}

pub(crate) fn set_nonblocking(fd: RawFd, call: &'static str) -> Result<()> {
    // SAFETY: fcntl on an fd we own; F_GETFL/F_SETFL take no pointers.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl < 0 || libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) < 0 {
            return Err(Error::last(call));
        }
    }
    Ok(())
}

pub(crate) fn poll_readable(fd: RawFd, timeout_ms: i32, call: &'static str) -> Result<bool> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
        if rc < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(Error::Call { call, source: e });
        }
        return Ok(rc > 0);
    }
}

/// `poll(2)` for readability on several fds; returns how many are ready (0 on timeout or
/// EINTR). `timeout_ms` −1 waits forever.
pub fn poll_fds(fds: &[RawFd], timeout_ms: i32) -> Result<usize> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: pfds is a valid array of pfds.len() pollfd structs for the call's duration.
    let rc = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout_ms) };
    if rc < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() == std::io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(Error::Call {
            call: "poll",
            source: e,
        });
    }
    Ok(rc as usize)
}
