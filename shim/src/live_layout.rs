//! The live view's file: one per process, in the run directory, named `PID.live`, mapped
//! shared by the process (the shim writes it) and read by `rdmashim ss` / `rdmashim stats`.
//!
//! This file is also compiled into the `rdmashim` launcher (`#[path]` module): plain safe Rust,
//! no dependencies. It knows the layout only; mapping and locking are `live.rs`'s.
//!
//! Layout (little-endian, every offset fixed by [`VERSION`]; a reader checks the magic, the
//! version and every size the header states against its own and the file's length):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `RDMSHLV\0` |
//! | 8 | 4 | layout version ([`VERSION`]) |
//! | 12 | 4 | header size ([`HEADER_LEN`]) |
//! | 16, 20, 24 | 4 each | counters: offset, slots, slot size ([`COUNTER_LEN`]) |
//! | 28, 32, 36 | 4 each | connections: offset, slots, slot size ([`CONN_LEN`]) |
//! | 40 | 4 | file size |
//! | 44, 48 | 4 each | pid, ppid (the parent when the record began) |
//! | 52 | 4 | state: 1 running, 2 ended (exit), 3 exec (the image was replaced) |
//! | 56 | 8 | update sequence: odd while the shim writes, even when it is done |
//! | 64 | 8 | `started_unix_ms` (as in the stats JSON) |
//! | 72 | 8 | the process's start time, clock ticks after boot (`/proc/PID/stat` field 22; 0: unknown) |
//! | 80 | 8 | `heartbeat_unix_ms`: when the counters were last published |
//! | 88 | 2 + 255 | program: length, then its bytes |
//! | 352 | 32 | the shim's version, NUL-padded |
//!
//! A counter slot: group (u8, [`GROUPS`]; 0xff: unused), name length (u8), name (22 bytes),
//! value (u64 at 24). The names are written once, when the file is made: a reader needs no list
//! of hooks or reasons of its own, and counters may be added without a new layout version.
//!
//! A connection slot: in use (u32 at 0: 1), fd (i32 at 4), transport (u8 at 8: 0 TCP, 1 shared
//! memory, 2 RDMA), state (9, [`ConnState`]), side (10: 0 unknown, 1 client, 2 server), local
//! and peer address families (11, 12: 0 none, 4, 6), local port (u16 at 14), peer port (u16 at
//! 16), local address (16 bytes at 18; IPv4 in the first 4), peer address (16 bytes at 34),
//! bytes sent (u64 at 56) and received (u64 at 64; `u64::MAX` both: not counted), since (u64 at
//! 72, ms since the epoch), fallback reason (u8 length at 80, name at 81..112).
#![forbid(unsafe_code)]

use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

pub const MAGIC: [u8; 8] = *b"RDMSHLV\0";
pub const VERSION: u32 = 1;
pub const HEADER_LEN: usize = 1024;
pub const COUNTER_LEN: usize = 32;
pub const COUNTERS: usize = 256;
pub const CONN_LEN: usize = 128;
/// Connections a file lists at once; more are left out (the header's counters still count
/// them).
pub const CONNS: usize = 256;
pub const COUNTER_OFF: usize = HEADER_LEN;
pub const CONN_OFF: usize = COUNTER_OFF + COUNTERS * COUNTER_LEN;
/// The file's size: header, counters, connections, rounded up to whole pages.
pub const FILE_LEN: usize = (CONN_OFF + CONNS * CONN_LEN).div_ceil(4096) * 4096;
/// The longest counter name.
pub const NAME_MAX: usize = 22;
pub const PROGRAM_MAX: usize = 255;
const PROGRAM_OFF: usize = 88;
const SHIM_VERSION_OFF: usize = 352;
const SHIM_VERSION_MAX: usize = 32;
pub const SEQ_OFF: usize = 56;
pub const STATE_OFF: usize = 52;
pub const HEARTBEAT_OFF: usize = 80;
const REASON_MAX: usize = 31;

/// The counter groups, as the stats JSON nests them (`fallback_reasons` inside `connections`).
pub const GROUPS: [&str; 8] = [
    "calls",
    "connections",
    "fallback_reasons",
    "bytes",
    "waits",
    "output",
    "security",
    "fds",
];

/// The record's state in the header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordState {
    Running = 1,
    /// The process exited (the shim's destructor or `_exit` ran).
    Ended = 2,
    /// The process replaced its image.
    Exec = 3,
}

