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

/// Whether the kernel flagged this process for secure execution (`AT_SECURE`: setuid, setgid
/// or file capabilities gained at exec).
pub fn secure_execution() -> bool {
    // SAFETY: getauxval has no preconditions; an absent entry reads as 0.
    unsafe { libc::getauxval(libc::AT_SECURE) != 0 }
}

/// getpid(2) (not hooked; glibc does not cache it since 2.25, so it is a real syscall).
pub fn getpid() -> u32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() as u32 }
}

/// getppid(2) (not hooked).
pub fn getppid() -> u32 {
    // SAFETY: getppid has no preconditions.
    unsafe { libc::getppid() as u32 }
}

/// Wall-clock time, milliseconds since the Unix epoch (`CLOCK_REALTIME`: no lock, no
/// allocation, async-signal-safe — the fork child's handler calls it). 0 if the clock fails.
pub fn unix_ms() -> u64 {
    unix_us() / 1000
}

/// Wall-clock time, microseconds since the Unix epoch (as [`unix_ms`]). 0 if the clock fails.
pub fn unix_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer.
    if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) } != 0 {
        return 0;
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000)
        .saturating_add(ts.tv_nsec as u64 / 1000)
}

/// The base name of this process's executable: the name it was executed as, remembered at
/// load ([`remember_exec_name`]), else the target of `/proc/self/exe` (without the
/// ` (deleted)` the kernel adds when the file was removed), else `/proc/self/comm` (the
/// kernel's 15-byte name, which the program may have changed). `None` without any (a chroot
/// without `/proc`). The name returned is a part of `buf`.
pub fn program_name(buf: &mut [u8; 4096]) -> Option<&[u8]> {
    if let Some(n) = EXEC_NAME.get().filter(|n| n.len > 0) {
        let len = usize::from(n.len);
        buf[..len].copy_from_slice(&n.buf[..len]);
        return buf.get(..len);
    }
    let _e = ErrnoGuard::save();
    // SAFETY: a NUL-terminated path; buf is writable for its length.
    let n = unsafe {
        rdmashim_core::raw_syscall!(
            libc::SYS_readlinkat,
            libc::AT_FDCWD,
            c"/proc/self/exe".as_ptr(),
            buf.as_mut_ptr(),
            buf.len(),
        )
    };
    // (a link of exactly buf's length may have been cut short)
    if let Some(link) = usize::try_from(n)
        .ok()
        .filter(|n| *n > 0 && *n < buf.len())
        .and_then(|n| buf.get(..n))
    {
        let end = link.len() - if link.ends_with(b" (deleted)") { 10 } else { 0 };
        let start = link
            .get(..end)
            .and_then(|l| l.iter().rposition(|b| *b == b'/'))
            .map_or(0, |i| i + 1);
        if start < end {
            return buf.get(start..end);
        }
    }
    let fd = open(b"/proc/self/comm\0", libc::O_RDONLY | libc::O_CLOEXEC, 0).ok()?;
    // SAFETY: buf is writable for its length; fd was just opened here.
    let n = unsafe { rdmashim_core::raw_syscall!(libc::SYS_read, fd, buf.as_mut_ptr(), buf.len()) };
    close(fd);
    let comm = buf.get(..usize::try_from(n).ok()?)?;
    let comm = comm.strip_suffix(b"\n").unwrap_or(comm);
    (!comm.is_empty()).then_some(comm)
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
        rdmashim_core::raw_syscall!(
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
    unsafe { rdmashim_core::raw_syscall!(libc::SYS_close, fd) };
}

/// Writes all of `data` to `fd` with raw `write` syscalls.
pub fn write_all(fd: c_int, mut data: &[u8]) -> Result<(), Errno> {
    while !data.is_empty() {
        // SAFETY: data is a valid readable slice for its length.
        let r =
            unsafe { rdmashim_core::raw_syscall!(libc::SYS_write, fd, data.as_ptr(), data.len()) };
        match check(r) {
            Ok(n) => data = data.get(n as usize..).unwrap_or(&[]),
            Err(e) if e.0 == libc::EINTR => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The signals a failed write raises at the writing thread: SIGPIPE (a pipe or socket with no
/// reader) and SIGXFSZ (a regular file past `RLIMIT_FSIZE`). Both kill by default.
const WRITE_SIGNALS: [c_int; 2] = [libc::SIGPIPE, libc::SIGXFSZ];

fn sigbit(sig: c_int) -> u64 {
    1u64 << (sig - 1)
}

/// rt_sigprocmask(2) on the kernel's 64-bit mask; returns the previous mask.
fn sigmask(how: c_int, set: u64) -> u64 {
    let mut old = 0u64;
    // SAFETY: both pointers are valid 8-byte masks, the kernel's sigset size on Linux.
    unsafe {
        rdmashim_core::raw_syscall!(
            libc::SYS_rt_sigprocmask,
            how,
            &set as *const u64,
            &mut old as *mut u64,
            8usize,
        )
    };
    old
}

/// The signals pending for the calling thread or its process.
fn sigpending() -> u64 {
    let mut set = 0u64;
    // SAFETY: set is a valid 8-byte mask.
    unsafe { rdmashim_core::raw_syscall!(libc::SYS_rt_sigpending, &mut set as *mut u64, 8usize) };
    set
}

/// Takes `sig` off the pending set without running a handler (it is blocked here).
fn sigconsume(sig: c_int) {
    let set = sigbit(sig);
    let zero = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid mask, null siginfo (allowed), a zero timeout: returns at once.
    unsafe {
        rdmashim_core::raw_syscall!(
            libc::SYS_rt_sigtimedwait,
            &set as *const u64,
            core::ptr::null_mut::<libc::siginfo_t>(),
            &zero as *const libc::timespec,
            8usize,
        )
    };
}

/// Writes all of `data` to `fd` and never raises a signal at the process: SIGPIPE and SIGXFSZ
/// are blocked for the write, and one that the write itself raised (EPIPE, EFBIG) is taken off
/// the thread's pending set before the mask is restored. A signal of that kind that was
/// already pending stays pending. The shim's own output (log records, the stats file) goes
/// through here: a sandboxed child with `RLIMIT_FSIZE` 0 and its stderr on a file, or a
/// program whose stderr pipe has no reader any more, must not die of a line of ours.
pub fn quiet_write(fd: c_int, data: &[u8]) -> Result<(), Errno> {
    let set = WRITE_SIGNALS.iter().fold(0, |m, s| m | sigbit(*s));
    let old = sigmask(libc::SIG_BLOCK, set);
    let before = sigpending() & set;
    let r = write_all(fd, data);
    if let Err(e) = r {
        let raised = match e.0 {
            libc::EPIPE => libc::SIGPIPE,
            libc::EFBIG => libc::SIGXFSZ,
            _ => 0,
        };
        if raised != 0 && before & sigbit(raised) == 0 && sigpending() & sigbit(raised) != 0 {
            sigconsume(raised);
        }
    }
    sigmask(libc::SIG_SETMASK, old);
    r
}

/// The effective uid (not hooked).
pub fn geteuid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

fn fstat(fd: c_int) -> Result<libc::stat, Errno> {
    // SAFETY: an all-zero stat is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: st is a valid out-pointer; a bad fd fails with EBADF.
    check(unsafe { rdmashim_core::raw_syscall!(libc::SYS_fstat, fd, &mut st as *mut libc::stat) })?;
    Ok(st)
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`: the entry itself, never a link's target.
fn lstat_at(dir: c_int, name: &[u8]) -> Result<libc::stat, Errno> {
    // SAFETY: as in `fstat`.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: name is NUL-terminated (callers build it so); st is a valid out-pointer.
    check(unsafe {
        rdmashim_core::raw_syscall!(
            libc::SYS_newfstatat,
            dir,
            name.as_ptr() as *const c_char,
            &mut st as *mut libc::stat,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(st)
}

fn unlink_at(dir: c_int, name: &[u8]) {
    // SAFETY: name is NUL-terminated (callers build it so).
    unsafe {
        rdmashim_core::raw_syscall!(libc::SYS_unlinkat, dir, name.as_ptr() as *const c_char, 0)
    };
}

/// The directory a file of the shim goes into, opened once (`O_PATH`), so that every later
/// step names the same directory whatever happens to the path meanwhile, and the file's own
/// name (NUL-terminated) within it.
///
/// The directory must not let others swap entries under the shim: one writable by group or
/// others is accepted only with the sticky bit (`/tmp`), where nobody can rename or remove
/// another user's file. Otherwise `EPERM`.
struct OutDir {
    fd: c_int,
    name: crate::fmtbuf::FixedBuf<256>,
}

impl OutDir {
    fn open(path: &[u8]) -> Result<OutDir, Errno> {
        let path = path.strip_suffix(b"\0").ok_or(Errno(libc::EINVAL))?;
        let (dir, base) = match path.iter().rposition(|b| *b == b'/') {
            Some(0) => (&b"/"[..], &path[1..]),
            Some(i) => (&path[..i], &path[i + 1..]),
            None => (&b"."[..], path),
        };
        if base.is_empty() || base == b"." || base == b".." || dir.contains(&0) {
            return Err(Errno(libc::EINVAL));
        }
        let mut name = crate::fmtbuf::FixedBuf::<256>::new();
        name.push_bytes(base);
        name.push_bytes(b"\0");
        let mut d = crate::fmtbuf::FixedBuf::<4200>::new();
        d.push_bytes(dir);
        d.push_bytes(b"\0");
        if name.overflowed() || d.overflowed() {
            return Err(Errno(libc::ENAMETOOLONG));
        }
        let fd = open(
            d.as_bytes(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            0,
        )?;
        let out = OutDir { fd, name };
        let st = fstat(fd)?;
        let others_write = st.st_mode & (libc::S_IWGRP | libc::S_IWOTH) != 0;
        if others_write && st.st_mode & libc::S_ISVTX == 0 {
            return Err(Errno(libc::EPERM));
        }
        Ok(out)
    }

    fn name(&self) -> &[u8] {
        self.name.as_bytes()
    }

    /// `openat` in this directory.
    fn open_at(&self, name: &[u8], flags: c_int, mode: libc::mode_t) -> Result<c_int, Errno> {
        // SAFETY: name is NUL-terminated (built by this module).
        let r = unsafe {
            rdmashim_core::raw_syscall!(
                libc::SYS_openat,
                self.fd,
                name.as_ptr() as *const c_char,
                flags,
                mode,
            )
        };
        check(r).map(|fd| fd as c_int)
    }
}

impl Drop for OutDir {
    fn drop(&mut self) {
        close(self.fd);
    }
}

/// Whether `st` is a regular file of ours with no other name: the only kind of existing file
/// the shim writes to or replaces.
fn is_own_file(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_uid == geteuid() && st.st_nlink <= 1
}

/// Appends one log record to `path` (NUL-terminated), or to stderr if `None`. Opening per
/// record keeps no fd of the shim open in the application (which may close or reuse any fd).
/// The file is opened without following a link (`O_NOFOLLOW`), without blocking (a FIFO
/// planted there is refused), and written only if it is a regular file of ours with one name;
/// a record that cannot be written is dropped (the caller counts it). errno is preserved.
pub fn append_log(path: Option<&[u8]>, data: &[u8]) -> Result<(), Errno> {
    let _e = ErrnoGuard::save();
    let Some(p) = path else {
        return quiet_write(2, data);
    };
    let dir = OutDir::open(p)?;
    let flags = libc::O_WRONLY
        | libc::O_CREAT
        | libc::O_APPEND
        | libc::O_NOFOLLOW
        | libc::O_NONBLOCK
        | libc::O_NOCTTY
        | libc::O_CLOEXEC;
    let fd = dir.open_at(dir.name(), flags, 0o644)?;
    let r = match fstat(fd) {
        Ok(st) if is_own_file(&st) => quiet_write(fd, data),
        Ok(_) => Err(Errno(libc::EPERM)),
        Err(e) => Err(e),
    };
    close(fd);
    r
}

/// The soft limit on this process's descriptors (`RLIMIT_NOFILE`), read now (the program may
/// change it); `None` if it cannot be read or is unlimited.
pub fn nofile_limit() -> Option<u64> {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: prlimit64 of this process, no new limit, `rl` a writable rlimit.
    let r = unsafe {
        rdmashim_core::raw_syscall!(
            libc::SYS_prlimit64,
            0,
            libc::RLIMIT_NOFILE,
            core::ptr::null::<libc::rlimit>(),
            &mut rl as *mut libc::rlimit,
        )
    };
    (r == 0 && rl.rlim_cur != libc::RLIM_INFINITY).then_some(rl.rlim_cur)
}

/// The host's memory in bytes (`sysinfo(2)`: total usable RAM), `None` if it cannot be read.
pub fn phys_mem_bytes() -> Option<u64> {
    // SAFETY: sysinfo is plain data; all zeroes is a valid value.
    let mut si: libc::sysinfo = unsafe { core::mem::zeroed() };
    // SAFETY: sysinfo writes one struct sysinfo into `si`, which is writable.
    let r =
        unsafe { rdmashim_core::raw_syscall!(libc::SYS_sysinfo, &mut si as *mut libc::sysinfo) };
    (r == 0).then(|| si.totalram as u64 * u64::from(si.mem_unit.max(1)))
}

/// Fills `buf` from the kernel's CSPRNG (`getrandom(2)`, never blocking once the pool is
/// initialised; `GRND_NONBLOCK` so that an early-boot process fails instead of waiting).
pub fn random(buf: &mut [u8]) -> Result<(), Errno> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        // SAFETY: rest is a writable slice of its length.
        let r = unsafe {
            rdmashim_core::raw_syscall!(
                libc::SYS_getrandom,
                rest.as_mut_ptr(),
                rest.len(),
                libc::GRND_NONBLOCK,
            )
        };
        match check(r) {
            Ok(n) => done += n as usize,
            Err(e) if e.0 == libc::EINTR => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A name no one can guess in advance, for a temporary file: [`random`], or the clock and
/// the stack's address where that fails.
fn unguessable() -> u64 {
    let mut b = [0u8; 8];
    let mut v = 0u64;
    if random(&mut b).is_ok() {
        v = u64::from_ne_bytes(b);
    } else {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: ts is a valid out-pointer.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        v = (ts.tv_nsec as u64 ^ (ts.tv_sec as u64).rotate_left(32))
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            ^ (&v as *const u64 as u64);
    }
    v
}

/// Writes `data` to `path` (NUL-terminated) atomically: a new file of a name nobody can
/// predict next to it, created exclusively and without following links (`O_CREAT|O_EXCL|
/// O_NOFOLLOW`), written through its descriptor, then renamed over `path` within the same
/// directory handle. An existing `path` is replaced only if it is a regular file of ours with
/// one name (a link or someone else's file planted there stays as it is, and the stats are not
/// written); a failed write leaves no temporary file behind. errno is preserved.
pub fn write_file_atomic(path: &[u8], data: &[u8]) -> Result<(), Errno> {
    let _e = ErrnoGuard::save();
    let dir = OutDir::open(path)?;
    match lstat_at(dir.fd, dir.name()) {
        Ok(st) if !is_own_file(&st) => return Err(Errno(libc::EEXIST)),
        Ok(_) => {}
        Err(e) if e.0 == libc::ENOENT => {}
        Err(e) => return Err(e),
    }
    let mut tmp = crate::fmtbuf::FixedBuf::<300>::new();
    let base = dir.name().strip_suffix(b"\0").unwrap_or(&[]);
    // `.NAME.tmp.PID.RANDOM`: hidden, and ours alone.
    let _ = core::fmt::Write::write_fmt(
        &mut tmp,
        format_args!(
            ".{}.tmp.{}.{:016x}\0",
            core::str::from_utf8(base).unwrap_or("stats"),
            getpid(),
            unguessable()
        ),
    );
    if tmp.overflowed() {
        return Err(Errno(libc::ENAMETOOLONG));
    }
    let tmp = tmp.as_bytes();
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    let fd = dir.open_at(tmp, flags, 0o644)?;
    let w = quiet_write(fd, data);
    close(fd);
    if let Err(e) = w {
        unlink_at(dir.fd, tmp);
        return Err(e);
    }
    // SAFETY: both names are NUL-terminated and relative to the same directory fd.
    let r = unsafe {
        rdmashim_core::raw_syscall!(
            libc::SYS_renameat,
            dir.fd,
            tmp.as_ptr() as *const c_char,
            dir.fd,
            dir.name().as_ptr() as *const c_char,
        )
    };
    check(r).map(|_| ()).inspect_err(|_| unlink_at(dir.fd, tmp))
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

/// The base name of the file this process's image was executed as (the kernel's
/// `AT_EXECFN`: `redis-server`, not the `redis-check-rdb` it links to), read when the library
/// loads — before the program can rewrite its argument and environment area, next to which
/// the kernel keeps that string.
struct ExecName {
    buf: [u8; 255],
    len: u8,
}

static EXEC_NAME: std::sync::OnceLock<ExecName> = std::sync::OnceLock::new();

/// Remembers the name [`program_name`] gives first (constructor; no system call).
pub fn remember_exec_name() {
    // SAFETY: getauxval reads the auxiliary vector; AT_EXECFN, when present, points to the
    // NUL-terminated path the kernel put on the initial stack, alive for the process's life.
    let p = unsafe { libc::getauxval(libc::AT_EXECFN) } as *const c_char;
    if p.is_null() {
        return;
    }
    // SAFETY: as above: a NUL-terminated string.
    let path = unsafe { core::ffi::CStr::from_ptr(p) }.to_bytes();
    let base = path
        .iter()
        .rposition(|b| *b == b'/')
        .map_or(path, |i| &path[i + 1..]);
    let mut n = ExecName {
        buf: [0; 255],
        len: 0,
    };
    let len = base.len().min(n.buf.len());
    n.buf[..len].copy_from_slice(&base[..len]);
    n.len = len as u8;
    let _ = EXEC_NAME.set(n);
}

/// The path this image was executed as (the kernel's `AT_EXECFN`: as the caller of `execve`
/// gave it, possibly relative), `None` without one.
pub fn exec_path() -> Option<&'static [u8]> {
    // SAFETY: getauxval reads the auxiliary vector; AT_EXECFN, when present, points to the
    // NUL-terminated path the kernel put on the initial stack, alive for the process's life.
    let p = unsafe { libc::getauxval(libc::AT_EXECFN) } as *const c_char;
    if p.is_null() {
        return None;
    }
    // SAFETY: as above: a NUL-terminated string that lives as long as the process.
    Some(unsafe { core::ffi::CStr::from_ptr(p) }.to_bytes())
}

/// The target of `/proc/self/exe` (the executable's real path; without the ` (deleted)` of a
/// removed file), in `buf`. `None` if it cannot be read or does not fit.
pub fn exe_path(buf: &mut [u8; 4096]) -> Option<&[u8]> {
    let _e = ErrnoGuard::save();
    // SAFETY: a NUL-terminated path; buf is writable for its length.
    let n = unsafe {
        rdmashim_core::raw_syscall!(
            libc::SYS_readlinkat,
            libc::AT_FDCWD,
            c"/proc/self/exe".as_ptr(),
            buf.as_mut_ptr(),
            buf.len(),
        )
    };
    let link = usize::try_from(n)
        .ok()
        .filter(|n| *n > 0 && *n < buf.len())
        .and_then(|n| buf.get(..n))?;
    Some(link.strip_suffix(b" (deleted)").unwrap_or(link))
}

/// Reads the configuration file `path` (not NUL-terminated) whole, with raw system calls (the
/// constructor runs before `main`: no hooked call, no stdio, no locale). A file larger than
/// `max` bytes is not read ([`FileRead::TooBig`]), nor is anything but a regular file (a FIFO
/// would block the program's start). With `trusted` (secure execution: a setuid program), only
/// a file owned by root that no one else may write is used.
pub fn read_config(path: &[u8], max: usize, trusted: bool) -> crate::settings::FileRead {
    use crate::settings::FileRead;
    let _e = ErrnoGuard::save();
    let mut z = Vec::with_capacity(path.len() + 1);
    z.extend_from_slice(path);
    z.push(0);
    let fd = match open(
        &z,
        libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_NONBLOCK,
        0,
    ) {
        Ok(fd) => fd,
        Err(e) if e.0 == libc::ENOENT => return FileRead::Missing,
        Err(e) => return FileRead::Failed(e.to_string()),
    };
    let r = (|| {
        let st = fstat(fd).map_err(|e| FileRead::Failed(e.to_string()))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(FileRead::Failed("not a regular file".into()));
        }
        if trusted && (st.st_uid != 0 || st.st_mode & 0o022 != 0) {
            return Err(FileRead::Failed(
                "a setuid or setgid program uses only a file of root's that no one else may write"
                    .into(),
            ));
        }
        let size = u64::try_from(st.st_size).unwrap_or(0);
        if size > max as u64 {
            return Err(FileRead::TooBig(size));
        }
        // Its size and a byte more (a file that grew since its fstat is seen to, up to one
        // byte past the limit, which refuses it).
        let mut buf = vec![0u8; (size as usize).min(max) + 1];
        let mut have = 0usize;
        loop {
            if have == buf.len() {
                if buf.len() > max {
                    break;
                }
                buf.resize(max + 1, 0);
            }
            let rest = buf.get_mut(have..).unwrap_or(&mut []);
            // SAFETY: rest is writable for its length; fd is open.
            let n = unsafe {
                rdmashim_core::raw_syscall!(libc::SYS_read, fd, rest.as_mut_ptr(), rest.len())
            };
            match check(n) {
                Ok(0) => break,
                Ok(n) => have = (have + n as usize).min(buf.len()),
                Err(e) if e.0 == libc::EINTR => continue,
                Err(e) => return Err(FileRead::Failed(e.to_string())),
            }
        }
        if have > max {
            return Err(FileRead::TooBig(have as u64));
        }
        buf.truncate(have);
        Ok(FileRead::Text(buf))
    })();
    close(fd);
    r.unwrap_or_else(|e| e)
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

/// What `/proc/self/fd/N` reads for an io_uring instance.
const IO_URING_LINK: &[u8] = b"anon_inode:[io_uring]";

/// Whether this process holds a descriptor of an io_uring instance: every entry of
/// `/proc/self/fd` is looked at with one `fstat`, and those that may be anonymous inodes (no
/// file type, as through Linux 6.14, or a regular file on a device without a major number,
/// as later) with a `readlinkat`. For instances set up by inline system calls (liburing, the
/// io-uring crates), which the `syscall` hook never sees. False when `/proc` is not there, and
/// for an instance whose descriptor was closed after its registration (the ring lives on
/// without one).
pub fn holds_io_uring() -> bool {
    let _e = ErrnoGuard::save();
    // SAFETY: a NUL-terminated path; opendir/readdir/closedir use glibc-internal calls, never
    // our hooks; every entry's name is NUL-terminated; st and link are valid out-buffers of
    // the sizes given; the directory is closed once.
    unsafe {
        let d = libc::opendir(c"/proc/self/fd".as_ptr());
        if d.is_null() {
            return false;
        }
        let dfd = libc::dirfd(d);
        let mut found = false;
        loop {
            let ent = libc::readdir(d);
            if ent.is_null() {
                break;
            }
            let name = (*ent).d_name.as_ptr();
            let Some(fd) = core::ffi::CStr::from_ptr(name)
                .to_str()
                .ok()
                .and_then(|n| n.parse::<c_int>().ok())
            else {
                continue;
            };
            if fd == dfd {
                continue;
            }
            let mut st = core::mem::MaybeUninit::<libc::stat>::zeroed();
            if rdmashim_core::raw_syscall!(libc::SYS_fstat, fd, st.as_mut_ptr()) < 0 {
                continue;
            }
            let st = st.assume_init();
            let kind = st.st_mode & libc::S_IFMT;
            if !(kind == 0 || (kind == libc::S_IFREG && libc::major(st.st_dev) == 0)) {
                continue;
            }
            let mut link = [0u8; 32];
            let n = rdmashim_core::raw_syscall!(
                libc::SYS_readlinkat,
                dfd,
                name,
                link.as_mut_ptr(),
                link.len()
            );
            if n > 0 && link.get(..n as usize) == Some(IO_URING_LINK) {
                found = true;
                break;
            }
        }
        libc::closedir(d);
        found
    }
}

/// Makes `dir` (NUL-free, absolute) if it is missing, with `mode` (its parent must exist).
pub fn make_dir(dir: &[u8], mode: libc::mode_t) -> Result<(), Errno> {
    let mut d = crate::fmtbuf::FixedBuf::<4200>::new();
    d.push_bytes(dir);
    d.push_bytes(b"\0");
    if d.overflowed() {
        return Err(Errno(libc::ENAMETOOLONG));
    }
    // SAFETY: the path is NUL-terminated and outlives the call.
    let r = unsafe {
        rdmashim_core::raw_syscall!(
            libc::SYS_mkdirat,
            libc::AT_FDCWD,
            d.as_bytes().as_ptr() as *const c_char,
            mode,
        )
    };
    match check(r) {
        Err(e) if e.0 != libc::EEXIST => Err(e),
        _ => Ok(()),
    }
}

/// Whether `dir` (NUL-free, absolute) is a directory itself (not a link to one) owned by the
/// effective user or by root: a run directory someone else made in `/tmp` (a sticky
/// directory's owner may remove and replace the files in it) is not used.
pub fn own_dir(dir: &[u8]) -> Result<(), Errno> {
    let mut d = crate::fmtbuf::FixedBuf::<4200>::new();
    d.push_bytes(dir);
    d.push_bytes(b"\0");
    if d.overflowed() {
        return Err(Errno(libc::ENAMETOOLONG));
    }
    let st = lstat_at(libc::AT_FDCWD, d.as_bytes())?;
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return Err(Errno(libc::ENOTDIR));
    }
    if st.st_uid != geteuid() && st.st_uid != 0 {
        return Err(Errno(libc::EPERM));
    }
    Ok(())
}

/// Sizes the new file `fd` to `len` bytes that are really there (not a hole): a shared
/// mapping's write to a page the file system cannot supply raises SIGBUS, so space is taken
/// now, where its lack is an error. `fallocate`, else zeros written; SIGXFSZ
/// (`RLIMIT_FSIZE`) never raised at the process ([`quiet_write`]).
fn reserve(fd: c_int, len: usize) -> Result<(), Errno> {
    let set = sigbit(libc::SIGXFSZ);
    let old = sigmask(libc::SIG_BLOCK, set);
    let before = sigpending() & set;
    // SAFETY: fallocate on an fd of ours, mode 0 (allocate), a valid range.
    let r = check(unsafe { rdmashim_core::raw_syscall!(libc::SYS_fallocate, fd, 0, 0, len) });
    if before == 0 && sigpending() & set != 0 {
        sigconsume(libc::SIGXFSZ);
    }
    sigmask(libc::SIG_SETMASK, old);
    match r {
        Err(e) if e.0 == libc::EOPNOTSUPP => {
            static ZEROS: [u8; 4096] = [0; 4096];
            (0..len.div_ceil(4096)).try_for_each(|_| quiet_write(fd, &ZEROS))
        }
        r => r.map(|_| ()),
    }
}

/// Makes file `name` in `dir` (both NUL-free; `dir` absolute), `len` bytes, readable and
/// writable by the owner alone, maps it shared and returns the mapping, with `init` run on it
/// before the file appears under its name (it is made under a hidden name nobody can predict,
/// then renamed: a reader never sees a half-made file). The directory follows the rules of
/// the shim's other files ([`OutDir`]); an existing `name` is replaced only if it is a regular
/// file of ours with one name (a stale record of an earlier process with this pid). No
/// descriptor stays open. errno is preserved.
pub fn create_shared_file(
    dir: &[u8],
    name: &[u8],
    len: usize,
    init: impl FnOnce(&mut [u8]),
) -> Result<*mut u8, Errno> {
    let _e = ErrnoGuard::save();
    let mut path = crate::fmtbuf::FixedBuf::<4200>::new();
    path.push_bytes(dir);
    path.push_bytes(b"/");
    path.push_bytes(name);
    path.push_bytes(b"\0");
    if path.overflowed() {
        return Err(Errno(libc::ENAMETOOLONG));
    }
    let dir = OutDir::open(path.as_bytes())?;
    match lstat_at(dir.fd, dir.name()) {
        Ok(st) if !is_own_file(&st) => return Err(Errno(libc::EEXIST)),
        Ok(_) | Err(Errno(libc::ENOENT)) => {}
        Err(e) => return Err(e),
    }
    let mut tmp = crate::fmtbuf::FixedBuf::<300>::new();
    let base = dir.name().strip_suffix(b"\0").unwrap_or(&[]);
    let _ = core::fmt::Write::write_fmt(
        &mut tmp,
        format_args!(
            ".{}.tmp.{}.{:016x}\0",
            core::str::from_utf8(base).unwrap_or("live"),
            getpid(),
            unguessable()
        ),
    );
    if tmp.overflowed() {
        return Err(Errno(libc::ENAMETOOLONG));
    }
    let tmp = tmp.as_bytes();
    let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    let fd = dir.open_at(tmp, flags, 0o600)?;
    let mapped = reserve(fd, len).and_then(|_| {
        // SAFETY: a new shared mapping of our own file, no fixed address.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            Err(errno())
        } else {
            Ok(p as *mut u8)
        }
    });
    close(fd);
    let p = match mapped {
        Ok(p) => p,
        Err(e) => {
            unlink_at(dir.fd, tmp);
            return Err(e);
        }
    };
    // SAFETY: `p` is a fresh mapping of `len` bytes that nothing else references yet.
    init(unsafe { core::slice::from_raw_parts_mut(p, len) });
    // SAFETY: both names are NUL-terminated and relative to the same directory fd.
    let r = check(unsafe {
        rdmashim_core::raw_syscall!(
            libc::SYS_renameat,
            dir.fd,
            tmp.as_ptr() as *const c_char,
            dir.fd,
            dir.name().as_ptr() as *const c_char,
        )
    });
    if let Err(e) = r {
        unlink_at(dir.fd, tmp);
        // SAFETY: the mapping was made above and is handed to nobody.
        unsafe { unmap_shared(p, len) };
        return Err(e);
    }
    Ok(p)
}

/// A table of `words` 64-bit words shared by this user's processes: the file `dir/name` (both
/// NUL-free, `dir` absolute and passing [`OutDir`]'s rules), mapped shared. An existing one is
/// used if it is a regular file of ours with one name and exactly the table's size; else, if
/// `create`, it is made as [`create_shared_file`] makes files (zeroed, `init` run on it before
/// it appears) but never over another process's: if one appears meanwhile, that one is used
/// (without `create`: ENOENT). The mapping lives until the process ends. No descriptor stays
/// open; errno is preserved.
pub fn open_shared_table(
    dir: &[u8],
    name: &[u8],
    words: usize,
    init: impl Fn(&[core::sync::atomic::AtomicU64]),
    create: bool,
) -> Result<&'static [core::sync::atomic::AtomicU64], Errno> {
    let _e = ErrnoGuard::save();
    let len = words * 8;
    let mut path = crate::fmtbuf::FixedBuf::<4200>::new();
    path.push_bytes(dir);
    path.push_bytes(b"/");
    path.push_bytes(name);
    path.push_bytes(b"\0");
    if path.overflowed() {
        return Err(Errno(libc::ENAMETOOLONG));
    }
    let d = OutDir::open(path.as_bytes())?;
    let map =
        |fd: c_int| -> Result<&'static [core::sync::atomic::AtomicU64], Errno> {
            // SAFETY: a new shared mapping of a file of ours, no fixed address.
            let p = unsafe {
                libc::mmap(
                    core::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(errno());
            }
            // SAFETY: `len` bytes mapped at a page-aligned address, never unmapped: AtomicU64 has
            // u64's size and alignment, and every access to the words is atomic.
            Ok(unsafe {
                core::slice::from_raw_parts(p as *const core::sync::atomic::AtomicU64, words)
            })
        };
    for _ in 0..3 {
        let flags = libc::O_RDWR | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK;
        match d.open_at(d.name(), flags, 0) {
            Ok(fd) => {
                let ok = fstat(fd).is_ok_and(|st| is_own_file(&st) && st.st_size as usize == len);
                let r = if ok {
                    map(fd)
                } else {
                    Err(Errno(libc::EEXIST))
                };
                close(fd);
                return r;
            }
            Err(e) if e.0 != libc::ENOENT || !create => return Err(e),
            Err(_) => {}
        }
        // Made under a hidden name, then linked in without replacing (a process that made it
        // first wins; this one then opens that one).
        let mut tmp = crate::fmtbuf::FixedBuf::<300>::new();
        let _ = core::fmt::Write::write_fmt(
            &mut tmp,
            format_args!(".table.tmp.{}.{:016x}\0", getpid(), unguessable()),
        );
        let tmp = tmp.as_bytes();
        let flags =
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        let fd = d.open_at(tmp, flags, 0o600)?;
        let made = reserve(fd, len).and_then(|_| map(fd));
        close(fd);
        let table = match made {
            Ok(t) => t,
            Err(e) => {
                unlink_at(d.fd, tmp);
                return Err(e);
            }
        };
        init(table);
        // SAFETY: both names are NUL-terminated and relative to the same directory fd.
        let r = check(unsafe {
            rdmashim_core::raw_syscall!(
                libc::SYS_renameat2,
                d.fd,
                tmp.as_ptr() as *const c_char,
                d.fd,
                d.name().as_ptr() as *const c_char,
                libc::RENAME_NOREPLACE,
            )
        });
        unlink_at(d.fd, tmp);
        match r {
            Ok(_) => return Ok(table),
            // (another process made it meanwhile: use that one; this mapping stays unused)
            Err(e) if e.0 == libc::EEXIST => continue,
            Err(e) => return Err(e),
        }
    }
    Err(Errno(libc::EEXIST))
}

/// Unmaps a mapping of [`create_shared_file`].
///
/// # Safety
/// `p`/`len` must come from one `create_shared_file` call, and nothing may reference it any
/// more.
pub unsafe fn unmap_shared(p: *mut u8, len: usize) {
    // SAFETY: guaranteed by the caller.
    unsafe { libc::munmap(p as *mut libc::c_void, len) };
}

/// Removes `dir/name` (both NUL-free) if it is a regular file of ours. errno is preserved.
pub fn remove_own_file(dir: &[u8], name: &[u8]) {
    let _e = ErrnoGuard::save();
    let mut path = crate::fmtbuf::FixedBuf::<4200>::new();
    path.push_bytes(dir);
    path.push_bytes(b"/");
    path.push_bytes(name);
    path.push_bytes(b"\0");
    if path.overflowed() {
        return;
    }
    if let Ok(d) = OutDir::open(path.as_bytes()) {
        if lstat_at(d.fd, d.name()).is_ok_and(|st| is_own_file(&st)) {
            unlink_at(d.fd, d.name());
        }
    }
}

/// This process's start time in clock ticks after boot (`/proc/self/stat` field 22), 0 if it
/// cannot be read: with the pid, it names the process (a pid is given out again, a start time
/// with it is not).
pub fn proc_start_ticks() -> u64 {
    let Ok(fd) = open(b"/proc/self/stat\0", libc::O_RDONLY | libc::O_CLOEXEC, 0) else {
        return 0;
    };
    let mut buf = [0u8; 1024];
    // SAFETY: buf is writable for its length; fd was just opened here.
    let n = unsafe { rdmashim_core::raw_syscall!(libc::SYS_read, fd, buf.as_mut_ptr(), buf.len()) };
    close(fd);
    usize::try_from(n)
        .ok()
        .and_then(|n| buf.get(..n))
        .and_then(crate::live_layout::stat_start_ticks)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phys_mem_is_meminfos_total() {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
        let kib: u64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("MemTotal");
        assert_eq!(phys_mem_bytes(), Some(kib * 1024));
    }

    #[test]
    fn nofile_limit_is_the_soft_limit_as_the_program_sets_it() {
        let mut rl = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: rl is a valid out-pointer.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) }, 0);
        let want = (rl.rlim_cur != libc::RLIM_INFINITY).then_some(rl.rlim_cur);
        assert_eq!(nofile_limit(), want);
        assert!(
            want.is_some_and(|n| n > 0),
            "an unlimited NOFILE is not Linux's"
        );
    }

    #[test]
    fn reads_a_configuration_file_and_nothing_else() {
        use crate::settings::FileRead;
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("rdmashim-sys-conf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = |n: &str| dir.join(n).into_os_string().into_encoded_bytes();
        const MAX: usize = 100;
        assert_eq!(read_config(&p("absent"), MAX, false), FileRead::Missing);
        std::fs::write(dir.join("ok"), "ring_kib = 8\n").unwrap();
        assert_eq!(
            read_config(&p("ok"), MAX, false),
            FileRead::Text(b"ring_kib = 8\n".to_vec())
        );
        std::fs::write(dir.join("max"), [b'#'; MAX]).unwrap();
        assert!(matches!(read_config(&p("max"), MAX, false), FileRead::Text(t) if t.len() == MAX));
        std::fs::write(dir.join("big"), [b'#'; MAX + 1]).unwrap();
        assert_eq!(
            read_config(&p("big"), MAX, false),
            FileRead::TooBig(MAX as u64 + 1)
        );
        // a directory, and a FIFO (opened without waiting for a writer)
        assert!(matches!(
            read_config(dir.as_os_str().as_encoded_bytes(), MAX, false),
            FileRead::Failed(_)
        ));
        let fifo = std::ffi::CString::new(p("fifo")).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        assert_eq!(
            read_config(&p("fifo"), MAX, false),
            FileRead::Failed("not a regular file".into())
        );
        // a setuid program's: root's, and writable by no one else
        let mine = geteuid() == 0;
        let trusted = read_config(&p("ok"), MAX, true);
        assert_eq!(matches!(trusted, FileRead::Text(_)), mine, "{trusted:?}");
        std::fs::set_permissions(dir.join("ok"), std::fs::Permissions::from_mode(0o664)).unwrap();
        assert!(matches!(
            read_config(&p("ok"), MAX, true),
            FileRead::Failed(_)
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn io_uring_descriptors_are_found() {
        // Anonymous inodes of other kinds, a pipe and a file are not io_uring.
        // SAFETY: plain descriptor-making calls.
        let others = unsafe {
            [
                libc::eventfd(0, libc::EFD_CLOEXEC),
                libc::epoll_create1(libc::EPOLL_CLOEXEC),
                libc::open(
                    c"/proc/self/status".as_ptr(),
                    libc::O_RDONLY | libc::O_CLOEXEC,
                ),
            ]
        };
        assert!(others.iter().all(|&fd| fd >= 0));
        assert!(!holds_io_uring());
        let mut params = [0u8; 120];
        // SAFETY: io_uring_setup(entries, params): params is a zeroed io_uring_params (120 bytes).
        let ring = unsafe {
            rdmashim_core::raw_syscall!(libc::SYS_io_uring_setup, 4, params.as_mut_ptr())
        };
        if ring < 0 {
            // (io_uring disabled on this host: kernel.io_uring_disabled, or a seccomp profile)
            eprintln!(
                "io_uring_setup failed ({}): detection not exercised",
                errno().0
            );
        } else {
            assert!(holds_io_uring());
            close(ring as c_int);
            assert!(!holds_io_uring());
        }
        for fd in others {
            close(fd);
        }
    }

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
    fn quiet_write_raises_no_signal() {
        let mut fds = [0i32; 2];
        // SAFETY: fds is a valid array of two ints.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        close(fds[0]);
        set_errno(Errno(libc::EAGAIN));
        // A plain write would kill this test process with SIGPIPE here.
        assert_eq!(quiet_write(fds[1], b"x"), Err(Errno(libc::EPIPE)));
        assert_eq!(
            errno(),
            Errno(libc::EPIPE),
            "quiet_write leaves errno to its caller"
        );
        assert_eq!(sigpending() & sigbit(libc::SIGPIPE), 0, "left pending");
        assert_eq!(
            sigmask(libc::SIG_BLOCK, 0) & sigbit(libc::SIGPIPE),
            0,
            "mask restored"
        );
        close(fds[1]);
    }

    #[test]
    fn whose_process_this_is() {
        assert_eq!(getppid(), std::os::unix::process::parent_id());
        let exe = std::env::current_exe().unwrap();
        // (cargo runs the test executable by its own path: the name it ran as is its file's)
        remember_exec_name();
        assert!(EXEC_NAME.get().is_some_and(|n| n.len > 0));
        let mut buf = [0u8; 4096];
        assert_eq!(
            program_name(&mut buf),
            Some(exe.file_name().unwrap().as_encoded_bytes()),
            "the base name the test ran as"
        );
        let before = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let now = unix_ms();
        assert!(now >= before && now < before + 5_000, "{now} vs {before}");
    }

    #[test]
    fn probes() {
        assert_eq!(dir_has_entries(b"/nonexistent-dir\0"), None);
        assert_eq!(dir_has_entries(b"/\0"), Some(true));
    }

    #[test]
    fn a_shared_table_is_made_once_and_shared() {
        use core::sync::atomic::Ordering;
        let dir = std::env::temp_dir().join(format!("rdmashim-sys-table-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let d = dir.clone().into_os_string().into_encoded_bytes();
        let inits = std::sync::atomic::AtomicU32::new(0);
        let init = |t: &[core::sync::atomic::AtomicU64]| {
            inits.fetch_add(1, Ordering::Relaxed);
            t[0].store(7, Ordering::Release);
        };
        assert_eq!(
            open_shared_table(&d, b"t", 16, init, false).err(),
            Some(Errno(libc::ENOENT)),
            "only looked for: not made"
        );
        let a = open_shared_table(&d, b"t", 16, init, true).unwrap();
        assert_eq!(a.len(), 16);
        assert_eq!(a[0].load(Ordering::Acquire), 7);
        a[5].store(42, Ordering::Release);
        // a second opening maps the same file: made once, writes seen both ways
        let b = open_shared_table(&d, b"t", 16, init, false).unwrap();
        assert_eq!(inits.load(Ordering::Relaxed), 1);
        assert_eq!(b[5].load(Ordering::Acquire), 42);
        b[6].store(9, Ordering::Release);
        assert_eq!(a[6].load(Ordering::Acquire), 9);
        // no hidden file left behind
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("t")]);
        // another size, a link, a FIFO: refused, never mapped
        assert!(open_shared_table(&d, b"t", 32, init, true).is_err());
        std::os::unix::fs::symlink(dir.join("t"), dir.join("l")).unwrap();
        assert!(open_shared_table(&d, b"l", 16, init, true).is_err());
        let fifo =
            std::ffi::CString::new(dir.join("f").into_os_string().into_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        assert!(open_shared_table(&d, b"f", 16, init, true).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_shared_file_appears_whole_and_is_removed() {
        let dir = std::env::temp_dir().join(format!("rdmashim-shared-{}", std::process::id()));
        let dir = dir.to_str().unwrap().as_bytes().to_vec();
        make_dir(&dir, 0o700).unwrap();
        make_dir(&dir, 0o700).unwrap();
        own_dir(&dir).unwrap();
        let link = [dir.as_slice(), b".link"].concat();
        std::os::unix::fs::symlink(
            std::str::from_utf8(&dir).unwrap(),
            std::str::from_utf8(&link).unwrap(),
        )
        .unwrap();
        assert_eq!(
            own_dir(&link),
            Err(Errno(libc::ENOTDIR)),
            "a link to a directory is not one"
        );
        std::fs::remove_file(std::str::from_utf8(&link).unwrap()).unwrap();
        let p = create_shared_file(&dir, b"1.live", 8192, |b| {
            assert!(b.iter().all(|x| *x == 0));
            b[0] = 7;
            b[8191] = 9;
        })
        .unwrap();
        let path = std::path::PathBuf::from(String::from_utf8(dir.clone()).unwrap());
        let f = std::fs::read(path.join("1.live")).unwrap();
        assert_eq!((f.len(), f[0], f[8191]), (8192, 7, 9));
        // SAFETY: the mapping was made above, 8192 bytes; nothing else references it.
        unsafe {
            *p.add(1) = 5;
        }
        assert_eq!(std::fs::read(path.join("1.live")).unwrap()[1], 5, "shared");
        // SAFETY: as above; not used after.
        unsafe { unmap_shared(p, 8192) };
        // Only the file itself, no temporary left behind.
        let names: Vec<_> = std::fs::read_dir(&path)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("1.live")]);
        remove_own_file(&dir, b"1.live");
        assert!(!path.join("1.live").exists());
        // A planted link is not replaced.
        std::os::unix::fs::symlink("/etc/hostname", path.join("2.live")).unwrap();
        assert!(create_shared_file(&dir, b"2.live", 4096, |_| {}).is_err());
        remove_own_file(&dir, b"2.live");
        assert!(
            path.join("2.live").symlink_metadata().is_ok(),
            "a link is not ours"
        );
        std::fs::remove_dir_all(&path).unwrap();
        assert!(create_shared_file(b"/proc/no-such-dir", b"1.live", 4096, |_| {}).is_err());
        assert!(proc_start_ticks() > 0);
    }
}
