//! The atom protocol: begin, complete, fail, execute, reads, and resume.

use std::sync::atomic::Ordering;

use prost::Message;

use crate::codec::proto;
use crate::codec::{self, StartParts, StoreRecord};
use crate::config::Durability;
use crate::error::{Error, Result};
use crate::limits;
use crate::log::{BatchBuilder, Lsn};
use crate::store::Codec;
use crate::store::index::{AtomEntry, EntryState, StoreIndex};
use crate::store::types::{
    AgentResume, Atom, AtomFailure, AtomId, AtomOutput, AtomStatus, Executed, ResumeReport, RunId, RunStatus,
};
use crate::store::{SnapshotPolicy, Store, now_us, unknown_run};

/// Room a dictionary record needs in a segment besides the dictionary itself: the segment
/// header, the frame header and record length, the envelope and the protobuf fields, rounded up.
const DICTIONARY_RECORD_SLACK: u64 = 1024;

/// The size of the final dictionary for segments of `segment_bytes`: `DICTIONARY_BYTES`, or
/// less when a record that large would not fit in one segment before its reserve (it could
/// never be written, and the store would silently keep compressing with the first, smaller
/// dictionary).
pub(crate) fn final_dictionary_bytes(segment_bytes: u64) -> usize {
    let room = segment_bytes.saturating_sub(limits::segment_reserve_bytes(segment_bytes));
    let fits = usize::try_from(room.saturating_sub(DICTIONARY_RECORD_SLACK)).unwrap_or(usize::MAX);
    limits::DICTIONARY_BYTES.min(fits)
}

/// The size of the first dictionary: `DICTIONARY_FIRST_BYTES`, at most half the final one's.
pub(crate) fn first_dictionary_bytes(segment_bytes: u64) -> usize {
    limits::DICTIONARY_FIRST_BYTES.min(final_dictionary_bytes(segment_bytes) / 2)
}

/// Samples of encoded deltas kept until the store's compression dictionary is trained.
pub(crate) struct Training {
    samples: Vec<Vec<u8>>,
    bytes: usize,
    stage: TrainingStage,
    /// Samples handed to the background thread, with the dictionary size to train from them.
    pending: Option<(Vec<Vec<u8>>, usize)>,
}

/// Which dictionary a store trains next: a small first one after
/// `DICTIONARY_FIRST_SAMPLES` records, then the final one after `DICTIONARY_TRAINING_SAMPLES`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TrainingStage {
    First,
    Final,
    Done,
}

impl Training {
    pub fn new(stage: TrainingStage) -> Self {
        Self { samples: Vec::new(), bytes: 0, stage, pending: None }
    }

    /// Nothing left to train (the final dictionary exists, or the store is read-only).
    pub fn done() -> Self {
        Self::new(TrainingStage::Done)
    }

    /// Whether nothing is left to sample.
    pub fn is_done(&self) -> bool {
        self.stage == TrainingStage::Done
    }
}

/// Bytes of a completion record beyond its delta and result (envelope, field headers, the
/// atom and the time), with the length prefixes of a start and completion in a batch: what
/// [`Store::record`] sizes its batch with, so that it seldom grows.
const RECORD_OVERHEAD_GUESS: usize = 64;

impl Store {
    /// Records that `agent` of `run` starts the atom it calls `key`, depending on `parents`.
    /// The start is ordered in the log but made durable by the atom's completion (or by any
    /// later sync), not on its own.
    ///
    /// The id returned names the atom in this process at once, and across a crash only once
    /// the start is durable (the atom's completion or failure returned, or [`Store::sync`]):
    /// a crash before that takes the start back, and the next process may give the id to
    /// another atom. What names a step across processes is its key (with its branch:
    /// [`Store::atom_by_key_on`]). `idempotency_key` is the caller's label for the atom (a
    /// framework's own checkpoint id, say), stored with it and returned by [`Store::atom`];
    /// the store does not enforce it: the identity it enforces is (run, agent, key) on the
    /// branch of `parents` ([`Error::AtomExists`]).
    ///
    /// # Errors
    /// [`Error::UnknownRun`], [`Error::RunFinished`], [`Error::InvalidParent`],
    /// [`Error::AtomExists`], [`Error::KeyCollision`], and the log's append errors. A refused
    /// transition leaves the log untouched.
    pub fn begin_atom(
        &self,
        run: RunId,
        agent: &str,
        key: &str,
        parents: &[AtomId],
        idempotency_key: &str,
    ) -> Result<AtomId> {
        let (atom, run32, record, _) = self.reserve_and_encode_start(run, agent, key, parents, idempotency_key)?;
        let appended = self.shared.log.append_with(&record, Durability::None);
        let mut index = self.shared.index.write();
        match appended {
            Ok(lsn) => {
                let entry = index.atom_slot(atom);
                entry.started_lsn = lsn.get();
                entry.state = EntryState::Running;
                Ok(atom)
            }
            Err(error) => {
                release_reservation(&mut index, atom, run32, agent, key);
                Err(error)
            }
        }
    }

