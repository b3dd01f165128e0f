//! The two-host tier (scripts/two-host-tier, run by scripts/test): this binary runs in two
//! soft-RoCE VMs joined by a virtual Ethernet link, once as host A (the servers) and once as
//! host B (the clients), the same tests in the same order; each test checks its own host's
//! side (`rdmashim_compat_tests::two_host`). Unlike the one-VM RDMA tier, packets cross two
//! kernels and two rxe devices, and a device can be lost on one host only.
//!
//! Both hosts run them in the same order, libtest's order of names (`t10_…` before `t1_…`);
//! each stands alone (a test that removes a device or cuts the link restores it).

use rdmashim_compat_tests::two_host::{self, dial, serve, DeviceRemoval, Ends, Flag, Role, Under};
use rdmashim_compat_tests::*;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_behave");
const FORGE: &str = env!("CARGO_BIN_EXE_forge");

/// Traffic control on this host's link (`eth0`) while this lives, also when the test fails:
/// the root queueing discipline goes with it.
struct Tc;

impl Tc {
    fn run(args: &[&str]) {
        let st = std::process::Command::new("tc").args(args).status();
        assert!(
            st.as_ref().is_ok_and(|s| s.success()),
            "tc {args:?}: {st:?}"
        );
    }

    /// Every packet this host sends is dropped (`netem loss 100%`): the link is cut.
    fn cut() -> Tc {
        Tc::run(&[
            "qdisc", "add", "dev", "eth0", "root", "netem", "loss", "100%",
        ]);
        Tc
    }

    /// This host's RoCE v2 packets (UDP to port 4791) are dropped; TCP goes on.
    fn drop_roce() -> Tc {
        Tc::run(&[
            "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "prio",
        ]);
        let t = Tc;
        Tc::run(&[
            "filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "prio", "1", "u32",
            "match", "ip", "protocol", "17", "0xff", "match", "ip", "dport", "4791", "0xffff",
            "action", "drop",
        ]);
        t
    }
}

impl Drop for Tc {
    fn drop(&mut self) {
        let _ = std::process::Command::new("tc")
            .args(["qdisc", "del", "dev", "eth0", "root"])
            .status();
    }
}

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
                    let rss = || proc_status_kib(pid, "VmRSS").unwrap_or(0);
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

/// This host's IPv6 addresses for the tier: a global one (fd77::1 on A, fd77::2 on B, added
/// here if missing, without duplicate detection) and the link-local one eth0 has from its MAC.
fn ipv6() -> (String, String, String, String) {
    let (own, peer) = match two_host::role() {
        Role::A => ("fd77::1", "fd77::2"),
        Role::B => ("fd77::2", "fd77::1"),
    };
    let _ = std::process::Command::new("ip")
        .args([
            "-6",
            "addr",
            "add",
            &format!("{own}/64"),
            "dev",
            "eth0",
            "nodad",
        ])
        .status();
    // (two-vm's MACs: 52:54:00:77:00:01 and :02, so EUI-64 link-local addresses)
    let (own_ll, peer_ll) = match two_host::role() {
        Role::A => ("fe80::5054:ff:fe77:1%eth0", "fe80::5054:ff:fe77:2%eth0"),
        Role::B => ("fe80::5054:ff:fe77:2%eth0", "fe80::5054:ff:fe77:1%eth0"),
    };
    // Both must be usable (link-local addresses pass their duplicate detection first).
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let out = std::process::Command::new("ip")
            .args(["-6", "addr", "show", "dev", "eth0"])
            .output()
            .expect("ip -6 addr");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let ll = own_ll.split('%').next().unwrap();
        if text.contains(own) && text.contains(ll) && !text.contains("tentative") {
            break;
        }
        assert!(Instant::now() < until, "IPv6 addresses not ready: {text}");
        std::thread::sleep(Duration::from_millis(100));
    }
    (own.into(), peer.into(), own_ll.into(), peer_ll.into())
}

