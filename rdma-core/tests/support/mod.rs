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

/// A raw rdma_cm client just before `rdma_connect`: address and route resolved to `addr`, an RC
/// QP created on a fresh PD with one CQ (no completion channel).
pub struct RawClient {
    /// The id's event channel.
    pub ch: std::sync::Arc<rdmashim_core::cm::EventChannel>,
    /// The id, with its QP.
    pub id: rdmashim_core::cm::CmId,
    /// The QP's protection domain.
    pub pd: std::sync::Arc<rdmashim_core::verbs::Pd>,
    /// The QP's send and receive CQ.
    pub cq: std::sync::Arc<rdmashim_core::verbs::Cq>,
}

/// See [`RawClient`].
pub fn raw_client(addr: SocketAddr) -> RawClient {
    use rdmashim_core::cm::{CmId, EventChannel, QpCaps};
    use rdmashim_core::verbs::{Cq, Pd};
    use std::time::Duration;
    const T: Duration = Duration::from_secs(20);
    let ch = EventChannel::new().expect("rdma_create_event_channel");
    let mut id = CmId::new(&ch).expect("rdma_create_id");
    id.resolve_blocking(&ch, addr, Duration::from_secs(5), T)
        .expect("address and route resolved");
    let ctx = id.context().expect("the id's device");
    let pd = Pd::new(&ctx).expect("ibv_alloc_pd");
    let cq = Cq::new(&ctx, 64, None).expect("ibv_create_cq");
    id.create_qp(&pd, &cq, &cq, QpCaps::default())
        .expect("rdma_create_qp");
    RawClient { ch, id, pd, cq }
}
