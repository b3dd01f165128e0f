//! How the shim reads its `RDMASHIM_*` variables: the values accepted, the defaults, and the
//! warning each value that is not accepted gets (config.rs reads the environment once and
//! keeps the result; the table of variables is there).
//!
//! This file is also compiled into the `rdmashim` launcher (`#[path]` module), so that
//! `rdmashim doctor` judges the environment by the very rules the library will apply: it is
//! plain safe Rust with no dependencies.
#![forbid(unsafe_code)]

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

/// The parsed configuration: every `RDMASHIM_*` variable, read once (the shim reads its
/// environment nowhere else).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub disabled: bool,
    /// `RDMASHIM_LOCAL`: upgrade connections between processes of this host (shared memory).
    pub local: bool,
    pub log_level: Level,
    /// Log file path pattern (may contain `%p`); `None` means stderr.
    pub log_file: Option<Vec<u8>>,
    /// Stats path pattern (may contain `%p`); `None` means no stats file.
    pub stats_path: Option<Vec<u8>>,
    /// `RDMASHIM_RING_KIB`: the receive ring of an upgraded connection, KiB.
    pub ring_kib: u64,
    /// `RDMASHIM_DIAL_DELAY_MS`.
    pub dial_delay_ms: u64,
    /// `RDMASHIM_SPIN_US`.
    pub spin_us: u64,
    /// `RDMASHIM_NEGATIVE_CACHE_SECS` (`None`: the cache's own periods).
    pub negative_cache_secs: Option<u64>,
    /// `RDMASHIM_TRACE` is set.
    pub trace: bool,
    /// `RDMASHIM_FAULT` (tests only).
    pub fault: Option<Fault>,
    /// What was wrong with the variables, one line each (the constructor logs them once).
    pub warnings: Vec<String>,
    /// Secure execution: the environment was not read.
    pub secure: bool,
    /// `RDMASHIM_LIVE`: keep the live view's file (`live.rs`).
    pub live: bool,
    /// `RDMASHIM_RUN_DIR`: where the live view's files go (`None`: [`run_dirs`]' defaults).
    pub run_dir: Option<Vec<u8>>,
    /// `XDG_RUNTIME_DIR`, for [`run_dirs`].
    pub xdg_runtime_dir: Option<Vec<u8>>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            disabled: false,
            local: LOCAL_DEFAULT,
            log_level: Level::Warn,
            log_file: None,
            stats_path: None,
            ring_kib: RING_KIB.default,
            dial_delay_ms: DIAL_DELAY_MS.default,
            spin_us: SPIN_US.default,
            negative_cache_secs: None,
            trace: false,
            fault: None,
            warnings: Vec::new(),
            secure: false,
            live: LIVE_DEFAULT,
            run_dir: None,
            xdg_runtime_dir: None,
        }
    }
}

/// Environment variable names.
pub const ENV_DISABLE: &str = "RDMASHIM_DISABLE";
pub const ENV_LOG: &str = "RDMASHIM_LOG";
pub const ENV_LOG_FILE: &str = "RDMASHIM_LOG_FILE";
pub const ENV_STATS: &str = "RDMASHIM_STATS";
pub const ENV_TRACE: &str = "RDMASHIM_TRACE";
pub const ENV_FAULT: &str = "RDMASHIM_FAULT";
pub const ENV_LOCAL: &str = "RDMASHIM_LOCAL";
pub const ENV_LIVE: &str = "RDMASHIM_LIVE";
pub const ENV_RUN_DIR: &str = "RDMASHIM_RUN_DIR";

/// Whether the live view is kept unless `RDMASHIM_LIVE` says.
pub const LIVE_DEFAULT: bool = true;

/// The system-wide run directory, used by processes that may write there (root's).
pub const SYSTEM_RUN_DIR: &str = "/run/rdmashim";