/// IPv6 between the hosts, a global address and a link-local one (with its interface): the
/// connections upgrade as over IPv4, 24 MiB each way over the rings, every byte checked.
#[test]
#[ignore = "two-host tier: runs in two soft-RoCE VMs (scripts/test)"]
fn t7_ipv6_between_hosts() {
    let (own, peer, own_ll, peer_ll) = ipv6();
    for (i, (own, peer)) in [(own, peer), (own_ll, peer_ll)].into_iter().enumerate() {
        let base = 7700 + 10 * i as u16;
        let st = match two_host::role() {
            Role::A => two_host::serve_at(
                BIN,
                "duplex",
                &own,
                base,
                &[("BEHAVE_SETTLE_MS", "2000")],
                (Under::Shim, Ends::Ok),
                |_| {},
            )
            .expect("the server wrote no stats"),
            Role::B => two_host::dial_to(BIN, "duplex", &peer, base, &[], |_| {}),
        };
        assert_eq!(st.connections(), 1, "{own}: {}", st.summary());
        assert_eq!(st.upgraded(), 1, "{own}: {}", st.summary());
        assert!(
            st.bytes("ring_tx") > 0 && st.bytes("ring_rx") > 0,
            "{own}: over the rings: {}",
            st.summary()
        );
    }
}

/// The link between the hosts stops carrying anything for 60 s under an upgraded stream (A's
/// side of it drops every packet: `tc netem loss 100%`), then comes back: the stream resumes
/// and completes, every byte checked — over the ring if its retries outlasted the cut, else
/// over TCP after a failover (either way, as TCP would have).
#[test]
#[ignore = "two-host tier: runs in two soft-RoCE VMs (scripts/test)"]
fn t8_link_cut_for_a_minute() {
    const BASE: u16 = 7800;
    let env = [("BEHAVE_READ_TIMEOUT_S", "240")];
    let st = match two_host::role() {
        Role::A => {
            let mut env = env.to_vec();
            env.push(("BEHAVE_SETTLE_MS", "2000"));
            serve(BIN, "duplex", BASE, &env, (Under::Shim, Ends::Ok), |_| {
                two_host::wait_flag(BASE + 2, two_host::PEER_WAIT);
                let _cut = Tc::cut();
                std::thread::sleep(Duration::from_secs(60));
            })
            .expect("the server wrote no stats")
        }
        Role::B => {
            let pause = Scratch::new("two-host-cut");
            let dir = pause.dir.to_string_lossy().into_owned();
            let (half, go) = (pause.dir.join("half"), pause.dir.join("go"));
            let mut env = env.to_vec();
            env.push(("BEHAVE_DUPLEX_PAUSE", dir.as_str()));
            dial(BIN, "duplex", BASE, &env, |_| {
                let until = Instant::now() + Duration::from_secs(120);
                while !half.exists() {
                    assert!(Instant::now() < until, "the stream never reached 4 MiB");
                    std::thread::sleep(Duration::from_millis(10));
                }
                let _flag = Flag::raise(BASE + 2);
                // (A cuts its link once it sees the flag; the reader goes on into the cut)
                std::thread::sleep(Duration::from_secs(2));
                std::fs::write(&go, b"").unwrap();
            })
        }
    };
    assert_eq!(st.connections(), 1, "{}", st.summary());
    assert_eq!(st.upgraded(), 1, "{}", st.summary());
    eprintln!(
        "link cut 60 s: {} ({})",
        if st.path_failed == 1 {
            "failed over to TCP"
        } else {
            "resumed on the ring"
        },
        st.summary()
    );
}

/// A silent peer host: B's RDMA packets to A are dropped (`tc` on B's link: UDP port 4791),
/// so A's shim offers the upgrade (its token) but B's request never arrives. B's first
/// process dials, and its dial's deadline ends it (`upgrade_timeout`) while the connection
/// goes on over TCP; a second, new process on B then makes no attempt at all — the silence is
/// held host-wide (`RUN_DIR/silent-hosts`): counted `negative_cache`, and B's device sends not
/// one packet meanwhile. Both connections work (24 MiB each way, every byte checked).
#[test]
#[ignore = "two-host tier: runs in two soft-RoCE VMs (scripts/test)"]
fn t9_silent_host_is_tried_once_per_host() {
    const BASE: u16 = 7900;
    // (the server waits before it streams: the first client's dial ends meanwhile)
    let settle = [("BEHAVE_SETTLE_MS", "7000")];
    match two_host::role() {
        Role::A => {
            for base in [BASE, BASE + 10] {
                let st = serve(
                    BIN,
                    "duplex",
                    base,
                    &settle,
                    (Under::Shim, Ends::Ok),
                    |_| {},
                )
                .expect("the server wrote no stats");
                assert_eq!(st.upgraded(), 0, "{}", st.summary());
            }
        }
        Role::B => {
            let _drop = Tc::drop_roce();
            let first = dial(BIN, "duplex", BASE, &[], |_| {});
            assert_eq!(first.upgraded(), 0, "{}", first.summary());
            assert!(
                first.reason("upgrade_timeout") + first.reason("peer_unreachable") == 1,
                "the first process tried, and heard nothing: {}",
                first.summary()
            );
            let counters = DeviceCounters::read(&test_device());
            let second = dial(BIN, "duplex", BASE + 10, &[], |_| {});
            let sent = counters.delta().sent_pkts;
            assert_eq!(
                second.reason("negative_cache"),
                1,
                "a new process does not try the silent host again: {}",
                second.summary()
            );
            assert_eq!(sent, 0, "RDMA packets went out to a host known silent");
            assert_eq!(second.bytes("tcp_rx"), 24 << 20, "{}", second.summary());
        }
    }
}

