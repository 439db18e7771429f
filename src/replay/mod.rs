//! Rebuilding an agent's context at any atom (its head, or any point of its history: time
//! travel): the newest usable, valid snapshot on the atom's ancestry, then the deltas of the
//! completed atoms after it, in DAG order. The DAG order is atom-id order (a topological
//! order: parents always have smaller ids), so a context is the same however it is rebuilt.
//!
//! The replayer scans the run's records once, in log order (sequential positioned reads,
//! records sliced from the read windows), learns every atom's parents from its small start
//! record, computes the ancestry, then decompresses and decodes the needed deltas in parallel
//! and applies them in order. A snapshot that fails its SHA-256 or does not decode is never used: the rebuild falls
//! back to an older one, or to the log from the start, and reports it.

use parking_lot::Mutex;
use rayon::prelude::*;

use crate::codec::context::{Context, Rotation};
use crate::codec::delta_view::{self, Op};
use crate::codec::{CodecError, RecordKind, StoreRecord};
use crate::error::{Error, Result};
use crate::limits;
use crate::log::{HeldRange, HeldSources, Lsn, RecordRef};
use crate::snapshot::{self, NameDurability};
use crate::store::Store;
use crate::store::index::{AtomEntry, EntryState};
use crate::store::types::{AtomId, AtomStatus, RunId};

mod shared;

/// The result of [`Store::rebuild_context`].
#[derive(Clone, Debug, PartialEq)]
pub struct Rebuilt {
    /// The context as of the atom (including the atom's own delta, if it completed).
    pub context: Context,
    /// The snapshot the rebuild started from, if any.
    pub snapshot: Option<AtomId>,
    /// Snapshots that were skipped because they failed verification, newest first.
    pub fallbacks: Vec<SnapshotFallback>,
    /// How many completed atoms' deltas were applied on top of the snapshot.
    pub atoms_applied: usize,
}

/// A snapshot the rebuild could not use, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotFallback {
    /// The atom the snapshot was of.
    pub atom: AtomId,
    /// Why it was not used.
    pub reason: &'static str,
}

/// Where a rebuild's tables keep each atom after its floor (a snapshot, or 0) up to the rebuilt
/// atom. Dense: slot `i` is atom `floor + 1 + i`, whichever run it belongs to (atom ids are
/// dense, so this is the common case, even with several runs interleaved). Sparse: the slots
/// are the run's own atoms, in id order, found by binary search; used when the span of ids is
/// far larger than the run's atoms in it (a gap left by a run that compaction dropped, or a
/// damaged but checksum-valid id), so that memory follows the atoms, not the span.
#[derive(Clone, Debug)]
enum Slots {
    Dense { floor: u64, len: usize },
    Sparse { ids: Vec<u64> },
}

impl Slots {
    fn len(&self) -> usize {
        match self {
            Slots::Dense { len, .. } => *len,
            Slots::Sparse { ids } => ids.len(),
        }
    }

    fn slot(&self, atom: u64) -> Option<usize> {
        match self {
            Slots::Dense { floor, len } => {
                let at = usize::try_from(atom.checked_sub(floor + 1)?).ok()?;
                (at < *len).then_some(at)
            }
            Slots::Sparse { ids } => ids.binary_search(&atom).ok(),
        }
    }

    fn id(&self, slot: usize) -> u64 {
        match self {
            Slots::Dense { floor, .. } => floor + 1 + slot as u64,
            Slots::Sparse { ids } => ids.get(slot).copied().unwrap_or(0),
        }
    }
}

/// A dense span of ids is used up to this many ids, or up to `SPARSE_AFTER_RATIO` times the
/// run's atoms in it, whichever is more (about 18 bytes per id of tables).
const DENSE_SPAN_IDS_MAX: u64 = 1 << 24;
const SPARSE_AFTER_RATIO: u64 = 64;

/// Tests make every rebuild use sparse slots, which must give the same contexts.
#[cfg(test)]
static FORCE_SPARSE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn force_sparse() -> bool {
    #[cfg(test)]
    return FORCE_SPARSE.load(std::sync::atomic::Ordering::Relaxed);
    #[cfg(not(test))]
    false
}

/// Which atoms after a floor belong to the run being rebuilt.
struct RunMembers {
    slots: Slots,
    /// Whether the atom at each slot is the run's (all of them, for sparse slots).
    members: Vec<bool>,
    /// How many are.
    count: usize,
}

impl RunMembers {
    /// Dense slots for the `len` ids after `floor`, marking the members at index positions `at`
    /// (atom id `at + 1`).
    fn dense(floor: u64, len: usize, members_at: impl Iterator<Item = usize>) -> Self {
        let slots = Slots::Dense { floor, len };
        let mut members = vec![false; len];
        let mut count = 0;
        for at in members_at {
            if let Some(slot) = slots.slot(at as u64 + 1) {
                count += usize::from(!members[slot]);
                members[slot] = true;
            }
        }
        Self { slots, members, count }
    }

    /// Sparse slots: exactly the members `ids` (ascending).
    fn sparse(ids: Vec<u64>) -> Self {
        let count = ids.len();
        Self { members: vec![true; count], slots: Slots::Sparse { ids }, count }
    }

    /// The members' atom ids, ascending.
    fn ids(&self) -> impl DoubleEndedIterator<Item = u64> + '_ {
        (0..self.slots.len()).filter(|slot| self.members[*slot]).map(|slot| self.slots.id(slot))
    }

    fn contains(&self, atom: u64) -> bool {
        self.slots.slot(atom).and_then(|slot| self.members.get(slot)).copied().unwrap_or(false)
    }
}

/// A scan part covers at least this many LSNs (smaller scans are not split).
const SCAN_PART_LSNS_MIN: u64 = 4096;

/// How many parts a scan of `len` LSNs is split into: one for a short scan, else one per
/// thread of `pool`.
fn scan_part_count(pool: Option<&rayon::ThreadPool>, len: u64) -> usize {
    let threads = pool.map_or(1, rayon::ThreadPool::current_num_threads);
    if len <= SCAN_PART_LSNS_MIN * 2 { 1 } else { threads.max(1) }
}

/// A rebuild reads only its run's records, at the LSNs the index holds for them, when they are
/// at most one in this many of the range it would otherwise scan (a run among many others
/// running beside it): the frames between are stepped over on their headers, and crossed
/// through the sparse index where it reaches. Stepping over a frame costs about what reading
/// it does (a cache miss on its header against a streamed checksum), so this pays only once
/// the sparse index skips most of them: `cargo bench --bench replay -- interleaved` measured
/// 0.8-1.3x at one record in 16 to 64, 1.8x at one in 128, 3.6x at one in 256.
const TARGETED_RANGE_RATIO: u64 = 128;

/// What one part of a scan reads.
#[derive(Clone, Copy)]
enum ScanSpan<'a> {
    /// Every record with an LSN in `from..=to`.
    Range(u64, u64),
    /// The records at these LSNs (ascending), the run's: of the atoms in the second list, in
    /// the same order.
    Lsns(&'a [u64], &'a [u64]),
}

