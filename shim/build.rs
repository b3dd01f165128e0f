//! Builds the C-variadic entry points (`fcntl`, `fcntl64`, `ioctl`, `prctl`, `syscall`; `execl`,
//! `execlp`, `execle`) and the stdio stream maker of the `fdopen` hook, and links them into the cdylib
//! only. Stable Rust cannot define C-variadic functions; these few lines of C read the optional
//! argument per command (or the argument list) and call a fixed-signature function. `csrc/stdio.c` needs glibc's `struct _IO_FILE`, which only C
//! sees.
//!
//! The archive is passed as a cdylib link argument (not `rustc-link-lib`) so that any rlib and the
//! unit-test executables never contain a definition of `fcntl`/`ioctl`. rustc's version script hides
//! every symbol it does not know about; `csrc/exports.map` adds the C symbols to the dynamic
//! symbol table.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=csrc/variadic.c");
    println!("cargo:rerun-if-changed=csrc/stdio.c");
    println!("cargo:rerun-if-changed=csrc/exec.c");
    println!("cargo:rerun-if-changed=csrc/syscall.c");
    println!("cargo:rerun-if-changed=csrc/exports.map");
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    cc::Build::new()
        .file(manifest.join("csrc/variadic.c"))
        .file(manifest.join("csrc/stdio.c"))
        .file(manifest.join("csrc/exec.c"))
        .file(manifest.join("csrc/syscall.c"))
        .warnings(true)
        .extra_warnings(true)
        .flag_if_supported("-fno-strict-aliasing")
        .cargo_metadata(false)
        .compile("rdmashim_variadic");
    let archive = out.join("librdmashim_variadic.a");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--whole-archive,{},--no-whole-archive",
        archive.display()
    );
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        manifest.join("csrc/exports.map").display()
    );
}