/// A gibibyte each way between the hosts at once, in chunks and reads of random sizes, every
/// byte checked: upgraded, and all but the first bytes over the rings.
#[test]
#[ignore = "two-host tier: runs in two soft-RoCE VMs (scripts/test)"]
fn t10_a_gibibyte_each_way() {
    let env = [("BEHAVE_DUPLEX_MIB", "1024")];
    let st = match two_host::role() {
        Role::A => {
            let mut env = env.to_vec();
            env.push(("BEHAVE_SETTLE_MS", "2000"));
            serve(BIN, "duplex", 8000, &env, (Under::Shim, Ends::Ok), |_| {})
                .expect("the server wrote no stats")
        }
        Role::B => dial(BIN, "duplex", 8000, &env, |_| {}),
    };
    assert_eq!(st.upgraded(), 1, "{}", st.summary());
    assert_eq!(st.path_failed, 0, "{}", st.summary());
    assert!(
        st.bytes("ring_tx") + st.bytes("ring_rx") >= (2u64 << 30) - (64 << 20),
        "over the rings: {}",
        st.summary()
    );
}

/// Shims of two releases that do not understand each other (`RDMASHIM_FAULT=version:3` makes
/// one speak binding version 3, as a later release would): first the server's host runs it,
/// then the client's. Each time the client takes the server's token out of the stream whole,
/// counts `peer_version`, never dials (no RDMA packet leaves its host), and both directions'
/// 24 MiB go over TCP, every byte checked by the programs; the server, whose client never
/// asked, counts `no_upgrade_request`.
#[test]
#[ignore = "two-host tier: runs in two soft-RoCE VMs (scripts/test)"]
fn t11_shims_of_other_releases() {
    let newer = [("RDMASHIM_FAULT", "version:3")];
    for (i, newer_server) in [true, false].into_iter().enumerate() {
        let base = 8100 + 10 * i as u16;
        let (server_env, client_env): (&[_], &[_]) = if newer_server {
            (&newer, &[])
        } else {
            (&[], &newer)
        };
        let case = if newer_server {
            "newer server"
        } else {
            "newer client"
        };
        match two_host::role() {
            Role::A => {
                let st = serve(
                    BIN,
                    "duplex",
                    base,
                    server_env,
                    (Under::Shim, Ends::Ok),
                    |_| {},
                )
                .expect("the server wrote no stats");
                assert_eq!(st.connections(), 1, "{case}: {}", st.summary());
                assert_eq!(st.upgraded(), 0, "{case}: {}", st.summary());
                assert_eq!(
                    st.reason("no_upgrade_request"),
                    1,
                    "{case}: {}",
                    st.summary()
                );
                assert_eq!(st.bytes("tcp_tx"), 24 << 20, "{case}: {}", st.summary());
            }
            Role::B => {
                let counters = DeviceCounters::read(&test_device());
                let st = dial(BIN, "duplex", base, client_env, |_| {});
                let sent = counters.delta().sent_pkts;
                assert_eq!(st.connections(), 1, "{case}: {}", st.summary());
                assert_eq!(st.reason("peer_version"), 1, "{case}: {}", st.summary());
                assert_eq!(st.bytes("tcp_rx"), 24 << 20, "{case}: {}", st.summary());
                assert_eq!(
                    sent, 0,
                    "{case}: RDMA packets went out to the other release"
                );
            }
        }
    }
}

