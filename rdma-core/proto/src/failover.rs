//! Going on over TCP when the ring's path fails (protocol §8.6).
//!
//! After a side's SwitchOver its TCP direction carries nothing (§7), and a sender keeps every
//! byte the receiver has not credited in its staging area (§5.1). So when the queue pair fails
//! (retries exhausted, device removed, port down), each side can go on alone, without a round
//! trip: at the TCP offset its SwitchOver declared it writes a [`Record`] naming the ring
//! cursor its continuation starts at (the peer's last credit, `acked`), then the staged bytes
//! from there on, then the application's. The receiver reads the sender's pre-switch TCP
//! bytes, then the record, then drops the continuation's first `read − resume_from` bytes (it
//! had read them from the ring already; `acked ≤ credited ≤ read` makes that difference
//! non-negative and at most a ring), then delivers the rest: one contiguous stream, nothing
//! lost, repeated or reordered.
//!
//! [`Incoming`] is the receiving half of that: what the next TCP bytes are (the application's,
//! or the shim's to consume), and the checks on the record.

use crate::state::{ErrorReason, Violation};

/// Bytes of a [`Record`] on the wire.
pub const RECORD_LEN: usize = 24;
/// First four bytes of a record.
pub const RECORD_MAGIC: [u8; 4] = *b"RSfo";
/// The record layout this crate writes and reads.
pub const RECORD_VERSION: u8 = 1;

/// What a side writes on its TCP direction, at the offset its SwitchOver declared, when the
/// ring's path failed: where its continuation starts.
///
/// Layout (big-endian): magic `RSfo` (4), version 1 (1), flags 0 (1), reserved 0 (2),
/// `resume_from` (8), the handshake nonce (8). The nonce ties the record to this connection's
/// upgrade: a record found anywhere else (a miscounted offset) is a violation, never data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    /// Ring cursor (in the sender's ring stream) of the continuation's first byte.
    pub resume_from: u64,
}

use crate::error::FailoverError;

impl Record {
    /// The record's bytes, for the upgrade with handshake nonce `nonce`.
    pub fn encode(&self, nonce: u64) -> [u8; RECORD_LEN] {
        let mut b = [0u8; RECORD_LEN];
        b[..4].copy_from_slice(&RECORD_MAGIC);
        b[4] = RECORD_VERSION;
        b[8..16].copy_from_slice(&self.resume_from.to_be_bytes());
        b[16..24].copy_from_slice(&nonce.to_be_bytes());
        b
    }

    /// Reads a record of the upgrade with nonce `nonce`.
    pub fn decode(b: &[u8; RECORD_LEN], nonce: u64) -> Result<Record, FailoverError> {
        let magic = [b[0], b[1], b[2], b[3]];
        if magic != RECORD_MAGIC {
            return Err(FailoverError::BadMagic(magic));
        }
        if b[4] != RECORD_VERSION {
            return Err(FailoverError::Version(b[4]));
        }
        if b[5..8] != [0, 0, 0] {
            return Err(FailoverError::Reserved);
        }
        let word = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[at..at + 8]);
            u64::from_be_bytes(w)
        };
        if word(16) != nonce {
            return Err(FailoverError::Nonce);
        }
        Ok(Record {
            resume_from: word(8),
        })
    }
}

/// Where the next TCP bytes of the peer's stream go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// The application's (at most `limit`, if any).
    App(Option<u64>),
    /// The shim reads at most this many and hands them to [`Incoming::on_control`].
    Control(u64),
}

/// The peer's stream on TCP after the path failed: its pre-switch bytes still unread, its
/// record, the part of its continuation we already had, then the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Incoming {
    /// Pre-switch TCP bytes still to deliver.
    pre: u64,
    /// Our read cursor in the peer's ring stream when the ring stopped.
    read: u64,
    /// Our ring's size: the most the peer can have had uncredited.
    window: u64,
    nonce: u64,
    record: [u8; RECORD_LEN],
    got: usize,
    /// Continuation bytes still to drop; `None` until the record is in.
    skip: Option<u64>,
}

impl Incoming {
    pub(crate) fn new(pre: u64, read: u64, window: u64, nonce: u64) -> Incoming {
        Incoming {
            pre,
            read,
            window,
            nonce,
            record: [0; RECORD_LEN],
            got: 0,
            skip: None,
        }
    }

    pub(crate) fn next(&self) -> Next {
        match self.skip {
            _ if self.pre > 0 => Next::App(Some(self.pre)),
            None => Next::Control((RECORD_LEN - self.got) as u64),
            Some(s) if s > 0 => Next::Control(s),
            Some(_) => Next::App(None),
        }
    }

    /// Everything before the application's continuation was read: the stream is plain TCP.
    pub(crate) fn done(&self) -> bool {
        self.pre == 0 && self.skip == Some(0)
    }

    /// The application read `n` bytes (after [`Next::App`]).
    pub(crate) fn on_app_read(&mut self, n: u64) {
        self.pre = self.pre.saturating_sub(n);
    }

