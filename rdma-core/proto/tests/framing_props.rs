//! Property tests of the polled kind's records (`framing`): a writer and a reader sharing a
//! simulated ring (a byte array indexed modulo its size, as the double mapping lets the
//! transport see it), the writer placing each record's bytes in address order a few at a
//! time — a WRITE seen half-way — and the reader polling and consuming between any two steps.
//! The reader must deliver exactly the bytes written, in order, never a record before its
//! last byte is placed, over many laps of the ring, and never report a violation.

use proptest::prelude::*;
use rdmashim_proto::framing::{frame, max_payload, FrameReader, Poll};
use rdmashim_proto::RingSize;

struct Ring {
    mem: Vec<u8>,
}

impl Ring {
    fn word(&self, offset: usize) -> u64 {
        assert!(offset.is_multiple_of(8), "an unaligned word read");
        assert!(offset < self.mem.len(), "a read past the ring");
        u64::from_le_bytes(self.mem[offset..offset + 8].try_into().unwrap())
    }
    fn put(&mut self, cursor: u64, byte: u8) {
        let n = self.mem.len();
        self.mem[(cursor % n as u64) as usize] = byte;
    }
    fn get(&self, offset: usize) -> u8 {
        self.mem[offset % self.mem.len()]
    }
}

/// One record on its way: its bytes as the WRITE carries them, where it starts, how many of
/// them are placed.
struct InFlight {
    at: u64,
    bytes: Vec<u8>,
    placed: usize,
}

#[derive(Clone, Debug)]
enum Op {
    /// The writer frames a payload of this length (if the ring has room, else it waits).
    Write(u32),
    /// The WRITE in flight places this many more bytes.
    Place(usize),
    /// The reader polls and takes up to this many bytes.
    Read(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1u32..3000).prop_map(Op::Write),
        (1u32..40).prop_map(Op::Write),
        // (small records: many trailers land where an earlier lap's header or trailer was,
        // whose high bytes match a new trailer's; a reader may then take a record whose
        // trailer is partly placed — never before its payload is)
        Just(Op::Write(8)),
        Just(Op::Write(8)),
        (1usize..200).prop_map(Op::Place),
        (1usize..5000).prop_map(Op::Read),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn the_reader_gets_every_byte_once_in_order_and_never_early(
        log2 in 12u8..=13,
        salt in any::<u32>(),
        start in (0u64..1 << 20).prop_map(|c| c * 8),
        ops in prop::collection::vec(op(), 1..400),
    ) {
        let size = RingSize::from_log2(log2).unwrap();
        let mut ring = Ring { mem: vec![0; size.bytes() as usize] };
        let mut reader = FrameReader::new(size, salt, start);
        let mut next_at = start; // where the writer's next record goes
        let mut freed_to = start; // ring cursor up to which the reader gave space back
        let mut flight: Option<InFlight> = None;
        let mut intended: Vec<u8> = Vec::new(); // every framed record's payload, in order
        let mut placed = 0usize; // how many of them are in ring memory (a prefix)
        let mut read: Vec<u8> = Vec::new();
        let mut serial = 0u8;
        for op in ops {
            match op {
                Op::Write(len) => {
                    let len = len.min(max_payload(size));
                    let f = frame(next_at, len, size, salt).unwrap();
                    if flight.is_some() || next_at + f.bytes - freed_to > size.bytes() {
                        continue; // (one WRITE at a time here; no room: the writer waits)
                    }
                    let mut bytes = vec![0u8; f.bytes as usize];
                    bytes[..8].copy_from_slice(&f.header.to_le_bytes());
                    for b in &mut bytes[f.payload_at..f.payload_at + len as usize] {
                        serial = serial.wrapping_add(1);
                        *b = serial;
                    }
                    bytes[f.trailer_at..].copy_from_slice(&f.header.to_le_bytes());
                    intended.extend_from_slice(&bytes[f.payload_at..f.payload_at + len as usize]);
                    flight = Some(InFlight { at: next_at, bytes, placed: 0 });
                    next_at += f.bytes;
                }
                Op::Place(n) => {
                    if let Some(w) = flight.as_mut() {
                        let end = (w.placed + n).min(w.bytes.len());
                        for i in w.placed..end {
                            ring.put(w.at + i as u64, w.bytes[i]);
                            // (bytes 8.. up to the trailer are the payload and its padding)
                            if i >= 8 && placed < intended.len() && i < w.bytes.len() - 8 {
                                placed += 1;
                            }
                        }
                        w.placed = end;
                        if end == w.bytes.len() {
                            flight = None;
                            placed = intended.len();
                        }
                    }
                }
                Op::Read(n) => {
                    let mut want = n;
                    while want > 0 {
                        match reader.poll(|o| ring.word(o)) {
                            Ok(Poll::Empty) => break,
                            Ok(Poll::Ready { offset, len }) => {
                                prop_assert!(len > 0);
                                let k = len.min(want);
                                for i in 0..k {
                                    read.push(ring.get(offset + i));
                                }
                                prop_assert!(
                                    read.len() <= placed,
                                    "read {} bytes, only {} placed", read.len(), placed
                                );
                                freed_to += reader.consume(k).unwrap();
                                want -= k;
                            }
                            Err(e) => prop_assert!(false, "violation: {e:?}"),
                        }
                    }
                    prop_assert_eq!(&read[..], &intended[..read.len()]);
                }
            }
        }
        // Once the last WRITE is placed, everything written is read.
        if let Some(w) = flight.take() {
            for i in w.placed..w.bytes.len() {
                ring.put(w.at + i as u64, w.bytes[i]);
            }
        }
        loop {
            match reader.poll(|o| ring.word(o)) {
                Ok(Poll::Ready { offset, len }) => {
                    for i in 0..len {
                        read.push(ring.get(offset + i));
                    }
                    freed_to += reader.consume(len).unwrap();
                }
                Ok(Poll::Empty) => break,
                Err(e) => prop_assert!(false, "violation: {e:?}"),
            }
        }
        prop_assert_eq!(read, intended);
        prop_assert_eq!(freed_to, next_at);
        prop_assert_eq!(reader.cursor(), next_at);
    }

