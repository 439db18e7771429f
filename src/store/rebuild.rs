//! Rebuilding the store index from the log on open: one pass, reading only envelopes and the
//! small start records (in place, without decoding them into strings); atom outputs are never
//! decompressed.
//!
//! Compaction removes the records of a dropped run segment by segment, so a log may hold a
//! dropped run's end records without their start records (an *orphan*), always before the
//! `RunDropped` record. Orphans are set aside and accepted at the end only if a dropped run
//! explains them; anything else is an inconsistent log.

use rayon::prelude::*;

use crate::codec::{BodyReader, Codec, CodecError, RecordKind, StoreRecord, delta_view};
use crate::error::{Error, Result};
use crate::log::{HeldRange, HeldSources, Log, Lsn};
use crate::store::index::{self, EntryState, GuardEntry, RunEntry, StoreIndex};
use crate::store::types::{AtomId, RunId, RunStatus};

/// What folding the records below `next_lsn` made: the index, the orphans still to be
/// explained, and where the dictionaries are (an index snapshot holds exactly this).
#[derive(Debug, Default, PartialEq)]
pub(crate) struct FoldState {
    pub index: StoreIndex,
    pub orphans: Orphans,
    /// LSNs of the `CompressionDictionary` records folded, in order.
    pub dictionary_lsns: Vec<u64>,
    /// Every record below this LSN is folded.
    pub next_lsn: u64,
}

impl FoldState {
    /// Nothing folded yet: an index hashing identities with `identity`.
    pub fn new(identity: index::IdentityHasher) -> Self {
        Self {
            index: StoreIndex { next_dictionary: 1, identity, ..StoreIndex::default() },
            orphans: Orphans::default(),
            dictionary_lsns: Vec::new(),
            next_lsn: Lsn::FIRST.get(),
        }
    }

    /// The index, once every record is folded: fails if an orphan is left unexplained.
    pub fn finish(self) -> Result<StoreIndex> {
        let mut index = self.index;
        self.orphans.check(&index)?;
        // Rebuilding grew these by doubling; a long-lived index keeps only what it holds.
        index.atoms.shrink_to_fit();
        index.runs.shrink_to_fit();
        index.agents.shrink_to_fit();
        Ok(index)
    }
}

/// Replays every record of `log` into a fresh index, loading dictionaries into `codec`.
#[cfg(test)]
pub(crate) fn rebuild(log: &Log, codec: &Codec) -> Result<StoreIndex> {
    fold_from(log, codec, FoldState::new(index::IdentityHasher::random()), log.next_lsn().get())?.finish()
}

/// Folds the records of `log` from `start.next_lsn` up to `until` (exclusive) into `start`,
/// loading dictionaries into `codec`, and returns the state, unfinished (see
/// [`FoldState::finish`]).
///
/// With more than one core the log is read in chunks of `REBUILD_CHUNK_LSNS`: the pool's
/// threads verify and parse chunk *n + 1* (frame CRCs, envelopes, start records read in place)
/// while one thread folds chunk *n* into the index in log order. Should that fail, the log is
/// folded again on one thread from its first record, so that the error reported is the first
/// one in log order, exactly as without the pipeline or an index snapshot.
pub(crate) fn fold_from(log: &Log, codec: &Codec, start: FoldState, until: u64) -> Result<FoldState> {
    let identity = start.index.identity;
    match crate::store::pool::replay_pool().filter(|pool| pool.current_num_threads() > 1) {
        Some(pool) => {
            let threads = pool.current_num_threads();
            match pool.install(|| fold_pipelined(log, codec, start, until, threads, REBUILD_CHUNK_LSNS)) {
                Ok(state) => Ok(state),
                Err(error) => {
                    tracing::debug!(%error, "the parallel index rebuild failed; folding on one thread for the exact error");
                    fold_sequential(log, codec, FoldState::new(identity), until)
                }
            }
        }
        None => fold_sequential(log, codec, start, until),
    }
}

