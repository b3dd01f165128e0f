//! Shims of two releases that do not understand each other, on one host (127.0.0.1, where
//! both ends would upgrade to shared memory): `RDMASHIM_FAULT=version:3` makes one end speak
//! binding version 3, as a later release would. The `duplex` scenario streams 24 MiB each way
//! at once, every byte checked by the programs. The client takes the server's token out of the
//! stream whole (the application reads exactly what TCP gave it), counts `peer_version` and
//! never dials; the server, whose client never asked, counts `no_upgrade_request`. Nothing
//! goes over a ring. Between two hosts over RDMA: `two_hosts`' `t11_shims_of_other_releases`.

use rdmashim_compat_tests::*;

const BIN: &str = env!("CARGO_BIN_EXE_behave");
const NEWER: &[(&str, &str)] = &[("RDMASHIM_FAULT", "version:3")];

#[test]
fn newer_server() {
    other_releases(&[], NEWER);
}

#[test]
fn newer_client() {
    other_releases(NEWER, &[]);
}

/// Both releases alike (the knob on both ends): they understand each other and upgrade.
#[test]
fn both_newer() {
    let shim = Side::Shim(Via::Preload);
    let r = behave_roles_envs(
        BIN,
        "duplex",
        (shim, NEWER),
        (shim, NEWER),
        "127.0.0.1",
        Some(SETTLE),
    );
    for st in [r.client.as_ref(), r.server.as_ref()] {
        let st = st.expect("a role wrote no stats");
        st.assert_all_upgraded();
        assert!(st.bytes("shm_tx") > 0, "{}", st.summary());
    }
}

fn other_releases(client_env: &[(&str, &str)], server_env: &[(&str, &str)]) {
    let shim = Side::Shim(Via::Preload);
    let r = behave_roles_envs(
        BIN,
        "duplex",
        (shim, client_env),
        (shim, server_env),
        "127.0.0.1",
        None,
    );
    let c = r.client.as_ref().expect("the client wrote no stats");
    let s = r.server.as_ref().expect("the server wrote no stats");
    assert_eq!(c.connections(), 1, "{}", c.summary());
    assert_eq!(c.reason("peer_version"), 1, "{}", c.summary());
    assert_eq!(s.connections(), 1, "{}", s.summary());
    assert_eq!(s.reason("no_upgrade_request"), 1, "{}", s.summary());
    for st in [c, s] {
        assert_eq!(st.bytes("tcp_rx"), 24 << 20, "{}", st.summary());
        assert_eq!(st.bytes("tcp_tx"), 24 << 20, "{}", st.summary());
        assert_eq!(st.ring_bytes() + st.shm_bytes(), 0, "{}", st.summary());
    }
}
