//! How the shim reads its settings: the machine-wide configuration file (default
//! `/etc/rdmashim.conf`, or `RDMASHIM_CONFIG`), then the `RDMASHIM_*` variables over it; the
//! values accepted, the defaults, and the warning each value that is not accepted gets
//! (config.rs reads both once and keeps the result; the table of variables is there). The
//! file's rules (`allow`/`deny`) are rules.rs's.
//!
//! The file is `key = value` lines (`#` starts a comment at the start of a line or after a
//! blank); every variable is a key, its name in lower case without `RDMASHIM_` (`ring_kib =
//! 64`), and a rule is `allow|deny SELECTOR = VALUE`. It is parsed from bytes (no locale), at
//! most [`CONFIG_MAX`] of them, in one pass; a line that is not understood gets one warning
//! naming the file, the line, the value and what is accepted, and is left out.
//!
//! This file is also compiled into the `rdmashim` launcher (`#[path]` module), so that
//! `rdmashim doctor` judges the environment by the very rules the library will apply: it is
//! plain safe Rust with no dependencies.
#![forbid(unsafe_code)]

use crate::rules::{self, Action, Resolved, Rule, Selector};

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
    /// `RDMASHIM_PINNED_MIB`: the most memory the process's connections over RDMA may pin, MiB
    /// (0: a quarter of the host's memory).
    pub pinned_mib: u64,
    /// `RDMASHIM_ACK_TIMEOUT`: the ACK timeout exponent of a connection's queue pair (0:
    /// rdma_cm's on a NIC, 20 on a software device).
    pub ack_timeout: u64,
    /// `RDMASHIM_RING_IDLE_SECS`: how long a grown ring of a connection over RDMA may stand
    /// still before it is given back (0: never).
    pub ring_idle_secs: u64,
    /// `RDMASHIM_HUGE_PAGES`: rings of a multiple of the huge page size may be made of the
    /// host's huge pages, while its pool has them free.
    pub huge_pages: bool,
    /// `RDMASHIM_KIND`: how a connection upgraded over RDMA carries its bytes.
    pub kind: LinkKind,
    /// `RDMASHIM_TRACE` is set.
    pub trace: bool,
    /// `RDMASHIM_FAULT` (tests only).
    pub fault: Option<Fault>,
    /// What was wrong with the file and the variables, one line each (the constructor logs
    /// them once).
    pub warnings: Vec<String>,
    /// Secure execution: the environment was not read.
    pub secure: bool,
    /// The configuration file: which, and what became of it.
    pub file: ConfigFile,
    /// The file's rules, in order.
    pub rules: Vec<Rule>,
    /// The rules as they apply to this program ([`Config::resolve_program`]; until then: none,
    /// every connection allowed).
    pub policy: Resolved,
    /// `RDMASHIM_LIVE`: keep the live view's file (`live.rs`).
    pub live: bool,
    /// `RDMASHIM_RUN_DIR`: where the live view's files go (`None`: [`run_dirs`]' defaults).
    pub run_dir: Option<Vec<u8>>,
    /// `XDG_RUNTIME_DIR`, for [`run_dirs`].
    pub xdg_runtime_dir: Option<Vec<u8>>,
}

/// Which configuration file was looked at, and what became of it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConfigFile {
    /// The file (`None`: none was looked at).
    pub path: Option<Vec<u8>>,
    pub status: FileStatus,
}

/// What became of the configuration file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum FileStatus {
    /// Not looked for (the environment alone was parsed).
    #[default]
    NotRead,
    /// Read and used.
    Read,
    /// The default file is absent (not a warning: the defaults and the environment apply).
    Absent,
    /// `RDMASHIM_CONFIG` is empty or `none`.
    Ignored,
    /// Present but not used: why.
    Refused(String),
}

impl ConfigFile {
    /// `/etc/rdmashim.conf (read)`, `/etc/rdmashim.conf (absent)`, `none (RDMASHIM_CONFIG=none)`.
    pub fn describe(&self) -> String {
        let path = self
            .path
            .as_deref()
            .map(|p| String::from_utf8_lossy(p).into_owned());
        match (&self.status, path) {
            (FileStatus::Ignored, _) => format!("none ({ENV_CONFIG} says none)"),
            (FileStatus::NotRead, _) | (_, None) => "none".into(),
            (FileStatus::Read, Some(p)) => format!("{p} (read)"),
            (FileStatus::Absent, Some(p)) => format!("{p} (absent: defaults)"),
            (FileStatus::Refused(why), Some(p)) => format!("{p} (not used: {why})"),
        }
    }
}

/// What reading the configuration file gave (the caller reads it: the library with raw
/// system calls, the launcher with std).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileRead {
    /// Its bytes (at most [`CONFIG_MAX`]).
    Text(Vec<u8>),
    /// No such file.
    Missing,
    /// Larger than [`CONFIG_MAX`]: its size, as far as it was read.
    TooBig(u64),
    /// It cannot be read (or may not be: under secure execution, a file that is not root's):
    /// why, in words.
    Failed(String),
}

/// The configuration file when `RDMASHIM_CONFIG` is unset.
pub const DEFAULT_CONFIG: &str = "/etc/rdmashim.conf";
/// The variable that names another file (empty or `none`: no file).
pub const ENV_CONFIG: &str = "RDMASHIM_CONFIG";
/// The largest configuration file read (bytes); a larger one is refused whole.
pub const CONFIG_MAX: usize = 64 * 1024;

