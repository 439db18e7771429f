//! [`Store`]: runs, agents and atoms on top of the [`Log`]. Every write is a log record (see
//! `continuum.proto`); the in-memory index is rebuilt from the log on open.
//!
//! The atom protocol: `begin` writes a start record (ordered, not synced on its own), the
//! closure runs, `complete` or `fail` writes the end record with `Sync` durability, which also
//! makes the start durable; only then is the result handed back. After a crash, [`Store::resume`]
//! tells each agent where it stands and [`Store::execute`] returns recorded outputs instead of
//! running completed atoms again.

pub(crate) mod atom_table;
pub(crate) mod atoms;
pub(crate) mod ballast;
pub(crate) mod batch;
pub(crate) mod branches;
pub(crate) mod builder;
pub(crate) mod control;
pub(crate) mod guard;
pub(crate) mod history;
pub(crate) mod identity;
pub(crate) mod index;
pub(crate) mod index_snapshot;
pub(crate) mod inspect;
pub(crate) mod keys;
pub(crate) mod log_view;
pub(crate) mod loss;
pub(crate) mod open;
pub(crate) mod policy;
pub(crate) mod pool;
pub(crate) mod reads;
pub(crate) mod rebuild;
pub(crate) mod runs;
pub(crate) mod stop;
pub(crate) mod training;
pub(crate) mod types;

use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::{Mutex, RwLock};

use crate::codec::{Codec, StoreRecord};
use crate::config::Durability;
use crate::error::{Error, Result};
use crate::log::{Log, Lsn};

use index::StoreIndex;

use crate::purge::CompactionReport;
pub use builder::StoreBuilder;
pub(crate) use control::stripe_of;
pub use control::{CONTROL_AGENT_PREFIX, is_control_agent};
pub use history::History;
pub use inspect::{RecordDecoder, RecordInfo, RunInfo};
pub use log_view::LogView;
pub use loss::{LossEvidence, StoreRecoveryReport};
pub use policy::{CompactionPolicy, RetentionPolicy, SnapshotPolicy};
pub use stop::StopToken;
pub use types::{
    AgentResume, Atom, AtomFailure, AtomId, AtomOutput, AtomStatus, Executed, ResumeReport, RunId, RunSpec, RunStatus,
};

/// The index snapshot's file name in a store directory (for the fuzz seeds).
pub(crate) const INDEX_SNAPSHOT_FILE_NAME: &str = index_snapshot::FILE_NAME;

/// Whether `body` decodes as an index snapshot's body (for the fuzz target).
pub(crate) fn index_snapshot_body_decodes(body: &[u8]) -> bool {
    index_snapshot::parse_body(body)
}

/// Folds `log` into an index on one thread and pipelined, which must agree (for the fuzz
/// target).
pub(crate) fn folds_agree(log: &Log) {
    rebuild::folds_agree(log);
}

