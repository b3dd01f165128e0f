//! An fd number reused while an epoll set still holds a registration made through it (the
//! connection's fd was closed while a duplicate kept it open; a new connection got the
//! number): registering the new connection, or deleting the number from a set where only the
//! old registration is, works on the new connection and leaves nothing of the old one's in
//! the sets (under the shim: no eventfd or completion channel of the old connection, which
//! would keep the set waking for nothing).
//!
//! The scenario (src/bin/behave.rs, `epoll_reuse`) asserts what Linux TCP does; it runs without
//! the shim (the expectations are the kernel's own) and with the shim on both ends.

use rdmashim_compat_tests::*;

const BIN: &str = env!("CARGO_BIN_EXE_behave");

#[test]
fn kernel_tcp() {
    behave_roles(
        BIN,
        "epoll_reuse",
        Side::Plain,
        Side::Plain,
        "127.0.0.1",
        None,
    );
}

/// Both ends shimmed on `ip`: three connections each, upgraded (`over_rdma`) or all on TCP for
/// the host's reason.
fn shimmed(ip: &str, over_rdma: bool) {
    let shim = Side::Shim(Via::Preload);
    let settle = over_rdma.then_some(SETTLE);
    let r = behave_roles(BIN, "epoll_reuse", shim, shim, ip, settle);
    for (role, st) in [("client", &r.client), ("server", &r.server)] {
        let st = st
            .as_ref()
            .unwrap_or_else(|| panic!("the {role} wrote no stats"));
        assert_eq!(st.connections(), 3, "{role}: {}", st.summary());
        if over_rdma {
            st.assert_all_upgraded();
            assert!(
                st.ring_bytes() > 0,
                "{role}: no ring bytes: {}",
                st.summary()
            );
        } else {
            st.assert_all_fallback(&expected_reason());
        }
    }
}

#[test]
fn under_the_shim() {
    shimmed("127.0.0.1", false);
}

/// RDMA tier: the old and new connections are upgraded, so their eventfds and completion
/// channels are in the sets.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn over_rdma() {
    shimmed(&test_ip(), true);
}