/// The file `RDMASHIM_CONFIG`'s value (`None`: unset) names: `None` for no file.
pub fn config_path(env: Option<&[u8]>) -> Option<Vec<u8>> {
    match env {
        None => Some(DEFAULT_CONFIG.as_bytes().to_vec()),
        Some(v) if v.is_empty() || v == b"none" || v.contains(&0) => None,
        Some(v) => Some(v.to_vec()),
    }
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
            pinned_mib: PINNED_MIB.default,
            ack_timeout: ACK_TIMEOUT.default,
            ring_idle_secs: RING_IDLE_SECS.default,
            huge_pages: HUGE_PAGES_DEFAULT,
            kind: LinkKind::default(),
            trace: false,
            fault: None,
            warnings: Vec::new(),
            secure: false,
            file: ConfigFile::default(),
            rules: Vec::new(),
            policy: Resolved::default(),
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
pub const ENV_HUGE_PAGES: &str = "RDMASHIM_HUGE_PAGES";
pub const ENV_KIND: &str = "RDMASHIM_KIND";

/// The connection kind the shim's links over RDMA ask for (`RDMASHIM_KIND`; protocol §3,
/// §15–§17):
/// used when the peer's shim asks for the same one, else WRITE WITH IMMEDIATE, which every
/// shim speaks. The default is duplex: as fast as WRITE WITH IMMEDIATE for small messages,
/// and a request and its answer carry each other's credit, which the shim's small starting
/// rings otherwise send apart every few KiB (docs/bench/kinds.md: 4 KiB ping-pong 1.21× the
/// device against 1.59×). (Records, §14, are not carried by the shim yet: its readiness
/// learns of data from completions.)
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LinkKind {
    /// The ring written by RDMA WRITE WITH IMMEDIATE.
    Imm,
    /// DATA as SENDs into posted receives of 16 KiB, copied into the ring.
    Sends,
    /// Sends, this side's receives in a shared receive queue (its own choice: the peer asks
    /// for sends, or for srq, alike).
    Srq,
    /// READ pull (protocol §16): the receiver reads each DATA from the sender's staging area
    /// with an RDMA READ. No ring moves: its rings start at their full size.
    Read,
    /// Duplex (protocol §17): WRITE WITH IMMEDIATE whose DATA also return the credit owed for
    /// the other direction (the default).
    #[default]
    Duplex,
}

/// The bytes of each receive a link of the sends kind posts, and so the most one DATA
/// carries (`rdmashim_proto::SENDS_BUF`; the launcher does not link the transport).
pub const SENDS_BUF: u64 = 16 << 10;

/// A control message's receive buffer (`rdmashim_proto::MAX_CONTROL_LEN`).
pub const CONTROL_BUF: u64 = 64;

impl LinkKind {
    /// The value's spelling.
    pub fn name(self) -> &'static str {
        match self {
            LinkKind::Imm => "imm",
            LinkKind::Sends => "sends",
            LinkKind::Srq => "srq",
            LinkKind::Read => "read",
            LinkKind::Duplex => "duplex",
        }
    }

    /// Whether a link of this kind takes part in ring moves (protocol §6.4), starting with
    /// small rings and growing them: all but READ pull, whose staging area the peer reads
    /// from is fixed for the connection's life (§16).
    pub fn moves(self) -> bool {
        self != LinkKind::Read
    }

    /// The receives a link of this kind posts, and each one's bytes, for a largest ring of
    /// `ring` bytes. Over WRITE WITH IMMEDIATE: the transport's default 64, of a control
    /// message's size. Over sends: as many as that ring holds DATA of [`SENDS_BUF`], 4 to 64,
    /// so that a writer runs out of receives no sooner than out of ring. With fewer (16
    /// against 512 KiB rings) its bytes waited in its staging area for receives, and their
    /// posts ran in whatever call drove the link next — an application's epoll_wait took 0.25 s
    /// of CPU in 1.3 s of waiting for EPOLLOUT, soft-RoCE's device work
    /// (compat-tests/tests/upgrade_kinds.rs).
    pub fn receives(self, ring: u64) -> (u64, u64) {
        match self {
            LinkKind::Imm | LinkKind::Read | LinkKind::Duplex => (64, CONTROL_BUF),
            LinkKind::Sends | LinkKind::Srq => ((ring / SENDS_BUF).clamp(4, 64), SENDS_BUF),
        }
    }
}

/// Whether the live view is kept unless `RDMASHIM_LIVE` says.
pub const LIVE_DEFAULT: bool = true;

/// Whether rings may be made of the host's free huge pages unless `RDMASHIM_HUGE_PAGES` says
/// (`rdmashim_core::ring`: only rings of a multiple of their size, only while the pool has
/// them free and not promised to another mapping).
pub const HUGE_PAGES_DEFAULT: bool = true;

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

/// Every setting: its variable and its key in the file (the variable's name in lower case,
/// without `RDMASHIM_`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Key {
    Disable,
    Local,
    Log,
    LogFile,
    Stats,
    RingKib,
    DialDelayMs,
    SpinUs,
    NegativeCacheSecs,
    PinnedMib,
    AckTimeout,
    RingIdleSecs,
    HugePages,
    Kind,
    Trace,
    Fault,
    Live,
    RunDir,
}

impl Key {
    pub const ALL: [Key; 18] = [
        Key::Disable,
        Key::Local,
        Key::Log,
        Key::LogFile,
        Key::Stats,
        Key::RingKib,
        Key::DialDelayMs,
        Key::SpinUs,
        Key::NegativeCacheSecs,
        Key::PinnedMib,
        Key::AckTimeout,
        Key::RingIdleSecs,
        Key::HugePages,
        Key::Kind,
        Key::Trace,
        Key::Fault,
        Key::Live,
        Key::RunDir,
    ];

