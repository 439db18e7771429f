//! Public value types of the store: identifiers, statuses, run specs, atom views, resume points.

use std::collections::BTreeMap;

use crate::codec::proto::Delta;
use crate::log::Lsn;

pub use crate::ids::{AtomId, RunId};

/// Where an atom is in its life: `running → completed | failed` (an atom not yet begun has no
/// status; a retryable failure may run again).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AtomStatus {
    /// Begun, not finished (after a crash: the work to resume).
    Running,
    /// Finished; its delta and result are recorded.
    Completed,
    /// Finished with an error.
    Failed {
        /// Whether running it again may succeed.
        retryable: bool,
    },
}

/// A run's status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunStatus {
    /// Not finished.
    Running,
    /// Finished.
    Finished {
        /// Whether it succeeded.
        success: bool,
        /// What a human needs to know to resume or diagnose it.
        resume_hint: String,
    },
    /// Suspended on purpose ([`Store::suspend`](crate::Store::suspend)) until
    /// [`Store::resume_suspended`](crate::Store::resume_suspended): distinct from running and
    /// from crashed (a crashed run is `Running` with an atom left running). It takes no new
    /// atoms meanwhile.
    Suspended {
        /// Why.
        reason: crate::continuation::SuspendReason,
        /// Since when, in microseconds since the Unix epoch.
        since_unix_us: u64,
    },
    /// Finished, then dropped by retention (`RetentionPolicy::finished_run_age`): its atoms,
    /// guards and snapshots are gone. Its name is free for a new run.
    Dropped,
}

/// What a new run is: `RunSpec::new("nightly-report").pipeline("research", "1.2")`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunSpec {
    /// The caller's name for the run, unique within the store.
    pub name: String,
    /// Pipeline name.
    pub pipeline: String,
    /// Pipeline version.
    pub pipeline_version: String,
    /// Environment metadata: host, model versions, framework versions.
    pub environment: BTreeMap<String, String>,
    /// This run's snapshot policy, instead of the store's.
    pub snapshot_policy: Option<crate::store::SnapshotPolicy>,
}

impl RunSpec {
    /// A run named `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into(), ..Self::default() }
    }

    /// Sets the pipeline name and version.
    #[must_use]
    pub fn pipeline(mut self, name: impl Into<String>, version: impl Into<String>) -> Self {
        self.pipeline = name.into();
        self.pipeline_version = version.into();
        self
    }

    /// Gives this run its own snapshot policy (stored with the run, so it holds after reopen).
    #[must_use]
    pub fn snapshot_policy(mut self, policy: crate::store::SnapshotPolicy) -> Self {
        self.snapshot_policy = Some(policy);
        self
    }

    /// Adds one environment entry.
    #[must_use]
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.environment.insert(key.into(), value.into());
        self
    }
}

/// What an atom produced: the changes it made and the value it returned.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AtomOutput {
    /// New messages, tool outputs, intermediate results and state changes.
    pub delta: Delta,
    /// The atom's return value, opaque to the store.
    pub result: Vec<u8>,
}

/// Why an atom's work failed, as its closure reports it to [`Store::execute`](crate::Store::execute),
/// or why a guarded side effect failed, as its closure reports it to
/// [`Store::guarded`](crate::Store::guarded).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AtomFailure {
    /// A human-readable message.
    pub message: String,
    /// Whether running the atom again may succeed.
    pub retryable: bool,
}

impl From<crate::Error> for AtomFailure {
    /// A store error met inside an atom's work (a receive that could not read, a send refused),
    /// as the atom's failure: retryable unless the error is the caller's input.
    fn from(error: crate::Error) -> Self {
        let retryable = !matches!(error, crate::Error::InvalidArgument { .. } | crate::Error::LimitExceeded { .. });
        AtomFailure { message: error.to_string(), retryable }
    }
}

/// The result of [`Store::execute`](crate::Store::execute).
#[derive(Clone, Debug, PartialEq)]
pub struct Executed {
    /// The atom.
    pub atom: AtomId,
    /// Its output.
    pub output: AtomOutput,
    /// `true` when the output was recorded earlier and the closure did not run.
    pub replayed: bool,
    /// `true` when retention reclaimed the recorded delta (the atom is older than its agent's
    /// oldest kept snapshot): `output.delta` is then empty, and `output.result` is still the
    /// recorded result. The agent's context comes from [`Store::rebuild_context`] of a newer
    /// atom, which needs no reclaimed delta.
    ///
    /// [`Store::rebuild_context`]: crate::Store::rebuild_context
    pub delta_reclaimed: bool,
}

/// Everything the store knows about one atom.
#[derive(Clone, Debug, PartialEq)]
pub struct Atom {
    /// Its id.
    pub id: AtomId,
    /// Its run.
    pub run: RunId,
    /// Its agent.
    pub agent: String,
    /// The caller's name for it within (run, agent).
    pub key: String,
    /// Atoms it depends on.
    pub parents: Vec<AtomId>,
    /// Its idempotency key (empty if none).
    pub idempotency_key: String,
    /// Its status.
    pub status: AtomStatus,
    /// When it started, in microseconds since the Unix epoch.
    pub started_at_unix_us: u64,
    /// When it finished, if it did.
    pub ended_at_unix_us: Option<u64>,
    /// Its output, if it completed.
    pub output: Option<AtomOutput>,
    /// Its error, if it failed.
    pub error: Option<String>,
    /// LSN of its start record.
    pub started_lsn: Lsn,
    /// Whether a rollback abandoned it (it stays readable; its agent moved on without it).
    pub abandoned: bool,
    /// Whether retention reclaimed its delta (`output.delta` is then empty; the result stays).
    pub delta_reclaimed: bool,
}

/// Where one agent of a run stands, for resuming after a crash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentResume {
    /// The agent.
    pub agent: String,
    /// Completed atoms, in id order; their outputs are recorded and are never recomputed.
    pub completed: Vec<AtomId>,
    /// The last completed atom.
    pub last_completed: Option<AtomId>,
    /// The first atom that started but did not complete (left running by a crash, or failed
    /// with a retryable error): where the agent resumes.
    pub first_incomplete: Option<AtomId>,
    /// Atoms that failed for good.
    pub failed: Vec<AtomId>,
}

/// Where a whole run stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResumeReport {
    /// The run.
    pub run: RunId,
    /// Its status.
    pub status: RunStatus,
    /// Every agent that has atoms, by name.
    pub agents: Vec<AgentResume>,
}
