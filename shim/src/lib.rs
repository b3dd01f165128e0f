//! `librdmashim.so`: the preload library.
//!
//! Loaded with `LD_PRELOAD` into an unmodified program, it defines the libc entry points of the
//! socket API (see [`hook`] for the list and `docs/shim.md` for why each one), passes every call
//! through to the real libc function, and records what it saw: a lock-free fd table
//! ([`fdtable`]), per-hook call counters and connection/byte counters ([`stats`]), and, for every
//! TCP connection, the reason it stays on TCP ([`reason`]). The RDMA upgrade plugs into the hook
//! bodies through the [`outcome::Outcome`] type: a hook's logic either handles the call, lets it
//! pass through to the kernel, or fails it with an errno, and the hook wrapper converts that to
//! the C return convention in exactly one place.
//!
//! Layout (one file per layer):
//! - `hooks/`: every `extern "C"` entry point (unsafe lives here, in `real.rs`, `sys.rs`, `init.rs`,
//!   `live.rs` (the live view's mapping) and the chunk pointer handling of `fdtable.rs`;
//!   everything else is safe code).
//! - `real.rs`: the table of real libc functions, resolved with `dlsym(RTLD_NEXT)`.
//! - `fdtable.rs`: fd-indexed, two-level, lock-free table of per-fd state.
//! - `stats.rs`, `reason.rs`, `settings.rs`, `rules.rs`, `config.rs`, `policy.rs`, `log.rs`,
//!   `fmtbuf.rs`, `outcome.rs`, `guard.rs`: safe.
//! - `init.rs`: constructor, destructor, fork handler.
#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod cadence;
pub mod config;
pub mod fault;
pub mod fdtable;
pub mod fmtbuf;
pub mod guard;
pub mod hook;
#[cfg(not(test))]
mod live;
pub mod live_layout;
pub mod log;
#[cfg(not(test))]
mod net;
pub mod outcome;
#[cfg(not(test))]
mod policy;
pub mod probe;
pub mod reason;
pub mod rules;
pub mod settings;
#[cfg(not(test))]
mod signals;
pub mod slots;
pub mod spin;
pub mod stats;
mod sys;
#[cfg(all(feature = "timeline", not(test)))]
mod timeline;
pub mod track;
#[cfg(not(test))]
pub mod upgrade;
pub mod versioned;

// The entry points, the real-function table and the constructor are left out of unit-test
// builds: a test executable that defined `read`, `close`, ... would interpose its own harness.
#[cfg(not(test))]
mod hooks;
#[cfg(not(test))]
mod init;
#[cfg(not(test))]
mod real;