/// The link is cut for good (A's side drops every packet: `tc netem loss 100%`) under an
/// upgraded, idle connection whose programs asked for TCP keepalive (2 s idle, probes every
/// second, 3 unanswered: the `keepalive` scenario) and wait in `read`: as on TCP, each wait
/// ends a few seconds into the cut in the kernel's verdict on the TCP connection under the
/// stream, which the shim watches (the queue pair, idle, hears of nothing) — ETIMEDOUT, or
/// ECONNRESET on A when B's kernel gave up first (A's side of the cut drops only what A
/// sends) — and `close` returns at once. First with the shim disabled on both hosts (the
/// kernel alone: what the programs must see), then upgraded. Before, the upgraded programs'
/// waits ran to their own 120 s limit: keepalive set by the application took no effect on an
/// upgraded connection.
#[test]
#[ignore = "two-host tier: runs in two soft-RoCE VMs (scripts/test)"]
fn t12_keepalive_ends_a_cut_connection() {
    for (i, upgraded) in [false, true].into_iter().enumerate() {
        let st = cut_under(
            "keepalive",
            8200 + 10 * i as u16,
            upgraded,
            |_| {
                let _cut = Tc::cut();
                // (both ends time out 2-5 s into the cut; then the link comes back)
                std::thread::sleep(Duration::from_secs(20));
            },
            |_| {},
        );
        assert_eq!(st.connections(), 1, "{}", st.summary());
        assert_eq!(st.upgraded(), u64::from(upgraded), "{}", st.summary());
        assert_eq!(st.path_failed, 0, "{}", st.summary());
    }
}

/// One case of a test that cuts the link under `scenario` (on ports from `base`; with the
/// shim disabled on both hosts unless `upgraded`): B waits for its client to be where the
/// cut belongs (BEHAVE_READY_FILE), raises its flag and, two seconds later (A has surely seen
/// it: once B's side is cut too, the flag's answers would not get through), runs `on_b`; A
/// runs `on_a` as soon as it sees the flag. Both get their program's pid. This host's stats.
fn cut_under(
    scenario: &str,
    base: u16,
    upgraded: bool,
    on_a: impl FnOnce(u32),
    on_b: impl FnOnce(u32),
) -> Stats {
    let mut env = vec![("BEHAVE_SETTLE_MS", "2000")];
    if !upgraded {
        env.push(("RDMASHIM_DISABLE", "1"));
    }
    match two_host::role() {
        Role::A => serve(BIN, scenario, base, &env, (Under::Shim, Ends::Ok), |pid| {
            two_host::wait_flag(base + 2, two_host::PEER_WAIT);
            on_a(pid);
        })
        .expect("the server wrote no stats"),
        Role::B => {
            let ready = Scratch::new(&format!("two-host-{scenario}-ready"));
            let file = ready.dir.join("ready").to_string_lossy().into_owned();
            env.push(("BEHAVE_READY_FILE", file.as_str()));
            dial(BIN, scenario, base, &env, |pid| {
                wait_for_file(&file);
                let _flag = Flag::raise(base + 2);
                std::thread::sleep(Duration::from_secs(2));
                on_b(pid);
            })
        }
    }
}