    /// The environment variable.
    pub fn var(self) -> &'static str {
        match self {
            Key::Disable => ENV_DISABLE,
            Key::Local => ENV_LOCAL,
            Key::Log => ENV_LOG,
            Key::LogFile => ENV_LOG_FILE,
            Key::Stats => ENV_STATS,
            Key::RingKib => RING_KIB.name,
            Key::DialDelayMs => DIAL_DELAY_MS.name,
            Key::SpinUs => SPIN_US.name,
            Key::NegativeCacheSecs => NEGATIVE_CACHE_SECS.name,
            Key::PinnedMib => PINNED_MIB.name,
            Key::AckTimeout => ACK_TIMEOUT.name,
            Key::RingIdleSecs => RING_IDLE_SECS.name,
            Key::HugePages => ENV_HUGE_PAGES,
            Key::Kind => ENV_KIND,
            Key::Trace => ENV_TRACE,
            Key::Fault => ENV_FAULT,
            Key::Live => ENV_LIVE,
            Key::RunDir => ENV_RUN_DIR,
        }
    }

    /// The key in the configuration file.
    pub fn key(self) -> &'static str {
        match self {
            Key::Disable => "disable",
            Key::Local => "local",
            Key::Log => "log",
            Key::LogFile => "log_file",
            Key::Stats => "stats",
            Key::RingKib => "ring_kib",
            Key::DialDelayMs => "dial_delay_ms",
            Key::SpinUs => "spin_us",
            Key::NegativeCacheSecs => "negative_cache_secs",
            Key::PinnedMib => "pinned_mib",
            Key::AckTimeout => "ack_timeout",
            Key::RingIdleSecs => "ring_idle_secs",
            Key::HugePages => "huge_pages",
            Key::Kind => "kind",
            Key::Trace => "trace",
            Key::Fault => "fault",
            Key::Live => "live",
            Key::RunDir => "run_dir",
        }
    }

    pub fn from_key(k: &[u8]) -> Option<Key> {
        Key::ALL.into_iter().find(|x| x.key().as_bytes() == k)
    }
}

/// Where a value came from, for its warning: `RDMASHIM_RING_KIB=banana`, or
/// `/etc/rdmashim.conf:3: ring_kib = banana`.
#[derive(Clone, Copy, Debug)]
enum Origin<'a> {
    Env,
    File { path: &'a [u8], line: u32 },
}

impl Origin<'_> {
    fn show(self, key: Key, value: &[u8]) -> String {
        let v = String::from_utf8_lossy(value);
        match self {
            Origin::Env => format!("{}={v}", key.var()),
            Origin::File { path, line } => {
                format!(
                    "{}:{line}: {} = {v}",
                    String::from_utf8_lossy(path),
                    key.key()
                )
            }
        }
    }
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
/// `RDMASHIM_PINNED_MIB` (the default, 0: a quarter of the host's memory).
pub const PINNED_MIB: Number = Number {
    name: "RDMASHIM_PINNED_MIB",
    min: 0,
    max: 1 << 30,
    default: 0,
};
/// The memory mappings a connection over RDMA adds to its process, as the shim counts them
/// (`rdmashim_core::Transport::Rdma.mappings_per_link()`, which the launcher, without the
/// transport, cannot ask): the shim takes at most half of `vm.max_map_count` for them.
pub const MAPPINGS_PER_RDMA_LINK: u64 = 10;

/// `RDMASHIM_ACK_TIMEOUT` (the default, 0: rdma_cm's on a NIC, 20 on a software device; see
/// `StreamConfig::ack_timeout`).
pub const ACK_TIMEOUT: Number = Number {
    name: "RDMASHIM_ACK_TIMEOUT",
    min: 0,
    max: 31,
    default: 0,
};
/// `RDMASHIM_RING_IDLE_SECS`: a connection over RDMA whose receive ring grew gives it back
/// (offers its peer a ring of the size it started with, protocol §6.4) once nothing has
/// arrived in it or been read from it for this long; 0: a grown ring stays.
pub const RING_IDLE_SECS: Number = Number {
    name: "RDMASHIM_RING_IDLE_SECS",
    min: 0,
    max: 86_400,
    default: 10,
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
        let (v, w) = self.check(raw);
        (
            v,
            w.map(|w| format!("{}={}: {w}", self.name, String::from_utf8_lossy(raw))),
        )
    }

    /// As [`parse`](Self::parse), the warning without the variable's name and value.
    fn check(&self, raw: &[u8]) -> (u64, Option<String>) {
        let text = String::from_utf8_lossy(raw);
        let accepted = format!("a whole number from {} to {}", self.min, self.max);
        match text.trim().parse::<u64>() {
            Ok(n) if (self.min..=self.max).contains(&n) => (n, None),
            Ok(n) => {
                let v = n.clamp(self.min, self.max);
                (v, Some(format!("out of range ({accepted}); using {v}")))
            }
            Err(_) => (
                self.default,
                Some(format!(
                    "not {accepted}; using the default, {}",
                    self.default
                )),
            ),
        }
    }
}

impl Config {
    /// The most bytes the process's connections over RDMA may pin (`RDMASHIM_PINNED_MIB`; 0:
    /// a quarter of `phys`, the host's memory; `None` if that is unknown: no cap of the shim's
    /// own, RLIMIT_MEMLOCK alone).
    pub fn pinned_cap(&self, phys: Option<u64>) -> Option<u64> {
        match self.pinned_mib {
            0 => phys.map(|p| p / 4),
            mib => Some(mib << 20),
        }
    }

    /// Parses the configuration from a variable lookup alone (no file).
    pub fn from_lookup(get: impl Fn(&str) -> Option<Vec<u8>>) -> Config {
        let mut c = Config::default();
        c.apply_env(&get);
        c.xdg_runtime_dir = get("XDG_RUNTIME_DIR").filter(|v| !v.is_empty() && !v.contains(&0));
        c
    }

