//! [`Store`]: runs, agents and atoms on top of the [`Log`]. Every write is a log record (see
//! `continuum.proto`); the in-memory index is rebuilt from the log on open.
//!
//! The atom protocol: `begin` writes a start record (ordered, not synced on its own), the
//! closure runs, `complete` or `fail` writes the end record with `Sync` durability, which also
//! makes the start durable; only then is the result handed back. After a crash, [`Store::resume`]
//! tells each agent where it stands and [`Store::execute`] returns recorded outputs instead of
//! running completed atoms again.

mod atom_table;
mod atoms;
mod background;
mod ballast;
mod checkpoint;
mod compaction;
mod guard;
mod history;
pub(crate) mod identity;
mod index;
mod inspect;
mod log_view;
mod loss;
mod lull;
mod policy;
mod purge;
mod rebuild;
mod replay;
mod retention;
mod types;

use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::{Mutex, RwLock};

use crate::codec::{Codec, StoreRecord};
use crate::config::{Durability, RecoveryMode};
use crate::error::{Error, Result};
use crate::log::{Log, LogBuilder, Lsn};
use crate::storage::Storage;

use index::StoreIndex;

pub use compaction::{CompactionReport, SpaceReport};
pub use history::History;
pub use inspect::{RecordDecoder, RecordInfo, RunInfo};
pub use log_view::LogView;
pub use loss::{LossEvidence, StoreRecoveryReport};
pub use policy::{CompactionPolicy, RetentionPolicy, SnapshotPolicy};
pub use replay::{Rebuilt, SnapshotFallback};
pub use types::{
    AgentResume, Atom, AtomFailure, AtomId, AtomOutput, AtomStatus, Executed, ResumeReport, RunId, RunSpec, RunStatus,
};

/// The index checkpoint's file name in a store directory (for the fuzz seeds).
pub(crate) const CHECKPOINT_FILE_NAME: &str = checkpoint::FILE_NAME;

/// Whether `body` decodes as an index checkpoint's body (for the fuzz target).
pub(crate) fn checkpoint_body_decodes(body: &[u8]) -> bool {
    checkpoint::parse_body(body)
}

/// Folds `log` into an index on one thread and pipelined, which must agree (for the fuzz
/// target).
pub(crate) fn folds_agree(log: &Log) {
    rebuild::folds_agree(log);
}

/// Builds a [`Store`]: `Store::builder(dir).segment_bytes(…).open()?`.
#[must_use = "a builder does nothing until `open` is called"]
pub struct StoreBuilder {
    log: LogBuilder,
    policies: policy::Policies,
    background: bool,
}

impl StoreBuilder {
    /// Size of each log segment; see [`Config::segment_bytes`](crate::Config::segment_bytes).
    pub fn segment_bytes(mut self, bytes: u64) -> Self {
        self.log = self.log.segment_bytes(bytes);
        self
    }

    /// How recovery treats invalid bytes; see [`RecoveryMode`].
    pub fn recovery_mode(mut self, mode: RecoveryMode) -> Self {
        self.log = self.log.recovery_mode(mode);
        self
    }

    /// How long a waiting appender spins before it sleeps; see
    /// [`Config::commit_spin`](crate::Config::commit_spin) (the same default as a bare log's).
    /// `Duration::ZERO` makes waiters sleep at once, which leaves more CPU to other work when
    /// the appending threads have plenty to do between appends.
    pub fn commit_spin(mut self, spin: std::time::Duration) -> Self {
        self.log = self.log.commit_spin(spin);
        self
    }

    /// The file system to use (tests use [`SimStorage`](crate::storage::sim::SimStorage)).
    pub fn storage(mut self, storage: Arc<dyn Storage>) -> Self {
        self.log = self.log.storage(storage);
        self
    }

    /// Labels every metrics series of this store `store="<name>"`; see
    /// [`LogBuilder::metrics_label`].
    pub fn metrics_label(mut self, name: impl Into<String>) -> Self {
        self.log = self.log.metrics_label(name);
        self
    }

