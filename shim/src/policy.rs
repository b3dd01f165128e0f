//! The configuration file's rules, asked where the upgrade decides to try a connection: a
//! client at `connect` (before its SYN is marked: a connection the rules deny is never
//! marked, so the server sees a plain client), a server at `accept` (before its token is
//! written: its client sees a plain server). The program rules were decided at load
//! (`config.rs`; a denied program never gets here: `probe::process_reason` is `policy`);
//! what is left is a short list walked without allocation ([`crate::rules::Resolved`]).

use crate::rules::{Conn, Verdict};
use core::ffi::c_int;
use std::net::SocketAddr;

/// The rules' verdict for a connect of `fd` to `peer`. This end's port is asked of the
/// kernel only if a rule looks at it (before the connect it is the port the socket was
/// bound to, or 0).
#[inline]
pub(crate) fn client(fd: c_int, peer: SocketAddr) -> Verdict {
    let p = &crate::config::get().policy;
    if p.allows_all() {
        return Verdict::DEFAULT;
    }
    let local_port = if p.wants_local_port {
        crate::net::local_addr(fd).map_or(0, |a| a.port())
    } else {
        0
    };
    p.decide(&Conn {
        peer: peer.ip(),
        local_port,
        remote_port: peer.port(),
        server: false,
    })
}

/// The rules' verdict for a connection accepted from `peer` on `local`.
#[inline]
pub(crate) fn server(peer: SocketAddr, local: SocketAddr) -> Verdict {
    let p = &crate::config::get().policy;
    if p.allows_all() {
        return Verdict::DEFAULT;
    }
    p.decide(&Conn {
        peer: peer.ip(),
        local_port: local.port(),
        remote_port: peer.port(),
        server: true,
    })
}
