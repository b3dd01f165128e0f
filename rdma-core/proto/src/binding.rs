//! The binding of an upgrade to its TCP connection (`docs/protocol.md`, sections 2.8 and 2.9).
//!
//! An rdma_cm request travels beside the TCP connection, not inside it, so anyone on either host
//! can send one that names any 4-tuple. What binds an upgrade to the connection is a secret that
//! only the two holders of the TCP socket can know, because it crossed that connection:
//!
//! 1. A client shim that may upgrade a connection **marks its SYN** ([`MARK_TTL`], and on IPv4
//!    the DF bit clear). Only the process that calls `connect()` shapes that SYN; a plain stack
//!    does not send such a SYN ([`classify_syn`]).
//! 2. A server shim that can upgrade, and that accepted a connection whose SYN was marked,
//!    writes a [`Token`] as the very first bytes of its direction (before the application can
//!    write anything): 32 bytes holding a fresh random [`BindingKey`]. A SYN that was not marked
//!    gets no token, so a peer without the shim never sees a byte it did not ask for, and
//!    nothing anyone sends over rdma_cm can make a server emit one.
//! 3. The client shim takes the token out of the stream before its application reads
//!    ([`scan_token`]); its `ConnectRequest` carries [`request_tag`], an HMAC under that key over
//!    the TCP 4-tuple and the request. Only a reader of the server's TCP bytes has the key.
//! 4. The server accepts only a request whose tag verifies; its `AcceptReply` carries
//!    [`reply_tag`] over the request's tag and the reply, which only the server that wrote the
//!    token can compute. Neither side commits its direction to the ring before it verified the
//!    other's tag.
//!
//! Everything here is pure: the caller supplies the key's randomness, the saved SYN, the peeked
//! bytes and the addresses.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::error::DecodeError;

/// The binding's version, in the token (the handshake version that carries its tags).
pub const BINDING_VERSION: u8 = 2;
/// Length of a [`Token`] on the wire.
pub const TOKEN_LEN: usize = 32;
/// The token's first 8 bytes. The first byte (0xD3) is not printable ASCII, not a TLS record
/// type, not 0x00 or 0xFF; the whole is what no application protocol starts with.
pub const TOKEN_MAGIC: [u8; 8] = [0xD3, b'R', b'D', b'S', b'H', 0xB1, 0x4E, 0xD0];
/// Length of a [`BindingKey`].
pub const KEY_LEN: usize = 16;
/// Length of a [`Tag`] (HMAC-SHA256 truncated: 128 bits, RFC 2104 section 5 allows it).
pub const TAG_LEN: usize = 16;

/// The initial TTL (IPv4) or hop limit (IPv6) of a marked SYN.
pub const MARK_TTL: u8 = 201;
/// Hops a marked SYN may have crossed and still read as marked: it arrives with a TTL in
/// `MARK_TTL - MARK_HOPS ..= MARK_TTL`. Plain stacks start at 32, 64, 128 or 255; none of them
/// lands in that band within 50 hops (255 - 54 = 201).
pub const MARK_HOPS: u8 = 30;

/// A connection's binding secret: 128 random bits the server shim chose and sent only over that
/// TCP connection. Its `Debug` shows no byte of it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct BindingKey([u8; KEY_LEN]);

impl BindingKey {
    /// A key from random bytes (the caller's CSPRNG: this crate does no I/O).
    pub fn from_random(bytes: [u8; KEY_LEN]) -> Self {
        BindingKey(bytes)
    }

    /// The key's bytes (for the token).
    pub fn as_bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }
}

impl fmt::Debug for BindingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BindingKey(..)")
    }
}

/// A truncated HMAC. Checked in constant time with [`Tag::verify`] (`==` is for tests and
/// round trips).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Tag(pub [u8; TAG_LEN]);

impl Tag {
    /// The zero tag of a native handshake.
    pub const ZERO: Tag = Tag([0; TAG_LEN]);

    /// Constant-time equality (no early exit on the first differing byte).
    pub fn verify(&self, other: &Tag) -> bool {
        self.0
            .iter()
            .zip(other.0.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }
}

impl fmt::Debug for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tag(")?;
        for b in &self.0[..4] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "..)")
    }
}

