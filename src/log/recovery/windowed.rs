//! The fast path of a sealed segment's scan: its frames read through one small reused window
//! of positioned reads, not the whole segment at once.
//!
//! A sealed segment whose frames are all valid and in order (the case of every open but a
//! damaged one) is verified here with bounded memory and without first copying 64 MiB into a
//! fresh buffer. The first frame that does not verify, or does not follow, ends the fast
//! path: the caller then reads the segment whole and scans it with the general scan, which
//! classifies what it finds under the recovery mode.

use std::cell::RefCell;
use std::path::Path;

use crate::error::{Error, Result};
use crate::limits;
use crate::log::index::SparseEntry;
use crate::log::record::{self, FRAME_HEADER_BYTES};
use crate::log::segment::{SEGMENT_HEADER_BYTES, SegmentHeader};
use crate::log::streams::{self, StreamKey};
use crate::storage::StorageFile;

use super::{SegmentScan, follows};

/// Bytes read per positioned read: small enough to stay in a core's cache while its frames'
/// checksums are computed, large enough that the system call is a small share of the cost.
const WINDOW_BYTES: usize = 1 << 20;

thread_local! {
    /// Each recovery thread's window, reused from segment to segment.
    static WINDOW: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Scans `file`'s bytes `..end` (a sealed segment with `header`) frame by frame through the
/// window. `Ok(None)` when some frame is not valid or not in order: the general scan decides.
pub(super) fn scan_sealed(
    file: &dyn StorageFile,
    path: &Path,
    header: &SegmentHeader,
    end: u64,
    stream_key: Option<StreamKey>,
) -> Result<Option<SegmentScan>> {
    WINDOW.with_borrow_mut(|window| scan_with(window, file, path, header, end, stream_key))
}

fn scan_with(
    window: &mut Vec<u8>,
    file: &dyn StorageFile,
    path: &Path,
    header: &SegmentHeader,
    end: u64,
    stream_key: Option<StreamKey>,
) -> Result<Option<SegmentScan>> {
    let mut scan = SegmentScan::empty(header, stream_key);
    let salt = header.salt();
    let mut reader = Window { bytes: window, start: 0, file, path, end };
    reader.bytes.clear();
    let mut at = SEGMENT_HEADER_BYTES as u64;
    let mut last_indexed: Option<u64> = None;
    loop {
        let head = reader.get(at, FRAME_HEADER_BYTES)?;
        let Ok(frame_header) = record::decode_header(head, salt) else {
            return Ok(reader.only_zeros_from(at)?.then(|| finish(scan, header)));
        };
        let frame_len = frame_header.frame_len();
        if at + frame_len as u64 > end {
            return Ok(None);
        }
        let bytes = reader.get(at, frame_len)?;
        let Ok(frame) = record::decode_frame(bytes, salt) else {
            return Ok(None);
        };
        let frame = frame.header;
        let misplaced = frame.is_compressed() && !header.compressed;
        if misplaced || u64::from(frame.synced_through) > at || !follows(header, scan.next_lsn, &frame) {
            return Ok(None);
        }
        if last_indexed.is_none_or(|i| at - i >= limits::SPARSE_INDEX_STRIDE_BYTES) {
            scan.sparse.push(SparseEntry { lsn: frame.first_lsn, offset: at });
            last_indexed = Some(at);
        }
        if let (Some(key_of), Some(part)) = (stream_key, &mut scan.streams)
            && streams::index_frame(key_of, bytes, at, &frame, salt, part).is_err()
        {
            scan.streams = None;
        }
        scan.records += u64::from(frame.record_count);
        scan.next_lsn = frame.next_lsn();
        at += frame_len as u64;
        scan.data_end = at;
    }
}

/// A segment that ends cleanly after its last frame. A compacted segment's LSNs run to the
/// end its header records, past records compaction dropped.
fn finish(mut scan: SegmentScan, header: &SegmentHeader) -> SegmentScan {
    if header.is_compacted() {
        scan.next_lsn = header.end_lsn;
    }
    scan
}

/// The bytes of one segment file `..end`, read a window at a time into a reused buffer.
struct Window<'a> {
    bytes: &'a mut Vec<u8>,
    /// Offset in the file of `bytes[0]`.
    start: u64,
    file: &'a dyn StorageFile,
    path: &'a Path,
    end: u64,
}