/// Where the live view's files go, in order of preference: `RDMASHIM_RUN_DIR` alone if set;
/// else [`SYSTEM_RUN_DIR`], `$XDG_RUNTIME_DIR/rdmashim` (an absolute one), and
/// `/tmp/rdmashim-UID` (`uid`: the effective one). The shim takes the first it may write to
/// (making the last component if needed), `rdmashim ss` the first it finds that way.
pub fn run_dirs(c: &Config, uid: u32) -> Vec<Vec<u8>> {
    if let Some(d) = &c.run_dir {
        return vec![d.clone()];
    }
    let mut v = vec![SYSTEM_RUN_DIR.as_bytes().to_vec()];
    if let Some(x) = c
        .xdg_runtime_dir
        .as_ref()
        .filter(|x| x.starts_with(b"/") && !x.contains(&0))
    {
        let mut d = x.clone();
        if !d.ends_with(b"/") {
            d.push(b'/');
        }
        d.extend_from_slice(b"rdmashim");
        v.push(d);
    }
    v.push(format!("/tmp/rdmashim-{uid}").into_bytes());
    v
}

/// Whether same-host connections move to shared memory unless `RDMASHIM_LOCAL` says.
pub const LOCAL_DEFAULT: bool = true;

/// A numeric setting: its variable, accepted range and default.
pub struct Number {
    pub name: &'static str,
    pub min: u64,
    pub max: u64,
    pub default: u64,
}

pub const RING_KIB: Number = Number {
    name: "RDMASHIM_RING_KIB",
    min: 4,
    max: 8192,
    default: 512,
};
pub const DIAL_DELAY_MS: Number = Number {
    name: "RDMASHIM_DIAL_DELAY_MS",
    min: 0,
    max: 1000,
    default: 10,
};
pub const SPIN_US: Number = Number {
    name: "RDMASHIM_SPIN_US",
    min: 0,
    max: 10_000,
    default: 500,
};
pub const NEGATIVE_CACHE_SECS: Number = Number {
    name: "RDMASHIM_NEGATIVE_CACHE_SECS",
    min: 0,
    max: u32::MAX as u64,
    default: 0,
};

/// A boolean as people write one: `1/0`, `true/false`, `yes/no`, `on/off` (any case; empty is
/// false). `None` for anything else.
pub fn parse_bool(v: &[u8]) -> Option<bool> {
    match v.to_ascii_lowercase().as_slice() {
        b"1" | b"true" | b"yes" | b"on" => Some(true),
        b"" | b"0" | b"false" | b"no" | b"off" => Some(false),
        _ => None,
    }
}

impl Number {
    /// The value of `raw` (the variable's text), and the warning it deserves: one that is not
    /// a whole number gets the default, one outside the range the nearest bound.
    pub fn parse(&self, raw: &[u8]) -> (u64, Option<String>) {
        let text = String::from_utf8_lossy(raw);
        let accepted = format!("a whole number from {} to {}", self.min, self.max);
        match text.trim().parse::<u64>() {
            Ok(n) if (self.min..=self.max).contains(&n) => (n, None),
            Ok(n) => {
                let v = n.clamp(self.min, self.max);
                let w = format!("{}={text}: out of range ({accepted}); using {v}", self.name);
                (v, Some(w))
            }
            Err(_) => {
                let w = format!(
                    "{}={text}: not {accepted}; using the default, {}",
                    self.name, self.default
                );
                (self.default, Some(w))
            }
        }
    }
}