/// What one thread's part of a scan found: `(atom, start, len)` of each start record's parents
/// in `parents`, and each completion record, as a range of one of `sources` (the segment maps
/// or read windows it lies in, each held once: no reference count per record).
#[derive(Default)]
struct ScanPart {
    starts: Vec<(u64, usize, usize)>,
    parents: Vec<u64>,
    completions: Vec<ScannedCompletion>,
    sources: HeldSources,
    /// Records of the run's atoms it visited (failures included), counted by `scan_range`
    /// to check a targeted part (a shared scan's parts leave it at 0).
    matched: usize,
}

/// A completion (or reclaimed completion) record found by a scan: its atom, its LSN and its
/// bytes in its part's `sources`.
struct ScannedCompletion {
    atom: u64,
    lsn: u64,
    record: HeldRange,
}

impl ScanPart {
    /// An empty part for a span of `span_lsns` LSNs of the run `in_run`. A run's atoms write
    /// two records each: its tables are reserved for all of the span being the run's, or all
    /// of the run's atoms being in it, whichever is fewer, so that they never grow by copying.
    fn for_span(span_lsns: u64, in_run: &RunMembers) -> Self {
        let expected = usize::try_from(span_lsns / 2).unwrap_or(0).min(in_run.count);
        ScanPart {
            starts: Vec::with_capacity(expected),
            parents: Vec::with_capacity(expected),
            completions: Vec::with_capacity(expected),
            sources: HeldSources::default(),
            matched: 0,
        }
    }

    /// The record `completion` of this part: its LSN and bytes.
    fn completion(&self, completion: &ScannedCompletion) -> Completion<'_> {
        (completion.lsn, self.sources.bytes(completion.record))
    }
}

/// What the scan of one rebuild reads ([`Store::plan_scan`]): the run's atoms after the floor,
/// the LSN range from the first one's start record to the rebuilt atom's last record, and,
/// when the run's records are at most one in [`TARGETED_RANGE_RATIO`] of that range, their
/// LSNs (ascending) and atoms, to read instead of the range.
struct ScanPlan {
    run: u32,
    in_run: RunMembers,
    from_lsn: u64,
    to_lsn: u64,
    targeted: Option<(Vec<u64>, Vec<u64>)>,
}

/// A scan's reading of the records it visits, with the buffers it reuses from one to the next.
struct Reading<'s> {
    store: &'s Store,
    reader: crate::codec::BodyReader<'s>,
    scratch: Vec<u8>,
    parents: Vec<u64>,
}

impl<'s> Reading<'s> {
    fn new(store: &'s Store) -> Self {
        Self { store, reader: store.shared.codec.body_reader(), scratch: Vec::new(), parents: Vec::new() }
    }

    /// The kind and atom of `record` if it is an atom's start, completion, reclaimed
    /// completion or failure; `None` for any other record.
    fn peek_atom(&self, lsn: u64, record: &RecordRef<'_>) -> Result<Option<(RecordKind, u64)>> {
        let (kind, subject) =
            self.store.shared.codec.peek(record.bytes()).map_err(|source| Error::Codec { lsn, source })?;
        let atom_record = matches!(
            kind,
            RecordKind::AtomStarted | RecordKind::AtomCompleted | RecordKind::AtomReclaimed | RecordKind::AtomFailed
        );
        Ok(atom_record.then_some((kind, subject)))
    }

    /// Keeps an atom record of `kind` about `subject` in `part`: a start record's parents, or
    /// a completion (or reclaimed completion) held where it lies, for decoding later. A
    /// failure adds nothing.
    fn keep(
        &mut self,
        part: &mut ScanPart,
        kind: RecordKind,
        subject: u64,
        lsn: u64,
        record: &RecordRef<'_>,
    ) -> Result<()> {
        let codec_error = |source: CodecError| Error::Codec { lsn, source };
        match kind {
            RecordKind::AtomFailed => {}
            RecordKind::AtomStarted => {
                let bytes = record.bytes();
                let body = self.reader.body(bytes, &mut self.scratch).map_err(codec_error)?;
                if delta_view::read_start_parents(body, subject, &mut self.parents).is_err() {
                    // Not the plain encoding the fast reader expects: let prost decide.
                    match self.store.shared.codec.decode(bytes).map_err(codec_error)? {
                        StoreRecord::AtomStarted(started) => self.parents = started.parents,
                        _ => return Err(Error::InconsistentLog { lsn, reason: "kind and body disagree" }),
                    }
                }
                part.starts.push((subject, part.parents.len(), self.parents.len()));
                part.parents.extend_from_slice(&self.parents);
            }
            _ => {
                let record = part
                    .sources
                    .hold(record)
                    .ok_or(Error::InconsistentLog { lsn, reason: "a record lies past 4 GiB of its segment" })?;
                part.completions.push(ScannedCompletion { atom: subject, lsn, record });
            }
        }
        Ok(())
    }
}

/// A completion (or reclaimed completion) record: its LSN and bytes.
type Completion<'a> = (u64, &'a [u8]);

/// No completion record: a [`RunScan::completions`] slot's value.
const NO_COMPLETION: u32 = u32::MAX;

/// What one scan of a run's records learned about its atoms after a floor (a snapshot, or 0)
/// up to the rebuilt atom: each one's parents and its completion record. Dense, since atom ids
/// are: atom `floor + 1 + i` is at slot `i`.
struct RunScan {
    slots: Slots,
    /// Where each atom's parents are in `parents`; `None` if its start record was not seen.
    starts: Vec<Option<(u32, u32)>>,
    parents: Vec<u64>,
    /// Where each atom's completion record is: an index into the parts' completions numbered
    /// one part after the other, or `NO_COMPLETION`.
    completions: Vec<u32>,
    /// The scan's parts, in LSN order, and where each one's completions start in that numbering.
    parts: Vec<ScanPart>,
    part_starts: Vec<u32>,
}

impl RunScan {
    fn new(slots: Slots) -> Self {
        let atoms = slots.len();
        Self {
            slots,
            starts: vec![None; atoms],
            parents: Vec::new(),
            completions: vec![NO_COMPLETION; atoms],
            parts: Vec::new(),
            part_starts: Vec::new(),
        }
    }

    /// The scan of `slots` from the parts that found its records, in LSN order.
    fn assemble(slots: Slots, found: Vec<Result<ScanPart>>) -> Result<Self> {
        let mut scan = RunScan::new(slots);
        let too_many =
            || Error::LimitExceeded { what: "records in a rebuild's history".into(), limit: u64::from(u32::MAX) };
        let mut numbered = 0u32;
        for part in found {
            let part = part?;
            for &(atom, start, len) in &part.starts {
                if let Some(slot) = scan.slot(atom) {
                    scan.set_parents(slot, part.parents.get(start..start + len).unwrap_or_default())?;
                }
            }
            scan.part_starts.push(numbered);
            for completion in &part.completions {
                if let Some(slot) = scan.slot(completion.atom) {
                    scan.completions[slot] = numbered;
                }
                numbered = numbered.checked_add(1).filter(|n| *n != NO_COMPLETION).ok_or_else(too_many)?;
            }
            scan.parts.push(part);
        }
        Ok(scan)
    }

