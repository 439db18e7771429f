//! Rebuilding the store index from the log on open: one pass, reading only envelopes and the
//! small start records (in place, without decoding them into strings); atom outputs are never
//! decompressed.
//!
//! Compaction removes the records of a dropped run segment by segment, so a log may hold a
//! dropped run's end records without their start records (an *orphan*), always before the
//! `RunDropped` record. Orphans are set aside and accepted at the end only if a dropped run
//! explains them; anything else is an inconsistent log.

use crate::codec::{Codec, CodecError, RecordKind, StoreRecord, delta_view};
use crate::error::{Error, Result};
use crate::log::{Log, Lsn};
use crate::store::index::{self, EntryState, GuardEntry, RunEntry, StoreIndex};
use crate::store::types::{AtomId, RunId, RunStatus};

/// Replays every record of `log` into a fresh index, loading dictionaries into `codec`.
pub(crate) fn rebuild(log: &Log, codec: &Codec) -> Result<StoreIndex> {
    let started = std::time::Instant::now();
    let mut index = StoreIndex { next_dictionary: 1, ..StoreIndex::default() };
    let mut orphans = Orphans::default();
    let mut reader = codec.body_reader();
    let (mut scratch, mut parents) = (Vec::new(), Vec::new());
    log.visit(Lsn::FIRST, Lsn::new(u64::MAX), |lsn, record| {
        let bytes = record.bytes();
        let codec_error = |source| Error::Codec { lsn, source };
        let (kind, subject) = codec.peek(bytes).map_err(codec_error)?;
        match kind {
            // Most records are starts: read in place, without decoding them into strings.
            RecordKind::AtomStarted => {
                let body = reader.body(bytes, &mut scratch).map_err(codec_error)?;
                match delta_view::read_start(body, subject, &mut parents) {
                    Ok(start) => {
                        // read_start checked both are UTF-8.
                        let agent = start.agent.text(body).map_err(|_| codec_error(CodecError::Protobuf))?;
                        let key = start.key.text(body).map_err(|_| codec_error(CodecError::Protobuf))?;
                        start_atom(&mut index, lsn, subject, start.run, agent, key)?;
                    }
                    // Not the encoding the fast reader expects: prost decodes it, or says why not.
                    Err(_) => apply(&mut index, &mut orphans, codec, lsn, codec.decode(bytes).map_err(codec_error)?)?,
                }
            }
            RecordKind::AtomCompleted => finish(&mut index, &mut orphans, lsn, subject, EntryState::Completed),
            RecordKind::AtomReclaimed => {
                finish(&mut index, &mut orphans, lsn, subject, EntryState::Completed);
                if let Some(entry) = index.atom_mut(AtomId(subject)) {
                    entry.reclaimed = true;
                }
            }
            RecordKind::AtomFailed => {
                let StoreRecord::AtomFailed(failed) = codec.decode(bytes).map_err(codec_error)? else {
                    return Err(Error::InconsistentLog { lsn, reason: "kind and body disagree" });
                };
                let state = if failed.retryable { EntryState::FailedRetryable } else { EntryState::Failed };
                finish(&mut index, &mut orphans, lsn, subject, state);
            }
            _ => apply(&mut index, &mut orphans, codec, lsn, codec.decode(bytes).map_err(codec_error)?)?,
        }
        Ok(true)
    })?;
    orphans.check(&index)?;
    // Rebuilding grew these by doubling; a long-lived index keeps only what it holds.
    index.atoms.shrink_to_fit();
    index.runs.shrink_to_fit();
    index.agents.shrink_to_fit();
    let atoms = index.atoms.iter().filter(|entry| entry.state.status().is_some()).count() as u64;
    let time_to_resume = log.recovery_report().duration + started.elapsed();
    log.metrics_handle().record_index_rebuild(atoms, time_to_resume);
    tracing::info!(
        atoms,
        runs = index.runs.len(),
        time_to_resume_us = time_to_resume.as_micros() as u64,
        "store index rebuilt"
    );
    Ok(index)
}

