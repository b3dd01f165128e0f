//! The files the shim writes (stats, log) never follow a link, never land on a file it did not
//! create, and never cost the program its life: a record that cannot be written is dropped and
//! counted, and the shim's own writes raise neither SIGXFSZ nor SIGPIPE.
//!
//! The attack these pin (measured before the fix): a process run with
//! `RDMASHIM_STATS=/tmp/st-x.json` wrote its stats through a symlink planted at
//! `/tmp/st-x.json.tmp`, overwriting the link's target; a sandboxed child with `RLIMIT_FSIZE` 0
//! and its stderr on a file was killed by SIGXFSZ on the shim's first log line.

use rdmashim_compat_tests::*;
use std::os::unix::fs::{symlink, FileTypeExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};

const PRECIOUS: &[u8] = b"precious bytes, not the shim's\n";

/// A shimmed `true` that logs at least one record (the constructor's, at debug level) and
/// writes its stats to `stats`, its log to `log` (stderr if `None`).
fn shimmed_true(stats: &Path, log: Option<&Path>) -> Command {
    let mut c = Command::new("true");
    c.env("LD_PRELOAD", &shim().lib)
        .env("RDMASHIM_STATS", stats)
        .env("RDMASHIM_LOG", "debug")
        .env_remove("RDMASHIM_DISABLE")
        .env_remove("RDMASHIM_LOG_FILE");
    if let Some(l) = log {
        c.env("RDMASHIM_LOG_FILE", l);
    }
    c
}

fn victim(dir: &Path) -> std::path::PathBuf {
    let v = dir.join("victim");
    std::fs::write(&v, PRECIOUS).unwrap();
    v
}

fn assert_untouched(victim: &Path) {
    assert_eq!(
        std::fs::read(victim).unwrap(),
        PRECIOUS,
        "{} was written through a link",
        victim.display()
    );
}

fn assert_link_to(link: &Path, target: &Path) {
    let m = std::fs::symlink_metadata(link).unwrap();
    assert!(m.file_type().is_symlink(), "{} replaced", link.display());
    assert_eq!(std::fs::read_link(link).unwrap(), target);
}

#[test]
fn links_planted_at_the_temporary_and_log_names_are_not_followed() {
    let s = Scratch::new("files-links");
    let v = victim(&s.dir);
    let stats = s.dir.join("st.json");
    let log = s.dir.join("shim.log");
    // The old temporary name, and the log file, both links to the victim.
    symlink(&v, s.dir.join("st.json.tmp")).unwrap();
    symlink(&v, &log).unwrap();
    let out = run(shimmed_true(&stats, Some(&log)), T);
    assert!(out.status.success(), "{:?}", out);
    assert_untouched(&v);
    assert_link_to(&s.dir.join("st.json.tmp"), &v);
    assert_link_to(&log, &v);
    // The stats went to a file of their own, and say the log record was dropped.
    let st = Stats::load(&stats);
    assert!(
        std::fs::symlink_metadata(&stats).unwrap().is_file(),
        "stats file"
    );
    assert!(
        st.raw["output"]["log_dropped"].as_u64().unwrap() >= 1,
        "{}",
        st.raw
    );
    // Nothing left behind: no temporary file of any name.
    assert_eq!(
        dir_names(&s.dir),
        ["shim.log", "st.json", "st.json.tmp", "victim"]
    );
}

#[test]
fn a_link_or_a_foreign_file_at_the_stats_path_is_not_replaced() {
    let s = Scratch::new("files-final");
    let v = victim(&s.dir);
    let stats = s.dir.join("st.json");
    symlink(&v, &stats).unwrap();
    let out = run(shimmed_true(&stats, None), T);
    assert!(out.status.success(), "{:?}", out);
    assert_untouched(&v);
    assert_link_to(&stats, &v);
    assert_eq!(
        dir_names(&s.dir),
        ["st.json", "victim"],
        "no temporary file left"
    );

    // A file with a second name (a hard link) is not the shim's to replace either.
    let other = s.dir.join("other");
    std::fs::remove_file(&stats).unwrap();
    std::fs::hard_link(&v, &stats).unwrap();
    std::fs::hard_link(&v, &other).unwrap();
    let out = run(shimmed_true(&stats, Some(&other)), T);
    assert!(out.status.success(), "{:?}", out);
    assert_untouched(&v);
    assert_eq!(dir_names(&s.dir), ["other", "st.json", "victim"]);
}