    /// Records an atom that has already run: its start and its completion with `output`, in
    /// one batch that is durable on return (unless the store was opened with a weaker
    /// [`StoreBuilder::atom_durability`](crate::StoreBuilder::atom_durability)). This is what a framework's checkpointer does when
    /// it persists a step after running it; an agent that must survive a crash *during* the
    /// step uses [`Store::begin_atom`] before it and [`Store::complete_atom`] after it (or
    /// [`Store::execute`]).
    ///
    /// Either both records are in the log or neither is: a crash before this returns leaves no
    /// trace of the atom, so its step runs again on resume, and a step whose output was used
    /// after this returned never does. One `fdatasync` (shared with concurrent writers)
    /// instead of the two records' separate appends. Recording a step again (the same run,
    /// agent and key on the same branch) returns [`Error::AtomExists`] with the recorded atom;
    /// `idempotency_key` is stored, not enforced (see [`Store::begin_atom`]).
    ///
    /// # Errors
    /// As [`Store::begin_atom`]. A refused atom leaves the log untouched.
    ///
    /// # Example
    /// ```
    /// # fn main() -> continuum::Result<()> {
    /// use continuum::{AtomOutput, Delta, RunSpec, Store};
    /// let dir = tempfile::tempdir().unwrap();
    /// let store = Store::open(dir.path())?;
    /// let run = store.create_run(RunSpec::new("pipeline"))?;
    /// let output = AtomOutput { delta: Delta::default(), result: b"done".to_vec() };
    /// let step = store.record_atom(run, "planner", "step-1", &[], "", &output)?;
    /// assert_eq!(store.atom(step)?.output, Some(output));
    /// # Ok(())
    /// # }
    /// ```
    pub fn record_atom(
        &self,
        run: RunId,
        agent: &str,
        key: &str,
        parents: &[AtomId],
        idempotency_key: &str,
        output: &AtomOutput,
    ) -> Result<AtomId> {
        let (delta, result) = (&output.delta, output.result.as_slice());
        self.record(
            run,
            (agent, key, parents, idempotency_key),
            || delta.encode_to_vec(),
            result.len(),
            |codec, out, atom, now| codec.put_completion(out, atom, delta, result, now),
        )
    }

    /// [`Store::record_atom`] with the delta already encoded: `delta` is the protobuf encoding
    /// of a [`Delta`](crate::Delta) (what a binding or a framework that serializes its own
    /// checkpoints hands over), stored as it is, not decoded and encoded again. It is checked
    /// first, in place: bytes that are not a `Delta` prost decodes are refused, so that every
    /// stored atom replays.
    ///
    /// ```
    /// # fn main() -> continuum::Result<()> {
    /// use continuum::{AtomOutput, Delta, RunSpec, Store};
    /// use prost::Message;
    /// let dir = tempfile::tempdir().unwrap();
    /// let store = Store::open(dir.path())?;
    /// let run = store.create_run(RunSpec::new("pipeline"))?;
    /// let delta = Delta { drop_oldest_messages: 2, ..Delta::default() };
    /// let step = store.record_atom_encoded(run, "planner", "step-1", &[], "", &delta.encode_to_vec(), b"done")?;
    /// assert_eq!(store.atom(step)?.output, Some(AtomOutput { delta, result: b"done".to_vec() }));
    /// assert!(store.record_atom_encoded(run, "planner", "step-2", &[step], "", b"\xff", b"").is_err());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidDelta`] (nothing is recorded), and as [`Store::record_atom`].
    #[allow(clippy::too_many_arguments)]
    pub fn record_atom_encoded(
        &self,
        run: RunId,
        agent: &str,
        key: &str,
        parents: &[AtomId],
        idempotency_key: &str,
        delta: &[u8],
        result: &[u8],
    ) -> Result<AtomId> {
        check_delta(delta)?;
        self.record(
            run,
            (agent, key, parents, idempotency_key),
            || delta.to_vec(),
            delta.len() + result.len(),
            |codec, out, atom, now| codec.put_completion_bytes(out, atom, delta, result, now),
        )
    }