    /// Parses the configuration file (the one `RDMASHIM_CONFIG` names, or the default), read
    /// with `read`, then the variables of `get` over it: a variable overrides the file's key.
    pub fn load(
        get: impl Fn(&str) -> Option<Vec<u8>>,
        read: impl FnOnce(&[u8]) -> FileRead,
    ) -> Config {
        let mut c = Config::default();
        let env = get(ENV_CONFIG);
        match config_path(env.as_deref()) {
            None => c.file.status = FileStatus::Ignored,
            Some(path) => {
                let shown = String::from_utf8_lossy(&path).into_owned();
                let named = env.is_some();
                c.file.status = match read(&path) {
                    FileRead::Text(t) if t.len() <= CONFIG_MAX => {
                        c.parse_file(&path, &t);
                        FileStatus::Read
                    }
                    FileRead::Text(t) => c.too_big(&shown, t.len() as u64),
                    FileRead::TooBig(n) => c.too_big(&shown, n),
                    FileRead::Missing if !named => FileStatus::Absent,
                    FileRead::Missing => {
                        c.warnings.push(format!(
                            "{ENV_CONFIG}={shown}: no such file; using the environment and the defaults"
                        ));
                        FileStatus::Refused("no such file".into())
                    }
                    FileRead::Failed(why) => {
                        c.warnings.push(format!(
                            "{shown}: cannot be used ({why}); using the environment and the defaults"
                        ));
                        FileStatus::Refused(why)
                    }
                };
                c.file.path = Some(path);
            }
        }
        c.apply_env(&get);
        c.xdg_runtime_dir = get("XDG_RUNTIME_DIR").filter(|v| !v.is_empty() && !v.contains(&0));
        c
    }

    fn too_big(&mut self, shown: &str, n: u64) -> FileStatus {
        let why = format!("larger than {CONFIG_MAX} bytes");
        self.warnings.push(format!(
            "{shown}: {why} ({n} or more): not read; using the environment and the defaults"
        ));
        FileStatus::Refused(why)
    }

    fn apply_env(&mut self, get: &impl Fn(&str) -> Option<Vec<u8>>) {
        for k in Key::ALL {
            if let Some(v) = get(k.var()) {
                self.set(k, &v, Origin::Env);
            }
        }
    }

    /// Sets `key` from `raw` (from `origin`): an accepted value, or the default and a warning.
    fn set(&mut self, key: Key, raw: &[u8], origin: Origin<'_>) {
        const BOOL: &str = "not a boolean (1/0, true/false, yes/no, on/off)";
        let mut warn = |tail: String| {
            self.warnings
                .push(format!("{}: {tail}", origin.show(key, raw)))
        };
        let path = |v: &[u8]| {
            let v = trim_blank(v);
            (!v.is_empty() && !v.contains(&0)).then(|| v.to_vec())
        };
        match key {
            Key::Disable => {
                self.disabled = parse_bool(trim_blank(raw)).unwrap_or_else(|| {
                    warn(format!("{BOOL}; upgrades are disabled"));
                    true
                })
            }
            Key::Local => {
                self.local = parse_bool(trim_blank(raw)).unwrap_or_else(|| {
                    warn(format!("{BOOL}; connections on this host stay TCP"));
                    false
                })
            }
            Key::Log => match Level::parse(trim_blank(raw).to_ascii_lowercase().as_slice()) {
                Some(l) => self.log_level = l,
                None => {
                    warn("unknown level (error, warn, info, debug, off); using warn".into());
                    self.log_level = Level::Warn;
                }
            },
            // (the environment's value as it is: a path may end in a blank)
            Key::LogFile => {
                self.log_file = match origin {
                    Origin::Env => Some(raw.to_vec()).filter(|v| !v.is_empty() && !v.contains(&0)),
                    Origin::File { .. } => path(raw),
                }
            }
            Key::Stats => {
                self.stats_path = match origin {
                    Origin::Env => Some(raw.to_vec()).filter(|v| !v.is_empty() && !v.contains(&0)),
                    Origin::File { .. } => path(raw),
                }
            }
            Key::RunDir => {
                self.run_dir = match origin {
                    Origin::Env => Some(raw.to_vec()).filter(|v| !v.is_empty() && !v.contains(&0)),
                    Origin::File { .. } => path(raw),
                }
            }
            Key::Live => {
                self.live = parse_bool(trim_blank(raw)).unwrap_or_else(|| {
                    warn(format!("{BOOL}; no live view"));
                    false
                })
            }
            Key::HugePages => {
                self.huge_pages = parse_bool(trim_blank(raw)).unwrap_or_else(|| {
                    warn(format!("{BOOL}; no huge pages"));
                    false
                })
            }
            Key::Kind => {
                // (a value the shim cannot carry gets the enum's one default)
                let default = LinkKind::default();
                self.kind = match trim_blank(raw).to_ascii_lowercase().as_slice() {
                    b"imm" => LinkKind::Imm,
                    b"sends" => LinkKind::Sends,
                    b"srq" => LinkKind::Srq,
                    b"read" => LinkKind::Read,
                    b"duplex" => LinkKind::Duplex,
                    b"records" => {
                        warn(format!(
                            "records are not carried by the shim yet; using {}",
                            default.name()
                        ));
                        default
                    }
                    _ => {
                        warn(format!(
                            "unknown connection kind (imm, sends, srq, read, duplex); using {}",
                            default.name()
                        ));
                        default
                    }
                }
            }
            Key::RingKib
            | Key::DialDelayMs
            | Key::SpinUs
            | Key::NegativeCacheSecs
            | Key::PinnedMib
            | Key::AckTimeout
            | Key::RingIdleSecs => {
                let n = match key {
                    Key::RingKib => &RING_KIB,
                    Key::DialDelayMs => &DIAL_DELAY_MS,
                    Key::SpinUs => &SPIN_US,
                    Key::PinnedMib => &PINNED_MIB,
                    Key::AckTimeout => &ACK_TIMEOUT,
                    Key::RingIdleSecs => &RING_IDLE_SECS,
                    _ => &NEGATIVE_CACHE_SECS,
                };
                let (v, w) = n.check(raw);
                if let Some(w) = w {
                    warn(w);
                }
                match key {
                    Key::RingKib => self.ring_kib = v,
                    Key::DialDelayMs => self.dial_delay_ms = v,
                    Key::SpinUs => self.spin_us = v,
                    Key::PinnedMib => self.pinned_mib = v,
                    Key::AckTimeout => self.ack_timeout = v,
                    Key::RingIdleSecs => self.ring_idle_secs = v,
                    _ => self.negative_cache_secs = Some(v),
                }
            }
            // (the variable: set is on, whatever its value; the file's key: a boolean)
            Key::Trace => {
                self.trace = match origin {
                    Origin::Env => true,
                    Origin::File { .. } => parse_bool(trim_blank(raw)).unwrap_or_else(|| {
                        warn(format!("{BOOL}; no trace"));
                        false
                    }),
                }
            }
            Key::Fault => {
                let v = String::from_utf8_lossy(raw).into_owned();
                self.fault = Fault::parse(&v);
                if self.fault.is_none() {
                    warn(
                        "not POINT:N (ring_recv, engine_link or path_fail, N >= 1); no fault"
                            .into(),
                    );
                }
            }
        }
    }

