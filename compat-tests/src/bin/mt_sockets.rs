//! A multithreaded program with many sockets, run under the shim by tests/multithreaded.rs.
//!
//! Client threads make TCP loopback connections (half with a blocking connect, half with
//! `connect_timeout`, i.e. a non-blocking connect completed through poll + SO_ERROR), send a
//! payload, half-close, and read the echo back (half of them writing from a second thread on a
//! `try_clone`d fd while the first reads). An echo server thread per connection. Meanwhile churn
//! threads create socketpairs, dup (F_DUPFD_CLOEXEC), dup2/dup3 onto fixed fds, and close.
//! Prints `ok connections=N payload_bytes=B` on success.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const CLIENT_THREADS: u64 = 8;
const CONNS_PER_THREAD: u64 = 25;
const CHURN_THREADS: usize = 3;

fn payload(seed: u64) -> Vec<u8> {
    let len = 1 + (seed.wrapping_mul(2654435761) % (96 * 1024)) as usize;
    (0..len)
        .map(|i| (i as u64).wrapping_mul(31).wrapping_add(seed) as u8)
        .collect()
}

fn echo(mut s: TcpStream) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => s.write_all(&buf[..n]).expect("echo write"),
            Err(e) => panic!("echo read: {e}"),
        }
    }
}

fn client(addr: std::net::SocketAddr, t: u64, k: u64, bytes: &AtomicU64) {
    let seed = t * 1000 + k;
    let data = payload(seed);
    let s = if k & 1 == 0 {
        TcpStream::connect(addr).expect("connect")
    } else {
        TcpStream::connect_timeout(&addr, Duration::from_secs(10)).expect("connect_timeout")
    };
    let mut got = Vec::with_capacity(data.len());
    if k % 4 < 2 {
        // One thread writes, the other reads, on two fds of one socket.
        let mut w = s.try_clone().expect("try_clone");
        let d2 = data.clone();
        let writer = std::thread::spawn(move || {
            w.write_all(&d2).expect("write");
            w.shutdown(Shutdown::Write).expect("shutdown");
        });
        (&s).read_to_end(&mut got).expect("read");
        writer.join().unwrap();
    } else {
        (&s).write_all(&data).expect("write");
        s.shutdown(Shutdown::Write).expect("shutdown");
        (&s).read_to_end(&mut got).expect("read");
    }
    assert!(got == data, "echo mismatch on connection {seed}");
    bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
}

fn churn(i: usize, stop: &AtomicBool) -> u64 {
    let target = 900 + i as i32;
    let mut rounds = 0;
    while !stop.load(Ordering::Relaxed) || rounds < 50 {
        let (mut a, mut b) = UnixStream::pair().expect("socketpair");
        let c = a.try_clone().expect("dup");
        a.write_all(b"ping").unwrap();
        let mut buf = [0u8; 4];
        b.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"ping");
        // SAFETY: dup2/dup3 onto a fixed fd number this thread owns, then close it.
        unsafe {
            assert_eq!(libc::dup2(c.as_raw_fd(), target), target);
            assert_eq!(libc::dup3(b.as_raw_fd(), target, libc::O_CLOEXEC), target);
            assert_eq!(libc::close(target), 0);
        }
        drop(c);
        rounds += 1;
    }
    rounds
}

fn main() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().unwrap();
    let total = CLIENT_THREADS * CONNS_PER_THREAD;
    let server = std::thread::spawn(move || {
        let mut handlers = vec![];
        for _ in 0..total {
            let (s, _) = listener.accept().expect("accept");
            handlers.push(std::thread::spawn(move || echo(s)));
        }
        handlers.into_iter().for_each(|h| h.join().unwrap());
    });
    let stop = Arc::new(AtomicBool::new(false));
    let churners: Vec<_> = (0..CHURN_THREADS)
        .map(|i| {
            let stop = stop.clone();
            std::thread::spawn(move || churn(i, &stop))
        })
        .collect();
    let bytes = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> = (0..CLIENT_THREADS)
        .map(|t| {
            let bytes = bytes.clone();
            std::thread::spawn(move || {
                for k in 0..CONNS_PER_THREAD {
                    client(addr, t, k, &bytes);
                }
            })
        })
        .collect();
    clients.into_iter().for_each(|h| h.join().unwrap());
    server.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    let rounds: u64 = churners.into_iter().map(|h| h.join().unwrap()).sum();
    println!(
        "ok connections={total} payload_bytes={} churn_rounds={rounds}",
        bytes.load(Ordering::Relaxed)
    );
}
