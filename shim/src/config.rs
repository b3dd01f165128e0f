//! Configuration from the environment, read once (by the constructor, or by whichever shim slow
//! path needs it first). Hooks never read it on the pass-through path.
//!
//! | variable | meaning |
//! |---|---|
//! | `RDMASHIM_DISABLE=1` | never upgrade (connections are counted with reason `disabled`) |
//! | `RDMASHIM_LOG=error\|warn\|info\|debug\|off` | log level (default `warn`) |
//! | `RDMASHIM_LOG_FILE=PATH` | append log lines to PATH (default: stderr); `%p` becomes the pid |
//! | `RDMASHIM_STATS=PATH` | write the stats JSON to PATH at exit; `%p` becomes the pid |
//!
//! Under secure execution (`AT_SECURE` in the auxiliary vector: a setuid or setgid program, or
//! one with file capabilities, started by a less privileged user) the environment is the
//! caller's, not the program's: the shim then takes no setting and no path from it at all
//! ([`setting`] answers `None` for every variable) and runs with the defaults — logs to stderr,
//! no stats file. (glibc's loader itself ignores `LD_PRELOAD` entries with a slash for such
//! programs and loads others only from the system's library directories, and only if the
//! library is set-user-ID: the shim reaches them only through `/etc/ld.so.preload` or such an
//! installation.)

use crate::fmtbuf::FixedBuf;
use core::fmt::Write;
use std::sync::OnceLock;

/// Log levels, in increasing verbosity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Off = 0,
    Error = 1,
    Warn = 2,
    Info = 3,
    Debug = 4,
}

impl Level {
    pub fn parse(s: &[u8]) -> Option<Level> {
        Some(match s {
            b"off" | b"none" | b"0" => Level::Off,
            b"error" => Level::Error,
            b"warn" | b"warning" => Level::Warn,
            b"info" => Level::Info,
            b"debug" | b"trace" => Level::Debug,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Level::Off => "off",
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
        }
    }
}

/// The parsed configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub disabled: bool,
    pub log_level: Level,
    /// Log file path pattern (may contain `%p`); `None` means stderr.
    pub log_file: Option<Vec<u8>>,
    /// Stats path pattern (may contain `%p`); `None` means no stats file.
    pub stats_path: Option<Vec<u8>>,
    /// `RDMASHIM_LOG` was set to something unknown (reported once at init).
    pub bad_log_level: bool,
    /// Secure execution: the environment was not read.
    pub secure: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            disabled: false,
            log_level: Level::Warn,
            log_file: None,
            stats_path: None,
            bad_log_level: false,
            secure: false,
        }
    }
}

/// Environment variable names.
pub const ENV_DISABLE: &str = "RDMASHIM_DISABLE";
pub const ENV_LOG: &str = "RDMASHIM_LOG";
pub const ENV_LOG_FILE: &str = "RDMASHIM_LOG_FILE";
pub const ENV_STATS: &str = "RDMASHIM_STATS";

impl Config {
    /// Parses the configuration from a variable lookup.
    pub fn from_lookup(get: impl Fn(&str) -> Option<Vec<u8>>) -> Config {
        let mut c = Config::default();
        if let Some(v) = get(ENV_DISABLE) {
            c.disabled = !matches!(v.as_slice(), b"" | b"0" | b"false" | b"no" | b"off");
        }
        if let Some(v) = get(ENV_LOG) {
            match Level::parse(v.to_ascii_lowercase().as_slice()) {
                Some(l) => c.log_level = l,
                None => c.bad_log_level = true,
            }
        }
        c.log_file = get(ENV_LOG_FILE).filter(|v| !v.is_empty() && !v.contains(&0));
        c.stats_path = get(ENV_STATS).filter(|v| !v.is_empty() && !v.contains(&0));
        c
    }

    fn from_env() -> Config {
        if secure_execution() {
            return Config {
                secure: true,
                ..Config::default()
            };
        }
        use std::os::unix::ffi::OsStringExt;
        Config::from_lookup(|k| std::env::var_os(k).map(|v| v.into_vec()))
    }
}

/// Whether the process runs under secure execution (`getauxval(AT_SECURE)`).
fn secure_execution() -> bool {
    static SECURE: OnceLock<bool> = OnceLock::new();
    *SECURE.get_or_init(crate::sys::secure_execution)
}

/// The value of the shim's environment variable `name` — the one way the shim reads its
/// environment — or `None` if unset, or under secure execution.
pub fn setting(name: &str) -> Option<std::ffi::OsString> {
    if secure_execution() {
        return None;
    }
    std::env::var_os(name)
}

static CONFIG: OnceLock<Config> = OnceLock::new();

/// The process configuration (parsed on first use).
pub fn get() -> &'static Config {
    CONFIG.get_or_init(Config::from_env)
}

/// Expands `%p` (pid) and `%%` in a path pattern into `out`, NUL-terminated. Returns false if it
/// does not fit.
pub fn expand_path<const N: usize>(pattern: &[u8], pid: u32, out: &mut FixedBuf<N>) -> bool {
    out.clear();
    let mut it = pattern.iter().copied().peekable();
    while let Some(b) = it.next() {
        if b == b'%' {
            match it.peek() {
                Some(b'p') => {
                    it.next();
                    let _ = write!(out, "{pid}");
                    continue;
                }
                Some(b'%') => {
                    it.next();
                    out.push_bytes(b"%");
                    continue;
                }
                _ => {}
            }
        }
        out.push_bytes(&[b]);
    }
    out.push_bytes(b"\0");
    !out.overflowed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(vars: &[(&str, &str)]) -> Config {
        let m: HashMap<String, Vec<u8>> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect();
        Config::from_lookup(|k| m.get(k).cloned())
    }

    #[test]
    fn parses() {
        assert_eq!(cfg(&[]), Config::default());
        let c = cfg(&[
            ("RDMASHIM_DISABLE", "1"),
            ("RDMASHIM_LOG", "DEBUG"),
            ("RDMASHIM_STATS", "/tmp/s.%p.json"),
            ("RDMASHIM_LOG_FILE", "/tmp/l"),
        ]);
        assert!(c.disabled);
        assert_eq!(c.log_level, Level::Debug);
        assert_eq!(c.stats_path.as_deref(), Some(&b"/tmp/s.%p.json"[..]));
        assert_eq!(c.log_file.as_deref(), Some(&b"/tmp/l"[..]));
        assert!(!cfg(&[("RDMASHIM_DISABLE", "0")]).disabled);
        assert!(!cfg(&[("RDMASHIM_DISABLE", "")]).disabled);
        let bad = cfg(&[("RDMASHIM_LOG", "loud")]);
        assert!(bad.bad_log_level);
        assert_eq!(bad.log_level, Level::Warn);
        assert_eq!(cfg(&[("RDMASHIM_STATS", "")]).stats_path, None);
    }

    #[test]
    fn expands_pid() {
        let mut b = FixedBuf::<64>::new();
        assert!(expand_path(b"/tmp/s.%p.json", 42, &mut b));
        assert_eq!(b.as_bytes(), b"/tmp/s.42.json\0");
        assert!(expand_path(b"a%%p%q%", 7, &mut b));
        assert_eq!(b.as_bytes(), b"a%p%q%\0");
        let mut small = FixedBuf::<4>::new();
        assert!(!expand_path(b"/tmp/x", 1, &mut small));
    }
}