    /// Parses the configuration file `path`'s bytes `text`: its settings and its rules.
    pub fn parse_file(&mut self, path: &[u8], text: &[u8]) {
        let shown = String::from_utf8_lossy(path).into_owned();
        if text.len() > CONFIG_MAX {
            self.too_big(&shown, text.len() as u64);
            return;
        }
        for (i, line) in text.split(|b| *b == b'\n').enumerate() {
            let n = u32::try_from(i + 1).unwrap_or(u32::MAX);
            let line = trim_blank(strip_comment(line));
            if line.is_empty() {
                continue;
            }
            let text = String::from_utf8_lossy(line);
            let Some(eq) = line.iter().position(|b| *b == b'=') else {
                self.warnings.push(format!(
                    "{shown}:{n}: {text}: not `key = value` or `allow|deny SELECTOR = VALUE`; line ignored"
                ));
                continue;
            };
            let (lhs, value) = (trim_blank(&line[..eq]), trim_blank(&line[eq + 1..]));
            let mut words = lhs
                .split(|b| *b == b' ' || *b == b'\t')
                .filter(|w| !w.is_empty());
            let (first, second, more) = (words.next(), words.next(), words.next().is_some());
            match (first, second, more) {
                (Some(k), None, _) => match Key::from_key(k) {
                    Some(key) => self.set(key, value, Origin::File { path, line: n }),
                    None => self.warnings.push(format!(
                        "{shown}:{n}: {text}: unknown key (one of {}, or a rule: allow|deny SELECTOR = VALUE); line ignored",
                        Key::ALL.map(Key::key).join(", ")
                    )),
                },
                (Some(a), Some(sel), false) => {
                    let Some(action) = Action::parse(a) else {
                        self.warnings.push(format!(
                            "{shown}:{n}: {text}: not a rule (allow|deny SELECTOR = VALUE); line ignored"
                        ));
                        continue;
                    };
                    match Selector::parse(sel, value) {
                        Ok(selector) => self.rules.push(Rule {
                            action,
                            selector,
                            line: n,
                        }),
                        Err(None) => self.warnings.push(format!(
                            "{shown}:{n}: {text}: unknown selector (one of {}); rule ignored",
                            rules::SELECTORS.map(|(k, _)| k).join(", ")
                        )),
                        Err(Some(accepted)) => self.warnings.push(format!(
                            "{shown}:{n}: {text}: not {accepted}; rule ignored"
                        )),
                    }
                }
                _ => self.warnings.push(format!(
                    "{shown}:{n}: {text}: not `key = value` or `allow|deny SELECTOR = VALUE`; line ignored"
                )),
            }
        }
    }

    /// Decides the rules for this program, recognised by `is_program` (given a program
    /// rule's glob: see [`rules::program_matches`]).
    pub fn resolve_program(&mut self, is_program: impl Fn(&[u8]) -> bool) {
        self.policy = rules::resolve(&self.rules, is_program);
    }

    /// Whether any rule is a program rule (the program's paths are looked up only then).
    pub fn has_program_rules(&self) -> bool {
        self.rules
            .iter()
            .any(|r| matches!(r.selector, Selector::Program(_)))
    }

    /// The rule that denies this whole program, if one does (after [`resolve_program`]).
    ///
    /// [`resolve_program`]: Self::resolve_program
    pub fn program_denied(&self) -> Option<&Rule> {
        let line = self.policy.process_denied()?;
        self.rules.iter().find(|r| r.line == line)
    }
}

/// `line` up to its comment: a `#` at its start or after a blank.
fn strip_comment(line: &[u8]) -> &[u8] {
    let mut prev_blank = true;
    for (i, b) in line.iter().enumerate() {
        if *b == b'#' && prev_blank {
            return &line[..i];
        }
        prev_blank = matches!(b, b' ' | b'\t');
    }
    line
}

