//! Operation sequences against one connection, as a hostile peer and a confused shim would
//! produce them: never panics, keeps the cursor invariants, and a failure is final.
#![no_main]

use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use rdmashim_proto::*;

fn take<const N: usize>(data: &mut &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    let n = data.len().min(N);
    out[..n].copy_from_slice(&data[..n]);
    *data = &data[n..];
    out
}

fuzz_target!(|input: &[u8]| {
    let mut data = input;
    let [mode, log2, slots] = take::<3>(&mut data);
    let now = Instant::now();
    let local = |addr| LocalParams {
        ring: RingDesc {
            addr,
            rkey: 1,
            size: RingSize::from_log2(12 + log2 % 4).unwrap(),
        },
        recv_slots: 4 + u16::from(slots % 16),
    };
    let (mut c, req) =
        Connection::connect(Config::default(), local(0x1000), &proof(), 1, 2, 3, 0, now).unwrap();
    if mode & 1 == 1 {
        c = Connection::accept(Config::default(), local(0x2000), &req, &proof(), 0, now)
            .unwrap()
            .0;
    } else if mode & 2 == 2 {
        let reply = AcceptReply {
            flags: Flags::empty(),
            nonce: 3,
            ring: local(0x2000).ring,
            recv_slots: 4 + u16::from(slots % 16),
        };
        let _ = c.handle_accept(&reply.encode());
    }
    let mut failed = None;
    while !data.is_empty() {
        let [op] = take::<1>(&mut data);
        let arg = u32::from_be_bytes(take::<4>(&mut data));
        match op % 20 {
            0 => {
                let _ = c.handle_completion(Completion::WriteImm {
                    imm: arg,
                    byte_len: None,
                });
            }
            1 => {
                let len = arg & 0x3fff;
                let _ = c.handle_completion(Completion::WriteImm {
                    imm: 0x4000_0000 | len,
                    byte_len: Some(len),
                });
            }
            2 => {
                let n = (arg as usize % 65).min(data.len());
                let (p, rest) = data.split_at(n);
                data = rest;
                let _ = c.handle_completion(Completion::Recv { payload: p });
            }
            3 => {
                let _ = c.note_tcp_read(u64::from(arg % 5000));
            }
            4 => {
                let _ = c.handle_tcp_eof();
            }
            5 => c.handle_tcp_reset(),
            6 => c.handle_transport_error(),
            7 => {
                let _ = c.commit_switch(u64::from(arg % 5000));
            }
            8 => {
                let _ = c.send(arg as usize % 20_000);
            }
            9 => {
                let _ = c.consume(arg as usize % 20_000);
            }
            10 => {
                let _ = c.shutdown_write();
            }
            11 => c.shutdown_read(),
            12 => c.close(),
            13 => c.abort(),
            14 => c.handle_established(),
            15 => c.handle_timeout(now + Duration::from_millis(u64::from(arg % 10_000))),
            16 => c.handle_reject(&arg.to_be_bytes()),
            17 => {
                let _ = c.handle_accept(&arg.to_be_bytes());
            }
            _ => while c.poll_action().is_some() {},
        }
        let _ = (c.readiness(), c.recv(), c.state(), c.can_fall_back());
        let rx = c.rx_cursors();
        assert!(rx.credited() <= rx.tail() && rx.tail() <= rx.head());
        assert!(rx.head() <= rx.credited() + rx.size().bytes());
        if let Some(tx) = c.tx_cursors() {
            assert!(tx.acked() <= tx.posted() && tx.posted() <= tx.head());
            assert!(tx.head() <= tx.acked() + tx.size().bytes());
        }
        if let Some(f) = failed {
            assert_eq!(c.error(), Some(f));
        }
        failed = c.error();
    }
});

/// The binding both ends of a test connection share (as the shim's token gives it to them).
fn proof() -> Proof {
    Proof::Bound {
        key: BindingKey::from_random([0x5a; 16]),
        tuple: TcpTuple {
            client: "10.0.0.1:1234".parse().unwrap(),
            server: "10.0.0.2:80".parse().unwrap(),
        },
    }
}
