//! RDMA tier: gunicorn as a prefork Python server. Its arbiter makes the listening socket and
//! forks three workers of the `gthread` class: each accepts on the inherited socket from a
//! selector loop and serves its keep-alive connections from a pool of two threads, in Python.
//! The same keep-alive client as for nginx (three connections, each fetching a 256 KiB file
//! twenty times, 100 ms apart, every body checked) is upgraded in whichever worker took each
//! connection (on that worker's own rdma_cm listener, docs/upgrade.md §4), and the later
//! responses go through the rings and the device's packet counters; the arbiter's record
//! shows no connection.
//!
//! (gunicorn's default `sync` workers answer one request per connection and close it: those
//! connections end within milliseconds, before any upgrade, and stay TCP as `closed_early` /
//! `no_upgrade_request`, intact; measured by hand, not a test.)

use rdmashim_compat_tests::prefork_http::{check_workers, serve_and_fetch, www};
use rdmashim_compat_tests::*;

/// The WSGI application: the file, whatever the path.
const APP_PY: &str = r#"
import os
BODY = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "www", "f.bin"), "rb").read()
def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "application/octet-stream"),
                              ("Content-Length", str(len(BODY)))])
    return [BODY]
"#;

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn gunicorn_gthread_workers_upgrade() {
    gunicorn_workers(Rings::Rdma);
}

/// The same over shared memory, on 127.0.0.1: every host.
#[test]
fn gunicorn_gthread_workers_upgrade_over_shm() {
    gunicorn_workers(Rings::Shm);
}

fn gunicorn_workers(rings: Rings) {
    let ip = rings.ip();
    let Some(gunicorn) = require("gunicorn") else {
        return;
    };
    let s = Scratch::new("up-gunicorn");
    let (_www, want) = www(&s);
    std::fs::write(s.dir.join("app.py"), APP_PY).unwrap();
    let port = free_port_on(&ip);
    let device = rings.device();
    let mut cmd = shimmed(&gunicorn, &s, "gunicorn");
    cmd.args([
        "--workers",
        "3",
        "--worker-class",
        "gthread",
        "--threads",
        "2",
    ])
    .args(["--keep-alive", "30", "--graceful-timeout", "10", "--bind"])
    .arg(format!("{ip}:{port}"))
    .arg("--chdir")
    .arg(&s.dir)
    .arg("app:app");
    let cst = serve_and_fetch(&s, cmd, "gunicorn", "TERM", (&ip, port), &want);
    check_workers("gunicorn", &s.stats("gunicorn"), &cst, rings);
    if let Some(d) = device {
        d.delta().assert_carried(cst.ring_bytes());
    }
}
