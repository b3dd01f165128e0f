//! Fork-per-connection servers: the child that serves an accepted connection takes its upgrade
//! over (docs/upgrade.md §7, "fork children that serve a connection"; protocol 2.4, Redirect).
//!
//! A server that accepts, then forks a process to serve the connection (PostgreSQL's
//! postmaster, inetd, git and rsync daemons) has written the connection's token, naming its
//! own rdma_cm listener, before the fork; the client's request comes to that listener. The
//! parent offers such a connection at the fork ([`offer`]: an accepted connection still
//! waiting for its request); the child whose program first uses it adopts it ([`adopt`]):
//! it makes a connection of its own from the copy of its parent's (the key, the 4-tuple, the
//! bytes already read and written), waits for the request on an rdma_cm listener of its own
//! (the one a prefork worker binds) and says so in the fork board. The parent answers the
//! client's request with a Redirect to that port, and the client dials the child.
//!
//! The parent redirects only after its own last close of the connection (until then it may use
//! the connection itself), and a connection it uses, or forks with again, is withdrawn: it
//! stays TCP in every process, as it would have without an offer (reason `forked`). So a byte
//! of the stream is never read or written by a process that does not own the upgrade.

use super::board::Board;
use super::{slot_parts, world, world_of, Conn, Phase};
use crate::fdtable::{Kind, TABLE};
use crate::reason::FallbackReason;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The longest the parent holds a client's request for an offered connection: for its own last
/// close and a child's adoption (which binds the child's rdma_cm listener: tens of
/// milliseconds under emulation). The client's dial allows 5 s in all.
pub(crate) const OFFER_HOLD: Duration = Duration::from_millis(2000);

/// Inherited slots this process adopted, and the slots of its own connections made for them
/// (a second thread that uses the connection meanwhile finds it here).
static ADOPTED: Mutex<Vec<(u64, u64)>> = Mutex::new(Vec::new());

/// The board and word index of connection `c` of this process, with its birth count.
fn board_of(c: &Conn) -> Option<(&'static Board, usize, u32)> {
    if !super::slot_is_ours(c.slot) {
        return None;
    }
    let b = super::world_if_created()?.board()?;
    Some((b, slot_parts(c.slot).1.index as usize, c.attrs.born()))
}

/// Before a fork: offers `c` (an accepted server connection waiting for its request) to the
/// child; false if it cannot be (no board; or it was offered at an earlier fork: two
/// processes may then hold it, and which one serves it is anybody's guess).
pub(crate) fn offer(c: &Conn) -> bool {
    if c.offered.load(Ordering::Acquire) || c.bound.is_none() || board_of(c).is_none() {
        return false;
    }
    c.offered.store(true, Ordering::Release);
    true
}

/// The offer of `c` ends without a redirect (called when the connection is decided otherwise,
/// see [`Conn::to_tcp`](super::Conn)): a child that adopted it will get no request.
pub(crate) fn withdraw(c: &Conn) {
    if let Some((b, index, born)) = board_of(c) {
        b.withdraw(index, born);
    }
}

/// In a fork child: the connection that took over inherited slot `slot` (born at `born`)
/// stays TCP after all (the program closed it, exec'd, changed its credentials, or its upgrade
/// failed): unless the parent already redirected the client here, the adoption is withdrawn,
/// so that the parent rejects the client's request at once instead of sending it to a
/// listener that will not answer it.
pub(crate) fn unadopt(slot: u64, born: u32) {
    let (g, key) = slot_parts(slot);
    let index = key.index as usize;
    if let Some(b) = world_of(g).and_then(|w| w.board()) {
        b.withdraw(index, born);
    }
}

/// The parent used an offered connection itself: it keeps it, on TCP (as every process that
/// holds it will).
pub(crate) fn reclaim(c: &Conn) {
    let mut g = c.lock();
    if c.offered.load(Ordering::Acquire) && matches!(g.phase, Phase::Awaiting) {
        c.fall_back(&mut g, FallbackReason::Forked);
    }
}

/// What the parent does with a client's request held for offered connection `c`.
pub(crate) enum Verdict {
    /// Hold on: the parent still has it open, or no child adopted it yet.
    Wait,
    /// A child took it: redirect the client to this port.
    Redirect(u16),
    /// It stays TCP: reject.
    Refuse,
}

