//! Logging: never on the pass-through path; each record is formatted into a fixed stack buffer
//! and written with raw syscalls (errno preserved). A record that cannot be written is dropped
//! and counted (`output.log_dropped` in the stats); writing one never raises SIGPIPE or SIGXFSZ
//! and never follows a link (`sys::append_log`).
//!
//! A record is `rdmashim[PID] LEVEL: message`; in a log file (`RDMASHIM_LOG_FILE`) it starts
//! with its time, UTC to the microsecond (`2026-12-01T21:26:31.123456Z rdmashim[PID] ...`):
//! a file has no other clock, where standard error usually goes to a terminal or to a journal
//! that stamps each line itself.

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
    let mut path = FixedBuf::<4200>::new();
    let file = match &config::get().log_file {
        Some(p) if config::expand_path(p, pid, &mut path) => Some(path.as_bytes()),
        _ => None,
    };
    let mut b = FixedBuf::<512>::new();
    if file.is_some() {
        write_utc(&mut b, crate::sys::unix_us());
        b.push_bytes(b" ");
    }
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
    if let Err(e) = crate::sys::append_log(file, b.as_bytes()) {
        crate::stats::count_log_dropped();
        if let Some(f) = file {
            log_file_failed(pid, f, e);
        }
    }
}

/// Writes `us` (microseconds since the Unix epoch) as a UTC time in ISO 8601:
/// `YYYY-MM-DDTHH:MM:SS.uuuuuuZ` (the civil date from the day count, proleptic Gregorian).
fn write_utc<const N: usize>(b: &mut FixedBuf<N>, us: u64) {
    let secs = us / 1_000_000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Days since 1970-01-01 to year, month, day (H. Hinnant's `civil_from_days`, for days >= 0).
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    let _ = write!(
        b,
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        us % 1_000_000
    );
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

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(us: u64) -> String {
        let mut b = FixedBuf::<64>::new();
        write_utc(&mut b, us);
        String::from_utf8(b.as_bytes().to_vec()).unwrap()
    }

    #[test]
    fn times_are_utc_in_iso_8601() {
        assert_eq!(utc(0), "1970-01-01T00:00:00.000000Z");
        // a leap day, the end of a leap year, and a time of this project's
        assert_eq!(utc(951_782_400_000_001), "2000-02-29T00:00:00.000001Z");
        assert_eq!(utc(1_609_459_199_999_999), "2020-12-31T23:59:59.999999Z");
        assert_eq!(utc(1_796_160_391_123_456), "2026-12-01T21:26:31.123456Z");
        // 2100 is not a leap year
        assert_eq!(utc(4_107_542_400_000_000), "2100-03-01T00:00:00.000000Z");
    }
}
