//! Reading atoms back: one atom with its output, a run's or an agent's atom ids, and where
//! each agent of a run stands (`resume`).

use crate::codec::StoreRecord;
use crate::error::{Error, Result};
use crate::log::Lsn;
use crate::store::index::{AtomEntry, EntryState};
use crate::store::types::{AgentResume, Atom, AtomId, AtomOutput, AtomStatus, ResumeReport, RunId};
use crate::store::{Store, unknown_run};

impl Store {
    /// Everything the store knows about `atom`, read from the log.
    ///
    /// # Errors
    /// [`Error::UnknownAtom`], and read or decode errors of the log.
    pub fn atom(&self, atom: AtomId) -> Result<Atom> {
        let entry = {
            let index = self.shared.index.read();
            *index
                .atom(atom)
                .filter(|entry| entry.state.status().is_some())
                .ok_or(Error::UnknownAtom { atom: atom.0 })?
        };
        let started = self.read_record(entry.started_lsn)?;
        let ended = if entry.ended_lsn != 0 && entry.state.status() != Some(AtomStatus::Running) {
            Some(self.read_record(entry.ended_lsn)?)
        } else {
            None
        };
        assemble_atom(atom, &entry, started, ended)
    }

    /// Every atom of `run`, in id order.
    pub fn run_atoms(&self, run: RunId) -> Vec<AtomId> {
        self.shared.index.read().run_atoms(run).map(|(atom, _)| atom).collect()
    }

    /// Every atom of `agent` in `run`, in id order.
    pub fn agent_atoms(&self, run: RunId, agent: &str) -> Vec<AtomId> {
        let index = self.shared.index.read();
        let Some(agent_id) = u32::try_from(run.0).ok().and_then(|run32| index.agent_id(run32, agent)) else {
            return Vec::new();
        };
        index.run_atoms(run).filter(|(_, entry)| entry.agent == agent_id).map(|(atom, _)| atom).collect()
    }

    /// The newest atom of `agent` in `run` that no rollback abandoned: the agent's head, where
    /// it resumes from, or what a checkpointer's "latest index snapshot of this thread" asks for.
    /// After [`Store::rollback`] to `to` it is `to` until the agent records another atom. The
    /// run's atoms are walked from its newest back to the agent's, so an agent that is its
    /// run's only one, or among its latest, is found at once, however long the run.
    ///
    /// ```
    /// # use continuum::{AtomOutput, RunSpec, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = Store::open(dir.path())?;
    /// let run = store.create_run(RunSpec::new("triage"))?;
    /// assert_eq!(store.last_agent_atom(run, "planner"), None);
    /// let first = store.record_atom(run, "planner", "step-1", &[], "", &AtomOutput::default())?;
    /// let second = store.record_atom(run, "planner", "step-2", &[first], "", &AtomOutput::default())?;
    /// store.record_atom(run, "critic", "review-1", &[second], "", &AtomOutput::default())?;
    /// assert_eq!(store.last_agent_atom(run, "planner"), Some(second));
    /// store.rollback(run, "planner", first, "try step 2 again")?;
    /// assert_eq!(store.last_agent_atom(run, "planner"), Some(first));
    /// # Ok::<(), continuum::Error>(())
    /// ```
    pub fn last_agent_atom(&self, run: RunId, agent: &str) -> Option<AtomId> {
        let index = self.shared.index.read();
        let agent_id = u32::try_from(run.0).ok().and_then(|run32| index.agent_id(run32, agent))?;
        index.last_run_atom(run, |entry| entry.agent == agent_id && !entry.abandoned)
    }

    /// Atoms of `run` that started and did not complete (running, or failed retryably).
    pub fn incomplete_atoms(&self, run: RunId) -> Vec<AtomId> {
        let index = self.shared.index.read();
        index
            .run_atoms(run)
            .filter(|(_, entry)| !entry.abandoned)
            .filter(|(_, entry)| {
                matches!(entry.state, EntryState::Running | EntryState::Finishing | EntryState::FailedRetryable)
            })
            .map(|(atom, _)| atom)
            .collect()
    }

    /// Where each agent of `run` stands: what completed (never to be redone), and where to
    /// resume.
    ///
    /// # Errors
    /// [`Error::UnknownRun`].
    pub fn resume(&self, run: RunId) -> Result<ResumeReport> {
        let index = self.shared.index.read();
        let status = self.overlaid_status(run, &index.run(run).ok_or_else(|| unknown_run(run))?.status);
        let mut agents: Vec<(u32, AgentResume)> = Vec::new();
        for (atom, entry) in index.run_atoms(run).filter(|(_, entry)| !entry.abandoned) {
            let at = match agents.iter().position(|(id, _)| *id == entry.agent) {
                Some(at) => at,
                None => {
                    agents.push((entry.agent, empty_resume(index.agent_name(entry.agent))));
                    agents.len() - 1
                }
            };
            let agent = &mut agents[at].1;
            match entry.state {
                EntryState::Completed => {
                    agent.completed.push(atom);
                    agent.last_completed = Some(atom);
                }
                EntryState::Failed => agent.failed.push(atom),
                _ => {
                    agent.first_incomplete.get_or_insert(atom);
                }
            }
        }
        Ok(ResumeReport { run, status, agents: agents.into_iter().map(|(_, agent)| agent).collect() })
    }
}

/// The public view of `atom` (index entry `entry`) from its start record and, if it ended, its
/// end record.
pub(crate) fn assemble_atom(
    atom: AtomId,
    entry: &AtomEntry,
    started: StoreRecord,
    ended: Option<StoreRecord>,
) -> Result<Atom> {
    let StoreRecord::AtomStarted(started) = started else {
        return Err(Error::InconsistentLog { lsn: entry.started_lsn, reason: "an atom's start is not a start record" });
    };
    let mut found = Atom {
        id: atom,
        run: RunId(started.run),
        agent: started.agent,
        key: started.key,
        parents: started.parents.into_iter().map(AtomId).collect(),
        idempotency_key: started.idempotency_key,
        status: entry.state.status().unwrap_or(AtomStatus::Running),
        started_at_unix_us: started.started_at_unix_us,
        ended_at_unix_us: None,
        output: None,
        error: None,
        started_lsn: Lsn::new(entry.started_lsn),
        abandoned: entry.abandoned,
        delta_reclaimed: entry.reclaimed,
    };
    match ended {
        None => {}
        Some(StoreRecord::AtomCompleted(done) | StoreRecord::AtomReclaimed(done)) => {
            found.ended_at_unix_us = Some(done.ended_at_unix_us);
            found.output = Some(AtomOutput { delta: done.delta.unwrap_or_default(), result: done.result });
        }
        Some(StoreRecord::AtomFailed(failed)) => {
            found.ended_at_unix_us = Some(failed.ended_at_unix_us);
            found.error = Some(failed.error);
        }
        Some(_) => {
            return Err(Error::InconsistentLog { lsn: entry.ended_lsn, reason: "an atom's end is not an end record" });
        }
    }
    Ok(found)
}

fn empty_resume(agent: &str) -> AgentResume {
    AgentResume {
        agent: agent.to_owned(),
        completed: Vec::new(),
        last_completed: None,
        first_incomplete: None,
        failed: Vec::new(),
    }
}
