//! Process model: fork and exec.
//!
//! fork: pass-through; the child's reset (own pid, counters zeroed, fd table inherited as the
//! kernel's fd table is) runs in a `pthread_atfork` child handler, which also covers glibc's
//! internal forks (daemon(3), ...). vfork is deliberately *not* hooked: a vfork child shares
//! our memory, and a hook frame would be torn down under the parent; instead every hook that
//! would change the fd table or write stats first checks it is not in such a child.
//!
//! exec: the new image has no shim state. Before any exec — `execve`, and `execv`, `execvp`,
//! `execvpe`, `fexecve` and the C `execl`/`execlp`/`execle` (csrc/exec.c), which glibc routes
//! around `execve`'s symbol — every upgraded connection that an fd without FD_CLOEXEC refers
//! to goes back to TCP at exact offsets (protocol §8.5), so the new image finds a plain TCP
//! socket in the state the stream is in; and the stats record is written, so a process that
//! execs still leaves one (if the new image runs under the shim too it overwrites the same
//! pid-named file at its exit). `posix_spawn`, `posix_spawnp`, `system` and `popen` start a
//! child that inherits the fds and execs through glibc's internals: the same return to TCP
//! happens in the parent first (which goes on with the connections, as TCP).
//!
//! Credentials: `setuid` and its kin end RDMA for a process that used it (the kernel refuses
//! RDMA commands on descriptors opened under other credentials): its connections go back to
//! TCP first, as before an exec (see [`before_credentials`]).

use super::hook;
use crate::outcome::Outcome::PassThrough;
use core::ffi::{c_char, c_int, c_void};
use libc::pid_t;
use std::sync::atomic::{AtomicU32, Ordering};

/// The pid the shim state belongs to (set by the constructor and the fork child handler).
pub(crate) static PID: AtomicU32 = AtomicU32::new(0);

/// Whether we run in a child that shares our memory but not our fd table (a `vfork` child, or a
/// `clone` child without CLONE_FILES): such a child must not change the fd table or write stats.
/// Costs one getpid(2); call it only where the table would change.
pub(crate) fn in_foreign_child() -> bool {
    let me = crate::sys::getpid();
    match PID.load(Ordering::Relaxed) {
        0 => {
            // Constructor not run yet: this is the process that loaded us.
            PID.store(me, Ordering::Relaxed);
            false
        }
        p => p != me,
    }
}

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
    |_real, _cx| { before_exec(); PassThrough }
}

hook! {
    /// execv(3): glibc calls its internal execve, which no preload sees.
    fn execv(path: *const c_char, argv: *const *const c_char) -> i32;
    id: Execv;
    fallback: enosys;
    |_real, _cx| { before_exec(); PassThrough }
}

hook! {
    /// execvp(3) (also reached by the C `execlp`, csrc/exec.c).
    fn execvp(file: *const c_char, argv: *const *const c_char) -> i32;
    id: Execvp;
    fallback: enosys;
    |_real, _cx| { before_exec(); PassThrough }
}