    /// Records an atom that has run (`record_atom`): reserves it, samples its delta (`sample`
    /// encodes it) for dictionary training, and appends its start and its completion
    /// (`completion` writes it, given the atom and the time; about `completion_bytes` of
    /// delta and result) as one batch, both records encoded straight into the batch's frame.
    fn record(
        &self,
        run: RunId,
        (agent, key, parents, idempotency_key): (&str, &str, &[AtomId], &str),
        sample: impl FnOnce() -> Vec<u8>,
        completion_bytes: usize,
        completion: impl FnOnce(&Codec, &mut Vec<u8>, u64, u64),
    ) -> Result<AtomId> {
        let (atom, run32) = self.reserve_atom(run, agent, key, parents)?;
        let now = now_us();
        let start =
            StartParts { atom: atom.0, run: run.0, agent, key, parents, idempotency_key, started_at_unix_us: now };
        let codec = &self.shared.codec;
        // IMPORTANT: with the default `Sync`, both records are durable before return.
        let appended = (|| {
            let mut batch = BatchBuilder::with_capacity(start.len_guess() + RECORD_OVERHEAD_GUESS + completion_bytes);
            batch.push_with(|out| codec.put_start(out, &start))?;
            // Sampled before encoding, as `complete_atom` does: a dictionary trained here is
            // appended before the records it compresses.
            self.sample_for_dictionary(sample);
            batch.push_with(|out| completion(codec, out, atom.0, now))?;
            self.shared.log.append_built(batch, self.shared.policies.atom_durability)
        })();
        let mut index = self.shared.index.write();
        match appended {
            Ok(lsns) => {
                let entry = index.atom_slot(atom);
                entry.started_lsn = lsns.first().get();
                entry.ended_lsn = lsns.first().get() + 1;
                entry.state = EntryState::Completed;
                let agent = entry.agent;
                let own = index.run(run).and_then(|run| run.snapshot_policy);
                drop(index);
                self.after_completion(atom, agent, own.unwrap_or(self.shared.policies.snapshot));
                Ok(atom)
            }
            Err(error) => {
                release_reservation(&mut index, atom, run32, agent, key);
                Err(error)
            }
        }
    }

    /// Reserves a new atom ([`Store::reserve_atom`]) and encodes its start record, stamped now:
    /// the atom, its run's 32-bit id, the record and the time (Unix microseconds).
    fn reserve_and_encode_start(
        &self,
        run: RunId,
        agent: &str,
        key: &str,
        parents: &[AtomId],
        idempotency_key: &str,
    ) -> Result<(AtomId, u32, Vec<u8>, u64)> {
        let (atom, run32) = self.reserve_atom(run, agent, key, parents)?;
        let started_at_unix_us = now_us();
        let record = self.shared.codec.encode_start(&StartParts {
            atom: atom.0,
            run: run.0,
            agent,
            key,
            parents,
            idempotency_key,
            started_at_unix_us,
        });
        Ok((atom, run32, record, started_at_unix_us))
    }

    /// Validates a new atom and reserves its id and key, so that no other thread can take them.
    fn reserve_atom(&self, run: RunId, agent: &str, key: &str, parents: &[AtomId]) -> Result<(AtomId, u32)> {
        let mut index = self.shared.index.write();
        let run_entry = index.run(run).ok_or_else(|| unknown_run(run))?;
        if run_entry.status != RunStatus::Running {
            return Err(Error::RunFinished { run: run.0 });
        }
        let run32 = u32::try_from(run.0).map_err(|_| unknown_run(run))?;
        for parent in parents {
            check_parent(&index, run32, *parent)?;
            if index.atom(*parent).is_some_and(|entry| self.history_gone(entry, *parent)) {
                return Err(Error::InvalidParent {
                    parent: parent.0,
                    reason: "its history was reclaimed by retention",
                });
            }
        }
        // One lookup of the agent and one of the key's hash serve both the check and the
        // reservation. The key is taken only on the branch of `parents` (see `atom_on_branch`).
        let agent_id = index.agent_id(run32, agent);
        let hash = agent_id.map(|agent_id| index.identity.atom_key(run32, agent_id, key));
        if let Some(agent_id) = agent_id
            && let Some(existing) = self.atom_on_branch(&index, (run32, agent_id), agent, key, Some(parents))?
        {
            return Err(Error::AtomExists { atom: existing.0 });
        }
        let agent_id = agent_id.unwrap_or_else(|| index.intern_agent(run32, agent));
        let hash = hash.unwrap_or_else(|| index.identity.atom_key(run32, agent_id, key));
        let atom = AtomId(index.atoms.len() as u64 + 1);
        let id = u32::try_from(atom.0).map_err(|_| Error::KeyCollision { key: key.to_owned() })?;
        index.atom_keys.insert(hash, id);
        *index.atom_slot(atom) = AtomEntry::new(0, run32, agent_id, EntryState::Starting);
        index.note_run_atom(run32, id);
        Ok((atom, run32))
    }

