//! Readiness of connections under the upgrade: poll/ppoll/select/pselect and epoll.
//!
//! Each connection has two eventfds (`Conn::rd_efd`, `Conn::wr_efd`) whose level is kept equal
//! to the ring side's readiness (readable/EOF/error; room to write/error) by whoever changes
//! it (`Conn::sync_efds`), and which get a fresh write on every new arrival (a new edge for
//! edge-triggered waiters).
//!
//! - poll/select: the call is rebuilt: the socket keeps the events of the directions still on
//!   TCP, the eventfds stand for the directions on the ring; the answer is recomputed from the
//!   connection after the wait.
//! - epoll: `epoll_ctl` on an fd under the upgrade registers the socket *and* the eventfds the
//!   interest needs, all with a tagged `data` (magic, source, fd), and remembers the
//!   application's events and data ([`Registry`]). `epoll_wait` turns tagged events back into
//!   the application's data with the connection's real readiness, merges the sources of one fd,
//!   drops sources that report nothing the application asked for, honours EPOLLONESHOT, and
//!   waits again if nothing was left. When this side's writing moves to the ring, EPOLLOUT is
//!   taken off the socket's registrations (a socket that sends nothing is always writable).
//!
//! Deferred registrations: event loops such as redis' `ae` (redis-benchmark) take a connection
//! out of their set and put it back, for reading or for writing, on every request: four
//! `epoll_ctl` calls, each a system call on one of the connection's eventfds. A plain
//! level-triggered registration that needs no socket (both directions on the ring) is
//! therefore kept in user space as long as it can be:
//! - an ADD or MOD that wants an eventfd the set does not hold leaves the registration
//!   *dirty* (no system call); the next wait on the set looks at its readiness itself
//!   ([`user_events`]): ready, it is reported from here (and looked at again next time, as a
//!   level-triggered registration is); not ready, its eventfds join the set then, before the
//!   wait can sleep;
//! - an eventfd the application no longer wants (DEL, or a MOD without its direction) stays in
//!   the set ([`Linger`]): the next registration that wants it takes it back without a system
//!   call, and if it reports an event first, it leaves the set then ([`translate_epoll`]);
//! - a thread asleep on the set must learn of a new registration: an ADD or MOD while one
//!   sleeps ([`SetSpin::sleepers`]) makes its kernel registrations at once, and a set that is
//!   itself watched (poll, select, or nested in another epoll set: [`observe_set`]) never
//!   defers again.
//!
//! Edge-triggered, one-shot and exclusive registrations are made in the kernel at once, as
//! before.
//!
//! Lock order: a connection's lock, then the registry's. Never the reverse: `epoll_wait`
//! copies what it needs out of the registry before it looks at a connection.

use super::{Conn, Inner, Phase};
use crate::net;
use crate::outcome::Errno;
use crate::spin::wait::{spin_wait_interruptible, Turn};
use crate::spin::SpinGate;
use core::ffi::c_int;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const TAG_MAGIC: u64 = 0x5d4d;
const SRC_SOCK: u64 = 0;
const SRC_RD: u64 = 1;
const SRC_WR: u64 = 2;
/// The link's completion channel, in the application's epoll set (see [`epoll_ctl`]).
const SRC_COMP: u64 = 3;

/// An application's own registration whose data carries [`TAG_MAGIC`] (see [`AppTag`]).
const SRC_APP: u64 = 4;

fn tag(src: u64, fd: c_int) -> u64 {
    (TAG_MAGIC << 48) | (src << 40) | u64::from(fd as u32)
}

fn untag(data: u64) -> Option<(u64, c_int)> {
    looks_tagged(data).then_some(((data >> 40) & 0xff, data as u32 as c_int))
}

/// Whether epoll data could be one of the shim's tags (an application's, too: [`AppTag`]).
pub fn looks_tagged(data: u64) -> bool {
    data >> 48 == TAG_MAGIC
}

/// An application's registration, of an fd the upgrade does not manage, whose data carries
/// the tags' magic in its top 16 bits: it is made under a tag of its own ([`SRC_APP`]) and
/// given its data back when its events come, so that no event of the application is ever
/// taken for one of the shim's — which would drop it, or report it as another fd's — and
/// none of the shim's for the application's. Rare (an application's data is mostly a small
/// number or a pointer, whose top bits are zero), so a list under a lock does.
struct AppTag {
    epfd: c_int,
    fd: c_int,
    data: u64,
}

static APP_TAGS: std::sync::Mutex<Vec<AppTag>> = std::sync::Mutex::new(Vec::new());
/// How many [`APP_TAGS`] there are: while none, the hooks' fast paths need not look.
static APP_TAGGED: AtomicUsize = AtomicUsize::new(0);

/// Whether no application registration is under a tag of the shim's.
pub fn no_app_tags() -> bool {
    APP_TAGGED.load(Ordering::Relaxed) == 0
}

/// epoll_ctl for an fd the upgrade does not manage, when its data looks like a tag or one of
/// its registrations is under one ([`AppTag`]); `None` to pass the call through. `ev`: the
/// application's events and data (none for DEL).
pub fn epoll_ctl_app(
    epfd: c_int,
    op: c_int,
    fd: c_int,
    ev: Option<(u32, u64)>,
) -> Option<Result<(), Errno>> {
    let mut t = APP_TAGS.lock().unwrap_or_else(|p| p.into_inner());
    let at = t.iter().position(|a| a.epfd == epfd && a.fd == fd);
    let r = match (op, ev) {
        (libc::EPOLL_CTL_ADD | libc::EPOLL_CTL_MOD, Some((events, data))) if looks_tagged(data) => {
            let r = net::epoll_ctl(epfd, op, fd, events, tag(SRC_APP, fd));
            if r.is_ok() {
                match at {
                    Some(i) => t[i].data = data,
                    None => t.push(AppTag { epfd, fd, data }),
                }
            }
            r
        }
        _ => {
            // A DEL, or new data that needs no tag, for a registration under one (or one
            // the kernel dropped with its file: an ADD under the same number finds it).
            let i = at?;
            let (events, data) = ev.unwrap_or((0, 0));
            let r = net::epoll_ctl(epfd, op, fd, events, data);
            if r.is_ok() || op == libc::EPOLL_CTL_DEL {
                t.swap_remove(i);
            }
            r
        }
    };
    APP_TAGGED.store(t.len(), Ordering::Relaxed);
    Some(r)
}

/// The application's data of its registration of `fd` in `epfd` under a tag, if any.
fn app_tag_data(epfd: c_int, fd: c_int) -> Option<u64> {
    let t = APP_TAGS.lock().unwrap_or_else(|p| p.into_inner());
    t.iter()
        .find(|a| a.epfd == epfd && a.fd == fd)
        .map(|a| a.data)
}

const EV_IN: u32 = libc::EPOLLIN as u32;
const EV_OUT: u32 = libc::EPOLLOUT as u32;
const EV_RDHUP: u32 = libc::EPOLLRDHUP as u32;
const EV_PRI: u32 = libc::EPOLLPRI as u32;
const EV_ERR: u32 = libc::EPOLLERR as u32;
const EV_HUP: u32 = libc::EPOLLHUP as u32;
const EV_ET: u32 = libc::EPOLLET as u32;
const EV_ONESHOT: u32 = libc::EPOLLONESHOT as u32;

/// One registration of an fd under the upgrade in an epoll set.
struct Reg {
    conn: Arc<Conn>,
    /// The application's events (with its flags) and data.
    events: u32,
    data: u64,
    /// EPOLLONESHOT fired: nothing more until EPOLL_CTL_MOD.
    disarmed: bool,
    /// The link's completion channel fd, if this registration put it into the set (one
    /// registration per connection and set holds it).
    comp: Option<c_int>,
    /// The socket is in the set too ([`needs_socket`]).
    sock: bool,
    /// Which of the connection's eventfds the kernel's set holds for this registration
    /// ([`KIN_RD`], [`KIN_WR`]), and the flags (EPOLLET, EPOLLONESHOT) they were registered
    /// with.
    kin: u8,
    kin_flags: u32,
}

/// The kernel's set holds a registration's read eventfd.
const KIN_RD: u8 = 1;
/// The kernel's set holds a registration's write eventfd.
const KIN_WR: u8 = 2;

/// The eventfds a registration for `app` wants in the kernel's set (none while the
/// connection's eventfds are retired: `efds` false).
fn kin_for(app: u32, efds: bool) -> u8 {
    if !efds {
        return 0;
    }
    (if wants_rd(app) { KIN_RD } else { 0 }) | (if wants_wr(app) { KIN_WR } else { 0 })
}

/// The eventfd of `c` that `bit` names, and its tag's source.
fn efd_of(c: &Conn, bit: u8) -> (c_int, u64) {
    if bit == KIN_RD {
        (c.rd_efd, SRC_RD)
    } else {
        (c.wr_efd, SRC_WR)
    }
}

/// Eventfds of a connection left in an epoll set under the tags of `fd` after the
/// application's registration no longer wants them (see the module documentation, "Deferred registrations"): plain level-triggered
/// registrations, taken back without a system call by the next registration of the same
/// connection and fd that wants them, or taken out of the set when one reports an event no
/// registration wants.
struct Linger {
    conn: Arc<Conn>,
    kin: u8,
}

