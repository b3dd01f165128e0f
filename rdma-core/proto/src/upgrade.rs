//! Decisions of the upgrade that need no I/O: which peer addresses can be upgraded at all, the
//! per-peer negative cache, and the server's matching of rdma_cm connect requests to the TCP
//! connections the application accepted (see `docs/upgrade.md` §3–4).
//!
//! Time is passed in; nothing here reads a clock.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// Why an address is never upgraded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotUpgradable {
    /// 127.0.0.0/8, ::1 (and ::ffff:127.x): traffic that never leaves the host's loopback;
    /// RDMA devices have no loopback address.
    Loopback,
    /// 0.0.0.0 / ::.
    Unspecified,
    /// Multicast or broadcast: not a TCP peer.
    Multicast,
}

impl fmt::Display for NotUpgradable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NotUpgradable::Loopback => "loopback address",
            NotUpgradable::Unspecified => "unspecified address",
            NotUpgradable::Multicast => "multicast or broadcast address",
        })
    }
}

/// Whether a TCP peer at `ip` could be reached over RDMA (IPv4-mapped IPv6 counts as IPv4).
pub fn upgradable(ip: IpAddr) -> Result<(), NotUpgradable> {
    let ip = match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    };
    if ip.is_loopback() {
        return Err(NotUpgradable::Loopback);
    }
    if ip.is_unspecified() {
        return Err(NotUpgradable::Unspecified);
    }
    let multi = match ip {
        IpAddr::V4(v4) => v4.is_multicast() || v4.is_broadcast(),
        IpAddr::V6(v6) => v6.is_multicast(),
    };
    if multi {
        return Err(NotUpgradable::Multicast);
    }
    Ok(())
}

/// How an upgrade attempt to a peer failed, as far as the negative cache cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PeerFailure {
    /// The peer's host answered with a reject (no shim listening, or it refused).
    Rejected,
    /// No answer: a host without RDMA never answers a CM request.
    Unreachable,
    /// Our own deadline passed first.
    Timeout,
}

/// Expiry times of the negative cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NegativeCacheConfig {
    /// After a reject (cheap to retry: the answer comes in a few ms). Default 60 s.
    pub after_reject: Duration,
    /// After no answer or a timeout (expensive: every attempt holds resources for seconds).
    /// Default 600 s.
    pub after_silence: Duration,
    /// Most peers remembered (the entry expiring first is evicted). Default 4096.
    pub capacity: usize,
}

impl Default for NegativeCacheConfig {
    fn default() -> Self {
        NegativeCacheConfig {
            after_reject: Duration::from_secs(60),
            after_silence: Duration::from_secs(600),
            capacity: 4096,
        }
    }
}

impl NegativeCacheConfig {
    /// The default expiries, both replaced by `secs` when given (`RDMASHIM_NEGATIVE_CACHE_SECS`;
    /// 0 disables the cache).
    pub fn with_override(secs: Option<u64>) -> Self {
        let mut c = Self::default();
        if let Some(s) = secs {
            c.after_reject = Duration::from_secs(s);
            c.after_silence = Duration::from_secs(s);
        }
        c
    }
}

#[derive(Clone, Copy, Debug)]
struct NegEntry {
    until: Instant,
    failure: PeerFailure,
}

/// Where a failure applies: a reject speaks for one service (one port: the host may run
/// another one under the shim), silence for the whole host (no RDMA there).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum NegKey {
    Port(IpAddr, u16),
    Host(IpAddr),
}

/// Peers an upgrade recently failed with: no new attempt until the entry expires, so a host
/// without the shim (or without RDMA) costs one attempt per expiry period, not one per
/// connection.
///
/// A reject suppresses that peer's port; no answer or a timeout suppresses the whole host. A
/// host this process upgraded a connection to within the silence period is *proven*: silence
/// or a timeout from it is taken as transient (a busy peer) and not cached. A host whose shim
/// answered (even with a reject of one connection) is proven too.
///
/// It also decides when a new connection's dial may wait ([`NegativeCache::may_delay`]): a
/// dial to a host nothing is known about starts at once (a *probe*, so that a host without the
/// shim is learned from the first connection), and others wait behind it.
#[derive(Debug)]
pub struct NegativeCache {
    cfg: NegativeCacheConfig,
    entries: HashMap<NegKey, NegEntry>,
    proven: HashMap<IpAddr, Instant>,
    /// Hosts with a probe dial under way, since when.
    probing: HashMap<IpAddr, Instant>,
}

/// How long a probe dial is taken to be under way if its end is never reported (a dial ends
/// by its own deadlines well before).
pub const PROBE_STALE: Duration = Duration::from_secs(15);

