//! The Debian package and README's "Using it on an RDMA host", followed verbatim.
//!
//! README marks the code blocks of that section (`<!-- install-test:NAME -->`), and
//! `scripts/readme-block NAME` prints one: the README is the only place the commands run here
//! are written. scripts/test runs the `build` block (`scripts/package`) on the host before the
//! RDMA tier; inside the soft-RoCE VM, where the test is root and the overlay is thrown away,
//! [`readme_install_section_in_the_vm`] installs the package with the `install` block and runs
//! the `server`, `client`, `check` and `preload` blocks from the installed paths. The host tier
//! checks the packaging itself ([`package_contents`]: the same script, fed this build's debug
//! binaries) and that README's configuration table and the man pages name every variable.

use rdmashim_compat_tests::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const VERSION: &str = env!("CARGO_PKG_VERSION");
/// Where the package puts the library (the launcher's `lib_candidates` looks there).
const PACKAGE_LIB: &str = "/usr/lib/rdmashim/librdmashim.so";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repository root")
        .to_path_buf()
}

/// README's block `name` (scripts/readme-block).
fn readme_block(name: &str) -> String {
    let mut c = Command::new(repo().join("scripts/readme-block"));
    c.arg(name);
    let text = run_ok(c, T);
    assert!(!text.trim().is_empty(), "README's {name} block is empty");
    text
}

/// The commands of a shell block: one per line (a trailing `\` continues it), comments and
/// blank lines left out.
fn commands(block: &str) -> Vec<String> {
    let mut out = vec![];
    let mut cur = String::new();
    for line in block.lines() {
        let t = line.trim();
        if cur.is_empty() && (t.is_empty() || t.starts_with('#')) {
            continue;
        }
        match t.strip_suffix('\\') {
            Some(head) => {
                cur.push_str(head);
                cur.push(' ');
            }
            None => {
                cur.push_str(t);
                out.push(std::mem::take(&mut cur));
            }
        }
    }
    assert!(cur.is_empty(), "a command ends in `\\`: {block}");
    out
}

/// A numeric setting of settings.rs: its variable, range and default.
struct Numeric {
    name: String,
    min: u64,
    max: u64,
    default: u64,
}

/// The `RDMASHIM_*` names settings.rs reads, and its numeric settings whose range and
/// default are plain numbers.
fn settings() -> (Vec<String>, Vec<Numeric>) {
    let source = std::fs::read_to_string(repo().join("shim/src/settings.rs")).unwrap();
    let mut names: Vec<String> = source
        .match_indices("\"RDMASHIM_")
        .map(|(i, _)| {
            let rest = &source[i + 1..];
            let end = rest
                .find(|c: char| !(c.is_ascii_uppercase() || c == '_'))
                .unwrap_or(rest.len());
            rest[..end].to_string()
        })
        .collect();
    names.sort();
    names.dedup();
    assert!(names.len() >= 11, "{names:?}");
    let mut numbers = vec![];
    for block in source.split("= Number {").skip(1) {
        let block = &block[..block.find('}').unwrap()];
        let field = |f: &str| {
            block
                .lines()
                .find_map(|l| l.trim().strip_prefix(&format!("{f}: ")))
                .map(|v| v.trim_end_matches(',').trim_matches('"').to_string())
                .unwrap_or_else(|| panic!("{f} missing in {block}"))
        };
        // (`10_000`; `u32::MAX as u64` is no plain number)
        let number = |f: &str| field(f).replace('_', "").parse::<u64>();
        if let (Ok(min), Ok(max), Ok(default)) = (number("min"), number("max"), number("default")) {
            numbers.push(Numeric {
                name: field("name"),
                min,
                max,
                default,
            });
        }
    }
    assert!(numbers.len() >= 3, "{} numeric settings", numbers.len());
    (names, numbers)
}