/// Applies a record that needs its body.
fn apply(index: &mut StoreIndex, orphans: &mut Orphans, codec: &Codec, lsn: u64, record: StoreRecord) -> Result<()> {
    match record {
        StoreRecord::RunCreated(run) => {
            let id = u32::try_from(run.run).ok().filter(|id| *id as usize == index.runs.len() + 1);
            let id = id.ok_or(Error::InconsistentLog { lsn, reason: "run numbers are not dense" })?;
            index.run_names.insert(run.run_name.clone(), id);
            let snapshot_policy = match (run.snapshot_every_atoms, run.snapshot_every_ms) {
                (None, None) => None,
                (atoms, ms) => Some(crate::store::SnapshotPolicy {
                    every_atoms: atoms.unwrap_or(0),
                    every: std::time::Duration::from_millis(ms.unwrap_or(0)),
                }),
            };
            index.runs.push(RunEntry {
                name: run.run_name,
                status: RunStatus::Running,
                snapshot_policy,
                ended_at_unix_us: 0,
            });
        }
        StoreRecord::AtomStarted(started) => {
            start_atom(index, lsn, started.atom, started.run, &started.agent, &started.key)?;
        }
        StoreRecord::RunTerminal(terminal) => {
            let entry = index
                .run_mut(RunId(terminal.run))
                .ok_or(Error::InconsistentLog { lsn, reason: "end of an unknown run" })?;
            entry.status = RunStatus::Finished { success: terminal.success, resume_hint: terminal.resume_hint };
            entry.ended_at_unix_us = terminal.ended_at_unix_us;
        }
        StoreRecord::GuardStarted(guard) => {
            index.guards.insert(index::guard_hash(&guard.key), GuardEntry { started_lsn: lsn, completed_lsn: 0 });
        }
        StoreRecord::GuardCompleted(guard) => {
            let entry = index
                .guards
                .entry(index::guard_hash(&guard.key))
                .or_insert(GuardEntry { started_lsn: lsn, completed_lsn: 0 });
            entry.completed_lsn = lsn;
        }
        StoreRecord::Dictionary(dictionary) => {
            codec.add_dictionary(dictionary.id, &dictionary.dictionary);
            index.next_dictionary = index.next_dictionary.max(dictionary.id + 1);
        }
        StoreRecord::AtomsAbandoned(rollback) => {
            let run =
                u32::try_from(rollback.run).map_err(|_| Error::InconsistentLog { lsn, reason: "run out of range" })?;
            match index.agent_id(run, &rollback.agent) {
                Some(agent) => {
                    index.abandon_after(run, agent, rollback.after_atom);
                }
                None => orphans.rollbacks.push((lsn, RunId(rollback.run))),
            }
        }
        StoreRecord::AtomPinned(pin) => match index.atom_mut(AtomId(pin.atom)) {
            Some(entry) => entry.pinned = pin.pinned,
            None => orphans.ends.push((lsn, pin.atom)),
        },
        StoreRecord::RunDropped(dropped) => {
            if index.run(RunId(dropped.run)).is_none() {
                return Err(Error::InconsistentLog { lsn, reason: "drop of an unknown run" });
            }
            index.drop_run(RunId(dropped.run), dropped.next_atom);
            orphans.dropped_below = orphans.dropped_below.max(dropped.next_atom);
        }
        StoreRecord::AtomCompleted(_) | StoreRecord::AtomFailed(_) | StoreRecord::AtomReclaimed(_) => {
            return Err(Error::InconsistentLog { lsn, reason: "kind and body disagree" });
        }
    }
    Ok(())
}

/// Indexes a started atom.
fn start_atom(index: &mut StoreIndex, lsn: u64, atom: u64, run: u64, agent: &str, key: &str) -> Result<()> {
    let run32 = u32::try_from(run).map_err(|_| Error::InconsistentLog { lsn, reason: "run out of range" })?;
    if index.run(RunId(run)).is_none() || atom == 0 {
        return Err(Error::InconsistentLog { lsn, reason: "atom of an unknown run" });
    }
    let agent = index.intern_agent(run32, agent);
    let id = u32::try_from(atom).map_err(|_| Error::InconsistentLog { lsn, reason: "atom out of range" })?;
    index.atom_keys.insert(index::atom_key_hash(run32, agent, key), id);
    *index.atom_slot(AtomId(atom)) = index::AtomEntry::new(lsn, run32, agent, EntryState::Running);
    Ok(())
}

fn finish(index: &mut StoreIndex, orphans: &mut Orphans, lsn: u64, atom: u64, state: EntryState) {
    match index.atom_mut(AtomId(atom)) {
        Some(entry) => {
            entry.ended_lsn = lsn;
            entry.state = state;
        }
        None => orphans.ends.push((lsn, atom)),
    }
}

/// Records whose subject is gone, to be explained by a dropped run.
#[derive(Default)]
struct Orphans {
    /// (LSN, atom) of end records of atoms without a start record.
    ends: Vec<(u64, u64)>,
    /// (LSN, run) of rollbacks of agents without a start record.
    rollbacks: Vec<(u64, RunId)>,
    /// Every atom below this id may belong to a dropped run.
    dropped_below: u64,
}

impl Orphans {
    fn check(&self, index: &StoreIndex) -> Result<()> {
        if let Some(&(lsn, _)) = self.ends.iter().find(|(_, atom)| *atom >= self.dropped_below) {
            return Err(Error::InconsistentLog { lsn, reason: "end of an unknown atom" });
        }
        let dropped = |run: RunId| index.run(run).is_some_and(|entry| entry.status == RunStatus::Dropped);
        if let Some(&(lsn, _)) = self.rollbacks.iter().find(|(_, run)| !dropped(*run)) {
            return Err(Error::InconsistentLog { lsn, reason: "rollback of an unknown agent" });
        }
        Ok(())
    }
}
