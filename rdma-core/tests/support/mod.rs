//! What the RDMA tier's tests share: the device and address they must use.
//!
//! RDMA tests are `#[ignore]`d, so a plain `cargo test` (the host tier) does not run them;
//! `scripts/test` runs them inside the soft-RoCE VM with `--ignored`, where
//! `RDMASHIM_TEST_DEVICE` and `RDMASHIM_TEST_IP` are set. A test selected without them fails
//! with the reason: it never passes by skipping.
#![allow(dead_code)]

use std::net::{IpAddr, SocketAddr};

/// The RDMA device the tier runs on (`RDMASHIM_TEST_DEVICE`, e.g. `rxe0`).
pub fn device() -> String {
    match std::env::var("RDMASHIM_TEST_DEVICE") {
        Ok(d) if !d.is_empty() => {
            assert!(
                std::path::Path::new("/sys/class/infiniband")
                    .join(&d)
                    .exists(),
                "RDMASHIM_TEST_DEVICE={d} but /sys/class/infiniband/{d} does not exist"
            );
            d
        }
        _ => panic!(
            "RDMA test selected without RDMASHIM_TEST_DEVICE: run it in the VM tier \
             (scripts/rdma-vm, or scripts/test)"
        ),
    }
}

/// The IP address of the RDMA device's netdev (`RDMASHIM_TEST_IP`).
pub fn ip() -> IpAddr {
    let s = std::env::var("RDMASHIM_TEST_IP")
        .expect("RDMASHIM_TEST_IP not set: run RDMA tests in the VM tier (scripts/rdma-vm)");
    s.parse().expect("RDMASHIM_TEST_IP is not an IP address")
}

/// A port for an rdma_cm listener, distinct per test (and per process).
pub fn port(n: u16) -> u16 {
    20000 + (std::process::id() % 1000) as u16 * 16 + n
}

/// `ip():port`.
pub fn addr(n: u16) -> SocketAddr {
    SocketAddr::new(ip(), port(n))
}