/// A page as `man` shows it, in ASCII, without hyphenation or justification, whitespace runs
/// made single spaces; fails on any warning of the formatter.
fn render_man(page: &Path) -> String {
    let mut c = Command::new("man");
    c.args(["--nh", "--nj", "--warnings", "-P", "cat", "-l"])
        .arg(page)
        .env("LC_ALL", "C")
        .env("MANWIDTH", "100");
    let out = run(c, T);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && err.trim().is_empty(),
        "man -l {}: {}\n{err}",
        page.display(),
        out.status
    );
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Host tier: scripts/package, fed this build's (debug) binaries, makes a package with the
/// files where the launcher and the README say they are, root-owned, stripped, with the
/// RDMA libraries recommended, not required; its launcher finds its library from where
/// the package puts them; its man pages render without a warning.
#[test]
fn package_contents() {
    for p in ["dpkg-deb", "dpkg-shlibdeps", "man", "strip", "readelf"] {
        if require(p).is_none() {
            return;
        }
    }
    let s = Scratch::new("package");
    let bin_dir = shim().lib.parent().unwrap();
    assert_eq!(
        shim().launcher.parent(),
        Some(bin_dir),
        "the library and the launcher are built side by side"
    );
    let mut c = Command::new(repo().join("scripts/package"));
    c.arg("--bin-dir")
        .arg(bin_dir)
        .arg("--out")
        .arg(s.dir.join("out"));
    let deb = PathBuf::from(run_ok(c, Duration::from_secs(120)).trim());
    let arch = run_ok(
        {
            let mut c = Command::new("dpkg");
            c.arg("--print-architecture");
            c
        },
        T,
    );
    assert_eq!(
        deb,
        s.dir
            .join("out")
            .join(format!("rdmashim_{VERSION}_{}.deb", arch.trim()))
    );

    // Control fields.
    let field = |f: &str| {
        let mut c = Command::new("dpkg-deb");
        c.arg("-f").arg(&deb).arg(f);
        run_ok(c, T).trim().to_string()
    };
    assert_eq!(field("Package"), "rdmashim");
    assert_eq!(field("Version"), VERSION);
    assert_eq!(field("Architecture"), arch.trim());
    let depends = field("Depends");
    assert!(depends.contains("libc6 (>= "), "Depends: {depends}");
    assert!(
        !depends.contains("ibverbs") && !depends.contains("rdmacm"),
        "the RDMA libraries are opened with dlopen, not required: {depends}"
    );
    assert_eq!(
        field("Recommends"),
        "libibverbs1, librdmacm1, ibverbs-providers"
    );

    // Files: exactly these, root-owned, with these modes.
    let mut c = Command::new("dpkg-deb");
    c.arg("-c").arg(&deb);
    let listing = run_ok(c, T);
    let mut files = vec![];
    let mut bytes = 0u64;
    for l in listing.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        assert_eq!(f[1], "root/root", "{l}");
        if f[0].starts_with('-') {
            files.push((f[5].trim_start_matches('.').to_string(), f[0].to_string()));
            bytes += f[2].parse::<u64>().unwrap();
        }
    }
    files.sort();
    let want = [
        ("/etc/rdmashim.conf", "-rw-r--r--"),
        ("/usr/bin/rdmashim", "-rwxr-xr-x"),
        (PACKAGE_LIB, "-rw-r--r--"),
        ("/usr/share/doc/rdmashim/changelog.gz", "-rw-r--r--"),
        ("/usr/share/doc/rdmashim/copyright", "-rw-r--r--"),
        ("/usr/share/man/man1/rdmashim.1.gz", "-rw-r--r--"),
        ("/usr/share/man/man5/rdmashim.conf.5.gz", "-rw-r--r--"),
        ("/usr/share/man/man7/rdmashim-preload.7.gz", "-rw-r--r--"),
    ];
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(p, m)| (p.to_string(), m.to_string()))
        .collect();
    assert_eq!(files, want, "{listing}");
    let installed: u64 = field("Installed-Size").parse().unwrap();
    assert!(
        installed >= bytes / 1024 && installed <= bytes / 1024 + 4 * listing.lines().count() as u64,
        "Installed-Size {installed} KiB for {bytes} bytes in {} entries",
        listing.lines().count()
    );

    // The configuration file is a conffile (dpkg keeps an administrator's changes).
    let mut c = Command::new("dpkg-deb");
    c.arg("-I").arg(&deb).arg("conffiles");
    assert_eq!(run_ok(c, T), "/etc/rdmashim.conf\n");

    // Unpacked: the launcher finds the library at the package's place, relative to itself;
    // both are stripped; the library needs no RDMA library to load.
    let root = s.dir.join("root");
    let mut c = Command::new("dpkg-deb");
    c.arg("-x").arg(&deb).arg(&root);
    run_ok(c, T);
    let mut c = Command::new("md5sum");
    c.arg("--quiet")
        .arg("-c")
        .current_dir(&root)
        .stdin(Stdio::null());
    let mut ctl = Command::new("dpkg-deb");
    ctl.arg("-I").arg(&deb).arg("md5sums");
    std::fs::write(root.join("md5sums"), run_ok(ctl, T)).unwrap();
    c.arg("md5sums");
    run_ok(c, T);
    let launcher = root.join("usr/bin/rdmashim");
    let lib = root.join(&PACKAGE_LIB[1..]).canonicalize().unwrap();
    let mut c = Command::new(&launcher);
    c.arg("--version");
    assert_eq!(run_ok(c, T).trim(), format!("rdmashim {VERSION}"));
    let mut c = Command::new(&launcher);
    c.args(["run", "--", "sh", "-c", "printf %s \"$LD_PRELOAD\""])
        .env_remove("LD_PRELOAD")
        .env_remove("RDMASHIM_LIB");
    assert_eq!(run_ok(c, T), lib.to_str().unwrap());
    let readelf = |args: &[&str], f: &Path| {
        let mut c = Command::new("readelf");
        c.args(args).arg(f);
        run_ok(c, T)
    };
    assert!(
        readelf(&["-S", "-W"], &shim().lib).contains(" .debug_info "),
        "the build has debug info"
    );
    for f in [&lib, &launcher] {
        let sections = readelf(&["-S", "-W"], f);
        assert!(
            // (.debug_gdb_scripts, which rustc puts in, is loaded memory, not debug info)
            [
                " .debug_info ",
                " .debug_line ",
                " .debug_str ",
                " .symtab "
            ]
            .iter()
            .all(|s| !sections.contains(s)),
            "{} not stripped:\n{sections}",
            f.display()
        );
    }
    let dynamic = readelf(&["-d"], &lib);
    assert!(
        !dynamic.contains("libibverbs") && !dynamic.contains("librdmacm"),
        "{dynamic}"
    );
    assert!(
        readelf(&["--dyn-syms", "-W"], &lib).contains(" rdmashim_syscall"),
        "the launcher knows the library by this symbol"
    );

    // Documents.
    let doc = root.join("usr/share/doc/rdmashim");
    let copyright = std::fs::read_to_string(doc.join("copyright")).unwrap();
    assert!(copyright.starts_with(
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n"
    ));
    assert!(
        copyright.contains("\nLicense: Expat or Apache-2.0\n"),
        "{copyright}"
    );
    let mut c = Command::new("gzip");
    c.arg("-dc").arg(doc.join("changelog.gz"));
    let changelog = run_ok(c, T);
    assert!(
        changelog.starts_with(&format!("rdmashim ({VERSION}) unstable; urgency=medium\n")),
        "{changelog}"
    );

    // Man pages: render cleanly; rdmashim(1) names every variable the shim reads, the
    // numbers with their ranges and defaults.
    let (names, numbers) = settings();
    let man1 = render_man(&root.join("usr/share/man/man1/rdmashim.1.gz"));
    for section in [
        "NAME",
        "SYNOPSIS",
        "DESCRIPTION",
        "OPTIONS",
        "ENVIRONMENT",
        "FILES",
        "EXIT STATUS",
        "EXAMPLES",
        "SEE ALSO",
    ] {
        assert!(
            man1.contains(&format!(" {section} ")) || man1.starts_with(section),
            "rdmashim(1) has no {section}: {man1}"
        );
    }
    for n in &names {
        assert!(man1.contains(n.as_str()), "rdmashim(1) does not name {n}");
    }
    for Numeric {
        name: n,
        min,
        max,
        default,
    } in &numbers
    {
        assert!(
            man1.contains(&format!("{n}=N"))
                && man1.contains(&format!("{min} to {max}, default {default}")),
            "rdmashim(1): {n} {min} to {max}, default {default}"
        );
    }
    assert!(man1.contains("/etc/rdmashim.conf") && man1.contains("rdmashim.conf(5)"));
    // rdmashim.conf(5): a key for every variable; the package's file is the repository's,
    // every line a comment.
    let man5 = render_man(&root.join("usr/share/man/man5/rdmashim.conf.5.gz"));
    for n in names.iter().filter(|n| *n != "RDMASHIM_CONFIG") {
        let key = n["RDMASHIM_".len()..].to_ascii_lowercase();
        assert!(
            man5.contains(&format!(" {key} = ")),
            "rdmashim.conf(5) has no key {key} (for {n})"
        );
    }
    for sel in ["program", "peer", "port", "local_port", "remote_port"] {
        assert!(
            man5.contains(&format!(" {sel} = ")),
            "rdmashim.conf(5): {sel}"
        );
    }
    let conf = std::fs::read_to_string(root.join("etc/rdmashim.conf")).unwrap();
    assert_eq!(
        conf,
        std::fs::read_to_string(repo().join("docs/rdmashim.conf")).unwrap()
    );
    assert!(
        conf.lines().all(|l| l.is_empty() || l.starts_with('#')),
        "{conf}"
    );
    let man7 = render_man(&root.join("usr/share/man/man7/rdmashim-preload.7.gz"));
    assert!(
        man7.contains(&format!("Environment=LD_PRELOAD={PACKAGE_LIB}")),
        "{man7}"
    );
    for reason in [
        "no_device",
        "libraries_missing",
        "resources",
        "plain_peer",
        "peer_rejected",
        "negative_cache",
    ] {
        assert!(
            man7.contains(reason),
            "rdmashim-preload(7) does not explain {reason}"
        );
    }
}

