//! [`Log`]: the write-ahead log. Segment files, group commit, recovery, reads, prefix truncation.
//!
//! The log knows nothing of atoms or agents: it stores opaque records, addressed by
//! [`Lsn`]s that start at 1, increase by one per record, and are never reused.

mod compact;
mod index;
mod inflated;
mod iter;
pub(crate) mod manifest;
pub(crate) mod problem;
pub(crate) mod record;
pub(crate) mod recovery;
pub(crate) mod segment;
mod streams;
mod tuning;
mod writer;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::{Condvar, Mutex, RwLock};

use crate::config::{Config, Durability, RecoveryMode};
use crate::error::{Error, Result};
use crate::metrics::{Metrics, MetricsOptions, MetricsSnapshot};
#[cfg(feature = "object-store")]
use crate::storage::StorageFile;
use crate::storage::{DirLock, FileStorage, Storage};

use index::SegmentIndex;
use manifest::{Manifest, ManifestWriter, TailRecord};
pub(crate) use record::BatchBuilder;
use record::EncodedBatch;
use streams::Streams;
use writer::Writer;

pub use compact::{
    FRAME_COMPRESSION_BYTES_MAX, FRAME_COMPRESSION_BYTES_MIN, FrameCompression, Rewrite, RewriteOptions, RewriteReport,
};
pub(crate) use iter::{HeldRange, HeldSources};
pub use iter::{LogIter, RecordRef};
pub use manifest::MANIFEST_FILE_NAME;
pub use problem::Problem;
pub use recovery::{InvalidRange, LossEvidence, LostRecords, RecoveryReport};
pub use streams::StreamKey;

/// Records of a stream [`Log::visit_stream`] looks up at a time (12 bytes each).
const STREAM_VISIT_CHUNK: usize = 16 * 1024;

pub use crate::storage::LOCK_FILE_NAME;

/// A log sequence number: the address of one record. Starts at 1; never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn(u64);

impl Lsn {
    /// The LSN of the first record of a new log.
    pub const FIRST: Lsn = Lsn(1);

    /// Wraps a raw LSN.
    pub const fn new(lsn: u64) -> Self {
        Self(lsn)
    }

    /// The raw number.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The LSN after this one.
    pub const fn next(self) -> Self {
        Self(self.0 + 1)
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The consecutive LSNs of one appended batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LsnRange {
    first: Lsn,
    count: u32,
}

impl LsnRange {
    pub(crate) fn new(first: Lsn, count: u32) -> Self {
        Self { first, count }
    }

    pub(crate) fn empty() -> Self {
        Self { first: Lsn(0), count: 0 }
    }

    /// The first record's LSN.
    pub fn first(&self) -> Lsn {
        self.first
    }

    /// The last record's LSN.
    pub fn last(&self) -> Lsn {
        Lsn(self.first.0 + u64::from(self.count) - 1)
    }

    /// Number of records.
    pub fn len(&self) -> u32 {
        self.count
    }

    /// Whether the range is empty (never true for an appended batch).
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Every LSN of the range, in order.
    pub fn iter(&self) -> impl Iterator<Item = Lsn> + use<> {
        (self.first.0..self.first.0 + u64::from(self.count)).map(Lsn)
    }
}

/// Public facts about one segment file, for inspection tools and tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentInfo {
    /// The segment file.
    pub path: PathBuf,
    /// Its sequence number.
    pub seq: u64,
    /// LSN of its first record.
    pub first_lsn: Lsn,
    /// LSN after its last record.
    pub next_lsn: Lsn,
    /// Bytes of header and frames; the rest of the file is preallocated zeros.
    pub data_bytes: u64,
    /// Whether the segment is sealed (every segment but the last is).
    pub sealed: bool,
    /// Whether compaction rewrote it with compressed frames (format version 2).
    pub compressed: bool,
}

/// One version of a segment and its open file (`Log::segment_files`).
#[cfg(feature = "object-store")]
#[derive(Clone)]
pub(crate) struct SegmentFile {
    pub seq: u64,
    /// Its header's generation: which version of the segment `file` holds.
    pub generation: u32,
    pub first_lsn: u64,
    /// The LSN after its last published record.
    pub next_lsn: u64,
    /// Offset after its last published frame.
    pub data_end: u64,
    /// Whether it is sealed (every segment but the last is).
    pub sealed: bool,
    pub file: Arc<dyn StorageFile>,
}

/// Builds a [`Log`]: `Log::builder(dir).segment_bytes(…).open()?`.
#[must_use = "a builder does nothing until `open` is called"]
pub struct LogBuilder {
    dir: PathBuf,
    config: Config,
    storage: Arc<dyn Storage>,
    metrics: MetricsOptions,
    stream_key: Option<StreamKey>,
}

impl LogBuilder {
    /// Size of each segment file; see [`Config::segment_bytes`].
    pub fn segment_bytes(mut self, bytes: u64) -> Self {
        self.config.segment_bytes = bytes;
        self
    }

