//! What the dynamic loader will do with the shim for a program `rdmashim run` is about to
//! start: programs it can never reach are named before they run, so that a user does not read
//! "nothing upgraded" in its stats (or find no stats at all) without a reason.
//!
//! - **Statically linked** (an ELF executable with no `PT_INTERP`): no dynamic loader runs in
//!   it, `LD_PRELOAD` is never read.
//! - **Go** (a `.go.buildinfo` section, or Go's build-id note): even when dynamically linked
//!   (cgo), the Go runtime makes its socket system calls itself, not through libc, so the
//!   hooks never see its connections.
//! - **setuid / setgid** (and not already that user or group): the loader runs it in secure
//!   mode (`AT_SECURE`) and ignores a preload path with a slash in it, which ours always has.
//!
//! A script (`#!`) is judged by its interpreter (through `/usr/bin/env NAME` too).
//! Everything else — including what cannot be read — is assumed to load the shim.

use crate::elf::{Elf, ET_DYN, ET_EXEC, PT_INTERP};
use std::ffi::OsStr;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Why the shim will not be in a program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unreachable {
    /// A statically linked executable.
    Static,
    /// A Go program.
    Go,
    /// setuid (`true`) or setgid (`false`) to someone else.
    SetId(bool),
}

impl Unreachable {
    /// One sentence for the user.
    pub fn explain(&self) -> &'static str {
        match self {
            Unreachable::Static => {
                "is statically linked: no dynamic loader runs in it, so the shim cannot be \
                 preloaded, and its connections stay kernel TCP (no stats are written for it)"
            }
            Unreachable::Go => {
                "is a Go program: the Go runtime makes its socket system calls itself, not \
                 through libc, so the shim sees none of its connections (they stay kernel TCP)"
            }
            Unreachable::SetId(true) => {
                "is setuid: the loader runs it in secure mode and ignores LD_PRELOAD paths, so \
                 the shim is not loaded and its connections stay kernel TCP"
            }
            Unreachable::SetId(false) => {
                "is setgid: the loader runs it in secure mode and ignores LD_PRELOAD paths, so \
                 the shim is not loaded and its connections stay kernel TCP"
            }
        }
    }
}

/// The file `exec` would run for `prog`: itself if it has a slash, else the first executable
/// file of that name on `path` (`PATH`).
pub fn resolve(prog: &OsStr, path: Option<&OsStr>) -> Option<PathBuf> {
    let p = Path::new(prog);
    if prog.as_encoded_bytes().contains(&b'/') {
        return p.is_file().then(|| p.to_path_buf());
    }
    std::env::split_paths(path?).map(|d| d.join(p)).find(|c| {
        c.metadata()
            .is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0)
    })
}

/// Why the shim cannot reach the program in `file` (run with `PATH` `path` by a process of
/// user `uid`, group `gid`), if it cannot.
pub fn judge(file: &Path, path: Option<&OsStr>, uid: u32, gid: u32) -> Option<Unreachable> {
    judge_depth(file, path, uid, gid, 0)
}

fn judge_depth(
    file: &Path,
    path: Option<&OsStr>,
    uid: u32,
    gid: u32,
    depth: u8,
) -> Option<Unreachable> {
    let meta = file.metadata().ok()?;
    if meta.mode() & libc::S_ISUID != 0 && meta.uid() != uid {
        return Some(Unreachable::SetId(true));
    }
    if meta.mode() & libc::S_ISGID != 0 && meta.gid() != gid {
        return Some(Unreachable::SetId(false));
    }
    let mut f = File::open(file).ok()?;
    let mut head = [0u8; 256];
    let n = read_up_to(&mut f, &mut head)?;
    let head = &head[..n];
    if head.starts_with(b"#!") {
        // (the kernel follows one interpreter; a second level is the interpreter's business)
        if depth > 0 {
            return None;
        }
        let interp = shebang_program(head, path)?;
        return judge_depth(&interp, path, uid, gid, depth + 1);
    }
    classify_elf(f)
}

/// The program a `#!` line runs: its interpreter, or for `/usr/bin/env [-S] NAME`, NAME
/// found on `path`.
fn shebang_program(head: &[u8], path: Option<&OsStr>) -> Option<PathBuf> {
    let line = head[2..].split(|b| *b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let mut words = line.split_whitespace();
    let interp = words.next()?;
    if Path::new(interp).file_name() == Some(OsStr::new("env")) {
        let name = words.find(|w| !w.starts_with('-'))?;
        return resolve(OsStr::new(name), path);
    }
    Some(PathBuf::from(interp))
}

fn read_up_to(f: &mut File, buf: &mut [u8]) -> Option<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    Some(n)
}

