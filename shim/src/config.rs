//! Configuration from the configuration file and the environment, read once (by the
//! constructor, or by whichever shim slow path needs it first). Hooks never read it on the
//! pass-through path.
//!
//! The file is `/etc/rdmashim.conf`, or the one `RDMASHIM_CONFIG` names (empty or `none`:
//! none); every variable below is a key there (`ring_kib = 64`), and a variable overrides
//! its key. The file also holds the policy's rules (`deny program = sshd`, `deny port =
//! 5432`: rules.rs); the program rules are decided here, once, for this program. The file
//! is read with raw system calls, at most 64 KiB of it (settings.rs parses it; docs/man/
//! rdmashim.conf.5 is its manual).
//!
//! | variable | meaning |
//! |---|---|
//! | `RDMASHIM_CONFIG=FILE` | the configuration file (default `/etc/rdmashim.conf`; empty or `none`: none) |
//! | `RDMASHIM_DISABLE=1` | never upgrade (connections are counted with reason `disabled`) |
//! | `RDMASHIM_LOG=error\|warn\|info\|debug\|off` | log level (default `warn`) |
//! | `RDMASHIM_LOG_FILE=PATH` | append log lines to PATH (default: stderr); `%p` becomes the pid |
//! | `RDMASHIM_STATS=PATH` | write the stats JSON to PATH at exit; `%p` becomes the pid |
//! | `RDMASHIM_LOCAL=1\|0` | connections between processes of this host move to shared-memory rings (`1`, the default), or stay TCP (`0`: reason `not_upgradable_address`) |
//! | `RDMASHIM_LIVE=1\|0` | keep the live view's file (`live.rs`; default `1`) |
//! | `RDMASHIM_RUN_DIR=DIR` | where the live view's files go (default: `settings::run_dirs`) |
//! | `RDMASHIM_RING_KIB`, `RDMASHIM_DIAL_DELAY_MS`, `RDMASHIM_SPIN_US`, `RDMASHIM_NEGATIVE_CACHE_SECS`, `RDMASHIM_PINNED_MIB`, `RDMASHIM_ACK_TIMEOUT`, `RDMASHIM_RING_IDLE_SECS`, `RDMASHIM_HUGE_PAGES`, `RDMASHIM_KIND`, `RDMASHIM_TRACE` | the upgrade's tunables (docs/shim.md) |
//! | `RDMASHIM_FAULT=POINT:N` | tests only: panic the `N`th time the shim passes `POINT` (`ring_recv`, `engine_link`; see `fault.rs`) |
//!
//! A relative `RDMASHIM_STATS`, `RDMASHIM_LOG_FILE` or `RDMASHIM_RUN_DIR` is made absolute here, once, against
//! the working directory the process has when the configuration is read (at load): a
//! program that changes directory later still writes where it was started.
//!
//! Every value is checked: a boolean is a boolean in any case, a number a whole number in its
//! range; anything else gets one warning naming the variable, the value and what is accepted
//! (logged once by the constructor), and the default (or the nearest bound).
//!
//! Under secure execution (`AT_SECURE` in the auxiliary vector: a setuid or setgid program, or
//! one with file capabilities, started by a less privileged user) the environment is the
//! caller's, not the program's: the shim then takes no setting and no path from it at all
//! (`RDMASHIM_CONFIG` included) and runs with the defaults — logs to stderr, no stats file, a
//! live record in the default run directory (without `XDG_RUNTIME_DIR`) — and
//! `/etc/rdmashim.conf`, if root owns it and no one else may write it. (glibc's loader itself
//! ignores `LD_PRELOAD` entries with a slash for such programs and loads others only from the
//! system's library directories, and only if the library is set-user-ID: the shim reaches them
//! only through `/etc/ld.so.preload` or such an installation.)

use crate::fmtbuf::FixedBuf;
use core::fmt::Write;
use std::sync::OnceLock;

