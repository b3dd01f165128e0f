//! `rdmashim doctor`: what this host offers, and what would happen to a connection made now.
//!
//! The verdict follows the shim's own rules, through the shim's own code where it has one: the
//! configuration file and the environment are parsed by settings.rs (the library's parser: the
//! same keys, booleans, ranges, rules and warnings; the file's rules are rules.rs's, and
//! `--program` judges a program by them as the library would), the host probe's order (`disabled`, then `no_device`: any entry in
//! `/sys/class/infiniband`) is reason.rs's `host_reason_from`, and the libraries are opened
//! by the names and with the flags of the transport's loader. What the shim only finds out
//! when a connection tries, doctor looks at beforehand: whether one connection's rings fit
//! under RLIMIT_MEMLOCK (counting CAP_IPC_LOCK), and whether any port is ACTIVE.
//!
//! Exit status: 0 if connections can be upgraded (over RDMA, or between processes of this
//! host over shared memory), 1 if every connection will stay on TCP.

use crate::huge::HugePages;
use crate::json::Value;
use crate::reason::{host_reason_from, FallbackReason};
use crate::rules;
use crate::settings::{
    Config, FileRead, LinkKind, CONFIG_MAX, CONTROL_BUF, ENV_CONFIG, ENV_DISABLE, ENV_HUGE_PAGES,
    ENV_KIND, ENV_LOCAL, MAPPINGS_PER_RDMA_LINK, PINNED_MIB, RING_KIB,
};
use crate::sys;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Where the kernel lists RDMA devices.
const SYSFS: &str = "/sys/class/infiniband";
/// The libraries the transport loads (rdma-core/src/sys.rs, `LIBIBVERBS` and `LIBRDMACM`).
const LIBS: [&str; 2] = ["libibverbs.so.1", "librdmacm.so.1"];

/// Each connection's send queue depth (rdma-core/src/link.rs, `StreamConfig::default`, as the
/// shim uses it), each entry with a control-send buffer of a control message's size; its
/// receives and their buffers are its kind's (`LinkKind::receives`).
const SQ_DEPTH: u64 = 128;
/// The largest ring the transport makes (rdma-core/src/link.rs); the shim caps
/// `RDMASHIM_RING_KIB`'s ring there.
const MAX_RING: u64 = 8 << 20;
/// The ring a connection over RDMA starts with, or `RDMASHIM_RING_KIB`'s if smaller
/// (shim/src/upgrade/mod.rs, `START_RING`); it grows to `RDMASHIM_RING_KIB`'s when its
/// traffic needs it (ring moves).
const START_RING: u64 = 16 << 10;
/// capability(7): CAP_IPC_LOCK's bit. A process with it in its effective set may pin memory
/// beyond RLIMIT_MEMLOCK (the kernel's memory registration checks `capable(CAP_IPC_LOCK)`).
const CAP_IPC_LOCK: u32 = 14;

/// What `rdmashim doctor ARGS` asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Args {
    Report {
        json: bool,
        /// `--program PROG`: judge the configuration's rules for this program.
        program: Option<OsString>,
    },
    Help,
}

pub fn parse(args: &[OsString]) -> Result<Args, String> {
    let mut json = false;
    let mut program = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.to_str() {
            Some("--json") => json = true,
            Some("--program") => {
                program = Some(it.next().ok_or("doctor: --program needs a value")?.clone())
            }
            Some("-h" | "--help") => return Ok(Args::Help),
            _ => return Err(format!("doctor: unknown argument {a:?}")),
        }
    }
    Ok(Args::Report { json, program })
}

/// Reads the configuration file as the library does: a regular file of at most
/// [`CONFIG_MAX`] bytes.
pub fn read_config(path: &[u8]) -> FileRead {
    use std::io::Read;
    use std::os::unix::ffi::OsStrExt;
    let path = Path::new(std::ffi::OsStr::from_bytes(path));
    // (looked at before it is opened: opening a FIFO would wait for a writer)
    match fs::metadata(path) {
        Ok(m) if !m.is_file() => return FileRead::Failed("not a regular file".into()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return FileRead::Missing,
        _ => {}
    }
    let f = match fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return FileRead::Missing,
        Err(e) => return FileRead::Failed(e.to_string()),
    };
    match f.metadata() {
        Ok(m) if !m.is_file() => return FileRead::Failed("not a regular file".into()),
        Ok(m) if m.len() > CONFIG_MAX as u64 => return FileRead::TooBig(m.len()),
        Ok(_) => {}
        Err(e) => return FileRead::Failed(e.to_string()),
    }
    let mut text = Vec::new();
    match f.take(CONFIG_MAX as u64 + 1).read_to_end(&mut text) {
        Ok(n) if n > CONFIG_MAX => FileRead::TooBig(n as u64),
        Ok(_) => FileRead::Text(text),
        Err(e) => FileRead::Failed(e.to_string()),
    }
}

// ----- what doctor looks at -------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gid {
    pub index: String,
    pub gid: String,
    /// `RoCE v2`, `IB/RoCE v1`, ... (empty if the kernel does not say).
    pub kind: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Port {
    pub number: String,
    /// As sysfs words it: `4: ACTIVE`.
    pub state: String,
    pub phys_state: String,
    pub link_layer: String,
    /// The non-zero GIDs.
    pub gids: Vec<Gid>,
}

impl Port {
    fn active(&self) -> bool {
        self.state.contains("ACTIVE")
    }

    /// `port 1 ACTIVE, RoCE v2, address 10.99.0.1`.
    fn summary(&self) -> String {
        let mut s = format!("port {} ACTIVE", self.number);
        let has = |k: &str| self.gids.iter().any(|g| g.kind.contains(k));
        let kind = match self.link_layer.as_str() {
            "Ethernet" if has("RoCE v2") => "RoCE v2",
            "Ethernet" if has("RoCE v1") => "RoCE v1",
            "" => "",
            other => other,
        };
        if !kind.is_empty() {
            s += &format!(", {kind}");
        }
        let mut v4: Vec<String> = self.gids.iter().filter_map(|g| v4_of(&g.gid)).collect();
        v4.dedup();
        match v4.len() {
            0 => {}
            1 => s += &format!(", address {}", v4[0]),
            _ => s += &format!(", addresses {}", v4.join(" ")),
        }
        s
    }
}

