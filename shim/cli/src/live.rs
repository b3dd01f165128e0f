//! `rdmashim ss` and `rdmashim stats`: the shimmed processes' live records (the files the
//! shim keeps in its run directory, layout in `src/live_layout.rs`), read without trusting
//! them: every file is checked whole, and one that is not a valid record is named with the
//! reason, never a crash.

use crate::json::Value;
use crate::live_layout::{self as lay, Record, RecordState, GROUPS};
use crate::settings;
use std::fs;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// `rdmashim ss --help`.
pub const SS_USAGE: &str = "  rdmashim ss [-a] [--json] [--clean] [--dir DIR]
      The connections of the processes running under the shim, from their live records:
      pid, program, fd, local and peer address, transport (tcp, shm, rdma), state (tcp,
      upgrading, ring, switched_back, path_failed), bytes sent and received, and why a
      connection stays on TCP. A process killed by a signal leaves its record: it is listed as dead, with its
      last figures.
      -a               also processes without connections
      --json           one JSON object instead of the table
      --clean          remove the records of processes that are gone, and say which
      --dir DIR        the run directory to read (default: RDMASHIM_RUN_DIR, else the first
                       of /run/rdmashim, $XDG_RUNTIME_DIR/rdmashim, /tmp/rdmashim-UID that
                       is this user's or root's and that it may write to, as the shim
                       chooses)
      Exit status: 0; 1 if a record could not be read (named on stderr); 2 for a usage error.
";

/// `rdmashim stats --help`.
pub const STATS_USAGE: &str = "  rdmashim stats [PID] [--json] [--dir DIR]
      The counters of process PID (of every process with a record if no PID), as its stats
      file would have them (calls, connections, fallback reasons, bytes, waits), from its
      live record: a running process's as last published (at its connections' events, and
      about every second while it has connections on rings), or a killed one's last.
      --json           JSON (an object for a PID, else an array of them)
      --dir DIR        the run directory to read (as for ss)
      Exit status: 0; 1 if there is no record for PID or it cannot be read; 2 for a usage
      error.
";

#[derive(Debug, Default, PartialEq, Eq)]
pub struct SsArgs {
    pub all: bool,
    pub json: bool,
    pub clean: bool,
    pub dir: Option<PathBuf>,
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct StatsArgs {
    pub pid: Option<u32>,
    pub json: bool,
    pub dir: Option<PathBuf>,
}

/// `None`: help was asked for.
pub fn parse_ss(args: &[std::ffi::OsString]) -> Result<Option<SsArgs>, String> {
    let mut a = SsArgs::default();
    let mut it = args.iter();
    while let Some(x) = it.next() {
        match x.to_str() {
            Some("-h" | "--help") => return Ok(None),
            Some("-a" | "--all") => a.all = true,
            Some("--json") => a.json = true,
            Some("--clean") => a.clean = true,
            Some("--dir") => a.dir = Some(it.next().ok_or("--dir needs a value")?.into()),
            _ => return Err(format!("ss: unknown argument {x:?}")),
        }
    }
    Ok(Some(a))
}

/// `None`: help was asked for.
pub fn parse_stats(args: &[std::ffi::OsString]) -> Result<Option<StatsArgs>, String> {
    let mut a = StatsArgs::default();
    let mut it = args.iter();
    while let Some(x) = it.next() {
        match x.to_str() {
            Some("-h" | "--help") => return Ok(None),
            Some("--json") => a.json = true,
            Some("--dir") => a.dir = Some(it.next().ok_or("--dir needs a value")?.into()),
            Some(p) if a.pid.is_none() && p.parse::<u32>().is_ok() => a.pid = p.parse().ok(),
            _ => return Err(format!("stats: unknown argument {x:?}")),
        }
    }
    Ok(Some(a))
}

/// The run directory: `explicit`, else the shim's choice for this user.
fn run_dir(explicit: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(d) = explicit {
        return Ok(d.to_path_buf());
    }
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let cfg = settings::Config::from_lookup(|k| std::env::var_os(k).map(|v| v.into_vec()));
    let dirs: Vec<PathBuf> = settings::run_dirs(&cfg, crate::sys::effective_uid())
        .into_iter()
        .map(|d| PathBuf::from(std::ffi::OsStr::from_bytes(&d)))
        .collect();
    if cfg.run_dir.is_some() {
        return Ok(dirs[0].clone());
    }
    // (as the shim: a directory of this user's or root's, not a link, that it may write to)
    let uid = crate::sys::effective_uid();
    dirs.iter()
        .find(|d| {
            use std::os::unix::fs::MetadataExt;
            fs::symlink_metadata(d).is_ok_and(|m| m.is_dir() && (m.uid() == uid || m.uid() == 0))
                && crate::sys::writable(d)
        })
        .cloned()
        .ok_or_else(|| {
            let l: Vec<_> = dirs.iter().map(|d| d.display().to_string()).collect();
            format!(
                "no run directory of the shim's for this user (looked in: {})",
                l.join(", ")
            )
        })
}

/// How a record's process stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Running,
    /// Gone without ending its record (killed by a signal), or its pid is another process's
    /// now (the start time differs).
    Dead,
    /// Ended its record (exit, or an exec) but the file stayed.
    Ended,
}