impl RecordState {
    fn from_u32(v: u32) -> Option<RecordState> {
        [RecordState::Running, RecordState::Ended, RecordState::Exec]
            .into_iter()
            .find(|s| *s as u32 == v)
    }
    pub fn name(self) -> &'static str {
        match self {
            RecordState::Running => "running",
            RecordState::Ended => "ended",
            RecordState::Exec => "exec",
        }
    }
}

/// A connection's transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    Tcp = 0,
    Shm = 1,
    Rdma = 2,
}

impl Via {
    pub fn name(self) -> &'static str {
        match self {
            Via::Tcp => "tcp",
            Via::Shm => "shm",
            Via::Rdma => "rdma",
        }
    }
}

/// Where a listed connection stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnState {
    /// Plain TCP for good (never under the upgrade, or fell back: the reason says why).
    Tcp = 0,
    /// Under the upgrade, not decided yet (its bytes still go over TCP).
    Upgrading = 1,
    /// On the rings ([`Via`] says which).
    Ring = 2,
    /// Was on the rings and went back to TCP at exact offsets (`switched_back`).
    SwitchedBack = 3,
    /// Was on the rings, whose path failed: on TCP from the agreed byte on (`path_failed`).
    PathFailed = 4,
}

impl ConnState {
    const ALL: [ConnState; 5] = [
        ConnState::Tcp,
        ConnState::Upgrading,
        ConnState::Ring,
        ConnState::SwitchedBack,
        ConnState::PathFailed,
    ];
    pub fn name(self) -> &'static str {
        match self {
            ConnState::Tcp => "tcp",
            ConnState::Upgrading => "upgrading",
            ConnState::Ring => "ring",
            ConnState::SwitchedBack => "switched_back",
            ConnState::PathFailed => "path_failed",
        }
    }
}

/// One listed connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conn {
    pub fd: i32,
    pub via: Via,
    pub state: ConnState,
    /// `Some(true)`: client (connected), `Some(false)`: server (accepted).
    pub client: Option<bool>,
    pub local: Option<SocketAddr>,
    pub peer: Option<SocketAddr>,
    /// Bytes sent and received on it, as the shim counted them (`None`: not counted, as for
    /// a connection that was never under the upgrade: its bytes take the pass-through path).
    pub tx: Option<u64>,
    pub rx: Option<u64>,
    pub since_unix_ms: u64,
    /// Why it stays TCP (empty: none recorded).
    pub reason: Cow<'static, str>,
}

/// One counter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counter {
    pub group: usize,
    pub name: String,
    pub value: u64,
}

/// A whole file, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub pid: u32,
    pub ppid: u32,
    pub state: RecordState,
    pub seq: u64,
    pub started_unix_ms: u64,
    pub proc_start_ticks: u64,
    pub heartbeat_unix_ms: u64,
    /// The program's name, bytes that are not UTF-8 as U+FFFD (empty: unknown).
    pub program: String,
    pub version: String,
    pub counters: Vec<Counter>,
    pub conns: Vec<Conn>,
}

impl Record {
    /// The shim was writing when the copy was taken (the sequence is odd): the figures of the
    /// update under way may be half written. A process killed mid-update stays so.
    pub fn torn(&self) -> bool {
        self.seq & 1 == 1
    }

    /// The counter `name` of group `group` (0 if absent).
    pub fn counter(&self, group: &str, name: &str) -> u64 {
        self.counters
            .iter()
            .find(|c| GROUPS.get(c.group) == Some(&group) && c.name == name)
            .map_or(0, |c| c.value)
    }
}

/// Why a file is not a valid live record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    Short(usize),
    Magic,
    Version(u32),
    Sizes(&'static str),
    Field(&'static str),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Short(n) => write!(f, "too short ({n} bytes) for a live record"),
            DecodeError::Magic => write!(f, "not an rdmashim live record (bad magic)"),
            DecodeError::Version(v) => {
                write!(f, "layout version {v}, this reader knows {VERSION}")
            }
            DecodeError::Sizes(w) => write!(f, "inconsistent sizes: {w}"),
            DecodeError::Field(w) => write!(f, "invalid field: {w}"),
        }
    }
}

// ----- writing: plain stores into the caller's bytes (the shim's mapping, or a test's buffer)

