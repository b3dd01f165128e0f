//! Socket behaviour scenarios, one per behaviour, each with a server and a client role:
//!
//!   behave SCENARIO server IP        listens on IP:0, prints "port N", serves one connection
//!   behave SCENARIO client IP PORT   connects and plays the other side
//!
//! Each role asserts what Linux's TCP does (the tests in tests/behaviour_*.rs run every
//! scenario without the shim too, so the expectations are the kernel's own) and prints
//! "ok SCENARIO ROLE" on success; any deviation panics (exit code 101) with the details.
//! Under the shim with RDMA, the same scenarios prove the upgraded connection behaves like TCP.
//! With `BEHAVE_SETTLE_MS=N` set, the server waits N ms after accepting before it plays its
//! part: the RDMA tier uses it so that the upgrade (asynchronous: the application never waits
//! for it) is decided before the scenario's data moves.
//!
//! The calls are made through libc (so they pass through the shim's hooks), with the raw
//! errno checked where the behaviour is an error.

use std::ffi::c_void;
use std::io::{Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, RawFd};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(10);

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// poll(2) on one fd; returns revents.
fn poll1(fd: RawFd, events: i16, timeout_ms: i32) -> i16 {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut p, 1, timeout_ms) };
    assert!(n >= 0, "poll: errno {}", errno());
    p.revents
}

/// The events of one epoll_wait on `ep` (at most 8), each checked to carry `data`.
fn epoll_events(ep: RawFd, data: u64, timeout_ms: i32) -> Vec<u32> {
    let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 8];
    // SAFETY: evs has room for 8 events.
    let n = unsafe { libc::epoll_wait(ep, evs.as_mut_ptr(), 8, timeout_ms) };
    assert!(n >= 0, "epoll_wait errno {}", errno());
    evs[..n as usize]
        .iter()
        .map(|e| {
            assert_eq!({ e.u64 }, data, "epoll data not ours");
            e.events
        })
        .collect()
}

fn recv_flags(fd: RawFd, buf: &mut [u8], flags: i32) -> isize {
    // SAFETY: buf is valid for buf.len() bytes.
    unsafe { libc::recv(fd, buf.as_mut_ptr().cast::<c_void>(), buf.len(), flags) }
}

fn send_flags(fd: RawFd, buf: &[u8], flags: i32) -> isize {
    // SAFETY: buf is valid for buf.len() bytes.
    unsafe { libc::send(fd, buf.as_ptr().cast::<c_void>(), buf.len(), flags) }
}

fn read_exact_fd(fd: RawFd, n: usize) -> Vec<u8> {
    let mut out = vec![0u8; n];
    let mut got = 0;
    let deadline = Instant::now() + T;
    while got < n {
        assert!(
            Instant::now() < deadline,
            "read_exact timed out at {got}/{n}"
        );
        let r = recv_flags(fd, &mut out[got..], 0);
        assert!(r > 0, "recv returned {r} (errno {}) at {got}/{n}", errno());
        got += r as usize;
    }
    out
}

fn read_to_eof(s: &mut TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(T)).unwrap();
    let mut v = Vec::new();
    s.read_to_end(&mut v).expect("read to EOF");
    v
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).wrapping_shr(13) as u8 ^ seed)
        .collect()
}

/// A server's first part in the scenarios whose client waits in a blocking recv: `rounds`
/// echoes of `msg`-byte messages, then three answers (`pattern(msg, i)`), each asked for by
/// the command byte `b'a' + i` and written `delay` after it (the client sleeps meanwhile).
fn echo_then_late_answers(s: &mut TcpStream, msg: usize, rounds: usize, delay: Duration) {
    s.set_read_timeout(Some(T)).unwrap();
    let mut buf = vec![0u8; msg];
    for _ in 0..rounds {
        s.read_exact(&mut buf).unwrap();
        s.write_all(&buf).unwrap();
    }
    for i in 0..3u8 {
        let mut cmd = [0u8; 1];
        s.read_exact(&mut cmd).unwrap();
        assert_eq!(cmd[0], b'a' + i, "command {i}");
        std::thread::sleep(delay);
        s.write_all(&pattern(msg, i)).unwrap();
    }
}

/// The client's side of [`echo_then_late_answers`]' echoes: `rounds` `msg`-byte messages
/// (`pattern(msg, i ^ seed)`), each read back whole and checked.
fn ping_pong(s: &mut TcpStream, msg: usize, rounds: usize, seed: u8) {
    let mut got = vec![0u8; msg];
    for i in 0..rounds {
        let out = pattern(msg, i as u8 ^ seed);
        s.write_all(&out).unwrap();
        s.read_exact(&mut got).unwrap();
        assert!(got == out, "round {i} came back different");
    }
}

fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// Waits for fork child `pid`, which served the connection, and fails unless it exited 0.
fn wait_child(pid: libc::pid_t) {
    let mut st = 0;
    // SAFETY: our child.
    unsafe { libc::waitpid(pid, &mut st, 0) };
    assert!(
        libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
        "the child that served the connection failed ({st:#x})"
    );
}

/// A system call made with the instruction itself (the kernel's convention for this
/// architecture): no library function runs, so no preloaded hook sees it — as in liburing,
/// Go, a static helper. Returns the kernel's result (`-errno` on failure).
fn unseen_syscall(nr: i64, a: [i64; 6]) -> i64 {
    // SAFETY: the caller's system call with its arguments (rdmashim-core's inline system
    // call: the instruction itself, never glibc's `syscall`).
    let r = unsafe { rdmashim_core::sys::syscall6(nr, a) };
    if r == -1 {
        -i64::from(errno())
    } else {
        r
    }
}

fn sleep_ms(ms: u64) {
    std::thread::sleep(Duration::from_millis(ms));
}

// ---------------------------------------------------------------------------------------------

/// Non-blocking connect: EINPROGRESS (or immediate success), POLLOUT, SO_ERROR 0; and to a
/// port nobody listens on: POLLOUT|POLLERR and SO_ERROR ECONNREFUSED.
mod nonblocking_connect {
    use super::*;

    pub fn server(mut s: TcpStream) {
        let mut b = [0u8; 5];
        s.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"hello");
        s.write_all(b"world").unwrap();
    }

    fn nb_connect(addr: SocketAddr) -> (RawFd, i32) {
        let fam = if addr.is_ipv4() {
            libc::AF_INET
        } else {
            libc::AF_INET6
        };
        // SAFETY: plain socket(2).
        let fd = unsafe { libc::socket(fam, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0) };
        assert!(fd >= 0);
        let (sa, len) = rdmashim_core::sockaddr::to_raw(addr);
        // SAFETY: sa holds a valid sockaddr of len bytes.
        let rc = unsafe { libc::connect(fd, (&sa as *const libc::sockaddr_storage).cast(), len) };
        (fd, if rc == 0 { 0 } else { errno() })
    }

    fn so_error(fd: RawFd) -> i32 {
        let mut e: i32 = -1;
        let mut l = std::mem::size_of::<i32>() as libc::socklen_t;
        // SAFETY: e/l are valid out-parameters of the right size.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_ERROR,
                (&mut e as *mut i32).cast(),
                &mut l,
            )
        };
        assert_eq!(rc, 0);
        e
    }

    pub fn client(addr: SocketAddr) {
        let (fd, e) = nb_connect(addr);
        assert!(e == 0 || e == libc::EINPROGRESS, "connect errno {e}");
        let rev = poll1(fd, libc::POLLOUT, 10_000);
        assert!(rev & libc::POLLOUT != 0, "no POLLOUT: {rev:#x}");
        assert_eq!(so_error(fd), 0);
        // Connecting again: Linux reports the completed asynchronous connect once (0), and
        // EISCONN from then on (a connect that succeeded at once goes straight to EISCONN).
        let again = || {
            let (sa, len) = rdmashim_core::sockaddr::to_raw(addr);
            // SAFETY: sa holds a valid sockaddr of len bytes.
            let rc =
                unsafe { libc::connect(fd, (&sa as *const libc::sockaddr_storage).cast(), len) };
            if rc == 0 {
                0
            } else {
                errno()
            }
        };
        if e == libc::EINPROGRESS {
            assert_eq!(
                again(),
                0,
                "the first connect after completion reports success"
            );
        }
        assert_eq!(again(), libc::EISCONN);
        // SAFETY: fd is ours; TcpStream takes ownership.
        let mut s = unsafe { TcpStream::from_raw_fd(fd) };
        s.set_nonblocking(false).unwrap();
        s.write_all(b"hello").unwrap();
        let mut b = [0u8; 5];
        s.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"world");

        // refused: a port that was just free
        let l = TcpListener::bind(SocketAddr::new(addr.ip(), 0)).unwrap();
        let closed = l.local_addr().unwrap();
        drop(l);
        let (fd, e) = nb_connect(closed);
        if e == libc::EINPROGRESS {
            let rev = poll1(fd, libc::POLLOUT, 10_000);
            assert!(
                rev & (libc::POLLERR | libc::POLLHUP) != 0,
                "refused: revents {rev:#x}"
            );
            assert_eq!(so_error(fd), libc::ECONNREFUSED);
        } else {
            assert_eq!(e, libc::ECONNREFUSED);
        }
        // SAFETY: our fd.
        unsafe { libc::close(fd) };
    }
}

/// Edge-triggered epoll: one event per arrival, none for data already reported; EPOLLRDHUP at
/// the peer's half-close; EPOLLONESHOT disarms until EPOLL_CTL_MOD.
mod epoll_et {
    use super::*;

    pub fn server(mut s: TcpStream) {
        let mut go = [0u8; 1];
        for chunk in [&b"first"[..], b"second", b"third", b"fourth"] {
            s.read_exact(&mut go).unwrap(); // the client asks for each chunk
            s.write_all(chunk).unwrap();
        }
        s.read_exact(&mut go).unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        // wait for the client to finish
        assert_eq!(read_to_eof(&mut s), b"");
    }

    fn wait(ep: RawFd, timeout_ms: i32) -> Vec<u32> {
        epoll_events(ep, 0xfeed, timeout_ms)
    }

    fn ctl(ep: RawFd, op: i32, fd: RawFd, events: u32) {
        let mut ev = libc::epoll_event {
            events,
            u64: 0xfeed,
        };
        // SAFETY: valid epoll fd, socket fd and event.
        let rc = unsafe { libc::epoll_ctl(ep, op, fd, &mut ev) };
        assert_eq!(rc, 0, "epoll_ctl errno {}", errno());
    }

    pub fn client(addr: SocketAddr) {
        let mut s = TcpStream::connect(addr).unwrap();
        let fd = s.as_raw_fd();
        // SAFETY: plain epoll_create1.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        assert!(ep >= 0);
        let et = (libc::EPOLLIN | libc::EPOLLET | libc::EPOLLRDHUP) as u32;
        ctl(ep, libc::EPOLL_CTL_ADD, fd, et);
        assert!(wait(ep, 100).is_empty(), "event before any data");

        s.write_all(b"g").unwrap();
        let ev = wait(ep, 10_000);
        assert_eq!(ev.len(), 1);
        assert!(ev[0] & libc::EPOLLIN as u32 != 0);
        // read part of it: edge-triggered, no new event for what is left
        let mut b = [0u8; 2];
        assert_eq!(recv_flags(fd, &mut b, 0), 2);
        assert!(
            wait(ep, 200).is_empty(),
            "ET reported data that was already reported"
        );
        let mut rest = [0u8; 3];
        assert_eq!(recv_flags(fd, &mut rest, 0), 3);
        assert_eq!([&b[..], &rest[..]].concat(), b"first");

        // EPOLLONESHOT: one report, then silence until re-armed
        ctl(
            ep,
            libc::EPOLL_CTL_MOD,
            fd,
            (libc::EPOLLIN | libc::EPOLLONESHOT) as u32,
        );
        s.write_all(b"g").unwrap();
        assert_eq!(wait(ep, 10_000).len(), 1);
        assert!(wait(ep, 200).is_empty(), "ONESHOT fired twice");
        ctl(
            ep,
            libc::EPOLL_CTL_MOD,
            fd,
            (libc::EPOLLIN | libc::EPOLLONESHOT) as u32,
        );
        assert_eq!(
            wait(ep, 1000).len(),
            1,
            "re-armed ONESHOT with data pending must fire"
        );
        assert_eq!(read_exact_fd(fd, 6), b"second");

        // level-triggered: reported again and again while data is unread
        ctl(
            ep,
            libc::EPOLL_CTL_MOD,
            fd,
            (libc::EPOLLIN | libc::EPOLLRDHUP) as u32,
        );
        s.write_all(b"g").unwrap();
        assert_eq!(wait(ep, 10_000).len(), 1);
        assert_eq!(wait(ep, 100).len(), 1, "LT must report unread data again");
        assert_eq!(read_exact_fd(fd, 5), b"third");
        assert!(wait(ep, 200).is_empty());

        // edge-triggered, data that arrived before a wait with timeout 0: reported by it
        ctl(ep, libc::EPOLL_CTL_MOD, fd, et);
        s.write_all(b"g").unwrap();
        sleep_ms(500);
        let ev = wait(ep, 0);
        assert_eq!(ev.len(), 1, "epoll_wait(0) after the data arrived");
        assert!(ev[0] & libc::EPOLLIN as u32 != 0, "events {:#x}", ev[0]);
        assert_eq!(read_exact_fd(fd, 6), b"fourth");
        assert!(wait(ep, 0).is_empty());
        ctl(
            ep,
            libc::EPOLL_CTL_MOD,
            fd,
            (libc::EPOLLIN | libc::EPOLLRDHUP) as u32,
        );

        // the peer's half-close: EPOLLIN | EPOLLRDHUP, and read returns 0
        s.write_all(b"g").unwrap();
        let ev = wait(ep, 10_000);
        assert_eq!(ev.len(), 1);
        let want = (libc::EPOLLIN | libc::EPOLLRDHUP) as u32;
        assert_eq!(ev[0] & want, want, "events {:#x}", ev[0]);
        assert_eq!(recv_flags(fd, &mut b, 0), 0);
        // SAFETY: our epoll fd.
        unsafe { libc::close(ep) };
        s.shutdown(Shutdown::Write).unwrap();
    }
}

/// epoll with EPOLL_CTL_DEL and ADD again, as event loops do when they stop and start wanting
/// a connection's events (redis' `ae` twice per request): data that arrived meanwhile is
/// reported after the re-ADD; after a DEL, poll(2), a blocking read and another epoll set
/// see the connection and the old set sees nothing of it; then many rounds of the `ae`
/// pattern (ADD for EPOLLOUT, write, DEL, ADD for EPOLLIN, read, DEL).
/// epoll registrations an event loop makes and drops on every request, and the sets they are
/// in: a thread asleep on a set learns of an fd added meanwhile; readiness at the ADD is
/// reported at once, again and again while it lasts (level-triggered), and no more after the
/// DEL; data that arrives while the fd is out of the set is neither reported then nor lost;
/// a set watched by poll(2) or nested in another set reports what it holds; EEXIST and ENOENT
/// as the kernel gives them. (Under the shim, once both directions are on the ring, these
/// registrations are kept in user space as long as they can be: docs/upgrade.md.)
mod epoll_defer {
    use super::*;

    pub fn server(mut s: TcpStream) {
        // (after the settle pause in the RDMA tier and over shared memory: on the ring)
        s.write_all(b"hi").unwrap();
        let mut b = [0u8; 1];
        loop {
            match s.read(&mut b) {
                Ok(0) => break,
                Ok(_) => s.write_all(&[b[0] ^ 0xff]).unwrap(),
                Err(e) => panic!("server read: {e}"),
            }
        }
    }

    fn ctl_errno(ep: RawFd, op: i32, fd: RawFd, events: u32, data: u64) -> i32 {
        let mut ev = libc::epoll_event { events, u64: data };
        // SAFETY: a valid epoll_event; the fds are the caller's.
        let rc = unsafe { libc::epoll_ctl(ep, op, fd, &mut ev) };
        if rc == 0 {
            0
        } else {
            errno()
        }
    }

    fn ctl(ep: RawFd, op: i32, fd: RawFd, events: u32, data: u64) {
        let e = ctl_errno(ep, op, fd, events, data);
        assert_eq!(e, 0, "epoll_ctl({op}) of fd {fd} in {ep}: errno {e}");
    }

    fn new_set() -> RawFd {
        // SAFETY: plain epoll_create1.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        assert!(ep >= 0, "epoll_create1 errno {}", errno());
        ep
    }

    fn close(fd: RawFd) {
        // SAFETY: an fd of ours.
        unsafe { libc::close(fd) };
    }

    const IN: u32 = libc::EPOLLIN as u32;
    const OUT: u32 = libc::EPOLLOUT as u32;

    /// One byte to the server and its answer, read through `ep` (the fd registered for
    /// reading, with data `fd`).
    fn round(ep: RawFd, fd: RawFd, i: u8) {
        assert_eq!(send_flags(fd, &[i], 0), 1);
        let deadline = Instant::now() + T;
        while !epoll_events(ep, fd as u64, 1000)
            .iter()
            .any(|e| e & IN != 0)
        {
            assert!(Instant::now() < deadline, "round {i}: no answer");
        }
        let mut b = [0u8; 1];
        assert_eq!(recv_flags(fd, &mut b, 0), 1, "round {i}");
        assert_eq!(b[0], i ^ 0xff, "round {i}");
    }

    pub fn client(addr: SocketAddr) {
        let s = TcpStream::connect(addr).unwrap();
        let fd = s.as_raw_fd();
        assert_eq!(read_exact_fd(fd, 2), b"hi");
        let data = fd as u64;

        // A thread asleep on an empty set wakes for an fd added meanwhile that is writable.
        let ep = new_set();
        let sleeper = std::thread::spawn(move || {
            let t = Instant::now();
            let evs = epoll_events(ep, data, 5000);
            (evs, t.elapsed())
        });
        sleep_ms(300);
        ctl(ep, libc::EPOLL_CTL_ADD, fd, OUT, data);
        let (evs, took) = sleeper.join().unwrap();
        assert_eq!(evs, [OUT], "the sleeper's events ({took:?})");
        assert!(
            took < Duration::from_secs(4),
            "the sleeper woke late: {took:?}"
        );
        ctl(ep, libc::EPOLL_CTL_DEL, fd, 0, 0);

        // Ready at the ADD: reported at once, and at every wait while registered.
        ctl(ep, libc::EPOLL_CTL_ADD, fd, OUT, data);
        assert_eq!(epoll_events(ep, data, 0), [OUT]);
        assert_eq!(epoll_events(ep, data, 1000), [OUT], "level-triggered");
        // (a MOD that adds reading: nothing to read, still writable)
        ctl(ep, libc::EPOLL_CTL_MOD, fd, IN | OUT, data);
        assert_eq!(epoll_events(ep, data, 0), [OUT]);
        ctl(ep, libc::EPOLL_CTL_MOD, fd, IN, data);
        assert!(
            epoll_events(ep, data, 0).is_empty(),
            "MOD took EPOLLOUT off"
        );
        ctl(ep, libc::EPOLL_CTL_DEL, fd, 0, 0);
        assert!(epoll_events(ep, data, 0).is_empty(), "after the DEL");

        // What the kernel answers, with the fd out of the set after registrations came and
        // went.
        assert_eq!(ctl_errno(ep, libc::EPOLL_CTL_DEL, fd, 0, 0), libc::ENOENT);
        assert_eq!(
            ctl_errno(ep, libc::EPOLL_CTL_MOD, fd, IN, data),
            libc::ENOENT
        );
        ctl(ep, libc::EPOLL_CTL_ADD, fd, IN, data);
        assert_eq!(
            ctl_errno(ep, libc::EPOLL_CTL_ADD, fd, OUT, data),
            libc::EEXIST
        );
        ctl(ep, libc::EPOLL_CTL_DEL, fd, 0, 0);

        // Data that arrives while the fd is out of the set: not reported (the wait lasts its
        // whole timeout), reported after the ADD, and read whole.
        ctl(ep, libc::EPOLL_CTL_ADD, fd, IN, data);
        ctl(ep, libc::EPOLL_CTL_DEL, fd, 0, 0);
        assert_eq!(send_flags(fd, &[7], 0), 1);
        sleep_ms(200);
        let t = Instant::now();
        assert!(
            epoll_events(ep, data, 400).is_empty(),
            "an fd out of the set"
        );
        assert!(
            t.elapsed() >= Duration::from_millis(350),
            "the wait ended early: {:?}",
            t.elapsed()
        );
        ctl(ep, libc::EPOLL_CTL_ADD, fd, IN, data);
        assert_eq!(epoll_events(ep, data, 1000), [IN]);
        let mut b = [0u8; 1];
        assert_eq!(recv_flags(fd, &mut b, 0), 1);
        assert_eq!(b[0], 7 ^ 0xff);
        assert!(epoll_events(ep, data, 0).is_empty(), "drained");
        ctl(ep, libc::EPOLL_CTL_DEL, fd, 0, 0);

        // A set watched by poll(2): its fd is readable when the set has something to report.
        let watched = new_set();
        ctl(watched, libc::EPOLL_CTL_ADD, fd, OUT, data);
        assert!(
            poll1(watched, libc::POLLIN, 2000) & libc::POLLIN != 0,
            "poll on an epoll set holding a writable fd"
        );
        assert_eq!(epoll_events(watched, data, 0), [OUT]);
        // (and later registrations in it too)
        ctl(watched, libc::EPOLL_CTL_DEL, fd, 0, 0);
        assert!(
            poll1(watched, libc::POLLIN, 0) & libc::POLLIN == 0,
            "empty set"
        );
        ctl(watched, libc::EPOLL_CTL_ADD, fd, OUT, data);
        assert!(
            poll1(watched, libc::POLLIN, 2000) & libc::POLLIN != 0,
            "re-added"
        );
        close(watched);

        // Sets nested in another: one that held the fd before it was nested, and one that
        // gets it after.
        let outer = new_set();
        let before = new_set();
        ctl(before, libc::EPOLL_CTL_ADD, fd, OUT, data);
        ctl(outer, libc::EPOLL_CTL_ADD, before, IN, 1000 + before as u64);
        let after = new_set();
        ctl(outer, libc::EPOLL_CTL_ADD, after, IN, 1000 + after as u64);
        ctl(after, libc::EPOLL_CTL_ADD, fd, OUT, data);
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 8];
        let mut got = Vec::new();
        let deadline = Instant::now() + T;
        while got.len() < 2 {
            assert!(Instant::now() < deadline, "nested sets reported {got:?}");
            // SAFETY: evs has room for 8 events.
            let n = unsafe { libc::epoll_wait(outer, evs.as_mut_ptr(), 8, 2000) };
            assert!(n >= 0, "epoll_wait errno {}", errno());
            for e in &evs[..n as usize] {
                let d = e.u64;
                if !got.contains(&d) {
                    got.push(d);
                }
            }
        }
        got.sort();
        assert_eq!(got, [1000 + before as u64, 1000 + after as u64]);
        assert_eq!(epoll_events(before, data, 0), [OUT]);
        assert_eq!(epoll_events(after, data, 0), [OUT]);
        for e in [after, before, outer] {
            close(e);
        }