    /// When snapshots are written (default: every 50 completed atoms of an agent or every 10
    /// minutes, whichever comes first). Runs may override it ([`RunSpec::snapshot_policy`]).
    pub fn snapshot_policy(mut self, policy: SnapshotPolicy) -> Self {
        self.policies.snapshot = policy;
        self
    }

    /// What retention keeps (default: the last 5 snapshots per agent; finished runs forever).
    pub fn retention(mut self, policy: RetentionPolicy) -> Self {
        self.policies.retention = policy;
        self
    }

    /// When compaction rewrites a segment, and how often it runs in the background.
    pub fn compaction(mut self, policy: CompactionPolicy) -> Self {
        self.policies.compaction = policy;
        self
    }

    /// How many records must come after the newest index checkpoint before the store writes
    /// another on its own: at open (after folding that many), when dropped or closed, and on
    /// the background thread after a compaction round (when they are also a quarter of what
    /// the checkpoint covers). Default 65,536; `u64::MAX` leaves checkpoints to
    /// [`Store::checkpoint_index`]. Smaller means faster opens after a crash and more
    /// checkpoint writes (each rewrites the whole index: about 16 bytes per atom).
    pub fn index_checkpoint_after(mut self, records: u64) -> Self {
        self.policies.index_checkpoint_after = records;
        self
    }

    /// The smallest record body (protobuf bytes) the store compresses as it appends it, with
    /// zstd and the store's trained dictionary; smaller records are appended plain. Default
    /// 2 KiB. Cold compression (`CompactionPolicy::cold_compression`) rewrites sealed segments
    /// with all of their records compressed together, far smaller than record by record
    /// (about 140 bytes per atom against 323 for 500-byte deltas), so compressing small records
    /// on the append path only shrinks the newest segment, at 2–6 µs of CPU per record. Lower
    /// it (64 compresses nearly everything) when cold compression is off, or when the newest
    /// segment's size matters more than that CPU.
    pub fn compress_records_from(mut self, bytes: usize) -> Self {
        self.policies.compress_records_from = bytes;
        self
    }

    /// Sets aside `bytes` of disk in the store's directory (a file named `ballast`), given back
    /// when a compaction round runs out of space, so that retention can free space even on a
    /// disk with not a byte left: the round rewrites the segments a dropped run shared with
    /// live ones, and each rewrite needs room for the records it keeps until it replaces the
    /// original. A segment's size ([`StoreBuilder::segment_bytes`]) always suffices. Default 0:
    /// no ballast. Once given back, it is made again at the next open that finds the room.
    pub fn ballast_bytes(mut self, bytes: u64) -> Self {
        self.policies.ballast_bytes = bytes;
        self
    }

    /// How durable an atom is when `complete_atom`, `fail_atom` or `record_atom` returns.
    /// Default [`Durability::Sync`]: its records are on disk (one `fdatasync`, shared with
    /// concurrent writers), so a crash never loses it and `execute` never runs it again.
    ///
    /// [`Durability::Buffered`] returns once the operating system has the records and syncs
    /// them in the background every [`StoreBuilder::flush_interval`] (as LangGraph's `async`
    /// durability, SQLite's `synchronous=NORMAL`): an atom costs no `fdatasync` of its own,
    /// but a power loss (not a process crash) may lose the atoms ended in the last interval, a
    /// suffix of each agent's history, which then run again. Everything else stays exact:
    /// each guarded effect's record is synced before the effect runs, so a re-run atom's
    /// effects are not repeated; a snapshot or an index checkpoint syncs the log first, so
    /// neither ever refers to an atom a crash took back; runs, rollbacks, forks, pins and
    /// drops are synced as always. [`Store::sync`] makes every ended atom durable at once.
    /// [`Durability::None`] syncs only when something else does (a segment filled up, a
    /// synced record, [`Store::sync`], close).
    pub fn atom_durability(mut self, durability: Durability) -> Self {
        self.policies.atom_durability = durability;
        self
    }

    /// How often the background flusher syncs atoms ended with [`Durability::Buffered`]; see
    /// [`Config::flush_interval`](crate::Config::flush_interval).
    pub fn flush_interval(mut self, interval: std::time::Duration) -> Self {
        self.log = self.log.flush_interval(interval);
        self
    }

