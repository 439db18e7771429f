//! Run checkpoints and version migration, on top of control atoms (`store/control.rs`).
//!
//! A checkpoint of a run is a completed control atom of agent [`CHECKPOINT_AGENT`] whose key
//! is `checkpoint/<sequence>` and whose result is the encoded checkpoint (`RunCheckpoint` in
//! `continuum.proto`): durable, replayed on open and kept by retention as every atom is, with
//! no storage path of its own. Its sequence grows by run; the newest is the agent's head atom,
//! found from the index. Each agent's memory is a reference to its head atom, kept rebuildable
//! by the purge plan while the checkpoint is its run's newest. A migration applied to a loaded
//! checkpoint is recorded as a control atom of agent [`MIGRATION_AGENT`]; the checkpoint itself
//! is never rewritten. `docs/ARCHITECTURE.md`, "Run checkpoints and migrations", has the design.

pub(crate) mod codec;
mod migrate;
mod read;
mod types;
mod write;

pub use migrate::{MigratedCheckpoint, MigrationState, Migrations};
pub use types::{CheckpointDraft, RunCheckpoint};

/// The control agent whose atoms hold a run's checkpoints.
pub const CHECKPOINT_AGENT: &str = "continuum.checkpoint";

/// The control agent whose atoms record the migrations applied to a run's checkpoints.
pub const MIGRATION_AGENT: &str = "continuum.migration";
