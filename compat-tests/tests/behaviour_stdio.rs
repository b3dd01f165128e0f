//! stdio on sockets (`fdopen`, `fgets`, `fputs`, `fflush`, `fclose`) on both ends: glibc moves
//! a stream's bytes with internal calls no preload sees, so the shim gives such a socket a
//! stream whose I/O goes through its hooks.
//!
//! The scenario (src/bin/behave.rs, `stdio`) asserts what Linux TCP does; it runs without the
//! shim (so the expectations are the kernel's own) and with the shim on both ends.

use rdmashim_compat_tests::*;

const BIN: &str = env!("CARGO_BIN_EXE_behave");

#[test]
fn kernel_tcp() {
    behave(BIN, "stdio", None, "127.0.0.1");
}

/// Over shared memory (both ends shimmed on 127.0.0.1, on every host): see [`on_rings`].
#[test]
fn over_shm() {
    on_rings(Rings::Shm);
}

/// RDMA tier: the same over RDMA rings (both ends on `RDMASHIM_TEST_IP`).
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn over_rdma() {
    on_rings(Rings::Rdma);
}

/// The streams' reads, writes and closes reach the hooks: the connection is upgraded and the
/// lines cross the rings (before, the streams' bytes went to the kernel sockets behind the
/// upgrade's back).
fn on_rings(rings: Rings) {
    let r = behave(BIN, "stdio", Some(Via::Preload), &rings.ip());
    for (role, st) in [("client", &r.client), ("server", &r.server)] {
        let st = st.as_ref().unwrap_or_else(|| panic!("{role} stats"));
        assert!(
            st.calls("fdopen") == 1 && st.calls("close") >= 1,
            "{role}: the stream's I/O did not reach the hooks: {}",
            st.summary()
        );
    }
    rings.assert_at_least(r.client.as_ref().expect("client stats"), 100_000, 100_000);
}
