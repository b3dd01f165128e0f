//! A `-D_FORTIFY_SOURCE=2` program: reads with a known buffer size go through glibc's `_chk`
//! entry points (`__read_chk`, `__recv_chk`, `__recvfrom_chk`, `__poll_chk`), which a preload
//! that only defines `read`/`recv`/`poll` never sees. The shim must see them and count bytes.
//!
//! Same-host upgrades are off for every process here (`RDMASHIM_LOCAL=0`): this checks the
//! shim's TCP path — every hook the program needs fires and every byte is counted — which
//! must hold for any connection that stays TCP. (Over shared memory: tests/upgrade_*.rs and
//! tests/same_host.rs.)

use rdmashim_compat_tests::*;
use std::process::Command;

const PROG: &str = r#"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int main(int argc, char **argv) {
    size_t n = (size_t)atoi(argv[1]); /* not a compile-time constant: forces the _chk variants */
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    if (bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 1) || getsockname(l, (struct sockaddr *)&a, &al)) return 1;
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (struct sockaddr *)&a, sizeof a)) return 2;
    int s = accept(l, NULL, NULL);
    char msg[300];
    memset(msg, 'z', sizeof msg);
    if (write(c, msg, sizeof msg) != (ssize_t)sizeof msg) return 3;
    struct pollfd p[1] = {{.fd = s, .events = POLLIN}};
    nfds_t np = (nfds_t)(n / 100);   /* 1 */
    if (poll(p, np, 5000) != 1) return 4;
    char buf[100];
    size_t got = 0;
    got += (size_t)read(s, buf, n);
    got += (size_t)recv(s, buf, n, 0);
    got += (size_t)recvfrom(s, buf, n, 0, NULL, NULL);
    printf("%zu\n", got);
    close(c); close(s); close(l);
    return 0;
}
"#;

#[test]
fn fortified_reads_are_seen() {
    let Some(cc) = require("cc") else { return };
    let s = Scratch::new("fortify");
    let src = s.dir.join("fortified.c");
    let bin = s.dir.join("fortified");
    std::fs::write(&src, PROG).unwrap();
    let mut c = Command::new(cc);
    c.args(["-O2", "-D_FORTIFY_SOURCE=2", "-o"])
        .arg(&bin)
        .arg(&src);
    run_ok(c, T);
    let imports = imported_hooks(
        &[&bin],
        &["__read_chk", "__recv_chk", "__recvfrom_chk", "__poll_chk"],
    );
    assert_eq!(
        imports,
        ["__poll_chk", "__read_chk", "__recv_chk", "__recvfrom_chk"],
        "compiler did not fortify"
    );

    let mut c = shimmed(&bin, &s, "fortified");
    c.env("RDMASHIM_LOCAL", "0");
    c.arg("100");
    assert_eq!(run_ok(c, T), "300\n");
    let st = s.one_stats("fortified");
    st.assert_fired(&["__read_chk", "__recv_chk", "__recvfrom_chk", "__poll_chk"]);
    assert_eq!(st.calls("read"), 0);
    assert_eq!(st.calls("recv"), 0);
    assert_eq!(
        st.bytes("tcp_rx"),
        300,
        "bytes read through the _chk entry points are counted"
    );
    assert_eq!(st.bytes("tcp_tx"), 300);
    assert_eq!(st.connections(), 2);
    st.assert_all_fallback(&loopback_tcp_reason());
}
