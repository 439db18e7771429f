//! Recovery on open: scan every segment, verify every checksum, classify invalid bytes, apply
//! the [`RecoveryMode`], and rebuild the segment index.
//!
//! Rules (docs/FORMAT.md, "Recovery"):
//! 1. Every segment header must verify, name the LSN in its file name, and carry a sequence
//!    number greater than the previous segment's.
//! 2. Frames must follow each other with consecutive LSNs, and each segment must start at the
//!    LSN after the previous one's last record.
//! 3. The first position where no valid frame starts ends the segment's data. If only zeros
//!    follow, the segment ends cleanly there.
//! 4. If a valid frame follows further on, the bytes in between are corruption, never a torn
//!    tail. One exception: in the last segment, an invalid range that contains a whole
//!    all-zero 512-byte sector is a write the kernel never wrote back (pages of unsynced
//!    writes reach the disk in any order), so it is a torn tail like any other.
//! 5. Invalid bytes at the end of a sealed segment are corruption; at the end of the last
//!    segment they are a torn tail, cut under `TolerateTornTail` and refused under `Strict`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::{Config, RecoveryMode};
use crate::error::{CorruptionKind, Error, Result};
use crate::limits;
use crate::log::index::{SegmentIndex, SegmentMeta, SparseEntry};
use crate::log::manifest::{self, FoundSegment, Manifest};
use crate::log::record::{
    self, FRAME_ALIGN_BYTES, FRAME_HEADER_BYTES, FrameHeader, KIND_COMPRESSED_RECORDS, KIND_RECORDS,
};
use crate::log::segment::{self, SEGMENT_HEADER_BYTES, SegmentHeader, TEMP_SUFFIX};
use crate::log::streams::{self, StreamKey, StreamPart};
use crate::storage::{OpenMode, Storage, StorageFile, WriteMap};
use rayon::prelude::*;

pub(crate) mod read_only;
mod windowed;

/// Sector size assumed by the torn-write rule (docs/FORMAT.md, media assumptions).
const SECTOR_BYTES: usize = 512;

/// What recovery found and did when the log was opened.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Segment files found.
    pub segments: usize,
    /// Valid records found.
    pub records: u64,
    /// LSN of the oldest record kept.
    pub first_lsn: u64,
    /// LSN the next append receives.
    pub next_lsn: u64,
    /// The torn tail cut from the last segment, if there was one.
    pub torn_tail: Option<InvalidRange>,
    /// Invalid ranges skipped under [`RecoveryMode::SkipCorrupted`].
    pub skipped: Vec<InvalidRange>,
    /// LSN ranges `[start, end)` lost in skipped ranges.
    pub lost_lsns: Vec<(u64, u64)>,
    /// Evidence that acknowledged records existed past what recovery found (a deleted or
    /// shortened segment; docs/FORMAT.md §6, "Lost records"), reported under
    /// [`RecoveryMode::TolerateTornTail`] and [`RecoveryMode::SkipCorrupted`] (under
    /// [`RecoveryMode::Strict`] the open fails with `RecordsLost`). A writable open that
    /// reports it carries on from what it found and records that as the log from then on.
    pub lost_records: Vec<LostRecords>,
    /// Leftover temporary files (from a crash during segment creation) that were deleted.
    pub temp_files_removed: usize,
    /// Wall time recovery took.
    pub duration: Duration,
}

/// A range of invalid bytes in a segment file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidRange {
    /// The segment file.
    pub segment: PathBuf,
    /// Offset of the first invalid byte.
    pub offset: u64,
    /// Bytes in the range.
    pub bytes: u64,
}

impl RecoveryReport {
    /// Whether recovery found records lost ([`RecoveryReport::lost_records`]), lost LSNs in
    /// skipped ranges, or skipped ranges: anything but a clean log or a cut torn tail.
    pub fn found_loss(&self) -> bool {
        !self.lost_records.is_empty() || !self.lost_lsns.is_empty() || !self.skipped.is_empty()
    }
}

/// Evidence that records existed past the end of what recovery found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LostRecords {
    /// What shows it.
    pub evidence: LossEvidence,
    /// The segment file it is about (which may be missing), or the manifest.
    pub segment: PathBuf,
    /// The first LSN lost.
    pub from_lsn: u64,
    /// The LSN after the last one known lost; equal to `from_lsn` when how many is unknown.
    pub to_lsn: u64,
    /// Bytes of the segment file known missing (0 when unknown).
    pub bytes: u64,
}

/// What shows that records were lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LossEvidence {
    /// The log manifest lists a segment that does not exist.
    #[error("segment {seq}, listed in the log manifest, is missing")]
    SegmentMissing {
        /// Its sequence number.
        seq: u64,
    },
    /// A segment ends before the LSN the manifest recorded for it (its end when it was
    /// sealed, or the durable end of the active segment at the last open or clean close).
    #[error("the segment ends before LSN {recorded_next_lsn}, which the log manifest recorded")]
    EndsBeforeRecorded {
        /// The LSN the manifest recorded.
        recorded_next_lsn: u64,
    },
    /// The last segment's file is shorter than it was preallocated (or trimmed at a clean
    /// close) to, which no crash does.
    #[error("the last segment's file is {file_bytes} bytes, shorter than the {expected_bytes} it was written with")]
    ShorterThanWritten {
        /// The file's length.
        file_bytes: u64,
        /// Its preallocated length, or the length a clean close trimmed it to.
        expected_bytes: u64,
    },
    /// The segments carry generations, so a manifest was written, and it is gone.
    #[error("the log manifest is missing")]
    ManifestMissing,
}

