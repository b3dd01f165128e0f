//! Run-time binding to libibverbs and librdmacm.
//!
//! rdmashim is preloaded into every process of a pipeline, most of which never make a TCP
//! connection, and it must start on hosts that have no rdma-core at all. So nothing here is
//! linked at load time: the two libraries are `dlopen`ed the first time something asks for
//! them ([`lib`]), once per process, and a host without them gets a [`LoadError`] naming the
//! library, never a failed program start.
//!
//! The C types come from `rdma-mummy-sys` (bindgen over rdma-core's own headers). Its C
//! wrapper functions are deliberately *not* used: they sit in an object file whose constructor
//! `dlopen`s libibverbs at load time in every process (see ../shared/design/brief.md §8). As
//! long as this crate calls none of them, the linker leaves that object (and its constructor)
//! out; `tests/no_eager_dlopen.rs` checks it. The `static inline` verbs (`ibv_post_send`,
//! `ibv_poll_cq`, …) are the Rust ones of `rdma-mummy-sys`, which only follow the provider's
//! ops table and need no symbol.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::fmt;
use std::sync::OnceLock;

/// The CPU's time-stamp counter (`rdtsc`); `None` where there is none this crate reads (not
/// x86_64). Its rate is the caller's to learn (the spin clock, [`crate::tick`]; `ring_bench`'s
/// timing): under clocksources without a vDSO reader (HPET) a monotonic-clock read is a system
/// call.
#[inline(always)]
pub fn cycles() -> Option<u64> {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: rdtsc exists on every x86_64 CPU, reads a counter and touches no memory.
        Some(unsafe { core::arch::x86_64::_rdtsc() })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

/// Makes system call `nr` with six arguments (unused ones are ignored by the kernel) without
/// going through the C library's `syscall()`, which a preload shim defines to see the
/// program's raw closes: the transport's and the shim's own calls must not reach its hooks.
/// Returns what `syscall(3)` returns: the result, or -1 with errno set.
///
/// # Safety
/// As the system call `nr` with these arguments (pointers valid for what it does with them).
#[inline]
pub unsafe fn syscall6(nr: std::ffi::c_long, a: [std::ffi::c_long; 6]) -> std::ffi::c_long {
    #[cfg(target_arch = "x86_64")]
    let r: std::ffi::c_long = {
        let r;
        // SAFETY: the kernel's x86_64 system call convention (number and result in rax,
        // arguments in rdi, rsi, rdx, r10, r8, r9; rcx and r11 clobbered); what the call does
        // with its arguments is the caller's contract.
        unsafe {
            core::arch::asm!(
                "syscall",
                inlateout("rax") nr => r,
                in("rdi") a[0],
                in("rsi") a[1],
                in("rdx") a[2],
                in("r10") a[3],
                in("r8") a[4],
                in("r9") a[5],
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack),
            )
        };
        r
    };
    #[cfg(target_arch = "aarch64")]
    let r: std::ffi::c_long = {
        let r;
        // SAFETY: the kernel's arm64 system call convention (number in x8, arguments in
        // x0..x5, result in x0); the arguments are the caller's contract.
        unsafe {
            core::arch::asm!(
                "svc 0",
                in("x8") nr,
                inlateout("x0") a[0] => r,
                in("x1") a[1],
                in("x2") a[2],
                in("x3") a[3],
                in("x4") a[4],
                in("x5") a[5],
                options(nostack),
            )
        };
        r
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    // SAFETY: the caller's contract (on these architectures through libc's `syscall`).
    return unsafe { libc::syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]) };
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    {
        if (-4095..0).contains(&r) {
            // SAFETY: __errno_location returns the calling thread's errno.
            unsafe { *libc::__errno_location() = -r as c_int };
            return -1;
        }
        r
    }
}

