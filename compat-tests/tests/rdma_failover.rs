//! RDMA tier: the RDMA device is removed under an upgraded stream (`rdma link delete`, as an
//! administrator or a failing adapter would), both directions streaming 24 MiB at once with
//! every byte checked (`behave duplex`). Over TCP the stream would go on — the network is still
//! there, only the RDMA path is gone — so it must here: both sides count the connection
//! upgraded and its path failed (protocol §8.6), both read from the ring before and from TCP
//! after, and the stream is whole.
//!
//! The client's reader pauses after 4 MiB (`BEHAVE_DUPLEX_PAUSE`) so that the removal lands
//! mid-stream, whatever the speed of the emulated device; the writers fill the window
//! meanwhile. soft-RoCE has no way to take a device from a process that holds it open, so the
//! removal completes only once both processes have exited; the device is added back after.
//!
//! This binary holds this one test: no other test may find the device gone.

use rdmashim_compat_tests::two_host::DeviceRemoval;
use rdmashim_compat_tests::*;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_behave");

/// The thread that removes the device; dropping this (also when the test fails) waits for it
/// and for the removal, then adds the device back for the tests after.
struct Remover(Option<std::thread::JoinHandle<DeviceRemoval>>);

impl Drop for Remover {
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            let _ = t.join();
        }
    }
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn device_removed_mid_stream() {
    let dev = test_device();
    let pause = Scratch::new("failover-pause");
    let half = pause.dir.join("half");
    let go = pause.dir.join("go");
    let remover = Remover(Some({
        let dev = dev.clone();
        std::thread::spawn(move || {
            let until = Instant::now() + Duration::from_secs(120);
            while !half.exists() {
                assert!(Instant::now() < until, "the stream never reached 4 MiB");
                std::thread::sleep(Duration::from_millis(10));
            }
            // (it completes once the processes let the device go: at their exit)
            let removal = DeviceRemoval::start(&dev);
            // The removal reaches both processes (rdma_cm's DEVICE_REMOVAL, failed work
            // requests); then the reader goes on.
            std::thread::sleep(Duration::from_millis(1500));
            std::fs::write(&go, b"").unwrap();
            removal
        })
    }));
    let shim = Side::Shim(Via::Preload);
    let dir = pause.dir.to_string_lossy().into_owned();
    let r = behave_roles_env(
        BIN,
        "duplex",
        shim,
        shim,
        &test_ip(),
        // (the server's stream starts once the connection is on the ring)
        Some(SETTLE),
        &[("BEHAVE_DUPLEX_PAUSE", dir.as_str())],
    );
    drop(remover);
    for (role, st) in [("client", &r.client), ("server", &r.server)] {
        let st = st.as_ref().expect("stats");
        assert_eq!(st.connections(), 1, "{role}: {}", st.summary());
        assert_eq!(st.upgraded(), 1, "{role}: {}", st.summary());
        assert_eq!(st.path_failed, 1, "{role}: path failed: {}", st.summary());
        assert!(
            st.bytes("ring_rx") + st.bytes("ring_tx") > 0 && st.bytes("tcp_rx") > 0,
            "{role}: the ring, then TCP: {}",
            st.summary()
        );
    }
    let c = r.client.as_ref().unwrap();
    assert!(
        c.bytes("ring_rx") >= 4 << 20,
        "the client read its first 4 MiB from the ring: {}",
        c.summary()
    );
}