/// The result of recovery: the rebuilt index and the open active segment.
pub(crate) struct Recovered {
    pub index: SegmentIndex,
    pub active: ActiveState,
    pub report: RecoveryReport,
    /// With a stream key: the streams of the segments recovery indexed as it read them.
    pub streams: Option<RecoveredStreams>,
}

/// The stream index as far as recovery built it ("Streams" in docs/ARCHITECTURE.md).
pub(crate) struct RecoveredStreams {
    pub key_of: StreamKey,
    /// The streams of every record below `indexed_to`.
    pub part: StreamPart,
    pub indexed_to: u64,
}

impl RecoveredStreams {
    /// Nothing indexed yet: the stream index reads every record of the log itself.
    pub fn unread(key_of: StreamKey) -> Self {
        Self { key_of, part: StreamPart::default(), indexed_to: 0 }
    }
}

/// What the writer needs to continue the last segment.
pub(crate) struct ActiveState {
    pub header: SegmentHeader,
    pub path: PathBuf,
    pub file: Arc<dyn StorageFile>,
    pub data_end: u64,
    pub next_lsn: u64,
    /// A writable map of the segment, when the storage offers one: appends become copies
    /// into the page cache instead of `write` calls.
    pub map: Option<WriteMap>,
}

impl ActiveState {
    /// The writer's state for a segment, mapped for writing when possible.
    pub fn new(header: SegmentHeader, path: PathBuf, file: Arc<dyn StorageFile>, data_end: u64, next_lsn: u64) -> Self {
        // A segment that cannot be mapped is written with positioned writes instead.
        let map = file.writable_map().ok().flatten();
        Self { header, path, file, data_end, next_lsn, map }
    }
}

/// How one segment's bytes ended.
#[derive(Debug, PartialEq, Eq)]
enum Tail {
    Clean,
    Invalid { offset: u64, bytes: u64 },
}

/// The scan of one segment.
#[derive(Debug)]
struct SegmentScan {
    next_lsn: u64,
    data_end: u64,
    records: u64,
    sparse: Vec<SparseEntry>,
    skips: Vec<(u64, u64)>,
    lost_lsns: Vec<(u64, u64)>,
    tail: Tail,
    /// With a stream key: the streams of the segment's valid frames, or `None` if a frame's
    /// records could not be read for them (the stream index then reads this segment itself,
    /// and reports why).
    streams: Option<StreamPart>,
}

impl SegmentScan {
    /// The scan of a segment with `header` before its first frame.
    fn empty(header: &SegmentHeader, stream_key: Option<StreamKey>) -> Self {
        SegmentScan {
            next_lsn: header.first_lsn,
            data_end: SEGMENT_HEADER_BYTES as u64,
            records: 0,
            sparse: Vec::new(),
            skips: Vec::new(),
            lost_lsns: Vec::new(),
            tail: Tail::Clean,
            streams: stream_key.map(|_| StreamPart::default()),
        }
    }
}

/// Recovers the log in `dir`, creating an empty log if there is none.
pub(crate) fn recover(
    storage: &dyn Storage,
    dir: &Path,
    config: &Config,
    stream_key: Option<StreamKey>,
) -> Result<Recovered> {
    let started = Instant::now();
    let mut report = RecoveryReport::default();
    let names = storage.list_dir(dir).map_err(|e| Error::io("list directory", dir, e))?;
    report.temp_files_removed = remove_temp_files(storage, dir, &names)?;
    // IMPORTANT: a process that died may have left creates, renames and unlinks in the page
    // cache only; this open builds on them, so they are made durable before anything new is.
    storage.sync_dir(dir).map_err(|e| Error::io("sync directory", dir, e))?;
    let listed = read_manifest(storage, dir, config.recovery_mode)?;
    let mut lsns: Vec<u64> = names.iter().filter_map(|name| segment::parse_file_name(name)).collect();
    lsns.sort_unstable();
    report.segments = lsns.len();
    let mut recovered = match lsns.split_last() {
        None => create_first_segment(storage, dir, config, listed.as_ref(), &mut report)?,
        Some((&last, sealed)) => {
            let segments = Segments { sealed, last, listed: listed.as_ref() };
            recover_segments(storage, dir, config, stream_key, &segments, &mut report)?
        }
    };
    if recovered.streams.is_none() {
        recovered.streams = stream_key.map(RecoveredStreams::unread);
    }
    report.first_lsn = recovered.index.first_lsn();
    report.next_lsn = recovered.active.next_lsn;
    report.duration = started.elapsed();
    recovered.report = report;
    Ok(recovered)
}

