//! Any bytes: never panics; an accepted input re-encodes to exactly its message bytes and the
//! rest was zero padding.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdmashim_proto::ConnectRequest;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = ConnectRequest::decode(data) {
        let enc = m.encode();
        assert_eq!(&enc[..], &data[..enc.len()]);
        assert!(data[enc.len()..].iter().all(|&b| b == 0));
        assert_eq!(ConnectRequest::decode(&enc), Ok(m));
    }
});