/// Whether a registration of `c` for `app` needs the socket in the set, besides the
/// eventfds. Not once both directions are on the ring and the registration wants reading or
/// writing: the socket then carries nothing the eventfds do not (their levels include the
/// end, the error and the hang-up, and the peer's death reaches the connection through
/// rdma_cm and the CQ, as it does for a blocking read, which never polls the socket), and
/// event loops that DEL and ADD a connection on every request (redis' `ae`) pay one system
/// call for each instead of two. EPOLLEXCLUSIVE keeps the socket (the kernel validates it).
fn needs_socket(g: &Inner, app: u32) -> bool {
    // (a connection switching back to TCP has its eventfds retired: the socket it is)
    let switched = g.committed
        && g.back == super::Back::None
        && match &g.phase {
            Phase::Linked(l) => {
                let r = l.conn().readiness();
                !r.read_via_tcp && !r.write_via_tcp
            }
            _ => false,
        };
    !switched || !(wants_rd(app) || wants_wr(app)) || app & libc::EPOLLEXCLUSIVE as u32 != 0
}

/// The process's epoll registrations of fds under the upgrade, by (epoll fd, fd).
#[derive(Default)]
pub struct Registry {
    regs: HashMap<(c_int, c_int), Reg>,
    /// Completion channels left in a set by the EPOLL_CTL_DEL of their connection's last
    /// registration there (see [`Parked`]).
    parked: Vec<Parked>,
    /// By epoll set: its connections over shared memory, each with its number of
    /// registrations there — what a busy-polling wait on the set looks at
    /// ([`take_arrivals`]).
    local: HashMap<c_int, Vec<(Arc<Conn>, u32)>>,
    /// Connections over shared memory whose inbox an application thread left unarmed
    /// ([`list_unarmed`]), for the next epoll sleep to arm ([`arm_for_epoll`]).
    unarmed: Vec<Arc<Conn>>,
    /// Eventfds no registration wants that stay in their sets, by (epoll fd, fd)
    /// ([`Linger`]).
    linger: HashMap<(c_int, c_int), Linger>,
    /// The dirty registrations, by (epoll fd, fd): deferred, each wants an eventfd the
    /// kernel's set does not hold yet (see the module documentation, "Deferred
    /// registrations"); counted by set in [`SetSpin::dirty`].
    dirty: HashSet<(c_int, c_int)>,
}

/// A completion channel that stays in an application's epoll set after the EPOLL_CTL_DEL
/// of its connection's last registration in that set, until that set's next wait (or a
/// poll-family call on the connection, its close, the set's close). Event loops that stop
/// and start wanting a connection's events by DEL and ADD — redis' `ae` does it twice per
/// request, libuv whenever a stream stops reading — would otherwise move the channel out of
/// the set and back into the engine's, and back again, each time: 4 system calls, plus arming
/// the CQ. A re-ADD before the next wait takes the channel back as it is. While parked, the
/// channel is still the application's (`Conn::comp_in_app`): a blocked data call waits on it
/// itself, and a completion wakes the set's `epoll_wait`, which lets the channel go.
struct Parked {
    epfd: c_int,
    /// The fd the channel's tag names.
    fd: c_int,
    conn: Arc<Conn>,
    comp: c_int,
}

/// How many channels are parked (a wait checks it before it locks the registry).
static PARKED: AtomicUsize = AtomicUsize::new(0);

/// What an epoll set's `epoll_wait` needs to know to busy-poll before it sleeps (see
/// [`spin_gate`]), by epoll fd number.
struct SetSpin {
    /// Registrations of fds under the upgrade in the set (kept by [`Registry::put`] and
    /// [`Registry::take`], under the registry's lock).
    conns: AtomicUsize,
    /// Whether spinning pays for this set's waits (learnt from its own spins).
    gate: SpinGate,
    /// Dirty registrations in the set (see the module documentation, "Deferred
    /// registrations"; kept under the registry's lock).
    dirty: AtomicUsize,
    /// Threads between their last look at the set's dirty registrations and the end of their
    /// sleep on it.
    sleepers: AtomicUsize,
    /// The set is watched by other means than its own `epoll_wait` ([`observe_set`]): its
    /// registrations are made in the kernel at once.
    observed: AtomicBool,
}

/// Epoll fds below this number get a [`SetSpin`] (event loops create their set early, and
/// their fd numbers are small); a set above it never spins.
const SET_SPIN_LEN: usize = 1024;

static SET_SPIN: [SetSpin; SET_SPIN_LEN] = [const {
    SetSpin {
        conns: AtomicUsize::new(0),
        gate: SpinGate::new(),
        dirty: AtomicUsize::new(0),
        sleepers: AtomicUsize::new(0),
        observed: AtomicBool::new(false),
    }
}; SET_SPIN_LEN];

fn set_spin(epfd: c_int) -> Option<&'static SetSpin> {
    usize::try_from(epfd).ok().and_then(|i| SET_SPIN.get(i))
}