/// The log manifest, if there is one. One that does not verify fails the open, except under
/// [`RecoveryMode::SkipCorrupted`], which goes on without it (and reports it missing).
pub(crate) fn read_manifest(storage: &dyn Storage, dir: &Path, mode: RecoveryMode) -> Result<Option<Manifest>> {
    match manifest::read(storage, dir) {
        Err(error @ Error::Corruption { .. }) if mode == RecoveryMode::SkipCorrupted => {
            tracing::warn!(%error, "ignored the log manifest (SkipCorrupted)");
            Ok(None)
        }
        other => other,
    }
}

/// The segment files recovery found, with the manifest that lists them.
struct Segments<'a> {
    sealed: &'a [u64],
    last: u64,
    listed: Option<&'a Manifest>,
}

/// Applies the mode to the evidence of lost records: fails under [`RecoveryMode::Strict`],
/// reports it otherwise.
pub(crate) fn settle_lost(lost: Vec<LostRecords>, mode: RecoveryMode, report: &mut RecoveryReport) -> Result<()> {
    if mode == RecoveryMode::Strict
        && let Some(first) = lost.first()
    {
        let kind =
            CorruptionKind::RecordsLost { evidence: first.evidence, from_lsn: first.from_lsn, to_lsn: first.to_lsn };
        return Err(corruption(&first.segment, 0, kind));
    }
    for lost in &lost {
        tracing::error!(
            segment = %lost.segment.display(),
            evidence = %lost.evidence,
            from_lsn = lost.from_lsn,
            to_lsn = lost.to_lsn,
            "records are lost from the end of the log"
        );
    }
    report.lost_records.extend(lost);
    Ok(())
}

fn remove_temp_files(storage: &dyn Storage, dir: &Path, names: &[String]) -> Result<usize> {
    let temps: Vec<&String> = names.iter().filter(|name| name.ends_with(TEMP_SUFFIX)).collect();
    for name in &temps {
        let path = dir.join(name);
        storage.remove_file(&path).map_err(|e| Error::io("remove", &path, e))?;
    }
    if !temps.is_empty() {
        tracing::info!(count = temps.len(), "removed leftover temporary segment files");
    }
    Ok(temps.len())
}

/// Creates the first segment of a log with no segment file: a new log, or (when a manifest
/// lists segments, all of them missing) a log whose records were all lost, which goes on after
/// the LSNs and the sequence numbers the manifest lists, so that none is ever reused.
fn create_first_segment(
    storage: &dyn Storage,
    dir: &Path,
    config: &Config,
    listed: Option<&Manifest>,
    report: &mut RecoveryReport,
) -> Result<Recovered> {
    let lost = manifest::check(dir, listed, &[])?;
    settle_lost(lost, config.recovery_mode, report)?;
    let after = listed.and_then(|m| m.segments.last().map(|last| (m, last)));
    let header = SegmentHeader {
        seq: after.map_or(1, |(_, last)| last.seq + 1),
        first_lsn: report.lost_records.iter().map(|lost| lost.to_lsn).max().unwrap_or(1).max(1),
        segment_bytes: config.segment_bytes,
        store_id: after.map_or_else(segment::new_store_id, |(m, _)| m.store_id),
        end_lsn: 0,
        compressed: false,
        generation: segment::GENERATION_WRITER,
    };
    let created = segment::create(storage, dir, header)?;
    let active = ActiveState::new(header, created.path, created.file, SEGMENT_HEADER_BYTES as u64, header.first_lsn);
    let mut index = SegmentIndex::default();
    index.segments.push(active_meta(&active, Vec::new(), Vec::new()));
    Ok(Recovered { index, active, report: RecoveryReport::default(), streams: None })
}

/// The index entry of the active segment, read with positioned reads below its published end.
pub(crate) fn active_meta(active: &ActiveState, sparse: Vec<SparseEntry>, skips: Vec<(u64, u64)>) -> SegmentMeta {
    SegmentMeta {
        seq: active.header.seq,
        generation: active.header.generation,
        salt: active.header.salt(),
        compressed: false,
        first_lsn: active.header.first_lsn,
        next_lsn: active.next_lsn,
        data_end: active.data_end,
        path: Arc::from(active.path.as_path()),
        sparse: Arc::new(sparse),
        skips: Arc::new(skips),
        file: Arc::clone(&active.file),
    }
}

fn recover_segments(
    storage: &dyn Storage,
    dir: &Path,
    config: &Config,
    stream_key: Option<StreamKey>,
    segments: &Segments<'_>,
    report: &mut RecoveryReport,
) -> Result<Recovered> {
    let mut sealed = recover_sealed(storage, dir, config, stream_key, segments.sealed, segments.last, report)?;
    let mode = config.recovery_mode;
    let path = dir.join(segment::file_name(segments.last));
    let file = storage.open(&path, OpenMode::ReadWrite).map_err(|e| Error::io("open", &path, e))?;
    let bytes = read_written(file.as_ref(), &path)?;
    let header = check_header(&bytes, &path, segments.last, sealed.previous, mode, report)?;
    let scan = scan_segment(&bytes, &header, &path, mode, true)?;
    drop(bytes);
    let file_bytes = file.len().map_err(|e| Error::io("stat", &path, e))?;
    sealed.found.push(FoundSegment { path: path.clone(), header, next_lsn: scan.next_lsn, file_bytes });
    if let (RecoveryMode::Strict, Tail::Invalid { offset, bytes }) = (mode, &scan.tail) {
        return Err(corruption(&path, *offset, CorruptionKind::TornTail { bytes: *bytes }));
    }
    // Before the tail is cut or anything written: the evidence is taken as the files are.
    let lost = manifest::check(dir, segments.listed, &sealed.found)?;
    settle_lost(lost, mode, report)?;
    let active = settle_last_tail(&scan, &header, &path, file, mode, report)?;
    report.records += scan.records;
    let mut index = sealed.index;
    index.segments.push(active_meta(&active, scan.sparse, scan.skips));
    Ok(Recovered { index, active, report: RecoveryReport::default(), streams: sealed.streams })
}