fn put(b: &mut [u8], at: usize, v: &[u8]) {
    if let Some(d) = b.get_mut(at..at + v.len()) {
        d.copy_from_slice(v);
    }
}

pub fn put_u32(b: &mut [u8], at: usize, v: u32) {
    put(b, at, &v.to_le_bytes());
}

pub fn put_u64(b: &mut [u8], at: usize, v: u64) {
    put(b, at, &v.to_le_bytes());
}

/// Who the record is of: what [`init`] writes once.
pub struct Identity<'a> {
    pub pid: u32,
    pub ppid: u32,
    pub started_unix_ms: u64,
    pub proc_start_ticks: u64,
    pub program: &'a [u8],
    pub version: &'a str,
}

/// Writes a fresh record into `b` (at least [`FILE_LEN`] bytes, zeroed): the header, the
/// counters' names (`names`: group and name, in the order [`set_counters`] gives values) and
/// an empty connection table.
pub fn init<'n>(b: &mut [u8], id: &Identity<'_>, names: impl Iterator<Item = (usize, &'n str)>) {
    put(b, 0, &MAGIC);
    for (at, v) in [
        (8, VERSION),
        (12, HEADER_LEN as u32),
        (16, COUNTER_OFF as u32),
        (20, COUNTERS as u32),
        (24, COUNTER_LEN as u32),
        (28, CONN_OFF as u32),
        (32, CONNS as u32),
        (36, CONN_LEN as u32),
        (40, FILE_LEN as u32),
        (44, id.pid),
        (48, id.ppid),
        (STATE_OFF, RecordState::Running as u32),
    ] {
        put_u32(b, at, v);
    }
    put_u64(b, SEQ_OFF, 0);
    put_u64(b, 64, id.started_unix_ms);
    put_u64(b, 72, id.proc_start_ticks);
    let prog = id.program.get(..PROGRAM_MAX).unwrap_or(id.program);
    put(b, PROGRAM_OFF, &(prog.len() as u16).to_le_bytes());
    put(b, PROGRAM_OFF + 2, prog);
    let v = id.version.as_bytes();
    put(b, SHIM_VERSION_OFF, v.get(..SHIM_VERSION_MAX).unwrap_or(v));
    let mut n = 0;
    for (group, name) in names.take(COUNTERS) {
        let name = name.as_bytes();
        let name = name.get(..NAME_MAX).unwrap_or(name);
        let at = COUNTER_OFF + n * COUNTER_LEN;
        put(b, at, &[group as u8, name.len() as u8]);
        put(b, at + 2, name);
        n += 1;
    }
    for i in n..COUNTERS {
        put(b, COUNTER_OFF + i * COUNTER_LEN, &[0xff]);
    }
}

/// Writes the counters' values, in the order of the names given to [`init`].
pub fn set_counters(b: &mut [u8], values: impl Iterator<Item = u64>) {
    for (i, v) in values.take(COUNTERS).enumerate() {
        put_u64(b, COUNTER_OFF + i * COUNTER_LEN + 24, v);
    }
}

/// The offset of connection slot `i`.
pub fn conn_at(i: usize) -> usize {
    CONN_OFF + i * CONN_LEN
}

/// Whether connection slot `i` is in use, and its fd.
pub fn conn_slot(b: &[u8], i: usize) -> Option<(bool, i32)> {
    let at = conn_at(i);
    Some((get_u32(b, at)? == 1, get_u32(b, at + 4)? as i32))
}

fn put_addr(b: &mut [u8], fam_at: usize, port_at: usize, ip_at: usize, a: Option<SocketAddr>) {
    let (fam, port, ip) = match a {
        None => (0u8, 0u16, [0u8; 16]),
        Some(SocketAddr::V4(a)) => {
            let mut ip = [0u8; 16];
            ip[..4].copy_from_slice(&a.ip().octets());
            (4, a.port(), ip)
        }
        Some(SocketAddr::V6(a)) => (6, a.port(), a.ip().octets()),
    };
    put(b, fam_at, &[fam]);
    put(b, port_at, &port.to_le_bytes());
    put(b, ip_at, &ip);
}