    /// Whatever the ring holds, a poll reads only aligned words inside the ring and never
    /// gives a span beyond the largest payload: hostile or stale memory is empty, a violation,
    /// or a record that fits.
    #[test]
    fn any_memory_gives_a_bounded_answer(
        log2 in 12u8..=13,
        salt in any::<u32>(),
        at in (0u64..1 << 30).prop_map(|c| c * 8),
        words in prop::collection::vec(any::<u64>(), 1024),
        plant in any::<bool>(),
        len in any::<u32>(),
    ) {
        let size = RingSize::from_log2(log2).unwrap();
        let mut mem: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).cycle()
            .take(size.bytes() as usize).collect();
        if plant {
            // (a header of this position's tag with any length, the trailer left as it was)
            let o = size.offset(at);
            let tag = ((at >> 3) as u32) ^ salt;
            mem[o..o + 8].copy_from_slice(&((u64::from(tag) << 32) | u64::from(len)).to_le_bytes());
        }
        let ring = Ring { mem };
        let mut r = FrameReader::new(size, salt, at);
        if let Ok(Poll::Ready { offset, len }) = r.poll(|o| ring.word(o)) {
            prop_assert!(len >= 1 && len <= max_payload(size) as usize);
            prop_assert_eq!(offset, size.offset(at + 8));
            prop_assert!(r.consume(len + 1).is_err());
            prop_assert!(r.consume(len).unwrap() > len as u64);
        }
    }
}

/// A record whose trailer carries its position's tag but another length is the peer's
/// violation, not an empty ring.
#[test]
fn a_trailer_that_disagrees_is_a_violation() {
    let size = RingSize::from_log2(12).unwrap();
    let f = frame(4096 + 64, 10, size, 99).unwrap();
    let mut ring = Ring { mem: vec![0; 4096] };
    ring.mem[64..72].copy_from_slice(&f.header.to_le_bytes());
    let bad = f.header + 1;
    ring.mem[64 + f.trailer_at..64 + f.trailer_at + 8].copy_from_slice(&bad.to_le_bytes());
    let mut r = FrameReader::new(size, 99, 4096 + 64);
    assert!(matches!(
        r.poll(|o| ring.word(o)),
        Err(rdmashim_proto::framing::FramingError::TrailerMismatch { at: 4160, .. })
    ));
    // the record of the lap before (same offset, a ring earlier) is stale: empty
    let old = frame(64, 10, size, 99).unwrap();
    ring.mem[64..72].copy_from_slice(&old.header.to_le_bytes());
    ring.mem[64 + old.trailer_at..64 + old.trailer_at + 8]
        .copy_from_slice(&old.header.to_le_bytes());
    assert_eq!(r.poll(|o| ring.word(o)), Ok(Poll::Empty));
}