/// What recovery found in the sealed segments.
struct SealedRecovered {
    index: SegmentIndex,
    /// The last sealed segment's header and the LSN after it.
    previous: Option<(SegmentHeader, u64)>,
    streams: Option<RecoveredStreams>,
    found: Vec<FoundSegment>,
}

fn recover_sealed(
    storage: &dyn Storage,
    dir: &Path,
    config: &Config,
    stream_key: Option<StreamKey>,
    sealed: &[u64],
    last: u64,
    report: &mut RecoveryReport,
) -> Result<SealedRecovered> {
    let mut index = SegmentIndex::default();
    let mut found = Vec::with_capacity(sealed.len() + 1);
    let mut previous: Option<(SegmentHeader, u64)> = None;
    let mode = config.recovery_mode;
    // Sealed segments are read and scanned in parallel (verifying every frame's CRC is most of
    // a large log's recovery; each thread holds one segment's bytes at a time), then checked
    // and settled one by one in order, so that the error reported is the first in log order,
    // exactly as a one-by-one recovery reports it.
    let read_one = |&first_lsn: &u64| {
        let path = dir.join(segment::file_name(first_lsn));
        let read = read_sealed(storage, &path, mode, stream_key);
        (path, read)
    };
    let reads: Vec<(PathBuf, Result<SealedRead>)> = if sealed.len() > 1 {
        sealed.par_iter().map(read_one).collect()
    } else {
        sealed.iter().map(read_one).collect()
    };
    // The sealed segments' streams, merged in LSN order while every one was read whole.
    let first = sealed.first().copied().unwrap_or(last);
    let mut streams =
        stream_key.map(|key_of| RecoveredStreams { key_of, part: StreamPart::default(), indexed_to: first });
    for (&first_lsn, (path, read)) in sealed.iter().zip(reads) {
        let read = read?;
        let header = check_header(&read.head, &path, first_lsn, previous, config.recovery_mode, report)?;
        // A header that checks out decoded above, so its segment was scanned.
        let mut scan = read
            .scan
            .ok_or_else(|| corruption(&path, 0, CorruptionKind::BadSegmentHeader { reason: "unreadable" }))??;
        if let Some(recovered) = &mut streams
            && let Some(part) = scan.streams.take()
            && recovered.indexed_to == first_lsn
        {
            streams::merge(&mut recovered.part, part);
            recovered.indexed_to = scan.next_lsn;
        }
        let scan = settle_sealed_tail(scan, &path, config.recovery_mode, report)?;
        previous = Some((header, scan.next_lsn));
        let file_bytes = read.file.len().map_err(|e| Error::io("stat", &path, e))?;
        found.push(FoundSegment { path: path.clone(), header, next_lsn: scan.next_lsn, file_bytes });
        index.segments.push(sealed_meta(header, &path, scan, read.file));
    }
    Ok(SealedRecovered { index, previous, streams, found })
}

/// A sealed segment as recovery read it: its file, its header's bytes, and the scan of its
/// written part (`None` if the header did not decode).
struct SealedRead {
    file: Arc<dyn StorageFile>,
    head: Vec<u8>,
    scan: Option<Result<SegmentScan>>,
}

/// Opens, reads and scans one sealed segment; its bytes are dropped once scanned.
fn read_sealed(storage: &dyn Storage, path: &Path, mode: RecoveryMode, key: Option<StreamKey>) -> Result<SealedRead> {
    let file = storage.open(path, OpenMode::ReadOnly).map_err(|e| Error::io("open", path, e))?;
    let end = written_end(file.as_ref(), path)?;
    let mut head = vec![0u8; SEGMENT_HEADER_BYTES.min(end as usize)];
    file.read_exact_at(&mut head, 0).map_err(|e| Error::io("read", path, e))?;
    let Ok(header) = SegmentHeader::decode(&head) else {
        return Ok(SealedRead { file, head, scan: None });
    };
    if let Some(scan) = windowed::scan_sealed(file.as_ref(), path, &header, end, key)? {
        return Ok(SealedRead { file, head, scan: Some(Ok(scan)) });
    }
    let bytes = read_written(file.as_ref(), path)?;
    let scan = Some(scan_segment_indexed(&bytes, &header, path, mode, false, key));
    Ok(SealedRead { file, head, scan })
}