        // The event loop's pattern: writable, write, DEL, ADD for reading, answer, DEL.
        for i in 0..200u8 {
            ctl(ep, libc::EPOLL_CTL_ADD, fd, OUT, data);
            assert_eq!(epoll_events(ep, data, 1000), [OUT], "round {i}");
            ctl(ep, libc::EPOLL_CTL_DEL, fd, 0, 0);
            ctl(ep, libc::EPOLL_CTL_ADD, fd, IN, data);
            round(ep, fd, i);
            ctl(ep, libc::EPOLL_CTL_DEL, fd, 0, 0);
        }
        close(ep);
        s.shutdown(Shutdown::Write).unwrap();
        let mut s = s;
        assert_eq!(read_to_eof(&mut s), b"");
    }
}

mod epoll_readd {
    use super::*;

    const ROUNDS: usize = 300;

    pub fn server(mut s: TcpStream) {
        let mut go = [0u8; 1];
        for chunk in [&b"one"[..], b"two", b"three", b"four", b"five"] {
            s.read_exact(&mut go).unwrap();
            // (late, so that the client's poll and blocking read wait for them)
            if chunk == b"three" || chunk == b"four" {
                sleep_ms(300);
            }
            s.write_all(chunk).unwrap();
        }
        for i in 0..ROUNDS {
            s.read_exact(&mut go).unwrap();
            assert_eq!(go[0], i as u8, "round {i}");
            s.write_all(&[go[0] ^ 0xff]).unwrap();
        }
        s.shutdown(Shutdown::Write).unwrap();
        assert_eq!(read_to_eof(&mut s), b"");
    }

    fn ctl(ep: RawFd, op: i32, fd: RawFd, events: u32) {
        let e = ctl_errno(ep, op, fd, events);
        assert_eq!(e, 0, "epoll_ctl({op}) errno {e}");
    }

    /// epoll_ctl's errno (0: success).
    fn ctl_errno(ep: RawFd, op: i32, fd: RawFd, events: u32) -> i32 {
        let mut ev = libc::epoll_event {
            events,
            u64: fd as u64,
        };
        // SAFETY: valid epoll fd, socket fd and event.
        let rc = unsafe { libc::epoll_ctl(ep, op, fd, &mut ev) };
        if rc == 0 {
            0
        } else {
            errno()
        }
    }

    /// The events of one epoll_wait (each for `fd`).
    fn wait(ep: RawFd, fd: RawFd, timeout_ms: i32) -> Vec<u32> {
        epoll_events(ep, fd as u64, timeout_ms)
    }

    fn wait_for(ep: RawFd, fd: RawFd, bit: i32, what: &str) {
        let deadline = Instant::now() + T;
        loop {
            assert!(Instant::now() < deadline, "{what}: no event");
            if wait(ep, fd, 1000).iter().any(|e| e & bit as u32 != 0) {
                return;
            }
        }
    }

    pub fn client(addr: SocketAddr) {
        let mut s = TcpStream::connect(addr).unwrap();
        let fd = s.as_raw_fd();
        // SAFETY: plain epoll_create1.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        assert!(ep >= 0);
        let rd = libc::EPOLLIN as u32;
        ctl(ep, libc::EPOLL_CTL_ADD, fd, rd);
        s.write_all(b"g").unwrap();
        wait_for(ep, fd, libc::EPOLLIN, "first chunk");
        assert_eq!(read_exact_fd(fd, 3), b"one");

        // DEL, the data arrives, ADD again: reported
        ctl(ep, libc::EPOLL_CTL_DEL, fd, 0);
        s.write_all(b"g").unwrap();
        sleep_ms(300); // (arrived while the fd was out of the set)
        ctl(ep, libc::EPOLL_CTL_ADD, fd, rd);
        wait_for(ep, fd, libc::EPOLLIN, "data pending at the re-ADD");
        assert_eq!(read_exact_fd(fd, 3), b"two");

        // after a DEL: poll(2) sees the data (at once: the server answers in well under a
        // second, even in the emulated VM)
        ctl(ep, libc::EPOLL_CTL_DEL, fd, 0);
        s.write_all(b"g").unwrap();
        assert!(
            poll1(fd, libc::POLLIN, 1500) & libc::POLLIN != 0,
            "poll after EPOLL_CTL_DEL: no POLLIN within 1.5 s"
        );
        assert_eq!(read_exact_fd(fd, 5), b"three");

        // ADD and DEL at once, then a blocking read
        ctl(ep, libc::EPOLL_CTL_ADD, fd, rd);
        ctl(ep, libc::EPOLL_CTL_DEL, fd, 0);
        s.write_all(b"g").unwrap();
        let mut four = [0u8; 4];
        s.read_exact(&mut four).unwrap();
        assert_eq!(&four, b"four");

        // into another set after the DEL: that set reports, the old one stays silent
        // SAFETY: plain epoll_create1.
        let ep2 = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        assert!(ep2 >= 0);
        ctl(ep, libc::EPOLL_CTL_ADD, fd, rd);
        ctl(ep, libc::EPOLL_CTL_DEL, fd, 0);
        ctl(ep2, libc::EPOLL_CTL_ADD, fd, rd);
        s.write_all(b"g").unwrap();
        wait_for(ep2, fd, libc::EPOLLIN, "the second set");
        assert!(
            wait(ep, fd, 200).is_empty(),
            "the old set reported a deleted fd"
        );
        assert_eq!(read_exact_fd(fd, 4), b"five");
        ctl(ep2, libc::EPOLL_CTL_DEL, fd, 0);
        // SAFETY: our epoll fd.
        unsafe { libc::close(ep2) };

        // the `ae` pattern, round after round
        for i in 0..ROUNDS {
            ctl(ep, libc::EPOLL_CTL_ADD, fd, libc::EPOLLOUT as u32);
            wait_for(ep, fd, libc::EPOLLOUT, "writable");
            assert_eq!(send_flags(fd, &[i as u8], 0), 1);
            ctl(ep, libc::EPOLL_CTL_DEL, fd, 0);
            ctl(ep, libc::EPOLL_CTL_ADD, fd, rd);
            wait_for(ep, fd, libc::EPOLLIN, "the answer");
            let mut b = [0u8; 1];
            assert_eq!(recv_flags(fd, &mut b, 0), 1, "round {i}");
            assert_eq!(b[0], i as u8 ^ 0xff, "round {i}");
            ctl(ep, libc::EPOLL_CTL_DEL, fd, 0);
        }
        // the errors the kernel gives (under the shim, once both directions are on the ring,
        // a registration holds no socket and the registry answers for the kernel)
        ctl(ep, libc::EPOLL_CTL_ADD, fd, rd);
        assert_eq!(ctl_errno(ep, libc::EPOLL_CTL_ADD, fd, rd), libc::EEXIST);
        let excl = rd | libc::EPOLLEXCLUSIVE as u32;
        assert_eq!(ctl_errno(ep, libc::EPOLL_CTL_MOD, fd, excl), libc::EINVAL);
        ctl(ep, libc::EPOLL_CTL_DEL, fd, 0);
        assert_eq!(ctl_errno(ep, libc::EPOLL_CTL_DEL, fd, 0), libc::ENOENT);
        assert_eq!(ctl_errno(ep, libc::EPOLL_CTL_MOD, fd, rd), libc::ENOENT);
        assert_eq!(ctl_errno(-1, libc::EPOLL_CTL_ADD, fd, rd), libc::EBADF);
        ctl(ep, libc::EPOLL_CTL_ADD, fd, excl);
        assert_eq!(ctl_errno(ep, libc::EPOLL_CTL_MOD, fd, rd), libc::EINVAL);
        ctl(ep, libc::EPOLL_CTL_DEL, fd, 0);
        // the end: the server's half-close, seen through a re-ADD
        ctl(ep, libc::EPOLL_CTL_ADD, fd, rd | libc::EPOLLRDHUP as u32);
        let ev = wait(ep, fd, 10_000);
        assert_eq!(ev.len(), 1);
        assert!(ev[0] & libc::EPOLLRDHUP as u32 != 0, "events {:#x}", ev[0]);
        let mut b = [0u8; 1];
        assert_eq!(recv_flags(fd, &mut b, 0), 0);
        // SAFETY: our epoll fd.
        unsafe { libc::close(ep) };
        s.shutdown(Shutdown::Write).unwrap();
    }
}

/// select(2) for read and write readiness; the server speaks first.
mod select {
    use super::*;

    pub fn server(mut s: TcpStream) {
        sleep_ms(300);
        s.write_all(b"220 ready\r\n").unwrap();
        let mut b = [0u8; 6];
        s.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"QUIT\r\n");
        s.write_all(b"221 bye\r\n").unwrap();
    }

    fn sel(fd: RawFd, read: bool, timeout_ms: i64) -> bool {
        // SAFETY: an fd_set is plain data; FD_ZERO/FD_SET initialise it for fd < FD_SETSIZE.
        unsafe {
            let mut set: libc::fd_set = std::mem::zeroed();
            libc::FD_ZERO(&mut set);
            libc::FD_SET(fd, &mut set);
            let mut tv = libc::timeval {
                tv_sec: timeout_ms / 1000,
                tv_usec: (timeout_ms % 1000) * 1000,
            };
            let (r, w) = if read {
                (&mut set as *mut libc::fd_set, std::ptr::null_mut())
            } else {
                (std::ptr::null_mut(), &mut set as *mut libc::fd_set)
            };
            let n = libc::select(fd + 1, r, w, std::ptr::null_mut(), &mut tv);
            assert!(n >= 0, "select errno {}", errno());
            n == 1 && libc::FD_ISSET(fd, &set)
        }
    }

    pub fn client(addr: SocketAddr) {
        let s = TcpStream::connect(addr).unwrap();
        let fd = s.as_raw_fd();
        assert!(sel(fd, false, 1000), "a fresh connection is writable");
        assert!(!sel(fd, true, 50), "readable before the server spoke");
        assert!(sel(fd, true, 10_000), "the greeting never became readable");
        assert_eq!(read_exact_fd(fd, 11).as_slice(), b"220 ready\r\n");
        assert_eq!(send_flags(fd, b"QUIT\r\n", 0), 6);
        assert!(sel(fd, true, 10_000));
        assert_eq!(read_exact_fd(fd, 9).as_slice(), b"221 bye\r\n");
    }
}

/// shutdown(SHUT_WR): the peer reads to EOF and can still answer; our later sends fail with
/// EPIPE (MSG_NOSIGNAL).
mod half_close {
    use super::*;

    pub fn server(mut s: TcpStream) {
        let got = read_to_eof(&mut s);
        assert_eq!(got.len(), 200_000);
        assert_eq!(fnv(&got), fnv(&pattern(200_000, 7)));
        // the other direction still works after the peer's half-close
        s.write_all(format!("{:016x}", fnv(&got)).as_bytes())
            .unwrap();
        s.shutdown(Shutdown::Write).unwrap();
    }

    pub fn client(addr: SocketAddr) {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(&pattern(200_000, 7)).unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        let n = send_flags(s.as_raw_fd(), b"x", libc::MSG_NOSIGNAL);
        assert_eq!((n, errno()), (-1, libc::EPIPE), "send after SHUT_WR");
        let reply = read_to_eof(&mut s);
        assert_eq!(
            reply,
            format!("{:016x}", fnv(&pattern(200_000, 7))).as_bytes()
        );
        let rev = poll1(s.as_raw_fd(), libc::POLLIN | libc::POLLRDHUP, 0);
        assert!(
            rev & libc::POLLRDHUP != 0 && rev & libc::POLLIN != 0,
            "{rev:#x}"
        );
    }
}

/// MSG_PEEK does not consume; MSG_WAITALL waits for everything; MSG_DONTWAIT gives EAGAIN;
/// FIONREAD counts what is readable.
mod peek_waitall {
    use super::*;

    pub fn server(mut s: TcpStream) {
        s.write_all(&pattern(40, 1)).unwrap();
        sleep_ms(300);
        s.write_all(&pattern(60, 2)).unwrap();
        let mut go = [0u8; 1];
        s.read_exact(&mut go).unwrap();
        s.write_all(b"0123456789").unwrap();
        assert_eq!(read_to_eof(&mut s), b"");
    }

    pub fn client(addr: SocketAddr) {
        let mut s = TcpStream::connect(addr).unwrap();
        let fd = s.as_raw_fd();
        let mut b = [0u8; 200];
        // WAITALL: returns only when all 100 bytes (sent in two pieces 300 ms apart) are in
        let t0 = Instant::now();
        assert_eq!(recv_flags(fd, &mut b[..100], libc::MSG_WAITALL), 100);
        assert!(
            t0.elapsed() >= Duration::from_millis(200),
            "WAITALL returned early"
        );
        assert_eq!(&b[..40], &pattern(40, 1)[..]);
        assert_eq!(&b[40..100], &pattern(60, 2)[..]);
        // nothing left: DONTWAIT says EAGAIN, FIONREAD says 0
        assert_eq!(
            (recv_flags(fd, &mut b, libc::MSG_DONTWAIT), errno()),
            (-1, libc::EAGAIN)
        );
        let mut avail: libc::c_int = -1;
        // SAFETY: FIONREAD writes one int.
        assert_eq!(unsafe { libc::ioctl(fd, libc::FIONREAD, &mut avail) }, 0);
        assert_eq!(avail, 0);
        s.write_all(b"g").unwrap();
        assert!(poll1(fd, libc::POLLIN, 10_000) & libc::POLLIN != 0);
        sleep_ms(100); // let all 10 bytes arrive
                       // SAFETY: as above.
        assert_eq!(unsafe { libc::ioctl(fd, libc::FIONREAD, &mut avail) }, 0);
        assert_eq!(avail, 10);
        // PEEK twice: same bytes, nothing consumed
        assert_eq!(recv_flags(fd, &mut b[..4], libc::MSG_PEEK), 4);
        assert_eq!(&b[..4], b"0123");
        assert_eq!(recv_flags(fd, &mut b[..10], libc::MSG_PEEK), 10);
        assert_eq!(&b[..10], b"0123456789");
        assert_eq!(recv_flags(fd, &mut b[..3], 0), 3);
        assert_eq!(&b[..3], b"012");
        assert_eq!(recv_flags(fd, &mut b[..20], libc::MSG_PEEK), 7);
        assert_eq!(recv_flags(fd, &mut b[..20], 0), 7);
        assert_eq!(&b[..7], b"3456789");
        s.shutdown(Shutdown::Write).unwrap();
    }
}

/// readv and recvmsg into scatter lists as programs pass them: buffers never initialised
/// (read(2) only writes them), segments that overlap (the later segment's bytes win, as the
/// kernel copies in order), an empty list, and a bad segment (EFAULT, nothing consumed).
mod scatter {
    use super::*;

    const FIRST: usize = 1000;
    const SECOND: usize = 600;

    pub fn server(mut s: TcpStream) {
        s.write_all(&pattern(FIRST, 5)).unwrap();
        let mut go = [0u8; 1];
        s.read_exact(&mut go).unwrap();
        s.write_all(&pattern(SECOND, 6)).unwrap();
        assert_eq!(read_to_eof(&mut s), b"");
    }

    fn iov(p: *mut u8, len: usize) -> libc::iovec {
        libc::iovec {
            iov_base: p.cast(),
            iov_len: len,
        }
    }

    /// recvmsg with MSG_WAITALL over `iovs`, no address, no control data.
    fn recvmsg_all(fd: RawFd, iovs: &mut [libc::iovec]) -> isize {
        // SAFETY: all-zero is a valid msghdr (no name, no control).
        let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
        m.msg_iov = iovs.as_mut_ptr();
        m.msg_iovlen = iovs.len() as _;
        // SAFETY: the iovecs describe live buffers of the test's own.
        unsafe { libc::recvmsg(fd, &mut m, libc::MSG_WAITALL) }
    }

    pub fn client(addr: SocketAddr) {
        let mut s = TcpStream::connect(addr).unwrap();
        let fd = s.as_raw_fd();
        assert!(poll1(fd, libc::POLLIN, 10_000) & libc::POLLIN != 0);
        // A bad first segment: EFAULT, and the bytes stay for the next call.
        let mut ok = [0u8; 8];
        let bad = [iov(std::ptr::null_mut(), 10), iov(ok.as_mut_ptr(), 8)];
        // SAFETY: an array of two iovecs (the kernel checks the segments).
        let r = unsafe { libc::readv(fd, bad.as_ptr(), 2) };
        assert_eq!((r, errno()), (-1, libc::EFAULT));
        // SAFETY: a count of zero reads nothing; a negative one is refused.
        assert_eq!(unsafe { libc::readv(fd, ok.as_ptr().cast(), 0) }, 0);
        // SAFETY: as above.
        let r = unsafe { libc::readv(fd, bad.as_ptr(), -1) };
        assert_eq!((r, errno()), (-1, libc::EINVAL));
        // Three segments of memory never initialised, filled in order.
        let mut a: Vec<u8> = Vec::with_capacity(300);
        let mut b: Vec<u8> = Vec::with_capacity(1);
        let mut c: Vec<u8> = Vec::with_capacity(699);
        let mut segs = [
            iov(a.as_mut_ptr(), 300),
            iov(b.as_mut_ptr(), 1),
            iov(c.as_mut_ptr(), 699),
        ];
        assert_eq!(recvmsg_all(fd, &mut segs), FIRST as isize);
        // SAFETY: recvmsg wrote every byte of the three capacities.
        unsafe {
            a.set_len(300);
            b.set_len(1);
            c.set_len(699);
        }
        let first = pattern(FIRST, 5);
        assert_eq!(a, first[..300]);
        assert_eq!(b, first[300..301]);
        assert_eq!(c, first[301..]);
        // Overlapping segments: [0, 300) then [100, 400) of one buffer.
        s.write_all(b"g").unwrap();
        let mut buf = vec![0u8; 400];
        let p = buf.as_mut_ptr();
        let mut over = [iov(p, 300), iov(p.wrapping_add(100), 300)];
        assert_eq!(recvmsg_all(fd, &mut over), SECOND as isize);
        let second = pattern(SECOND, 6);
        assert_eq!(buf[..100], second[..100]);
        assert_eq!(buf[100..], second[300..]);
        // The end: readv gives 0.
        s.shutdown(Shutdown::Write).unwrap();
        let mut tail = [0u8; 16];
        let end = [iov(tail.as_mut_ptr(), 16)];
        // SAFETY: one iovec over `tail`.
        assert_eq!(unsafe { libc::readv(fd, end.as_ptr(), 1) }, 0);
    }
}

/// One thread reads while another writes on the same socket, both directions at full speed.
mod threads {
    use super::*;

    const N: usize = 4 << 20;

    pub fn server(s: TcpStream) {
        // echo with a reader and a writer thread on the same connection
        let mut r = s.try_clone().unwrap();
        let mut w = s;
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(64);
        let reader = std::thread::spawn(move || loop {
            let mut buf = vec![0u8; 7919];
            let n = r.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            buf.truncate(n);
            tx.send(buf).unwrap();
        });
        for chunk in rx {
            w.write_all(&chunk).unwrap();
        }
        reader.join().unwrap();
        w.shutdown(Shutdown::Write).unwrap();
    }

    pub fn client(addr: SocketAddr) {
        let s = TcpStream::connect(addr).unwrap();
        let mut w = s.try_clone().unwrap();
        let data = pattern(N, 3);
        let expect = fnv(&data);
        let writer = std::thread::spawn(move || {
            for c in data.chunks(10_007) {
                w.write_all(c).unwrap();
            }
            w.shutdown(Shutdown::Write).unwrap();
        });
        let mut r = s;
        let got = read_to_eof(&mut r);
        writer.join().unwrap();
        assert_eq!(got.len(), N);
        assert_eq!(fnv(&got), expect);
    }
}

/// fork: a child that closes its inherited copy leaves the parent's connection intact (redis
/// BGSAVE); a child that writes on it is heard, and the parent goes on after it.
mod fork {
    use super::*;

    pub fn server(mut s: TcpStream) {
        assert_eq!(read_exact_fd(s.as_raw_fd(), 6), b"before");
        // SAFETY: the child only closes an fd and calls _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: async-signal-safe calls only.
            unsafe {
                libc::close(s.as_raw_fd());
                libc::_exit(0);
            }
        }
        let mut st = 0;
        // SAFETY: our child.
        unsafe { libc::waitpid(pid, &mut st, 0) };
        assert!(libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0);
        s.write_all(b"after-close").unwrap();
        assert_eq!(read_exact_fd(s.as_raw_fd(), 4), b"next");
        // A child that uses the connection: its bytes are heard, then the parent's. Over the
        // rings the parent switches the connection back to TCP when the child asks for it
        // (docs/upgrade.md §7), and both go on there.
        // SAFETY: the child only calls send and _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let n = send_flags(s.as_raw_fd(), b"from-child", libc::MSG_NOSIGNAL);
            // SAFETY: async-signal-safe.
            unsafe { libc::_exit(if n == 10 { 0 } else { 1 }) };
        }
        // SAFETY: our child.
        unsafe { libc::waitpid(pid, &mut st, 0) };
        assert!(
            libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
            "the child's send failed ({st:#x})"
        );
        s.write_all(b"+parent").unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        assert_eq!(read_to_eof(&mut s), b"");
    }

    pub fn client(addr: SocketAddr) {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"before").unwrap();
        assert_eq!(read_exact_fd(s.as_raw_fd(), 11), b"after-close");
        s.write_all(b"next").unwrap();
        let rest = read_to_eof(&mut s);
        assert_eq!(
            String::from_utf8_lossy(&rest),
            "from-child+parent",
            "the child's bytes, then the parent's"
        );
        s.shutdown(Shutdown::Write).unwrap();
    }
}