impl NegativeCache {
    /// An empty cache.
    pub fn new(cfg: NegativeCacheConfig) -> Self {
        NegativeCache {
            cfg,
            entries: HashMap::new(),
            proven: HashMap::new(),
            probing: HashMap::new(),
        }
    }

    fn live(&mut self, k: NegKey, now: Instant) -> Option<PeerFailure> {
        match self.entries.get(&k) {
            Some(e) if now < e.until => Some(e.failure),
            Some(_) => {
                self.entries.remove(&k);
                None
            }
            None => None,
        }
    }

    /// `Some(failure)` if attempts to `peer` are suppressed at `now` (expired entries are
    /// dropped on the way).
    pub fn check(&mut self, peer: SocketAddr, now: Instant) -> Option<PeerFailure> {
        self.live(NegKey::Host(peer.ip()), now)
            .or_else(|| self.live(NegKey::Port(peer.ip(), peer.port()), now))
    }

    /// Whether host `ip` is proven at `now` (see the type's docs).
    fn is_proven(&self, ip: IpAddr, now: Instant) -> bool {
        self.proven
            .get(&ip)
            .is_some_and(|t| now < *t + self.cfg.after_silence)
    }

    /// Records a failed attempt to `peer` at `now`.
    pub fn record(&mut self, peer: SocketAddr, failure: PeerFailure, now: Instant) {
        let (key, ttl) = match failure {
            PeerFailure::Rejected => (NegKey::Port(peer.ip(), peer.port()), self.cfg.after_reject),
            PeerFailure::Unreachable | PeerFailure::Timeout => {
                if self.is_proven(peer.ip(), now) {
                    return;
                }
                (NegKey::Host(peer.ip()), self.cfg.after_silence)
            }
        };
        if ttl.is_zero() || self.cfg.capacity == 0 {
            return;
        }
        if !self.entries.contains_key(&key) && self.entries.len() >= self.cfg.capacity {
            self.entries.retain(|_, e| now < e.until);
            if self.entries.len() >= self.cfg.capacity {
                if let Some(victim) = self
                    .entries
                    .iter()
                    .min_by_key(|(_, e)| e.until)
                    .map(|(k, _)| *k)
                {
                    self.entries.remove(&victim);
                }
            }
        }
        let until = now + ttl;
        let e = self
            .entries
            .entry(key)
            .or_insert(NegEntry { until, failure });
        // a later failure never shortens a suppression already in force
        if until >= e.until {
            *e = NegEntry { until, failure };
        }
    }

    /// An upgrade to `peer` succeeded at `now`, or its shim answered: forget its failures,
    /// and remember the host as proven (see the type's docs).
    pub fn record_success(&mut self, peer: SocketAddr, now: Instant) {
        self.entries.remove(&NegKey::Host(peer.ip()));
        self.entries.remove(&NegKey::Port(peer.ip(), peer.port()));
        self.probing.remove(&peer.ip());
        if self.cfg.capacity == 0 {
            return;
        }
        if !self.proven.contains_key(&peer.ip()) && self.proven.len() >= self.cfg.capacity {
            let silence = self.cfg.after_silence;
            self.proven.retain(|_, t| now < *t + silence);
            if self.proven.len() >= self.cfg.capacity {
                if let Some(oldest) = self
                    .proven
                    .iter()
                    .min_by_key(|(_, t)| **t)
                    .map(|(ip, _)| *ip)
                {
                    self.proven.remove(&oldest);
                }
            }
        }
        self.proven.insert(peer.ip(), now);
    }

    /// Whether a new connection's dial to `peer` may wait for the dial delay (`true`), or
    /// must start at once as a probe of the host (`false`; the probe is then under way until
    /// [`probe_ended`](Self::probe_ended) or [`PROBE_STALE`]). It may wait when the host is
    /// proven, or another probe of it is under way: a stream of short connections to a shim
    /// costs one dial, not one each, and one to a host without the shim is cached after the
    /// first.
    pub fn may_delay(&mut self, peer: SocketAddr, now: Instant) -> bool {
        let ip = peer.ip();
        if self.is_proven(ip, now)
            || self
                .probing
                .get(&ip)
                .is_some_and(|t| now < *t + PROBE_STALE)
        {
            return true;
        }
        if self.probing.len() >= self.cfg.capacity.max(1) {
            self.probing.retain(|_, t| now < *t + PROBE_STALE);
            if self.probing.len() >= self.cfg.capacity.max(1) {
                return true;
            }
        }
        self.probing.insert(ip, now);
        false
    }

