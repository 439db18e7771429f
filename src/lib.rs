//! continuum: an embedded, crash-safe, append-only log storage engine for long-running AI agents.
//!
//! Agents use the [`Store`]: runs of atoms (one thought → action cycle each) forming a DAG,
//! written to the log before their output is used, so that after a crash an agent resumes at
//! its first incomplete atom and never repeats a completed one.
//!
//! ```
//! # fn main() -> continuum::Result<()> {
//! use continuum::{AtomOutput, Delta, RunSpec, Store};
//!
//! let dir = tempfile::tempdir().expect("a temporary directory");
//! let store = Store::open(dir.path())?;
//! let run = store.create_run(RunSpec::new("trip-42").pipeline("travel-agent", "1.0"))?;
//! let plan = store.execute(run, "planner", "step-1", &[], |_atom| {
//!     Ok(AtomOutput { delta: Delta::default(), result: b"fly on tuesday".to_vec() })
//! })?;
//! // Run again (after a crash, say): the recorded output comes back, the closure never runs.
//! let again = store.execute(run, "planner", "step-1", &[], |_atom| unreachable!())?;
//! assert!(again.replayed);
//! assert_eq!(again.output.result, plan.output.result);
//! // A side effect guarded by an idempotency key runs at most once.
//! let booking = store.guarded(plan.atom, "book", |key| Ok(format!("booked with {key}").into_bytes()))?;
//! assert_eq!(booking, b"booked with trip-42#1/planner/step-1/book");
//! # Ok(())
//! # }
//! ```
//!
//! A run can also stop on purpose and resume later, in another process: [`continuation`]
//! suspends it with a tree of its agents and the tool calls that wait for approval, records
//! each decision durably, and runs an approved call exactly once after the resume.
//!
//! Underneath is the [`Log`]: a write-ahead log of segment files with group commit, a CRC on
//! every batch, crash recovery and prefix truncation. `docs/ARCHITECTURE.md` explains the
//! design and `docs/FORMAT.md` every byte on disk.
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

pub mod channel;
pub mod checkpoint;
pub mod codec;
pub mod config;
pub mod continuation;
pub use codec::context;
pub mod error;
#[doc(hidden)]
pub mod fuzz;
mod ids;
pub mod inspect;
pub mod lease;
pub mod limits;
pub mod log;
pub mod metrics;
pub(crate) mod purge;
pub(crate) mod replay;
#[cfg(unix)]
pub mod serve;
pub mod shared_state;
#[cfg(feature = "object-store")]
pub mod ship;
pub mod shutdown;
pub(crate) mod snapshot;
pub mod storage;
pub mod store;
#[doc(hidden)]
pub mod synthetic;

pub use codec::context::{Context, KeyedValues};
pub use codec::proto::Delta;
pub use config::{Config, Durability, RecoveryMode};
pub use error::{CorruptionKind, Error, Result};
pub use lease::Lease;
pub use log::{FrameCompression, Log, LogBuilder, Lsn, LsnRange, RecoveryReport, RewriteOptions, StreamKey};
pub use metrics::MetricsSnapshot;
pub use purge::{CompactionReport, SpaceReport};
pub use replay::{Rebuilt, SnapshotFallback};
pub use store::{
    AgentResume, Atom, AtomFailure, AtomId, AtomOutput, AtomStatus, CONTROL_AGENT_PREFIX, CompactionPolicy, Executed,
    History, IndexSnapshotInfo, LogView, LossEvidence, ResumeReport, RetentionPolicy, RunId, RunSpec, RunStatus,
    SnapshotPolicy, StopToken, Store, StoreBuilder, StoreRecoveryReport, is_control_agent,
};
