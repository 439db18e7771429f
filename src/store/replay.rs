//! Rebuilding an agent's context at any atom (its head, or any point of its history: time
//! travel): the newest usable, valid snapshot on the atom's ancestry, then the deltas of the
//! completed atoms after it, in DAG order. The DAG order is atom-id order (a topological
//! order: parents always have smaller ids), so a context is the same however it is rebuilt. A snapshot that fails its SHA-256 or does not decode is never used: the
//! rebuild falls back to an older one, or to the log from the start, and reports it.

use std::collections::BTreeSet;

use crate::codec::StoreRecord;
use crate::context::Context;
use crate::error::{Error, Result};
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

impl Store {
    /// The context of `atom`'s agent as of `atom`: the fold of the deltas of every completed
    /// atom among `atom` and its ancestors, in DAG order.
    ///
    /// # Errors
    /// [`Error::UnknownAtom`], and read or decode errors of the log.
    pub fn rebuild_context(&self, atom: AtomId) -> Result<Rebuilt> {
        let ancestry = self.ancestry(atom)?;
        let candidates: Vec<u64> = {
            let snapshots = self.snapshots.lock();
            ancestry.iter().rev().filter(|id| snapshots.contains(id)).copied().collect()
        };
        let mut fallbacks = Vec::new();
        for candidate in candidates {
            // A snapshot of S folds S's ancestry in id order. It can start T's rebuild only if
            // every ancestor of T up to S is also an ancestor of S: then the rest of T's
            // ancestry comes after S, and the fold order is T's own id order.
            let covered = self.ancestry(AtomId(candidate))?;
            if ancestry.range(..=candidate).count() != covered.len() {
                continue;
            }
            match self.load_snapshot(candidate)? {
                Ok(mut context) => {
                    let pending: Vec<u64> = ancestry.difference(&covered).copied().collect();
                    let atoms_applied = self.apply_deltas(&mut context, &pending)?;
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
        let mut context = Context::new();
        let pending: Vec<u64> = ancestry.into_iter().collect();
        let atoms_applied = self.apply_deltas(&mut context, &pending)?;
        Ok(Rebuilt { context, snapshot: None, fallbacks, atoms_applied })
    }

    /// Writes a snapshot of the context as of `atom`, which must have completed.
    ///
    /// # Errors
    /// [`Error::UnknownAtom`], [`Error::InvalidTransition`] if the atom has not completed, and
    /// the file system's errors.
    pub fn snapshot_now(&self, atom: AtomId) -> Result<()> {
        let status = self.index.read().atom(atom).and_then(|entry| entry.state.status());
        match status {
            Some(AtomStatus::Completed) => {}
            Some(_) => return Err(Error::InvalidTransition { atom: atom.0, from: "unfinished", to: "snapshotted" }),
            None => return Err(Error::UnknownAtom { atom: atom.0 }),
        }
        let rebuilt = self.rebuild_context(atom)?;
        let bytes = snapshot::encode(atom.0, &rebuilt.context)?;
        snapshot::publish(self.log.storage().as_ref(), self.log.dir(), atom.0, &bytes)?;
        self.snapshots.lock().insert(atom.0);
        Ok(())
    }

    /// Atoms that have a snapshot file.
    pub fn snapshots(&self) -> Vec<AtomId> {
        self.snapshots.lock().iter().map(|atom| AtomId(*atom)).collect()
    }

    /// `atom` and all its ancestors, as a set ordered by id (a topological order).
    fn ancestry(&self, atom: AtomId) -> Result<BTreeSet<u64>> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![atom.0];
        while let Some(id) = stack.pop() {
            if !seen.insert(id) {
                continue;
            }
            let started_lsn = self.index.read().atom(AtomId(id)).map(|entry| entry.started_lsn);
            let started_lsn = started_lsn.filter(|lsn| *lsn != 0).ok_or(Error::UnknownAtom { atom: id })?;
            match self.read_record(started_lsn)? {
                StoreRecord::AtomStarted(started) => stack.extend(started.parents),
                _ => {
                    return Err(Error::InconsistentLog {
                        lsn: started_lsn,
                        reason: "an atom's start is not a start record",
                    });
                }
            }
        }
        Ok(seen)
    }

    /// Applies the deltas of the completed atoms among `atoms` (ascending ids); returns how many.
    fn apply_deltas(&self, context: &mut Context, atoms: &[u64]) -> Result<usize> {
        let mut applied = 0;
        for &id in atoms {
            let entry = self.index.read().atom(AtomId(id)).copied();
            let Some(entry) = entry.filter(|entry| entry.state == EntryState::Completed) else { continue };
            match self.read_record(entry.ended_lsn)? {
                StoreRecord::AtomCompleted(done) => {
                    context.apply(&done.delta.unwrap_or_default());
                    applied += 1;
                }
                _ => {
                    return Err(Error::InconsistentLog {
                        lsn: entry.ended_lsn,
                        reason: "a completed atom's end is not a completion",
                    });
                }
            }
        }
        Ok(applied)
    }

    /// A verified snapshot's context, or why it cannot be used.
    fn load_snapshot(&self, atom: u64) -> Result<Result<Context, &'static str>> {
        let bytes = match snapshot::read(self.log.storage().as_ref(), self.log.dir(), atom)? {
            Ok(bytes) => bytes,
            Err(error) => return Ok(Err(error.reason())),
        };
        Ok(snapshot::decode(&bytes, atom).map_err(|error| error.reason()))
    }
}
