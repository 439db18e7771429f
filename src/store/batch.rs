//! The multi-atom batch: a caller's atom completion together with control atoms of the
//! store's own agents (a channel's messages, a consumer's offset), in one log batch, so that
//! after any crash either the completion and every one of its control atoms are in the log,
//! or none of them is.
//!
//! The control atoms' ids and keys are reserved with the caller's transition (as
//! [`Store::begin_atom`] reserves one atom's), released together if the append fails, and
//! applied to the index together after it succeeds.

use prost::Message;

use crate::codec::StartParts;
use crate::error::Result;
use crate::log::{BatchBuilder, LsnRange};
use crate::store::atoms::{Reservation, release_reservation};
use crate::store::index::{EntryState, StoreIndex};
use crate::store::types::{AtomId, AtomOutput, RunId};
use crate::store::{Store, is_control_agent, now_us};

/// A control atom to record with a caller's atom: an atom of `agent` (one of the store's own)
/// in `run`, called `key`, without parents, whose output is `result` with an empty delta.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ControlDraft {
    /// The run the control atom belongs to.
    pub run: RunId,
    /// Its agent, which starts with [`CONTROL_AGENT_PREFIX`](crate::CONTROL_AGENT_PREFIX).
    pub agent: String,
    /// Its key, unique for its agent.
    pub key: String,
    /// Its result bytes.
    pub result: Vec<u8>,
}

impl Store {
    /// Records that `atom` completed with `output`, and records `controls` in the same log
    /// batch: durable on return as [`Store::complete_atom`] is. Returns the control atoms' ids,
    /// in the order of `controls`. On error nothing is recorded: the atom is as it was before,
    /// and every reserved control id and key is free again.
    ///
    /// # Errors
    /// As [`Store::complete_atom`]; [`Error::AtomExists`](crate::Error::AtomExists) when a
    /// control atom's key is taken; [`Error::RecordTooLarge`](crate::Error::RecordTooLarge) or
    /// [`Error::BatchTooLarge`](crate::Error::BatchTooLarge) for a batch above the log's bounds.
    pub(crate) fn complete_atom_with(
        &self,
        atom: AtomId,
        output: &AtomOutput,
        controls: &[ControlDraft],
    ) -> Result<Vec<AtomId>> {
        assert!(controls.iter().all(|draft| is_control_agent(&draft.agent)), "control atoms are the store's own");
        // Held until the index update: no lease is granted on the run before the batch lands.
        let _fence = self.fence_end(atom)?;
        let previous = self.mark_finishing(atom, "completed")?;
        let reservations = match self.reserve_controls(controls) {
            Ok(reservations) => reservations,
            Err(error) => {
                let mut index = self.shared.index.write();
                let entry = index.atom_slot(atom);
                entry.state = entry.state.transition(previous);
                return Err(error);
            }
        };
        self.sample_for_dictionary(|| output.delta.encode_to_vec());
        // IMPORTANT: with the default `Sync`, the completion and every control atom are durable
        // before return, in one batch: all of them or none after a crash.
        let appended = self.append_completion_with(atom, output, controls, &reservations);
        let mut index = self.shared.index.write();
        match appended {
            Ok(lsns) => {
                let (agent, policy) = apply_completion_with(&mut index, atom, lsns, &reservations);
                let policy = policy.unwrap_or(self.shared.policies.snapshot);
                drop(index);
                self.after_completion(atom, agent, policy);
                Ok(reservations.iter().map(|reservation| reservation.atom).collect())
            }
            Err(error) => {
                for reservation in reservations.iter().rev() {
                    release_reservation(&mut index, reservation);
                }
                let entry = index.atom_slot(atom);
                entry.state = entry.state.transition(previous);
                Err(error)
            }
        }
    }

    /// Reserves every control atom of `controls`, or none: on a refusal the ones reserved
    /// before it are released.
    fn reserve_controls(&self, controls: &[ControlDraft]) -> Result<Vec<Reservation>> {
        let mut reservations = Vec::with_capacity(controls.len());
        for draft in controls {
            match self.reserve_atom(draft.run, &draft.agent, &draft.key, &[]) {
                Ok(reservation) => reservations.push(reservation),
                Err(error) => {
                    let mut index = self.shared.index.write();
                    for reservation in reservations.iter().rev() {
                        release_reservation(&mut index, reservation);
                    }
                    return Err(error);
                }
            }
        }
        Ok(reservations)
    }

