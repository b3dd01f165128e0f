//! Helpers shared by the protocol's integration tests.

use rdmashim_proto::{BindingKey, Completion, Connection, ErrorReason, Proof, TcpTuple};

/// The binding both ends of a test connection share (as the shim's token gives it to them).
pub fn proof() -> Proof {
    Proof::Bound {
        key: BindingKey::from_random([0x5a; 16]),
        tuple: TcpTuple {
            client: "10.0.0.1:1234".parse().unwrap(),
            server: "10.0.0.2:80".parse().unwrap(),
        },
    }
}

/// Hands completion `c` to `conn` (side `who`), and checks on a copy that the core's general
/// path (`handle_completion_general`, without its DATA lane) returns the same and leaves the
/// same core. Returns the result and whether the lane took the completion.
#[allow(dead_code)] // (not every test binary hands completions over this way)
pub fn complete(
    conn: &mut Connection,
    c: Completion<'_>,
    who: &str,
) -> (Result<(), ErrorReason>, bool) {
    let lane = conn.takes_data_lane(c);
    let mut general = conn.clone();
    let want = general.handle_completion_general(c);
    let got = conn.handle_completion(c);
    assert_eq!(
        got, want,
        "{who}: the DATA lane returns another result than the general path"
    );
    assert!(
        *conn == general,
        "{who}: the DATA lane leaves another core than the general path:\n{conn:?}\n{general:?}"
    );
    (got, lane)
}
