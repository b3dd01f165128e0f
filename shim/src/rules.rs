//! The policy's rules: which programs and connections may move off TCP.
//!
//! A rule is one line of the configuration file (settings.rs reads the file):
//!
//! ```text
//! deny program = sshd            # the program's name (or, with a '/', its path): a glob
//! allow peer = 10.0.0.0/8        # the peer's address: IPv4 or IPv6, with or without /PREFIX
//! deny port = 5432               # the service (server's) port: a client's remote, a server's local
//! deny local_port = 1-1023       # this end's port; remote_port: the other end's
//! ```
//!
//! The first rule that matches decides; when none does, the connection may upgrade (the
//! default is allow). Program rules are decided once, when the library loads
//! ([`resolve`]): a program rule that does not match is dropped, one that matches ends the
//! list there. What is left is a short list of connection rules and the verdict after them
//! ([`Resolved`]); a program denied before any connection rule is denied as a whole
//! ([`Resolved::process_denied`]). Matching a connection ([`Resolved::decide`]) walks that
//! list: no allocation, no system call.
//!
//! This file is also compiled into the `rdmashim` launcher (`#[path]` module), so that
//! `rdmashim doctor` shows and judges the rules by the library's own code: it is plain safe
//! Rust with no dependencies.
#![forbid(unsafe_code)]

use std::net::IpAddr;

/// What a rule does when it matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Allow,
    Deny,
}

impl Action {
    pub fn parse(word: &[u8]) -> Option<Action> {
        match word {
            b"allow" => Some(Action::Allow),
            b"deny" => Some(Action::Deny),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Action::Allow => "allow",
            Action::Deny => "deny",
        }
    }
}

/// An inclusive range of ports (one port: `lo == hi`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ports {
    pub lo: u16,
    pub hi: u16,
}

impl Ports {
    /// `N` or `N-M` (0 ≤ N ≤ M ≤ 65535).
    pub fn parse(v: &[u8]) -> Option<Ports> {
        let num = |s: &[u8]| -> Option<u16> {
            let s = trim(s);
            if s.is_empty() || s.len() > 5 || !s.iter().all(u8::is_ascii_digit) {
                return None;
            }
            let n = s.iter().fold(0u32, |n, d| n * 10 + u32::from(d - b'0'));
            u16::try_from(n).ok()
        };
        let (lo, hi) = match v.iter().position(|b| *b == b'-') {
            Some(i) => (num(&v[..i])?, num(&v[i + 1..])?),
            None => {
                let p = num(v)?;
                (p, p)
            }
        };
        (lo <= hi).then_some(Ports { lo, hi })
    }

    #[inline]
    pub fn contains(self, p: u16) -> bool {
        self.lo <= p && p <= self.hi
    }
}

impl std::fmt::Display for Ports {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.lo == self.hi {
            write!(f, "{}", self.lo)
        } else {
            write!(f, "{}-{}", self.lo, self.hi)
        }
    }
}

/// An address prefix, IPv4 or IPv6. Bits past the prefix are ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    pub addr: IpAddr,
    pub len: u8,
}

impl Cidr {
    /// `ADDRESS` or `ADDRESS/PREFIX` (IPv4 prefix 0–32, IPv6 0–128; no zone, no brackets).
    pub fn parse(v: &[u8]) -> Option<Cidr> {
        let s = std::str::from_utf8(v).ok()?;
        let (a, len) = match s.split_once('/') {
            Some((a, l)) => {
                if l.is_empty() || l.len() > 3 || !l.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                (a, Some(l.parse::<u8>().ok()?))
            }
            None => (s, None),
        };
        let addr: IpAddr = a.parse().ok()?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = len.unwrap_or(max);
        (len <= max).then_some(Cidr { addr, len })
    }

    /// Whether `ip` lies in the prefix. A v4-mapped IPv6 address (`::ffff:a.b.c.d`) is the
    /// IPv4 address it maps, as the kernel's connections of an IPv6 socket to IPv4 peers are.
    #[inline]
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, canonical(ip)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => prefix_eq(
                u128::from(u32::from(net)) << 96,
                u128::from(u32::from(ip)) << 96,
                self.len,
            ),
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                prefix_eq(u128::from(net), u128::from(ip), self.len)
            }
            _ => false,
        }
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

/// Whether the first `len` bits (of 128) of `a` and `b` are equal.
#[inline]
fn prefix_eq(a: u128, b: u128, len: u8) -> bool {
    let mask = match len {
        0 => 0,
        l if l >= 128 => u128::MAX,
        l => u128::MAX << (128 - u32::from(l)),
    };
    (a ^ b) & mask == 0
}