    /// The completion record of the atom at `slot`, if the scan saw one.
    fn completion(&self, slot: usize) -> Option<Completion<'_>> {
        let at = *self.completions.get(slot).filter(|at| **at != NO_COMPLETION)?;
        let part = self.part_starts.partition_point(|start| *start <= at).checked_sub(1)?;
        let found = self.parts.get(part)?;
        let index = usize::try_from(at - self.part_starts[part]).ok()?;
        Some(found.completion(found.completions.get(index)?))
    }

    /// Every completion record the scan saw, in LSN order.
    fn all_completions(&self) -> impl Iterator<Item = Completion<'_>> {
        self.parts.iter().flat_map(|part| part.completions.iter().map(|completion| part.completion(completion)))
    }

    fn slot(&self, atom: u64) -> Option<usize> {
        self.slots.slot(atom)
    }

    fn id(&self, slot: usize) -> u64 {
        self.slots.id(slot)
    }

    fn parents_at(&self, slot: usize) -> Option<&[u64]> {
        let (start, len) = self.starts.get(slot).copied().flatten()?;
        self.parents.get(start as usize..start as usize + len as usize)
    }

    fn set_parents(&mut self, slot: usize, parents: &[u64]) -> Result<()> {
        let too_many =
            || Error::LimitExceeded { what: "parent links in a rebuild's history".into(), limit: u64::from(u32::MAX) };
        let start = u32::try_from(self.parents.len()).map_err(|_| too_many())?;
        let len = u32::try_from(parents.len()).map_err(|_| too_many())?;
        self.parents.extend_from_slice(parents);
        self.starts[slot] = Some((start, len));
        Ok(())
    }

    /// `atom` and all its ancestors (the scan's floor must be 0), ordered by id. Parents have
    /// smaller ids than their children, so one sweep down from `atom` marks them all.
    fn ancestry(&self, atom: u64) -> Result<Vec<u64>> {
        let top = self.slot(atom).ok_or(Error::UnknownAtom { atom })?;
        let mut needed = vec![false; top + 1];
        needed[top] = true;
        for slot in (0..=top).rev() {
            if !needed[slot] {
                continue;
            }
            let id = self.id(slot);
            for &parent in self.parents_at(slot).ok_or(Error::UnknownAtom { atom: id })? {
                if parent >= id {
                    return Err(Error::InconsistentLog { lsn: 0, reason: "a parent's id is not below its child's" });
                }
                needed[self.slot(parent).ok_or(Error::UnknownAtom { atom: parent })?] = true;
            }
        }
        Ok(self.marked(&needed))
    }

    /// The ancestors of `atom` (itself included) with ids above the scan's floor `snapshot`,
    /// if a snapshot of `snapshot` can start `atom`'s rebuild: `snapshot` is an ancestor, and
    /// every path down from `atom` meets it before any smaller id. A snapshot folds its own
    /// ancestry in id order; under this condition the rest of `atom`'s ancestry all comes
    /// after it, so the fold order is `atom`'s own id order. (The condition is sufficient, not
    /// necessary: some merges of branches could use the snapshot but are rebuilt from an older
    /// one instead.)
    fn after_snapshot(&self, atom: u64, snapshot: u64) -> Option<Vec<u64>> {
        if atom == snapshot {
            return Some(Vec::new());
        }
        let top = self.slot(atom)?;
        let mut needed = vec![false; top + 1];
        needed[top] = true;
        let mut reached = false;
        for slot in (0..=top).rev() {
            if !needed[slot] {
                continue;
            }
            let id = self.id(slot);
            for &parent in self.parents_at(slot)? {
                if parent == snapshot {
                    reached = true;
                } else if parent < snapshot || parent >= id {
                    return None;
                } else {
                    needed[self.slot(parent)?] = true;
                }
            }
        }
        reached.then(|| self.marked(&needed))
    }

    fn marked(&self, needed: &[bool]) -> Vec<u64> {
        needed.iter().enumerate().filter(|(_, needed)| **needed).map(|(slot, _)| self.id(slot)).collect()
    }
}

impl Store {
    /// The context of `atom`'s agent as of `atom`: the fold of the deltas of every completed
    /// atom among `atom` and its ancestors, in DAG order.
    ///
    /// # Errors
    /// [`Error::UnknownAtom`], and read or decode errors of the log.
    pub fn rebuild_context(&self, atom: AtomId) -> Result<Rebuilt> {
        self.rebuild_recorded(atom, crate::store::pool::replay_pool())
    }

    /// [`Store::rebuild_context`] of several atoms at once — the heads of independent branches
    /// (a fork and its original, or the agents of a run) — in parallel on the replay pool, each
    /// rebuild's own decoding spread over the pool too. Results come back in `atoms` order,
    /// each exactly what `rebuild_context` returns for it.
    ///
    /// Their scans are shared: where the heads' LSN ranges overlap (agents writing side by
    /// side), the log is read once for all of them, in parallel parts, and each fold then
    /// decodes in parallel in turn (see `Store::rebuild_several`).
    pub fn rebuild_contexts(&self, atoms: &[AtomId]) -> Vec<Result<Rebuilt>> {
        let pool = crate::store::pool::replay_pool();
        let mut results: Vec<Option<Result<Rebuilt>>> = atoms.iter().map(|_| None).collect();
        let mut rebuild = || self.rebuild_several(atoms, pool, |at, rebuilt| results[at] = Some(rebuilt));
        match pool {
            // The whole of it on the pool, so that its threads stay awake from the scan on.
            Some(pool) if pool.current_thread_index().is_none() => pool.install(rebuild),
            _ => rebuild(),
        }
        results
            .into_iter()
            .zip(atoms)
            .map(|(rebuilt, atom)| rebuilt.unwrap_or(Err(Error::UnknownAtom { atom: atom.0 })))
            .collect()
    }

