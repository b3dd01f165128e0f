//! Any bytes: never panics; an accepted input re-encodes to exactly its message bytes and the
//! rest was zero padding.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdmashim_proto::Reject;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = Reject::decode(data) {
        let enc = m.encode();
        assert_eq!(&enc[..], &data[..enc.len()]);
        assert!(data[enc.len()..].iter().all(|&b| b == 0));
        assert_eq!(Reject::decode(&enc), Ok(m));
    }
});