/// Every record from `start.next_lsn` on folded on this thread, in log order.
fn fold_sequential(log: &Log, codec: &Codec, start: FoldState, until: u64) -> Result<FoldState> {
    let mut fold = Fold::resume(codec, start);
    if until > fold.next_lsn {
        log.visit(Lsn::new(fold.next_lsn), Lsn::new(until - 1), |lsn, record| {
            fold.record(lsn, record.bytes())?;
            Ok(true)
        })?;
    }
    Ok(fold.into_state(until))
}

/// LSNs parsed together before they are folded (bounds the parsed records held to two chunks).
const REBUILD_CHUNK_LSNS: u64 = 1 << 16;

/// The parsing of chunk *n + 1* on the pool overlapped with the fold of chunk *n*.
fn fold_pipelined(
    log: &Log,
    codec: &Codec,
    start: FoldState,
    until: u64,
    threads: usize,
    chunk_lsns: u64,
) -> Result<FoldState> {
    let next = until;
    let first = start.next_lsn.max(log.first_lsn().get());
    let mut fold = Fold::resume(codec, start);
    let mut chunks = (first..next)
        .step_by(chunk_lsns.max(1) as usize)
        .map(|from| (from, from.saturating_add(chunk_lsns.max(1) - 1).min(next - 1)));
    let Some(head) = chunks.next() else { return Ok(fold.into_state(next)) };
    let mut current = parse_chunk(log, codec, head, threads)?;
    for chunk in chunks {
        let (parsed, folded) = rayon::join(|| parse_chunk(log, codec, chunk, threads), || fold.parts(&current));
        folded?;
        current = parsed?;
    }
    fold.parts(&current)?;
    Ok(fold.into_state(next))
}

/// Parses the records of `from..=to`, split evenly over `threads`, in LSN order.
fn parse_chunk(log: &Log, codec: &Codec, (from, to): (u64, u64), threads: usize) -> Result<Vec<ParsedPart>> {
    let step = (to - from + 1).div_ceil(threads as u64).max(1);
    let ranges: Vec<(u64, u64)> =
        (from..=to).step_by(step as usize).map(|start| (start, start.saturating_add(step - 1).min(to))).collect();
    ranges.par_iter().map(|&(start, end)| parse_range(log, codec, start, end)).collect()
}

/// One record of a [`ParsedPart`], as far as a parse thread could take it.
enum Parsed {
    /// A plain start record read in place: its agent and key as bytes held by the part.
    Start { lsn: u64, atom: u64, run: u64, agent: HeldRange, key: HeldRange },
    /// A completion (`reclaimed`: a reclaimed completion).
    Completed { lsn: u64, atom: u64, reclaimed: bool },
    /// Anything else: the fold reads the record's bytes itself (a compressed body may need a
    /// dictionary the fold has not loaded yet; a malformed one must fail in log order).
    Other { lsn: u64, record: HeldRange },
}

/// The records of one LSN range, referring to the segment maps (or read windows) they lie in,
/// each held once.
#[derive(Default)]
struct ParsedPart {
    records: Vec<Parsed>,
    sources: HeldSources,
}

fn parse_range(log: &Log, codec: &Codec, from: u64, to: u64) -> Result<ParsedPart> {
    let mut part = ParsedPart::default();
    let mut parents = Vec::new();
    log.visit(Lsn::new(from), Lsn::new(to), |lsn, record| {
        let held =
            part.sources.hold(&record).ok_or(Error::InconsistentLog { lsn, reason: "a record lies past 4 GiB" })?;
        let bytes = record.bytes();
        let parsed = match codec.peek_plain(bytes) {
            Ok((RecordKind::AtomStarted, atom, Some(body))) => {
                // The body is a slice of the record: its offset in it, for the spans.
                let body_at = body.as_ptr() as usize - bytes.as_ptr() as usize;
                let shifted = |at: std::ops::Range<usize>| held.sub(body_at + at.start..body_at + at.end);
                delta_view::read_start(body, atom, &mut parents).ok().and_then(|start| {
                    let (agent, key) = (shifted(start.agent.range())?, shifted(start.key.range())?);
                    Some(Parsed::Start { lsn, atom, run: start.run, agent, key })
                })
            }
            Ok((RecordKind::AtomCompleted, atom, _)) => Some(Parsed::Completed { lsn, atom, reclaimed: false }),
            Ok((RecordKind::AtomReclaimed, atom, _)) => Some(Parsed::Completed { lsn, atom, reclaimed: true }),
            _ => None,
        };
        part.records.push(parsed.unwrap_or(Parsed::Other { lsn, record: held }));
        Ok(true)
    })?;
    Ok(part)
}