/// The IPv4 address of an IPv4-mapped GID (`0000:...:ffff:0a63:0001` is 10.99.0.1).
fn v4_of(gid: &str) -> Option<String> {
    let g: Vec<u16> = gid
        .split(':')
        .map(|x| u16::from_str_radix(x, 16).ok())
        .collect::<Option<_>>()?;
    if g.len() != 8 || g[..5].iter().any(|x| *x != 0) || g[5] != 0xffff {
        return None;
    }
    let [a, b] = g[6].to_be_bytes();
    let [c, d] = g[7].to_be_bytes();
    Some(format!("{a}.{b}.{c}.{d}"))
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    pub name: String,
    pub node_type: String,
    pub netdevs: Vec<String>,
    pub ports: Vec<Port>,
}

/// RLIMIT_MEMLOCK in bytes (`None`: unlimited).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memlock {
    pub soft: Option<u64>,
    pub hard: Option<u64>,
}

/// Everything the verdict is drawn from.
#[derive(Debug, Clone)]
pub struct Facts {
    /// The configuration file and the environment, as the shim would read them (the program
    /// rules decided for [`Facts::program`]).
    pub config: Config,
    /// The program judged (`--program`), as given.
    pub program: Option<String>,
    pub devices: Vec<Device>,
    /// Each library, and why it does not load.
    pub libraries: Vec<(&'static str, Option<String>)>,
    pub memlock: Result<Memlock, String>,
    /// CAP_IPC_LOCK in the effective set (`None`: unknown).
    pub cap_ipc_lock: Option<bool>,
    pub page: u64,
    /// The host's memory (`None`: unknown).
    pub phys: Option<u64>,
    /// `vm.max_map_count`, the most memory mappings a process may hold (`None`: unknown).
    pub max_map_count: Option<u64>,
    /// The host's huge pages (`None`: the kernel has none).
    pub huge: Option<HugePages>,
}

fn read_trim(p: &Path) -> Option<String> {
    fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

fn sorted_entries(p: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(p)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort_by_key(|s| (s.parse::<u64>().unwrap_or(u64::MAX), s.clone()));
    v
}

fn devices(root: &Path) -> Vec<Device> {
    sorted_entries(root)
        .into_iter()
        .map(|d| {
            let base = root.join(&d);
            let ports = sorted_entries(&base.join("ports"))
                .into_iter()
                .map(|p| {
                    let pb = base.join("ports").join(&p);
                    let gids = sorted_entries(&pb.join("gids"))
                        .into_iter()
                        .filter_map(|g| {
                            let gid = read_trim(&pb.join("gids").join(&g))?;
                            if gid.chars().all(|c| c == '0' || c == ':') {
                                return None;
                            }
                            let kind =
                                read_trim(&pb.join("gid_attrs/types").join(&g)).unwrap_or_default();
                            Some(Gid {
                                index: g,
                                gid,
                                kind,
                            })
                        })
                        .collect();
                    Port {
                        state: read_trim(&pb.join("state")).unwrap_or_default(),
                        phys_state: read_trim(&pb.join("phys_state")).unwrap_or_default(),
                        link_layer: read_trim(&pb.join("link_layer")).unwrap_or_default(),
                        number: p,
                        gids,
                    }
                })
                .collect();
            Device {
                node_type: read_trim(&base.join("node_type")).unwrap_or_default(),
                netdevs: sorted_entries(&base.join("device/net")),
                ports,
                name: d,
            }
        })
        .collect()
}

/// Whether `/proc/PID/status` text says CAP_IPC_LOCK is in the effective set.
fn cap_ipc_lock(status: &str) -> Option<bool> {
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    let caps = u64::from_str_radix(hex.trim(), 16).ok()?;
    Some(caps & (1 << CAP_IPC_LOCK) != 0)
}

impl Facts {
    /// This host, and this process's environment and limits (a program started from here
    /// inherits both).
    pub fn gather(program: Option<&OsString>) -> Facts {
        use std::os::unix::ffi::{OsStrExt, OsStringExt};
        let mut config = Config::load(|k| std::env::var_os(k).map(|v| v.into_vec()), read_config);
        if let Some(prog) = program {
            // As the library sees it: the name it is executed as, and its paths (as executed
            // — found through PATH as exec finds it — and the file's real path).
            let path = std::env::var_os("PATH");
            let found = crate::program::resolve(prog, path.as_deref());
            let real = found.as_ref().and_then(|f| fs::canonicalize(f).ok());
            let name = rules::base_name(prog.as_bytes()).to_vec();
            let paths: Vec<Vec<u8>> = [found, real]
                .into_iter()
                .flatten()
                .map(|p| p.into_os_string().into_vec())
                .collect();
            let paths: Vec<&[u8]> = paths.iter().map(Vec::as_slice).collect();
            config.resolve_program(|g| rules::program_matches(g, &name, &paths));
        }
        Facts {
            config,
            program: program.map(|p| p.to_string_lossy().into_owned()),
            devices: devices(Path::new(SYSFS)),
            libraries: LIBS
                .iter()
                .map(|l| (*l, sys::try_dlopen(l).err()))
                .collect(),
            memlock: sys::memlock_limit()
                .map(|(soft, hard)| Memlock { soft, hard })
                .map_err(|e| e.to_string()),
            cap_ipc_lock: fs::read_to_string("/proc/self/status")
                .ok()
                .and_then(|s| cap_ipc_lock(&s)),
            page: sys::page_size(),
            phys: sys::phys_mem_bytes(),
            max_map_count: read_trim(Path::new("/proc/sys/vm/max_map_count"))
                .and_then(|s| s.parse().ok()),
            huge: HugePages::read(),
        }
    }
}

// ----- what the rings pin ---------------------------------------------------------------------

/// The memory one connection over RDMA registers, all of it pinned and counted against
/// RLIMIT_MEMLOCK (rdma-core/src/pool.rs, `Kit`): its receive ring and its send staging ring
/// (the peer's ring size, taken to be this side's), each a double mapping registered over both
/// views (rdma-core/src/ring.rs: the kernel counts every page of the registered range), and
/// its receive and control-send buffers, in whole pages. A connection over shared memory
/// registers nothing. Rings start small ([`START_RING`]) and grow to `RDMASHIM_RING_KIB`'s
/// when the connection's traffic needs them (ring moves): both figures. (READ pull takes no
/// moves: its rings start at their full size.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pinned {
    /// One ring's size, grown.
    pub ring: u64,
    /// Both rings, both views each, grown.
    pub rings: u64,
    /// One ring's size at the start.
    pub start_ring: u64,
    /// The receive and control-send buffers.
    pub buffers: u64,
}

impl Pinned {
    /// For `RDMASHIM_RING_KIB` = `ring_kib` and `RDMASHIM_KIND` = `kind`, with pages of
    /// `page` bytes. The ring is that many KiB rounded up to a power of two, at most 8 MiB (as
    /// shim/src/upgrade/mod.rs, `link_config`, makes it); the receives are the kind's.
    pub fn new(ring_kib: u64, kind: LinkKind, page: u64) -> Pinned {
        let ring = (ring_kib * 1024).next_power_of_two().min(MAX_RING);
        let pages = |n: u64| n.div_ceil(page) * page;
        let (recvs, buf) = kind.receives(ring);
        Pinned {
            ring,
            rings: 2 * 2 * ring,
            // (READ pull takes no ring moves: its rings start grown)
            start_ring: if kind.moves() {
                ring.min(START_RING)
            } else {
                ring
            },
            buffers: pages(recvs * buf) + pages(SQ_DEPTH * CONTROL_BUF),
        }
    }

