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

/// Under the shim the streams' reads, writes and closes reach the hooks (loopback: TCP).
#[test]
fn under_the_shim() {
    let s = behave(BIN, "stdio", Some(Via::Preload), "127.0.0.1");
    for (role, st) in [("client", s.client), ("server", s.server)] {
        let st = st.unwrap_or_else(|| panic!("{role} stats"));
        assert!(
            st.calls("fdopen") == 1 && st.calls("close") >= 1 && st.bytes("tcp_rx") > 0,
            "{role}: the stream's I/O did not reach the hooks: {}",
            st.summary()
        );
    }
}

/// RDMA tier: the connection is upgraded and the lines cross the rings (before, the streams'
/// bytes went to the kernel sockets behind the upgrade's back).
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn over_rdma() {
    let r = behave(BIN, "stdio", Some(Via::Preload), &test_ip());
    r.client
        .expect("client stats")
        .assert_ring_at_least(100_000, 100_000);
}