/// Whether connection slot `i` lists the connection `local` → `peer` (the addresses
/// [`put_conn`] wrote): a slot is found by its fd, whose number a connection closed meanwhile
/// may have handed on to another.
pub fn conn_is(b: &[u8], i: usize, local: SocketAddr, peer: SocketAddr) -> bool {
    let at = conn_at(i);
    let mut want = [0u8; CONN_LEN];
    put_addr(&mut want, 11, 14, 18, Some(local));
    put_addr(&mut want, 12, 16, 34, Some(peer));
    // (the families, then the ports and addresses, which follow one another)
    b.get(at + 11..at + 13) == want.get(11..13) && b.get(at + 14..at + 50) == want.get(14..50)
}

/// Writes connection slot `i` (in use).
pub fn put_conn(b: &mut [u8], i: usize, c: &Conn) {
    let at = conn_at(i);
    put_u32(b, at, 1);
    put_u32(b, at + 4, c.fd as u32);
    let side = match c.client {
        None => 0,
        Some(true) => 1,
        Some(false) => 2,
    };
    put(b, at + 8, &[c.via as u8, c.state as u8, side]);
    put_addr(b, at + 11, at + 14, at + 18, c.local);
    put_addr(b, at + 12, at + 16, at + 34, c.peer);
    put_u64(b, at + 56, c.tx.unwrap_or(u64::MAX));
    put_u64(b, at + 64, c.rx.unwrap_or(u64::MAX));
    put_u64(b, at + 72, c.since_unix_ms);
    set_reason(b, i, &c.reason);
}

/// Sets the state (and transport) of connection slot `i`.
pub fn set_conn_state(b: &mut [u8], i: usize, via: Via, state: ConnState) {
    put(b, conn_at(i) + 8, &[via as u8, state as u8]);
}

/// Sets the fallback reason of connection slot `i`.
pub fn set_reason(b: &mut [u8], i: usize, reason: &str) {
    let at = conn_at(i);
    let r = reason.as_bytes();
    let r = r.get(..REASON_MAX).unwrap_or(r);
    let mut field = [0u8; REASON_MAX + 1];
    field[0] = r.len() as u8;
    field[1..=r.len()].copy_from_slice(r);
    put(b, at + 80, &field);
}

/// Sets the byte counts of connection slot `i`.
pub fn set_conn_bytes(b: &mut [u8], i: usize, tx: u64, rx: u64) {
    let at = conn_at(i);
    put_u64(b, at + 56, tx);
    put_u64(b, at + 64, rx);
}

/// Connection slot `i` as it is, if in use (a fork child copies its parent's).
pub fn conn_raw(b: &[u8], i: usize) -> Option<[u8; CONN_LEN]> {
    let at = conn_at(i);
    let raw: [u8; CONN_LEN] = b.get(at..at + CONN_LEN)?.try_into().ok()?;
    (get_u32(&raw, 0) == Some(1)).then_some(raw)
}

/// Writes `raw` (from [`conn_raw`]) into connection slot `i`, its byte counts from zero if
/// it had any.
pub fn put_conn_raw(b: &mut [u8], i: usize, raw: &[u8; CONN_LEN]) {
    put(b, conn_at(i), raw);
    if get_u64(raw, 56) != Some(u64::MAX) {
        set_conn_bytes(b, i, 0, 0);
    }
}

/// Frees connection slot `i`.
pub fn clear_conn(b: &mut [u8], i: usize) {
    put(b, conn_at(i), &[0u8; CONN_LEN]);
}

// ----- reading: every field checked, nothing trusted

fn get<const N: usize>(b: &[u8], at: usize) -> Option<[u8; N]> {
    b.get(at..at.checked_add(N)?)?.try_into().ok()
}

pub fn get_u32(b: &[u8], at: usize) -> Option<u32> {
    get::<4>(b, at).map(u32::from_le_bytes)
}

pub fn get_u64(b: &[u8], at: usize) -> Option<u64> {
    get::<8>(b, at).map(u64::from_le_bytes)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn get_addr(
    b: &[u8],
    fam_at: usize,
    port_at: usize,
    ip_at: usize,
) -> Result<Option<SocketAddr>, DecodeError> {
    let bad = DecodeError::Field("address");
    let fam = *b.get(fam_at).ok_or(bad.clone())?;
    let port = get::<2>(b, port_at)
        .map(u16::from_le_bytes)
        .ok_or(bad.clone())?;
    let ip = get::<16>(b, ip_at).ok_or(bad.clone())?;
    Ok(match fam {
        0 => None,
        4 => Some(SocketAddr::new(
            IpAddr::V4(Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3])),
            port,
        )),
        6 => Some(SocketAddr::new(IpAddr::V6(Ipv6Addr::from(ip)), port)),
        _ => return Err(bad),
    })
}

