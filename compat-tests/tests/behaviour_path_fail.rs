//! The ring path of an upgraded connection fails mid-stream (protocol §8.6): the stream goes
//! on over its TCP connection at the exact byte both ends agree on — 24 MiB each way at once,
//! every byte checked — and both sides count the connection's path failed, not a fallback.
//!
//! The scenario (src/bin/behave.rs, `duplex`) runs on kernel TCP first (its expectations are
//! the kernel's), then under the shim with the client's path failed on purpose at its 40th
//! ring read (`RDMASHIM_FAULT=path_fail:40`): over shared memory on every host, over RDMA in
//! the VM tier. (A device removed for real is in the RDMA tier's `rdma_failover` test.)

use rdmashim_compat_tests::*;

const BIN: &str = env!("CARGO_BIN_EXE_behave");

#[test]
fn kernel_tcp() {
    behave(BIN, "duplex", None, "127.0.0.1");
}

#[test]
fn over_shm() {
    behave_path_failed(BIN, Rings::Shm, 40);
}

/// RDMA tier: the same over soft-RoCE, the queue pair torn down under both streams.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn over_rdma() {
    behave_path_failed(BIN, Rings::Rdma, 40);
}

/// The client has read the server's whole stream (256 KiB, its end too) from the ring and had
/// its EOF, and goes on writing its own 24 MiB, when the server's path fails (at its 1000th
/// ring read, some 9 MiB into the client's stream: time enough on a loaded host for the
/// client to have read the server's 256 KiB — at the 300th it had not, in 2 of 12 runs beside
/// four busy loops): the server's record and the bytes it repeats of what the client read arrive
/// on a socket the client's program reads no more. The shim reads them itself; before, the
/// client's close left them unread, its kernel reset the connection, and the server lost the
/// end of the client's stream (ECONNRESET: found across two hosts, `t14`).
fn after_the_readers_end(rings: Rings) {
    let short = ("BEHAVE_DUPLEX_SERVER_KIB", "256");
    let c = settled_and_failed(
        rings,
        &[short],
        &[short, ("RDMASHIM_FAULT", "path_fail:1000")],
    );
    assert!(
        rings.rx(&c) == 256 << 10 && c.bytes("tcp_rx") == 0,
        "the client read all of the server's stream from the ring: {}",
        c.summary()
    );
}

#[test]
fn after_the_readers_end_over_shm() {
    after_the_readers_end(Rings::Shm);
}

/// RDMA tier: the same over soft-RoCE.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn after_the_readers_end_over_rdma() {
    after_the_readers_end(Rings::Rdma);
}

/// A writer that waits for EPOLLOUT (PostgreSQL's backend sending a `COPY … TO STDOUT`): the
/// server sends 8 MiB without blocking, with a 64 KiB send buffer, waiting in epoll whenever
/// the socket is full (and for EPOLLIN to read: no blocking call of its own drives the
/// connection); the client sent its 1 MiB at once, and shuts its side only once it has read
/// everything; it reads slowly (a 1 ms nap before each read: the server's ring stays full),
/// and its path fails at its 400th ring read. The server's continuation (what the client had
/// not read of the ring) is several times what its socket takes at once, and nothing of the
/// program's drives the connection meanwhile: the engine writes the rest as the socket
/// takes it. Before, the engine's retry was never due (its time was taken anew at every
/// look), and the writer slept until something else happened — across two hosts the link's
/// teardown, 40–50 s later (two_hosts' t15); here never (the client's read timed out).
fn a_writer_waiting_for_epollout(rings: Rings) {
    nonblocking_writer(rings, true);
}

/// The same, but the client shuts its side as soon as its 1 MiB is out (on the ring; after
/// the failover its continuation ends with a FIN on the socket) while the server waits for
/// EPOLLOUT. The shim's own registration of the socket asks for EPOLLRDHUP, to learn of the
/// socket's end while the stream is on the ring; level-triggered, an end the program did
/// not ask for woke its every wait, which filtered it out and waited again: the wait spun
/// (17 million wakes in one run, 0.62 s of CPU in 1.06 s of waiting). The scenario checks
/// that its waits for EPOLLOUT used at most a tenth of their time in CPU (0.00 s now).
fn a_writer_waiting_for_epollout_after_the_peers_end(rings: Rings) {
    nonblocking_writer(rings, false);
}

/// `duplex` with a non-blocking server (see [`a_writer_waiting_for_epollout`]) that writes
/// 8 MiB, a slow client that writes 1 MiB and shuts its side at once or, `late_shut`, once it
/// read everything, and whose path fails at its 400th ring read: over plain TCP first (the
/// scenario's expectations are the kernel's), then over `rings`.
fn nonblocking_writer(rings: Rings, late_shut: bool) {
    let sizes = [
        ("BEHAVE_DUPLEX_SERVER_KIB", "8192"),
        ("BEHAVE_DUPLEX_MIB", "1"),
    ];
    let server_env = [sizes[0], sizes[1], ("BEHAVE_DUPLEX_NONBLOCKING", "1")];
    let mut client_env = vec![
        sizes[0],
        sizes[1],
        ("BEHAVE_DUPLEX_READ_NAP_MS", "1"),
        ("RDMASHIM_FAULT", "path_fail:400"),
    ];
    if late_shut {
        client_env.push(("BEHAVE_DUPLEX_LATE_SHUT", "1"));
    }
    behave_roles_envs(
        BIN,
        "duplex",
        (Side::Plain, &client_env),
        (Side::Plain, &server_env),
        "127.0.0.1",
        None,
    );
    let c = settled_and_failed(rings, &client_env, &server_env);
    assert!(
        c.bytes("tcp_rx") > 0,
        "the client read the rest over TCP: {}",
        c.summary()
    );
}

#[test]
fn a_writer_waiting_for_epollout_after_the_peers_end_over_shm() {
    a_writer_waiting_for_epollout_after_the_peers_end(Rings::Shm);
}

/// RDMA tier: the same over soft-RoCE.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn a_writer_waiting_for_epollout_after_the_peers_end_over_rdma() {
    a_writer_waiting_for_epollout_after_the_peers_end(Rings::Rdma);
}

#[test]
fn a_writer_waiting_for_epollout_over_shm() {
    a_writer_waiting_for_epollout(Rings::Shm);
}

/// RDMA tier: the same over soft-RoCE.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn a_writer_waiting_for_epollout_over_rdma() {
    a_writer_waiting_for_epollout(Rings::Rdma);
}

/// `duplex` over `rings` with each role's variables, the server settled first (its stream
/// starts on the ring): both sides must count the connection upgraded and its path failed.
/// Returns the client's stats.
fn settled_and_failed(
    rings: Rings,
    client_env: &[(&str, &str)],
    server_env: &[(&str, &str)],
) -> Stats {
    let shim = Side::Shim(Via::Preload);
    let r = behave_roles_envs(
        BIN,
        "duplex",
        (shim, client_env),
        (shim, server_env),
        &rings.ip(),
        Some(SETTLE),
    );
    for (role, st) in [("client", &r.client), ("server", &r.server)] {
        let st = st.as_ref().expect("stats");
        assert_eq!(st.connections(), 1, "{role}: {}", st.summary());
        assert_eq!(st.upgraded(), 1, "{role}: {}", st.summary());
        assert_eq!(st.path_failed, 1, "{role}: path failed: {}", st.summary());
    }
    r.client.expect("stats")
}
