//! The atom protocol: begin, complete, fail, execute and record an atom.

use prost::Message;

use crate::codec::proto;
use crate::codec::{StartParts, StoreRecord};
use crate::config::Durability;
use crate::error::{Error, Result};
use crate::log::BatchBuilder;
use crate::store::Codec;
use crate::store::control::check_caller_agent;
use crate::store::index::{AtomEntry, EntryState, StoreIndex};
use crate::store::types::{AtomFailure, AtomId, AtomOutput, AtomStatus, Executed, RunId, RunStatus};
use crate::store::{SnapshotPolicy, Store, now_us, unknown_run};

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
    /// [`Error::UnknownRun`], [`Error::RunFinished`], [`Error::RunSuspended`],
    /// [`Error::InvalidParent`], [`Error::AtomExists`], [`Error::KeyCollision`],
    /// [`Error::LimitExceeded`] once the atom ids run out, [`Error::InvalidArgument`] for an
    /// agent name the store keeps for its own
    /// ([`CONTROL_AGENT_PREFIX`](crate::CONTROL_AGENT_PREFIX)), [`Error::Stopping`] once a stop
    /// was requested ([`Store::request_stop`]), and the log's append errors. A refused
    /// transition leaves the log untouched.
    pub fn begin_atom(
        &self,
        run: RunId,
        agent: &str,
        key: &str,
        parents: &[AtomId],
        idempotency_key: &str,
    ) -> Result<AtomId> {
        check_caller_agent(agent)?;
        let admission = self.shared.stop.admit(run)?;
        let (reservation, record, _) = self.reserve_and_encode_start(run, agent, key, parents, idempotency_key)?;
        self.append_start(&reservation, &record)?;
        admission.begun(reservation.atom);
        Ok(reservation.atom)
    }

    /// Appends the start `record` of the reserved atom (ordered, not synced on its own) and
    /// marks it running, or gives the reservation back if the append fails.
    pub(crate) fn append_start(&self, reservation: &Reservation, record: &[u8]) -> Result<()> {
        let appended = self.shared.log.append_with(record, Durability::None);
        let mut index = self.shared.index.write();
        match appended {
            Ok(lsn) => {
                let entry = index.atom_slot(reservation.atom);
                entry.started_lsn = lsn.get();
                entry.state = entry.state.transition(EntryState::Running);
                Ok(())
            }
            Err(error) => {
                release_reservation(&mut index, reservation);
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
        check_caller_agent(agent)?;
        let _admission = self.shared.stop.admit(run)?;
        self.record_unchecked(run, (agent, key, parents, idempotency_key), output)
    }

    /// [`Store::record_atom`] for any agent, the store's own included.
    pub(crate) fn record_unchecked(
        &self,
        run: RunId,
        (agent, key, parents, idempotency_key): (&str, &str, &[AtomId], &str),
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
        check_caller_agent(agent)?;
        check_delta(delta)?;
        let _admission = self.shared.stop.admit(run)?;
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
        // Held until the index update: no lease is granted on the run before the atom lands.
        let _fence = self.fence_record(run, agent)?;
        let reservation = self.reserve_atom(run, agent, key, parents)?;
        let atom = reservation.atom;
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
                entry.state = entry.state.transition(EntryState::Completed);
                let agent_id = entry.agent;
                let own = index.run(run).and_then(|run| run.snapshot_policy);
                drop(index);
                // The store's own agents have empty contexts: nothing to snapshot.
                if !crate::store::control::is_control_agent(agent) {
                    self.after_completion(atom, agent_id, own.unwrap_or(self.shared.policies.snapshot));
                }
                Ok(atom)
            }
            Err(error) => {
                release_reservation(&mut index, &reservation);
                Err(error)
            }
        }
    }

    /// Reserves a new atom ([`Store::reserve_atom`]) and encodes its start record, stamped now:
    /// the reservation, the record and the time (Unix microseconds).
    pub(crate) fn reserve_and_encode_start(
        &self,
        run: RunId,
        agent: &str,
        key: &str,
        parents: &[AtomId],
        idempotency_key: &str,
    ) -> Result<(Reservation, Vec<u8>, u64)> {
        let reservation = self.reserve_atom(run, agent, key, parents)?;
        let atom = reservation.atom;
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
        Ok((reservation, record, started_at_unix_us))
    }

    /// Validates a new atom and reserves its id and key, so that no other thread can take them.
    pub(super) fn reserve_atom(&self, run: RunId, agent: &str, key: &str, parents: &[AtomId]) -> Result<Reservation> {
        let mut index = self.shared.index.write();
        let run_entry = index.run(run).ok_or_else(|| unknown_run(run))?;
        if run_entry.status != RunStatus::Running {
            return Err(Error::RunFinished { run: run.0 });
        }
        if !crate::is_control_agent(agent)
            && let Some(suspended) = self.shared.continuations.read().runs.get(&run.0)
        {
            return Err(Error::RunSuspended { run: run.0, suspension: suspended.id.number });
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
        let id = u32::try_from(atom.0)
            .map_err(|_| Error::LimitExceeded { what: "atom ids".into(), limit: u64::from(u32::MAX) })?;
        assert!(index.atom(atom).is_none(), "a new atom id names no atom yet");
        let previous_holder = index.take_key(hash, id);
        *index.atom_slot(atom) = AtomEntry::new(0, run32, agent_id, EntryState::Starting);
        index.note_run_atom(run32, id);
        Ok(Reservation { atom, key_hash: hash, previous_holder })
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
        // Held until the index update: no lease is granted on the run before the end lands.
        let _fence = self.fence_end(atom)?;
        let previous = self.mark_finishing(atom, to)?;
        // IMPORTANT: with the default `Sync`, this record and the atom's start record are
        // durable before return.
        let appended = self.shared.log.append_with(record, self.shared.policies.atom_durability);
        let mut index = self.shared.index.write();
        let entry = index.atom_slot(atom);
        let finished = match appended {
            Ok(lsn) => {
                entry.ended_lsn = lsn.get();
                entry.state = entry.state.transition(state);
                let (agent, run) = (entry.agent, RunId(u64::from(entry.run)));
                let own = index.run(run).and_then(|run| run.snapshot_policy);
                Ok((agent, own.unwrap_or(self.shared.policies.snapshot)))
            }
            Err(error) => {
                entry.state = entry.state.transition(previous);
                Err(error)
            }
        };
        drop(index);
        // After the index has the end: a graceful stop that sees no atom in flight finds it.
        self.shared.stop.ended(atom);
        finished
    }

    /// Marks `atom` as finishing (going `to` completed or failed), guarding the transition;
    /// returns the state it had, which a failed append restores.
    pub(super) fn mark_finishing(&self, atom: AtomId, to: &'static str) -> Result<EntryState> {
        let mut index = self.shared.index.write();
        let entry = index.atom_mut(atom).ok_or(Error::UnknownAtom { atom: atom.0 })?;
        if entry.abandoned {
            return Err(Error::InvalidTransition { atom: atom.0, from: "abandoned", to });
        }
        if !entry.state.can_finish() {
            return Err(Error::InvalidTransition { atom: atom.0, from: state_name(entry.state), to });
        }
        let finishing = entry.state.transition(EntryState::Finishing);
        Ok(std::mem::replace(&mut entry.state, finishing))
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
    /// Once a stop was requested ([`Store::request_stop`]), an atom that would call `work` (a
    /// new one, or one left running or failed retryably) is refused with [`Error::Stopping`]
    /// and nothing is written; a completed one still returns its recorded output.
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
        check_caller_agent(agent)?;
        let found = {
            let index = self.shared.index.read();
            let run32 = u32::try_from(run.0).map_err(|_| unknown_run(run))?;
            self.find_atom(&index, run32, (agent, key), Some(parents))?
        };
        // An existing atom that runs again is in flight until this returns.
        let (atom, _admission) = match found {
            Some(atom) => match self.replay(atom)? {
                Some(executed) => {
                    self.shared.log.metrics_handle().record_atom_skipped();
                    return Ok(executed);
                }
                None => (atom, Some(self.shared.stop.admit(run)?)),
            },
            None => (self.begin_atom(run, agent, key, parents, "")?, None),
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
    pub(crate) fn replay(&self, atom: AtomId) -> Result<Option<Executed>> {
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
}

/// A new atom's id and key, taken by [`Store::reserve_atom`] until its start is written.
pub(crate) struct Reservation {
    pub(crate) atom: AtomId,
    /// The hash under which the index maps the key to its newest atom.
    key_hash: u64,
    /// The atom the key mapped to before (on another branch, or abandoned).
    previous_holder: Option<u32>,
}

/// Frees the id and key [`Store::reserve_atom`] took for an atom whose start was not written:
/// the key maps again to the atom it mapped to before, so that its branch still finds it
/// (unless another atom took the key since).
pub(crate) fn release_reservation(index: &mut StoreIndex, reservation: &Reservation) {
    let id = u32::try_from(reservation.atom.0).expect("a reserved id fits in 32 bits");
    index.give_key_back(reservation.key_hash, id, reservation.previous_holder);
    let entry = index.atom_slot(reservation.atom);
    entry.state = entry.state.transition(EntryState::Vacant);
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