    /// Grown.
    pub fn total(&self) -> u64 {
        self.rings + self.buffers
    }

    /// At the start (what an upgrade needs to fit).
    pub fn start_total(&self) -> u64 {
        2 * 2 * self.start_ring + self.buffers
    }
}

/// Whether a connection's grown rings are made of the host's huge pages (`rdmashim_core::ring`:
/// a ring of a multiple of their size, while the pool has them free), and the doctor's line
/// about it.
pub fn huge_pages(f: &Facts, p: &Pinned) -> (bool, String) {
    let Some(hp) = f.huge.filter(|h| h.size > 0) else {
        return (
            false,
            "huge pages: none on this kernel: rings take ordinary pages".into(),
        );
    };
    let pool = format!(
        "huge pages: {} each, {} of {} free and not promised",
        mib(hp.size as u64),
        hp.available,
        hp.total
    );
    let ring = usize::try_from(p.ring).unwrap_or(usize::MAX);
    if !f.config.huge_pages {
        (false, format!("{pool}; not used ({ENV_HUGE_PAGES} is off)"))
    } else if hp.total == 0 {
        (
            false,
            format!("{pool}: none set aside (vm.nr_hugepages): rings take ordinary pages"),
        )
    } else if !ring.is_multiple_of(hp.size) {
        (
            false,
            format!(
                "{pool}; not used: a grown ring ({}, {}) is smaller than a huge page",
                mib(p.ring),
                RING_KIB.name
            ),
        )
    } else {
        let rings = hp.available / (p.ring / hp.size as u64).max(1);
        (
            true,
            format!(
                "{pool}: grown rings of {} are made of them, room for {rings} such rings now \
                 (then ordinary pages; {ENV_HUGE_PAGES}=off: never)",
                mib(p.ring)
            ),
        )
    }
}

// ----- the verdict ----------------------------------------------------------------------------

/// Why connections stay on TCP, and what would change it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Why {
    pub reason: FallbackReason,
    pub detail: String,
    pub fix: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Connections to other hosts: upgraded over these devices (with their ACTIVE ports
    /// described), or why they stay TCP.
    pub rdma: Result<Vec<(String, String)>, Why>,
    /// Connections between processes of this host move to shared-memory rings.
    pub same_host: bool,
    /// What one connection over RDMA pins.
    pub pinned: Pinned,
    /// How many connections over RDMA fit under RLIMIT_MEMLOCK (`None`: no limit applies,
    /// or it is unknown).
    pub room: Option<u64>,
    /// The shim's own cap on what a process's rings pin (`RDMASHIM_PINNED_MIB`), bytes, and
    /// how many connections over RDMA fit under it (`None`: no cap, the host's memory unknown).
    pub cap: Option<(u64, u64)>,
    /// The shim's share of a process's memory mappings (half of `vm.max_map_count`), and how
    /// many connections over RDMA fit in it (`None`: the bound is unknown).
    pub maps: Option<(u64, u64)>,
    /// The program judged (`--program`).
    pub program: Option<String>,
}

impl Verdict {
    /// 0 if some connections can be upgraded, 1 if none can.
    pub fn exit_code(&self) -> u8 {
        if self.rdma.is_ok() || self.same_host {
            0
        } else {
            1
        }
    }
}

/// `512 KiB`, `2 MiB`, `2.01 MiB` (not a whole number of them).
fn mib(v: u64) -> String {
    let (unit, name) = if v < 1 << 20 {
        (1u64 << 10, "KiB")
    } else {
        (1 << 20, "MiB")
    };
    if v & (unit - 1) == 0 {
        format!("{} {name}", v / unit)
    } else {
        format!("{:.2} {name}", v as f64 / unit as f64)
    }
}

/// The verdict, by the shim's rules (module documentation).
pub fn judge(f: &Facts) -> Verdict {
    let c = &f.config;
    let pinned = Pinned::new(c.ring_kib, c.kind, f.page);
    let room = match (&f.memlock, f.cap_ipc_lock) {
        (_, Some(true)) | (Err(_), _) | (Ok(Memlock { soft: None, .. }), _) => None,
        (Ok(Memlock { soft: Some(s), .. }), _) => Some(s / pinned.start_total()),
    };
    let cap = c.pinned_cap(f.phys).map(|b| (b, b / pinned.start_total()));
    let why = |reason: FallbackReason, detail: String, fix: &str| Why {
        reason,
        detail,
        fix: fix.to_string(),
    };
    let missing: Vec<String> = f
        .libraries
        .iter()
        .filter_map(|(l, e)| e.as_ref().map(|e| format!("{l}: {e}")))
        .collect();
    let active: Vec<(String, String)> = f
        .devices
        .iter()
        .filter_map(|d| {
            let ports: Vec<String> = d
                .ports
                .iter()
                .filter(|p| p.active())
                .map(Port::summary)
                .collect();
            (!ports.is_empty()).then(|| (d.name.clone(), ports.join("; ")))
        })
        .collect();
    let rdma = match host_reason_from(c.disabled, || !f.devices.is_empty()) {
        Some(r @ FallbackReason::Disabled) => Err(why(
            r,
            format!("{ENV_DISABLE} is set"),
            &format!("unset {ENV_DISABLE}, or set it to 0"),
        )),
        Some(r) => Err(why(
            r,
            r.describe().to_string(),
            "an RDMA device: a NIC's RDMA driver, or soft-RoCE on an Ethernet interface \
             (as root: rdma link add rxe0 type rxe netdev IFACE)",
        )),
        None if !missing.is_empty() => Err(why(
            FallbackReason::LibrariesMissing,
            missing.join("; "),
            "rdma-core's libraries and the device's provider (Debian: libibverbs1, \
             librdmacm1, ibverbs-providers)",
        )),
        None if room == Some(0) => Err(why(
            FallbackReason::Memlock,
            format!(
                "RLIMIT_MEMLOCK {} is below the {} one connection's rings pin: their \
                 registration fails and the connection stays on TCP (the dialing side counts \
                 it resources)",
                mib(f.memlock.as_ref().ok().and_then(|m| m.soft).unwrap_or(0)),
                mib(pinned.start_total())
            ),
            &format!(
                "a memlock limit of at least {} KiB per connection (ulimit -l; memlock in \
                 limits.conf, LimitMEMLOCK= for a systemd service), or CAP_IPC_LOCK, or a \
                 smaller {}",
                pinned.start_total().div_ceil(1024),
                RING_KIB.name
            ),
        )),
        None if active.is_empty() => Err(why(
            FallbackReason::PeerUnreachable,
            "no port of any RDMA device is ACTIVE: the shim will dial, and its dials fail \
             (counted peer_unreachable, or upgrade_timeout)"
                .to_string(),
            "a port that is up (its link, and its network interface: ip link set IFACE up)",
        )),
        None => Ok(active),
    };
    // (after `disabled`, before anything of the host's, as `probe::process_reason` does)
    let denied = (!c.disabled).then(|| c.program_denied()).flatten();
    let rdma = match denied {
        Some(rule) => Err(why(
            FallbackReason::Policy,
            format!(
                "{}:{}: {rule}",
                String::from_utf8_lossy(c.file.path.as_deref().unwrap_or(b"")),
                rule.line
            ),
            &format!(
                "a rule that allows this program before line {} of the configuration file, \
                 or that line removed (or {ENV_CONFIG}=none, for a trial)",
                rule.line
            ),
        )),
        None => rdma,
    };
    Verdict {
        rdma,
        same_host: !c.disabled && denied.is_none() && c.local,
        pinned,
        room,
        cap,
        maps: f
            .max_map_count
            .map(|m| (m / 2, m / 2 / MAPPINGS_PER_RDMA_LINK)),
        program: f.program.clone(),
    }
}

// ----- the report -----------------------------------------------------------------------------

fn print_devices(devs: &[Device]) {
    if devs.is_empty() {
        println!("RDMA devices ({SYSFS}): none");
        return;
    }
    println!("RDMA devices ({SYSFS}):");
    for d in devs {
        let netdevs = if d.netdevs.is_empty() {
            String::new()
        } else {
            format!(", netdev {}", d.netdevs.join(","))
        };
        println!("  {}: node_type {}{netdevs}", d.name, d.node_type);
        for p in &d.ports {
            println!(
                "    port {}: state {}, phys_state {}, link_layer {}",
                p.number, p.state, p.phys_state, p.link_layer
            );
            for g in &p.gids {
                println!("      gid[{}] {} {}", g.index, g.gid, g.kind);
            }
        }
    }
}

/// The verdict line.
fn verdict_line(v: &Verdict) -> String {
    let same_host = |rdma_ok: bool| {
        if v.same_host {
            "connections between processes of this host move to shared-memory rings"
        } else if rdma_ok {
            // (transport_for: only a loopback peer is shared memory's; the host's own
            // address is then RDMA's, over the device)
            "loopback connections stay on TCP (RDMASHIM_LOCAL is off; those to this host's own \
             RDMA address go over the device)"
        } else {
            "connections between processes of this host stay on TCP too (RDMASHIM_LOCAL is off)"
        }
    };
    match &v.rdma {
        Err(w) if w.reason == FallbackReason::Disabled => format!(
            "verdict: every connection will stay on TCP ({}: {})",
            w.reason.name(),
            w.detail
        ),
        Err(w) if w.reason == FallbackReason::Policy => format!(
            "verdict: every connection of {} will stay on TCP ({}: {})",
            v.program.as_deref().unwrap_or("this program"),
            w.reason.name(),
            w.detail
        ),
        Err(w) => format!(
            "verdict: connections to other hosts will stay on TCP ({}: {}); {}",
            w.reason.name(),
            w.detail,
            same_host(false)
        ),
        Ok(devs) => {
            let over: Vec<String> = devs.iter().map(|(d, p)| format!("{d} ({p})")).collect();
            format!(
                "verdict: connections to peers running rdmashim will be upgraded over {}; {}",
                over.join(", "),
                same_host(true)
            )
        }
    }
}

fn report(f: &Facts, v: &Verdict) {
    for w in &f.config.warnings {
        println!("warning: {w}");
    }
    print_devices(&f.devices);
    for (l, e) in &f.libraries {
        match e {
            None => println!("{l}: loads"),
            Some(e) => println!("{l}: does not load ({e})"),
        }
    }
    match crate::find_lib(None) {
        Ok(p) => println!("shim library: {}", p.display()),
        Err(e) => println!("shim library: {e}"),
    }
    println!("config file: {}", f.config.file.describe());
    for line in rule_lines(f) {
        println!("{line}");
    }
    let onoff = |b: bool| if b { "on" } else { "off" };
    println!(
        "settings: {ENV_DISABLE} {}, {ENV_LOCAL} {}, {} {}, {ENV_KIND} {}",
        onoff(f.config.disabled),
        onoff(f.config.local),
        RING_KIB.name,
        f.config.ring_kib,
        f.config.kind.name()
    );
    let p = v.pinned;
    println!(
        "memory: a connection over RDMA pins {} at first ({} of rings: its {} receive ring and \
         a send staging ring of the peer's size, each registered over both views of its double \
         mapping; and {} of buffers), up to {} once its traffic grows its rings to {}'s {} \
         (and the peer's); one over shared memory pins nothing",
        mib(p.start_total()),
        mib(4 * p.start_ring),
        mib(p.start_ring),
        mib(p.buffers),
        mib(p.total()),
        RING_KIB.name,
        mib(p.ring)
    );
    match &f.memlock {
        Ok(m) => {
            let show = |v: Option<u64>| v.map_or("unlimited".to_string(), mib);
            let cap = match f.cap_ipc_lock {
                Some(true) => "; CAP_IPC_LOCK is in the effective set, so the limit does not apply",
                Some(false) => "; no CAP_IPC_LOCK",
                None => "; CAP_IPC_LOCK unknown",
            };
            let room = match (v.room, m.soft) {
                (Some(n), Some(soft)) => {
                    format!("{n} ({} with grown rings)", soft / v.pinned.total())
                }
                _ => "any number of".to_string(),
            };
            println!(
                "RLIMIT_MEMLOCK: soft {}, hard {}{cap} -> room for {room} connections over RDMA \
                 per process",
                show(m.soft),
                show(m.hard)
            );
        }
        Err(e) => println!("RLIMIT_MEMLOCK: unknown ({e})"),
    }
    match v.cap {
        Some((bytes, n)) => {
            let whose = match (f.config.pinned_mib, f.phys) {
                (0, Some(p)) => format!(" (the default: a quarter of this host's {})", mib(p)),
                _ => String::new(),
            };
            println!(
                "{}: {}{whose} -> room for {n} connections over RDMA per process ({} with grown \
                 rings); past it new ones stay TCP (resources), and rings stop growing",
                PINNED_MIB.name,
                mib(bytes),
                bytes / v.pinned.total()
            );
        }
        None => println!(
            "{}: no cap (the host's memory is unknown): RLIMIT_MEMLOCK alone",
            PINNED_MIB.name
        ),
    }
    println!("{}", huge_pages(f, &p).1);
    match v.maps {
        Some((share, n)) => println!(
            "vm.max_map_count: {} -> the shim's share, half: room for {n} connections over RDMA \
             per process ({MAPPINGS_PER_RDMA_LINK} mappings each; {} over shared memory, 4 \
             each); past it new ones stay TCP (resources): the other half stays the program's",
            share * 2,
            share / 4
        ),
        None => println!("vm.max_map_count: unknown: no share of the shim's"),
    }
    match &v.rdma {
        Err(w) if matches!(w.reason, FallbackReason::Disabled | FallbackReason::Policy) => {
            println!("to upgrade connections: {}", w.fix)
        }
        Err(w) => println!("to upgrade connections to other hosts: {}", w.fix),
        Ok(_) => {}
    }
    println!("{}", verdict_line(v));
}

/// The rules, one line each, and what they mean for the program judged.
fn rule_lines(f: &Facts) -> Vec<String> {
    let c = &f.config;
    if c.rules.is_empty() {
        return vec!["rules: none (every connection may upgrade)".into()];
    }
    let mut v = vec!["rules (the first that matches decides; none: allow):".to_string()];
    for r in &c.rules {
        v.push(format!("  line {}: {r}", r.line));
    }
    match &f.program {
        Some(p) => v.push(match c.program_denied() {
            Some(r) => format!("program {p}: denied by line {} ({r})", r.line),
            None if c.policy.allows_all() => format!("program {p}: every connection allowed"),
            None => format!(
                "program {p}: {} connection rule(s) decide per connection{}",
                c.policy.rules.len(),
                c.policy.end.map_or(String::new(), |e| format!(
                    ", then line {}: {}",
                    e.line,
                    e.action.name()
                ))
            ),
        }),
        None if c.has_program_rules() => v.push(
            "program rules are judged for one program: rdmashim doctor --program NAME".into(),
        ),
        None => {}
    }
    v
}

/// The whole report as one JSON object.
pub fn to_json(f: &Facts, v: &Verdict) -> Value {
    use Value::*;
    let devices = f
        .devices
        .iter()
        .map(|d| {
            let ports = d
                .ports
                .iter()
                .map(|p| {
                    let gids = p
                        .gids
                        .iter()
                        .map(|g| {
                            Obj(vec![
                                ("index", Value::str(&g.index)),
                                ("gid", Value::str(&g.gid)),
                                ("type", Value::str(&g.kind)),
                            ])
                        })
                        .collect();
                    Obj(vec![
                        ("port", Value::str(&p.number)),
                        ("state", Value::str(&p.state)),
                        ("active", Bool(p.active())),
                        ("phys_state", Value::str(&p.phys_state)),
                        ("link_layer", Value::str(&p.link_layer)),
                        ("gids", Arr(gids)),
                    ])
                })
                .collect();
            Obj(vec![
                ("name", Value::str(&d.name)),
                ("node_type", Value::str(&d.node_type)),
                ("netdevs", Arr(d.netdevs.iter().map(Value::str).collect())),
                ("ports", Arr(ports)),
            ])
        })
        .collect();
    let libraries = f
        .libraries
        .iter()
        .map(|(l, e)| {
            Obj(vec![
                ("name", Value::str(*l)),
                ("loads", Bool(e.is_none())),
                ("error", Value::opt(e.clone(), Str)),
            ])
        })
        .collect();
    let memlock = match &f.memlock {
        Ok(m) => Obj(vec![
            ("soft", Value::opt(m.soft, Num)),
            ("hard", Value::opt(m.hard, Num)),
            ("cap_ipc_lock", Value::opt(f.cap_ipc_lock, Bool)),
            ("connections", Value::opt(v.room, Num)),
        ]),
        Err(e) => Obj(vec![("error", Value::str(e))]),
    };
    let pinned_cap = Obj(vec![
        ("bytes", Value::opt(v.cap.map(|c| c.0), Num)),
        ("connections", Value::opt(v.cap.map(|c| c.1), Num)),
        ("host_memory", Value::opt(f.phys, Num)),
    ]);
    let huge = Obj(vec![
        ("page_bytes", Value::opt(f.huge.map(|h| h.size as u64), Num)),
        ("total", Value::opt(f.huge.map(|h| h.total), Num)),
        ("available", Value::opt(f.huge.map(|h| h.available), Num)),
        ("enabled", Bool(f.config.huge_pages)),
        ("grown_rings_use_them", Bool(huge_pages(f, &v.pinned).0)),
    ]);
    let mappings = Obj(vec![
        ("max_map_count", Value::opt(f.max_map_count, Num)),
        ("shim_share", Value::opt(v.maps.map(|m| m.0), Num)),
        ("connections", Value::opt(v.maps.map(|m| m.1), Num)),
    ]);
    let (verdict, upgrade_devices, reason, detail, fix) = match &v.rdma {
        Ok(d) => (
            "upgrade",
            d.iter().map(|(n, _)| Value::str(n)).collect(),
            Null,
            Null,
            Null,
        ),
        Err(w) => (
            if v.same_host { "same_host_only" } else { "tcp" },
            vec![],
            Value::str(w.reason.name()),
            Value::str(&w.detail),
            Value::str(&w.fix),
        ),
    };
    Obj(vec![
        ("version", Value::str(crate::VERSION)),
        ("devices", Arr(devices)),
        ("libraries", Arr(libraries)),
        (
            "shim_library",
            Value::opt(crate::find_lib(None).ok(), |p: PathBuf| {
                Value::str(p.to_string_lossy())
            }),
        ),
        (
            "settings",
            Obj(vec![
                ("disabled", Bool(f.config.disabled)),
                ("local", Bool(f.config.local)),
                ("ring_kib", Num(f.config.ring_kib)),
                ("kind", Value::str(f.config.kind.name())),
                (
                    "warnings",
                    Arr(f.config.warnings.iter().map(Value::str).collect()),
                ),
            ]),
        ),
        (
            "config",
            Obj(vec![
                (
                    "file",
                    Value::opt(f.config.file.path.as_deref(), |p: &[u8]| {
                        Value::str(String::from_utf8_lossy(p))
                    }),
                ),
                ("status", Value::str(f.config.file.describe())),
                (
                    "rules",
                    Arr(f
                        .config
                        .rules
                        .iter()
                        .map(|r| {
                            Obj(vec![
                                ("line", Num(u64::from(r.line))),
                                ("rule", Value::str(r.to_string())),
                            ])
                        })
                        .collect()),
                ),
                ("program", Value::opt(f.program.clone(), Value::str)),
                (
                    "program_denied_by_line",
                    Value::opt(f.config.program_denied().map(|r| r.line), |l| {
                        Num(u64::from(l))
                    }),
                ),
            ]),
        ),
        ("memlock", memlock),
        ("pinned_cap", pinned_cap),
        ("mappings", mappings),
        ("huge_pages", huge),
        (
            "per_connection_bytes",
            Obj(vec![
                ("rdma", Num(v.pinned.total())),
                ("ring", Num(v.pinned.ring)),
                ("rdma_start", Num(v.pinned.start_total())),
                ("ring_start", Num(v.pinned.start_ring)),
                ("shared_memory", Num(0)),
            ]),
        ),
        ("verdict", Value::str(verdict)),
        ("upgrade_devices", Arr(upgrade_devices)),
        ("same_host", Bool(v.same_host)),
        ("reason", reason),
        ("detail", detail),
        ("fix", fix),
        ("exit", Num(u64::from(v.exit_code()))),
    ])
}

pub fn doctor(json: bool, program: Option<&OsString>) -> ExitCode {
    let f = Facts::gather(program);
    let v = judge(&f);
    if json {
        println!("{}", to_json(&f, &v));
    } else {
        report(&f, &v);
    }
    ExitCode::from(v.exit_code())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(state: &str, gids: &[(&str, &str)]) -> Port {
        Port {
            number: "1".into(),
            state: state.into(),
            phys_state: "5: LinkUp".into(),
            link_layer: "Ethernet".into(),
            gids: gids
                .iter()
                .enumerate()
                .map(|(i, (gid, kind))| Gid {
                    index: i.to_string(),
                    gid: gid.to_string(),
                    kind: kind.to_string(),
                })
                .collect(),
        }
    }

    fn rxe(state: &str) -> Device {
        Device {
            name: "rxe0".into(),
            node_type: "1: CA".into(),
            netdevs: vec![],
            ports: vec![port(
                state,
                &[
                    ("fe80:0000:0000:0000:0000:0000:0000:0001", "RoCE v2"),
                    ("0000:0000:0000:0000:0000:ffff:0a63:0001", "IB/RoCE v1"),
                    ("0000:0000:0000:0000:0000:ffff:0a63:0001", "RoCE v2"),
                ],
            )],
        }
    }

    /// A healthy host, with the environment `vars`.
    fn facts(vars: &[(&str, &str)]) -> Facts {
        Facts {
            config: Config::from_lookup(|k| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.as_bytes().to_vec())
            }),
            program: None,
            devices: vec![rxe("4: ACTIVE")],
            libraries: LIBS.iter().map(|l| (*l, None)).collect(),
            memlock: Ok(Memlock {
                soft: Some(8 << 20),
                hard: Some(8 << 20),
            }),
            cap_ipc_lock: Some(false),
            page: 4096,
            phys: Some(16 << 30),
            max_map_count: Some(65530),
            huge: Some(HugePages {
                size: 2 << 20,
                total: 0,
                available: 0,
            }),
        }
    }

    fn reason(v: &Verdict) -> Option<&'static str> {
        v.rdma.as_ref().err().map(|w| w.reason.name())
    }

    #[test]
    fn huge_pages_for_grown_rings() {
        let pool = |total, available| {
            Some(HugePages {
                size: 2 << 20,
                total,
                available,
            })
        };
        // the default 512 KiB rings are smaller than a huge page
        let mut f = facts(&[]);
        f.huge = pool(64, 64);
        let (used, line) = huge_pages(&f, &Pinned::new(f.config.ring_kib, f.config.kind, 4096));
        assert!(!used && line.contains("smaller than a huge page"), "{line}");
        // 4 MiB rings: two huge pages each
        let mut f = facts(&[("RDMASHIM_RING_KIB", "4096")]);
        f.huge = pool(64, 10);
        let (used, line) = huge_pages(&f, &Pinned::new(f.config.ring_kib, f.config.kind, 4096));
        assert!(used, "{line}");
        assert!(
            line.contains("10 of 64 free") && line.contains("room for 5 such rings"),
            "{line}"
        );
        // no pool set aside, turned off, no huge pages at all
        f.huge = pool(0, 0);
        let (used, line) = huge_pages(&f, &Pinned::new(f.config.ring_kib, f.config.kind, 4096));
        assert!(!used && line.contains("vm.nr_hugepages"), "{line}");
        let mut f = facts(&[("RDMASHIM_RING_KIB", "4096"), ("RDMASHIM_HUGE_PAGES", "0")]);
        f.huge = pool(64, 64);
        let (used, line) = huge_pages(&f, &Pinned::new(f.config.ring_kib, f.config.kind, 4096));
        assert!(
            !used && line.contains("RDMASHIM_HUGE_PAGES is off"),
            "{line}"
        );
        f.huge = None;
        assert!(!huge_pages(&f, &Pinned::new(f.config.ring_kib, f.config.kind, 4096)).0);
    }

    #[test]
    fn what_a_connection_pins() {
        // The default 512 KiB ring: two rings, both views, and 4 + 8 KiB of buffers.
        let p = Pinned::new(RING_KIB.default, LinkKind::Imm, 4096);
        assert_eq!(p.ring, 512 << 10);
        assert_eq!(p.total(), 4 * (512 << 10) + (4 << 10) + (8 << 10));
        // It starts with 16 KiB rings (or the knob's, if smaller).
        assert_eq!(p.start_total(), 4 * (16 << 10) + (4 << 10) + (8 << 10));
        assert_eq!(Pinned::new(8, LinkKind::Imm, 4096).start_ring, 8 << 10);
        // Rounded up to a power of two, capped at 8 MiB; buffers in whole pages.
        assert_eq!(Pinned::new(600, LinkKind::Imm, 4096).ring, 1 << 20);
        assert_eq!(Pinned::new(8192, LinkKind::Imm, 4096).ring, 8 << 20);
        assert_eq!(Pinned::new(4, LinkKind::Imm, 65536).buffers, 2 * 65536);
        // Over sends, 16 KiB receives, as many as the largest ring holds (4 to 64).
        let s = Pinned::new(RING_KIB.default, LinkKind::Sends, 4096);
        assert_eq!(s.buffers, 32 * (16 << 10) + (8 << 10));
        assert_eq!(s.start_total(), 4 * (16 << 10) + (512 << 10) + (8 << 10));
        assert_eq!(
            Pinned::new(16, LinkKind::Sends, 4096).buffers,
            4 * (16 << 10) + (8 << 10)
        );
        // READ pull: no ring moves, so the rings are at their full size from the start.
        let r = Pinned::new(RING_KIB.default, LinkKind::Read, 4096);
        assert_eq!(r.start_total(), r.total());
        assert_eq!(r.total(), p.total());
    }

    #[test]
    fn a_healthy_host_upgrades_over_its_active_device() {
        let f = facts(&[]);
        let v = judge(&f);
        assert_eq!(
            v.rdma,
            Ok(vec![(
                "rxe0".to_string(),
                "port 1 ACTIVE, RoCE v2, address 10.99.0.1".to_string()
            )])
        );
        assert!(v.same_host);
        // 8 MiB over 64 + 12 KiB per connection at the start
        assert_eq!(v.room, Some(107));
        assert_eq!(v.exit_code(), 0);
        let line = verdict_line(&v);
        assert_eq!(
            line,
            "verdict: connections to peers running rdmashim will be upgraded over rxe0 \
             (port 1 ACTIVE, RoCE v2, address 10.99.0.1); connections between processes of \
             this host move to shared-memory rings"
        );
        let off = facts(&[("RDMASHIM_LOCAL", "off")]);
        let v = judge(&off);
        assert!(v.rdma.is_ok() && !v.same_host && v.exit_code() == 0);
        assert!(verdict_line(&v).ends_with("go over the device)"));
    }

    #[test]
    fn the_shims_order_of_reasons() {
        // disabled before everything, by the shim's parsing (an unreadable value disables)
        for val in ["1", "YES", "banana"] {
            let mut f = facts(&[("RDMASHIM_DISABLE", val)]);
            f.devices.clear();
            let v = judge(&f);
            assert_eq!(reason(&v), Some("disabled"), "{val}");
            assert!(!v.same_host);
            assert_eq!(v.exit_code(), 1);
            assert!(verdict_line(&v)
                .starts_with("verdict: every connection will stay on TCP (disabled: "));
        }
        assert!(judge(&facts(&[("RDMASHIM_DISABLE", "FALSE")])).rdma.is_ok());
        // then no device
        let mut f = facts(&[]);
        f.devices.clear();
        f.libraries[0].1 = Some("not found".into());
        let v = judge(&f);
        assert_eq!((reason(&v), v.exit_code()), (Some("no_device"), 0));
        let line = verdict_line(&v);
        assert!(
            line.starts_with("verdict: connections to other hosts will stay on TCP (no_device: ")
        );
        assert!(line
            .ends_with("connections between processes of this host move to shared-memory rings"));
        // and nothing at all with same-host upgrades off
        let mut f = facts(&[("RDMASHIM_LOCAL", "0")]);
        f.devices.clear();
        let v = judge(&f);
        assert_eq!((reason(&v), v.exit_code()), (Some("no_device"), 1));
        assert!(verdict_line(&v).ends_with("stay on TCP too (RDMASHIM_LOCAL is off)"));
        // then the libraries
        let mut f = facts(&[]);
        f.libraries[1].1 = Some("librdmacm.so.1: cannot open shared object file".into());
        let v = judge(&f);
        assert_eq!(reason(&v), Some("libraries_missing"));
        assert!(v.rdma.unwrap_err().detail.contains("librdmacm.so.1"));
    }

    #[test]
    fn memlock_and_cap_ipc_lock() {
        let mut f = facts(&[]);
        f.memlock = Ok(Memlock {
            soft: Some(64 << 10),
            hard: Some(64 << 10),
        });
        let v = judge(&f);
        assert_eq!((reason(&v), v.room), (Some("memlock"), Some(0)));
        assert!(v.rdma.unwrap_err().fix.contains("at least 76 KiB"));
        // A smaller ring fits: 4 KiB rings pin 16 KiB + 12 KiB.
        let mut small = f.clone();
        small.config = Config::from_lookup(|k| (k == "RDMASHIM_RING_KIB").then(|| b"4".to_vec()));
        assert_eq!(judge(&small).room, Some(2));
        // CAP_IPC_LOCK lifts the limit; so does an unlimited one.
        f.cap_ipc_lock = Some(true);
        assert_eq!(judge(&f).room, None);
    }

    #[test]
    fn the_pinned_memory_cap() {
        // By default a quarter of the host's memory (16 GiB here), in connections of 76 KiB
        // (their start).
        let per = 4 * (16 << 10) + (12 << 10);
        let v = judge(&facts(&[]));
        assert_eq!(v.cap, Some((4 << 30, (4 << 30) / per)));
        // The knob, in MiB.
        let v = judge(&facts(&[("RDMASHIM_PINNED_MIB", "100")]));
        assert_eq!(v.cap, Some((100 << 20, (100 << 20) / per)));
        // Unknown memory, no knob: no cap of the shim's own.
        let mut f = facts(&[]);
        f.phys = None;
        assert_eq!(judge(&f).cap, None);
        let j = to_json(&f, &judge(&f)).to_string();
        assert!(
            j.contains(r#""pinned_cap":{"bytes":null,"connections":null,"host_memory":null}"#),
            "{j}"
        );
        let f = facts(&[]);
        let j = to_json(&f, &judge(&f)).to_string();
        let want = format!(
            r#""pinned_cap":{{"bytes":{},"connections":{},"host_memory":{}}}"#,
            4u64 << 30,
            (4u64 << 30) / per,
            16u64 << 30
        );
        assert!(j.contains(&want), "{j}");
        assert!(judge(&f).rdma.is_ok());
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t0000000000004000\n";
        assert_eq!(cap_ipc_lock(status), Some(true));
        assert_eq!(cap_ipc_lock("CapEff:\t000001fffeffbfff\n"), Some(false));
        assert_eq!(cap_ipc_lock("Name:\tx\n"), None);
    }

    #[test]
    fn no_active_port() {
        let mut f = facts(&[]);
        f.devices = vec![rxe("1: DOWN")];
        let v = judge(&f);
        assert_eq!((reason(&v), v.exit_code()), (Some("peer_unreachable"), 0));
        assert!(v.rdma.unwrap_err().detail.contains("ACTIVE"));
    }

    #[test]
    fn mapped_gids() {
        assert_eq!(
            v4_of("0000:0000:0000:0000:0000:ffff:c0a8:0102").as_deref(),
            Some("192.168.1.2")
        );
        assert_eq!(v4_of("fe80:0000:0000:0000:0000:ffff:c0a8:0102"), None);
        assert_eq!(v4_of("nonsense"), None);
    }

    #[test]
    fn arguments() {
        let os = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(
            parse(&os(&[])),
            Ok(Args::Report {
                json: false,
                program: None
            })
        );
        assert_eq!(
            parse(&os(&["--json"])),
            Ok(Args::Report {
                json: true,
                program: None
            })
        );
        assert_eq!(
            parse(&os(&["--program", "sshd", "--json"])),
            Ok(Args::Report {
                json: true,
                program: Some("sshd".into())
            })
        );
        assert!(parse(&os(&["--program"])).is_err());
        assert_eq!(parse(&os(&["--json", "-h"])), Ok(Args::Help));
        assert!(parse(&os(&["--verbose"])).is_err());
    }

    #[test]
    fn a_program_the_rules_deny() {
        let mut f = facts(&[]);
        f.config.parse_file(
            b"/etc/rdmashim.conf",
            b"deny port = 22\ndeny program = sshd\n",
        );
        f.config.file.path = Some(b"/etc/rdmashim.conf".to_vec());
        // no program named: the rules are listed, the verdict is the host's
        assert!(judge(&f).rdma.is_ok());
        assert!(rule_lines(&f).last().unwrap().contains("--program"));
        // sshd: a connection rule comes first, so not the whole program
        f.program = Some("sshd".into());
        f.config
            .resolve_program(|g| rules::program_matches(g, b"sshd", &[]));
        assert!(judge(&f).rdma.is_ok());
        // with the program rule first, denied as a whole
        let mut f = facts(&[]);
        f.config.parse_file(
            b"/etc/rdmashim.conf",
            b"# ssh stays TCP\ndeny program = sshd\n",
        );
        f.config.file.path = Some(b"/etc/rdmashim.conf".to_vec());
        f.program = Some("sshd".into());
        f.config
            .resolve_program(|g| rules::program_matches(g, b"sshd", &[]));
        let v = judge(&f);
        assert_eq!(
            (reason(&v), v.exit_code(), v.same_host),
            (Some("policy"), 1, false)
        );
        assert_eq!(
            verdict_line(&v),
            "verdict: every connection of sshd will stay on TCP (policy: \
             /etc/rdmashim.conf:2: deny program = sshd)"
        );
        assert_eq!(
            rule_lines(&f).last().unwrap(),
            "program sshd: denied by line 2 (deny program = sshd)"
        );
        let j = to_json(&f, &v).to_string();
        for want in [
            r#""reason":"policy""#,
            r#""program_denied_by_line":2"#,
            r#""rules":[{"line":2,"rule":"deny program = sshd"}]"#,
            r#""verdict":"tcp""#,
        ] {
            assert!(j.contains(want), "{want} missing: {j}");
        }
        // disabled still comes first
        let mut d = f.clone();
        d.config.disabled = true;
        assert_eq!(reason(&judge(&d)), Some("disabled"));
    }

    #[test]
    fn reads_the_file_as_the_library_does() {
        let dir = std::env::temp_dir().join(format!("rdmashim-doctor-conf-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let p = |n: &str| dir.join(n).into_os_string().into_encoded_bytes();
        assert_eq!(read_config(&p("absent")), FileRead::Missing);
        assert_eq!(
            read_config(dir.as_os_str().as_encoded_bytes()),
            FileRead::Failed("not a regular file".into())
        );
        fs::write(dir.join("ok"), "ring_kib = 8\n").unwrap();
        assert_eq!(
            read_config(&p("ok")),
            FileRead::Text(b"ring_kib = 8\n".to_vec())
        );
        fs::write(dir.join("big"), vec![b'#'; CONFIG_MAX + 1]).unwrap();
        assert_eq!(
            read_config(&p("big")),
            FileRead::TooBig(CONFIG_MAX as u64 + 1)
        );
        fs::write(dir.join("max"), vec![b'#'; CONFIG_MAX]).unwrap();
        assert!(matches!(read_config(&p("max")), FileRead::Text(t) if t.len() == CONFIG_MAX));
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn json_of_a_verdict() {
        let f = facts(&[("RDMASHIM_RING_KIB", "banana")]);
        let j = to_json(&f, &judge(&f)).to_string();
        for want in [
            r#""verdict":"upgrade""#,
            r#""upgrade_devices":["rxe0"]"#,
            r#""reason":null"#,
            r#""rdma":2109440"#,
            r#""rdma_start":77824"#,
            r#""connections":107"#,
            r#""exit":0"#,
            "RDMASHIM_RING_KIB=banana: not a whole number",
        ] {
            assert!(j.contains(want), "{want} missing: {j}");
        }
    }
}