impl Registry {
    /// Counts registration `(epfd, fd)` dirty or not ([`Registry::dirty`] and its set's
    /// [`SetSpin::dirty`]).
    fn mark_dirty(&mut self, epfd: c_int, fd: c_int, on: bool) {
        let changed = if on {
            self.dirty.insert((epfd, fd))
        } else {
            self.dirty.remove(&(epfd, fd))
        };
        if let (true, Some(s)) = (changed, set_spin(epfd)) {
            if on {
                s.dirty.fetch_add(1, Ordering::SeqCst);
            } else {
                s.dirty.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    /// The fds of set `epfd`'s dirty registrations, with their connections.
    fn dirty_of(&self, epfd: c_int) -> Vec<(c_int, Arc<Conn>)> {
        self.dirty
            .iter()
            .filter(|(e, _)| *e == epfd)
            .filter_map(|k| self.regs.get(k).map(|g| (k.1, g.conn.clone())))
            .collect()
    }
}

/// Whether a plain level-triggered registration in set `epfd` may be deferred (see the module
/// documentation, "Deferred registrations").
fn can_defer(epfd: c_int) -> bool {
    set_spin(epfd).is_some_and(|s| !s.observed.load(Ordering::SeqCst))
}

/// Whether a thread sleeps on set `epfd` (after its last look at the set's dirty
/// registrations). SeqCst, after the registration was counted dirty: with [`Sleep`]'s
/// increment before its look, one of the two sees the other.
fn sleeping_on(epfd: c_int) -> bool {
    set_spin(epfd).is_some_and(|s| s.sleepers.load(Ordering::SeqCst) > 0)
}

/// A thread about to sleep on set `epfd` ([`sleeping_on`]): counted from before its last look
/// at the set's dirty registrations ([`user_events`]) to the end of its sleep.
pub struct Sleep(Option<&'static SetSpin>);

impl Sleep {
    pub fn begin(epfd: c_int) -> Sleep {
        let s = set_spin(epfd);
        if let Some(s) = s {
            s.sleepers.fetch_add(1, Ordering::SeqCst);
        }
        Sleep(s)
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some(s) = self.0 {
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// The dirty registrations of set `epfd` that are ready now, as the application's events
/// (fd, events, data); those that are not get their eventfds in the kernel's set, so that the
/// wait that follows learns of them (see the module documentation, "Deferred
/// registrations"). One atomic load when the set has none.
pub fn user_events(epfd: c_int) -> Vec<(c_int, u32, u64)> {
    let mut out = Vec::new();
    if set_spin(epfd).is_none_or(|s| s.dirty.load(Ordering::SeqCst) == 0) {
        return out;
    }
    let Some((w, dirty)) = dirty_in(epfd) else {
        return out;
    };
    for (fd, conn) in dirty {
        let b = bits(&conn, fd, 0);
        let _g = conn.lock();
        let mut r = w.regs.lock().unwrap_or_else(|p| p.into_inner());
        let Some(reg) = r.regs.get(&(epfd, fd)) else {
            continue;
        };
        if !is(&reg.conn, &conn) || !r.dirty.contains(&(epfd, fd)) {
            continue;
        }
        let b = b & (reg.events | EV_ERR | EV_HUP);
        if b != 0 {
            out.push((fd, b, reg.data));
        } else {
            materialize(&mut r, epfd, fd);
        }
    }
    out
}

/// An fd number and its connection.
type FdConn = (c_int, Arc<Conn>);

/// The world and the dirty registrations of set `epfd` (copied out of the registry: the
/// caller locks each connection before the registry again).
fn dirty_in(epfd: c_int) -> Option<(&'static super::World, Vec<FdConn>)> {
    let w = super::world_if_created()?;
    let dirty = w
        .regs
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .dirty_of(epfd);
    Some((w, dirty))
}

/// Set `epfd` is watched by other means than its own waits (its fd in a poll or select, or
/// added to another epoll set): its dirty registrations get their eventfds in the kernel's
/// set now, and its registrations are made there at once from now on (until it is closed).
pub fn observe_set(epfd: c_int) {
    let Some(s) = set_spin(epfd) else {
        return;
    };
    s.observed.store(true, Ordering::SeqCst);
    if s.dirty.load(Ordering::SeqCst) == 0 {
        return;
    }
    let Some((w, dirty)) = dirty_in(epfd) else {
        return;
    };
    for (fd, conn) in dirty {
        let _g = conn.lock();
        let mut r = w.regs.lock().unwrap_or_else(|p| p.into_inner());
        if r.regs.get(&(epfd, fd)).is_some_and(|g| is(&g.conn, &conn)) {
            materialize(&mut r, epfd, fd);
        }
    }
}

/// Appends the application's events `user` ([`user_events`]) to the `k` events of `evs`
/// that [`translate_seen`] left (`seen`: the fds it reported, merged into rather than
/// repeated), up to `max`. Returns the new count.
pub fn merge_user(
    evs: &mut [libc::epoll_event],
    mut k: usize,
    seen: &[(c_int, usize)],
    user: &[(c_int, u32, u64)],
) -> usize {
    for &(fd, b, data) in user {
        if let Some(&(_, i)) = seen.iter().find(|(f, _)| *f == fd) {
            evs[i].events |= b;
        } else if k < evs.len() {
            evs[k] = libc::epoll_event {
                events: b,
                u64: data,
            };
            k += 1;
        }
    }
    k
}

/// The spin gate of epoll set `epfd` if a wait on it should consider busy-polling: the set
/// holds a connection under the upgrade. Such a connection's arrivals reach the set through
/// its completion channel and eventfds, which a sleeping `epoll_wait` learns of only through
/// a wake-up — on an emulated CPU ~50–100 µs of scheduler work per message, which made an
/// event loop's request (redis) slower than over kernel TCP while a blocking read, which
/// spins, was 6× faster. No lock: one atomic load.
pub fn spin_gate(epfd: c_int) -> Option<&'static SpinGate> {
    set_spin(epfd)
        .filter(|s| s.conns.load(Ordering::Relaxed) > 0)
        .map(|s| &s.gate)
}

impl Registry {
    /// Records the registration of `fd` in `epfd` (replacing any), counting it for the set,
    /// and whether it is `dirty`.
    fn put(&mut self, epfd: c_int, fd: c_int, reg: Reg, dirty: bool) {
        let conn = reg.conn.clone();
        match self.regs.insert((epfd, fd), reg) {
            None => {
                if let Some(s) = set_spin(epfd) {
                    s.conns.fetch_add(1, Ordering::Relaxed);
                }
            }
            Some(old) => self.unlist(epfd, &old.conn),
        }
        self.mark_dirty(epfd, fd, dirty);
        self.list(epfd, &conn);
    }

    /// Removes the registration of `fd` in `epfd`, if any.
    fn take(&mut self, epfd: c_int, fd: c_int) -> Option<Reg> {
        let old = self.regs.remove(&(epfd, fd));
        if let Some(o) = &old {
            if let Some(s) = set_spin(epfd) {
                s.conns.fetch_sub(1, Ordering::Relaxed);
            }
            self.mark_dirty(epfd, fd, false);
            self.unlist(epfd, &o.conn);
        }
        old
    }

    /// Counts a registration of `c` in `epfd` in [`Registry::local`], if `c` is over
    /// shared memory.
    fn list(&mut self, epfd: c_int, c: &Arc<Conn>) {
        if c.arrivals.get().is_none() {
            return;
        }
        let l = self.local.entry(epfd).or_default();
        match l.iter_mut().find(|(x, _)| Arc::ptr_eq(x, c)) {
            Some((_, n)) => *n += 1,
            None => l.push((c.clone(), 1)),
        }
    }

    /// Uncounts a registration of `c` in `epfd` (see [`Registry::list`]).
    fn unlist(&mut self, epfd: c_int, c: &Conn) {
        let Some(l) = self.local.get_mut(&epfd) else {
            return;
        };
        if let Some(i) = l.iter().position(|(x, _)| is(x, c)) {
            l[i].1 -= 1;
            if l[i].1 == 0 {
                l.swap_remove(i);
            }
        }
        if l.is_empty() {
            self.local.remove(&epfd);
        }
    }
}

/// The events the socket's own registration asks for: the application's, without EPOLLOUT
/// once writes go to the ring, and with EPOLLRDHUP (the TCP end) until it was seen
/// ([`Conn::end_seen`]), except with EPOLLEXCLUSIVE, which the kernel accepts only with
/// EPOLLIN, EPOLLOUT, EPOLLET and EPOLLWAKEUP (EINVAL otherwise, where the application's own
/// call would have succeeded).
fn sock_events(app: u32, c: &Conn) -> u32 {
    let mut ev = app;
    if c.out_masked.load(Ordering::Acquire) {
        ev &= !EV_OUT;
    }
    if app & libc::EPOLLEXCLUSIVE as u32 != 0 || c.end_seen.load(Ordering::Acquire) {
        return ev;
    }
    ev | EV_RDHUP
}

fn flags_of(app: u32) -> u32 {
    app & (EV_ET | EV_ONESHOT)
}

/// A registration whose EPOLL_CTL_MOD to the same events changes nothing in the kernel:
/// level-triggered, not one-shot (a MOD re-arms those), not exclusive (a MOD of that is
/// EINVAL). Event loops such as redis' `ae` MOD a registration whenever they start or stop
/// wanting EPOLLOUT, and the eventfd and the socket registrations of such a MOD are the same
/// as before: skipping them saves two of its three system calls.
fn plain_lt(app: u32) -> bool {
    app & (EV_ET | EV_ONESHOT | libc::EPOLLEXCLUSIVE as u32) == 0
}

/// Makes set `epfd` hold the eventfds `want` of `c` for its registration of `fd` (the
/// application's events `app`), given that it holds `have`, registered with flags
/// `have_flags`. An eventfd held and still wanted is left as it is when both the old and the
/// new registration are plain level-triggered ([`plain_lt`]: event loops such as redis' `ae`
/// MOD a registration whenever they start or stop wanting EPOLLOUT), and registered anew
/// otherwise (a MOD re-arms an edge-triggered or one-shot registration). Returns what the set
/// holds after, and the first error.
fn kernel_efds(
    epfd: c_int,
    fd: c_int,
    c: &Conn,
    app: u32,
    want: u8,
    have: u8,
    have_flags: u32,
) -> (u8, Result<(), Errno>) {
    let mut held = have;
    let mut res = Ok(());
    let ev = EV_IN | flags_of(app);
    for bit in [KIN_RD, KIN_WR] {
        let (efd, src) = efd_of(c, bit);
        let r = match (want & bit != 0, have & bit != 0) {
            (true, false) => net::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, efd, ev, tag(src, fd))
                .map(|()| held |= bit),
            (true, true) if plain_lt(app) && have_flags == 0 => Ok(()),
            (true, true) => net::epoll_ctl(epfd, libc::EPOLL_CTL_MOD, efd, ev, tag(src, fd)),
            (false, true) => {
                held &= !bit;
                net::epoll_ctl(epfd, libc::EPOLL_CTL_DEL, efd, 0, 0)
            }
            (false, false) => Ok(()),
        };
        if res.is_ok() {
            res = r;
        }
    }
    (held, res)
}

/// Takes the eventfds lingering in set `epfd` under the tags of `fd`: those of `c` are
/// returned (still in the set, plain level-triggered); another connection's (its fd was
/// closed unseen, and the number is `c`'s now) leave the set.
fn take_linger(r: &mut Registry, epfd: c_int, fd: c_int, c: &Conn) -> u8 {
    let Some(l) = r.linger.remove(&(epfd, fd)) else {
        return 0;
    };
    if is(&l.conn, c) {
        return l.kin;
    }
    let _ = kernel_efds(epfd, fd, &l.conn, 0, 0, l.kin, 0);
    0
}

/// Leaves eventfds `kin` of `c` in set `epfd` under the tags of `fd` ([`Linger`]).
fn put_linger(r: &mut Registry, epfd: c_int, fd: c_int, c: &Arc<Conn>, kin: u8) {
    if kin == 0 {
        return;
    }
    let l = r.linger.entry((epfd, fd)).or_insert_with(|| Linger {
        conn: c.clone(),
        kin: 0,
    });
    l.kin |= kin;
}

/// Takes the lingering eventfds of `c` (all sets) out of their sets.
fn drop_lingers(r: &mut Registry, c: &Conn) {
    if r.linger.is_empty() {
        return;
    }
    r.linger.retain(|(epfd, fd), l| {
        if !is(&l.conn, c) {
            return true;
        }
        let _ = kernel_efds(*epfd, *fd, c, 0, 0, l.kin, 0);
        false
    });
}

/// Dirty registration `(epfd, fd)` gets the eventfds it wants in the kernel's set (registry
/// lock held; the connection's too, or the caller knows its eventfds are not retired).
fn materialize(r: &mut Registry, epfd: c_int, fd: c_int) {
    if !r.dirty.contains(&(epfd, fd)) {
        return;
    }
    let Some(reg) = r.regs.get_mut(&(epfd, fd)) else {
        return;
    };
    let want = kin_for(reg.events, true);
    let (held, _) = kernel_efds(
        epfd,
        fd,
        &reg.conn,
        reg.events,
        want,
        reg.kin,
        reg.kin_flags,
    );
    reg.kin = held;
    reg.kin_flags = flags_of(reg.events);
    r.mark_dirty(epfd, fd, false);
}

fn wants_rd(app: u32) -> bool {
    app & (EV_IN | EV_RDHUP | EV_PRI) != 0
}

fn wants_wr(app: u32) -> bool {
    app & EV_OUT != 0
}

/// epoll_ctl for an fd under the upgrade.
///
/// Besides the socket and the eventfds, a registration puts the link's completion channel
/// into the set (once per connection and set), and the engine stops watching it: a
/// completion then wakes the application's own `epoll_wait`, which takes it
/// ([`translate_epoll`]), instead of waking the engine thread to process it and write an
/// eventfd that wakes the application (measured: the engine's CPU time was 127 µs per
/// redis-benchmark request on the server, on two emulated CPUs that the work saturates).
/// A link that comes up later is put into the sets then ([`link_up`]); when the last set
/// lets the channel go, the engine watches it again ([`Conn::on_completions`]).
pub fn epoll_ctl(
    c: &Arc<Conn>,
    epfd: c_int,
    op: c_int,
    fd: c_int,
    ev: Option<(u32, u64)>,
) -> Result<(), Errno> {
    let w = super::world().ok_or(Errno(libc::ENOMEM))?;
    let ev = match op {
        libc::EPOLL_CTL_DEL => None,
        _ => Some(ev.ok_or(Errno(libc::EFAULT))?),
    };
    // Lock order: the connection's, then the registry's.
    let mut g = c.lock();
    if op != libc::EPOLL_CTL_DEL {
        c.watch_efds_for_epoll(&mut g);
    }
    let comp = match &g.phase {
        Phase::Linked(l) => Some(l.comp_fd()),
        _ => None,
    };
    let mut r = w.regs.lock().unwrap_or_else(|p| p.into_inner());
    let mut added = false;
    let mut released = false;
    // A registration of this fd number that belongs to another connection is stale: that
    // connection's fd was closed while a duplicate kept it open (its socket's registration
    // stays in the kernel's set, as with TCP), and the number is `c`'s now. The application
    // can no longer name it, so its eventfds and channel leave the set here, whatever this
    // call is; otherwise they would stay, readable, under a tag the registry gives to `c`,
    // and every wait on the set would wake for nothing.
    let stale = match r.regs.get(&(epfd, fd)) {
        Some(g) if !is(&g.conn, c) => r.take(epfd, fd),
        _ => None,
    };
    let stale_released = stale
        .as_ref()
        .is_some_and(|old| unregister_rest(&mut r, epfd, fd, &old.conn, old, Leave::Remove));
    let res = match op {
        libc::EPOLL_CTL_ADD | libc::EPOLL_CTL_MOD => 'arm: {
            let Some((events, data)) = ev else {
                break 'arm Err(Errno(libc::EFAULT));
            };
            // (this connection's registration, if any: the kernel holds the socket and the
            // eventfds as the registry says, since every change goes through here, and
            // `after_change` re-registers them when EPOLLOUT comes off)
            let prior = r
                .regs
                .get(&(epfd, fd))
                .filter(|g| is(&g.conn, c))
                .map(|g| (g.events, g.sock));
            let sockless = !needs_socket(&g, events);
            let sock = match prior {
                Some((_, false)) if op == libc::EPOLL_CTL_ADD => {
                    break 'arm Err(Errno(libc::EEXIST));
                }
                Some((_, false)) if events & libc::EPOLLEXCLUSIVE as u32 != 0 => {
                    break 'arm Err(Errno(libc::EINVAL));
                }
                Some((_, had)) => had || !sockless,
                None => !(op == libc::EPOLL_CTL_ADD && sockless),
            };
            let old = match op {
                libc::EPOLL_CTL_MOD => prior.map(|(o, _)| o),
                _ => None,
            };
            if sock {
                // (a sockless registration that now needs the socket: it joins the set)
                let kop = match prior {
                    Some((_, false)) => libc::EPOLL_CTL_ADD,
                    _ => op,
                };
                let unchanged = kop == libc::EPOLL_CTL_MOD
                    && old.is_some_and(|o| {
                        plain_lt(o)
                            && plain_lt(events)
                            && sock_events(o, c) == sock_events(events, c)
                    });
                if !unchanged {
                    let kernel =
                        net::epoll_ctl(epfd, kop, fd, sock_events(events, c), tag(SRC_SOCK, fd));
                    if kernel.is_err() {
                        break 'arm kernel;
                    }
                }
            }
            let (have, have_flags) = r
                .regs
                .get(&(epfd, fd))
                .filter(|g| is(&g.conn, c))
                .map_or((0, 0), |g| (g.kin, g.kin_flags));
            // (what lingers under this fd's tags: plain registrations, held as such)
            let lingered = take_linger(&mut r, epfd, fd, c);
            let have_flags = if have == 0 { 0 } else { have_flags };
            // (retired eventfds, of a connection switching back, are in no set)
            let efds = g.back == super::Back::None;
            let want = kin_for(events, efds);
            let defer = efds && !sock && plain_lt(events) && have_flags == 0 && can_defer(epfd);
            let (kin, dirty) = if defer {
                // Deferred (module documentation): nothing changes in the kernel now.
                let held = have | lingered;
                put_linger(&mut r, epfd, fd, c, held & !want);
                (held & want, held & want != want)
            } else {
                let (kin, res) =
                    kernel_efds(epfd, fd, c, events, want, have | lingered, have_flags);
                if !sock && prior.is_none() {
                    // (a sockless ADD: the eventfds' registrations are the kernel's only word
                    // on `epfd`)
                    if let Err(e) = res {
                        let _ = kernel_efds(epfd, fd, c, 0, 0, kin, flags_of(events));
                        break 'arm Err(e);
                    }
                }
                (kin, false)
            };
            let held = r.regs.get(&(epfd, fd)).and_then(|g| g.comp);
            let comp = match (held, comp) {
                (Some(h), _) => Some(h),
                (None, Some(cfd)) => {
                    let got = add_comp(&mut r, epfd, fd, c, cfd);
                    added = got.is_some();
                    got
                }
                (None, None) => None,
            };
            r.put(
                epfd,
                fd,
                Reg {
                    conn: c.clone(),
                    events,
                    data,
                    disarmed: false,
                    comp,
                    sock,
                    kin,
                    kin_flags: flags_of(events),
                },
                dirty,
            );
            if dirty && (sleeping_on(epfd) || !can_defer(epfd)) {
                // (a thread asleep on the set would not learn of it, nor would one that
                // watches the set itself, if it began to meanwhile: `observe_set`)
                materialize(&mut r, epfd, fd);
            }
            Ok(())
        }
        libc::EPOLL_CTL_DEL => {
            // (a stale registration of the number went above: this one is `c`'s)
            let old = r.take(epfd, fd);
            let res = match &old {
                Some(o) if !o.sock => Ok(()),
                _ => net::epoll_ctl(epfd, op, fd, 0, 0),
            };
            if let Some(old) = old {
                if !old.sock && old.kin_flags == 0 && plain_lt(old.events) && can_defer(epfd) {
                    // (its eventfds stay in the set: module documentation)
                    put_linger(&mut r, epfd, fd, c, old.kin);
                    released = drop_comp(&mut r, epfd, fd, &old, Leave::Park);
                } else {
                    released = unregister_rest(&mut r, epfd, fd, c, &old, Leave::Park);
                }
            }
            res
        }
        _ => Err(Errno(libc::EINVAL)),
    };
    drop(r);
    if added {
        c.comp_to_app(&mut g);
    }
    if released {
        c.comp_from_app(&mut g);
    }
    drop(g);
    // (the other connection's lock only after this one's is released: no order between two)
    if let Some(old) = stale.filter(|_| stale_released) {
        old.conn.comp_from_app(&mut old.conn.lock());
    }
    res
}

fn is(a: &Arc<Conn>, b: &Conn) -> bool {
    std::ptr::eq(Arc::as_ptr(a), b)
}

/// Puts completion channel `comp` of `c` into set `epfd` for the registration of `fd`, unless
/// another registration of `c` in that set holds it already; takes it back if it is parked
/// there. Registry lock held.
fn add_comp(r: &mut Registry, epfd: c_int, fd: c_int, c: &Conn, comp: c_int) -> Option<c_int> {
    if let Some(i) = r
        .parked
        .iter()
        .position(|p| p.epfd == epfd && is(&p.conn, c) && p.comp == comp)
    {
        let p = r.parked.swap_remove(i);
        PARKED.fetch_sub(1, Ordering::SeqCst);
        if p.fd == fd
            || net::epoll_ctl(epfd, libc::EPOLL_CTL_MOD, comp, EV_IN, tag(SRC_COMP, fd)).is_ok()
        {
            return Some(comp);
        }
        // (not in the set after all: added again below, counted once)
        c.comp_in_app.fetch_sub(1, Ordering::SeqCst);
    }
    let held = r
        .regs
        .iter()
        .any(|((e, _), g)| *e == epfd && is(&g.conn, c) && g.comp.is_some());
    if held {
        return None;
    }
    net::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, comp, EV_IN, tag(SRC_COMP, fd)).ok()?;
    c.comp_in_app.fetch_add(1, Ordering::SeqCst);
    Some(comp)
}

/// Registration `old` of `fd` left the registry (its socket is the caller's): the eventfds
/// of `c` leave set `epfd`, and the completion channel per `how` ([`drop_comp`], whose answer
/// this returns).
fn unregister_rest(
    r: &mut Registry,
    epfd: c_int,
    fd: c_int,
    c: &Conn,
    old: &Reg,
    how: Leave,
) -> bool {
    let _ = kernel_efds(epfd, fd, c, 0, 0, old.kin, old.kin_flags);
    drop_comp(r, epfd, fd, old, how)
}

/// What [`drop_comp`] does with a channel no other registration takes over.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Leave {
    /// Leave it in the set ([`Parked`]).
    Park,
    /// Take it out of the set.
    Remove,
    /// Nothing: the set is going away.
    SetClosing,
}

/// Registration `old` of `fd` (removed from the registry) held its connection's completion channel
/// in set `epfd`: another registration of the connection in that set takes it over, or it
/// is parked or leaves the set (per `how`). Returns whether the connection's count of sets
/// holding the channel dropped to zero (the caller then calls [`Conn::comp_from_app`] once
/// the registry is unlocked).
fn drop_comp(r: &mut Registry, epfd: c_int, fd: c_int, old: &Reg, how: Leave) -> bool {
    let Some(comp) = old.comp else {
        return false;
    };
    if how != Leave::SetClosing {
        let heir = r
            .regs
            .iter_mut()
            .find(|((e, _), g)| *e == epfd && Arc::ptr_eq(&g.conn, &old.conn));
        if let Some(((_, fd), g)) = heir {
            let moved = net::epoll_ctl(epfd, libc::EPOLL_CTL_MOD, comp, EV_IN, tag(SRC_COMP, *fd));
            if moved.is_ok() {
                g.comp = Some(comp);
                return false;
            }
        }
        if how == Leave::Park {
            r.parked.push(Parked {
                epfd,
                fd,
                conn: old.conn.clone(),
                comp,
            });
            PARKED.fetch_add(1, Ordering::SeqCst);
            return false;
        }
        let _ = net::epoll_ctl(epfd, libc::EPOLL_CTL_DEL, comp, 0, 0);
    }
    old.conn.comp_in_app.fetch_sub(1, Ordering::SeqCst) == 1
}

/// Lets the parked channels that `pick` selects go: out of their sets, and back to the
/// engine when no set holds them any more. Takes each connection's lock, then the
/// registry's (none may be held on entry).
fn unpark(pick: impl Fn(&Parked) -> bool) {
    if PARKED.load(Ordering::SeqCst) == 0 {
        return;
    }
    let Some(w) = super::world_if_created() else {
        return;
    };
    let conns: Vec<Arc<Conn>> = {
        let r = w.regs.lock().unwrap_or_else(|p| p.into_inner());
        r.parked
            .iter()
            .filter(|p| pick(p))
            .map(|p| p.conn.clone())
            .collect()
    };
    for c in conns {
        let mut g = c.lock();
        let taken: Vec<Parked> = {
            let mut r = w.regs.lock().unwrap_or_else(|p| p.into_inner());
            let mut out = Vec::new();
            let mut i = 0;
            while i < r.parked.len() {
                if Arc::ptr_eq(&r.parked[i].conn, &c) && pick(&r.parked[i]) {
                    out.push(r.parked.swap_remove(i));
                } else {
                    i += 1;
                }
            }
            PARKED.fetch_sub(out.len(), Ordering::SeqCst);
            out
        };
        let mut released = false;
        for p in taken {
            // (a link dropped since then closed its channel, which took it out of every set,
            // and the fd number may be another's by now)
            if matches!(&g.phase, Phase::Linked(l) if l.comp_fd() == p.comp) {
                let _ = net::epoll_ctl(p.epfd, libc::EPOLL_CTL_DEL, p.comp, 0, 0);
            }
            released |= c.comp_in_app.fetch_sub(1, Ordering::SeqCst) == 1;
        }
        if released {
            c.comp_from_app(&mut g);
        }
    }
}

/// `c`'s link came up (engine thread, `c`'s lock held): its completion channel joins the
/// epoll sets `c` is registered in. Returns whether any set took it.
pub(crate) fn link_up(c: &Conn, comp: c_int) -> bool {
    let Some(w) = super::world_if_created() else {
        return false;
    };
    let mut r = w.regs.lock().unwrap_or_else(|p| p.into_inner());
    // (registered before it had an inbox, which it has now: each registration is counted for
    // the busy-polling waits — none was before, `Registry::list` skips a connection without)
    let regs: Vec<(c_int, Arc<Conn>)> = r
        .regs
        .iter()
        .filter(|(_, g)| is(&g.conn, c))
        .map(|((epfd, _), g)| (*epfd, g.conn.clone()))
        .collect();
    for (epfd, conn) in &regs {
        r.list(*epfd, conn);
    }
    let keys: Vec<(c_int, c_int)> = r
        .regs
        .iter()
        .filter(|(_, g)| is(&g.conn, c) && g.comp.is_none())
        .map(|(k, _)| *k)
        .collect();
    let mut any = false;
    for (epfd, fd) in keys {
        if let Some(cfd) = add_comp(&mut r, epfd, fd, c, comp) {
            if let Some(g) = r.regs.get_mut(&(epfd, fd)) {
                g.comp = Some(cfd);
            }
            any = true;
        }
    }
    any
}

/// `c`'s link is about to be dropped (its lock held): its completion channel leaves the
/// application's epoll sets it is in (registrations and parked), while its number is still
/// its own — once closed, the number may name a file of the application's, which a later
/// EPOLL_CTL_DEL of ours would take out of the set.
pub(crate) fn link_down(c: &Conn) {
    let Some(w) = super::world_if_created() else {
        return;
    };
    let mut r = w.regs.lock().unwrap_or_else(|p| p.into_inner());
    for ((epfd, _), reg) in r.regs.iter_mut() {
        if let (true, Some(comp)) = (is(&reg.conn, c), reg.comp) {
            let _ = net::epoll_ctl(*epfd, libc::EPOLL_CTL_DEL, comp, 0, 0);
            reg.comp = None;
            c.comp_in_app.fetch_sub(1, Ordering::SeqCst);
        }
    }
    let before = r.parked.len();
    r.parked.retain(|p| {
        let mine = is(&p.conn, c);
        if mine {
            let _ = net::epoll_ctl(p.epfd, libc::EPOLL_CTL_DEL, p.comp, 0, 0);
            c.comp_in_app.fetch_sub(1, Ordering::SeqCst);
        }
        !mine
    });
    PARKED.fetch_sub(before - r.parked.len(), Ordering::SeqCst);
}

/// Before a sleep on epoll set `epfd`: arms the CQs of its connections that an application
/// thread left unarmed ([`Conn::on_wake`]), and every shared-memory inbox left unarmed
/// ([`list_unarmed`]), so that their completions wake this wait (through the completion
/// channel or the eventfds). (A set nested in another is covered by the engine's own
/// re-arming after [`super::UNARMED_MAX`].)
pub fn arm_for_epoll(epfd: c_int) {
    if super::UNARMED.load(Ordering::SeqCst) > super::UNARMED_CQ.load(Ordering::SeqCst) {
        // (the inboxes left unarmed, wherever they are registered: one thread's sleep may
        // arm another's — a system call of the peer's more, while that thread spins)
        if let Some(w) = super::world_if_created() {
            let left = {
                let mut r = w.regs.lock().unwrap_or_else(|p| p.into_inner());
                std::mem::take(&mut r.unarmed)
            };
            for c in left {
                c.unarmed_listed.store(false, Ordering::SeqCst);
                c.ensure_armed(&mut c.lock());
            }
        }
    }
    arm_for_spin(epfd);
}

/// `c`'s inbox was left unarmed (its lock held): listed for the next epoll sleep to arm
/// (see [`arm_for_epoll`]; once however often).
pub(crate) fn list_unarmed(c: &Conn) {
    if c.unarmed_listed.swap(true, Ordering::SeqCst) {
        return;
    }
    let Some(w) = super::world_if_created() else {
        return;
    };
    match w.get(c.slot).filter(|a| std::ptr::eq(&**a, c)) {
        Some(a) => w
            .regs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .unarmed
            .push(a),
        None => c.unarmed_listed.store(false, Ordering::SeqCst),
    }
}

/// [`arm_for_epoll`] for one turn of a busy-polling wait on `epfd`: arms the CQs only, and
/// leaves the shared-memory inboxes unarmed, so that their peers write no eventfd while the
/// wait looks at them itself ([`take_arrivals`]).
pub fn arm_for_spin(epfd: c_int) {
    unpark(|p| p.epfd == epfd);
    if super::UNARMED_CQ.load(Ordering::SeqCst) == 0 {
        return;
    }
    let Some(w) = super::world_if_created() else {
        return;
    };
    let conns: Vec<Arc<Conn>> = {
        let r = w.regs.lock().unwrap_or_else(|p| p.into_inner());
        r.regs
            .iter()
            .filter(|((e, _), g)| *e == epfd && g.conn.arrivals.get().is_none())
            .map(|(_, g)| g.conn.clone())
            .collect()
    };
    for c in conns {
        c.ensure_armed(&mut c.lock());
    }
}

/// One turn of a busy-polling wait on epoll set `epfd`: takes what the peers of its
/// connections over shared memory published meanwhile (looked at without any lock but the
/// registry's, then each such connection driven under its own), leaving their inboxes
/// unarmed while the wait goes on: the peer's next message costs neither side a system call.
/// The connections' eventfds then report the new readiness to the wait, and its sleep arms
/// the inboxes first ([`arm_for_epoll`]). Returns whether anything arrived.
pub fn take_arrivals(epfd: c_int) -> bool {
    let Some(w) = super::world_if_created() else {
        return false;
    };
    let found: Vec<Arc<Conn>> = {
        let r = w.regs.lock().unwrap_or_else(|p| p.into_inner());
        let Some(l) = r.local.get(&epfd) else {
            return false;
        };
        l.iter()
            .filter(|(c, _)| c.arrivals.get().is_some_and(|a| a.pending()))
            .map(|(c, _)| c.clone())
            .collect()
    };
    for c in &found {
        // (a thread blocked on the connection's completion channel keeps it armed)
        let last = c.sleepers.load(Ordering::SeqCst) == 0;
        c.on_wake(&mut c.lock(), last);
    }
    !found.is_empty()
}

/// The epoll fd `epfd` is being closed: forget its registrations.
pub fn forget_epoll(epfd: c_int) {
    unpark(|p| p.epfd == epfd);
    if !no_app_tags() {
        let mut t = APP_TAGS.lock().unwrap_or_else(|p| p.into_inner());
        t.retain(|a| a.epfd != epfd);
        APP_TAGGED.store(t.len(), Ordering::Relaxed);
    }
    // (the number's next set learns afresh)
    if let Some(s) = set_spin(epfd) {
        s.gate.reset();
        s.observed.store(false, Ordering::SeqCst);
    }
    let Some(w) = super::world_if_created() else {
        return;
    };
    let released: Vec<Arc<Conn>> = {
        let mut r = w.regs.lock().unwrap_or_else(|p| p.into_inner());
        let keys: Vec<(c_int, c_int)> =
            r.regs.keys().filter(|(e, _)| *e == epfd).copied().collect();
        // (lingering eventfds leave with the set)
        r.linger.retain(|(e, _), _| *e != epfd);
        let mut released = Vec::new();
        for k in keys {
            if let Some(old) = r.take(k.0, k.1) {
                if drop_comp(&mut r, epfd, k.1, &old, Leave::SetClosing) {
                    released.push(old.conn.clone());
                }
            }
        }
        released
    };
    for c in released {
        c.comp_from_app(&mut c.lock());
    }
}

/// The last fd of `c`, `closing`, is being closed: remove its registrations (socket and
/// eventfds) from every epoll set (the socket stays open privately until the ring is torn
/// down, so the kernel would otherwise keep reporting it). A registration made through another
/// fd number, closed earlier while `closing` kept the connection open, loses its eventfds and
/// channel only: the kernel's registration of the socket under that number can no longer be
/// named (the number may be another file's now, whose registration a DEL would remove), and
/// lasts, as with TCP, until the socket's last reference goes.
pub fn forget_conn(c: &Arc<Conn>, closing: c_int) {
    let Some(w) = super::world_if_created() else {
        return;
    };
    let released = {
        let mut r = w.regs.lock().unwrap_or_else(|p| p.into_inner());
        // (no epoll sleep may come to arm it: a server that never sleeps under load would
        // otherwise keep every closed connection, and its eventfds, listed)
        if c.unarmed_listed.swap(false, Ordering::SeqCst) {
            r.unarmed.retain(|x| !Arc::ptr_eq(x, c));
        }
        drop_lingers(&mut r, c);
        let keys: Vec<(c_int, c_int)> = r
            .regs
            .iter()
            .filter(|(_, g)| Arc::ptr_eq(&g.conn, c))
            .map(|(k, _)| *k)
            .collect();
        let mut released = false;
        for (epfd, fd) in keys {
            let Some(old) = r.take(epfd, fd) else {
                continue;
            };
            if fd == closing && old.sock {
                let _ = net::epoll_ctl(epfd, libc::EPOLL_CTL_DEL, fd, 0, 0);
            }
            released |= unregister_rest(&mut r, epfd, fd, c, &old, Leave::Remove);
        }
        released
    };
    if released {
        c.comp_from_app(&mut c.lock());
    }
    unpark(|p| Arc::ptr_eq(&p.conn, c));
}

/// After a change of `c` (called with its lock held): once this side writes on the ring,
/// EPOLLOUT comes off the socket's registrations.
pub(crate) fn after_change(c: &Conn, g: &mut Inner) {
    if !g.committed || g.back == super::Back::Resumed || c.out_masked.load(Ordering::Acquire) {
        return;
    }
    c.out_masked.store(true, Ordering::Release);
    resock(c, |_| true);
}

/// Registers anew the socket of `c`'s armed registrations that hold it and that `pick` selects,
/// with [`sock_events`] as they are now (after a change of [`Conn::out_masked`]).
fn resock(c: &Conn, pick: impl Fn(&Reg) -> bool) {
    let Some(w) = super::world_if_created() else {
        return;
    };
    let r = w.regs.lock().unwrap_or_else(|p| p.into_inner());
    for ((epfd, fd), reg) in &r.regs {
        if is(&reg.conn, c) && !reg.disarmed && reg.sock && pick(reg) {
            let _ = net::epoll_ctl(
                *epfd,
                libc::EPOLL_CTL_MOD,
                *fd,
                sock_events(reg.events, c),
                tag(SRC_SOCK, *fd),
            );
        }
    }
}

/// `c` began to switch back to TCP (see [`super::Back::Switching`]; called with its lock
/// held): its eventfds leave every epoll registration (reads are the socket's now, and writes
/// wait for the continuation, after which they are the socket's too: [`unmask_out`]), a
/// registration without the socket gets it, and the eventfds are signaled once, for good, so
/// that every thread asleep on them looks again — at the socket — and none sleeps on them
/// again (the waits leave them out while the switch lasts). Until [`restore_efds`] (the switch
/// back called off) or the end of the connection, nothing sets or clears them.
pub(crate) fn retire_efds(c: &Conn, g: &mut Inner) {
    if let Some(w) = super::world_if_created() {
        let mut r = w.regs.lock().unwrap_or_else(|p| p.into_inner());
        let mut undirtied = Vec::new();
        for (&(epfd, fd), reg) in r.regs.iter_mut() {
            if !is(&reg.conn, c) {
                continue;
            }
            let _ = kernel_efds(epfd, fd, c, 0, 0, reg.kin, reg.kin_flags);
            reg.kin = 0;
            undirtied.push((epfd, fd));
            if !reg.sock && !reg.disarmed {
                let added = net::epoll_ctl(
                    epfd,
                    libc::EPOLL_CTL_ADD,
                    fd,
                    sock_events(reg.events, c),
                    tag(SRC_SOCK, fd),
                );
                reg.sock = added.is_ok();
            }
        }
        for (epfd, fd) in undirtied {
            r.mark_dirty(epfd, fd, false);
        }
        drop_lingers(&mut r, c);
    }
    net::eventfd_signal(c.rd_efd);
    net::eventfd_signal(c.wr_efd);
    // (cleared when the connection ends, before the eventfds are reused: `Drop for Conn`)
    g.rd_set = true;
    g.wr_set = true;
}

/// A switch back of `c` was called off (lock held): the eventfds come back to its epoll
/// registrations at the levels of the ring side's readiness.
pub(crate) fn restore_efds(c: &Conn, g: &mut Inner) {
    net::eventfd_clear(c.rd_efd);
    net::eventfd_clear(c.wr_efd);
    g.rd_set = false;
    g.wr_set = false;
    if let Some(w) = super::world_if_created() {
        let mut r = w.regs.lock().unwrap_or_else(|p| p.into_inner());
        for ((epfd, fd), reg) in r.regs.iter_mut() {
            if is(&reg.conn, c) && !reg.disarmed {
                let want = kin_for(reg.events, true);
                let (held, _) =
                    kernel_efds(*epfd, *fd, c, reg.events, want, reg.kin, reg.kin_flags);
                reg.kin = held;
                reg.kin_flags = flags_of(reg.events);
            }
        }
    }
    c.sync_efds(g);
}

/// `c`'s writes are the socket's again (its switch back wrote the continuation; lock held):
/// the socket's epoll registrations get EPOLLOUT back, if the application asked for it (the
/// change reports a socket that is writable at once, also to an edge-triggered waiter).
pub(crate) fn unmask_out(c: &Conn, _g: &mut Inner) {
    if c.out_masked.swap(false, Ordering::AcqRel) {
        resock(c, |reg| wants_wr(reg.events));
    }
}

/// A client's socket while the server's token is (or was) at its head: its readability may
/// be the token's alone. While the wait lasts, the token is taken out here (through `fd`, the
/// application's fd of the socket), and the socket reads as readable only if something is left
/// for the application (a part of a token is not: the rest follows at once). Once someone
/// took the token, the first readiness reported after is checked the same way: an
/// edge-triggered event of its arrival may have been queued before the engine took it.
fn without_token(c: &Conn, g: &mut Inner, fd: c_int, kernel: u32) -> u32 {
    if kernel & EV_IN == 0 {
        return kernel;
    }
    let awaiting = g.token == super::binding::TokenWait::Awaiting;
    if !awaiting && !std::mem::take(&mut g.token_taken) {
        return kernel;
    }
    if awaiting {
        super::take_token(c, g, fd);
        g.token_taken = false;
    }
    if g.token == super::binding::TokenWait::Awaiting || !net::readable_now(fd) {
        kernel & !EV_IN
    } else {
        kernel
    }
}

/// The connection's readiness in epoll bits. `kernel`: the socket's own events if they are
/// known (a socket source fired, or a poll of it), else 0.
fn bits(c: &Conn, fd: c_int, kernel: u32) -> u32 {
    let mut g = c.lock();
    let kernel = without_token(c, &mut g, fd, kernel);
    c.drive(&mut g, false);
    let Phase::Linked(l) = &mut g.phase else {
        return kernel;
    };
    let r0 = l.conn().readiness();
    if !r0.read_via_tcp && kernel & (EV_RDHUP | EV_HUP | EV_ERR) != 0 {
        // The socket ended while this side reads the ring: the peer closed after its ring
        // Close (nothing changes), or it vanished — unless bytes came before the end: then
        // the peer's path failed and they are its record and continuation, which the end
        // follows (`Conn::look_under_ring`; the engine's watch of the socket may not have
        // seen them yet). Taken for a plain end, they were lost with the rest of this
        // side's stream.
        // (it drives the link first)
        c.look_under_ring(&mut g, fd);
        if let Phase::Linked(l) = &mut g.phase {
            if !l.conn().failed_over() {
                if kernel & EV_ERR != 0 {
                    l.conn_mut().handle_tcp_reset();
                } else {
                    let _ = l.conn_mut().handle_tcp_eof();
                }
            }
        }
        c.settle(&mut g);
    }
    let Phase::Linked(l) = &g.phase else {
        return kernel;
    };
    let r = l.conn().readiness();
    let mut b = 0;
    if r.read_via_tcp {
        b |= kernel & (EV_IN | EV_RDHUP | EV_PRI);
    } else {
        if r.readable {
            b |= EV_IN;
        }
        if r.rdhup {
            b |= EV_RDHUP;
        }
    }
    if r.write_via_tcp {
        b |= kernel & EV_OUT;
    } else if r.writable {
        b |= EV_OUT;
    }
    if r.hup {
        b |= EV_HUP;
    }
    if r.error {
        b |= EV_ERR;
    }
    if r.read_via_tcp || r.write_via_tcp {
        b |= kernel & (EV_ERR | EV_HUP);
    }
    c.sync_efds(&mut g);
    b
}

/// Translates the `n` events epoll_wait returned in `evs` for epoll set `epfd`; returns how
/// many are left for the application (in place).
pub fn translate_epoll(epfd: c_int, evs: &mut [libc::epoll_event], n: usize) -> usize {
    translate_seen(epfd, evs, n, &mut Vec::new())
}

/// [`translate_epoll`], which also lists the fds under the upgrade it reported, each with its
/// index in `evs`, in `seen`.
pub fn translate_seen(
    epfd: c_int,
    evs: &mut [libc::epoll_event],
    n: usize,
    seen: &mut Vec<(c_int, usize)>,
) -> usize {
    let world = super::world_if_created();
    if world.is_none() && no_app_tags() {
        return n;
    }
    let mut out = 0;
    for i in 0..n {
        let ev = evs[i];
        let data = ev.u64;
        let Some((src, fd)) = untag(data) else {
            evs[out] = ev;
            out += 1;
            continue;
        };
        if src == SRC_APP {
            // (none: the registration was replaced or dropped since the event came)
            if let Some(d) = app_tag_data(epfd, fd) {
                evs[out] = libc::epoll_event {
                    events: ev.events,
                    u64: d,
                };
                out += 1;
            }
            continue;
        }
        let Some(w) = world else {
            // (no registration of the shim's exists: not a tag)
            evs[out] = ev;
            out += 1;
            continue;
        };
        let (reg, lingered) = {
            let mut r = w.regs.lock().unwrap_or_else(|p| p.into_inner());
            // (an eventfd no registration wants, left in the set: it leaves now, see the
            // module documentation, "Deferred registrations")
            let bit = match src {
                SRC_RD => KIN_RD,
                SRC_WR => KIN_WR,
                _ => 0,
            };
            let lingered = match r.linger.get_mut(&(epfd, fd)) {
                Some(l) if l.kin & bit != 0 => {
                    let _ = kernel_efds(epfd, fd, &l.conn, 0, 0, bit, 0);
                    l.kin &= !bit;
                    if l.kin == 0 {
                        r.linger.remove(&(epfd, fd));
                    }
                    true
                }
                _ => false,
            };
            let reg = r
                .regs
                .get(&(epfd, fd))
                .map(|g| (g.conn.clone(), g.events, g.data, g.disarmed));
            (reg, lingered)
        };
        if lingered {
            continue;
        }
        let Some((conn, app, app_data, disarmed)) = reg else {
            if src == SRC_COMP {
                // a parked channel: its connection's registration went, and so does it
                unpark(|p| p.epfd == epfd && p.fd == fd);
            }
            continue;
        };
        if src == SRC_COMP {
            // Taken here (even for a disarmed registration: the channel stays readable until
            // then). A level-triggered registration gets the readiness now (the eventfd's
            // report that may follow is recomputed, and dropped once nothing is left); an
            // edge-triggered one only through the eventfd the completions set, so that it
            // gets one event per arrival, not two. (A wait left with nothing to report waits
            // again: the eventfd is ready by then.)
            // (an inbox over shared memory is left unarmed, as a busy-polling wait leaves it:
            // see `take_arrivals`; the set's next sleep arms it)
            let mut g = conn.lock();
            if conn.arrivals.get().is_some() {
                conn.on_wake(&mut g, conn.sleepers.load(Ordering::SeqCst) == 0);
            } else {
                conn.on_completions(&mut g);
            }
            drop(g);
            if app & EV_ET != 0 {
                continue;
            }
        }
        if disarmed {
            continue;
        }
        let kernel = if src == SRC_SOCK { ev.events } else { 0 };
        let b = bits(&conn, fd, kernel) & (app | EV_ERR | EV_HUP);
        if kernel & EV_RDHUP != 0
            && app & EV_RDHUP == 0
            && !conn.end_seen.swap(true, Ordering::AcqRel)
        {
            // (the socket's end, which `bits` has acted on, is asked for no more)
            resock(&conn, |reg| reg.events & EV_ET == 0);
        }
        if super::trace() {
            crate::shim_log!(
                crate::config::Level::Debug,
                "trace: epoll fd={fd} src={src} kernel={kernel:#x} app={app:#x} -> {b:#x}"
            );
        }
        if b == 0 {
            continue;
        }
        if let Some(&(_, idx)) = seen.iter().find(|(f, _)| *f == fd) {
            let merged = evs[idx].events | b;
            evs[idx].events = merged;
            continue;
        }
        if app & EV_ONESHOT != 0 {
            let mut r = w.regs.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(g) = r.regs.get_mut(&(epfd, fd)) {
                g.disarmed = true;
            }
        }
        evs[out] = libc::epoll_event {
            events: b,
            u64: app_data,
        };
        seen.push((fd, out));
        out += 1;
    }
    out
}

/// One pollfd entry's connection (if under the upgrade) and the plan for it.
struct Entry {
    conn: Arc<Conn>,
    /// Index in the rebuilt array of the socket, and of the eventfds if used.
    sock: usize,
    efds: [Option<usize>; 2],
}

/// The epoll bits and the poll bits that mean the same.
const POLL_BITS: [(u32, i16); 6] = [
    (EV_IN, libc::POLLIN),
    (EV_OUT, libc::POLLOUT),
    (EV_RDHUP, libc::POLLRDHUP),
    (EV_PRI, libc::POLLPRI),
    (EV_ERR, libc::POLLERR),
    (EV_HUP, libc::POLLHUP),
];

fn to_poll(b: u32) -> i16 {
    POLL_BITS
        .iter()
        .filter(|(e, _)| b & e != 0)
        .fold(0, |p, (_, q)| p | q)
}

fn from_poll(p: i16) -> u32 {
    POLL_BITS
        .iter()
        .filter(|(_, q)| p & q != 0)
        .fold(0, |b, (e, _)| b | e)
}

/// How a poll-family wait watches a connection.
struct Via {
    /// The directions served by its socket.
    read: bool,
    write: bool,
    /// A direction may still move onto the ring (the connection is not settled on TCP).
    may_switch: bool,
    /// Switching back to TCP: the eventfds are retired, and the wait looks again every
    /// [`super::BACK_NAP`] ms.
    backing: bool,
}

/// How a poll-family wait watches `c` (see [`Via`]).
fn via_tcp(c: &Conn) -> Via {
    let g = c.lock();
    let (read, write, may_switch) = match &g.phase {
        Phase::Linked(l) => {
            let r = l.conn().readiness();
            (r.read_via_tcp, r.write_via_tcp, g.back == super::Back::None)
        }
        Phase::Fallen => (true, true, false),
        _ => (true, true, true),
    };
    Via {
        read,
        write,
        may_switch,
        backing: g.back != super::Back::None && matches!(g.phase, Phase::Linked(_)),
    }
}

/// Keeps the eventfds' levels of a poll-family call's connections while it runs (each look
/// at a connection, [`bits`], sets them under its lock before the wait).
struct Watching<'a>(&'a [Option<Arc<Conn>>]);

impl<'a> Watching<'a> {
    fn new(conns: &'a [Option<Arc<Conn>>]) -> Self {
        for c in conns.iter().flatten() {
            c.watch_efds_unlocked();
        }
        Watching(conns)
    }
}

impl Drop for Watching<'_> {
    fn drop(&mut self) {
        for c in self.0.iter().flatten() {
            c.unwatch_efds();
        }
    }
}

