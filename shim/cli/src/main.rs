//! `rdmashim`: run a program under the shim, or diagnose the host.
//!
//! ```text
//! rdmashim run [OPTIONS] [--] PROGRAM [ARGS...]
//! rdmashim doctor [--json] [--program PROG]
//! rdmashim ss [-a] [--json] [--clean] [--dir DIR]
//! rdmashim stats [PID] [--json] [--dir DIR]
//! rdmashim --help | --version
//! ```
#![deny(unsafe_code)]

mod doctor;
mod elf;
#[path = "../../../rdma-core/src/huge.rs"]
#[allow(dead_code)]
mod huge;
mod json;
mod live;
#[path = "../../src/live_layout.rs"]
#[allow(dead_code)]
mod live_layout;
mod program;
#[path = "../../src/reason.rs"]
#[allow(dead_code)]
mod reason;
#[path = "../../src/rules.rs"]
#[allow(dead_code)]
mod rules;
#[path = "../../src/settings.rs"]
#[allow(dead_code)]
mod settings;
mod sys;

use settings::{DIAL_DELAY_MS, NEGATIVE_CACHE_SECS, RING_IDLE_SECS, RING_KIB, SPIN_US};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The workspace's version.
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// `rdmashim run --help`.
const RUN_USAGE: &str = "  rdmashim run [--stats PATH] [--log LEVEL] [--log-file PATH] [--config FILE|--no-config] [--disable] [--local|--no-local] [--lib PATH] [--] PROGRAM [ARGS...]
      Runs PROGRAM with librdmashim.so preloaded (appended to any existing LD_PRELOAD).
      --stats PATH     write the stats JSON at exit (RDMASHIM_STATS; %p becomes the pid)
      --log LEVEL      error|warn|info|debug|off (RDMASHIM_LOG)
      --log-file PATH  log to PATH instead of stderr (RDMASHIM_LOG_FILE)
      --config FILE    read settings and rules from FILE instead of /etc/rdmashim.conf
                       (RDMASHIM_CONFIG); --no-config: from no file (RDMASHIM_CONFIG=none)
      --disable        never upgrade (RDMASHIM_DISABLE=1)
      --no-local       keep connections between processes of this host on TCP
                       (RDMASHIM_LOCAL=0); --local moves them to shared memory (the default)
      --lib PATH       the library to preload (default: $RDMASHIM_LIB, next to this
                       executable, or installed); it must be librdmashim.so
      Exit status: PROGRAM's; 127 if PROGRAM or the library cannot be found (or the file
      given is not the library), 126 if PROGRAM cannot be executed, 2 for a usage error.
";

/// `rdmashim doctor --help`.
const DOCTOR_USAGE: &str = "  rdmashim doctor [--json] [--program PROG]
      RDMA devices, libraries, the memory the rings pin against RLIMIT_MEMLOCK, the
      configuration file and its rules, and what would happen to a connection made now,
      judged by the shim's own rules from the file and this environment's RDMASHIM_*
      variables.
      --json           one JSON object instead of the report
      --program PROG   judge the file's program rules for PROG (a name, found through
                       PATH, or a path): the verdict says if they deny it
      Exit status: 0 if connections can be upgraded (over RDMA, or at least between
      processes of this host over shared memory); 1 if every connection will stay on TCP;
      2 for a usage error.
";

