//! A program near its descriptor limit (src/bin/behave.rs, `fd_limit_server` and
//! `fd_limit_client`): `RLIMIT_NOFILE` lowered to 256 and every number but the last twelve
//! taken by files, then three connections, then the program takes every descriptor left. It
//! must get exactly as many as on a kernel without the shim (twelve less its three sockets):
//! an upgrade would take descriptors of the shim's own (a private duplicate of the socket, the
//! readiness eventfds, the engine's and the device's), so the crowded end keeps each
//! connection on TCP (`fd_limit`, decided per connection, before its token or its SYN's mark)
//! and its peer sees a plain one (`plain_peer`). Every byte crosses as on TCP.

use rdmashim_compat_tests::*;

const BIN: &str = env!("CARGO_BIN_EXE_behave");
const CONNS: u64 = 3;

#[test]
fn kernel_tcp() {
    behave_conns(BIN, "fd_limit_server", None, "127.0.0.1", CONNS);
    behave_conns(BIN, "fd_limit_client", None, "127.0.0.1", CONNS);
}

/// Both ends shimmed on 127.0.0.1 (where they would upgrade to shared memory): every host.
#[test]
fn over_shm() {
    crowded(Rings::Shm);
}

/// RDMA tier: both ends on `RDMASHIM_TEST_IP`, where they would upgrade to RDMA rings.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn over_rdma() {
    crowded(Rings::Rdma);
}

fn crowded(rings: Rings) {
    let shim = Side::Shim(Via::Preload);
    for (scenario, crowded_server) in [("fd_limit_server", true), ("fd_limit_client", false)] {
        let r = behave_roles(BIN, scenario, shim, shim, &rings.ip(), None);
        let c = r.client.as_ref().expect("the client wrote no stats");
        let s = r.server.as_ref().expect("the server wrote no stats");
        let (crowded, peer) = if crowded_server { (s, c) } else { (c, s) };
        for st in [crowded, peer] {
            assert_eq!(st.connections(), CONNS, "{scenario}: {}", st.summary());
            assert_eq!(st.upgraded(), 0, "{scenario}: {}", st.summary());
            assert_eq!(
                rings.tx(st) + rings.rx(st),
                0,
                "{scenario}: {}",
                st.summary()
            );
        }
        assert_eq!(
            crowded.reason("fd_limit"),
            CONNS,
            "{scenario}: {}",
            crowded.summary()
        );
        assert_eq!(
            peer.reason("plain_peer"),
            CONNS,
            "{scenario}: {}",
            peer.summary()
        );
    }
}