    /// Default durability of appends; see [`Config::durability`].
    pub fn durability(mut self, durability: Durability) -> Self {
        self.config.durability = durability;
        self
    }

    /// How recovery treats invalid bytes; see [`Config::recovery_mode`].
    pub fn recovery_mode(mut self, mode: RecoveryMode) -> Self {
        self.config.recovery_mode = mode;
        self
    }

    /// Background flusher interval; see [`Config::flush_interval`].
    pub fn flush_interval(mut self, interval: Duration) -> Self {
        self.config.flush_interval = interval;
        self
    }

    /// How long a waiting appender spins before it sleeps; see [`Config::commit_spin`].
    pub fn commit_spin(mut self, spin: Duration) -> Self {
        self.config.commit_spin = spin;
        self
    }

    /// Replaces the whole configuration.
    pub fn config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// Indexes the log by stream: `key_of` names the stream each record belongs to (an agent,
    /// a Raft group), and [`Log::visit_stream`] then reads one stream's records without
    /// reading the others'. The index lives in memory only (12 bytes per record of a stream,
    /// up to twice that while it grows): recovery builds it in the same pass that verifies the
    /// sealed segments, and it catches up with new records at each query, so appends pay
    /// nothing for it ("Streams" in docs/ARCHITECTURE.md). `key_of` must be a pure function of
    /// the bytes, and must not panic.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Each record starts with its agent's number.
    /// fn agent(record: &[u8]) -> Option<u64> {
    ///     record.first().map(|agent| u64::from(*agent))
    /// }
    /// let dir = tempfile::tempdir()?;
    /// let log = continuum::Log::builder(dir.path()).stream_key(agent).open()?;
    /// for (agent, step) in [(1u8, b'a'), (2, b'x'), (1, b'b'), (2, b'y')] {
    ///     log.append(&[agent, step])?;
    /// }
    /// drop(log);
    /// let log = continuum::Log::builder(dir.path()).stream_key(agent).open()?;
    /// let mut steps = Vec::new();
    /// log.visit_stream(1, continuum::Lsn::FIRST, |_, record| {
    ///     steps.push(record.bytes()[1]);
    ///     Ok(true)
    /// })?;
    /// assert_eq!(steps, b"ab");
    /// # Ok(())
    /// # }
    /// ```
    pub fn stream_key(mut self, key_of: StreamKey) -> Self {
        self.stream_key = Some(key_of);
        self
    }

    /// The file system to use instead of the real one (tests use
    /// [`SimStorage`](crate::storage::sim::SimStorage)).
    pub fn storage(mut self, storage: Arc<dyn Storage>) -> Self {
        self.storage = storage;
        self
    }

    /// Validates the configuration, locks the directory (creating it if needed), runs recovery
    /// and opens the log for appends.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`], [`Error::Locked`] if another handle has the store open,
    /// [`Error::Corruption`] when recovery finds damage its mode does not tolerate, and
    /// [`Error::Io`] / [`Error::NoSpace`] from the file system.
    pub fn open(self) -> Result<Log> {
        Log::open_with(self.storage, self.dir, self.config, self.metrics, self.stream_key)
    }

    /// The directory and storage the log will open (for reading the store's other files while
    /// it recovers).
    pub(crate) fn location(&self) -> (&Path, &Arc<dyn Storage>) {
        (&self.dir, &self.storage)
    }

