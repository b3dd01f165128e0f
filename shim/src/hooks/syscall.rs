//! The Rust half of `syscall(2)` (csrc/syscall.c hands over only the numbers below; it makes
//! every other one itself).
//!
//! A program that closes, duplicates or sandboxes through `syscall()` gets what the named
//! function's hook does: libuv closes every descriptor with `syscall(SYS_close, fd)` (a close
//! the shim would otherwise never see: its connection would stay open on the ring, its entry
//! would name a file opened later at the same number), libseccomp installs filters with
//! `syscall(SYS_seccomp, ...)`. `io_uring_setup`, which glibc has no function for, ends RDMA
//! for the process first ([`crate::upgrade::close_for_io_uring`]).

use super::process;
use core::ffi::{c_int, c_long, c_uint, c_ulong};

/// seccomp(2) operations that install a filter (`SECCOMP_SET_MODE_STRICT`,
/// `SECCOMP_SET_MODE_FILTER`).
const SECCOMP_SET_MODE_STRICT: c_long = 0;
const SECCOMP_SET_MODE_FILTER: c_long = 1;

/// `syscall(nr, a1, ..., a6)` for the numbers csrc/syscall.c hands over: the result, or -1
/// with errno set (as glibc's `syscall`).
///
/// # Safety
/// Called only from the C entry point with the application's arguments.
#[no_mangle]
pub unsafe extern "C" fn rdmashim_syscall(
    nr: c_long,
    a1: c_long,
    a2: c_long,
    a3: c_long,
    a4: c_long,
    a5: c_long,
    a6: c_long,
) -> c_long {
    // (each argument is narrowed as the kernel reads it for this call)
    // SAFETY: in every arm, the named hook or the system call itself, with the caller's
    // arguments, which have that call's meaning.
    unsafe {
        match nr {
            libc::SYS_close => super::fd::close(a1 as c_int) as c_long,
            libc::SYS_dup => super::fd::dup(a1 as c_int) as c_long,
            #[cfg(target_arch = "x86_64")]
            libc::SYS_dup2 => super::fd::dup2(a1 as c_int, a2 as c_int) as c_long,
            libc::SYS_dup3 => super::fd::dup3(a1 as c_int, a2 as c_int, a3 as c_int) as c_long,
            libc::SYS_close_range => {
                super::fd::close_range(a1 as c_uint, a2 as c_uint, a3 as c_int) as c_long
            }
            libc::SYS_fcntl => {
                super::fd::rdmashim_fcntl(a1 as c_int, a2 as c_int, a3 as usize, 0) as c_long
            }
            libc::SYS_prctl => process::rdmashim_prctl(
                a1 as c_int,
                a2 as c_ulong,
                a3 as c_ulong,
                a4 as c_ulong,
                a5 as c_ulong,
            ) as c_long,
            libc::SYS_seccomp => {
                let filter = matches!(a1, SECCOMP_SET_MODE_STRICT | SECCOMP_SET_MODE_FILTER);
                if filter {
                    process::before_sandbox_call(crate::hook::Hook::Syscall);
                }
                let r = rdmashim_core::raw_syscall!(libc::SYS_seccomp, a1, a2, a3);
                if filter && r == 0 {
                    crate::log::silence();
                }
                r
            }
            libc::SYS_io_uring_setup => {
                process::before_io_uring();
                rdmashim_core::raw_syscall!(libc::SYS_io_uring_setup, a1, a2)
            }
            _ => rdmashim_core::raw_syscall!(nr, a1, a2, a3, a4, a5, a6),
        }
    }
}