// (the parsing rules live in settings.rs, which the launcher compiles too)
pub use crate::settings::{
    parse_bool, Config, Level, Number, CONFIG_MAX, DIAL_DELAY_MS, ENV_CONFIG, ENV_DISABLE,
    ENV_FAULT, ENV_LIVE, ENV_LOCAL, ENV_LOG, ENV_LOG_FILE, ENV_RUN_DIR, ENV_STATS, ENV_TRACE,
    LOCAL_DEFAULT, NEGATIVE_CACHE_SECS, RING_KIB, SPIN_US,
};

/// The configuration of this process: from the configuration file and its environment (under
/// secure execution: the default file alone, if it is root's).
fn from_env() -> Config {
    use std::os::unix::ffi::OsStringExt;
    let secure = secure_execution();
    let mut c = Config::load(
        |k| {
            (!secure)
                .then(|| std::env::var_os(k).map(|v| v.into_vec()))
                .flatten()
        },
        |path| crate::sys::read_config(path, CONFIG_MAX, secure),
    );
    c.secure = secure;
    // (getcwd(3) is not hooked; std asks it, and allocates, as the parsing above does)
    c.resolve_relative(|| {
        std::env::current_dir()
            .ok()
            .map(|d| d.into_os_string().into_vec())
    });
    if c.has_program_rules() {
        // The program: the name it was executed as, and its paths (as executed, if absolute;
        // the file's real one). A script is its own name and its interpreter's.
        let executed = crate::sys::exec_path().unwrap_or(b"");
        let mut buf = [0u8; 4096];
        let real = crate::sys::exe_path(&mut buf).unwrap_or(b"");
        let name = crate::rules::base_name(executed);
        let paths: [&[u8]; 2] = [
            if executed.starts_with(b"/") {
                executed
            } else {
                b""
            },
            real,
        ];
        c.resolve_program(|glob| crate::rules::program_matches(glob, name, &paths));
    } else {
        c.resolve_program(|_| false);
    }
    c
}

/// Whether the process runs under secure execution (`getauxval(AT_SECURE)`).
fn secure_execution() -> bool {
    static SECURE: OnceLock<bool> = OnceLock::new();
    *SECURE.get_or_init(crate::sys::secure_execution)
}

static CONFIG: OnceLock<Config> = OnceLock::new();

/// The process configuration (parsed on first use).
pub fn get() -> &'static Config {
    CONFIG.get_or_init(from_env)
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

    /// `rdmashim doctor` (the launcher, without the transport) says how many connections the
    /// shim's share of the mappings holds by the settings' figure: the transport's own.
    #[test]
    fn the_doctors_mappings_per_connection_are_the_transports() {
        assert_eq!(
            crate::settings::MAPPINGS_PER_RDMA_LINK as usize,
            rdmashim_core::Transport::Rdma.mappings_per_link()
        );
    }

    /// The doctor's figures of a connection's receive buffers are the transport's: the
    /// protocol's buffer sizes, and over WRITE WITH IMMEDIATE the default receive count.
    #[test]
    fn the_doctors_receive_buffers_are_the_transports() {
        use crate::settings::{LinkKind, CONTROL_BUF, SENDS_BUF};
        assert_eq!(SENDS_BUF as usize, rdmashim_proto::SENDS_BUF);
        assert_eq!(CONTROL_BUF as usize, rdmashim_proto::MAX_CONTROL_LEN);
        let d = rdmashim_core::StreamConfig::default();
        assert_eq!(LinkKind::Imm.receives(1 << 20).0, u64::from(d.recv_slots));
        assert_eq!(LinkKind::Sends.receives(512 << 10), (32, SENDS_BUF));
        assert_eq!(LinkKind::Sends.receives(16 << 10).0, 4);
        assert_eq!(LinkKind::Sends.receives(8 << 20).0, 64);
        assert_eq!(
            LinkKind::Srq.receives(512 << 10),
            LinkKind::Sends.receives(512 << 10)
        );
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
