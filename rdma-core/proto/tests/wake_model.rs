//! The polled kind's wake-up (`wake`), checked against every interleaving of a small model: a
//! writer posting K records, the two directions of the queue pair as FIFOs (records and
//! doorbells one way, the reader's notices the other), and a reader that polls, goes to sleep
//! when it finds nothing, and wakes only on a completion. The writer's side also sends up to
//! two other messages (credits, control) whose completions wake the reader's thread without
//! being a wake-up it asked for: the reader then sleeps again on the notice it has out,
//! without a new one (a new notice per completion would wake the peer in turn, and two idle
//! peers would trade notices for ever). In no reachable state may the reader sleep for good
//! with a record it has not read; and the model finds that state when the writer is made to
//! forget the doorbell a notice behind its posts asks for.

use rdmashim_proto::wake::{Notice, OnNotice, ReaderWake, WriterWake};
use std::collections::{HashSet, VecDeque};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum ToReader {
    /// A record; `imm`: it was posted as a WRITE WITH IMMEDIATE (makes a completion).
    Record { imm: bool },
    /// A zero-length WRITE WITH IMMEDIATE.
    Doorbell,
    /// Any other message that makes a completion (a credit, a control message).
    Other,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    writer: WriterWake,
    posted: u64,
    to_reader: VecDeque<ToReader>,
    to_writer: VecDeque<Notice>,
    reader: ReaderWake,
    /// Records in the reader's ring memory.
    landed: u64,
    /// Records the reader has read.
    read: u64,
    /// Wake-up completions (records with an immediate, doorbells) in the reader's CQ, not yet
    /// taken.
    cq: u32,
    /// Other completions in the reader's CQ.
    cq_other: u32,
    /// Other messages the writer's side may still send.
    others_left: u32,
    /// The reader's thread waits on its completion channel.
    sleeping: bool,
}

/// Every state reachable from the start with `k` records to write; `ring_when_past`: whether
/// the writer honours an `OnNotice::Ring` (false: the broken writer that only arms).
fn explore(k: u64, ring_when_past: bool) -> Vec<State> {
    let start = State {
        writer: WriterWake::default(),
        posted: 0,
        to_reader: VecDeque::new(),
        to_writer: VecDeque::new(),
        reader: ReaderWake::default(),
        landed: 0,
        read: 0,
        cq: 0,
        cq_other: 0,
        others_left: 2,
        sleeping: false,
    };
    let mut seen = HashSet::new();
    let mut todo = vec![start];
    let mut stuck = Vec::new();
    while let Some(s) = todo.pop() {
        if !seen.insert(s.clone()) {
            continue;
        }
        let mut next = Vec::new();
        // the writer posts its next record
        if s.posted < k {
            let mut t = s.clone();
            let imm = t.writer.on_post();
            t.to_reader.push_back(ToReader::Record { imm });
            t.posted += 1;
            next.push(t);
        }
        // the writer's side sends something else
        if s.others_left > 0 {
            let mut t = s.clone();
            t.others_left -= 1;
            t.to_reader.push_back(ToReader::Other);
            next.push(t);
        }
        // the next WRITE lands at the reader
        if let Some(&m) = s.to_reader.front() {
            let mut t = s.clone();
            t.to_reader.pop_front();
            match m {
                ToReader::Record { imm } => {
                    t.landed += 1;
                    t.cq += u32::from(imm);
                }
                ToReader::Doorbell => t.cq += 1,
                ToReader::Other => t.cq_other += 1,
            }
            next.push(t);
        }
        // the next notice reaches the writer
        if let Some(&n) = s.to_writer.front() {
            let mut t = s.clone();
            t.to_writer.pop_front();
            let posted = t.posted;
            if t.writer.on_notice(n, posted) == OnNotice::Ring && ring_when_past {
                t.to_reader.push_back(ToReader::Doorbell);
            }
            next.push(t);
        }
        if s.sleeping {
            // only a completion wakes it; only a wake-up ends its notice
            if s.cq > 0 {
                let mut t = s.clone();
                t.cq -= 1;
                t.reader.woken();
                t.sleeping = false;
                next.push(t);
            }
            if s.cq_other > 0 {
                let mut t = s.clone();
                t.cq_other -= 1;
                t.sleeping = false;
                next.push(t);
            }
        } else {
            // it polls its ring (and takes what its CQ holds), or, finding nothing, sleeps
            if s.read < s.landed || s.cq > 0 || s.cq_other > 0 {
                let mut t = s.clone();
                t.read = t.landed;
                if t.cq > 0 {
                    t.reader.woken();
                }
                t.cq = 0;
                t.cq_other = 0;
                next.push(t);
            }
            if s.read == s.landed {
                let mut t = s.clone();
                let seen = t.read;
                if let Some(n) = t.reader.sleep(seen) {
                    t.to_writer.push_back(n);
                }
                t.sleeping = true;
                next.push(t);
            }
        }
        // (a state with nothing left but the reader's sleep: the end of a run)
        if next.is_empty() {
            stuck.push(s.clone());
        }
        todo.extend(next);
    }
    assert!(!stuck.is_empty(), "no run ends");
    stuck
}

#[test]
fn no_run_leaves_a_sleeping_reader_with_a_record_unread() {
    for k in 0..=4 {
        for end in explore(k, true) {
            assert!(
                end.sleeping && end.reader.asleep(),
                "a run ended with the reader awake: {end:?}"
            );
            assert_eq!(
                (end.posted, end.landed, end.read),
                (k, k, k),
                "lost wake-up: {end:?}"
            );
            assert!(end.to_reader.is_empty() && end.to_writer.is_empty());
        }
    }
}

#[test]
fn the_model_finds_the_lost_wake_up_of_a_writer_that_only_arms() {
    let lost = explore(2, false)
        .into_iter()
        .find(|end| end.read < end.landed);
    assert!(
        lost.is_some(),
        "the broken writer's lost wake-up was not found"
    );
}

#[test]
fn a_notice_behind_the_posts_rings_at_once_and_one_ahead_arms_one_record() {
    let mut w = WriterWake::default();
    assert_eq!(w.on_notice(Notice { seen: 64 }, 128), OnNotice::Ring);
    assert!(!w.armed());
    assert_eq!(w.on_notice(Notice { seen: 128 }, 128), OnNotice::Armed);
    assert!(w.on_post(), "the first record after the notice wakes");
    assert!(!w.on_post(), "a notice is good for one wake-up");
    assert_eq!(w.wakes(), 2);
    let mut r = ReaderWake::default();
    assert_eq!(r.sleep(128), Some(Notice { seen: 128 }));
    assert_eq!(r.sleep(128), None, "one notice per sleep");
    r.woken();
    assert!(!r.asleep());
    assert_eq!(r.notices(), 1);
}
