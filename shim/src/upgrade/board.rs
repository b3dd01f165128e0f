//! The fork board: how a fork child gets the use of a connection that its parent has on a
//! ring (docs/upgrade.md §7, "fork").
//!
//! A fork child shares every socket with its parent, but not the rings: they live in the
//! parent's queue pairs and memory. When the child uses an inherited connection that the
//! parent has upgraded, the parent switches it back to TCP (protocol §8.5) and the child then
//! uses the socket as plain TCP, exactly where the stream stands. The board is how the child
//! asks: a page of memory shared by the parent and all its children (an anonymous
//! `MAP_SHARED` mapping made in the fork's prepare handler, so every child inherits it), with
//! one word per slot of the parent's connection slab, and a pipe whose read end the parent's
//! engine watches.
//!
//! A word is `born << 32 | state`: `born` is the fork count of the parent when the slot's
//! connection was made ([`super::attrs::Attrs::born`]), written by the parent whenever a
//! connection takes the slot; `state` is [`IDLE`], [`ASKED`] (by a child), [`TCP`] (the
//! connection is plain TCP: use the socket) or [`RESET`] (it could not go back and was
//! reset). Every fork counts twice (prepare and parent handlers), and a child remembers the
//! count it left its parent's generation at ([`LEFT`]); a connection born after that cannot
//! be the child's, so a slot whose word says so has been reused: the child's connection was
//! closed by the parent meanwhile — which, for a connection that existed at a fork, switches
//! it back first ([`super::data::close_last`]). So the child needs no lock of the parent's,
//! and a reused slot never hands the child someone else's ring.
//!
//! The child waits for the answer at most [`ASK_WAIT`], looking every millisecond; the
//! parent's engine answers once the connection is plain TCP, or resets it and says so when it
//! cannot go back (a peer without `SWITCH_BACK`, a ring already closed) or not in time. A
//! slot past [`BOARD_LEN`], a board that could not be made, or a parent that does not answer
//! (it died) gives the child `ECONNRESET`: the stream cannot be had without a hole.

use super::data::{self, Step};
use super::{slot_parts, world_of, LAST_GENERATION, PRIVATE_FD_MIN};
use crate::net;
use crate::outcome::Errno;
use crate::reason::FallbackReason;
use core::ffi::c_int;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Slots of the parent's slab the board covers (a word each: 512 KiB of address space, of
/// which only the pages of slots in use are ever touched).
pub(crate) const BOARD_LEN: usize = 1 << 16;

pub(crate) const IDLE: u32 = 0;
pub(crate) const ASKED: u32 = 1;
pub(crate) const TCP: u32 = 2;
pub(crate) const RESET: u32 = 3;
/// A connection the parent offered at the fork (an undecided server connection: see
/// [`super::adopt`]) that a child took over: the child serves its upgrade on the rdma_cm port
/// in the state's high 16 bits ([`adopted`]).
pub(crate) const ADOPTED: u32 = 4;
/// The parent redirected the client's request to the adopting child: the connection is the
/// child's for good.
pub(crate) const REDIRECTED: u32 = 5;

/// The state word of an adoption by a child that serves on `port`.
fn adopted(port: u16) -> u32 {
    ADOPTED | u32::from(port) << 16
}

/// Whether `state` is an adoption (by a child on any port).
fn is_adopted(state: u32) -> bool {
    state & 0xffff == ADOPTED
}

/// The word of a connection born at fork count `born` whose state is `state`.
fn packed(born: u32, state: u32) -> u64 {
    u64::from(born) << 32 | u64::from(state)
}

/// The longest a child waits for its parent's answer: the parent's engine gives a switch back
/// [`super::data::HAND_BACK_WAIT`], and may be busy.
/// (a dial under way is waited for until its own deadline, 5 s).
const ASK_WAIT: Duration = Duration::from_secs(8);
/// How often a waiting child wakes the parent's engine again (a wake-up may have been taken
/// by a scan that came just before the request).
const POKE_EVERY: Duration = Duration::from_millis(50);

/// For each generation this process has left (by forking), the fork count it left it at.
static LEFT: [AtomicU32; LAST_GENERATION as usize + 1] =
    [const { AtomicU32::new(0) }; LAST_GENERATION as usize + 1];

/// In a fork child: it left generation `g` with its parent's fork count as it is now.
pub(crate) fn left_generation(g: u32) {
    if let Some(l) = LEFT.get(g as usize) {
        l.store(super::attrs::forks(), Ordering::Relaxed);
    }
}

/// In a fork child: the fork count at which it left generation `g` (0 if it never did).
pub(crate) fn left(g: u32) -> u32 {
    LEFT.get(g as usize)
        .map_or(0, |l| l.load(Ordering::Relaxed))
}

/// One process generation's board (see the module's documentation).
pub(crate) struct Board {
    /// Word 0: requests made (each child's request adds one); word 1 + i: slot index i.
    words: &'static [AtomicU64],
    /// The wake-up pipe: the engine watches `rd`; children write to `wr`.
    rd: c_int,
    wr: c_int,
    /// What `wr` is, so that a child whose copy was closed (and the number reused) does not
    /// write into some other file.
    wr_id: Option<(u64, u64)>,
}