/// Folds every record of `log` on one thread and pipelined (the `index_fold` fuzz target):
/// neither may panic, and both must build the same index or both refuse the log.
pub(crate) fn folds_agree(log: &Log) {
    let identity = index::IdentityHasher::with_seed(1);
    let until = log.next_lsn().get();
    let sequential =
        fold_sequential(log, &Codec::default(), FoldState::new(identity), until).and_then(FoldState::finish);
    let pipelined =
        fold_pipelined(log, &Codec::default(), FoldState::new(identity), until, 2, 16).and_then(FoldState::finish);
    match (sequential, pipelined) {
        (Ok(one), Ok(other)) => assert!(one == other, "the sequential and pipelined folds built different indexes"),
        (Err(_), Err(_)) => {}
        (one, other) => panic!("one fold refused the log: {:?} against {:?}", one.map(|_| ()), other.map(|_| ())),
    }
}

/// The index being rebuilt, record by record in log order.
struct Fold<'c> {
    codec: &'c Codec,
    index: StoreIndex,
    orphans: Orphans,
    dictionary_lsns: Vec<u64>,
    /// Where the fold started.
    next_lsn: u64,
    reader: BodyReader<'c>,
    scratch: Vec<u8>,
    parents: Vec<u64>,
    /// Whether a `RunDropped` record was folded: the dropped run's atom keys are forgotten at
    /// the end (one pass over the keys, only then).
    dropped: bool,
}

impl<'c> Fold<'c> {
    /// Continues the fold `state`.
    fn resume(codec: &'c Codec, state: FoldState) -> Self {
        Self {
            codec,
            index: state.index,
            orphans: state.orphans,
            dictionary_lsns: state.dictionary_lsns,
            next_lsn: state.next_lsn,
            reader: codec.body_reader(),
            scratch: Vec::new(),
            parents: Vec::new(),
            dropped: false,
        }
    }

    /// The state once every record below `next_lsn` is folded.
    fn into_state(mut self, next_lsn: u64) -> FoldState {
        if self.dropped {
            self.index.forget_vacant_keys();
        }
        FoldState {
            index: self.index,
            orphans: self.orphans,
            dictionary_lsns: self.dictionary_lsns,
            next_lsn: next_lsn.max(self.next_lsn),
        }
    }

    /// Folds parsed parts, in order.
    fn parts(&mut self, parts: &[ParsedPart]) -> Result<()> {
        for part in parts {
            for parsed in &part.records {
                match *parsed {
                    Parsed::Start { lsn, atom, run, agent, key } => {
                        let text = |held| {
                            std::str::from_utf8(part.sources.bytes(held))
                                .map_err(|_| Error::Codec { lsn, source: CodecError::Protobuf })
                        };
                        start_atom(&mut self.index, lsn, atom, run, text(agent)?, text(key)?)?;
                    }
                    Parsed::Completed { lsn, atom, reclaimed } => self.completed(lsn, atom, reclaimed),
                    Parsed::Other { lsn, record } => self.record(lsn, part.sources.bytes(record))?,
                }
            }
        }
        Ok(())
    }

    fn completed(&mut self, lsn: u64, atom: u64, reclaimed: bool) {
        finish(&mut self.index, &mut self.orphans, lsn, atom, EntryState::Completed);
        if reclaimed && let Some(entry) = self.index.atom_mut(AtomId(atom)) {
            entry.reclaimed = true;
        }
    }