    /// The shim read `bytes` (after [`Next::Control`], at most what it said).
    pub(crate) fn on_control(&mut self, mut bytes: &[u8]) -> Result<(), FailoverError> {
        if self.skip.is_none() {
            let n = bytes.len().min(RECORD_LEN - self.got);
            self.record[self.got..self.got + n].copy_from_slice(&bytes[..n]);
            self.got += n;
            bytes = &bytes[n..];
            if self.got < RECORD_LEN {
                return Ok(());
            }
            let r = Record::decode(&self.record, self.nonce)?;
            if r.resume_from > self.read || self.read - r.resume_from > self.window {
                return Err(FailoverError::ResumeOutOfRange {
                    declared: r.resume_from,
                    read: self.read,
                });
            }
            self.skip = Some(self.read - r.resume_from);
        }
        if let Some(s) = self.skip.as_mut() {
            *s = s.saturating_sub(bytes.len() as u64);
        }
        Ok(())
    }

    /// TCP ended. Before the record: the peer vanished (ring bytes may be lost); inside the
    /// part already read: a violation; after it: the stream's end.
    pub(crate) fn on_eof(&self) -> Result<(), ErrorReason> {
        match self.skip {
            None => Err(ErrorReason::PeerVanished),
            _ if self.pre > 0 => Err(ErrorReason::PeerVanished),
            Some(s) if s > 0 => Err(ErrorReason::Protocol(Violation::Failover(
                FailoverError::ShortContinuation,
            ))),
            Some(_) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trips_and_names_its_upgrade() {
        let r = Record {
            resume_from: 0x0102_0304_0506_0708,
        };
        let b = r.encode(77);
        assert_eq!(&b[..4], b"RSfo");
        assert_eq!(Record::decode(&b, 77), Ok(r));
        assert_eq!(Record::decode(&b, 78), Err(FailoverError::Nonce));
        let mut v = b;
        v[4] = 2;
        assert_eq!(Record::decode(&v, 77), Err(FailoverError::Version(2)));
        let mut z = b;
        z[6] = 1;
        assert_eq!(Record::decode(&z, 77), Err(FailoverError::Reserved));
        let mut m = b;
        m[0] = b'X';
        assert!(matches!(
            Record::decode(&m, 77),
            Err(FailoverError::BadMagic(_))
        ));
    }

    #[test]
    fn decode_never_panics_on_any_bytes() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..10_000 {
            let mut b = [0u8; RECORD_LEN];
            for byte in b.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *byte = x as u8;
            }
            if x.is_multiple_of(3) {
                b[..4].copy_from_slice(&RECORD_MAGIC);
                b[4] = RECORD_VERSION;
            }
            let _ = Record::decode(&b, x);
        }
    }

    #[test]
    fn incoming_reads_pre_switch_bytes_then_the_record_then_skips() {
        let rec = Record { resume_from: 100 }.encode(5);
        let mut i = Incoming::new(3, 130, 4096, 5);
        assert_eq!(i.next(), Next::App(Some(3)));
        i.on_app_read(3);
        assert_eq!(i.next(), Next::Control(RECORD_LEN as u64));
        assert_eq!(i.on_eof(), Err(ErrorReason::PeerVanished));
        i.on_control(&rec[..10]).unwrap();
        assert_eq!(i.next(), Next::Control((RECORD_LEN - 10) as u64));
        // the rest of the record and 12 of the 30 bytes to drop in one read
        let mut more = rec[10..].to_vec();
        more.extend_from_slice(&[0u8; 12]);
        i.on_control(&more).unwrap();
        assert_eq!(i.next(), Next::Control(18));
        assert!(matches!(
            i.on_eof(),
            Err(ErrorReason::Protocol(Violation::Failover(
                FailoverError::ShortContinuation
            )))
        ));
        i.on_control(&[0u8; 18]).unwrap();
        assert!(i.done());
        assert_eq!(i.next(), Next::App(None));
        assert_eq!(i.on_eof(), Ok(()));
    }

    #[test]
    fn incoming_refuses_a_continuation_it_cannot_join() {
        // starts after what was read: bytes would be missing
        let mut i = Incoming::new(0, 50, 4096, 1);
        assert_eq!(
            i.on_control(&Record { resume_from: 51 }.encode(1)),
            Err(FailoverError::ResumeOutOfRange {
                declared: 51,
                read: 50
            })
        );
        // more than a ring before it: the sender cannot have held those bytes
        let mut j = Incoming::new(0, 10_000, 4096, 1);
        assert!(j
            .on_control(&Record { resume_from: 1000 }.encode(1))
            .is_err());
        // exactly at the read cursor: nothing to drop
        let mut k = Incoming::new(0, 50, 4096, 1);
        k.on_control(&Record { resume_from: 50 }.encode(1)).unwrap();
        assert!(k.done());
    }
}
