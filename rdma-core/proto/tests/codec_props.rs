//! Property tests for every encoder/decoder: round trips (with and without padding), and
//! "fuzz" properties — arbitrary or mutated inputs never panic, and are either decoded (and
//! re-encode to exactly the bytes they came from) or rejected with a reason.

use proptest::prelude::*;
use rdmashim_proto::control::FIRST_IGNORABLE_KIND;
use rdmashim_proto::handshake::{ACCEPT_REPLY_LEN, CONNECT_REQUEST_LEN, REJECT_LEN};
use rdmashim_proto::*;

fn ring_size() -> impl Strategy<Value = RingSize> {
    (MIN_RING_LOG2..=MAX_RING_LOG2).prop_map(|l| RingSize::from_log2(l).unwrap())
}

fn ring_desc() -> impl Strategy<Value = RingDesc> {
    (any::<u64>(), any::<u32>(), ring_size()).prop_map(|(addr, rkey, size)| RingDesc {
        addr,
        rkey,
        size,
    })
}

/// Flags a decoder accepts: known must-understand bits (NATIVE) and any may-ignore bits.
fn flags() -> impl Strategy<Value = Flags> {
    (any::<u8>(), any::<bool>())
        .prop_map(|(hi, native)| Flags::from_bits_retain(u16::from(hi) << 8 | u16::from(native)))
}

fn connect_request() -> impl Strategy<Value = ConnectRequest> {
    (
        flags(),
        any::<u16>(),
        any::<u16>(),
        any::<u64>(),
        ring_desc(),
        MIN_RECV_SLOTS..=u16::MAX,
        any::<[u8; 16]>(),
    )
        .prop_map(
            |(flags, client_port, server_port, nonce, ring, recv_slots, tag)| ConnectRequest {
                flags,
                client_port,
                server_port,
                nonce,
                ring,
                recv_slots,
                tag: Tag(tag),
            },
        )
}

fn accept_reply() -> impl Strategy<Value = AcceptReply> {
    (
        flags(),
        any::<u64>(),
        ring_desc(),
        MIN_RECV_SLOTS..=u16::MAX,
        any::<[u8; 16]>(),
    )
        .prop_map(|(flags, nonce, ring, recv_slots, tag)| AcceptReply {
            flags,
            nonce,
            ring,
            recv_slots,
            tag: Tag(tag),
        })
}

fn reject() -> impl Strategy<Value = Reject> {
    let reason = prop_oneof![
        (1u8..=255)
            .prop_filter("8 is a redirect", |c| *c != 8)
            .prop_map(|code| RejectReason::from_wire(code, 0).unwrap()),
        (1u16..=u16::MAX).prop_map(RejectReason::Redirect),
    ];
    (reason, 1u8..=255).prop_map(|(reason, max_version)| Reject {
        reason,
        max_version,
    })
}

fn imm() -> impl Strategy<Value = Imm> {
    prop_oneof![
        (1..=Imm::MAX_DATA_LEN, any::<bool>())
            .prop_map(|(len, credit_wanted)| Imm::Data { len, credit_wanted }),
        (0..=Imm::MAX_CREDIT_BYTES, 0..=Imm::MAX_CREDIT_SLOTS)
            .prop_filter("credit returns something", |(b, s)| *b > 0 || *s > 0)
            .prop_map(|(bytes, slots)| Imm::Credit { bytes, slots }),
        (
            1..=Imm::MAX_DUPLEX_LEN,
            any::<bool>(),
            0..=Imm::MAX_DUPLEX_UNITS,
            0..=Imm::MAX_DUPLEX_SLOTS
        )
            .prop_filter("credit returns something", |(_, _, u, s)| *u > 0 || *s > 0)
            .prop_map(|(len, credit_wanted, units, slots)| Imm::DataCredit {
                len,
                credit_wanted,
                units,
                slots
            }),
    ]
}

