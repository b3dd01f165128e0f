//! fork: a child closing its inherited copy leaves the parent's connection intact (redis BGSAVE); a child writing on it is heard.
//!
//! The scenario (src/bin/behave.rs, `fork`) asserts what Linux TCP does; it runs without the
//! shim (so the expectations are the kernel's own) and with the shim on both ends.

use rdmashim_compat_tests::*;

const BIN: &str = env!("CARGO_BIN_EXE_behave");

#[test]
fn kernel_tcp() {
    behave(BIN, "fork", None, "127.0.0.1");
}

#[test]
fn under_the_shim() {
    behave(BIN, "fork", Some(Via::Preload), "127.0.0.1");
}
