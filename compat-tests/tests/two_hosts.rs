//! The two-host tier (scripts/two-host-tier, run by scripts/test): this binary runs in two
//! soft-RoCE VMs joined by a virtual Ethernet link, once as host A (the servers) and once as
//! host B (the clients), the same tests in the same order; each test checks its own host's
//! side (`rdmashim_compat_tests::two_host`). Unlike the one-VM RDMA tier, packets cross two
//! kernels and two rxe devices, and a device can be lost on one host only.
//!
//! The tests are named in the order they run (libtest sorts them): `t1_…`, `t2_…`, …

use rdmashim_compat_tests::two_host::{self, dial, serve, DeviceRemoval, Ends, Flag, Role};
use rdmashim_compat_tests::*;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_behave");

/// Both directions streaming 24 MiB at once between the hosts, every byte checked: upgraded on
/// both hosts, the bytes over RDMA rings, nothing failed over.
#[test]
#[ignore = "two-host tier: runs in two soft-RoCE VMs (scripts/test)"]
fn t1_duplex_between_hosts() {
    let st = match two_host::role() {
        // (the server settles first: its stream starts on the ring)
        Role::A => serve(
            BIN,
            "duplex",
            7100,
            &[("BEHAVE_SETTLE_MS", "2000")],
            Ends::Ok,
            |_| {},
        )
        .expect("the server wrote no stats"),
        Role::B => dial(BIN, "duplex", 7100, &[], |_| {}),
    };
    assert_eq!(st.connections(), 1, "{}", st.summary());
    assert_eq!(st.upgraded(), 1, "{}", st.summary());
    assert_eq!(st.path_failed, 0, "{}", st.summary());
    assert!(
        st.bytes("ring_tx") >= 16 << 20 && st.bytes("ring_rx") > 0,
        "the streams went over the rings: {}",
        st.summary()
    );
}

/// The RDMA device of the server's host is removed mid-stream (the client's host keeps its
/// own, whose queue pair then finds its peer gone): both hosts go on over TCP at the agreed
/// byte (protocol §8.6), every byte checked, each counting the connection's path failed.
/// B's reader pauses after 4 MiB and raises its flag; A removes its device then; B's reader
/// goes on two seconds later.
#[test]
#[ignore = "two-host tier: runs in two soft-RoCE VMs (scripts/test)"]
fn t2_device_removed_on_one_host() {
    const BASE: u16 = 7200;
    let st = match two_host::role() {
        Role::A => {
            let mut removal = None;
            let st = serve(
                BIN,
                "duplex",
                BASE,
                &[("BEHAVE_SETTLE_MS", "2000")],
                Ends::Ok,
                |_| {
                    two_host::wait_flag(BASE + 2, two_host::PEER_WAIT);
                    removal = Some(DeviceRemoval::start(&test_device()));
                },
            );
            // (the removal completes now that the server exited; the device comes back)
            drop(removal);
            st.expect("the server wrote no stats")
        }
        Role::B => {
            let pause = Scratch::new("two-host-pause");
            let dir = pause.dir.to_string_lossy().into_owned();
            let (half, go) = (pause.dir.join("half"), pause.dir.join("go"));
            let st = dial(
                BIN,
                "duplex",
                BASE,
                &[("BEHAVE_DUPLEX_PAUSE", dir.as_str())],
                |_| {
                    let until = Instant::now() + Duration::from_secs(120);
                    while !half.exists() {
                        assert!(Instant::now() < until, "the stream never reached 4 MiB");
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    let _flag = Flag::raise(BASE + 2);
                    std::thread::sleep(Duration::from_secs(2));
                    std::fs::write(&go, b"").unwrap();
                    // (the flag stays up a moment more: A may look late)
                    std::thread::sleep(Duration::from_secs(1));
                },
            );
            assert!(
                st.bytes("ring_rx") >= 2 << 20,
                "B read the first MiBs from the ring: {}",
                st.summary()
            );
            st
        }
    };
    assert_eq!(st.connections(), 1, "{}", st.summary());
    assert_eq!(st.upgraded(), 1, "{}", st.summary());
    assert_eq!(st.path_failed, 1, "the path failed: {}", st.summary());
    assert!(st.bytes("tcp_rx") > 0, "then TCP: {}", st.summary());
}

/// The server's process is killed (SIGKILL) mid-stream on its host: the client on the other
/// host sees EOF or ECONNRESET within a second, as over TCP (the scenario checks).
#[test]
#[ignore = "two-host tier: runs in two soft-RoCE VMs (scripts/test)"]
fn t3_peer_killed_on_other_host() {
    match two_host::role() {
        Role::A => {
            let st = serve(
                BIN,
                "peer_death",
                7300,
                &[("BEHAVE_SETTLE_MS", "2000")],
                Ends::Killed,
                |_| {},
            );
            assert!(st.is_none(), "a killed server writes no stats");
        }
        Role::B => {
            let st = dial(BIN, "peer_death", 7300, &[], |_| {});
            assert_eq!(st.upgraded(), 1, "{}", st.summary());
            assert!(st.bytes("ring_rx") > 0, "{}", st.summary());
        }
    }
}
