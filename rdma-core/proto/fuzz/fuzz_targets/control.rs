//! Any bytes: never panics; an accepted control message re-encodes consistently (byte for byte
//! unless it is an ignorable kind, whose body is not kept).
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdmashim_proto::ControlMsg;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = ControlMsg::decode(data) {
        let enc = m.encode();
        assert_eq!(ControlMsg::decode(enc.as_bytes()), Ok(m));
        if !matches!(m, ControlMsg::Ignored { .. }) {
            let n = enc.as_bytes().len();
            assert_eq!(enc.as_bytes(), &data[..n]);
            assert!(data[n..].iter().all(|&b| b == 0));
        }
    }
});
