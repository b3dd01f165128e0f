//! The two-host tier (scripts/two-host-tier, run by scripts/test): this binary runs in two
//! soft-RoCE VMs joined by a virtual Ethernet link, once as host A (the servers) and once as
//! host B (the clients), the same tests in the same order; each test checks its own host's
//! side (`rdmashim_compat_tests::two_host`). Unlike the one-VM RDMA tier, packets cross two
//! kernels and two rxe devices, and a device can be lost on one host only.
//!
//! The tests are named in the order they run (libtest sorts them): `t1_…`, `t2_…`, …

use rdmashim_compat_tests::two_host::{self, dial, serve, DeviceRemoval, Ends, Flag, Role, Under};
use rdmashim_compat_tests::*;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_behave");
const FORGE: &str = env!("CARGO_BIN_EXE_forge");

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
            (Under::Shim, Ends::Ok),
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
                (Under::Shim, Ends::Ok),
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
                (Under::Shim, Ends::Killed),
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

/// A server on the other host that runs no shim: the shimmed client's connection works as
/// plain TCP (24 MiB each way, every byte checked), counted `plain_peer` — its SYN's mark got
/// no token back — and no RDMA connection is tried (the client's host sends no rdma_cm
/// request: the device's counters say so).
#[test]
#[ignore = "two-host tier: runs in two soft-RoCE VMs (scripts/test)"]
fn t4_plain_server_on_other_host() {
    match two_host::role() {
        Role::A => {
            serve(BIN, "duplex", 7400, &[], (Under::Plain, Ends::Ok), |_| {});
        }
        Role::B => {
            let counters = DeviceCounters::read(&test_device());
            let st = dial(BIN, "duplex", 7400, &[], |_| {});
            let sent = counters.delta().sent_pkts;
            assert_eq!(st.connections(), 1, "{}", st.summary());
            assert_eq!(st.upgraded(), 0, "{}", st.summary());
            assert_eq!(st.reason("plain_peer"), 1, "{}", st.summary());
            assert_eq!(st.bytes("tcp_rx"), 24 << 20, "{}", st.summary());
            assert_eq!(sent, 0, "RDMA packets went out to a plain peer");
        }
    }
}

/// The server's host has no RDMA device (removed for the test), its server runs the shim:
/// the client's connection stays TCP and works, with a reason that says why, on both hosts.
#[test]
#[ignore = "two-host tier: runs in two soft-RoCE VMs (scripts/test)"]
fn t5_server_host_without_rdma() {
    match two_host::role() {
        Role::A => {
            let dev = test_device();
            let removal = DeviceRemoval::start(&dev);
            let until = Instant::now() + Duration::from_secs(30);
            while std::path::Path::new("/sys/class/infiniband")
                .join(&dev)
                .exists()
            {
                assert!(Instant::now() < until, "the device did not go");
                std::thread::sleep(Duration::from_millis(50));
            }
            let st = serve(BIN, "duplex", 7500, &[], (Under::Shim, Ends::Ok), |_| {})
                .expect("the server wrote no stats");
            drop(removal);
            assert_eq!(st.connections(), 1, "{}", st.summary());
            assert_eq!(st.upgraded(), 0, "{}", st.summary());
            assert_eq!(st.fallback, 1, "{}", st.summary());
        }
        Role::B => {
            let st = dial(BIN, "duplex", 7500, &[], |_| {});
            assert_eq!(st.connections(), 1, "{}", st.summary());
            assert_eq!(st.upgraded(), 0, "{}", st.summary());
            assert!(
                st.reason("plain_peer")
                    + st.reason("peer_rejected")
                    + st.reason("peer_unreachable")
                    == 1,
                "the reason says the peer cannot: {}",
                st.summary()
            );
        }
    }
}

/// A flood from the other host while an upgraded stream is live: 10,000 rdma_cm requests to the
/// server's port with random or forged private data (`forge flood`), sent while B's reader
/// is paused half-way. Every one is rejected, none accepted or left unanswered; the live
/// stream then completes over its ring, every byte checked, nothing failed over; the server's
/// memory stays bounded.
#[test]
#[ignore = "two-host tier: runs in two soft-RoCE VMs (scripts/test)"]
fn t6_flood_from_other_host() {
    const BASE: u16 = 7600;
    const FLOOD: u64 = 10_000;
    let st = match two_host::role() {
        Role::A => {
            let mut rss_kib = 0;
            let st = serve(
                BIN,
                "duplex",
                BASE,
                &[("BEHAVE_SETTLE_MS", "2000")],
                (Under::Shim, Ends::Ok),
                |pid| {
                    // The server's resident memory, at its largest while the flood lasts
                    // (it is over when B raises its flag).
                    let rss = || {
                        std::fs::read_to_string(format!("/proc/{pid}/status"))
                            .unwrap_or_default()
                            .lines()
                            .find_map(|l| l.strip_prefix("VmRSS:"))
                            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                            .unwrap_or(0u64)
                    };
                    let until = Instant::now() + Duration::from_secs(600);
                    while !two_host::flag_up(BASE + 2) {
                        assert!(Instant::now() < until, "B's flood never ended");
                        rss_kib = rss_kib.max(rss());
                        std::thread::sleep(Duration::from_millis(200));
                    }
                },
            )
            .expect("the server wrote no stats");
            assert!(
                rss_kib > 0 && rss_kib < 256 * 1024,
                "the server's resident memory during the flood: at most {rss_kib} KiB"
            );
            st
        }
        Role::B => {
            let pause = Scratch::new("two-host-flood");
            let dir = pause.dir.to_string_lossy().into_owned();
            let (half, go) = (pause.dir.join("half"), pause.dir.join("go"));
            let target = format!("{}:{BASE}", two_host::peer_ip());
            let mut summary = String::new();
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
                    let out = std::process::Command::new(FORGE)
                        .args(["flood", &target, &FLOOD.to_string()])
                        .output()
                        .expect("run the forger");
                    summary = String::from_utf8_lossy(&out.stdout).into_owned();
                    let _flag = Flag::raise(BASE + 2);
                    std::fs::write(&go, b"").unwrap();
                    std::thread::sleep(Duration::from_secs(2));
                },
            );
            let line = summary
                .lines()
                .rfind(|l| l.starts_with("forge: "))
                .unwrap_or_else(|| panic!("the forger said {summary:?}"));
            let f: std::collections::BTreeMap<String, u64> = line["forge: ".len()..]
                .split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
                .collect();
            assert_eq!(f.get("sent").copied(), Some(FLOOD), "{line}");
            assert_eq!(f.get("accepted").copied().unwrap_or(0), 0, "{line}");
            assert_eq!(f.get("no_answer").copied().unwrap_or(0), 0, "{line}");
            let rejected: u64 = f
                .iter()
                .filter(|(k, _)| k.starts_with("rejected_"))
                .map(|(_, v)| v)
                .sum();
            assert_eq!(
                rejected, FLOOD,
                "every request answered with a reject: {line}"
            );
            st
        }
    };
    assert_eq!(st.connections(), 1, "{}", st.summary());
    assert_eq!(st.upgraded(), 1, "{}", st.summary());
    assert_eq!(st.path_failed, 0, "{}", st.summary());
    assert!(
        st.bytes("ring_tx") > 0 && st.bytes("ring_rx") > 0,
        "{}",
        st.summary()
    );
}
