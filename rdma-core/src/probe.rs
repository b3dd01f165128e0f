//! What this host can do with RDMA, in one call.

use crate::error::Unavailable;
use crate::sys;
use crate::verbs::{self, Context};

/// One port of a device, as `ibv_query_port` reports it.
#[derive(Debug, Clone)]
pub struct PortInfo {
    /// Port number (from 1).
    pub port: u8,
    /// `IBV_PORT_ACTIVE` etc., as text.
    pub state: &'static str,
    /// Whether the port can carry traffic now.
    pub active: bool,
    /// "Ethernet" (RoCE) or "InfiniBand".
    pub link_layer: &'static str,
    /// Active MTU in bytes.
    pub mtu: u32,
}

/// One RDMA device.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    /// The device's name (`rxe0`, `mlx5_0`, …).
    pub name: String,
    /// Its ports.
    pub ports: Vec<PortInfo>,
    /// How many QPs the device supports (`ibv_device_attr.max_qp`).
    pub max_qp: i32,
}

fn port_state(s: u32) -> (&'static str, bool) {
    use crate::sys::ffi::ibv_port_state as st;
    match s {
        st::IBV_PORT_ACTIVE => ("active", true),
        st::IBV_PORT_DOWN => ("down", false),
        st::IBV_PORT_INIT => ("init", false),
        st::IBV_PORT_ARMED => ("armed", false),
        st::IBV_PORT_ACTIVE_DEFER => ("active_defer", false),
        _ => ("unknown", false),
    }
}

fn mtu_bytes(m: u32) -> u32 {
    match m {
        1..=5 => 128 << m,
        _ => 0,
    }
}

/// Lists the host's RDMA devices and their ports. Loads the RDMA libraries if they are not
/// loaded yet (call it only when RDMA is about to be used).
pub fn probe() -> Result<Vec<DeviceInfo>, Unavailable> {
    sys::lib().map_err(|e| Unavailable::LibrariesMissing(e.clone()))?;
    let names = match verbs::device_names() {
        Ok(n) => n,
        // ibv_get_device_list fails with ENOSYS when the kernel has no uverbs at all.
        Err(_) => return Err(Unavailable::NoDevice),
    };
    if names.is_empty() {
        return Err(Unavailable::NoDevice);
    }
    let mut out = Vec::new();
    for name in names {
        let Ok(ctx) = Context::open(&name) else {
            continue;
        };
        let attr = ctx.query_device().ok();
        let nports = attr.as_ref().map_or(1, |a| a.phys_port_cnt.max(1));
        let mut ports = Vec::new();
        for p in 1..=nports {
            if let Ok(pa) = ctx.query_port(p) {
                let (state, active) = port_state(pa.state);
                ports.push(PortInfo {
                    port: p,
                    state,
                    active,
                    link_layer: if pa.link_layer == 2 {
                        "Ethernet"
                    } else {
                        "InfiniBand"
                    },
                    mtu: mtu_bytes(pa.active_mtu),
                });
            }
        }
        out.push(DeviceInfo {
            name,
            ports,
            max_qp: attr.map_or(0, |a| a.max_qp),
        });
    }
    if out.is_empty() {
        return Err(Unavailable::NoDevice);
    }
    Ok(out)
}