    /// [`Store::rebuild_context`] decoding on `threads` threads (for measuring the speedup).
    #[doc(hidden)]
    pub fn rebuild_context_with_threads(&self, atom: AtomId, threads: usize) -> Result<Rebuilt> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.clamp(1, limits::REPLAY_THREADS_MAX))
            .build()
            .map_err(|e| Error::io("spawn replay threads", "", std::io::Error::other(e.to_string())))?;
        self.rebuild_context_on(atom, Some(&pool))
    }

    /// A rebuild on `pool`, recorded in the metrics.
    fn rebuild_recorded(&self, atom: AtomId, pool: Option<&rayon::ThreadPool>) -> Result<Rebuilt> {
        let started = std::time::Instant::now();
        let rebuilt = self.rebuild_context_on(atom, pool);
        self.record_rebuild(&rebuilt, started);
        rebuilt
    }

    fn rebuild_context_on(&self, atom: AtomId, pool: Option<&rayon::ThreadPool>) -> Result<Rebuilt> {
        // The whole rebuild runs on the pool, so that its threads stay awake from the scan to
        // the last delta instead of falling asleep while the ancestry is worked out.
        match pool {
            Some(pool) if pool.current_thread_index().is_none() => {
                pool.install(|| self.rebuild_on_pool(atom, Some(pool)))
            }
            _ => self.rebuild_on_pool(atom, pool),
        }
    }

    /// Rebuilds from the newest usable snapshot that verifies, else from the log's start. The
    /// newest candidate is tried with a scan from it (the usual case, reading least); if it is
    /// not usable or does not verify, one scan from the oldest candidate serves every other
    /// one, newest first. Every snapshot of the run is a candidate: the purge plan counts on
    /// the oldest usable kept one being found (`purge/plan.rs`).
    fn rebuild_on_pool(&self, atom: AtomId, pool: Option<&rayon::ThreadPool>) -> Result<Rebuilt> {
        let mut fallbacks = Vec::new();
        let candidates = self.snapshot_candidates(atom);
        if let Some(&newest) = candidates.first() {
            let scan = self.scan_run(atom, Some(newest), pool)?;
            if let Some(rebuilt) = self.rebuild_from(atom, &scan, newest, &mut fallbacks, pool)? {
                return Ok(rebuilt);
            }
        }
        if let [_, older @ .., oldest] = &candidates[..] {
            let scan = self.scan_run(atom, Some(*oldest), pool)?;
            for &candidate in older.iter().chain(std::iter::once(oldest)) {
                if let Some(rebuilt) = self.rebuild_from(atom, &scan, candidate, &mut fallbacks, pool)? {
                    return Ok(rebuilt);
                }
            }
        }
        let scan = self.scan_run(atom, None, pool)?;
        let pending = scan.ancestry(atom.0)?;
        let mut context = Context::new();
        let atoms_applied = apply_deltas(self, &scan, &mut context, &pending, pool)?;
        Ok(Rebuilt { context, snapshot: None, fallbacks, atoms_applied })
    }

    /// `atom`'s rebuild from `snapshot`, with `scan` (which starts at or before it), if the
    /// snapshot is usable for it and verifies; a snapshot that does not verify is added to
    /// `fallbacks`.
    fn rebuild_from(
        &self,
        atom: AtomId,
        scan: &RunScan,
        snapshot: u64,
        fallbacks: &mut Vec<SnapshotFallback>,
        pool: Option<&rayon::ThreadPool>,
    ) -> Result<Option<Rebuilt>> {
        let Some(pending) = scan.after_snapshot(atom.0, snapshot) else { return Ok(None) };
        match self.load_snapshot(snapshot)? {
            Ok(mut context) => {
                let atoms_applied = apply_deltas(self, scan, &mut context, &pending, pool)?;
                let fallbacks = std::mem::take(fallbacks);
                Ok(Some(Rebuilt { context, snapshot: Some(AtomId(snapshot)), fallbacks, atoms_applied }))
            }
            Err(reason) => {
                tracing::warn!(atom = snapshot, reason, "snapshot failed verification; falling back to an older one");
                fallbacks.push(SnapshotFallback { atom: AtomId(snapshot), reason });
                Ok(None)
            }
        }
    }

    /// Snapshots that may start `atom`'s rebuild, newest first: every one of the same run, not
    /// after it.
    fn snapshot_candidates(&self, atom: AtomId) -> Vec<u64> {
        let index = self.shared.index.read();
        let Some(run) = index.atom(atom).map(|entry| entry.run) else { return Vec::new() };
        let snapshots = self.shared.snapshots.lock();
        snapshots
            .range(..=atom.0)
            .rev()
            .filter(|id| index.atom(AtomId(**id)).is_some_and(|entry| entry.run == run))
            .copied()
            .collect()
    }

    /// Writes a snapshot of the context as of `atom`, which must have completed.
    ///
    /// # Errors
    /// [`Error::UnknownAtom`], [`Error::InvalidTransition`] if the atom has not completed, and
    /// the file system's errors.
    pub fn snapshot_now(&self, atom: AtomId) -> Result<()> {
        self.write_snapshot(atom, NameDurability::Now, crate::store::pool::replay_pool())
    }

    /// Writes a snapshot of `atom`'s context, rebuilt on `pool` (`None`: on this thread), its
    /// name durable now or at the next sync of the snapshot directory (policy snapshots: see
    /// `docs/ARCHITECTURE.md`, "Snapshot policy").
    pub(crate) fn write_snapshot(
        &self,
        atom: AtomId,
        name: NameDurability,
        pool: Option<&rayon::ThreadPool>,
    ) -> Result<()> {
        self.snapshottable(atom)?;
        let rebuilt = self.rebuild_recorded(atom, pool)?;
        self.publish_snapshot(atom, &rebuilt.context, name)
    }

    /// Whether `atom` may have a snapshot: it must have completed.
    ///
    /// # Errors
    /// [`Error::UnknownAtom`], or [`Error::InvalidTransition`] if it has not completed.
    pub(crate) fn snapshottable(&self, atom: AtomId) -> Result<()> {
        let status = self.shared.index.read().atom(atom).and_then(|entry| entry.state.status());
        match status {
            Some(AtomStatus::Completed) => Ok(()),
            Some(_) => Err(Error::InvalidTransition { atom: atom.0, from: "unfinished", to: "snapshotted" }),
            None => Err(Error::UnknownAtom { atom: atom.0 }),
        }
    }

    /// Writes `context`, rebuilt as of `atom`, as `atom`'s snapshot file, adds it to the set
    /// and applies retention to its agent's snapshots.
    pub(crate) fn publish_snapshot(&self, atom: AtomId, context: &Context, name: NameDurability) -> Result<()> {
        let started = std::time::Instant::now();
        if self.shared.policies.atom_durability != crate::Durability::Sync {
            // IMPORTANT: the atom's records are durable before its snapshot exists: a snapshot
            // of an atom a crash took back would be taken for the atom that reuses its id.
            self.shared.log.sync()?;
        }
        let bytes = snapshot::encode(atom.0, self.shared.store_id, context)?;
        snapshot::publish(self.shared.log.storage().as_ref(), self.shared.log.dir(), atom.0, &bytes)?;
        match name {
            // IMPORTANT: the rename is durable only once the directory is synced.
            NameDurability::Now => self.shared.sync_snapshot_dir(true)?,
            // IMPORTANT: listed as unsynced before it joins the set (`Shared::durable_snapshots`).
            NameDurability::Deferred => {
                self.shared.unsynced_snapshots.lock().insert(atom.0);
            }
        }
        self.shared.log.metrics_handle().record_snapshot_write(bytes.len() as u64, started.elapsed());
        // Retention prunes snapshots in the next compaction round's plan (`purge/plan.rs`), which
        // knows what each one still serves.
        self.shared.snapshots.lock().insert(atom.0);
        Ok(())
    }

    /// Atoms that have a snapshot file.
    pub fn snapshots(&self) -> Vec<AtomId> {
        self.shared.snapshots.lock().iter().map(|atom| AtomId(*atom)).collect()
    }

    /// One pass over the log, from the first start record of the run's atoms after `after`
    /// (all of them for `None`) to `atom`'s last record, keeping the start records' parents
    /// and the completion records of the run's atoms.
    fn scan_run(&self, atom: AtomId, after: Option<u64>, pool: Option<&rayon::ThreadPool>) -> Result<RunScan> {
        let plan = self.plan_scan(atom, after)?;
        let found = match &plan.targeted {
            Some((lsns, atoms)) => self.scan_targeted(atom, &plan.in_run, lsns, atoms, pool),
            None => None,
        };
        let found = match found {
            Some(found) => found,
            // Split the LSN range evenly over the pool's threads; each part seeks to its start
            // through the segments' sparse index.
            None => {
                let (from_lsn, to_lsn) = (plan.from_lsn, plan.to_lsn);
                let range_lsns = to_lsn - from_lsn + 1;
                self.scan_parts(pool, range_lsns, &plan.in_run, |i, parts| {
                    let step = range_lsns.div_ceil(parts as u64);
                    let from = from_lsn + i as u64 * step;
                    ScanSpan::Range(from, (from + step - 1).min(to_lsn))
                })
            }
        };
        RunScan::assemble(plan.in_run.slots, found)
    }

    /// What the scan of `atom`'s rebuild from the snapshot `after` (the log's start for `None`)
    /// reads: taken from the index under its read lock, so that the scan itself holds none.
    fn plan_scan(&self, atom: AtomId, after: Option<u64>) -> Result<ScanPlan> {
        // Only atoms after the snapshot matter: the rebuild stops at the snapshot. Atoms after
        // `atom` do not matter; the run's atoms between the floor and it bound the scan.
        let targeted_scans = self.shared.targeted_scans.load(std::sync::atomic::Ordering::Relaxed);
        let (run, in_run, from_lsn, to_lsn, mut lsns) = {
            let index = self.shared.index.read();
            let entry = index.atom(atom).filter(|e| e.started_lsn != 0).ok_or(Error::UnknownAtom { atom: atom.0 })?;
            let run = entry.run;
            // No atom of the run lies below its span (parents are of the same run), so a run
            // begun after many others' atoms does not walk them.
            let span_floor = index.atom_span(RunId(u64::from(run))).0 as u64;
            let floor = after.unwrap_or(0).max(span_floor).min(atom.0 - 1);
            // The run's atoms in the span, read from the index's written pages only.
            let range = usize::try_from(floor).unwrap_or(usize::MAX)..usize::try_from(atom.0).unwrap_or(usize::MAX);
            let in_span = || {
                index
                    .atoms
                    .iter_from(range.start)
                    .take_while(|(at, _)| *at < range.end)
                    .filter(move |(_, e)| e.state != EntryState::Vacant && e.run == run)
            };
            let span = atom.0 - floor;
            let dense_len = || usize::try_from(span).map_err(|_| Error::UnknownAtom { atom: atom.0 });
            let mut first = None::<u64>;
            // The LSNs of the members' records, for a run whose records are a small part of
            // the range to scan (see `TARGETED_RANGE_RATIO`); dropped, and no longer
            // collected, once they are too many for that (the range ends at the target atom's
            // last record and starts at the smallest start LSN seen, usually the first one's).
            let to_lsn = entry.started_lsn.max(entry.ended_lsn);
            let (mut lsns, mut collecting) = (Vec::new(), targeted_scans);
            let mut note_start = |at: usize, e: &AtomEntry| {
                if e.started_lsn != 0 {
                    first = Some(first.map_or(e.started_lsn, |f| f.min(e.started_lsn)));
                }
                if !collecting {
                    return;
                }
                for lsn in [e.started_lsn, e.ended_lsn] {
                    if lsn != 0 {
                        lsns.push((lsn, at));
                    }
                }
                let range = to_lsn.saturating_sub(first.unwrap_or(to_lsn)) + 1;
                if (lsns.len() as u64).saturating_mul(TARGETED_RANGE_RATIO) > range {
                    (lsns, collecting) = (Vec::new(), false);
                }
            };
            // The index's read lock is held while the span is walked, and every appending
            // thread waits for it: a span known to be dense is walked once, not counted first.
            let in_run = if span <= DENSE_SPAN_IDS_MAX && !force_sparse() {
                RunMembers::dense(
                    floor,
                    dense_len()?,
                    in_span().inspect(|(at, e)| note_start(*at, e)).map(|(at, _)| at),
                )
            } else {
                let mut count = 0u64;
                for (at, e) in in_span() {
                    count += 1;
                    note_start(at, e);
                }
                if span <= count.saturating_mul(SPARSE_AFTER_RATIO) && !force_sparse() {
                    RunMembers::dense(floor, dense_len()?, in_span().map(|(at, _)| at))
                } else {
                    // Every id listed is a member.
                    RunMembers::sparse(in_span().map(|(at, _)| at as u64 + 1).collect())
                }
            };
            (run, in_run, first.unwrap_or(entry.started_lsn), to_lsn, lsns)
        };
        lsns.retain(|(lsn, _)| (from_lsn..=to_lsn).contains(lsn));
        let range_lsns = to_lsn - from_lsn + 1;
        let targeted = (!lsns.is_empty() && (lsns.len() as u64).saturating_mul(TARGETED_RANGE_RATIO) <= range_lsns)
            .then(|| {
                lsns.sort_unstable();
                lsns.dedup_by_key(|(lsn, _)| *lsn);
                lsns.into_iter().map(|(lsn, at)| (lsn, at as u64 + 1)).unzip()
            });
        Ok(ScanPlan { run, in_run, from_lsn, to_lsn, targeted })
    }

    /// Reads only the run's records, at the LSNs the index gave (`atoms[i]`'s at `lsns[i]`);
    /// `None` if they do not all hold them (the index and the log disagree), in which case
    /// the caller scans the whole range, which does not depend on the index's LSNs.
    fn scan_targeted(
        &self,
        atom: AtomId,
        in_run: &RunMembers,
        lsns: &[u64],
        atoms: &[u64],
        pool: Option<&rayon::ThreadPool>,
    ) -> Option<Vec<Result<ScanPart>>> {
        let found = self.scan_parts(pool, lsns.len() as u64, in_run, |i, parts| {
            let step = lsns.len().div_ceil(parts);
            let part = i * step..((i + 1) * step).min(lsns.len());
            ScanSpan::Lsns(lsns.get(part.clone()).unwrap_or_default(), atoms.get(part).unwrap_or_default())
        });
        // Every LSN the index gave must hold one of the run's records.
        let matched = found.iter().map(|part| part.as_ref().map_or(0, |part| part.matched)).sum::<usize>();
        let agreed = found.iter().any(Result::is_err) || matched == lsns.len();
        self.shared.log.metrics_handle().record_targeted_scan(!agreed);
        if agreed {
            return Some(found);
        }
        tracing::warn!(
            atom = atom.0,
            matched,
            expected = lsns.len(),
            "the index's LSNs of a run's records did not all hold them: scanning the whole range"
        );
        None
    }
    /// Lets rebuilds read only their run's records when those are at most one in 128 of the
    /// range they span (`on`, the default), or makes every rebuild scan its whole range (the
    /// way they all did before; both give the same contexts). For benchmarks and tests
    /// comparing the two, not a tuning knob.
    #[doc(hidden)]
    pub fn set_targeted_scans(&self, on: bool) {
        self.shared.targeted_scans.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Scans a span of `len` LSNs in parts: `span(i, n)` is part `i` of `n` (one part for a
    /// short span, else one per thread of `pool`, run on it).
    fn scan_parts<'a>(
        &self,
        pool: Option<&rayon::ThreadPool>,
        len: u64,
        in_run: &RunMembers,
        span: impl Fn(usize, usize) -> ScanSpan<'a> + Sync,
    ) -> Vec<Result<ScanPart>> {
        let parts = scan_part_count(pool, len);
        let scan_all = || (0..parts).into_par_iter().map(|i| self.scan_range(span(i, parts), in_run)).collect();
        match pool {
            Some(pool) if parts > 1 => pool.install(scan_all),
            _ => (0..parts).map(|i| self.scan_range(span(i, parts), in_run)).collect(),
        }
    }

    /// The start and completion records of the run's atoms in `span`.
    fn scan_range(&self, span: ScanSpan<'_>, in_run: &RunMembers) -> Result<ScanPart> {
        let span_lsns = match span {
            ScanSpan::Range(from, to) => to - from + 1,
            ScanSpan::Lsns(lsns, _) => lsns.len() as u64,
        };
        let mut part = ScanPart::for_span(span_lsns, in_run);
        let mut reading = Reading::new(self);
        let (mut matched, mut next_wanted) = (0, 0);
        let visit = |lsn, record: RecordRef<'_>| {
            let Some((kind, subject)) = reading.peek_atom(lsn, &record)? else { return Ok(true) };
            if !in_run.contains(subject) {
                return Ok(true);
            }
            // A targeted part counts only the records of the atoms the index named (its records
            // come in the order of its LSNs, some perhaps missing).
            matched += match span {
                ScanSpan::Range(..) => 1,
                ScanSpan::Lsns(lsns, atoms) => {
                    while lsns.get(next_wanted).is_some_and(|wanted| *wanted < lsn) {
                        next_wanted += 1;
                    }
                    usize::from(lsns.get(next_wanted) == Some(&lsn) && atoms.get(next_wanted) == Some(&subject))
                }
            };
            reading.keep(&mut part, kind, subject, lsn, &record)?;
            Ok(true)
        };
        match span {
            ScanSpan::Range(from, to) => self.shared.log.visit(Lsn::new(from), Lsn::new(to), visit)?,
            ScanSpan::Lsns(lsns, _) => {
                self.shared.log.visit_lsns(lsns, visit)?;
            }
        }
        part.matched = matched;
        Ok(part)
    }

    /// Reads and decompresses every completion record of `atom`'s run up to it on one thread,
    /// without decoding or applying anything: the bound a rebuild is measured against.
    #[doc(hidden)]
    pub fn read_and_decompress_run(&self, atom: AtomId) -> Result<usize> {
        let scan = self.scan_run(atom, None, None)?;
        let mut reader = self.shared.codec.body_reader();
        let mut body = Vec::new();
        let mut bytes = 0;
        for (lsn, record) in scan.all_completions() {
            body.clear();
            reader.append_body(record, &mut body).map_err(|source| Error::Codec { lsn, source })?;
            bytes += body.len();
        }
        Ok(bytes)
    }

    /// A verified snapshot's context, or why it cannot be used.
    fn load_snapshot(&self, atom: u64) -> Result<Result<Context, &'static str>> {
        let bytes = match snapshot::read(self.shared.log.storage().as_ref(), self.shared.log.dir(), atom)? {
            Ok(bytes) => bytes,
            Err(error) => return Ok(Err(error.reason())),
        };
        Ok(snapshot::decode(&bytes, atom, self.shared.store_id).map_err(|error| error.reason()))
    }
}