/// A client that hands its connection to a child: it connects, sends its greeting, forks
/// 300 ms later, and closes its own copy at once; the child reads the server's answer, sends more, and reads
/// the server's 2 MiB to the end (a daemon's helper, a shell's pipeline stage). The server
/// sends them in 64 pieces 25 ms apart, a stream that spans whatever happens meanwhile.
mod fork_client {
    use super::*;

    const N: usize = 2 << 20;

    pub fn server(mut s: TcpStream) {
        assert_eq!(read_exact_fd(s.as_raw_fd(), 5), b"hello");
        s.write_all(b"world").unwrap();
        assert_eq!(read_exact_fd(s.as_raw_fd(), 4), b"more");
        let data = rdmashim_compat_tests::random_bytes(N, 0x0f1c);
        for piece in data.chunks(N / 64) {
            s.write_all(piece).unwrap();
            sleep_ms(25);
        }
        s.shutdown(Shutdown::Write).unwrap();
        assert_eq!(read_to_eof(&mut s), b"", "the child sends nothing more");
    }

    pub fn client(addr: SocketAddr) {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"hello").unwrap();
        // (a moment before the fork: the shim's dial of the connection, if any, has started —
        // over RDMA after its address and route are resolved, which took over 300 ms under
        // emulation on a loaded host; the server's shim in the test holds its answer 2 s)
        sleep_ms(1000);
        let fd = s.into_raw_fd();
        // SAFETY: the child uses the connection and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let ok = std::panic::catch_unwind(|| {
                assert_eq!(read_exact_fd(fd, 5), b"world");
                // SAFETY: the inherited fd, this process's alone now.
                let mut s = unsafe { TcpStream::from_raw_fd(fd) };
                s.write_all(b"more").unwrap();
                let got = read_to_eof(&mut s);
                assert_eq!(got.len(), N, "length of the server's answer");
                assert!(
                    got == rdmashim_compat_tests::random_bytes(N, 0x0f1c),
                    "the server's answer, corrupted"
                );
            })
            .is_ok();
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        // SAFETY: the parent's copy, closed at once (the child holds the connection).
        unsafe { libc::close(fd) };
        wait_child(pid);
    }
}

/// fork per connection (inetd-style servers, PostgreSQL's postmaster, git and rsync daemons):
/// the server accepts and forks at once; the child serves the connection (an echo of a stream
/// large enough to outlast the client's upgrade attempt) while the parent closes its copy and
/// waits. The client pauses after the greeting, so that an upgrade attempt of its own comes
/// while the child serves.
mod fork_serve {
    use super::*;

    const N: usize = 256 * 1024;

    pub fn server(s: TcpStream) {
        let fd = s.into_raw_fd();
        // SAFETY: the child serves the connection and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let code = std::panic::catch_unwind(|| serve(fd)).map_or(1, |()| 0);
            // exit, not _exit: the child is a process of its own (as a PostgreSQL backend),
            // whose shim writes its own stats at exit.
            std::process::exit(code);
        }
        // SAFETY: the parent's copy, closed at once (the child holds the connection).
        unsafe { libc::close(fd) };
        wait_child(pid);
    }

    fn serve(fd: RawFd) {
        // SAFETY: the inherited fd, ours alone in this process.
        let mut s = unsafe { TcpStream::from_raw_fd(fd) };
        assert_eq!(read_exact_fd(fd, 5), b"hello");
        s.write_all(b"world").unwrap();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => s.write_all(&buf[..n]).unwrap(),
                Err(e) => panic!("child read: {e}"),
            }
        }
        s.shutdown(Shutdown::Write).unwrap();
    }

    pub fn client(addr: SocketAddr) {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"hello").unwrap();
        assert_eq!(read_exact_fd(s.as_raw_fd(), 5), b"world");
        sleep_ms(1500);
        let data = rdmashim_compat_tests::random_bytes(N, 0xf0f5);
        let mut w = s.try_clone().unwrap();
        let sent = data.clone();
        let writer = std::thread::spawn(move || {
            for chunk in sent.chunks(7919) {
                w.write_all(chunk).unwrap();
            }
            w.shutdown(Shutdown::Write).unwrap();
        });
        let got = read_to_eof(&mut s);
        writer.join().unwrap();
        assert_eq!(got.len(), N, "echo length");
        assert!(got == data, "echo corrupted");
    }
}

/// A fork child that ends with `_exit` right after its last write, without closing the socket
/// (Python's `ForkingMixIn` children, many C servers'): on TCP the kernel delivers what the
/// socket buffer holds, then the FIN. The server forks at once; the child reads the greeting,
/// waits for the client's go (sent after a pause, so that an upgrade comes first), writes
/// 4 MiB and calls `_exit`; the parent closes its copy and waits. The client must read all of
/// it, then EOF.
mod fork_quick_exit {
    use super::*;

    const N: usize = 4 << 20;

    pub fn server(s: TcpStream) {
        let fd = s.into_raw_fd();
        // SAFETY: the child serves the connection and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let ok = std::panic::catch_unwind(|| {
                assert_eq!(read_exact_fd(fd, 5), b"hello");
                assert_eq!(read_exact_fd(fd, 2), b"go");
                let data = rdmashim_compat_tests::random_bytes(N, 0x0e17);
                // SAFETY: the inherited fd, ours alone in this process; not closed here.
                let mut s = std::mem::ManuallyDrop::new(unsafe { TcpStream::from_raw_fd(fd) });
                s.write_all(&data).unwrap();
            })
            .is_ok();
            // SAFETY: ends the child at once, the socket still open (the kernel closes it).
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        // SAFETY: the parent's copy, closed at once (the child holds the connection).
        unsafe { libc::close(fd) };
        wait_child(pid);
    }

    pub fn client(addr: SocketAddr) {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"hello").unwrap();
        sleep_ms(1500);
        s.write_all(b"go").unwrap();
        let got = read_to_eof(&mut s);
        assert_eq!(
            got.len(),
            N,
            "length of what the child wrote before its _exit"
        );
        assert!(
            got == rdmashim_compat_tests::random_bytes(N, 0x0e17),
            "what the child wrote, corrupted"
        );
    }
}

/// dup2 onto another number shares the connection; closing one copy keeps it open; closing the
/// last one ends it (the peer sees EOF).
mod dup2 {
    use super::*;

    pub fn server(mut s: TcpStream) {
        assert_eq!(read_exact_fd(s.as_raw_fd(), 9), b"via-dup2!");
        s.write_all(b"reply").unwrap();
        assert_eq!(
            read_to_eof(&mut s),
            b"tail",
            "EOF must follow the last copy's close"
        );
    }

    pub fn client(addr: SocketAddr) {
        let s = TcpStream::connect(addr).unwrap();
        let fd = s.into_raw_fd();
        let target = 200;
        // SAFETY: dup2 onto a free high fd number.
        assert_eq!(unsafe { libc::dup2(fd, target) }, target);
        assert_eq!(send_flags(target, b"via-dup2!", 0), 9);
        // SAFETY: closing the original; the dup keeps the connection.
        unsafe { libc::close(fd) };
        assert_eq!(read_exact_fd(target, 5), b"reply");
        // SAFETY: F_DUPFD_CLOEXEC gives a third copy.
        let third = unsafe { libc::fcntl(target, libc::F_DUPFD_CLOEXEC, 300) };
        assert!(third >= 300);
        // SAFETY: closing one of two copies.
        unsafe { libc::close(target) };
        assert_eq!(send_flags(third, b"tail", 0), 4);
        // SAFETY: the last copy: the connection closes.
        unsafe { libc::close(third) };
    }
}

/// sendfile(2) from a file to the socket.
mod sendfile {
    use super::*;

    const N: usize = 3 << 20;

    pub fn server(mut s: TcpStream) {
        let path = std::env::temp_dir().join(format!("behave-sendfile-{}", std::process::id()));
        std::fs::write(&path, pattern(N, 9)).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        let mut off: libc::off_t = 0;
        while (off as usize) < N {
            // SAFETY: valid fds and offset pointer.
            let n =
                unsafe { libc::sendfile(s.as_raw_fd(), f.as_raw_fd(), &mut off, N - off as usize) };
            assert!(n > 0, "sendfile returned {n}, errno {}", errno());
        }
        let _ = std::fs::remove_file(&path);
        s.shutdown(Shutdown::Write).unwrap();
        assert_eq!(
            read_to_eof(&mut s),
            format!("{:016x}", fnv(&pattern(N, 9))).as_bytes()
        );
    }

    pub fn client(addr: SocketAddr) {
        let mut s = TcpStream::connect(addr).unwrap();
        let got = read_to_eof(&mut s);
        assert_eq!(got.len(), N);
        s.write_all(format!("{:016x}", fnv(&got)).as_bytes())
            .unwrap();
        s.shutdown(Shutdown::Write).unwrap();
    }
}

/// The peer process dies mid-stream (SIGKILL): the reader gets EOF or ECONNRESET within a
/// second of the death, never a hang; writes then fail with EPIPE or ECONNRESET.
mod peer_death {
    use super::*;

    pub fn server(mut s: TcpStream) {
        s.write_all(&pattern(100_000, 4)).unwrap();
        let mut go = [0u8; 1];
        s.read_exact(&mut go).unwrap();
        // SAFETY: raise(2): die as a crashed peer would.
        unsafe { libc::raise(libc::SIGKILL) };
        unreachable!();
    }

    pub fn client(addr: SocketAddr) {
        let mut s = TcpStream::connect(addr).unwrap();
        let mut got = vec![0u8; 100_000];
        s.read_exact(&mut got).unwrap();
        assert_eq!(fnv(&got), fnv(&pattern(100_000, 4)));
        s.write_all(b"k").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let t0 = Instant::now();
        let mut b = [0u8; 16];
        let r = s.read(&mut b);
        let dt = t0.elapsed();
        match r {
            Ok(0) => {}
            Err(e) if e.raw_os_error() == Some(libc::ECONNRESET) => {}
            other => panic!("after the peer died: {other:?}"),
        }
        assert!(
            dt < Duration::from_secs(2),
            "took {dt:?} to notice the death"
        );
        // writing to a dead peer: the first write may still be accepted locally, then EPIPE or
        // ECONNRESET
        let mut failed = None;
        for _ in 0..50 {
            let n = send_flags(s.as_raw_fd(), &[0u8; 1024], libc::MSG_NOSIGNAL);
            if n < 0 {
                failed = Some(errno());
                break;
            }
            sleep_ms(20);
        }
        let e = failed.expect("writes to a dead peer kept succeeding");
        assert!(e == libc::EPIPE || e == libc::ECONNRESET, "errno {e}");
    }
}

/// Both directions stream at once: each side writes 24 MiB (`BEHAVE_DUPLEX_MIB`; the server
/// `BEHAVE_DUPLEX_SERVER_KIB` where set) in chunks of random sizes from a thread of its own
/// while it reads the peer's with reads of random sizes, checks every byte, then shuts its
/// writing down and reads to EOF. A stream whose ring path fails midway
/// (`RDMASHIM_FAULT=path_fail:N`) must come through whole, in order, as on TCP.
mod duplex {
    use super::*;

    /// Bytes `role` writes: 24 MiB, or `BEHAVE_DUPLEX_MIB` MiB; the server's
    /// `BEHAVE_DUPLEX_SERVER_KIB` KiB where set (both ends must be given the same).
    fn len(role: &str) -> u64 {
        let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
        match var("BEHAVE_DUPLEX_SERVER_KIB") {
            Some(kib) if role == "server" => kib << 10,
            _ => var("BEHAVE_DUPLEX_MIB").unwrap_or(24) << 20,
        }
    }

    fn byte_at(i: u64, seed: u8) -> u8 {
        ((i as u32).wrapping_mul(2_654_435_761) >> 13) as u8 ^ (i >> 17) as u8 ^ seed
    }

    /// A small generator for chunk and read sizes (1 B to 64 KiB, most of them small).
    fn sizes(mut x: u64) -> impl FnMut() -> usize {
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let max = [16usize, 1500, 9000, 65536][(x >> 60) as usize % 4];
            1 + (x as usize % max)
        }
    }

    fn run(s: TcpStream, role: &str, out_seed: u8, in_seed: u8) {
        let (out_len, len) = match role {
            "server" => (len("server"), len("client")),
            _ => (len("client"), len("server")),
        };
        // (BEHAVE_READ_TIMEOUT_S: longer, for a test that stalls the network on purpose)
        let timeout = std::env::var("BEHAVE_READ_TIMEOUT_S")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(T, Duration::from_secs);
        s.set_read_timeout(Some(timeout)).unwrap();
        // (BEHAVE_USER_TIMEOUT_MS: TCP_USER_TIMEOUT on the socket, as a program that wants a
        // dead peer found in that time sets it)
        let user_timeout = std::env::var("BEHAVE_USER_TIMEOUT_MS").ok();
        if let Some(ms) = user_timeout.as_deref().and_then(|v| v.parse().ok()) {
            super::keepalive::set_int(&s, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, ms);
        }
        let mut w = s.try_clone().unwrap();
        // (BEHAVE_DUPLEX_NONBLOCKING: the writer sends without blocking and waits in epoll for
        // EPOLLOUT when the socket is full, as an event loop does — PostgreSQL's backends)
        let nonblocking = std::env::var_os("BEHAVE_DUPLEX_NONBLOCKING").is_some();
        // (BEHAVE_DUPLEX_LATE_SHUT: the write side is shut only once the peer's stream is all
        // read, as a client that sent its request shuts down at the end of the answer)
        let (read_all, late_shut) = std::sync::mpsc::channel::<()>();
        let late_shut = std::env::var_os("BEHAVE_DUPLEX_LATE_SHUT")
            .is_some()
            .then_some(late_shut);
        let who = role.to_owned();
        let writer = std::thread::spawn(move || {
            let mut next = sizes(0x9e37_79b9 ^ u64::from(out_seed));
            let mut buf = vec![0u8; 65536];
            let mut at = 0u64;
            let mut out = nonblocking.then(|| Nonblocking::writer(w.as_raw_fd()));
            while at < out_len {
                let n = next().min((out_len - at) as usize);
                for (k, b) in buf[..n].iter_mut().enumerate() {
                    *b = byte_at(at + k as u64, out_seed);
                }
                match out.as_mut() {
                    Some(o) => o.write_all(&buf[..n]),
                    None => w.write_all(&buf[..n]).unwrap(),
                }
                at += n as u64;
            }
            if let Some(rx) = late_shut {
                let _ = rx.recv();
            }
            w.shutdown(Shutdown::Write).unwrap();
            if let Some(o) = out {
                eprintln!(
                    "measured: {who}: longest wait for EPOLLOUT {:.1} s; {:.2} s waited in all, \
                     {:.2} s of CPU meanwhile",
                    o.longest.as_secs_f64(),
                    o.waited.as_secs_f64(),
                    o.busy.as_secs_f64()
                );
                // (a wait spins if something it did not ask for keeps waking it: the kernel's
                // sleep costs next to nothing — 0.00 s of about 1 s here — a spin most of it)
                assert!(
                    o.busy <= o.waited / 10 + Duration::from_millis(50),
                    "the writer's waits for EPOLLOUT spun: {:?} of CPU in {:?}",
                    o.busy,
                    o.waited
                );
            }
        });
        let mut r = s;
        let mut inbound = nonblocking.then(|| Nonblocking::reader(r.as_raw_fd(), timeout));
        let mut next = sizes(0x51ed_270b ^ u64::from(in_seed));
        let mut buf = vec![0u8; 65536];
        let mut at = 0u64;
        // (a test that breaks the path for real: once 4 MiB are in, the reader says so in
        // that directory's `half` and waits for its `go`, while the writers fill the window)
        let mut pause = std::env::var_os("BEHAVE_DUPLEX_PAUSE").map(std::path::PathBuf::from);
        // (the longest the stream stood still for this reader, pauses of its own aside)
        let (mut last, mut gap) = (Instant::now(), Duration::ZERO);
        // (BEHAVE_DUPLEX_READ_NAP_MS: a slow reader, which naps before each read; the writer
        // keeps ahead of it and its window full)
        let nap = std::env::var("BEHAVE_DUPLEX_READ_NAP_MS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok());
        loop {
            if let Some(ms) = nap {
                sleep_ms(ms);
                last = Instant::now();
            }
            if at >= 4 << 20 {
                if let Some(dir) = pause.take() {
                    std::fs::write(dir.join("half"), b"").unwrap();
                    let until = Instant::now() + Duration::from_secs(60);
                    while !dir.join("go").exists() && Instant::now() < until {
                        sleep_ms(20);
                    }
                    last = Instant::now();
                }
            }
            let want = next();
            let n = match inbound.as_mut() {
                Some(i) => i.read(&mut buf[..want]),
                None => r.read(&mut buf[..want]).expect("read"),
            };
            gap = gap.max(last.elapsed());
            last = Instant::now();
            if n == 0 {
                break;
            }
            for (k, &b) in buf[..n].iter().enumerate() {
                let i = at + k as u64;
                assert!(
                    b == byte_at(i, in_seed),
                    "byte {i} of the peer's stream is wrong"
                );
            }
            at += n as u64;
        }
        assert_eq!(at, len, "the peer's stream ended early");
        let _ = read_all.send(());
        writer.join().unwrap();
        eprintln!(
            "measured: {role}: longest wait for the peer's bytes {:.1} s{}",
            gap.as_secs_f64(),
            user_timeout.map_or(String::new(), |ms| format!(" (TCP_USER_TIMEOUT {ms} ms)"))
        );
    }

    /// A side that never blocks in a data call (`MSG_DONTWAIT`), and on EAGAIN waits in an
    /// epoll set of its own (level-triggered): a writer for EPOLLOUT, at most 30 s — a socket
    /// that stays full that long while its peer reads is a writer never woken — with a 64 KiB
    /// send buffer (`SO_SNDBUF`, as a program may set it: what the socket takes at once is
    /// little); a reader for EPOLLIN, at most its read timeout.
    struct Nonblocking {
        fd: RawFd,
        ep: RawFd,
        longest: Duration,
        timeout: Duration,
        /// The time spent in its waits, and the CPU time its thread used meanwhile.
        waited: Duration,
        busy: Duration,
    }

    /// The calling thread's CPU time.
    fn thread_cpu() -> Duration {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid out-pointer.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    }

    impl Nonblocking {
        fn reader(fd: RawFd, timeout: Duration) -> Nonblocking {
            let mut r = Nonblocking::waiting(fd, libc::EPOLLIN as u32);
            r.timeout = timeout;
            r
        }

        fn read(&mut self, b: &mut [u8]) -> usize {
            loop {
                let n = recv_flags(self.fd, b, libc::MSG_DONTWAIT);
                if n >= 0 {
                    return n as usize;
                }
                assert_eq!(errno(), libc::EAGAIN, "recv: errno {}", errno());
                let ms = self.timeout.as_millis().min(i32::MAX as u128) as i32;
                let ev = epoll_events(self.ep, 7, ms);
                assert!(!ev.is_empty(), "read: nothing for {:?}", self.timeout);
            }
        }

        fn waiting(fd: RawFd, events: u32) -> Nonblocking {
            // SAFETY: plain epoll_create1.
            let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
            assert!(ep >= 0, "epoll_create1 errno {}", errno());
            let mut ev = libc::epoll_event { events, u64: 7 };
            // SAFETY: a valid event for a valid fd.
            let rc = unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) };
            assert_eq!(rc, 0, "epoll_ctl errno {}", errno());
            Nonblocking {
                fd,
                ep,
                longest: Duration::ZERO,
                timeout: Duration::from_secs(30),
                waited: Duration::ZERO,
                busy: Duration::ZERO,
            }
        }

        fn writer(fd: RawFd) -> Nonblocking {
            let small: libc::c_int = 64 << 10;
            // SAFETY: a valid int option for a valid socket.
            let rc = unsafe {
                libc::setsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    libc::SO_SNDBUF,
                    (&small as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            assert_eq!(rc, 0, "SO_SNDBUF errno {}", errno());
            Nonblocking::waiting(fd, libc::EPOLLOUT as u32)
        }

        fn write_all(&mut self, mut b: &[u8]) {
            while !b.is_empty() {
                let n = send_flags(self.fd, b, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL);
                if n > 0 {
                    b = &b[n as usize..];
                    continue;
                }
                assert!(
                    n < 0 && errno() == libc::EAGAIN,
                    "send returned {n} (errno {})",
                    errno()
                );
                let (t, cpu) = (Instant::now(), thread_cpu());
                let ms = self.timeout.as_millis().min(i32::MAX as u128) as i32;
                let ev = epoll_events(self.ep, 7, ms);
                assert!(
                    !ev.is_empty(),
                    "the writer waited {:?} for EPOLLOUT: never woken",
                    self.timeout
                );
                self.longest = self.longest.max(t.elapsed());
                self.waited += t.elapsed();
                self.busy += thread_cpu().saturating_sub(cpu);
            }
        }
    }

    impl Drop for Nonblocking {
        fn drop(&mut self) {
            // SAFETY: the epoll fd is this value's own.
            unsafe { libc::close(self.ep) };
        }
    }

    pub fn server(s: TcpStream) {
        run(s, "server", 0x5a, 0xc3);
    }

    pub fn client(addr: SocketAddr) {
        run(TcpStream::connect(addr).unwrap(), "client", 0xc3, 0x5a);
    }
}

/// The plainest exchange, both ways: the client sends 16 blocks of 64 KiB, the server echoes
/// each back, then each side half-closes and sees the other's EOF.
mod echo {
    use super::*;

    const BLOCK: usize = 64 * 1024;
    const BLOCKS: usize = 16;

    pub fn server(mut s: TcpStream) {
        s.set_read_timeout(Some(T)).unwrap();
        let mut buf = vec![0u8; BLOCK];
        for _ in 0..BLOCKS {
            s.read_exact(&mut buf).unwrap();
            s.write_all(&buf).unwrap();
        }
        assert_eq!(read_to_eof(&mut s), b"");
        s.shutdown(Shutdown::Write).unwrap();
    }

