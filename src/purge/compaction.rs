//! Compaction: gives back the space of what retention released, without ever losing a byte
//! that is still needed (design invariant 7).
//!
//! One round:
//! 1. Retention: finished runs past their age are dropped (a durable `RunDropped` record
//!    first), and each agent keeps only its newest K snapshots.
//! 2. Plan, from one scan of the log up to its current end:
//!    - records of dropped runs are dead;
//!    - the delta of a completed atom is needed if some *target* atom's rebuild needs it.
//!      Targets are the atoms at or after their agent's oldest kept snapshot (and every atom
//!      of an agent that has none), and each agent's head (its newest atom no rollback
//!      abandoned: after a rollback to an atom older than that snapshot, the agent continues
//!      from it). A target's rebuild may start from the oldest kept
//!      snapshot usable for it, so it needs the deltas of its ancestors above that snapshot
//!      (all of them, if no kept snapshot is usable). Every other delta is reclaimable: its
//!      completion record is replaced by an `AtomReclaimed` record that keeps the result;
//!    - everything else is live (start records, failures, run records, dictionaries, ...).
//! 3. Atoms whose deltas are about to go are marked in the index, so that no new atom can
//!    branch from them (unless from their snapshot); a branch begun during planning aborts
//!    the round.
//! 4. Sealed segments whose live fraction is below the threshold are rewritten
//!    ([`Log::rewrite_segment`](crate::Log::rewrite_segment)) and leading empty segments
//!    deleted.
//!
//! Every step is crash-safe on its own: a crash leaves each segment either as it was or
//! rewritten, and every decision is recomputed from durable state on the next round.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use bytes::Bytes;

use crate::codec::{CodecError, RecordKind, StoreRecord, proto};
use crate::error::{Error, Result};
use crate::log::{Lsn, Rewrite, RewriteOptions};
use crate::purge::plan::{AtomFacts, PurgeDecision, PurgeInputs};
use crate::store::Store;
use crate::store::index::EntryState;
use crate::store::types::{AtomId, RunId, RunStatus};

/// Bytes a reclaimed completion record is assumed to keep, when planning (the real size is
/// known only once it is rewritten).
const RECLAIMED_RECORD_BYTES_ESTIMATE: u64 = 64;
/// Bytes of a record's length prefix in its frame.
const RECORD_PREFIX_BYTES: u64 = 4;
/// How long a round waits for an atom reserved before its marks to write its start record.
const START_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(5);
/// Ranges of released atoms per `HistoryReleased` record (at most ~20 bytes each).
const RELEASED_RANGES_PER_RECORD: usize = 65_536;

/// What one round of [`Store::compact`] did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CompactionReport {
    /// Which round this was since the store was opened (from 1).
    pub round: u64,
    /// Finished runs dropped by retention age.
    pub runs_dropped: usize,
    /// Snapshot files deleted by retention.
    pub snapshots_deleted: usize,
    /// Atoms whose deltas were reclaimed (their completion records rewritten).
    pub deltas_reclaimed: u64,
    /// Channel messages whose payloads were reclaimed: every live consumer had consumed them
    /// (their completion records rewritten without the payload).
    pub messages_reclaimed: u64,
    /// Segments rewritten (for their dead bytes, for cold compression, or both).
    pub segments_rewritten: usize,
    /// Of those, segments rewritten with compressed frames (cold compression).
    pub segments_compressed: usize,
    /// Empty leading segments deleted.
    pub segments_deleted: usize,
    /// Bytes of the rewritten segments before.
    pub bytes_read: u64,
    /// Bytes of the rewritten segments after.
    pub bytes_written: u64,
    /// `bytes_read - bytes_written` (0 if the rewrites came out larger), plus the bytes of
    /// deleted segments.
    pub bytes_reclaimed: u64,
    /// Whether the round stopped early: an agent branched from history being reclaimed, or
    /// the store is closing (the next round tries again).
    pub aborted: bool,
}

/// The space the log uses, next to what is live in it (records only; see
/// [`Store::space_report`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SpaceReport {
    /// Bytes of frames in every segment (headers included, preallocated space excluded).
    pub log_bytes: u64,
    /// Bytes of live records (and length prefixes) in them; reclaimable deltas count as
    /// their estimated remains.
    pub live_bytes: u64,
    /// Bytes of the retained snapshot files.
    pub snapshot_bytes: u64,
}

impl SpaceReport {
    /// `log_bytes / live_bytes` (1.0 for an empty log).
    pub fn amplification(&self) -> f64 {
        if self.live_bytes == 0 { 1.0 } else { self.log_bytes as f64 / self.live_bytes as f64 }
    }
}

/// What happens to one record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Live,
    Dead,
    /// A completion whose delta is reclaimable.
    Strip,
    /// A message's completion whose payload every live consumer has consumed.
    StripPayload,
}

/// What became of an atom reserved before a round's marks.
enum Start {
    /// Its start record is at this LSN.
    Written(u64),
    /// Its reservation was given up (nothing was written).
    GivenUp,
    /// Still not written after [`START_WAIT_MAX`]: taken as branching from released history.
    Late,
}