/// Completion records decoded by one thread: their bodies back to back, and the ops their
/// deltas read as.
struct DecodedPart<'a> {
    records: &'a [Pending<'a>],
    buffers: PartBuffers,
}

/// The buffers of a [`DecodedPart`], recycled from part to part and rebuild to rebuild: fresh
/// ones for every part would make the allocator map and fault in megabytes per rebuild.
#[derive(Default)]
struct PartBuffers {
    /// Per record: its kind, the end of its body in `bodies` (each starts where the one before
    /// it ends), and the end of its ops in `ops`, or `None` if its delta must be decoded by
    /// prost instead.
    ends: Vec<(RecordKind, usize, Option<usize>)>,
    bodies: Vec<u8>,
    ops: Vec<Op>,
}

/// Spare [`PartBuffers`], at most `PART_BUFFERS_KEPT` of them, none over
/// `PART_BUFFER_BYTES_KEPT` (memory the store keeps between rebuilds stays bounded).
static SPARE_BUFFERS: Mutex<Vec<PartBuffers>> = Mutex::new(Vec::new());
const PART_BUFFERS_KEPT: usize = 16;
const PART_BUFFER_BYTES_KEPT: usize = 1 << 20;

impl PartBuffers {
    fn take() -> Self {
        SPARE_BUFFERS.lock().pop().unwrap_or_default()
    }