/// An ELF executable's verdict: static (no `PT_INTERP`), Go, or `None` (not ELF, not an
/// executable, unreadable: assumed fine).
fn classify_elf(f: File) -> Option<Unreachable> {
    let mut e = Elf::read(f)?;
    if e.kind != ET_EXEC && e.kind != ET_DYN {
        return None;
    }
    let interp = e.has_program_header(PT_INTERP)?;
    let go = e.sections().is_some_and(|s| {
        s.iter()
            .any(|s| s.name == b".go.buildinfo" || s.name == b".note.go.buildid")
    });
    if go {
        return Some(Unreachable::Go);
    }
    // (a static PIE is ET_DYN without PT_INTERP too; a shared library run directly has one)
    (!interp).then_some(Unreachable::Static)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn me() -> (u32, u32) {
        crate::sys::real_ids()
    }

    fn tmp(name: &str, bytes: &[u8], mode: u32) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = std::env::temp_dir().join(format!("rdmashim-prog-{}-{name}", std::process::id()));
        let mut f = File::create(&p).unwrap();
        f.write_all(bytes).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    fn elf(pt: u32, sections: &[&str]) -> Vec<u8> {
        crate::elf::tests::elf(ET_EXEC, pt, sections, &[])
    }

    #[test]
    fn dynamic_static_and_go_executables() {
        let (u, g) = me();
        let dynamic = tmp("dyn", &elf(PT_INTERP, &[".text"]), 0o755);
        assert_eq!(judge(&dynamic, None, u, g), None);
        let fixed = tmp("static", &elf(1, &[".text"]), 0o755);
        assert_eq!(judge(&fixed, None, u, g), Some(Unreachable::Static));
        let go = tmp("go", &elf(PT_INTERP, &[".text", ".go.buildinfo"]), 0o755);
        assert_eq!(judge(&go, None, u, g), Some(Unreachable::Go));
        let go_static = tmp("gos", &elf(1, &[".note.go.buildid"]), 0o755);
        assert_eq!(judge(&go_static, None, u, g), Some(Unreachable::Go));
        // Truncated or not ELF at all: assumed fine.
        let cut = tmp("cut", &elf(1, &[])[..40], 0o755);
        assert_eq!(judge(&cut, None, u, g), None);
        let text = tmp("text", b"hello", 0o755);
        assert_eq!(judge(&text, None, u, g), None);
        for p in [dynamic, fixed, go, go_static, cut, text] {
            let _ = std::fs::remove_file(p);
        }
    }

    #[test]
    fn real_binaries_of_this_host() {
        let (u, g) = me();
        // (the ones the setup installs: coreutils' ls is dynamic, busybox-static is static)
        assert_eq!(judge(Path::new("/bin/ls"), None, u, g), None);
        if Path::new("/bin/busybox").is_file() {
            assert_eq!(
                judge(Path::new("/bin/busybox"), None, u, g),
                Some(Unreachable::Static)
            );
        }
    }

    #[test]
    fn scripts_are_judged_by_their_interpreter() {
        let (u, g) = me();
        let fixed = tmp("interp", &elf(1, &[]), 0o755);
        let dir = fixed.parent().unwrap().as_os_str().to_owned();
        let direct = tmp(
            "s1",
            format!("#!{} -x\necho\n", fixed.display()).as_bytes(),
            0o755,
        );
        assert_eq!(judge(&direct, None, u, g), Some(Unreachable::Static));
        let name = fixed.file_name().unwrap().to_str().unwrap();
        let via_env = tmp(
            "s2",
            format!("#!/usr/bin/env -S {name} -q\n").as_bytes(),
            0o755,
        );
        assert_eq!(judge(&via_env, Some(&dir), u, g), Some(Unreachable::Static));
        let sh = tmp("s3", b"#!/bin/sh\ntrue\n", 0o755);
        assert_eq!(judge(&sh, None, u, g), None);
        for p in [fixed, direct, via_env, sh] {
            let _ = std::fs::remove_file(p);
        }
    }

    #[test]
    fn setuid_to_someone_else() {
        let (u, g) = me();
        let p = tmp("suid", &elf(PT_INTERP, &[]), 0o4755);
        // (owned by us: running it changes nothing, so the loader is not in secure mode)
        assert_eq!(judge(&p, None, u, g), None);
        assert_eq!(
            judge(&p, None, u.wrapping_add(1), g),
            Some(Unreachable::SetId(true))
        );
        let q = tmp("sgid", &elf(PT_INTERP, &[]), 0o2755);
        assert_eq!(
            judge(&q, None, u, g.wrapping_add(1)),
            Some(Unreachable::SetId(false))
        );
        for p in [p, q] {
            let _ = std::fs::remove_file(p);
        }
    }

    #[test]
    fn resolving_like_exec() {
        assert_eq!(
            resolve(OsStr::new("ls"), Some(OsStr::new("/nonexistent:/bin"))),
            Some(PathBuf::from("/bin/ls"))
        );
        assert_eq!(resolve(OsStr::new("ls"), None), None);
        assert_eq!(
            resolve(OsStr::new("/bin/ls"), None),
            Some(PathBuf::from("/bin/ls"))
        );
        assert_eq!(resolve(OsStr::new("./no-such-program"), None), None);
    }
}