/// The first bytes of the server's direction of a connection whose SYN was marked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Token {
    /// The connection's binding key.
    pub key: BindingKey,
    /// The rdma_cm port the client dials instead of the server's TCP port (flag
    /// [`TOKEN_DIAL_PORT`]): set by a server process whose rdma_cm listener is not on the
    /// service's port (a prefork worker: the service's port belongs to the process that made
    /// the listening socket). Never 0.
    pub dial_port: Option<u16>,
}

/// Token flag (bit 0): bytes 10–11 hold the rdma_cm port to dial (big-endian, not 0).
pub const TOKEN_DIAL_PORT: u8 = 0x01;

impl Token {
    /// The token's 32 bytes: magic, version, flags, the dial port (0 if none), 4 reserved zero
    /// bytes, the key.
    pub fn encode(&self) -> [u8; TOKEN_LEN] {
        let mut b = [0u8; TOKEN_LEN];
        b[..8].copy_from_slice(&TOKEN_MAGIC);
        b[8] = BINDING_VERSION;
        if let Some(p) = self.dial_port.filter(|p| *p != 0) {
            b[9] = TOKEN_DIAL_PORT;
            b[10..12].copy_from_slice(&p.to_be_bytes());
        }
        b[16..].copy_from_slice(&self.key.0);
        b
    }
}

/// What binds one handshake: nothing (a native stream), or a key and the TCP connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proof {
    /// A native stream: no TCP connection behind it (the handshake sets `NATIVE`).
    Native,
    /// An upgrade of the TCP connection `tuple`, whose key is `key`.
    Bound {
        /// The key the server sent in its token.
        key: BindingKey,
        /// The connection, as the sockets see it.
        tuple: TcpTuple,
    },
}

/// What the first bytes of a server's direction are, as far as `scan_token` can tell.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenScan {
    /// Nothing to decide on yet (no byte, or a proper prefix of a token: wait for more).
    NeedMore,
    /// Application bytes: the server sent no token (its end runs no shim, or cannot upgrade).
    /// Nothing is to be taken out of the stream.
    NotToken,
    /// A token: its [`TOKEN_LEN`] bytes are to be taken out of the stream.
    Token(Token),
    /// A token of ours that cannot be used (another version, unknown must-understand flags,
    /// reserved bytes set): its [`TOKEN_LEN`] bytes are still to be taken out of the stream,
    /// and the connection stays on TCP.
    Unusable(DecodeError),
}

/// Classifies the first bytes available at offset 0 of the server's direction (peeked, not
/// consumed). A token is written in one call on a fresh socket before any application byte, so
/// it arrives whole in the first segment; the caller may treat a lasting `NeedMore` on a short
/// input as application data (see `docs/protocol.md` 2.1).
pub fn scan_token(first: &[u8]) -> TokenScan {
    let n = first.len().min(TOKEN_MAGIC.len());
    if first.get(..n) != TOKEN_MAGIC.get(..n) {
        return TokenScan::NotToken;
    }
    let Some(t) = first.get(..TOKEN_LEN) else {
        return TokenScan::NeedMore;
    };
    if t[8] != BINDING_VERSION {
        return TokenScan::Unusable(DecodeError::UnsupportedVersion(t[8]));
    }
    // Flags: every bit is must-understand; only DIAL_PORT is defined.
    let flags = t[9];
    if flags & !TOKEN_DIAL_PORT != 0 {
        return TokenScan::Unusable(DecodeError::UnknownFlags(u16::from(flags)));
    }
    let port = u16::from_be_bytes([t[10], t[11]]);
    let dial_port = if flags & TOKEN_DIAL_PORT != 0 {
        if port == 0 {
            return TokenScan::Unusable(DecodeError::ZeroDialPort);
        }
        Some(port)
    } else {
        if let Some(i) = t[10..12].iter().position(|b| *b != 0) {
            return TokenScan::Unusable(DecodeError::ReservedNonZero { offset: 10 + i });
        }
        None
    };
    if let Some(i) = t[12..16].iter().position(|b| *b != 0) {
        return TokenScan::Unusable(DecodeError::ReservedNonZero { offset: 12 + i });
    }
    let mut key = [0u8; KEY_LEN];
    key.copy_from_slice(&t[16..]);
    TokenScan::Token(Token {
        key: BindingKey(key),
        dial_port,
    })
}

