//! [`StoreBuilder`]: a store's options, and `open`.

use std::sync::Arc;

use parking_lot::Mutex;

use crate::config::{Durability, RecoveryMode};
use crate::error::Result;
use crate::log::LogBuilder;
use crate::storage::Storage;

use super::{CompactionPolicy, RetentionPolicy, SnapshotPolicy};
use super::{Shared, Store};
use super::{index_snapshot, policy};

/// Builds a [`Store`]: `Store::builder(dir).segment_bytes(…).open()?`.
#[must_use = "a builder does nothing until `open` is called"]
pub struct StoreBuilder {
    pub(crate) log: LogBuilder,
    pub(crate) policies: policy::Policies,
    pub(crate) background: bool,
    /// Where the store ships to, if anywhere (`ship/`).
    #[cfg(feature = "object-store")]
    pub(crate) remote: Option<crate::ship::Remote>,
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
    /// minutes, whichever comes first). Runs may override it ([`RunSpec::snapshot_policy`](crate::RunSpec::snapshot_policy)).
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

    /// How many records must come after the newest index snapshot before the store writes
    /// another on its own: at open (after folding that many), when dropped or closed, and on
    /// the background thread after a compaction round (when they are also a quarter of what
    /// the index snapshot covers). Default 65,536; `u64::MAX` leaves index snapshots to
    /// [`Store::write_index_snapshot`]. Smaller means faster opens after a crash and more
    /// index snapshot writes (each rewrites the whole index: about 16 bytes per atom).
    pub fn index_snapshot_after(mut self, records: u64) -> Self {
        self.policies.index_snapshot_after = records;
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
    /// effects are not repeated; a snapshot or an index snapshot syncs the log first, so
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

    /// Ships the store to object storage (`docs/ARCHITECTURE.md`, "Object storage"): each
    /// sealed segment and snapshot file is uploaded once, in the background, and listed in the
    /// store's manifest under the remote's prefix. The open proves that this directory owns
    /// the prefix (creating the manifest the first time), and fails with
    /// [`Error::Fenced`](crate::Error::Fenced) when another host took the store over.
    #[cfg(feature = "object-store")]
    pub fn ship_to(mut self, remote: crate::ship::Remote) -> Self {
        self.remote = Some(remote);
        self
    }

    /// Opens the log (running its recovery) and rebuilds the index from it.
    ///
    /// # Errors
    /// Everything [`LogBuilder::open`] returns, plus [`Error::Codec`](crate::Error::Codec) and
    /// [`Error::InconsistentLog`](crate::Error::InconsistentLog) for records the index cannot take, and
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) for an invalid policy.
    pub fn open(self) -> Result<Store> {
        self.policies.validate()?;
        // The index snapshot is read and decoded while the log recovers (both take a large
        // store's open time); it is checked against the log once that is open.
        let (dir, storage) = self.log.location();
        let (dir, storage) = (dir.to_path_buf(), Arc::clone(storage));
        let (log, index_snapshot) = std::thread::scope(|scope| {
            let reader = std::thread::Builder::new()
                .name("continuum-index-snapshot-read".into())
                .spawn_scoped(scope, || index_snapshot::read(storage.as_ref(), &dir));
            let log = self.log.open();
            let read = match reader {
                Ok(thread) => thread.join().unwrap_or(index_snapshot::Read::Unusable("its reader panicked")),
                Err(_) => index_snapshot::read(storage.as_ref(), &dir),
            };
            (log, read)
        });
        let shared = Arc::new(Shared::new(log?, self.policies, false, Some(index_snapshot))?);
        shared.ensure_ballast();
        Store::view(Arc::clone(&shared)).load_suspensions()?;
        let index_snapshot_writer = Mutex::new(Shared::write_pending_index_snapshot(&shared));
        let worker = if self.background { Some(crate::purge::background::Worker::start(&shared)?) } else { None };
        #[cfg(feature = "object-store")]
        let shipper = match self.remote {
            Some(remote) => Some(crate::ship::start(&shared, remote)?),
            None => None,
        };
        Ok(Store {
            worker,
            #[cfg(feature = "object-store")]
            shipper,
            shared,
            owner: true,
            index_snapshot_writer,
        })
    }
}