    /// The probe dial to `peer` ended (whatever its outcome, recorded separately).
    pub fn probe_ended(&mut self, peer: SocketAddr) {
        self.probing.remove(&peer.ip());
    }

    /// Entries held (expired ones included until touched).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// A TCP connection as the server sees it: the peer's address and port, and our local port.
/// (The local IP is implied by the listener the request arrived on.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TupleKey {
    /// The client's IP (from rdma_cm's event / the accepted socket's peer address).
    pub peer_ip: IpAddr,
    /// The client's TCP source port (from the ConnectRequest / the accepted socket).
    pub peer_port: u16,
    /// The server's TCP port (the listening port).
    pub local_port: u16,
}

/// Limits of the server-side matcher.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatcherConfig {
    /// How long a connect request waits for the application to accept its TCP connection
    /// (it may still sit in the kernel's backlog of a busy server). Default 3 s.
    pub request_wait: Duration,
    /// How long an accepted TCP connection waits for its connect request before it is decided
    /// that no request will come. Default 5 s (the client sends its request right after its
    /// connect completes; address resolution under load can take a while).
    pub accepted_wait: Duration,
    /// How long an accepted connection may wait in all while its client's host makes
    /// progress: as long as requests keep coming from that host, or it keeps taking up
    /// answers to its requests (one or the other within the last `accepted_wait`), its wait
    /// goes on, up to this. A client that dials a burst of
    /// connections sets them up one after another (or a few at a time); the last ones' requests
    /// come long after their connections were accepted, and with no sign of a host that
    /// stopped trying. Default 1800 s (a burst of ten thousand, set up at ~45 a second under
    /// emulation, took ~220 s on one host and more than 300 s, the bound before, on a slower
    /// one; the wait ends `accepted_wait` after the host's last request whatever this allows,
    /// so the bound only keeps a host that never stops sending requests from holding a
    /// connection's wait for ever).
    pub accepted_wait_max: Duration,
    /// Most pending requests (a flood of bogus requests is rejected, not stored). Default 1024.
    pub max_requests: usize,
}

impl Default for MatcherConfig {
    fn default() -> Self {
        MatcherConfig {
            request_wait: Duration::from_secs(3),
            accepted_wait: Duration::from_secs(5),
            accepted_wait_max: Duration::from_secs(1800),
            max_requests: 1024,
        }
    }
}

/// What became of a connect request handed to [`Matcher::on_request`].
#[derive(Debug, PartialEq, Eq)]
pub enum RequestOutcome<R, C> {
    /// Its TCP connection was already accepted: upgrade `conn` with `req`.
    Matched {
        /// The request.
        req: R,
        /// The accepted connection.
        conn: C,
    },
    /// Kept until its connection is accepted (or [`Matcher::expire`] gives it back).
    Pending,
    /// [`MAX_REQUESTS_PER_TUPLE`] requests for that 4-tuple are already pending: reject this
    /// one as a duplicate.
    Duplicate(R),
    /// Too many pending requests: reject it (resources).
    Full(R),
}

/// Something [`Matcher::expire`] gave up on.
#[derive(Debug, PartialEq, Eq)]
pub enum Expired<R, C> {
    /// No accepted TCP connection matched in time: reject the request (no matching TCP).
    Request(TupleKey, R),
    /// No request came for an accepted connection (its client closed it first, or could not
    /// dial); the connection stays TCP.
    Accepted(TupleKey, C),
}

/// Most requests kept pending for one 4-tuple. More than one: anyone can send a request that
/// names a tuple (`docs/protocol.md` 2.8), and a forger's request that came first must not turn
/// the real client's into a duplicate. The caller verifies each request it is handed against
/// the connection's key and, when one fails, hands the connection back to
/// [`Matcher::on_accepted`], which gives it the next.
pub const MAX_REQUESTS_PER_TUPLE: usize = 4;

/// The server's rendezvous between rdma_cm connect requests and accepted TCP connections.
/// Either may come first; each waits a bounded time for the other.
#[derive(Debug)]
pub struct Matcher<R, C> {
    cfg: MatcherConfig,
    /// Pending requests per tuple, oldest first.
    requests: HashMap<TupleKey, Vec<(R, Instant)>>,
    /// How many requests `requests` holds in all.
    pending: usize,
    /// Accepted connections: the connection, when its wait ends, when it was accepted.
    accepted: HashMap<TupleKey, (C, Instant, Instant)>,
    /// When each client host last made progress (within the last `accepted_wait`).
    progress: HashMap<IpAddr, Instant>,
}

impl<R, C> Matcher<R, C> {
    /// An empty matcher.
    pub fn new(cfg: MatcherConfig) -> Self {
        Matcher {
            cfg,
            requests: HashMap::new(),
            pending: 0,
            accepted: HashMap::new(),
            progress: HashMap::new(),
        }
    }