/// [`syscall6`] with one to six arguments of any integer or pointer type, as `libc::syscall`
/// takes them: `raw_syscall!(libc::SYS_close, fd)`. Unsafe: use inside an `unsafe` block.
#[macro_export]
macro_rules! raw_syscall {
    ($nr:expr $(,)?) => { $crate::sys::syscall6($nr as ::core::ffi::c_long, [0; 6]) };
    ($nr:expr, $a:expr $(,)?) => { $crate::raw_syscall!(@ $nr, $a, 0, 0, 0, 0, 0) };
    ($nr:expr, $a:expr, $b:expr $(,)?) => { $crate::raw_syscall!(@ $nr, $a, $b, 0, 0, 0, 0) };
    ($nr:expr, $a:expr, $b:expr, $c:expr $(,)?) => { $crate::raw_syscall!(@ $nr, $a, $b, $c, 0, 0, 0) };
    ($nr:expr, $a:expr, $b:expr, $c:expr, $d:expr $(,)?) => { $crate::raw_syscall!(@ $nr, $a, $b, $c, $d, 0, 0) };
    ($nr:expr, $a:expr, $b:expr, $c:expr, $d:expr, $e:expr $(,)?) => { $crate::raw_syscall!(@ $nr, $a, $b, $c, $d, $e, 0) };
    ($nr:expr, $a:expr, $b:expr, $c:expr, $d:expr, $e:expr, $f:expr $(,)?) => { $crate::raw_syscall!(@ $nr, $a, $b, $c, $d, $e, $f) };
    (@ $nr:expr, $a:expr, $b:expr, $c:expr, $d:expr, $e:expr, $f:expr) => {
        $crate::sys::syscall6(
            $nr as ::core::ffi::c_long,
            [
                $a as ::core::ffi::c_long,
                $b as ::core::ffi::c_long,
                $c as ::core::ffi::c_long,
                $d as ::core::ffi::c_long,
                $e as ::core::ffi::c_long,
                $f as ::core::ffi::c_long,
            ],
        )
    };
}

use ffi::{
    ibv_comp_channel, ibv_context, ibv_cq, ibv_device, ibv_device_attr, ibv_gid, ibv_mr, ibv_pd,
    ibv_port_attr, ibv_qp, ibv_qp_attr, ibv_qp_init_attr, ibv_srq, ibv_srq_init_attr,
    rdma_cm_event, rdma_cm_id, rdma_conn_param, rdma_event_channel,
};
pub use rdma_mummy_sys as ffi;

/// The shared object names rdma-core installs (the `.so.1` ABI names, as every rdma-core since
/// v13 ships them; the unversioned `.so` exists only with the -dev packages).
pub const LIBIBVERBS: &str = "libibverbs.so.1";
/// See [`LIBIBVERBS`].
pub const LIBRDMACM: &str = "librdmacm.so.1";

/// Why the RDMA libraries could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    /// The shared object that failed (`libibverbs.so.1`, …).
    pub library: String,
    /// The symbol that was missing, when the library loaded but lacked one.
    pub symbol: Option<&'static str>,
    /// `dlerror()`'s text.
    pub detail: String,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.symbol {
            Some(sym) => write!(f, "{} lacks {}: {}", self.library, sym, self.detail),
            None => write!(f, "cannot load {}: {}", self.library, self.detail),
        }
    }
}

impl std::error::Error for LoadError {}