    /// The settings the log will open with.
    #[cfg(feature = "object-store")]
    pub(crate) fn settings(&self) -> &Config {
        &self.config
    }

    /// Opens the log read-only: no lock is taken and nothing is ever written, truncated,
    /// synced, created or deleted, so it works while another process has the store open for
    /// writing (it sees the records written up to the open) and on a damaged store. Recovery
    /// *reports* what the configured [`RecoveryMode`] would repair — a torn tail is left in
    /// place and listed in [`Log::recovery_report`] — and appends fail with
    /// [`Error::ReadOnly`].
    ///
    /// Records a concurrent writer has written but not yet acknowledged (its `fdatasync` still
    /// running) may be visible.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`], [`Error::Corruption`] for damage the mode does not tolerate,
    /// and [`Error::Io`] (`NotFound` when `dir` holds no segment).
    pub fn open_read_only(self) -> Result<Log> {
        recovery::read_only::open(self.storage, self.dir, self.config, self.metrics, self.stream_key)
    }

    /// Turns the metrics off (for measuring their cost; they are on by default).
    #[doc(hidden)]
    pub fn metrics_enabled(mut self, enabled: bool) -> Self {
        self.metrics.enabled = enabled;
        self
    }

    /// Labels every metrics series of this log `store="<name>"`, so that two logs (or stores)
    /// in one process keep their series apart; without it the series carry no `store` label.
    /// The series are registered at open with the `metrics` recorder installed then (see
    /// [`crate::metrics`]).
    pub fn metrics_label(mut self, name: impl Into<String>) -> Self {
        self.metrics.label = Some(name.into());
        self
    }
}

/// The write-ahead log. `Send + Sync`: share it between threads behind an `Arc`.
pub struct Log {
    inner: Arc<Inner>,
    flusher: Mutex<Option<JoinHandle<()>>>,
    flusher_started: std::sync::atomic::AtomicBool,
}

struct Inner {
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    config: Config,
    index: Arc<RwLock<SegmentIndex>>,
    writer: Writer,
    report: RecoveryReport,
    /// Rewrites `log.manifest` when segments are created, rewritten or deleted.
    manifest: Arc<ManifestWriter>,
    truncating: Mutex<()>,
    stop: Mutex<bool>,
    stop_signal: Condvar,
    metrics: Arc<Metrics>,
    /// The stream index, if the log was opened with a [`StreamKey`].
    streams: Option<Streams>,
    _lock: DirLock,
}

impl fmt::Debug for Log {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Log").field("dir", &self.inner.dir).field("config", &self.inner.config).finish()
    }
}

