//! RDMA tier: the rsync daemon, fork per connection, pulled from by a shimmed `rsync` client
//! (5 MB of random bytes, byte-exact), in two set-ups:
//! - started as root with `uid = nobody` in its module: the child that serves a connection
//!   drops root after it reads the module's name. The credential change ends RDMA for it (the
//!   kernel refuses its RDMA commands after it, docs/shim.md): a connection already upgraded
//!   goes back to TCP at exact offsets (`switched_back` on both sides), one not yet decided
//!   stays TCP (`credentials_changed`; the client's `peer_rejected`). Before, the client
//!   waited 5 s for a dial the child could not answer;
//! - started unprivileged: the child takes the connection over; rsync's client forks its
//!   receiver early, and both of its processes use the socket, so the connection stays TCP
//!   (`forked`) or, if it was upgraded first, goes back to TCP at the receiver's first use.
//!
//! Which of these happens depends on timing; the test accepts exactly these outcomes, and in
//! all of them the file arrives whole and the connection is counted once by each side's
//! processes. (rsync cannot carry its data on a ring today: both of its ends fork.)

use rdmashim_compat_tests::*;
use std::time::Duration;

fn pull(unprivileged: bool) {
    let ip = test_ip();
    let Some(rsync) = require("rsync") else {
        return;
    };
    let s = Scratch::new(if unprivileged {
        "rsyncd-user"
    } else {
        "rsyncd-root"
    });
    {
        use std::os::unix::fs::PermissionsExt;
        // (records of processes that dropped root: a sticky, world-writable dir, as /tmp)
        std::fs::set_permissions(&s.dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    }
    let m = s.dir.join("m");
    std::fs::create_dir(&m).unwrap();
    let blob = random_bytes(5_000_000, 37);
    std::fs::write(m.join("blob"), &blob).unwrap();
    let conf = s.dir.join("rsyncd.conf");
    let uid = if unprivileged {
        ""
    } else {
        "uid = nobody\ngid = nogroup\n"
    };
    std::fs::write(
        &conf,
        format!(
            "use chroot = no\npid file = {d}/rsyncd.pid\nlog file = {d}/rsyncd.log\n\
             [m]\npath = {m}\nread only = yes\n{uid}",
            d = s.dir.display(),
            m = m.display()
        ),
    )
    .unwrap();
    let port = free_port_on(&ip);
    let mut cmd = if unprivileged {
        let mut c = shimmed("setpriv", &s, "rsyncd");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&rsync);
        c
    } else {
        shimmed(&rsync, &s, "rsyncd")
    };
    cmd.args(["--daemon", "--no-detach"])
        .arg(format!("--config={}", conf.display()))
        .arg(format!("--address={ip}"))
        .arg(format!("--port={port}"));
    let mut daemon = Server::start(cmd, "rsync daemon", "TERM");
    wait_listening(port, &mut daemon, Duration::from_secs(30));
    let out = s.dir.join("out");
    let mut c = shimmed(&rsync, &s, "client");
    c.arg("-q")
        .arg(format!("rsync://{ip}:{port}/m/blob"))
        .arg(&out);
    run_ok(c, Duration::from_secs(120));
    assert!(
        std::fs::read(&out).unwrap() == blob,
        "the file arrived whole"
    );
    daemon.stop();
    let client = s.stats("client");
    let served = s.stats("rsyncd");
    for r in client.iter().chain(&served) {
        eprintln!("{}, switched back {}", r.summary(), r.switched_back);
    }
    // The one connection, counted once by the client's processes (rsync forks its receiver).
    assert_eq!(client.iter().map(Stats::connections).sum::<u64>(), 1);
    // Each process may decide differently, by timing (whether the upgrade was settled before
    // the child dropped root, before the client forked its receiver), but always so: the
    // connection ends on TCP, and the reasons are the ones of these process models.
    for r in &client {
        r.assert_ends_on_tcp(&["peer_rejected", "forked", "closed_early"]);
    }
    for r in &served {
        r.assert_ends_on_tcp(&[
            "credentials_changed",
            "no_upgrade_request",
            "forked",
            "handed_to_child",
        ]);
    }
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn rsync_daemon_dropping_root() {
    pull(false);
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn rsync_daemon_unprivileged() {
    pull(true);
}
