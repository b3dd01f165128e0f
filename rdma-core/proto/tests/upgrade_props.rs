//! The server's request/accept rendezvous never loses or duplicates either side: under any
//! interleaving of requests, accepts, closes and clock steps, every request ends exactly once
//! (matched, refused, or expired) and so does every accepted connection (matched, expired or
//! forgotten), and nothing waits longer than its bound, nor less while its host makes progress.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use rdmashim_proto::upgrade::{Expired, Matcher, MatcherConfig, RequestOutcome, TupleKey};

#[derive(Clone, Debug)]
enum Op {
    Request(u8),
    Accept(u8),
    Close(u8),
    /// A connection of the client host was established (it took an answer up).
    Established,
    Advance(u16),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..12).prop_map(Op::Request),
        (0u8..12).prop_map(Op::Accept),
        (0u8..12).prop_map(Op::Close),
        Just(Op::Established),
        (0u16..1500).prop_map(Op::Advance),
    ]
}

fn key(p: u8) -> TupleKey {
    TupleKey {
        peer_ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)),
        peer_port: 40000 + p as u16,
        local_port: 6379,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn every_request_and_connection_ends_exactly_once(ops in prop::collection::vec(op(), 1..200)) {
        let cfg = MatcherConfig { max_requests: 6, ..Default::default() };
        let t0 = Instant::now();
        let mut now = t0;
        let mut m: Matcher<u32, u32> = Matcher::new(cfg);
        let (mut next_req, mut next_conn) = (0u32, 1_000_000u32);
        let mut live_reqs: HashSet<u32> = HashSet::new();
        let mut live_conns: HashSet<u32> = HashSet::new();
        let mut ended: HashSet<u32> = HashSet::new();
        let mut born: std::collections::HashMap<u32, Instant> = Default::default();
        // (every tuple is of one client host: its requests and its connections established
        // extend the accepted ones' waits)
        let mut last_progress: Option<Instant> = None;
        let mut end = |id: u32, live: &mut HashSet<u32>| {
            prop_assert!(live.remove(&id), "{} ended but was not live", id);
            prop_assert!(ended.insert(id), "{} ended twice", id);
            Ok(())
        };
        for o in ops {
            match o {
                Op::Request(p) => {
                    last_progress = Some(now);
                    let id = next_req; next_req += 1;
                    live_reqs.insert(id); born.insert(id, now);
                    match m.on_request(key(p), id, now) {
                        RequestOutcome::Matched { req, conn } => {
                            end(req, &mut live_reqs)?; end(conn, &mut live_conns)?;
                        }
                        RequestOutcome::Pending => {}
                        RequestOutcome::Duplicate(r) | RequestOutcome::Full(r) => end(r, &mut live_reqs)?,
                    }
                }
                Op::Accept(p) => {
                    // the kernel never hands out a 4-tuple again while it is open: a new accept of the
                    // same tuple means the old connection was closed
                    if let Some(c) = m.forget_accepted(&key(p)) {
                        end(c, &mut live_conns)?;
                    }
                    let id = next_conn; next_conn += 1;
                    live_conns.insert(id); born.insert(id, now);
                    if let Some((r, c)) = m.on_accepted(key(p), id, now) {
                        end(r, &mut live_reqs)?; end(c, &mut live_conns)?;
                    }
                }
                Op::Close(p) => {
                    if let Some(c) = m.forget_accepted(&key(p)) { end(c, &mut live_conns)?; }
                }
                Op::Established => {
                    last_progress = Some(now);
                    m.host_progress(key(0).peer_ip, now);
                }
                Op::Advance(ms) => {
                    now += Duration::from_millis(ms as u64);
                    for e in m.expire(now) {
                        match e {
                            Expired::Request(_, r) => {
                                prop_assert!(now - born[&r] >= cfg.request_wait);
                                end(r, &mut live_reqs)?;
                            }
                            Expired::Accepted(_, c) => {
                                prop_assert!(now - born[&c] >= cfg.accepted_wait);
                                // it waited on while its host made progress, up to the cap
                                let idle = last_progress.is_none_or(|t| now - t >= cfg.accepted_wait);
                                prop_assert!(idle || now - born[&c] >= cfg.accepted_wait_max);
                                end(c, &mut live_conns)?;
                            }
                        }
                    }
                }
            }
            prop_assert!(m.pending_requests() <= cfg.max_requests);
            prop_assert_eq!(m.pending_requests(), live_reqs.len());
            prop_assert_eq!(m.waiting_accepted(), live_conns.len());
        }
        // nothing waits past its bound
        now += cfg.accepted_wait_max.max(cfg.request_wait);
        for e in m.expire(now) {
            match e {
                Expired::Request(_, r) => end(r, &mut live_reqs)?,
                Expired::Accepted(_, c) => end(c, &mut live_conns)?,
            }
        }
        prop_assert!(live_reqs.is_empty() && live_conns.is_empty());
        prop_assert_eq!(m.poll_timeout(), None);
    }
}