impl Board {
    /// A new board (no slot recorded), or `None` without memory or fds.
    pub(crate) fn create() -> Option<Board> {
        let words = net::shared_words(BOARD_LEN + 1)?;
        let (rd, wr) = net::pipe_private(PRIVATE_FD_MIN).ok()?;
        Some(Board {
            words,
            rd,
            wr,
            wr_id: net::file_id(wr),
        })
    }

    /// The fd the engine watches for requests.
    pub(crate) fn wake_fd(&self) -> c_int {
        self.rd
    }

    fn word(&self, index: usize) -> Option<&AtomicU64> {
        if index >= BOARD_LEN {
            return None;
        }
        self.words.get(index + 1)
    }

    /// A connection born at fork count `born` took slot `index` (nothing asked of it yet).
    pub(crate) fn took(&self, index: usize, born: u32) {
        if let Some(w) = self.word(index) {
            w.store(packed(born, IDLE), Ordering::Release);
        }
    }

    /// The answer for slot `index`'s connection born at `born`: `state` ([`TCP`] or
    /// [`RESET`]). A word that no longer holds that connection is left alone.
    pub(crate) fn answer(&self, index: usize, born: u32, state: u32) {
        self.settle(index, born, state, |s| s != state);
    }

    /// Sets slot `index`'s word to state `to` while it holds the connection born at `born` in a
    /// state that `from` accepts (compare-and-swap loop); else leaves it alone.
    fn settle(&self, index: usize, born: u32, to: u32, from: impl Fn(u32) -> bool) {
        let Some(w) = self.word(index) else { return };
        let mut v = w.load(Ordering::Acquire);
        while (v >> 32) as u32 == born && from(v as u32) {
            match w.compare_exchange(v, packed(born, to), Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return,
                Err(now) => v = now,
            }
        }
    }