fn decode_conn(b: &[u8], at: usize) -> Result<Conn, DecodeError> {
    let f = |w| DecodeError::Field(w);
    let fd = get_u32(b, at + 4).ok_or(f("fd"))? as i32;
    let via = match b.get(at + 8) {
        Some(0) => Via::Tcp,
        Some(1) => Via::Shm,
        Some(2) => Via::Rdma,
        _ => return Err(f("transport")),
    };
    let state = b
        .get(at + 9)
        .and_then(|s| ConnState::ALL.into_iter().find(|c| *c as u8 == *s))
        .ok_or(f("connection state"))?;
    let client = match b.get(at + 10) {
        Some(0) => None,
        Some(1) => Some(true),
        Some(2) => Some(false),
        _ => return Err(f("side")),
    };
    let local = get_addr(b, at + 11, at + 14, at + 18)?;
    let peer = get_addr(b, at + 12, at + 16, at + 34)?;
    let count = |v: u64| (v != u64::MAX).then_some(v);
    let tx = count(get_u64(b, at + 56).ok_or(f("bytes"))?);
    let rx = count(get_u64(b, at + 64).ok_or(f("bytes"))?);
    let since_unix_ms = get_u64(b, at + 72).ok_or(f("since"))?;
    let rlen = usize::from(*b.get(at + 80).ok_or(f("reason"))?);
    if rlen > REASON_MAX {
        return Err(f("reason length"));
    }
    let reason = Cow::Owned(text(b.get(at + 81..at + 81 + rlen).ok_or(f("reason"))?));
    Ok(Conn {
        fd,
        via,
        state,
        client,
        local,
        peer,
        tx,
        rx,
        since_unix_ms,
        reason,
    })
}

/// Decodes a copy of a whole file. Checks the magic, the version, that every size the header
/// states is this layout's and fits in `b`, and every field's range; never panics.
pub fn decode(b: &[u8]) -> Result<Record, DecodeError> {
    if b.len() < HEADER_LEN {
        return Err(DecodeError::Short(b.len()));
    }
    if get::<8>(b, 0) != Some(MAGIC) {
        return Err(DecodeError::Magic);
    }
    let u = |at| get_u32(b, at).unwrap_or(0) as usize;
    let version = u(8) as u32;
    if version != VERSION {
        return Err(DecodeError::Version(version));
    }
    for (at, want, what) in [
        (12, HEADER_LEN, "header size"),
        (16, COUNTER_OFF, "counters' offset"),
        (20, COUNTERS, "counter slots"),
        (24, COUNTER_LEN, "counter slot size"),
        (28, CONN_OFF, "connections' offset"),
        (32, CONNS, "connection slots"),
        (36, CONN_LEN, "connection slot size"),
        (40, FILE_LEN, "file size"),
    ] {
        if u(at) != want {
            return Err(DecodeError::Sizes(what));
        }
    }
    if b.len() < FILE_LEN {
        return Err(DecodeError::Short(b.len()));
    }
    let state = RecordState::from_u32(u(STATE_OFF) as u32).ok_or(DecodeError::Field("state"))?;
    let plen = get::<2>(b, PROGRAM_OFF).map_or(0, u16::from_le_bytes) as usize;
    if plen > PROGRAM_MAX {
        return Err(DecodeError::Field("program length"));
    }
    let program = text(&b[PROGRAM_OFF + 2..PROGRAM_OFF + 2 + plen]);
    let v = &b[SHIM_VERSION_OFF..SHIM_VERSION_OFF + SHIM_VERSION_MAX];
    let version = text(&v[..v.iter().position(|c| *c == 0).unwrap_or(v.len())]);
    let mut counters = Vec::new();
    for i in 0..COUNTERS {
        let at = COUNTER_OFF + i * COUNTER_LEN;
        let group = usize::from(b[at]);
        if group == 0xff {
            continue;
        }
        let len = usize::from(b[at + 1]);
        if group >= GROUPS.len() || len > NAME_MAX {
            return Err(DecodeError::Field("counter"));
        }
        counters.push(Counter {
            group,
            name: text(&b[at + 2..at + 2 + len]),
            value: get_u64(b, at + 24).unwrap_or(0),
        });
    }
    let mut conns = Vec::new();
    for i in 0..CONNS {
        match conn_slot(b, i) {
            Some((true, _)) => conns.push(decode_conn(b, conn_at(i))?),
            Some((false, _)) if get_u32(b, conn_at(i)) == Some(0) => {}
            _ => return Err(DecodeError::Field("connection slot")),
        }
    }
    Ok(Record {
        pid: u(44) as u32,
        ppid: u(48) as u32,
        state,
        seq: get_u64(b, SEQ_OFF).unwrap_or(0),
        started_unix_ms: get_u64(b, 64).unwrap_or(0),
        proc_start_ticks: get_u64(b, 72).unwrap_or(0),
        heartbeat_unix_ms: get_u64(b, HEARTBEAT_OFF).unwrap_or(0),
        program,
        version,
        counters,
        conns,
    })
}