fn sealed_meta(header: SegmentHeader, path: &Path, scan: SegmentScan, file: Arc<dyn StorageFile>) -> SegmentMeta {
    SegmentMeta {
        seq: header.seq,
        generation: header.generation,
        salt: header.salt(),
        compressed: header.compressed,
        first_lsn: header.first_lsn,
        next_lsn: scan.next_lsn,
        data_end: scan.data_end,
        path: Arc::from(path),
        sparse: Arc::new(scan.sparse),
        skips: Arc::new(scan.skips),
        file,
    }
}

fn corruption(path: &Path, offset: u64, kind: CorruptionKind) -> Error {
    Error::Corruption { segment: path.to_path_buf(), offset, kind }
}

/// Verifies a segment header and its place after the previous segment.
fn check_header(
    bytes: &[u8],
    path: &Path,
    named_lsn: u64,
    previous: Option<(SegmentHeader, u64)>,
    mode: RecoveryMode,
    report: &mut RecoveryReport,
) -> Result<SegmentHeader> {
    let header = SegmentHeader::decode(bytes)
        .map_err(|reason| corruption(path, 0, CorruptionKind::BadSegmentHeader { reason }))?;
    if header.first_lsn != named_lsn {
        return Err(corruption(path, 0, CorruptionKind::NameMismatch { named: named_lsn, stored: header.first_lsn }));
    }
    let Some((previous, previous_next_lsn)) = previous else {
        return Ok(header);
    };
    if header.store_id != previous.store_id {
        return Err(corruption(
            path,
            0,
            CorruptionKind::ForeignSegment { expected: previous.store_id, found: header.store_id },
        ));
    }
    if header.seq <= previous.seq {
        return Err(corruption(path, 0, CorruptionKind::SequenceOrder { previous: previous.seq, found: header.seq }));
    }
    if header.first_lsn != previous_next_lsn {
        let gap = CorruptionKind::LsnGap { expected: previous_next_lsn, found: header.first_lsn };
        if mode != RecoveryMode::SkipCorrupted || header.first_lsn < previous_next_lsn {
            return Err(corruption(path, 0, gap));
        }
        report.lost_lsns.push((previous_next_lsn, header.first_lsn));
    }
    Ok(header)
}

/// The part of a segment's bytes recovery must scan, read with positioned reads (a read the
/// disk fails is an `Error::Io` naming the file): all of it, or, when the file system says
/// nothing was ever written past some offset, up to that offset plus `WRITTEN_SLACK_BYTES`.
/// Bytes never written read as zeros, which hold no frame and no non-zero byte, so the scan's
/// verdict is the same; only a frame some of whose bytes were never written (an unsynced
/// write the kernel did not finish, never an acknowledged one) could read differently, and
/// it is torn either way once cut. A file larger than any segment is refused unread.
fn read_written(file: &dyn StorageFile, path: &Path) -> Result<Vec<u8>> {
    let end = written_end(file, path)?;
    let mut bytes = vec![0u8; usize::try_from(end).expect("at most SEGMENT_BYTES_MAX, checked above")];
    file.read_exact_at(&mut bytes, 0).map_err(|e| Error::io("read", path, e))?;
    Ok(bytes)
}

/// The end of the part of a segment file recovery scans (see [`read_written`]).
fn written_end(file: &dyn StorageFile, path: &Path) -> Result<u64> {
    const WRITTEN_SLACK_BYTES: u64 = 64 * 1024;
    let len = file.len().map_err(|e| Error::io("stat", path, e))?;
    if len > limits::SEGMENT_BYTES_MAX {
        let reason = "the file is larger than the largest segment";
        return Err(corruption(path, 0, CorruptionKind::BadSegmentHeader { reason }));
    }
    let hint = file.data_end_hint().ok().flatten();
    let end = hint.map_or(len, |end| end.saturating_add(WRITTEN_SLACK_BYTES).min(len));
    Ok(end.max((SEGMENT_HEADER_BYTES as u64).min(len)))
}

/// Walks the frames of one segment. Fails on corruption the mode does not tolerate.
fn scan_segment(
    bytes: &[u8],
    header: &SegmentHeader,
    path: &Path,
    mode: RecoveryMode,
    is_last: bool,
) -> Result<SegmentScan> {
    scan_segment_indexed(bytes, header, path, mode, is_last, None)
}

