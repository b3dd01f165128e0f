//! RDMA tier: the connection kinds under the shim (`RDMASHIM_KIND`, protocol §3, §15–§17). Two
//! shimmed processes of `behave duplex` stream 24 MiB each way at once in random-sized writes
//! and reads, every byte checked by the programs; and as an event loop does, a server whose
//! non-blocking writes of 8 MiB wait in epoll for EPOLLOUT while its client reads slowly (the
//! waits must sleep: a tenth of their time in CPU at most, which the scenario checks).
//!
//! Which kind carried the bytes each side's stats say (`connections.kinds`), and the device
//! confirms where it can: rxe counts the work requests of the SEND opcodes it carries
//! (`rdma_sends`), and a WRITE WITH IMMEDIATE is not one. Over sends every DATA is a SEND of at
//! most 16 KiB, so 48 MiB of ring bytes are at least 3,072 of them; over WRITE WITH IMMEDIATE
//! and over READ pull only control messages are, a handful per connection. (rxe counts no
//! READs: over READ pull the bytes arriving whole, pulled from where the sender staged them,
//! prove the pulls.)
//!
//! The tests of this binary run one at a time: the device's counters are the host's.

use rdmashim_compat_tests::*;

const BIN: &str = env!("CARGO_BIN_EXE_behave");
const SENDS_BUF: u64 = 16 << 10;

static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A role's environment: the kind it asks for (`None`: none, so the shim's default — or the
/// kind the tests' own environment exports to every shimmed program, [`default_kind`]) and
/// other variables.
type Env<'a> = (Option<&'a str>, &'a [(&'a str, &'a str)]);

/// `behave duplex` between two shimmed processes with these environments: each side's stats,
/// and the device's SEND work requests over the run.
fn duplex(client: Env<'static>, server: Env<'static>) -> (RoleStats, u64) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let dev = test_device();
    let env = |(kind, extra): Env<'static>| {
        let mut v = extra.to_vec();
        v.extend(kind.map(|k| ("RDMASHIM_KIND", k)));
        v
    };
    let (c_env, s_env) = (env(client), env(server));
    let before = DeviceCounters::read(&dev);
    let shim = Side::Shim(Via::Preload);
    let r = behave_roles_envs(
        BIN,
        "duplex",
        (shim, &c_env),
        (shim, &s_env),
        &test_ip(),
        // (the streams start once the connection is on the ring)
        Some(SETTLE),
    );
    let d = before.delta();
    (r, d.rdma_sends)
}