impl Window<'_> {
    /// The file's bytes `at..at + len`, cut at `end`; the window moves to `at` if they are not
    /// all in it, growing for a frame larger than the window.
    fn get(&mut self, at: u64, len: usize) -> Result<&[u8]> {
        let window_end = self.start + self.bytes.len() as u64;
        let want_end = (at + len as u64).min(self.end);
        if at < self.start || want_end > window_end {
            let read_len = usize::try_from(self.end - at).unwrap_or(usize::MAX).min(len.max(WINDOW_BYTES));
            self.bytes.resize(read_len, 0);
            self.file.read_exact_at(self.bytes, at).map_err(|e| Error::io("read", self.path, e))?;
            self.start = at;
        }
        let from = usize::try_from(at - self.start).expect("inside the window");
        let to = usize::try_from(want_end - self.start).expect("inside the window");
        Ok(&self.bytes[from..to])
    }

    /// Whether every byte from `at` to the end is zero.
    fn only_zeros_from(&mut self, mut at: u64) -> Result<bool> {
        while at < self.end {
            let chunk = self.get(at, WINDOW_BYTES)?;
            if chunk.iter().any(|&b| b != 0) {
                return Ok(false);
            }
            at += chunk.len() as u64;
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::config::RecoveryMode;
    use crate::log::recovery::Tail;
    use crate::log::segment;
    use crate::storage::sim::SimStorage;
    use crate::storage::{OpenMode, Storage};

    fn key_of(record: &[u8]) -> Option<u64> {
        record.first().map(|&b| u64::from(b % 3))
    }

    /// A log of sealed 4 MiB segments whose frames range from a few bytes to 3 MiB (larger
    /// than the window), some compressed.
    fn sealed_segments(storage: &SimStorage, dir: &Path) -> Vec<std::path::PathBuf> {
        let log =
            crate::Log::builder(dir).storage(Arc::new(storage.clone())).segment_bytes(4 << 20).open().expect("log");
        for i in 0..120u32 {
            let len = match i % 10 {
                0 => 3 << 20,
                1 => 700 << 10,
                _ => 40 + (i as usize * 37) % 5000,
            };
            let record: Vec<u8> = (0..len).map(|j| (i as usize + j / 512) as u8).collect();
            log.append(&record).expect("append");
        }
        drop(log);
        let mut lsns: Vec<u64> =
            storage.list_dir(dir).expect("list").iter().filter_map(|name| segment::parse_file_name(name)).collect();
        lsns.sort_unstable();
        lsns.pop(); // the last segment is scanned by the general scan only
        let paths: Vec<_> = lsns.into_iter().map(|lsn| dir.join(segment::file_name(lsn))).collect();
        assert!(paths.len() >= 5, "{} sealed segments", paths.len());
        paths
    }

    fn both_scans(storage: &SimStorage, path: &Path) -> (Option<SegmentScan>, SegmentScan) {
        let file = storage.open(path, OpenMode::ReadOnly).expect("open");
        let end = super::super::written_end(file.as_ref(), path).expect("end");
        let bytes = super::super::read_written(file.as_ref(), path).expect("read");
        let header = SegmentHeader::decode(&bytes).expect("header");
        let windowed = scan_sealed(file.as_ref(), path, &header, end, Some(key_of)).expect("windowed scan");
        let general =
            super::super::scan_segment_indexed(&bytes, &header, path, RecoveryMode::SkipCorrupted, false, Some(key_of))
                .expect("general scan");
        (windowed, general)
    }

    #[test]
    fn the_windowed_scan_finds_what_the_general_scan_finds() {
        let storage = SimStorage::new(7);
        let dir = Path::new("/log");
        for path in sealed_segments(&storage, dir) {
            let (windowed, general) = both_scans(&storage, &path);
            let windowed = windowed.expect("every frame of an undamaged segment verifies");
            assert_eq!(windowed.next_lsn, general.next_lsn);
            assert_eq!(windowed.data_end, general.data_end);
            assert_eq!(windowed.records, general.records);
            assert_eq!(windowed.sparse, general.sparse);
            assert_eq!(windowed.streams, general.streams);
            assert!(general.skips.is_empty() && matches!(general.tail, Tail::Clean));
        }
    }

    #[test]
    fn a_damaged_frame_leaves_the_segment_to_the_general_scan() {
        let storage = SimStorage::new(8);
        let dir = Path::new("/log");
        let path = sealed_segments(&storage, dir).remove(1);
        let bytes = storage.file_bytes(&path).expect("bytes");
        let header = SegmentHeader::decode(&bytes).expect("header");
        let first = record::decode_frame(&bytes[SEGMENT_HEADER_BYTES..], header.salt()).expect("frame");
        let damaged_at = SEGMENT_HEADER_BYTES + first.header.frame_len() + FRAME_HEADER_BYTES + 1;
        storage.overwrite(&path, damaged_at as u64, &[bytes[damaged_at] ^ 0x40]);
        let (windowed, general) = both_scans(&storage, &path);
        assert!(windowed.is_none(), "a frame that does not verify ends the fast path");
        assert!(!general.skips.is_empty() || !matches!(general.tail, Tail::Clean), "the general scan sees the damage");
    }
}