/// The plan of one round.
struct Plan {
    /// LSNs at or above this are untouched.
    bound: u64,
    /// Highest atom id the plan knows.
    atoms_known: u64,
    dropped_runs: HashSet<u32>,
    /// Run of every atom with a start record in the scanned range.
    atom_runs: HashMap<u64, u32>,
    /// Guard records of dropped runs.
    dead_guards: HashSet<u64>,
    /// What is live: the snapshots kept, the deltas stripped, the atoms released.
    decision: PurgeDecision,
    /// Per sealed segment in range: (first LSN, next LSN, record bytes, live bytes).
    segments: Vec<SegmentTally>,
}

#[derive(Clone, Copy, Debug)]
struct SegmentTally {
    first_lsn: u64,
    next_lsn: u64,
    data_bytes: u64,
    total: u64,
    live: u64,
    /// Whether cold compression already rewrote the segment.
    compressed: bool,
}

impl SegmentTally {
    /// Whether a round rewrites the segment: it holds records, and too few of them are live,
    /// or cold compression is on and has not compressed it yet.
    fn due(&self, policy: &crate::store::CompactionPolicy) -> bool {
        self.total > 0 && (self.sparse(policy) || (policy.cold_compression.is_some() && !self.compressed))
    }

    /// Whether too few of its records are live: its dead bytes are due to be reclaimed.
    fn sparse(&self, policy: &crate::store::CompactionPolicy) -> bool {
        (self.live as f64) < policy.live_fraction_min * self.total as f64
    }
}

impl Plan {
    fn fate(&self, kind: RecordKind, subject: u64, lsn: u64) -> Fate {
        let dropped = |atom: u64| self.atom_runs.get(&atom).is_some_and(|run| self.dropped_runs.contains(run));
        match kind {
            RecordKind::AtomStarted | RecordKind::AtomFailed | RecordKind::AtomReclaimed if dropped(subject) => {
                Fate::Dead
            }
            RecordKind::AtomsAbandoned | RecordKind::AtomPinned if dropped(subject) => Fate::Dead,
            RecordKind::AtomCompleted if dropped(subject) => Fate::Dead,
            RecordKind::AtomCompleted if self.decision.strip.contains(&subject) => Fate::Strip,
            RecordKind::AtomCompleted if self.decision.messages_reclaimed.contains(&subject) => Fate::StripPayload,
            RecordKind::GuardStarted | RecordKind::GuardCompleted | RecordKind::GuardFailed
                if self.dead_guards.contains(&lsn) =>
            {
                Fate::Dead
            }
            _ => Fate::Live,
        }
    }
}

impl Store {
    /// Runs one round of retention and compaction now (the background thread runs it every
    /// `CompactionPolicy::interval`). Appends and reads go on meanwhile.
    ///
    /// # Errors
    /// Read and decode errors of the log, and the file system's errors. A failed round leaves
    /// every segment either as it was or rewritten; nothing needed is lost.
    pub fn compact(&self) -> Result<CompactionReport> {
        let _one_at_a_time = self.shared.compacting.lock();
        let mut report = CompactionReport::default();
        let Some(plan) = self.plan_and_release(&mut report)? else {
            report.aborted = true;
            report.round = self.shared.compaction_rounds.fetch_add(1, std::sync::atomic::Ordering::AcqRel) + 1;
            *self.shared.last_compaction.lock() = Some(report.clone());
            return Ok(report);
        };
        let policy = self.shared.policies.compaction;
        let options = RewriteOptions { compression: policy.cold_compression };
        let closing = || self.shared.closing.load(std::sync::atomic::Ordering::Acquire);
        let mut index_snapshot = IndexSnapshotPatch::default();
        for tally in plan.segments.iter().filter(|t| t.due(&policy)) {
            if closing() {
                report.aborted = true;
                break;
            }
            let started = Instant::now();
            if index_snapshot.state.is_none() && !index_snapshot.dropped {
                index_snapshot.state = self.shared.loaded_index_snapshot();
            }
            // IMPORTANT: no index snapshot may outlive a change to the records it covers.
            self.shared.remove_index_snapshot()?;
            let (mut stripped, mut emptied);
            // A rewrite that runs out of space is tried once more after the ballast (if any) is
            // given back.
            let mut ballast_released = false;
            let rewrite = loop {
                (stripped, emptied) = (0, 0);
                let rewrite = self.shared.log.rewrite_segment_with(Lsn::new(tally.first_lsn), options, |lsn, bytes| {
                    // A long compressed rewrite gives way to a closing store (the original stays).
                    if closing() {
                        return Err(Error::Closed);
                    }
                    let decision = self.rewrite_decision(&plan, lsn.get(), bytes)?;
                    index_snapshot
                        .note(lsn.get(), &decision, || self.shared.codec.peek(bytes).map(|(_, atom)| atom).ok());
                    if matches!(decision, Rewrite::Replace(_)) {
                        let message = plan.decision.messages_reclaimed.contains(&self.subject(bytes));
                        *(if message { &mut emptied } else { &mut stripped }) += 1;
                    }
                    match decision {
                        // Cold compression stores records plain, to compress them together.
                        Rewrite::Keep if options.compression.is_some() => {
                            let plain = self
                                .shared
                                .codec
                                .plain(bytes)
                                .map_err(|source| Error::Codec { lsn: lsn.get(), source })?;
                            Ok(plain.map_or(Rewrite::Keep, Rewrite::Replace))
                        }
                        decision => Ok(decision),
                    }
                });
                match rewrite {
                    Err(Error::NoSpace { op, path }) if !ballast_released && self.shared.release_ballast() => {
                        tracing::warn!(op, path = %path.display(), "compaction ran out of space: the ballast is given back");
                        ballast_released = true;
                        // The notes describe a rewrite that did not happen.
                        index_snapshot.dropped = true;
                    }
                    rewrite => break rewrite,
                }
            };
            let rewrite = match rewrite {
                Err(Error::Closed) if closing() => {
                    // Its notes describe a rewrite that did not happen.
                    index_snapshot.dropped = true;
                    report.aborted = true;
                    break;
                }
                rewrite => rewrite?,
            };
            report.segments_rewritten += 1;
            report.segments_compressed += usize::from(options.compression.is_some());
            report.deltas_reclaimed += stripped;
            report.messages_reclaimed += emptied;
            report.bytes_read += rewrite.bytes_before;
            report.bytes_written += rewrite.bytes_after;
            // Background work yields half of its time to the foreground.
            std::thread::sleep(started.elapsed());
        }
        // A compressed rewrite of a small segment can come out larger than its original (its
        // records were compressed one by one with the dictionary, and are stored plain inside
        // the frame): nothing was reclaimed then, and the report says so.
        report.bytes_reclaimed = report.bytes_read.saturating_sub(report.bytes_written);
        let (deleted, bytes) = self.delete_empty_prefix()?;
        report.segments_deleted = deleted;
        report.bytes_reclaimed += bytes;
        index_snapshot.publish(&self.shared);
        report.round = self.shared.compaction_rounds.fetch_add(1, std::sync::atomic::Ordering::AcqRel) + 1;
        self.shared.log.metrics_handle().record_compaction(
            report.bytes_read,
            report.bytes_written,
            report.bytes_reclaimed,
        );
        tracing::info!(?report, "compaction round");
        *self.shared.last_compaction.lock() = Some(report.clone());
        Ok(report)
    }