impl Status {
    fn name(self) -> &'static str {
        match self {
            Status::Running => "running",
            Status::Dead => "dead",
            Status::Ended => "ended",
        }
    }
}

/// Whether the record's process is the one running under its pid.
fn status_of(r: &Record) -> Status {
    if r.state != RecordState::Running {
        return Status::Ended;
    }
    if !crate::sys::process_exists(r.pid) {
        return Status::Dead;
    }
    let now = fs::read(format!("/proc/{}/stat", r.pid))
        .ok()
        .and_then(|s| lay::stat_start_ticks(&s));
    match now {
        Some(t) if r.proc_start_ticks != 0 && t != r.proc_start_ticks => Status::Dead,
        _ => Status::Running,
    }
}

/// Reads one record: the whole file between two equal even update sequences (the shim was
/// not writing meanwhile), tried a few times; a record whose writer was killed mid-update
/// stays odd and is returned as it is ([`Record::torn`]).
pub fn read_record(path: &Path) -> Result<Record, String> {
    let name = path.display();
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| format!("{name}: {e}"))?;
    let meta = f.metadata().map_err(|e| format!("{name}: {e}"))?;
    if !meta.is_file() {
        return Err(format!("{name}: not a regular file"));
    }
    if meta.len() != lay::FILE_LEN as u64 {
        return Err(format!(
            "{name}: {} bytes, a live record has {}",
            meta.len(),
            lay::FILE_LEN
        ));
    }
    let seq = |f: &fs::File| {
        let mut b = [0u8; 8];
        f.read_exact_at(&mut b, lay::SEQ_OFF as u64)
            .map(|_| u64::from_le_bytes(b))
    };
    let mut buf = vec![0u8; lay::FILE_LEN];
    let mut last = None;
    for _ in 0..20 {
        let before = seq(&f).map_err(|e| format!("{name}: {e}"))?;
        f.read_exact_at(&mut buf, 0)
            .map_err(|e| format!("{name}: {e}"))?;
        let after = seq(&f).map_err(|e| format!("{name}: {e}"))?;
        let r = lay::decode(&buf);
        if before == after && before & 1 == 0 {
            return r.map_err(|e| format!("{name}: {e}"));
        }
        last = Some(r);
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    match last {
        Some(r) => r.map_err(|e| format!("{name}: {e}")),
        None => Err(format!("{name}: unreadable")),
    }
}

/// The records of a directory (with their files), and the errors of files that are not valid
/// records.
type Records = (Vec<(PathBuf, Record)>, Vec<String>);

/// Every record in `dir`, by pid, with the errors of files that are not valid records.
fn read_all(dir: &Path) -> Result<Records, String> {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        // (no process has made a record there yet)
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((vec![], vec![])),
        Err(e) => return Err(format!("{}: {e}", dir.display())),
    };
    let mut recs = Vec::new();
    let mut errs = Vec::new();
    for ent in rd.flatten() {
        let name = ent.file_name();
        let Some(pid) = name.to_str().and_then(lay::pid_of) else {
            continue;
        };
        let path = ent.path();
        match read_record(&path) {
            Ok(r) if r.pid == pid => recs.push((path, r)),
            Ok(r) => errs.push(format!(
                "{}: the record is of pid {}, not {pid}",
                path.display(),
                r.pid
            )),
            Err(e) => errs.push(e),
        }
    }
    recs.sort_by_key(|(_, r)| r.pid);
    Ok((recs, errs))
}

fn addr(a: Option<std::net::SocketAddr>) -> String {
    a.map_or("-".into(), |a| a.to_string())
}

fn count(v: Option<u64>) -> String {
    v.map_or("-".into(), |v| v.to_string())
}

