//! stdio on sockets: `fdopen`.
//!
//! glibc's stdio reads, writes and closes a stream's descriptor with its internal `__read`,
//! `__write` and `__close`, which no preload sees: a program that wraps a socket in a `FILE`
//! (`fdopen(sock, "r+")`, then `fgets`/`fprintf`/`fclose`, as many small C servers do) would
//! move its bytes past the shim — on the kernel socket while the peer's shim has moved the
//! connection onto the ring — and its `fclose` would leave the connection open. For a TCP
//! socket the shim tracks, `fdopen` returns a stream made with `fopencookie` whose functions
//! are the shim's own hooks (`csrc/stdio.c`), so its bytes take the path every `read`/`write`
//! does (pass-through on TCP, the ring once upgraded) and its close is seen. `fileno()` of such
//! a stream answers the socket, as for glibc's own.

use super::hook;
use crate::outcome::Outcome::{Fail, Handled, PassThrough};
use core::ffi::{c_char, c_int, c_void};
use libc::{size_t, ssize_t};

extern "C" {
    /// A cookie stream on `fd` (csrc/stdio.c); null with errno set on failure.
    fn rdmashim_stream_open(fd: c_int, mode: *const c_char) -> *mut libc::FILE;
}

hook! {
    /// fdopen(3): on a TCP socket, a stream whose I/O goes through the hooks (module doc).
    fn fdopen(fd: c_int, mode: *const c_char) -> *mut libc::FILE;
    id: Fdopen;
    fallback: enosys;
    fast: not_tcp(fd);
    |_real, _cx| {
        if !crate::fdtable::TABLE.get(fd).is_tcp_stream() {
            return PassThrough;
        }
        // (fdopen's "e": close-on-exec, which a cookie stream does not apply itself)
        // SAFETY: the caller's mode string (fdopen's contract: NUL-terminated).
        let cloexec = !mode.is_null() && unsafe { core::ffi::CStr::from_ptr(mode) }.to_bytes().contains(&b'e');
        // SAFETY: fd is open (a tracked socket); mode is the caller's string.
        let f = unsafe { rdmashim_stream_open(fd, mode) };
        if f.is_null() {
            return Fail(crate::sys::errno());
        }
        if cloexec {
            // SAFETY: the Rust half of the fcntl hook, with F_SETFD's int argument.
            unsafe { super::fd::rdmashim_fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC as usize, 0) };
        }
        Handled(f)
    }
}

fn fd_of(cookie: *mut c_void) -> c_int {
    cookie as usize as c_int
}

/// A cookie stream's read: the `read` hook.
///
/// # Safety
/// Called by glibc with a buffer of `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn rdmashim_stream_read(
    cookie: *mut c_void,
    buf: *mut c_char,
    size: size_t,
) -> ssize_t {
    // SAFETY: glibc's buffer of `size` bytes.
    unsafe { super::io::read(fd_of(cookie), buf.cast(), size) }
}

/// A cookie stream's write: the `write` hook until all of it is written or one fails, as
/// glibc's own stream writes (a short count marks the stream in error).
///
/// # Safety
/// Called by glibc with `size` bytes at `buf`.
#[no_mangle]
pub unsafe extern "C" fn rdmashim_stream_write(
    cookie: *mut c_void,
    buf: *const c_char,
    size: size_t,
) -> ssize_t {
    let fd = fd_of(cookie);
    let mut done = 0usize;
    while done < size {
        // SAFETY: the rest of glibc's `size` bytes.
        let n = unsafe { super::io::write(fd, buf.add(done).cast(), size - done) };
        if n <= 0 {
            return if done > 0 { done as ssize_t } else { n };
        }
        done += n as usize;
    }
    done as ssize_t
}

/// A cookie stream's seek: lseek on the socket (ESPIPE, which glibc's flush ignores as for
/// its own streams on sockets).
///
/// # Safety
/// Called by glibc with a valid offset pointer.
#[no_mangle]
pub unsafe extern "C" fn rdmashim_stream_seek(
    cookie: *mut c_void,
    offset: *mut i64,
    whence: c_int,
) -> c_int {
    // SAFETY: glibc's offset; lseek takes no pointer.
    unsafe {
        let r = libc::lseek64(fd_of(cookie), *offset, whence);
        if r < 0 {
            return -1;
        }
        *offset = r;
    }
    0
}

/// A cookie stream's close: the `close` hook.
///
/// # Safety
/// Called by glibc once, when the stream is closed.
#[no_mangle]
pub unsafe extern "C" fn rdmashim_stream_close(cookie: *mut c_void) -> c_int {
    // SAFETY: the stream's descriptor, closed once.
    unsafe { super::fd::close(fd_of(cookie)) }
}