/// Host tier: every block the RDMA test follows is in README, and README's configuration
/// table has a row for every variable the shim reads, the numbers with their defaults and
/// ranges (as settings.rs has them).
#[test]
fn readme_section_is_complete() {
    for name in [
        "build", "install", "server", "client", "check", "preload", "systemd",
    ] {
        readme_block(name);
    }
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let section = &readme[readme
        .find("\n## Using it on an RDMA host\n")
        .expect("README has the section")..];
    let section = &section[..section[1..].find("\n## ").map_or(section.len(), |i| i + 1)];
    let (names, numbers) = settings();
    for n in &names {
        assert!(
            section.contains(&format!("\n| `{n}` | ")),
            "README's configuration table has no row for {n}"
        );
    }
    for Numeric {
        name: n,
        min,
        max,
        default,
    } in &numbers
    {
        let row = section
            .lines()
            .find(|l| l.starts_with(&format!("| `{n}` | ")))
            .unwrap();
        assert!(
            row.starts_with(&format!("| `{n}` | {default} | ")) && row.contains(&format!("{min}–{max}")),
            "README's row for {n} should give the default {default} and the range {min}–{max}: {row}"
        );
    }
    let systemd = readme_block("systemd");
    assert!(
        systemd.contains(&format!("Environment=LD_PRELOAD={PACKAGE_LIB}\n")),
        "{systemd}"
    );
    if let Some(analyze) = require_quietly("systemd-analyze") {
        // The drop-in, on a unit of its own, as systemd reads it: nothing to say about it
        // (and something once a line systemd does not know is added: it was read).
        let s = Scratch::new("dropin");
        std::fs::write(
            s.dir.join("rdmashim-check.service"),
            "[Service]\nType=oneshot\nExecStart=/bin/true\n",
        )
        .unwrap();
        std::fs::create_dir(s.dir.join("rdmashim-check.service.d")).unwrap();
        let verify = |dropin: &str| {
            std::fs::write(s.dir.join("rdmashim-check.service.d/rdmashim.conf"), dropin).unwrap();
            let mut c = Command::new(&analyze);
            c.args(["verify", "--man=no"])
                .arg(s.dir.join("rdmashim-check.service"))
                .env("SYSTEMD_UNIT_PATH", format!("{}:", s.dir.display()));
            String::from_utf8_lossy(&run(c, T).stderr).into_owned()
        };
        let err = verify(&systemd);
        assert!(
            !err.contains("rdmashim.conf"),
            "systemd-analyze verify says about README's drop-in: {err}"
        );
        let err = verify(&format!("{systemd}NoSuchKey=1\n"));
        assert!(
            err.contains("rdmashim.conf") && err.contains("NoSuchKey"),
            "systemd-analyze did not read the drop-in: {err}"
        );
    }
}

