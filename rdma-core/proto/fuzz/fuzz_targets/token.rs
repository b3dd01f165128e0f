//! Any first bytes of a server's direction: the token scan never panics, and a token it
//! returns is exactly the first TOKEN_LEN bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdmashim_proto::binding::{classify_syn, scan_token, TokenScan, TOKEN_LEN};

fuzz_target!(|data: &[u8]| {
    if let TokenScan::Token(t) = scan_token(data) {
        assert_eq!(&t.encode()[..], &data[..TOKEN_LEN]);
    }
    let _ = classify_syn(data);
});
