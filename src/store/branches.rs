//! Branches of an agent's history: rollback to an earlier atom and fork from one, and whether
//! anything can still continue from an atom.

use crate::codec::StoreRecord;
use crate::codec::proto;
use crate::config::Durability;
use crate::error::{Error, Result};
use crate::store::index::{AtomEntry, EntryState};
use crate::store::types::{AtomId, RunId};
use crate::store::{Store, now_us, unknown_run};

impl Store {
    /// Whether nothing can continue from `atom` (whose index entry is `entry`): a compaction
    /// round released it (no rebuild can reach it: `purge/plan.rs`), or reclaimed its delta and it
    /// has no snapshot. It cannot be a parent, a rollback's target or pinned.
    pub(crate) fn history_gone(&self, entry: &AtomEntry, atom: AtomId) -> bool {
        entry.released || (entry.reclaimed && !self.shared.snapshots.lock().contains(&atom.0))
    }

    /// Rollback: abandons every atom of `agent` in `run` after `to` (in id order, whatever
    /// branch it is on, forks from `to` included), so that the agent continues from `to`. The
    /// abandoned atoms stay readable (time travel into the old branch works); their keys are
    /// free, so re-running those steps creates new atoms. Returns the abandoned atoms.
    ///
    /// # Errors
    /// [`Error::UnknownAtom`] if `to` is not an atom of that run and agent;
    /// [`Error::RunSuspended`] while the run is suspended; [`Error::InvalidArgument`] for one of
    /// the store's own agents;
    /// [`Error::HistoryReclaimed`] if retention reclaimed `to`'s history and it has no snapshot
    /// (nothing could continue from it: it can no longer be a parent); the log's errors.
    pub fn rollback(&self, run: RunId, agent: &str, to: AtomId, reason: &str) -> Result<Vec<AtomId>> {
        // The store's own agents never roll back: a checkpoint's sequence is never reused.
        crate::store::control::check_caller_agent(agent)?;
        if let Some(suspended) = self.shared.continuations.read().runs.get(&run.0) {
            return Err(Error::RunSuspended { run: run.0, suspension: suspended.id.number });
        }
        // No compaction round plans from the heads before this rollback and marks after it.
        let _purge = self.shared.purge.lock();
        let (run32, agent_id) = {
            let index = self.shared.index.read();
            let run32 = u32::try_from(run.0).map_err(|_| unknown_run(run))?;
            let agent_id = index.agent_id(run32, agent).ok_or(Error::UnknownAtom { atom: to.0 })?;
            let entry = index.atom(to).ok_or(Error::UnknownAtom { atom: to.0 })?;
            if entry.run != run32 || entry.agent != agent_id || entry.abandoned {
                return Err(Error::UnknownAtom { atom: to.0 });
            }
            // What `reserve_atom` refuses as a parent: refused here, before any atom is
            // abandoned, rather than leaving the agent with nothing to continue from.
            if self.history_gone(entry, to) {
                return Err(Error::HistoryReclaimed { atom: to.0, reclaimed: to.0 });
            }
            (run32, agent_id)
        };
        let record = StoreRecord::AtomsAbandoned(proto::AtomsAbandoned {
            after_atom: to.0,
            run: run.0,
            agent: agent.to_owned(),
            reason: reason.to_owned(),
            at_unix_us: now_us(),
        });
        self.append(&record, Durability::Sync)?;
        Ok(self.shared.index.write().abandon_after(run32, agent_id, to.0))
    }

    /// Fork: starts a new branch of `agent` from the completed atom `from` ("go back to step 7
    /// and try again"): a new atom called `key` whose only parent is `from`. The old branch
    /// stays as it was. To abandon it instead, roll back to `from` *before* forking: a
    /// [`Store::rollback`] abandons every atom of the agent after `from` in id order, so one
    /// called after the fork abandons the fork's atoms too.
    ///
    /// # Errors
    /// [`Error::InvalidParent`] if `from` has not completed; the errors of
    /// [`Store::begin_atom`].
    pub fn fork(&self, run: RunId, agent: &str, from: AtomId, key: &str) -> Result<AtomId> {
        // No compaction round plans without this branch and releases its parent meanwhile.
        let _purge = self.shared.purge.lock();
        let completed = self.shared.index.read().atom(from).is_some_and(|entry| entry.state == EntryState::Completed);
        if !completed {
            return Err(Error::InvalidParent { parent: from.0, reason: "a fork starts from a completed atom" });
        }
        self.begin_atom(run, agent, key, &[from], "")
    }
}