    /// Asks the background thread to run a compaction round now (at its lowered priority);
    /// returns `false` if the store has no background thread or its queue is full.
    pub fn compact_in_background(&self) -> bool {
        self.worker.as_ref().is_some_and(|worker| worker.request(crate::purge::background::Job::Compact))
    }

    /// The report of the last compaction round that completed since the store was opened.
    pub fn last_compaction(&self) -> Option<CompactionReport> {
        self.shared.last_compaction.lock().clone()
    }

    /// The log's size next to its live data, from one planning scan (nothing is changed).
    ///
    /// # Errors
    /// Read and decode errors of the log.
    pub fn space_report(&self) -> Result<SpaceReport> {
        let plan = self.plan()?;
        let mut report = SpaceReport::default();
        for segment in self.shared.log.segments() {
            report.log_bytes += segment.data_bytes;
        }
        let planned: u64 = plan.segments.iter().map(|t| t.data_bytes).sum();
        let planned_live: u64 = plan.segments.iter().map(|t| t.live).sum();
        // The active segment (not planned) is all live.
        report.live_bytes = planned_live + report.log_bytes.saturating_sub(planned);
        let storage = self.shared.log.storage();
        for atom in self.shared.snapshots.lock().iter() {
            let path = crate::snapshot::path(self.shared.log.dir(), *atom);
            if let Ok(file) = storage.open(&path, crate::storage::OpenMode::ReadOnly) {
                report.snapshot_bytes += file.len().unwrap_or(0);
            }
        }
        Ok(report)
    }

    /// The part of a round that decides what is live, under the purge lock (so that no
    /// rollback, fork or pin changes the heads it plans from): finished runs past their age are
    /// dropped, the plan is made, what it strips and releases is marked in the index and the
    /// release made durable, and the snapshots retention drops are deleted. `None` if an atom
    /// begun meanwhile branches from history the plan would release (the round stops).
    fn plan_and_release(&self, report: &mut CompactionReport) -> Result<Option<Plan>> {
        let _purge = self.shared.purge.lock();
        // IMPORTANT: the round reclaims history that the kept snapshots cover, so their names
        // must be durable first (policy snapshots defer their directory sync).
        self.shared.sync_snapshot_dir(false)?;
        report.runs_dropped = self.drop_expired_runs()?.len();
        let plan = self.plan()?;
        if !plan.dead_guards.is_empty() {
            // The guards of dropped runs are never looked up again (their keys name the
            // dropped run's id): their memory goes now, their records with the rewrites.
            self.shared.index.write().forget_guards(&plan.dead_guards);
        }
        #[cfg(test)]
        if let Some(hook) = self.shared.after_plan.lock().take() {
            hook();
        }
        if !self.mark_released(&plan)? {
            return Ok(None);
        }
        // IMPORTANT: what the round releases is durable before it deletes a snapshot or
        // rewrites a delta away, so that no reopen takes a released atom for a rebuildable one.
        self.record_released(&plan.decision.released)?;
        self.delete_snapshots(&plan.decision.snapshots_pruned)?;
        report.snapshots_deleted = plan.decision.snapshots_pruned.len();
        Ok(Some(plan))
    }