/// How a poll-family call waits.
#[derive(Clone, Copy)]
pub enum Timeout {
    /// Milliseconds (-1: forever), poll/select style.
    Ms(c_int),
    /// A timespec (None: forever) and a signal mask, ppoll/pselect style.
    Ts(Option<libc::timespec>, *const libc::sigset_t),
}

impl Timeout {
    /// The wait's length (None: forever).
    fn total(&self) -> Option<Duration> {
        match self {
            Timeout::Ms(ms) if *ms < 0 => None,
            Timeout::Ms(ms) => Some(Duration::from_millis(*ms as u64)),
            Timeout::Ts(None, _) => None,
            Timeout::Ts(Some(ts), _) => Some(Duration::new(
                ts.tv_sec.max(0) as u64,
                ts.tv_nsec.clamp(0, 999_999_999) as u32,
            )),
        }
    }

    /// The same kind of wait (with its signal mask) for `d` (None: forever).
    fn with(&self, d: Option<Duration>) -> Timeout {
        match self {
            Timeout::Ms(_) => {
                Timeout::Ms(d.map_or(-1, |d| d.as_millis().min(i32::MAX as u128) as c_int))
            }
            Timeout::Ts(_, mask) => Timeout::Ts(
                d.map(|d| libc::timespec {
                    tv_sec: d.as_secs() as libc::time_t,
                    tv_nsec: d.subsec_nanos() as libc::c_long,
                }),
                *mask,
            ),
        }
    }

