//! RDMA tier: `git daemon`, a fork-and-exec-per-connection server (as inetd's): for each
//! connection its parent forks a child that puts the socket on its stdin and stdout and
//! execs `git daemon --serve`, which reads the request and runs `git upload-pack` on the same
//! socket (another fork and exec). Two clones of a repository (3 MB of random bytes and a
//! text file) by a shimmed `git clone`: both trees are byte-exact.
//!
//! The shim's decision, checked in the records: the connection is offered to the child at
//! the fork (docs/shim.md, process models), but the child execs before it uses it — a new
//! image, with no way yet to take over a connection its parent offered — so it stays TCP for
//! good: the daemon declines the client's upgrade (`peer_rejected`, or `closed_early` if the
//! clone was over first), nothing goes through a ring, and no process waits on the way.

use rdmashim_compat_tests::*;
use std::process::Command;
use std::time::Duration;

fn git(dir: &std::path::Path, args: &[&str]) {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            "user.email=t@t",
            "-c",
            "user.name=t",
            "-c",
            "init.defaultBranch=main",
        ])
        .args(args)
        .output()
        .expect("git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn git_daemon_clones_intact() {
    let ip = test_ip();
    let Some(gitbin) = require("git") else { return };
    let s = Scratch::new("git-daemon");
    let src = s.dir.join("src");
    std::fs::create_dir(&src).unwrap();
    let big = random_bytes(3 << 20, 31);
    std::fs::write(src.join("big.bin"), &big).unwrap();
    let text: String = (0..100_000).map(|i| format!("{i}\n")).collect();
    std::fs::write(src.join("nums.txt"), &text).unwrap();
    git(&src, &["init", "-q"]);
    git(&src, &["add", "."]);
    git(&src, &["commit", "-qm", "init"]);
    git(&s.dir, &["clone", "-q", "--bare", "src", "repo.git"]);

    let port = free_port_on(&ip);
    let mut cmd = shimmed(&gitbin, &s, "daemon");
    cmd.arg("daemon")
        .arg(format!("--base-path={}", s.dir.display()))
        .args(["--export-all", "--reuseaddr"])
        .arg(format!("--listen={ip}"))
        .arg(format!("--port={port}"));
    let mut daemon = Server::start(cmd, "git daemon", "TERM");
    wait_listening(port, &mut daemon, Duration::from_secs(30));
    for i in 0..2 {
        let dest = s.dir.join(format!("clone{i}"));
        let label = format!("clone{i}");
        let mut c = shimmed(&gitbin, &s, &label);
        c.args(["clone", "-q"])
            .arg(format!("git://{ip}:{port}/repo.git"))
            .arg(&dest);
        run_ok(c, Duration::from_secs(120));
        assert!(
            std::fs::read(dest.join("big.bin")).unwrap() == big,
            "clone {i}: big.bin"
        );
        assert_eq!(
            std::fs::read_to_string(dest.join("nums.txt")).unwrap(),
            text,
            "clone {i}"
        );
        let recs = s.stats(&label);
        for r in &recs {
            eprintln!("{label}: {}", r.summary());
        }
        let conns: u64 = recs.iter().map(Stats::connections).sum();
        assert_eq!(conns, 1, "clone {i}: one connection");
        for r in &recs {
            // (a request that reached the daemon before its fork is answered there, and the
            // child's exec switches it back first: upgraded and switched back, as
            // upgrade_postgres saw once; else never upgraded, no byte on a ring)
            assert_eq!(r.upgraded(), r.switched_back, "{}", r.summary());
            if r.upgraded() == 0 {
                assert_eq!(r.ring_bytes(), 0, "{}", r.summary());
            }
            assert_eq!(
                r.fallback,
                r.reason("peer_rejected") + r.reason("closed_early"),
                "the daemon's child execs: {}",
                r.summary()
            );
        }
    }
    daemon.stop();
    for r in s.stats("daemon") {
        eprintln!("daemon: {}", r.summary());
        assert_eq!(r.upgraded(), r.switched_back, "{}", r.summary());
    }
}
