//! The transport seam of the upgrade: a connection's dial, its server's listener and the
//! requests it receives are made over RDMA (rdma_cm: [`Dialer`], [`UpgradeListener`],
//! [`Incoming`]) or, between processes of one host, over shared memory (a Unix rendezvous
//! socket: [`ShmDialer`], [`ShmListener`], [`ShmIncoming`]). Both give the same [`Link`]:
//! the protocol core, the switch at an exact offset, credits and the switch back are one;
//! the caller (the shim's engine) picks the transport per connection and drives either
//! through these enums without telling them apart.
#![forbid(unsafe_code)]

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::time::Instant;

use rdmashim_proto::{ConnectRequest, Proof, RejectReason};

use crate::link::{DialError, DialStatus, Dialer, Incoming, Link, StreamConfig, UpgradeListener};
use crate::rendezvous::{ShmDialer, ShmIncoming, ShmListener};

/// Which carriage a link, dial or listener uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    /// RDMA rings through rdma_cm: a peer on another host (or this one's RDMA address).
    Rdma,
    /// Shared-memory rings: a peer process of this host.
    Shm,
}

impl Transport {
    /// The memory mappings one link of this transport adds to its process (counted as
    /// [`crate::mappings`] counts them): its two rings' views (the receive ring and, over RDMA,
    /// the staging ring; over shared memory, the peer's ring), and over RDMA its queue pair's.
    pub fn mappings_per_link(self) -> usize {
        match self {
            Transport::Rdma => 4 + crate::MAPPINGS_PER_QUEUE_PAIR,
            Transport::Shm => 4,
        }
    }

    /// The transport's name in stats and logs.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Rdma => "rdma",
            Transport::Shm => "shm",
        }
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A client's upgrade dial under way, over either transport.
#[derive(Debug)]
// One per dialling connection, boxed whole by its owner: boxing a variant buys nothing.
#[allow(clippy::large_enum_variant)]
pub enum UpgradeDialer {
    /// Over rdma_cm.
    Rdma(Dialer),
    /// To a process of this host.
    Shm(ShmDialer),
}

impl UpgradeDialer {
    /// The fd to watch: readable when [`Self::poll`] has something to take.
    pub fn fd(&self) -> RawFd {
        match self {
            UpgradeDialer::Rdma(d) => d.fd(),
            UpgradeDialer::Shm(d) => d.fd(),
        }
    }

    /// When the dial times out.
    pub fn deadline(&self) -> Instant {
        match self {
            UpgradeDialer::Rdma(d) => d.deadline(),
            UpgradeDialer::Shm(d) => d.deadline(),
        }
    }

    /// What the dial waits for now, for logs.
    pub fn waiting_for(&self) -> &'static str {
        match self {
            UpgradeDialer::Rdma(d) => d.waiting_for(),
            UpgradeDialer::Shm(_) => "the server's answer",
        }
    }

    /// Whether the dial waits for this host's address or route resolution
    /// ([`Dialer::resolving`]; a shared-memory dial never does).
    pub fn resolving(&self) -> bool {
        match self {
            UpgradeDialer::Rdma(d) => d.resolving(),
            UpgradeDialer::Shm(_) => false,
        }
    }

    /// A later deadline while the dial waits ([`Dialer::wait_longer`],
    /// [`ShmDialer::wait_longer`]). Returns whether it moved.
    pub fn wait_longer(&mut self, until: Instant) -> bool {
        match self {
            UpgradeDialer::Rdma(d) => d.wait_longer(until),
            UpgradeDialer::Shm(d) => d.wait_longer(until),
        }
    }

    /// One step without blocking ([`Dialer::poll_at`], [`ShmDialer::poll_at`]), the deadline
    /// judged at `now`: the instant the caller decided at whether to let the dial wait longer
    /// ([`Self::wait_longer`]). `tcp_received` is used by an RDMA dial when it builds its
    /// request; a shared-memory dial sent its request when it started.
    pub fn poll_at(&mut self, tcp_received: u64, now: Instant) -> DialStatus {
        match self {
            UpgradeDialer::Rdma(d) => d.poll_at(tcp_received, now),
            UpgradeDialer::Shm(d) => d.poll_at(now),
        }
    }

    /// [`Dialer::defer_build`] for an RDMA dial; a shared-memory dial has nothing to defer
    /// (its rings are mapped when it starts, cheaply).
    pub fn defer_build(&mut self) {
        if let UpgradeDialer::Rdma(d) = self {
            d.defer_build();
        }
    }

    /// Whether [`Self::build`] is due ([`Dialer::needs_build`]).
    pub fn needs_build(&self) -> bool {
        matches!(self, UpgradeDialer::Rdma(d) if d.needs_build())
    }

    /// [`Dialer::build`].
    pub fn build(&mut self, tcp_received: u64) -> Result<(), DialError> {
        match self {
            UpgradeDialer::Rdma(d) => d.build(tcp_received),
            UpgradeDialer::Shm(_) => Ok(()),
        }
    }

    /// Its transport.
    pub fn transport(&self) -> Transport {
        match self {
            UpgradeDialer::Rdma(_) => Transport::Rdma,
            UpgradeDialer::Shm(_) => Transport::Shm,
        }
    }
}

