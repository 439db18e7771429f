//! Writing a run checkpoint: the sequence check, the heads, the committed side effects, and
//! the control atom that holds it, under the control lock and the purge lock.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use crate::checkpoint::CHECKPOINT_AGENT;
use crate::checkpoint::codec::{self, checkpoint_key};
use crate::checkpoint::types::{CheckpointDraft, RunCheckpoint};
use crate::codec::proto;
use crate::codec::{RecordKind, StoreRecord};
use crate::config::Durability;
use crate::error::{Error, Result};
use crate::log::Lsn;
use crate::store::index::EntryState;
use crate::store::{AtomId, RunId, Store, is_control_agent, now_us};

impl Store {
    /// Writes a checkpoint of `run` and returns its sequence, durable on return. A draft
    /// without a sequence takes the run's newest plus one; one with a sequence not greater
    /// than the newest is refused ([`Error::StaleCheckpoint`], carrying the newest), so a stale
    /// writer never overwrites a newer checkpoint, in this process or after a reopen. The
    /// checkpoint is a control atom of the run (`docs/ARCHITECTURE.md`, "Run checkpoints and
    /// migrations"); the agent heads it names stay rebuildable while it is its run's newest,
    /// whatever compaction reclaims. A finished run takes no checkpoint, as it takes no atom:
    /// write the terminal checkpoint ([`CheckpointDraft::terminal`]) before
    /// [`Store::finish_run`].
    ///
    /// ```
    /// # fn main() -> continuum::Result<()> {
    /// use continuum::checkpoint::CheckpointDraft;
    /// use continuum::{AtomOutput, RunSpec, Store};
    /// let dir = tempfile::tempdir().unwrap();
    /// let store = Store::open(dir.path())?;
    /// let run = store.create_run(RunSpec::new("trip").pipeline("travel", "1.0"))?;
    /// let step = store.record_atom(run, "planner", "step-1", &[], "", &AtomOutput::default())?;
    /// let sequence = store.write_checkpoint(run, CheckpointDraft::at("planner", "step-2"))?;
    /// let latest = store.load_latest_checkpoint(run)?.expect("a checkpoint");
    /// assert_eq!((latest.sequence, latest.agent_heads["planner"]), (sequence, step));
    /// assert!(store.write_checkpoint(run, CheckpointDraft::at("planner", "step-2").sequence(sequence)).is_err());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::StaleCheckpoint`]; [`Error::InvalidArgument`] for a sequence of 0 or a head
    /// that is not a completed, current atom of its agent in `run`; [`Error::LimitExceeded`]
    /// for a field above its bound (`limits.rs`); [`Error::UnknownRun`],
    /// [`Error::RunFinished`], and the log's errors. Nothing is written on error.
    pub fn write_checkpoint(&self, run: RunId, draft: CheckpointDraft) -> Result<u64> {
        let written = self.write_checkpoint_checked(run, draft);
        let metrics = self.shared.log.metrics_handle();
        match &written {
            Ok(_) => metrics.record_checkpoint_written(),
            Err(Error::StaleCheckpoint { .. }) => metrics.record_stale_checkpoint(),
            Err(_) => {}
        }
        written
    }