    /// Folds one record.
    fn record(&mut self, lsn: u64, bytes: &[u8]) -> Result<()> {
        let codec = self.codec;
        let codec_error = |source| Error::Codec { lsn, source };
        let (kind, subject) = codec.peek(bytes).map_err(codec_error)?;
        match kind {
            // Most records are starts: read in place, without decoding them into strings.
            RecordKind::AtomStarted => {
                let body = self.reader.body(bytes, &mut self.scratch).map_err(codec_error)?;
                match delta_view::read_start(body, subject, &mut self.parents) {
                    Ok(start) => {
                        // read_start checked both are UTF-8.
                        let agent = start.agent.text(body).map_err(|_| codec_error(CodecError::Protobuf))?;
                        let key = start.key.text(body).map_err(|_| codec_error(CodecError::Protobuf))?;
                        start_atom(&mut self.index, lsn, subject, start.run, agent, key)?;
                    }
                    // Not the encoding the fast reader expects: prost decodes it, or says why not.
                    Err(_) => {
                        let record = codec.decode(bytes).map_err(codec_error)?;
                        apply(&mut self.index, &mut self.orphans, codec, lsn, record)?;
                    }
                }
            }
            RecordKind::AtomCompleted => self.completed(lsn, subject, false),
            RecordKind::AtomReclaimed => self.completed(lsn, subject, true),
            RecordKind::AtomFailed => {
                let StoreRecord::AtomFailed(failed) = codec.decode(bytes).map_err(codec_error)? else {
                    return Err(Error::InconsistentLog { lsn, reason: "kind and body disagree" });
                };
                let state = if failed.retryable { EntryState::FailedRetryable } else { EntryState::Failed };
                finish(&mut self.index, &mut self.orphans, lsn, subject, state);
            }
            kind => {
                if kind == RecordKind::Dictionary {
                    self.dictionary_lsns.push(lsn);
                }
                self.dropped |= kind == RecordKind::RunDropped;
                apply(&mut self.index, &mut self.orphans, codec, lsn, codec.decode(bytes).map_err(codec_error)?)?;
            }
        }
        Ok(())
    }
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
                atom_span: (0, 0),
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
            index.guards.insert(index.identity.guard(&guard.key), GuardEntry { started_lsn: lsn, completed_lsn: 0 });
        }
        StoreRecord::GuardCompleted(guard) => {
            let hash = index.identity.guard(&guard.key);
            let entry = index.guards.entry(hash).or_insert(GuardEntry { started_lsn: lsn, completed_lsn: 0 });
            entry.completed_lsn = lsn;
        }
        StoreRecord::GuardFailed(guard) => {
            let hash = index.identity.guard(&guard.key);
            if guard.retryable {
                // The key is free again: the next call runs the effect anew.
                index.guards.remove(&hash);
            } else {
                index.guards.entry(hash).or_insert(GuardEntry { started_lsn: lsn, completed_lsn: 0 }).completed_lsn =
                    lsn;
            }
        }
        StoreRecord::Dictionary(dictionary) => {
            if dictionary.id > crate::limits::DICTIONARY_ID_MAX {
                return Err(Error::InconsistentLog { lsn, reason: "dictionary id out of range" });
            }
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
            // The next atom id sizes the atom table: never past the largest id.
            if dropped.next_atom > crate::limits::ATOM_ID_MAX + 1 {
                return Err(Error::InconsistentLog { lsn, reason: "next atom id out of range" });
            }
            index.drop_run(RunId(dropped.run), dropped.next_atom);
            orphans.dropped_below = orphans.dropped_below.max(dropped.next_atom);
        }
        StoreRecord::HistoryReleased(released) => {
            index
                .release(&released.first, &released.count)
                .ok_or(Error::InconsistentLog { lsn, reason: "a release's ranges do not pair up or overlap" })?;
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
    let id = u32::try_from(atom)
        .ok()
        .filter(|id| u64::from(*id) <= crate::limits::ATOM_ID_MAX)
        .ok_or(Error::InconsistentLog { lsn, reason: "atom out of range" })?;
    let hash = index.identity.atom_key(run32, agent, key);
    index.take_key(hash, id);
    *index.atom_slot(AtomId(atom)) = index::AtomEntry::new(lsn, run32, agent, EntryState::Running);
    index.note_run_atom(run32, id);
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
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Orphans {
    /// (LSN, atom) of end records of atoms without a start record.
    pub ends: Vec<(u64, u64)>,
    /// (LSN, run) of rollbacks of agents without a start record.
    pub rollbacks: Vec<(u64, RunId)>,
    /// Every atom below this id may belong to a dropped run.
    pub dropped_below: u64,
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

#[cfg(test)]
pub(crate) mod tests {
    use std::time::Duration;

    use super::*;
    use crate::store::{RetentionPolicy, Store};
    use crate::{AtomFailure, AtomOutput, RunSpec, SnapshotPolicy};

    /// A store whose log holds every kind of record: runs (one finished and then dropped by
    /// retention, so its atoms' end records stay behind as orphans), atoms completed, failed
    /// (both kinds) and left running, start records compressed (long keys) and plain, forks,
    /// a rollback, pins, guards, completions reclaimed behind an agent's one kept snapshot,
    /// and the dictionaries trained after 256 and 2,000 deltas; in
    /// 256 KiB segments, so that most are sealed.
    pub(crate) fn busy_store(dir: &std::path::Path) {
        let store = Store::builder(dir)
            .segment_bytes(256 * 1024)
            .snapshot_policy(SnapshotPolicy::NEVER)
            .retention(RetentionPolicy { snapshots_per_agent: 1, finished_run_age: Some(Duration::ZERO) })
            .background(false)
            .open()
            .expect("open");
        let doomed = store.create_run(RunSpec::new("doomed")).expect("run");
        let run = store.create_run(RunSpec::new("kept")).expect("run");
        let mut transcript = crate::synthetic::Transcript::new(7);
        let mut last = None;
        for i in 0..3_600u64 {
            let (target, agent) = if i % 7 == 0 { (doomed, "d") } else { (run, ["a", "b", "c"][(i % 3) as usize]) };
            let key = if i % 11 == 0 {
                format!("a long idempotency key {}", "x".repeat(80)) + &i.to_string()
            } else {
                i.to_string()
            };
            let parents: Vec<_> = last.filter(|_| target == run && agent == "a").into_iter().collect();
            let atom = store.begin_atom(target, agent, &key, &parents, "").expect("begin");
            match i % 13 {
                1 => store
                    .fail_atom(atom, &AtomFailure { message: "tool timed out".into(), retryable: true })
                    .expect("fail"),
                2 => {
                    store.fail_atom(atom, &AtomFailure { message: "bad input".into(), retryable: false }).expect("fail")
                }
                3 => {}
                _ => store
                    .complete_atom(atom, &AtomOutput { delta: transcript.next_delta(500), result: vec![1, 2, 3] })
                    .expect("complete"),
            }
            if i % 29 == 4 && store.atom(atom).is_ok_and(|a| a.status == crate::AtomStatus::Completed) {
                store.guarded(atom, "send-email", |_| Ok(b"sent".to_vec())).expect("guard");
                store.pin(atom, true).expect("pin");
            }
            let completed = store.atom(atom).is_ok_and(|a| a.status == crate::AtomStatus::Completed);
            if target == run && agent == "a" && completed {
                last = Some(atom);
            }
            if target == run && agent == "b" && completed && i > 2_000 && i % 50 == 2 {
                store.snapshot_now(atom).expect("snapshot");
            }
            if i == 1_500 {
                let to = last.expect("a completed atom");
                store.rollback(run, "a", to, "reviewer").expect("rollback");
                store.fork(run, "a", to, "retry").expect("fork");
            }
        }
        store.finish_run(doomed, true, "").expect("finish");
        store.compact().expect("compact");
    }

    /// Identity hashes with one seed, so that two folds' maps compare equal.
    fn fresh() -> FoldState {
        FoldState::new(index::IdentityHasher::with_seed(7))
    }

    fn rebuild_sequential(log: &Log) -> Result<StoreIndex> {
        fold_sequential(log, &Codec::default(), fresh(), log.next_lsn().get())?.finish()
    }

    fn rebuild_pipelined(log: &Log, threads: usize, chunk: u64) -> Result<StoreIndex> {
        fold_pipelined(log, &Codec::default(), fresh(), log.next_lsn().get(), threads, chunk)?.finish()
    }

    #[test]
    fn the_pipelined_rebuild_equals_the_sequential_fold() {
        let dir = tempfile::tempdir().expect("dir");
        busy_store(dir.path());
        let log = Log::open_read_only(dir.path()).expect("log");
        let sequential = rebuild_sequential(&log).expect("sequential");
        assert!(
            sequential.atoms.len() > 2_000 && sequential.next_dictionary == 3,
            "{} {}",
            sequential.atoms.len(),
            sequential.next_dictionary
        );
        assert!(sequential.runs.iter().any(|run| run.status == crate::RunStatus::Dropped));
        assert!(sequential.atoms.iter().any(|(_, atom)| atom.reclaimed));
        assert!(log.segments().len() > 3, "{} segments", log.segments().len());
        for (threads, chunk) in [(2, REBUILD_CHUNK_LSNS), (2, 1), (3, 7), (2, 100), (4, 1_000)] {
            let pipelined = rebuild_pipelined(&log, threads, chunk).expect("pipelined");
            assert!(pipelined == sequential, "{threads} threads, chunks of {chunk} LSNs");
        }
    }

    #[test]
    fn a_start_record_naming_a_far_atom_costs_a_page_not_the_gap() {
        // A checksum-valid start record of atom 4,000,000,000 (damage the CRC cannot see, or a
        // crafted file): before the atom table was paged, opening allocated 128 GB for it.
        let dir = tempfile::tempdir().expect("dir");
        crate::store::test_logs::write_run(dir.path(), &[(1, vec![], None), (4_000_000_000, vec![], None)]);
        let log = Log::open_read_only(dir.path()).expect("log");
        for index in [rebuild(&log, &Codec::default()), rebuild_sequential(&log)] {
            let index = index.expect("rebuild");
            assert!(index.atom(AtomId(4_000_000_000)).is_some() && index.atom(AtomId(1)).is_some());
            assert!(index.heap_bytes() < 64 << 20, "{} bytes", index.heap_bytes());
        }
    }

    /// Appends `record` to the log in `dir` through the log's API: a checksum-valid record.
    fn append_record(dir: &std::path::Path, record: StoreRecord) {
        let log = Log::open(dir).expect("log");
        log.append(&Codec::default().encode(&record)).expect("append");
    }

    #[test]
    fn a_run_dropped_record_with_a_huge_next_atom_is_refused_not_allocated() {
        // Before the bound, the fold sized the atom table's page list for 2^63 ids: every open
        // aborted on the allocation.
        let dir = tempfile::tempdir().expect("dir");
        crate::store::test_logs::write_run(dir.path(), &[(1, vec![], None)]);
        let dropped = crate::codec::proto::RunDropped { run: 1, next_atom: u64::MAX / 2, dropped_at_unix_us: 1 };
        append_record(dir.path(), StoreRecord::RunDropped(dropped));
        let log = Log::open_read_only(dir.path()).expect("log");
        for error in [rebuild(&log, &Codec::default()).map(|_| ()), rebuild_sequential(&log).map(|_| ())] {
            assert!(
                matches!(error, Err(Error::InconsistentLog { reason: "next atom id out of range", .. })),
                "{error:?}"
            );
        }
        drop(log);
        let opened = Store::builder(dir.path()).background(false).open().map(|_| ());
        assert!(matches!(opened, Err(Error::InconsistentLog { .. })), "{opened:?}");
    }

    #[test]
    fn a_release_is_clipped_to_the_index_and_overlapping_ranges_are_refused() {
        let dir = tempfile::tempdir().expect("dir");
        crate::store::test_logs::write_run(dir.path(), &[(1, vec![], None), (2, vec![1], None)]);
        // Ranges far past every atom cost nothing: only held atoms are marked.
        let far =
            crate::codec::proto::HistoryReleased { first: vec![1, 1 << 40], count: vec![1, u64::MAX], at_unix_us: 1 };
        append_record(dir.path(), StoreRecord::HistoryReleased(far));
        let log = Log::open_read_only(dir.path()).expect("log");
        let index = rebuild_sequential(&log).expect("a clipped release folds");
        assert!(index.atom(AtomId(1)).expect("atom 1").released);
        assert!(!index.atom(AtomId(2)).expect("atom 2").released);
        drop(log);
        // Overlapping ranges would let one record make the fold walk the index once per range.
        let overlapping =
            crate::codec::proto::HistoryReleased { first: vec![1, 1, 1], count: vec![u64::MAX; 3], at_unix_us: 2 };
        append_record(dir.path(), StoreRecord::HistoryReleased(overlapping));
        let log = Log::open_read_only(dir.path()).expect("log");
        let error = rebuild_sequential(&log).map(|_| ());
        assert!(matches!(error, Err(Error::InconsistentLog { .. })), "{error:?}");
    }

    #[test]
    fn a_run_dropped_record_at_the_largest_atom_id_costs_a_page_list_not_the_ids() {
        let dir = tempfile::tempdir().expect("dir");
        crate::store::test_logs::write_run(dir.path(), &[(1, vec![], None)]);
        let next_atom = crate::limits::ATOM_ID_MAX + 1;
        append_record(
            dir.path(),
            StoreRecord::RunDropped(crate::codec::proto::RunDropped { run: 1, next_atom, dropped_at_unix_us: 1 }),
        );
        let log = Log::open_read_only(dir.path()).expect("log");
        let index = rebuild_sequential(&log).expect("a drop at the largest id folds");
        assert!(index.heap_bytes() < 64 << 20, "{} bytes", index.heap_bytes());
    }

    #[test]
    fn a_dictionary_at_the_largest_id_is_a_typed_error_not_an_overflow() {
        // `id + 1` overflowed: a panic in debug builds, a wrapped next id (0) in release ones.
        let dir = tempfile::tempdir().expect("dir");
        crate::store::test_logs::write_run(dir.path(), &[(1, vec![], None)]);
        let dictionary = crate::codec::proto::CompressionDictionary { id: u32::MAX, dictionary: vec![1, 2, 3] };
        append_record(dir.path(), StoreRecord::Dictionary(dictionary));
        let log = Log::open_read_only(dir.path()).expect("log");
        let error = rebuild_sequential(&log).map(|_| ());
        assert!(matches!(error, Err(Error::InconsistentLog { reason: "dictionary id out of range", .. })), "{error:?}");
    }

    #[test]
    fn a_damaged_record_fails_the_rebuild_as_the_sequential_fold_does() {
        let dir = tempfile::tempdir().expect("dir");
        busy_store(dir.path());
        // A valid frame whose record is not a store record: both rebuilds must refuse it, and
        // `rebuild` reports the sequential fold's error.
        {
            let log = Log::open(dir.path()).expect("log");
            log.append(b"not an envelope").expect("append");
        }
        let log = Log::open_read_only(dir.path()).expect("log");
        let expected = rebuild_sequential(&log).map(|_| ()).expect_err("sequential");
        assert!(rebuild_pipelined(&log, 2, 64).is_err());
        let error = rebuild(&log, &Codec::default()).map(|_| ()).expect_err("rebuild");
        assert_eq!(error.to_string(), expected.to_string());
    }
}
