//! `rdmashim doctor`: what this host offers, and what would happen to a connection made now.

use crate::reason::FallbackReason;
use crate::sys;
use std::fs;
use std::path::Path;
use std::process::ExitCode;

/// Where the kernel lists RDMA devices.
const SYSFS: &str = "/sys/class/infiniband";
const LIBS: [&str; 2] = ["libibverbs.so.1", "librdmacm.so.1"];
/// PLACEHOLDER until the transport fixes its ring sizes: locked memory one connection needs
/// (a 1 MiB receive ring and a 1 MiB send staging area).
pub const RING_BYTES_PER_CONNECTION: u64 = 2 * 1024 * 1024;

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

/// Prints the devices; returns how many have at least one ACTIVE port.
fn devices() -> (usize, usize) {
    let devs = sorted_entries(Path::new(SYSFS));
    if devs.is_empty() {
        println!("RDMA devices ({SYSFS}): none");
        return (0, 0);
    }
    println!("RDMA devices ({SYSFS}):");
    let mut active = 0;
    for d in &devs {
        let base = Path::new(SYSFS).join(d);
        let node = read_trim(&base.join("node_type")).unwrap_or_default();
        let netdevs = sorted_entries(&base.join("device/net")).join(",");
        println!(
            "  {d}: node_type {node}{}",
            if netdevs.is_empty() {
                String::new()
            } else {
                format!(", netdev {netdevs}")
            }
        );
        let mut dev_active = false;
        for p in sorted_entries(&base.join("ports")) {
            let pb = base.join("ports").join(&p);
            let state = read_trim(&pb.join("state")).unwrap_or_default();
            let phys = read_trim(&pb.join("phys_state")).unwrap_or_default();
            let ll = read_trim(&pb.join("link_layer")).unwrap_or_default();
            dev_active |= state.contains("ACTIVE");
            println!("    port {p}: state {state}, phys_state {phys}, link_layer {ll}");
            for g in sorted_entries(&pb.join("gids")) {
                let Some(gid) = read_trim(&pb.join("gids").join(&g)) else {
                    continue;
                };
                if gid.chars().all(|c| c == '0' || c == ':') {
                    continue;
                }
                let ty = read_trim(&pb.join("gid_attrs/types").join(&g)).unwrap_or_default();
                println!("      gid[{g}] {gid} {ty}");
            }
        }
        active += usize::from(dev_active);
    }
    (devs.len(), active)
}

fn mib(v: u64) -> String {
    format!("{:.1} MiB", v as f64 / (1024.0 * 1024.0))
}

pub fn doctor() -> ExitCode {
    let disabled = std::env::var_os("RDMASHIM_DISABLE")
        .map(|v| !matches!(v.to_str(), Some("" | "0" | "false" | "no" | "off")))
        .unwrap_or(false);
    let (ndev, nactive) = devices();
    let mut libs_ok = true;
    for l in LIBS {
        match sys::try_dlopen(l) {
            Ok(()) => println!("{l}: loads"),
            Err(e) => {
                libs_ok = false;
                println!("{l}: does not load ({e})");
            }
        }
    }
    let memlock_ok = match sys::memlock_limit() {
        Ok((soft, hard)) => {
            let show = |v: Option<u64>| v.map_or("unlimited".to_string(), mib);
            let conns = soft.map_or("any number of".to_string(), |s| {
                (s / RING_BYTES_PER_CONNECTION).to_string()
            });
            println!(
                "RLIMIT_MEMLOCK: soft {}, hard {}; rings need {} per connection (placeholder) -> room for {conns} connections",
                show(soft),
                show(hard),
                mib(RING_BYTES_PER_CONNECTION)
            );
            soft.is_none_or(|s| s >= RING_BYTES_PER_CONNECTION)
        }
        Err(e) => {
            println!("RLIMIT_MEMLOCK: unknown ({e})");
            true
        }
    };
    match crate::find_lib(None) {
        Ok(p) => println!("shim library: {}", p.display()),
        Err(e) => println!("shim library: {e}"),
    }
    let why = if disabled {
        Some(FallbackReason::Disabled)
    } else if ndev == 0 {
        Some(FallbackReason::NoDevice)
    } else if !libs_ok {
        Some(FallbackReason::LibrariesMissing)
    } else if !memlock_ok {
        Some(FallbackReason::Memlock)
    } else {
        None
    };
    // (as the shim reads RDMASHIM_LOCAL: on unless a boolean says off; anything else is off)
    let local = std::env::var_os("RDMASHIM_LOCAL").is_none_or(|v| {
        matches!(
            v.to_str().map(str::to_ascii_lowercase).as_deref(),
            Some("1" | "true" | "yes" | "on")
        )
    });
    let same_host = if local {
        "connections between processes of this host move to shared-memory rings"
    } else {
        "connections between processes of this host stay on TCP too (RDMASHIM_LOCAL is off)"
    };
    match why {
        Some(r @ FallbackReason::Disabled) => println!(
            "verdict: connections will stay on TCP ({}: {})",
            r.name(),
            r.describe()
        ),
        Some(r) => println!(
            "verdict: connections to other hosts will stay on TCP ({}: {}); {same_host}",
            r.name(),
            r.describe()
        ),
        None => {
            let r = FallbackReason::TransportUnavailable;
            let note = if nactive == 0 {
                " (and no port is ACTIVE)"
            } else {
                ""
            };
            println!(
                "verdict: connections to other hosts will stay on TCP ({}: {}){note}; RDMA device and libraries are present; {same_host}",
                r.name(),
                r.describe()
            )
        }
    }
    ExitCode::SUCCESS
}