    /// [`Store::write_checkpoint`] without its metrics.
    fn write_checkpoint_checked(&self, run: RunId, draft: CheckpointDraft) -> Result<u64> {
        if draft.sequence == Some(0) {
            return Err(Error::InvalidArgument { reason: "checkpoint sequences start at 1".into() });
        }
        // The newest sequence is read and the next one recorded under one lock.
        let _control = self.control_lock();
        let previous = self.load_latest_checkpoint(run)?;
        let newest = previous.as_ref().map_or(0, |checkpoint| checkpoint.sequence);
        let sequence = match draft.sequence {
            Some(sequence) if sequence <= newest => {
                return Err(Error::StaleCheckpoint { run: run.get(), sequence, newest });
            }
            Some(sequence) => sequence,
            None => newest
                .checked_add(1)
                .ok_or(Error::LimitExceeded { what: "checkpoint sequences".into(), limit: u64::MAX })?,
        };
        let base = match &previous {
            Some(previous) => RunBase::from(previous),
            None => self.run_base(run)?,
        };
        // No compaction round plans between the heads' check and the checkpoint naming them.
        let _purge = self.shared.purge.lock();
        let heads = match &draft.agent_heads {
            Some(heads) => self.check_heads(run, heads)?,
            None => self.current_heads(run),
        };
        let side_effects = self.committed_side_effects(run, previous.as_ref())?;
        let body = checkpoint_body(run, sequence, base, draft, heads, side_effects);
        let bytes = codec::encode(&body)?;
        self.record_control(run, CHECKPOINT_AGENT, &checkpoint_key(sequence), &[], bytes)?;
        if self.shared.policies.atom_durability != Durability::Sync {
            // IMPORTANT: a checkpoint is durable on return whatever the store's atom durability.
            self.shared.log.sync()?;
        }
        Ok(sequence)
    }

    /// Checks that each head is a completed atom of its agent in `run` that no rollback
    /// abandoned and whose history is still there; returns them by id.
    fn check_heads(&self, run: RunId, heads: &BTreeMap<String, AtomId>) -> Result<BTreeMap<String, u64>> {
        let index = self.shared.index.read();
        let mut checked = BTreeMap::new();
        for (agent, atom) in heads {
            codec::check_name("agent", agent)?;
            let refuse = |why: &str| Error::InvalidArgument {
                reason: format!("checkpoint head {} of agent {agent:?}: {why}", atom.get()),
            };
            if is_control_agent(agent) {
                return Err(refuse("the agent is one of the store's own"));
            }
            let entry =
                index.atom(*atom).filter(|e| e.state.status().is_some()).ok_or_else(|| refuse("no such atom"))?;
            if u64::from(entry.run) != run.get() {
                return Err(refuse("it belongs to another run"));
            }
            if index.agent_name(entry.agent) != agent {
                return Err(refuse("it belongs to another agent"));
            }
            if entry.state != EntryState::Completed || entry.abandoned {
                return Err(refuse("it is not a completed atom on its agent's current branch"));
            }
            if self.history_gone(entry, *atom) {
                return Err(refuse("its history was reclaimed"));
            }
            checked.insert(agent.clone(), atom.get());
        }
        Ok(checked)
    }

    /// Each agent's newest completed atom that no rollback abandoned (the store's own agents
    /// left out): the run's atoms walked from its newest back, until every agent has one.
    fn current_heads(&self, run: RunId) -> BTreeMap<String, u64> {
        let index = self.shared.index.read();
        let Ok(run32) = u32::try_from(run.get()) else { return BTreeMap::new() };
        let agents: HashSet<u32> = index.agent_ids.get(&run32).map_or_else(HashSet::new, |names| {
            names.iter().filter(|(name, _)| !is_control_agent(name)).map(|(_, id)| *id).collect()
        });
        let mut heads = BTreeMap::new();
        let mut found = HashSet::new();
        let (from, to) = index.atom_span(run);
        for at in (from..to).rev() {
            if found.len() == agents.len() {
                break;
            }
            let Some(entry) = index.atoms.get(at) else { continue };
            let current = entry.run == run32 && entry.state == EntryState::Completed && !entry.abandoned;
            if current && agents.contains(&entry.agent) && found.insert(entry.agent) {
                heads.insert(index.agent_name(entry.agent).to_owned(), at as u64 + 1);
            }
        }
        heads
    }