impl Config {
    /// Parses the configuration from a variable lookup.
    pub fn from_lookup(get: impl Fn(&str) -> Option<Vec<u8>>) -> Config {
        let mut c = Config::default();
        if let Some(v) = get(ENV_DISABLE) {
            c.disabled = parse_bool(&v).unwrap_or_else(|| {
                c.warnings.push(format!(
                    "{ENV_DISABLE}={}: not a boolean (1/0, true/false, yes/no, on/off); upgrades are disabled",
                    String::from_utf8_lossy(&v)
                ));
                true
            });
        }
        if let Some(v) = get(ENV_LOCAL) {
            c.local = parse_bool(&v).unwrap_or_else(|| {
                c.warnings.push(format!(
                    "{ENV_LOCAL}={}: not a boolean (1/0, true/false, yes/no, on/off); connections on this host stay TCP",
                    String::from_utf8_lossy(&v)
                ));
                false
            });
        }
        if let Some(v) = get(ENV_LOG) {
            match Level::parse(v.to_ascii_lowercase().as_slice()) {
                Some(l) => c.log_level = l,
                None => c.warnings.push(format!(
                    "{ENV_LOG}={}: unknown level (error, warn, info, debug, off); using warn",
                    String::from_utf8_lossy(&v)
                )),
            }
        }
        if let Some(v) = get(ENV_LIVE) {
            c.live = parse_bool(&v).unwrap_or_else(|| {
                c.warnings.push(format!(
                    "{ENV_LIVE}={}: not a boolean (1/0, true/false, yes/no, on/off); no live view",
                    String::from_utf8_lossy(&v)
                ));
                false
            });
        }
        c.run_dir = get(ENV_RUN_DIR).filter(|v| !v.is_empty() && !v.contains(&0));
        c.xdg_runtime_dir = get("XDG_RUNTIME_DIR").filter(|v| !v.is_empty() && !v.contains(&0));
        c.log_file = get(ENV_LOG_FILE).filter(|v| !v.is_empty() && !v.contains(&0));
        c.stats_path = get(ENV_STATS).filter(|v| !v.is_empty() && !v.contains(&0));
        let mut number = |n: &Number| {
            get(n.name).map(|raw| {
                let (v, w) = n.parse(&raw);
                c.warnings.extend(w);
                v
            })
        };
        let ring = number(&RING_KIB);
        let dial = number(&DIAL_DELAY_MS);
        let spin = number(&SPIN_US);
        let neg = number(&NEGATIVE_CACHE_SECS);
        c.ring_kib = ring.unwrap_or(RING_KIB.default);
        c.dial_delay_ms = dial.unwrap_or(DIAL_DELAY_MS.default);
        c.spin_us = spin.unwrap_or(SPIN_US.default);
        c.negative_cache_secs = neg;
        c.trace = get(ENV_TRACE).is_some();
        if let Some(v) = get(ENV_FAULT) {
            let v = String::from_utf8_lossy(&v).into_owned();
            c.fault = Fault::parse(&v);
            if c.fault.is_none() {
                c.warnings.push(format!(
                    "{ENV_FAULT}={v}: not POINT:N (ring_recv or engine_link, N >= 1); no fault"
                ));
            }
        }
        c
    }
}

impl Config {
    /// Makes a relative `RDMASHIM_STATS` or `RDMASHIM_LOG_FILE` absolute against `cwd()`, the
    /// working directory at load (asked only if one is relative), so that the files land
    /// where the process was started even after it changes directory. A path stays as given
    /// when `cwd()` has no answer (the directory is gone, or unreachable).
    pub fn resolve_relative(&mut self, cwd: impl FnOnce() -> Option<Vec<u8>>) {
        let relative = |p: &Option<Vec<u8>>| p.as_deref().is_some_and(|p| !p.starts_with(b"/"));
        if !relative(&self.stats_path) && !relative(&self.log_file) && !relative(&self.run_dir) {
            return;
        }
        let Some(cwd) = cwd().filter(|d| d.starts_with(b"/") && !d.contains(&0)) else {
            return;
        };
        for p in [&mut self.stats_path, &mut self.log_file] {
            if let Some(path) = p.as_mut().filter(|p| !p.starts_with(b"/")) {
                *path = absolute_pattern(&cwd, path);
            }
        }
        // (a directory, not a pattern: a `%` in it stays as it is)
        if let Some(d) = self.run_dir.as_mut().filter(|d| !d.starts_with(b"/")) {
            let mut a = cwd.clone();
            a.push(b'/');
            a.extend_from_slice(d);
            *d = a;
        }
    }
}

/// `dir/pattern`, with every `%` of `dir` doubled: the directory is a name, not a pattern
/// (`%p` in it is not the pid).
pub fn absolute_pattern(dir: &[u8], pattern: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(dir.len() + pattern.len() + 2);
    for &b in dir {
        out.push(b);
        if b == b'%' {
            out.push(b'%');
        }
    }
    if !out.ends_with(b"/") {
        out.push(b'/');
    }
    out.extend_from_slice(pattern);
    out
}

/// Where a fault can be made to happen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Point {
    RingRecv,
    EngineLink,
}

