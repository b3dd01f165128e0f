//! RDMA tier: SSH servers, with the shim on both ends — the privilege-separated servers of the
//! process-model table (docs/shim.md), pulled from and pushed to (5 MB each way, byte-exact):
//! - OpenSSH's `sshd`: per login, a fork (by default re-executing itself: the connection goes
//!   to the new image on TCP), then a pre-authentication child in a sandbox (chroot into the
//!   privilege-separation directory, `RLIMIT_NOFILE` 0, `RLIMIT_FSIZE` 0, a seccomp filter that
//!   kills on unexpected system calls), then the session as the user. The socket is used by
//!   several processes in turn, so it stays TCP (or goes back to TCP at exact offsets); the
//!   shim lives in every one of those processes and must never get one killed or a login
//!   refused. Run both re-executing and, where the server still has `-r`, not.
//! - `dropbear`: a fork per login. Started by its absolute path (as service managers do), the
//!   child re-executes dropbear and the connection goes to the new image on TCP. Started by
//!   name, the child serves the connection and takes its upgrade over (`handed_to_child`);
//!   while checking the key it changes its effective ids (`seteuid`), so an upgraded
//!   connection goes back to TCP at exact offsets there (`credentials_changed`), or stays TCP
//!   if the change came first.
//!
//! Which of these happens depends on timing; the tests accept exactly these outcomes. Both
//! need root (the VM tier runs as root).

use rdmashim_compat_tests::*;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const BLOB: usize = 5_000_000;
/// Logins per test: half pull the blob, half push it.
const LOGINS: u64 = 4;

fn assert_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "SSH servers need root (their privilege separation); the VM tier runs as root"
    );
}

fn keygen(path: &Path) {
    let mut c = Command::new("ssh-keygen");
    c.args(["-q", "-t", "ed25519", "-N", "", "-f"]).arg(path);
    run_ok(c, Duration::from_secs(30));
}

/// Starts the server `cmd` (listening on `at`), then logs in [`LOGINS`] times through a
/// shimmed OpenSSH client (each its own process and connection) with the key
/// `userkey`: pulls the scratch's `blob` with `cat` and pushes it back with `cat >`,
/// checking every byte; stops the server. Asserts its log `log` has `accepted` once per
/// login, and returns the log.
fn serve_logins(
    s: &Scratch,
    cmd: Command,
    ssh: &Path,
    at: (&str, u16),
    log: &Path,
    accepted: &str,
) -> String {
    let (ip, port) = at;
    let key = s.dir.join("userkey");
    let blob = s.dir.join("blob");
    let mut daemon = Server::start(cmd, "ssh server", "TERM");
    wait_listening(port, &mut daemon, Duration::from_secs(30));
    let want = std::fs::read(&blob).unwrap();
    let server_log = || std::fs::read_to_string(log).unwrap_or_default();
    for i in 0..LOGINS / 2 {
        let client = |label: &str| {
            let mut c = shimmed(ssh, s, label);
            c.arg("-i")
                .arg(&key)
                .args([
                    "-o",
                    "StrictHostKeyChecking=no",
                    "-o",
                    "UserKnownHostsFile=/dev/null",
                    "-o",
                    "LogLevel=ERROR",
                    "-o",
                    "BatchMode=yes",
                    "-p",
                ])
                .arg(port.to_string())
                .arg(format!("root@{ip}"));
            c
        };
        let mut pull = client("client");
        pull.arg(format!("cat {}", blob.display()));
        let got = run(pull, Duration::from_secs(120));
        assert!(
            got.status.success(),
            "ssh pull {i}: {got:?}; server log:\n{}",
            server_log()
        );
        assert!(got.stdout == want, "pull {i}: the file arrived whole");
        let up = s.dir.join(format!("up{i}"));
        let mut push = client("client");
        push.arg(format!("cat > {}", up.display()));
        run_ok_with_input(push, &blob, Duration::from_secs(120));
        assert!(
            std::fs::read(&up).unwrap() == want,
            "push {i}: the file arrived whole"
        );
    }
    daemon.assert_running();
    daemon.stop();
    let text = server_log();
    assert_eq!(
        text.matches(accepted).count() as u64,
        LOGINS,
        "every login was accepted:\n{text}"
    );
    text
}