    fn give_back(mut self) {
        let bytes = self.bodies.capacity()
            + self.ops.capacity() * std::mem::size_of::<Op>()
            + self.ends.capacity() * std::mem::size_of::<(RecordKind, usize, Option<usize>)>();
        if bytes > PART_BUFFER_BYTES_KEPT {
            return;
        }
        self.ends.clear();
        self.bodies.clear();
        self.ops.clear();
        let mut spare = SPARE_BUFFERS.lock();
        if spare.len() < PART_BUFFERS_KEPT {
            spare.push(self);
        }
    }
}

/// A completed atom to apply: its id and its completion record.
type Pending<'a> = (u64, Completion<'a>);

/// Decompresses the completion bodies of `records` and reads their deltas (the parallel half
/// of a rebuild).
fn decode_part<'a>(store: &Store, records: &'a [Pending<'a>]) -> Result<DecodedPart<'a>> {
    let mut reader = store.shared.codec.body_reader();
    let mut part = DecodedPart { records, buffers: PartBuffers::take() };
    let buffers = &mut part.buffers;
    for (_, (lsn, bytes)) in records {
        let start = buffers.bodies.len();
        let (kind, subject) =
            reader.append_body(bytes, &mut buffers.bodies).map_err(|source| Error::Codec { lsn: *lsn, source })?;
        let body = &buffers.bodies[start..];
        let ops = (kind == RecordKind::AtomCompleted
            && delta_view::read_completion(body, subject, &mut buffers.ops).is_ok())
        .then_some(buffers.ops.len());
        buffers.ends.push((kind, buffers.bodies.len(), ops));
    }
    Ok(part)
}

/// Applies decoded completions in order (the sequential half of a rebuild of `target`).
fn apply_part(
    store: &Store,
    part: &DecodedPart<'_>,
    context: &mut Context,
    rotation: &mut Rotation,
    target: u64,
) -> Result<()> {
    let (mut body_start, mut ops_start) = (0, 0);
    for (&(kind, body_end, ops_end), &(id, (lsn, bytes))) in part.buffers.ends.iter().zip(part.records) {
        let body = part.buffers.bodies.get(body_start..body_end).unwrap_or_default();
        body_start = body_end;
        match kind {
            RecordKind::AtomCompleted => {}
            RecordKind::AtomReclaimed => return Err(Error::HistoryReclaimed { atom: target, reclaimed: id }),
            _ => {
                return Err(Error::InconsistentLog { lsn, reason: "a completed atom's end is not a completion" });
            }
        }
        if let Some(ops_end) = ops_end {
            let ops = part.buffers.ops.get(ops_start..ops_end).unwrap_or_default();
            ops_start = ops_end;
            context.apply_ops(body, ops, rotation).map_err(|source| Error::Codec { lsn, source })?;
            continue;
        }
        // Not the encoding the zero-copy reader expects: prost decodes it, or says why not.
        match store.shared.codec.decode(bytes).map_err(|source| Error::Codec { lsn, source })? {
            StoreRecord::AtomCompleted(done) => {
                context.settle(rotation);
                context.apply_owned(done.delta.unwrap_or_default());
            }
            _ => return Err(Error::InconsistentLog { lsn, reason: "kind and body disagree" }),
        }
    }
    Ok(())
}

/// Applies the deltas of the completed atoms among `atoms` (ascending ids) in order; returns
/// how many were applied. Chunk by chunk: while one thread applies a chunk, the others
/// decompress the next, so memory stays bounded by two chunks however long the history is.
fn apply_deltas(
    store: &Store,
    scan: &RunScan,
    context: &mut Context,
    atoms: &[u64],
    pool: Option<&rayon::ThreadPool>,
) -> Result<usize> {
    let target = atoms.last().copied().unwrap_or(0);
    let completed: Vec<Pending<'_>> = {
        let index = store.shared.index.read();
        atoms
            .iter()
            .filter(|id| index.atom(AtomId(**id)).is_some_and(|e| e.state == EntryState::Completed))
            // A completion after the rebuilt atom's last record is not part of its past.
            .filter_map(|id| scan.slot(*id).and_then(|slot| scan.completion(slot)).map(|record| (*id, record)))
            .collect()
    };
    let threads = pool.map_or(1, rayon::ThreadPool::current_num_threads);
    match pool {
        Some(pool) => pool.install(|| pipeline(store, &completed, context, threads, target)),
        None => pipeline(store, &completed, context, threads, target),
    }?;
    Ok(completed.len())
}