    pub fn client(addr: SocketAddr) {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        let mut got = vec![0u8; BLOCK];
        for i in 0..BLOCKS {
            let block = pattern(BLOCK, i as u8);
            s.write_all(&block).unwrap();
            s.read_exact(&mut got).unwrap();
            assert!(got == block, "block {i} came back different");
        }
        s.shutdown(Shutdown::Write).unwrap();
        assert_eq!(read_to_eof(&mut s), b"");
    }
}

/// Tells a test watching from outside that the scenario reached its point (the file named by
/// BEHAVE_READY_FILE, if set, is created): a test that cuts the link must not cut it before.
fn ready() {
    if let Some(p) = std::env::var_os("BEHAVE_READY_FILE") {
        std::fs::write(p, b"").expect("BEHAVE_READY_FILE");
    }
}

/// Both ends ask for TCP keepalive (`SO_KEEPALIVE`; probes after 2 s idle, every second, 3
/// unanswered: `TCP_KEEPIDLE`, `TCP_KEEPINTVL`, `TCP_KEEPCNT`), exchange a greeting (after the
/// server's settle pause: on the ring when upgraded), then wait in `read` for the other's next
/// bytes, which never come: the test cuts the network between them for good. As on TCP, the
/// wait must end in the kernel's verdict on the TCP connection within two minutes: ETIMEDOUT,
/// or ECONNRESET where the other end's kernel gave up first and its reset got through (never
/// EOF, bytes, another error, or the wait's own limit); then `close` returns at once.
/// For the two-host tier (`two_hosts`' t12).
mod keepalive {
    use super::*;

    /// Sets an int socket option on `s`.
    pub fn set_int(s: &TcpStream, level: libc::c_int, name: libc::c_int, v: libc::c_int) {
        // SAFETY: setsockopt of an int option on our socket.
        let r = unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                level,
                name,
                (&v as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(r, 0, "setsockopt({level}, {name}): errno {}", errno());
    }

    /// Keepalive on `s`: probes after 2 s idle, every second, 3 unanswered.
    pub fn ask_for_keepalive(s: &TcpStream) {
        for (level, name, v) in [
            (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1),
            (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 2),
            (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 1),
            (libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3),
        ] {
            set_int(s, level, name, v);
        }
        s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    }

    /// This process's descriptors: each number and what it refers to (`/proc/self/fd`; not
    /// the one that lists them).
    pub fn fds() -> std::collections::BTreeMap<i32, String> {
        let listing = format!("/proc/{}/fd", std::process::id());
        let mut m = std::collections::BTreeMap::new();
        for e in std::fs::read_dir(&listing).unwrap().flatten() {
            let Some(n) = e.file_name().to_str().and_then(|n| n.parse().ok()) else {
                continue;
            };
            if let Ok(t) = std::fs::read_link(e.path()) {
                let t = t.to_string_lossy().into_owned();
                if t != listing {
                    m.insert(n, t);
                }
            }
        }
        m
    }

    /// Closes `s`, which must take under two seconds (a dead connection's close never hangs);
    /// then nothing of the connection may stay (within ten seconds: the shim tears a closed
    /// connection down in the background, bounded by its close timeout): no descriptor refers
    /// to its socket any more — the shim's own duplicates included, which would keep the TCP
    /// connection open in the kernel — and none is left of those made after `up`, this
    /// process's descriptors once the connection was up.
    pub fn closes_at_once(s: TcpStream, role: &str, up: &std::collections::BTreeMap<i32, String>) {
        let sock = format!("socket:[{}]", inode(s.as_raw_fd()));
        let t = Instant::now();
        drop(s);
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "{role}: close took {:?}",
            t.elapsed()
        );
        let left = || {
            fds()
                .into_iter()
                .filter(|(n, what)| *what == sock || up.get(n) != Some(what))
                .collect::<Vec<_>>()
        };
        loop {
            let l = left();
            if l.is_empty() {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "{role}: descriptors left {:?} after close (the socket was {sock}): {l:?}",
                t.elapsed()
            );
            sleep_ms(50);
        }
        eprintln!(
            "measured: {role}: the connection's descriptors were gone {:.1} s after close",
            t.elapsed().as_secs_f64()
        );
    }

    /// The inode number of socket `fd` (its identity in `/proc/self/fd`).
    fn inode(fd: RawFd) -> u64 {
        let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
        // SAFETY: st is a valid out-pointer for a struct stat.
        let r = unsafe { libc::fstat(fd, st.as_mut_ptr()) };
        assert_eq!(r, 0, "fstat: errno {}", errno());
        // SAFETY: filled by the kernel on success.
        unsafe { st.assume_init() }.st_ino
    }

    /// Waits for bytes that never come: the wait must end in ETIMEDOUT (its own probes went
    /// unanswered) or ECONNRESET (the other end's kernel gave up first and its reset got
    /// through: the cut may be one way); then closes.
    fn wait_for_the_end(mut s: TcpStream, role: &str) {
        let up = fds();
        let t0 = Instant::now();
        let mut b = [0u8; 16];
        match s.read(&mut b) {
            Err(e) if matches!(e.raw_os_error(), Some(libc::ETIMEDOUT | libc::ECONNRESET)) => {
                eprintln!("{role}: {e} after {:?}", t0.elapsed());
            }
            other => panic!(
                "{role}: the wait ended in {other:?} after {:?}",
                t0.elapsed()
            ),
        }
        closes_at_once(s, role, &up);
    }

    pub fn server(mut s: TcpStream) {
        ask_for_keepalive(&s);
        handover::settle();
        s.write_all(b"hello").unwrap();
        let mut w = [0u8; 5];
        s.read_exact(&mut w).unwrap();
        assert_eq!(&w, b"world");
        wait_for_the_end(s, "server");
    }

    pub fn client(addr: SocketAddr) {
        let mut s = TcpStream::connect(addr).unwrap();
        ask_for_keepalive(&s);
        let mut h = [0u8; 5];
        s.read_exact(&mut h).unwrap();
        assert_eq!(&h, b"hello");
        s.write_all(b"world").unwrap();
        ready();
        wait_for_the_end(s, "client");
    }
}

/// A writer on a link that died for good (the test cuts it both ways, as a peer host powered
/// off would look): its writes fill the buffers, then block; the TCP_USER_TIMEOUT it set
/// (BEHAVE_USER_TIMEOUT_MS, 5 s by default) ends the blocked write in ETIMEDOUT. The reader
/// on the other host asked for keepalive (2 s idle, probes every second, 3 unanswered) and
/// waits: ETIMEDOUT too. Both close at once. Each prints how long its end took, counted from
/// the start of the writer's first write that blocked (about when the link died) and from the
/// reader's last read that got bytes.
mod cut_writer {
    use super::keepalive::{ask_for_keepalive, closes_at_once, fds, set_int};
    use super::*;

    fn user_timeout_ms() -> libc::c_int {
        std::env::var("BEHAVE_USER_TIMEOUT_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(5000)
    }

    pub fn server(mut s: TcpStream) {
        set_int(
            &s,
            libc::IPPROTO_TCP,
            libc::TCP_USER_TIMEOUT,
            user_timeout_ms(),
        );
        // (a backstop: a write that never ends fails the test instead of hanging it)
        s.set_write_timeout(Some(Duration::from_secs(150))).unwrap();
        handover::settle();
        s.write_all(b"hello").unwrap();
        let mut w = [0u8; 5];
        s.read_exact(&mut w).unwrap();
        assert_eq!(&w, b"world");
        let up = fds();
        let chunk = pattern(64 << 10, 3);
        // (the start of the first write that blocked: the buffers were full)
        let (mut sent, mut blocked) = (0u64, None::<Instant>);
        let err = loop {
            // (the stream repeats the chunk: a short write goes on where it stopped)
            let at = (sent % chunk.len() as u64) as usize;
            let t = Instant::now();
            let r = s.write(&chunk[at..]);
            if blocked.is_none() && t.elapsed() >= Duration::from_millis(500) {
                blocked = Some(t);
            }
            match r {
                Ok(n) => {
                    assert!(n > 0, "server: write returned 0");
                    sent += n as u64;
                }
                Err(e) => break e,
            }
        };
        let Some(blocked) = blocked else {
            panic!("server: the writes never blocked; then {err:?} ({sent} bytes written)");
        };
        assert_eq!(
            err.raw_os_error(),
            Some(libc::ETIMEDOUT),
            "server: the writes ended in {err:?} {:.1} s after they blocked ({sent} bytes \
             written)",
            blocked.elapsed().as_secs_f64()
        );
        eprintln!(
            "measured: server: write: {err} {:.1} s after the writes blocked ({sent} bytes \
             written)",
            blocked.elapsed().as_secs_f64()
        );
        closes_at_once(s, "server", &up);
    }

    pub fn client(addr: SocketAddr) {
        let mut s = TcpStream::connect(addr).unwrap();
        ask_for_keepalive(&s);
        s.set_read_timeout(Some(Duration::from_secs(150))).unwrap();
        let mut h = [0u8; 5];
        s.read_exact(&mut h).unwrap();
        assert_eq!(&h, b"hello");
        s.write_all(b"world").unwrap();
        let up = fds();
        let want = pattern(64 << 10, 3);
        let (mut got, mut moved) = (0u64, Instant::now());
        let mut buf = vec![0u8; 64 << 10];
        loop {
            match s.read(&mut buf) {
                Ok(0) => panic!("client: EOF after {got} bytes"),
                Ok(n) => {
                    for (k, b) in buf[..n].iter().enumerate() {
                        let i = (got as usize + k) % want.len();
                        assert_eq!(*b, want[i], "client: byte {} differs", got as usize + k);
                    }
                    // (streaming: the test may cut the link now)
                    if got < 1 << 20 && got + n as u64 >= 1 << 20 {
                        ready();
                    }
                    got += n as u64;
                    moved = Instant::now();
                }
                Err(e) if e.raw_os_error() == Some(libc::ETIMEDOUT) => {
                    eprintln!(
                        "measured: client: read: {e} {:.1} s after its last read that got \
                         bytes ({got} bytes read)",
                        moved.elapsed().as_secs_f64()
                    );
                    break;
                }
                Err(e) => panic!(
                    "client: the read ended in {e:?} {:.1} s after its last that got bytes \
                     ({got} bytes read)",
                    moved.elapsed().as_secs_f64()
                ),
            }
        }
        closes_at_once(s, "client", &up);
    }
}

mod lowest_fd {
    //! While a thread of the program sleeps in a blocking recv (over the rings: in the shim's
    //! own wait), another opens a file: it gets the lowest free descriptor number, as POSIX
    //! says and as programs that close 0, 1 or 2 and open a file in their place rely on. The
    //! shim's wait must hold no descriptor down there (its signalfd is one of its own, high).
    use super::*;

    const MSG: usize = 64;
    const ROUNDS: usize = 20;
    const DELAY: Duration = Duration::from_millis(400);
    /// How long the client lets the upgrade's set-up end before it takes numbers.
    const SETTLE: Duration = Duration::from_secs(1);

    pub fn server(mut s: TcpStream) {
        // (the answers of the three sleeps, each late)
        echo_then_late_answers(&mut s, MSG, ROUNDS, DELAY);
        assert_eq!(read_to_eof(&mut s), b"");
    }

    /// The number a new descriptor gets now.
    fn lowest_free() -> RawFd {
        let f = std::fs::File::open("/dev/null").unwrap();
        f.as_raw_fd()
    }

    pub fn client(addr: SocketAddr) {
        let mut s = TcpStream::connect(addr).unwrap();
        ping_pong(&mut s, MSG, ROUNDS, 0x33);
        // (the upgrade's set-up is over before the first number is taken: it holds
        // descriptors of its own for a while — librdmacm's and libibverbs' take the lowest
        // free numbers, as any descriptor does — and closes some when it ends; a number
        // taken meanwhile is higher than one taken after, a race of the set-up's that this
        // scenario, the sleep's, must not measure — seen once in 730 tests, the set-up
        // still going on after the ping-pong's 20 rounds)
        std::thread::sleep(SETTLE);
        // (no read timeout: a wait the shim holds signals for, as a blocking call without one)
        let mut reader = s.try_clone().unwrap();
        for i in 0..3u8 {
            let want = lowest_free();
            s.write_all(&[b'a' + i]).unwrap();
            let t = std::thread::spawn(move || {
                let mut got = [0u8; MSG];
                reader.read_exact(&mut got).unwrap();
                assert!(
                    got[..] == pattern(MSG, i)[..],
                    "answer {i} came back different"
                );
                reader
            });
            // (the reader is asleep by now: the answer is 400 ms away)
            std::thread::sleep(DELAY / 4);
            let got = lowest_free();
            reader = t.join().unwrap();
            assert_eq!(
                got, want,
                "sleep {i}: a file opened while a thread slept in recv got descriptor {got}, \
                 not the lowest free one, {want}"
            );
        }
        s.shutdown(std::net::Shutdown::Write).unwrap();
    }
}

/// A wait for readiness — epoll_wait, poll — is interrupted by a signal (EINTR; neither is
/// ever restarted), also when the connection is upgraded and the wait busy-polls before it
/// sleeps; and a signal sent to the process runs its handler on the thread that waits (the
/// only thread the application has), never on one of the shim's own. For each kind of wait
/// the client first plays a ping-pong through it (its waits are what teaches the spin gate
/// that spinning pays), then waits for nothing while a timer's SIGALRM arrives, twice.
mod wait_signal {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    const MSG: usize = 64;
    const ROUNDS: usize = 100;

    pub fn server(mut s: TcpStream) {
        s.set_read_timeout(Some(T)).unwrap();
        let mut buf = [0u8; MSG];
        for _ in 0..2 * ROUNDS + 1 {
            s.read_exact(&mut buf).unwrap();
            s.write_all(&buf).unwrap();
        }
        assert_eq!(read_to_eof(&mut s), b"");
    }

    static ALARMS: AtomicU32 = AtomicU32::new(0);

    extern "C" fn on_alarm(_: libc::c_int) {
        ALARMS.fetch_add(1, Ordering::SeqCst);
    }

    /// How the client waits for its socket to become readable.
    #[derive(Clone, Copy, Debug)]
    enum Wait {
        Epoll(RawFd),
        Poll,
    }

    /// One wait for readability, up to `timeout_ms`: its return value and errno.
    fn wait(w: Wait, fd: RawFd, timeout_ms: i32) -> (i32, i32) {
        match w {
            Wait::Epoll(ep) => {
                let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 8];
                // SAFETY: evs has room for 8 events.
                let n = unsafe { libc::epoll_wait(ep, evs.as_mut_ptr(), 8, timeout_ms) };
                let e = errno();
                if n > 0 {
                    assert!(
                        n == 1
                            && { evs[0].u64 } == 0xbeef
                            && evs[0].events & libc::EPOLLIN as u32 != 0,
                        "epoll_wait: {n} events, first {:#x}",
                        { evs[0].events }
                    );
                }
                (n, e)
            }
            Wait::Poll => {
                let mut p = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd.
                let n = unsafe { libc::poll(&mut p, 1, timeout_ms) };
                let e = errno();
                if n > 0 {
                    assert!(
                        p.revents & libc::POLLIN != 0,
                        "poll: revents {:#x}",
                        p.revents
                    );
                }
                (n, e)
            }
        }
    }

    /// One message out and back, waiting with `w`.
    fn round(fd: RawFd, w: Wait, i: usize) {
        let msg = pattern(MSG, i as u8);
        assert_eq!(
            send_flags(fd, &msg, 0),
            MSG as isize,
            "send errno {}",
            errno()
        );
        let mut got = Vec::new();
        while got.len() < MSG {
            let mut b = [0u8; MSG];
            let n = recv_flags(fd, &mut b[..MSG - got.len()], libc::MSG_DONTWAIT);
            if n > 0 {
                got.extend_from_slice(&b[..n as usize]);
                continue;
            }
            assert!(
                n < 0 && errno() == libc::EAGAIN,
                "recv: {n}, errno {}",
                errno()
            );
            let (k, e) = wait(w, fd, 10_000);
            assert!(k == 1, "{w:?} round {i}: {k} (errno {e})");
        }
        assert!(got == msg, "{w:?} round {i} came back different");
    }

    /// Two waits for nothing, each interrupted by an alarm after `delay_us`.
    fn alarms(fd: RawFd, w: Wait) {
        for delay_us in [2_000i64, 30_000] {
            let before = ALARMS.load(Ordering::SeqCst);
            let it = libc::itimerval {
                it_interval: libc::timeval {
                    tv_sec: 0,
                    tv_usec: 0,
                },
                it_value: libc::timeval {
                    tv_sec: 0,
                    tv_usec: delay_us,
                },
            };
            let t0 = Instant::now();
            // SAFETY: a one-shot ITIMER_REAL.
            let rc = unsafe { libc::setitimer(libc::ITIMER_REAL, &it, std::ptr::null_mut()) };
            assert_eq!(rc, 0);
            let (n, e) = wait(w, fd, 5_000);
            let took = t0.elapsed();
            assert!(
                n == -1 && e == libc::EINTR,
                "{w:?}, alarm after {delay_us} us: returned {n} (errno {e}) after {took:?}"
            );
            assert_eq!(ALARMS.load(Ordering::SeqCst), before + 1, "the handler ran");
            assert!(
                took < Duration::from_secs(2),
                "interrupted only after {took:?}"
            );
        }
    }

    pub fn client(addr: SocketAddr) {
        // (a spin longer than the alarms' delay, so that under the shim they arrive while the
        // wait busy-polls; read once, at the shim's first spin)
        std::env::set_var("RDMASHIM_SPIN_US", "10000");
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_nonblocking(true).unwrap();
        let fd = s.as_raw_fd();
        // SAFETY: a handler that only touches an atomic; no SA_RESTART (neither wait is
        // restarted anyway).
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_alarm as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut act.sa_mask);
            assert_eq!(
                libc::sigaction(libc::SIGALRM, &act, std::ptr::null_mut()),
                0
            );
        }
        // SAFETY: plain epoll_create1, and an epoll_event for the socket.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        assert!(ep >= 0, "epoll_create1 errno {}", errno());
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: 0xbeef,
        };
        // SAFETY: valid epoll fd, socket fd and event.
        let rc = unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) };
        assert_eq!(rc, 0, "epoll_ctl errno {}", errno());
        for i in 0..ROUNDS {
            round(fd, Wait::Epoll(ep), i);
        }
        alarms(fd, Wait::Epoll(ep));
        // SAFETY: our epoll fd.
        unsafe { libc::close(ep) };
        for i in 0..ROUNDS {
            round(fd, Wait::Poll, ROUNDS + i);
        }
        alarms(fd, Wait::Poll);
        // the connection is as it was
        round(fd, Wait::Poll, 2 * ROUNDS);
        s.shutdown(Shutdown::Write).unwrap();
        s.set_nonblocking(false).unwrap();
        assert_eq!(read_to_eof(&mut s), b"");
    }
}

/// A blocking read or write that a signal handler interrupts is restarted by the kernel when
/// the handler was installed with SA_RESTART and the socket has no timeout for the call, and
/// fails with EINTR otherwise (signal(7)) — whether it spins first or sleeps, on the ring as
/// on TCP. Programs that install handlers with `signal()` (glibc: BSD semantics, SA_RESTART)
/// — a fork-per-connection server's SIGCHLD, a timer — rely on never seeing that EINTR. After
/// a ping-pong (under the shim over RDMA its waits learn to spin), the client waits in a
/// blocking `recv` for an answer the server delays by 300 ms, while a timer's SIGALRM arrives:
/// every 5 ms with SA_RESTART (the recv returns the answer), every 30 ms without (EINTR, and
/// the next recv gets the answer), every 30 ms with SA_RESTART on a socket with SO_RCVTIMEO
/// (EINTR); then it
/// writes 16 MiB while the server does not read for 300 ms and alarms arrive every 5 ms with
/// SA_RESTART (no send fails; every byte arrives in order).
mod restart {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    const MSG: usize = 64;
    const ROUNDS: usize = 50;
    const DELAY: Duration = Duration::from_millis(300);
    const BULK: usize = 16 << 20;

    pub fn server(mut s: TcpStream) {
        echo_then_late_answers(&mut s, MSG, ROUNDS, DELAY);
        // a bulk write it does not read at first
        let mut cmd = [0u8; 1];
        s.read_exact(&mut cmd).unwrap();
        assert_eq!(cmd[0], b'w');
        std::thread::sleep(DELAY);
        let mut got = vec![0u8; BULK];
        s.read_exact(&mut got).unwrap();
        assert!(
            got == pattern(BULK, 7),
            "the bulk write came back different"
        );
        s.write_all(b"k").unwrap();
        assert_eq!(read_to_eof(&mut s), b"");
    }

    static ALARMS: AtomicU32 = AtomicU32::new(0);

    extern "C" fn on_alarm(_: libc::c_int) {
        ALARMS.fetch_add(1, Ordering::SeqCst);
    }

