//! Every verbs or rdma_cm failure becomes an [`Error`] that names the call that failed.

use std::fmt;
use std::io;

use crate::sys::LoadError;

/// Why this host cannot do RDMA at all (as opposed to one call failing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unavailable {
    /// libibverbs or librdmacm could not be loaded (or lacks a symbol).
    LibrariesMissing(LoadError),
    /// The libraries loaded but list no RDMA device.
    NoDevice,
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::LibrariesMissing(e) => write!(f, "RDMA libraries missing: {e}"),
            Self::NoDevice => f.write_str("no RDMA device"),
        }
    }
}

/// An error from the RDMA layer.
#[derive(Debug)]
pub enum Error {
    /// RDMA is not possible on this host.
    Unavailable(Unavailable),
    /// A verbs or rdma_cm call failed.
    Call {
        /// The C function, e.g. `"rdma_resolve_addr"`.
        call: &'static str,
        /// The errno it left (or returned).
        source: io::Error,
    },
    /// rdma_cm delivered an event other than the one the operation waits for.
    UnexpectedEvent {
        /// What the operation was waiting for.
        expected: &'static str,
        /// What came (`rdma_event_str`), e.g. `"RDMA_CM_EVENT_REJECTED"`.
        got: String,
        /// The event's status field (negative errno or a reject reason).
        status: i32,
        /// private_data that came with the event (a reject's reason, for instance).
        private_data: Vec<u8>,
    },
    /// A work completion finished with an error status.
    Completion {
        /// The operation the completion belonged to.
        op: &'static str,
        /// `ibv_wc_status_str` of the status.
        status: String,
        /// The vendor error code.
        vendor_err: u32,
    },
    /// An argument the caller passed cannot work (a range outside a registration, …).
    InvalidArgument(&'static str),
    /// No device of that name.
    NoSuchDevice(String),
    /// A wait ran out of time.
    Timeout(&'static str),
}

impl Error {
    /// The error for `call` from the current thread's errno.
    pub fn last(call: &'static str) -> Self {
        Self::Call {
            call,
            source: io::Error::last_os_error(),
        }
    }

    /// The error for `call` from an errno value it returned (verbs calls such as
    /// `ibv_modify_qp` and `ibv_post_send` return the errno instead of setting it).
    pub fn returned(call: &'static str, errno: i32) -> Self {
        Self::Call {
            call,
            source: io::Error::from_raw_os_error(errno.abs()),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unavailable(u) => u.fmt(f),
            Self::Call { call, source } => write!(f, "{call} failed: {source}"),
            Self::UnexpectedEvent {
                expected,
                got,
                status,
                ..
            } => write!(f, "waiting for {expected}, got {got} (status {status})"),
            Self::Completion {
                op,
                status,
                vendor_err,
            } => write!(
                f,
                "{op} completed with error: {status} (vendor error {vendor_err:#x})"
            ),
            Self::InvalidArgument(what) => write!(f, "invalid argument: {what}"),
            Self::NoSuchDevice(name) => write!(f, "no RDMA device named {name}"),
            Self::Timeout(what) => write!(f, "timed out waiting for {what}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Call { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl From<Unavailable> for Error {
    fn from(u: Unavailable) -> Self {
        Self::Unavailable(u)
    }
}

/// Result of the RDMA layer.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The `std::io::ErrorKind` a socket-like API reports for this error.
    pub fn io_kind(&self) -> io::ErrorKind {
        match self {
            Self::Unavailable(_) | Self::NoSuchDevice(_) => io::ErrorKind::Unsupported,
            Self::Call { source, .. } => source.kind(),
            Self::UnexpectedEvent { got, .. } => match got.as_str() {
                "RDMA_CM_EVENT_REJECTED" => io::ErrorKind::ConnectionRefused,
                "RDMA_CM_EVENT_UNREACHABLE"
                | "RDMA_CM_EVENT_ADDR_ERROR"
                | "RDMA_CM_EVENT_ROUTE_ERROR" => io::ErrorKind::HostUnreachable,
                _ => io::ErrorKind::ConnectionAborted,
            },
            Self::Completion { .. } => io::ErrorKind::ConnectionReset,
            Self::InvalidArgument(_) => io::ErrorKind::InvalidInput,
            Self::Timeout(_) => io::ErrorKind::TimedOut,
        }
    }
}

/// The error as an `io::Error` of the matching kind; the original stays reachable through
/// `get_ref()`/`into_inner()` (downcast to [`Error`]).
impl Error {
    /// Whether this is a memory registration the kernel refused for lack of lockable memory:
    /// `ibv_reg_mr` failing with ENOMEM (pinned pages over RLIMIT_MEMLOCK, for a process
    /// without CAP_IPC_LOCK), EAGAIN or EPERM.
    pub fn is_memlock(&self) -> bool {
        matches!(self, Self::Call { call: "ibv_reg_mr", source }
            if matches!(source.raw_os_error(), Some(libc::ENOMEM | libc::EAGAIN | libc::EPERM)))
    }
}

/// Whether `e` carries an [`Error`] that [`Error::is_memlock`] (an upgrade's set-up that failed
/// for RLIMIT_MEMLOCK, not for want of anything else).
pub fn is_memlock(e: &io::Error) -> bool {
    e.get_ref()
        .and_then(|i| i.downcast_ref::<Error>())
        .is_some_and(Error::is_memlock)
}

impl From<Error> for io::Error {
    fn from(e: Error) -> Self {
        io::Error::new(e.io_kind(), e)
    }
}
