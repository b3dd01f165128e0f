//! The host-wide part of the negative cache: peer hosts that did not answer an upgrade
//! (no RDMA there, or no path to it), shared by every process of this host.
//!
//! A process's own [`crate::upgrade::NegativeCache`] keeps it from trying a silent host again
//! for a while; but every new process starts with an empty one, so a host whose programs are
//! short-lived (a CLI run in a loop, a CGI, a cron job) would try each silent peer once per
//! process — an rdma_cm request that holds resources for seconds. This table, in a small file
//! every process of the user maps (the shim's run directory), carries the silence across
//! processes: at most one attempt per peer host per expiry, host-wide.
//!
//! Layout: [`WORDS`] 64-bit words, native endian (the file never leaves the host): word 0 is
//! [`MAGIC`]; then [`SLOTS`] slots of four words — a sequence word (odd while a writer is in
//! the slot), the peer's address as IPv6 (IPv4 mapped) in two words, and the time until which
//! it is silent (ms since the epoch; 0: free). Readers retry nothing: a slot that changes
//! under them is skipped, and a writer that finds a slot busy gives up — the table is advice,
//! and a missed entry costs one attempt. A hostile writer (the table's owner alone can write
//! it) can only keep upgrades off, never change a byte of a stream.

use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::{AtomicU64, Ordering};

/// Peer hosts the table holds (the entry expiring first is replaced when all are live).
pub const SLOTS: usize = 64;
/// Words of the table.
pub const WORDS: usize = 1 + 4 * SLOTS;
/// Word 0 of a valid table ("RSnegv01").
pub const MAGIC: u64 = u64::from_be_bytes(*b"RSnegv01");

fn key(ip: IpAddr) -> (u64, u64) {
    let v6 = match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a.to_ipv4_mapped().map_or(a, |v4| v4.to_ipv6_mapped()),
    };
    let b = u128::from_be_bytes(v6.octets());
    ((b >> 64) as u64, b as u64)
}

/// Marks a new table (all slots free). `words` must be zeroed and [`WORDS`] long.
pub fn init(words: &[AtomicU64]) {
    words[0].store(MAGIC, Ordering::Release);
}

/// Whether `words` is a table of this layout.
pub fn valid(words: &[AtomicU64]) -> bool {
    words.len() >= WORDS && words[0].load(Ordering::Acquire) == MAGIC
}

/// One slot read consistently: (address words, until), or `None` if a writer was in it.
fn read(words: &[AtomicU64], i: usize) -> Option<(u64, u64, u64)> {
    let s = &words[1 + 4 * i..1 + 4 * i + 4];
    let seq = s[0].load(Ordering::Acquire);
    if seq & 1 == 1 {
        return None;
    }
    let (hi, lo, until) = (
        s[1].load(Ordering::Acquire),
        s[2].load(Ordering::Acquire),
        s[3].load(Ordering::Acquire),
    );
    (s[0].load(Ordering::Acquire) == seq).then_some((hi, lo, until))
}