    /// SIGALRM's handler, with or without SA_RESTART.
    fn handler(restart: bool) {
        // SAFETY: a handler that only touches an atomic.
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_alarm as extern "C" fn(libc::c_int) as usize;
            act.sa_flags = if restart { libc::SA_RESTART } else { 0 };
            libc::sigemptyset(&mut act.sa_mask);
            assert_eq!(
                libc::sigaction(libc::SIGALRM, &act, std::ptr::null_mut()),
                0
            );
        }
    }

    /// ITIMER_REAL: first after `first_us`, then every `every_us` (0: once; both 0: off).
    fn timer(first_us: i64, every_us: i64) {
        let tv = |us: i64| libc::timeval {
            tv_sec: (us / 1_000_000) as libc::time_t,
            tv_usec: (us % 1_000_000) as libc::suseconds_t,
        };
        let it = libc::itimerval {
            it_interval: tv(every_us),
            it_value: tv(first_us),
        };
        // SAFETY: a valid itimerval.
        let rc = unsafe { libc::setitimer(libc::ITIMER_REAL, &it, std::ptr::null_mut()) };
        assert_eq!(rc, 0, "setitimer errno {}", errno());
    }

    /// One blocking recv of at most MSG bytes: its result and errno.
    fn recv_once(fd: RawFd, buf: &mut [u8; MSG]) -> (isize, i32) {
        let n = recv_flags(fd, buf, 0);
        (n, errno())
    }

    /// The rest of a MSG-byte answer after its first `n` bytes, blocking, retrying EINTR.
    fn rest(fd: RawFd, buf: &mut [u8; MSG], mut n: usize) {
        while n < MSG {
            let k = recv_flags(fd, &mut buf[n..], 0);
            match k {
                k if k > 0 => n += k as usize,
                -1 if errno() == libc::EINTR => {}
                k => panic!("recv {k}, errno {}", errno()),
            }
        }
    }

    /// Asks for delayed answer `i` and waits in a blocking recv that an alarm, every 30 ms,
    /// must interrupt (EINTR, the handler ran); then the answer is read whole. (Alarms that
    /// repeat: one that lands before the recv begins — a test thread held off its CPU for
    /// 30 ms on a loaded machine — runs its handler and interrupts nothing, over TCP too.)
    fn interrupted(s: &mut TcpStream, buf: &mut [u8; MSG], i: u8, what: &str) {
        let fd = s.as_raw_fd();
        let before = ALARMS.load(Ordering::SeqCst);
        s.write_all(&[b'a' + i]).unwrap();
        timer(30_000, 30_000);
        let (n, e) = recv_once(fd, buf);
        timer(0, 0);
        assert!(
            n == -1 && e == libc::EINTR,
            "{what}: recv returned {n} (errno {e})"
        );
        assert!(
            ALARMS.load(Ordering::SeqCst) > before,
            "{what}: the handler ran"
        );
        rest(fd, buf, 0);
        assert!(
            buf[..] == pattern(MSG, i)[..],
            "{what}: answer {i} came back different"
        );
    }

    pub fn client(addr: SocketAddr) {
        let mut s = TcpStream::connect(addr).unwrap();
        let fd = s.as_raw_fd();
        ping_pong(&mut s, MSG, ROUNDS, 0x55);
        let mut buf = [0u8; MSG];

        // 1. SA_RESTART, alarms every 5 ms: the recv is restarted until the answer comes.
        handler(true);
        let before = ALARMS.load(Ordering::SeqCst);
        s.write_all(b"a").unwrap();
        timer(5_000, 5_000);
        let (n, e) = recv_once(fd, &mut buf);
        timer(0, 0);
        let alarms = ALARMS.load(Ordering::SeqCst) - before;
        assert!(
            n > 0,
            "SA_RESTART: recv returned {n} (errno {e}) after {alarms} alarms"
        );
        assert!(alarms >= 10, "only {alarms} alarms arrived during the wait");
        rest(fd, &mut buf, n as usize);
        assert!(
            buf[..] == pattern(MSG, 0)[..],
            "answer 1 came back different"
        );

        // 2. no SA_RESTART, one alarm: EINTR, the handler ran, the answer is still there.
        handler(false);
        interrupted(&mut s, &mut buf, 1, "no SA_RESTART");

        // 3. SA_RESTART but SO_RCVTIMEO set: EINTR all the same.
        handler(true);
        s.set_read_timeout(Some(T)).unwrap();
        interrupted(&mut s, &mut buf, 2, "SA_RESTART with SO_RCVTIMEO");
        s.set_read_timeout(None).unwrap();

        // 4. a blocking write of 16 MiB the server does not read for a while, alarms every
        // 5 ms with SA_RESTART: no send fails, whatever it returns.
        s.write_all(b"w").unwrap();
        let bulk = pattern(BULK, 7);
        let before = ALARMS.load(Ordering::SeqCst);
        timer(5_000, 5_000);
        let mut off = 0;
        while off < BULK {
            let n = send_flags(fd, &bulk[off..], 0);
            assert!(n > 0, "SA_RESTART: send returned {n} (errno {})", errno());
            off += n as usize;
        }
        timer(0, 0);
        let alarms = ALARMS.load(Ordering::SeqCst) - before;
        assert!(alarms >= 3, "only {alarms} alarms arrived during the write");
        let mut k = [0u8; 1];
        s.read_exact(&mut k).unwrap();
        assert_eq!(&k, b"k");
        s.shutdown(Shutdown::Write).unwrap();
        assert_eq!(read_to_eof(&mut s), b"");
    }
}

/// epoll hands every event back with the data the application registered, whatever that data
/// is — also values shaped like the tags the shim gives its own registrations (its magic
/// 0x5d4d in the top 16 bits, a source, an fd number), which it must never take for its own
/// (dropping the event, or reporting it as another fd's), nor give out for the application's.
/// The client registers its socket, two pipes and an eventfd in one set, with data that looks
/// like a tag of the socket's (for a pipe), of a pipe's (for the socket), of the pipe itself,
/// and all ones; then each source alone, then all of them at once, must come back as
/// exactly the events of the sources that are ready, each with its own data; after an
/// EPOLL_CTL_MOD to plain data and a DEL, the same. Over RDMA the socket is upgraded.
mod epoll_data {
    use super::*;

    const ROUNDS: usize = 20;
    const MAGIC: u64 = 0x5d4d << 48;

    pub fn server(mut s: TcpStream) {
        s.set_read_timeout(Some(T)).unwrap();
        let mut b = [0u8; 16];
        loop {
            let n = s.read(&mut b).unwrap();
            if n == 0 {
                break;
            }
            s.write_all(&b[..n]).unwrap();
        }
    }

    fn ctl(ep: RawFd, op: i32, fd: RawFd, data: u64) {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: data,
        };
        // SAFETY: valid epoll fd, fd and event.
        let rc = unsafe { libc::epoll_ctl(ep, op, fd, &mut ev) };
        assert_eq!(rc, 0, "epoll_ctl op {op} fd {fd} errno {}", errno());
    }

    /// Waits until the events of exactly `want` (data values) have come, each once, readable.
    fn expect(ep: RawFd, want: &[u64], what: &str) {
        let mut got: Vec<u64> = Vec::new();
        let deadline = Instant::now() + T;
        while got.len() < want.len() {
            assert!(
                Instant::now() < deadline,
                "{what}: got {got:x?}, want {want:x?}"
            );
            let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 8];
            // SAFETY: evs has room for 8 events.
            let n = unsafe { libc::epoll_wait(ep, evs.as_mut_ptr(), 8, 1000) };
            assert!(n >= 0, "epoll_wait errno {}", errno());
            for e in &evs[..n as usize] {
                let (d, bits) = ({ e.u64 }, { e.events });
                assert!(
                    want.contains(&d) && !got.contains(&d),
                    "{what}: event {bits:#x} with data {d:#x}, want {want:x?}, had {got:x?}"
                );
                assert!(
                    bits & libc::EPOLLIN as u32 != 0,
                    "{what}: {d:#x}: {bits:#x}"
                );
                got.push(d);
            }
        }
        // (level-triggered: nothing else is ready, so nothing else may come)
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 8];
        // SAFETY: as above.
        let n = unsafe { libc::epoll_wait(ep, evs.as_mut_ptr(), 8, 0) };
        let extra: Vec<u64> = evs[..n.max(0) as usize].iter().map(|e| e.u64).collect();
        assert!(
            extra.iter().all(|d| want.contains(d)),
            "{what}: unexpected events {extra:x?}"
        );
    }

    fn pipe() -> (RawFd, RawFd) {
        let mut p = [0; 2];
        // SAFETY: p has room for two fds.
        assert_eq!(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        (p[0], p[1])
    }

    fn put(fd: RawFd) {
        // SAFETY: one byte from a live buffer.
        assert_eq!(unsafe { libc::write(fd, b"p".as_ptr().cast(), 1) }, 1);
    }

    fn take(fd: RawFd, n: usize) {
        let mut b = [0u8; 16];
        // SAFETY: b has room for 16 bytes.
        let k = unsafe { libc::read(fd, b.as_mut_ptr().cast(), n) };
        assert_eq!(k, n as isize, "read {fd}: errno {}", errno());
    }

    pub fn client(addr: SocketAddr) {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        let fd = s.as_raw_fd();
        let (a_r, a_w) = pipe();
        let (b_r, b_w) = pipe();
        // SAFETY: plain eventfd and epoll_create1.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        // SAFETY: as above.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        assert!(efd >= 0 && ep >= 0);
        let d_sock = MAGIC | a_r as u64;
        let d_a = MAGIC | 1 << 40 | fd as u64;
        let d_b = MAGIC | 4 << 40 | b_r as u64;
        let d_e = u64::MAX;
        ctl(ep, libc::EPOLL_CTL_ADD, fd, d_sock);
        ctl(ep, libc::EPOLL_CTL_ADD, a_r, d_a);
        ctl(ep, libc::EPOLL_CTL_ADD, b_r, d_b);
        ctl(ep, libc::EPOLL_CTL_ADD, efd, d_e);
        let eventfd_take = || {
            let mut v = 0u64;
            // SAFETY: eventfd reads 8 bytes.
            let k = unsafe { libc::read(efd, (&mut v as *mut u64).cast(), 8) };
            assert_eq!(k, 8);
        };
        let eventfd_put = || {
            let v = 1u64;
            // SAFETY: eventfd writes 8 bytes.
            let k = unsafe { libc::write(efd, (&v as *const u64).cast(), 8) };
            assert_eq!(k, 8);
        };
        let mut all = |d_sock: u64, d_a: u64, what: &str| {
            for i in 0..ROUNDS {
                s.write_all(&[i as u8]).unwrap();
                expect(ep, &[d_sock], &format!("{what}: socket alone, round {i}"));
                take(fd, 1);
            }
            put(a_w);
            expect(ep, &[d_a], &format!("{what}: pipe a alone"));
            take(a_r, 1);
            put(b_w);
            expect(ep, &[d_b], &format!("{what}: pipe b alone"));
            take(b_r, 1);
            eventfd_put();
            expect(ep, &[d_e], &format!("{what}: eventfd alone"));
            eventfd_take();
            s.write_all(b"x").unwrap();
            put(a_w);
            put(b_w);
            eventfd_put();
            // (the echo first, so that all four are ready at once)
            let mut b = [0u8; 1];
            let deadline = Instant::now() + T;
            while poll1(fd, libc::POLLIN, 100) & libc::POLLIN == 0 {
                assert!(Instant::now() < deadline, "{what}: no echo");
            }
            expect(
                ep,
                &[d_sock, d_a, d_b, d_e],
                &format!("{what}: all at once"),
            );
            s.read_exact(&mut b).unwrap();
            take(a_r, 1);
            take(b_r, 1);
            eventfd_take();
        };
        all(d_sock, d_a, "tag-shaped data");
        // the socket's and pipe a's data made plain, pipe b's changed to another tag shape
        let (p_sock, p_a) = (7, 8);
        ctl(ep, libc::EPOLL_CTL_MOD, fd, p_sock);
        ctl(ep, libc::EPOLL_CTL_MOD, a_r, p_a);
        all(p_sock, p_a, "after MOD");
        // pipe b out of the set: its readiness reaches no one
        // SAFETY: a DEL needs no event.
        let rc = unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_DEL, b_r, std::ptr::null_mut()) };
        assert_eq!(rc, 0);
        put(b_w);
        put(a_w);
        expect(ep, &[p_a], "after DEL");
        for f in [a_r, a_w, b_r, b_w, efd, ep] {
            // SAFETY: fds of ours.
            unsafe { libc::close(f) };
        }
        s.shutdown(Shutdown::Write).unwrap();
        assert_eq!(read_to_eof(&mut s), b"");
    }
}

/// stdio on a socket: both ends wrap their socket in a `FILE` (`fdopen`) and talk in lines
/// with `fputs`/`fflush`/`fgets`, as many small C servers do; glibc's stdio moves the bytes
/// with its internal read and write, which a preload never sees. The client sends lines of
/// growing length, each echoed and compared, checks that `fileno` names its socket, shuts its
/// write side down through it, reads the server's last line and EOF (the server `fclose`s
/// its stream at EOF), and `fclose`s its own.
mod stdio {
    use super::*;
    use std::ffi::{CStr, CString};

    const LINES: usize = 500;

    fn open(fd: RawFd) -> *mut libc::FILE {
        // SAFETY: a socket of ours; the mode is NUL-terminated.
        let f = unsafe { libc::fdopen(fd, c"r+".as_ptr()) };
        assert!(!f.is_null(), "fdopen errno {}", errno());
        // SAFETY: a live stream.
        assert_eq!(unsafe { libc::fileno(f) }, fd, "fileno of the stream");
        f
    }

    /// One line (without its newline) or None at EOF.
    fn line(f: *mut libc::FILE) -> Option<Vec<u8>> {
        let mut buf = vec![0 as libc::c_char; 4096];
        // SAFETY: buf has room for 4096 bytes; f is a live stream.
        let p = unsafe { libc::fgets(buf.as_mut_ptr(), buf.len() as i32, f) };
        if p.is_null() {
            // SAFETY: a live stream.
            let failed = unsafe { libc::ferror(f) };
            assert_eq!(failed, 0, "fgets failed: errno {}", errno());
            return None;
        }
        // SAFETY: fgets NUL-terminated it.
        let mut v = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_bytes().to_vec();
        assert_eq!(v.pop(), Some(b'\n'), "a line without its newline");
        Some(v)
    }

    fn put(f: *mut libc::FILE, text: &[u8]) {
        let c = CString::new([text, b"\n"].concat()).unwrap();
        // SAFETY: a NUL-terminated string and a live stream.
        unsafe {
            assert!(libc::fputs(c.as_ptr(), f) >= 0, "fputs errno {}", errno());
            assert_eq!(libc::fflush(f), 0, "fflush errno {}", errno());
        }
    }

    fn text(i: usize) -> Vec<u8> {
        pattern(1 + i * 7 % 3000, i as u8)
            .iter()
            .map(|b| b'a' + b % 26)
            .collect()
    }

    pub fn server(s: TcpStream) {
        let f = open(s.into_raw_fd());
        let mut n = 0;
        while let Some(l) = line(f) {
            put(f, &l);
            n += 1;
        }
        assert_eq!(n, LINES, "lines echoed");
        put(f, b"bye");
        // SAFETY: the stream, closed once (its socket with it).
        assert_eq!(unsafe { libc::fclose(f) }, 0, "fclose errno {}", errno());
    }

    pub fn client(addr: SocketAddr) {
        let s = TcpStream::connect(addr).unwrap();
        let fd = s.into_raw_fd();
        let f = open(fd);
        for i in 0..LINES {
            let t = text(i);
            put(f, &t);
            assert!(
                line(f).as_deref() == Some(&t[..]),
                "line {i} came back different"
            );
        }
        // SAFETY: the stream's socket (fileno checked), write side shut down.
        assert_eq!(unsafe { libc::shutdown(libc::fileno(f), libc::SHUT_WR) }, 0);
        assert_eq!(line(f).as_deref(), Some(&b"bye"[..]));
        assert_eq!(line(f), None, "EOF after the server's fclose");
        // SAFETY: the stream, closed once.
        assert_eq!(unsafe { libc::fclose(f) }, 0, "fclose errno {}", errno());
    }
}

/// A prefork server: the listening socket is made before the server forks its workers, and
/// only the workers accept (nginx, Apache prefork, gunicorn). Each of two workers accepts one
/// connection and echoes blocks on it for a few seconds (past the shim's wait for an upgrade
/// that cannot come: the socket's RDMA side belongs to the parent), so the connection's fate
/// is decided while bytes flow. Every byte must arrive, in order, whatever that fate.
mod prefork {
    use super::*;

    pub const WORKERS: u8 = 2;
    const BLOCK: usize = 16 * 1024;
    const ROUNDS: usize = 10;
    const GAP_MS: u64 = 400;

    /// The parent: forks the workers, keeps the listener (as a prefork master does) and
    /// waits for them; each must exit 0.
    pub fn serve(l: TcpListener) {
        let mut pids = Vec::new();
        for w in 0..WORKERS {
            // SAFETY: single-threaded here; the child runs the worker and exits.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0, "fork: errno {}", errno());
            if pid == 0 {
                let ok = std::panic::catch_unwind(|| {
                    let (s, _) = l.accept().expect("worker accept");
                    worker(s, w);
                })
                .is_ok();
                // exit, not _exit: the worker is a process of its own, whose shim writes its
                // own stats at exit.
                std::process::exit(if ok { 0 } else { 1 });
            }
            pids.push(pid);
        }
        for pid in pids {
            let mut st = 0;
            // SAFETY: our child.
            unsafe { libc::waitpid(pid, &mut st, 0) };
            assert!(
                libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
                "worker {pid} failed (status {st:#x})"
            );
        }
        drop(l);
    }

    fn worker(mut s: TcpStream, w: u8) {
        s.set_read_timeout(Some(T)).unwrap();
        s.write_all(&[w]).unwrap();
        let mut buf = vec![0u8; BLOCK];
        for _ in 0..ROUNDS {
            s.read_exact(&mut buf).unwrap();
            for b in &mut buf {
                *b ^= 0x5a ^ w;
            }
            s.write_all(&buf).unwrap();
        }
        assert_eq!(read_to_eof(&mut s), b"");
        s.shutdown(Shutdown::Write).unwrap();
    }

    /// Two connections at once: each is served by a different worker (each accepts one), and
    /// each block comes back transformed by that worker.
    pub fn client(addr: SocketAddr) {
        let conns: Vec<_> = (0..WORKERS)
            .map(|i| {
                std::thread::spawn(move || {
                    let mut s = TcpStream::connect(addr).unwrap();
                    s.set_read_timeout(Some(T)).unwrap();
                    let mut w = [0u8];
                    s.read_exact(&mut w).unwrap();
                    let mut got = vec![0u8; BLOCK];
                    for r in 0..ROUNDS {
                        let block = pattern(BLOCK, (r as u8) ^ (i << 4));
                        s.write_all(&block).unwrap();
                        s.read_exact(&mut got).unwrap();
                        let expect: Vec<u8> = block.iter().map(|b| b ^ 0x5a ^ w[0]).collect();
                        assert!(
                            got == expect,
                            "connection {i} round {r} came back different"
                        );
                        sleep_ms(GAP_MS);
                    }
                    s.shutdown(Shutdown::Write).unwrap();
                    assert_eq!(read_to_eof(&mut s), b"");
                    w[0]
                })
            })
            .collect();
        let mut workers: Vec<u8> = conns.into_iter().map(|t| t.join().unwrap()).collect();
        workers.sort_unstable();
        assert_eq!(
            workers,
            (0..WORKERS).collect::<Vec<_>>(),
            "one worker per connection"
        );
    }
}

/// An fd number reused while an epoll set still holds a registration made through it: the
/// connection was registered, its fd closed while a duplicate kept it open (so the kernel keeps
/// that registration, which the application can no longer name), and a new connection got the
/// number. Registering the new one (phase 1), or deleting the number from a set where only the
/// old registration exists (phase 2, ENOENT), must work on the new connection, and leave nothing
/// of the old one's behind: once the new connection is closed, the sets hold no registration
/// of anything but sockets (the shim's eventfds and completion channels are anonymous inodes).
mod epoll_reuse {
    use super::*;

    /// Three connections, in order: A (kept to the end), B (an exchange), D (silent). Each
    /// gets "r" once its settle pause (the RDMA tier's) is over.
    pub fn serve(l: TcpListener) {
        let settle = std::env::var("BEHAVE_SETTLE_MS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok());
        let mut conns = Vec::new();
        for i in 0..3 {
            let (mut s, _) = l.accept().expect("accept");
            if let Some(ms) = settle {
                sleep_ms(ms);
            }
            s.write_all(b"r").unwrap();
            if i == 1 {
                let mut g = [0u8; 1];
                s.read_exact(&mut g).unwrap();
                assert_eq!(&g, b"g");
                s.write_all(b"x").unwrap();
            }
            conns.push(s);
        }
        for mut s in conns {
            assert_eq!(read_to_eof(&mut s), b"");
        }
        drop(l);
    }

    fn ctl(ep: RawFd, op: i32, fd: RawFd, data: u64) -> i32 {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: data,
        };
        // SAFETY: valid epoll fd and event.
        let rc = unsafe { libc::epoll_ctl(ep, op, fd, &mut ev) };
        if rc == 0 {
            0
        } else {
            errno()
        }
    }

    fn dup(fd: RawFd) -> RawFd {
        // SAFETY: plain dup(2) of an open fd.
        let d = unsafe { libc::dup(fd) };
        assert!(d >= 0, "dup: errno {}", errno());
        d
    }

    fn close(fd: RawFd) {
        // SAFETY: an fd this test owns.
        assert_eq!(unsafe { libc::close(fd) }, 0, "close: errno {}", errno());
    }

    /// Connects and waits for the server's "r"; returns the fd (the caller owns it).
    fn connect(addr: SocketAddr) -> RawFd {
        let s = TcpStream::connect(addr).unwrap();
        let fd = s.into_raw_fd();
        assert_eq!(read_exact_fd(fd, 1), b"r");
        fd
    }

    /// The registrations of set `ep` whose fd is open and not a socket.
    fn non_sockets(ep: RawFd) -> Vec<String> {
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{ep}")).unwrap();
        info.lines()
            .filter_map(|l| l.strip_prefix("tfd:"))
            .filter_map(|l| l.split_whitespace().next()?.parse::<RawFd>().ok())
            .filter_map(|t| {
                let target = std::fs::read_link(format!("/proc/self/fd/{t}")).ok()?;
                let target = target.to_string_lossy().into_owned();
                (!target.starts_with("socket:")).then(|| format!("fd {t}: {target}"))
            })
            .collect()
    }

    /// Moves `fd` to number `to` (free, or one of this test's fds, which is closed), so that
    /// the numbers this scenario reuses do not depend on what else the process opens.
    fn move_to(fd: RawFd, to: RawFd) -> RawFd {
        // SAFETY: dup2(2) of an open fd onto a number this test owns.
        assert_eq!(unsafe { libc::dup2(fd, to) }, to, "dup2: errno {}", errno());
        close(fd);
        to
    }

    /// Numbers well above what the process opens by itself, below the shim's private ones.
    const N1: RawFd = 400;
    const N2: RawFd = 401;

