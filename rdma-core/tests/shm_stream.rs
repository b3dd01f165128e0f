//! Streams between two threads of one process over shared memory (`LocalListener`,
//! `Stream::connect_local`): the protocol core of the RDMA streams over memory both ends map.
//! Runs on every host (no RDMA device needed).

use std::io::Read;
use std::net::Shutdown;

use rdmashim_core::{LocalListener, Stream, StreamConfig};

fn name(tag: &str) -> Vec<u8> {
    format!("rdmashim-test/{}/{tag}", std::process::id()).into_bytes()
}

/// Small rings (16 KiB, 4 receive slots): every few messages wrap the ring and run out of
/// credits, so the cursors, the credits and the double mapping all take part.
fn small() -> StreamConfig {
    StreamConfig {
        ring_size: 16 << 10,
        recv_slots: 4,
        ..StreamConfig::default()
    }
}

/// xorshift: the chunk sizes and the bytes, the same on both sides.
fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

#[test]
fn echo_of_random_chunks_keeps_every_byte_in_order() {
    let n = name("echo");
    let l = LocalListener::bind(&n, small()).unwrap();
    let server = std::thread::spawn(move || {
        let mut s = l.accept().unwrap();
        let mut buf = vec![0u8; 40_000];
        let mut total = 0usize;
        loop {
            let k = s.read(&mut buf).unwrap();
            if k == 0 {
                break;
            }
            s.write_all(&buf[..k]).unwrap();
            total += k;
        }
        s.shutdown(Shutdown::Write).unwrap();
        total
    });
    let mut c = Stream::connect_local(&n, small()).unwrap();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut sent = 0usize;
    for _ in 0..400 {
        let len = (next(&mut x) % 40_000) as usize + 1;
        let data: Vec<u8> = (0..len).map(|_| next(&mut x) as u8).collect();
        c.write_all(&data).unwrap();
        let mut back = vec![0u8; len];
        c.read_exact(&mut back).unwrap();
        assert!(back == data, "chunk {len} at {sent} came back different");
        sent += len;
    }
    c.shutdown(Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    c.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
    assert_eq!(server.join().unwrap(), sent);
    // Every byte the client sent went through the peer's ring (nothing over a socket).
    assert_eq!(c.stats().data_bytes, sent as u64);
}

#[test]
fn one_way_stream_larger_than_the_ring() {
    let n = name("one_way");
    let l = LocalListener::bind(&n, small()).unwrap();
    const LEN: usize = 8 << 20;
    let server = std::thread::spawn(move || {
        let mut s = l.accept().unwrap();
        let mut got = Vec::with_capacity(LEN);
        s.read_to_end(&mut got).unwrap();
        got
    });
    let mut c = Stream::connect_local(&n, small()).unwrap();
    let mut x = 7u64;
    let data: Vec<u8> = (0..LEN).map(|_| next(&mut x) as u8).collect();
    c.write_all(&data).unwrap();
    c.close().unwrap();
    let got = server.join().unwrap();
    assert_eq!(got.len(), LEN);
    assert!(got == data);
}

#[test]
fn no_listener_is_refused_and_a_name_has_one_listener() {
    let n = name("none");
    let e = Stream::connect_local(&n, small()).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
    let _l = LocalListener::bind(&n, small()).unwrap();
    let e = LocalListener::bind(&n, small())
        .err()
        .expect("a second listener on the name");
    assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{e}");
}

/// A raw client on the rendezvous socket: connects to `name` and sends `msg`; returns the
/// answer's bytes (empty: the server closed without one).
fn raw_request(name: &[u8], msg: &[u8]) -> Vec<u8> {
    // SAFETY: plain socket calls on buffers that live through each call.
    unsafe {
        let s = libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0);
        assert!(s >= 0);
        let mut a: libc::sockaddr_un = std::mem::zeroed();
        a.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (d, c) in a.sun_path[1..].iter_mut().zip(name) {
            *d = *c as libc::c_char;
        }
        let len = std::mem::offset_of!(libc::sockaddr_un, sun_path) + 1 + name.len();
        let r = libc::connect(s, (&a as *const libc::sockaddr_un).cast(), len as u32);
        assert_eq!(r, 0);
        assert_eq!(
            libc::send(s, msg.as_ptr().cast(), msg.len(), 0),
            msg.len() as isize
        );
        let mut buf = [0u8; 256];
        let n = libc::recv(s, buf.as_mut_ptr().cast(), buf.len(), 0);
        libc::close(s);
        buf[..n.max(0) as usize].to_vec()
    }
}

/// Garbage, and a well-formed request without the descriptors of its inbox, are rejected
/// with the reason, and the listener goes on serving.
#[test]
fn hostile_requests_are_rejected_and_the_listener_goes_on() {
    let n = name("hostile");
    let l = LocalListener::bind(&n, small()).unwrap();
    let server = std::thread::spawn(move || {
        let mut s = l.accept().unwrap();
        let mut b = [0u8; 5];
        s.read_exact(&mut b).unwrap();
        b
    });
    let junk = raw_request(&n, b"not a request");
    assert_eq!(junk.first(), Some(&2), "a rejection: {junk:?}");
    // (an address, then no request)
    let short = raw_request(&n, &[0u8; 16]);
    assert_eq!(short.first(), Some(&2), "a rejection: {short:?}");
    let req = rdmashim_proto::ConnectRequest {
        flags: rdmashim_proto::Flags::NATIVE,
        client_port: 1,
        server_port: 2,
        nonce: 3,
        ring: rdmashim_proto::RingDesc {
            addr: 0,
            rkey: 0,
            size: rdmashim_proto::RingSize::new(16 << 10).unwrap(),
        },
        recv_slots: 4,
        tag: rdmashim_proto::Tag::ZERO,
    };
    let no_fds = raw_request(&n, &[&[0u8; 16][..], &req.encode()].concat());
    assert_eq!(no_fds.first(), Some(&2), "a rejection: {no_fds:?}");
    let reason = rdmashim_proto::Reject::decode(&no_fds[1..]).unwrap().reason;
    assert_eq!(reason, rdmashim_proto::RejectReason::Malformed);
    let mut c = Stream::connect_local(&n, small()).unwrap();
    c.write_all(b"still").unwrap();
    assert_eq!(&server.join().unwrap(), b"still");
}