/// A v4-mapped IPv6 address as its IPv4 address; anything else as it is.
#[inline]
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// What a rule looks at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selector {
    /// The program: a glob (`*`, `?`) on its name, or, with a `/`, on its path.
    Program(Vec<u8>),
    /// The peer's address.
    Peer(Cidr),
    /// The service port: the server's (a client's remote port, a server's local port).
    Port(Ports),
    /// This end's port (a client's, only if it bound one before `connect`).
    LocalPort(Ports),
    /// The other end's port.
    RemotePort(Ports),
}

/// The selectors' keys, and what each accepts (for the warnings and the documentation).
pub const SELECTORS: [(&str, &str); 5] = [
    ("program", "a program name or path, * and ? as wildcards"),
    (
        "peer",
        "an IPv4 or IPv6 address, optionally /PREFIX (0-32, 0-128)",
    ),
    ("port", "a port or a range, N or N-M (0-65535)"),
    ("local_port", "a port or a range, N or N-M (0-65535)"),
    ("remote_port", "a port or a range, N or N-M (0-65535)"),
];

impl Selector {
    /// The selector `key = value`: `Ok`, or `Err` with what the key accepts (`None`: not a
    /// selector's key).
    pub fn parse(key: &[u8], value: &[u8]) -> Result<Selector, Option<&'static str>> {
        let accepted = SELECTORS
            .iter()
            .find(|(k, _)| k.as_bytes() == key)
            .map(|(_, a)| *a)
            .ok_or(None)?;
        let parsed = match key {
            b"program" => (!value.is_empty() && !value.contains(&0))
                .then(|| Selector::Program(value.to_vec())),
            b"peer" => Cidr::parse(value).map(Selector::Peer),
            b"port" => Ports::parse(value).map(Selector::Port),
            b"local_port" => Ports::parse(value).map(Selector::LocalPort),
            b"remote_port" => Ports::parse(value).map(Selector::RemotePort),
            _ => None,
        };
        parsed.ok_or(Some(accepted))
    }

    pub fn key(&self) -> &'static str {
        match self {
            Selector::Program(_) => "program",
            Selector::Peer(_) => "peer",
            Selector::Port(_) => "port",
            Selector::LocalPort(_) => "local_port",
            Selector::RemotePort(_) => "remote_port",
        }
    }
}

impl std::fmt::Display for Selector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Selector::Program(g) => write!(f, "program = {}", String::from_utf8_lossy(g)),
            Selector::Peer(c) => write!(f, "peer = {c}"),
            Selector::Port(p) | Selector::LocalPort(p) | Selector::RemotePort(p) => {
                write!(f, "{} = {p}", self.key())
            }
        }
    }
}

/// One rule, and the line of the file it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub action: Action,
    pub selector: Selector,
    pub line: u32,
}

impl std::fmt::Display for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.action.name(), self.selector)
    }
}

/// A connection as the rules see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conn {
    pub peer: IpAddr,
    /// This end's port (0: not known, a client that did not bind one).
    pub local_port: u16,
    pub remote_port: u16,
    /// This end accepted it (a server); else it connected (a client).
    pub server: bool,
}

impl Conn {
    #[inline]
    fn service_port(&self) -> u16 {
        if self.server {
            self.local_port
        } else {
            self.remote_port
        }
    }
}

/// Which rule decided, and how (`line` 0: no rule matched, the default).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub action: Action,
    pub line: u32,
}

impl Verdict {
    pub const DEFAULT: Verdict = Verdict {
        action: Action::Allow,
        line: 0,
    };

    #[inline]
    pub fn allowed(self) -> bool {
        self.action == Action::Allow
    }
}

/// The rules of one program, decided as far as they can be before any connection.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resolved {
    /// The connection rules to walk, in order.
    pub rules: Vec<Rule>,
    /// The program rule that matched after them (its action and line), if one did; else the
    /// default (allow) follows them.
    pub end: Option<Verdict>,
    /// Some rule looks at this end's port (a client asks for it only then).
    pub wants_local_port: bool,
}

/// The rules of the program that `is_program` recognises (given a program rule's glob):
/// the program rules decided, the connection rules before the first one that matches kept.
pub fn resolve(rules: &[Rule], is_program: impl Fn(&[u8]) -> bool) -> Resolved {
    let mut r = Resolved::default();
    for rule in rules {
        match &rule.selector {
            Selector::Program(g) => {
                if is_program(g) {
                    r.end = Some(Verdict {
                        action: rule.action,
                        line: rule.line,
                    });
                    break;
                }
            }
            s => {
                r.wants_local_port |= matches!(s, Selector::LocalPort(_));
                r.rules.push(rule.clone());
            }
        }
    }
    r
}

