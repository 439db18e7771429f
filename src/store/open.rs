//! Opening a store: the index rebuilt (from the index snapshot and the records after it, or
//! from the whole log), the snapshots listed and bound, loss evidence settled.

use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::codec::Codec;
use crate::error::Result;
use crate::log::Log;

use super::index::StoreIndex;
use super::{IndexSnapshotState, Shared, StoreRecoveryReport};
use super::{identity, index, index_snapshot, loss, policy, rebuild, training, types};

impl Shared {
    /// Rebuilds the index of the opened `log` (from `index snapshot`, the index snapshot already
    /// read, if it was; otherwise it is read here) and lists its snapshots. A `read_only` store
    /// never trains a dictionary (training appends one).
    pub(crate) fn new(
        log: Log,
        policies: policy::Policies,
        read_only: bool,
        found: Option<index_snapshot::Read>,
    ) -> Result<Self> {
        let codec =
            Codec::compressing_from(policies.compress_records_from).counting_into(log.metrics_handle().encoded_bytes());
        let index_snapshot = IndexSnapshotState::default();
        let found = found.unwrap_or_else(|| index_snapshot::read(log.storage().as_ref(), log.dir()));
        let store_id = identity::store_id(&log)?;
        let mut snapshots = crate::snapshot::list(log.storage().as_ref(), log.dir())?.into_iter().collect();
        if !read_only {
            // IMPORTANT: compaction relies on the snapshots listed here; their names are durable
            // before it can run.
            crate::snapshot::sync_dir_at_open(log.storage().as_ref(), log.dir())?;
            index_snapshot::remove_legacy(&log)?;
        }
        let opening =
            Opening { read_only, store_id, snapshots: &snapshots, index_snapshot_after: policies.index_snapshot_after };
        let (index, recovery) = open_index(&log, &codec, &opening, found, &index_snapshot)?;
        loss::settle(&recovery, log.config().recovery_mode, log.next_lsn().get())?;
        if !read_only {
            loss::clear_evidence(&log, &recovery, &mut snapshots)?;
            let completed =
                |atom| index.atom(types::AtomId(atom)).is_some_and(|e| e.state == index::EntryState::Completed);
            crate::snapshot::bind_all(log.storage().as_ref(), log.dir(), store_id, &snapshots, completed)?;
        }
        let training = match (read_only, codec.current_dictionary_len()) {
            (true, _) => training::Training::done(),
            (false, None) => training::Training::new(training::TrainingStage::First),
            // A first-stage dictionary (smaller than the final one's half): train the final one.
            (false, Some(len)) if len * 2 <= training::final_dictionary_bytes(log.config().segment_bytes) => {
                training::Training::new(training::TrainingStage::Final)
            }
            (false, Some(_)) => training::Training::done(),
        };
        let stop = Arc::new(super::stop::StopState::new(log.metrics_handle().stop_requests()));
        Ok(Shared {
            log,
            codec,
            store_id,
            recovery,
            identity: index.identity,
            index: RwLock::new(index),
            training_done: std::sync::atomic::AtomicBool::new(training.is_done()),
            training: Mutex::new(training),
            snapshots: Mutex::new(snapshots),
            policies,
            snapshot_clock: Mutex::new(policy::SnapshotClocks::default()),
            compacting: Mutex::new(()),
            purge: Mutex::new(()),
            #[cfg(test)]
            after_plan: Mutex::new(None),
            runs_changing: Mutex::new(()),
            control: Mutex::new(()),
            channels: crate::channel::ChannelState::default(),
            state: crate::shared_state::StateTable::default(),
            continuations: RwLock::new(Default::default()),
            closing: std::sync::atomic::AtomicBool::new(false),
            compaction_rounds: std::sync::atomic::AtomicU64::new(0),
            last_compaction: Mutex::new(None),
            index_snapshot,
            unsynced_snapshots: Mutex::new(std::collections::BTreeSet::new()),
            targeted_scans: std::sync::atomic::AtomicBool::new(true),
            stop,
            leases: Default::default(),
        })
    }