fn conn_json(c: &lay::Conn) -> Value {
    let s = |v: Option<std::net::SocketAddr>| Value::opt(v, |a| Value::str(a.to_string()));
    Value::Obj(vec![
        ("fd", Value::Num(c.fd.max(0) as u64)),
        ("local", s(c.local)),
        ("peer", s(c.peer)),
        ("transport", Value::str(c.via.name())),
        ("state", Value::str(c.state.name())),
        (
            "side",
            Value::opt(c.client, |cl| {
                Value::str(if cl { "client" } else { "server" })
            }),
        ),
        ("tx_bytes", Value::opt(c.tx, Value::Num)),
        ("rx_bytes", Value::opt(c.rx, Value::Num)),
        ("since_unix_ms", Value::Num(c.since_unix_ms)),
        (
            "fallback_reason",
            if c.reason.is_empty() {
                Value::Null
            } else {
                Value::str(c.reason.to_string())
            },
        ),
    ])
}

fn who_json(path: &Path, r: &Record, st: Status) -> Vec<(&'static str, Value)> {
    vec![
        ("pid", Value::Num(r.pid.into())),
        ("ppid", Value::Num(r.ppid.into())),
        (
            "program",
            if r.program.is_empty() {
                Value::Null
            } else {
                Value::str(r.program.clone())
            },
        ),
        ("version", Value::str(r.version.clone())),
        ("status", Value::str(st.name())),
        ("started_unix_ms", Value::Num(r.started_unix_ms)),
        ("heartbeat_unix_ms", Value::Num(r.heartbeat_unix_ms)),
        ("torn", Value::Bool(r.torn())),
        ("file", Value::str(path.display().to_string())),
    ]
}

