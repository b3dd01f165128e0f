//! Each stats record says whose it is (`ppid`, `program`, `version`, the span it covers), lands
//! where the program was started even when the program changes directory, and a stats or log
//! file that cannot be written is reported with its reason in words — the program's own output
//! and exit status untouched.
//!
//! Before: a relative `RDMASHIM_STATS` was opened relative to whatever directory the program
//! had at exit (a daemon's `chdir("/")` sent it to `/`), a record had only its `pid`, and the
//! warning said `errno 2`.

use rdmashim_compat_tests::*;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The base name `/proc/PID/exe` has for the system python (a symlink such as
/// `/usr/bin/python3` names a versioned file).
/// The names python may be recorded under: the base name it is executed as (the test's
/// command), or that of the file behind it (where the name it ran as cannot be read).
fn python_base_names() -> Vec<String> {
    let p = python();
    let real = std::fs::canonicalize(&p).unwrap();
    let base = |p: &Path| p.file_name().unwrap().to_string_lossy().into_owned();
    vec![base(Path::new(&p)), base(&real)]
}

/// A python that moves to `ARGV[1]`, makes one loopback connection, waits 100 ms, forks a
/// child that makes its own connection and exits normally, waits for it, and prints
/// `PARENT_PID CHILD_PID FORK_MS` (FORK_MS: the wall clock just before the fork).
const CHDIR_AND_FORK: &str = "import os, socket, sys, time\n\
    os.chdir(sys.argv[1])\n\
    def one():\n\
    \x20   s = socket.create_server(('127.0.0.1', 0))\n\
    \x20   c = socket.create_connection(s.getsockname())\n\
    \x20   a, _ = s.accept()\n\
    \x20   c.sendall(b'x'); assert a.recv(1) == b'x'\n\
    \x20   for x in (a, c, s): x.close()\n\
    one()\n\
    time.sleep(0.1)\n\
    t = int(time.time() * 1000)\n\
    pid = os.fork()\n\
    if pid == 0:\n\
    \x20   one()\n\
    \x20   sys.exit(0)\n\
    _, st = os.waitpid(pid, 0)\n\
    assert st == 0, st\n\
    print(os.getpid(), pid, t)\n";

#[test]
fn a_relative_path_lands_where_the_program_started_and_says_whose_record_it_is() {
    let s = Scratch::new("record-chdir");
    let elsewhere = s.dir.join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let mut c = shimmed(python(), &s, "unused");
    c.current_dir(&s.dir)
        .env("RDMASHIM_STATS", "rec.%p.json")
        .args(["-c", CHDIR_AND_FORK])
        .arg(&elsewhere);
    let before = now_ms();
    let out = run(c, T);
    let after = now_ms();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "",
        "no warning expected"
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    let v: Vec<u64> = printed
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    let &[parent, child, fork_ms] = v.as_slice() else {
        panic!("stdout: {printed}");
    };

    // Both records where the program started, none where it went.
    assert!(
        dir_names(&elsewhere).is_empty(),
        "written after the chdir: {:?}",
        dir_names(&elsewhere)
    );
    let mut want = vec![
        format!("rec.{parent}.json"),
        format!("rec.{child}.json"),
        "elsewhere".to_string(),
    ];
    want.sort();
    assert_eq!(dir_names(&s.dir), want);
    let p = Stats::load(&s.dir.join(format!("rec.{parent}.json")));
    let k = Stats::load(&s.dir.join(format!("rec.{child}.json")));

    let programs = python_base_names();
    for (st, pid) in [(&p, parent), (&k, child)] {
        let r = &st.raw;
        assert_eq!(st.pid, pid);
        let name = r["program"].as_str().unwrap_or_default().to_string();
        assert!(
            programs.contains(&name),
            "program {name:?}, python is {programs:?}: {r}"
        );
        assert_eq!(r["version"], env!("CARGO_PKG_VERSION"), "{r}");
        let (started, ended) = (
            r["started_unix_ms"].as_u64().expect("started_unix_ms"),
            r["ended_unix_ms"].as_u64().expect("ended_unix_ms"),
        );
        assert!(
            before <= started && started <= ended && ended <= after,
            "pid {pid}: {before} <= {started} <= {ended} <= {after}"
        );
        // Each record counts its own connection (the child's counters start at zero).
        assert_eq!(st.connections(), 2, "pid {pid}: {}", st.summary());
    }
    assert_eq!(p.raw["ppid"], u64::from(std::process::id()), "the test");
    assert_eq!(
        k.raw["ppid"], parent,
        "the child's parent is the forking process"
    );
    // The child's record began at its fork, not when the parent loaded the library (the
    // parent slept 100 ms after its connection, before the fork).
    let (p_started, k_started, p_ended) = (
        p.raw["started_unix_ms"].as_u64().unwrap(),
        k.raw["started_unix_ms"].as_u64().unwrap(),
        p.raw["ended_unix_ms"].as_u64().unwrap(),
    );
    assert!(
        k_started >= fork_ms && k_started >= p_started + 100,
        "child started {k_started}, fork at {fork_ms}, parent started {p_started}"
    );
    assert!(
        p_ended >= k.raw["ended_unix_ms"].as_u64().unwrap(),
        "the parent wrote after it reaped the child"
    );
}

/// A python that prints `out` and exits with status 3, under the shim with `vars`; returns
/// its stderr after checking its stdout and status are its own.
fn print_and_exit_3(s: &Scratch, vars: &[(&str, &Path)], level: &str) -> String {
    let mut c = shimmed(python(), s, "unused");
    c.env("RDMASHIM_LOG", level)
        .env_remove("RDMASHIM_LOG_FILE")
        .args(["-c", "print('out'); raise SystemExit(3)"]);
    for (k, v) in vars {
        c.env(k, v);
    }
    let out = run(c, T);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "out\n", "{out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `err` is exactly one shim warning line, ending in `tail`.
fn one_warning(err: &str, tail: &str) {
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "stderr: {err}");
    assert!(
        lines[0].starts_with("rdmashim[") && lines[0].contains("] warn: "),
        "{err}"
    );
    assert!(
        lines[0].ends_with(tail),
        "stderr: {err}\nwanted the end: {tail}"
    );
}

#[test]
fn a_stats_file_that_cannot_be_written_is_reported_in_words() {
    let s = Scratch::new("record-unwritable");
    // A directory that does not exist (root is refused too).
    let missing: PathBuf = s.dir.join("missing").join("st.json");
    let err = print_and_exit_3(&s, &[("RDMASHIM_STATS", &missing)], "warn");
    one_warning(
        &err,
        &format!(
            "cannot write stats to {}: No such file or directory (errno 2)",
            missing.display()
        ),
    );

    // A directory others can write without the sticky bit: refused by the shim itself.
    let open = s.dir.join("open");
    std::fs::create_dir(&open).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let refused = open.join("st.json");
    let err = print_and_exit_3(&s, &[("RDMASHIM_STATS", &refused)], "warn");
    one_warning(
        &err,
        &format!(
            "cannot write stats to {}: Operation not permitted (errno 1)",
            refused.display()
        ),
    );
    assert!(dir_names(&open).is_empty(), "{:?}", dir_names(&open));
}

#[test]
fn a_log_file_that_cannot_be_written_is_reported_once_in_words() {
    let s = Scratch::new("record-log");
    let log = s.dir.join("missing").join("shim.log");
    let stats = s.dir.join("st.json");
    // At debug level the constructor's record and others fail: one warning for them all.
    let err = print_and_exit_3(
        &s,
        &[("RDMASHIM_LOG_FILE", &log), ("RDMASHIM_STATS", &stats)],
        "debug",
    );
    one_warning(
        &err,
        &format!(
            "cannot write log to {}: No such file or directory (errno 2); \
             log records are dropped (output.log_dropped)",
            log.display()
        ),
    );
    let st = Stats::load(&stats);
    assert!(
        st.raw["output"]["log_dropped"].as_u64().unwrap() >= 1,
        "{}",
        st.raw
    );
}