    /// Whether a background thread writes policy snapshots and runs compaction (default:
    /// yes). Without it, policy snapshots are written by the thread that completes the atom,
    /// and compaction runs only when [`Store::compact`] is called.
    pub fn background(mut self, enabled: bool) -> Self {
        self.background = enabled;
        self
    }

    /// Opens the log (running its recovery) and rebuilds the index from it.
    ///
    /// # Errors
    /// Everything [`LogBuilder::open`] returns, plus [`Error::Codec`] and
    /// [`Error::InconsistentLog`] for records the index cannot take, and
    /// [`Error::InvalidConfig`] for an invalid policy.
    pub fn open(self) -> Result<Store> {
        self.policies.validate()?;
        // The index checkpoint is read and decoded while the log recovers (both take a large
        // store's open time); it is checked against the log once that is open.
        let (dir, storage) = self.log.location();
        let (dir, storage) = (dir.to_path_buf(), Arc::clone(storage));
        let (log, checkpoint) = std::thread::scope(|scope| {
            let reader = std::thread::Builder::new()
                .name("continuum-checkpoint-read".into())
                .spawn_scoped(scope, || checkpoint::read(storage.as_ref(), &dir));
            let log = self.log.open();
            let read = match reader {
                Ok(thread) => thread.join().unwrap_or(checkpoint::Read::Unusable("its reader panicked")),
                Err(_) => checkpoint::read(storage.as_ref(), &dir),
            };
            (log, read)
        });
        let shared = Arc::new(Shared::new(log?, self.policies, false, Some(checkpoint))?);
        shared.ensure_ballast();
        let checkpoint_writer = Mutex::new(Shared::write_pending_checkpoint(&shared));
        let worker = if self.background { Some(background::Worker::start(&shared)?) } else { None };
        Ok(Store { worker, shared, owner: true, checkpoint_writer })
    }
}

