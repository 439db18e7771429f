//! Retention: the snapshot policy's trigger, keeping the last K snapshots of each agent, and
//! dropping finished runs past their retention age. Compaction (`compaction.rs`) then gives
//! the space of what retention released back.

use crate::codec::StoreRecord;
use crate::codec::proto;
use crate::config::Durability;
use crate::error::{Error, Result};
use crate::snapshot::{self, NameDurability};
use crate::store::policy::{SnapshotClock, SnapshotClocks, SnapshotPolicy};
use crate::store::types::{AtomId, RunId, RunStatus};
use crate::store::{Store, now_us};

impl Store {
    /// Counts a completed atom towards its agent's next policy snapshot, and writes (or has
    /// the background thread write) one when it is due. Never fails the completion: a
    /// snapshot is an optimisation, and a failed one is logged.
    pub(crate) fn after_completion(&self, atom: AtomId, agent: u32, policy: SnapshotPolicy) {
        let due = {
            let mut clocks = self.shared.snapshot_clock.lock();
            let clock = clocks.clocks.entry(agent).or_insert_with(|| SnapshotClock::new(policy.every_atoms));
            clock.atoms += 1;
            clock.last = Some(atom);
            clock.every_atoms = policy.every_atoms;
            // The clock is read only if the policy has a time limit.
            let elapsed = if policy.every.is_zero() { std::time::Duration::ZERO } else { clock.since.elapsed() };
            let due = policy.is_due(clock.atoms, elapsed);
            if due {
                *clock = SnapshotClock::new(policy.every_atoms);
            } else if self.worker.is_some() && clock.every_atoms > 0 && clock.atoms == clock.every_atoms.div_ceil(2) {
                // It just reached half way: the background thread's next round may take it
                // (`Store::take_half_due`).
                clocks.half_way.push(agent);
            }
            due
        };
        if !due {
            return;
        }
        match &self.worker {
            Some(worker) => worker.request_snapshot(agent, atom),
            None => {
                if let Err(error) = self.policy_snapshot(atom) {
                    self.policy_snapshot_failed(atom, &error);
                }
            }
        }
    }

    /// The agents at least half way to their next policy snapshot by their run's policy's
    /// count, except those `skip` names, each with its newest completed atom; their clocks
    /// start again as if the snapshot were due. The background thread writes these with the
    /// snapshots due when it writes a round, so that the agents writing side by side come due
    /// together from then on and their rebuilds share one read of the log instead of each
    /// reading all of the others' records since its last snapshot (`docs/ARCHITECTURE.md`, "A
    /// round of policy snapshots reads the log once"). Only the agents that reached half way
    /// since the last call are looked at (skipped ones are kept for the next), not every
    /// agent's clock.
    pub(crate) fn take_half_due(&self, skip: impl Fn(u32) -> bool) -> Vec<(u32, AtomId)> {
        let mut guard = self.shared.snapshot_clock.lock();
        let SnapshotClocks { clocks, half_way } = &mut *guard;
        let mut taken = Vec::new();
        half_way.retain(|agent| {
            let Some(clock) = clocks.get_mut(agent) else { return false };
            let Some(last) = clock.last.filter(|_| clock.half_way()) else { return false };
            if skip(*agent) {
                return true;
            }
            *clock = SnapshotClock::new(clock.every_atoms);
            taken.push((*agent, last));
            false
        });
        // An agent listed twice (it came due and reached half way again) is taken once: its
        // clock started again at the first.
        taken
    }

    /// Counts and logs a policy snapshot that failed: its error reaches no caller.
    pub(crate) fn policy_snapshot_failed(&self, atom: AtomId, error: &Error) {
        self.shared.log.metrics_handle().record_policy_snapshot_failure();
        tracing::warn!(atom = atom.get(), %error, "policy snapshot failed");
    }

    /// Writes the policy snapshot of `atom` (unless its agent has moved on to a rollback, or
    /// the atom is gone) and applies retention to its agent's snapshots.
    pub(crate) fn policy_snapshot(&self, atom: AtomId) -> Result<()> {
        self.policy_snapshots(&[atom]).pop().unwrap_or(Ok(()))
    }