    /// Appends the durable record of the atoms a round released (none: nothing is written).
    fn record_released(&self, released: &[u64]) -> Result<()> {
        assert!(self.shared.purge.is_locked(), "atoms are released under the purge lock");
        let ranges = crate::store::index::id_ranges(released.iter().copied());
        for chunk in ranges.chunks(RELEASED_RANGES_PER_RECORD) {
            let record = StoreRecord::HistoryReleased(proto::HistoryReleased {
                first: chunk.iter().map(|(first, _)| *first).collect(),
                count: chunk.iter().map(|(_, count)| *count).collect(),
                at_unix_us: crate::store::now_us(),
            });
            self.append_reserved(&record)?;
        }
        Ok(())
    }

    /// Scans the log up to its current end and decides the fate of every record.
    fn plan(&self) -> Result<Plan> {
        let bound = self.shared.log.next_lsn().get();
        // IMPORTANT: only snapshots whose names are durable bound what the round reclaims.
        // Taken before the index lock: it may wait for a snapshot directory sync.
        let snapshots = self.shared.durable_snapshots();
        let (atoms_known, dropped_runs) = {
            let index = self.shared.index.read();
            let dropped = (1..=index.runs.len() as u64)
                .filter(|run| index.run(RunId(*run)).is_some_and(|entry| entry.status == RunStatus::Dropped))
                .filter_map(|run| u32::try_from(run).ok())
                .collect();
            (index.atoms.len() as u64, dropped)
        };
        let mut plan = Plan {
            bound,
            atoms_known,
            dropped_runs,
            atom_runs: HashMap::new(),
            dead_guards: HashSet::new(),
            decision: PurgeDecision::default(),
            segments: Vec::new(),
        };
        let graph = self.scan_graph(&mut plan)?;
        // IMPORTANT: what the newest checkpoints name stays rebuildable (invariant 7).
        let checkpointed = self.checkpointed_heads()?;
        let channel_agents = self.channel_agents(&plan.dropped_runs);
        let facts = self.entry_facts(&graph, &plan.dropped_runs, &checkpointed, &channel_agents);
        // IMPORTANT: what a live consumer has not consumed keeps its payload (invariant 7).
        let channels = self.channel_facts(&channel_agents, &facts)?;
        plan.decision = crate::purge::plan::decide(&PurgeInputs {
            parents: &graph.parents,
            facts: &facts,
            snapshots: &snapshots,
            snapshots_per_agent: self.shared.policies.retention.snapshots_per_agent,
            channels: &channels,
        });
        if !plan.decision.messages_reclaimed.is_empty() {
            // IMPORTANT: the offsets that let these payloads go are durable before any is
            // rewritten away (with `Buffered` atoms a completed offset atom may not be yet).
            self.shared.log.sync()?;
        }
        self.tally_segments(&mut plan)?;
        Ok(plan)
    }

    /// Pass 1: every atom's run, agent and parents, and the guard records (started, completed,
    /// failed) of dropped runs.
    fn scan_graph(&self, plan: &mut Plan) -> Result<Graph> {
        let mut graph = Graph::default();
        let mut guard_runs: HashMap<u64, u32> = HashMap::new();
        for item in self.shared.log.iter_from(Lsn::FIRST)? {
            let (lsn, bytes) = item?;
            let lsn = lsn.get();
            if lsn >= plan.bound {
                break;
            }
            let codec_error = |source: CodecError| Error::Codec { lsn, source };
            let (kind, _) = self.shared.codec.peek(&bytes).map_err(codec_error)?;
            if !matches!(
                kind,
                RecordKind::AtomStarted
                    | RecordKind::GuardStarted
                    | RecordKind::GuardCompleted
                    | RecordKind::GuardFailed
            ) {
                continue;
            }
            match self.shared.codec.decode(&bytes).map_err(codec_error)? {
                StoreRecord::AtomStarted(started) => {
                    let run = u32::try_from(started.run).unwrap_or(u32::MAX);
                    plan.atom_runs.insert(started.atom, run);
                    graph.parents.insert(started.atom, started.parents);
                }
                StoreRecord::GuardStarted(guard) => {
                    let run = plan.atom_runs.get(&guard.atom).copied().unwrap_or(u32::MAX);
                    guard_runs.insert(self.shared.identity.guard(&guard.key), run);
                    if plan.dropped_runs.contains(&run) {
                        plan.dead_guards.insert(lsn);
                    }
                }
                StoreRecord::GuardCompleted(proto::GuardCompleted { key, .. })
                | StoreRecord::GuardFailed(proto::GuardFailed { key, .. }) => {
                    let run = guard_runs.get(&self.shared.identity.guard(&key));
                    if run.is_some_and(|run| plan.dropped_runs.contains(run)) {
                        plan.dead_guards.insert(lsn);
                    }
                }
                _ => return Err(Error::InconsistentLog { lsn, reason: "kind and body disagree" }),
            }
        }
        Ok(graph)
    }