/// Writes slot `i` if no other writer is in it.
fn write(words: &[AtomicU64], i: usize, (hi, lo): (u64, u64), until: u64) {
    let s = &words[1 + 4 * i..1 + 4 * i + 4];
    let seq = s[0].load(Ordering::Acquire);
    if seq & 1 == 1
        || s[0]
            .compare_exchange(seq, seq + 1, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
    {
        return;
    }
    s[1].store(hi, Ordering::Release);
    s[2].store(lo, Ordering::Release);
    s[3].store(until, Ordering::Release);
    s[0].store(seq + 2, Ordering::Release);
}

/// Until when host `ip` is silent (ms since the epoch), if it is at `now_ms`.
pub fn silent_until(words: &[AtomicU64], ip: IpAddr, now_ms: u64) -> Option<u64> {
    if !valid(words) {
        return None;
    }
    let k = key(ip);
    (0..SLOTS).find_map(|i| match read(words, i) {
        Some((hi, lo, until)) if (hi, lo) == k && until > now_ms => Some(until),
        _ => None,
    })
}

/// Records host `ip` as silent until `until_ms` (never shortening a silence in force): in its
/// own slot, else a free or expired one, else the one expiring first.
pub fn record_silent(words: &[AtomicU64], ip: IpAddr, until_ms: u64, now_ms: u64) {
    if !valid(words) {
        return;
    }
    let k = key(ip);
    let mut free = None;
    let mut first: Option<(usize, u64)> = None;
    for i in 0..SLOTS {
        let Some((hi, lo, until)) = read(words, i) else {
            continue;
        };
        if (hi, lo) == k {
            if until < until_ms {
                write(words, i, k, until_ms);
            }
            return;
        }
        if until <= now_ms {
            free.get_or_insert(i);
        } else if first.is_none_or(|(_, u)| until < u) {
            first = Some((i, until));
        }
    }
    if let Some(i) = free.or(first.map(|(i, _)| i)) {
        write(words, i, k, until_ms);
    }
}

/// Host `ip` answered (an upgrade to it worked, or its shim declined one): it is not silent.
pub fn forget(words: &[AtomicU64], ip: IpAddr) {
    if !valid(words) {
        return;
    }
    let k = key(ip);
    for i in 0..SLOTS {
        if let Some((hi, lo, until)) = read(words, i) {
            if (hi, lo) == k && until != 0 {
                write(words, i, (0, 0), 0);
            }
        }
    }
}

/// The table's entries in force at `now_ms` (for `rdmashim doctor` and tests).
pub fn entries(words: &[AtomicU64], now_ms: u64) -> Vec<(IpAddr, u64)> {
    if !valid(words) {
        return Vec::new();
    }
    (0..SLOTS)
        .filter_map(|i| read(words, i))
        .filter(|&(_, _, until)| until > now_ms)
        .map(|(hi, lo, until)| {
            let a = Ipv6Addr::from(((u128::from(hi)) << 64 | u128::from(lo)).to_be_bytes());
            let ip = a.to_ipv4_mapped().map_or(IpAddr::V6(a), IpAddr::V4);
            (ip, until)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Vec<AtomicU64> {
        let t: Vec<AtomicU64> = (0..WORDS).map(|_| AtomicU64::new(0)).collect();
        init(&t);
        t
    }

    #[test]
    fn records_expire_and_are_forgotten() {
        let t = table();
        let a: IpAddr = "10.77.0.1".parse().unwrap();
        let b: IpAddr = "fd77::2".parse().unwrap();
        assert_eq!(silent_until(&t, a, 1000), None);
        record_silent(&t, a, 5000, 1000);
        record_silent(&t, b, 3000, 1000);
        assert_eq!(silent_until(&t, a, 1000), Some(5000));
        // the same host, as a mapped IPv6 address
        let mapped: IpAddr = "::ffff:10.77.0.1".parse().unwrap();
        assert_eq!(silent_until(&t, mapped, 1000), Some(5000));
        assert_eq!(silent_until(&t, b, 2999), Some(3000));
        assert_eq!(silent_until(&t, b, 3000), None, "expired");
        // never shortened
        record_silent(&t, a, 2000, 1000);
        assert_eq!(silent_until(&t, a, 1000), Some(5000));
        forget(&t, a);
        assert_eq!(silent_until(&t, a, 1000), None);
        assert_eq!(entries(&t, 1000), vec![(b, 3000)]);
    }

    #[test]
    fn a_full_table_replaces_the_entry_expiring_first() {
        let t = table();
        let ip = |i: usize| IpAddr::from([10, 0, (i >> 8) as u8, i as u8]);
        for i in 0..SLOTS {
            record_silent(&t, ip(i), 10_000 + i as u64, 0);
        }
        record_silent(&t, ip(999), 50_000, 0);
        assert_eq!(silent_until(&t, ip(0), 0), None, "the first to expire went");
        assert_eq!(silent_until(&t, ip(999), 0), Some(50_000));
        assert_eq!(silent_until(&t, ip(1), 0), Some(10_001));
        // an expired slot is taken before a live one
        record_silent(&t, ip(1000), 60_000, 10_002);
        assert_eq!(silent_until(&t, ip(1000), 10_002), Some(60_000));
        assert_eq!(
            silent_until(&t, ip(999), 10_002),
            Some(50_000),
            "a live entry stays"
        );
        assert_eq!(silent_until(&t, ip(63), 10_002), Some(10_063));
    }

    #[test]
    fn a_foreign_or_short_table_is_never_read() {
        let t: Vec<AtomicU64> = (0..WORDS).map(|_| AtomicU64::new(0)).collect();
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        record_silent(&t, a, 5000, 0);
        assert_eq!(silent_until(&t, a, 0), None);
        let short = table();
        assert_eq!(silent_until(&short[..WORDS - 1], a, 0), None);
        // a writer in a slot: skipped by readers, not overwritten by writers
        let t = table();
        record_silent(&t, a, 5000, 0);
        t[1].fetch_add(1, Ordering::AcqRel);
        assert_eq!(silent_until(&t, a, 0), None);
        record_silent(&t, a, 9000, 0);
        t[1].fetch_add(1, Ordering::AcqRel);
        assert_eq!(silent_until(&t, a, 0), Some(5000));
    }
}