/// `v` without blanks (spaces, tabs, a carriage return) around it.
fn trim_blank(v: &[u8]) -> &[u8] {
    let blank = |b: &u8| matches!(b, b' ' | b'\t' | b'\r');
    let start = v.iter().position(|b| !blank(b)).unwrap_or(v.len());
    let end = v.iter().rposition(|b| !blank(b)).map_or(start, |i| i + 1);
    &v[start..end]
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
    /// Not a panic: the connection's ring path is failed on purpose (protocol §8.6).
    PathFail,
    /// Not a panic, not a pass: `N` is the binding version this shim speaks instead of its
    /// own, as a shim of another release would (its token says `N`, and it understands only
    /// tokens of version `N`).
    Version,
    /// Not a panic, not a pass: the setup thread holds each request it answered `N` ms more
    /// before the engine takes the new link up, as a host under load may (the application
    /// goes on meanwhile: it may fork, or close the connection).
    SlowAccept,
    /// Not a panic, not a pass: the setup thread holds each request `N` ms before it answers
    /// it (the client's dial stays under way that long).
    SlowAnswer,
    /// Not a panic, not a pass: the process's `vm.max_map_count` is taken to be `N` (the shim
    /// takes half of it for its connections' mappings), as on a host where it is low.
    MapCount,
}

impl Point {
    pub const ALL: [(Point, &'static str); 7] = [
        (Point::RingRecv, "ring_recv"),
        (Point::EngineLink, "engine_link"),
        (Point::PathFail, "path_fail"),
        (Point::Version, "version"),
        (Point::SlowAccept, "slow_accept"),
        (Point::SlowAnswer, "slow_answer"),
        (Point::MapCount, "map_count"),
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
    /// `POINT:N` (N ≥ 1; for `version`, 1–255); `None` for anything else.
    pub fn parse(v: &str) -> Option<Fault> {
        let (name, n) = v.trim().split_once(':')?;
        let point = Point::ALL.iter().find(|(_, s)| *s == name)?.0;
        let after = n.parse::<u64>().ok().filter(|n| *n >= 1)?;
        if point == Point::Version && after > u64::from(u8::MAX) {
            return None;
        }
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
            ("RDMASHIM_PINNED_MIB", "4GiB"),
        ]);
        assert_eq!(
            (
                c.ring_kib,
                c.spin_us,
                c.dial_delay_ms,
                c.negative_cache_secs,
                c.pinned_mib
            ),
            (512, 500, 1000, Some(30), 0)
        );
        assert_eq!(c.warnings.len(), 4, "{:?}", c.warnings);
        assert!(c.warnings[0].contains(
            "RDMASHIM_RING_KIB=banana: not a whole number from 4 to 8192; using the default, 512"
        ));
        assert!(c.warnings[1].contains("RDMASHIM_DIAL_DELAY_MS=4000: out of range"));
        assert!(c.warnings[1].ends_with("using 1000"));
        assert!(c.warnings[2].contains("RDMASHIM_SPIN_US=-5"));
        assert!(c.warnings[3].contains(
            "RDMASHIM_PINNED_MIB=4GiB: not a whole number from 0 to 1073741824; using the default, 0"
        ));
        assert_eq!(cfg(&[("RDMASHIM_PINNED_MIB", "4096")]).pinned_mib, 4096);
        let ok = cfg(&[("RDMASHIM_RING_KIB", "64"), ("RDMASHIM_TRACE", "")]);
        assert_eq!((ok.ring_kib, ok.trace), (64, true));
        assert!(ok.warnings.is_empty());
    }

    /// The configuration of file `text` (at `/etc/rdmashim.conf`) and the variables `vars`.
    fn with_file(text: impl AsRef<[u8]>, vars: &[(&str, &str)]) -> Config {
        let m: HashMap<String, Vec<u8>> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect();
        let text = text.as_ref().to_vec();
        Config::load(
            |k| m.get(k).cloned(),
            |p| {
                assert_eq!(p, DEFAULT_CONFIG.as_bytes());
                FileRead::Text(text)
            },
        )
    }

    #[test]
    fn the_file_has_every_setting() {
        let c = with_file(
            "# the machine's settings\n\
             \n\
             disable = no\n\
             local=off\n\
             \tlog = DEBUG   # loud\n\
             log_file = /var/log/rdmashim.%p.log\n\
             stats = stats#%p.json\n\
             ring_kib = 64\r\n\
             dial_delay_ms = 20\n\
             spin_us = 0\n\
             negative_cache_secs = 30\n\
             trace = yes\n\
             fault = ring_recv:2\n",
            &[],
        );
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        assert_eq!(c.file.status, FileStatus::Read);
        assert!(!c.disabled && !c.local && c.trace);
        assert_eq!(c.log_level, Level::Debug);
        assert_eq!(
            c.log_file.as_deref(),
            Some(&b"/var/log/rdmashim.%p.log"[..])
        );
        assert_eq!(c.stats_path.as_deref(), Some(&b"stats#%p.json"[..]));
        assert_eq!(
            (
                c.ring_kib,
                c.dial_delay_ms,
                c.spin_us,
                c.negative_cache_secs
            ),
            (64, 20, 0, Some(30))
        );
        assert_eq!(c.fault.map(|f| f.after), Some(2));
        // every key there is (the table above has them all)
        for k in Key::ALL {
            assert_eq!(Key::from_key(k.key().as_bytes()), Some(k));
            assert_eq!(k.var().to_lowercase(), format!("rdmashim_{}", k.key()));
        }
    }

    #[test]
    fn the_environment_overrides_the_file() {
        let file = "ring_kib = 64\nlocal = off\nstats = /var/tmp/s.json\ndisable = yes\n";
        let c = with_file(
            file,
            &[
                ("RDMASHIM_RING_KIB", "128"),
                ("RDMASHIM_LOCAL", "1"),
                ("RDMASHIM_STATS", ""),
            ],
        );
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        assert_eq!((c.ring_kib, c.local, c.stats_path), (128, true, None));
        assert!(c.disabled, "the file's, where no variable says otherwise");
        // a bad variable over a good key: its warning, and the default
        let c = with_file(file, &[("RDMASHIM_RING_KIB", "lots")]);
        assert_eq!(c.ring_kib, 512);
        assert_eq!(
            c.warnings,
            ["RDMASHIM_RING_KIB=lots: not a whole number from 4 to 8192; using the default, 512"]
        );
    }

