//! Process model: fork and exec.
//!
//! fork: pass-through; the child's reset (own pid, counters zeroed, fd table inherited as the
//! kernel's fd table is) runs in a `pthread_atfork` child handler, which also covers glibc's
//! internal forks (daemon(3), ...). vfork is deliberately *not* hooked: a vfork child shares
//! our memory, and a hook frame would be torn down under the parent; instead every hook that
//! would change the fd table or write stats first checks it is not in such a child.
//!
//! exec: the new image has no shim state. Before a (non-vfork-child) execve the stats record is
//! written, so a process that execs still leaves one; if the new image runs under the shim too
//! it overwrites the same (pid-named) file at its exit. This is also where the upgrade must
//! demote upgraded fds without FD_CLOEXEC back to plain TCP, or refuse such upgrades.

use super::conn;
use super::hook;
use crate::outcome::Outcome::PassThrough;
use core::ffi::c_char;
use libc::pid_t;

hook! {
    /// fork(2).
    fn fork() -> pid_t;
    id: Fork;
    fallback: enosys;
    |_real, _cx| { PassThrough }
}

hook! {
    /// execve(2).
    fn execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> i32;
    id: Execve;
    fallback: syscall(SYS_execve; path, argv, envp);
    |_real, _cx| {
        if !conn::in_foreign_child() {
            let _s = crate::guard::Section::enter();
            let _e = crate::sys::ErrnoGuard::save();
            crate::fdtable::TABLE.for_each(0, u32::MAX, |fd, e| {
                if e.kind() == crate::fdtable::Kind::Upgraded && crate::upgrade::slot_is_ours(e.slot()) {
                    if let Some(c) = crate::upgrade::lookup(e.slot()) {
                        crate::upgrade::data::abort_for_exec(&c, fd);
                    }
                }
            });
            crate::init::write_stats();
        }
        PassThrough
    }
}