    pub fn client(addr: SocketAddr) {
        for n in [N1, N2] {
            // SAFETY: F_GETFD only reads the fd's flags.
            let flags = unsafe { libc::fcntl(n, libc::F_GETFD) };
            assert!(flags < 0, "fd {n} is open");
        }
        // SAFETY: plain epoll_create1.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        assert!(ep >= 0);

        // Phase 1: A registered as N1; N1 closed (A lives on as m); B becomes N1 and is
        // registered.
        let a = move_to(connect(addr), N1);
        assert_eq!(ctl(ep, libc::EPOLL_CTL_ADD, a, 1), 0);
        let m = dup(a);
        close(a);
        let b = move_to(connect(addr), N1);
        assert_eq!(ctl(ep, libc::EPOLL_CTL_ADD, b, 2), 0);
        assert_eq!(send_flags(b, b"g", 0), 1);
        let deadline = Instant::now() + T;
        loop {
            assert!(Instant::now() < deadline, "B's answer was not reported");
            // (A's peer is silent: the kernel's registration of A reports nothing either)
            let ev = epoll_events(ep, 2, 1000);
            if ev.iter().any(|e| e & libc::EPOLLIN as u32 != 0) {
                break;
            }
        }
        assert_eq!(read_exact_fd(b, 1), b"x");
        close(b);
        let left = non_sockets(ep);
        assert!(left.is_empty(), "set 1 holds: {left:?}");

        // Phase 2: A registered (in another set) as N2, N2 closed, D becomes N2; a DEL of N2
        // finds only the old registration: ENOENT, as the kernel says.
        // SAFETY: plain epoll_create1.
        let ep2 = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        assert!(ep2 >= 0);
        let q = move_to(dup(m), N2);
        assert_eq!(ctl(ep2, libc::EPOLL_CTL_ADD, q, 3), 0);
        close(q);
        let d = move_to(connect(addr), N2);
        assert_eq!(ctl(ep2, libc::EPOLL_CTL_DEL, d, 0), libc::ENOENT);
        close(d);
        let left = non_sockets(ep2);
        assert!(left.is_empty(), "set 2 holds: {left:?}");

        // A ends as usual.
        // SAFETY: `m` is an open TCP socket this test owns; the stream takes it over.
        let a = unsafe { TcpStream::from_raw_fd(m) };
        a.shutdown(Shutdown::Write).unwrap();
        close(ep);
        close(ep2);
    }
}

/// A daemon's close-all loop in the middle of a connection: the client closes every fd but
/// the connection's socket (and stdio), as daemons do after they start, with `close` one by
/// one and later with `close_range` around the socket; in between it puts `/dev/null` at
/// every low number it now believes free (`dup2`, as a daemon reopening its standard
/// descriptors, or a shell's `exec 5>file`, does) and closes them again; it goes on with the
/// stream throughout. On a kernel without the shim nothing else is open; under it, the shim's
/// own descriptors (and librdmacm's) must survive, or the connection must fail cleanly.
mod close_all {
    use super::*;

    const BLOCKS: usize = 16;

    pub fn server(mut s: TcpStream) {
        s.write_all(b"r").unwrap();
        let mut buf = vec![0u8; 4096];
        for _ in 0..BLOCKS {
            s.read_exact(&mut buf).unwrap();
            s.write_all(&buf).unwrap();
        }
        assert_eq!(read_to_eof(&mut s), b"");
    }

    pub fn client(addr: SocketAddr) {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        let mut r = [0u8];
        s.read_exact(&mut r).unwrap();
        assert_eq!(&r, b"r");
        let keep = s.as_raw_fd();
        let mut got = vec![0u8; 4096];
        for i in 0..BLOCKS {
            if i == BLOCKS / 2 {
                for fd in 3..4096 {
                    if fd != keep {
                        // SAFETY: closing every fd but the socket is what the scenario does;
                        // this program holds nothing else it uses afterwards.
                        unsafe { libc::close(fd) };
                    }
                }
            }
            if i == 5 * BLOCKS / 8 {
                // /dev/null at each low number but the socket's and stdio's: all free now.
                let null = std::fs::File::open("/dev/null").unwrap();
                let nfd = null.as_raw_fd();
                for fd in (3..256).filter(|&fd| fd != keep && fd != nfd) {
                    // SAFETY: plain dup2 onto numbers this program holds nothing at.
                    let r = unsafe { libc::dup2(nfd, fd) };
                    assert_eq!(r, fd, "dup2 onto {fd}: {}", std::io::Error::last_os_error());
                }
                for fd in (3..256).filter(|&fd| fd != keep && fd != nfd) {
                    // SAFETY: the duplicates just made.
                    assert_eq!(unsafe { libc::close(fd) }, 0, "close {fd}");
                }
            }
            if i == 3 * BLOCKS / 4 {
                // The same with close_range(2) (closefrom's way), around the socket.
                let keep = keep as libc::c_uint;
                // SAFETY: as above; plain close_range calls on ranges of fds.
                unsafe {
                    if keep > 3 {
                        libc::close_range(3, keep - 1, 0);
                    }
                    libc::close_range(keep + 1, libc::c_uint::MAX, 0);
                }
            }
            let block = pattern(4096, i as u8);
            s.write_all(&block).unwrap();
            s.read_exact(&mut got).unwrap();
            assert!(got == block, "block {i} came back different");
        }
        s.shutdown(Shutdown::Write).unwrap();
        assert_eq!(read_to_eof(&mut s), b"");
    }
}

/// A process that used a connection forks, and its child makes a connection of its own (a
/// prefork worker connecting to its backend, a daemon's helper): the child's connection works
/// as TCP does. Under the shim the parent's connection was upgraded, so librdmacm's device
/// state in the child is the parent's, which the kernel refuses to another process: the
/// child's connection must never be set up on it (it was, and was reset at its first post);
/// it goes on a device context of the child's own.
mod fork_dial {
    use super::*;

    /// Connection A (the parent's): "r" once the settle pause is over, then an echo of 64
    /// blocks. Connection B (the child's, accepted while A is open): "r" the same way, then an
    /// echo of all it reads, once it reads EOF.
    pub fn serve(l: TcpListener) {
        let settle = std::env::var("BEHAVE_SETTLE_MS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok());
        let (mut a, _) = l.accept().expect("accept A");
        if let Some(ms) = settle {
            sleep_ms(ms);
        }
        a.write_all(b"r").unwrap();
        let mut buf = vec![0u8; 4096];
        for _ in 0..BLOCKS {
            a.read_exact(&mut buf).unwrap();
            a.write_all(&buf).unwrap();
        }
        let (mut b, _) = l.accept().expect("accept B");
        if let Some(ms) = settle {
            sleep_ms(ms);
        }
        b.write_all(b"r").unwrap();
        let got = read_to_eof(&mut b);
        b.write_all(&got).unwrap();
        b.shutdown(Shutdown::Write).unwrap();
        // A ends once the child is done.
        assert_eq!(read_to_eof(&mut a), b"");
        drop(l);
    }

    const BLOCKS: usize = 64;

    pub fn client(addr: SocketAddr) {
        let mut a = TcpStream::connect(addr).unwrap();
        a.set_read_timeout(Some(T)).unwrap();
        let mut r = [0u8];
        a.read_exact(&mut r).unwrap();
        assert_eq!(&r, b"r");
        let mut got = vec![0u8; 4096];
        for i in 0..BLOCKS {
            let block = pattern(4096, i as u8);
            a.write_all(&block).unwrap();
            a.read_exact(&mut got).unwrap();
            assert!(got == block, "A: block {i} came back different");
        }
        // SAFETY: single-threaded here; the child connects, exchanges and exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: errno {}", errno());
        if pid == 0 {
            let ok = std::panic::catch_unwind(|| {
                let mut b = TcpStream::connect(addr).unwrap();
                b.set_read_timeout(Some(T)).unwrap();
                let mut r = [0u8];
                b.read_exact(&mut r).unwrap();
                assert_eq!(&r, b"r");
                let payload = pattern(256 * 1024, 0x77);
                b.write_all(&payload).unwrap();
                b.shutdown(Shutdown::Write).unwrap();
                assert!(
                    read_to_eof(&mut b) == payload,
                    "B: the echo came back different"
                );
            })
            .is_ok();
            // (exit, not _exit: the child's shim writes its record)
            std::process::exit(if ok { 0 } else { 1 });
        }
        let mut st = 0;
        // SAFETY: our child.
        unsafe { libc::waitpid(pid, &mut st, 0) };
        assert!(
            libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
            "the child's connection failed (status {st:#x})"
        );
        a.shutdown(Shutdown::Write).unwrap();
    }
}

// ---------------------------------------------------------------------------------------------

/// exec and spawn with a live connection (servers that re-exec themselves per connection, CGI,
/// a helper that writes to the client): the socket survives the exec (no FD_CLOEXEC) and the
/// new image goes on with the stream where the old one left it; a child started by
/// `system()` writes into the stream at an exact point, between the parent's bytes. The client
/// streams a large body while reading the echo, so that bytes are in flight both ways at the
/// moment of the exec or spawn.
mod handover {
    use super::*;

    /// Bytes the client sends (and gets back).
    pub const N: usize = 6 * 1024 * 1024 + 12_345;
    /// Bytes the first image (or the parent, before it spawns) echoes.
    pub const FIRST: usize = 2 * 1024 * 1024 + 777;
    /// What the spawned child writes.
    pub const CHILD: &[u8] = b"[child]";

    /// Echoes exactly `n` bytes of the stream on `fd` (reads never ask for more).
    pub fn echo(fd: RawFd, n: usize) {
        let mut buf = vec![0u8; 64 * 1024];
        let mut done = 0;
        while done < n {
            let want = (n - done).min(buf.len());
            let r = recv_flags(fd, &mut buf[..want], 0);
            assert!(r > 0, "echo: recv {r} (errno {}) at {done}/{n}", errno());
            write_all_fd(fd, &buf[..r as usize]);
            done += r as usize;
        }
    }

    /// Echoes until the client's EOF, then ends our direction.
    pub fn echo_rest(fd: RawFd) {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let r = recv_flags(fd, &mut buf, 0);
            assert!(r >= 0, "echo: recv errno {}", errno());
            if r == 0 {
                break;
            }
            write_all_fd(fd, &buf[..r as usize]);
        }
        // SAFETY: plain shutdown of our socket.
        assert_eq!(unsafe { libc::shutdown(fd, libc::SHUT_WR) }, 0);
    }

    fn write_all_fd(fd: RawFd, mut b: &[u8]) {
        while !b.is_empty() {
            let r = send_flags(fd, b, libc::MSG_NOSIGNAL);
            assert!(r > 0, "send {r} (errno {})", errno());
            b = &b[r as usize..];
        }
    }

    /// Makes `fd` survive an exec.
    pub fn inheritable(fd: RawFd) {
        // SAFETY: fcntl on our own fd.
        assert_eq!(unsafe { libc::fcntl(fd, libc::F_SETFD, 0) }, 0);
    }

    /// The settle pause the test asks for (`BEHAVE_SETTLE_MS`: the upgrade happens meanwhile).
    pub fn settle() {
        if let Some(ms) = std::env::var("BEHAVE_SETTLE_MS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
        {
            sleep_ms(ms);
        }
    }

    /// The end of a scenario whose process changed mid-connection (`setuid`, `dup2_high`):
    /// echoes the rest of `fd` and closes it, then serves a second connection from `l` —
    /// "again", echoed, then EOF.
    pub fn rest_then_again(fd: RawFd, l: &TcpListener) {
        echo_rest(fd);
        // SAFETY: our fd, closed once.
        unsafe { libc::close(fd) };
        let (mut s, _) = l.accept().expect("accept the second connection");
        assert_eq!(read_exact_fd(s.as_raw_fd(), 5), b"again");
        s.write_all(b"again").unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "the second connection's rest: {rest:?}");
    }

    /// The greeting, then the echo of the first part: where every handover scenario's server
    /// starts; returns the connection's fd.
    pub fn first_part(s: TcpStream) -> RawFd {
        let fd = s.into_raw_fd();
        assert_eq!(read_exact_fd(fd, 5), b"hello");
        write_all_fd(fd, b"world");
        echo(fd, FIRST);
        fd
    }

    /// `behave exec_image FD`, ready for `execv`: the path and the strings (which must outlive
    /// the call), and their NULL-terminated vector.
    struct ExecImage {
        exe: std::ffi::CString,
        _args: Vec<std::ffi::CString>,
        argv: Vec<*const libc::c_char>,
    }

    impl ExecImage {
        fn new(fd: RawFd) -> ExecImage {
            let args: Vec<std::ffi::CString> = ["behave", "exec_image", &fd.to_string()]
                .iter()
                .map(|a| std::ffi::CString::new(*a).unwrap())
                .collect();
            let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
            argv.push(std::ptr::null());
            ExecImage {
                exe: std::ffi::CString::new("/proc/self/exe").unwrap(),
                _args: args,
                argv,
            }
        }

        /// `execv` (returns only if it failed). Allocates nothing: a fork child of a threaded
        /// process may call it.
        fn exec(&self) {
            // SAFETY: NUL-terminated strings and a NULL-terminated vector that outlive the call.
            unsafe { libc::execv(self.exe.as_ptr(), self.argv.as_ptr()) };
        }
    }

    /// exec: the server echoes the first part, then replaces its image (with `execv`, which
    /// glibc routes around `execve`'s symbol) by `behave exec_image FD`, which echoes the rest.
    pub fn exec_server(s: TcpStream) {
        let fd = first_part(s);
        inheritable(fd);
        // (the new image writes no stats file: the first image's record stays the server's)
        std::env::remove_var("RDMASHIM_STATS");
        ExecImage::new(fd).exec();
        panic!("execv: errno {}", errno());
    }

    /// The image the exec started: the rest of the echo on the inherited fd.
    pub fn exec_image(fd: RawFd) {
        echo_rest(fd);
        println!("ok exec server");
    }

    /// spawn: the server echoes the first part, then `system()` runs a shell that writes
    /// [`CHILD`] to the inherited socket, then the server echoes the rest.
    pub fn spawn_server(s: TcpStream) {
        let fd = first_part(s);
        inheritable(fd);
        // (the shell writes no stats file of its own: the server's is the one the test reads)
        let stats = std::env::var_os("RDMASHIM_STATS");
        std::env::remove_var("RDMASHIM_STATS");
        let cmd = format!("printf '%s' '{}' >&{fd}", String::from_utf8_lossy(CHILD));
        let cmd = std::ffi::CString::new(cmd).unwrap();
        // SAFETY: a NUL-terminated command.
        let st = unsafe { libc::system(cmd.as_ptr()) };
        if let Some(v) = stats {
            std::env::set_var("RDMASHIM_STATS", v);
        }
        assert!(
            libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
            "system: {st:#x}"
        );
        echo_rest(fd);
        // SAFETY: our fd, closed once.
        unsafe { libc::close(fd) };
    }

    /// A server that writes into the connection through the C library's `stdout` (bash's
    /// `printf ... >&3`; a server that serves its connection on its standard descriptors in
    /// the same image): after the first part it puts the connection at descriptor 1 (`dup2`),
    /// writes [`CHILD`] with `fwrite` and `fflush`, puts its own standard output back, and
    /// echoes the rest. glibc's stdio writes with an internal call no preload sees.
    pub fn stdout_server(s: TcpStream) {
        extern "C" {
            static mut stdout: *mut libc::FILE;
        }
        let fd = first_part(s);
        // SAFETY: plain descriptor calls on our own descriptors; `stdout` is glibc's stream,
        // written and flushed by this thread only, at a descriptor that is the connection.
        unsafe {
            let saved = libc::dup(1);
            assert!(saved >= 0, "dup(1): errno {}", errno());
            assert_eq!(libc::dup2(fd, 1), 1, "dup2 onto 1: errno {}", errno());
            let out = stdout;
            let n = libc::fwrite(CHILD.as_ptr().cast(), 1, CHILD.len(), out);
            assert_eq!(n, CHILD.len(), "fwrite");
            assert_eq!(libc::fflush(out), 0, "fflush: errno {}", errno());
            assert_eq!(libc::dup2(saved, 1), 1, "dup2 back: errno {}", errno());
            libc::close(saved);
        }
        echo_rest(fd);
        // SAFETY: our fd, closed once.
        unsafe { libc::close(fd) };
    }

    pub fn client(addr: SocketAddr, child: &[u8]) {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"hello").unwrap();
        assert_eq!(read_exact_fd(s.as_raw_fd(), 5), b"world");
        let data = rdmashim_compat_tests::random_bytes(N, 0xec0);
        let mut w = s.try_clone().unwrap();
        let sent = data.clone();
        let writer = std::thread::spawn(move || {
            for chunk in sent.chunks(9973) {
                w.write_all(chunk).unwrap();
            }
            w.shutdown(Shutdown::Write).unwrap();
        });
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).expect("read the echo to EOF");
        writer.join().unwrap();
        let mut want = data[..FIRST].to_vec();
        want.extend_from_slice(child);
        want.extend_from_slice(&data[FIRST..]);
        assert_eq!(got.len(), want.len(), "echo length");
        if let Some(i) = got.iter().zip(&want).position(|(a, b)| a != b) {
            panic!("echo differs from byte {i} on (of {})", want.len());
        }
    }

    /// fork per connection, once the connection is on the ring (a server that reads the
    /// request before it forks, or a long-lived one): the server echoes the first part, then
    /// forks; the child echoes the rest while the parent closes its copy and waits.
    pub fn fork_server(s: TcpStream) {
        let fd = first_part(s);
        // SAFETY: the child serves the connection and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: errno {}", errno());
        if pid == 0 {
            let code = std::panic::catch_unwind(|| echo_rest(fd)).map_or(1, |()| 0);
            // SAFETY: ends the child without the parent's exit handlers.
            unsafe { libc::_exit(code) };
        }
        // SAFETY: the parent's copy, closed at once (the child holds the connection).
        unsafe { libc::close(fd) };
        wait_child(pid);
    }

    /// inetd style, once the connection is on the ring: the server echoes the first part,
    /// then forks, and the child `execv`s the program that serves the rest (`behave
    /// exec_image FD`) while the parent closes its copy and waits.
    pub fn fork_exec_server(s: TcpStream) {
        let fd = first_part(s);
        inheritable(fd);
        // (made before the fork: the child of a threaded process only calls execv and _exit)
        let image = ExecImage::new(fd);
        // SAFETY: the child only calls execv and _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: errno {}", errno());
        if pid == 0 {
            image.exec();
            // SAFETY: ends the child without the parent's exit handlers.
            unsafe { libc::_exit(127) };
        }
        // SAFETY: the parent's copy, closed at once (the child holds the connection).
        unsafe { libc::close(fd) };
        wait_child(pid);
    }

    pub fn exec_client(addr: SocketAddr) {
        client(addr, b"");
    }

    pub fn spawn_client(addr: SocketAddr) {
        client(addr, CHILD);
    }
}

/// Descriptors passed to another program over a unix socket (`SCM_RIGHTS`): an accepted
/// connection handed to a worker (dovecot's login processes, postfix's postscreen, PgBouncer's
/// online restart), a listener handed to a successor (haproxy `-x`, envoy's hot restart) or
/// inherited through an exec (systemd's socket activation, `LISTEN_FDS`). The receiver is
/// another image (`behave receiver FD MODE`), started after the server has its socket, which it
/// shares nothing with but what is passed. On TCP nothing of this shows.
mod passing {
    use super::*;
    use std::os::unix::net::UnixStream;

    /// Starts `behave receiver FD mode`, with `fd` inheritable for it (closed here once it
    /// runs); `stats`: whether it writes a stats record of its own (only the listener's
    /// receivers serve connections from their start).
    fn receiver(fd: RawFd, mode: &str, stats: bool) -> std::process::Child {
        handover::inheritable(fd);
        let mut cmd = std::process::Command::new("/proc/self/exe");
        cmd.args(["receiver", &fd.to_string(), mode]);
        if !stats {
            cmd.env_remove("RDMASHIM_STATS");
        }
        let child = cmd.spawn().expect("spawn the receiver");
        // SAFETY: our copy of a descriptor the child now holds.
        unsafe { libc::close(fd) };
        child
    }

    /// A unix socketpair: ours, and the end a receiver gets.
    fn pair() -> (UnixStream, RawFd) {
        let (ours, theirs) = UnixStream::pair().expect("socketpair");
        (ours, theirs.into_raw_fd())
    }