    /// [`Store::policy_snapshot`] of each of `atoms` (one result each, in order), their
    /// rebuilds on this thread sharing their reads of the log where their agents' records
    /// interleave (`Store::rebuild_several`). Rebuilt on the calling thread (the background
    /// thread, at a lower priority): on the replay pool, whose threads run at normal priority,
    /// their decoding took the agents' cores.
    pub(crate) fn policy_snapshots(&self, atoms: &[AtomId]) -> Vec<Result<()>> {
        let mut results: Vec<Result<()>> = atoms.iter().map(|_| Ok(())).collect();
        let usable: Vec<usize> = {
            let index = self.shared.index.read();
            (0..atoms.len()).filter(|at| index.atom(atoms[*at]).is_some_and(|entry| !entry.abandoned)).collect()
        };
        let mut wanted = Vec::with_capacity(usable.len());
        for at in usable {
            match self.snapshottable(atoms[at]) {
                Ok(()) => wanted.push(at),
                Err(error) => results[at] = Err(error),
            }
        }
        let to_rebuild: Vec<AtomId> = wanted.iter().map(|at| atoms[*at]).collect();
        self.rebuild_several(&to_rebuild, None, |i, rebuilt| {
            let (at, atom) = (wanted[i], to_rebuild[i]);
            results[at] =
                rebuilt.and_then(|rebuilt| self.publish_snapshot(atom, &rebuilt.context, NameDurability::Deferred));
        });
        results
    }