impl Shared {
    /// Rebuilds the index of the opened `log` (from `checkpoint`, the index checkpoint already
    /// read, if it was; otherwise it is read here) and lists its snapshots. A `read_only` store
    /// never trains a dictionary (training appends one).
    fn new(
        log: Log,
        policies: policy::Policies,
        read_only: bool,
        checkpoint: Option<checkpoint::Read>,
    ) -> Result<Self> {
        let codec =
            Codec::compressing_from(policies.compress_records_from).counting_into(log.metrics_handle().encoded_bytes());
        let index_checkpoint = IndexCheckpoint::default();
        let checkpoint = checkpoint.unwrap_or_else(|| checkpoint::read(log.storage().as_ref(), log.dir()));
        let store_id = identity::store_id(&log)?;
        let mut snapshots = crate::snapshot::list(log.storage().as_ref(), log.dir())?.into_iter().collect();
        if !read_only {
            // IMPORTANT: compaction relies on the snapshots listed here; their names are durable
            // before it can run.
            crate::snapshot::sync_dir_at_open(log.storage().as_ref(), log.dir())?;
        }
        let opening =
            Opening { read_only, store_id, snapshots: &snapshots, checkpoint_after: policies.index_checkpoint_after };
        let (index, recovery) = open_index(&log, &codec, &opening, checkpoint, &index_checkpoint)?;
        loss::settle(&recovery, log.config().recovery_mode, log.next_lsn().get())?;
        if !read_only {
            loss::clear_evidence(&log, &recovery, &mut snapshots)?;
            let completed =
                |atom| index.atom(types::AtomId(atom)).is_some_and(|e| e.state == index::EntryState::Completed);
            crate::snapshot::bind_all(log.storage().as_ref(), log.dir(), store_id, &snapshots, completed)?;
        }
        let training = match (read_only, codec.current_dictionary_len()) {
            (true, _) => atoms::Training::done(),
            (false, None) => atoms::Training::new(atoms::TrainingStage::First),
            // A first-stage dictionary (smaller than the final one's half): train the final one.
            (false, Some(len)) if len * 2 <= atoms::final_dictionary_bytes(log.config().segment_bytes) => {
                atoms::Training::new(atoms::TrainingStage::Final)
            }
            (false, Some(_)) => atoms::Training::done(),
        };
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
            closing: std::sync::atomic::AtomicBool::new(false),
            compaction_rounds: std::sync::atomic::AtomicU64::new(0),
            last_compaction: Mutex::new(None),
            index_checkpoint,
            unsynced_snapshots: Mutex::new(std::collections::BTreeSet::new()),
            targeted_scans: std::sync::atomic::AtomicBool::new(true),
        })
    }
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

    /// Starts a thread that publishes the checkpoint of the open's fold, if the open left one
    /// (`None` if not, or if the thread cannot start: the checkpoint is then dropped, which
    /// costs only the next open's time).
    fn write_pending_checkpoint(shared: &Arc<Shared>) -> Option<std::thread::JoinHandle<()>> {
        shared.index_checkpoint.pending.lock().as_ref()?;
        let shared = Arc::clone(shared);
        let spawned = std::thread::Builder::new().name("continuum-checkpoint-write".into()).spawn(move || {
            let Some((covered, bytes)) = shared.index_checkpoint.pending.lock().take() else { return };
            // Compaction cannot start a change while this holds the lock; one that already
            // changed a segment since the open bumped `log_changes`.
            let _no_compaction = shared.compacting.lock();
            // Nothing changed a segment since the open, and no newer checkpoint was written
            // meanwhile (`checkpoint_index` on the background thread).
            if shared.index_checkpoint.log_changes.load(std::sync::atomic::Ordering::Acquire) != 0
                || shared.index_checkpoint.covered.load(std::sync::atomic::Ordering::Relaxed) >= covered
            {
                return;
            }
            if let Err(error) = shared.publish_index_checkpoint(covered, &bytes) {
                shared.log.metrics_handle().record_maintenance_failure();
                tracing::warn!(%error, "index checkpoint not written after open");
            }
        });
        spawned.ok()
    }

    /// The index checkpoint on disk, loaded and checked against the log, if this store has
    /// one (compaction patches it).
    fn loaded_index_checkpoint(&self) -> Option<rebuild::FoldState> {
        if self.index_checkpoint.covered.load(std::sync::atomic::Ordering::Relaxed) == 0 {
            return None;
        }
        checkpoint::load(&self.log, &Codec::default())
    }

    /// Publishes the index checkpoint `bytes`, which cover the records below `covered` (the
    /// caller holds the compaction lock).
    fn publish_index_checkpoint(&self, covered: u64, bytes: &[u8]) -> Result<()> {
        checkpoint::publish(&self.log, bytes)?;
        self.index_checkpoint.covered.store(covered, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Deletes the index checkpoint, durably (before anything changes the records it covers).
    fn remove_index_checkpoint(&self) -> Result<()> {
        self.index_checkpoint.log_changes.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        checkpoint::remove(&self.log)?;
        self.index_checkpoint.covered.store(0, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

/// What an open knows before it rebuilds the index.
struct Opening<'a> {
    read_only: bool,
    /// The log's store id.
    store_id: u64,
    /// Atoms with a snapshot file.
    snapshots: &'a std::collections::BTreeSet<u64>,
    /// Records a fold must cover for the open to write a checkpoint of it.
    checkpoint_after: u64,
}

/// Rebuilds the index: from the index checkpoint and the records after it if there is a usable
/// one, from the whole log otherwise; writes a new checkpoint when the fold covered at least
/// `checkpoint_after` records (not for a read-only store). A checkpoint that cannot
/// be written costs only the next open's time: it is logged, not returned. Returns the index
/// and the evidence of lost records the checkpoint and the snapshots give.
fn open_index(
    log: &Log,
    codec: &Codec,
    opening: &Opening<'_>,
    checkpoint: checkpoint::Read,
    written: &IndexCheckpoint,
) -> Result<(StoreIndex, StoreRecoveryReport)> {
    let (read_only, checkpoint_after) = (opening.read_only, opening.checkpoint_after);
    let started = std::time::Instant::now();
    let covered_beyond = checkpoint::beyond_log(&checkpoint, log, opening.store_id);
    let (loaded, ignored) = match checkpoint::accept(checkpoint, log, codec) {
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
        from_checkpoint_lsn = from,
        records_folded = folded,
        time_to_resume_us = time_to_resume.as_micros() as u64,
        "store index rebuilt"
    );
    if !read_only && folded >= checkpoint_after {
        // The recovered records are durable before a checkpoint covering them is. The file is
        // written by `StoreBuilder::open`'s writer thread, off the open's path.
        match log.sync().and_then(|()| checkpoint::encode(&state, log)) {
            Ok(bytes) => *written.pending.lock() = Some((state.next_lsn, bytes)),
            Err(error) => {
                log.metrics_handle().record_maintenance_failure();
                tracing::warn!(%error, "index checkpoint not written at open");
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

/// What the store knows of its index checkpoint file.
#[derive(Debug, Default)]
pub(crate) struct IndexCheckpoint {
    /// The LSN the checkpoint on disk covers (records below it are in it); 0 if none.
    covered: std::sync::atomic::AtomicU64,
    /// The LSN the checkpoint the open used covers (0 if it folded the whole log), and why it
    /// ignored the one it found, if it did.
    at_open: Mutex<(u64, Option<checkpoint::Unusable>)>,
    /// A checkpoint of the open's fold (the LSN it covers and its bytes), until the writer
    /// thread publishes it.
    pending: Mutex<Option<(u64, Vec<u8>)>>,
    /// Bumped (under the compaction lock) before compaction changes a segment: a checkpoint
    /// folded before the bump must not be published after it.
    log_changes: std::sync::atomic::AtomicU64,
}

/// What a store knows of its index checkpoint ([`Store::index_checkpoint`]): a cache of the
/// index rebuild on open (`docs/ARCHITECTURE.md`, "Index checkpoint").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexCheckpointInfo {
    /// The LSN the newest checkpoint covers (every record below it is in it), if one exists
    /// that this store opened from or wrote.
    pub covered: Option<Lsn>,
    /// Records after it: what the next open would fold (all of the log's records if there is
    /// no checkpoint).
    pub records_after: u64,
    /// The LSN the checkpoint the open used covered, or `None` if the open folded the whole
    /// log.
    pub opened_from: Option<Lsn>,
    /// Why the open ignored the checkpoint it found (damaged, stale, another log's...), if it
    /// did.
    pub ignored_at_open: Option<String>,
}

/// The continuity store. `Send + Sync`: share it between agent threads behind an `Arc`.
pub struct Store {
    /// The background thread, owned by the handle the user opened (absent in the temporary
    /// handles the thread itself works through, and when disabled). Declared first: it is
    /// stopped before the store's files are closed.
    worker: Option<background::Worker>,
    shared: Arc<Shared>,
    /// Opened by [`StoreBuilder::open`] (not a view): checkpoints the index when dropped.
    owner: bool,
    /// The thread publishing the checkpoint of the open's fold, if one runs.
    checkpoint_writer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Drop for Store {
    /// Stops the background thread, then writes an index checkpoint if at least
    /// `index_checkpoint_after` records came after the newest one (a failure is logged:
    /// it costs only the next open's time).
    fn drop(&mut self) {
        drop(self.worker.take());
        self.wait_for_checkpoint_writer();
        if let Err(error) = self.shared.sync_snapshot_dir(false) {
            tracing::warn!(%error, "snapshot directory not synced at close");
        }
        if self.owner
            && self.records_after_checkpoint() >= self.shared.policies.index_checkpoint_after
            && let Err(error) = self.checkpoint_index()
        {
            tracing::warn!(%error, "index checkpoint not written at close");
        }
    }
}

/// Everything a store holds, shared with its background thread.
pub(crate) struct Shared {
    log: Log,
    codec: Codec,
    /// The store id every segment header holds; snapshots and index checkpoints repeat it.
    store_id: u64,
    /// What the open found lost from the end of the log.
    recovery: StoreRecoveryReport,
    /// The index's identity hasher (fixed for the store's lifetime in this process), for
    /// hashing a key before taking the index lock.
    identity: index::IdentityHasher,
    index: RwLock<StoreIndex>,
    training: Mutex<atoms::Training>,
    /// Set once `training` reaches its last stage: completions then skip its lock (taken by
    /// every completion otherwise, by all of a burst's writers at once).
    training_done: std::sync::atomic::AtomicBool,
    /// Atoms with a snapshot file.
    snapshots: Mutex<std::collections::BTreeSet<u64>>,
    policies: policy::Policies,
    /// Per agent: completed atoms and time since its last snapshot.
    snapshot_clock: Mutex<policy::SnapshotClocks>,
    /// Compaction runs one at a time.
    compacting: Mutex<()>,
    /// Held while a compaction round plans what is live and marks what it releases, and by
    /// everything that changes what is live (rollback, fork, pin): no plan is made from heads
    /// that change under it (`purge.rs`). Taken after `compacting`, never before it.
    purge: Mutex<()>,
    /// Called by a compaction round between its plan and its marks (tests of the purge lock).
    #[cfg(test)]
    after_plan: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    /// Held while a run is created or finished: their records are appended one at a time,
    /// without the index lock.
    runs_changing: Mutex<()>,
    /// Set when the owning handle is dropped: a compaction round stops between segments.
    closing: std::sync::atomic::AtomicBool,
    /// Compaction rounds completed since open, and the last one's report.
    compaction_rounds: std::sync::atomic::AtomicU64,
    last_compaction: Mutex<Option<CompactionReport>>,
    /// The index checkpoint on disk.
    index_checkpoint: IndexCheckpoint,
    /// Policy snapshots renamed into place since the snapshot directory was last synced: their
    /// names are not durable yet, so compaction does not rely on them. Held while the
    /// directory syncs.
    unsynced_snapshots: Mutex<std::collections::BTreeSet<u64>>,
    /// Whether rebuilds may read only their run's records (see `Store::set_targeted_scans`).
    targeted_scans: std::sync::atomic::AtomicBool,
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
        StoreBuilder { log: Log::builder(dir), policies: policy::Policies::default(), background: true }
    }

    /// A handle over `shared` without a worker: what the background thread works through.
    fn view(shared: Arc<Shared>) -> Self {
        Store { worker: None, shared, owner: false, checkpoint_writer: Mutex::new(None) }
    }

    /// A read-only view of the store's log: its records, segments, recovery report and
    /// counters. Only the store appends to its log (its index must describe every record);
    /// [`Store::sync`] makes its atoms durable.
    pub fn log(&self) -> LogView<'_> {
        LogView::from(&self.shared.log)
    }

    /// Creates a run, or returns the existing run of that name.
    ///
    /// # Errors
    /// The log's append errors.
    pub fn create_run(&self, spec: RunSpec) -> Result<RunId> {
        if let Some(run) = self.run_id(&spec.name) {
            return Ok(run);
        }
        // Run creations and ends take turns, so that run numbers follow the order of their
        // records in the log (dense); the index lock is not held across the record's sync,
        // which would stall every agent's completions.
        let _runs = self.shared.runs_changing.lock();
        if let Some(run) = self.run_id(&spec.name) {
            return Ok(run);
        }
        let run = self.shared.index.read().runs.len() as u64 + 1;
        let id = u32::try_from(run).map_err(|_| Error::UnknownRun { run: spec.name.clone() })?;
        let record = StoreRecord::RunCreated(crate::codec::proto::RunCreated {
            run,
            run_name: spec.name.clone(),
            pipeline: spec.pipeline,
            pipeline_version: spec.pipeline_version,
            environment: spec.environment.into_iter().collect(),
            created_at_unix_us: now_us(),
            snapshot_every_atoms: spec.snapshot_policy.map(|p| p.every_atoms),
            snapshot_every_ms: spec.snapshot_policy.map(|p| policy::duration_ms(p.every)),
        });
        self.append(&record, Durability::Sync)?;
        let mut index = self.shared.index.write();
        index.run_names.insert(spec.name.clone(), id);
        index.runs.push(index::RunEntry {
            name: spec.name,
            status: RunStatus::Running,
            snapshot_policy: spec.snapshot_policy,
            ended_at_unix_us: 0,
            atom_span: (0, 0),
        });
        Ok(RunId(run))
    }

    /// The run named `name`.
    pub fn run_id(&self, name: &str) -> Option<RunId> {
        self.shared.index.read().run_names.get(name).map(|id| RunId(u64::from(*id)))
    }

    /// A run's status.
    ///
    /// # Errors
    /// [`Error::UnknownRun`].
    pub fn run_status(&self, run: RunId) -> Result<RunStatus> {
        let index = self.shared.index.read();
        index.run(run).map(|entry| entry.status.clone()).ok_or_else(|| unknown_run(run))
    }

    /// Marks a run finished, with a human-readable hint for whoever resumes or debugs it.
    ///
    /// # Errors
    /// [`Error::UnknownRun`], [`Error::RunFinished`], the log's append errors.
    pub fn finish_run(&self, run: RunId, success: bool, resume_hint: &str) -> Result<()> {
        // One end per run: ends take turns (with creations), outside the index lock.
        let _runs = self.shared.runs_changing.lock();
        if self.run_status(run)? != RunStatus::Running {
            return Err(Error::RunFinished { run: run.0 });
        }
        let ended_at_unix_us = now_us();
        let record = StoreRecord::RunTerminal(crate::codec::proto::RunTerminal {
            run: run.0,
            success,
            resume_hint: resume_hint.to_owned(),
            ended_at_unix_us,
        });
        self.append_reserved(&record)?;
        if let Some(entry) = self.shared.index.write().run_mut(run) {
            entry.status = RunStatus::Finished { success, resume_hint: resume_hint.to_owned() };
            entry.ended_at_unix_us = ended_at_unix_us;
        }
        Ok(())
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

    /// Writes an index checkpoint covering every record appended so far, so that the next open
    /// folds only the records after it (`docs/ARCHITECTURE.md`, "Index checkpoint"). The
    /// checkpoint is built the way an open builds the index: the newest checkpoint (if usable)
    /// plus a fold of the records after it, never a copy of the live index. The store also
    /// does this on its own (see [`StoreBuilder::index_checkpoint_after`]). Compaction deletes
    /// the checkpoint before it changes a segment, and writes it again patched after a round
    /// that only stripped deltas. Waits for a compaction round in progress, and holds
    /// compaction off while it folds. Returns the LSN the checkpoint covers (records below
    /// it).
    ///
    /// # Errors
    /// The log's errors (a poisoned or read-only log cannot be checkpointed), an inconsistent
    /// log, and I/O errors writing the file.
    pub fn checkpoint_index(&self) -> Result<Lsn> {
        self.wait_for_checkpoint_writer();
        let shared = &self.shared;
        // No compaction may change the log while it is folded and its checkpoint written.
        let _no_compaction = shared.compacting.lock();
        let until = shared.log.next_lsn().get();
        // IMPORTANT: the records a checkpoint covers are durable before it is.
        shared.log.sync()?;
        let codec = Codec::default();
        let start = checkpoint::load(&shared.log, &codec)
            .unwrap_or_else(|| rebuild::FoldState::new(index::IdentityHasher::random()));
        let state = rebuild::fold_from(&shared.log, &codec, start, until)?;
        shared.publish_index_checkpoint(state.next_lsn, &checkpoint::encode(&state, &shared.log)?)?;
        Ok(Lsn::new(state.next_lsn))
    }

    /// What the open found of records lost from the end of the log: evidence (an index
    /// checkpoint or snapshots of this store) that acknowledged records existed past its end.
    /// Empty after a lossless open; [`RecoveryMode::Strict`] refuses to open instead. The log's
    /// own findings (torn tail, skipped ranges) are in the log's
    /// [`recovery_report`](crate::Log::recovery_report).
    pub fn recovery_report(&self) -> &StoreRecoveryReport {
        &self.shared.recovery
    }

    /// What this store knows of its index checkpoint: the LSN the newest one covers, the
    /// records after it, and whether the open used one (or why it ignored the one it found).
    pub fn index_checkpoint(&self) -> IndexCheckpointInfo {
        // One load for both fields: the background thread may publish a newer checkpoint
        // between two (covering its records: `records_after` would then belong to another).
        let covered = self.shared.index_checkpoint.covered.load(std::sync::atomic::Ordering::Relaxed);
        let (opened_from, ignored) = *self.shared.index_checkpoint.at_open.lock();
        IndexCheckpointInfo {
            covered: (covered != 0).then(|| Lsn::new(covered)),
            records_after: self.lag_after(covered).0,
            opened_from: (opened_from != 0).then(|| Lsn::new(opened_from)),
            ignored_at_open: ignored.map(str::to_owned),
        }
    }

    /// Closes the store: stops the background thread, then writes an index checkpoint if at
    /// least `index_checkpoint_after` records came after the newest one (what dropping the
    /// store does, with the error returned instead of logged).
    ///
    /// # Errors
    /// The errors of [`Store::checkpoint_index`]; the store is closed either way.
    pub fn close(mut self) -> Result<()> {
        drop(self.worker.take());
        self.wait_for_checkpoint_writer();
        let snapshots = self.shared.sync_snapshot_dir(false);
        let due = self.owner && self.records_after_checkpoint() >= self.shared.policies.index_checkpoint_after;
        // Dropping `self` afterwards must not try again.
        self.owner = false;
        let checkpoint = if due { self.checkpoint_index().map(|_| ()) } else { Ok(()) };
        snapshots.and(checkpoint)
    }

    /// Waits until the checkpoint of the open's fold, if one is being written, is published.
    pub(crate) fn wait_for_checkpoint_writer(&self) {
        if let Some(thread) = self.checkpoint_writer.lock().take() {
            let _ = thread.join();
        }
    }

    /// Records appended since the newest index checkpoint (all of them if there is none).
    fn records_after_checkpoint(&self) -> u64 {
        self.checkpoint_lag().0
    }

    /// Records after the newest index checkpoint (all of them if there is none), and records
    /// it covers.
    fn checkpoint_lag(&self) -> (u64, u64) {
        self.lag_after(self.shared.index_checkpoint.covered.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// [`Store::checkpoint_lag`] of a checkpoint covering the records before `covered` (0: none).
    fn lag_after(&self, covered: u64) -> (u64, u64) {
        let first = self.shared.log.first_lsn().get();
        let covered = covered.max(first);
        (self.shared.log.next_lsn().get().saturating_sub(covered), covered - first)
    }

    /// Bytes of memory the in-memory index holds (capacity-based estimate).
    pub fn index_heap_bytes(&self) -> usize {
        self.shared.index.read().heap_bytes()
    }

    fn append(&self, record: &StoreRecord, durability: Durability) -> Result<Lsn> {
        let bytes = self.shared.codec.encode(record);
        self.shared.log.append_with(&bytes, durability)
    }

    /// Appends a record that lets space be freed (a run finished or dropped, an atom
    /// unpinned): it may use the reserve at the end of the log's active segment
    /// ([`Log::append_reserved_with`]), so that a full disk never keeps retention from freeing
    /// space.
    fn append_reserved(&self, record: &StoreRecord) -> Result<Lsn> {
        let bytes = self.shared.codec.encode(record);
        self.shared.log.append_reserved_with(&bytes, Durability::Sync)
    }

    fn read_record(&self, lsn: u64) -> Result<StoreRecord> {
        let bytes = self
            .shared
            .log
            .read(Lsn::new(lsn))?
            .ok_or(Error::InconsistentLog { lsn, reason: "indexed record is missing" })?;
        self.shared.codec.decode(&bytes).map_err(|source| Error::Codec { lsn, source })
    }
}

fn unknown_run(run: RunId) -> Error {
    Error::UnknownRun { run: run.to_string() }
}

/// Microseconds since the Unix epoch (0 if the clock is before it).
fn now_us() -> u64 {
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
