//! Secure execution: in a set-user-ID program started by another user (`AT_SECURE`), the
//! environment belongs to the caller, so the shim takes no setting and no path from it — no
//! stats file where `RDMASHIM_STATS` says, no debug lines because `RDMASHIM_LOG` says so
//! (docs/shim.md, "Secure execution").
//!
//! glibc preloads a library into such a program only from a system library directory and only
//! if the library is set-user-ID itself, so this test installs a copy there: it runs in the VM
//! tier, whose root filesystem is a throw-away overlay (and it is root there).

use rdmashim_compat_tests::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const LIB_NAME: &str = "librdmashim-secure-exec-test.so";

fn system_lib_dir() -> PathBuf {
    [
        "/usr/lib/x86_64-linux-gnu",
        "/lib/x86_64-linux-gnu",
        "/usr/lib",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.is_dir())
    .expect("a system library directory")
}

fn install(from: &Path, to: &Path, mode: u32) {
    std::fs::copy(from, to).unwrap_or_else(|e| panic!("copy to {}: {e}", to.display()));
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Runs `prog 3` (a sleep) as user nobody with the shim preloaded by name and its settings in the
/// environment; returns whether the shim was mapped into it (read from /proc while it runs)
/// and its stderr.
fn run_as_nobody(prog: &Path, stats: &Path) -> (bool, String) {
    // (the variables reach only the program: setpriv and env, which run before it, are
    // root's and nobody's own, not under secure execution, and would read them)
    let mut c = Command::new("setpriv");
    c.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--",
        "env",
    ])
    .arg(format!("LD_PRELOAD={LIB_NAME}"))
    .arg(format!("RDMASHIM_STATS={}", stats.display()))
    .arg("RDMASHIM_LOG=debug")
    .arg(prog)
    .arg("3")
    .env_remove("LD_PRELOAD")
    .env_remove("RDMASHIM_STATS")
    .env_remove("RDMASHIM_LOG")
    .env_remove("RDMASHIM_LOG_FILE")
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    let child = c.spawn().expect("spawn");
    // Once the pid runs the program (setpriv and env exec in turn) and its loader is done
    // (libc is mapped after the preloads).
    let proc = PathBuf::from(format!("/proc/{}", child.id()));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut maps = String::new();
    while std::time::Instant::now() < deadline {
        if std::fs::read_link(proc.join("exe")).ok().as_deref() == Some(prog) {
            maps = std::fs::read_to_string(proc.join("maps")).unwrap_or_default();
            if maps.contains("libc.so") {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = wait_child(child, Duration::from_secs(30));
    assert!(out.status.success(), "{}: {}", prog.display(), out.status);
    (
        maps.contains(LIB_NAME),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn under_secure_execution_the_environment_is_not_read() {
    let _ = test_device(); // (only in the VM: this installs into system directories)
    let lib = system_lib_dir().join(LIB_NAME);
    install(&shim().lib, &lib, 0o4755);
    let bin_dir = Path::new("/usr/local/lib/rdmashim-secure-exec-test");
    std::fs::create_dir_all(bin_dir).unwrap();
    let sleep = PathBuf::from("/bin/sleep");
    let suid = bin_dir.join("sleep-suid");
    let plain = bin_dir.join("sleep-plain");
    install(&sleep, &suid, 0o4755);
    install(&sleep, &plain, 0o755);
    let s = Scratch::new("secure-exec");
    std::fs::set_permissions(&s.dir, std::fs::Permissions::from_mode(0o1777)).unwrap();

    // A plain program as nobody: the shim is loaded and does what its environment says.
    let (mapped, err) = run_as_nobody(&plain, &s.dir.join("plain.%p.json"));
    assert!(mapped, "the shim was not loaded at all");
    assert!(err.contains("rdmashim["), "no debug line: {err:?}");
    assert_eq!(s.stats("plain").len(), 1, "the control run wrote its stats");

    // The same program set-user-ID root, started by nobody: loaded, and deaf to it.
    let (mapped, err) = run_as_nobody(&suid, &s.dir.join("suid.%p.json"));
    assert!(
        mapped,
        "the shim was not loaded into the set-user-ID program"
    );
    assert!(!err.contains("rdmashim["), "a setting was read: {err:?}");
    assert!(
        s.stats("suid").is_empty(),
        "a path was taken from the environment"
    );

    let _ = std::fs::remove_file(&lib);
    let _ = std::fs::remove_dir_all(bin_dir);
}