/// The file name of `pid`'s record.
pub fn file_name(pid: u32) -> String {
    format!("{pid}.live")
}

/// The pid a file name names, if it is a record's (`PID.live`).
pub fn pid_of(name: &str) -> Option<u32> {
    let p = name.strip_suffix(".live")?;
    (!p.is_empty() && p.bytes().all(|c| c.is_ascii_digit()))
        .then(|| p.parse().ok())
        .flatten()
}

/// A process's start time in clock ticks after boot: field 22 of `/proc/PID/stat`'s text
/// (the fields after the name's closing parenthesis, which the name itself may contain).
pub fn stat_start_ticks(stat: &[u8]) -> Option<u64> {
    let close = stat.iter().rposition(|c| *c == b')')?;
    let rest = std::str::from_utf8(stat.get(close + 1..)?).ok()?;
    rest.split_ascii_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let mut b = vec![0u8; FILE_LEN];
        let id = Identity {
            pid: 4242,
            ppid: 1,
            started_unix_ms: 1_700_000_000_000,
            proc_start_ticks: 12345,
            program: b"redis-\xffserver",
            version: "0.1.0",
        };
        init(
            &mut b,
            &id,
            [
                (0, "read"),
                (1, "upgraded"),
                (2, "not_upgradable_address"),
                (3, "shm_tx"),
            ]
            .into_iter(),
        );
        set_counters(&mut b, [7, 1, 2, u64::MAX].into_iter());
        put_conn(
            &mut b,
            3,
            &Conn {
                fd: 9,
                via: Via::Shm,
                state: ConnState::Ring,
                client: Some(true),
                local: Some("127.0.0.1:40000".parse().unwrap()),
                peer: Some("[::1]:7000".parse().unwrap()),
                tx: Some(10),
                rx: None,
                since_unix_ms: 5,
                reason: "".into(),
            },
        );
        put_conn(
            &mut b,
            0,
            &Conn {
                fd: 4,
                via: Via::Tcp,
                state: ConnState::Tcp,
                client: Some(false),
                local: None,
                peer: Some("10.0.0.1:1".parse().unwrap()),
                tx: None,
                rx: None,
                since_unix_ms: 6,
                reason: "plain_peer".into(),
            },
        );
        b
    }

    #[test]
    fn round_trip() {
        let mut b = sample();
        let r = decode(&b).unwrap();
        assert_eq!((r.pid, r.ppid, r.state), (4242, 1, RecordState::Running));
        assert_eq!(r.program, "redis-\u{fffd}server");
        assert_eq!(r.version, "0.1.0");
        assert_eq!(r.proc_start_ticks, 12345);
        assert_eq!(r.counter("calls", "read"), 7);
        assert_eq!(r.counter("fallback_reasons", "not_upgradable_address"), 2);
        assert_eq!(r.counter("bytes", "shm_tx"), u64::MAX);
        assert_eq!(r.counters.len(), 4);
        assert_eq!(r.conns.len(), 2);
        assert_eq!(r.conns[0].reason, "plain_peer");
        assert_eq!(r.conns[0].local, None);
        let c = &r.conns[1];
        assert_eq!(
            (c.fd, c.via, c.state, c.client),
            (9, Via::Shm, ConnState::Ring, Some(true))
        );
        assert_eq!(c.peer, Some("[::1]:7000".parse().unwrap()));
        assert_eq!((c.tx, c.rx), (Some(10), None));
        assert!(!r.torn());
        set_conn_state(&mut b, 3, Via::Tcp, ConnState::SwitchedBack);
        set_conn_bytes(&mut b, 3, 11, 12);
        clear_conn(&mut b, 0);
        put_u64(&mut b, SEQ_OFF, 3);
        let r = decode(&b).unwrap();
        assert_eq!(r.conns.len(), 1);
        assert_eq!(r.conns[0].state, ConnState::SwitchedBack);
        assert_eq!((r.conns[0].tx, r.conns[0].rx), (Some(11), Some(12)));
        assert!(r.torn());
    }

    #[test]
    fn a_slot_is_known_by_its_connections_addresses() {
        let b = sample();
        let (local, peer) = (
            "127.0.0.1:40000".parse().unwrap(),
            "[::1]:7000".parse().unwrap(),
        );
        assert!(conn_is(&b, 3, local, peer));
        // (the same fd's next connection: another port, or the addresses the other way round)
        assert!(!conn_is(&b, 3, "127.0.0.1:40001".parse().unwrap(), peer));
        assert!(!conn_is(&b, 3, local, "[::1]:7001".parse().unwrap()));
        assert!(!conn_is(&b, 3, local, "127.0.0.1:7000".parse().unwrap()));
        assert!(!conn_is(&b, 3, peer, local));
        // (a slot without a local address, and one past the file's end)
        assert!(!conn_is(&b, 0, local, "10.0.0.1:1".parse().unwrap()));
        assert!(!conn_is(&b, CONNS + 10_000, local, peer));
    }

    #[test]
    fn corrupted_files_are_errors() {
        let good = sample();
        assert!(matches!(decode(&good[..100]), Err(DecodeError::Short(100))));
        assert!(matches!(
            decode(&good[..FILE_LEN - 1]),
            Err(DecodeError::Short(_))
        ));
        let mut b = good.clone();
        b[0] = b'X';
        assert_eq!(decode(&b), Err(DecodeError::Magic));
        let mut b = good.clone();
        put_u32(&mut b, 8, 99);
        assert_eq!(decode(&b), Err(DecodeError::Version(99)));
        for at in [12, 20, 32, 36, 40] {
            let mut b = good.clone();
            put_u32(&mut b, at, u32::MAX);
            assert!(matches!(decode(&b), Err(DecodeError::Sizes(_))), "{at}");
        }
        let mut b = good.clone();
        put_u32(&mut b, STATE_OFF, 9);
        assert_eq!(decode(&b), Err(DecodeError::Field("state")));
        let mut b = good.clone();
        b[PROGRAM_OFF] = 0xff;
        b[PROGRAM_OFF + 1] = 0xff;
        assert!(decode(&b).is_err());
        let mut b = good.clone();
        b[COUNTER_OFF + 1] = 200;
        assert!(decode(&b).is_err());
        let mut b = good.clone();
        b[conn_at(3) + 8] = 7;
        assert!(decode(&b).is_err());
        let mut b = good.clone();
        b[conn_at(3) + 80] = 250;
        assert!(decode(&b).is_err());
        let mut b = good.clone();
        put_u32(&mut b, conn_at(5), 2);
        assert!(decode(&b).is_err());
        // Any byte flipped anywhere: an answer or an error, never a panic.
        for at in (0..FILE_LEN).step_by(7) {
            let mut b = good.clone();
            b[at] ^= 0xa5;
            let _ = decode(&b);
        }
        for len in [0, 7, 8, 1023, 1024, 4096] {
            let _ = decode(&good[..len]);
        }
    }

    #[test]
    fn names() {
        assert_eq!(pid_of("123.live"), Some(123));
        for bad in [
            "x.live",
            ".live",
            "123.live.tmp",
            "123",
            "-1.live",
            "99999999999.live",
        ] {
            assert_eq!(pid_of(bad), None, "{bad}");
        }
        assert_eq!(pid_of(&file_name(77)), Some(77));
        let stat = b"77 (a) b) c) S 1 77 77 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 98765 1000 10";
        assert_eq!(stat_start_ticks(stat), Some(98765));
        assert_eq!(stat_start_ticks(b"77 (x"), None);
        assert_eq!(FILE_LEN % 4096, 0);
    }
}
