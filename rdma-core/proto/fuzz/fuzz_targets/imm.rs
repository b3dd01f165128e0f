//! Any immediate: never panics; an accepted one re-encodes to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdmashim_proto::{Imm, WireImm};

fuzz_target!(|data: &[u8]| {
    let mut b = [0u8; 4];
    let n = data.len().min(4);
    b[..n].copy_from_slice(&data[..n]);
    let v = u32::from_be_bytes(b);
    if let Ok(i) = Imm::decode(v) {
        assert_eq!(i.encode(), v);
        assert_eq!(Imm::from_wire(WireImm(v.to_be())), Ok(i));
    }
});