/// The whole usage text: both commands, and every variable the shim reads with its default
/// (the numbers' ranges and defaults come from the shim's own table, settings.rs).
fn usage() -> String {
    let num = |n: &settings::Number| format!("{} to {}, default {}", n.min, n.max, n.default);
    format!(
        "usage:\n{RUN_USAGE}{DOCTOR_USAGE}{ss}{stats}  rdmashim --help | --version
      This text, or the version (-h, -V); `rdmashim COMMAND --help` for one command's.

The shim reads its configuration file, {default} (rdmashim.conf(5): every variable
below is a key there, in lower case without RDMASHIM_, plus allow/deny rules), then these
variables, which override the file (each value is checked: a boolean is 1/0, true/false,
yes/no or on/off in any case; anything else gets one warning and the default):
  RDMASHIM_CONFIG=FILE          the configuration file (empty or none: no file)
  RDMASHIM_DISABLE=BOOL         never upgrade (default off)
  RDMASHIM_LOCAL=BOOL           connections between processes of this host move to
                                shared-memory rings (default on)
  RDMASHIM_LOG=LEVEL            error|warn|info|debug|off (default warn)
  RDMASHIM_LOG_FILE=PATH        append log lines there, %p = pid (default stderr)
  RDMASHIM_STATS=PATH           write the stats JSON there at exit, %p = pid (default none)
  RDMASHIM_RING_KIB=N           the largest receive ring of an upgraded connection, KiB,
                                rounded up to a power of two ({ring}; over RDMA rings start
                                at 16 KiB and grow when the traffic needs it)
  RDMASHIM_DIAL_DELAY_MS=N      how long a client waits before it upgrades ({dial})
  RDMASHIM_SPIN_US=N            longest busy-poll of a blocked call ({spin})
  RDMASHIM_PINNED_MIB=N         most memory the process's RDMA rings may pin, MiB; past it
                                connections stay TCP (default 0: a quarter of the host's)
  RDMASHIM_ACK_TIMEOUT=N        ACK timeout of a connection's queue pair, 4.096 us x 2^N a
                                try, seven tries (0 to 31; default 0: rdma_cm's on a NIC, 20
                                on a software device such as soft-RoCE)
  RDMASHIM_RING_IDLE_SECS=N     a grown ring is given back after this long without traffic
                                ({idle}; 0: never)
  RDMASHIM_HUGE_PAGES=BOOL      rings of 2 MiB and more take the host's free huge pages
                                (default on)
  RDMASHIM_KIND=KIND            how upgraded connections carry bytes when the peer asks for
                                the same: imm (RDMA WRITE WITH IMMEDIATE), sends (SENDs
                                into posted receives, copied into the ring), srq (sends,
                                the receives in a shared receive queue), read (the
                                receiver pulls with RDMA READs) or duplex (credits ride
                                on the other direction's DATA; default imm)
  RDMASHIM_NEGATIVE_CACHE_SECS=N  how long a peer whose upgrade failed is not tried again
                                ({neg_min} to {neg_max}, 0: always tried; default unset: 60 s
                                after a reject, 10 min after silence)
  RDMASHIM_TRACE                set: trace lines of the upgrade (default unset)
  RDMASHIM_LIVE=BOOL            keep a live record for `rdmashim ss` and `stats` (default on)
  RDMASHIM_RUN_DIR=DIR          where live records go (default: /run/rdmashim if writable,
                                else $XDG_RUNTIME_DIR/rdmashim, else /tmp/rdmashim-UID)
  RDMASHIM_FAULT=POINT:N        tests only: fail on purpose (default unset)
The launcher reads RDMASHIM_LIB=PATH: the library, unless --lib is given.
",
        default = settings::DEFAULT_CONFIG,
        ss = live::SS_USAGE,
        stats = live::STATS_USAGE,
        ring = num(&RING_KIB),
        dial = num(&DIAL_DELAY_MS),
        spin = num(&SPIN_US),
        idle = num(&RING_IDLE_SECS),
        neg_min = NEGATIVE_CACHE_SECS.min,
        neg_max = NEGATIVE_CACHE_SECS.max,
    )
}

/// Name of the preload library.
pub const LIB_NAME: &str = "librdmashim.so";

/// Parsed `run` options.
#[derive(Debug, Default, PartialEq, Eq)]
struct RunOpts {
    /// `--config FILE` / `--no-config` (`none`): RDMASHIM_CONFIG.
    config: Option<OsString>,
    stats: Option<OsString>,
    log: Option<String>,
    log_file: Option<OsString>,
    disable: bool,
    /// `--local` / `--no-local`: RDMASHIM_LOCAL (unset: the environment's, or the default).
    local: Option<bool>,
    lib: Option<PathBuf>,
    program: Vec<OsString>,
}

/// What `rdmashim run ARGS` asks for.
#[derive(Debug, PartialEq, Eq)]
enum Run {
    Program(RunOpts),
    Help,
}

fn parse_run(args: &[OsString]) -> Result<Run, String> {
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
            Some("--config") => {
                let v = value(&mut i, "--config")?;
                if v.is_empty() {
                    return Err("--config: an empty FILE (--no-config reads none)".into());
                }
                o.config = Some(v)
            }
            Some("--no-config") => o.config = Some("none".into()),
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
            Some("-h" | "--help") => return Ok(Run::Help),
            Some(s) if s.starts_with("--") => return Err(format!("unknown option {s}")),
            _ => break,
        }
        i += 1;
    }
    o.program = args.get(i..).unwrap_or(&[]).to_vec();
    if o.program.is_empty() {
        return Err("run: no PROGRAM given".into());
    }
    Ok(Run::Program(o))
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

/// A symbol only the shim defines (the Rust half of its `syscall` hook, which its C entry
/// point calls): how a file is known to be librdmashim.so without loading it.
const SHIM_SYMBOL: &[u8] = b"rdmashim_syscall";

/// Whether `path` is the shim library: an ELF shared object whose dynamic symbols include
/// [`SHIM_SYMBOL`]. Read, not loaded (loading would run its constructors here).
fn check_lib(path: &Path) -> Result<(), String> {
    let f = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let not = |what: &str| format!("{} is not {LIB_NAME}: {what}", path.display());
    let mut e = elf::Elf::read(f).ok_or_else(|| not("it is not an ELF file"))?;
    if e.kind != elf::ET_DYN {
        return Err(not("it is not a shared object"));
    }
    match e.defines(SHIM_SYMBOL) {
        Some(true) => Ok(()),
        Some(false) => Err(not(&format!(
            "it is a shared object, but not the shim (it does not define {})",
            String::from_utf8_lossy(SHIM_SYMBOL)
        ))),
        None => Err(not("it is a shared object without a dynamic symbol table")),
    }
}

/// The library to preload (absolute): `explicit` (`--lib`), else the first candidate that
/// exists; either way checked to be the shim.
pub fn find_lib(explicit: Option<&Path>) -> Result<PathBuf, String> {
    let found = match explicit {
        Some(p) => p
            .canonicalize()
            .map_err(|e| format!("--lib {}: {e}", p.display()))?,
        None => {
            let exe = std::env::current_exe().ok();
            let cands = lib_candidates(exe.as_deref());
            cands
                .iter()
                .find_map(|c| c.is_file().then(|| c.canonicalize().ok()).flatten())
                .ok_or_else(|| {
                    let list: Vec<_> = cands.iter().map(|c| c.display().to_string()).collect();
                    format!("{LIB_NAME} not found (looked in: {}); build it with `cargo build -p rdmashim-shim` or pass --lib", list.join(", "))
                })?
        }
    };
    check_lib(&found)?;
    Ok(found)
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
        Ok(Run::Program(o)) => o,
        Ok(Run::Help) => {
            print!("usage:\n{RUN_USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprint!("rdmashim: {e}\nusage:\n{RUN_USAGE}");
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
    if let Some(c) = &o.config {
        cmd.env(settings::ENV_CONFIG, c);
    }
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
        Some("doctor") => match doctor::parse(&args[1..]) {
            Ok(doctor::Args::Report { json, program }) => doctor::doctor(json, program.as_ref()),
            Ok(doctor::Args::Help) => {
                print!("usage:\n{DOCTOR_USAGE}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprint!("rdmashim: {e}\nusage:\n{DOCTOR_USAGE}");
                ExitCode::from(2)
            }
        },
        Some("ss") => match live::parse_ss(&args[1..]) {
            Ok(Some(a)) => live::ss(&a),
            Ok(None) => {
                print!("usage:\n{}", live::SS_USAGE);
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprint!("rdmashim: {e}\nusage:\n{}", live::SS_USAGE);
                ExitCode::from(2)
            }
        },
        Some("stats") => match live::parse_stats(&args[1..]) {
            Ok(Some(a)) => live::stats(&a),
            Ok(None) => {
                print!("usage:\n{}", live::STATS_USAGE);
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprint!("rdmashim: {e}\nusage:\n{}", live::STATS_USAGE);
                ExitCode::from(2)
            }
        },
        Some("-h" | "--help" | "help") => {
            print!("{}", usage());
            ExitCode::SUCCESS
        }
        Some("-V" | "--version") => {
            println!("rdmashim {VERSION}");
            ExitCode::SUCCESS
        }
        Some(other) => {
            eprint!("rdmashim: unknown command {other:?}\n{}", usage());
            ExitCode::from(2)
        }
        None => {
            eprint!("{}", usage());
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

    fn program(args: &[&str]) -> Result<RunOpts, String> {
        match parse_run(&os(args))? {
            Run::Program(o) => Ok(o),
            Run::Help => Err("help".into()),
        }
    }

    #[test]
    fn parses_run() {
        let o = program(&[
            "--stats",
            "/tmp/s.%p",
            "--log",
            "debug",
            "--disable",
            "--",
            "ls",
            "-l",
        ])
        .unwrap();
        assert_eq!(o.stats.as_deref(), Some(OsStr::new("/tmp/s.%p")));
        assert_eq!(o.log.as_deref(), Some("debug"));
        assert!(o.disable);
        assert_eq!(o.local, None);
        assert_eq!(o.program, os(&["ls", "-l"]));
        assert_eq!(program(&["--local", "ls"]).unwrap().local, Some(true));
        assert_eq!(program(&["--no-local", "ls"]).unwrap().local, Some(false));
        assert_eq!(
            program(&["--config", "/x.conf", "ls"])
                .unwrap()
                .config
                .as_deref(),
            Some(OsStr::new("/x.conf"))
        );
        assert_eq!(
            program(&["--no-config", "ls"]).unwrap().config.as_deref(),
            Some(OsStr::new("none"))
        );
        assert!(program(&["--config", "", "ls"]).is_err());
        assert!(program(&["--config"]).is_err());
        // Options after PROGRAM belong to it (its own --help too).
        let o = program(&["curl", "--stats", "x", "--help"]).unwrap();
        assert_eq!(o.program, os(&["curl", "--stats", "x", "--help"]));
        assert!(program(&["--log", "loud", "ls"]).is_err());
        assert!(program(&["--stats"]).is_err());
        assert!(program(&["--"]).is_err());
        assert!(program(&["--bogus", "ls"]).is_err());
    }

    #[test]
    fn run_help_before_the_program() {
        for args in [
            &["--help"][..],
            &["-h"],
            &["--log", "debug", "--help", "ls"],
        ] {
            assert_eq!(parse_run(&os(args)), Ok(Run::Help), "{args:?}");
        }
        // (after `--`, a program named --help)
        assert_eq!(program(&["--", "--help"]).unwrap().program, os(&["--help"]));
    }

    /// Every variable the shim's settings name is in the usage text, with its default.
    #[test]
    fn usage_lists_every_variable() {
        let text = usage();
        let source = include_str!("../../src/settings.rs");
        let mut names: Vec<&str> = source
            .match_indices("\"RDMASHIM_")
            .map(|(i, _)| {
                let rest = &source[i + 1..];
                let end = rest.find(|c: char| !(c.is_ascii_uppercase() || c == '_'));
                &rest[..end.unwrap_or(rest.len())]
            })
            .collect();
        names.sort();
        names.dedup();
        assert!(names.len() >= 11, "{names:?}");
        for n in names {
            assert!(
                text.contains(&format!("  {n}")),
                "{n} missing from the usage"
            );
        }
        for n in [RING_KIB, DIAL_DELAY_MS, SPIN_US, RING_IDLE_SECS] {
            assert!(
                text.contains(&format!("{} to {}, default {}", n.min, n.max, n.default)),
                "{}",
                n.name
            );
        }
    }

    #[test]
    fn only_the_shim_passes_as_the_library() {
        let dir = std::env::temp_dir();
        let write = |name: &str, bytes: &[u8]| {
            let p = dir.join(format!("rdmashim-lib-{}-{name}", std::process::id()));
            std::fs::write(&p, bytes).unwrap();
            p
        };
        let sections = [".text", ".dynsym", ".dynstr"];
        let shim = write(
            "shim.so",
            &elf::tests::elf(elf::ET_DYN, 1, &sections, &["socket", "rdmashim_syscall"]),
        );
        assert_eq!(check_lib(&shim), Ok(()));
        let other = write(
            "other.so",
            &elf::tests::elf(elf::ET_DYN, 1, &sections, &["socket"]),
        );
        let e = check_lib(&other).unwrap_err();
        assert!(e.contains("not the shim"), "{e}");
        let exe = write(
            "exe",
            &elf::tests::elf(elf::ET_EXEC, 1, &sections, &["rdmashim_syscall"]),
        );
        assert!(check_lib(&exe).unwrap_err().contains("not a shared object"));
        let text = write("text", b"localhost\n");
        assert!(check_lib(&text).unwrap_err().contains("not an ELF file"));
        assert!(check_lib(&dir.join("rdmashim-no-such-file")).is_err());
        for p in [shim, other, exe, text] {
            let _ = std::fs::remove_file(p);
        }
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

    /// The Debian package (scripts/package) puts the library at
    /// /usr/lib/rdmashim/librdmashim.so and the launcher at /usr/bin/rdmashim: found there
    /// from the launcher's own place first (`../lib/rdmashim`), and at that fixed path
    /// wherever the launcher was copied to.
    #[test]
    fn candidates_include_the_package_path() {
        let package = Path::new("/usr/lib/rdmashim/librdmashim.so");
        // (lexically: `..` removed with the component before it)
        let plain = |p: &Path| {
            let mut v = PathBuf::new();
            for c in p.components() {
                match c {
                    std::path::Component::ParentDir => {
                        v.pop();
                    }
                    c => v.push(c),
                }
            }
            v
        };
        let installed = lib_candidates(Some(Path::new("/usr/bin/rdmashim")));
        let elsewhere = lib_candidates(Some(Path::new("/opt/tools/rdmashim")));
        let at = |c: &[PathBuf]| c.iter().position(|p| plain(p) == package);
        let env = usize::from(std::env::var_os("RDMASHIM_LIB").is_some());
        assert_eq!(at(&installed), Some(env + 1), "{installed:?}");
        assert!(at(&elsewhere).is_some(), "{elsewhere:?}");
    }

    #[test]
    fn candidates_start_next_to_exe() {
        let c = lib_candidates(Some(Path::new("/t/debug/rdmashim")));
        let first_non_env = c.iter().find(|p| p.starts_with("/t")).unwrap();
        assert_eq!(first_non_env, Path::new("/t/debug/librdmashim.so"));
    }
}