    #[test]
    fn the_connection_kind_is_duplex_unless_another_is_asked_for() {
        assert_eq!(with_file("", &[]).kind, LinkKind::Duplex);
        assert_eq!(Config::default().kind, LinkKind::Duplex);
        let c = with_file("kind = sends\n", &[]);
        assert_eq!((c.kind, c.warnings.len()), (LinkKind::Sends, 0));
        let c = with_file("kind = sends\n", &[("RDMASHIM_KIND", " IMM ")]);
        assert_eq!((c.kind, c.warnings.len()), (LinkKind::Imm, 0));
        for (v, why) in [
            (
                "records",
                "records are not carried by the shim yet; using duplex",
            ),
            (
                "fast",
                "unknown connection kind (imm, sends, srq, read, duplex); using duplex",
            ),
        ] {
            let c = with_file("kind = sends\n", &[("RDMASHIM_KIND", v)]);
            assert_eq!(c.kind, LinkKind::Duplex, "{v}");
            assert_eq!(c.warnings, vec![format!("RDMASHIM_KIND={v}: {why}")]);
        }
        assert_eq!(LinkKind::Sends.name(), "sends");
        let c = with_file("kind = srq\n", &[]);
        assert_eq!((c.kind, c.warnings.len()), (LinkKind::Srq, 0));
        let c = with_file("", &[("RDMASHIM_KIND", "Read")]);
        assert_eq!((c.kind, c.warnings.len()), (LinkKind::Read, 0));
        assert!(!c.kind.moves() && LinkKind::Srq.moves() && LinkKind::Duplex.moves());
        let c = with_file("kind = imm\n", &[]);
        assert_eq!((c.kind, c.warnings.len()), (LinkKind::Imm, 0));
        assert_eq!(
            LinkKind::Read.receives(512 << 10),
            LinkKind::Imm.receives(512 << 10)
        );
        assert_eq!(
            LinkKind::Duplex.receives(512 << 10),
            LinkKind::Imm.receives(512 << 10)
        );
    }

    #[test]
    fn each_bad_line_gets_one_warning_with_its_place() {
        let c = with_file(
            "ring_kib = banana\n\
             spin_us = 99999\n\
             disable = perhaps\n\
             log = loud\n\
             colour = blue\n\
             just some words\n\
             permit port = 22\n\
             deny peer = 10.0.0.0/33\n\
             deny port = 70000\n\
             deny host = example.com\n\
             deny port 22 = 23\n\
             deny port = 6379\n\
             = 5\n",
            &[],
        );
        let w = &c.warnings;
        let want = [
            "/etc/rdmashim.conf:1: ring_kib = banana: not a whole number from 4 to 8192; using the default, 512",
            "/etc/rdmashim.conf:2: spin_us = 99999: out of range (a whole number from 0 to 10000); using 10000",
            "/etc/rdmashim.conf:3: disable = perhaps: not a boolean (1/0, true/false, yes/no, on/off); upgrades are disabled",
            "/etc/rdmashim.conf:4: log = loud: unknown level (error, warn, info, debug, off); using warn",
            "/etc/rdmashim.conf:5: colour = blue: unknown key (one of disable, local, log, log_file, stats, ring_kib, dial_delay_ms, spin_us, negative_cache_secs, pinned_mib, ack_timeout, ring_idle_secs, huge_pages, kind, trace, fault, live, run_dir, or a rule: allow|deny SELECTOR = VALUE); line ignored",
            "/etc/rdmashim.conf:6: just some words: not `key = value` or `allow|deny SELECTOR = VALUE`; line ignored",
            "/etc/rdmashim.conf:7: permit port = 22: not a rule (allow|deny SELECTOR = VALUE); line ignored",
            "/etc/rdmashim.conf:8: deny peer = 10.0.0.0/33: not an IPv4 or IPv6 address, optionally /PREFIX (0-32, 0-128); rule ignored",
            "/etc/rdmashim.conf:9: deny port = 70000: not a port or a range, N or N-M (0-65535); rule ignored",
            "/etc/rdmashim.conf:10: deny host = example.com: unknown selector (one of program, peer, port, local_port, remote_port); rule ignored",
            "/etc/rdmashim.conf:11: deny port 22 = 23: not `key = value` or `allow|deny SELECTOR = VALUE`; line ignored",
            "/etc/rdmashim.conf:13: = 5: not `key = value` or `allow|deny SELECTOR = VALUE`; line ignored",
        ];
        assert_eq!(w.len(), want.len(), "{w:#?}");
        for (got, want) in w.iter().zip(want) {
            assert_eq!(got, want);
        }
        assert_eq!((c.ring_kib, c.spin_us, c.disabled), (512, 10_000, true));
        assert_eq!(c.rules.len(), 1, "only the good rule: {:?}", c.rules);
        assert_eq!(c.rules[0].line, 12);
        assert_eq!(c.rules[0].to_string(), "deny port = 6379");
    }