#[test]
fn a_directory_others_can_write_needs_the_sticky_bit() {
    let s = Scratch::new("files-dir");
    let open = s.dir.join("open");
    let sticky = s.dir.join("sticky");
    for (d, mode) in [(&open, 0o777), (&sticky, 0o1777)] {
        std::fs::create_dir(d).unwrap();
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let out = run(
        shimmed_true(&open.join("st.json"), Some(&open.join("log"))),
        T,
    );
    assert!(out.status.success(), "{:?}", out);
    assert!(dir_names(&open).is_empty(), "wrote into {}", open.display());
    let out = run(
        shimmed_true(&sticky.join("st.json"), Some(&sticky.join("log"))),
        T,
    );
    assert!(out.status.success(), "{:?}", out);
    assert_eq!(dir_names(&sticky), ["log", "st.json"]);
    let log = std::fs::read_to_string(sticky.join("log")).unwrap();
    assert!(log.contains("rdmashim["), "{log}");
    assert_eq!(
        Stats::load(&sticky.join("st.json")).raw["output"]["log_dropped"],
        0
    );
}

#[test]
fn a_fifo_at_the_log_path_neither_blocks_nor_receives() {
    let s = Scratch::new("files-fifo");
    let fifo = s.dir.join("log");
    let st = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(st.success());
    let out = run(shimmed_true(&s.dir.join("st.json"), Some(&fifo)), T);
    assert!(out.status.success(), "{:?}", out);
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    let st = Stats::load(&s.dir.join("st.json"));
    assert!(st.raw["output"]["log_dropped"].as_u64().unwrap() >= 1);
}

#[test]
fn no_sigxfsz_from_the_shims_writes() {
    // RLIMIT_FSIZE 0 and stderr on a file, as a privilege-separated server's sandboxed child
    // has it: the shim's log record fails with EFBIG, and the process lives.
    let s = Scratch::new("files-fsize");
    let err = std::fs::File::create(s.dir.join("stderr")).unwrap();
    let mut c = Command::new("sh");
    c.args(["-c", "ulimit -f 0 && exec true"])
        .env("LD_PRELOAD", &shim().lib)
        .env("RDMASHIM_LOG", "debug")
        .env("RDMASHIM_STATS", s.dir.join("st.%p.json"))
        .env_remove("RDMASHIM_LOG_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(err);
    let st = c.status().unwrap();
    assert_eq!(
        (st.code(), st.signal()),
        (Some(0), None),
        "killed by the shim's own write"
    );
    // sh's own stats file (written before the limit) exists; `true`'s could not be written
    // (EFBIG), and no temporary file of it was left behind.
    for n in dir_names(&s.dir) {
        assert!(!n.contains(".tmp"), "left behind: {n}");
    }
}

#[test]
fn no_sigpipe_from_the_shims_writes() {
    // stderr is a pipe nobody reads any more: the shim's record fails with EPIPE, and the
    // process lives.
    let s = Scratch::new("files-pipe");
    let mut fds = [0i32; 2];
    // SAFETY: fds is a valid array of two ints.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both fds were just created and are owned here exactly once.
    let (r, w) = unsafe {
        use std::os::fd::FromRawFd;
        (
            std::os::fd::OwnedFd::from_raw_fd(fds[0]),
            std::os::fd::OwnedFd::from_raw_fd(fds[1]),
        )
    };
    drop(r);
    let mut c = shimmed_true(&s.dir.join("st.json"), None);
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(w));
    let st = c.status().unwrap();
    assert_eq!(
        (st.code(), st.signal()),
        (Some(0), None),
        "killed by the shim's own write"
    );
    let st = Stats::load(&s.dir.join("st.json"));
    assert!(st.raw["output"]["log_dropped"].as_u64().unwrap() >= 1);
}

/// A log file's records start with their time, UTC to the microsecond, then the record as
/// standard error has it (`rdmashim[PID] LEVEL: ...`); the same process's records on standard
/// error carry no time (a terminal or a journal stamps them).
#[test]
fn log_file_records_start_with_their_utc_time() {
    let s = Scratch::new("files-log-time");
    let log = s.dir.join("log");
    let before = std::time::SystemTime::now();
    let out = run(shimmed_true(&s.dir.join("st.json"), Some(&log)), T);
    assert!(out.status.success(), "{:?}", out);
    let after = std::time::SystemTime::now();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.is_empty(), "no debug record in the file");
    let secs =
        |t: std::time::SystemTime| t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    for line in text.lines() {
        let (time, rest) = line.split_once(' ').unwrap_or_else(|| panic!("{line}"));
        let b = time.as_bytes();
        let shape = time.len() == 27
            && b.iter().enumerate().all(|(i, c)| match i {
                4 | 7 => *c == b'-',
                10 => *c == b'T',
                13 | 16 => *c == b':',
                19 => *c == b'.',
                26 => *c == b'Z',
                _ => c.is_ascii_digit(),
            });
        assert!(shape, "not a UTC time: {line}");
        assert!(
            rest.starts_with("rdmashim[") && rest.contains("] debug: "),
            "{line}"
        );
        // (the day and the time of day, against the clock around the run)
        let n = |r: std::ops::Range<usize>| time[r].parse::<u64>().unwrap();
        let of_day = n(11..13) * 3600 + n(14..16) * 60 + n(17..19);
        let days = [secs(before) / 86_400, secs(after) / 86_400];
        let at = [secs(before) % 86_400, secs(after) % 86_400 + 1];
        assert!(
            (days[0] != days[1]) || (at[0]..=at[1]).contains(&of_day),
            "{time} is not between the run's start and end"
        );
    }
    let out = run(shimmed_true(&s.dir.join("st2.json"), None), T);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.lines().count() > 0 && err.lines().all(|l| l.starts_with("rdmashim[")),
        "{err}"
    );
}