hook! {
    /// execvpe(3).
    fn execvpe(file: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> i32;
    id: Execvpe;
    fallback: enosys;
    |_real, _cx| { before_exec(); PassThrough }
}

hook! {
    /// fexecve(3).
    fn fexecve(fd: c_int, argv: *const *const c_char, envp: *const *const c_char) -> i32;
    id: Fexecve;
    fallback: enosys;
    |_real, _cx| { before_exec(); PassThrough }
}

hook! {
    /// posix_spawn(3): the child (a vfork-like clone) execs with glibc's internal execve; its
    /// inherited sockets must be plain TCP before it exists, so the connections go back to
    /// TCP in the parent — which keeps them, as TCP (docs/upgrade.md, process models).
    fn posix_spawn(
        pid: *mut libc::pid_t,
        path: *const c_char,
        actions: *const libc::posix_spawn_file_actions_t,
        attr: *const libc::posix_spawnattr_t,
        argv: *const *mut c_char,
        envp: *const *mut c_char
    ) -> c_int;
    id: PosixSpawn;
    fallback: enosys;
    |_real, _cx| { before_spawn(); PassThrough }
}

hook! {
    /// posix_spawnp(3): as `posix_spawn`.
    fn posix_spawnp(
        pid: *mut libc::pid_t,
        file: *const c_char,
        actions: *const libc::posix_spawn_file_actions_t,
        attr: *const libc::posix_spawnattr_t,
        argv: *const *mut c_char,
        envp: *const *mut c_char
    ) -> c_int;
    id: PosixSpawnp;
    fallback: enosys;
    |_real, _cx| { before_spawn(); PassThrough }
}

hook! {
    /// system(3): `/bin/sh` is spawned with glibc's internal posix_spawn; as `posix_spawn`.
    fn system(command: *const c_char) -> c_int;
    id: System;
    fallback: enosys;
    |_real, _cx| {
        // (`system(NULL)` only asks whether a shell exists)
        if !command.is_null() {
            before_spawn();
        }
        PassThrough
    }
}

hook! {
    /// popen(3): as `system`.
    fn popen(command: *const c_char, mode: *const c_char) -> *mut libc::FILE;
    id: Popen;
    fallback: enosys;
    |_real, _cx| { before_spawn(); PassThrough }
}

/// Hooks of the calls that change the process's credentials: each runs
/// [`before_credentials`], then the call.
macro_rules! credential_hooks {
    ($( $name:ident ( $($arg:ident : $ty:ty),* ) = $id:ident ;)*) => {$(
        hook! {
            /// A change of the process's credentials (of every thread's: glibc makes each
            /// thread change its own); see [`before_credentials`].
            fn $name($($arg: $ty),*) -> c_int;
            id: $id;
            fallback: enosys;
            |_real, _cx| { before_credentials(); PassThrough }
        }
    )*};
}

credential_hooks! {
    setuid(uid: libc::uid_t) = Setuid;
    setgid(gid: libc::gid_t) = Setgid;
    seteuid(uid: libc::uid_t) = Seteuid;
    setegid(gid: libc::gid_t) = Setegid;
    setreuid(ruid: libc::uid_t, euid: libc::uid_t) = Setreuid;
    setregid(rgid: libc::gid_t, egid: libc::gid_t) = Setregid;
    setresuid(ruid: libc::uid_t, euid: libc::uid_t, suid: libc::uid_t) = Setresuid;
    setresgid(rgid: libc::gid_t, egid: libc::gid_t, sgid: libc::gid_t) = Setresgid;
    setgroups(size: libc::size_t, list: *const libc::gid_t) = Setgroups;
    setfsuid(fsuid: libc::uid_t) = Setfsuid;
    setfsgid(fsgid: libc::gid_t) = Setfsgid;
    capset(hdrp: *mut c_void, datap: *const c_void) = Capset;
}

type PrctlFn = unsafe extern "C" fn(
    c_int,
    libc::c_ulong,
    libc::c_ulong,
    libc::c_ulong,
    libc::c_ulong,
) -> c_int;

/// The Rust half of `prctl(2)` (csrc/variadic.c reads its four optional arguments). Only
/// `PR_SET_SECCOMP` concerns the shim: see [`before_sandbox_call`]; once a filter is in place the
/// shim writes no log record and no stats file ([`crate::log::silence`]).
///
/// # Safety
/// Called only from the C entry point with the application's arguments.
#[no_mangle]
pub unsafe extern "C" fn rdmashim_prctl(
    option: c_int,
    a2: libc::c_ulong,
    a3: libc::c_ulong,
    a4: libc::c_ulong,
    a5: libc::c_ulong,
) -> c_int {
    // SAFETY: PrctlFn is prctl's prototype with its optional arguments spelled out, as glibc
    // reads them.
    let Some(real) = (unsafe { crate::real::get::<PrctlFn>(crate::hook::Hook::Prctl) }) else {
        // SAFETY: the raw prctl system call with the caller's arguments.
        return unsafe { rdmashim_core::raw_syscall!(libc::SYS_prctl, option, a2, a3, a4, a5) }
            as c_int;
    };
    if option != libc::PR_SET_SECCOMP {
        // SAFETY: the caller's arguments, unchanged, to the real function.
        return unsafe { real(option, a2, a3, a4, a5) };
    }
    before_sandbox_call(crate::hook::Hook::Prctl);
    // SAFETY: the caller's arguments, unchanged, to the real function.
    let r = unsafe { real(option, a2, a3, a4, a5) };
    if r == 0 {
        crate::log::silence();
    }
    r
}

/// Before the process installs a seccomp filter (`prctl(PR_SET_SECCOMP)`: sshd's
/// pre-authentication child, other privilege-separated servers' workers; `syscall(SYS_seccomp)`:
/// libseccomp), as the logic of hook `h`: the filter may kill the process at the first system
/// call it does not expect, and the shim cannot know which it allows. So RDMA ends here, while
/// every call is still allowed (`sandboxed`; see [`end_rdma_before`]).
pub(super) fn before_sandbox_call(h: crate::hook::Hook) {
    end_rdma_before(
        h,
        crate::upgrade::close_for_sandbox,
        "sandbox",
        crate::reason::FallbackReason::Sandboxed,
    );
}

/// Before the process sets up an io_uring instance (`syscall(SYS_io_uring_setup, ...)`: the
/// Rust io-uring crate, libuv): its reads, writes and closes of a socket would reach the
/// kernel unseen, so RDMA ends here, while the instance does not exist yet (`io_uring`; see
/// [`end_rdma_before`]).
pub(super) fn before_io_uring() {
    end_rdma_before(
        crate::hook::Hook::Syscall,
        crate::upgrade::close_for_io_uring,
        "io_uring",
        crate::reason::FallbackReason::IoUring,
    );
}

/// Before a call of hook `h` after which the process cannot keep RDMA: `end` (one of
/// `crate::upgrade`'s `close_for_*`) ends it for the process — its rdma_cm listeners are
/// dropped and new connections stay TCP — and if it did now, the connections it inherited from
/// its parent are asked for (as before an exec) and its own on the ring go back to TCP at exact
/// offsets (`what`, `reason`). Counted as `h`'s call; not for the shim's own calls, nor in a
/// vfork child (our memory is the parent's).
fn end_rdma_before(
    h: crate::hook::Hook,
    end: fn() -> bool,
    what: &'static str,
    reason: crate::reason::FallbackReason,
) {
    let Some(cx) = crate::guard::hook_entry() else {
        return;
    };
    crate::stats::count_call(cx, h);
    let _ = super::run(h, || {
        if !in_foreign_child() {
            let _s = crate::guard::Section::enter();
            let _e = crate::sys::ErrnoGuard::save();
            if end() {
                hand_back_inherited(true, what, reason);
            }
        }
        PassThrough::<c_int>
    });
}

/// Before the program puts a file of its own at `fd`, a descriptor of the shim's or of the
/// RDMA libraries' (`dup2`/`dup3` onto a number at 1000 or above, where they live: a shell's
/// `exec 1000>file`, a program that keeps its files at fixed high numbers): the number is free
/// on a kernel without the shim, so the call cannot be refused. RDMA ends for the process for
/// good (`fd_replaced`) while its descriptors are still the shim's: inherited connections are
/// asked for, its own on the ring go back to TCP at exact offsets, the ones it closed get a
/// bounded time to finish, and then no thread of the shim's uses the transport or a
/// descriptor of its own again (`upgrade::replace_private_fd`). Not in a vfork child (our
/// memory is the parent's; its descriptors are its own copy).
pub(super) fn before_private_replaced(fd: c_int) {
    if in_foreign_child() {
        return;
    }
    let _s = crate::guard::Section::enter();
    let _e = crate::sys::ErrnoGuard::save();
    if crate::upgrade::close_for_replaced_fd(fd) {
        hand_back_inherited(true, "dup2", crate::reason::FallbackReason::FdReplaced);
        crate::upgrade::abandon_descriptors();
    }
}

/// A connection under the upgrade (entry `e`) is about to be at a standard descriptor, or just
/// got there (`dup2`/`dup3` onto 0, 1 or 2; `dup`/`F_DUPFD` returning one): the program may now
/// read or write it through glibc's stdio, whose internal calls no hook sees (bash's
/// `printf ... >&3` writes to a `stdout` whose descriptor is the socket). It goes back to plain
/// TCP first, as before an exec: undecided, it stays TCP (`stdio`); on the ring, it switches
/// back at exact offsets; a fork child's inherited one is asked for. Not in a vfork child.
pub(super) fn before_stdio(e: crate::fdtable::FdEntry, fd: c_int) {
    if e.kind() != crate::fdtable::Kind::Upgraded || in_foreign_child() {
        return;
    }
    let _s = crate::guard::Section::enter();
    let _e = crate::sys::ErrnoGuard::save();
    if !crate::upgrade::slot_is_ours(e.slot()) {
        // (one that cannot be had was reset by its owner: the program sees that)
        let _ = crate::upgrade::use_inherited(e.slot());
    } else if let Some(c) = crate::upgrade::lookup(e.slot()) {
        crate::upgrade::data::hand_back_all(
            &[(c, fd)],
            "stdio",
            crate::reason::FallbackReason::Stdio,
        );
    }
}

type ExitFn = unsafe extern "C" fn(c_int) -> !;

/// _exit(2), called by the program (glibc's own `exit` reaches the kernel without it, after the
/// shim's destructor). See [`before_quick_exit`].
///
/// # Safety
/// As `_exit`: none.
#[no_mangle]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    quick_exit_via(crate::hook::Hook::Exit, status)
}