impl Shared {
    /// Sets the ballast aside if the store has one configured and the disk has the room (best
    /// effort: without it the store works, with no reserve).
    fn ensure_ballast(&self) {
        let bytes = self.policies.ballast_bytes;
        if bytes == 0 {
            return;
        }
        match ballast::ensure(self.log.storage().as_ref(), self.log.dir(), bytes) {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(bytes, "no room for the ballast: a full disk may keep compaction from freeing space")
            }
            Err(error) => tracing::warn!(%error, "the ballast was not set aside"),
        }
    }

    /// Gives the ballast back (a compaction round ran out of space); returns whether there was
    /// one to give.
    pub(crate) fn release_ballast(&self) -> bool {
        if self.policies.ballast_bytes == 0 {
            return false;
        }
        match ballast::release(self.log.storage().as_ref(), self.log.dir()) {
            Ok(released) => released,
            Err(error) => {
                tracing::warn!(%error, "the ballast could not be given back");
                false
            }
        }
    }

    /// Syncs the snapshot directory if a policy snapshot's name is not durable yet, or always
    /// (`always`: after writing an explicit snapshot or deleting snapshots). A compaction round
    /// calls it first, so that the snapshots it relies on are durable; so does a clean close.
    ///
    /// # Errors
    /// The directory sync's; the snapshots stay unsynced then.
    pub(crate) fn sync_snapshot_dir(&self, always: bool) -> Result<()> {
        // Held across the sync: nothing reads the set as durable before the sync is done.
        let mut unsynced = self.unsynced_snapshots.lock();
        if unsynced.is_empty() && !always {
            return Ok(());
        }
        crate::snapshot::sync_dir(self.log.storage().as_ref(), self.log.dir())?;
        unsynced.clear();
        Ok(())
    }

    /// The snapshots whose names are durable: what compaction may rely on. A policy snapshot
    /// published after the round's directory sync is left out until the next round.
    pub(crate) fn durable_snapshots(&self) -> std::collections::BTreeSet<u64> {
        // The set first: a snapshot enters `unsynced_snapshots` before it enters the set.
        let mut snapshots = self.snapshots.lock().clone();
        for atom in self.unsynced_snapshots.lock().iter() {
            snapshots.remove(atom);
        }
        snapshots
    }

    /// The bytes of an index snapshot covering exactly the records below `until` (at most the
    /// log's end), built as [`Store::write_index_snapshot`] builds one: the index snapshot on
    /// disk if it covers exactly those, else a fold from it (if it covers no more) or from
    /// the log's start. Nothing is written; what ships the log uses it.
    #[cfg(feature = "object-store")]
    pub(crate) fn index_snapshot_until(&self, until: u64) -> Result<Vec<u8>> {
        assert!(until <= self.log.next_lsn().get(), "an index snapshot past the log's end");
        let _no_compaction = self.compacting.lock();
        if let Some(bytes) = index_snapshot::file_covering(&self.log, until) {
            return Ok(bytes);
        }
        let codec = Codec::default();
        let covered = self.index_snapshot.covered.load(std::sync::atomic::Ordering::Relaxed);
        let start = (covered != 0 && covered <= until)
            .then(|| index_snapshot::load(&self.log, &codec))
            .flatten()
            .filter(|state| state.next_lsn <= until)
            .unwrap_or_else(|| rebuild::FoldState::new(index::IdentityHasher::random()));
        let state = rebuild::fold_from(&self.log, &codec, start, until)?;
        index_snapshot::encode(&state, &self.log)
    }

    /// The index snapshot on disk, loaded and checked against the log, if this store has
    /// one (compaction patches it).
    pub(crate) fn loaded_index_snapshot(&self) -> Option<rebuild::FoldState> {
        if self.index_snapshot.covered.load(std::sync::atomic::Ordering::Relaxed) == 0 {
            return None;
        }
        index_snapshot::load(&self.log, &Codec::default())
    }

    /// Publishes the index snapshot `bytes`, which cover the records below `covered` (the
    /// caller holds the compaction lock).
    pub(crate) fn publish_index_snapshot(&self, covered: u64, bytes: &[u8]) -> Result<()> {
        index_snapshot::publish(&self.log, bytes)?;
        self.index_snapshot.covered.store(covered, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Deletes the index snapshot, durably (before anything changes the records it covers).
    pub(crate) fn remove_index_snapshot(&self) -> Result<()> {
        self.index_snapshot.log_changes.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        index_snapshot::remove(&self.log)?;
        self.index_snapshot.covered.store(0, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

/// What the store knows of its index snapshot file.
#[derive(Debug, Default)]
pub(crate) struct IndexSnapshotState {
    /// The LSN the index snapshot on disk covers (records below it are in it); 0 if none.
    covered: std::sync::atomic::AtomicU64,
    /// The LSN the index snapshot the open used covers (0 if it folded the whole log), and why it
    /// ignored the one it found, if it did.
    at_open: Mutex<(u64, Option<index_snapshot::Unusable>)>,
    /// An index snapshot of the open's fold (the LSN it covers and its bytes), until the writer
    /// thread publishes it.
    pending: Mutex<Option<(u64, Vec<u8>)>>,
    /// Bumped (under the compaction lock) before compaction changes a segment: an index snapshot
    /// folded before the bump must not be published after it.
    log_changes: std::sync::atomic::AtomicU64,
}

impl IndexSnapshotState {
    /// The LSN the index snapshot on disk covers; 0 if there is none.
    #[cfg(feature = "object-store")]
    pub(crate) fn covered(&self) -> u64 {
        self.covered.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// What a store knows of its index snapshot ([`Store::index_snapshot`]): a cache of the
/// index rebuild on open (`docs/ARCHITECTURE.md`, "Index snapshot").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexSnapshotInfo {
    /// The LSN the newest index snapshot covers (every record below it is in it), if one exists
    /// that this store opened from or wrote.
    pub covered: Option<Lsn>,
    /// Records after it: what the next open would fold (all of the log's records if there is
    /// no index snapshot).
    pub records_after: u64,
    /// The LSN the index snapshot the open used covered, or `None` if the open folded the whole
    /// log.
    pub opened_from: Option<Lsn>,
    /// Why the open ignored the index snapshot it found (damaged, stale, another log's...), if it
    /// did.
    pub ignored_at_open: Option<String>,
}

/// The continuity store. `Send + Sync`: share it between agent threads behind an `Arc`.
pub struct Store {
    /// The background thread, owned by the handle the user opened (absent in the temporary
    /// handles the thread itself works through, and when disabled). Declared first: it is
    /// stopped before the store's files are closed.
    pub(crate) worker: Option<crate::purge::background::Worker>,
    /// The shipping thread (`ship/`), owned as the worker is; stopped after a last cycle
    /// before the store's files are closed.
    #[cfg(feature = "object-store")]
    pub(crate) shipper: Option<crate::ship::Shipper>,
    pub(crate) shared: Arc<Shared>,
    /// Opened by [`StoreBuilder::open`] (not a view): index snapshots the index when dropped.
    pub(crate) owner: bool,
    /// The thread publishing the index snapshot of the open's fold, if one runs.
    pub(crate) index_snapshot_writer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Drop for Store {
    /// Stops the background thread, then writes an index snapshot if at least
    /// `index_snapshot_after` records came after the newest one (a failure is logged:
    /// it costs only the next open's time).
    fn drop(&mut self) {
        drop(self.worker.take());
        self.wait_for_index_snapshot_writer();
        if let Err(error) = self.shared.sync_snapshot_dir(false) {
            tracing::warn!(%error, "snapshot directory not synced at close");
        }
        if self.owner
            && self.records_after_index_snapshot() >= self.shared.policies.index_snapshot_after
            && let Err(error) = self.write_index_snapshot()
        {
            tracing::warn!(%error, "index snapshot not written at close");
        }
        // Last: the shipping thread's last cycle ships the close's index snapshot too.
        #[cfg(feature = "object-store")]
        drop(self.shipper.take());
    }
}

/// Everything a store holds, shared with its background thread.
pub(crate) struct Shared {
    pub(crate) log: Log,
    pub(crate) codec: Codec,
    /// The store id every segment header holds; snapshots and index snapshots repeat it.
    pub(crate) store_id: u64,
    /// What the open found lost from the end of the log.
    pub(crate) recovery: StoreRecoveryReport,
    /// The index's identity hasher (fixed for the store's lifetime in this process), for
    /// hashing a key before taking the index lock.
    pub(crate) identity: index::IdentityHasher,
    pub(crate) index: RwLock<StoreIndex>,
    pub(crate) training: Mutex<training::Training>,
    /// Set once `training` reaches its last stage: completions then skip its lock (taken by
    /// every completion otherwise, by all of a burst's writers at once).
    pub(crate) training_done: std::sync::atomic::AtomicBool,
    /// Atoms with a snapshot file.
    pub(crate) snapshots: Mutex<std::collections::BTreeSet<u64>>,
    pub(crate) policies: policy::Policies,
    /// Per agent: completed atoms and time since its last snapshot.
    pub(crate) snapshot_clock: Mutex<policy::SnapshotClocks>,
    /// Compaction runs one at a time.
    pub(crate) compacting: Mutex<()>,
    /// Held while a compaction round plans what is live and marks what it releases, and by
    /// everything that changes what is live (rollback, fork, pin): no plan is made from heads
    /// that change under it (`purge/plan.rs`). Taken after `compacting`, never before it.
    pub(crate) purge: Mutex<()>,
    /// Called by a compaction round between its plan and its marks (tests of the purge lock).
    #[cfg(test)]
    pub(crate) after_plan: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    /// Held while a run is created or finished: their records are appended one at a time,
    /// without the index lock.
    pub(crate) runs_changing: Mutex<()>,
    /// Held across a check of a run's control atoms and the control atom it decides to record
    /// (`store/control.rs`).
    pub(crate) control: Mutex<()>,
    /// Channels' shared state: the consumers' commit locks and the signal a landed message
    /// wakes waiting receivers with (`channel/`).
    pub(crate) channels: crate::channel::ChannelState,
    /// Shared state's key locks and newest versions (`shared_state/`).
    pub(crate) state: crate::shared_state::StateTable,
    /// The suspended runs (`continuation/table.rs`). Taken after `index` when both are held.
    pub(crate) continuations: RwLock<crate::continuation::table::Suspensions>,
    /// Set when the owning handle is dropped: a compaction round stops between segments.
    pub(crate) closing: std::sync::atomic::AtomicBool,
    /// Compaction rounds completed since open, and the last one's report.
    pub(crate) compaction_rounds: std::sync::atomic::AtomicU64,
    pub(crate) last_compaction: Mutex<Option<CompactionReport>>,
    /// The index snapshot on disk.
    pub(crate) index_snapshot: IndexSnapshotState,
    /// Policy snapshots renamed into place since the snapshot directory was last synced: their
    /// names are not durable yet, so compaction does not rely on them. Held while the
    /// directory syncs.
    pub(crate) unsynced_snapshots: Mutex<std::collections::BTreeSet<u64>>,
    /// Whether rebuilds may read only their run's records (see `Store::set_targeted_scans`).
    pub(crate) targeted_scans: std::sync::atomic::AtomicBool,
    /// The stop request and the atoms and runs in flight (`store/stop.rs`), shared with the
    /// store's stop tokens.
    pub(crate) stop: Arc<stop::StopState>,
    /// The runs' leases: their locks, the cache of their newest lease atoms, the atoms begun
    /// under one (`lease/`). Its locks are taken before `index`.
    pub(crate) leases: crate::lease::LeaseState,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("log", &self.shared.log).finish()
    }
}

impl Store {
    /// Opens (or creates) the store in `dir` with default settings.
    ///
    /// # Errors
    /// As [`StoreBuilder::open`].
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        Self::builder(dir).open()
    }

    /// A builder for a store in `dir`.
    pub fn builder(dir: impl AsRef<Path>) -> StoreBuilder {
        StoreBuilder {
            log: Log::builder(dir),
            policies: policy::Policies::default(),
            background: true,
            #[cfg(feature = "object-store")]
            remote: None,
        }
    }

    /// A handle over `shared` without a worker: what the background thread works through.
    pub(crate) fn view(shared: Arc<Shared>) -> Self {
        Store {
            worker: None,
            #[cfg(feature = "object-store")]
            shipper: None,
            shared,
            owner: false,
            index_snapshot_writer: Mutex::new(None),
        }
    }

    /// A read-only view of the store's log: its records, segments, recovery report and
    /// counters. Only the store appends to its log (its index must describe every record);
    /// [`Store::sync`] makes its atoms durable.
    pub fn log(&self) -> LogView<'_> {
        LogView::from(&self.shared.log)
    }

    /// Makes every atom ended so far durable (one `fdatasync`, shared with concurrent
    /// writers): what a store opened with [`StoreBuilder::atom_durability`]`(Buffered)` calls
    /// before it acts on its atoms outside the process. A no-op's cost with the default `Sync`.
    ///
    /// # Errors
    /// [`Error::Poisoned`] after an earlier failed write or sync, and the sync's [`Error::Io`].
    pub fn sync(&self) -> Result<()> {
        self.shared.log.sync()
    }

    /// Writes an index snapshot covering every record appended so far, so that the next open
    /// folds only the records after it (`docs/ARCHITECTURE.md`, "Index snapshot"). The
    /// index snapshot is built the way an open builds the index: the newest index snapshot (if usable)
    /// plus a fold of the records after it, never a copy of the live index. The store also
    /// does this on its own (see [`StoreBuilder::index_snapshot_after`]). Compaction deletes
    /// the index snapshot before it changes a segment, and writes it again patched after a round
    /// that only stripped deltas. Waits for a compaction round in progress, and holds
    /// compaction off while it folds. Returns the LSN the index snapshot covers (records below
    /// it).
    ///
    /// # Errors
    /// The log's errors (a poisoned or read-only log cannot be covered by an index snapshot), an inconsistent
    /// log, and I/O errors writing the file.
    pub fn write_index_snapshot(&self) -> Result<Lsn> {
        self.wait_for_index_snapshot_writer();
        let shared = &self.shared;
        // No compaction may change the log while it is folded and its index snapshot written.
        let _no_compaction = shared.compacting.lock();
        let until = shared.log.next_lsn().get();
        // IMPORTANT: the records an index snapshot covers are durable before it is.
        shared.log.sync()?;
        let codec = Codec::default();
        let start = index_snapshot::load(&shared.log, &codec)
            .unwrap_or_else(|| rebuild::FoldState::new(index::IdentityHasher::random()));
        let state = rebuild::fold_from(&shared.log, &codec, start, until)?;
        shared.publish_index_snapshot(state.next_lsn, &index_snapshot::encode(&state, &shared.log)?)?;
        Ok(Lsn::new(state.next_lsn))
    }

    /// What the open found of records lost from the end of the log: evidence (an index
    /// index snapshot or snapshots of this store) that acknowledged records existed past its end.
    /// Empty after a lossless open; [`RecoveryMode::Strict`](crate::RecoveryMode::Strict) refuses to open instead. The log's
    /// own findings (torn tail, skipped ranges) are in the log's
    /// [`recovery_report`](crate::Log::recovery_report).
    pub fn recovery_report(&self) -> &StoreRecoveryReport {
        &self.shared.recovery
    }

    /// What this store knows of its index snapshot: the LSN the newest one covers, the
    /// records after it, and whether the open used one (or why it ignored the one it found).
    pub fn index_snapshot(&self) -> IndexSnapshotInfo {
        // One load for both fields: the background thread may publish a newer index snapshot
        // between two (covering its records: `records_after` would then belong to another).
        let covered = self.shared.index_snapshot.covered.load(std::sync::atomic::Ordering::Relaxed);
        let (opened_from, ignored) = *self.shared.index_snapshot.at_open.lock();
        IndexSnapshotInfo {
            covered: (covered != 0).then(|| Lsn::new(covered)),
            records_after: self.lag_after(covered).0,
            opened_from: (opened_from != 0).then(|| Lsn::new(opened_from)),
            ignored_at_open: ignored.map(str::to_owned),
        }
    }

    /// Closes the store: stops the background thread, then writes an index snapshot if at
    /// least `index_snapshot_after` records came after the newest one (what dropping the
    /// store does, with the error returned instead of logged).
    ///
    /// # Errors
    /// The errors of [`Store::write_index_snapshot`]; the store is closed either way.
    pub fn close(mut self) -> Result<()> {
        drop(self.worker.take());
        self.wait_for_index_snapshot_writer();
        let snapshots = self.shared.sync_snapshot_dir(false);
        let due = self.owner && self.records_after_index_snapshot() >= self.shared.policies.index_snapshot_after;
        // Dropping `self` afterwards must not try again.
        self.owner = false;
        let index_snapshot = if due { self.write_index_snapshot().map(|_| ()) } else { Ok(()) };
        // Last: the shipping thread's last cycle ships the close's index snapshot too.
        #[cfg(feature = "object-store")]
        drop(self.shipper.take());
        snapshots.and(index_snapshot)
    }

    /// What [`Store::close`] makes durable, through a handle other threads share
    /// ([`crate::shutdown::close`]): the log synced, the snapshot directory synced, an index
    /// snapshot written if one is due. The background thread is told to stop, not joined.
    ///
    /// # Errors
    /// The sync's, and those of [`Store::write_index_snapshot`].
    pub(crate) fn close_shared(&self) -> Result<()> {
        // A compaction round stops between segments: the index snapshot need not wait for it.
        self.shared.closing.store(true, std::sync::atomic::Ordering::Release);
        self.wait_for_index_snapshot_writer();
        // IMPORTANT: atoms acknowledged under a buffered durability are synced before the exit.
        let synced = self.shared.log.sync();
        let snapshots = self.shared.sync_snapshot_dir(false);
        let due = self.owner && self.records_after_index_snapshot() >= self.shared.policies.index_snapshot_after;
        let index_snapshot = if due { self.write_index_snapshot().map(|_| ()) } else { Ok(()) };
        synced.and(snapshots).and(index_snapshot)
    }

    /// Waits until the index snapshot of the open's fold, if one is being written, is published.
    pub(crate) fn wait_for_index_snapshot_writer(&self) {
        if let Some(thread) = self.index_snapshot_writer.lock().take() {
            let _ = thread.join();
        }
    }

    /// Records appended since the newest index snapshot (all of them if there is none).
    fn records_after_index_snapshot(&self) -> u64 {
        self.index_snapshot_lag().0
    }

    /// Records after the newest index snapshot (all of them if there is none), and records
    /// it covers.
    pub(crate) fn index_snapshot_lag(&self) -> (u64, u64) {
        self.lag_after(self.shared.index_snapshot.covered.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// [`Store::index_snapshot_lag`] of an index snapshot covering the records before `covered` (0: none).
    fn lag_after(&self, covered: u64) -> (u64, u64) {
        let first = self.shared.log.first_lsn().get();
        let covered = covered.max(first);
        (self.shared.log.next_lsn().get().saturating_sub(covered), covered - first)
    }

    /// Bytes of memory the in-memory index holds (capacity-based estimate).
    pub fn index_heap_bytes(&self) -> usize {
        self.shared.index.read().heap_bytes()
    }

    pub(crate) fn append(&self, record: &StoreRecord, durability: Durability) -> Result<Lsn> {
        let bytes = self.shared.codec.encode(record);
        self.shared.log.append_with(&bytes, durability)
    }

    /// Appends a record that lets space be freed (a run finished or dropped, an atom
    /// unpinned): it may use the reserve at the end of the log's active segment
    /// ([`Log::append_reserved_with`]), so that a full disk never keeps retention from freeing
    /// space.
    pub(crate) fn append_reserved(&self, record: &StoreRecord) -> Result<Lsn> {
        let bytes = self.shared.codec.encode(record);
        self.shared.log.append_reserved_with(&bytes, Durability::Sync)
    }

    pub(crate) fn read_record(&self, lsn: u64) -> Result<StoreRecord> {
        let bytes = self
            .shared
            .log
            .read(Lsn::new(lsn))?
            .ok_or(Error::InconsistentLog { lsn, reason: "indexed record is missing" })?;
        self.shared.codec.decode(&bytes).map_err(|source| Error::Codec { lsn, source })
    }
}

pub(crate) fn unknown_run(run: RunId) -> Error {
    Error::UnknownRun { run: run.to_string() }
}

/// Microseconds since the Unix epoch (0 if the clock is before it).
pub(crate) fn now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// Logs written record by record, as a store would write them but with the atom ids a test
/// chooses (damaged or crafted ones included).
#[cfg(test)]
pub(crate) mod test_logs {
    use std::path::Path;

    use crate::codec::proto::{AtomStarted, Delta, RunCreated};
    use crate::codec::{Codec, StoreRecord};
    use crate::log::Log;

    /// Writes run 1 ("r") and, for each `(atom, parents, delta)`, the atom's start record (agent
    /// "a", key the atom's id) and, with a delta, its completion.
    pub(crate) fn write_run(dir: &Path, atoms: &[(u64, Vec<u64>, Option<&Delta>)]) {
        let codec = Codec::default();
        let log = Log::open(dir).expect("log");
        let run = RunCreated { run: 1, run_name: "r".into(), ..Default::default() };
        log.append(&codec.encode(&StoreRecord::RunCreated(run))).expect("append");
        for (atom, parents, delta) in atoms {
            let started = AtomStarted {
                atom: *atom,
                run: 1,
                agent: "a".into(),
                key: atom.to_string(),
                parents: parents.clone(),
                ..Default::default()
            };
            log.append(&codec.encode(&StoreRecord::AtomStarted(started))).expect("append");
            if let Some(delta) = delta {
                log.append(&codec.encode_completion(*atom, delta, b"ok", 0)).expect("append");
            }
        }
    }
}