/// [`scan_segment`], also indexing the records of every valid frame by `stream_key`: the
/// stream index is built in the same pass that verifies the frames ("Streams" in
/// docs/ARCHITECTURE.md).
fn scan_segment_indexed(
    bytes: &[u8],
    header: &SegmentHeader,
    path: &Path,
    mode: RecoveryMode,
    is_last: bool,
    stream_key: Option<StreamKey>,
) -> Result<SegmentScan> {
    let mut scan = SegmentScan::empty(header, stream_key);
    let salt = header.salt();
    let mut at = SEGMENT_HEADER_BYTES;
    let mut last_indexed: Option<usize> = None;
    // Found once per segment: each damaged range would otherwise scan the zero tail again.
    let mut last_nonzero_at: Option<Option<usize>> = None;
    if header.is_compacted() && is_last {
        let reason = "a compacted segment is the newest segment";
        return Err(corruption(path, 0, CorruptionKind::BadSegmentHeader { reason }));
    }
    loop {
        match valid_frame_at(bytes, at, salt) {
            Some(frame) if frame.is_compressed() && !header.compressed => {
                let reason = "a compressed frame in a segment of format version 1";
                return Err(corruption(path, at as u64, CorruptionKind::BadBatch { reason }));
            }
            Some(frame) if follows(header, scan.next_lsn, &frame) => {
                if last_indexed.is_none_or(|i| (at - i) as u64 >= limits::SPARSE_INDEX_STRIDE_BYTES) {
                    scan.sparse.push(SparseEntry { lsn: frame.first_lsn, offset: at as u64 });
                    last_indexed = Some(at);
                }
                if let (Some(key_of), Some(part)) = (stream_key, &mut scan.streams)
                    && streams::index_frame(key_of, &bytes[at..], at as u64, &frame, salt, part).is_err()
                {
                    scan.streams = None;
                }
                scan.records += u64::from(frame.record_count);
                scan.next_lsn = frame.next_lsn();
                at += frame.frame_len();
                scan.data_end = at as u64;
            }
            Some(frame) if mode != RecoveryMode::SkipCorrupted || frame.first_lsn < scan.next_lsn => {
                let gap = CorruptionKind::LsnGap { expected: scan.next_lsn, found: frame.first_lsn };
                return Err(corruption(path, at as u64, gap));
            }
            _ => match classify_invalid(bytes, at, salt, (scan.next_lsn, is_last), &mut last_nonzero_at) {
                Invalid::End if header.is_compacted() => {
                    scan.next_lsn = header.end_lsn;
                    return Ok(scan);
                }
                Invalid::End => return Ok(scan),
                Invalid::Tail { bytes } => {
                    scan.tail = Tail::Invalid { offset: at as u64, bytes };
                    return Ok(scan);
                }
                Invalid::BeforeValid { next_valid } => {
                    if mode != RecoveryMode::SkipCorrupted {
                        let kind = CorruptionKind::InvalidBatchBeforeValid { next_valid_offset: next_valid as u64 };
                        return Err(corruption(path, at as u64, kind));
                    }
                    at = skip_to(&mut scan, bytes, at, next_valid, salt);
                    last_indexed = Some(next_valid);
                }
            },
        }
    }
}

/// Whether `frame` may come next: in a segment the writer wrote, LSNs are contiguous; in one
/// compaction rewrote, they may skip ahead, up to the end the header records.
fn follows(header: &SegmentHeader, next_lsn: u64, frame: &FrameHeader) -> bool {
    if header.is_compacted() {
        frame.first_lsn >= next_lsn && frame.next_lsn() <= header.end_lsn
    } else {
        frame.first_lsn == next_lsn
    }
}

/// The header of the fully valid frame at `at`, if one starts there. A frame never claims
/// durability past its own start.
fn valid_frame_at(bytes: &[u8], at: usize, salt: u64) -> Option<FrameHeader> {
    let frame = record::decode_frame(bytes.get(at..)?, salt).ok()?;
    (frame.header.synced_through as usize <= at).then_some(frame.header)
}

/// Records a skipped range and resumes at the valid frame after it; returns the new position.
fn skip_to(scan: &mut SegmentScan, bytes: &[u8], at: usize, next_valid: usize, salt: u64) -> usize {
    scan.skips.push((at as u64, next_valid as u64));
    let frame = valid_frame_at(bytes, next_valid, salt).expect("classify_invalid found a valid frame here");
    if frame.first_lsn > scan.next_lsn {
        scan.lost_lsns.push((scan.next_lsn, frame.first_lsn));
    }
    scan.next_lsn = frame.first_lsn;
    scan.sparse.push(SparseEntry { lsn: frame.first_lsn, offset: next_valid as u64 });
    next_valid
}

enum Invalid {
    /// Only zeros follow: the data ends here.
    End,
    /// Invalid bytes, `bytes` long up to the last non-zero byte, and no valid frame after them.
    Tail { bytes: u64 },
    /// A valid frame starts at `next_valid` after invalid bytes.
    BeforeValid { next_valid: usize },
}

/// Classifies the bytes from `at`, where no valid frame starts (`next_lsn` expected next, in
/// the last segment or not). `last_nonzero_at` caches the offset of the segment's last
/// non-zero byte, found on the first call.
fn classify_invalid(
    bytes: &[u8],
    at: usize,
    salt: u64,
    (next_lsn, is_last): (u64, bool),
    last_nonzero_at: &mut Option<Option<usize>>,
) -> Invalid {
    let rest = &bytes[at..];
    let segment_last = *last_nonzero_at.get_or_insert_with(|| last_nonzero(bytes));
    let Some(last_nonzero) = segment_last.filter(|last| *last >= at).map(|last| last - at) else {
        return Invalid::End;
    };
    // A frame whose header verifies owns its payload: a frame image inside it is record bytes.
    let search_from = match record::decode_header(rest, salt) {
        Ok(header) => at + header.frame_len(),
        Err(_) => at + FRAME_ALIGN_BYTES,
    };
    let tail = Invalid::Tail { bytes: last_nonzero as u64 + 1 };
    let Some(next_valid) = find_next_valid(bytes, search_from, salt, next_lsn) else {
        return tail;
    };
    if is_last && is_unsynced_hole(bytes, at, next_valid, salt) { tail } else { Invalid::BeforeValid { next_valid } }
}