    /// Whether nothing can continue from `atom` (whose index entry is `entry`): a compaction
    /// round released it (no rebuild can reach it: `purge/plan.rs`), or reclaimed its delta and it
    /// has no snapshot. It cannot be a parent, a rollback's target or pinned.
    pub(crate) fn history_gone(&self, entry: &AtomEntry, atom: AtomId) -> bool {
        entry.released || (entry.reclaimed && !self.shared.snapshots.lock().contains(&atom.0))
    }

    /// The atom of (run, agent, key), confirmed against its start record: with `parents`,
    /// the one on their branch ([`Store::atom_on_branch`]); without, the newest that no rollback
    /// abandoned.
    fn find_atom(
        &self,
        index: &StoreIndex,
        run: u32,
        (agent, key): (&str, &str),
        parents: Option<&[AtomId]>,
    ) -> Result<Option<AtomId>> {
        let Some(agent_id) = index.agent_id(run, agent) else { return Ok(None) };
        self.atom_on_branch(index, (run, agent_id), agent, key, parents)
    }

    /// The atom `agent` of `run` calls `key` on the branch of `parents`: the newest that no
    /// rollback abandoned and that either has the same set of parents or is an ancestor of one
    /// of them (a step the agent runs again after moving past it); `None` for `parents`: the
    /// newest not abandoned, on any branch. A key names a step at one place of the agent's graph, so a fork
    /// re-running a step gets an atom of its own, and each branch finds its own
    /// (`docs/ARCHITECTURE.md`, "Keys and branches").
    ///
    /// The index maps a key's hash to its newest atom. Only when that one is abandoned or on
    /// another branch are older ones looked for: among the agent's atoms newer than every
    /// parent (a child's id is above its parents'), then among the parents' ancestors, each
    /// read from its start record.
    ///
    /// # Errors
    /// [`Error::KeyCollision`] when the hash's newest atom has another key; read errors.
    fn atom_on_branch(
        &self,
        index: &StoreIndex,
        (run, agent_id): (u32, u32),
        agent: &str,
        key: &str,
        parents: Option<&[AtomId]>,
    ) -> Result<Option<AtomId>> {
        let hash = index.identity.atom_key(run, agent_id, key);
        let Some(&id) = index.atom_keys.get(&hash) else { return Ok(None) };
        let holder = AtomId(u64::from(id));
        let Some(entry) = index.atom(holder) else { return Ok(None) };
        if !entry.abandoned {
            match self.key_match(entry, agent, key, parents)? {
                KeyMatch::Same => return Ok(Some(holder)),
                KeyMatch::OtherKey => return Err(Error::KeyCollision { key: key.to_owned() }),
                KeyMatch::OtherBranch if self.is_ancestor(index, holder, parents.unwrap_or_default())? => {
                    return Ok(Some(holder));
                }
                KeyMatch::OtherBranch => {}
            }
        }
        let newer_than = parents.map_or(0, |parents| parents.iter().map(|parent| parent.0).max().unwrap_or(0));
        let candidates: Vec<(AtomId, AtomEntry)> = index
            .run_atoms(RunId(u64::from(run)))
            .filter(|(atom, entry)| atom.0 > newer_than && *atom != holder && entry.agent == agent_id)
            .filter(|(_, entry)| !entry.abandoned)
            .map(|(atom, entry)| (atom, *entry))
            .collect();
        for (atom, entry) in candidates.into_iter().rev() {
            if self.key_match(&entry, agent, key, parents)? == KeyMatch::Same {
                return Ok(Some(atom));
            }
        }
        match parents {
            Some(parents) => self.ancestor_with_key(index, agent, key, parents),
            None => Ok(None),
        }
    }

    /// Whether `ancestor` is an ancestor of one of `of`: a walk up from them through the
    /// atoms newer than `ancestor` only.
    fn is_ancestor(&self, index: &StoreIndex, ancestor: AtomId, of: &[AtomId]) -> Result<bool> {
        let mut found = false;
        self.walk_ancestors(index, of, ancestor.0, |atom, _| {
            found |= atom == ancestor;
            found
        })?;
        Ok(found)
    }