    #[test]
    fn comments_blanks_and_odd_bytes() {
        let c = with_file(
            b"  # indented comment\n\
             \t\r\n\
             deny program = sshd # the daemon\n\
             deny program = a#b\n\
             stats = /tmp/x y.json\n\
             deny program = \xff\xfe\n",
            &[],
        );
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        let globs: Vec<_> = c
            .rules
            .iter()
            .map(|r| match &r.selector {
                Selector::Program(g) => g.clone(),
                s => panic!("{s:?}"),
            })
            .collect();
        assert_eq!(globs, [&b"sshd"[..], b"a#b", b"\xff\xfe"]);
        assert_eq!(c.stats_path.as_deref(), Some(&b"/tmp/x y.json"[..]));
        // not UTF-8 in a bad line: shown, not refused
        let c = with_file("ring_kib = \u{fffd}x\n", &[]);
        assert_eq!(c.warnings.len(), 1);
        // a file without a newline at its end, and an empty one
        assert_eq!(with_file("ring_kib = 8", &[]).ring_kib, 8);
        assert_eq!(with_file("", &[]).warnings.len(), 0);
    }

    #[test]
    fn which_file_and_what_became_of_it() {
        assert_eq!(
            config_path(None).as_deref(),
            Some(DEFAULT_CONFIG.as_bytes())
        );
        assert_eq!(config_path(Some(b"")), None);
        assert_eq!(config_path(Some(b"none")), None);
        assert_eq!(
            config_path(Some(b"/x.conf")).as_deref(),
            Some(&b"/x.conf"[..])
        );
        let env = |v: Option<&'static str>| {
            move |k: &str| {
                (k == ENV_CONFIG)
                    .then_some(v)
                    .flatten()
                    .map(|v| v.as_bytes().to_vec())
            }
        };
        // ignored: never read
        let c = Config::load(env(Some("none")), |_| panic!("read"));
        assert_eq!(c.file.status, FileStatus::Ignored);
        assert!(c.warnings.is_empty());
        // the default, absent: quietly the defaults
        let c = Config::load(env(None), |_| FileRead::Missing);
        assert_eq!(
            (c.file.status.clone(), c.warnings.len()),
            (FileStatus::Absent, 0)
        );
        assert!(c.file.describe().contains("absent"));
        // a named file, absent: said
        let c = Config::load(env(Some("/x.conf")), |p| {
            assert_eq!(p, b"/x.conf");
            FileRead::Missing
        });
        assert_eq!(
            c.warnings,
            ["RDMASHIM_CONFIG=/x.conf: no such file; using the environment and the defaults"]
        );
        // one that cannot be read
        let c = Config::load(env(None), |_| {
            FileRead::Failed("Permission denied (errno 13)".into())
        });
        assert_eq!(
            c.warnings,
            ["/etc/rdmashim.conf: cannot be used (Permission denied (errno 13)); using the environment and the defaults"]
        );
    }

    #[test]
    fn an_oversize_file_is_refused_whole() {
        let mut big = "deny port = 22\n".repeat(CONFIG_MAX / 15 + 1);
        assert!(big.len() > CONFIG_MAX);
        let c = with_file(&big, &[("RDMASHIM_RING_KIB", "16")]);
        assert!(c.rules.is_empty());
        assert_eq!(c.ring_kib, 16, "the environment still applies");
        assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
        assert!(c.warnings[0].starts_with("/etc/rdmashim.conf: larger than 65536 bytes"));
        assert!(matches!(c.file.status, FileStatus::Refused(_)));
        // the reader's own refusal says the same
        let c = Config::load(|_| None, |_| FileRead::TooBig(1 << 20));
        assert_eq!(c.warnings.len(), 1);
        // exactly the limit is read
        big.truncate(CONFIG_MAX);
        let c = with_file(&big, &[]);
        assert_eq!(c.file.status, FileStatus::Read);
    }

    #[test]
    fn the_program_rule_is_decided_once() {
        let mut c = with_file(
            "allow peer = 10.0.0.0/8\ndeny program = sshd\ndeny program = /usr/sbin/*\n",
            &[],
        );
        assert!(c.has_program_rules());
        c.resolve_program(|g| rules::program_matches(g, b"sshd", &[b"/usr/sbin/sshd"]));
        assert!(
            c.program_denied().is_none(),
            "a connection rule comes first"
        );
        let mut c = with_file("deny program = sshd\nallow program = *\n", &[]);
        c.resolve_program(|g| rules::program_matches(g, b"sshd", &[]));
        assert_eq!(c.program_denied().map(|r| r.line), Some(1));
        c.resolve_program(|g| rules::program_matches(g, b"curl", &[]));
        assert!(c.program_denied().is_none() && c.policy.allows_all());
    }

    #[test]
    fn the_packaged_file_is_all_comments_and_its_examples_parse() {
        let text = include_str!("../../docs/rdmashim.conf");
        assert_eq!(
            with_file(text, &[]),
            Config {
                file: ConfigFile {
                    path: Some(DEFAULT_CONFIG.as_bytes().to_vec()),
                    status: FileStatus::Read,
                },
                ..Config::default()
            }
        );
        // every example, uncommented, is understood
        let examples: String = text
            .lines()
            .filter_map(|l| l.strip_prefix('#'))
            .filter(|l| l.starts_with(|c: char| c.is_ascii_lowercase()))
            .map(|l| format!("{l}\n"))
            .collect();
        let c = with_file(&examples, &[]);
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        assert_eq!(c.rules.len(), 6, "{examples}");
        let keys: Vec<&str> = examples
            .lines()
            .filter_map(|l| l.split_once('=').map(|(k, _)| k.trim()))
            .filter(|k| !k.contains(' '))
            .collect();
        for k in Key::ALL.into_iter().filter(|k| *k != Key::Fault) {
            assert!(
                keys.contains(&k.key()),
                "{} not in the packaged file",
                k.key()
            );
        }
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
        assert_eq!(
            Fault::parse("slow_accept:500"),
            Some(Fault {
                point: Point::SlowAccept,
                after: 500
            })
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