impl Point {
    pub const ALL: [(Point, &'static str); 2] = [
        (Point::RingRecv, "ring_recv"),
        (Point::EngineLink, "engine_link"),
    ];

    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(p, _)| *p == self)
            .map_or("", |(_, n)| n)
    }
}

/// A configured fault: panic the `after`th time `point` is passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    pub point: Point,
    pub after: u64,
}

impl Fault {
    /// `POINT:N` (N ≥ 1); `None` for anything else.
    pub fn parse(v: &str) -> Option<Fault> {
        let (name, n) = v.trim().split_once(':')?;
        let point = Point::ALL.iter().find(|(_, s)| *s == name)?.0;
        let after = n.parse::<u64>().ok().filter(|n| *n >= 1)?;
        Some(Fault { point, after })
    }
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
        assert!(cfg(&[]).local, "same-host upgrades are on by default");
        assert!(cfg(&[("RDMASHIM_LOCAL", "yes")]).local);
        assert!(!cfg(&[("RDMASHIM_LOCAL", "0")]).local);
        let odd = cfg(&[("RDMASHIM_LOCAL", "sometimes")]);
        assert!(!odd.local && odd.warnings[0].contains("RDMASHIM_LOCAL=sometimes"));
        assert!(!cfg(&[("RDMASHIM_DISABLE", "")]).disabled);
        let bad = cfg(&[("RDMASHIM_LOG", "loud")]);
        assert_eq!(bad.warnings.len(), 1, "{:?}", bad.warnings);
        assert!(bad.warnings[0].contains("RDMASHIM_LOG=loud"));
        assert_eq!(bad.log_level, Level::Warn);
        assert_eq!(cfg(&[("RDMASHIM_STATS", "")]).stats_path, None);
    }

    #[test]
    fn the_live_view_and_its_directory() {
        assert!(cfg(&[]).live, "on by default");
        assert!(!cfg(&[("RDMASHIM_LIVE", "off")]).live);
        let odd = cfg(&[("RDMASHIM_LIVE", "maybe")]);
        assert!(!odd.live && odd.warnings[0].contains("RDMASHIM_LIVE=maybe"));
        let s = |v: Vec<Vec<u8>>| -> Vec<String> {
            v.into_iter()
                .map(|d| String::from_utf8(d).unwrap())
                .collect()
        };
        assert_eq!(
            s(run_dirs(&cfg(&[]), 1000)),
            ["/run/rdmashim", "/tmp/rdmashim-1000"]
        );
        assert_eq!(
            s(run_dirs(
                &cfg(&[("XDG_RUNTIME_DIR", "/run/user/1000/")]),
                1000
            )),
            [
                "/run/rdmashim",
                "/run/user/1000/rdmashim",
                "/tmp/rdmashim-1000"
            ]
        );
        // (a relative XDG_RUNTIME_DIR is ignored, as the XDG specification says)
        assert_eq!(s(run_dirs(&cfg(&[("XDG_RUNTIME_DIR", "run")]), 0)).len(), 2);
        let mut c = cfg(&[("RDMASHIM_RUN_DIR", "live%p"), ("XDG_RUNTIME_DIR", "/x")]);
        c.resolve_relative(|| Some(b"/srv".to_vec()));
        assert_eq!(
            s(run_dirs(&c, 0)),
            ["/srv/live%p"],
            "alone, and not a pattern"
        );
    }

    #[test]
    fn relative_paths_are_made_absolute_against_the_start_directory() {
        let mut c = cfg(&[
            ("RDMASHIM_STATS", "st.%p.json"),
            ("RDMASHIM_LOG_FILE", "../logs/shim.log"),
        ]);
        c.resolve_relative(|| Some(b"/srv/app".to_vec()));
        assert_eq!(c.stats_path.as_deref(), Some(&b"/srv/app/st.%p.json"[..]));
        assert_eq!(
            c.log_file.as_deref(),
            Some(&b"/srv/app/../logs/shim.log"[..])
        );

        // An absolute path is left alone, and the directory is not even asked for.
        let mut c = cfg(&[("RDMASHIM_STATS", "/tmp/s.json")]);
        c.resolve_relative(|| panic!("getcwd for an absolute path"));
        assert_eq!(c.stats_path.as_deref(), Some(&b"/tmp/s.json"[..]));
        let mut none = cfg(&[]);
        none.resolve_relative(|| panic!("getcwd with no path"));

        // Only the relative one of the two changes; the root has its slash once.
        let mut c = cfg(&[
            ("RDMASHIM_STATS", "s.json"),
            ("RDMASHIM_LOG_FILE", "/var/log/l"),
        ]);
        c.resolve_relative(|| Some(b"/".to_vec()));
        assert_eq!(c.stats_path.as_deref(), Some(&b"/s.json"[..]));
        assert_eq!(c.log_file.as_deref(), Some(&b"/var/log/l"[..]));

        // No working directory (deleted, unreachable): the path stays as given.
        let mut c = cfg(&[("RDMASHIM_STATS", "s.json")]);
        c.resolve_relative(|| None);
        assert_eq!(c.stats_path.as_deref(), Some(&b"s.json"[..]));
        c.resolve_relative(|| Some(b"(unreachable)/x".to_vec()));
        assert_eq!(c.stats_path.as_deref(), Some(&b"s.json"[..]));
    }

    #[test]
    fn a_percent_in_the_directory_is_not_a_pattern() {
        assert_eq!(
            absolute_pattern(b"/home/u/100%p", b"s.%p.json"),
            b"/home/u/100%%p/s.%p.json"
        );
        assert_eq!(absolute_pattern(b"/a/", b"b"), b"/a/b");
    }

    #[test]
    fn booleans_are_booleans() {
        for (v, want) in [
            ("1", true),
            ("TRUE", true),
            ("Yes", true),
            ("on", true),
            ("FALSE", false),
            ("0", false),
            ("No", false),
            ("off", false),
            ("", false),
        ] {
            let c = cfg(&[("RDMASHIM_DISABLE", v)]);
            assert_eq!(c.disabled, want, "{v:?}");
            assert!(c.warnings.is_empty(), "{v:?}: {:?}", c.warnings);
        }
        // Anything else: disabled (it was asked for by name), and said so.
        let c = cfg(&[("RDMASHIM_DISABLE", "please")]);
        assert!(c.disabled);
        assert!(c.warnings[0].starts_with("RDMASHIM_DISABLE=please: not a boolean"));
    }

    #[test]
    fn numbers_are_checked() {
        let c = cfg(&[
            ("RDMASHIM_RING_KIB", "banana"),
            ("RDMASHIM_SPIN_US", "-5"),
            ("RDMASHIM_DIAL_DELAY_MS", "4000"),
            ("RDMASHIM_NEGATIVE_CACHE_SECS", " 30 "),
        ]);
        assert_eq!(
            (
                c.ring_kib,
                c.spin_us,
                c.dial_delay_ms,
                c.negative_cache_secs
            ),
            (512, 500, 1000, Some(30))
        );
        assert_eq!(c.warnings.len(), 3, "{:?}", c.warnings);
        assert!(c.warnings[0].contains(
            "RDMASHIM_RING_KIB=banana: not a whole number from 4 to 8192; using the default, 512"
        ));
        assert!(c.warnings[1].contains("RDMASHIM_DIAL_DELAY_MS=4000: out of range"));
        assert!(c.warnings[1].ends_with("using 1000"));
        assert!(c.warnings[2].contains("RDMASHIM_SPIN_US=-5"));
        let ok = cfg(&[("RDMASHIM_RING_KIB", "64"), ("RDMASHIM_TRACE", "")]);
        assert_eq!((ok.ring_kib, ok.trace), (64, true));
        assert!(ok.warnings.is_empty());
    }

    #[test]
    fn parses_points_and_counts() {
        assert_eq!(
            Fault::parse("ring_recv:3"),
            Some(Fault {
                point: Point::RingRecv,
                after: 3
            })
        );
        assert_eq!(
            Fault::parse(" engine_link:1 ").map(|f| f.point),
            Some(Point::EngineLink)
        );
        for bad in [
            "",
            "ring_recv",
            "ring_recv:0",
            "ring_recv:x",
            "nowhere:2",
            ":2",
        ] {
            assert_eq!(Fault::parse(bad), None, "{bad:?}");
        }
    }
}
