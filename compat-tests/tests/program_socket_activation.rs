//! A socket-activated service: `systemd-socket-activate` (systemd's own tool, run without the
//! shim as systemd is) makes the listening socket and starts lighttpd, under the shim, at the
//! first connection, handing it the socket at descriptor 3 with `LISTEN_PID` and `LISTEN_FDS`
//! (`server.systemd-socket-activation`). The first connection came before the service: its
//! SYN was kept by nobody, and it stays TCP (`plain_peer` on both sides). Every later one is
//! upgraded in lighttpd, its responses over the rings (docs/upgrade.md §7, "Listening sockets
//! made elsewhere"). Every body is checked.
//!
//! Before: lighttpd never saw its socket's `listen`; no connection of a socket-activated
//! service upgraded.

use rdmashim_compat_tests::prefork_http::{check_workers_woken, fetch, lighttpd_conf, www};
use rdmashim_compat_tests::*;
use std::process::Command;
use std::time::Duration;

#[test]
fn lighttpd_activated_by_systemd_upgrades_over_shm() {
    let rings = Rings::Shm;
    let ip = rings.ip();
    let (Some(activate), Some(lighttpd), Some(curl)) = (
        require("systemd-socket-activate"),
        require("/usr/sbin/lighttpd"),
        require("curl"),
    ) else {
        return;
    };
    let s = Scratch::new("socket-activation");
    let (www, want) = www(&s);
    let port = free_port_on(&ip);
    let conf = lighttpd_conf(
        &s,
        &www,
        (&ip, port),
        "server.systemd-socket-activation = \"enable\"\n",
    );
    // The service's environment is the shim's, passed by the activator (`-E`), which runs
    // without it.
    let service = shimmed(&lighttpd, &s, "lighttpd");
    let mut cmd = Command::new(activate);
    cmd.env_remove("LD_PRELOAD")
        .arg(format!("--listen={ip}:{port}"));
    for (k, v) in service.get_envs() {
        if let Some(v) = v {
            let mut kv = std::ffi::OsString::from("--setenv=");
            kv.push(k);
            kv.push("=");
            kv.push(v);
            cmd.arg(kv);
        }
    }
    cmd.arg(&lighttpd).arg("-D").arg("-f").arg(&conf);
    // (it execs lighttpd in its own place at the first connection: SIGINT stops lighttpd)
    let mut server = Server::start(cmd, "systemd-socket-activate", "INT");
    wait_listening(port, &mut server, Duration::from_secs(30));

    // The connection that starts the service, from a shimmed curl.
    let mut first = shimmed(&curl, &s, "first");
    first
        .args(["-sS", "--max-time", "60"])
        .arg(format!("http://{ip}:{port}/f.bin"));
    let body = run(first, Duration::from_secs(90));
    assert!(body.status.success(), "first curl: {body:?}");
    assert_eq!(sha256_hex(&body.stdout), want, "the first body");
    let fst = s.one_stats("first");
    assert_eq!(fst.reason("plain_peer"), 1, "first: {}", fst.summary());

    let cst = fetch(&s, &ip, port, &want);
    assert!(
        server.stop().is_some_and(|st| st.success()),
        "lighttpd did not stop cleanly"
    );
    let all = s.stats("lighttpd");
    assert_eq!(all.len(), 1, "one lighttpd process: {all:#?}");
    // (the first connection stays TCP, a few hundred KiB of it: not a wake-up's few bytes,
    // so it is checked here and not counted as one)
    assert_eq!(all[0].reason("plain_peer"), 1, "{}", all[0].summary());
    check_workers_woken("lighttpd", &all, &cst, &["plain_peer"], rings);
}
