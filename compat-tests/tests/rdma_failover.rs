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

use rdmashim_compat_tests::*;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_behave");

/// Adds the device back (on the netdev the VM made it on) once its removal is through, and
/// waits for its port to be ACTIVE: later test binaries need it.
struct Restore {
    dev: String,
    delete: Option<std::process::Child>,
}

impl Drop for Restore {
    fn drop(&mut self) {
        if let Some(mut d) = self.delete.take() {
            let until = Instant::now() + Duration::from_secs(60);
            while d.try_wait().ok().flatten().is_none() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = d.kill();
            let _ = d.wait();
        }
        let sys = Path::new("/sys/class/infiniband").join(&self.dev);
        if !sys.exists() {
            let netdev = std::env::var("RDMA_NETDEV").unwrap_or_else(|_| "dummy0".into());
            let st = Command::new("rdma")
                .args(["link", "add", &self.dev, "type", "rxe", "netdev", &netdev])
                .status();
            eprintln!("rdma link add {} netdev {netdev}: {st:?}", self.dev);
        }
        let state = sys.join("ports/1/state");
        let until = Instant::now() + Duration::from_secs(20);
        while Instant::now() < until {
            if std::fs::read_to_string(&state).is_ok_and(|s| s.contains("ACTIVE")) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!("{} not ACTIVE again after its removal", self.dev);
    }
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn device_removed_mid_stream() {
    let dev = test_device();
    let pause = Scratch::new("failover-pause");
    let mut restore = Restore {
        dev: dev.clone(),
        delete: None,
    };
    let half = pause.dir.join("half");
    let go = pause.dir.join("go");
    let remover = {
        let dev = dev.clone();
        std::thread::spawn(move || {
            let until = Instant::now() + Duration::from_secs(120);
            while !half.exists() {
                assert!(Instant::now() < until, "the stream never reached 4 MiB");
                std::thread::sleep(Duration::from_millis(10));
            }
            // (it returns once the processes let the device go: at their exit)
            let delete = Command::new("rdma")
                .args(["link", "delete", &dev])
                .stdin(Stdio::null())
                .spawn()
                .expect("rdma link delete");
            // The removal reaches both processes (rdma_cm's DEVICE_REMOVAL, failed work
            // requests); then the reader goes on.
            std::thread::sleep(Duration::from_millis(1500));
            std::fs::write(&go, b"").unwrap();
            delete
        })
    };
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
    restore.delete = Some(remover.join().expect("the remover"));
    drop(restore);
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