impl Resolved {
    /// The line of the program rule that denies every connection of this program (no
    /// connection rule comes before it).
    pub fn process_denied(&self) -> Option<u32> {
        match self.end {
            Some(v) if self.rules.is_empty() && !v.allowed() => Some(v.line),
            _ => None,
        }
    }

    /// Whether no rule can deny anything (the walk can be skipped).
    #[inline]
    pub fn allows_all(&self) -> bool {
        self.rules.is_empty() && self.end.is_none_or(Verdict::allowed)
    }

    /// The verdict for connection `c`: the first rule that matches, else the program rule
    /// after them, else allow.
    #[inline]
    pub fn decide(&self, c: &Conn) -> Verdict {
        for r in &self.rules {
            let hit = match &r.selector {
                Selector::Peer(n) => n.contains(c.peer),
                Selector::Port(p) => p.contains(c.service_port()),
                Selector::LocalPort(p) => p.contains(c.local_port),
                Selector::RemotePort(p) => p.contains(c.remote_port),
                Selector::Program(_) => false,
            };
            if hit {
                return Verdict {
                    action: r.action,
                    line: r.line,
                };
            }
        }
        self.end.unwrap_or(Verdict::DEFAULT)
    }
}

/// Whether a program rule's glob matches a program known by its base `name` and its paths
/// (as executed, and the file's real path): a glob with a `/` is matched against the paths,
/// one without against the base names (of the name and of each path).
pub fn program_matches(glob: &[u8], name: &[u8], paths: &[&[u8]]) -> bool {
    let mut paths = paths.iter().filter(|p| !p.is_empty());
    if glob.contains(&b'/') {
        paths.any(|p| glob_match(glob, p))
    } else {
        (!name.is_empty() && glob_match(glob, name))
            || paths.any(|p| glob_match(glob, base_name(p)))
    }
}

/// The part of `path` after its last `/`.
pub fn base_name(path: &[u8]) -> &[u8] {
    path.iter()
        .rposition(|b| *b == b'/')
        .map_or(path, |i| &path[i + 1..])
}

/// Shell-style match of `text` by `glob`: `*` any run of bytes (`/` included), `?` any one
/// byte, anything else itself. Iterative with one backtrack point: linear-ish, no allocation.
pub fn glob_match(glob: &[u8], text: &[u8]) -> bool {
    let (mut g, mut t) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match glob.get(g) {
            Some(b'*') => {
                star = Some((g, t));
                g += 1;
            }
            Some(&c) if c == b'?' || c == text[t] => {
                g += 1;
                t += 1;
            }
            _ => match star {
                Some((sg, st)) => {
                    g = sg + 1;
                    t = st + 1;
                    star = Some((sg, st + 1));
                }
                None => return false,
            },
        }
    }
    glob[g.min(glob.len())..].iter().all(|b| *b == b'*')
}