    /// Starts a thread that publishes the index snapshot of the open's fold, if the open left one
    /// (`None` if not, or if the thread cannot start: the index snapshot is then dropped, which
    /// costs only the next open's time).
    pub(crate) fn write_pending_index_snapshot(shared: &Arc<Shared>) -> Option<std::thread::JoinHandle<()>> {
        shared.index_snapshot.pending.lock().as_ref()?;
        let shared = Arc::clone(shared);
        let spawned = std::thread::Builder::new().name("continuum-index snapshot-write".into()).spawn(move || {
            let Some((covered, bytes)) = shared.index_snapshot.pending.lock().take() else { return };
            // Compaction cannot start a change while this holds the lock; one that already
            // changed a segment since the open bumped `log_changes`.
            let _no_compaction = shared.compacting.lock();
            // Nothing changed a segment since the open, and no newer index snapshot was written
            // meanwhile (`write_index_snapshot` on the background thread).
            if shared.index_snapshot.log_changes.load(std::sync::atomic::Ordering::Acquire) != 0
                || shared.index_snapshot.covered.load(std::sync::atomic::Ordering::Relaxed) >= covered
            {
                return;
            }
            if let Err(error) = shared.publish_index_snapshot(covered, &bytes) {
                shared.log.metrics_handle().record_maintenance_failure();
                tracing::warn!(%error, "index snapshot not written after open");
            }
        });
        spawned.ok()
    }
}

/// What an open knows before it rebuilds the index.
struct Opening<'a> {
    read_only: bool,
    /// The log's store id.
    store_id: u64,
    /// Atoms with a snapshot file.
    snapshots: &'a std::collections::BTreeSet<u64>,
    /// Records a fold must cover for the open to write an index snapshot of it.
    index_snapshot_after: u64,
}

/// Rebuilds the index: from the index snapshot and the records after it if there is a usable
/// one, from the whole log otherwise; writes a new index snapshot when the fold covered at least
/// `checkpoint_after` records (not for a read-only store). An index snapshot that cannot
/// be written costs only the next open's time: it is logged, not returned. Returns the index
/// and the evidence of lost records the index snapshot and the snapshots give.
fn open_index(
    log: &Log,
    codec: &Codec,
    opening: &Opening<'_>,
    index_snapshot: index_snapshot::Read,
    written: &IndexSnapshotState,
) -> Result<(StoreIndex, StoreRecoveryReport)> {
    let (read_only, index_snapshot_after) = (opening.read_only, opening.index_snapshot_after);
    let started = std::time::Instant::now();
    let covered_beyond = index_snapshot::beyond_log(&index_snapshot, log, opening.store_id);
    let (loaded, ignored) = match index_snapshot::accept(index_snapshot, log, codec) {
        Ok(state) => (Some(state), None),
        Err(reason) => (None, reason),
    };
    let from = loaded.as_ref().map_or(0, |state| state.next_lsn);
    written.covered.store(from, std::sync::atomic::Ordering::Relaxed);
    *written.at_open.lock() = (from, ignored);
    let start = loaded.unwrap_or_else(|| rebuild::FoldState::new(index::IdentityHasher::random()));
    let state = rebuild::fold_from(log, codec, start, log.next_lsn().get())?;
    let folded = state.next_lsn - from.max(log.first_lsn().get()).min(state.next_lsn);
    let atoms = state.index.atoms.iter().filter(|(_, entry)| entry.state.status().is_some()).count() as u64;
    let time_to_resume = log.recovery_report().duration + started.elapsed();
    log.metrics_handle().record_index_rebuild(atoms, time_to_resume);
    tracing::info!(
        atoms,
        runs = state.index.runs.len(),
        from_index_snapshot_lsn = from,
        records_folded = folded,
        time_to_resume_us = time_to_resume.as_micros() as u64,
        "store index rebuilt"
    );
    if !read_only && folded >= index_snapshot_after {
        // The recovered records are durable before an index snapshot covering them is. The file is
        // written by `StoreBuilder::open`'s writer thread, off the open's path.
        match log.sync().and_then(|()| index_snapshot::encode(&state, log)) {
            Ok(bytes) => *written.pending.lock() = Some((state.next_lsn, bytes)),
            Err(error) => {
                log.metrics_handle().record_maintenance_failure();
                tracing::warn!(%error, "index snapshot not written at open");
            }
        }
    }
    let storage = log.storage().as_ref();
    let verified = |atom| {
        let bytes = crate::snapshot::read(storage, log.dir(), atom).ok().and_then(std::result::Result::ok);
        bytes.is_some_and(|bytes| crate::snapshot::verify(&bytes, atom, opening.store_id).is_ok())
    };
    let recovery = loss::find(log, &state, covered_beyond, opening.snapshots, verified);
    Ok((state.finish()?, recovery))
}