    /// The newest ancestor of `parents` (they included) that `agent` calls `key` and no rollback
    /// abandoned.
    fn ancestor_with_key(
        &self,
        index: &StoreIndex,
        agent: &str,
        key: &str,
        parents: &[AtomId],
    ) -> Result<Option<AtomId>> {
        let mut found: Option<AtomId> = None;
        self.walk_ancestors(index, parents, 0, |atom, started| {
            let entry_ok = index.atom(atom).is_some_and(|entry| !entry.abandoned);
            if entry_ok && started.key == key && started.agent == agent && found.is_none_or(|f| atom > f) {
                found = Some(atom);
            }
            false
        })?;
        Ok(found)
    }

    /// Calls `visit` with each atom of `from` and each of their ancestors whose id is at least
    /// `floor`, once, with its start record, until it returns `true`.
    fn walk_ancestors(
        &self,
        index: &StoreIndex,
        from: &[AtomId],
        floor: u64,
        mut visit: impl FnMut(AtomId, &proto::AtomStarted) -> bool,
    ) -> Result<()> {
        let mut seen = std::collections::HashSet::new();
        let mut stack: Vec<AtomId> = from.iter().copied().filter(|atom| atom.0 >= floor).collect();
        while let Some(atom) = stack.pop() {
            let Some(entry) = index.atom(atom).filter(|entry| entry.state.status().is_some()) else { continue };
            if !seen.insert(atom) {
                continue;
            }
            let StoreRecord::AtomStarted(started) = self.read_record(entry.started_lsn)? else {
                return Err(Error::InconsistentLog {
                    lsn: entry.started_lsn,
                    reason: "an atom's start is not a start record",
                });
            };
            if visit(atom, &started) {
                return Ok(());
            }
            // Parents are older than their children: ids below `floor` lead only further down.
            stack.extend(
                started.parents.iter().filter(|parent| **parent >= floor && **parent < atom.0).map(|p| AtomId(*p)),
            );
        }
        Ok(())
    }

    /// How the atom of `entry` stands to (`agent`, `key`, `parents`), read from its start
    /// record. An atom whose start is still being written is taken as the same (as a 64-bit
    /// hash of another key begun this very moment is not worth waiting for).
    fn key_match(&self, entry: &AtomEntry, agent: &str, key: &str, parents: Option<&[AtomId]>) -> Result<KeyMatch> {
        if entry.state == EntryState::Starting {
            return Ok(KeyMatch::Same);
        }
        let StoreRecord::AtomStarted(started) = self.read_record(entry.started_lsn)? else {
            return Err(Error::InconsistentLog {
                lsn: entry.started_lsn,
                reason: "an atom's start is not a start record",
            });
        };
        if started.key != key || started.agent != agent {
            return Ok(KeyMatch::OtherKey);
        }
        match parents {
            Some(parents) if !same_parents(&started.parents, parents) => Ok(KeyMatch::OtherBranch),
            _ => Ok(KeyMatch::Same),
        }
    }

    /// The atom `agent` of `run` calls `key` on the branch of `parents`, if it was begun: the
    /// atom [`Store::execute`] with these parents would answer with (the newest not abandoned
    /// whose parents are the same set, or that is an ancestor of one of them; see
    /// `docs/ARCHITECTURE.md`, "Keys and branches").
    ///
    /// # Errors
    /// Read errors of the log.
    pub fn atom_by_key_on(&self, run: RunId, agent: &str, key: &str, parents: &[AtomId]) -> Result<Option<AtomId>> {
        let index = self.shared.index.read();
        let Ok(run32) = u32::try_from(run.0) else { return Ok(None) };
        self.find_atom(&index, run32, (agent, key), Some(parents))
    }

    /// The newest atom `agent` of `run` calls `key` that no rollback abandoned, on any branch
    /// (after a fork two atoms may hold the key; [`Store::atom_by_key_on`] tells them apart).
    ///
    /// # Errors
    /// Read errors of the log.
    pub fn atom_by_key(&self, run: RunId, agent: &str, key: &str) -> Result<Option<AtomId>> {
        let index = self.shared.index.read();
        let Ok(run32) = u32::try_from(run.0) else { return Ok(None) };
        self.find_atom(&index, run32, (agent, key), None)
    }