fn trim(s: &[u8]) -> &[u8] {
    let start = s
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(s.len());
    let end = s
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(start, |i| i + 1);
    &s[start..end.max(start)]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(action: Action, key: &str, value: &str, line: u32) -> Rule {
        Rule {
            action,
            selector: Selector::parse(key.as_bytes(), value.as_bytes()).unwrap(),
            line,
        }
    }

    fn client(peer: &str, remote_port: u16) -> Conn {
        Conn {
            peer: peer.parse().unwrap(),
            local_port: 0,
            remote_port,
            server: false,
        }
    }

    #[test]
    fn ports() {
        assert_eq!(Ports::parse(b"22"), Some(Ports { lo: 22, hi: 22 }));
        assert_eq!(Ports::parse(b"1-1023"), Some(Ports { lo: 1, hi: 1023 }));
        assert_eq!(Ports::parse(b"0-65535"), Some(Ports { lo: 0, hi: 65535 }));
        assert_eq!(Ports::parse(b" 80 - 90 "), Some(Ports { lo: 80, hi: 90 }));
        for bad in [
            "", "-", "65536", "1-", "-5", "10-9", "http", "+1", "0x10", "1-2-3", "999999",
        ] {
            assert_eq!(Ports::parse(bad.as_bytes()), None, "{bad:?}");
        }
        let p = Ports { lo: 80, hi: 90 };
        assert!(p.contains(80) && p.contains(90) && !p.contains(79) && !p.contains(91));
        assert_eq!(p.to_string(), "80-90");
    }

    #[test]
    fn cidr_edges() {
        let c = |s: &str| Cidr::parse(s.as_bytes());
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        // /0 matches every address of its family, none of the other.
        let all4 = c("0.0.0.0/0").unwrap();
        assert!(all4.contains(ip("255.255.255.255")) && all4.contains(ip("0.0.0.0")));
        assert!(!all4.contains(ip("::1")));
        let all6 = c("::/0").unwrap();
        assert!(all6.contains(ip("ffff::1")) && !all6.contains(ip("10.0.0.1")));
        // a host: no prefix is /32 or /128
        assert_eq!(c("192.0.2.7").unwrap().len, 32);
        assert_eq!(c("2001:db8::7").unwrap().len, 128);
        assert!(c("192.0.2.7").unwrap().contains(ip("192.0.2.7")));
        assert!(!c("192.0.2.7/32").unwrap().contains(ip("192.0.2.8")));
        // the boundaries of a prefix
        let n = c("10.1.0.0/16").unwrap();
        assert!(n.contains(ip("10.1.0.0")) && n.contains(ip("10.1.255.255")));
        assert!(!n.contains(ip("10.0.255.255")) && !n.contains(ip("10.2.0.0")));
        let odd = c("192.168.1.128/25").unwrap();
        assert!(odd.contains(ip("192.168.1.255")) && !odd.contains(ip("192.168.1.127")));
        // bits past the prefix are ignored
        assert!(c("10.9.9.9/8").unwrap().contains(ip("10.0.0.1")));
        // IPv6 prefixes, at and off nibble and word boundaries
        let ll = c("fe80::/10").unwrap();
        assert!(ll.contains(ip("fe80::1")) && ll.contains(ip("febf:ffff::1")));
        assert!(!ll.contains(ip("fec0::1")));
        let doc = c("2001:db8::/32").unwrap();
        assert!(doc.contains(ip("2001:db8:ffff::1")) && !doc.contains(ip("2001:db9::1")));
        assert!(c("::1/128").unwrap().contains(ip("::1")));
        assert!(!c("::1/127").unwrap().contains(ip("::2")));
        assert!(c("::/127").unwrap().contains(ip("::1")));
        // a v4-mapped peer is its IPv4 address
        assert!(c("127.0.0.0/8").unwrap().contains(ip("::ffff:127.0.0.1")));
        assert!(!c("::ffff:0:0/96").unwrap().contains(ip("::ffff:10.0.0.1")));
        // what is not a prefix
        for bad in [
            "",
            "10.0.0.0/",
            "10.0.0.0/33",
            "::/129",
            "10.0.0.0/-1",
            "10.0.0.0/+8",
            "10.0.0",
            "10.0.0.256",
            "010.0.0.1",
            "fe80::1%eth0",
            "[::1]",
            "::1/1000",
            "example.com",
            "10.0.0.0/8/8",
            " 10.0.0.1",
        ] {
            assert_eq!(c(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn globs() {
        assert!(glob_match(b"sshd", b"sshd"));
        assert!(!glob_match(b"sshd", b"sshd2"));
        assert!(glob_match(b"redis-*", b"redis-server"));
        assert!(glob_match(b"*", b""));
        assert!(glob_match(b"a*b*c", b"aXbYbZc"));
        assert!(!glob_match(b"a*b*c", b"aXbYbZ"));
        assert!(glob_match(b"py?hon3", b"python3"));
        assert!(!glob_match(b"?", b""));
        assert!(glob_match(b"/usr/sbin/*", b"/usr/sbin/sshd"));
        // a name without a slash is a base name; with one, a path
        assert!(program_matches(b"sshd", b"sshd", &[b"/usr/sbin/sshd"]));
        assert!(program_matches(
            b"python3*",
            b"python3",
            &[b"/usr/bin/python3.11"]
        ));
        assert!(program_matches(
            b"python3.11",
            b"python3",
            &[b"/usr/bin/python3.11"]
        ));
        assert!(program_matches(
            b"/usr/sbin/*",
            b"sshd",
            &[b"/usr/sbin/sshd"]
        ));
        assert!(!program_matches(b"/usr/sbin/*", b"sshd", &[]));
        assert!(!program_matches(b"sbin", b"sshd", &[b"/usr/sbin/sshd"]));
    }

    #[test]
    fn first_match_wins_and_the_default_allows() {
        let rules = vec![
            rule(Action::Allow, "peer", "10.0.0.5", 1),
            rule(Action::Deny, "peer", "10.0.0.0/8", 2),
            rule(Action::Deny, "port", "6379", 3),
            rule(Action::Allow, "remote_port", "6000-6999", 4),
        ];
        let r = resolve(&rules, |_| false);
        assert_eq!(r.end, None);
        assert!(!r.allows_all() && !r.wants_local_port);
        let line = |c: Conn| {
            let v = r.decide(&c);
            (v.allowed(), v.line)
        };
        assert_eq!(line(client("10.0.0.5", 6379)), (true, 1));
        assert_eq!(line(client("10.0.0.6", 80)), (false, 2));
        assert_eq!(line(client("192.0.2.1", 6379)), (false, 3));
        assert_eq!(line(client("192.0.2.1", 6380)), (true, 4));
        assert_eq!(line(client("192.0.2.1", 80)), (true, 0));
        assert_eq!(line(client("::ffff:10.9.9.9", 80)), (false, 2));
        // the service port is a server's local port, not its client's
        let server = |local_port, remote_port| Conn {
            peer: "192.0.2.1".parse().unwrap(),
            local_port,
            remote_port,
            server: true,
        };
        assert_eq!(line(server(6379, 40000)), (false, 3));
        assert_eq!(
            line(server(40000, 6379)),
            (true, 4),
            "its client's port is remote"
        );
        assert_eq!(line(server(40000, 80)), (true, 0));
        assert_eq!(line(server(7000, 6500)), (true, 4));
        // local_port: a client's own port, when known
        let r = resolve(&[rule(Action::Deny, "local_port", "1-1023", 7)], |_| false);
        let mut c = client("192.0.2.1", 80);
        assert!(r.decide(&c).allowed(), "0: not bound, in no range from 1");
        c.local_port = 999;
        assert_eq!(r.decide(&c).line, 7);
        // IPv6 peers
        let r = resolve(&[rule(Action::Deny, "peer", "2001:db8::/32", 1)], |_| false);
        assert!(!r.decide(&client("2001:db8::1", 1)).allowed());
        assert!(r.decide(&client("2001:db9::1", 1)).allowed());
        assert!(r.decide(&client("10.0.0.1", 1)).allowed());
        // no rules at all
        let none = resolve(&[], |_| false);
        assert!(none.allows_all() && !none.wants_local_port);
        assert_eq!(none.decide(&client("10.0.0.1", 1)), Verdict::DEFAULT);
    }

    #[test]
    fn program_rules_are_decided_once() {
        let rules = vec![
            rule(Action::Deny, "program", "sshd", 1),
            rule(Action::Deny, "port", "22", 2),
            rule(Action::Allow, "program", "redis-*", 3),
            rule(Action::Deny, "peer", "0.0.0.0/0", 4),
        ];
        // sshd: denied as a whole, before any connection rule
        let sshd = resolve(&rules, |g| program_matches(g, b"sshd", &[]));
        assert_eq!(sshd.process_denied(), Some(1));
        // redis-server: port 22 denied, then everything allowed (the rule after is never reached)
        let redis = resolve(&rules, |g| program_matches(g, b"redis-server", &[]));
        assert_eq!(redis.process_denied(), None);
        assert_eq!(redis.rules.len(), 1);
        assert!(!redis.decide(&client("10.0.0.1", 22)).allowed());
        assert_eq!(redis.decide(&client("10.0.0.1", 6379)).line, 3);
        // anything else: port 22 and every IPv4 peer denied, IPv6 allowed by default
        let other = resolve(&rules, |g| program_matches(g, b"curl", &[]));
        assert_eq!(other.process_denied(), None);
        assert_eq!(other.decide(&client("10.0.0.1", 80)).line, 4);
        assert!(other.decide(&client("2001:db8::1", 80)).allowed());
        // a deny program after a connection rule: that rule still lets some through
        let later = resolve(
            &[
                rule(Action::Allow, "peer", "10.0.0.0/8", 1),
                rule(Action::Deny, "program", "*", 2),
            ],
            |g| program_matches(g, b"x", &[]),
        );
        assert_eq!(later.process_denied(), None);
        assert!(later.decide(&client("10.1.1.1", 1)).allowed());
        assert_eq!(later.decide(&client("192.0.2.1", 1)).line, 2);
        // an allowing program rule first: nothing to walk
        let allowed = resolve(&rules[2..], |_| true);
        assert!(allowed.allows_all());
    }
}