    /// Moves slot `index`'s word from state `from` to `to` if it holds exactly that, for the
    /// connection born at `born`.
    fn swap(&self, index: usize, born: u32, from: u32, to: u32) -> bool {
        self.word(index).is_some_and(|w| {
            w.compare_exchange(
                packed(born, from),
                packed(born, to),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
        })
    }

    /// The child's side of an adoption: takes over slot `index`'s connection (born at
    /// `born`, offered at the fork and not claimed by anyone since) to serve it on rdma_cm port
    /// `port`, and wakes the parent's engine. False if the word says otherwise (the parent
    /// withdrew the offer, another process took it, or the slot holds another connection).
    pub(crate) fn adopt(&self, index: usize, born: u32, port: u16) -> bool {
        let ok = self.swap(index, born, IDLE, adopted(port));
        if ok {
            self.poke();
        }
        ok
    }

    /// Whether slot `index` holds its connection born at `born`, offered and not claimed.
    pub(crate) fn is_idle(&self, index: usize, born: u32) -> bool {
        self.word(index)
            .is_some_and(|w| w.load(Ordering::Acquire) == packed(born, IDLE))
    }

    /// The parent's side: the port of the child that adopted slot `index`'s connection (born
    /// at `born`), if one did.
    pub(crate) fn adopter(&self, index: usize, born: u32) -> Option<u16> {
        let v = self.word(index)?.load(Ordering::Acquire);
        let state = v as u32;
        ((v >> 32) as u32 == born && is_adopted(state)).then_some((state >> 16) as u16)
    }

    /// The parent's side: the adopting child on `port` gets the connection for good (the
    /// client is being redirected there). False if the word changed meanwhile.
    pub(crate) fn redirect(&self, index: usize, born: u32, port: u16) -> bool {
        self.swap(index, born, adopted(port), REDIRECTED)
    }

    /// The parent's side: the offer of slot `index`'s connection (born at `born`) is
    /// withdrawn, adopted or not (the parent used the connection itself, forked again with
    /// it, or it was decided otherwise): the word says [`TCP`], so a child that adopted it
    /// gets no request and serves it as TCP, as does any child that asks. A connection
    /// already redirected is left alone (only after the parent's last close).
    pub(crate) fn withdraw(&self, index: usize, born: u32) {
        self.settle(index, born, TCP, |s| s == IDLE || is_adopted(s));
    }

    /// Requests made so far (the engine scans the words when this moved).
    pub(crate) fn requests(&self) -> u64 {
        self.words[0].load(Ordering::Acquire)
    }

    /// The slots below `upto` whose connection a child asked for, with their `born`.
    pub(crate) fn asked(&self, upto: usize) -> Vec<(usize, u32)> {
        (0..upto.min(BOARD_LEN))
            .filter_map(|i| {
                let v = self.word(i)?.load(Ordering::Acquire);
                (v as u32 == ASKED).then_some((i, (v >> 32) as u32))
            })
            .collect()
    }

    /// Wakes the parent's engine: counts a request and writes to the pipe (if this process's
    /// copy of it is still the pipe).
    fn poke(&self) {
        self.words[0].fetch_add(1, Ordering::AcqRel);
        if self.wr_id.is_some() && net::file_id(self.wr) == self.wr_id {
            net::poke(self.wr);
        }
    }

    /// The engine took the wake-ups.
    pub(crate) fn drain(&self) {
        net::drain(self.rd);
    }

    /// A child asks for slot `index`, which held its connection when it left the board's
    /// generation at fork count `left`; waits for the answer.
    fn ask(&self, index: usize, left: u32) -> Result<(), Errno> {
        let Some(w) = self.word(index) else {
            return Err(lost("its parent's board has no room for it"));
        };
        let deadline = Instant::now() + ASK_WAIT;
        let mut poked: Option<Instant> = None;
        loop {
            let v = w.load(Ordering::Acquire);
            let (born, state) = ((v >> 32) as u32, v as u32);
            if born > left || state == TCP {
                // (born later: the slot was reused, so the parent closed our connection,
                // switching it back first)
                return Ok(());
            }
            if state == RESET {
                return Err(Errno(libc::ECONNRESET));
            }
            if state == REDIRECTED {
                // (another child of the parent took it onto its own ring: two processes using
                // one connection, which a fork-per-connection server's do not)
                return Err(lost("another child of its parent serves it on a ring"));
            }
            let now = Instant::now();
            if state != ASKED {
                if w.compare_exchange(v, packed(born, ASKED), Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
                {
                    continue;
                }
                self.poke();
                poked = Some(now);
            } else if poked.is_none_or(|t| now >= t + POKE_EVERY) {
                self.poke();
                poked = Some(now);
            }
            if now >= deadline {
                return Err(lost("its parent did not give it back in time"));
            }
            net::nap_ms(1);
        }
    }
}

/// The engine's side: the requests of this process's fork children, each served until its
/// connection is plain TCP.
#[derive(Default)]
pub(crate) struct Requests {
    asked: Vec<Asked>,
    /// [`Board::requests`] when last scanned.
    seen: u64,
}

/// A child's request for the connection of a slot.
struct Asked {
    index: usize,
    born: u32,
    /// When it is reset if it is not back on TCP.
    until: Instant,
}

impl Requests {
    /// Whether some request waits for its connection (the engine looks again within
    /// [`super::BACK_NAP`]).
    pub(crate) fn pending(&self) -> bool {
        !self.asked.is_empty()
    }

    /// Takes up new requests and serves them all: each asked connection is returned to plain
    /// TCP (an undecided one settles there with reason `forked`, one on the ring is switched
    /// back), then the child is told to use the socket; one that cannot go back, or not within
    /// [`data::HAND_BACK_WAIT`] (of the request, or of the end of the dial it waited for), is
    /// reset and the child told so.
    pub(crate) fn serve(&mut self) {
        let Some(w) = super::world_if_created() else {
            return;
        };
        let Some(b) = w.board() else { return };
        let n = b.requests();
        if n != self.seen {
            self.seen = n;
            let until = Instant::now() + data::HAND_BACK_WAIT;
            for (index, born) in b.asked(w.slots()) {
                if !self
                    .asked
                    .iter()
                    .any(|a| a.index == index && a.born == born)
                {
                    self.asked.push(Asked { index, born, until });
                }
            }
        }
        let now = Instant::now();
        self.asked.retain_mut(|a| {
            let c = match w.at(a.index) {
                Some(c) if c.attrs.born() == a.born => c,
                // (no longer there: closed by this process, which switched it back first)
                _ => {
                    b.answer(a.index, a.born, TCP);
                    return false;
                }
            };
            let step = data::back_step(&c, &mut c.lock(), None, FallbackReason::Forked);
            let why = match step {
                Step::Tcp => {
                    b.answer(a.index, a.born, TCP);
                    return false;
                }
                // (the switch back gets its whole wait from the dial's end: a dial that took
                // longer than the wait would otherwise leave it none)
                Step::Dialing => {
                    a.until = now + data::HAND_BACK_WAIT;
                    return true;
                }
                Step::Wait if now < a.until => return true,
                Step::Wait => "not back on TCP in time".to_string(),
                Step::Cannot(why) => why,
            };
            data::reset_shared(&c, None, "fork", &why);
            b.answer(a.index, a.born, RESET);
            false
        });
    }
}

/// A child's connection that cannot be had: logged, and seen as a reset one.
fn lost(why: &str) -> Errno {
    crate::shim_log!(
        crate::config::Level::Warn,
        "an inherited connection on RDMA cannot be used in this child ({why}); reset"
    );
    Errno(libc::ECONNRESET)
}

/// In a fork child: makes the connection of `slot` (its parent's, or an older ancestor's) usable
/// as plain TCP, asking its owner to switch it back if it is on a ring. `Ok`: use the socket.
pub(crate) fn inherited(slot: u64) -> Result<(), Errno> {
    if super::inherited_fell_back(slot) {
        return Ok(());
    }
    let (g, key) = slot_parts(slot);
    let index = key.index as usize;
    let board = world_of(g).and_then(|w| w.board());
    let Some(b) = board else {
        return Err(lost("its parent made no board"));
    };
    b.ask(index, left(g))
}
