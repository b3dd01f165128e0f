//! RDMA tier: nginx as a prefork server. Its master makes the listening socket, forks two
//! workers (which drop root for `nobody`) and accepts nothing; the workers accept on the
//! inherited socket, from one epoll loop each, and send the files with `sendfile`. Each
//! worker serves its connections on an rdma_cm listener of its own, whose port its token
//! names (docs/upgrade.md §4), with queue pairs on a device context of its own (§7: the
//! master's, inherited, is refused to the workers by the kernel).
//!
//! A Python client under the shim keeps three connections alive at once, each fetching a
//! 256 KiB file twenty times, 100 ms apart, every body checked. Every connection is upgraded
//! in whichever worker took it, the later responses go through the rings (and the device's
//! packet counters), and the master's record shows no connection. Before the workers had
//! listeners and device contexts of their own, their connections stayed on TCP
//! (`inherited_listener`; a worker's queue pair on the master's context was reset at its
//! first post).

use rdmashim_compat_tests::prefork_http::{check_workers, serve_and_fetch, www};
use rdmashim_compat_tests::*;

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn nginx_prefork_workers_upgrade() {
    nginx_workers(Rings::Rdma);
}

/// The same over shared memory, on 127.0.0.1: every host.
#[test]
fn nginx_prefork_workers_upgrade_over_shm() {
    nginx_workers(Rings::Shm);
}

fn nginx_workers(rings: Rings) {
    let ip = rings.ip();
    let Some(nginx) = require("/usr/sbin/nginx") else {
        return;
    };
    let s = Scratch::new("up-nginx");
    let (www, want) = www(&s);
    let port = free_port_on(&ip);
    let d = s.dir.display();
    let conf = s.dir.join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "worker_processes 2;\ndaemon off;\nmaster_process on;\npid {d}/nginx.pid;\n\
             error_log {d}/error.log info;\nevents {{ worker_connections 64; }}\n\
             http {{\n  access_log off;\n  sendfile on;\n  keepalive_timeout 60;\n  \
             keepalive_requests 1000;\n  client_body_temp_path {d}/body;\n  \
             proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fcgi;\n  \
             uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n  \
             server {{ listen {ip}:{port}; root {}; }}\n}}\n",
            www.display()
        ),
    )
    .unwrap();
    let device = rings.device();
    let mut cmd = shimmed(&nginx, &s, "nginx");
    cmd.arg("-c")
        .arg(&conf)
        .arg("-p")
        .arg(&s.dir)
        .arg("-e")
        .arg(s.dir.join("error.log"));
    let cst = serve_and_fetch(&s, cmd, "nginx", "QUIT", (&ip, port), &want);
    let all = s.stats("nginx");
    // The master and its two workers each wrote a record; only workers accepted.
    assert_eq!(all.len(), 3, "nginx records: {all:#?}");
    check_workers("nginx", &all, &cst, rings);
    if let Some(d) = device {
        d.delta().assert_carried(cst.ring_bytes());
    }
}
