//! RDMA tier: lighttpd as a prefork server (`server.max-worker = 2`): its parent makes the
//! listening socket and forks two workers, which accept on it from their own event loops and
//! send the file with `sendfile`. As with nginx (tests/upgrade_nginx.rs), each worker serves
//! its connections on an rdma_cm listener and a device context of its own (docs/upgrade.md
//! §4, §7). The same Python client under the shim keeps three connections alive, each
//! fetching a 256 KiB file twenty times, 100 ms apart, every body checked: every connection
//! is upgraded in the worker that took it, and most responses go through the rings (and the
//! device's packet counters).

use rdmashim_compat_tests::prefork_http::{check_workers, lighttpd_conf, serve_and_fetch, www};
use rdmashim_compat_tests::*;

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn lighttpd_prefork_workers_upgrade() {
    lighttpd_workers(Rings::Rdma);
}

/// The same over shared memory, on 127.0.0.1: every host.
#[test]
fn lighttpd_prefork_workers_upgrade_over_shm() {
    lighttpd_workers(Rings::Shm);
}

fn lighttpd_workers(rings: Rings) {
    let ip = rings.ip();
    let Some(lighttpd) = require("/usr/sbin/lighttpd") else {
        return;
    };
    let s = Scratch::new("up-lighttpd");
    let (www, want) = www(&s);
    let port = free_port_on(&ip);
    let conf = lighttpd_conf(
        &s,
        &www,
        (&ip, port),
        "server.max-worker = 2\nserver.network-backend = \"sendfile\"\n",
    );
    let device = rings.device();
    let mut cmd = shimmed(&lighttpd, &s, "lighttpd");
    cmd.arg("-D").arg("-f").arg(&conf);
    // (its parent stops the workers by signalling its whole process group: not this test's)
    use std::os::unix::process::CommandExt;
    cmd.process_group(0);
    let cst = serve_and_fetch(&s, cmd, "lighttpd", "INT", (&ip, port), &want);
    check_workers("lighttpd", &s.stats("lighttpd"), &cst, rings);
    if let Some(d) = device {
        d.delta().assert_carried(cst.ring_bytes());
    }
}