/// Whether the invalid range `at..next_valid` of the last segment is a write the kernel never
/// wrote back (docs/FORMAT.md §6, rule 4): it holds a whole zero sector, and no valid frame
/// after it was written once the range was known durable.
fn is_unsynced_hole(bytes: &[u8], at: usize, next_valid: usize, salt: u64) -> bool {
    if !has_zero_sector(&bytes[at..next_valid], at) {
        return false;
    }
    let mut frame_at = next_valid;
    while let Some(frame) = valid_frame_at(bytes, frame_at, salt) {
        if frame.synced_through as usize > at {
            return false;
        }
        frame_at += frame.frame_len();
    }
    true
}

/// The first aligned offset from `from` where a fully valid frame with an LSN at or after
/// `next_lsn` starts.
fn find_next_valid(bytes: &[u8], from: usize, salt: u64, next_lsn: u64) -> Option<usize> {
    let mut at = from.next_multiple_of(FRAME_ALIGN_BYTES);
    while at + FRAME_HEADER_BYTES <= bytes.len() {
        // Cheap filters before any checksum: the kind byte and the reserved bytes.
        let kind = bytes[at + 12];
        let plausible = (kind == KIND_RECORDS || kind == KIND_COMPRESSED_RECORDS)
            && bytes[at + 13] == 0
            && bytes[at + 14..at + 16] == [0; 2];
        if plausible && valid_frame_at(bytes, at, salt).is_some_and(|frame| frame.first_lsn >= next_lsn) {
            return Some(at);
        }
        at += FRAME_ALIGN_BYTES;
    }
    None
}

/// Index of the last non-zero byte. The preallocated tail of a segment is usually tens of
/// megabytes of zeros, so this compares whole pages (`memcmp`) rather than single bytes.
fn last_nonzero(bytes: &[u8]) -> Option<usize> {
    const ZEROS: [u8; 4096] = [0; 4096];
    let mut end = bytes.len();
    while end > 0 {
        let start = end.saturating_sub(ZEROS.len());
        let chunk = &bytes[start..end];
        #[cfg(test)]
        tests::ZERO_SCANNED.with(|scanned| scanned.set(scanned.get() + chunk.len()));
        if chunk != &ZEROS[..chunk.len()] {
            return chunk.iter().rposition(|&b| b != 0).map(|at| start + at);
        }
        end = start;
    }
    None
}

/// Whether `range`, which starts at file offset `offset`, contains a whole sector of zeros.
fn has_zero_sector(range: &[u8], offset: usize) -> bool {
    let first = offset.next_multiple_of(SECTOR_BYTES) - offset;
    range
        .get(first..)
        .is_some_and(|aligned| aligned.chunks_exact(SECTOR_BYTES).any(|sector| sector.iter().all(|&b| b == 0)))
}

fn settle_sealed_tail(
    scan: SegmentScan,
    path: &Path,
    mode: RecoveryMode,
    report: &mut RecoveryReport,
) -> Result<SegmentScan> {
    report.records += scan.records;
    report.lost_lsns.extend(scan.lost_lsns.iter().copied());
    record_skips(&scan, path, report);
    if let Tail::Invalid { offset, bytes } = scan.tail {
        if mode != RecoveryMode::SkipCorrupted {
            return Err(corruption(path, offset, CorruptionKind::SealedSegmentTail { bytes }));
        }
        tracing::warn!(segment = %path.display(), offset, bytes, "skipped the invalid tail of a sealed segment (SkipCorrupted)");
        report.skipped.push(InvalidRange { segment: path.to_path_buf(), offset, bytes });
    }
    Ok(scan)
}

fn record_skips(scan: &SegmentScan, path: &Path, report: &mut RecoveryReport) {
    for &(start, end) in &scan.skips {
        tracing::warn!(segment = %path.display(), offset = start, bytes = end - start, "skipped invalid bytes (SkipCorrupted)");
        report.skipped.push(InvalidRange { segment: path.to_path_buf(), offset: start, bytes: end - start });
    }
}

/// Applies the mode to the last segment's tail and returns the writer's starting state.
fn settle_last_tail(
    scan: &SegmentScan,
    header: &SegmentHeader,
    path: &Path,
    file: Arc<dyn StorageFile>,
    mode: RecoveryMode,
    report: &mut RecoveryReport,
) -> Result<ActiveState> {
    report.lost_lsns.extend(scan.lost_lsns.iter().copied());
    record_skips(scan, path, report);
    if let Tail::Invalid { offset, bytes } = scan.tail {
        if mode == RecoveryMode::Strict {
            return Err(corruption(path, offset, CorruptionKind::TornTail { bytes }));
        }
        cut_tail(file.as_ref(), path, offset, bytes)?;
        tracing::warn!(segment = %path.display(), offset, bytes, "cut a torn tail");
        report.torn_tail = Some(InvalidRange { segment: path.to_path_buf(), offset, bytes });
    } else {
        // IMPORTANT: after a process crash the page cache may still hold bytes the dead process
        // wrote but never synced; they are published now, so they must be durable first.
        file.sync_data().map_err(|e| Error::io("fdatasync", path, e))?;
    }
    preallocate_again(file.as_ref(), header, path)?;
    Ok(ActiveState::new(*header, path.to_path_buf(), file, scan.data_end, scan.next_lsn))
}

