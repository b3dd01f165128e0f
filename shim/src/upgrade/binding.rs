//! The shim's part of binding an upgrade to its TCP connection (`docs/protocol.md` 2.9): the
//! client marks its SYN, the server reads the SYN and writes the token as the first bytes of its
//! direction, the client takes the token out of the stream before its application reads. The
//! pure parts (the token's format, the SYN's classification, the tags) are in
//! `rdmashim_proto::binding`.

use crate::net;
use crate::reason::FallbackReason;
use core::ffi::c_int;
use rdmashim_proto::binding::{
    classify_syn, scan_token, SynVerdict, Token, TokenScan, BINDING_VERSION, KEY_LEN, MARK_TTL,
    TOKEN_LEN, TOKEN_MAGIC,
};
use rdmashim_proto::DecodeError;
use rdmashim_proto::{BindingKey, TcpTuple};
use std::net::SocketAddr;

/// A client's wait for the server's token (under the connection's lock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TokenWait {
    /// Not a client that waits for one (a server; or decided).
    None,
    /// The SYN was marked; the first bytes of the server's direction are not seen yet.
    Awaiting,
    /// The token came: the key the handshake's tags are made with, and the rdma_cm port to
    /// dial if it is not the server's TCP port.
    Got(BindingKey, Option<u16>),
}

/// A client socket's options as they were before its SYN was marked.
pub(crate) struct Mark {
    ttl: (c_int, c_int, c_int),
    pmtu: Option<c_int>,
}

/// Marks the SYN that the kernel's `connect()` of `fd` to `peer` is about to send: TTL (hop
/// limit) [`MARK_TTL`] and, on IPv4, DF clear. `None` if an option cannot be read or set (the
/// connection then goes unmarked: it stays TCP). Undo with [`unmark`] right after the call.
pub(crate) fn mark(fd: c_int, peer: SocketAddr) -> Option<Mark> {
    let v4 = match peer {
        SocketAddr::V4(_) => true,
        SocketAddr::V6(a) => a.ip().to_ipv4_mapped().is_some(),
    };
    // (an AF_INET6 socket talking to a v4-mapped address sends IPv4: its IP-level options
    // apply, as in ip(7))
    let (level, name) = if v4 {
        (libc::IPPROTO_IP, libc::IP_TTL)
    } else {
        (libc::IPPROTO_IPV6, libc::IPV6_UNICAST_HOPS)
    };
    let ttl = net::get_int_opt(fd, level, name).ok()?;
    let pmtu = if v4 {
        Some(net::get_int_opt(fd, libc::IPPROTO_IP, libc::IP_MTU_DISCOVER).ok()?)
    } else {
        None
    };
    let m = Mark {
        ttl: (level, name, ttl),
        pmtu,
    };
    let set = net::set_int_opt(fd, level, name, c_int::from(MARK_TTL)).is_ok()
        && (!v4
            || net::set_int_opt(
                fd,
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                libc::IP_PMTUDISC_DONT,
            )
            .is_ok());
    if !set {
        unmark(fd, m);
        return None;
    }
    Some(m)
}

/// Puts back what [`mark`] changed (the values read before; the SYN is on its way).
pub(crate) fn unmark(fd: c_int, m: Mark) {
    let (level, name, ttl) = m.ttl;
    let _ = net::set_int_opt(fd, level, name, ttl);
    if let Some(p) = m.pmtu {
        let _ = net::set_int_opt(fd, libc::IPPROTO_IP, libc::IP_MTU_DISCOVER, p);
    }
}

/// Server: the listening socket `fd` keeps each connection's SYN for [`on_accept`] (set before
/// `listen()`, so no SYN arrives unsaved), or stops (`on = false`, when it will have no rdma_cm
/// side after all).
pub(crate) fn save_syns(fd: c_int, on: bool) -> bool {
    net::set_int_opt(fd, libc::IPPROTO_TCP, libc::TCP_SAVE_SYN, c_int::from(on)).is_ok()
}

