//! Logging: never on the pass-through path; each record is formatted into a fixed stack buffer
//! and written with raw syscalls (errno preserved). A record that cannot be written is dropped
//! and counted (`output.log_dropped` in the stats); writing one never raises SIGPIPE or SIGXFSZ
//! and never follows a link (`sys::append_log`).

use crate::config::{self, Level};
use crate::fmtbuf::FixedBuf;
use core::fmt::{self, Write};
use core::sync::atomic::{AtomicBool, Ordering};

/// Set once the process runs under a seccomp filter it installed ([`silence`]).
static SILENT: AtomicBool = AtomicBool::new(false);

/// From now on the shim writes nothing: no log record, no stats file. For a process that
/// installed a seccomp filter (a sandbox): the system calls a write needs (open, rename, the
/// signal mask calls around it) may be ones the filter kills the process for.
pub fn silence() {
    SILENT.store(true, Ordering::Relaxed);
}

/// Whether [`silence`] was called (in this process or the parent it forked from).
#[inline]
pub fn silenced() -> bool {
    SILENT.load(Ordering::Relaxed)
}

/// Whether records of `level` are written.
#[inline]
pub fn enabled(level: Level) -> bool {
    level != Level::Off && config::get().log_level >= level && !silenced()
}

/// Writes one record. Use the [`shim_log!`](crate::shim_log) macro, which checks the level first.
#[cold]
pub fn emit(level: Level, args: fmt::Arguments<'_>) {
    let _s = crate::guard::Section::enter();
    let pid = crate::sys::getpid();
    let mut b = FixedBuf::<512>::new();
    let _ = write!(b, "rdmashim[{pid}] {}: ", level.name());
    let _ = b.write_fmt(args);
    if b.overflowed() {
        // Keep room for the newline.
        let keep = b.len().saturating_sub(4);
        let mut t = FixedBuf::<512>::new();
        t.push_bytes(b.as_bytes().get(..keep).unwrap_or(&[]));
        t.push_bytes(b"...");
        b = t;
    }
    b.push_bytes(b"\n");
    let mut path = FixedBuf::<4200>::new();
    let file = match &config::get().log_file {
        Some(p) if config::expand_path(p, pid, &mut path) => Some(path.as_bytes()),
        _ => None,
    };
    if let Err(e) = crate::sys::append_log(file, b.as_bytes()) {
        crate::stats::count_log_dropped();
        if let Some(f) = file {
            log_file_failed(pid, f, e);
        }
    }
}

/// How much of a long path a message shows (the rest of the 512-byte record is words).
const PATH_SHOWN: usize = 320;

/// Set once a record could not be written to `RDMASHIM_LOG_FILE` and that was said on stderr.
static LOG_FILE_FAILED: AtomicBool = AtomicBool::new(false);

/// The first record that cannot be written to the log file (`path`, NUL-terminated) is
/// reported on stderr, once per process, with the reason in words; later ones are only
/// counted. Without it, a mistyped or unwritable log path would lose every record silently.
#[cold]
fn log_file_failed(pid: u32, path: &[u8], e: crate::outcome::Errno) {
    if LOG_FILE_FAILED.swap(true, Ordering::Relaxed)
        || config::get().log_level < Level::Warn
        || silenced()
    {
        return;
    }
    let mut b = FixedBuf::<512>::new();
    let _ = write!(
        b,
        "rdmashim[{pid}] {}: cannot write log to ",
        Level::Warn.name()
    );
    let path = path.strip_suffix(b"\0").unwrap_or(path);
    match path.get(..PATH_SHOWN) {
        Some(head) if path.len() > PATH_SHOWN => {
            b.push_bytes(head);
            b.push_bytes(b"...");
        }
        _ => b.push_bytes(path),
    }
    let _ = writeln!(b, ": {e}; log records are dropped (output.log_dropped)");
    if crate::sys::append_log(None, b.as_bytes()).is_err() {
        crate::stats::count_log_dropped();
    }
}

/// `shim_log!(Level::Info, "fmt", args...)`: formats only if the level is enabled.
#[macro_export]
macro_rules! shim_log {
    ($level:expr, $($arg:tt)*) => {
        if $crate::log::enabled($level) {
            $crate::log::emit($level, format_args!($($arg)*));
        }
    };
}
