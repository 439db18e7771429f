//! Read-only recovery: the same scan as a writable open, through
//! [`ReadOnlyStorage`], reporting instead of repairing.
//!
//! - No lock, no temporary-file cleanup, no tail cut, no `fdatasync`, no segment creation.
//! - Segments are read as copies (never mapped) and later read with positioned reads below the
//!   end found here, so a writer in another process can go on appending meanwhile.
//! - The last segment may be growing: a scan that finds invalid bytes there is retried a few
//!   times, since a frame half-copied by the writer when it was read is complete a moment later.
//! - A segment deleted between listing and opening (the writer truncated its prefix) restarts
//!   the scan.
//!
//! [`verify_segments`] is the scan of `dump verify`: every frame of every segment, past any
//! damage, reporting each problem with its file and offset.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::RecoveredStreams;
use super::{
    ActiveState, InvalidRange, Recovered, RecoveryReport, SegmentScan, Tail, active_meta, check_header, corruption,
    record_skips, scan_segment, sealed_meta, settle_sealed_tail,
};
use crate::config::{Config, RecoveryMode};
use crate::error::{CorruptionKind, Error, Result};
use crate::log::index::SegmentIndex;
use crate::log::manifest::{self, FoundSegment, ManifestWriter, TailRecord};
use crate::log::problem::Problem;
use crate::log::segment::{self, SegmentHeader};
use crate::log::{Log, StreamKey};
use crate::metrics::{Metrics, MetricsOptions};
use crate::storage::{DirLock, OpenMode, ReadOnlyStorage, Storage, StorageFile};

/// Scans of the last segment before what it holds is taken as found.
const LAST_SEGMENT_SCANS: usize = 3;
/// Pause between two scans of the last segment.
const RESCAN_PAUSE: Duration = Duration::from_millis(20);
/// Restarts after a segment vanished between listing and opening.
const LISTING_ATTEMPTS: usize = 3;

/// Opens the log in `dir` read-only (see `LogBuilder::open_read_only`).
pub(crate) fn open(
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    config: Config,
    metrics: MetricsOptions,
    stream_key: Option<StreamKey>,
) -> Result<Log> {
    let _span = tracing::info_span!("continuum.open_read_only", dir = %dir.display()).entered();
    config.validate()?;
    let storage: Arc<dyn Storage> = Arc::new(ReadOnlyStorage::new(storage));
    let recovered = recover(storage.as_ref(), &dir, &config)?;
    if let Some(tail) = &recovered.report.torn_tail {
        tracing::warn!(segment = %tail.segment.display(), offset = tail.offset, bytes = tail.bytes, "found a torn tail; left in place (read-only)");
    }
    // No lock: a read-only handle never conflicts with the writer or with another reader.
    let no_lock = DirLock::new(Box::new(()));
    // A read-only open indexes the streams after its recovery (`Streams::new`).
    let recovered = Recovered { streams: stream_key.map(RecoveredStreams::unread), ..recovered };
    // Never written: a read-only log creates, rewrites and deletes no segment.
    let manifest =
        ManifestWriter::new(Arc::clone(&storage), dir.clone(), recovered.active.header.store_id, TailRecord::default());
    let metrics = Metrics::new(metrics.enabled, metrics.label.as_deref());
    Ok(Log::from_recovered(storage, dir, config, recovered, manifest, no_lock, metrics, true))
}

