//! Runs: create, find, finish, and their status.

use crate::codec::StoreRecord;
use crate::config::Durability;
use crate::error::{Error, Result};

use super::{RunId, RunSpec, RunStatus};
use super::{Store, now_us, unknown_run};
use super::{index, policy};

impl Store {
    /// Creates a run, or returns the existing run of that name.
    ///
    /// # Errors
    /// The log's append errors.
    pub fn create_run(&self, spec: RunSpec) -> Result<RunId> {
        if let Some(run) = self.run_id(&spec.name) {
            return Ok(run);
        }
        // Run creations and ends take turns, so that run numbers follow the order of their
        // records in the log (dense); the index lock is not held across the record's sync,
        // which would stall every agent's completions.
        let _runs = self.shared.runs_changing.lock();
        if let Some(run) = self.run_id(&spec.name) {
            return Ok(run);
        }
        let run = self.shared.index.read().runs.len() as u64 + 1;
        let id = u32::try_from(run).map_err(|_| Error::UnknownRun { run: spec.name.clone() })?;
        let record = StoreRecord::RunCreated(crate::codec::proto::RunCreated {
            run,
            run_name: spec.name.clone(),
            pipeline: spec.pipeline,
            pipeline_version: spec.pipeline_version,
            environment: spec.environment.into_iter().collect(),
            created_at_unix_us: now_us(),
            snapshot_every_atoms: spec.snapshot_policy.map(|p| p.every_atoms),
            snapshot_every_ms: spec.snapshot_policy.map(|p| policy::duration_ms(p.every)),
        });
        self.append(&record, Durability::Sync)?;
        let mut index = self.shared.index.write();
        index.run_names.insert(spec.name.clone(), id);
        index.runs.push(index::RunEntry {
            name: spec.name,
            status: RunStatus::Running,
            snapshot_policy: spec.snapshot_policy,
            ended_at_unix_us: 0,
            atom_span: (0, 0),
        });
        Ok(RunId(run))
    }

    /// The run named `name`.
    pub fn run_id(&self, name: &str) -> Option<RunId> {
        self.shared.index.read().run_names.get(name).map(|id| RunId(u64::from(*id)))
    }

    /// A run's status.
    ///
    /// # Errors
    /// [`Error::UnknownRun`].
    pub fn run_status(&self, run: RunId) -> Result<RunStatus> {
        let status =
            self.shared.index.read().run(run).map(|entry| entry.status.clone()).ok_or_else(|| unknown_run(run))?;
        Ok(self.overlaid_status(run, &status))
    }

    /// The status the index keeps for `run` (running, finished, dropped), with its suspension
    /// if it is suspended (the index keeps none: suspensions are control atoms).
    pub(crate) fn overlaid_status(&self, run: RunId, indexed: &RunStatus) -> RunStatus {
        if *indexed != RunStatus::Running {
            return indexed.clone();
        }
        match self.shared.continuations.read().runs.get(&run.get()) {
            Some(suspended) => {
                RunStatus::Suspended { reason: suspended.reason.clone(), since_unix_us: suspended.since_unix_us }
            }
            None => RunStatus::Running,
        }
    }

    /// Marks a run finished, with a human-readable hint for whoever resumes or debugs it. A
    /// suspended run can be finished (abandoning its suspension: its undecided requests are
    /// never decided, its approved calls stay runnable through
    /// [`Store::run_approved`](crate::Store::run_approved)).
    ///
    /// # Errors
    /// [`Error::UnknownRun`], [`Error::RunFinished`], the log's append errors.
    pub fn finish_run(&self, run: RunId, success: bool, resume_hint: &str) -> Result<()> {
        // One end per run: ends take turns (with creations), outside the index lock.
        let _runs = self.shared.runs_changing.lock();
        let indexed = self.shared.index.read().run(run).map(|entry| entry.status.clone());
        if indexed.ok_or_else(|| unknown_run(run))? != RunStatus::Running {
            return Err(Error::RunFinished { run: run.0 });
        }
        let ended_at_unix_us = now_us();
        let record = StoreRecord::RunTerminal(crate::codec::proto::RunTerminal {
            run: run.0,
            success,
            resume_hint: resume_hint.to_owned(),
            ended_at_unix_us,
        });
        self.append_reserved(&record)?;
        if let Some(entry) = self.shared.index.write().run_mut(run) {
            entry.status = RunStatus::Finished { success, resume_hint: resume_hint.to_owned() };
            entry.ended_at_unix_us = ended_at_unix_us;
        }
        self.shared.continuations.write().runs.remove(&run.get());
        self.shared.stop.run_finished(run);
        Ok(())
    }
}
