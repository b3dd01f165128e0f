//! RDMA tier: raw rdma_cm clients with malformed, truncated, wrong-magic and wrong-version
//! private data are rejected with a decodable `Reject` naming the right reason, and the
//! listener then still accepts a good client.

mod support;

use std::net::SocketAddr;
use std::thread;
use std::time::Duration;

use rdmashim_core::cm::{event_type as ev, ConnParam};
use rdmashim_core::{Listener, Stream};
use rdmashim_proto::handshake::CONNECT_REQUEST_LEN;
use rdmashim_proto::{ConnectRequest, Flags, Reject, RejectReason, RingDesc, RingSize, Tag};

const T: Duration = Duration::from_secs(20);

fn good_request() -> [u8; CONNECT_REQUEST_LEN] {
    ConnectRequest {
        flags: Flags::NATIVE,
        client_port: 1,
        server_port: 2,
        nonce: 42,
        ring: RingDesc {
            addr: 0x1000,
            rkey: 7,
            size: RingSize::from_log2(16).unwrap(),
        },
        recv_slots: 8,
        tag: Tag::ZERO,
    }
    .encode()
}

/// Connects with raw rdma_cm carrying `private_data`; returns what came back:
/// `Ok(reject)` for a rejection, `Err(event name)` otherwise.
fn raw_connect(addr: SocketAddr, private_data: &[u8]) -> Result<Option<Reject>, String> {
    let support::RawClient { ch, id, .. } = support::raw_client(addr);
    id.connect(&ConnParam {
        private_data,
        ..Default::default()
    })
    .unwrap();
    let e = ch.next_event(T).expect("an answer to the request");
    if e.kind == ev::RDMA_CM_EVENT_REJECTED {
        Ok(Reject::decode(&e.private_data).ok())
    } else {
        Err(e.name())
    }
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn bad_requests_are_rejected_with_reasons_and_the_listener_keeps_serving() {
    let _ = support::device();
    let addr = support::addr(8);
    let listener = Listener::bind(addr).expect("bind");
    let server = thread::spawn(move || {
        let mut s = listener.accept().expect("the good client is accepted");
        let mut buf = [0u8; 5];
        std::io::Read::read_exact(&mut s, &mut buf).unwrap();
        s.write_all(&buf).unwrap();
        let _ = s.close();
    });

    let good = good_request();
    let mut wrong_magic = good;
    wrong_magic[..4].copy_from_slice(b"XXXX");
    // Version 1: the unbound handshake of older peers.
    let mut wrong_version = good;
    wrong_version[4] = 1;
    // Not native (it names a TCP connection, with a tag no key here can verify): a native
    // listener has no TCP connection to bind it to.
    let mut bound = good;
    bound[7] = 0;
    bound[36..52].copy_from_slice(&[0x77; 16]);
    let mut bad_ring = good;
    bad_ring[32] = 30; // ring_log2 out of range
    let mut trailing = good.to_vec();
    trailing.extend_from_slice(&[0, 0, 9]); // a non-zero byte after the message
    let cases: Vec<(&str, Vec<u8>, RejectReason)> = vec![
        ("empty", Vec::new(), RejectReason::Malformed),
        ("truncated", good[..20].to_vec(), RejectReason::Malformed),
        ("header only", good[..6].to_vec(), RejectReason::Malformed),
        ("wrong magic", wrong_magic.to_vec(), RejectReason::Malformed),
        (
            "wrong version",
            wrong_version.to_vec(),
            RejectReason::UnsupportedVersion,
        ),
        ("bad ring size", bad_ring.to_vec(), RejectReason::Malformed),
        (
            "bound, at a native listener",
            bound.to_vec(),
            RejectReason::Unproven,
        ),
        ("trailing bytes", trailing, RejectReason::Malformed),
        (
            "garbage",
            (0..56u8).map(|b| b.wrapping_mul(37)).collect(),
            RejectReason::Malformed,
        ),
    ];
    for (name, data, want) in cases {
        match raw_connect(addr, &data) {
            Ok(Some(r)) => {
                assert_eq!(r.reason, want, "{name}: rejected for the wrong reason");
                assert_eq!(r.max_version, rdmashim_proto::PROTOCOL_VERSION, "{name}");
            }
            Ok(None) => panic!("{name}: rejected without a decodable Reject"),
            Err(got) => panic!("{name}: not rejected, got {got}"),
        }
    }

    let mut c = Stream::connect(addr).expect("a good client still gets in");
    c.write_all(b"hello").unwrap();
    let mut buf = [0u8; 5];
    std::io::Read::read_exact(&mut c, &mut buf).unwrap();
    assert_eq!(&buf, b"hello");
    server.join().expect("server");
}
