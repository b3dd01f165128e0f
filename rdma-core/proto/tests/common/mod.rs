//! Helpers shared by the protocol's integration tests.

use rdmashim_proto::{BindingKey, Proof, TcpTuple};

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