/// _Exit(3): the same as `_exit`.
///
/// # Safety
/// As `_Exit`: none.
#[no_mangle]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    quick_exit_via(crate::hook::Hook::ExitUpper, status)
}

fn quick_exit_via(h: crate::hook::Hook, status: c_int) -> ! {
    if !crate::guard::bypass() {
        crate::stats::count_call(crate::guard::Cx::current(), h);
        let _ = std::panic::catch_unwind(before_quick_exit);
    }
    // SAFETY: ExitFn is the prototype of `_exit` and `_Exit`.
    if let Some(real) = unsafe { crate::real::get::<ExitFn>(h) } {
        // SAFETY: ends the process, as the program asked.
        unsafe { real(status) }
    }
    // SAFETY: exit_group ends every thread of the process, as `_exit` does; never returns.
    unsafe { rdmashim_core::raw_syscall!(libc::SYS_exit_group, status) };
    std::process::abort()
}

/// Before the program ends its process with `_exit` (a fork child that served a connection:
/// Python's `ForkingMixIn`, many C servers' children): as at a normal exit, each upgraded
/// connection gets a bounded time to deliver the bytes it accepted, the ring's Close
/// included, before the kernel destroys the queue pairs — on TCP the kernel would deliver what
/// the socket buffer holds after the process is gone. No stats record is written (none is at
/// `_exit`, as documented); not in a vfork child (whose memory is its parent's).
fn before_quick_exit() {
    if crate::guard::poisoned() || in_foreign_child() {
        return;
    }
    let _s = crate::guard::Section::enter();
    let _e = crate::sys::ErrnoGuard::save();
    if crate::fdtable::UPGRADE_CONNS.load(core::sync::atomic::Ordering::Relaxed) != 0 {
        crate::upgrade::flush_at_exit();
    }
    crate::live::end(false);
}