/// Every process's connections end on TCP (those that were upgraded switched back, at exact
/// offsets), each counted once, for the reasons of these process models; the clients count
/// one connection each.
/// `over`: the reasons a client may give (`peer_rejected` between two hosts' addresses; on
/// loopback, where nothing upgrades, the host tier's one reason).
fn check_outcomes(s: &Scratch, server: &str, over: &[&str], server_reasons: &[&str]) {
    let client = s.stats("client");
    let served = s.stats(server);
    for r in client.iter().chain(&served) {
        eprintln!("{}, switched back {}", r.summary(), r.switched_back);
    }
    assert_eq!(client.len() as u64, LOGINS, "one record per client process");
    assert_eq!(sum_connections(&client), LOGINS);
    for r in &client {
        r.assert_ends_on_tcp(over);
    }
    let mut allowed = server_reasons.to_vec();
    allowed.extend_from_slice(over);
    for r in &served {
        r.assert_ends_on_tcp(&allowed);
    }
}

fn sshd(reexec: bool, ip: String) {
    assert_root();
    let (Some(sshd), Some(ssh)) = (require("/usr/sbin/sshd"), require("ssh")) else {
        return;
    };
    let s = Scratch::new(if reexec { "sshd" } else { "sshd-r" });
    {
        use std::os::unix::fs::PermissionsExt;
        // (records of processes that dropped root: a sticky, world-writable dir, as /tmp)
        std::fs::set_permissions(&s.dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    }
    // The privilege-separation directory the sandboxed child is chrooted into.
    let _ = std::fs::create_dir_all("/run/sshd");
    let hostkey = s.dir.join("hostkey");
    let key = s.dir.join("userkey");
    keygen(&hostkey);
    keygen(&key);
    std::fs::copy(key.with_extension("pub"), s.dir.join("authorized_keys")).unwrap();
    std::fs::write(s.dir.join("blob"), random_bytes(BLOB, 41)).unwrap();
    let port = free_port_on(&ip);
    let log = s.dir.join("sshd.log");
    let conf = s.dir.join("sshd_config");
    std::fs::write(
        &conf,
        format!(
            "Port {port}\nListenAddress {ip}\nHostKey {hk}\nAuthorizedKeysFile {d}/authorized_keys\n\
             StrictModes no\nUsePAM no\nPermitRootLogin prohibit-password\nPidFile {d}/sshd.pid\n",
            hk = hostkey.display(),
            d = s.dir.display()
        ),
    )
    .unwrap();
    let mut cmd = shimmed(&sshd, &s, "sshd");
    cmd.args(["-D", "-f"]).arg(&conf).arg("-E").arg(&log);
    if !reexec {
        // (gone from OpenSSH 9.8, whose per-login process is always a new image)
        let mut t = Command::new(&sshd);
        t.args(["-t", "-r", "-f"]).arg(&conf);
        if !run(t, Duration::from_secs(30)).status.success() {
            eprintln!("SKIP: this sshd has no -r (it always re-executes)");
            return;
        }
        cmd.arg("-r");
    }
    let text = serve_logins(
        &s,
        cmd,
        &ssh,
        (&ip, port),
        &log,
        "Accepted publickey for root",
    );
    for bad in [
        "fatal",
        "killed",
        "signal 31",
        "Bad system call",
        "rdmashim",
    ] {
        assert!(!text.contains(bad), "sshd logged {bad:?}:\n{text}");
    }
    let reason = loopback_tcp_reason();
    let over: &[&str] = if Rings::at(&ip).is_some() {
        &["peer_rejected"]
    } else {
        &[&reason]
    };
    check_outcomes(
        &s,
        "sshd",
        over,
        &[
            "forked",
            "handed_to_child",
            "exec",
            "credentials_changed",
            "no_upgrade_request",
        ],
    );
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn sshd_privsep_sandbox_reexec() {
    sshd(true, test_ip());
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn sshd_privsep_sandbox_no_reexec() {
    sshd(false, test_ip());
}

/// Host tier: the same on loopback, where nothing upgrades — the shim still lives in every
/// process of the login, the sandboxed one included (before, its stats file could not be
/// written in the sandbox's chroot, and the warning's signal-mask calls got it killed by the
/// filter: every login refused).
#[test]
fn sshd_privsep_sandbox_loopback() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIP: sshd's privilege separation needs root");
        return;
    }
    sshd(true, "127.0.0.1".into());
}

/// `reexec`: started by its absolute path, dropbear's child re-executes it per login (a fresh
/// image, for its address-space randomisation) and the connection goes to the new image on
/// TCP; started by name, the child serves the login itself.
fn dropbear(reexec: bool) {
    assert_root();
    let ip = test_ip();
    let (Some(dropbear), Some(dropbearkey), Some(ssh), Some(unshare)) = (
        require("/usr/sbin/dropbear"),
        require("dropbearkey"),
        require("ssh"),
        require("unshare"),
    ) else {
        return;
    };
    let s = Scratch::new(if reexec { "dropbear" } else { "dropbear-fork" });
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&s.dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    }
    // dropbear reads root's keys from its home only: a home of the test's own, bind-mounted
    // over /root in a mount namespace of the server's (nothing outside it sees it).
    let home = s.dir.join("home");
    std::fs::create_dir_all(home.join(".ssh")).unwrap();
    let hostkey = s.dir.join("hostkey");
    let mut k = Command::new(&dropbearkey);
    k.args(["-t", "ed25519", "-f"]).arg(&hostkey);
    run_ok(k, Duration::from_secs(30));
    let key = s.dir.join("userkey");
    keygen(&key);
    std::fs::copy(key.with_extension("pub"), home.join(".ssh/authorized_keys")).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        for (p, m) in [(&home, 0o700), (&home.join(".ssh"), 0o700)] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
        }
    }
    std::fs::write(s.dir.join("blob"), random_bytes(BLOB, 43)).unwrap();
    let port = free_port_on(&ip);
    let log = s.dir.join("dropbear.log");
    // (the shim is preloaded into dropbear only: unshare and the shell exec it)
    let mut cmd = Command::new(&unshare);
    cmd.args(["-m", "sh", "-c"])
        .arg(format!(
            "mount --bind {home} /root && LD_PRELOAD={lib} RDMASHIM_STATS={st} RDMASHIM_LOG=warn \
             PATH={dir}:$PATH exec {dropbear} -F -E -s -p {ip}:{port} -r {hk} 2>>{log}",
            home = home.display(),
            lib = shim().lib.display(),
            st = s.stats_pattern("dropbear").display(),
            dir = dropbear.parent().unwrap().display(),
            dropbear = if reexec {
                dropbear.display().to_string()
            } else {
                "dropbear".into()
            },
            hk = hostkey.display(),
            log = log.display()
        ))
        .env_remove("LD_PRELOAD");
    let text = serve_logins(
        &s,
        cmd,
        &ssh,
        (&ip, port),
        &log,
        "Pubkey auth succeeded for 'root'",
    );
    assert!(
        !text.contains("rdmashim"),
        "the shim wrote to dropbear's log:\n{text}"
    );
    check_outcomes(
        &s,
        "dropbear",
        &["peer_rejected"],
        &[
            "handed_to_child",
            "credentials_changed",
            "forked",
            "exec",
            "no_upgrade_request",
        ],
    );
    if reexec {
        return;
    }
    // The listener handed the logins to the children that serve them, which took their
    // upgrades over, and either went back to TCP at the key check's `seteuid` or stayed TCP
    // if that came first: counted once by each child. A login whose offer the listener
    // withdrew (docs/upgrade.md §7: it forked the next login's child while still holding
    // this one, or no child adopted it within the hold, as a loaded VM can make it) stays
    // TCP in every process (`forked`, its client `peer_rejected`), whole.
    let served = s.stats("dropbear");
    let listener = served
        .iter()
        .max_by_key(|r| r.connections())
        .expect("the listener's record");
    let (handed, withdrawn) = (
        listener.reason("handed_to_child"),
        listener.reason("forked"),
    );
    assert!(
        handed >= 1 && handed + withdrawn == LOGINS,
        "each login handed to the child that serves it, or withdrawn: {}",
        listener.summary()
    );
    let children: u64 = served
        .iter()
        .map(|r| r.upgraded() + r.reason("credentials_changed"))
        .sum();
    assert_eq!(children, LOGINS, "each login counted once by its child");
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn dropbear_reexec_per_login() {
    dropbear(true);
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn dropbear_fork_per_login() {
    dropbear(false);
}