/// Decides a held request for `c` (`closed`: the parent closed its last fd; `follows`: the
/// request set `REDIRECT`; `late`: the hold is over). A redirect is recorded in the board
/// before the client is told.
pub(crate) fn verdict(c: &Conn, closed: bool, follows: bool, late: bool) -> Verdict {
    if !c.offered.load(Ordering::Acquire) {
        return Verdict::Refuse;
    }
    let Some((b, index, born)) = board_of(c) else {
        return Verdict::Refuse;
    };
    match b.adopter(index, born) {
        Some(port) if closed && follows => {
            if b.redirect(index, born, port) {
                Verdict::Redirect(port)
            } else {
                Verdict::Refuse
            }
        }
        Some(_) if !follows => Verdict::Refuse,
        _ if late => Verdict::Refuse,
        _ if closed && !b.is_idle(index, born) => Verdict::Refuse,
        _ => Verdict::Wait,
    }
}

/// In a fork child, the program uses a connection of inherited fd-table slot `slot`: if its
/// parent offered it and nobody claimed it, this process takes its upgrade over (see the
/// module's documentation) and returns its own connection for it (every fd of the slot now
/// refers to that one). `None`: the inherited connection is to be had as before
/// ([`super::use_inherited`]).
pub(crate) fn adopt(slot: u64) -> Option<Arc<Conn>> {
    let (g, key) = slot_parts(slot);
    let index = key.index as usize;
    let old = world_of(g)?.conns.get(key)?;
    // (an inherited connection that was not offered, the usual case, takes no lock)
    if !old.offered.load(Ordering::Acquire) || old.fell_back.load(Ordering::Acquire) {
        return None;
    }
    // (no RDMA for this process: the parent's hold runs out and the client stays TCP)
    if crate::probe::host_reason().is_some() {
        return None;
    }
    let mut done = ADOPTED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(&(_, own)) = done.iter().find(|(s, _)| *s == slot) {
        return super::lookup(own);
    }
    let b = world_of(g)?.board()?;
    let born = old.attrs.born();
    let left = super::board::left(g);
    if born > left || !b.is_idle(index, born) {
        return None;
    }
    let bound = old.bound?;
    let (sent, received) = {
        // (the copy of a lock another thread of the parent held at the fork stays held)
        let og = old.try_lock()?;
        if og.closed || !matches!(og.phase, Phase::Awaiting) {
            return None;
        }
        (og.tcp_sent, og.tcp_received)
    };
    let mut fds = Vec::new();
    TABLE.for_each(0, u32::MAX, |fd, e| {
        if e.kind() == Kind::Upgraded && e.slot() == slot {
            fds.push(fd);
        }
    });
    let first = *fds.first()?;
    let w = world()?;
    let engine = w.engine()?;
    let port = engine.own_port(old.local, old.transport)?;
    let conn = w.insert(|own| {
        Conn::new(
            own,
            first,
            rdmashim_proto::Side::Server,
            old.peer,
            old.local,
            Phase::Awaiting,
            Some(bound),
            super::binding::TokenWait::None,
        )
    })?;
    {
        let mut cg = conn.lock();
        cg.tcp_sent = sent;
        cg.tcp_received = received;
    }
    if !b.adopt(index, born, port) {
        // (claimed meanwhile: by the parent, or another child)
        conn.fall_back(&mut conn.lock(), FallbackReason::Forked);
        w.remove(conn.slot);
        return None;
    }
    let _ = conn.adopted_from.set((slot, born));
    let mut n = 0;
    for fd in fds {
        let moved = TABLE.update(fd, |e| {
            (e.kind() == Kind::Upgraded && e.slot() == slot).then(|| e.with_slot(conn.slot))
        });
        n += u32::from(moved.is_some());
    }
    conn.fds.store(n.max(1), Ordering::Release);
    done.push((slot, conn.slot));
    crate::shim_log!(
        crate::config::Level::Debug,
        "server {} <- {}: took over from the parent process; its upgrade is served on rdma_cm port {port}",
        conn.local,
        conn.peer
    );
    engine.accepted(conn.clone());
    Some(conn)
}