fn control() -> impl Strategy<Value = ControlMsg> {
    prop_oneof![
        any::<u64>().prop_map(|tcp_bytes_sent| ControlMsg::SwitchOver { tcp_bytes_sent }),
        any::<u64>().prop_map(|ring_bytes| ControlMsg::ShutdownWrite { ring_bytes }),
        (any::<u64>(), any::<bool>())
            .prop_map(|(ring_bytes, reset)| ControlMsg::Close { ring_bytes, reset }),
        (any::<u64>(), any::<u32>())
            .prop_map(|(read_cursor, slots)| ControlMsg::CreditUpdate { read_cursor, slots }),
        any::<u64>().prop_map(|epoch| ControlMsg::Barrier { epoch }),
        (any::<u64>(), any::<u64>()).prop_map(|(ring_bytes, read_cursor)| {
            ControlMsg::SwitchBack {
                ring_bytes,
                read_cursor,
            }
        }),
        ring_desc().prop_map(|ring| ControlMsg::RingOffer { ring }),
        ring_desc().prop_map(|ring| ControlMsg::Source { ring }),
        any::<u64>().prop_map(|at| ControlMsg::RingMoved { at }),
        any::<u64>().prop_map(|seen| ControlMsg::Sleeping { seen }),
        ring_size().prop_map(|size| ControlMsg::RingWanted { size }),
        // (129 is RingWanted's)
        (FIRST_IGNORABLE_KIND + 2..=255).prop_map(|kind| ControlMsg::Ignored { kind }),
    ]
}

/// `bytes` followed by `pad` zero bytes.
fn padded(bytes: &[u8], pad: usize) -> Vec<u8> {
    let mut v = bytes.to_vec();
    v.resize(bytes.len() + pad, 0);
    v
}

/// A valid encoding with a few random byte mutations, truncation or extension: reaches the
/// decoders' deeper checks far more often than uniformly random bytes do.
fn mutated(valid: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    let len = valid.len();
    (
        prop::collection::vec((0..len, any::<u8>()), 0..4),
        0..=len + 8,
        prop::collection::vec(any::<u8>(), 0..8),
    )
        .prop_map(move |(flips, cut, tail)| {
            let mut v = valid.clone();
            for (i, x) in flips {
                v[i] ^= x;
            }
            v.truncate(cut);
            if cut > len {
                v.extend(tail);
            }
            v
        })
}

/// Checks the shared decoder contract on one input for a fixed-layout message:
/// accepted ⇒ re-encoding gives exactly the message bytes and the rest was zero padding. An
/// input shorter than the encoding (an 8-byte rejection) is accepted only where the bytes it
/// lacks encode as zeros.
fn check_fixed<M: PartialEq + std::fmt::Debug, const N: usize>(
    input: &[u8],
    decoded: Result<M, DecodeError>,
    encode: impl Fn(&M) -> [u8; N],
    decode: impl Fn(&[u8]) -> Result<M, DecodeError>,
) -> Result<(), TestCaseError> {
    match decoded {
        Ok(m) => {
            let enc = encode(&m);
            let n = input.len().min(N);
            prop_assert_eq!(&enc[..n], &input[..n]);
            prop_assert!(enc[n..].iter().all(|&b| b == 0));
            prop_assert!(input[n..].iter().all(|&b| b == 0));
            prop_assert_eq!(decode(&enc), Ok(m));
        }
        Err(e) => prop_assert!(!e.to_string().is_empty()),
    }
    Ok(())
}

