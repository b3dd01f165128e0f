//! RDMA tier: haproxy (2.6, one process, an event loop per thread) in front of a Python
//! HTTP/1.1 backend, the three under the shim. The keep-alive client of the prefork tests
//! (three connections, each fetching a 256 KiB file twenty times, 100 ms apart, every body
//! checked) talks to haproxy, which relays each request on keep-alive connections of its own
//! to the backend. Every connection on both of haproxy's sides is upgraded — the ones it
//! accepts and the ones it makes — and the backend's too; the bodies cross haproxy's rings
//! twice (in from the backend, out to the client) and the device's packet counters grew to
//! match. haproxy stops at SIGUSR1 (its soft stop) once its connections are done.
//!
//! Hot reload: a second haproxy takes the first's listening socket over its stats socket
//! (`-x`, `expose-fd listeners`: the descriptor passed with `SCM_RIGHTS`) and stops it
//! (`-sf`); the new process adopts the socket at its first accept (docs/upgrade.md §7,
//! "Listening sockets made elsewhere"), and the client's connections upgrade in it as above.
//! Before, none did (`plain_peer`); and while one of haproxy's threads adopted the socket,
//! another accepted the first connection past the upgrade (found here: accepts now wait for
//! the adoption).

use rdmashim_compat_tests::prefork_http::{fetch, www, CONNS, FILE, GETS};
use rdmashim_compat_tests::*;
use std::time::Duration;

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn haproxy_relays_both_sides_over_rdma() {
    haproxy_relays(Rings::Rdma, false);
}

/// The same over shared memory, on 127.0.0.1: every host.
#[test]
fn haproxy_relays_both_sides_over_shm() {
    haproxy_relays(Rings::Shm, false);
}

/// A hot reload first (the listening socket passed to the new haproxy), over shared memory.
#[test]
fn haproxy_relays_after_a_hot_reload_over_shm() {
    haproxy_relays(Rings::Shm, true);
}

/// The same over RDMA.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn haproxy_relays_after_a_hot_reload_over_rdma() {
    haproxy_relays(Rings::Rdma, true);
}

fn haproxy_relays(rings: Rings, reload: bool) {
    let ip = rings.ip();
    let Some(haproxy) = require("haproxy") else {
        return;
    };
    let s = Scratch::new("up-haproxy");
    let (www, want) = www(&s);
    let device = rings.device();

    let (mut backend, be_port) = http_server(&s, Via::Preload, &ip, &www, "backend");

    let port = free_port_on(&ip);
    let conf = s.dir.join("haproxy.cfg");
    let admin = s.dir.join("admin.sock");
    std::fs::write(
        &conf,
        format!(
            "global\n    maxconn 100\n    stats socket {} mode 600 level admin expose-fd listeners\n\
             defaults\n    mode http\n    timeout connect 5s\n    \
             timeout client 60s\n    timeout server 60s\nfrontend f\n    bind {ip}:{port}\n    \
             default_backend b\nbackend b\n    server s1 {ip}:{be_port}\n",
            admin.display()
        ),
    )
    .unwrap();
    let start = |label: &str, args: &[&std::ffi::OsStr]| {
        let mut cmd = shimmed(&haproxy, &s, label);
        cmd.arg("-db").arg("-f").arg(&conf).args(args);
        let mut proxy = Server::start(cmd, label, "USR1");
        wait_listening(port, &mut proxy, Duration::from_secs(30));
        proxy
    };
    let mut proxy = start("haproxy", &[]);
    if reload {
        // (the first one becomes the old one: `-sf` stops it with SIGUSR1 once the new one
        // holds the socket; it had no connection)
        let mut old = proxy;
        let pid = old.pid().to_string();
        proxy = start(
            "haproxy-new",
            &[
                "-x".as_ref(),
                admin.as_os_str(),
                "-sf".as_ref(),
                pid.as_ref(),
            ],
        );
        let st = old.wait_exit(Duration::from_secs(30));
        assert!(st.is_some_and(|st| st.success()), "the old haproxy: {st:?}");
        let ost = s.one_stats("haproxy");
        assert_eq!(ost.connections(), 0, "the old haproxy: {}", ost.summary());
    }
    let label = if reload { "haproxy-new" } else { "haproxy" };

    let cst = fetch(&s, &ip, port, &want);
    assert!(proxy.stop().expect("haproxy status").success(), "haproxy");
    assert!(backend.stop().expect("backend status").success(), "backend");
    let pst = s.one_stats(label);
    let bst = s.one_stats("backend");
    eprintln!("haproxy: {}", pst.summary());
    eprintln!("backend: {}", bst.summary());
    // The client's connections, and at least one of haproxy's own to the backend per
    // client connection while requests overlap; every one upgraded on both sides.
    assert!(pst.connections() > CONNS as u64, "{}", pst.summary());
    pst.assert_all_upgraded();
    bst.assert_all_upgraded();
    assert_eq!(
        bst.connections(),
        pst.connections() - CONNS as u64,
        "haproxy's connections to the backend are the backend's: {} / {}",
        pst.summary(),
        bst.summary()
    );
    // Most responses came after the switches: in from the backend and out to the client.
    let half = (CONNS * GETS / 2 * FILE) as u64;
    rings.assert_at_least(&bst, half, 0);
    rings.assert_at_least(&pst, half, half);
    rings.assert_at_least(&cst, 0, half);
    if let Some(d) = device {
        d.delta()
            .assert_carried(bst.ring_bytes() + cst.ring_bytes());
    }
}