    /// Records that `atom` completed with `output`; returns once that is durable (or as
    /// [`StoreBuilder::atom_durability`](crate::StoreBuilder::atom_durability) says).
    ///
    /// # Errors
    /// [`Error::UnknownAtom`], [`Error::InvalidTransition`] (completing twice, or a failed
    /// atom that is not retryable), and the log's append errors.
    pub fn complete_atom(&self, atom: AtomId, output: &AtomOutput) -> Result<()> {
        self.sample_for_dictionary(|| output.delta.encode_to_vec());
        let bytes = self.shared.codec.encode_completion(atom.0, &output.delta, &output.result, now_us());
        let (agent, policy) = self.finish_atom(atom, &bytes, "completed", EntryState::Completed)?;
        self.after_completion(atom, agent, policy);
        Ok(())
    }

    /// [`Store::complete_atom`] with the delta already encoded (see
    /// [`Store::record_atom_encoded`]).
    ///
    /// # Errors
    /// [`Error::InvalidDelta`] (the atom stays as it was), and as [`Store::complete_atom`].
    pub fn complete_atom_encoded(&self, atom: AtomId, delta: &[u8], result: &[u8]) -> Result<()> {
        check_delta(delta)?;
        self.sample_for_dictionary(|| delta.to_vec());
        let bytes = self.shared.codec.encode_completion_bytes(atom.0, delta, result, now_us());
        let (agent, policy) = self.finish_atom(atom, &bytes, "completed", EntryState::Completed)?;
        self.after_completion(atom, agent, policy);
        Ok(())
    }

    /// Records that `atom` failed; returns once that is durable (or as
    /// [`StoreBuilder::atom_durability`](crate::StoreBuilder::atom_durability) says).
    ///
    /// # Errors
    /// As [`Store::complete_atom`].
    pub fn fail_atom(&self, atom: AtomId, failure: &AtomFailure) -> Result<()> {
        let record = StoreRecord::AtomFailed(proto::AtomFailed {
            atom: atom.0,
            error: failure.message.clone(),
            retryable: failure.retryable,
            ended_at_unix_us: now_us(),
        });
        let state = if failure.retryable { EntryState::FailedRetryable } else { EntryState::Failed };
        self.finish_atom(atom, &self.shared.codec.encode(&record), "failed", state).map(|_| ())
    }

    /// Appends an encoded end record for `atom`, guarding the transition. Returns the atom's
    /// agent and the snapshot policy of its run (read under the lock taken anyway).
    fn finish_atom(
        &self,
        atom: AtomId,
        record: &[u8],
        to: &'static str,
        state: EntryState,
    ) -> Result<(u32, SnapshotPolicy)> {
        let previous = {
            let mut index = self.shared.index.write();
            let entry = index.atom_mut(atom).ok_or(Error::UnknownAtom { atom: atom.0 })?;
            if entry.abandoned {
                return Err(Error::InvalidTransition { atom: atom.0, from: "abandoned", to });
            }
            if !entry.state.can_finish() {
                return Err(Error::InvalidTransition { atom: atom.0, from: state_name(entry.state), to });
            }
            std::mem::replace(&mut entry.state, EntryState::Finishing)
        };
        // IMPORTANT: with the default `Sync`, this record and the atom's start record are
        // durable before return.
        let appended = self.shared.log.append_with(record, self.shared.policies.atom_durability);
        let mut index = self.shared.index.write();
        let entry = index.atom_slot(atom);
        match appended {
            Ok(lsn) => {
                entry.ended_lsn = lsn.get();
                entry.state = state;
                let (agent, run) = (entry.agent, RunId(u64::from(entry.run)));
                let own = index.run(run).and_then(|run| run.snapshot_policy);
                Ok((agent, own.unwrap_or(self.shared.policies.snapshot)))
            }
            Err(error) => {
                entry.state = previous;
                Err(error)
            }
        }
    }