/// Before this process's image is replaced: every upgraded connection that an fd without
/// FD_CLOEXEC refers to goes back to TCP (the new image has no ring: it uses the socket), and
/// the stats record is written (the new image starts its own). Not in a vfork child (our
/// memory is the parent's). A fork child's inherited connections are its parent's to give
/// back: it asks for them.
fn before_exec() {
    if in_foreign_child() {
        return;
    }
    let _s = crate::guard::Section::enter();
    let _e = crate::sys::ErrnoGuard::save();
    hand_back_inherited(false, "exec", crate::reason::FallbackReason::Exec);
    crate::init::write_stats();
    crate::live::end(true);
}

/// Before a child is spawned that inherits this process's fds and execs: as [`before_exec`],
/// without the stats record (this process goes on).
fn before_spawn() {
    if in_foreign_child() {
        return;
    }
    let _s = crate::guard::Section::enter();
    let _e = crate::sys::ErrnoGuard::save();
    hand_back_inherited(false, "spawn", crate::reason::FallbackReason::Exec);
}

/// Before the process changes its credentials: if RDMA ends for it
/// ([`crate::upgrade::close_for_credentials`]), every connection of its own goes back to TCP
/// (those on the ring switch back at exact offsets, while the ring still works). A fork
/// child's inherited connections are its parent's, which it asks for as before. Not in a vfork
/// child (our memory is the parent's).
fn before_credentials() {
    if in_foreign_child() {
        return;
    }
    let _s = crate::guard::Section::enter();
    let _e = crate::sys::ErrnoGuard::save();
    if !crate::upgrade::close_for_credentials() {
        return;
    }
    let (conns, _) = crate::upgrade::upgraded_conns(true);
    crate::upgrade::data::hand_back_all(
        &conns,
        "credential change",
        crate::reason::FallbackReason::CredentialsChanged,
    );
}

/// Returns to TCP every upgraded connection an fd without FD_CLOEXEC refers to (`all`: every
/// fd; `what`: exec, spawn or sandbox, for the log; `reason` for an undecided one): this
/// process's own, and those a fork child inherited (inetd-style servers fork, then exec the
/// program that serves the connection), which it asks its parent for.
fn hand_back_inherited(all: bool, what: &'static str, reason: crate::reason::FallbackReason) {
    let (conns, inherited) = crate::upgrade::upgraded_conns(all);
    hand_back(&conns, inherited, what, reason);
}

/// Returns to TCP the connections `conns` of this process's own and asks its parent for the
/// `inherited` slots of a fork child's (see [`hand_back_inherited`]).
pub(super) fn hand_back(
    conns: &[(std::sync::Arc<crate::upgrade::Conn>, c_int)],
    inherited: Vec<u64>,
    what: &'static str,
    reason: crate::reason::FallbackReason,
) {
    for slot in inherited {
        // (one that cannot be had was reset by its owner: the program sees that)
        let _ = crate::upgrade::use_inherited(slot);
    }
    crate::upgrade::data::hand_back_all(conns, what, reason);
}
