//! Why a TCP connection was not upgraded: a closed set of reasons with stable snake_case names.
//!
//! This file is also compiled into the `rdmashim` launcher (`#[path]` module), so it is plain
//! safe Rust with no dependencies.
#![forbid(unsafe_code)]

macro_rules! reasons {
    ($($variant:ident = $name:literal : $doc:literal),* $(,)?) => {
        /// Why a TCP connection stayed on TCP. Names are part of the stats schema: never renamed,
        /// never removed; new reasons are appended.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum FallbackReason { $(#[doc = $doc] $variant),* }

        impl FallbackReason {
            /// Every reason, in stats order.
            pub const ALL: &'static [FallbackReason] = &[$(FallbackReason::$variant),*];
            /// Number of reasons.
            pub const COUNT: usize = Self::ALL.len();

            /// The stable snake_case name used in the stats JSON and the logs.
            pub const fn name(self) -> &'static str {
                match self { $(FallbackReason::$variant => $name),* }
            }

            /// One-line human explanation.
            pub const fn describe(self) -> &'static str {
                match self { $(FallbackReason::$variant => $doc),* }
            }

            /// Inverse of [`name`](Self::name).
            pub fn from_name(s: &str) -> Option<Self> {
                Self::ALL.iter().copied().find(|r| r.name() == s)
            }

            /// Inverse of `as u8`.
            pub fn from_index(i: u8) -> Option<Self> {
                Self::ALL.get(usize::from(i)).copied()
            }
        }
    };
}

reasons! {
    NoDevice = "no_device": "no RDMA device in /sys/class/infiniband",
    LibrariesMissing = "libraries_missing": "libibverbs.so.1 or librdmacm.so.1 cannot be loaded",
    Disabled = "disabled": "RDMASHIM_DISABLE=1 is set",
    Memlock = "memlock": "RLIMIT_MEMLOCK too low to register the rings",
    PeerRejected = "peer_rejected": "the peer host rejected the RDMA connection request (no shim listening there)",
    PeerUnreachable = "peer_unreachable": "the peer is not reachable over RDMA (no route, or no answer)",
    UnsupportedSocket = "unsupported_socket": "the socket type or protocol cannot be upgraded",
    UnsupportedOption = "unsupported_option": "the application set a socket option the upgrade cannot honour",
    NotUpgradableAddress = "not_upgradable_address": "the peer address cannot be reached over RDMA (loopback)",
    UpgradeTimeout = "upgrade_timeout": "the upgrade handshake did not finish within its deadline",
    Resources = "resources": "out of RDMA resources (queue pairs, memory registrations, ring memory), or the process's rings would pin more than RDMASHIM_PINNED_MIB or take more than half of its memory mappings (vm.max_map_count)",
    ProtocolError = "protocol_error": "the peer sent a malformed or unsupported handshake",
    NegativeCache = "negative_cache": "a recent attempt to this peer failed; not retried yet",
    TransportUnavailable = "transport_unavailable": "the connection could not be handed to the upgrade engine",
    NoUpgradeRequest = "no_upgrade_request": "server side: the client marked its SYN and got the token, but no RDMA connect request came for the accepted connection (the client closed it first, or its dial failed or was given up: no RDMA libraries or route there)",
    ClosedEarly = "closed_early": "the application closed the connection before its upgrade completed",
    Forked = "forked": "the process forked while the connection's upgrade was undecided; it stays TCP, so that whichever process goes on with the socket (parent or child) uses it as TCP",
    InheritedListener = "inherited_listener": "server side: accepted on a listening socket whose RDMA side belongs to another process (made before a fork: a prefork server's workers), and no RDMA listener of this process's own could be bound to serve it",
    PlainPeer = "plain_peer": "the other end runs no shim, or will not upgrade this connection (server: the client's SYN carried no rdmashim mark; client: the server's first bytes carried no rdmashim token)",
    UnprovenPeer = "unproven_peer": "client side: the RDMA peer that answered could not prove it holds the TCP connection's other end (its reply's tag did not verify: another process on the server's host holds the port's rdma_cm side)",
    Exec = "exec": "the process replaced its image (exec, or spawned a child that inherits the socket) while the connection's upgrade was undecided; it stays TCP, which the new image can use",
    HandedToChild = "handed_to_child": "server side: the process forked after accepting the connection and the fork child that serves it took its upgrade over (the client's request was redirected to the child's rdma_cm listener; the child's own record counts the upgrade); this process's copy stays TCP",
    CredentialsChanged = "credentials_changed": "the process changed its credentials (setuid, setgid, setgroups and their kin) after it had used RDMA: the kernel refuses RDMA commands on descriptors opened under other credentials, so its connections went back to TCP (those on the ring switched back at exact offsets) and new ones stay TCP; its fork children may upgrade again",
    InternalError = "internal_error": "the shim failed (a panic in a hook or one of its threads): the connection, not yet plain TCP, was reset rather than left to a stream that could hang or lose bytes; everything else passes through from then on",
    Sandboxed = "sandboxed": "the process installed a seccomp filter (a sandbox, as sshd's pre-authentication child does): the shim cannot know which system calls the filter allows, and one it refuses may kill the process, so RDMA ended before the filter (connections on the ring went back to TCP at exact offsets), new connections stay TCP, and the shim writes no log record or stats file from then on",
    FdReplaced = "fd_replaced": "the program put a file of its own (dup2, dup3) at the number of one of the shim's descriptors, which lie at 1000 and above and which it cannot know about: RDMA ended before the call (connections on the ring went back to TCP at exact offsets), new connections stay TCP, and the shim never uses a descriptor of its own again",
    Stdio = "stdio": "the connection was at a standard descriptor (0, 1 or 2), or was put there (dup2 onto it: bash's `printf ... >&3`, a server that serves a connection on its stdin and stdout in the same image): glibc's stdio (printf, fwrite, fgets on stdin/stdout/stderr) reads and writes those with internal calls no hook sees, so the connection stays TCP (one on the ring went back to TCP at exact offsets first)",
    IoUring = "io_uring": "the process set up an io_uring instance, whose reads, writes and closes reach the kernel without any call the shim can see: a connection on the ring would lose its place in the stream, so RDMA ended before the instance existed (connections on the ring went back to TCP at exact offsets) and new connections stay TCP, in its fork children too",
    Policy = "policy": "the configuration file's rules (rdmashim.conf(5)) keep this connection on TCP: a deny rule for its program (then every connection of the process), its peer's address or its port matched first",
    FdLimit = "fd_limit": "the process is near its descriptor limit (RLIMIT_NOFILE): an upgrade would take descriptors of the shim's own, and the application's last ones must stay the application's",
    PeerVersion = "peer_version": "the peer's shim speaks another version of the upgrade protocol, which this one does not (its token, taken out of the stream whole, or its rejection of the request said so): the connection stays on TCP",
    FdPassed = "fd_passed": "the program passed the connection's descriptor to another process over a unix socket (SCM_RIGHTS: a connection-handoff daemon, a hot restart) while its upgrade was undecided: it stays TCP, which the receiver can use (one on the ring went back to TCP at exact offsets before the message left)",
}