/// What a saved SYN (`TCP_SAVED_SYN`: the IP header and the TCP header) says of its sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SynVerdict {
    /// Sent by a shim that may upgrade this connection.
    Marked,
    /// Sent by a plain stack, or by a shim that will not upgrade it.
    Unmarked,
    /// Not an IPv4 or IPv6 header (or too short to be one).
    Unreadable,
}

/// Whether a TTL (hop limit) is in the marked band.
fn marked_ttl(ttl: u8) -> bool {
    (MARK_TTL - MARK_HOPS..=MARK_TTL).contains(&ttl)
}

/// Classifies a saved SYN: marked if its TTL (hop limit) is in the band below [`MARK_TTL`] and,
/// on IPv4, its DF bit is clear (every common stack sets DF on a SYN).
pub fn classify_syn(headers: &[u8]) -> SynVerdict {
    match headers.first().map(|b| b >> 4) {
        Some(4) if headers.len() >= 20 => {
            let df = headers[6] & 0x40 != 0;
            if marked_ttl(headers[8]) && !df {
                SynVerdict::Marked
            } else {
                SynVerdict::Unmarked
            }
        }
        Some(6) if headers.len() >= 40 => {
            if marked_ttl(headers[7]) {
                SynVerdict::Marked
            } else {
                SynVerdict::Unmarked
            }
        }
        _ => SynVerdict::Unreadable,
    }
}

/// The TCP connection an upgrade is bound to, as both ends see it (from `getsockname` /
/// `getpeername` of the TCP socket, never from rdma_cm).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TcpTuple {
    /// The client's address and port (the side that called `connect`).
    pub client: SocketAddr,
    /// The server's address and port (the side that called `accept`).
    pub server: SocketAddr,
}

impl TcpTuple {
    /// 36 bytes: each address as 16 bytes (IPv4 as IPv4-mapped IPv6, so a dual-stack socket
    /// and an IPv4 socket agree) followed by its port, client first.
    fn encode(&self) -> [u8; 36] {
        let mut b = [0u8; 36];
        for (i, a) in [self.client, self.server].iter().enumerate() {
            let ip = match a.ip() {
                IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                IpAddr::V6(v6) => v6,
            };
            b[i * 18..i * 18 + 16].copy_from_slice(&ip.octets());
            b[i * 18 + 16..i * 18 + 18].copy_from_slice(&a.port().to_be_bytes());
        }
        b
    }
}

const REQUEST_LABEL: &[u8] = b"rdmashim/2 connect request\0";
const REPLY_LABEL: &[u8] = b"rdmashim/2 accept reply\0";

fn hmac(key: &BindingKey, parts: &[&[u8]]) -> Tag {
    // HMAC accepts keys of any length; `new_from_slice` cannot fail for it.
    let Ok(mut m) = Hmac::<Sha256>::new_from_slice(&key.0) else {
        unreachable!("HMAC takes keys of any length")
    };
    for p in parts {
        m.update(p);
    }
    let full = m.finalize().into_bytes();
    let mut t = [0u8; TAG_LEN];
    t.copy_from_slice(&full[..TAG_LEN]);
    Tag(t)
}

/// The tag a `ConnectRequest` carries: HMAC-SHA256 under the connection's key over a label,
/// the TCP 4-tuple and the request's bytes before the tag (ports, nonce, the client's ring).
pub fn request_tag(key: &BindingKey, tuple: &TcpTuple, request: &[u8]) -> Tag {
    hmac(key, &[REQUEST_LABEL, &tuple.encode(), request])
}