    /// The guard keys of `run` whose effects completed, and the LSN from which the next
    /// checkpoint must look again: the previous checkpoint's keys, and those of the guards
    /// completed at or after the LSN it left (the run's first atom's for the first checkpoint;
    /// log rewrites keep LSNs). A guard in flight now completes after its start, and one not
    /// yet indexed after `next_lsn`: the LSN left is the lowest of those.
    fn committed_side_effects(&self, run: RunId, previous: Option<&RunCheckpoint>) -> Result<(Vec<String>, u64)> {
        let next_lsn = self.shared.log.next_lsn().get();
        let (prefix, lsns, from_next) = {
            let index = self.shared.index.read();
            let entry = index.run(run).ok_or_else(|| Error::UnknownRun { run: run.to_string() })?;
            let prefix = crate::store::guard::run_guard_prefix(&entry.name, run);
            let first_atom = index.run_atoms(run).next().map_or(next_lsn, |(_, entry)| entry.started_lsn);
            let from = previous.map(|p| p.side_effects_from_lsn).filter(|lsn| *lsn != 0).unwrap_or(first_atom);
            let guards = index.guards.values();
            let lsns: Vec<u64> = guards.clone().map(|guard| guard.completed_lsn).filter(|lsn| *lsn >= from).collect();
            let in_flight = guards.filter(|guard| guard.completed_lsn == 0 && guard.started_lsn != 0);
            (prefix, lsns, in_flight.map(|guard| guard.started_lsn).fold(next_lsn, u64::min))
        };
        let mut keys: BTreeSet<String> =
            previous.map(|p| p.side_effects_committed.iter().cloned().collect()).unwrap_or_default();
        for lsn in lsns {
            if let StoreRecord::GuardCompleted(done) = self.read_record(lsn)?
                && done.key.starts_with(&prefix)
            {
                keys.insert(done.key);
            }
        }
        Ok((keys.into_iter().collect(), from_next))
    }

    /// The run's pipeline and environment, from its `RunCreated` record: the log is read up to
    /// the run's first atom (once per run: later checkpoints copy them from the previous one).
    fn run_base(&self, run: RunId) -> Result<RunBase> {
        let bound = {
            let index = self.shared.index.read();
            index.run_atoms(run).next().map_or(u64::MAX, |(_, entry)| entry.started_lsn)
        };
        for item in self.shared.log.iter_from(Lsn::FIRST)? {
            let (lsn, bytes) = item?;
            if lsn.get() >= bound {
                break;
            }
            let codec_error = |source| Error::Codec { lsn: lsn.get(), source };
            let (kind, subject) = self.shared.codec.peek(&bytes).map_err(codec_error)?;
            if kind == RecordKind::RunCreated
                && subject == run.get()
                && let StoreRecord::RunCreated(created) = self.shared.codec.decode(&bytes).map_err(codec_error)?
            {
                return Ok(RunBase {
                    pipeline: created.pipeline,
                    pipeline_version: created.pipeline_version,
                    environment: created.environment.into_iter().collect(),
                });
            }
        }
        // A prefix truncation took the record: the checkpoint names no pipeline.
        Ok(RunBase::default())
    }
}

/// What a checkpoint takes from its run (or from the run's previous checkpoint).
#[derive(Debug, Default)]
struct RunBase {
    pipeline: String,
    pipeline_version: String,
    environment: BTreeMap<String, String>,
}

impl From<&RunCheckpoint> for RunBase {
    fn from(previous: &RunCheckpoint) -> Self {
        RunBase {
            pipeline: previous.pipeline.clone(),
            pipeline_version: previous.pipeline_version.clone(),
            environment: previous.environment.clone(),
        }
    }
}

/// The body of checkpoint `sequence` of `run`.
fn checkpoint_body(
    run: RunId,
    sequence: u64,
    base: RunBase,
    draft: CheckpointDraft,
    heads: BTreeMap<String, u64>,
    (side_effects, side_effects_from_lsn): (Vec<String>, u64),
) -> proto::RunCheckpoint {
    let mut environment = base.environment;
    environment.extend(draft.environment);
    proto::RunCheckpoint {
        sequence,
        run: run.get(),
        pipeline: base.pipeline,
        pipeline_version: draft.pipeline_version.unwrap_or(base.pipeline_version),
        current_agent: draft.current_agent,
        position: draft.position,
        shared_context: draft.shared_context,
        agent_heads: heads,
        environment,
        is_terminal: draft.is_terminal,
        resume_hint: draft.resume_hint,
        side_effects_committed: side_effects,
        written_at_unix_us: now_us(),
        side_effects_from_lsn,
    }
}
