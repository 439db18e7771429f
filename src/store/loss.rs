//! Evidence, found when a store opens, that acknowledged records existed past the end of the
//! log (invariant 10): an index snapshot of this store covering LSNs the log no longer has,
//! or a snapshot of this store of an atom whose completion the log no longer holds. Both are
//! written only after the log is synced through what they cover, so neither can outlive the
//! records it depends on without a loss. [`RecoveryMode::Strict`] refuses such a store; the
//! other modes report the loss ([`Store::recovery_report`](crate::Store::recovery_report)),
//! and a writable open then clears the evidence (the index snapshot deleted, each such snapshot
//! set aside as `.snap.lost`), so that no later atom reuses a lost atom's snapshot and the loss
//! is reported once, as a cut torn tail is.

use std::collections::BTreeSet;
use std::fmt;

use crate::config::RecoveryMode;
use crate::error::{Error, Result};
use crate::log::{Log, Lsn};
use crate::store::index::{EntryState, StoreIndex};
use crate::store::rebuild::FoldState;
use crate::store::types::AtomId;

/// One piece of evidence that acknowledged records existed past the end of the log.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossEvidence {
    /// The store's index snapshot covers every record below `covered`, but the log ends at
    /// `log_end`: the records `log_end..covered` were durable and are gone.
    IndexSnapshot {
        /// The LSN the index snapshot covers up to (exclusive).
        covered: Lsn,
        /// The LSN after the log's last record.
        log_end: Lsn,
    },
    /// The store holds a verified snapshot of `atom`, written once the atom's completion was
    /// durable, but the log no longer holds that completion.
    Snapshot {
        /// The atom.
        atom: AtomId,
    },
}

impl fmt::Display for LossEvidence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LossEvidence::IndexSnapshot { covered, log_end } => write!(
                f,
                "the index snapshot covers LSNs up to {} but the log ends at LSN {}: {} records lost",
                covered.get(),
                log_end.get(),
                covered.get() - log_end.get()
            ),
            LossEvidence::Snapshot { atom } => {
                write!(f, "a snapshot of atom {} exists but the log no longer holds its completion", atom.get())
            }
        }
    }
}

/// What a store's open found of records lost from the end of its log
/// ([`Store::recovery_report`](crate::Store::recovery_report)); the log's own report
/// (torn tail, skipped ranges) is [`Log::recovery_report`](crate::Log::recovery_report).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreRecoveryReport {
    /// Every piece of evidence of lost records, index snapshot first, then snapshots by
    /// atom. Empty when nothing shows a loss.
    pub lost: Vec<LossEvidence>,
    /// Records known lost: LSNs past the end of the log the evidence shows were written (a
    /// lower bound; 0 when the evidence names no LSN).
    pub lost_records: u64,
    /// Atoms known to have completed whose completion is gone (a lower bound).
    pub lost_atoms: u64,
}

impl StoreRecoveryReport {
    /// Whether nothing shows a loss.
    pub fn is_lossless(&self) -> bool {
        self.lost.is_empty()
    }
}

/// The evidence `state` (the fold of the whole log, unfinished), the index snapshot's
/// covered LSN if it lies past the log (`index_snapshot_covered`) and the snapshot files
/// (`snapshots`, verified by `verified`) give of lost records.
pub(crate) fn find(
    log: &Log,
    state: &FoldState,
    index_snapshot_covered: Option<u64>,
    snapshots: &BTreeSet<u64>,
    verified: impl Fn(u64) -> bool,
) -> StoreRecoveryReport {
    let mut report = StoreRecoveryReport::default();
    let log_end = log.next_lsn().get();
    if let Some(covered) = index_snapshot_covered.filter(|covered| *covered > log_end) {
        report.lost.push(LossEvidence::IndexSnapshot { covered: Lsn::new(covered), log_end: Lsn::new(log_end) });
        report.lost_records = covered - log_end;
    }
    for &atom in snapshots {
        if completion_lost(&state.index, state.orphans.dropped_below, atom) && verified(atom) {
            report.lost.push(LossEvidence::Snapshot { atom: AtomId(atom) });
            report.lost_atoms += 1;
        }
    }
    report
}

/// Whether a snapshot of `atom` shows a completion the index does not hold: the atom is past
/// every id the log names, or it started and did not complete, or it is vacant though no
/// dropped run can explain it (a snapshot is written only of a completed atom).
fn completion_lost(index: &StoreIndex, dropped_below: u64, atom: u64) -> bool {
    let Some(entry) = atom.checked_sub(1).and_then(|at| index.atoms.get(usize::try_from(at).ok()?)) else {
        return atom != 0;
    };
    match entry.state {
        EntryState::Completed => false,
        EntryState::Vacant => atom >= dropped_below,
        // A failure after a completion is refused: the completion came after it and is gone.
        _ => true,
    }
}

/// Applies `mode` to what `report` found: [`RecoveryMode::Strict`] fails the open with the
/// first piece of evidence; the other modes log each one.
pub(crate) fn settle(report: &StoreRecoveryReport, mode: RecoveryMode, log_end: u64) -> Result<()> {
    let Some(first) = report.lost.first() else { return Ok(()) };
    if mode == RecoveryMode::Strict {
        return Err(Error::RecordsLost { evidence: first.clone(), log_end });
    }
    for evidence in &report.lost {
        tracing::error!(%evidence, "acknowledged records were lost from the end of the log");
    }
    Ok(())
}

/// Clears the evidence `report` lists (a writable open, once the loss is reported): deletes the
/// index snapshot (a cache), and sets each snapshot of a lost atom aside as
/// `NNNNNNNNNNNNNNNNNNNN.snap.lost` (its context may be worth salvaging; as a snapshot, a later
/// atom given the same id would be rebuilt from it). Durable before the open acknowledges
/// anything.
pub(crate) fn clear_evidence(log: &Log, report: &StoreRecoveryReport, snapshots: &mut BTreeSet<u64>) -> Result<()> {
    let storage = log.storage().as_ref();
    let mut removed_snapshot = false;
    for evidence in &report.lost {
        match evidence {
            LossEvidence::IndexSnapshot { .. } => crate::store::index_snapshot::remove(log)?,
            LossEvidence::Snapshot { atom } => {
                let path = crate::snapshot::path(log.dir(), atom.get());
                let aside = crate::snapshot::lost_path(log.dir(), atom.get());
                storage.rename(&path, &aside).map_err(|e| Error::io("rename", &path, e))?;
                snapshots.remove(&atom.get());
                removed_snapshot = true;
            }
        }
    }
    if removed_snapshot {
        // IMPORTANT: the lost atoms' snapshots are durably gone before their ids are reused.
        crate::snapshot::sync_dir(storage, log.dir())?;
    }
    Ok(())
}