    /// Calls `f` with a message of one byte and room for one descriptor in `SCM_RIGHTS`
    /// (what [`send_fd`] sends and [`recv_fd`] receives).
    fn one_fd_msg<R>(f: impl FnOnce(&mut libc::msghdr) -> R) -> R {
        let mut byte = [b'f'];
        let mut iov = libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: 1,
        };
        // SAFETY: a length computation.
        let space = unsafe { libc::CMSG_SPACE(size_of::<RawFd>() as u32) } as usize;
        // (u64s: aligned for the header)
        let mut control = vec![0u64; space.div_ceil(8)];
        // SAFETY: a zeroed msghdr is a valid empty one; its buffers outlive `f`.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        f(&mut msg)
    }

    /// Sends `fd` over `u`: one byte, with the descriptor in `SCM_RIGHTS`.
    fn send_fd(u: &UnixStream, fd: RawFd) {
        one_fd_msg(|msg| {
            // SAFETY: the header and data lie within the message's control buffer (room for
            // one descriptor).
            unsafe {
                let h = libc::CMSG_FIRSTHDR(msg);
                (*h).cmsg_level = libc::SOL_SOCKET;
                (*h).cmsg_type = libc::SCM_RIGHTS;
                (*h).cmsg_len = libc::CMSG_LEN(size_of::<RawFd>() as u32) as _;
                libc::CMSG_DATA(h).cast::<RawFd>().write_unaligned(fd);
            }
            // SAFETY: a valid message on our socket.
            let r = unsafe { libc::sendmsg(u.as_raw_fd(), msg, 0) };
            assert_eq!(r, 1, "sendmsg: errno {}", errno());
        })
    }

    /// Receives the descriptor [`send_fd`] sent over `u`.
    fn recv_fd(u: RawFd) -> RawFd {
        one_fd_msg(|msg| {
            // SAFETY: a valid message on our socket.
            let r = unsafe { libc::recvmsg(u, msg, libc::MSG_CMSG_CLOEXEC) };
            assert_eq!(r, 1, "recvmsg: errno {}", errno());
            // SAFETY: the message recvmsg filled: one SCM_RIGHTS header, one descriptor.
            unsafe {
                let h = libc::CMSG_FIRSTHDR(msg);
                assert!(!h.is_null(), "no descriptor came");
                assert_eq!(
                    ((*h).cmsg_level, (*h).cmsg_type),
                    (libc::SOL_SOCKET, libc::SCM_RIGHTS)
                );
                libc::CMSG_DATA(h).cast::<RawFd>().read_unaligned()
            }
        })
    }

    fn wait(mut child: std::process::Child) {
        let st = child.wait().expect("wait for the receiver");
        assert!(st.success(), "receiver: {st}");
    }

    /// pass_fd: the server echoes the first part, then passes the connection to the receiver
    /// and closes its copy; the receiver echoes the rest.
    pub fn server(s: TcpStream) {
        let (u, theirs) = pair();
        let child = receiver(theirs, "rest", false);
        let fd = handover::first_part(s);
        send_fd(&u, fd);
        // SAFETY: our copy, closed once (the receiver holds the connection).
        unsafe { libc::close(fd) };
        wait(child);
    }

    /// pass_fd_early: the server passes the connection as soon as it has accepted it (its
    /// upgrade undecided); the receiver serves all of it.
    pub fn early_server(s: TcpStream) {
        let (u, theirs) = pair();
        let child = receiver(theirs, "whole", false);
        let fd = s.into_raw_fd();
        send_fd(&u, fd);
        // SAFETY: our copy, closed once.
        unsafe { libc::close(fd) };
        wait(child);
    }

    /// pass_listener: the server passes its listening socket to the receiver and closes its
    /// own copy; the receiver accepts the client's connection and serves all of it.
    pub fn listener_server(l: TcpListener) {
        let (u, theirs) = pair();
        let child = receiver(theirs, "listener", true);
        send_fd(&u, l.as_raw_fd());
        drop(l);
        wait(child);
    }

    /// activated_listener: the listening socket is inherited through an exec, as systemd
    /// hands a socket-activated service its sockets; the new image accepts and serves.
    pub fn activated_server(l: TcpListener) {
        let fd = l.into_raw_fd();
        wait(receiver(fd, "activated", true));
    }

    /// systemd_listener: as systemd starts a socket-activated service: the listening socket
    /// is made by a process without the shim's upgrades (this server runs with
    /// `RDMASHIM_DISABLE=1`, so its SYNs are not kept), and the service gets it at descriptor 3
    /// with `LISTEN_PID` and `LISTEN_FDS` set (sd_listen_fds(3)), its upgrades on. It sets
    /// itself up for 1.5 s before its first accept; the client comes after 1 s.
    pub fn systemd_server(l: TcpListener) {
        let fd = l.into_raw_fd();
        handover::inheritable(fd);
        let moved = if fd == 3 {
            String::new()
        } else {
            format!(" 3<&{fd} {fd}<&-")
        };
        let script =
            format!("export LISTEN_PID=$$ LISTEN_FDS=1; exec \"$0\" receiver 3 service{moved}");
        let exe = std::env::current_exe().expect("current_exe");
        let child = std::process::Command::new("/bin/sh")
            .args(["-c", &script])
            .arg(exe)
            .env_remove("RDMASHIM_DISABLE")
            .spawn()
            .expect("spawn the service");
        // SAFETY: our copy of a descriptor the child now holds.
        unsafe { libc::close(fd) };
        wait(child);
    }

    /// `behave receiver FD MODE`: the other program.
    pub fn receiver_main(fd: RawFd, mode: &str) {
        let serve = |c: RawFd| {
            // SAFETY: a connection the receiver now owns.
            let s = unsafe { TcpStream::from_raw_fd(c) };
            let fd = handover::first_part(s);
            handover::echo_rest(fd);
            // SAFETY: our fd, closed once.
            unsafe { libc::close(fd) };
        };
        let accept = |l: RawFd| {
            // SAFETY: a listening socket the receiver now owns.
            let l = unsafe { TcpListener::from_raw_fd(l) };
            let (s, _) = l.accept().expect("accept");
            handover::settle();
            serve(s.into_raw_fd());
        };
        match mode {
            "rest" => {
                let c = recv_fd(fd);
                handover::echo_rest(c);
                // SAFETY: our fd, closed once.
                unsafe { libc::close(c) };
            }
            "whole" => serve(recv_fd(fd)),
            "listener" => accept(recv_fd(fd)),
            "activated" => accept(fd),
            // (a service that sets itself up for a while before its first accept: its first
            // client's connection waits in the queue)
            "service" => {
                sleep_ms(1500);
                accept(fd)
            }
            other => panic!("receiver mode {other}"),
        }
    }

    pub fn client(addr: SocketAddr) {
        handover::client(addr, b"");
    }

    /// [`client`], once the service has had a second to start (as a client of a service
    /// started at boot does).
    pub fn late_client(addr: SocketAddr) {
        sleep_ms(1000);
        client(addr);
    }
}

/// A server that drops its privileges mid-connection (sshd's privilege separation, the
/// children of rsync and FTP daemons, anything that accepts as root and then becomes another
/// user): it echoes the first part of a connection, changes its credentials (`setgroups`
/// where allowed, `setgid` and `setuid` to its own ids: allowed to any user, and a change all
/// the same for the kernel, which gives the process new credentials), echoes the rest, then
/// serves a second connection made after the change. On TCP nothing of this shows.
mod setuid {
    use super::*;

    pub fn serve(l: TcpListener) {
        let (s, _) = l.accept().expect("accept");
        handover::settle();
        let fd = handover::first_part(s);
        // SAFETY: plain calls with valid arguments (our own ids; an empty group list).
        unsafe {
            if libc::geteuid() == 0 {
                assert_eq!(
                    libc::setgroups(0, std::ptr::null()),
                    0,
                    "setgroups: errno {}",
                    errno()
                );
            }
            assert_eq!(libc::setgid(libc::getgid()), 0, "setgid: errno {}", errno());
            assert_eq!(libc::setuid(libc::getuid()), 0, "setuid: errno {}", errno());
        }
        handover::rest_then_again(fd, &l);
    }

    pub fn client(addr: SocketAddr) {
        handover::client(addr, b"");
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"again").unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"again");
    }
}

/// A server that keeps files of its own at fixed high descriptor numbers (a shell's
/// `exec 1000>file`, programs that reserve a block of numbers for their logs): in the middle of
/// a connection it echoes part of a large stream, `dup2`s a file onto every number from 1000 to
/// 1063 (free numbers, on a kernel without the shim), writes through each and checks that the
/// file got every line, in order, closes them, echoes the rest, then serves a second
/// connection made after.
mod dup2_high {
    use super::*;

    /// The first number the server puts its file at, and how many.
    const FIRST: RawFd = 1000;
    const COUNT: RawFd = 64;

    /// Makes room for descriptor numbers up to `FIRST + COUNT` (the soft limit is often 1024;
    /// root may raise the hard one).
    fn room() {
        let need = (FIRST + COUNT) as libc::rlim_t + 1;
        let mut rl = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: rl is a valid out-pointer.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) }, 0);
        if rl.rlim_cur >= need {
            return;
        }
        rl.rlim_cur = need;
        rl.rlim_max = rl.rlim_max.max(need);
        // SAFETY: rl is a valid rlimit.
        let r = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &rl) };
        assert_eq!(r, 0, "RLIMIT_NOFILE to {need}: errno {}", errno());
    }

    fn ino(fd: RawFd) -> u64 {
        // SAFETY: an all-zero stat is a valid value to be overwritten.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: st is a valid out-pointer.
        let r = unsafe { libc::fstat(fd, &mut st) };
        assert_eq!(r, 0, "fstat {fd}: errno {}", errno());
        st.st_ino
    }

    pub fn serve(l: TcpListener) {
        room();
        let (s, _) = l.accept().expect("accept");
        handover::settle();
        let fd = handover::first_part(s);
        let path = std::env::temp_dir().join(format!("behave-dup2-high-{}", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .expect("the file");
        std::fs::remove_file(&path).unwrap();
        let f = file.as_raw_fd();
        let mut want = Vec::new();
        for n in FIRST..FIRST + COUNT {
            // SAFETY: plain dup2 onto a number this program holds nothing at.
            let r = unsafe { libc::dup2(f, n) };
            assert_eq!(r, n, "dup2 onto {n}: errno {}", errno());
        }
        for n in FIRST..FIRST + COUNT {
            assert_eq!(ino(n), ino(f), "{n} is not the file");
            let line = format!("line {n}\n");
            // SAFETY: writes from a live buffer of its length.
            let w = unsafe { libc::write(n, line.as_ptr().cast(), line.len()) };
            assert_eq!(w, line.len() as isize, "write to {n}: errno {}", errno());
            want.extend_from_slice(line.as_bytes());
        }
        let mut got = Vec::new();
        let mut rd = &file;
        std::io::Seek::seek(&mut rd, std::io::SeekFrom::Start(0)).unwrap();
        rd.read_to_end(&mut got).unwrap();
        assert!(
            got == want,
            "the file holds {:?}",
            String::from_utf8_lossy(&got)
        );
        for n in FIRST..FIRST + COUNT {
            // SAFETY: the duplicates just made, closed once.
            assert_eq!(unsafe { libc::close(n) }, 0, "close {n}: errno {}", errno());
        }
        handover::rest_then_again(fd, &l);
    }
}

/// A server that sets up io_uring in the middle of a connection (through `syscall()`, as the
/// Rust io-uring crate and libuv do; glibc has no function for it), echoes the rest, then
/// serves a second connection. io_uring's reads, writes and closes reach the kernel without any
/// call a preload sees, so under the shim RDMA ends first: the connection, on the rings then,
/// goes back to TCP at exact offsets, and the next one stays TCP (`io_uring`). Whether the
/// kernel grants the instance (a container may refuse it) changes nothing the scenario checks.
mod io_uring_setup {
    use super::*;

    pub fn serve(l: TcpListener) {
        let (s, _) = l.accept().expect("accept");
        handover::settle();
        let fd = handover::first_part(s);
        // struct io_uring_params: 120 bytes, all zero (no flags) for io_uring_setup(2).
        let mut params = [0u8; 120];
        // SAFETY: io_uring_setup(2) with 4 entries and a zeroed params struct it may fill.
        let ring = unsafe { libc::syscall(libc::SYS_io_uring_setup, 4u32, params.as_mut_ptr()) };
        if ring >= 0 {
            // SAFETY: the descriptor just made, closed once.
            unsafe { libc::close(ring as RawFd) };
        }
        handover::rest_then_again(fd, &l);
    }
}

/// io_uring set up the way liburing does it, with the system call instruction (no library
/// function a preload sees), and driven by hand: one submission at a time, its completion
/// waited for. Enough for a server that does its sockets' I/O through io_uring.
mod uring {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    const OFF_CQ_RING: i64 = 0x800_0000;
    const OFF_SQES: i64 = 0x1000_0000;
    const ENTER_GETEVENTS: i64 = 1;
    pub const OP_CLOSE: u8 = 19;
    pub const OP_SEND: u8 = 26;
    pub const OP_RECV: u8 = 27;
    pub const OP_ACCEPT: u8 = 13;

    /// One instance: its descriptor and the three shared areas (submission ring, its
    /// entries, completion ring), with the offsets the kernel gave.
    pub struct Ring {
        pub fd: RawFd,
        sq: *mut u8,
        sqes: *mut u8,
        cq: *mut u8,
        /// struct io_uring_params as the kernel filled it, in 32-bit words.
        p: [u32; 30],
    }

    fn map(fd: RawFd, len: usize, off: i64) -> *mut u8 {
        // SAFETY: a shared mapping of the io_uring descriptor's area at `off`, as io_uring(7)
        // describes; checked below.
        let m = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                off,
            )
        };
        assert_ne!(
            m,
            libc::MAP_FAILED,
            "mmap of io_uring area {off:#x}: errno {}",
            errno()
        );
        m.cast()
    }

    impl Ring {
        /// A new instance of 4 entries, or the kernel's refusal (`-errno`).
        pub fn new() -> Result<Ring, i64> {
            let mut p = [0u32; 30];
            let fd = unseen_syscall(
                libc::SYS_io_uring_setup,
                [4, p.as_mut_ptr() as i64, 0, 0, 0, 0],
            );
            if fd < 0 {
                return Err(fd);
            }
            let fd = fd as RawFd;
            // sq_off starts at word 10, cq_off at word 20 (struct io_uring_params).
            let sq_len = p[10 + 6] as usize + p[0] as usize * 4;
            let cq_len = p[20 + 5] as usize + p[1] as usize * 16;
            Ok(Ring {
                fd,
                sq: map(fd, sq_len, 0),
                sqes: map(fd, p[0] as usize * 64, OFF_SQES),
                cq: map(fd, cq_len, OFF_CQ_RING),
                p,
            })
        }

        fn word(base: *mut u8, off: u32) -> &'static AtomicU32 {
            // SAFETY: `off` is one of the kernel's offsets of a 32-bit field in a mapping that
            // lives as long as the process (never unmapped).
            unsafe { &*(base.add(off as usize) as *const AtomicU32) }
        }

        /// Submits one operation (`op` on `fd`, buffer `addr`/`len`) and waits for its
        /// completion. Returns its result (`-errno` on failure).
        pub fn run(&mut self, op: u8, fd: RawFd, addr: u64, len: u32) -> i32 {
            let p = self.p;
            let tail = Self::word(self.sq, p[11]).load(Ordering::Relaxed);
            let idx = tail & Self::word(self.sq, p[12]).load(Ordering::Relaxed);
            let mut e = [0u8; 64];
            e[0] = op;
            e[4..8].copy_from_slice(&fd.to_ne_bytes());
            e[16..24].copy_from_slice(&addr.to_ne_bytes());
            e[24..28].copy_from_slice(&len.to_ne_bytes());
            e[32..40].copy_from_slice(&1u64.to_ne_bytes());
            // SAFETY: entry `idx` of the submission entries (below sq_entries), ours until the
            // tail moves past it; the array slot `idx` likewise.
            unsafe {
                std::ptr::copy_nonoverlapping(e.as_ptr(), self.sqes.add(idx as usize * 64), 64);
                (self.sq.add(p[16] as usize + idx as usize * 4) as *mut u32).write(idx);
            }
            Self::word(self.sq, p[11]).store(tail.wrapping_add(1), Ordering::Release);
            loop {
                let r = unseen_syscall(
                    libc::SYS_io_uring_enter,
                    [self.fd as i64, 1, 1, ENTER_GETEVENTS, 0, 0],
                );
                if r != -(libc::EINTR as i64) {
                    assert!(r >= 0, "io_uring_enter: {r}");
                    break;
                }
            }
            let head = Self::word(self.cq, p[20]).load(Ordering::Relaxed);
            let ctail = Self::word(self.cq, p[21]).load(Ordering::Acquire);
            assert_ne!(head, ctail, "io_uring_enter returned with no completion");
            let at = head & Self::word(self.cq, p[22]).load(Ordering::Relaxed);
            // SAFETY: completion `at` (below cq_entries), written by the kernel before the
            // tail we read with Acquire.
            let res = unsafe {
                (self.cq.add(p[25] as usize + at as usize * 16 + 8) as *const i32).read()
            };
            Self::word(self.cq, p[20]).store(head.wrapping_add(1), Ordering::Release);
            res
        }
    }
}

/// A server that does its sockets' I/O through io_uring set up with inline system calls
/// (liburing's way: no call the shim sees), the instance made before its first accept, as
/// such servers start. Three connections: the first two accepted with accept(2), the third
/// with io_uring's accept; each echoed through io_uring's receive and send until the client's
/// EOF, then closed through io_uring. io_uring moves bytes on the sockets where no hook runs,
/// so under the shim RDMA ends when the engine finds the instance, before it takes up the first
/// connection: every connection stays TCP (`io_uring`), and each echo is whole.
mod uring_io {
    use super::*;

    const CONNS: usize = 3;
    const LEN: usize = 300_000;

    pub fn serve(l: TcpListener) {
        let mut ring = uring::Ring::new().unwrap_or_else(|e| panic!("io_uring_setup: {e}"));
        let lfd = l.as_raw_fd();
        for round in 0..CONNS {
            let fd = if round < 2 {
                l.accept().expect("accept").0.into_raw_fd()
            } else {
                let fd = ring.run(uring::OP_ACCEPT, lfd, 0, 0);
                assert!(fd >= 0, "io_uring accept: {fd}");
                fd
            };
            handover::settle();
            let mut buf = vec![0u8; 16 << 10];
            let mut total = 0;
            loop {
                let n = ring.run(
                    uring::OP_RECV,
                    fd,
                    buf.as_mut_ptr() as u64,
                    buf.len() as u32,
                );
                assert!(n >= 0, "connection {round}: io_uring recv: {n}");
                if n == 0 {
                    break;
                }
                let mut off = 0;
                while off < n as usize {
                    let w = ring.run(
                        uring::OP_SEND,
                        fd,
                        buf[off..].as_ptr() as u64,
                        (n as usize - off) as u32,
                    );
                    assert!(w > 0, "connection {round}: io_uring send: {w}");
                    off += w as usize;
                }
                total += n as usize;
            }
            assert_eq!(total, LEN, "connection {round}: bytes received");
            assert_eq!(ring.run(uring::OP_CLOSE, fd, 0, 0), 0, "io_uring close");
        }
    }

    pub fn client(addr: SocketAddr) {
        for round in 0..CONNS {
            let mut s = TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(T)).unwrap();
            let data = pattern(LEN, round as u8);
            let mut r = s.try_clone().unwrap();
            let reader = std::thread::spawn(move || read_to_eof(&mut r));
            s.write_all(&data).unwrap();
            s.shutdown(Shutdown::Write).unwrap();
            let got = reader.join().unwrap();
            assert_eq!(got.len(), LEN, "connection {round}: echo length");
            assert!(got == data, "connection {round}: echo differs");
        }
    }
}

/// A server whose connection is on the rings when it sets up io_uring with inline system
/// calls (no call the shim sees), keeps the instance and pauses (two and a half seconds, as a
/// server busy elsewhere), then echoes the rest and serves a second connection. Under the shim
/// the engine's periodic look finds the instance: the connection goes back to TCP at exact
/// offsets while the server pauses, and the next one stays TCP (`io_uring`).
mod uring_late {
    use super::*;

    pub fn serve(l: TcpListener) {
        let (s, _) = l.accept().expect("accept");
        handover::settle();
        let fd = handover::first_part(s);
        let ring = uring::Ring::new().unwrap_or_else(|e| panic!("io_uring_setup: {e}"));
        // (the engine looks once a second, or less often where a look costs more than a
        // millisecond of CPU: 2.5 s was too short for it under emulation on a loaded host)
        sleep_ms(5000);
        handover::rest_then_again(fd, &l);
        // SAFETY: the instance's descriptor, closed once (its mappings stay: the process ends).
        unsafe { libc::close(ring.fd) };
    }
}

/// A program near its descriptor limit (`RLIMIT_NOFILE` lowered to 256, then every number but
/// the last twelve taken by files): three connections at once, each a greeting and its answer,
/// then the program takes every descriptor it has left — exactly twelve less the three
/// sockets, as on a kernel without the shim: whatever the upgrade would need of its own, it
/// must not take the program's last descriptors. `fd_limit_server`: the server is the crowded
/// one (after its `listen`); `fd_limit_client`: the client (before its connects).
mod fd_limit {
    use super::*;

    const LIMIT: u64 = 256;
    const SPARE: usize = 12;
    const CONNS: usize = 3;

    /// Lowers the soft limit to [`LIMIT`] and fills every free number below it but the last
    /// [`SPARE`]; returns the files (open until the process ends).
    fn crowd() -> Vec<std::fs::File> {
        let mut rl = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: rl is a valid out-pointer.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) }, 0);
        rl.rlim_cur = LIMIT;
        // SAFETY: rl is a valid rlimit (a lower soft limit is always allowed).
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &rl) }, 0);
        let mut files = Vec::new();
        loop {
            match std::fs::File::open("/dev/null") {
                Ok(f) => files.push(f),
                Err(e) if e.raw_os_error() == Some(libc::EMFILE) => break,
                Err(e) => panic!("open /dev/null: {e}"),
            }
        }
        assert!(files.len() > SPARE, "only {} descriptors free", files.len());
        files.truncate(files.len() - SPARE);
        files
    }

    /// Takes every descriptor left and says how many it got (then gives them back).
    fn spare() -> usize {
        let mut files = Vec::new();
        loop {
            match std::fs::File::open("/dev/null") {
                Ok(f) => files.push(f),
                Err(e) if e.raw_os_error() == Some(libc::EMFILE) => return files.len(),
                Err(e) => panic!("open /dev/null: {e}"),
            }
        }
    }

    fn serve_crowded(l: TcpListener, crowded: bool) {
        let _files = crowded.then(crowd);
        let mut conns: Vec<TcpStream> = (0..CONNS).map(|_| l.accept().expect("accept").0).collect();
        for (i, s) in conns.iter_mut().enumerate() {
            s.set_read_timeout(Some(T)).unwrap();
            let mut hello = [0u8; 7];
            s.read_exact(&mut hello).unwrap();
            assert_eq!(&hello, format!("hello {i}").as_bytes());
            s.write_all(format!("world {i}").as_bytes()).unwrap();
        }
        if crowded {
            assert_eq!(spare(), SPARE - CONNS, "descriptors left to the server");
        }
        for s in &mut conns {
            assert!(read_to_eof(s).is_empty());
        }
    }

    fn client_crowded(addr: SocketAddr, crowded: bool) {
        let _files = crowded.then(crowd);
        let mut conns: Vec<TcpStream> = (0..CONNS)
            .map(|_| TcpStream::connect(addr).expect("connect"))
            .collect();
        for (i, s) in conns.iter_mut().enumerate() {
            s.set_read_timeout(Some(T)).unwrap();
            s.write_all(format!("hello {i}").as_bytes()).unwrap();
            let mut world = [0u8; 7];
            s.read_exact(&mut world).unwrap();
            assert_eq!(&world, format!("world {i}").as_bytes());
        }
        if crowded {
            assert_eq!(spare(), SPARE - CONNS, "descriptors left to the client");
        }
    }

    pub fn serve_server(l: TcpListener) {
        serve_crowded(l, true);
    }

    pub fn client_server(addr: SocketAddr) {
        client_crowded(addr, false);
    }

    pub fn serve_client(l: TcpListener) {
        serve_crowded(l, false);
    }

    pub fn client_client(addr: SocketAddr) {
        client_crowded(addr, true);
    }
}