    /// What the index knows of every atom of `graph` (an atom it no longer holds is left
    /// out: dead). Copied a chunk at a time, so that appends never wait long for the index.
    fn entry_facts(
        &self,
        graph: &Graph,
        dropped_runs: &HashSet<u32>,
        checkpointed: &HashSet<u64>,
        channels: &crate::purge::messages::ChannelAgents,
    ) -> HashMap<u64, AtomFacts> {
        const CHUNK: usize = 4096;
        let ids: Vec<u64> = graph.parents.keys().copied().collect();
        let mut facts = HashMap::with_capacity(ids.len());
        for chunk in ids.chunks(CHUNK) {
            let index = self.shared.index.read();
            for &id in chunk {
                if let Some(e) = index.atom(AtomId(id)) {
                    let fact = AtomFacts {
                        agent: e.agent,
                        completed: e.state == EntryState::Completed,
                        reclaimed: e.reclaimed,
                        pinned: e.pinned,
                        checkpointed: checkpointed.contains(&id),
                        abandoned: e.abandoned,
                        released: e.released,
                        dropped: dropped_runs.contains(&e.run),
                        message: channels.holds_messages(e.agent),
                    };
                    facts.insert(id, fact);
                }
            }
        }
        facts
    }

    /// Pass 2: the record bytes and live bytes of each sealed segment below the bound.
    fn tally_segments(&self, plan: &mut Plan) -> Result<()> {
        let sealed: Vec<_> =
            self.shared.log.segments().into_iter().filter(|s| s.sealed && s.next_lsn.get() <= plan.bound).collect();
        let Some(last) = sealed.last() else { return Ok(()) };
        let end = last.next_lsn.get();
        let mut tallies: Vec<SegmentTally> = sealed
            .iter()
            .map(|s| SegmentTally {
                first_lsn: s.first_lsn.get(),
                next_lsn: s.next_lsn.get(),
                data_bytes: s.data_bytes,
                total: 0,
                live: 0,
                compressed: s.compressed,
            })
            .collect();
        let mut at = 0;
        for item in self.shared.log.iter_from(Lsn::FIRST)? {
            let (lsn, bytes) = item?;
            let lsn = lsn.get();
            if lsn >= end {
                break;
            }
            while at + 1 < tallies.len() && lsn >= tallies[at].next_lsn {
                at += 1;
            }
            let (kind, subject) = self.shared.codec.peek(&bytes).map_err(|source| Error::Codec { lsn, source })?;
            let size = bytes.len() as u64 + RECORD_PREFIX_BYTES;
            let tally = &mut tallies[at];
            tally.total += size;
            tally.live += match plan.fate(kind, subject, lsn) {
                Fate::Live => size,
                Fate::Dead => 0,
                Fate::Strip | Fate::StripPayload => size.min(RECLAIMED_RECORD_BYTES_ESTIMATE),
            };
        }
        plan.segments = tallies;
        Ok(())
    }

    /// Marks the atoms about to lose their deltas, and those the round releases. Returns
    /// `false` (and leaves nothing marked) if an atom begun since the plan was made branches
    /// from one the round releases. An atom reserved before the marks but not yet started is
    /// waited for (its parents are known once its start is written); one begun after them is
    /// refused such a parent by `reserve_atom`.
    fn mark_released(&self, plan: &Plan) -> Result<bool> {
        assert!(self.shared.purge.is_locked(), "atoms are marked released under the purge lock");
        let released: HashSet<u64> = plan.decision.released.iter().copied().collect();
        let in_flight = {
            let mut index = self.shared.index.write();
            let mut in_flight = Vec::new();
            for id in plan.atoms_known + 1..=index.atoms.len() as u64 {
                let Some(entry) = index.atom(AtomId(id)).copied() else { continue };
                if entry.started_lsn == 0 {
                    in_flight.push(id);
                } else if self.branches_from(entry.started_lsn, &released)? {
                    tracing::info!(atom = id, "a new branch needs history being released; compaction retries later");
                    return Ok(false);
                }
            }
            self.set_released_marks(&mut index, plan, true);
            in_flight
        };
        for id in in_flight {
            let branches = match self.wait_for_start(AtomId(id)) {
                Start::Written(lsn) => self.branches_from(lsn, &released),
                Start::GivenUp => Ok(false),
                Start::Late => Ok(true),
            };
            if !matches!(branches, Ok(false)) {
                self.set_released_marks(&mut self.shared.index.write(), plan, false);
                tracing::info!(atom = id, "a new branch may need history being released; compaction retries later");
                return branches.map(|_| false);
            }
        }
        Ok(true)
    }