impl Log {
    /// Opens (or creates) the log in `dir` with the default [`Config`] on the real file system.
    ///
    /// # Errors
    /// As [`LogBuilder::open`].
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        Self::builder(dir).open()
    }

    /// A builder for a log in `dir`.
    pub fn builder(dir: impl AsRef<Path>) -> LogBuilder {
        LogBuilder {
            dir: dir.as_ref().to_path_buf(),
            config: Config::default(),
            storage: Arc::new(FileStorage::new()),
            metrics: MetricsOptions::default(),
            stream_key: None,
        }
    }

    /// Opens the log in `dir` read-only with the default [`Config`]; see
    /// [`LogBuilder::open_read_only`].
    ///
    /// # Errors
    /// As [`LogBuilder::open_read_only`].
    pub fn open_read_only(dir: impl AsRef<Path>) -> Result<Self> {
        Self::builder(dir).open_read_only()
    }

    fn open_with(
        storage: Arc<dyn Storage>,
        dir: PathBuf,
        config: Config,
        metrics: MetricsOptions,
        stream_key: Option<StreamKey>,
    ) -> Result<Self> {
        let _span = tracing::info_span!("continuum.open", dir = %dir.display()).entered();
        config.validate()?;
        storage.create_dir_all(&dir).map_err(|e| Error::io("create directory", &dir, e))?;
        let lock = storage.lock_dir(&dir).map_err(|e| match e.kind() {
            std::io::ErrorKind::WouldBlock => Error::Locked { dir: dir.clone() },
            _ => Error::io("lock", &dir, e),
        })?;
        let recovered = recovery::recover(storage.as_ref(), &dir, &config, stream_key)?;
        let tail = opened_tail(&recovered.active)?;
        let store_id = recovered.active.header.store_id;
        // Once recovery has settled what the log holds, the manifest lists exactly that.
        manifest::write(storage.as_ref(), &dir, &Manifest::of_index(&recovered.index, store_id, tail))?;
        let manifest = ManifestWriter::new(Arc::clone(&storage), dir.clone(), store_id, tail);
        let metrics = Metrics::new(metrics.enabled, metrics.label.as_deref());
        Ok(Self::from_recovered(storage, dir, config, recovered, manifest, lock, metrics, false))
    }

    /// The log over what recovery (writable or read-only) found.
    #[expect(clippy::too_many_arguments, reason = "one private constructor, called from the two opens")]
    fn from_recovered(
        storage: Arc<dyn Storage>,
        dir: PathBuf,
        config: Config,
        recovered: recovery::Recovered,
        manifest: ManifestWriter,
        lock: DirLock,
        metrics: Metrics,
        read_only: bool,
    ) -> Self {
        let report = &recovered.report;
        tracing::info!(
            read_only,
            segments = report.segments,
            records = report.records,
            first_lsn = report.first_lsn,
            next_lsn = report.next_lsn,
            torn_tail_bytes = report.torn_tail.as_ref().map_or(0, |tail| tail.bytes),
            skipped_ranges = report.skipped.len(),
            duration_us = report.duration.as_micros() as u64,
            "log opened"
        );
        metrics.record_recovery(u64::from(report.torn_tail.is_some()), report.skipped.len() as u64);
        let metrics = Arc::new(metrics);
        let streams = recovered.streams.map(|streams| Streams::new(streams, &recovered.index.segments));
        let index = Arc::new(RwLock::new(recovered.index));
        let manifest = Arc::new(manifest);
        let writer = Writer::new(
            Arc::clone(&storage),
            dir.clone(),
            config.segment_bytes,
            config.commit_spin,
            recovered.active,
            Arc::clone(&index),
            Arc::clone(&manifest),
            Arc::clone(&metrics),
        );
        if read_only {
            writer.refuse_writes();
        }
        let inner = Arc::new(Inner {
            storage,
            dir,
            config,
            index,
            writer,
            report: recovered.report,
            manifest,
            truncating: Mutex::new(()),
            stop: Mutex::new(false),
            stop_signal: Condvar::new(),
            metrics,
            streams,
            _lock: lock,
        });
        let log = Log { inner, flusher: Mutex::new(None), flusher_started: std::sync::atomic::AtomicBool::new(false) };
        if log.inner.config.durability == Durability::Buffered && !read_only {
            log.start_flusher();
        }
        log
    }

    /// Appends one record with the log's default durability and returns its LSN.
    ///
    /// # Errors
    /// [`Error::RecordTooLarge`], [`Error::Poisoned`] after an earlier write or sync failure,
    /// [`Error::Closed`], and the file system's [`Error::Io`] / [`Error::NoSpace`].
    pub fn append(&self, record: &[u8]) -> Result<Lsn> {
        self.append_with(record, self.inner.config.durability)
    }

    /// Appends one record with the given durability.
    ///
    /// # Errors
    /// As [`Log::append`].
    pub fn append_with(&self, record: &[u8], durability: Durability) -> Result<Lsn> {
        self.append_batch_with(&[record], durability).map(|range| range.first())
    }

    /// Appends records as one batch: after any crash either all of them exist or none.
    ///
    /// # Errors
    /// As [`Log::append`], plus [`Error::EmptyBatch`] and [`Error::BatchTooLarge`].
    pub fn append_batch(&self, records: &[&[u8]]) -> Result<LsnRange> {
        self.append_batch_with(records, self.inner.config.durability)
    }

    /// Appends records as one batch with the given durability.
    ///
    /// # Errors
    /// As [`Log::append_batch`].
    pub fn append_batch_with(&self, records: &[&[u8]], durability: Durability) -> Result<LsnRange> {
        self.append_encoded(EncodedBatch::encode(records)?, durability)
    }

    /// Appends a batch built in place ([`BatchBuilder`]) with the given durability: what
    /// [`Log::append_batch_with`] does with the same records.
    pub(crate) fn append_built(&self, batch: BatchBuilder, durability: Durability) -> Result<LsnRange> {
        self.append_encoded(batch.finish()?, durability)
    }

    /// Refuses every append from now on with [`Error::Fenced`]: another owner took the
    /// store over (`ship/`). Appends already acknowledged stay.
    #[cfg(feature = "object-store")]
    pub(crate) fn fence(&self, epoch: u64, current: u64) {
        self.inner.writer.fence(epoch, current);
    }

    fn append_encoded(&self, batch: EncodedBatch, durability: Durability) -> Result<LsnRange> {
        if durability == Durability::Buffered && !self.flusher_started.load(std::sync::atomic::Ordering::Relaxed) {
            self.inner.writer.check_writable()?;
            self.start_flusher();
        }
        self.inner.writer.append(batch, durability, false)
    }

    /// Appends one record that lets space be freed (in a store: a run finished or dropped, an
    /// atom unpinned), with the given durability. Such a record may use the reserve every
    /// segment keeps at its end (a sixteenth of it, at most
    /// [`limits::SEGMENT_RESERVE_BYTES_MAX`](crate::limits::SEGMENT_RESERVE_BYTES_MAX)),
    /// which other appends leave free: once the disk is too full for a new segment, other
    /// appends fail with [`Error::NoSpace`] while these still fit, until the reserve too is
    /// used up.
    ///
    /// # Errors
    /// As [`Log::append`].
    pub fn append_reserved_with(&self, record: &[u8], durability: Durability) -> Result<Lsn> {
        let batch = EncodedBatch::encode(&[record])?;
        self.inner.writer.append(batch, durability, true).map(|range| range.first())
    }

    /// Makes every record appended so far durable (one `fdatasync`, shared with concurrent
    /// appenders).
    ///
    /// # Errors
    /// [`Error::Poisoned`], [`Error::Closed`], or the sync's [`Error::Io`].
    pub fn sync(&self) -> Result<()> {
        self.inner.writer.sync()
    }

    /// The record at `lsn`, or `None` if the log does not hold it (not yet written, truncated,
    /// or lost in a range skipped by recovery). The record is verified against its checksum.
    ///
    /// # Errors
    /// [`Error::Corruption`] if stored bytes no longer verify; [`Error::Io`].
    pub fn read(&self, lsn: Lsn) -> Result<Option<Bytes>> {
        let Some(meta) = self.inner.index.read().find(lsn.get()).cloned() else {
            return Ok(None);
        };
        // Frames before the record's are stepped over on their verified headers; only its own
        // frame is read and verified.
        let mut found = None;
        iter::visit_lsns(vec![meta], &[lsn.get()], |_, record| {
            found = Some(record.to_bytes());
            Ok(false)
        })?;
        Ok(found)
    }

    /// Calls `visit` with each record whose LSN is in `from..=to`, in order, until it returns
    /// `Ok(false)`: [`Log::iter_from`] without a shared slice per record (records are borrowed
    /// from their segment; [`RecordRef::to_bytes`] makes one when a caller keeps a record).
    ///
    /// # Errors
    /// [`Error::Corruption`] if stored bytes no longer verify, and `visit`'s errors.
    pub fn visit(&self, from: Lsn, to: Lsn, visit: impl FnMut(u64, RecordRef<'_>) -> Result<bool>) -> Result<()> {
        let segments = self.inner.index.read().segments.clone();
        iter::visit(segments, from.get(), to.get(), visit)
    }

    /// Calls `visit` with the record at each of `lsns` (ascending, without repeats) that the
    /// log holds, in order, until it returns `Ok(false)`, and returns how many it visited: for
    /// records scattered among many others (one agent's among every agent's, found through an
    /// index of the caller's). Only the frames holding them are read and verified; the frames
    /// between are stepped over on their headers, and wide gaps crossed through the segments'
    /// sparse index. LSNs the log does not hold (truncated, not yet written, or in a range
    /// recovery skipped) are passed over, which the count shows.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let dir = tempfile::tempdir()?;
    /// let log = continuum::Log::open(dir.path())?;
    /// let lsns: Vec<u64> = (0..10u8).map(|i| log.append(&[i]).map(|lsn| lsn.get())).collect::<Result<_, _>>()?;
    /// let mut seen = Vec::new();
    /// let wanted = [lsns[2], lsns[7], lsns[9] + 100];
    /// let visited = log.visit_lsns(&wanted, |lsn, record| {
    ///     seen.push((lsn, record.bytes()[0]));
    ///     Ok(true)
    /// })?;
    /// assert_eq!((visited, seen), (2, vec![(lsns[2], 2), (lsns[7], 7)]));
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] if `lsns` is not strictly ascending; [`Error::Corruption`] if a
    /// frame read (or a header stepped over) no longer verifies; `visit`'s errors.
    pub fn visit_lsns(&self, lsns: &[u64], visit: impl FnMut(u64, RecordRef<'_>) -> Result<bool>) -> Result<usize> {
        if lsns.windows(2).any(|pair| pair[0] >= pair[1]) {
            return Err(Error::InvalidArgument { reason: "visit_lsns takes strictly ascending LSNs".into() });
        }
        let segments = self.inner.index.read().segments.clone();
        iter::visit_lsns(segments, lsns, visit)
    }

    /// Calls `visit` with each record of the stream `key` (see [`LogBuilder::stream_key`]) at
    /// or after `from`, in LSN order, until it returns `Ok(false)`, and returns how many it
    /// visited. Each record is read straight from its frame (whose offset the index keeps),
    /// and verified; the rest of the log is not read. The records are those the log held when
    /// the call began (records appended meanwhile, even by `visit`, are not visited), looked
    /// up 16,384 at a time, so that a long stream's visit holds little memory.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] if the log was opened without a stream key;
    /// [`Error::Corruption`] if a frame read (or not yet indexed) no longer verifies; `visit`'s
    /// errors.
    pub fn visit_stream(
        &self,
        key: u64,
        from: Lsn,
        mut visit: impl FnMut(u64, RecordRef<'_>) -> Result<bool>,
    ) -> Result<usize> {
        let streams = self.stream_index()?;
        let until = self.inner.index.read().next_lsn();
        let (mut from, mut visited, stopped) = (from.get(), 0, std::cell::Cell::new(false));
        let mut visit = |lsn, record: RecordRef<'_>| {
            let go_on = visit(lsn, record)?;
            stopped.set(!go_on);
            Ok(go_on)
        };
        // A bounded part of the stream at a time, so that a long stream's visit holds little
        // memory; records appended meanwhile (at or after `until`) are not visited.
        loop {
            let segments = self.inner.index.read().segments.clone();
            let part = streams.stream(key, from..until, STREAM_VISIT_CHUNK, &segments)?;
            let Some(&last) = part.lsns.last() else { return Ok(visited) };
            visited += iter::visit_at(segments, &part.lsns, &part.frames, &mut visit)?;
            if stopped.get() || part.lsns.len() < STREAM_VISIT_CHUNK {
                return Ok(visited);
            }
            from = last + 1;
        }
    }

    /// The LSNs of the stream `key`'s records at or after `from`, ascending (see
    /// [`LogBuilder::stream_key`]).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] if the log was opened without a stream key;
    /// [`Error::Corruption`] if a frame not yet indexed no longer verifies.
    pub fn stream_lsns(&self, key: u64, from: Lsn) -> Result<Vec<u64>> {
        let segments = self.inner.index.read().segments.clone();
        Ok(self.stream_index()?.stream(key, from.get()..u64::MAX, usize::MAX, &segments)?.lsns)
    }

    /// The keys of every stream the log holds a record of, ascending (see
    /// [`LogBuilder::stream_key`]).
    ///
    /// # Errors
    /// As [`Log::stream_lsns`].
    pub fn stream_keys(&self) -> Result<Vec<u64>> {
        let segments = self.inner.index.read().segments.clone();
        self.stream_index()?.keys(&segments)
    }

    /// The stream index, or [`Error::InvalidConfig`] if the log was opened without a stream
    /// key.
    fn stream_index(&self) -> Result<&Streams> {
        self.streams().ok_or_else(streams::no_stream_key)
    }

    /// Iterates over the records from `lsn` (or from the oldest one, if `lsn` was truncated) to
    /// the newest record published when the iterator was created.
    ///
    /// # Errors
    /// The iterator yields [`Error::Corruption`] if stored bytes no longer verify, then ends.
    pub fn iter_from(&self, lsn: Lsn) -> Result<LogIter> {
        let segments = self.inner.index.read().segments.clone();
        Ok(LogIter::new(segments, lsn.get()))
    }

    /// LSN of the oldest record the log holds (or of the next one, if it is empty).
    pub fn first_lsn(&self) -> Lsn {
        Lsn(self.inner.index.read().first_lsn())
    }

    /// LSN the next appended record will receive, as far as readers can see.
    pub fn next_lsn(&self) -> Lsn {
        Lsn(self.inner.index.read().next_lsn())
    }

    /// Every segment, oldest first.
    pub fn segments(&self) -> Vec<SegmentInfo> {
        self.map_segments(|meta, sealed| SegmentInfo {
            path: meta.path.to_path_buf(),
            seq: meta.seq,
            first_lsn: Lsn(meta.first_lsn),
            next_lsn: Lsn(meta.next_lsn),
            data_bytes: meta.data_end,
            sealed,
            compressed: meta.compressed,
        })
    }

    /// `view` of every segment (and whether it is sealed), oldest first, under one read of the
    /// index.
    fn map_segments<T>(&self, view: impl Fn(&index::SegmentMeta, bool) -> T) -> Vec<T> {
        let index = self.inner.index.read();
        let last = index.segments.len().saturating_sub(1);
        index.segments.iter().enumerate().map(|(i, meta)| view(meta, i < last)).collect()
    }

    /// Every segment's version and file, oldest first (the last one active): what shipping
    /// uploads (`ship/`). A handle reads the version it names even after compaction renames a
    /// rewrite over its path.
    #[cfg(feature = "object-store")]
    pub(crate) fn segment_files(&self) -> Vec<SegmentFile> {
        self.map_segments(|meta, sealed| SegmentFile {
            seq: meta.seq,
            generation: meta.generation,
            first_lsn: meta.first_lsn,
            next_lsn: meta.next_lsn,
            data_end: meta.data_end,
            sealed,
            file: Arc::clone(&meta.file),
        })
    }

    /// Deletes every sealed segment whose records all have LSNs below `lsn`, oldest first.
    /// The active segment is never deleted. Returns how many segments were deleted.
    ///
    /// Crash-safe: segments leave the index and the log manifest first, then each file is
    /// unlinked and the directory synced before the next one, so a crash leaves a contiguous
    /// log.
    ///
    /// # Errors
    /// [`Error::Io`] if an unlink or directory sync fails; the segments not yet deleted stay.
    pub fn truncate_prefix(&self, lsn: Lsn) -> Result<usize> {
        self.inner.writer.check_writable()?;
        let _one_at_a_time = self.inner.truncating.lock();
        let victims = {
            let mut index = self.inner.index.write();
            let sealed = index.segments.len().saturating_sub(1);
            let count = index.segments[..sealed].iter().take_while(|meta| meta.next_lsn <= lsn.get()).count();
            index.segments.drain(..count).collect::<Vec<_>>()
        };
        if let (Some(streams), Some(last)) = (&self.inner.streams, victims.last()) {
            streams.forget_below(last.next_lsn);
        }
        if !victims.is_empty() {
            // IMPORTANT: the manifest stops listing the segments before they go, so that a
            // listed segment found missing is always lost records, never a truncated prefix.
            self.inner.manifest.publish(&self.inner.index, None)?;
        }
        for meta in &victims {
            let storage = self.inner.storage.as_ref();
            storage.remove_file(&meta.path).map_err(|e| Error::io("remove", meta.path.to_path_buf(), e))?;
            // IMPORTANT: each unlink is durable before the next, so a crash never leaves a gap.
            storage.sync_dir(&self.inner.dir).map_err(|e| Error::io("sync directory", &self.inner.dir, e))?;
        }
        Ok(victims.len())
    }

    /// What recovery found and did when this log was opened.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.inner.report
    }

    /// A copy of the log's counters and latency histograms (see [`crate::metrics`]).
    pub fn metrics(&self) -> MetricsSnapshot {
        self.inner.metrics.snapshot()
    }

    /// Turns the append-path metrics on or off (for measuring their cost side by side).
    #[doc(hidden)]
    pub fn set_metrics_enabled(&self, enabled: bool) {
        self.inner.metrics.set_enabled(enabled);
    }

    /// Marks CPU work of the store's own background thread until the guard drops: late yields
    /// of spinning appenders meanwhile do not hold spinning off (`writer::OwnWork`).
    pub(crate) fn own_background_work(&self) -> tuning::OwnWork<'_> {
        self.inner.writer.own_work()
    }

    /// The live metrics, for the layers above to record into.
    pub(crate) fn metrics_handle(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The stream index, if the log was opened with a [`StreamKey`].
    fn streams(&self) -> Option<&Streams> {
        self.inner.streams.as_ref()
    }

    /// The file system the log writes through.
    pub(crate) fn storage(&self) -> &Arc<dyn Storage> {
        &self.inner.storage
    }

    /// The store directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The configuration the log was opened with.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// Syncs everything appended, stops the background flusher and closes the log. A clean
    /// close also gives back the active segment's unused preallocation: the log manifest
    /// records the length the file is cut to, and the next writable open preallocates it
    /// again ("Closing" in docs/ARCHITECTURE.md).
    ///
    /// # Errors
    /// The final sync's error, or the trim's; the log is closed either way.
    pub fn close(self) -> Result<()> {
        self.shutdown()
    }

    fn shutdown(&self) -> Result<()> {
        *self.inner.stop.lock() = true;
        self.inner.stop_signal.notify_all();
        if let Some(flusher) = self.flusher.lock().take() {
            let _ = flusher.join();
        }
        let synced = if self.inner.writer.is_dirty() { self.inner.writer.sync() } else { Ok(()) };
        self.inner.writer.close();
        synced?;
        self.inner.writer.trim_on_close()
    }

    fn start_flusher(&self) {
        // Checked without the lock: every Buffered append calls this.
        if self.flusher_started.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        let mut flusher = self.flusher.lock();
        if flusher.is_some() {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        let interval = self.inner.config.flush_interval;
        let spawned =
            std::thread::Builder::new().name("continuum-flusher".into()).spawn(move || run_flusher(&weak, interval));
        // Without a flusher, Buffered appends are still written; only the timed sync is lost.
        *flusher = spawned.ok();
        self.flusher_started.store(true, std::sync::atomic::Ordering::Release);
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        // Best effort: `close` reports the final sync's error; dropping cannot.
        let _ = self.shutdown();
    }
}

/// The tail record of a log just opened: its recovered records are durable, and a last
/// segment that could not be preallocated again (a full disk) is recorded at its length.
fn opened_tail(active: &recovery::ActiveState) -> Result<TailRecord> {
    let file_bytes = active.file.len().map_err(|e| Error::io("stat", &active.path, e))?;
    let short = file_bytes < active.header.segment_bytes;
    Ok(TailRecord {
        seq: active.header.seq,
        next_lsn: active.next_lsn,
        trimmed_bytes: if short { file_bytes.max(1) } else { 0 },
    })
}

/// The background flusher: syncs unsynced bytes every `interval` until the log shuts down.
fn run_flusher(inner: &Weak<Inner>, interval: Duration) {
    loop {
        let Some(inner) = inner.upgrade() else { return };
        let mut stop = inner.stop.lock();
        if !*stop {
            inner.stop_signal.wait_for(&mut stop, interval);
        }
        if *stop {
            return;
        }
        drop(stop);
        if inner.writer.is_dirty() {
            // A failed sync poisons the writer, which reports it to the next appender.
            let _ = inner.writer.sync();
        }
    }
}
