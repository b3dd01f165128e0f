//! The shim's own OS access: errno, raw-syscall file output, page allocation, the host probe's
//! `opendir`/`dlopen`. Everything here avoids the hooked entry points (`write`, `close`, ...):
//! a call from inside the library to `write` would bind to the library's own `write`.
#![allow(unsafe_code)]

use crate::outcome::Errno;
use core::ffi::{c_char, c_int, c_long};

/// The calling thread's errno.
#[inline(always)]
pub fn errno() -> Errno {
    // SAFETY: __errno_location returns a valid pointer to the calling thread's errno.
    Errno(unsafe { *libc::__errno_location() })
}

/// Sets the calling thread's errno.
#[inline(always)]
pub fn set_errno(e: Errno) {
    // SAFETY: as in `errno`.
    unsafe { *libc::__errno_location() = e.0 };
}

/// RAII: restores errno on drop. Wrap every shim-side syscall made after the real call.
pub struct ErrnoGuard(Errno);

impl ErrnoGuard {
    pub fn save() -> Self {
        ErrnoGuard(errno())
    }
}

impl Drop for ErrnoGuard {
    fn drop(&mut self) {
        set_errno(self.0);
    }
}

/// getpid(2) (not hooked; glibc does not cache it since 2.25, so it is a real syscall).
pub fn getpid() -> u32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() as u32 }
}

fn check(r: c_long) -> Result<c_long, Errno> {
    if r < 0 {
        Err(errno())
    } else {
        Ok(r)
    }
}

/// Opens `path` (NUL-terminated) with raw syscalls.
fn open(path: &[u8], flags: c_int, mode: libc::mode_t) -> Result<c_int, Errno> {
    if path.last() != Some(&0) {
        return Err(Errno(libc::EINVAL));
    }
    // SAFETY: path is NUL-terminated and outlives the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_openat,
            libc::AT_FDCWD,
            path.as_ptr() as *const c_char,
            flags,
            mode,
        )
    };
    check(r).map(|fd| fd as c_int)
}

fn close(fd: c_int) {
    // SAFETY: fd was opened by this module and is closed once.
    unsafe { libc::syscall(libc::SYS_close, fd) };
}

/// Writes all of `data` to `fd` with raw `write` syscalls.
pub fn write_all(fd: c_int, mut data: &[u8]) -> Result<(), Errno> {
    while !data.is_empty() {
        // SAFETY: data is a valid readable slice for its length.
        let r = unsafe { libc::syscall(libc::SYS_write, fd, data.as_ptr(), data.len()) };
        match check(r) {
            Ok(n) => data = data.get(n as usize..).unwrap_or(&[]),
            Err(e) if e.0 == libc::EINTR => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Appends one log record to `path` (NUL-terminated), or to stderr if `None`. Opening per
/// record keeps no fd of the shim open in the application (which may close or reuse any fd).
/// errno is preserved.
pub fn append_log(path: Option<&[u8]>, data: &[u8]) {
    let _e = ErrnoGuard::save();
    match path {
        None => {
            let _ = write_all(2, data);
        }
        Some(p) => {
            let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND | libc::O_CLOEXEC;
            if let Ok(fd) = open(p, flags, 0o644) {
                let _ = write_all(fd, data);
                close(fd);
            }
        }
    }
}

/// Writes `data` to `path` (NUL-terminated) atomically: a temporary file next to it, then
/// rename(2). errno is preserved.
pub fn write_file_atomic(path: &[u8], data: &[u8]) -> Result<(), Errno> {
    let _e = ErrnoGuard::save();
    let mut tmp = crate::fmtbuf::FixedBuf::<4200>::new();
    tmp.push_bytes(path.strip_suffix(b"\0").ok_or(Errno(libc::EINVAL))?);
    tmp.push_bytes(b".tmp\0");
    if tmp.overflowed() {
        return Err(Errno(libc::ENAMETOOLONG));
    }
    let tmp = tmp.as_bytes();
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC;
    let fd = open(tmp, flags, 0o644)?;
    let w = write_all(fd, data);
    close(fd);
    w?;
    // SAFETY: both paths are NUL-terminated (checked above).
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat,
            libc::AT_FDCWD,
            tmp.as_ptr() as *const c_char,
            libc::AT_FDCWD,
            path.as_ptr() as *const c_char,
        )
    };
    check(r).map(|_| ())
}

/// Maps `len` bytes of zeroed anonymous memory (async-signal-safe, unlike malloc).
pub fn map_zeroed(len: usize) -> Option<*mut u8> {
    // SAFETY: anonymous private mapping, no fd, no fixed address.
    let p = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        None
    } else {
        Some(p as *mut u8)
    }
}

/// Unmaps memory obtained from [`map_zeroed`].
///
/// # Safety
/// `p`/`len` must come from one `map_zeroed` call, and nothing may reference it any more.
pub unsafe fn unmap(p: *mut u8, len: usize) {
    // SAFETY: guaranteed by the caller.
    unsafe { libc::munmap(p as *mut libc::c_void, len) };
}

/// Whether directory `path` (NUL-terminated) has any entry other than `.` and `..`.
/// `None` if it cannot be opened (absent).
pub fn dir_has_entries(path: &[u8]) -> Option<bool> {
    if path.last() != Some(&0) {
        return None;
    }
    let _e = ErrnoGuard::save();
    // SAFETY: path is NUL-terminated; opendir/readdir/closedir use glibc-internal calls, never
    // our hooks.
    unsafe {
        let d = libc::opendir(path.as_ptr() as *const c_char);
        if d.is_null() {
            return None;
        }
        let mut found = false;
        loop {
            let ent = libc::readdir(d);
            if ent.is_null() {
                break;
            }
            let name = core::ffi::CStr::from_ptr((*ent).d_name.as_ptr());
            if name.to_bytes() != b"." && name.to_bytes() != b".." {
                found = true;
                break;
            }
        }
        libc::closedir(d);
        Some(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_and_errno_preserved() {
        let dir = std::env::temp_dir().join(format!("rdmashim-sys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("s.json");
        let mut c = p.to_str().unwrap().as_bytes().to_vec();
        c.push(0);
        set_errno(Errno(libc::EAGAIN));
        write_file_atomic(&c, b"{\"a\":1}\n").unwrap();
        assert_eq!(errno(), Errno(libc::EAGAIN));
        assert_eq!(std::fs::read(&p).unwrap(), b"{\"a\":1}\n");
        assert!(write_file_atomic(b"/nonexistent-dir/x\0", b"x").is_err());
        assert_eq!(errno(), Errno(libc::EAGAIN));
        assert!(write_file_atomic(b"no-nul", b"x").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn probes() {
        assert_eq!(dir_has_entries(b"/nonexistent-dir\0"), None);
        assert_eq!(dir_has_entries(b"/\0"), Some(true));
    }
}
