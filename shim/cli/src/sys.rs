//! The launcher's only FFI: dlopen probing, RLIMIT_MEMLOCK, the page size and the real user
//! and group.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString};

/// Tries to dlopen `soname`; Ok(()) if it loads (the handle is closed again), else dlerror().
pub fn try_dlopen(soname: &str) -> Result<(), String> {
    let c = CString::new(soname).map_err(|e| e.to_string())?;
    // SAFETY: c is a valid NUL-terminated string; the handle is closed once.
    unsafe {
        let h = libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        if h.is_null() {
            let e = libc::dlerror();
            return Err(if e.is_null() {
                "dlopen failed".to_string()
            } else {
                CStr::from_ptr(e).to_string_lossy().into_owned()
            });
        }
        libc::dlclose(h);
    }
    Ok(())
}

/// RLIMIT_MEMLOCK (soft, hard) in bytes; `None` = unlimited.
pub fn memlock_limit() -> std::io::Result<(Option<u64>, Option<u64>)> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: r is a valid out-parameter.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let conv = |v: libc::rlim_t| (v != libc::RLIM_INFINITY).then_some(v);
    Ok((conv(r.rlim_cur), conv(r.rlim_max)))
}

/// The real user and group ids of this process (what a setuid program is judged against).
pub fn real_ids() -> (u32, u32) {
    // SAFETY: getuid and getgid have no preconditions and cannot fail.
    unsafe { (libc::getuid(), libc::getgid()) }
}

/// The size of a memory page (what registrations are counted in).
pub fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions; it returns -1 only for an unknown name.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(p).unwrap_or(4096)
}

/// The host's memory in bytes (`sysinfo(2)`), `None` if it cannot be read.
pub fn phys_mem_bytes() -> Option<u64> {
    // SAFETY: sysinfo is plain data; all zeroes is a valid value.
    let mut si: libc::sysinfo = unsafe { std::mem::zeroed() };
    // SAFETY: `si` is a writable struct sysinfo.
    let r = unsafe { libc::sysinfo(&mut si) };
    (r == 0).then(|| si.totalram as u64 * u64::from(si.mem_unit.max(1)))
}

/// The effective user id (whose run directory `rdmashim ss` reads by default).
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Whether process `pid` exists (`kill(pid, 0)`: success, or EPERM for another user's).
pub fn process_exists(pid: u32) -> bool {
    let Ok(p) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if p <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists; no signal is sent.
    let r = unsafe { libc::kill(p, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Whether this process may write to `dir` (`access(W_OK)`, by the real ids).
pub fn writable(dir: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: c is a valid NUL-terminated path.
    unsafe { libc::access(c.as_ptr(), libc::W_OK) == 0 }
}
