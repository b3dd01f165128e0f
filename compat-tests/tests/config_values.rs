//! The shim's variables are checked: a boolean is read as a boolean in any case, and a value
//! that is not accepted gets exactly one warning naming the variable, the value and what is
//! accepted — the program's own output and exit status stay as they are.

use rdmashim_compat_tests::*;

/// One loopback connection in one Python process (client and server), under the shim with
/// `vars`; returns its stderr and its stats.
fn one_connection(label: &str, vars: &[(&str, &str)]) -> (String, Stats) {
    let s = Scratch::new(label);
    let py = python();
    let mut c = shimmed(&py, &s, label);
    c.args([
        "-c",
        "import socket\n\
         s = socket.create_server(('127.0.0.1', 0))\n\
         c = socket.create_connection(s.getsockname())\n\
         a, _ = s.accept()\n\
         c.sendall(b'x'); print(a.recv(1).decode())",
    ]);
    for (k, v) in vars {
        c.env(k, v);
    }
    let out = run(c, T);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "x\n");
    (
        String::from_utf8_lossy(&out.stderr).into_owned(),
        s.one_stats(label),
    )
}

#[test]
fn false_in_capitals_does_not_disable() {
    let (err, st) = one_connection("cfg-false", &[("RDMASHIM_DISABLE", "FALSE")]);
    assert_eq!(err, "", "no warning for a boolean");
    assert_eq!(st.connections(), 2);
    assert_eq!(st.reason("disabled"), 0, "{}", st.summary());
    let (_, st) = one_connection("cfg-true", &[("RDMASHIM_DISABLE", "Yes")]);
    assert_eq!(st.reason("disabled"), 2, "{}", st.summary());
}

#[test]
fn a_bad_value_gets_one_warning_that_names_it() {
    let (err, st) = one_connection(
        "cfg-bad",
        &[
            ("RDMASHIM_RING_KIB", "banana"),
            ("RDMASHIM_SPIN_US", "-5"),
            ("RDMASHIM_DISABLE", "perhaps"),
        ],
    );
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 3, "one line per bad variable: {err}");
    for (line, want) in lines.iter().zip([
        "RDMASHIM_DISABLE=perhaps: not a boolean (1/0, true/false, yes/no, on/off); upgrades are disabled",
        "RDMASHIM_RING_KIB=banana: not a whole number from 4 to 8192; using the default, 512",
        "RDMASHIM_SPIN_US=-5: not a whole number from 0 to 10000; using the default, 500",
    ]) {
        assert!(line.starts_with("rdmashim[") && line.ends_with(want), "{line}");
    }
    assert_eq!(st.reason("disabled"), 2, "{}", st.summary());
}
