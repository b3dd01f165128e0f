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
//!
//! Binary upgrade (SIGUSR2, then SIGQUIT to the old master): the old master forks and execs
//! a new one, which inherits the listening socket through the exec (`NGINX` names its
//! descriptor) and forks workers of its own; once the old master is gone, the client's
//! connections go to the new workers, which adopt the socket at their first accept
//! (docs/upgrade.md §7, "Listening sockets made elsewhere"), and upgrade there. nginx keeps
//! only the variables its `env` directives name across that exec: the configuration names the
//! shim's. Before, no connection of the new workers upgraded (`plain_peer`).

use rdmashim_compat_tests::prefork_http::{check_workers, fetch, serve_and_fetch, www};
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

/// `cmd` (nginx under the shim) with a configuration of two workers serving `www` on
/// `ip:port`, its files in the scratch directory; `head`: directives first (`daemon off`
/// unless it says otherwise).
fn nginx_cmd(
    mut cmd: std::process::Command,
    s: &Scratch,
    head: &str,
    (ip, port): (&str, u16),
    www: &std::path::Path,
) -> std::process::Command {
    let d = s.dir.display();
    let daemon = if head.contains("daemon ") {
        ""
    } else {
        "daemon off;\n"
    };
    let conf = s.dir.join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "{head}{daemon}worker_processes 2;\nmaster_process on;\npid {d}/nginx.pid;\n\
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
    cmd.arg("-c")
        .arg(&conf)
        .arg("-p")
        .arg(&s.dir)
        .arg("-e")
        .arg(s.dir.join("error.log"));
    cmd
}

fn nginx_workers(rings: Rings) {
    let ip = rings.ip();
    let Some(nginx) = require("/usr/sbin/nginx") else {
        return;
    };
    let s = Scratch::new("up-nginx");
    let (www, want) = www(&s);
    let port = free_port_on(&ip);
    let device = rings.device();
    let cmd = nginx_cmd(shimmed(&nginx, &s, "nginx"), &s, "", (&ip, port), &www);
    let cst = serve_and_fetch(&s, cmd, "nginx", "QUIT", (&ip, port), &want);
    let all = s.stats("nginx");
    // The master and its two workers each wrote a record; only workers accepted.
    assert_eq!(all.len(), 3, "nginx records: {all:#?}");
    check_workers("nginx", &all, &cst, rings);
    if let Some(d) = device {
        d.delta().assert_carried(cst.ring_bytes());
    }
}

/// RDMA tier: the binary upgrade over RDMA.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn nginx_after_a_binary_upgrade() {
    binary_upgrade(Rings::Rdma);
}

/// The binary upgrade over shared memory, on 127.0.0.1: every host.
#[test]
fn nginx_after_a_binary_upgrade_over_shm() {
    binary_upgrade(Rings::Shm);
}

/// The pid nginx wrote to `path` once it is there and differs from `not`, within 30 s.
fn pid_file(path: &std::path::Path, not: u32) -> u32 {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let pid = std::fs::read_to_string(path)
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok());
        match pid {
            Some(p) if p != not => return p,
            _ => assert!(
                std::time::Instant::now() < until,
                "{}: no new pid in 30 s",
                path.display()
            ),
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Whether process `pid` is gone (or a zombie).
fn gone(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |st| {
        st.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
    })
}

/// Sends `sig` to `pid`.
fn send(pid: u32, sig: &str) {
    let st = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("kill");
    assert!(st.success(), "kill -{sig} {pid}");
}

/// Sends `sig` to `pid` and waits up to 30 s for it to be gone.
fn stop(pid: u32, sig: &str) {
    send(pid, sig);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !gone(pid) {
        assert!(
            std::time::Instant::now() < until,
            "{pid} still there 30 s after SIG{sig}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// nginx masters (daemons: no test's children) killed with their process groups if the test
/// fails before it stops them.
struct Masters(Vec<u32>);

impl Drop for Masters {
    fn drop(&mut self) {
        for pid in self.0.iter().filter(|p| !gone(**p)) {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .status();
        }
    }
}

fn binary_upgrade(rings: Rings) {
    let ip = rings.ip();
    let Some(nginx) = require("/usr/sbin/nginx") else {
        return;
    };
    let s = Scratch::new("up-nginx-binary");
    let (www, want) = www(&s);
    let port = free_port_on(&ip);
    let pid_path = s.dir.join("nginx.pid");
    // (a daemon: nginx takes SIGUSR2 only from a master whose parent is gone; the shim's
    // variables named so that the new binary keeps them)
    // (those set here and the shim's inherited from the test's environment: the VM's
    // RDMASHIM_LOCAL=0, without which the new workers would serve this host's clients on
    // shared memory while the client dials rdma_cm)
    let service = shimmed(&nginx, &s, "nginx");
    let mut names: Vec<String> = service
        .get_envs()
        .filter(|(_, v)| v.is_some())
        .map(|(k, _)| k.to_string_lossy().into_owned())
        .chain(
            std::env::vars()
                .map(|(k, _)| k)
                .filter(|k| k.starts_with("RDMASHIM_")),
        )
        .collect();
    names.sort();
    names.dedup();
    let envs: String = names.iter().map(|k| format!("env {k};\n")).collect();
    let head = format!("{envs}daemon on;\n");
    let device = rings.device();
    let cmd = nginx_cmd(service, &s, &head, (&ip, port), &www);
    run_ok(cmd, std::time::Duration::from_secs(30));
    let old = pid_file(&pid_path, 0);
    let mut masters = Masters(vec![old]);
    send(old, "USR2");
    let new = pid_file(&pid_path, old);
    masters.0.push(new);
    stop(old, "QUIT");
    let cst = fetch(&s, &ip, port, &want);
    stop(new, "QUIT");
    // (the workers end with their master; the records are written by then)
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let all = loop {
        let all = s.stats("nginx");
        let new_workers = all.iter().filter(|st| st.ppid() == u64::from(new)).count();
        if new_workers == 2 || std::time::Instant::now() > until {
            break all;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let (theirs, others): (Vec<Stats>, Vec<Stats>) =
        all.into_iter().partition(|st| st.ppid() == u64::from(new));
    assert_eq!(
        theirs.len(),
        2,
        "the new master's workers' records: {theirs:#?}"
    );
    for st in &others {
        assert_eq!(st.connections(), 0, "before the upgrade: {}", st.summary());
    }
    check_workers("nginx", &theirs, &cst, rings);
    if let Some(d) = device {
        d.delta().assert_carried(cst.ring_bytes());
    }
}