    /// Sets (or takes back) the marks of what `plan` strips and releases. The plan strips only
    /// deltas (and message payloads) not reclaimed before and releases only atoms not released
    /// before, so taking the marks back restores the index as it was. Once marked, a message is
    /// no longer read (`channel/read.rs`), before its payload is rewritten away.
    fn set_released_marks(&self, index: &mut crate::store::index::StoreIndex, plan: &Plan, on: bool) {
        for id in plan.decision.strip.iter().chain(&plan.decision.messages_reclaimed) {
            if let Some(entry) = index.atom_mut(AtomId(*id)) {
                entry.reclaimed = on;
            }
        }
        for id in &plan.decision.released {
            if let Some(entry) = index.atom_mut(AtomId(*id)) {
                entry.released = on;
            }
        }
    }

    /// Whether the atom whose start record is at `lsn` has a parent in `released`.
    fn branches_from(&self, lsn: u64, released: &HashSet<u64>) -> Result<bool> {
        match self.read_record(lsn)? {
            StoreRecord::AtomStarted(started) => Ok(started.parents.iter().any(|p| released.contains(p))),
            _ => Err(Error::InconsistentLog { lsn, reason: "an atom's start is not a start record" }),
        }
    }

    /// Waits (up to [`START_WAIT_MAX`]) for `atom`'s start record to be written.
    fn wait_for_start(&self, atom: AtomId) -> Start {
        let deadline = Instant::now() + START_WAIT_MAX;
        loop {
            match self.shared.index.read().atom(atom) {
                None => return Start::GivenUp,
                Some(entry) if entry.started_lsn != 0 => return Start::Written(entry.started_lsn),
                Some(_) => {}
            }
            if Instant::now() >= deadline {
                return Start::Late;
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }

    /// What the rewrite does with one record.
    fn rewrite_decision(&self, plan: &Plan, lsn: u64, bytes: &Bytes) -> Result<Rewrite> {
        let (kind, subject) = self.shared.codec.peek(bytes).map_err(|source| Error::Codec { lsn, source })?;
        Ok(match plan.fate(kind, subject, lsn) {
            Fate::Live => Rewrite::Keep,
            Fate::Dead => Rewrite::Drop,
            Fate::Strip => match self.shared.codec.decode(bytes).map_err(|source| Error::Codec { lsn, source })? {
                StoreRecord::AtomCompleted(mut done) => {
                    done.delta = None;
                    Rewrite::Replace(self.shared.codec.encode(&StoreRecord::AtomReclaimed(done)))
                }
                _ => return Err(Error::InconsistentLog { lsn, reason: "kind and body disagree" }),
            },
            Fate::StripPayload => Rewrite::Replace(self.reclaimed_message(lsn, bytes)?),
        })
    }

    /// A message's completion without its payload: an `AtomReclaimed` record whose result keeps
    /// only the sender's id (FORMAT.md §8, "Control atoms: channels").
    fn reclaimed_message(&self, lsn: u64, bytes: &Bytes) -> Result<Vec<u8>> {
        let StoreRecord::AtomCompleted(mut done) =
            self.shared.codec.decode(bytes).map_err(|source| Error::Codec { lsn, source })?
        else {
            return Err(Error::InconsistentLog { lsn, reason: "kind and body disagree" });
        };
        if done.result.len() < crate::channel::MESSAGE_HEADER_BYTES {
            return Err(Error::InconsistentLog { lsn, reason: "a message names no sender" });
        }
        done.result.truncate(crate::channel::MESSAGE_HEADER_BYTES);
        done.delta = None;
        Ok(self.shared.codec.encode(&StoreRecord::AtomReclaimed(done)))
    }

    /// The subject of a record the rewrite already decoded once (0 if it cannot be peeked).
    fn subject(&self, bytes: &Bytes) -> u64 {
        self.shared.codec.peek(bytes).map_or(0, |(_, subject)| subject)
    }

    /// Deletes leading sealed segments that hold no record; returns how many and their bytes.
    fn delete_empty_prefix(&self) -> Result<(usize, u64)> {
        let segments = self.shared.log.segments();
        let empty: Vec<_> = segments
            .iter()
            .take_while(|s| s.sealed && s.data_bytes <= crate::log::segment::SEGMENT_HEADER_BYTES as u64)
            .collect();
        let Some(last) = empty.last() else { return Ok((0, 0)) };
        let bytes = empty.iter().map(|s| s.data_bytes).sum();
        self.shared.remove_index_snapshot()?;
        let deleted = self.shared.log.truncate_prefix(last.next_lsn)?;
        Ok((deleted, bytes))
    }
}

/// The index snapshot a round deletes before it rewrites a segment, patched and written
/// again after the round if the round only stripped deltas (`AtomCompleted` replaced by
/// `AtomReclaimed`, whose only effect on a fold is the atom's `reclaimed` flag), so that the
/// background thread need not fold the whole log again. A round that drops records (a dropped
/// run's, dead guards) changes what a fold interns and maps; its index snapshot stays deleted.
#[derive(Default)]
struct IndexSnapshotPatch {
    /// The index snapshot as loaded before the round's first change (`None` if there was none).
    state: Option<crate::store::rebuild::FoldState>,
    /// Atoms whose completion below the index snapshot's LSN the round stripped.
    stripped: Vec<u64>,
    /// The round dropped a record, or could not tell what it replaced: no patch.
    dropped: bool,
}

impl IndexSnapshotPatch {
    /// Notes what the rewrite does to the record at `lsn`.
    fn note(&mut self, lsn: u64, decision: &Rewrite, atom: impl FnOnce() -> Option<u64>) {
        let covered = self.state.as_ref().map_or(0, |state| state.next_lsn);
        match decision {
            Rewrite::Keep => {}
            Rewrite::Drop => self.dropped = true,
            Rewrite::Replace(_) if lsn < covered => match atom() {
                Some(atom) => self.stripped.push(atom),
                None => self.dropped = true,
            },
            Rewrite::Replace(_) => {}
        }
    }

    /// Writes the patched index snapshot (a failure is logged: the background thread folds the
    /// log again instead).
    fn publish(self, shared: &crate::store::Shared) {
        let Some(mut state) = self.state.filter(|_| !self.dropped) else { return };
        for atom in self.stripped {
            if let Some(entry) = state.index.atom_mut(AtomId(atom)) {
                entry.reclaimed = true;
            }
        }
        let written = crate::store::index_snapshot::encode(&state, &shared.log)
            .and_then(|bytes| shared.publish_index_snapshot(state.next_lsn, &bytes));
        if let Err(error) = written {
            shared.log.metrics_handle().record_maintenance_failure();
            tracing::warn!(%error, "patched index snapshot not written");
        }
    }
}

/// The atom DAG as the log records it.
#[derive(Default)]
struct Graph {
    parents: std::collections::BTreeMap<u64, Vec<u64>>,
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::atomic::Ordering;
    use std::sync::{Arc, OnceLock, Weak};

    use crate::storage::{DirLock, FileStorage, OpenMode, Storage, StorageFile};
    use crate::synthetic::Transcript;
    use crate::{AtomOutput, CompactionPolicy, RunSpec, SnapshotPolicy, Store};

    use crate::store::Shared;

    /// The real file system, except that the store is marked closing the moment a compaction
    /// rewrite creates its new segment: the rewrite then meets the flag at its first record.
    #[derive(Debug)]
    struct CloseOnRewrite {
        shared: Arc<OnceLock<Weak<Shared>>>,
    }

    impl Storage for CloseOnRewrite {
        fn create_dir_all(&self, dir: &Path) -> std::io::Result<()> {
            FileStorage::new().create_dir_all(dir)
        }
        fn list_dir(&self, dir: &Path) -> std::io::Result<Vec<String>> {
            FileStorage::new().list_dir(dir)
        }
        fn open(&self, path: &Path, mode: OpenMode) -> std::io::Result<Arc<dyn StorageFile>> {
            let rewrite = path.file_name().is_some_and(|name| name.to_string_lossy().contains(".compact"));
            if let Some(shared) = self.shared.get().and_then(Weak::upgrade).filter(|_| rewrite) {
                shared.closing.store(true, Ordering::Release);
            }
            FileStorage::new().open(path, mode)
        }
        fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
            FileStorage::new().rename(from, to)
        }
        fn remove_file(&self, path: &Path) -> std::io::Result<()> {
            FileStorage::new().remove_file(path)
        }
        fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
            FileStorage::new().sync_dir(dir)
        }
        fn lock_dir(&self, dir: &Path) -> std::io::Result<DirLock> {
            FileStorage::new().lock_dir(dir)
        }
    }