fn recover(storage: &dyn Storage, dir: &Path, config: &Config) -> Result<Recovered> {
    let started = Instant::now();
    let mut attempt = 1;
    loop {
        match recover_once(storage, dir, config) {
            Err(Error::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound && attempt < LISTING_ATTEMPTS => {
                attempt += 1;
            }
            // A writer in another process may have been between a segment change and its
            // manifest, or between a close's manifest and its trim: look again before trusting it.
            Err(error) if is_manifest_finding(&error) && attempt < LISTING_ATTEMPTS => {
                attempt += 1;
                std::thread::sleep(RESCAN_PAUSE);
            }
            Ok(recovered) if !recovered.report.lost_records.is_empty() && attempt < LISTING_ATTEMPTS => {
                attempt += 1;
                std::thread::sleep(RESCAN_PAUSE);
            }
            Ok(mut recovered) => {
                recovered.report.duration = started.elapsed();
                return Ok(recovered);
            }
            Err(error) => return Err(error),
        }
    }
}

/// Whether `error` comes from the manifest check (which a concurrent writer can race).
fn is_manifest_finding(error: &Error) -> bool {
    matches!(
        error,
        Error::Corruption { kind: CorruptionKind::RecordsLost { .. } | CorruptionKind::StaleSegment { .. }, .. }
    )
}

/// The segments' first LSNs, in order.
fn list_segments(storage: &dyn Storage, dir: &Path) -> Result<Vec<u64>> {
    let names = storage.list_dir(dir).map_err(|e| Error::io("list directory", dir, e))?;
    let mut lsns: Vec<u64> = names.iter().filter_map(|name| segment::parse_file_name(name)).collect();
    lsns.sort_unstable();
    Ok(lsns)
}

fn open_segment(storage: &dyn Storage, dir: &Path, first_lsn: u64) -> Result<(PathBuf, Arc<dyn StorageFile>)> {
    let path = dir.join(segment::file_name(first_lsn));
    let file = storage.open(&path, OpenMode::ReadOnly).map_err(|e| Error::io("open", &path, e))?;
    Ok((path, file))
}

fn recover_once(storage: &dyn Storage, dir: &Path, config: &Config) -> Result<Recovered> {
    let mode = config.recovery_mode;
    let lsns = list_segments(storage, dir)?;
    let Some((&last, sealed)) = lsns.split_last() else {
        let missing = io::Error::new(io::ErrorKind::NotFound, "no segment files: not a continuum store");
        return Err(Error::io("open read-only", dir, missing));
    };
    let mut report = RecoveryReport { segments: lsns.len(), ..RecoveryReport::default() };
    let mut index = SegmentIndex::default();
    let mut previous: Option<(SegmentHeader, u64)> = None;
    let mut found = Vec::with_capacity(lsns.len());
    for &first_lsn in sealed {
        let (path, file) = open_segment(storage, dir, first_lsn)?;
        let view = file.view().map_err(|e| Error::io("read", &path, e))?;
        let header = check_header(&view, &path, first_lsn, previous, mode, &mut report)?;
        let scan = scan_segment(&view, &header, &path, mode, false)?;
        let scan = settle_sealed_tail(scan, &path, mode, &mut report)?;
        previous = Some((header, scan.next_lsn));
        let file_bytes = view.len() as u64;
        found.push(FoundSegment { path: path.clone(), header, next_lsn: scan.next_lsn, file_bytes });
        // Positioned reads below the end found here: see the module docs.
        index.segments.push(sealed_meta(header, &path, scan, file));
    }
    let (path, file) = open_segment(storage, dir, last)?;
    let view = file.view().map_err(|e| Error::io("read", &path, e))?;
    let header = check_header(&view, &path, last, previous, mode, &mut report)?;
    drop(view);
    let scan = scan_last(file.as_ref(), &header, &path, mode)?;
    report.records += scan.records;
    report.lost_lsns.extend(scan.lost_lsns.iter().copied());
    record_skips(&scan, &path, &mut report);
    if let Tail::Invalid { offset, bytes } = scan.tail {
        if mode == RecoveryMode::Strict {
            return Err(corruption(&path, offset, CorruptionKind::TornTail { bytes }));
        }
        report.torn_tail = Some(InvalidRange { segment: path.clone(), offset, bytes });
    }
    let file_bytes = file.len().map_err(|e| Error::io("stat", &path, e))?;
    found.push(FoundSegment { path: path.clone(), header, next_lsn: scan.next_lsn, file_bytes });
    // Read after the segments: a writer changes segments first and the manifest after (or,
    // for a prefix truncation and a close's trim, the manifest first, which a retry covers).
    let listed = super::read_manifest(storage, dir, mode)?;
    super::settle_lost(manifest::check(dir, listed.as_ref(), &found)?, mode, &mut report)?;
    let active = ActiveState::new(header, path, file, scan.data_end, scan.next_lsn);
    index.segments.push(active_meta(&active, scan.sparse, scan.skips));
    report.first_lsn = index.first_lsn();
    report.next_lsn = active.next_lsn;
    Ok(Recovered { index, active, report, streams: None })
}

/// Scans the last segment, again while it looks damaged (a concurrent writer may have been
/// half-way through a frame when it was read).
fn scan_last(file: &dyn StorageFile, header: &SegmentHeader, path: &Path, mode: RecoveryMode) -> Result<SegmentScan> {
    let mut scans = 1;
    loop {
        let view = file.view().map_err(|e| Error::io("read", path, e))?;
        let scan = scan_segment(&view, header, path, mode, true);
        let settled = matches!(&scan, Ok(found) if found.skips.is_empty() && found.tail == Tail::Clean);
        if settled || scans == LAST_SEGMENT_SCANS {
            return scan;
        }
        scans += 1;
        std::thread::sleep(RESCAN_PAUSE);
    }
}

/// What [`verify_segments`] checked.
#[derive(Debug, Default)]
pub(crate) struct SegmentsVerified {
    pub segments: usize,
    pub bytes: u64,
    pub records: u64,
    pub problems: Vec<Problem>,
    /// Whether some of the problems come from the manifest check.
    pub manifest_problems: bool,
}

/// Checks every frame of every segment in `dir` (both checksums, framing, LSN order), past
/// any damage, and reports every problem with its file and offset. `progress` is called with
/// the bytes read so far and the total.
pub(crate) fn verify_segments(
    storage: Arc<dyn Storage>,
    dir: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<SegmentsVerified> {
    let storage = ReadOnlyStorage::new(storage);
    let mut attempt = 1;
    loop {
        let verified = verify_segments_once(&storage, dir, progress)?;
        // A writer in another process may have been between a segment change and its manifest.
        if !verified.manifest_problems || attempt == LISTING_ATTEMPTS {
            return Ok(verified);
        }
        attempt += 1;
        std::thread::sleep(RESCAN_PAUSE);
    }
}

/// One pass of [`verify_segments`].
fn verify_segments_once(
    storage: &ReadOnlyStorage,
    dir: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<SegmentsVerified> {
    let mut attempt = 1;
    // Every segment is opened before any is read, so that a writer deleting or replacing
    // files meanwhile (prefix truncation, compaction) cannot pull one out from under the scan.
    let (files, total) = loop {
        match open_all_segments(storage, dir) {
            Err(Error::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound && attempt < LISTING_ATTEMPTS => {
                attempt += 1;
            }
            other => break other?,
        }
    };
    let mut verified = SegmentsVerified { segments: files.len(), ..SegmentsVerified::default() };
    let mut previous: Option<(SegmentHeader, u64)> = None;
    let mut found = Vec::with_capacity(files.len());
    let last = files.len().saturating_sub(1);
    for (i, (first_lsn, path, file)) in files.into_iter().enumerate() {
        let mut scans = 1;
        let (problems, next, file_bytes) = loop {
            let view = file.view().map_err(|e| Error::io("read", &path, e))?;
            let segment = verify_segment(&view, &path, first_lsn, previous, i == last);
            if segment.problems.is_empty() || i != last || scans == LAST_SEGMENT_SCANS {
                verified.bytes += view.len() as u64;
                verified.records += segment.records;
                break (segment.problems, segment.next, view.len() as u64);
            }
            scans += 1;
            std::thread::sleep(RESCAN_PAUSE);
        };
        verified.problems.extend(problems);
        if let Some((header, next_lsn)) = next {
            found.push(FoundSegment { path: path.clone(), header, next_lsn, file_bytes });
        }
        previous = next.or(previous);
        progress(verified.bytes, total.max(verified.bytes));
    }
    let problems = manifest_problems(storage, dir, &found);
    verified.manifest_problems = !problems.is_empty();
    verified.problems.extend(problems);
    Ok(verified)
}

/// What the log manifest shows about the segments found: lost records, stale segments, a
/// damaged manifest.
fn manifest_problems(storage: &dyn Storage, dir: &Path, found: &[FoundSegment]) -> Vec<Problem> {
    let manifest_path = dir.join(manifest::MANIFEST_FILE_NAME);
    let lost = manifest::read(storage, dir).and_then(|listed| manifest::check(dir, listed.as_ref(), found));
    match lost {
        Ok(lost) => lost
            .into_iter()
            .map(|lost| {
                let known = if lost.to_lsn > lost.from_lsn {
                    format!("LSNs {}..={}", lost.from_lsn, lost.to_lsn - 1)
                } else {
                    format!("LSNs from {} on (how many is unknown)", lost.from_lsn)
                };
                let what = format!("records lost from the end of the log: {}; {known}", lost.evidence);
                Problem { file: lost.segment, offset: 0, what }
            })
            .collect(),
        Err(error) => vec![Problem::from_error(&manifest_path, &error)],
    }
}

/// Every segment of `dir`, opened, with the sum of their lengths.
#[expect(clippy::type_complexity, reason = "a private helper's plain tuple")]
fn open_all_segments(storage: &dyn Storage, dir: &Path) -> Result<(Vec<(u64, PathBuf, Arc<dyn StorageFile>)>, u64)> {
    let lsns = list_segments(storage, dir)?;
    let mut files = Vec::with_capacity(lsns.len());
    let mut total = 0;
    for &first_lsn in &lsns {
        let (path, file) = open_segment(storage, dir, first_lsn)?;
        total += file.len().map_err(|e| Error::io("stat", &path, e))?;
        files.push((first_lsn, path, file));
    }
    Ok((files, total))
}

/// Problems of one segment, its record count, and its header with the LSN after it (for the
/// next segment's continuity check), when the header could be read.
struct SegmentVerified {
    problems: Vec<Problem>,
    records: u64,
    next: Option<(SegmentHeader, u64)>,
}

fn verify_segment(
    bytes: &[u8],
    path: &Path,
    first_lsn: u64,
    previous: Option<(SegmentHeader, u64)>,
    is_last: bool,
) -> SegmentVerified {
    let mut problems = Vec::new();
    let mut scratch = RecoveryReport::default();
    let header = match check_header(bytes, path, first_lsn, previous, RecoveryMode::Strict, &mut scratch) {
        Ok(header) => header,
        Err(error) => {
            problems.push(Problem::from_error(path, &error));
            // Past an LSN gap or an order problem the header itself may be fine: scan on.
            match SegmentHeader::decode(bytes).ok().filter(|header| header.first_lsn == first_lsn) {
                Some(header) => header,
                None => return SegmentVerified { problems, records: 0, next: None },
            }
        }
    };
    let scan = match scan_segment(bytes, &header, path, RecoveryMode::SkipCorrupted, is_last) {
        Ok(scan) => scan,
        Err(error) => {
            problems.push(Problem::from_error(path, &error));
            return SegmentVerified { problems, records: 0, next: None };
        }
    };
    for &(start, end) in &scan.skips {
        let what = format!("{} invalid bytes before a valid frame at offset {end}", end - start);
        problems.push(Problem { file: path.to_path_buf(), offset: start, what });
    }
    for &(from, to) in &scan.lost_lsns {
        let what = match to - from {
            1 => format!("LSN {from} is lost in invalid bytes"),
            _ => format!("LSNs {from}..={} are lost in invalid bytes", to - 1),
        };
        let offset = scan.skips.first().map_or(0, |skip| skip.0);
        problems.push(Problem { file: path.to_path_buf(), offset, what });
    }
    if let Tail::Invalid { offset, bytes } = scan.tail {
        let what = if is_last {
            format!("torn tail: {bytes} invalid bytes after the last valid frame (a writable open cuts them)")
        } else {
            format!("a sealed segment ends with {bytes} invalid bytes")
        };
        problems.push(Problem { file: path.to_path_buf(), offset, what });
    }
    if header.compressed {
        problems.extend(inflate_problems(bytes, &header, &scan, path));
    }
    SegmentVerified { problems, records: scan.records, next: Some((header, scan.next_lsn)) }
}

/// Inflates every compressed frame the scan accepted (recovery checks only their checksums and
/// stated length; a reader inflates them when it reads them): a frame whose records do not
/// decompress to that length, or do not frame, is a problem at its offset.
fn inflate_problems(bytes: &[u8], header: &SegmentHeader, scan: &SegmentScan, path: &Path) -> Vec<Problem> {
    let mut problems = Vec::new();
    let mut at = crate::log::segment::SEGMENT_HEADER_BYTES as u64;
    // The skips are sorted: a cursor over them, so that the walk is linear in frames + skips.
    let mut skips = scan.skips.iter().peekable();
    while at < scan.data_end {
        while skips.next_if(|(_, end)| *end <= at).is_some() {}
        if let Some(&&(start, end)) = skips.peek()
            && at >= start
        {
            at = end;
            continue;
        }
        let Ok(frame) = crate::log::record::decode_frame(&bytes[at as usize..], header.salt()) else { break };
        if frame.header.is_compressed()
            && let Err(error) = crate::log::record::inflate(&frame)
        {
            let what = format!("a compressed frame's records are damaged ({error:?})");
            problems.push(Problem { file: path.to_path_buf(), offset: at, what });
        }
        at += frame.header.frame_len() as u64;
    }
    problems
}
