//! Rebuilding an agent's context at any atom (its head, or any point of its history: time
//! travel): the newest usable, valid snapshot on the atom's ancestry, then the deltas of the
//! completed atoms after it, in DAG order. The DAG order is atom-id order (a topological
//! order: parents always have smaller ids), so a context is the same however it is rebuilt.
//!
//! The replayer scans the run's records once, in log order (sequential reads, zero-copy from
//! mapped segments), learns every atom's parents from its small start record, computes the
//! ancestry, then decompresses and decodes the needed deltas in parallel and applies them in
//! order. A snapshot that fails its SHA-256 or does not decode is never used: the rebuild falls
//! back to an older one, or to the log from the start, and reports it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

use bytes::Bytes;
use rayon::prelude::*;

use crate::codec::{CodecError, RecordKind, StoreRecord};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::limits;
use crate::log::Lsn;
use crate::snapshot;
use crate::store::Store;
use crate::store::index::EntryState;
use crate::store::types::{AtomId, AtomStatus};

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

/// Which atoms after a floor (a snapshot, or 0) belong to the run being rebuilt.
struct RunMembers {
    floor: u64,
    /// Atom `floor + 1 + i` is at `members[i]`.
    members: Vec<bool>,
}

impl RunMembers {
    fn contains(&self, atom: u64) -> bool {
        let at = atom.checked_sub(self.floor + 1).and_then(|at| usize::try_from(at).ok());
        at.and_then(|at| self.members.get(at)).copied().unwrap_or(false)
    }
}

/// Snapshots tried before a rebuild falls back to the log from the start.
const SNAPSHOT_CANDIDATES_MAX: usize = 8;

/// What one scan of a run's records learned: each atom's parents, and the raw bytes of each
/// completion record, by atom id.
#[derive(Default)]
struct RunScan {
    parents: BTreeMap<u64, Vec<u64>>,
    completions: BTreeMap<u64, Bytes>,
}

impl RunScan {
    /// `atom` and all its ancestors, ordered by id.
    fn ancestry(&self, atom: u64) -> Result<BTreeSet<u64>> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![atom];
        while let Some(id) = stack.pop() {
            if seen.insert(id) {
                let parents = self.parents.get(&id).ok_or(Error::UnknownAtom { atom: id })?;
                stack.extend(parents.iter().copied());
            }
        }
        Ok(seen)
    }

    /// The ancestors of `atom` (itself included) with ids above `snapshot`, if a snapshot of
    /// `snapshot` can start `atom`'s rebuild: `snapshot` is an ancestor, and every path down
    /// from `atom` meets it before any smaller id. A snapshot folds its own ancestry in id
    /// order; under this condition the rest of `atom`'s ancestry all comes after it, so the
    /// fold order is `atom`'s own id order. (The condition is sufficient, not necessary: some
    /// merges of branches could use the snapshot but are rebuilt from an older one instead.)
    fn after_snapshot(&self, atom: u64, snapshot: u64) -> Option<BTreeSet<u64>> {
        let mut seen = BTreeSet::new();
        let mut reached = false;
        let mut stack = vec![atom];
        while let Some(id) = stack.pop() {
            if id == snapshot {
                reached = true;
                continue;
            }
            if id < snapshot {
                return None;
            }
            if seen.insert(id) {
                stack.extend(self.parents.get(&id)?.iter().copied());
            }
        }
        reached.then_some(seen)
    }
}

impl Store {
    /// The context of `atom`'s agent as of `atom`: the fold of the deltas of every completed
    /// atom among `atom` and its ancestors, in DAG order.
    ///
    /// # Errors
    /// [`Error::UnknownAtom`], and read or decode errors of the log.
    pub fn rebuild_context(&self, atom: AtomId) -> Result<Rebuilt> {
        let started = std::time::Instant::now();
        let rebuilt = self.rebuild_context_on(atom, replay_pool());
        self.record_rebuild(&rebuilt, started);
        rebuilt
    }