/// Decodes and applies `completed` chunk by chunk on the current pool's `threads` threads.
fn pipeline(
    store: &Store,
    completed: &[Pending<'_>],
    context: &mut Context,
    threads: usize,
    target: u64,
) -> Result<()> {
    let mut chunks = chunks(completed);
    let Some(first) = chunks.next() else { return Ok(()) };
    let mut rotation = Rotation::default();
    let mut current = decode_chunk(store, first, threads)?;
    for next in chunks {
        let apply = || apply_chunk(store, std::mem::take(&mut current), context, &mut rotation, target);
        let (decoded, applied) = rayon::join(|| decode_chunk(store, next, threads), apply);
        applied?;
        current = decoded?;
    }
    apply_chunk(store, current, context, &mut rotation, target)?;
    context.settle(&mut rotation);
    Ok(())
}

/// Applies a decoded chunk's parts in order and recycles their buffers.
fn apply_chunk(
    store: &Store,
    parts: Vec<DecodedPart<'_>>,
    context: &mut Context,
    rotation: &mut Rotation,
    target: u64,
) -> Result<()> {
    for part in parts {
        apply_part(store, &part, context, rotation, target)?;
        part.buffers.give_back();
    }
    Ok(())
}

/// `completed` in chunks that start small and grow to `REPLAY_CHUNK_ATOMS`, and shrink again
/// towards the end: the first chunk is decoded, and the last applied, with nothing to overlap.
fn chunks<'s, 'a>(completed: &'s [Pending<'a>]) -> impl Iterator<Item = &'s [Pending<'a>]> {
    let mut rest = completed;
    let mut size = DECODE_PART_ATOMS_MIN * 2;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let take = size.min((rest.len() / 4).max(DECODE_PART_ATOMS_MIN * 2)).min(rest.len());
        size = (size * 2).min(limits::REPLAY_CHUNK_ATOMS);
        let (chunk, after) = rest.split_at(take);
        rest = after;
        Some(chunk)
    })
}