/// The server's side of a link is established only by the client's confirmation, sent once
/// the client has mapped the server's inbox: a client that never takes up the reply (its dial
/// timed out, its process died) leaves the server's link unestablished and then failed, so
/// the server never commits bytes to a ring nobody reads.
#[test]
fn the_server_is_established_only_by_the_clients_confirmation() {
    use rdmashim_core::{DialStatus, ShmDialer, ShmListener};
    use rdmashim_proto::{Proof, StreamState};
    let cfg = small();
    let client: std::net::SocketAddr = "127.0.0.1:1".parse().unwrap();
    let incoming = |l: &ShmListener| loop {
        if let Some(i) = l.next().unwrap() {
            return i;
        }
    };

    // The client goes away with the reply unread.
    let n = name("unconfirmed");
    let l = ShmListener::bind(&n).unwrap();
    let dial = ShmDialer::start(&n, client, 2, Proof::Native, 0, &cfg).unwrap();
    let mut link = incoming(&l).accept(&cfg, 0, &Proof::Native).unwrap();
    link.progress(true);
    assert_eq!(link.conn().state(), StreamState::Handshaking);
    drop(dial);
    link.progress(true);
    assert!(
        link.conn().error().is_some(),
        "the client left before confirming: {:?}",
        link.conn().state()
    );
    assert!(link.conn_mut().commit_switch(0).is_err());

    // The client takes the reply up: its confirmation establishes the server's side.
    let n = name("confirmed");
    let l = ShmListener::bind(&n).unwrap();
    let mut dial = ShmDialer::start(&n, client, 2, Proof::Native, 0, &cfg).unwrap();
    let mut link = incoming(&l).accept(&cfg, 0, &Proof::Native).unwrap();
    link.progress(true);
    assert_eq!(link.conn().state(), StreamState::Handshaking);
    let DialStatus::Connected(_client_link) = dial.poll() else {
        panic!("the client's dial did not complete");
    };
    link.progress(true);
    assert_eq!(link.conn().state(), StreamState::Switching);
    assert!(link.conn_mut().commit_switch(0).is_ok());
}

/// A server whose end of the rendezvous goes away before it answered — its shim gave up on the
/// request — is the same to the dial whether the kernel reports the end (the request read) or
/// a reset (the request left unread in the server's end: what a closed seqpacket socket with
/// unread messages gives its peer). Both are `Broken`, never a failure of the client's own
/// (`Local`, which the shim counts as `resources`: a same-host dial from a forking server's
/// client did so, once in a CI run).
#[test]
fn a_rendezvous_closed_unanswered_breaks_the_dial_read_or_not() {
    use rdmashim_core::{DialError, DialStatus, ShmDialer};
    use rdmashim_proto::Proof;
    let cfg = small();
    let client: std::net::SocketAddr = "127.0.0.1:1".parse().unwrap();
    for read_first in [true, false] {
        let n = name(if read_first {
            "closed-read"
        } else {
            "closed-unread"
        });
        // SAFETY: plain socket calls on buffers that live through each call.
        let listener = unsafe {
            let s = libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0);
            assert!(s >= 0);
            let mut a: libc::sockaddr_un = std::mem::zeroed();
            a.sun_family = libc::AF_UNIX as libc::sa_family_t;
            for (d, c) in a.sun_path[1..].iter_mut().zip(&n) {
                *d = *c as libc::c_char;
            }
            let len = std::mem::offset_of!(libc::sockaddr_un, sun_path) + 1 + n.len();
            assert_eq!(
                libc::bind(s, (&a as *const libc::sockaddr_un).cast(), len as u32),
                0
            );
            assert_eq!(libc::listen(s, 4), 0);
            s
        };
        let mut dial = ShmDialer::start(&n, client, 2, Proof::Native, 0, &cfg).unwrap();
        // SAFETY: the listener above; the accepted socket is closed here, unanswered.
        unsafe {
            let s = libc::accept(listener, std::ptr::null_mut(), std::ptr::null_mut());
            assert!(s >= 0);
            if read_first {
                let mut buf = [0u8; 512];
                assert!(libc::recv(s, buf.as_mut_ptr().cast(), buf.len(), 0) > 0);
            }
            libc::close(s);
            libc::close(listener);
        }
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let status = loop {
            match dial.poll() {
                DialStatus::Pending if std::time::Instant::now() < until => {
                    std::thread::sleep(std::time::Duration::from_millis(1))
                }
                s => break s,
            }
        };
        assert!(
            matches!(status, DialStatus::Failed(DialError::Broken(_))),
            "read first: {read_first}: {status:?}"
        );
    }
}
