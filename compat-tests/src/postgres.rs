//! PostgreSQL for the tests that run it (the RDMA tier's pgbench, the two-host tier's COPY): where
//! it is installed, a data directory made with `initdb`, and a postmaster started under the shim.
//! PostgreSQL refuses to run as root, so a test that runs as root runs it as `postgres`.

use crate::{run_ok, shimmed, wait_listening, Scratch, Server};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The newest installed PostgreSQL's bin directory (with `postgres` and `pgbench`).
pub fn bin() -> Option<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|b| b.join("postgres").is_file() && b.join("pgbench").is_file())
        .collect();
    v.sort();
    v.pop()
}

/// `cmd` as the `postgres` user when running as root (PostgreSQL refuses root).
pub fn as_postgres(mut cmd: Command) -> Command {
    use std::os::unix::process::CommandExt;
    if !root() {
        return cmd;
    }
    let id = |flag: &str| -> u32 {
        let out = run_ok(
            {
                let mut c = Command::new("id");
                c.args([flag, "postgres"]);
                c
            },
            Duration::from_secs(10),
        );
        out.trim().parse().expect("id of postgres")
    };
    cmd.uid(id("-u")).gid(id("-g"));
    cmd
}

/// Whether this process runs as root (its effective user id, from `/proc/self/status`).
fn root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|st| {
            let ids = st.lines().find_map(|l| l.strip_prefix("Uid:"))?.to_owned();
            ids.split_whitespace().nth(1).map(|euid| euid == "0")
        })
        .unwrap_or(false)
}

fn chown_postgres(p: &Path) {
    if root() {
        let st = Command::new("chown")
            .args(["-R", "postgres"])
            .arg(p)
            .status()
            .expect("chown");
        assert!(st.success(), "chown {}", p.display());
    }
}

/// A postmaster under the shim (stats labelled `postmaster`, its backends' too) listening on
/// `ip`:`port`, over a data directory made in `s` that trusts `client` (an address or
/// prefix). `s`'s directory is made writable by all: the server and its clients write their
/// records there. Returns once it accepts connections (`pg_isready`). Stopped with SIGINT
/// (fast shutdown).
pub fn start(bin: &Path, s: &Scratch, ip: &str, port: u16, client: &str, opts: &[&str]) -> Server {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&s.dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let data = s.dir.join("data");
    let mut c = Command::new(bin.join("initdb"));
    c.arg("-D")
        .arg(&data)
        .args(["-A", "trust", "-U", "postgres", "--no-sync"]);
    std::fs::create_dir(&data).unwrap();
    chown_postgres(&data);
    run_ok(as_postgres(c), Duration::from_secs(120));
    let hba = data.join("pg_hba.conf");
    let mut conf = std::fs::read_to_string(&hba).unwrap();
    conf.push_str(&format!("host all all {client} trust\n"));
    std::fs::write(&hba, conf).unwrap();
    let mut cmd = shimmed(bin.join("postgres"), s, "postmaster");
    cmd.arg("-D")
        .arg(&data)
        .arg("-k")
        .arg(&s.dir)
        .args(["-h", ip, "-p", &port.to_string()])
        .args(["-c", "fsync=off", "-c", "max_connections=20"]);
    for o in opts {
        cmd.args(["-c", o]);
    }
    let mut server = Server::start(as_postgres(cmd), "postgres", "INT");
    wait_listening(port, &mut server, Duration::from_secs(60));
    // (listening is not ready: until its startup is done it refuses every connection with
    // "the database system is starting up". Asked over its Unix socket: no connection of
    // the shim's to count)
    let until = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let ready = Command::new(bin.join("pg_isready"))
            .args(["-q", "-p", &port.to_string(), "-U", "postgres", "-h"])
            .arg(&s.dir)
            .env_remove("LD_PRELOAD")
            .status()
            .is_ok_and(|st| st.success());
        if ready {
            break;
        }
        server.assert_running();
        assert!(
            std::time::Instant::now() < until,
            "postgres listens but is not ready after a minute"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    server
}