/// Both roles upgraded their one connection, of kind `kind`, and carried at least `up` bytes
/// from the client and `down` bytes from the server on the ring (the first bytes may go by
/// TCP before the upgrade: the server's stream waits for it, the client's does not); returns
/// the ring bytes of both directions (as the client counted).
fn upgraded_and_carried(r: &RoleStats, kind: &str, up: u64, down: u64) -> u64 {
    for (role, st, tx, rx) in [
        ("client", &r.client, up, down),
        ("server", &r.server, down, up),
    ] {
        let st = st.as_ref().expect("stats");
        assert_eq!(st.connections(), 1, "{role}: {}", st.summary());
        assert_eq!(st.upgraded(), 1, "{role}: {}", st.summary());
        assert_eq!(st.kind(kind), 1, "{role}: not over {kind}: {:?}", st.kinds);
        assert_eq!(st.path_failed, 0, "{role}: {}", st.summary());
        assert!(
            st.bytes("ring_tx") >= tx && st.bytes("ring_rx") >= rx,
            "{role}: {tx} bytes out and {rx} in over the ring at least: {}",
            st.summary()
        );
    }
    let c = r.client.as_ref().unwrap();
    c.bytes("ring_rx") + c.bytes("ring_tx")
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn both_sides_asking_for_sends_stream_over_sends() {
    let (r, sends) = duplex((Some("sends"), &[]), (Some("sends"), &[]));
    let ring = upgraded_and_carried(&r, "sends", 16 << 20, 16 << 20);
    assert!(
        sends >= ring / SENDS_BUF,
        "{ring} ring bytes over sends are at least {} SENDs; the device carried {sends}",
        ring / SENDS_BUF
    );
}

/// An event loop's writer (the server: non-blocking writes of 8 MiB, waiting in epoll for
/// EPOLLOUT) ahead of a slow reader (the client naps 2 ms before each read), over the kind
/// `kind` (`None`: the default): returns the ring bytes and the device's SENDs.
///
/// The scenario allows the writer's waits a tenth of their time in CPU (+ 50 ms). Under
/// soft-RoCE a post does the device's work in the poster's system call, and the posts of
/// bytes that waited for the peer's receives run inside the wait that the credit ends: with a
/// 1 ms nap the waits took 0.16 s of CPU in 0.99 s over WRITE WITH IMMEDIATE (once in five
/// runs past the limit); that work is the same whatever the nap, so a reader twice as slow
/// puts it well under.
fn event_loop(kind: Option<&'static str>) -> (u64, u64) {
    // (both roles must be told the sizes; only the server writes without blocking, and only
    // the client naps before its reads)
    const SIZES: [(&str, &str); 2] = [
        ("BEHAVE_DUPLEX_SERVER_KIB", "8192"),
        ("BEHAVE_DUPLEX_MIB", "1"),
    ];
    const SERVER: [(&str, &str); 3] = [SIZES[0], SIZES[1], ("BEHAVE_DUPLEX_NONBLOCKING", "1")];
    const CLIENT: [(&str, &str); 3] = [SIZES[0], SIZES[1], ("BEHAVE_DUPLEX_READ_NAP_MS", "2")];
    let (r, sends) = duplex((kind, &CLIENT), (kind, &SERVER));
    let carried = match kind {
        Some("srq") => "sends",
        k => k.unwrap_or(default_kind()),
    };
    (upgraded_and_carried(&r, carried, 0, 8 << 20), sends)
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn an_event_loop_streams_over_sends() {
    let (ring, sends) = event_loop(Some("sends"));
    assert!(
        sends >= ring / SENDS_BUF,
        "{sends} SENDs for {ring} ring bytes"
    );
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn an_event_loop_streams_over_write_with_immediate() {
    let (ring, sends) = event_loop(Some("imm"));
    assert!(sends < 100, "{sends} SENDs for {ring} ring bytes");
}

/// Two shims that ask for no kind carry the default, duplex (as every program of the tier
/// does, `Stats::assert_upgraded`), an event loop's included.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn an_event_loop_streams_over_the_default_kind() {
    let (ring, sends) = event_loop(None);
    if default_kind() != "sends" {
        assert!(sends < 100, "{sends} SENDs for {ring} ring bytes");
    }
}

/// The SRQ kind on the server (its receives in a shared receive queue, a local choice) against
/// a client asking for sends: sends, carried as over sends.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn a_server_with_a_shared_receive_queue_streams_over_sends() {
    let (r, sends) = duplex((Some("sends"), &[]), (Some("srq"), &[]));
    let ring = upgraded_and_carried(&r, "sends", 16 << 20, 16 << 20);
    assert!(
        sends >= ring / SENDS_BUF,
        "{sends} SENDs for {ring} ring bytes"
    );
}

/// A kind only one side asks for is not used: the connection upgrades over WRITE WITH
/// IMMEDIATE, the kind every shim speaks, whose SENDs are its few control messages — against
/// a peer asking for imm and against one asking for the default, duplex.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn sends_asked_for_by_one_side_only_stays_on_write_with_immediate() {
    for (c, s) in [
        (Some("sends"), Some("imm")),
        (Some("duplex"), Some("sends")),
    ] {
        let (r, sends) = duplex((c, &[]), (s, &[]));
        let ring = upgraded_and_carried(&r, "imm", 16 << 20, 16 << 20);
        assert!(
            sends < 100,
            "{c:?}/{s:?}: {sends} SENDs for {ring} ring bytes: not WRITE WITH IMMEDIATE"
        );
    }
}

/// READ pull (protocol §16) under the shim: both sides ask for it, every DATA's bytes are
/// pulled by the receiver from the sender's staging area — 24 MiB each way, checked by the
/// programs — and the device carried no SEND per DATA (the announcements are WRITEs WITH
/// IMMEDIATE of no bytes).
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn both_sides_asking_for_read_pull_stream_over_read() {
    let (r, sends) = duplex((Some("read"), &[]), (Some("read"), &[]));
    let ring = upgraded_and_carried(&r, "read", 16 << 20, 16 << 20);
    assert!(sends < 100, "{sends} SENDs for {ring} ring bytes");
}

/// An event loop's writer ahead of a slow reader, over READ pull: its waits sleep (the
/// scenario's CPU check), and the stream arrives whole.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn an_event_loop_streams_over_read_pull() {
    let (ring, sends) = event_loop(Some("read"));
    assert!(sends < 100, "{sends} SENDs for {ring} ring bytes");
}

/// READ pull asked for by one side only: WRITE WITH IMMEDIATE, the kind every shim speaks.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn read_pull_asked_for_by_one_side_only_stays_on_write_with_immediate() {
    for (c, s) in [(Some("read"), Some("duplex")), (Some("imm"), Some("read"))] {
        let (r, _) = duplex((c, &[]), (s, &[]));
        upgraded_and_carried(&r, "imm", 16 << 20, 16 << 20);
    }
}

/// Duplex (protocol §17) under the shim: both sides ask for it, and the 24 MiB each way at
/// once go over WRITE WITH IMMEDIATE with credits riding on the other direction's DATA.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn both_sides_asking_for_duplex_stream_over_duplex() {
    let (r, sends) = duplex((Some("duplex"), &[]), (Some("duplex"), &[]));
    let ring = upgraded_and_carried(&r, "duplex", 16 << 20, 16 << 20);
    assert!(sends < 100, "{sends} SENDs for {ring} ring bytes");
}