pub fn ss(a: &SsArgs) -> ExitCode {
    let dir = match run_dir(a.dir.as_deref()) {
        Ok(d) => d,
        Err(e) => {
            if a.json {
                println!("{}", Value::Obj(vec![("processes", Value::Arr(vec![]))]));
            }
            eprintln!("rdmashim: {e}");
            return ExitCode::SUCCESS;
        }
    };
    let (recs, errs) = match read_all(&dir) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("rdmashim: {e}");
            return ExitCode::from(1);
        }
    };
    let mut procs = Vec::new();
    let mut rows = Vec::new();
    let mut cleaned = Vec::new();
    for (path, r) in &recs {
        let st = status_of(r);
        if a.clean && st != Status::Running {
            match fs::remove_file(path) {
                Ok(()) => cleaned.push(format!(
                    "removed {} ({}, {})",
                    path.display(),
                    r.pid,
                    st.name()
                )),
                Err(e) => eprintln!("rdmashim: cannot remove {}: {e}", path.display()),
            }
            continue;
        }
        if r.conns.is_empty() && !a.all {
            continue;
        }
        let mut o = who_json(path, r, st);
        o.push((
            "connections",
            Value::Arr(r.conns.iter().map(conn_json).collect()),
        ));
        procs.push(Value::Obj(o));
        let prog = if r.program.is_empty() {
            "?"
        } else {
            &r.program
        };
        let status = if r.torn() {
            format!("{}*", st.name())
        } else {
            st.name().to_string()
        };
        if r.conns.is_empty() {
            rows.push([
                r.pid.to_string(),
                prog.to_string(),
                status.clone(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
            ]);
        }
        for c in &r.conns {
            rows.push([
                r.pid.to_string(),
                prog.to_string(),
                status.clone(),
                c.fd.to_string(),
                addr(c.local),
                addr(c.peer),
                c.via.name().into(),
                c.state.name().into(),
                count(c.tx),
                count(c.rx),
                if c.reason.is_empty() {
                    "-".into()
                } else {
                    c.reason.to_string()
                },
            ]);
        }
    }
    if a.clean {
        // (stale temporary files of processes that are gone: a record being made when they died)
        if let Ok(rd) = fs::read_dir(&dir) {
            for ent in rd.flatten() {
                let n = ent.file_name();
                let Some(n) = n.to_str() else { continue };
                let pid = n
                    .strip_prefix('.')
                    .and_then(|n| n.split_once(".live.tmp."))
                    .and_then(|(_, rest)| rest.split('.').next())
                    .and_then(|p| p.parse::<u32>().ok());
                if pid.is_some_and(|p| !crate::sys::process_exists(p))
                    && fs::remove_file(ent.path()).is_ok()
                {
                    cleaned.push(format!("removed {}", ent.path().display()));
                }
            }
        }
    }
    if a.json {
        let mut o = vec![
            ("dir", Value::str(dir.display().to_string())),
            ("processes", Value::Arr(procs)),
        ];
        if a.clean {
            o.push((
                "removed",
                Value::Arr(cleaned.iter().map(|c| Value::str(c.clone())).collect()),
            ));
        }
        o.push((
            "errors",
            Value::Arr(errs.iter().map(|e| Value::str(e.clone())).collect()),
        ));
        println!("{}", Value::Obj(o));
    } else {
        for c in &cleaned {
            println!("{c}");
        }
        let head = [
            "PID", "PROGRAM", "STATUS", "FD", "LOCAL", "PEER", "VIA", "STATE", "TX", "RX", "REASON",
        ];
        let mut w = head.map(str::len);
        for r in &rows {
            for (i, c) in r.iter().enumerate() {
                w[i] = w[i].max(c.chars().count());
            }
        }
        let line = |cells: &[String]| {
            let mut s = String::new();
            for (i, c) in cells.iter().enumerate() {
                if i + 1 == cells.len() {
                    s.push_str(c);
                } else {
                    s.push_str(&format!("{c:<width$}  ", width = w[i]));
                }
            }
            println!("{}", s.trim_end());
        };
        if !rows.is_empty() || !a.clean {
            line(&head.map(String::from));
        }
        for r in &rows {
            line(r);
        }
        if rows.iter().any(|r| r[2].ends_with('*')) {
            println!("(* the record was being updated when its process stopped: its last update may be partial)");
        }
    }
    for e in &errs {
        eprintln!("rdmashim: {e}");
    }
    if errs.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// A record's counters as the stats file nests them.
fn counters_json(r: &Record) -> Vec<(&'static str, Value)> {
    let group = |g: usize| -> Vec<(String, Value)> {
        r.counters
            .iter()
            .filter(|c| c.group == g)
            .map(|c| (c.name.clone(), Value::Num(c.value)))
            .collect()
    };
    let mut out = Vec::new();
    for (g, name) in GROUPS.iter().enumerate() {
        match *name {
            "fallback_reasons" => {}
            "connections" => {
                let mut m = group(g);
                m.push(("fallback_reasons".into(), Value::Map(group(g + 1))));
                out.push((*name, Value::Map(m)));
            }
            _ => out.push((*name, Value::Map(group(g)))),
        }
    }
    out
}

fn stats_json(path: &Path, r: &Record) -> Value {
    let mut o = who_json(path, r, status_of(r));
    o.extend(counters_json(r));
    Value::Obj(o)
}

fn stats_text(path: &Path, r: &Record) -> String {
    let st = status_of(r);
    let mut s = format!(
        "pid {} ({}) {}{}, parent {}, started {} ms, last update {} ms (unix time); {}\n",
        r.pid,
        if r.program.is_empty() {
            "?"
        } else {
            &r.program
        },
        st.name(),
        if r.torn() {
            " (its last update may be partial)"
        } else {
            ""
        },
        r.ppid,
        r.started_unix_ms,
        r.heartbeat_unix_ms,
        path.display()
    );
    for (g, name) in GROUPS.iter().enumerate() {
        let nonzero: Vec<String> = r
            .counters
            .iter()
            .filter(|c| c.group == g && (c.value != 0 || g == 1 || g == 3))
            .map(|c| format!("{} {}", c.name, c.value))
            .collect();
        if !nonzero.is_empty() {
            s.push_str(&format!("  {name}: {}\n", nonzero.join(", ")));
        }
    }
    s
}

pub fn stats(a: &StatsArgs) -> ExitCode {
    let dir = match run_dir(a.dir.as_deref()) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("rdmashim: {e}");
            return ExitCode::from(1);
        }
    };
    if let Some(pid) = a.pid {
        let path = dir.join(lay::file_name(pid));
        if !path.exists() {
            eprintln!(
                "rdmashim: no live record of pid {pid} in {} (a process that exited normally removes its own; one without a TCP connection has none)",
                dir.display()
            );
            return ExitCode::from(1);
        }
        return match read_record(&path) {
            Ok(r) if r.pid == pid => {
                if a.json {
                    println!("{}", stats_json(&path, &r));
                } else {
                    print!("{}", stats_text(&path, &r));
                }
                ExitCode::SUCCESS
            }
            Ok(r) => {
                eprintln!(
                    "rdmashim: {}: the record is of pid {}, not {pid}",
                    path.display(),
                    r.pid
                );
                ExitCode::from(1)
            }
            Err(e) => {
                eprintln!("rdmashim: {e}");
                ExitCode::from(1)
            }
        };
    }
    let (recs, errs) = match read_all(&dir) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("rdmashim: {e}");
            return ExitCode::from(1);
        }
    };
    if a.json {
        println!(
            "{}",
            Value::Arr(recs.iter().map(|(p, r)| stats_json(p, r)).collect())
        );
    } else {
        for (p, r) in &recs {
            print!("{}", stats_text(p, r));
        }
    }
    for e in &errs {
        eprintln!("rdmashim: {e}");
    }
    if errs.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<std::ffi::OsString> {
        v.iter().map(Into::into).collect()
    }

    #[test]
    fn parses() {
        let a = parse_ss(&os(&["-a", "--json", "--dir", "/x"]))
            .unwrap()
            .unwrap();
        assert_eq!(
            a,
            SsArgs {
                all: true,
                json: true,
                clean: false,
                dir: Some("/x".into())
            }
        );
        assert_eq!(parse_ss(&os(&["--help"])).unwrap(), None);
        assert!(parse_ss(&os(&["--dir"])).is_err());
        assert!(parse_ss(&os(&["12"])).is_err());
        let s = parse_stats(&os(&["12", "--json"])).unwrap().unwrap();
        assert_eq!((s.pid, s.json), (Some(12), true));
        assert!(parse_stats(&os(&["12", "13"])).is_err());
        assert!(parse_stats(&os(&["x"])).is_err());
    }

    #[test]
    fn bad_files_are_named() {
        let d = std::env::temp_dir().join(format!("rdmashim-live-test-{}", std::process::id()));
        fs::create_dir_all(&d).unwrap();
        let p = d.join("1.live");
        fs::write(&p, b"hello").unwrap();
        let e = read_record(&p).unwrap_err();
        assert!(e.contains("1.live") && e.contains("bytes"), "{e}");
        fs::write(&p, vec![0u8; lay::FILE_LEN]).unwrap();
        let e = read_record(&p).unwrap_err();
        assert!(e.contains("1.live") && e.contains("magic"), "{e}");
        let (recs, errs) = read_all(&d).unwrap();
        assert!(recs.is_empty());
        assert_eq!(errs.len(), 1);
        // A good one, with a torn update under way.
        let mut b = vec![0u8; lay::FILE_LEN];
        let id = lay::Identity {
            pid: 2,
            ppid: 1,
            started_unix_ms: 1,
            proc_start_ticks: 0,
            program: b"p",
            version: "v",
        };
        lay::init(&mut b, &id, [(0, "read"), (1, "upgraded")].into_iter());
        lay::put_u64(&mut b, lay::SEQ_OFF, 5);
        fs::write(d.join("2.live"), &b).unwrap();
        let (recs, _) = read_all(&d).unwrap();
        assert_eq!(recs.len(), 1);
        assert!(recs[0].1.torn());
        let v = stats_json(&recs[0].0, &recs[0].1).to_string();
        assert!(v.contains(r#""calls":{"read":0}"#), "{v}");
        assert!(
            v.contains(r#""connections":{"upgraded":0,"fallback_reasons":{}}"#),
            "{v}"
        );
        // Planted links and FIFOs are refused, by name.
        std::os::unix::fs::symlink("/etc/hostname", d.join("3.live")).unwrap();
        let e = read_record(&d.join("3.live")).unwrap_err();
        assert!(e.contains("3.live"), "{e}");
        assert!(std::process::Command::new("mkfifo")
            .arg(d.join("4.live"))
            .status()
            .unwrap()
            .success());
        let e = read_record(&d.join("4.live")).unwrap_err();
        assert!(
            e.contains("4.live") && e.contains("not a regular file"),
            "{e}"
        );
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn dead_is_gone_or_another_process() {
        let mut b = vec![0u8; lay::FILE_LEN];
        let me = std::process::id();
        let ticks = lay::stat_start_ticks(&fs::read("/proc/self/stat").unwrap()).unwrap();
        let record = |b: &mut Vec<u8>, pid, ticks| {
            let id = lay::Identity {
                pid,
                ppid: 1,
                started_unix_ms: 1,
                proc_start_ticks: ticks,
                program: b"p",
                version: "v",
            };
            lay::init(b, &id, std::iter::empty());
            lay::decode(b).unwrap()
        };
        assert_eq!(status_of(&record(&mut b, me, ticks)), Status::Running);
        assert_eq!(
            status_of(&record(&mut b, me, 0)),
            Status::Running,
            "unknown: alive"
        );
        // The pid runs, but it is not the process that made the record.
        assert_eq!(status_of(&record(&mut b, me, ticks + 1)), Status::Dead);
        assert_eq!(status_of(&record(&mut b, 0, 0)), Status::Dead);
        assert_eq!(status_of(&record(&mut b, u32::MAX, 0)), Status::Dead);
        lay::put_u32(&mut b, lay::STATE_OFF, RecordState::Ended as u32);
        assert_eq!(status_of(&lay::decode(&b).unwrap()), Status::Ended);
    }
}