    /// Runs one atom exactly once across crashes. If the atom (`agent` of `run`, called `key`,
    /// on the branch of `parents`: see [`Store::atom_by_key_on`]) already completed, returns its
    /// recorded output without calling `work`. Otherwise records
    /// it as running, calls `work`, records the completion (or failure) durably, and only then
    /// returns the output. With a buffered [`StoreBuilder::atom_durability`](crate::StoreBuilder::atom_durability),
    /// a power loss soon after may take the completion back, and the atom runs again (its
    /// guarded effects do not).
    ///
    /// One (run, agent, key) must not be executed by two threads at once.
    ///
    /// # Errors
    /// [`Error::AtomFailed`] when `work` fails, or failed for good before;
    /// [`Error::OutputNotRecorded`] when `work` succeeded and its completion was not recorded
    /// (the error holds the output and the completion's error); the errors of
    /// [`Store::begin_atom`] and [`Store::fail_atom`].
    pub fn execute(
        &self,
        run: RunId,
        agent: &str,
        key: &str,
        parents: &[AtomId],
        work: impl FnOnce(AtomId) -> std::result::Result<AtomOutput, AtomFailure>,
    ) -> Result<Executed> {
        let found = {
            let index = self.shared.index.read();
            let run32 = u32::try_from(run.0).map_err(|_| unknown_run(run))?;
            self.find_atom(&index, run32, (agent, key), Some(parents))?
        };
        let atom = match found {
            Some(atom) => match self.replay(atom)? {
                Some(executed) => {
                    self.shared.log.metrics_handle().record_atom_skipped();
                    return Ok(executed);
                }
                None => atom,
            },
            None => self.begin_atom(run, agent, key, parents, "")?,
        };
        match work(atom) {
            Ok(output) => match self.complete_atom(atom, &output) {
                Ok(()) => Ok(Executed { atom, output, replayed: false, delta_reclaimed: false }),
                // The work is done: its output goes back to the caller with the error.
                Err(source) => {
                    Err(Error::OutputNotRecorded { atom: atom.0, output: Box::new(output), source: Box::new(source) })
                }
            },
            Err(failure) => {
                self.fail_atom(atom, &failure)?;
                Err(Error::AtomFailed { atom: atom.0, message: failure.message, retryable: failure.retryable })
            }
        }
    }

    /// The recorded outcome of an existing atom: `Some` if it must not run again.
    fn replay(&self, atom: AtomId) -> Result<Option<Executed>> {
        let found = self.atom(atom)?;
        match found.status {
            AtomStatus::Completed => {
                let output = found.output.ok_or(Error::InconsistentLog {
                    lsn: found.started_lsn.get(),
                    reason: "completed atom without output",
                })?;
                Ok(Some(Executed { atom, output, replayed: true, delta_reclaimed: found.delta_reclaimed }))
            }
            AtomStatus::Failed { retryable: false } => {
                Err(Error::AtomFailed { atom: atom.0, message: found.error.unwrap_or_default(), retryable: false })
            }
            AtomStatus::Running | AtomStatus::Failed { retryable: true } => Ok(None),
        }
    }

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
    /// it resumes from, or what a checkpointer's "latest checkpoint of this thread" asks for.
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
        let status = index.run(run).ok_or_else(|| unknown_run(run))?.status.clone();
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

    /// Keeps encoded deltas until enough are seen, then has a dictionary trained and written
    /// to the log before any record uses it: a small one early, the final one later (records
    /// keep naming the dictionary they were compressed with, so both stay readable). Training
    /// takes tens of milliseconds, so a store with a background thread hands the samples to
    /// it instead of making one atom's completion wait (see `docs/ARCHITECTURE.md`, "Codec").
    fn sample_for_dictionary(&self, sample: impl FnOnce() -> Vec<u8>) {
        if self.shared.training_done.load(Ordering::Acquire) {
            return;
        }
        let (samples, bytes) = {
            let mut training = self.shared.training.lock();
            let segment_bytes = self.shared.log.config().segment_bytes;
            let (wanted, bytes) = match training.stage {
                TrainingStage::First => (limits::DICTIONARY_FIRST_SAMPLES, first_dictionary_bytes(segment_bytes)),
                TrainingStage::Final => (limits::DICTIONARY_TRAINING_SAMPLES, final_dictionary_bytes(segment_bytes)),
                TrainingStage::Done => return,
            };
            let sample = sample();
            if training.bytes + sample.len() <= limits::DICTIONARY_TRAINING_BYTES_MAX {
                training.bytes += sample.len();
                training.samples.push(sample);
            }
            if training.samples.len() < wanted {
                return;
            }
            if training.stage == TrainingStage::First {
                // The final dictionary learns from these samples too.
                training.stage = TrainingStage::Final;
                (training.samples.clone(), bytes)
            } else {
                training.stage = TrainingStage::Done;
                self.shared.training_done.store(true, Ordering::Release);
                training.bytes = 0;
                (std::mem::take(&mut training.samples), bytes)
            }
        };
        match &self.worker {
            Some(worker) => {
                self.shared.training.lock().pending = Some((samples, bytes));
                worker.wake();
            }
            None => self.train_dictionary(&samples, bytes),
        }
    }

    /// Trains the dictionary whose samples were handed to the background thread, if any.
    pub(crate) fn train_pending_dictionary(&self) {
        let pending = self.shared.training.lock().pending.take();
        if let Some((samples, bytes)) = pending {
            self.train_dictionary(&samples, bytes);
        }
    }