/// Server: the application accepted `nfd` (from `peer`, on `local`). If its SYN was marked,
/// draws the connection's key and writes the token — before `accept()` returns, so before any
/// byte of the application — and returns the key and the 4-tuple the client's request must
/// be tagged for. Else why the connection stays TCP. `dial_port` (asked only for a marked
/// SYN) says where the client is to dial: `None`, the TCP port; or the port the token names.
pub(crate) fn on_accept(
    nfd: c_int,
    peer: SocketAddr,
    local: SocketAddr,
    dial_port: impl FnOnce() -> Result<Option<u16>, FallbackReason>,
) -> Result<(BindingKey, TcpTuple), FallbackReason> {
    // An IPv6 header with a hop-by-hop or routing extension and a TCP header with options
    // fits in far less.
    let mut syn = [0u8; 320];
    let n = net::saved_syn(nfd, &mut syn).unwrap_or(0);
    if classify_syn(&syn[..n]) != SynVerdict::Marked {
        return Err(FallbackReason::PlainPeer);
    }
    let dial_port = dial_port()?;
    let mut k = [0u8; KEY_LEN];
    crate::sys::random(&mut k).map_err(|_| FallbackReason::Resources)?;
    let key = BindingKey::from_random(k);
    let mut token = Token { key, dial_port }.encode();
    if let Some(v) = crate::fault::spoken_version() {
        token[8] = v;
    }
    // A fresh socket's send buffer is empty and far larger than 32 bytes: the token goes out
    // whole, as the head of the first segment, or (the client reset already) not at all.
    match net::send(nfd, &token, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) {
        Ok(TOKEN_LEN) => {}
        Ok(_) => return Err(FallbackReason::Resources),
        Err(_) => return Err(FallbackReason::ClosedEarly),
    }
    Ok((
        key,
        TcpTuple {
            client: peer,
            server: local,
        },
    ))
}

/// What the first bytes of the server's direction said.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Seen {
    /// Nothing (or too little) to tell yet.
    Nothing,
    /// The token: taken out of the stream.
    Token(Token),
    /// A token that cannot be used (of another version, or malformed): taken out; the
    /// connection stays TCP.
    Unusable(DecodeError),
    /// Application bytes (left in the stream), or the end of the stream: no shim there.
    Plain,
    /// The connection failed (reset) before its first byte.
    Ended,
}

/// Client: looks at the first bytes of the server's direction on socket `fd` (an fd of the
/// connection's socket, never blocking), and takes a token out of the stream. Call with the
/// connection's lock held and while it is [`TokenWait::Awaiting`], before any byte of that
/// direction is read for the application.
pub(crate) fn look(fd: c_int) -> Seen {
    let mut buf = [0u8; TOKEN_LEN];
    let n = match net::recv(fd, &mut buf, libc::MSG_PEEK | libc::MSG_DONTWAIT) {
        // (the end before any byte: no token came)
        Ok(0) => return Seen::Plain,
        Ok(n) => n,
        Err(e) if e.0 == libc::EAGAIN || e.0 == libc::EINTR => return Seen::Nothing,
        // (a reset: the application reads the error itself)
        Err(_) => return Seen::Ended,
    };
    let take = |buf: &mut [u8; TOKEN_LEN]| {
        net::recv(fd, buf, libc::MSG_DONTWAIT).is_ok_and(|m| m == TOKEN_LEN)
    };
    match scan(&mut buf, n) {
        TokenScan::Token(t) => {
            if take(&mut buf) {
                Seen::Token(t)
            } else {
                Seen::Nothing
            }
        }
        TokenScan::Unusable(e) => {
            take(&mut buf);
            Seen::Unusable(e)
        }
        TokenScan::NotToken => Seen::Plain,
        // A token is written whole on an empty socket and arrives in one segment: a prefix
        // shorter than the magic is the start of the application's bytes.
        TokenScan::NeedMore if n < TOKEN_MAGIC.len() => Seen::Plain,
        // The rest of a token is on its way — unless the stream ended: then these bytes are
        // all there is, and they are the application's.
        TokenScan::NeedMore if net::poll_now(fd, libc::POLLRDHUP) != 0 => Seen::Plain,
        TokenScan::NeedMore => Seen::Nothing,
    }
}

/// [`scan_token`] of the `n` bytes peeked into `buf`, as this shim understands tokens: of
/// [`BINDING_VERSION`], or of the version `RDMASHIM_FAULT=version:N` makes it speak (and then
/// only those: a shim of another release).
fn scan(buf: &mut [u8; TOKEN_LEN], n: usize) -> TokenScan {
    match crate::fault::spoken_version() {
        Some(v) if n > 8 && buf[..8] == TOKEN_MAGIC => {
            if buf[8] != v {
                return TokenScan::Unusable(DecodeError::UnsupportedVersion(buf[8]));
            }
            buf[8] = BINDING_VERSION;
            scan_token(&buf[..n])
        }
        _ => scan_token(&buf[..n]),
    }
}
