//! Pure decisions of the tracking logic: what entry a new fd gets. The hooks apply them.

use crate::fdtable::{flags, FdEntry, Kind};
use core::ffi::c_int;

/// The entry for a socket created by `socket(domain, ty, protocol)`: AF_INET/AF_INET6 +
/// SOCK_STREAM (ignoring the SOCK_NONBLOCK/SOCK_CLOEXEC bits) + protocol 0 or IPPROTO_TCP is a TCP
/// candidate; every other socket is `Other` (MPTCP, SCTP, UDP, AF_UNIX, ...).
pub fn socket_entry(domain: c_int, ty: c_int, protocol: c_int) -> FdEntry {
    let base = ty & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC);
    let mut f = 0;
    if ty & libc::SOCK_NONBLOCK != 0 {
        f |= flags::NONBLOCK;
    }
    if ty & libc::SOCK_CLOEXEC != 0 {
        f |= flags::CLOEXEC;
    }
    if domain == libc::AF_INET6 {
        f |= flags::V6;
    }
    let inet = domain == libc::AF_INET || domain == libc::AF_INET6;
    let tcp = protocol == 0 || protocol == libc::IPPROTO_TCP;
    let kind = if inet && base == libc::SOCK_STREAM && tcp {
        Kind::TcpCandidate
    } else {
        Kind::Other
    };
    FdEntry::new(kind, f, 0)
}

/// The entry of an fd accepted on a listener with entry `listener`, with accept4 `accept_flags`.
pub fn accepted_entry(listener: FdEntry, accept_flags: c_int) -> FdEntry {
    if listener.kind() != Kind::Listening {
        return FdEntry::new(Kind::Other, 0, 0);
    }
    let mut f = flags::ACCEPTED | (listener.flags() & flags::V6);
    if accept_flags & libc::SOCK_NONBLOCK != 0 {
        f |= flags::NONBLOCK;
    }
    if accept_flags & libc::SOCK_CLOEXEC != 0 {
        f |= flags::CLOEXEC;
    }
    FdEntry::new(Kind::TcpCandidate, f, 0)
}

/// The entry a duplicate of an fd with entry `e` gets (`cloexec`: whether the new fd has
/// FD_CLOEXEC). A connect still pending on the original is counted by the original only: the
/// copy is marked counted so a connection is never counted twice.
pub fn dup_entry(e: FdEntry, cloexec: bool) -> FdEntry {
    if e.is_unknown() {
        return e;
    }
    let mut d = e.without_flags(flags::CLOEXEC);
    if e.has(flags::CONNECTING) && !e.has(flags::COUNTED) {
        d = d
            .without_flags(flags::CONNECTING)
            .with_flags(flags::COUNTED);
    }
    if cloexec {
        d = d.with_flags(flags::CLOEXEC);
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockets() {
        use libc::*;
        let tcp = |d, t, p| socket_entry(d, t, p).kind();
        assert_eq!(tcp(AF_INET, SOCK_STREAM, 0), Kind::TcpCandidate);
        assert_eq!(
            tcp(
                AF_INET6,
                SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC,
                IPPROTO_TCP
            ),
            Kind::TcpCandidate
        );
        assert_eq!(tcp(AF_INET, SOCK_DGRAM, 0), Kind::Other);
        assert_eq!(tcp(AF_UNIX, SOCK_STREAM, 0), Kind::Other);
        assert_eq!(tcp(AF_INET, SOCK_STREAM, 262 /* MPTCP */), Kind::Other);
        assert_eq!(tcp(AF_INET, SOCK_SEQPACKET, 0), Kind::Other);
        let e = socket_entry(AF_INET6, SOCK_STREAM | SOCK_NONBLOCK, 0);
        assert!(e.has(flags::NONBLOCK | flags::V6) && !e.has(flags::CLOEXEC));
    }

    #[test]
    fn accepted_and_dup() {
        let l = FdEntry::new(Kind::Listening, flags::V6 | flags::NONBLOCK, 0);
        let a = accepted_entry(l, libc::SOCK_CLOEXEC);
        assert_eq!(a.kind(), Kind::TcpCandidate);
        assert_eq!(a.flags(), flags::ACCEPTED | flags::V6 | flags::CLOEXEC);
        assert_eq!(
            accepted_entry(FdEntry::new(Kind::Other, 0, 0), 0).kind(),
            Kind::Other
        );

        let pending = FdEntry::new(Kind::TcpCandidate, flags::CONNECTING | flags::CLOEXEC, 3);
        let d = dup_entry(pending, false);
        assert!(d.has(flags::COUNTED) && !d.has(flags::CONNECTING) && !d.has(flags::CLOEXEC));
        assert_eq!(d.slot(), 3);
        let fresh = FdEntry::new(Kind::TcpCandidate, 0, 0);
        assert_eq!(dup_entry(fresh, true), fresh.with_flags(flags::CLOEXEC));
        assert_eq!(dup_entry(FdEntry::UNKNOWN, true), FdEntry::UNKNOWN);
    }
}