fn check_control(input: &[u8]) -> Result<(), TestCaseError> {
    match ControlMsg::decode(input) {
        Ok(m) => {
            let enc = m.encode();
            prop_assert!(enc.as_bytes().len() <= MAX_CONTROL_LEN);
            prop_assert_eq!(ControlMsg::decode(enc.as_bytes()), Ok(m));
            if !matches!(m, ControlMsg::Ignored { .. }) {
                let n = enc.as_bytes().len();
                prop_assert_eq!(enc.as_bytes(), &input[..n]);
                prop_assert!(input[n..].iter().all(|&b| b == 0));
            }
        }
        Err(e) => prop_assert!(!e.to_string().is_empty()),
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    // ----- round trips ---------------------------------------------------------------------

    #[test]
    fn connect_request_round_trip(m in connect_request(), pad in 0usize..=(56 - CONNECT_REQUEST_LEN)) {
        let enc = m.encode();
        prop_assert!(enc.len() <= 56);
        prop_assert_eq!(ConnectRequest::decode(&enc), Ok(m));
        prop_assert_eq!(ConnectRequest::decode(&padded(&enc, pad)), Ok(m));
    }

    #[test]
    fn accept_reply_round_trip(m in accept_reply(), pad in 0usize..=(196 - ACCEPT_REPLY_LEN)) {
        let enc = m.encode();
        prop_assert!(enc.len() <= 196);
        prop_assert_eq!(AcceptReply::decode(&enc), Ok(m));
        prop_assert_eq!(AcceptReply::decode(&padded(&enc, pad)), Ok(m));
    }

    #[test]
    fn reject_round_trip(m in reject(), pad in 0usize..=(148 - REJECT_LEN)) {
        let enc = m.encode();
        prop_assert_eq!(Reject::decode(&enc), Ok(m));
        prop_assert_eq!(Reject::decode(&padded(&enc, pad)), Ok(m));
    }

    #[test]
    fn imm_round_trip(i in imm()) {
        prop_assert_eq!(Imm::decode(i.encode()), Ok(i));
        prop_assert_eq!(Imm::from_wire(i.to_wire()), Ok(i));
        prop_assert_eq!(i.to_wire().0.to_ne_bytes(), i.encode().to_be_bytes());
    }

    #[test]
    fn control_round_trip(m in control(), pad in 0usize..48) {
        let enc = m.encode();
        prop_assert_eq!(ControlMsg::decode(enc.as_bytes()), Ok(m));
        let p = padded(enc.as_bytes(), pad);
        if p.len() <= MAX_CONTROL_LEN {
            prop_assert_eq!(ControlMsg::decode(&p), Ok(m));
        } else {
            let too_long = matches!(ControlMsg::decode(&p), Err(DecodeError::TooLong { .. }));
            prop_assert!(too_long);
        }
    }

    // ----- fuzz: arbitrary bytes -------------------------------------------------------------

    #[test]
    fn fuzz_connect_request(input in prop::collection::vec(any::<u8>(), 0..300)) {
        check_fixed(&input, ConnectRequest::decode(&input), ConnectRequest::encode, ConnectRequest::decode)?;
    }

    #[test]
    fn fuzz_accept_reply(input in prop::collection::vec(any::<u8>(), 0..300)) {
        check_fixed(&input, AcceptReply::decode(&input), AcceptReply::encode, AcceptReply::decode)?;
    }

    #[test]
    fn fuzz_reject(input in prop::collection::vec(any::<u8>(), 0..300)) {
        check_fixed(&input, Reject::decode(&input), Reject::encode, Reject::decode)?;
    }

    #[test]
    fn fuzz_control(input in prop::collection::vec(any::<u8>(), 0..300)) {
        check_control(&input)?;
    }

    #[test]
    fn fuzz_imm(v in any::<u32>()) {
        match Imm::decode(v) {
            Ok(i) => prop_assert_eq!(i.encode(), v),
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }

    // ----- fuzz: mutated valid messages --------------------------------------------------------

    #[test]
    fn fuzz_connect_request_mutated(input in connect_request().prop_flat_map(|m| mutated(m.encode().to_vec()))) {
        check_fixed(&input, ConnectRequest::decode(&input), ConnectRequest::encode, ConnectRequest::decode)?;
    }

    #[test]
    fn fuzz_accept_reply_mutated(input in accept_reply().prop_flat_map(|m| mutated(m.encode().to_vec()))) {
        check_fixed(&input, AcceptReply::decode(&input), AcceptReply::encode, AcceptReply::decode)?;
    }

    #[test]
    fn fuzz_reject_mutated(input in reject().prop_flat_map(|m| mutated(m.encode().to_vec()))) {
        check_fixed(&input, Reject::decode(&input), Reject::encode, Reject::decode)?;
    }

    #[test]
    fn fuzz_control_mutated(input in control().prop_flat_map(|m| mutated(m.encode().as_bytes().to_vec()))) {
        check_control(&input)?;
    }

    // ----- cross-kind confusion ---------------------------------------------------------------

    #[test]
    fn kinds_do_not_alias(req in connect_request(), rep in accept_reply(), rej in reject()) {
        let is_wrong_kind = |r: Result<(), DecodeError>| matches!(r, Err(DecodeError::WrongKind { .. }));
        prop_assert!(is_wrong_kind(AcceptReply::decode(&req.encode()).map(|_| ())));
        prop_assert!(is_wrong_kind(Reject::decode(&req.encode()).map(|_| ())));
        prop_assert!(is_wrong_kind(ConnectRequest::decode(&rep.encode()).map(|_| ())));
        prop_assert!(is_wrong_kind(Reject::decode(&rep.encode()).map(|_| ())));
        let rej_bytes = rej.encode();
        let r = ConnectRequest::decode(&rej_bytes);
        let refused = matches!(r, Err(DecodeError::WrongKind { .. } | DecodeError::UnsupportedVersion(_)));
        prop_assert!(refused);
    }
}

mod binding_props {
    use super::*;
    use rdmashim_proto::binding::*;

    proptest! {
        /// Any first bytes: the scan never panics, and it is consistent with the magic — bytes
        /// that do not begin like a token are application bytes, left in the stream; a token
        /// followed by anything is that token.
        #[test]
        fn scan_any_input(data in proptest::collection::vec(any::<u8>(), 0..80)) {
            let n = data.len().min(TOKEN_MAGIC.len());
            let looks = data[..n] == TOKEN_MAGIC[..n];
            match scan_token(&data) {
                TokenScan::NotToken => prop_assert!(!looks),
                TokenScan::NeedMore => prop_assert!(looks && data.len() < TOKEN_LEN),
                TokenScan::Token(t) => {
                    prop_assert!(looks);
                    prop_assert_eq!(&t.encode()[..], &data[..TOKEN_LEN]);
                }
                TokenScan::Unusable(_) => prop_assert!(looks && data.len() >= TOKEN_LEN),
            }
        }

        #[test]
        fn token_then_anything(key in any::<[u8; KEY_LEN]>(),
                               port in proptest::option::of(1u16..),
                               rest in proptest::collection::vec(any::<u8>(), 0..64)) {
            let t = Token { key: BindingKey::from_random(key), dial_port: port };
            let mut b = t.encode().to_vec();
            b.extend_from_slice(&rest);
            prop_assert_eq!(scan_token(&b), TokenScan::Token(t));
        }

        /// A single flipped bit anywhere in the key, the 4-tuple or the message changes the tag.
        #[test]
        fn tag_changes_with_any_bit(key in any::<[u8; KEY_LEN]>(),
                                    msg in proptest::collection::vec(any::<u8>(), 1..48),
                                    bit in 0usize..(8 * 48)) {
            let k = BindingKey::from_random(key);
            let t = TcpTuple {
                client: "192.0.2.1:1234".parse().unwrap(),
                server: "192.0.2.2:80".parse().unwrap(),
            };
            let tag = request_tag(&k, &t, &msg);
            let mut m2 = msg.clone();
            let i = (bit / 8) % m2.len();
            m2[i] ^= 1 << (bit % 8);
            prop_assert!(!tag.verify(&request_tag(&k, &t, &m2)));
            let mut k2 = key;
            k2[(bit / 8) % KEY_LEN] ^= 1 << (bit % 8);
            prop_assert!(!tag.verify(&request_tag(&BindingKey::from_random(k2), &t, &msg)));
        }

        /// Any header bytes: classified without panicking; only an IPv4/IPv6 header of full
        /// length is readable.
        #[test]
        fn syn_any_input(data in proptest::collection::vec(any::<u8>(), 0..80)) {
            let v = classify_syn(&data);
            let readable = matches!(data.first().map(|b| b >> 4), Some(4) if data.len() >= 20)
                || matches!(data.first().map(|b| b >> 4), Some(6) if data.len() >= 40);
            prop_assert_eq!(v != SynVerdict::Unreadable, readable);
        }
    }
}
