//! RDMA tier: apache2 with mpm_prefork, the classic prefork server: its parent makes the
//! listening socket and forks workers (two to start, up to eight), each a single-threaded
//! process that drops root to `nobody` and then accepts on the inherited socket. As with nginx
//! and lighttpd (tests/upgrade_nginx.rs, upgrade_lighttpd.rs), each worker serves its
//! connections on an rdma_cm listener and a device context of its own (docs/upgrade.md §4,
//! §7); the credential change comes before the worker's first use of RDMA, so it changes
//! nothing (docs/upgrade.md §7, credential changes). The shared keep-alive client under the
//! shim: three connections, each fetching a 256 KiB file twenty times, 100 ms apart, every
//! body checked; every connection is upgraded in the worker that took it, and most responses
//! go through the rings (and the device's packet counters).

use rdmashim_compat_tests::prefork_http::{check_workers_woken, serve_and_fetch, www};
use rdmashim_compat_tests::*;

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn apache_prefork_workers_upgrade() {
    apache_workers(Rings::Rdma);
}

/// The same over shared memory, on 127.0.0.1: every host.
#[test]
fn apache_prefork_workers_upgrade_over_shm() {
    apache_workers(Rings::Shm);
}

fn apache_workers(rings: Rings) {
    let ip = rings.ip();
    let Some(apache) = require("/usr/sbin/apache2") else {
        return;
    };
    let modules = std::path::Path::new("/usr/lib/apache2/modules");
    let s = Scratch::new("up-apache");
    let (www, want) = www(&s);
    let port = free_port_on(&ip);
    let run = s.dir.join("run");
    std::fs::create_dir(&run).unwrap();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let user = if root {
        "User nobody\nGroup nogroup\n"
    } else {
        ""
    };
    let conf = s.dir.join("apache2.conf");
    std::fs::write(
        &conf,
        format!(
            "ServerRoot \"/etc/apache2\"\nServerName localhost\n\
             LoadModule mpm_prefork_module {m}/mod_mpm_prefork.so\n\
             LoadModule authz_core_module {m}/mod_authz_core.so\n\
             StartServers 2\nMinSpareServers 2\nMaxSpareServers 4\nMaxRequestWorkers 8\n\
             PidFile {run}/apache2.pid\nMutex file:{run} default\n\
             Listen {ip}:{port}\n{user}ErrorLog {dir}/error.log\nLogLevel warn\n\
             DocumentRoot \"{www}\"\n<Directory \"{www}\">\n  Require all granted\n</Directory>\n\
             KeepAlive On\nMaxKeepAliveRequests 1000\nKeepAliveTimeout 30\nEnableSendfile On\n",
            m = modules.display(),
            run = run.display(),
            dir = s.dir.display(),
            www = www.display(),
        ),
    )
    .unwrap();
    let device = rings.device();
    let mut cmd = shimmed(&apache, &s, "apache");
    cmd.arg("-DFOREGROUND").arg("-f").arg(&conf);
    // (its parent signals its whole process group at stop: not this test's)
    use std::os::unix::process::CommandExt;
    cmd.process_group(0);
    // (a graceful stop: the workers finish and exit normally, writing their records)
    let cst = serve_and_fetch(&s, cmd, "apache2", "WINCH", (&ip, port), &want);
    // At a graceful stop apache's parent wakes each worker blocked in accept by connecting to
    // its own listener (its "dummy connection"): those stay TCP — the worker's end
    // `closed_early` or `no_upgrade_request`, the parent's `closed_early`, or `peer_rejected`
    // when its dial came after the worker had closed its end (seen in CI), or over shared
    // memory `plain_peer` when the worker that accepted it was already on its way out and no
    // longer answered the rendezvous (seen in CI), or `peer_unreachable` when it was gone
    // before the parent's dial reached it (seen once in a full run) — and the client's
    // connections are the upgraded ones.
    let wakeups = [
        "closed_early",
        "no_upgrade_request",
        "peer_rejected",
        "plain_peer",
        "peer_unreachable",
    ];
    check_workers_woken("apache2", &s.stats("apache"), &cst, &wakeups, rings);
    if let Some(d) = device {
        d.delta().assert_carried(cst.ring_bytes());
    }
}
