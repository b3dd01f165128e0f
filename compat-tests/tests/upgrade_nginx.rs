//! RDMA tier: nginx as a prefork server. Its master makes the listening socket, forks two
//! workers (which drop root for `nobody`) and accepts nothing; the workers accept on the
//! inherited socket, from one epoll loop each, and send the files with `sendfile`. Each
//! worker serves its connections on an rdma_cm listener of its own, whose port its token
//! names (docs/upgrade.md §4), with queue pairs on a device context of its own (§7: the
//! master's, inherited, is refused to the workers by the kernel).
//!
//! A Python client under the shim keeps three connections alive at once, each fetching a
//! 256 KiB file twenty times, 100 ms apart, every body checked. Every connection is upgraded
//! in whichever worker took it, the later responses go through the rings (and the device's
//! packet counters), and the master's record shows no connection. Before the workers had
//! listeners and device contexts of their own, their connections stayed on TCP
//! (`inherited_listener`; a worker's queue pair on the master's context was reset at its
//! first post).

use rdmashim_compat_tests::*;
use std::time::Duration;

const FILE: usize = 256 << 10;
const CONNS: usize = 3;
const GETS: usize = 20;

/// `client.py IP PORT PATH SHA256 CONNS GETS`: CONNS threads, each one keep-alive connection
/// making GETS requests 100 ms apart; exits 1 on any error or a body that does not match.
const CLIENT_PY: &str = r#"
import hashlib, http.client, sys, threading, time
ip, port, path, want, conns, gets = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
errors = []
def one(i):
    try:
        c = http.client.HTTPConnection(ip, port, timeout=60)
        for g in range(gets):
            c.request("GET", path)
            r = c.getresponse()
            body = r.read()
            if r.status != 200 or hashlib.sha256(body).hexdigest() != want:
                errors.append(f"connection {i} get {g}: status {r.status}, {len(body)} bytes")
                return
            time.sleep(0.1)
        c.close()
    except Exception as e:
        errors.append(f"connection {i}: {e!r}")
ts = [threading.Thread(target=one, args=(i,)) for i in range(conns)]
for t in ts: t.start()
for t in ts: t.join()
for e in errors: print(e, file=sys.stderr)
sys.exit(1 if errors else 0)
"#;

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn nginx_prefork_workers_upgrade() {
    let ip = test_ip();
    let dev = test_device();
    let Some(nginx) = require("/usr/sbin/nginx") else {
        return;
    };
    let py = python();
    let s = Scratch::new("up-nginx");
    // The workers run as `nobody`: they write their records into the scratch dir (sticky,
    // as /tmp is: the shim writes into no directory others may rename files in).
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&s.dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let www = s.dir.join("www");
    std::fs::create_dir(&www).unwrap();
    std::fs::set_permissions(&www, std::fs::Permissions::from_mode(0o755)).unwrap();
    let file = random_bytes(FILE, 23);
    std::fs::write(www.join("f.bin"), &file).unwrap();
    let want = sha256_hex(&file);
    let client = s.dir.join("client.py");
    std::fs::write(&client, CLIENT_PY).unwrap();

    let port = free_port_on(&ip);
    let d = s.dir.display();
    let conf = s.dir.join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "worker_processes 2;\ndaemon off;\nmaster_process on;\npid {d}/nginx.pid;\n\
             error_log {d}/error.log info;\nevents {{ worker_connections 64; }}\n\
             http {{\n  access_log off;\n  sendfile on;\n  keepalive_timeout 60;\n  \
             keepalive_requests 1000;\n  client_body_temp_path {d}/body;\n  \
             proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fcgi;\n  \
             uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n  \
             server {{ listen {ip}:{port}; root {}; }}\n}}\n",
            www.display()
        ),
    )
    .unwrap();
    let device = DeviceCounters::read(&dev);
    let mut cmd = shimmed(&nginx, &s, "nginx");
    cmd.arg("-c")
        .arg(&conf)
        .arg("-p")
        .arg(&s.dir)
        .arg("-e")
        .arg(s.dir.join("error.log"));
    let mut server = Server::start(cmd, "nginx", "QUIT");
    wait_listening(port, &mut server, Duration::from_secs(30));

    let mut c = shimmed(&py, &s, "client");
    c.arg(&client).args([
        ip.as_str(),
        &port.to_string(),
        "/f.bin",
        &want,
        &CONNS.to_string(),
        &GETS.to_string(),
    ]);
    run_ok(c, Duration::from_secs(120));
    assert!(server.stop().expect("nginx status").success(), "nginx");

    let cst = s.one_stats("client");
    eprintln!("client: {}", cst.summary());
    assert_eq!(cst.connections(), CONNS as u64, "{}", cst.summary());
    cst.assert_all_upgraded();
    let all = s.stats("nginx");
    for st in &all {
        eprintln!("nginx: {}", st.summary());
    }
    // The master and its two workers each wrote a record; only workers accepted.
    assert_eq!(all.len(), 3, "nginx records: {all:#?}");
    let (workers, idle): (Vec<&Stats>, Vec<&Stats>) =
        all.iter().partition(|st| st.connections() > 0);
    assert!(
        idle.len() <= 2 && !workers.is_empty(),
        "no worker accepted: {all:#?}"
    );
    let accepted: u64 = workers.iter().map(|st| st.connections()).sum();
    assert_eq!(
        accepted, CONNS as u64,
        "connections accepted by the workers"
    );
    for w in &workers {
        w.assert_all_upgraded();
    }
    // Most responses came after the switch (it takes a fraction of the first 100 ms pause).
    let ring_tx: u64 = workers.iter().map(|st| st.bytes("ring_tx")).sum();
    assert!(
        ring_tx >= (CONNS * GETS / 2 * FILE) as u64,
        "the workers sent {ring_tx} bytes through the rings"
    );
    assert!(cst.bytes("ring_rx") >= ring_tx, "{}", cst.summary());
    device.delta().assert_carried(cst.ring_bytes());
}
