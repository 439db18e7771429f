//! Reading a run's checkpoints: the newest, one by sequence, the newest few; and the heads
//! the newest checkpoints of live runs name, which the purge plan keeps rebuildable.

use std::collections::HashSet;

use crate::checkpoint::CHECKPOINT_AGENT;
use crate::checkpoint::codec::{self, checkpoint_key};
use crate::checkpoint::types::RunCheckpoint;
use crate::error::Result;
use crate::store::{RunId, RunStatus, Store};

impl Store {
    /// The newest checkpoint of `run`, if it has one. Cheap: the index finds its atom (walking
    /// back from the run's newest atom), and one atom is read.
    ///
    /// ```
    /// # fn main() -> continuum::Result<()> {
    /// use continuum::checkpoint::CheckpointDraft;
    /// use continuum::{RunSpec, Store};
    /// let dir = tempfile::tempdir().unwrap();
    /// let store = Store::open(dir.path())?;
    /// let run = store.create_run(RunSpec::new("trip"))?;
    /// assert_eq!(store.load_latest_checkpoint(run)?, None);
    /// store.write_checkpoint(run, CheckpointDraft::at("planner", "start").resume_hint("plan first"))?;
    /// assert_eq!(store.load_latest_checkpoint(run)?.map(|c| c.resume_hint), Some("plan first".into()));
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::UnknownRun`](crate::Error::UnknownRun), the log's read errors, and
    /// [`Error::InconsistentLog`](crate::Error::InconsistentLog) if the atom holds no checkpoint.
    pub fn load_latest_checkpoint(&self, run: RunId) -> Result<Option<RunCheckpoint>> {
        self.run_status(run)?;
        let Some(atom) = self.last_agent_atom(run, CHECKPOINT_AGENT) else { return Ok(None) };
        codec::decode(&self.atom(atom)?).map(Some)
    }

    /// Checkpoint `sequence` of `run`, if it was written (one lookup by key, one atom read).
    ///
    /// # Errors
    /// As [`Store::load_latest_checkpoint`].
    pub fn load_checkpoint(&self, run: RunId, sequence: u64) -> Result<Option<RunCheckpoint>> {
        self.run_status(run)?;
        let Some(atom) = self.atom_by_key(run, CHECKPOINT_AGENT, &checkpoint_key(sequence))? else {
            return Ok(None);
        };
        codec::decode(&self.atom(atom)?).map(Some)
    }

    /// The newest `limit` checkpoints of `run`, newest first: chosen from the index, and only
    /// they read from the log.
    ///
    /// # Errors
    /// As [`Store::load_latest_checkpoint`].
    pub fn checkpoints(&self, run: RunId, limit: usize) -> Result<Vec<RunCheckpoint>> {
        self.run_status(run)?;
        self.agent_history(run, CHECKPOINT_AGENT)
            .newest_first()
            .limit(limit)
            .map(|atom| atom.and_then(|atom| codec::decode(&atom)))
            .collect()
    }

    /// The agent heads the newest checkpoint of each run that retention did not drop names:
    /// targets of the purge plan (`purge/plan.rs`). Called under the purge lock, which
    /// [`Store::write_checkpoint`] holds too.
    pub(crate) fn checkpointed_heads(&self) -> Result<HashSet<u64>> {
        let runs: Vec<RunId> = {
            let index = self.shared.index.read();
            (1..=index.runs.len() as u64)
                .map(RunId)
                .filter(|run| index.run(*run).is_some_and(|entry| entry.status != RunStatus::Dropped))
                .filter(|run| {
                    u32::try_from(run.get()).is_ok_and(|run32| index.agent_id(run32, CHECKPOINT_AGENT).is_some())
                })
                .collect()
        };
        let mut heads = HashSet::new();
        for run in runs {
            if let Some(checkpoint) = self.load_latest_checkpoint(run)? {
                heads.extend(checkpoint.agent_heads.values().map(|atom| atom.get()));
            }
        }
        Ok(heads)
    }
}