/// Closes that the program makes where a preloaded library may not see them: libuv (Node.js)
/// closes every descriptor with `syscall(SYS_close, fd)`; an inline system call (a static
/// helper, a hand-written wrapper) or io_uring's close reach the kernel through no library
/// function at all. Five connections, each an echo of a few blocks, then the client's last
/// words and its close:
/// 0. closed with `syscall(SYS_close)`; a file opened next gets the number and is written;
/// 1. closed with the system call instruction; the next socket gets the number (connection 2);
/// 2. a plain one on that socket;
/// 3. closed with the system call instruction; a file opened next (a call no preload sees)
///    gets the number and is written once the server has read the connection's end — which it
///    reads after the client's bytes, never before and never a reset — and says so on
///    connection 4.
///
/// Each file must hold exactly what was written to it, and the server every connection's
/// bytes, in order, then EOF. Under the shim before: the closes left their connections open
/// on the ring (the server waited for an EOF that never came) and the numbers' entries named
/// them, so a file's writes went to the peer.
mod missed_close {
    use super::*;

    const BLOCKS: usize = 8;
    const CONNS: usize = 5;

    pub fn serve(l: TcpListener) {
        for round in 0..CONNS {
            let (mut s, _) = l.accept().expect("accept");
            handover::settle();
            s.write_all(format!("r{round}").as_bytes()).unwrap();
            s.set_read_timeout(Some(T)).unwrap();
            let mut buf = vec![0u8; 4096];
            for _ in 0..BLOCKS {
                s.read_exact(&mut buf).unwrap();
                s.write_all(&buf).unwrap();
            }
            let rest = read_to_eof(&mut s);
            assert_eq!(
                String::from_utf8_lossy(&rest),
                format!("bye {round}"),
                "connection {round}: its last bytes"
            );
        }
    }

    /// A connection to the server, with a read timeout.
    fn connect(addr: SocketAddr) -> TcpStream {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        s
    }

    fn exchange(s: &mut TcpStream, round: usize) {
        let mut mark = vec![0u8; format!("r{round}").len()];
        s.read_exact(&mut mark).unwrap();
        assert_eq!(String::from_utf8_lossy(&mark), format!("r{round}"));
        let mut got = vec![0u8; 4096];
        for i in 0..BLOCKS {
            let block = pattern(4096, (round * BLOCKS + i) as u8);
            s.write_all(&block).unwrap();
            s.read_exact(&mut got).unwrap();
            assert!(
                got == block,
                "connection {round}, block {i} came back different"
            );
        }
        s.write_all(format!("bye {round}").as_bytes()).unwrap();
    }

    /// Opens a new file, which must get number `fd` (the lowest free one), runs `meanwhile`,
    /// then writes a line to it through that number and checks the file holds exactly that
    /// line.
    fn file_at(fd: RawFd, round: usize, meanwhile: impl FnOnce()) {
        let path = std::env::temp_dir().join(format!(
            "behave-missed-close-{}-{round}",
            std::process::id()
        ));
        let f = std::fs::File::create(&path).unwrap();
        assert_eq!(f.as_raw_fd(), fd, "the new file got another number");
        meanwhile();
        let line = format!("file {round}\n");
        // SAFETY: writes the line's bytes to the file just opened.
        let w = unsafe { libc::write(fd, line.as_ptr().cast(), line.len()) };
        assert_eq!(
            w,
            line.len() as isize,
            "write to the file: errno {}",
            errno()
        );
        drop(f);
        let got = std::fs::read(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert!(
            got == line.as_bytes(),
            "the file at {fd} holds {:?}",
            String::from_utf8_lossy(&got)
        );
    }

    pub fn client(addr: SocketAddr) {
        // 0: syscall(SYS_close), as libuv closes.
        let mut s = connect(addr);
        exchange(&mut s, 0);
        let fd = s.into_raw_fd();
        // SAFETY: closes the connection's descriptor, which nothing uses afterwards.
        let r = unsafe { libc::syscall(libc::SYS_close, fd) };
        assert_eq!(r, 0, "syscall(SYS_close): errno {}", errno());
        file_at(fd, 0, || {});

        // 1 and 2: an unseen close; the next socket gets the number.
        let mut s = connect(addr);
        exchange(&mut s, 1);
        let fd = s.into_raw_fd();
        assert_eq!(
            unseen_syscall(libc::SYS_close, [fd as i64, 0, 0, 0, 0, 0]),
            0
        );
        let mut s = connect(addr);
        assert_eq!(s.as_raw_fd(), fd, "the next socket got another number");
        exchange(&mut s, 2);
        drop(s);

        // 3 and 4: an unseen close; a file opened without any hooked call gets the number.
        let mut s = connect(addr);
        exchange(&mut s, 3);
        let mut next = connect(addr);
        let fd = s.into_raw_fd();
        assert_eq!(
            unseen_syscall(libc::SYS_close, [fd as i64, 0, 0, 0, 0, 0]),
            0
        );
        // (the server takes connection 4 once it has read the end of connection 3)
        file_at(fd, 3, || exchange(&mut next, 4));
        drop(next);
    }
}

/// Makes RLIMIT_MEMLOCK bind this process, as it binds an unprivileged one: drops
/// CAP_IPC_LOCK (which exempts root from it) and sets the limit to `kib` KiB.
/// Many connections at once (issue 28): the client opens `BEHAVE_CONNS` (default 1000)
/// connections one right after another, echoes 64 B on each (over TCP: their upgrades are still
/// being set up), says so (`ready`, BEHAVE_READY_FILE), and waits for the file BEHAVE_GO
/// (the test creates it once the upgrades are decided); then [`BYTES`] more on each, a pattern
/// of its own per connection, echoed and checked, and closes them all. The server serves each
/// connection on a thread of its own until its end, and ends once all have.
mod burst {
    use super::*;

    /// What each connection carries after the go.
    pub const BYTES: usize = 16 * 1024;

    pub(super) fn conns() -> usize {
        std::env::var("BEHAVE_CONNS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1000)
    }

    /// As many descriptors as the hard limit allows: a thousand connections take a few
    /// thousand (the shim's own among them).
    pub(super) fn raise_nofile() {
        let mut l = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: a valid rlimit for getrlimit/setrlimit to read and write.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 && l.rlim_cur < l.rlim_max {
                l.rlim_cur = l.rlim_max;
                libc::setrlimit(libc::RLIMIT_NOFILE, &l);
            }
        }
    }

    pub(super) fn spawn_small<F: FnOnce() + Send + 'static>(f: F) -> std::thread::JoinHandle<()> {
        std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(f)
            .expect("spawn")
    }

    pub fn serve(l: TcpListener) {
        raise_nofile();
        let n = conns();
        let mut threads = Vec::with_capacity(n);
        for _ in 0..n {
            let (mut s, _) = l.accept().expect("accept");
            threads.push(spawn_small(move || {
                s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
                let mut buf = vec![0u8; 16 * 1024];
                loop {
                    let k = s.read(&mut buf).expect("read");
                    if k == 0 {
                        break;
                    }
                    s.write_all(&buf[..k]).expect("write");
                }
                s.shutdown(Shutdown::Write).unwrap();
            }));
        }
        for t in threads {
            t.join().expect("a connection's thread failed");
        }
    }

    pub fn client(addr: SocketAddr) {
        raise_nofile();
        let n = conns();
        let t0 = Instant::now();
        let mut ss: Vec<TcpStream> = (0..n)
            .map(|i| {
                let s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {i}: {e}"));
                s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
                s
            })
            .collect();
        let mut got = vec![0u8; BYTES];
        for (i, s) in ss.iter_mut().enumerate() {
            let hello = pattern(64, i as u8);
            s.write_all(&hello).unwrap();
            s.read_exact(&mut got[..64]).unwrap();
            assert!(
                got[..64] == hello[..],
                "connection {i}: the first echo came back different"
            );
        }
        println!("burst of {n} in {:?}", t0.elapsed());
        std::io::stdout().flush().unwrap();
        ready();
        let go = std::env::var_os("BEHAVE_GO").map(std::path::PathBuf::from);
        if let Some(go) = go {
            let until = Instant::now() + Duration::from_secs(600);
            while !go.exists() {
                assert!(Instant::now() < until, "no go within 10 minutes");
                sleep_ms(20);
            }
        }
        // Each connection's own bytes, so that one delivered on another would show.
        for (i, s) in ss.iter_mut().enumerate() {
            let block = pattern(BYTES, (i * 7 + 1) as u8);
            let mut seed = (i as u64).to_le_bytes().to_vec();
            seed.extend_from_slice(&block[8..]);
            s.write_all(&seed).unwrap();
            s.read_exact(&mut got).unwrap();
            assert!(got == seed, "connection {i}: its bytes came back different");
        }
        for (i, mut s) in ss.into_iter().enumerate() {
            s.shutdown(Shutdown::Write).unwrap();
            assert_eq!(read_to_eof(&mut s), b"", "connection {i}");
        }
    }
}

/// Connections that stream from their first byte (issue 28's traffic patterns): the client
/// opens `BEHAVE_CONNS` connections, and on each at once a thread of its own writes its
/// index, then 64 KiB blocks of a pattern of its own, for as long as it takes (until the
/// `BEHAVE_GO` file appears), while another waits to read: their upgrades are set up while
/// every connection keeps its lock busy. Then it shuts its side, and the server, which checked
/// the blocks' numbers and patterns (see `block`), answers with the count, which must be what
/// was sent.
mod streams {
    use super::*;

    const BLOCK: usize = 64 * 1024;

    /// The servers' counts, as each connection's reader got them: (connection, bytes).
    static SENT_COUNTS: std::sync::Mutex<Vec<(u64, u64)>> = std::sync::Mutex::new(Vec::new());

    /// Connection `i`'s block number `k`: its number and the connection's, then a pattern of
    /// the connection's own. (The reader checks the numbers of every block, and the whole of
    /// one block in 64: it must keep pace with the writers, or they would wait on full
    /// buffers, letting go of their connections' locks.)
    fn block(i: u64, k: u64, b: &mut [u8]) {
        if k == 0 {
            b.copy_from_slice(&pattern(BLOCK, (i * 7 + 1) as u8));
        }
        b[..8].copy_from_slice(&k.to_le_bytes());
        b[8..16].copy_from_slice(&i.to_le_bytes());
    }

    /// Fills `buf` from `s`: false at the stream's end before its first byte.
    fn read_block(s: &mut TcpStream, buf: &mut [u8]) -> bool {
        let mut got = 0;
        while got < buf.len() {
            match s.read(&mut buf[got..]).expect("read") {
                0 if got == 0 => return false,
                0 => panic!("the stream ended inside a block ({got} of {})", buf.len()),
                k => got += k,
            }
        }
        true
    }

    pub fn serve(l: TcpListener) {
        burst::raise_nofile();
        let threads: Vec<_> = (0..burst::conns())
            .map(|_| {
                let (mut s, _) = l.accept().expect("accept");
                burst::spawn_small(move || {
                    s.set_read_timeout(Some(Duration::from_secs(600))).unwrap();
                    let mut idx = [0u8; 8];
                    s.read_exact(&mut idx).expect("the connection's index");
                    let i = u64::from_le_bytes(idx);
                    let (mut want, mut got) = (vec![0u8; BLOCK], vec![0u8; BLOCK]);
                    let mut k = 0u64;
                    while read_block(&mut s, &mut got) {
                        block(i, k, &mut want);
                        let whole = k.is_multiple_of(64);
                        assert!(
                            got[..16] == want[..16] && (!whole || got == want),
                            "connection {i}: block {k} came different"
                        );
                        k += 1;
                    }
                    s.write_all(&(k * BLOCK as u64).to_le_bytes())
                        .expect("write the count");
                    s.shutdown(Shutdown::Write).unwrap();
                })
            })
            .collect();
        for t in threads {
            t.join().expect("a connection's thread failed");
        }
    }

    pub fn client(addr: SocketAddr) {
        burst::raise_nofile();
        let go = std::env::var_os("BEHAVE_GO")
            .map(std::path::PathBuf::from)
            .expect("BEHAVE_GO");
        let threads: Vec<_> = (0..burst::conns() as u64)
            .map(|i| {
                let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {i}: {e}"));
                let go = go.clone();
                // (a thread already waits for the server's count, as a full-duplex
                // application's reader would, while the writer streams)
                let mut r = s.try_clone().expect("try_clone");
                let reader = burst::spawn_small(move || {
                    r.set_read_timeout(Some(Duration::from_secs(600))).unwrap();
                    let mut count = [0u8; 8];
                    r.read_exact(&mut count).expect("the server's count");
                    assert_eq!(read_to_eof(&mut r), b"", "connection {i}");
                    SENT_COUNTS
                        .lock()
                        .unwrap()
                        .push((i, u64::from_le_bytes(count)));
                });
                burst::spawn_small(move || {
                    s.write_all(&i.to_le_bytes()).expect("write the index");
                    let until = Instant::now() + Duration::from_secs(600);
                    let mut b = vec![0u8; BLOCK];
                    let mut k = 0u64;
                    while !go.exists() {
                        assert!(Instant::now() < until, "no go within 10 minutes");
                        block(i, k, &mut b);
                        s.write_all(&b).expect("write");
                        k += 1;
                    }
                    s.shutdown(Shutdown::Write).unwrap();
                    reader.join().expect("the reader");
                    let counts = SENT_COUNTS.lock().unwrap();
                    let got = counts.iter().find(|(j, _)| *j == i).map(|(_, c)| *c);
                    assert_eq!(got, Some(k * BLOCK as u64), "connection {i}: bytes lost");
                })
            })
            .collect();
        ready();
        for t in threads {
            t.join().expect("a connection's thread failed");
        }
    }
}

fn limit_memlock(kib: u64) {
    const CAP_IPC_LOCK: u32 = 14;
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut h = Header {
        version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
        pid: 0,
    };
    let mut d = [Data::default(); 2];
    // SAFETY: capget/capset with a version-3 header and two data words, as capget(2) says.
    unsafe {
        assert_eq!(
            libc::syscall(libc::SYS_capget, &mut h, d.as_mut_ptr()),
            0,
            "capget"
        );
        let bit = !(1u32 << CAP_IPC_LOCK);
        d[0].effective &= bit;
        d[0].permitted &= bit;
        d[0].inheritable &= bit;
        assert_eq!(libc::syscall(libc::SYS_capset, &h, d.as_ptr()), 0, "capset");
    }
    let r = libc::rlimit {
        rlim_cur: kib * 1024,
        rlim_max: kib * 1024,
    };
    // SAFETY: a valid rlimit.
    let set = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &r) };
    assert_eq!(set, 0, "setrlimit");
}

/// The index of network interface `name` (if_nametoindex(3)).
fn nix_if_index(name: &str) -> Option<u32> {
    let c = std::ffi::CString::new(name).ok()?;
    // SAFETY: a NUL-terminated name; the call only reads it.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (i != 0).then_some(i)
}

type Server = fn(TcpStream);
type ListenerServer = fn(TcpListener);
type Client = fn(SocketAddr);

/// How a scenario's server role starts: with the one connection accepted for it, or with the
/// listening socket.
enum Serve {
    Accepted(Server),
    Listener(ListenerServer),
}

const SCENARIOS: &[(&str, Server, Client)] = &[
    (
        "nonblocking_connect",
        nonblocking_connect::server,
        nonblocking_connect::client,
    ),
    ("epoll_et", epoll_et::server, epoll_et::client),
    ("epoll_readd", epoll_readd::server, epoll_readd::client),
    ("epoll_defer", epoll_defer::server, epoll_defer::client),
    ("select", select::server, select::client),
    ("half_close", half_close::server, half_close::client),
    ("peek_waitall", peek_waitall::server, peek_waitall::client),
    ("scatter", scatter::server, scatter::client),
    ("threads", threads::server, threads::client),
    ("fork", fork::server, fork::client),
    ("fork_serve", fork_serve::server, fork_serve::client),
    (
        "fork_quick_exit",
        fork_quick_exit::server,
        fork_quick_exit::client,
    ),
    ("fork_client", fork_client::server, fork_client::client),
    ("dup2", dup2::server, dup2::client),
    ("sendfile", sendfile::server, sendfile::client),
    ("peer_death", peer_death::server, peer_death::client),
    ("echo", echo::server, echo::client),
    ("duplex", duplex::server, duplex::client),
    ("keepalive", keepalive::server, keepalive::client),
    ("cut_writer", cut_writer::server, cut_writer::client),
    ("wait_signal", wait_signal::server, wait_signal::client),
    ("restart", restart::server, restart::client),
    ("lowest_fd", lowest_fd::server, lowest_fd::client),
    ("epoll_data", epoll_data::server, epoll_data::client),
    ("stdio", stdio::server, stdio::client),
    ("exec", handover::exec_server, handover::exec_client),
    ("spawn", handover::spawn_server, handover::spawn_client),
    ("fork_ring", handover::fork_server, handover::exec_client),
    ("close_all", close_all::server, close_all::client),
    (
        "stdout_dup",
        handover::stdout_server,
        handover::spawn_client,
    ),
    (
        "fork_exec",
        handover::fork_exec_server,
        handover::exec_client,
    ),
    ("pass_fd", passing::server, passing::client),
    ("pass_fd_early", passing::early_server, passing::client),
];

/// Scenarios whose server role takes the listening socket itself.
const LISTENER_SCENARIOS: &[(&str, ListenerServer, Client)] = &[
    ("prefork", prefork::serve, prefork::client),
    ("burst", burst::serve, burst::client),
    ("streams", streams::serve, streams::client),
    ("epoll_reuse", epoll_reuse::serve, epoll_reuse::client),
    ("fork_dial", fork_dial::serve, fork_dial::client),
    ("setuid", setuid::serve, setuid::client),
    ("dup2_high", dup2_high::serve, setuid::client),
    ("missed_close", missed_close::serve, missed_close::client),
    ("io_uring", io_uring_setup::serve, setuid::client),
    ("uring_io", uring_io::serve, uring_io::client),
    ("uring_late", uring_late::serve, setuid::client),
    (
        "fd_limit_server",
        fd_limit::serve_server,
        fd_limit::client_server,
    ),
    (
        "fd_limit_client",
        fd_limit::serve_client,
        fd_limit::client_client,
    ),
    ("pass_listener", passing::listener_server, passing::client),
    (
        "activated_listener",
        passing::activated_server,
        passing::client,
    ),
    (
        "systemd_listener",
        passing::systemd_server,
        passing::late_client,
    ),
];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() == 3 && args[1] == "exec_image" {
        // (the `exec` scenario's server, after its exec: the fd it inherited)
        handover::exec_image(args[2].parse().expect("FD"));
        return;
    }
    if args.len() == 4 && args[1] == "receiver" {
        // (a program another one passes a descriptor to: the `pass_*` scenarios)
        passing::receiver_main(args[2].parse().expect("FD"), &args[3]);
        return;
    }
    let usage = "usage: behave SCENARIO server IP | behave SCENARIO client IP PORT";
    if args.len() < 4 {
        eprintln!("{usage}");
        std::process::exit(2);
    }
    let (name, server, client) = match SCENARIOS.iter().find(|s| s.0 == args[1]) {
        Some(&(name, server, client)) => (name, Serve::Accepted(server), client),
        None => match LISTENER_SCENARIOS.iter().find(|s| s.0 == args[1]) {
            Some(&(name, serve, client)) => (name, Serve::Listener(serve), client),
            None => {
                eprintln!(
                    "unknown scenario {}; known: {:?}",
                    args[1],
                    SCENARIOS
                        .iter()
                        .map(|s| s.0)
                        .chain(LISTENER_SCENARIOS.iter().map(|s| s.0))
                        .collect::<Vec<_>>()
                );
                std::process::exit(2);
            }
        },
    };
    if let Some(kib) = std::env::var("BEHAVE_MEMLOCK_KIB")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        limit_memlock(kib);
    }
    // (an IPv6 link-local address takes its interface: fe80::1%eth0)
    let (ip, scope) = match args[3].split_once('%') {
        Some((a, ifname)) => (
            a.parse::<IpAddr>().expect("IP"),
            nix_if_index(ifname).unwrap_or_else(|| panic!("no interface {ifname}")),
        ),
        None => (args[3].parse::<IpAddr>().expect("IP"), 0),
    };
    let sockaddr = |port: u16| match ip {
        IpAddr::V6(a) => SocketAddr::V6(std::net::SocketAddrV6::new(a, port, 0, scope)),
        IpAddr::V4(_) => SocketAddr::new(ip, port),
    };
    match args[2].as_str() {
        "server" => {
            // (BEHAVE_PORT: a port agreed beforehand, for a client on another host)
            let port = std::env::var("BEHAVE_PORT")
                .ok()
                .and_then(|p| p.parse::<u16>().ok())
                .unwrap_or(0);
            let l = TcpListener::bind(sockaddr(port)).expect("bind");
            println!("port {}", l.local_addr().unwrap().port());
            std::io::stdout().flush().unwrap();
            let server = match server {
                Serve::Listener(serve) => {
                    serve(l);
                    println!("ok {name} server");
                    return;
                }
                Serve::Accepted(server) => server,
            };
            // The listener stays open while the scenario runs, as in most servers (the shim's
            // RDMA side of a listening socket lives as long as the socket).
            let (s, _) = l.accept().expect("accept");
            if let Some(ms) = std::env::var("BEHAVE_SETTLE_MS")
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
            {
                sleep_ms(ms);
            }
            server(s);
            drop(l);
        }
        "client" => {
            let port: u16 = args.get(4).expect(usage).parse().expect("PORT");
            client(sockaddr(port));
        }
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    }
    println!("ok {name} {}", args[2]);
}
