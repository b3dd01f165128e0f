//! Model-based property tests for the ring cursors: a sender and a receiver exchanging random
//! writes, consumptions and credits against a plain model, checking the documented invariants
//! after every step.

use proptest::prelude::*;
use rdmashim_proto::{RingSize, RxCursors, TxCursors, MAX_RING_LOG2, MIN_RING_LOG2};

#[derive(Clone, Debug)]
enum Op {
    Accept(u64),
    Post { max: u64, split: bool },
    Deliver,
    Consume(u64),
    Credit(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u64..20_000).prop_map(Op::Accept),
        (1u64..20_000, any::<bool>()).prop_map(|(max, split)| Op::Post { max, split }),
        Just(Op::Deliver),
        (0u64..20_000).prop_map(Op::Consume),
        (0u64..20_000).prop_map(Op::Credit),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn offset_is_mod(log2 in MIN_RING_LOG2..=MAX_RING_LOG2, cursor in any::<u64>()) {
        let s = RingSize::from_log2(log2).unwrap();
        prop_assert_eq!(s.offset(cursor) as u64, cursor % s.bytes());
        prop_assert_eq!(RingSize::new(s.bytes()), Ok(s));
    }

    #[test]
    fn ring_size_rejects_non_powers(bytes in any::<u64>()) {
        let ok = bytes.is_power_of_two()
            && (1u64 << MIN_RING_LOG2..=1u64 << MAX_RING_LOG2).contains(&bytes);
        prop_assert_eq!(RingSize::new(bytes).is_ok(), ok);
    }

    #[test]
    fn cursors_hold_invariants(log2 in 12u8..=14, ops in prop::collection::vec(op(), 1..200)) {
        let size = RingSize::from_log2(log2).unwrap();
        let mut tx = TxCursors::new(size);
        let mut rx = RxCursors::new(size);
        // Writes posted but not yet delivered, and credits the receiver sent.
        let mut in_flight: std::collections::VecDeque<(u64, u64)> = Default::default();
        for op in ops {
            match op {
                Op::Accept(n) => {
                    let free = tx.free();
                    let got = tx.accept(n);
                    prop_assert_eq!(got, n.min(free));
                }
                Op::Post { max, split } => {
                    if let Some(w) = tx.next_write(max, split) {
                        prop_assert_eq!(w.cursor, tx.posted());
                        prop_assert!(w.len <= max && w.len <= size.bytes());
                        if split {
                            prop_assert!(size.offset(w.cursor) as u64 + w.len <= size.bytes());
                        }
                        tx.mark_posted(w.len);
                        in_flight.push_back((w.cursor, w.len));
                    } else {
                        prop_assert_eq!(tx.unposted(), 0);
                    }
                }
                Op::Deliver => {
                    if let Some((c, len)) = in_flight.pop_front() {
                        prop_assert_eq!(c, rx.head());
                        // The sender's accounting guarantees the receiver accepts every write.
                        prop_assert!(rx.on_data(len).is_ok());
                        // Never over unread bytes: the write ends within one ring of the tail.
                        prop_assert!(c + len <= rx.tail() + size.bytes());
                    }
                }
                Op::Consume(n) => {
                    let readable = rx.readable();
                    prop_assert_eq!(rx.consume(n), n <= readable);
                }
                Op::Credit(max) => {
                    let n = rx.take_credit(max);
                    prop_assert!(tx.credit(n).is_ok());
                }
            }
            prop_assert!(tx.acked() <= tx.posted() && tx.posted() <= tx.head());
            prop_assert!(tx.head() <= tx.acked() + size.bytes());
            prop_assert!(rx.credited() <= rx.tail() && rx.tail() <= rx.head());
            prop_assert!(rx.head() <= rx.credited() + size.bytes());
            prop_assert_eq!(tx.acked(), rx.credited());
            prop_assert!(tx.free() <= size.bytes());
        }
        // A credit beyond what was written is refused.
        prop_assert!(tx.credit(tx.posted() - tx.acked() + 1).is_err());
    }
}