    /// The same wait, ppoll style, under signal mask `mask`.
    fn under(&self, mask: *const libc::sigset_t) -> Timeout {
        let ts = self.total().map(|d| libc::timespec {
            tv_sec: d.as_secs() as libc::time_t,
            tv_nsec: d.subsec_nanos() as libc::c_long,
        });
        Timeout::Ts(ts, mask)
    }

    /// Whether the call waits under the thread's own signal mask (not a ppoll/pselect mask).
    fn own_mask(&self) -> bool {
        match self {
            Timeout::Ms(_) => true,
            Timeout::Ts(_, mask) => mask.is_null(),
        }
    }
}

/// poll/ppoll over `fds`, where `conns[i]` is the connection of `fds[i]` if it is under the
/// upgrade. Returns the number of entries with events (as poll does).
///
/// A call that may block first busy-polls, as `epoll_wait` does (`hooks::up::epoll_wait`):
/// passes with timeout 0 — each drives the connections' links and asks the kernel about the
/// other fds — for the spin time, if the first connection's spin gate lets it, with the
/// asynchronous signals held back ([`spin_wait_interruptible`]; poll is never
/// restarted after a handler either). Without it, an arrival reached a sleeping poll through the
/// engine thread (its wake-up, its eventfd write) and then this thread's wake-up.
pub fn poll(
    fds: &mut [libc::pollfd],
    conns: &[Option<Arc<Conn>>],
    timeout: Timeout,
) -> Result<usize, Errno> {
    let total = timeout.total();
    let first = conns.iter().flatten().next();
    let (Some(first), false) = (first, total.is_some_and(|t| t.is_zero())) else {
        return poll_pass(fds, conns, timeout);
    };
    // (the clock only for a finite wait: under clocksources without a vDSO reader a read is
    // a system call)
    let deadline = total.map(|t| Instant::now() + t);
    let zero = timeout.with(Some(Duration::ZERO));
    let tally = crate::stats::Tally::at(crate::stats::fd_shard(fds.first().map_or(0, |p| p.fd)));
    let (found, held) = spin_wait_interruptible(&first.spin, tally, timeout.own_mask(), || {
        match poll_pass(fds, conns, zero) {
            Ok(0) => Turn::Again,
            Ok(k) => Turn::Found(Ok(k)),
            Err(e) => Turn::Leave(Err(e)),
        }
    });
    let r = match found {
        Ok(Some(r)) => r,
        Err(e) => Err(e),
        Ok(None) => {
            let rest = timeout.with(deadline.map(|d| d.saturating_duration_since(Instant::now())));
            // (the signals held by the spin are let through by the sleep itself)
            let rest = held.as_ref().map_or(rest, |h| rest.under(h.mask()));
            poll_pass(fds, conns, rest)
        }
    };
    if let Some(h) = held {
        h.release();
    }
    r
}