fn dlerror_text() -> String {
    // SAFETY: dlerror() returns NULL or a NUL-terminated string valid until the next dl* call on
    // this thread; we copy it out immediately.
    unsafe {
        let p = libc::dlerror();
        if p.is_null() {
            "unknown error".to_owned()
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    }
}

/// An open shared object. Never closed: function pointers taken from it live as long as the
/// process, which is what every caller assumes.
struct Handle {
    raw: *mut c_void,
    name: String,
}

impl Handle {
    fn open(name: &str) -> Result<Self, LoadError> {
        let cname = std::ffi::CString::new(name).map_err(|_| LoadError {
            library: name.to_owned(),
            symbol: None,
            detail: "name contains NUL".to_owned(),
        })?;
        // SAFETY: cname is a valid C string; RTLD_LOCAL keeps the libraries' symbols out of the
        // global namespace the application resolves against.
        let raw = unsafe { libc::dlopen(cname.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if raw.is_null() {
            return Err(LoadError {
                library: name.to_owned(),
                symbol: None,
                detail: dlerror_text(),
            });
        }
        Ok(Self {
            raw,
            name: name.to_owned(),
        })
    }

    fn sym(&self, symbol: &'static CStr) -> Result<*mut c_void, LoadError> {
        // SAFETY: self.raw is a live handle from dlopen; symbol is NUL-terminated.
        let p = unsafe { libc::dlsym(self.raw, symbol.as_ptr()) };
        if p.is_null() {
            Err(LoadError {
                library: self.name.clone(),
                symbol: Some(symbol.to_str().unwrap_or("?")),
                detail: dlerror_text(),
            })
        } else {
            Ok(p)
        }
    }
}

/// Declares a table of function pointers resolved from one library, all at once: a library
/// that lacks any of them is reported as unusable rather than failing later mid-connection.
macro_rules! fn_table {
    ($(#[$m:meta])* $table:ident { $( $name:ident : fn($($arg:ty),*) $(-> $ret:ty)? ; )* }) => {
        $(#[$m])*
        #[allow(missing_docs)]
        pub struct $table {
            $( pub $name: unsafe extern "C" fn($($arg),*) $(-> $ret)?, )*
        }

        impl $table {
            fn resolve(h: &Handle) -> Result<Self, LoadError> {
                Ok(Self {
                    $( $name: {
                        let p = h.sym(
                            // Built at compile time from the identifier; always NUL-terminated.
                            match CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                                Ok(c) => c,
                                Err(_) => unreachable!(),
                            },
                        )?;
                        // SAFETY: the symbol was resolved from rdma-core's library, whose ABI
                        // (stable since the .so.1 soname) declares it with exactly this
                        // signature; see <infiniband/verbs.h> and <rdma/rdma_cma.h>.
                        unsafe {
                            std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) $(-> $ret)?>(p)
                        }
                    }, )*
                })
            }
        }
    };
}

fn_table! {
    /// The exported functions of libibverbs that rdmashim calls.
    Verbs {
        ibv_get_device_list: fn(*mut c_int) -> *mut *mut ibv_device;
        ibv_free_device_list: fn(*mut *mut ibv_device);
        ibv_get_device_name: fn(*mut ibv_device) -> *const c_char;
        ibv_open_device: fn(*mut ibv_device) -> *mut ibv_context;
        ibv_close_device: fn(*mut ibv_context) -> c_int;
        ibv_query_device: fn(*mut ibv_context, *mut ibv_device_attr) -> c_int;
        ibv_query_port: fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int;
        ibv_query_gid: fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int;
        ibv_alloc_pd: fn(*mut ibv_context) -> *mut ibv_pd;
        ibv_dealloc_pd: fn(*mut ibv_pd) -> c_int;
        ibv_create_comp_channel: fn(*mut ibv_context) -> *mut ibv_comp_channel;
        ibv_destroy_comp_channel: fn(*mut ibv_comp_channel) -> c_int;
        ibv_create_cq: fn(*mut ibv_context, c_int, *mut c_void, *mut ibv_comp_channel, c_int) -> *mut ibv_cq;
        ibv_destroy_cq: fn(*mut ibv_cq) -> c_int;
        ibv_get_cq_event: fn(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int;
        ibv_ack_cq_events: fn(*mut ibv_cq, c_uint);
        ibv_reg_mr: fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr;
        ibv_dereg_mr: fn(*mut ibv_mr) -> c_int;
        ibv_wc_status_str: fn(ffi::ibv_wc_status::Type) -> *const c_char;
        ibv_fork_init: fn() -> c_int;
        ibv_create_qp: fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp;
        ibv_modify_qp: fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int;
        ibv_query_qp: fn(*mut ibv_qp, *mut ibv_qp_attr, c_int, *mut ibv_qp_init_attr) -> c_int;
        ibv_destroy_qp: fn(*mut ibv_qp) -> c_int;
        ibv_create_srq: fn(*mut ibv_pd, *mut ibv_srq_init_attr) -> *mut ibv_srq;
        ibv_destroy_srq: fn(*mut ibv_srq) -> c_int;
    }
}

fn_table! {
    /// The exported functions of librdmacm that rdmashim calls.
    Cm {
        rdma_create_event_channel: fn() -> *mut rdma_event_channel;
        rdma_destroy_event_channel: fn(*mut rdma_event_channel);
        rdma_create_id: fn(*mut rdma_event_channel, *mut *mut rdma_cm_id, *mut c_void, ffi::rdma_port_space::Type) -> c_int;
        rdma_destroy_id: fn(*mut rdma_cm_id) -> c_int;
        rdma_bind_addr: fn(*mut rdma_cm_id, *mut libc::sockaddr) -> c_int;
        rdma_listen: fn(*mut rdma_cm_id, c_int) -> c_int;
        rdma_resolve_addr: fn(*mut rdma_cm_id, *mut libc::sockaddr, *mut libc::sockaddr, c_int) -> c_int;
        rdma_resolve_route: fn(*mut rdma_cm_id, c_int) -> c_int;
        rdma_connect: fn(*mut rdma_cm_id, *mut rdma_conn_param) -> c_int;
        rdma_accept: fn(*mut rdma_cm_id, *mut rdma_conn_param) -> c_int;
        rdma_reject: fn(*mut rdma_cm_id, *const c_void, u8) -> c_int;
        rdma_disconnect: fn(*mut rdma_cm_id) -> c_int;
        rdma_get_cm_event: fn(*mut rdma_event_channel, *mut *mut rdma_cm_event) -> c_int;
        rdma_ack_cm_event: fn(*mut rdma_cm_event) -> c_int;
        rdma_create_qp: fn(*mut rdma_cm_id, *mut ibv_pd, *mut ibv_qp_init_attr) -> c_int;
        rdma_destroy_qp: fn(*mut rdma_cm_id);
        rdma_migrate_id: fn(*mut rdma_cm_id, *mut rdma_event_channel) -> c_int;
        rdma_event_str: fn(ffi::rdma_cm_event_type::Type) -> *const c_char;
        rdma_init_qp_attr: fn(*mut rdma_cm_id, *mut ibv_qp_attr, *mut c_int) -> c_int;
        rdma_establish: fn(*mut rdma_cm_id) -> c_int;
        rdma_set_option: fn(*mut rdma_cm_id, c_int, c_int, *mut c_void, usize) -> c_int;
    }
}

/// Both libraries, resolved.
pub struct Lib {
    /// libibverbs.
    pub verbs: Verbs,
    /// librdmacm.
    pub cm: Cm,
}

impl fmt::Debug for Lib {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Lib { libibverbs, librdmacm }")
    }
}

impl Lib {
    /// Loads the two libraries by the given names (tests use this to simulate a host without
    /// rdma-core; everyone else calls [`lib`]).
    pub fn load_from(verbs: &str, cm: &str) -> Result<Self, LoadError> {
        let v = Handle::open(verbs)?;
        let c = Handle::open(cm)?;
        Ok(Self {
            verbs: Verbs::resolve(&v)?,
            cm: Cm::resolve(&c)?,
        })
    }
}

static LIB: OnceLock<Result<Lib, LoadError>> = OnceLock::new();

/// The process-wide binding, loaded at the first call (and only then).
pub fn lib() -> Result<&'static Lib, &'static LoadError> {
    LIB.get_or_init(|| Lib::load_from(LIBIBVERBS, LIBRDMACM))
        .as_ref()
}

/// Whether [`lib`] has been called (and so the libraries possibly loaded) in this process.
pub fn loaded() -> bool {
    LIB.get().is_some()
}

/// `ibv_wc_status_str`, owned.
pub fn wc_status_str(lib: &Lib, status: ffi::ibv_wc_status::Type) -> String {
    // SAFETY: ibv_wc_status_str returns a pointer to a static string for any value.
    unsafe { cstr_lossy((lib.verbs.ibv_wc_status_str)(status)) }
}

/// `rdma_event_str`, owned.
pub fn event_str(lib: &Lib, ev: ffi::rdma_cm_event_type::Type) -> String {
    // SAFETY: rdma_event_str returns a pointer to a static string for any value.
    unsafe { cstr_lossy((lib.cm.rdma_event_str)(ev)) }
}

/// Copies a C string that may be NULL.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string.
pub(crate) unsafe fn cstr_lossy(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: non-null and NUL-terminated per the contract.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}