    /// Deletes snapshot files: out of the set first (no new rebuild picks them), then unlinked,
    /// then the directory synced.
    pub(crate) fn delete_snapshots(&self, atoms: &[u64]) -> Result<()> {
        if atoms.is_empty() {
            return Ok(());
        }
        {
            let mut snapshots = self.shared.snapshots.lock();
            for atom in atoms {
                snapshots.remove(atom);
            }
        }
        let storage = self.shared.log.storage().as_ref();
        for atom in atoms {
            let path = snapshot::path(self.shared.log.dir(), *atom);
            match storage.remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io("remove", path, e)),
            }
        }
        self.shared.sync_snapshot_dir(true)
    }

    /// Pins `atom` (or unpins it): while pinned, retention and compaction keep everything its
    /// context needs (it can always be rebuilt, and branched from), and its snapshot, if it
    /// has one, is never pruned. Durable when this returns. Waits for a compaction round or an
    /// index snapshot in progress to finish.
    ///
    /// # Errors
    /// [`Error::UnknownAtom`], [`Error::HistoryReclaimed`] when pinning an atom whose context
    /// can no longer be rebuilt, the rebuild's other errors, and the log's append errors.
    pub fn pin(&self, atom: AtomId, pinned: bool) -> Result<()> {
        // No round may plan without this pin, or release what the checks below rely on.
        let _purge = self.shared.purge.lock();
        if pinned {
            let gone = self.shared.index.read().atom(atom).is_some_and(|entry| self.history_gone(entry, atom));
            if gone {
                return Err(Error::HistoryReclaimed { atom: atom.0, reclaimed: atom.0 });
            }
            self.rebuild_context(atom)?;
        }
        let mut index = self.shared.index.write();
        index.atom(atom).filter(|e| e.state.status().is_some()).ok_or(Error::UnknownAtom { atom: atom.0 })?;
        let record = StoreRecord::AtomPinned(proto::AtomPinned { atom: atom.0, pinned, at_unix_us: now_us() });
        if pinned {
            self.append(&record, Durability::Sync)?;
        } else {
            self.append_reserved(&record)?;
        }
        if let Some(entry) = index.atom_mut(atom) {
            entry.pinned = pinned;
        }
        Ok(())
    }

    /// Drops every finished run that ended more than the retention age ago (never the topics
    /// run, [`TOPICS_RUN`](crate::channel::TOPICS_RUN)): a durable
    /// `RunDropped` record first (after a crash the run stays dropped), then its snapshots.
    /// Compaction removes its records. Returns the dropped runs.
    pub(crate) fn drop_expired_runs(&self) -> Result<Vec<RunId>> {
        let Some(age) = self.shared.policies.retention.finished_run_age else { return Ok(Vec::new()) };
        let cutoff = now_us().saturating_sub(u64::try_from(age.as_micros()).unwrap_or(u64::MAX));
        let expired: Vec<RunId> = {
            let index = self.shared.index.read();
            (1..=index.runs.len() as u64)
                .map(RunId)
                .filter(|run| {
                    index.run(*run).is_some_and(|entry| {
                        matches!(entry.status, RunStatus::Finished { .. }) && entry.ended_at_unix_us <= cutoff
                    })
                })
                // The topics run is store-wide: its consumers are atoms of other runs, so it
                // never ends for them; its messages go one by one (`purge/messages.rs`).
                .filter(|run| index.run_names.get(crate::channel::TOPICS_RUN) != u32::try_from(run.0).ok().as_ref())
                .collect()
        };
        for run in &expired {
            self.drop_run(*run)?;
        }
        if !expired.is_empty() {
            self.shared.index.write().forget_vacant_keys();
        }
        Ok(expired)
    }

    /// Drops one finished run.
    fn drop_run(&self, run: RunId) -> Result<()> {
        let mut index = self.shared.index.write();
        let next_atom = index.atoms.len() as u64 + 1;
        let record = StoreRecord::RunDropped(proto::RunDropped { run: run.0, next_atom, dropped_at_unix_us: now_us() });
        // IMPORTANT: durable before anything of the run is deleted, so that no crash brings
        // back a run whose snapshots are gone.
        self.append_reserved(&record)?;
        let snapshots: Vec<u64> = {
            let snapshots = self.shared.snapshots.lock();
            snapshots
                .iter()
                .filter(|id| index.atom(AtomId(**id)).is_some_and(|e| u64::from(e.run) == run.0))
                .copied()
                .collect()
        };
        index.drop_run(run, next_atom);
        drop(index);
        tracing::info!(run = run.get(), snapshots = snapshots.len(), "retention dropped a finished run");
        self.delete_snapshots(&snapshots)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::store::types::RunId;
    use crate::{AtomOutput, RunSpec, SnapshotPolicy, Store};

    fn store(dir: &std::path::Path, background: bool) -> Store {
        let policy = SnapshotPolicy { every_atoms: 10, every: Duration::ZERO };
        Store::builder(dir).snapshot_policy(policy).background(background).open().expect("open")
    }

    /// Records `count` more atoms of `agent` in `run`, each the child of the one before; returns
    /// them.
    fn record(store: &Store, run: RunId, agent: &str, count: usize) -> Vec<crate::AtomId> {
        let mut atoms: Vec<crate::AtomId> = Vec::new();
        let before = store.agent_atoms(run, agent).len();
        for i in before..before + count {
            let parents: Vec<_> = store.last_agent_atom(run, agent).into_iter().collect();
            let key = format!("{agent}-{i}");
            atoms.push(store.record_atom(run, agent, &key, &parents, "", &AtomOutput::default()).expect("record"));
        }
        atoms
    }

    #[test]
    fn only_agents_half_way_are_taken_and_a_skipped_one_waits_for_the_next_round() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = store(dir.path(), false);
        let run = store.create_run(RunSpec::new("r")).expect("run");
        record(&store, run, "early", 4);
        let half = record(&store, run, "half", 5);
        let skipped = record(&store, run, "skipped", 7);
        let id = |name: &str| store.shared.index.read().agent_id(1, name).expect("agent");
        // Without a background thread nothing is listed (nothing would ever take them).
        assert!(store.shared.snapshot_clock.lock().half_way.is_empty());
        store.shared.snapshot_clock.lock().half_way.extend([id("early"), id("half"), id("skipped")]);
        let taken = store.take_half_due(|agent| agent == id("skipped"));
        assert_eq!(taken, vec![(id("half"), half[4])]);
        assert_eq!(store.shared.snapshot_clock.lock().half_way, vec![id("skipped")]);
        // Taken, its clock started again: it is not half way any more.
        store.shared.snapshot_clock.lock().half_way.push(id("half"));
        let taken = store.take_half_due(|_| false);
        assert_eq!(taken, vec![(id("skipped"), skipped[6])]);
        assert!(store.shared.snapshot_clock.lock().half_way.is_empty());
    }

    #[test]
    fn with_a_background_thread_an_agent_is_listed_once_each_time_it_reaches_half_way() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = store(dir.path(), true);
        let run = store.create_run(RunSpec::new("r")).expect("run");
        record(&store, run, "a", 4);
        assert!(store.shared.snapshot_clock.lock().half_way.is_empty());
        record(&store, run, "a", 1);
        assert_eq!(store.shared.snapshot_clock.lock().half_way.len(), 1);
        record(&store, run, "a", 3);
        assert_eq!(store.shared.snapshot_clock.lock().half_way.len(), 1, "listed when it reaches half way, not after");
    }
}