    /// [`Store::rebuild_context`] decoding on `threads` threads (for measuring the speedup).
    #[doc(hidden)]
    pub fn rebuild_context_with_threads(&self, atom: AtomId, threads: usize) -> Result<Rebuilt> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.clamp(1, limits::REPLAY_THREADS_MAX))
            .build()
            .map_err(|_| Error::InvalidConfig { reason: "cannot start replay threads".into() })?;
        self.rebuild_context_on(atom, Some(&pool))
    }

    fn rebuild_context_on(&self, atom: AtomId, pool: Option<&rayon::ThreadPool>) -> Result<Rebuilt> {
        let mut fallbacks = Vec::new();
        for candidate in self.snapshot_candidates(atom) {
            let scan = self.scan_run(atom, Some(candidate))?;
            let Some(pending) = scan.after_snapshot(atom.0, candidate) else { continue };
            match self.load_snapshot(candidate)? {
                Ok(mut context) => {
                    let pending: Vec<u64> = pending.into_iter().collect();
                    let atoms_applied = apply_deltas(self, &scan, &mut context, &pending, pool)?;
                    return Ok(Rebuilt { context, snapshot: Some(AtomId(candidate)), fallbacks, atoms_applied });
                }
                Err(reason) => {
                    tracing::warn!(
                        atom = candidate,
                        reason,
                        "snapshot failed verification; falling back to an older one"
                    );
                    fallbacks.push(SnapshotFallback { atom: AtomId(candidate), reason });
                }
            }
        }
        let scan = self.scan_run(atom, None)?;
        let pending: Vec<u64> = scan.ancestry(atom.0)?.into_iter().collect();
        let mut context = Context::new();
        let atoms_applied = apply_deltas(self, &scan, &mut context, &pending, pool)?;
        Ok(Rebuilt { context, snapshot: None, fallbacks, atoms_applied })
    }

    /// Snapshots that may start `atom`'s rebuild, newest first: of the same run, not after it.
    fn snapshot_candidates(&self, atom: AtomId) -> Vec<u64> {
        let index = self.shared.index.read();
        let Some(run) = index.atom(atom).map(|entry| entry.run) else { return Vec::new() };
        let snapshots = self.shared.snapshots.lock();
        snapshots
            .range(..=atom.0)
            .rev()
            .filter(|id| index.atom(AtomId(**id)).is_some_and(|entry| entry.run == run))
            .take(SNAPSHOT_CANDIDATES_MAX)
            .copied()
            .collect()
    }

    /// Writes a snapshot of the context as of `atom`, which must have completed.
    ///
    /// # Errors
    /// [`Error::UnknownAtom`], [`Error::InvalidTransition`] if the atom has not completed, and
    /// the file system's errors.
    pub fn snapshot_now(&self, atom: AtomId) -> Result<()> {
        let status = self.shared.index.read().atom(atom).and_then(|entry| entry.state.status());
        match status {
            Some(AtomStatus::Completed) => {}
            Some(_) => return Err(Error::InvalidTransition { atom: atom.0, from: "unfinished", to: "snapshotted" }),
            None => return Err(Error::UnknownAtom { atom: atom.0 }),
        }
        let rebuilt = self.rebuild_context(atom)?;
        let started = std::time::Instant::now();
        let bytes = snapshot::encode(atom.0, &rebuilt.context)?;
        snapshot::publish(self.shared.log.storage().as_ref(), self.shared.log.dir(), atom.0, &bytes)?;
        self.shared.log.metrics_handle().record_snapshot_write(bytes.len() as u64, started.elapsed());
        self.shared.snapshots.lock().insert(atom.0);
        self.prune_snapshots_of(atom)?;
        Ok(())
    }

    /// Atoms that have a snapshot file.
    pub fn snapshots(&self) -> Vec<AtomId> {
        self.shared.snapshots.lock().iter().map(|atom| AtomId(*atom)).collect()
    }

    /// One pass over the log, from the first start record of the run's atoms after `after`
    /// (all of them for `None`) to `atom`'s last record, keeping the start records' parents
    /// and the completion records of the run's atoms.
    fn scan_run(&self, atom: AtomId, after: Option<u64>) -> Result<RunScan> {
        let (run, from_lsn, to_lsn) = {
            let index = self.shared.index.read();
            let entry = index.atom(atom).filter(|e| e.started_lsn != 0).ok_or(Error::UnknownAtom { atom: atom.0 })?;
            // Atoms after `atom` do not matter; those between the floor and it bound the scan.
            let floor = after.unwrap_or(0);
            let first = (floor + 1..=atom.0)
                .filter_map(|id| index.atom(AtomId(id)))
                .filter(|e| e.run == entry.run && e.started_lsn != 0)
                .map(|e| e.started_lsn)
                .min();
            (entry.run, first.unwrap_or(entry.started_lsn), entry.started_lsn.max(entry.ended_lsn))
        };
        // Which atoms up to `atom` belong to the run, taken once so that the scan holds no lock.
        // Only atoms after the snapshot matter: the rebuild stops at the snapshot.
        let floor = after.unwrap_or(0);
        let in_run = RunMembers {
            floor,
            members: {
                let index = self.shared.index.read();
                (floor + 1..=atom.0).map(|id| index.atom(AtomId(id)).is_some_and(|e| e.run == run)).collect()
            },
        };
        let mut scan = RunScan::default();
        for item in self.shared.log.iter_from(Lsn::new(from_lsn))? {
            let (lsn, bytes) = item?;
            if lsn.get() > to_lsn {
                break;
            }
            self.scan_record(&mut scan, &in_run, lsn.get(), bytes)?;
        }
        Ok(scan)
    }

    fn scan_record(&self, scan: &mut RunScan, in_run: &RunMembers, lsn: u64, bytes: Bytes) -> Result<()> {
        let codec_error = |source: CodecError| Error::Codec { lsn, source };
        let (kind, subject) = self.shared.codec.peek(&bytes).map_err(codec_error)?;
        if !matches!(kind, RecordKind::AtomStarted | RecordKind::AtomCompleted | RecordKind::AtomReclaimed) {
            return Ok(());
        }
        if !in_run.contains(subject) {
            return Ok(());
        }
        if matches!(kind, RecordKind::AtomCompleted | RecordKind::AtomReclaimed) {
            scan.completions.insert(subject, bytes);
            return Ok(());
        }
        match self.shared.codec.decode(&bytes).map_err(codec_error)? {
            StoreRecord::AtomStarted(started) => {
                scan.parents.insert(started.atom, started.parents);
                Ok(())
            }
            _ => Err(Error::InconsistentLog { lsn, reason: "kind and body disagree" }),
        }
    }

    /// Reads and decompresses every completion record of `atom`'s run up to it, without
    /// decoding or applying anything: the bound a rebuild is measured against.
    #[doc(hidden)]
    pub fn read_and_decompress_run(&self, atom: AtomId) -> Result<usize> {
        let scan = self.scan_run(atom, None)?;
        let mut bytes = 0;
        for record in scan.completions.values() {
            bytes +=
                self.shared.codec.decompressed_body_len(record).map_err(|source| Error::Codec { lsn: 0, source })?;
        }
        Ok(bytes)
    }

    /// A verified snapshot's context, or why it cannot be used.
    fn load_snapshot(&self, atom: u64) -> Result<Result<Context, &'static str>> {
        let bytes = match snapshot::read(self.shared.log.storage().as_ref(), self.shared.log.dir(), atom)? {
            Ok(bytes) => bytes,
            Err(error) => return Ok(Err(error.reason())),
        };
        Ok(snapshot::decode(&bytes, atom).map_err(|error| error.reason()))
    }
}

