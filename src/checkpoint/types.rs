//! The public values of run checkpoints: what a run's checkpoint holds ([`RunCheckpoint`]) and
//! what a writer hands over ([`CheckpointDraft`]).

use std::collections::BTreeMap;

use crate::store::{AtomId, RunId};

/// A resumable position of a run, as [`Store::write_checkpoint`](crate::Store::write_checkpoint)
/// recorded it: where the run stands, the state its agents share, and each agent's memory as a
/// reference (its head atom, whose context [`Store::rebuild_context`](crate::Store::rebuild_context)
/// rebuilds).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunCheckpoint {
    /// The run.
    pub run: RunId,
    /// Its place in the run's checkpoints: monotonic, from 1.
    pub sequence: u64,
    /// The control atom that holds it.
    pub atom: AtomId,
    /// The pipeline's name.
    pub pipeline: String,
    /// The pipeline's version the checkpoint was written by.
    pub pipeline_version: String,
    /// The agent the run resumes with.
    pub current_agent: String,
    /// The step position it resumes at, in the application's terms.
    pub position: String,
    /// State the run's agents share, by key.
    pub shared_context: BTreeMap<String, Vec<u8>>,
    /// Each agent's head atom.
    pub agent_heads: BTreeMap<String, AtomId>,
    /// Environment metadata: the run's, with the draft's entries over it.
    pub environment: BTreeMap<String, String>,
    /// Whether the pipeline had reached its end.
    pub is_terminal: bool,
    /// What whoever resumes the run needs to know.
    pub resume_hint: String,
    /// The guard keys of the run whose side effects had completed ([`Store::guarded`](crate::Store::guarded)),
    /// sorted.
    pub side_effects_committed: Vec<String>,
    /// When it was written, in microseconds since the Unix epoch.
    pub written_at_unix_us: u64,
    /// Guard completions at or after this LSN may be missing from `side_effects_committed`
    /// (their guards were in flight): the next checkpoint reads them (0: unknown).
    pub side_effects_from_lsn: u64,
}

/// What a writer hands to [`Store::write_checkpoint`](crate::Store::write_checkpoint): the
/// run's position and shared state. The store adds the pipeline, the environment, the
/// committed side effects and (unless given) each agent's head.
///
/// ```
/// use continuum::checkpoint::CheckpointDraft;
/// let draft = CheckpointDraft::at("planner", "step-3").shared("plan", b"fly tuesday".to_vec()).resume_hint("book the hotel next");
/// assert_eq!(draft.sequence, None);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckpointDraft {
    /// The sequence to write; `None`: the run's newest plus one.
    pub sequence: Option<u64>,
    /// The agent the run resumes with.
    pub current_agent: String,
    /// The step position it resumes at.
    pub position: String,
    /// State the run's agents share, by key.
    pub shared_context: BTreeMap<String, Vec<u8>>,
    /// Each agent's head atom; `None`: each agent's newest completed atom that no rollback
    /// abandoned.
    pub agent_heads: Option<BTreeMap<String, AtomId>>,
    /// Environment entries over the run's own.
    pub environment: BTreeMap<String, String>,
    /// The pipeline version the writer runs, if not the previous checkpoint's (the run's, for
    /// its first checkpoint): a run resumed by a newer version moves on with it.
    pub pipeline_version: Option<String>,
    /// Whether the pipeline has reached its end.
    pub is_terminal: bool,
    /// What whoever resumes the run needs to know.
    pub resume_hint: String,
}

impl CheckpointDraft {
    /// A draft of the run resuming with `agent` at `position`.
    pub fn at(agent: impl Into<String>, position: impl Into<String>) -> Self {
        Self { current_agent: agent.into(), position: position.into(), ..Self::default() }
    }

    /// A draft that continues from `previous`: its agent, position, shared context, version,
    /// environment and resume hint, with each agent's head taken afresh from the store. What a
    /// process writes for each run in flight when it stops between steps:
    ///
    /// ```
    /// # fn main() -> continuum::Result<()> {
    /// use continuum::checkpoint::CheckpointDraft;
    /// use continuum::{RunStatus, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path())?;
    /// # let run = store.create_run(continuum::RunSpec::new("trip"))?;
    /// # store.write_checkpoint(run, CheckpointDraft::at("planner", "step-2"))?;
    /// for info in store.runs().into_iter().filter(|info| info.status == RunStatus::Running) {
    ///     let draft = match store.load_latest_checkpoint(info.id)? {
    ///         Some(previous) => CheckpointDraft::following(&previous),
    ///         None => CheckpointDraft::default(),
    ///     };
    ///     store.write_checkpoint(info.id, draft.resume_hint("stopped by SIGTERM"))?;
    /// }
    /// assert_eq!(store.load_latest_checkpoint(run)?.map(|c| (c.sequence, c.position)), Some((2, "step-2".into())));
    /// # Ok(())
    /// # }
    /// ```
    pub fn following(previous: &RunCheckpoint) -> Self {
        Self {
            sequence: None,
            current_agent: previous.current_agent.clone(),
            position: previous.position.clone(),
            shared_context: previous.shared_context.clone(),
            agent_heads: None,
            environment: previous.environment.clone(),
            pipeline_version: Some(previous.pipeline_version.clone()),
            is_terminal: previous.is_terminal,
            resume_hint: previous.resume_hint.clone(),
        }
    }

    /// Asks for sequence `sequence` (refused unless greater than the run's newest).
    #[must_use]
    pub fn sequence(mut self, sequence: u64) -> Self {
        self.sequence = Some(sequence);
        self
    }

    /// Adds one entry of shared context.
    #[must_use]
    pub fn shared(mut self, key: impl Into<String>, value: Vec<u8>) -> Self {
        self.shared_context.insert(key.into(), value);
        self
    }

    /// Names `agent`'s head atom (the others' then are not taken from the store).
    #[must_use]
    pub fn head(mut self, agent: impl Into<String>, atom: AtomId) -> Self {
        self.agent_heads.get_or_insert_with(BTreeMap::new).insert(agent.into(), atom);
        self
    }

    /// Adds one environment entry.
    #[must_use]
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.environment.insert(key.into(), value.into());
        self
    }

    /// Records the pipeline version the writer runs; later checkpoints carry it over.
    #[must_use]
    pub fn pipeline_version(mut self, version: impl Into<String>) -> Self {
        self.pipeline_version = Some(version.into());
        self
    }

    /// Marks the pipeline as having reached its end.
    #[must_use]
    pub fn terminal(mut self) -> Self {
        self.is_terminal = true;
        self
    }

    /// Sets the resume hint.
    #[must_use]
    pub fn resume_hint(mut self, hint: impl Into<String>) -> Self {
        self.resume_hint = hint.into();
        self
    }
}