    /// A rollback that comes while a round plans waits for the round's marks, then sees what the
    /// round releases: it cannot move the agent onto history the round planned without (its
    /// head would be one no rebuild reaches). Without the purge lock the rollback lands between
    /// the plan and the marks.
    #[test]
    fn a_rollback_during_a_round_waits_for_its_plan_and_sees_what_it_releases() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Arc::new(
            Store::builder(dir.path())
                .segment_bytes(16 * 1024)
                .snapshot_policy(SnapshotPolicy { every_atoms: 10, every: std::time::Duration::ZERO })
                .retention(crate::RetentionPolicy { snapshots_per_agent: 1, finished_run_age: None })
                .compaction(CompactionPolicy { live_fraction_min: 1.0, interval: None, cold_compression: None })
                .background(false)
                .open()
                .expect("open"),
        );
        let run = store.create_run(RunSpec::new("r")).expect("run");
        let mut transcript = Transcript::new(9);
        let mut atoms = Vec::new();
        for i in 0..30 {
            let parents: Vec<_> = atoms.last().copied().into_iter().collect();
            let output = AtomOutput { delta: transcript.next_delta(600), result: Vec::new() };
            atoms.push(store.record_atom(run, "a", &i.to_string(), &parents, "", &output).expect("atom"));
        }
        let to = atoms[24];
        let rollback = Arc::new(parking_lot::Mutex::new(None));
        let (in_hook, slot) = (Arc::clone(&store), Arc::clone(&rollback));
        *store.shared.after_plan.lock() = Some(Box::new(move || {
            let thread = std::thread::spawn(move || in_hook.rollback(run, "a", to, "race"));
            *slot.lock() = Some(thread);
            std::thread::sleep(std::time::Duration::from_millis(200));
        }));
        let report = store.compact().expect("compact");
        assert!(report.deltas_reclaimed > 0, "{report:?}");
        let thread = rollback.lock().take().expect("the hook ran");
        match thread.join().expect("rollback thread") {
            Ok(_) => {
                store.rebuild_context(to).expect("a rollback that succeeded leaves a head that rebuilds");
            }
            Err(crate::Error::HistoryReclaimed { .. }) => {
                assert_eq!(store.last_agent_atom(run, "a"), atoms.last().copied());
            }
            Err(other) => panic!("unexpected error {other}"),
        }
        let head = store.last_agent_atom(run, "a").expect("head");
        store.rebuild_context(head).expect("the head rebuilds");
    }

    /// A policy snapshot's name is durable only after the snapshot directory's next sync, so a
    /// round must not plan with one published after its own sync (another thread may publish
    /// one between the sync and the plan): the plan sees only the durable ones.
    #[test]
    fn a_round_plans_only_with_snapshots_whose_names_are_durable() {
        let sim = crate::storage::sim::SimStorage::new(3);
        let store = Store::builder(Path::new("/store"))
            .storage(Arc::new(sim))
            .snapshot_policy(SnapshotPolicy { every_atoms: 5, every: std::time::Duration::ZERO })
            .background(false)
            .open()
            .expect("open");
        let run = store.create_run(RunSpec::new("r")).expect("run");
        let mut transcript = Transcript::new(5);
        let mut atoms = Vec::new();
        for i in 0..6 {
            let parents: Vec<_> = atoms.last().copied().into_iter().collect();
            let output = AtomOutput { delta: transcript.next_delta(300), result: Vec::new() };
            atoms.push(store.record_atom(run, "agent", &i.to_string(), &parents, "", &output).expect("atom"));
        }
        let snapshot = atoms[4].get();
        assert_eq!(store.snapshots(), vec![atoms[4]], "the policy snapshot is usable for rebuilds at once");
        let planned = store.plan().expect("plan").decision.snapshots_kept;
        assert!(!planned.contains(&snapshot), "its name is not durable yet: {planned:?}");
        store.shared.sync_snapshot_dir(false).expect("sync");
        let planned = store.plan().expect("plan").decision.snapshots_kept;
        assert!(planned.contains(&snapshot), "durable after the directory sync: {planned:?}");
    }

    #[test]
    fn a_compressed_rewrite_gives_way_to_a_closing_store_and_loses_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let slot = Arc::new(OnceLock::new());
        let policy = CompactionPolicy { interval: None, ..CompactionPolicy::default() };
        let builder = |storage: Arc<dyn Storage>| {
            Store::builder(dir.path())
                .storage(storage)
                .segment_bytes(64 * 1024)
                .snapshot_policy(SnapshotPolicy::NEVER)
                .compaction(policy)
                .background(false)
        };
        let store = builder(Arc::new(CloseOnRewrite { shared: Arc::clone(&slot) })).open().expect("open");
        let run = store.create_run(RunSpec::new("r")).expect("run");
        let mut transcript = Transcript::new(3);
        let outputs: Vec<AtomOutput> =
            (0..300).map(|i| AtomOutput { delta: transcript.next_delta(500), result: vec![i as u8] }).collect();
        let mut atoms = Vec::new();
        for (i, output) in outputs.iter().enumerate() {
            let parents: Vec<_> = atoms.last().copied().into_iter().collect();
            atoms.push(store.record_atom(run, "agent", &i.to_string(), &parents, "", output).expect("atom"));
        }
        let before: Vec<_> = store.log().segments().iter().map(|s| (s.first_lsn, s.data_bytes, s.compressed)).collect();
        assert!(before.len() > 3, "sealed segments to compress: {before:?}");
        slot.set(Arc::downgrade(&store.shared)).expect("set once");

        let report = store.compact().expect("a round that gives way is not an error");
        assert!(report.aborted, "{report:?}");
        assert_eq!((report.segments_rewritten, report.segments_compressed), (0, 0), "{report:?}");
        let after: Vec<_> = store.log().segments().iter().map(|s| (s.first_lsn, s.data_bytes, s.compressed)).collect();
        assert_eq!(after, before, "the segment it was rewriting stays as it was");
        let leftovers: Vec<String> = FileStorage::new()
            .list_dir(dir.path())
            .expect("list")
            .into_iter()
            .filter(|name| name.contains(".compact"))
            .collect();
        assert!(leftovers.is_empty(), "no half-written rewrite is left: {leftovers:?}");
        for (atom, output) in atoms.iter().zip(&outputs) {
            assert_eq!(store.atom(*atom).expect("atom").output.as_ref(), Some(output));
        }
        drop(store);

        // Reopened on the plain file system: everything reads back, and a round compresses it all.
        let store = builder(Arc::new(FileStorage::new())).open().expect("reopen");
        for (atom, output) in atoms.iter().zip(&outputs) {
            assert_eq!(store.atom(*atom).expect("atom").output.as_ref(), Some(output));
        }
        let report = store.compact().expect("round");
        assert!(!report.aborted && report.segments_compressed == before.len() - 1, "{report:?}");
        for (atom, output) in atoms.iter().zip(&outputs) {
            assert_eq!(store.atom(*atom).expect("atom").output.as_ref(), Some(output));
        }
    }
}