    /// Appends `atom`'s completion, then each control atom's start and completion, as one
    /// batch: records at LSNs `first`, `first + 1 + 2i` and `first + 2 + 2i`.
    fn append_completion_with(
        &self,
        atom: AtomId,
        output: &AtomOutput,
        controls: &[ControlDraft],
        reservations: &[Reservation],
    ) -> Result<LsnRange> {
        let codec = &self.shared.codec;
        let now = now_us();
        let guess = controls.iter().map(|draft| draft.key.len() + draft.agent.len() + draft.result.len() + 128);
        let mut batch = BatchBuilder::with_capacity(output.result.len() + 256 + guess.sum::<usize>());
        batch.push_with(|out| codec.put_completion(out, atom.0, &output.delta, &output.result, now))?;
        let empty = crate::Delta::default();
        for (draft, reservation) in controls.iter().zip(reservations) {
            let start = StartParts {
                atom: reservation.atom.0,
                run: draft.run.0,
                agent: &draft.agent,
                key: &draft.key,
                parents: &[],
                idempotency_key: "",
                started_at_unix_us: now,
            };
            batch.push_with(|out| codec.put_start(out, &start))?;
            batch.push_with(|out| codec.put_completion(out, reservation.atom.0, &empty, &draft.result, now))?;
        }
        self.shared.log.append_built(batch, self.shared.policies.atom_durability)
    }
}

/// Applies a batch appended by [`Store::append_completion_with`] to the index: the caller's
/// atom and every control atom completed. Returns the caller's agent and its run's own
/// snapshot policy.
fn apply_completion_with(
    index: &mut StoreIndex,
    atom: AtomId,
    lsns: LsnRange,
    reservations: &[Reservation],
) -> (u32, Option<crate::SnapshotPolicy>) {
    let first = lsns.first().get();
    for (at, reservation) in (0u64..).zip(reservations) {
        let entry = index.atom_slot(reservation.atom);
        entry.started_lsn = first + 1 + 2 * at;
        entry.ended_lsn = first + 2 + 2 * at;
        entry.state = entry.state.transition(EntryState::Completed);
    }
    let entry = index.atom_slot(atom);
    entry.ended_lsn = first;
    entry.state = entry.state.transition(EntryState::Completed);
    let (agent, run) = (entry.agent, RunId(u64::from(entry.run)));
    (agent, index.run(run).and_then(|run| run.snapshot_policy))
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use super::*;
    use crate::error::Error;
    use crate::storage::sim::{Fault, FaultKind, Op, SimStorage};
    use crate::store::{AtomStatus, RunSpec};

    fn draft(run: RunId, key: &str) -> ControlDraft {
        ControlDraft { run, agent: "continuum.test".into(), key: key.into(), result: key.as_bytes().to_vec() }
    }

    fn output() -> AtomOutput {
        AtomOutput { result: b"done".to_vec(), ..AtomOutput::default() }
    }

    #[test]
    fn a_refused_batch_records_nothing_and_frees_every_reservation() {
        let sim = SimStorage::new(5);
        let store = Store::builder(Path::new("/store")).storage(Arc::new(sim.clone())).background(false).open();
        let store = store.expect("open");
        let run = store.create_run(RunSpec::new("r")).expect("run");
        let atom = store.begin_atom(run, "agent", "step", &[], "").expect("begin");
        let taken = store.record_control(run, "continuum.test", "taken", &[], Vec::new()).expect("control");
        // A taken key refuses the whole batch before anything is appended.
        let refused = store.complete_atom_with(atom, &output(), &[draft(run, "a"), draft(run, "taken")]);
        assert!(matches!(refused, Err(Error::AtomExists { atom }) if atom == taken.get()), "{refused:?}");
        // A full disk refuses the append: the caller's atom runs on, the keys are free.
        sim.inject(Fault { op: Some(Op::Write), nth: 1, kind: FaultKind::NoSpace });
        let refused = store.complete_atom_with(atom, &output(), &[draft(run, "a"), draft(run, "b")]);
        assert!(matches!(refused, Err(Error::NoSpace { .. })), "{refused:?}");
        assert_eq!(store.atom(atom).expect("atom").status, AtomStatus::Running);
        assert_eq!(store.atom_by_key(run, "continuum.test", "a").expect("lookup"), None);
        assert_eq!(store.atom_by_key(run, "continuum.test", "a").expect("lookup"), None, "the key is free");
        assert!(store.atom(AtomId(taken.get() + 1)).is_err(), "the reserved ids name no atom");
        // A failed write poisons the log: the reopened store finds the atom running, without
        // its control atoms, and completes it with them.
        drop(store);
        let open = || Store::builder(Path::new("/store")).storage(Arc::new(sim.clone())).background(false).open();
        let store = open().expect("reopen");
        assert_eq!(store.atom(atom).expect("atom").status, AtomStatus::Running);
        assert_eq!(store.atom_by_key(run, "continuum.test", "a").expect("lookup"), None);
        let ids = store.complete_atom_with(atom, &output(), &[draft(run, "a"), draft(run, "b")]).expect("complete");
        assert_eq!(store.atom(atom).expect("atom").output, Some(output()));
        for (id, key) in ids.iter().zip(["a", "b"]) {
            let control = store.atom(*id).expect("control atom");
            assert_eq!((control.key.as_str(), control.output.map(|o| o.result)), (key, Some(key.as_bytes().to_vec())));
        }
        drop(store);
        let store = open().expect("reopen");
        assert_eq!(store.atom_by_key(run, "continuum.test", "b").expect("lookup"), Some(ids[1]));
        assert_eq!(store.atom(atom).expect("atom").output, Some(output()));
    }
}
