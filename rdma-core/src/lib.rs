//! rdmashim's transport: RC queue pairs set up through rdma_cm, whose private_data carries a
//! versioned handshake, and ring-buffer byte streams over RDMA WRITE.
//!
//! Layers, bottom up:
//! - [`sys`]: run-time binding to libibverbs/librdmacm (`dlopen` on first use; a host without
//!   rdma-core gets an error, never a failed start).
//! - [`verbs`]: owners of device contexts, PDs, completion channels, CQs, memory regions.
//! - [`cm`]: rdma_cm event channels and ids, RC QPs, and the work requests rdmashim posts.
//! - [`ring`]: the double-mapped ("magic") receive ring, of huge pages where it can be
//!   ([`huge`]: the host's pool).
//! - [`probe`]: what this host can do, in one call.
//! - [`sockaddr`]: the one conversion between C socket addresses and `SocketAddr`.
//! - [`shm`]: the carriage of the same links between two processes of one host: rings and
//!   queues in sealed shared memory, wake-ups by eventfd.
//! - [`rendezvous`]: how two such processes meet and pass those descriptors, over a Unix
//!   socket ([`ShmListener`], [`ShmDialer`]).
//! - `endpoint` (private): one connection's verbs resources and work requests.
//! - [`link`]: one ring connection driven by its owner without blocking ([`Link`]), and its
//!   non-blocking set-up ([`Dialer`], [`UpgradeListener`], [`Incoming`]): what the preload shim
//!   drives from its event loop.
//! - [`transport`]: the seam: a dial, a listener, a request over either transport
//!   ([`UpgradeDialer`], [`RequestListener`], [`Request`]), each giving the same [`Link`].
//! - [`stream`]: the blocking ring-buffer byte stream on top of a link, and the native API
//!   ([`Listener`], [`Stream`], [`barrier`]).
//!
//! The protocol logic (handshake codec, cursors, credits, stream state) is the sans-IO crate
//! `rdmashim-proto`.
// `unsafe` lives only in the modules that speak to C or map memory (sys, verbs, cm, fds, ring,
// shm, rendezvous, sockaddr), each of which allows it for itself; the others cannot use it.
#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod cm;
mod endpoint;
pub mod error;
pub mod fds;
pub mod huge;
pub mod link;
pub mod pool;
pub mod probe;
mod pull;
pub mod rendezvous;
pub mod ring;
pub mod shm;
pub mod sockaddr;
pub mod stream;
pub mod sys;
pub mod tick;
#[cfg(feature = "timeline")]
pub mod timeline;
pub mod transport;
pub mod verbs;

pub use cm::inherited_state;
pub use error::{Error, Result, Unavailable};
pub use link::{DialError, DialStatus, Dialer, Incoming, Link, StreamConfig, UpgradeListener};
pub use rendezvous::{ShmDialer, ShmIncoming, ShmListener};
pub use stream::{barrier, Handle, Listener, LocalListener, RecvHandle, SendHandle, Stream};
pub use transport::{Request, RequestListener, Transport, UpgradeDialer};
pub use verbs::{registered_bytes, set_pinned_limit};

/// The memory mappings a queue pair adds to its process, at most, beside its rings': its
/// queues and completion queue as the provider maps them into the process (soft-RoCE maps
/// each; measured there: 9.3 mappings per upgraded connection in all, 4 of them its two
/// rings' views).
pub const MAPPINGS_PER_QUEUE_PAIR: usize = 6;

/// The memory mappings the transport holds in this process, as far as it counts them: two per
/// double-mapped ring ([`ring::rings`], both transports'), [`MAPPINGS_PER_QUEUE_PAIR`] per
/// queue pair ([`cm::queue_pairs`]), and the two a dial to a process of this host will map
/// when answered (its peer's ring: [`rendezvous::dials`]). The kernel bounds a process's mappings
/// (`vm.max_map_count`, 65,530 by default) and the application's count against the same
/// bound: its `mmap` (a thread's stack, malloc's arena) fails with ENOMEM past it.
pub fn mappings() -> usize {
    2 * (ring::rings() + rendezvous::dials()) + MAPPINGS_PER_QUEUE_PAIR * cm::queue_pairs()
}
