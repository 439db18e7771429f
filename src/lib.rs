//! continuum: an embedded, crash-safe, append-only log storage engine for long-running AI agents.
//!
//! Start with [`Log`]: a write-ahead log of segment files with group commit, a CRC on every
//! batch, crash recovery and prefix truncation. `docs/ARCHITECTURE.md` explains the design and
//! `docs/FORMAT.md` every byte on disk.
//!
//! ```
//! # fn main() -> continuum::Result<()> {
//! let dir = tempfile::tempdir().expect("a temporary directory");
//! let log = continuum::Log::builder(dir.path()).segment_bytes(1 << 20).open()?;
//! let first = log.append(b"thought: look up the weather")?;
//! let range = log.append_batch(&[b"tool call: weather(paris)".as_slice(), b"tool output: 21C"])?;
//! assert_eq!(range.first(), first.next());
//! assert_eq!(log.read(first)?.as_deref(), Some(&b"thought: look up the weather"[..]));
//! drop(log);
//!
//! // Reopening runs recovery and finds every acknowledged record.
//! let log = continuum::Log::open(dir.path())?;
//! let records: Vec<_> = log.iter_from(first)?.collect::<continuum::Result<_>>()?;
//! assert_eq!(records.len(), 3);
//! # Ok(())
//! # }
//! ```

pub mod codec;
pub mod config;
pub mod context;
pub mod error;
#[doc(hidden)]
pub mod fuzz;
pub mod limits;
pub mod log;
pub(crate) mod snapshot;
pub mod storage;
pub mod store;
#[doc(hidden)]
pub mod synthetic;

pub use codec::proto::Delta;
pub use config::{Config, Durability, RecoveryMode};
pub use context::Context;
pub use error::{CorruptionKind, Error, Result};
pub use log::{Log, LogBuilder, Lsn, LsnRange, RecoveryReport};
pub use store::{
    AgentResume, Atom, AtomFailure, AtomId, AtomOutput, AtomStatus, Executed, ResumeReport, RunId, RunSpec, RunStatus,
    Store, StoreBuilder,
};