    /// A connect request for `key` arrived at `now`.
    pub fn on_request(&mut self, key: TupleKey, req: R, now: Instant) -> RequestOutcome<R, C> {
        self.host_progress(key.peer_ip, now);
        if let Some((conn, ..)) = self.accepted.remove(&key) {
            return RequestOutcome::Matched { req, conn };
        }
        if self
            .requests
            .get(&key)
            .is_some_and(|v| v.len() >= MAX_REQUESTS_PER_TUPLE)
        {
            return RequestOutcome::Duplicate(req);
        }
        if self.pending >= self.cfg.max_requests {
            return RequestOutcome::Full(req);
        }
        self.requests
            .entry(key)
            .or_default()
            .push((req, now + self.cfg.request_wait));
        self.pending += 1;
        RequestOutcome::Pending
    }

    /// The client host `ip` was seen to make progress at `now`: a request of its came, or it
    /// took up an answer to one (the server's end of that connection saw it established). A
    /// client busy taking up a burst's answers sends no requests meanwhile, and its later
    /// requests are on their way all the same (see `accepted_wait_max`). The map is pruned by
    /// `expire`, and never holds more hosts than requests may be pending.
    pub fn host_progress(&mut self, ip: IpAddr, now: Instant) {
        if self.progress.len() < self.cfg.max_requests || self.progress.contains_key(&ip) {
            let t = self.progress.entry(ip).or_insert(now);
            *t = (*t).max(now);
        }
    }

    /// The application accepted the TCP connection `key` at `now` (or the caller hands it
    /// back after the request it was given did not verify). Returns the oldest pending request
    /// for it, or keeps `conn` waiting for one.
    pub fn on_accepted(&mut self, key: TupleKey, conn: C, now: Instant) -> Option<(R, C)> {
        if let Some(v) = self.requests.get_mut(&key) {
            let (req, _) = v.remove(0);
            if v.is_empty() {
                self.requests.remove(&key);
            }
            self.pending -= 1;
            return Some((req, conn));
        }
        self.accepted
            .insert(key, (conn, now + self.cfg.accepted_wait, now));
        None
    }

    /// The accepted connection `key` went away (closed by the application) before a request
    /// came: forget it and hand it back.
    pub fn forget_accepted(&mut self, key: &TupleKey) -> Option<C> {
        self.accepted.remove(key).map(|(c, ..)| c)
    }

    /// As [`forget_accepted`](Self::forget_accepted), but only if the waiting connection is
    /// the one `is_it` recognises (a newer connection may have the same tuple: the old one's
    /// entry was replaced, see [`on_accepted`](Self::on_accepted)).
    pub fn forget_accepted_if(
        &mut self,
        key: &TupleKey,
        is_it: impl FnOnce(&C) -> bool,
    ) -> Option<C> {
        match self.accepted.get(key) {
            Some((c, ..)) if is_it(c) => self.forget_accepted(key),
            _ => None,
        }
    }

    /// Everything whose wait ended at or before `now`. An accepted connection whose client's
    /// host made progress within the last `accepted_wait` waits on (see `accepted_wait_max`).
    pub fn expire(&mut self, now: Instant) -> Vec<Expired<R, C>> {
        let mut out = Vec::new();
        let wait = self.cfg.accepted_wait;
        self.progress
            .retain(|_, t| now.saturating_duration_since(*t) < wait);
        let due: Vec<TupleKey> = self
            .requests
            .iter()
            .filter(|(_, v)| v.iter().any(|(_, t)| *t <= now))
            .map(|(k, _)| *k)
            .collect();
        for k in due {
            let Some(v) = self.requests.remove(&k) else {
                continue;
            };
            let (gone, kept): (Vec<_>, Vec<_>) = v.into_iter().partition(|(_, t)| *t <= now);
            self.pending -= gone.len();
            out.extend(gone.into_iter().map(|(r, _)| Expired::Request(k, r)));
            if !kept.is_empty() {
                self.requests.insert(k, kept);
            }
        }
        let due: Vec<TupleKey> = self
            .accepted
            .iter()
            .filter(|(_, (_, t, _))| *t <= now)
            .map(|(k, _)| *k)
            .collect();
        for k in due {
            let Some((c, _, born)) = self.accepted.remove(&k) else {
                continue;
            };
            let end = born + self.cfg.accepted_wait_max;
            match self.progress.get(&k.peer_ip) {
                // (`progress` holds only requests within `wait` of now: later than now)
                Some(&last) if now < end => {
                    self.accepted.insert(k, (c, (last + wait).min(end), born));
                }
                _ => out.push(Expired::Accepted(k, c)),
            }
        }
        out
    }