/// [`poll`] without the spin.
fn poll_pass(
    fds: &mut [libc::pollfd],
    conns: &[Option<Arc<Conn>>],
    timeout: Timeout,
) -> Result<usize, Errno> {
    let total = timeout.total();
    // (the clock only for a finite, non-zero wait — not on every pass of a spin: under
    // clocksources without a vDSO reader, as HPET in the soft-RoCE VM, a read is a system call)
    let start = total.filter(|t| !t.is_zero()).map(|_| Instant::now());
    let elapsed = || start.map_or(Duration::ZERO, |s| s.elapsed());
    unpark(|p| conns.iter().flatten().any(|c| Arc::ptr_eq(c, &p.conn)));
    let _watching = Watching::new(conns);
    loop {
        if super::UNARMED.load(Ordering::SeqCst) > 0 {
            // (see `arm_for_epoll`)
            for c in conns.iter().flatten() {
                c.ensure_armed(&mut c.lock());
            }
        }
        let mut real: Vec<libc::pollfd> = Vec::with_capacity(fds.len() + 4);
        let mut plan: Vec<Option<Entry>> = Vec::with_capacity(fds.len());
        let mut ready_now = false;
        let mut nap = false;
        for (p, c) in fds.iter().zip(conns) {
            let Some(c) = c else {
                real.push(libc::pollfd {
                    fd: p.fd,
                    events: p.events,
                    revents: 0,
                });
                plan.push(None);
                continue;
            };
            let want = from_poll(p.events);
            let Via {
                read: rt,
                write: wt,
                may_switch,
                backing,
            } = via_tcp(c);
            nap |= backing;
            let mut sock_ev = 0i16;
            if rt {
                sock_ev |= p.events & (libc::POLLIN | libc::POLLRDHUP | libc::POLLPRI);
            } else if !c.end_seen.load(Ordering::Acquire) {
                sock_ev |= libc::POLLRDHUP;
            }
            if wt {
                sock_ev |= p.events & libc::POLLOUT;
            }
            if bits(c, p.fd, 0) & (want | EV_ERR | EV_HUP) != 0 {
                ready_now = true;
            }
            let sock = real.len();
            real.push(libc::pollfd {
                fd: p.fd,
                events: sock_ev,
                revents: 0,
            });
            let mut efds = [None, None];
            // A direction still on TCP may move to the ring during the wait (the link comes
            // up, the peer's SwitchOver arrives): its eventfd is watched too, or bytes that
            // then arrive on the ring would not wake this wait.
            if (!rt || may_switch) && !backing && wants_rd(want) {
                efds[0] = Some(real.len());
                real.push(libc::pollfd {
                    fd: c.rd_efd,
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
            if (!wt || may_switch) && !backing && wants_wr(want) {
                efds[1] = Some(real.len());
                real.push(libc::pollfd {
                    fd: c.wr_efd,
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
            plan.push(Some(Entry {
                conn: c.clone(),
                sock,
                efds,
            }));
        }
        let left = total.map(|t| t.saturating_sub(elapsed()));
        // (a connection switching back: its eventfds are retired, and the end of the switch
        // is nobody's event; `left` stays the call's own, for the expiry below)
        let nap_left = if nap {
            let n = Duration::from_millis(super::BACK_NAP as u64);
            Some(left.map_or(n, |l| l.min(n)))
        } else {
            left
        };
        let r = if ready_now {
            net::poll(&mut real, 0)
        } else {
            match &timeout {
                Timeout::Ms(_) => net::poll(
                    &mut real,
                    nap_left.map_or(-1, |l| l.as_millis().min(i32::MAX as u128) as c_int),
                ),
                Timeout::Ts(_, mask) => {
                    let ts = nap_left.map(|l| libc::timespec {
                        tv_sec: l.as_secs() as libc::time_t,
                        tv_nsec: l.subsec_nanos() as libc::c_long,
                    });
                    net::ppoll_raw(&mut real, ts.as_ref(), *mask)
                }
            }
        };
        r?;
        let mut count = 0;
        let mut ri = 0;
        for (p, e) in fds.iter_mut().zip(&plan) {
            match e {
                None => {
                    p.revents = real[ri].revents;
                    ri += 1;
                }
                Some(e) => {
                    let k = from_poll(real[e.sock].revents);
                    let want = from_poll(p.events);
                    p.revents = to_poll(bits(&e.conn, p.fd, k) & (want | EV_ERR | EV_HUP))
                        | (real[e.sock].revents & libc::POLLNVAL);
                    if k & EV_RDHUP != 0 && want & EV_RDHUP == 0 {
                        // (acted on by `bits`: not asked for again, see `Conn::end_seen`)
                        e.conn.end_seen.store(true, Ordering::Release);
                    }
                    ri = e.sock + 1 + e.efds.iter().flatten().count();
                }
            }
            if p.revents != 0 {
                count += 1;
            }
        }
        let expired = left.is_some_and(|l| l.is_zero()) || total.is_some_and(|t| elapsed() >= t);
        if count > 0 || expired {
            return Ok(count);
        }
    }
}