/// A server's listener for upgrade requests, over either transport.
#[derive(Debug)]
pub enum RequestListener {
    /// rdma_cm's.
    Rdma(UpgradeListener),
    /// A rendezvous socket of this host.
    Shm(ShmListener),
}

impl RequestListener {
    /// Readable when requests are pending (then call [`Self::next`] until `None`).
    pub fn fd(&self) -> RawFd {
        match self {
            RequestListener::Rdma(l) => l.fd(),
            RequestListener::Shm(l) => l.fd(),
        }
    }

    /// The next decoded request, without blocking (undecodable ones are rejected with their
    /// reason and skipped).
    pub fn next(&self) -> io::Result<Option<Request>> {
        Ok(match self {
            RequestListener::Rdma(l) => l.next()?.map(Request::Rdma),
            RequestListener::Shm(l) => l.next()?.map(Request::Shm),
        })
    }

    /// Its transport.
    pub fn transport(&self) -> Transport {
        match self {
            RequestListener::Rdma(_) => Transport::Rdma,
            RequestListener::Shm(_) => Transport::Shm,
        }
    }
}

/// A decoded upgrade request not answered yet (dropping it rejects it, `Resources`).
#[derive(Debug)]
pub enum Request {
    /// Over rdma_cm.
    Rdma(Incoming),
    /// From a process of this host.
    Shm(ShmIncoming),
}

impl Request {
    /// The decoded request (its ports name the TCP connection).
    pub fn request(&self) -> &ConnectRequest {
        match self {
            Request::Rdma(i) => i.request(),
            Request::Shm(i) => i.request(),
        }
    }

    /// Where it came from: over RDMA, the requester's address as rdma_cm reports it (the
    /// port is rdma_cm's); over shared memory, the client's TCP end as it claims it.
    pub fn source(&self) -> Option<SocketAddr> {
        match self {
            Request::Rdma(i) => i.source(),
            Request::Shm(i) => i.source(),
        }
    }

    /// Rejects it with `reason`.
    pub fn reject(self, reason: RejectReason) {
        match self {
            Request::Rdma(i) => i.reject(reason),
            Request::Shm(i) => i.reject(reason),
        }
    }

    /// Accepts it if it proves `proof` ([`Incoming::accept`], [`ShmIncoming::accept`]).
    pub fn accept(self, cfg: &StreamConfig, tcp_received: u64, proof: &Proof) -> io::Result<Link> {
        match self {
            Request::Rdma(i) => i.accept(cfg, tcp_received, proof),
            Request::Shm(i) => i.accept(cfg, tcp_received, proof),
        }
    }

    /// Its transport.
    pub fn transport(&self) -> Transport {
        match self {
            Request::Rdma(_) => Transport::Rdma,
            Request::Shm(_) => Transport::Shm,
        }
    }
}

impl Link {
    /// The link's transport.
    pub fn transport(&self) -> Transport {
        if self.is_local() {
            Transport::Shm
        } else {
            Transport::Rdma
        }
    }
}