    /// When the host `ip` was last seen to make progress ([`host_progress`](Self::host_progress)),
    /// if within the last `accepted_wait` (as of the last [`expire`](Self::expire)): its client
    /// works through a queue of set-ups.
    pub fn last_progress_of(&self, ip: IpAddr) -> Option<Instant> {
        self.progress.get(&ip).copied()
    }

    /// When [`expire`](Self::expire) next has something to do.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.requests
            .values()
            .flatten()
            .map(|(_, t)| *t)
            .chain(self.accepted.values().map(|(_, t, _)| *t))
            .min()
    }

    /// Pending requests.
    pub fn pending_requests(&self) -> usize {
        self.pending
    }

    /// Accepted connections waiting for a request.
    pub fn waiting_accepted(&self) -> usize {
        self.accepted.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn loopback_unspecified_and_multicast_are_not_upgradable() {
        assert_eq!(upgradable(ip("127.0.0.1")), Err(NotUpgradable::Loopback));
        assert_eq!(upgradable(ip("127.9.8.7")), Err(NotUpgradable::Loopback));
        assert_eq!(upgradable(ip("::1")), Err(NotUpgradable::Loopback));
        assert_eq!(
            upgradable(ip("::ffff:127.0.0.1")),
            Err(NotUpgradable::Loopback)
        );
        assert_eq!(upgradable(ip("0.0.0.0")), Err(NotUpgradable::Unspecified));
        assert_eq!(upgradable(ip("::")), Err(NotUpgradable::Unspecified));
        assert_eq!(upgradable(ip("224.0.0.1")), Err(NotUpgradable::Multicast));
        assert_eq!(
            upgradable(ip("255.255.255.255")),
            Err(NotUpgradable::Multicast)
        );
        assert_eq!(upgradable(ip("ff02::1")), Err(NotUpgradable::Multicast));
        for ok in [
            "10.99.0.1",
            "192.168.1.2",
            "::ffff:10.0.0.1",
            "fe80::1",
            "2001:db8::1",
        ] {
            assert_eq!(upgradable(ip(ok)), Ok(()), "{ok}");
        }
    }

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn negative_cache_suppresses_until_expiry() {
        let t0 = Instant::now();
        let mut c = NegativeCache::new(NegativeCacheConfig::default());
        let p = sa("10.0.0.2:80");
        assert_eq!(c.check(p, t0), None);
        c.record(p, PeerFailure::Rejected, t0);
        assert_eq!(
            c.check(p, t0 + Duration::from_secs(59)),
            Some(PeerFailure::Rejected)
        );
        // a reject speaks for its port only: another service of the host may run the shim
        assert_eq!(c.check(sa("10.0.0.2:6379"), t0), None);
        assert_eq!(c.check(p, t0 + Duration::from_secs(60)), None);
        assert!(c.is_empty(), "expired entries are dropped when checked");

        // silence speaks for the whole host
        c.record(p, PeerFailure::Unreachable, t0);
        assert_eq!(
            c.check(sa("10.0.0.2:6379"), t0 + Duration::from_secs(599)),
            Some(PeerFailure::Unreachable)
        );
        // a reject later does not shorten the long suppression
        c.record(p, PeerFailure::Rejected, t0 + Duration::from_secs(1));
        assert_eq!(
            c.check(p, t0 + Duration::from_secs(300)),
            Some(PeerFailure::Unreachable)
        );
        c.record_success(p, t0 + Duration::from_secs(2));
        assert_eq!(c.check(p, t0 + Duration::from_secs(300)), None);
        // other peers are independent
        c.record(p, PeerFailure::Timeout, t0);
        assert_eq!(c.check(sa("10.0.0.3:80"), t0), None);
    }

    #[test]
    fn one_probe_per_unknown_host_then_delays() {
        let t0 = Instant::now();
        let mut c = NegativeCache::new(NegativeCacheConfig::default());
        let a = sa("10.0.0.2:80");
        let a2 = sa("10.0.0.2:8080");
        let b = sa("10.0.0.3:80");
        // the first connection to a host probes; later ones (any port) wait behind it
        assert!(!c.may_delay(a, t0));
        assert!(c.may_delay(a, t0));
        assert!(c.may_delay(a2, t0));
        // another host is probed on its own
        assert!(!c.may_delay(b, t0));
        // a probe that ended without proof (a reject, silence): the next one probes again
        c.probe_ended(a);
        assert!(!c.may_delay(a, t0 + Duration::from_secs(1)));
        // proof (an upgrade, or the shim's answer) ends the probe and makes every dial wait
        c.record_success(a, t0 + Duration::from_secs(2));
        assert!(c.may_delay(a2, t0 + Duration::from_secs(3)));
        // ... for the silence period
        assert!(!c.may_delay(a, t0 + Duration::from_secs(603)));
        // a probe whose end is never reported goes stale
        let t1 = t0 + Duration::from_secs(700);
        assert!(!c.may_delay(b, t1));
        assert!(c.may_delay(b, t1 + PROBE_STALE - Duration::from_millis(1)));
        assert!(!c.may_delay(b, t1 + PROBE_STALE));
    }

    #[test]
    fn probes_are_bounded() {
        let t0 = Instant::now();
        let cfg = NegativeCacheConfig {
            capacity: 2,
            ..NegativeCacheConfig::default()
        };
        let mut c = NegativeCache::new(cfg);
        assert!(!c.may_delay(sa("10.0.0.1:1"), t0));
        assert!(!c.may_delay(sa("10.0.0.2:1"), t0));
        // full: a third unknown host waits rather than growing the table
        assert!(c.may_delay(sa("10.0.0.3:1"), t0));
        // stale probes make room
        assert!(!c.may_delay(sa("10.0.0.3:1"), t0 + PROBE_STALE));
    }

    #[test]
    fn proven_peers_are_not_suppressed_by_silence() {
        let t0 = Instant::now();
        let mut c = NegativeCache::new(NegativeCacheConfig::default());
        let p = sa("10.0.0.2:6379");
        c.record_success(p, t0);
        // a busy peer that upgraded before: one lost request is not a verdict
        for f in [PeerFailure::Unreachable, PeerFailure::Timeout] {
            c.record(p, f, t0 + Duration::from_secs(10));
            assert_eq!(c.check(p, t0 + Duration::from_secs(11)), None, "{f:?}");
        }
        // a reject still counts (that port has no shim now)
        c.record(p, PeerFailure::Rejected, t0 + Duration::from_secs(10));
        assert_eq!(
            c.check(p, t0 + Duration::from_secs(11)),
            Some(PeerFailure::Rejected)
        );
        // proof expires with the silence period
        let late = t0 + Duration::from_secs(601);
        c.record(p, PeerFailure::Unreachable, late);
        assert_eq!(
            c.check(p, late + Duration::from_secs(1)),
            Some(PeerFailure::Unreachable)
        );
    }

    #[test]
    fn negative_cache_override_and_disable() {
        let t0 = Instant::now();
        let mut c = NegativeCache::new(NegativeCacheConfig::with_override(Some(0)));
        c.record(sa("10.0.0.2:1"), PeerFailure::Unreachable, t0);
        assert!(c.is_empty(), "0 s disables the cache");
        let mut c = NegativeCache::new(NegativeCacheConfig::with_override(Some(5)));
        c.record(sa("10.0.0.2:1"), PeerFailure::Unreachable, t0);
        assert!(c
            .check(sa("10.0.0.2:1"), t0 + Duration::from_secs(4))
            .is_some());
        assert!(c
            .check(sa("10.0.0.2:1"), t0 + Duration::from_secs(5))
            .is_none());
    }

    #[test]
    fn negative_cache_is_bounded() {
        let t0 = Instant::now();
        let cfg = NegativeCacheConfig {
            capacity: 8,
            ..Default::default()
        };
        let mut c = NegativeCache::new(cfg);
        let peer = |i: u32| SocketAddr::new(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i)), 80);
        for i in 0..100u32 {
            c.record(
                peer(i),
                PeerFailure::Rejected,
                t0 + Duration::from_millis(i as u64),
            );
            c.record_success(peer(1000 + i), t0);
            assert!(c.len() <= 8);
            assert!(c.proven.len() <= 8);
        }
        // the most recent failures are the ones kept
        assert!(c.check(peer(99), t0 + Duration::from_secs(1)).is_some());
        assert!(c.check(peer(0), t0 + Duration::from_secs(1)).is_none());
    }

    fn key(port: u16) -> TupleKey {
        TupleKey {
            peer_ip: IpAddr::V6(Ipv6Addr::LOCALHOST),
            peer_port: port,
            local_port: 7000,
        }
    }

    #[test]
    fn request_first_then_accept_matches() {
        let t0 = Instant::now();
        let mut m: Matcher<&str, u32> = Matcher::new(MatcherConfig::default());
        assert_eq!(m.on_request(key(1), "req1", t0), RequestOutcome::Pending);
        assert_eq!(m.poll_timeout(), Some(t0 + Duration::from_secs(3)));
        assert_eq!(
            m.on_accepted(key(2), 20, t0),
            None,
            "another tuple does not match"
        );
        assert_eq!(m.on_accepted(key(1), 10, t0), Some(("req1", 10)));
        assert_eq!(m.pending_requests(), 0);
        assert_eq!(m.waiting_accepted(), 1);
    }

    /// A forger's request that came first does not shut the real one out: both wait, the
    /// connection is offered the oldest, and handed back (its request did not verify) the next.
    #[test]
    fn several_requests_for_one_tuple_are_offered_in_turn() {
        let t0 = Instant::now();
        let mut m: Matcher<&str, u32> = Matcher::new(MatcherConfig::default());
        let names = ["forged1", "forged2", "forged3", "real"];
        for (i, r) in names.iter().enumerate() {
            let at = t0 + Duration::from_millis(i as u64);
            assert_eq!(m.on_request(key(1), *r, at), RequestOutcome::Pending);
        }
        assert_eq!(
            m.on_request(key(1), "fifth", t0),
            RequestOutcome::Duplicate("fifth")
        );
        assert_eq!(m.pending_requests(), 4);
        let mut conn = 10;
        for want in names {
            let (r, c) = m.on_accepted(key(1), conn, t0).expect("a request to try");
            assert_eq!((r, c), (want, 10));
            conn = c;
        }
        assert_eq!(m.on_accepted(key(1), conn, t0), None, "waits for more");
        assert_eq!((m.pending_requests(), m.waiting_accepted()), (0, 1));
        // Expiry takes only the due ones of a tuple.
        let mut m: Matcher<&str, u32> = Matcher::new(MatcherConfig::default());
        m.on_request(key(2), "old", t0);
        m.on_request(key(2), "new", t0 + Duration::from_secs(2));
        let gone = m.expire(t0 + Duration::from_secs(3));
        assert_eq!(gone, vec![Expired::Request(key(2), "old")]);
        assert_eq!(m.pending_requests(), 1);
        assert_eq!(m.on_accepted(key(2), 7, t0), Some(("new", 7)));
    }

    #[test]
    fn accept_first_then_request_matches() {
        let t0 = Instant::now();
        let mut m: Matcher<&str, u32> = Matcher::new(MatcherConfig::default());
        assert_eq!(m.on_accepted(key(1), 10, t0), None);
        assert_eq!(
            m.on_request(key(1), "req", t0 + Duration::from_millis(5)),
            RequestOutcome::Matched {
                req: "req",
                conn: 10
            }
        );
        assert_eq!(m.waiting_accepted(), 0);
    }

    #[test]
    fn a_reused_tuple_replaces_the_waiting_connection_explicitly() {
        let t0 = Instant::now();
        let mut m: Matcher<&str, u32> = Matcher::new(MatcherConfig::default());
        assert_eq!(m.on_accepted(key(1), 10, t0), None);
        // a newer connection with the same tuple: the caller takes the old one out first
        assert_eq!(m.forget_accepted(&key(1)), Some(10));
        assert_eq!(m.on_accepted(key(1), 11, t0), None);
        // the old connection's close does not take the new one's place
        assert_eq!(m.forget_accepted_if(&key(1), |c| *c == 10), None);
        assert_eq!(m.waiting_accepted(), 1);
        assert_eq!(
            m.on_request(key(1), "r", t0),
            RequestOutcome::Matched { req: "r", conn: 11 }
        );
        assert_eq!(m.forget_accepted_if(&key(1), |_| true), None);
    }

    #[test]
    fn waits_are_bounded_both_ways() {
        let t0 = Instant::now();
        let mut m: Matcher<&str, u32> = Matcher::new(MatcherConfig::default());
        m.on_request(key(1), "r", t0);
        m.on_accepted(key(2), 20, t0);
        assert!(m.expire(t0 + Duration::from_millis(2999)).is_empty());
        assert_eq!(
            m.expire(t0 + Duration::from_secs(3)),
            vec![Expired::Request(key(1), "r")]
        );
        assert_eq!(m.poll_timeout(), Some(t0 + Duration::from_secs(5)));
        assert_eq!(
            m.expire(t0 + Duration::from_secs(5)),
            vec![Expired::Accepted(key(2), 20)]
        );
        assert_eq!(m.poll_timeout(), None);
        // a closed connection is forgotten
        m.on_accepted(key(3), 30, t0);
        assert_eq!(m.forget_accepted(&key(3)), Some(30));
        assert!(m.expire(t0 + Duration::from_secs(10)).is_empty());
    }

    #[test]
    fn an_accepted_connection_waits_on_while_its_host_makes_progress() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut m: Matcher<u16, u16> = Matcher::new(MatcherConfig::default());
        // a burst: 3 accepted at once, their client sets them up one after another
        for p in 1..=3 {
            assert_eq!(m.on_accepted(key(p), p, t0), None);
        }
        // another host's requests are no sign of this one's progress
        let other = TupleKey {
            peer_ip: ip("10.9.9.9"),
            ..key(7)
        };
        assert_eq!(m.on_request(other, 70, t0 + s(4)), RequestOutcome::Pending);
        assert_eq!(
            m.on_request(key(1), 1, t0 + s(4)),
            RequestOutcome::Matched { req: 1, conn: 1 }
        );
        // at 5 s the others wait on: their host's last request was at 4 s
        assert!(m.expire(t0 + s(5)).is_empty());
        assert_eq!(m.waiting_accepted(), 2);
        assert_eq!(m.expire(t0 + s(7)), vec![Expired::Request(other, 70)]);
        assert_eq!(m.poll_timeout(), Some(t0 + s(9)));
        assert_eq!(
            m.on_request(key(2), 2, t0 + s(8)),
            RequestOutcome::Matched { req: 2, conn: 2 }
        );
        assert!(m.expire(t0 + s(9)).is_empty());
        assert_eq!(m.poll_timeout(), Some(t0 + s(13)));
        // the host went quiet: the last one's wait ends 5 s after its host's last request
        assert_eq!(m.expire(t0 + s(13)), vec![Expired::Accepted(key(3), 3)]);
        // and progress never stretches a wait past `accepted_wait_max`
        let mut m: Matcher<u16, u16> = Matcher::new(MatcherConfig::default());
        m.on_accepted(key(1), 1, t0);
        let mut now = t0;
        let mut expired = Vec::new();
        while expired.is_empty() && now - t0 < Duration::from_secs(3600) {
            now += s(1);
            let busy = key(2);
            let _ = m.on_request(busy, 0, now);
            let _ = m.forget_accepted(&busy);
            expired = m
                .expire(now)
                .into_iter()
                .filter(|e| matches!(e, Expired::Accepted(..)))
                .collect();
        }
        assert_eq!(now - t0, MatcherConfig::default().accepted_wait_max);
    }

    /// A client busy taking up the answers to its burst's first requests sends none for a
    /// while: the connections whose requests are still to come wait on as long as it takes
    /// answers up (the server sees each of those connections established), and no longer.
    #[test]
    fn an_accepted_connection_waits_on_while_its_host_takes_answers_up() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut m: Matcher<u16, u16> = Matcher::new(MatcherConfig::default());
        let host = key(1).peer_ip;
        assert_eq!(m.on_accepted(key(1), 1, t0), None);
        assert_eq!(m.on_accepted(key(2), 2, t0), None);
        // established connections of this host, no requests: at 3 s, 6 s and 9 s
        for at in [3, 6, 9] {
            m.host_progress(host, t0 + s(at));
            assert!(m.expire(t0 + s(at) + Duration::from_millis(500)).is_empty());
        }
        assert_eq!(m.last_progress_of(host), Some(t0 + s(9)));
        // (a late sign never moves the record back)
        m.host_progress(host, t0 + s(8));
        assert_eq!(m.last_progress_of(host), Some(t0 + s(9)));
        // another host's progress is no sign of this one's
        m.host_progress(ip("10.9.9.9"), t0 + s(12));
        // (each wait is moved on as it ends: at 11 s, to 5 s past the last sign, at 9 s)
        assert_eq!(m.poll_timeout(), Some(t0 + s(11)));
        assert!(m.expire(t0 + s(11)).is_empty());
        assert_eq!(m.poll_timeout(), Some(t0 + s(14)));
        assert_eq!(
            m.on_request(key(1), 1, t0 + s(13)),
            RequestOutcome::Matched { req: 1, conn: 1 }
        );
        // quiet for a wait after its last request: the other one's wait ends
        assert!(m.expire(t0 + s(17)).is_empty());
        assert_eq!(m.expire(t0 + s(18)), vec![Expired::Accepted(key(2), 2)]);
    }

    #[test]
    fn a_request_flood_is_refused_not_stored() {
        let t0 = Instant::now();
        let cfg = MatcherConfig {
            max_requests: 4,
            ..Default::default()
        };
        let mut m: Matcher<u16, ()> = Matcher::new(cfg);
        for p in 0..4 {
            assert_eq!(m.on_request(key(p), p, t0), RequestOutcome::Pending);
        }
        assert_eq!(m.on_request(key(9), 9, t0), RequestOutcome::Full(9));
        assert_eq!(m.pending_requests(), 4);
    }
}