/// Overwrites the torn tail `offset..offset + bytes` with zeros, durably, so that no stale
/// byte of it can ever be read as part of a later frame. The file keeps its length: a crash
/// never leaves the last segment shorter than it was written (the evidence of lost records
/// relies on that, docs/FORMAT.md §6).
fn cut_tail(file: &dyn StorageFile, path: &Path, offset: u64, bytes: u64) -> Result<()> {
    static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];
    let end = offset + bytes;
    let mut at = offset;
    while at < end {
        let len = (end - at).min(ZEROS.len() as u64);
        file.write_all_at(&ZEROS[..len as usize], at).map_err(|e| Error::io("write", path, e))?;
        at += len;
    }
    // IMPORTANT: the cut must be durable before new frames are written over the old tail.
    file.sync_data().map_err(|e| Error::io("fdatasync", path, e))
}

/// Preallocates the last segment back to its `segment_bytes` when a clean close trimmed it. A
/// full disk leaves it short (the writer writes past its end, and the open's manifest records
/// the length it has); any other failure fails the open.
fn preallocate_again(file: &dyn StorageFile, header: &SegmentHeader, path: &Path) -> Result<()> {
    let file_bytes = file.len().map_err(|e| Error::io("stat", path, e))?;
    if header.is_compacted() || file_bytes >= header.segment_bytes {
        return Ok(());
    }
    match file.allocate(header.segment_bytes) {
        Ok(()) => file.sync_data().map_err(|e| Error::io("fdatasync", path, e)),
        Err(e) if e.kind() == std::io::ErrorKind::StorageFull => {
            tracing::warn!(segment = %path.display(), file_bytes, "no room to preallocate the last segment again");
            Ok(())
        }
        Err(e) => Err(Error::io("preallocate", path, e)),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    thread_local! {
        /// Bytes `last_nonzero` compared on this thread: the work of finding segments' ends.
        pub(super) static ZERO_SCANNED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    #[test]
    fn skipping_many_damaged_ranges_scans_the_zero_tail_once() {
        // Guards against each damaged range scanning the segment's preallocated zeros again,
        // which would make a SkipCorrupted open (and `dump verify`) grow with ranges × segment size.
        let storage = crate::storage::sim::SimStorage::new(0);
        let dir = Path::new("/damaged");
        let segment_bytes = 4 << 20;
        {
            let log = crate::Log::builder(dir)
                .storage(Arc::new(storage.clone()))
                .segment_bytes(segment_bytes)
                .open()
                .expect("log");
            for i in 0..400u32 {
                log.append(&i.to_le_bytes().repeat(16)).expect("append");
            }
        }
        let path = dir.join(crate::log::segment::file_name(1));
        let mut bytes = storage.file_bytes(&path).expect("segment");
        let header = SegmentHeader::decode(&bytes).expect("header");
        // Damage the payload of every other frame.
        let mut at = SEGMENT_HEADER_BYTES;
        let mut damaged = 0;
        while let Ok(frame) = record::decode_frame(&bytes[at..], header.salt()) {
            let len = frame.header.frame_len();
            if damaged < 150 && (at / len).is_multiple_of(2) {
                bytes[at + record::FRAME_HEADER_BYTES + 6] ^= 0x55;
                damaged += 1;
            }
            at += len;
        }
        assert_eq!(damaged, 150);
        ZERO_SCANNED.with(|scanned| scanned.set(0));
        let scan = scan_segment(&bytes, &header, &path, RecoveryMode::SkipCorrupted, false).expect("scan");
        assert!(scan.skips.len() >= 100, "{} skips", scan.skips.len());
        let scanned = ZERO_SCANNED.with(std::cell::Cell::get);
        assert!(scanned <= 2 * bytes.len(), "{scanned} bytes compared for a {}-byte segment", bytes.len());
    }

    #[test]
    fn last_nonzero_finds_the_last_set_byte_across_pages() {
        let mut bytes = vec![0u8; 10_000];
        assert_eq!(last_nonzero(&bytes), None);
        bytes[0] = 1;
        assert_eq!(last_nonzero(&bytes), Some(0));
        bytes[5000] = 9;
        assert_eq!(last_nonzero(&bytes), Some(5000));
        bytes[9999] = 3;
        assert_eq!(last_nonzero(&bytes), Some(9999));
        assert_eq!(last_nonzero(&[]), None);
    }

    #[test]
    fn zero_sector_detection_respects_alignment() {
        let mut bytes = vec![1u8; 2048];
        assert!(!has_zero_sector(&bytes, 0));
        bytes[600..1200].fill(0);
        // Zeros 600..1200 hold no aligned sector (512..1024 starts with non-zero bytes).
        assert!(!has_zero_sector(&bytes, 0));
        bytes[512..1024].fill(0);
        assert!(has_zero_sector(&bytes, 0));
        assert!(has_zero_sector(&bytes[100..], 100));
    }
}