    /// Trains a dictionary of at most `bytes` from `samples`, appends it durably, and only
    /// then lets records be compressed with it.
    fn train_dictionary(&self, samples: &[Vec<u8>], bytes: usize) {
        // Training failure (samples too alike or too few) only means no new dictionary:
        // records stay compressed with the one before, or without one.
        let Some(dictionary) = codec::train_dictionary(samples, bytes) else { return };
        let id = self.shared.index.read().next_dictionary;
        let record = StoreRecord::Dictionary(proto::CompressionDictionary { id, dictionary: dictionary.clone() });
        // IMPORTANT: the dictionary is durable before any record compressed with it exists.
        match self.append(&record, Durability::Sync) {
            Ok(_) => {
                self.shared.index.write().next_dictionary = id + 1;
                self.shared.codec.add_dictionary(id, &dictionary);
            }
            // Records go on without it (compressed with the one before, or plain, and smaller
            // at rest after cold compression). The next open trains again from the stage the
            // log's dictionaries show.
            Err(error) => {
                self.shared.log.metrics_handle().record_maintenance_failure();
                tracing::warn!(%error, id, "compression dictionary not written");
            }
        }
    }
}

impl Store {
    /// Rollback: abandons every atom of `agent` in `run` after `to` (in id order, whatever
    /// branch it is on, forks from `to` included), so that the agent continues from `to`. The
    /// abandoned atoms stay readable (time travel into the old branch works); their keys are
    /// free, so re-running those steps creates new atoms. Returns the abandoned atoms.
    ///
    /// # Errors
    /// [`Error::UnknownAtom`] if `to` is not an atom of that run and agent;
    /// [`Error::HistoryReclaimed`] if retention reclaimed `to`'s history and it has no snapshot
    /// (nothing could continue from it: it can no longer be a parent); the log's errors.
    pub fn rollback(&self, run: RunId, agent: &str, to: AtomId, reason: &str) -> Result<Vec<AtomId>> {
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

/// Frees the id and key [`Store::reserve_atom`] took for an atom whose start was not written.
fn release_reservation(index: &mut StoreIndex, atom: AtomId, run: u32, agent: &str, key: &str) {
    let agent_id = index.agent_id(run, agent).unwrap_or(0);
    let hash = index.identity.atom_key(run, agent_id, key);
    index.atom_keys.remove(&hash);
    index.atom_slot(atom).state = EntryState::Vacant;
}

fn check_parent(index: &StoreIndex, run: u32, parent: AtomId) -> Result<()> {
    let entry = index.atom(parent).ok_or(Error::InvalidParent { parent: parent.0, reason: "no such atom" })?;
    if entry.run != run {
        return Err(Error::InvalidParent { parent: parent.0, reason: "it belongs to another run" });
    }
    if entry.state == EntryState::Starting {
        return Err(Error::InvalidParent { parent: parent.0, reason: "its start is not yet recorded" });
    }
    if entry.abandoned {
        return Err(Error::InvalidParent { parent: parent.0, reason: "it was abandoned by a rollback" });
    }
    Ok(())
}

/// How an atom stands to a lookup by key ([`Store::atom_on_branch`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KeyMatch {
    /// The same key, agent and branch.
    Same,
    /// The same key and agent, other parents.
    OtherBranch,
    /// Another key or agent with the same hash.
    OtherKey,
}

/// Whether `recorded` (a start record's parents) and `wanted` are the same set of atoms.
fn same_parents(recorded: &[u64], wanted: &[AtomId]) -> bool {
    let mut recorded = recorded.to_vec();
    let mut wanted: Vec<u64> = wanted.iter().map(|atom| atom.0).collect();
    recorded.sort_unstable();
    recorded.dedup();
    wanted.sort_unstable();
    wanted.dedup();
    recorded == wanted
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

fn state_name(state: EntryState) -> &'static str {
    match state {
        EntryState::Vacant => "vacant",
        EntryState::Starting => "starting",
        EntryState::Running => "running",
        EntryState::Finishing => "finishing",
        EntryState::Completed => "completed",
        EntryState::Failed => "failed",
        EntryState::FailedRetryable => "failed (retryable)",
    }
}

/// Refuses bytes that are not an encoded `Delta` (see [`Store::record_atom_encoded`]).
fn check_delta(delta: &[u8]) -> Result<()> {
    if crate::codec::check_encoded_delta(delta) { Ok(()) } else { Err(Error::InvalidDelta { bytes: delta.len() }) }
}