/// The tag an `AcceptReply` carries: HMAC-SHA256 under the connection's key over a label, the
/// request's tag (and with it everything the request said) and the reply's bytes before the
/// tag (the echoed nonce, the server's ring).
pub fn reply_tag(key: &BindingKey, request_tag: &Tag, reply: &[u8]) -> Tag {
    hmac(key, &[REPLY_LABEL, &request_tag.0, reply])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> BindingKey {
        BindingKey::from_random([b; KEY_LEN])
    }

    fn tuple() -> TcpTuple {
        TcpTuple {
            client: "10.99.0.1:40000".parse().unwrap(),
            server: "10.99.0.1:6379".parse().unwrap(),
        }
    }

    #[test]
    fn token_round_trip_and_layout() {
        let t = Token {
            key: key(7),
            dial_port: None,
        };
        let b = t.encode();
        assert_eq!(&b[..8], &TOKEN_MAGIC);
        assert_eq!(b[8], 2);
        assert_eq!(&b[9..16], &[0; 7]);
        assert_eq!(&b[16..], &[7; 16]);
        assert_eq!(scan_token(&b), TokenScan::Token(t.clone()));
        // Followed by application bytes in the same segment: still the token.
        let mut more = b.to_vec();
        more.extend_from_slice(b"+OK\r\n");
        assert_eq!(scan_token(&more), TokenScan::Token(t));
    }

    #[test]
    fn token_with_a_dial_port() {
        let t = Token {
            key: key(9),
            dial_port: Some(0x9c41),
        };
        let b = t.encode();
        assert_eq!(b[9], TOKEN_DIAL_PORT);
        assert_eq!(&b[10..12], &[0x9c, 0x41]);
        assert_eq!(&b[12..16], &[0; 4]);
        assert_eq!(scan_token(&b), TokenScan::Token(t));
        // (port 0 is no port: encoded without the flag)
        let none = Token {
            key: key(9),
            dial_port: Some(0),
        }
        .encode();
        assert_eq!(&none[9..16], &[0; 7]);
    }

    #[test]
    fn scan_prefixes_and_application_bytes() {
        let b = Token {
            key: key(1),
            dial_port: None,
        }
        .encode();
        assert_eq!(scan_token(&[]), TokenScan::NeedMore);
        for n in 1..TOKEN_LEN {
            assert_eq!(scan_token(&b[..n]), TokenScan::NeedMore, "prefix {n}");
        }
        for app in [
            &b"+PONG\r\n"[..],
            b"SSH-2.0-OpenSSH",
            b"\x16\x03\x01",
            b"\xd3",
            b"\xd3R!",
        ] {
            let want = if TOKEN_MAGIC.starts_with(app) {
                TokenScan::NeedMore
            } else {
                TokenScan::NotToken
            };
            assert_eq!(scan_token(app), want, "{app:?}");
        }
        let mut v = b;
        v[8] = 3;
        assert_eq!(
            scan_token(&v),
            TokenScan::Unusable(DecodeError::UnsupportedVersion(3))
        );
        let mut f = b;
        f[9] = 0x80;
        assert_eq!(
            scan_token(&f),
            TokenScan::Unusable(DecodeError::UnknownFlags(0x80))
        );
        let mut p = b;
        p[11] = 1;
        assert_eq!(
            scan_token(&p),
            TokenScan::Unusable(DecodeError::ReservedNonZero { offset: 11 })
        );
        let mut z = b;
        z[9] = TOKEN_DIAL_PORT;
        assert_eq!(
            scan_token(&z),
            TokenScan::Unusable(DecodeError::ZeroDialPort)
        );
        let mut r = b;
        r[13] = 1;
        assert_eq!(
            scan_token(&r),
            TokenScan::Unusable(DecodeError::ReservedNonZero { offset: 13 })
        );
    }

    fn ipv4_syn(ttl: u8, df: bool) -> Vec<u8> {
        let mut h = vec![0u8; 40];
        h[0] = 0x45;
        h[6] = if df { 0x40 } else { 0 };
        h[8] = ttl;
        h[9] = 6;
        h
    }

    fn ipv6_syn(hops: u8) -> Vec<u8> {
        let mut h = vec![0u8; 60];
        h[0] = 0x60;
        h[6] = 6;
        h[7] = hops;
        h
    }

    #[test]
    fn syn_marker() {
        assert_eq!(classify_syn(&ipv4_syn(201, false)), SynVerdict::Marked);
        assert_eq!(classify_syn(&ipv4_syn(171, false)), SynVerdict::Marked);
        assert_eq!(classify_syn(&ipv4_syn(170, false)), SynVerdict::Unmarked);
        assert_eq!(classify_syn(&ipv4_syn(202, false)), SynVerdict::Unmarked);
        // The marker needs both halves on IPv4.
        assert_eq!(classify_syn(&ipv4_syn(201, true)), SynVerdict::Unmarked);
        // Plain stacks, at any distance up to 50 hops.
        for init in [32u8, 60, 64, 128, 255] {
            for hops in 0..=50u8 {
                let ttl = init.saturating_sub(hops);
                for df in [false, true] {
                    assert_eq!(
                        classify_syn(&ipv4_syn(ttl, df)),
                        SynVerdict::Unmarked,
                        "init {init} hops {hops}"
                    );
                }
                assert_eq!(classify_syn(&ipv6_syn(ttl)), SynVerdict::Unmarked);
            }
        }
        assert_eq!(classify_syn(&ipv6_syn(195)), SynVerdict::Marked);
        assert_eq!(classify_syn(&[]), SynVerdict::Unreadable);
        assert_eq!(classify_syn(&[0x45; 19]), SynVerdict::Unreadable);
        assert_eq!(classify_syn(&[0x60; 39]), SynVerdict::Unreadable);
        assert_eq!(classify_syn(&[0x30; 60]), SynVerdict::Unreadable);
    }

    #[test]
    fn tuple_encoding_is_family_neutral() {
        let v4 = tuple();
        let mapped = TcpTuple {
            client: "[::ffff:10.99.0.1]:40000".parse().unwrap(),
            server: "[::ffff:10.99.0.1]:6379".parse().unwrap(),
        };
        assert_eq!(v4.encode(), mapped.encode());
        assert_eq!(&v4.encode()[16..18], &40000u16.to_be_bytes());
        assert_eq!(&v4.encode()[34..36], &6379u16.to_be_bytes());
    }

    /// Pinned against Python's hmac module:
    /// `hmac.new(bytes([7])*16, label + tuple + msg, sha256).digest()[:16]`.
    #[test]
    fn tags_match_the_reference() {
        let req = request_tag(&key(7), &tuple(), b"request bytes");
        assert_eq!(hex(&req.0), REQUEST_VECTOR);
        let rep = reply_tag(&key(7), &req, b"reply bytes");
        assert_eq!(hex(&rep.0), REPLY_VECTOR);
    }

    const REQUEST_VECTOR: &str = "2cabca980f31a93eb8f2aa07dd091785";
    const REPLY_VECTOR: &str = "61b98e202d4140907daf7b1e505d7d7c";

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn tags_bind_every_input() {
        let t = tuple();
        let base = request_tag(&key(7), &t, b"abc");
        assert!(base.verify(&request_tag(&key(7), &t, b"abc")));
        assert!(!base.verify(&request_tag(&key(8), &t, b"abc")), "key");
        assert!(!base.verify(&request_tag(&key(7), &t, b"abd")), "request");
        for other in [
            TcpTuple {
                client: "10.99.0.1:40001".parse().unwrap(),
                ..t
            },
            TcpTuple {
                server: "10.99.0.1:6380".parse().unwrap(),
                ..t
            },
            TcpTuple {
                client: "10.99.0.2:40000".parse().unwrap(),
                ..t
            },
            TcpTuple {
                client: t.server,
                server: t.client,
            },
        ] {
            assert!(
                !base.verify(&request_tag(&key(7), &other, b"abc")),
                "{other:?}"
            );
        }
        // A request tag can never pass as a reply tag, nor the other way round.
        let rep = reply_tag(&key(7), &base, b"abc");
        assert!(!rep.verify(&base));
        assert!(!rep.verify(&reply_tag(&key(7), &Tag([0; TAG_LEN]), b"abc")));
        assert_eq!(format!("{:?}", key(9)), "BindingKey(..)");
    }
}