/// Decodes the deltas of the completed atoms among `atoms` (ascending ids) in parallel and
/// applies them in order; returns how many were applied.
fn apply_deltas(
    store: &Store,
    scan: &RunScan,
    context: &mut Context,
    atoms: &[u64],
    pool: Option<&rayon::ThreadPool>,
) -> Result<usize> {
    let target = atoms.last().copied().unwrap_or(0);
    let completed: Vec<(u64, &Bytes)> = {
        let index = store.shared.index.read();
        atoms
            .iter()
            .filter(|id| index.atom(AtomId(**id)).is_some_and(|e| e.state == EntryState::Completed))
            // A completion after the rebuilt atom's last record is not part of its past.
            .filter_map(|id| scan.completions.get(id).map(|bytes| (*id, bytes)))
            .collect()
    };
    let decode = |(id, bytes): &(u64, &Bytes)| match store.shared.codec.decode(bytes) {
        Ok(StoreRecord::AtomCompleted(done)) => Ok(done.delta.unwrap_or_default()),
        Ok(StoreRecord::AtomReclaimed(_)) => Err(Error::HistoryReclaimed { atom: target, reclaimed: *id }),
        Ok(_) => Err(Error::InconsistentLog { lsn: 0, reason: "a completed atom's end is not a completion" }),
        Err(source) => Err(Error::Codec { lsn: *id, source }),
    };
    // Decode a bounded chunk in parallel, apply it in order, repeat: memory stays bounded by
    // the chunk however long the history is.
    for chunk in completed.chunks(limits::REPLAY_CHUNK_ATOMS) {
        let deltas: Vec<Result<_>> = match pool {
            Some(pool) => pool.install(|| chunk.par_iter().map(decode).collect()),
            None => chunk.iter().map(decode).collect(),
        };
        for delta in deltas {
            context.apply_owned(delta?);
        }
    }
    Ok(completed.len())
}

/// The shared pool rebuilds decode on: one thread per core, at most `REPLAY_THREADS_MAX`.
fn replay_pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    POOL.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        rayon::ThreadPoolBuilder::new()
            .num_threads(cores.min(limits::REPLAY_THREADS_MAX))
            .thread_name(|i| format!("continuum-replay-{i}"))
            .build()
            .ok()
    })
    .as_ref()
}