/// Waits until the scenario's BEHAVE_READY_FILE exists (at most two minutes).
fn wait_for_file(path: &str) {
    let until = Instant::now() + Duration::from_secs(120);
    while !std::path::Path::new(path).exists() {
        assert!(Instant::now() < until, "the scenario never got to {path}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether process `pid` (a child of this test) has exited: gone, or a zombie not yet reaped.
fn exited(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |st| {
        st.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
    })
}

/// Holds this host's link cut until process `pid` has exited (at most [`CUT_MAX`]).
fn cut_until_exit(pid: u32) {
    let _cut = Tc::cut();
    wait_exit(pid);
}

/// The longest a test holds a cut.
const CUT_MAX: Duration = Duration::from_secs(120);

/// Waits until process `pid` has exited (at most [`CUT_MAX`]).
fn wait_exit(pid: u32) {
    let until = Instant::now() + CUT_MAX;
    while !exited(pid) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The link dies for good both ways (each host drops every packet it sends: to each host, the
/// other is gone, as if powered off) under a stream that A writes as fast as it can, with the
/// TCP_USER_TIMEOUT of 5 s it set, and B reads with keepalive on (2 s idle, probes every
/// second, 3 unanswered): the `cut_writer` scenario. As on TCP, A's writes fill the buffers
/// and block, then the blocked write ends in ETIMEDOUT; B's read ends in ETIMEDOUT; both close
/// at once. First with the shim disabled on both hosts (the kernel alone: what the programs
/// must see), then upgraded; each program prints how long its end took.
#[test]
#[ignore = "two-host tier: runs in two soft-RoCE VMs (scripts/test)"]
fn t13_writer_on_a_dead_link() {
    for (i, upgraded) in [false, true].into_iter().enumerate() {
        let st = cut_under(
            "cut_writer",
            8300 + 10 * i as u16,
            upgraded,
            cut_until_exit,
            cut_until_exit,
        );
        assert_eq!(st.connections(), 1, "{}", st.summary());
        assert_eq!(st.upgraded(), u64::from(upgraded), "{}", st.summary());
        eprintln!(
            "{}: {}",
            if upgraded { "upgraded" } else { "TCP" },
            st.summary()
        );
    }
}

/// The RDMA path dies under an upgraded stream while TCP lives on (B drops the RoCE packets
/// it sends — its writes and its acknowledgements of A's — from the moment both directions
/// are streaming, `behave duplex` paused at 4 MiB on B) and B's program set TCP_USER_TIMEOUT
/// (2 s): B's writes unacknowledged for that long fail the ring's path there, not the queue
/// pair's retries (~16 s on soft-RoCE, the stall a program without the option sees), and the
/// stream goes on over TCP at the agreed offsets, every byte checked. Both sides count the
/// path failed; B's log says it was the user timeout. Each program prints the longest it
/// waited for the peer's bytes.
#[test]
#[ignore = "two-host tier: runs in two soft-RoCE VMs (scripts/test)"]
fn t14_user_timeout_fails_a_dead_rdma_path_over() {
    const BASE: u16 = 8400;
    let env = [("BEHAVE_READ_TIMEOUT_S", "120")];
    let st = match two_host::role() {
        Role::A => {
            let mut env = env.to_vec();
            env.push(("BEHAVE_SETTLE_MS", "2000"));
            serve(BIN, "duplex", BASE, &env, (Under::Shim, Ends::Ok), |_| {})
                .expect("the server wrote no stats")
        }
        Role::B => {
            let pause = Scratch::new("two-host-user-timeout");
            let dir = pause.dir.to_string_lossy().into_owned();
            let log = pause.dir.join("shim.log");
            let log_path = log.to_string_lossy().into_owned();
            let (half, go) = (pause.dir.join("half"), pause.dir.join("go"));
            let mut env = env.to_vec();
            env.extend([
                ("BEHAVE_DUPLEX_PAUSE", dir.as_str()),
                ("BEHAVE_USER_TIMEOUT_MS", "2000"),
                ("RDMASHIM_LOG", "info"),
                ("RDMASHIM_LOG_FILE", log_path.as_str()),
            ]);
            let st = dial(BIN, "duplex", BASE, &env, |pid| {
                wait_for_file(&half.to_string_lossy());
                let _drop = Tc::drop_roce();
                std::fs::write(&go, b"").unwrap();
                wait_exit(pid);
            });
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            assert!(
                log.lines()
                    .any(|l| l.contains("path failed") && l.contains("TCP_USER_TIMEOUT")),
                "B's path failed for its user timeout: {log}"
            );
            st
        }
    };
    assert_eq!(st.connections(), 1, "{}", st.summary());
    assert_eq!(st.upgraded(), 1, "{}", st.summary());
    assert_eq!(st.path_failed, 1, "{}", st.summary());
    assert!(
        st.bytes("tcp_rx") > 0,
        "the stream ended on TCP: {}",
        st.summary()
    );
    eprintln!("{}", st.summary());
}

/// PostgreSQL across the hosts, a program that sets `TCP_USER_TIMEOUT` itself (libpq's
/// `tcp_user_timeout`, 2 s here): psql on B copies a million generated rows out of the server
/// on A (`COPY … TO STDOUT`, about 40 MB), and B's RoCE packets are dropped once 8 MB are in.
/// psql's connection, upgraded in the backend that took it over from the postmaster, fails
/// over on its user timeout and the copy completes; its output is the same, byte for byte, as
/// the same copy over plain TCP after it. psql prints how long each copy took.
#[test]
#[ignore = "two-host tier: runs in two soft-RoCE VMs (scripts/test)"]
fn t15_postgres_copy_under_its_user_timeout() {
    const PORT: u16 = 8500;
    let bin = postgres::bin().expect("PostgreSQL is installed (scripts/setup)");
    match two_host::role() {
        Role::A => {
            let s = Scratch::new("two-host-postgres");
            let peer = format!("{}/32", two_host::peer_ip());
            let mut server = postgres::start(&bin, &s, &two_host::own_ip(), PORT, &peer, &[]);
            let listening = Flag::raise(PORT + 1);
            two_host::wait_flag(PORT + 2, two_host::PEER_WAIT);
            drop(listening);
            assert!(server.stop().is_some_and(|st| st.success()), "postgres");
            let all = s.stats("postmaster");
            for st in &all {
                eprintln!("postgres process: {}", st.summary());
            }
            assert!(
                all.iter().any(|st| st.upgraded == 1 && st.path_failed == 1),
                "the backend that served the copy: upgraded, then its path failed"
            );
        }
        Role::B => {
            two_host::wait_flag(PORT + 1, two_host::PEER_WAIT);
            let s = Scratch::new("two-host-psql");
            let conninfo = format!(
                "host={} port={PORT} user=postgres dbname=postgres tcp_user_timeout=2000",
                two_host::peer_ip()
            );
            let query =
                "COPY (SELECT i, md5(i::text) FROM generate_series(1, 1000000) i) TO STDOUT";
            let copy = |mut c: std::process::Command, out: &std::path::Path| {
                c.args([
                    conninfo.as_str(),
                    "-X",
                    "-q",
                    "-v",
                    "ON_ERROR_STOP=1",
                    "-c",
                    query,
                ])
                .arg("-o")
                .arg(out)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped());
                c.spawn().expect("spawn psql")
            };
            let log = s.dir.join("shim.log");
            let out = s.dir.join("copy.out");
            let mut c = shimmed(bin.join("psql"), &s, "psql");
            c.env("RDMASHIM_LOG", "info").env("RDMASHIM_LOG_FILE", &log);
            let t = Instant::now();
            let child = copy(c, &out);
            let until = Instant::now() + Duration::from_secs(120);
            while std::fs::metadata(&out).map_or(0, |m| m.len()) < 8 << 20 {
                assert!(Instant::now() < until, "the copy never reached 8 MB");
                std::thread::sleep(Duration::from_millis(20));
            }
            let dropped = Tc::drop_roce();
            let st = wait_child(child, Duration::from_secs(300));
            drop(dropped);
            let took = t.elapsed();
            assert!(
                st.status.success(),
                "psql under the shim: {}",
                String::from_utf8_lossy(&st.stderr)
            );
            let reference = s.dir.join("copy.tcp");
            let mut plain = std::process::Command::new(bin.join("psql"));
            plain.env_remove("LD_PRELOAD");
            let t = Instant::now();
            let st = wait_child(copy(plain, &reference), Duration::from_secs(300));
            assert!(st.status.success(), "psql over TCP");
            eprintln!(
                "measured: psql: the copy took {:.1} s upgraded (RoCE dropped at 8 MB), {:.1} s \
                 over TCP",
                took.as_secs_f64(),
                t.elapsed().as_secs_f64()
            );
            let (got, want) = (
                std::fs::read(&out).unwrap(),
                std::fs::read(&reference).unwrap(),
            );
            assert!(want.len() > 32 << 20, "the copy: {} bytes", want.len());
            assert!(
                got == want,
                "the copy under the shim differs from the copy over TCP ({} and {} bytes)",
                got.len(),
                want.len()
            );
            let done = Flag::raise(PORT + 2);
            std::thread::sleep(Duration::from_secs(2));
            drop(done);
            let st = s.one_stats("psql");
            eprintln!("psql: {}", st.summary());
            assert_eq!(st.upgraded(), 1, "{}", st.summary());
            assert_eq!(st.path_failed, 1, "{}", st.summary());
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            assert!(
                log.lines()
                    .any(|l| l.contains("path failed") && l.contains("TCP_USER_TIMEOUT")),
                "psql's path failed for its user timeout: {log}"
            );
        }
    }
}
