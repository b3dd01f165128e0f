//! `rdmashim`: run a program under the shim, or diagnose the host.
//!
//! ```text
//! rdmashim run [--stats PATH] [--log LEVEL] [--log-file PATH] [--disable] [--lib PATH] [--] PROGRAM [ARGS...]
//! rdmashim doctor
//! ```
#![deny(unsafe_code)]

mod doctor;
mod program;
#[path = "../../src/reason.rs"]
#[allow(dead_code)]
mod reason;
mod sys;

use std::ffi::{OsStr, OsString};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

const USAGE: &str = "\
usage:
  rdmashim run [--stats PATH] [--log LEVEL] [--log-file PATH] [--disable] [--local|--no-local] [--lib PATH] [--] PROGRAM [ARGS...]
      Runs PROGRAM with librdmashim.so preloaded (appended to any existing LD_PRELOAD).
      --stats PATH     write the stats JSON at exit (RDMASHIM_STATS; %p becomes the pid)
      --log LEVEL      error|warn|info|debug (RDMASHIM_LOG)
      --log-file PATH  log to PATH instead of stderr (RDMASHIM_LOG_FILE)
      --disable        never upgrade (RDMASHIM_DISABLE=1)
      --no-local       keep connections between processes of this host on TCP
                       (RDMASHIM_LOCAL=0); --local moves them to shared memory (the default)
      --lib PATH       the library to preload (default: next to this executable, or installed)
  rdmashim doctor
      RDMA devices, libraries, memlock limit, and what would happen to a connection made now.
";

/// Name of the preload library.
pub const LIB_NAME: &str = "librdmashim.so";

/// Parsed `run` options.
#[derive(Debug, Default, PartialEq, Eq)]
struct RunOpts {
    stats: Option<OsString>,
    log: Option<String>,
    log_file: Option<OsString>,
    disable: bool,
    /// `--local` / `--no-local`: RDMASHIM_LOCAL (unset: the environment's, or the default).
    local: Option<bool>,
    lib: Option<PathBuf>,
    program: Vec<OsString>,
}

fn parse_run(args: &[OsString]) -> Result<RunOpts, String> {
    let mut o = RunOpts::default();
    let mut i = 0;
    let value = |i: &mut usize, name: &str| -> Result<OsString, String> {
        *i += 1;
        args.get(*i)
            .cloned()
            .ok_or_else(|| format!("{name} needs a value"))
    };
    while i < args.len() {
        let a = &args[i];
        match a.to_str() {
            Some("--") => {
                i += 1;
                break;
            }
            Some("--stats") => o.stats = Some(value(&mut i, "--stats")?),
            Some("--log") => {
                let v = value(&mut i, "--log")?;
                let v = v.to_str().ok_or("--log: not UTF-8")?.to_string();
                if !["off", "error", "warn", "info", "debug"].contains(&v.as_str()) {
                    return Err(format!(
                        "--log: unknown level {v:?} (error|warn|info|debug|off)"
                    ));
                }
                o.log = Some(v);
            }
            Some("--log-file") => o.log_file = Some(value(&mut i, "--log-file")?),
            Some("--lib") => o.lib = Some(PathBuf::from(value(&mut i, "--lib")?)),
            Some("--disable") => o.disable = true,
            Some("--local") => o.local = Some(true),
            Some("--no-local") => o.local = Some(false),
            Some(s) if s.starts_with("--") => return Err(format!("unknown option {s}")),
            _ => break,
        }
        i += 1;
    }
    o.program = args.get(i..).unwrap_or(&[]).to_vec();
    if o.program.is_empty() {
        return Err("run: no PROGRAM given".into());
    }
    Ok(o)
}

/// Where to look for the library, in order.
fn lib_candidates(exe: Option<&Path>) -> Vec<PathBuf> {
    let mut v = vec![];
    if let Some(p) = std::env::var_os("RDMASHIM_LIB") {
        v.push(PathBuf::from(p));
    }
    if let Some(dir) = exe.and_then(Path::parent) {
        v.push(dir.join(LIB_NAME)); // target/{debug,release}
        v.push(dir.join("../lib/rdmashim").join(LIB_NAME)); // PREFIX/bin -> PREFIX/lib/rdmashim
        v.push(dir.join("../lib").join(LIB_NAME));
    }
    for p in [
        "/usr/local/lib/rdmashim",
        "/usr/lib/rdmashim",
        "/usr/local/lib",
        "/usr/lib",
    ] {
        v.push(Path::new(p).join(LIB_NAME));
    }
    v
}

/// The library to preload (absolute).
pub fn find_lib(explicit: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(p) = explicit {
        return p
            .canonicalize()
            .map_err(|e| format!("--lib {}: {e}", p.display()));
    }
    let exe = std::env::current_exe().ok();
    let cands = lib_candidates(exe.as_deref());
    cands
        .iter()
        .find_map(|c| c.is_file().then(|| c.canonicalize().ok()).flatten())
        .ok_or_else(|| {
            let list: Vec<_> = cands.iter().map(|c| c.display().to_string()).collect();
            format!("{LIB_NAME} not found (looked in: {}); build it with `cargo build -p rdmashim-shim` or pass --lib", list.join(", "))
        })
}

