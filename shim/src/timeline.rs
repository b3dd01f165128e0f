//! One end of a ping-pong's timeline (cargo feature `timeline`, off by default and then not
//! compiled): `RDMASHIM_TIMELINE=client:FILE` or `server:FILE` makes the thread that loads
//! the shim that end ([`rdmashim_core::timeline`]: the transport stamps its DATA posts and the
//! DATA completions it sees; [`read_returned`] stamps a read of ring bytes returning) and
//! writes the stamps to FILE at exit and whenever the application closes an upgraded
//! connection, with the time-stamp counter's ticks against the monotonic clock for its rate.
//! `scripts/bench-tools/timeline_merge.py CLIENT SERVER` puts the two ends together:
//! processes of one host read one counter. A diagnosis build only.

use rdmashim_core::timeline::{self, Mark, Side};
use std::sync::OnceLock;
use std::time::Instant;

static END: OnceLock<(Side, Vec<u8>, Instant, u64)> = OnceLock::new();

/// At load: this thread's end and the file, from `RDMASHIM_TIMELINE`.
pub fn start() {
    let Ok(v) = std::env::var("RDMASHIM_TIMELINE") else {
        return;
    };
    let (side, file) = match v.split_once(':') {
        Some(("client", f)) => (Side::Client, f),
        Some(("server", f)) => (Side::Server, f),
        _ => return,
    };
    let Some(t) = rdmashim_core::sys::cycles() else {
        return;
    };
    timeline::set_side(side);
    let _ = END.set((side, file.as_bytes().to_vec(), Instant::now(), t));
}

/// A read of ring bytes returns to the application.
#[inline]
pub fn read_returned() {
    timeline::mark(Mark::ReadReturned);
}

/// At exit, and whenever the application closes an upgraded connection (a server is ended by
/// a signal, which runs no destructor): the stamps, one line per mark (`name t t t …`),
/// after `rate NS TICKS` (the monotonic nanoseconds and counter ticks since load).
pub fn finish() {
    let Some((side, file, t0, c0)) = END.get() else {
        return;
    };
    let (Some(c1), ns) = (rdmashim_core::sys::cycles(), t0.elapsed().as_nanos()) else {
        return;
    };
    let mut out = format!("rate {ns} {}\n", c1.wrapping_sub(*c0));
    for (name, m) in [
        ("post_called", Mark::PostCalled),
        ("post_returned", Mark::PostReturned),
        ("data_seen", Mark::DataSeen),
        ("read_returned", Mark::ReadReturned),
    ] {
        out += name;
        for t in timeline::stamps(*side, m) {
            out += &format!(" {t}");
        }
        out += "\n";
    }
    let _ = std::fs::write(String::from_utf8_lossy(file).as_ref(), out);
}