/// `prog` on PATH, or `None` (an optional check's tool).
fn require_quietly(prog: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(prog))
            .find(|p| p.is_file())
    })
}

/// A command of README's, as a user's shell would run it: from the repository's root, with
/// `SERVER` the server's address. Both ends share the VM's one address, so same-host upgrades
/// are off (as in the whole RDMA tier): their connections go over the device, as between two
/// hosts.
fn shell(line: &str) -> Command {
    let mut c = Command::new("bash");
    c.arg("-c")
        .arg(line)
        .current_dir(repo())
        .env("SERVER", test_ip())
        .env("RDMASHIM_LOCAL", "0")
        .env_remove("LD_PRELOAD")
        .env_remove("RDMASHIM_LIB")
        .env_remove("RDMASHIM_STATS")
        .env_remove("RDMASHIM_DISABLE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Runs one command of README's; its stdout, and its pid (a single command: bash execs it,
/// and `rdmashim run` execs the program, so the pid is the program's).
fn run_line(line: &str, timeout: Duration) -> (String, u32) {
    let child = shell(line)
        .spawn()
        .unwrap_or_else(|e| panic!("{line}: {e}"));
    let pid = child.id();
    let out = wait_child(child, timeout);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "README's `{line}` failed: {}\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    (stdout, pid)
}

/// A server started from README's line, killed if the test ends before it does.
struct Bg {
    child: Child,
    line: String,
}

impl Bg {
    fn start(line: &str) -> Bg {
        let child = shell(line)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{line}: {e}"));
        let bg = Bg {
            child,
            line: line.to_string(),
        };
        // Listening: a TCP listener of this pid (ss names the process).
        let deadline = Instant::now() + Duration::from_secs(60);
        let pid = format!("pid={},", bg.child.id());
        loop {
            let mut ss = Command::new("ss");
            ss.args(["-Hltnp"]);
            if run_ok(ss, T).contains(&pid) {
                return bg;
            }
            assert!(Instant::now() < deadline, "`{line}` never listened");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits for the server to end by itself; its stats file (the line's `--stats`
    /// pattern with its pid), if it has one.
    fn finish(mut self) -> Option<Stats> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st;
            }
            assert!(Instant::now() < deadline, "`{}` did not end", self.line);
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(status.success(), "`{}`: {status}", self.line);
        stats_of(&self.line, self.child.id())
    }
}

impl Drop for Bg {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The stats file a README command wrote: its `--stats` pattern, `%p` its pid.
fn stats_of(line: &str, pid: u32) -> Option<Stats> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let pattern = words
        .iter()
        .position(|w| *w == "--stats")
        .map(|i| words[i + 1])?;
    let path = pattern.replace("%p", &pid.to_string());
    assert!(Path::new(&path).is_file(), "`{line}` wrote no {path}");
    Some(Stats::load(Path::new(&path)))
}

/// RDMA tier: README's section, verbatim, inside the VM: the package (built on the host by
/// the `build` block) installs; the installed launcher's version and doctor's verdict (rxe0,
/// connections upgraded, the installed library); iperf3 under `rdmashim run` on both ends
/// upgrades its connections over the device (both processes' stats, the device's packet
/// counters) and the `check` block's grep says so; a client with plain `LD_PRELOAD` of the
/// installed library upgrades too (its server's stats); the systemd drop-in names the
/// installed library; the man pages are found; `dpkg -r` takes it all away.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn readme_install_section_in_the_vm() {
    let dev = test_device();
    test_ip();
    assert_eq!(
        std::fs::read_to_string("/proc/self/status")
            .unwrap()
            .lines()
            .find(|l| l.starts_with("Uid:"))
            .and_then(|l| l.split_whitespace().nth(2)),
        Some("0"),
        "installing the package needs root (the VM runs tests as root)"
    );
    let debs: Vec<PathBuf> = std::fs::read_dir(repo().join("target/debian"))
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(
        debs.iter().any(|p| p.extension().is_some_and(|e| e == "deb")),
        "no package in target/debian: build it first with README's build block (scripts/package; scripts/test does it before the RDMA tier)"
    );
    for p in ["iperf3", "ss", "man"] {
        require(p);
    }

    // man-db's trigger re-indexes every man page of the system after each install and
    // removal: over the VM's 9p root, emulated, that is about two minutes each (the install
    // itself takes 5 s). In the VM only, whose overlay is thrown away, man-db's automatic
    // updates are switched off by its own switch; `man -w` below still finds the pages.
    if std::env::var_os("RDMASHIM_IN_VM").is_some() {
        let _ = std::fs::remove_file("/var/lib/man-db/auto-update");
    }

    // Install, version, doctor.
    let mut ran = vec![];
    for line in commands(&readme_block("install")) {
        let (out, _) = run_line(&line, Duration::from_secs(300));
        ran.push((line, out));
    }
    let output_of = |prefix: &str| {
        ran.iter()
            .find(|(l, _)| l.starts_with(prefix))
            .map(|(_, o)| o.clone())
            .unwrap_or_else(|| panic!("README's install block has no `{prefix}` command"))
    };
    assert!(
        ran[0].0.starts_with("dpkg -i "),
        "the block starts by installing: {ran:?}"
    );
    let (which, _) = run_line("command -v rdmashim", T);
    assert_eq!(
        which.trim(),
        "/usr/bin/rdmashim",
        "the installed launcher is the one run"
    );
    assert_eq!(
        output_of("rdmashim --version").trim(),
        format!("rdmashim {VERSION}")
    );
    let doctor = output_of("rdmashim doctor");
    assert!(
        doctor.contains(&format!("  {dev}: ")),
        "{dev} not listed:\n{doctor}"
    );
    assert!(
        doctor.contains(&format!("shim library: {PACKAGE_LIB}\n")),
        "doctor does not name the installed library:\n{doctor}"
    );
    let verdict = doctor.lines().last().unwrap();
    assert!(
        verdict.starts_with(&format!(
            "verdict: connections to peers running rdmashim will be upgraded over {dev} ("
        )),
        "{verdict}"
    );
    let (man1, _) = run_line("man -w rdmashim", T);
    assert_eq!(man1.trim(), "/usr/share/man/man1/rdmashim.1.gz");
    let (man7, _) = run_line("man -w 7 rdmashim-preload", T);
    assert_eq!(man7.trim(), "/usr/share/man/man7/rdmashim-preload.7.gz");
    let (man5, _) = run_line("man -w 5 rdmashim.conf", T);
    assert_eq!(man5.trim(), "/usr/share/man/man5/rdmashim.conf.5.gz");
    assert!(
        doctor.contains("config file: /etc/rdmashim.conf (read)\nrules: none"),
        "the installed configuration file, read, with no rule:\n{doctor}"
    );
    assert!(!doctor.contains("warning:"), "{doctor}");

    // Server and client under `rdmashim run`.
    let servers = commands(&readme_block("server"));
    assert_eq!(servers.len(), 1, "{servers:?}");
    let device = DeviceCounters::read(&dev);
    let server = Bg::start(&servers[0]);
    let mut client_ring = 0;
    for line in commands(&readme_block("client")) {
        let (out, pid) = run_line(&line, Duration::from_secs(120));
        assert!(out.contains("receiver"), "`{line}`: {out}");
        let st = stats_of(&line, pid).expect("the client line writes stats");
        assert!(st.upgraded() >= 1, "`{line}`: {}", st.summary());
        Rings::Rdma.assert_carried(&st, &line);
        client_ring += st.ring_bytes();
    }
    let st = server.finish().expect("the server line writes stats");
    assert!(st.upgraded() >= 1, "{}", st.summary());
    Rings::Rdma.assert_carried(&st, &servers[0]);
    device.delta().assert_carried(client_ring);

    // What the check block prints: one count per process, every one upgraded something.
    for line in commands(&readme_block("check")) {
        let (out, _) = run_line(&line, T);
        let counts: Vec<u64> = out
            .lines()
            .map(|l| {
                l.strip_prefix("\"upgraded\":")
                    .and_then(|n| n.parse().ok())
                    .unwrap_or_else(|| panic!("`{line}` printed {l:?}"))
            })
            .collect();
        assert!(
            counts.len() >= 2 && counts.iter().all(|n| *n >= 1),
            "`{line}`: {out}"
        );
    }

    // A client with the installed library in LD_PRELOAD: the server (which only upgrades a
    // connection whose client runs the shim) upgrades.
    for line in commands(&readme_block("preload")) {
        assert!(
            line.contains(&format!("LD_PRELOAD={PACKAGE_LIB} ")),
            "{line}"
        );
        let server = Bg::start(&servers[0]);
        let (out, _) = run_line(&line, Duration::from_secs(120));
        assert!(out.contains("receiver"), "`{line}`: {out}");
        let st = server.finish().expect("the server line writes stats");
        assert!(
            st.upgraded() >= 1,
            "`{line}`: the server upgraded nothing: {}",
            st.summary()
        );
        Rings::Rdma.assert_carried(&st, &line);
    }

    // The systemd drop-in's library is the installed shim.
    let systemd = readme_block("systemd");
    let lib = systemd
        .lines()
        .find_map(|l| l.strip_prefix("Environment=LD_PRELOAD="))
        .expect("the drop-in sets LD_PRELOAD");
    let (files, _) = run_line("dpkg -L rdmashim", T);
    assert!(
        files.lines().any(|f| f == lib),
        "{lib} is not the package's: {files}"
    );
    run_line(&format!("rdmashim run --lib {lib} -- true"), T);

    // Removal (README: `dpkg -r rdmashim`) leaves none of its files.
    run_line("dpkg -r rdmashim", Duration::from_secs(300));
    for f in ["/usr/bin/rdmashim", PACKAGE_LIB] {
        assert!(!Path::new(f).exists(), "{f} left after dpkg -r");
    }
}