/// LD_PRELOAD with `lib` appended to `existing` (unless already there).
fn compose_preload(existing: Option<&OsStr>, lib: &Path) -> OsString {
    let lib = lib.as_os_str();
    match existing.filter(|e| !e.is_empty()) {
        None => lib.to_os_string(),
        Some(e) => {
            let already = e
                .to_str()
                .map(|s| s.split([':', ' ']).any(|p| Path::new(p) == Path::new(lib)))
                .unwrap_or(false);
            if already {
                e.to_os_string()
            } else {
                let mut v = e.to_os_string();
                v.push(":");
                v.push(lib);
                v
            }
        }
    }
}

fn run(args: &[OsString]) -> ExitCode {
    let o = match parse_run(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("rdmashim: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let lib = match find_lib(o.lib.as_deref()) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("rdmashim: {e}");
            return ExitCode::from(127);
        }
    };
    // A program the loader will not put the shim into is named now (not silently left on
    // TCP); it runs all the same.
    let path = std::env::var_os("PATH");
    if o.log.as_deref() != Some("off") {
        if let Some(file) = program::resolve(&o.program[0], path.as_deref()) {
            let (uid, gid) = sys::real_ids();
            if let Some(why) = program::judge(&file, path.as_deref(), uid, gid) {
                eprintln!(
                    "rdmashim: warning: {} {}",
                    Path::new(&o.program[0]).display(),
                    why.explain()
                );
            }
        }
    }
    let mut cmd = std::process::Command::new(&o.program[0]);
    cmd.args(&o.program[1..]);
    cmd.env(
        "LD_PRELOAD",
        compose_preload(std::env::var_os("LD_PRELOAD").as_deref(), &lib),
    );
    if let Some(s) = &o.stats {
        cmd.env("RDMASHIM_STATS", s);
    }
    if let Some(l) = &o.log {
        cmd.env("RDMASHIM_LOG", l);
    }
    if let Some(f) = &o.log_file {
        cmd.env("RDMASHIM_LOG_FILE", f);
    }
    if o.disable {
        cmd.env("RDMASHIM_DISABLE", "1");
    }
    if let Some(l) = o.local {
        cmd.env("RDMASHIM_LOCAL", if l { "1" } else { "0" });
    }
    // exec: on success this never returns, and the program's exit status is ours.
    let err = cmd.exec();
    eprintln!(
        "rdmashim: cannot execute {}: {err}",
        Path::new(&o.program[0]).display()
    );
    ExitCode::from(if err.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    })
}

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    match args.first().and_then(|a| a.to_str()) {
        Some("run") => run(&args[1..]),
        Some("doctor") => doctor::doctor(),
        Some("-h" | "--help" | "help") => {
            print!("{USAGE}");
            ExitCode::SUCCESS
        }
        _ => {
            eprint!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn parses_run() {
        let o = parse_run(&os(&[
            "--stats",
            "/tmp/s.%p",
            "--log",
            "debug",
            "--disable",
            "--",
            "ls",
            "-l",
        ]))
        .unwrap();
        assert_eq!(o.stats.as_deref(), Some(OsStr::new("/tmp/s.%p")));
        assert_eq!(o.log.as_deref(), Some("debug"));
        assert!(o.disable);
        assert_eq!(o.local, None);
        assert_eq!(o.program, os(&["ls", "-l"]));
        assert_eq!(
            parse_run(&os(&["--local", "ls"])).unwrap().local,
            Some(true)
        );
        assert_eq!(
            parse_run(&os(&["--no-local", "ls"])).unwrap().local,
            Some(false)
        );
        // Options after PROGRAM belong to it.
        let o = parse_run(&os(&["curl", "--stats", "x"])).unwrap();
        assert_eq!(o.program, os(&["curl", "--stats", "x"]));
        assert!(parse_run(&os(&["--log", "loud", "ls"])).is_err());
        assert!(parse_run(&os(&["--stats"])).is_err());
        assert!(parse_run(&os(&["--"])).is_err());
        assert!(parse_run(&os(&["--bogus", "ls"])).is_err());
    }

    #[test]
    fn preload_composition() {
        let lib = Path::new("/x/librdmashim.so");
        assert_eq!(compose_preload(None, lib), "/x/librdmashim.so");
        assert_eq!(
            compose_preload(Some(OsStr::new("")), lib),
            "/x/librdmashim.so"
        );
        assert_eq!(
            compose_preload(Some(OsStr::new("/a.so")), lib),
            "/a.so:/x/librdmashim.so"
        );
        assert_eq!(
            compose_preload(Some(OsStr::new("/a.so /x/librdmashim.so")), lib),
            "/a.so /x/librdmashim.so"
        );
    }

    #[test]
    fn candidates_start_next_to_exe() {
        let c = lib_candidates(Some(Path::new("/t/debug/rdmashim")));
        let first_non_env = c.iter().find(|p| p.starts_with("/t")).unwrap();
        assert_eq!(first_non_env, Path::new("/t/debug/librdmashim.so"));
    }
}