/// The host probe's decision procedure (probe.rs), with the checks passed in (tested without a
/// host; `rdmashim doctor` runs it on its own checks): `disabled` first, then `no_device`.
pub fn host_reason_from(
    disabled: bool,
    has_device: impl FnOnce() -> bool,
) -> Option<FallbackReason> {
    if disabled {
        Some(FallbackReason::Disabled)
    } else if !has_device() {
        Some(FallbackReason::NoDevice)
    } else {
        None
    }
}

/// Which kind of address a connection's peer has, as far as upgrading is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerClass {
    /// 127.0.0.0/8, ::1, ::ffff:127.0.0.0/104: never reachable over RDMA.
    Loopback,
    /// Anything else (or unknown).
    Other,
}

/// The reason a connection stays on TCP, given the host-wide reason (if any) and its peer.
/// Host-wide reasons come first: they explain every connection of the process at once.
pub fn decide(host: Option<FallbackReason>, peer: PeerClass) -> FallbackReason {
    match (host, peer) {
        (Some(r), _) => r,
        (None, PeerClass::Loopback) => FallbackReason::NotUpgradableAddress,
        (None, PeerClass::Other) => FallbackReason::TransportUnavailable,
    }
}

/// Classifies an IPv4 address (network byte order octets).
pub fn classify_v4(octets: [u8; 4]) -> PeerClass {
    if octets[0] == 127 {
        PeerClass::Loopback
    } else {
        PeerClass::Other
    }
}

/// Classifies an IPv6 address (16 octets), including v4-mapped addresses.
pub fn classify_v6(o: [u8; 16]) -> PeerClass {
    let loopback = [0u8; 15]
        .iter()
        .chain([1u8].iter())
        .copied()
        .eq(o.iter().copied());
    let mapped = o[..10].iter().all(|b| *b == 0) && o[10] == 0xff && o[11] == 0xff;
    if loopback || (mapped && o[12] == 127) {
        PeerClass::Loopback
    } else {
        PeerClass::Other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_stable_and_unique() {
        let names: Vec<_> = FallbackReason::ALL.iter().map(|r| r.name()).collect();
        let mut d = names.clone();
        d.sort();
        d.dedup();
        assert_eq!(d.len(), names.len());
        for (i, r) in FallbackReason::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i);
            assert_eq!(FallbackReason::from_name(r.name()), Some(*r));
            assert_eq!(FallbackReason::from_index(i as u8), Some(*r));
            assert!(r
                .name()
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b == b'_'));
        }
        // The names the schema promises.
        for n in [
            "no_device",
            "libraries_missing",
            "disabled",
            "memlock",
            "peer_rejected",
            "peer_unreachable",
            "unsupported_socket",
            "unsupported_option",
            "not_upgradable_address",
            "upgrade_timeout",
            "resources",
            "protocol_error",
        ] {
            assert!(FallbackReason::from_name(n).is_some(), "{n}");
        }
    }

    #[test]
    fn host_probe_order() {
        assert_eq!(
            host_reason_from(true, || panic!()),
            Some(FallbackReason::Disabled)
        );
        assert_eq!(
            host_reason_from(false, || false),
            Some(FallbackReason::NoDevice)
        );
        assert_eq!(host_reason_from(false, || true), None);
    }

    #[test]
    fn decisions() {
        use FallbackReason::*;
        assert_eq!(decide(Some(NoDevice), PeerClass::Loopback), NoDevice);
        assert_eq!(decide(None, PeerClass::Loopback), NotUpgradableAddress);
        assert_eq!(decide(None, PeerClass::Other), TransportUnavailable);
        assert_eq!(classify_v4([127, 0, 0, 1]), PeerClass::Loopback);
        assert_eq!(classify_v4([10, 0, 0, 1]), PeerClass::Other);
        let mut v6 = [0u8; 16];
        v6[15] = 1;
        assert_eq!(classify_v6(v6), PeerClass::Loopback);
        let mut m = [0u8; 16];
        m[10] = 0xff;
        m[11] = 0xff;
        m[12] = 127;
        m[15] = 1;
        assert_eq!(classify_v6(m), PeerClass::Loopback);
        m[12] = 10;
        assert_eq!(classify_v6(m), PeerClass::Other);
    }
}