/// Decompresses one chunk on the pool, in parts small enough that a thread done applying the
/// chunk before can take some of them.
fn decode_chunk<'a>(store: &Store, chunk: &'a [Pending<'a>], threads: usize) -> Result<Vec<DecodedPart<'a>>> {
    if threads <= 1 {
        // The same parts, in order, on the one thread (their buffers are recycled the same way).
        return chunk.chunks(DECODE_PART_ATOMS).map(|part| decode_part(store, part)).collect();
    }
    // Small chunks (a short history, a pipeline's first and last) in small parts, so that no
    // thread waits long for another's last part; large ones in parts of `DECODE_PART_ATOMS`.
    let part_atoms = (chunk.len() / (threads * 4)).clamp(DECODE_PART_ATOMS_MIN, DECODE_PART_ATOMS);
    chunk.par_chunks(part_atoms).map(|part| decode_part(store, part)).collect()
}

/// Completions one decode task takes.
const DECODE_PART_ATOMS: usize = 256;

impl Store {
    /// Counts one context rebuild in the metrics.
    pub(crate) fn record_rebuild(&self, rebuilt: &Result<Rebuilt>, started: std::time::Instant) {
        let metrics = self.shared.log.metrics_handle();
        match rebuilt {
            Ok(rebuilt) => {
                metrics.record_context_rebuild(rebuilt.atoms_applied as u64, started.elapsed());
                metrics.record_snapshot_fallbacks(rebuilt.fallbacks.len() as u64);
            }
            Err(error) => metrics.record_error(error),
        }
    }
}

/// Completions one decode task takes at least.
const DECODE_PART_ATOMS_MIN: usize = 32;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AtomOutput, RunSpec, SnapshotPolicy};

    #[test]
    fn a_history_across_a_gap_of_four_billion_ids_rebuilds_with_sparse_slots() {
        // Atom 1 and its child, atom 4,000,000,000 (a gap a dropped run could leave, or a
        // damaged id): the rebuild's tables follow the run's two atoms, not the span of ids.
        let dir = tempfile::tempdir().expect("dir");
        let mut transcript = crate::synthetic::Transcript::new(5);
        let deltas = [transcript.next_delta(500), transcript.next_delta(500)];
        crate::store::test_logs::write_run(
            dir.path(),
            &[(1, vec![], Some(&deltas[0])), (4_000_000_000, vec![1], Some(&deltas[1]))],
        );
        let store = Store::builder(dir.path()).background(false).open().expect("open");
        let rebuilt = store.rebuild_context(AtomId(4_000_000_000)).expect("rebuild");
        let mut expected = Context::new();
        for delta in &deltas {
            expected.apply(delta);
        }
        assert_eq!(rebuilt.atoms_applied, 2);
        assert_eq!(rebuilt.context.encode(), expected.encode());
        assert!(store.index_heap_bytes() < 64 << 20);
    }

    /// Every atom's rebuild (its context and atom count, or its error) with the store's scans
    /// targeted where they pay, or all over their whole range.
    fn rebuild_all(store: &Store, atoms: &[AtomId], full_range: bool) -> Vec<String> {
        store.set_targeted_scans(!full_range);
        let rebuilt = atoms
            .iter()
            .map(|atom| match store.rebuild_context(*atom) {
                Ok(rebuilt) => {
                    format!("{:?} {} {:?}", rebuilt.snapshot, rebuilt.atoms_applied, rebuilt.context.encode())
                }
                Err(error) => error.to_string(),
            })
            .collect();
        store.set_targeted_scans(true);
        rebuilt
    }

    /// The store's targeted scans, and those that fell back to the whole range.
    fn targeted_scans(store: &Store) -> (u64, u64) {
        let metrics = store.log().metrics();
        (metrics.rebuild_targeted_scans, metrics.rebuild_scan_fallbacks)
    }

    /// Run 0's atoms are every `RUN_0_EVERY`-th of the store's.
    const RUN_0_EVERY: u64 = 200;

    /// Four runs interleaved: run 0 writes one atom in `RUN_0_EVERY` (40 in all: a few fork
    /// from its first atom, one fails, one is left running, one is snapshotted), the other
    /// three the rest in turn (one of them snapshotted every 1,000 atoms). 64 KiB segments, so that compaction compresses the sealed ones.
    /// Returns run 0's atoms and every 97th of the others'.
    pub(super) fn interleaved_store(dir: &std::path::Path) -> (Store, Vec<AtomId>, Vec<AtomId>) {
        let store = Store::builder(dir)
            .segment_bytes(64 * 1024)
            .snapshot_policy(SnapshotPolicy::NEVER)
            .background(false)
            .open()
            .expect("open");
        let runs: Vec<_> = (0..4).map(|r| store.create_run(RunSpec::new(format!("r{r}"))).expect("run")).collect();
        let mut transcript = crate::synthetic::Transcript::new(17);
        let mut heads = [None; 4];
        let (mut run_0, mut others) = (Vec::new(), Vec::new());
        for i in 0..40 * RUN_0_EVERY {
            let r = if i % RUN_0_EVERY == 0 { 0 } else { 1 + (i % 3) as usize };
            let k = i / RUN_0_EVERY;
            let parents: Vec<AtomId> = match (r, k % 10) {
                // Now and then a fork from the run's first atom.
                (0, 5) => run_0.first().copied().into_iter().collect(),
                _ => heads[r].into_iter().collect(),
            };
            let key = i.to_string();
            let output = AtomOutput { delta: transcript.next_delta(200), result: Vec::new() };
            let atom = if i % 4 == 0 {
                store.record_atom(runs[r], "agent", &key, &parents, "", &output).expect("record")
            } else {
                let atom = store.begin_atom(runs[r], "agent", &key, &parents, "").expect("begin");
                let failure = crate::AtomFailure { message: "tool failed".into(), retryable: false };
                match (r, k, i % 70) {
                    (0, 17, _) | (1.., _, 30) => store.fail_atom(atom, &failure).expect("fail"),
                    // Left running: its start record only.
                    (0, 23, _) => {}
                    _ => store.complete_atom(atom, &output).expect("complete"),
                }
                atom
            };
            // Run 0 has one snapshot; the others one each in turn every 1,000 atoms.
            if (r == 0 && k == 20) || (r != 0 && i % 1000 == 4) {
                store.snapshot_now(atom).expect("snapshot");
            }
            heads[r] = Some(atom);
            match r {
                0 => run_0.push(atom),
                _ if i % 97 == 0 => others.push(atom),
                _ => {}
            }
        }
        (store, run_0, others)
    }

    #[test]
    fn targeted_scans_rebuild_the_same_contexts_as_scans_of_the_whole_range() {
        let dir = tempfile::tempdir().expect("dir");
        let (store, run_0, others) = interleaved_store(dir.path());
        let atoms: Vec<AtomId> = run_0.iter().chain(&others).copied().collect();
        let check = |store: &Store, when: &str| {
            let full = rebuild_all(store, &atoms, true);
            let before = targeted_scans(store);
            let targeted = rebuild_all(store, &atoms, false);
            let (scans, fallbacks) = targeted_scans(store);
            // Run 0's atoms after its first two are rebuilt by targeted scans (the others'
            // runs are too dense in their ranges), without a fallback.
            assert!(scans - before.0 >= 38, "{when}: {} targeted scans", scans - before.0);
            assert_eq!(fallbacks, before.1, "{when}: a targeted scan fell back");
            for ((full, targeted), atom) in full.iter().zip(&targeted).zip(&atoms) {
                assert_eq!(full, targeted, "{when}: atom {atom:?}");
            }
            // Rebuilds from the snapshot are among them (and every atom, finished or not, has
            // the context of its ancestry).
            let from_snapshot = full.iter().filter(|r| r.starts_with("Some(")).count();
            assert!(from_snapshot >= 3, "{when}: {from_snapshot} rebuilds from the snapshot");
        };
        check(&store, "as appended");
        store.compact().expect("compact");
        assert!(store.log().segments().iter().any(|s| s.compressed), "compaction compresses sealed segments");
        check(&store, "compressed");
        drop(store);
        let store = Store::builder(dir.path()).segment_bytes(64 * 1024).background(false).open().expect("reopen");
        check(&store, "reopened");
    }

    #[test]
    fn a_targeted_scan_the_log_disagrees_with_falls_back_to_the_whole_range() {
        let dir = tempfile::tempdir().expect("dir");
        let (store, run_0, _) = interleaved_store(dir.path());
        // Run 0's atom 38 descends from 35, which forked from its first atom.
        let head = run_0[38];
        let expected = rebuild_all(&store, &[head], false);
        assert!(expected[0].starts_with("None 5 "), "{}", &expected[0][..40]);
        // Its parent's completion, which the index now places at another run's record.
        let victim = run_0[37];
        {
            let mut index = store.shared.index.write();
            let other = AtomId(victim.get() + 1);
            assert_ne!(index.atom(other).map(|e| e.run), index.atom(victim).map(|e| e.run));
            let wrong = index.atom(other).expect("other").ended_lsn;
            index.atom_slot(victim).ended_lsn = wrong;
        }
        let before = targeted_scans(&store);
        assert_eq!(rebuild_all(&store, &[head], false), expected);
        let after = targeted_scans(&store);
        let (scans, fallbacks) = (after.0 - before.0, after.1 - before.1);
        assert!(fallbacks >= 1 && scans == fallbacks, "{scans} targeted scans, {fallbacks} fallen back");
    }

    #[test]
    fn sparse_slots_rebuild_the_same_contexts_as_dense_ones() {
        let dir = tempfile::tempdir().expect("dir");
        let store =
            Store::builder(dir.path()).snapshot_policy(SnapshotPolicy::NEVER).background(false).open().expect("open");
        let runs: Vec<_> = (0..3).map(|r| store.create_run(RunSpec::new(format!("r{r}"))).expect("run")).collect();
        let mut transcript = crate::synthetic::Transcript::new(11);
        let mut heads = [None; 3];
        let mut atoms = Vec::new();
        for i in 0..240u64 {
            let r = (i % 3) as usize;
            // Run 0 forks now and then from an older atom of its own.
            let parents: Vec<AtomId> = match (r, i % 40) {
                (0, 21) => atoms.iter().filter(|(run, _)| *run == 0).nth(2).map(|(_, a)| *a).into_iter().collect(),
                _ => heads[r].into_iter().collect(),
            };
            let atom = store.begin_atom(runs[r], "agent", &i.to_string(), &parents, "").expect("begin");
            let output = AtomOutput { delta: transcript.next_delta(300), result: Vec::new() };
            store.complete_atom(atom, &output).expect("complete");
            if i == 120 {
                store.snapshot_now(atom).expect("snapshot");
            }
            heads[r] = Some(atom);
            atoms.push((r, atom));
        }
        let dense: Vec<_> = atoms.iter().map(|(_, a)| store.rebuild_context(*a).expect("dense")).collect();
        FORCE_SPARSE.store(true, std::sync::atomic::Ordering::Relaxed);
        let sparse: Vec<_> = atoms.iter().map(|(_, a)| store.rebuild_context(*a)).collect();
        FORCE_SPARSE.store(false, std::sync::atomic::Ordering::Relaxed);
        for ((dense, sparse), (_, atom)) in dense.iter().zip(sparse).zip(&atoms) {
            let sparse = sparse.expect("sparse");
            assert_eq!(dense.context.encode(), sparse.context.encode(), "atom {atom:?}");
            assert_eq!(dense.atoms_applied, sparse.atoms_applied, "atom {atom:?}");
        }
    }
}
