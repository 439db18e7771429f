//! The log manifest (`log.manifest`): a small file that lists every segment of the log, so that
//! an open can tell records lost from the end of the log (a deleted or shortened segment) and
//! an older copy of a rewritten segment from a log that simply ends.
//!
//! ```text
//! manifest := magic:[u8;8] format_version:u32 segment_count:u32 store_id:u64 tail_seq:u64
//!             tail_next_lsn:u64 tail_trimmed_bytes:u64 entry{segment_count} manifest_crc:u32
//! entry    := seq:u64 first_lsn:u64 end_lsn:u64 generation:u32 reserved:u32   (32 bytes, LE)
//! ```
//!
//! `end_lsn` is the LSN after a sealed segment's last record, 0 for the active segment.
//! `tail_*` describe the active segment `tail_seq`: every record below `tail_next_lsn` is
//! durable, and `tail_trimmed_bytes`, when not 0, is the length a clean close cut the file to.
//! `manifest_crc` is CRC-32 of every byte before it. The manifest is rewritten whole, never in
//! place (temp, fsync, rename, directory fsync), when a segment is created, rewritten or
//! deleted, when the log opens for writing and when it closes: never on the append path. See
//! `docs/FORMAT.md` §4a.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::error::{CorruptionKind, Error, Result};
use crate::limits;
use crate::log::index::SegmentIndex;
use crate::log::record::{read_u32_le, read_u64_le};
use crate::log::segment::{self, SegmentHeader};
use crate::log::{LossEvidence, LostRecords};
use crate::storage::{OpenMode, Storage};

/// The manifest's file name in the log directory.
pub const MANIFEST_FILE_NAME: &str = "log.manifest";
/// Its name while it is written; recovery deletes leftovers with the other `.tmp` files.
const MANIFEST_TEMP_NAME: &str = "log.manifest.tmp";
/// First bytes of the manifest.
const MANIFEST_MAGIC: [u8; 8] = *b"CONTMFST";
/// The manifest's format version.
const MANIFEST_VERSION: u32 = 1;
/// Bytes before the first entry.
const MANIFEST_HEADER_BYTES: usize = 48;
/// Bytes of one entry.
const ENTRY_BYTES: usize = 32;
/// Bytes of the trailing checksum.
const CRC_BYTES: usize = 4;

/// What the manifest says of the active segment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct TailRecord {
    /// Sequence number of the active segment when the manifest was written.
    pub seq: u64,
    /// Every record of the active segment below this LSN is durable.
    pub next_lsn: u64,
    /// The length a clean close cut the active segment's file to; 0 if it did not.
    pub trimmed_bytes: u64,
}

/// One listed segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ManifestEntry {
    pub seq: u64,
    pub first_lsn: u64,
    /// The LSN after a sealed segment's last record; 0 for the active segment.
    pub end_lsn: u64,
    pub generation: u32,
}

/// The decoded manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Manifest {
    pub store_id: u64,
    pub tail: TailRecord,
    pub segments: Vec<ManifestEntry>,
}

impl Manifest {
    /// The manifest of the segments `index` holds (the last one active).
    pub fn of_index(index: &SegmentIndex, store_id: u64, tail: TailRecord) -> Self {
        let last = index.segments.len().saturating_sub(1);
        let segments = index
            .segments
            .iter()
            .enumerate()
            .map(|(i, meta)| ManifestEntry {
                seq: meta.seq,
                first_lsn: meta.first_lsn,
                end_lsn: if i < last { meta.next_lsn } else { 0 },
                generation: meta.generation,
            })
            .collect();
        Self { store_id, tail, segments }
    }

    /// The manifest's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(MANIFEST_HEADER_BYTES + self.segments.len() * ENTRY_BYTES + CRC_BYTES);
        bytes.extend_from_slice(&MANIFEST_MAGIC);
        bytes.extend_from_slice(&MANIFEST_VERSION.to_le_bytes());
        let count = u32::try_from(self.segments.len()).expect("segment count is bounded by MANIFEST_SEGMENTS_MAX");
        bytes.extend_from_slice(&count.to_le_bytes());
        for field in [self.store_id, self.tail.seq, self.tail.next_lsn, self.tail.trimmed_bytes] {
            bytes.extend_from_slice(&field.to_le_bytes());
        }
        for entry in &self.segments {
            for field in [entry.seq, entry.first_lsn, entry.end_lsn] {
                bytes.extend_from_slice(&field.to_le_bytes());
            }
            bytes.extend_from_slice(&entry.generation.to_le_bytes());
            bytes.extend_from_slice(&0u32.to_le_bytes());
        }
        let crc = crc32fast::hash(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// Parses and verifies a manifest; the error says what is wrong.
    pub fn decode(bytes: &[u8]) -> Result<Self, &'static str> {
        if bytes.len() < MANIFEST_HEADER_BYTES + CRC_BYTES {
            return Err("the file is shorter than a manifest header");
        }
        let (body, crc) = bytes.split_at(bytes.len() - CRC_BYTES);
        if read_u32_le(crc, 0) != crc32fast::hash(body) {
            return Err("manifest checksum mismatch");
        }
        if body[..8] != MANIFEST_MAGIC {
            return Err("wrong magic bytes");
        }
        if read_u32_le(body, 8) != MANIFEST_VERSION {
            return Err("unsupported manifest version");
        }
        let count = read_u32_le(body, 12) as usize;
        if count > limits::MANIFEST_SEGMENTS_MAX || body.len() != MANIFEST_HEADER_BYTES + count * ENTRY_BYTES {
            return Err("the segment count does not match the file's length");
        }
        let tail = TailRecord {
            seq: read_u64_le(body, 24),
            next_lsn: read_u64_le(body, 32),
            trimmed_bytes: read_u64_le(body, 40),
        };
        let mut segments = Vec::with_capacity(count);
        for at in (MANIFEST_HEADER_BYTES..body.len()).step_by(ENTRY_BYTES) {
            if read_u32_le(body, at + 28) != 0 {
                return Err("reserved bytes are set");
            }
            segments.push(ManifestEntry {
                seq: read_u64_le(body, at),
                first_lsn: read_u64_le(body, at + 8),
                end_lsn: read_u64_le(body, at + 16),
                generation: read_u32_le(body, at + 24),
            });
        }
        if segments.windows(2).any(|pair| pair[0].first_lsn >= pair[1].first_lsn || pair[0].seq >= pair[1].seq) {
            return Err("segments are not listed in order");
        }
        Ok(Self { store_id: read_u64_le(body, 16), tail, segments })
    }
}

/// The manifest of the log in `dir`, `None` if there is none (a log written before manifests
/// existed, or a new log that crashed before its first manifest).
///
/// # Errors
/// [`Error::Corruption`] (`BadManifest`) if it does not verify; [`Error::Io`].
pub(crate) fn read(storage: &dyn Storage, dir: &Path) -> Result<Option<Manifest>> {
    let path = dir.join(MANIFEST_FILE_NAME);
    let file = match storage.open(&path, OpenMode::ReadOnly) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io("open", &path, e)),
    };
    let len = file.len().map_err(|e| Error::io("stat", &path, e))?;
    let bad =
        |reason| Error::Corruption { segment: path.clone(), offset: 0, kind: CorruptionKind::BadManifest { reason } };
    if len > manifest_bytes_max() {
        return Err(bad("the file is longer than any manifest"));
    }
    let mut bytes = vec![0u8; usize::try_from(len).map_err(|_| bad("the file is longer than any manifest"))?];
    file.read_exact_at(&mut bytes, 0).map_err(|e| Error::io("read", &path, e))?;
    Manifest::decode(&bytes).map(Some).map_err(bad)
}

/// The largest manifest [`read`] accepts.
fn manifest_bytes_max() -> u64 {
    (MANIFEST_HEADER_BYTES + limits::MANIFEST_SEGMENTS_MAX * ENTRY_BYTES + CRC_BYTES) as u64
}

/// Replaces the manifest of the log in `dir` atomically: temp file, fsync, rename, directory
/// fsync.
///
/// # Errors
/// [`Error::Io`] / [`Error::NoSpace`]; the previous manifest is left in place.
pub(crate) fn write(storage: &dyn Storage, dir: &Path, manifest: &Manifest) -> Result<()> {
    if manifest.segments.len() > limits::MANIFEST_SEGMENTS_MAX {
        let what = "segments in the log".to_owned();
        return Err(Error::LimitExceeded { what, limit: limits::MANIFEST_SEGMENTS_MAX as u64 });
    }
    let temp = dir.join(MANIFEST_TEMP_NAME);
    let path = dir.join(MANIFEST_FILE_NAME);
    let _ = storage.remove_file(&temp);
    let written =
        storage.open(&temp, OpenMode::CreateNew).map_err(|e| Error::io("create", &temp, e)).and_then(|file| {
            file.write_all_at(&manifest.encode(), 0).map_err(|e| Error::io("write", &temp, e))?;
            // IMPORTANT: the manifest's bytes are durable before the rename publishes them.
            file.sync_data().map_err(|e| Error::io("fdatasync", &temp, e))
        });
    if let Err(error) = written {
        let _ = storage.remove_file(&temp);
        return Err(error);
    }
    storage.rename(&temp, &path).map_err(|e| Error::io("rename", &temp, e))?;
    // IMPORTANT: the new manifest replaces the old one after a crash only once this returns.
    storage.sync_dir(dir).map_err(|e| Error::io("sync directory", dir, e))
}

/// Rewrites the manifest of an open log, one writer at a time.
#[derive(Debug)]
pub(crate) struct ManifestWriter {
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    store_id: u64,
    /// The last tail record written; held while a manifest is written, so that the manifest
    /// on disk is always built from the newest index.
    tail: Mutex<TailRecord>,
}

impl ManifestWriter {
    pub fn new(storage: Arc<dyn Storage>, dir: PathBuf, store_id: u64, tail: TailRecord) -> Self {
        Self { storage, dir, store_id, tail: Mutex::new(tail) }
    }

    /// Writes the manifest of the segments `index` holds now, with `tail` if given, else with
    /// the last tail record written. Takes the index's read lock only to copy it.
    ///
    /// # Errors
    /// As [`write()`].
    pub fn publish(&self, index: &RwLock<SegmentIndex>, tail: Option<TailRecord>) -> Result<()> {
        let mut last_tail = self.tail.lock();
        let tail = tail.unwrap_or(*last_tail);
        let manifest = Manifest::of_index(&index.read(), self.store_id, tail);
        write(self.storage.as_ref(), &self.dir, &manifest)?;
        *last_tail = tail;
        Ok(())
    }
}

/// One segment recovery found, as the manifest check needs it.
#[derive(Clone, Debug)]
pub(crate) struct FoundSegment {
    pub path: PathBuf,
    pub header: SegmentHeader,
    /// The LSN after its last record, as recovery found it.
    pub next_lsn: u64,
    /// The file's length.
    pub file_bytes: u64,
}

/// Checks the segments found in `dir` (in order) against the manifest: returns every piece of
/// evidence that records existed past what was found ("Lost records" in docs/FORMAT.md §6).
///
/// # Errors
/// [`Error::Corruption`]: `StaleSegment` for a listed segment found with an older generation
/// or another sequence number (an older copy of a rewritten segment), `ForeignSegment` for a
/// manifest of another store.
pub(crate) fn check(dir: &Path, manifest: Option<&Manifest>, found: &[FoundSegment]) -> Result<Vec<LostRecords>> {
    let mut lost = Vec::new();
    match manifest {
        None => lost.extend(manifest_missing(dir, found)),
        Some(manifest) => check_listed(dir, manifest, found, &mut lost)?,
    }
    if let Some(last) = found.last() {
        lost.extend(shorter_than_written(manifest, last));
    }
    Ok(lost)
}

/// A log whose segments carry generations always has a manifest, except a new log that
/// crashed between creating its first segment and writing its first manifest.
fn manifest_missing(dir: &Path, found: &[FoundSegment]) -> Option<LostRecords> {
    let first_of_new_log = |f: &FoundSegment| f.header.seq == 1 && f.header.first_lsn == 1 && !f.header.is_compacted();
    let newer = found.iter().any(|f| f.header.generation >= segment::GENERATION_WRITER);
    if !newer || (found.len() == 1 && first_of_new_log(&found[0])) {
        return None;
    }
    let from_lsn = found.last().map_or(1, |f| f.next_lsn);
    let path = dir.join(MANIFEST_FILE_NAME);
    Some(LostRecords { evidence: LossEvidence::ManifestMissing, segment: path, from_lsn, to_lsn: from_lsn, bytes: 0 })
}

fn check_listed(dir: &Path, manifest: &Manifest, found: &[FoundSegment], lost: &mut Vec<LostRecords>) -> Result<()> {
    if let Some(first) = found.first()
        && first.header.store_id != manifest.store_id
    {
        let kind = CorruptionKind::ForeignSegment { expected: manifest.store_id, found: first.header.store_id };
        return Err(Error::Corruption { segment: first.path.clone(), offset: 0, kind });
    }
    let last_found = found.last().map(|f| f.header.first_lsn);
    for (i, entry) in manifest.segments.iter().enumerate() {
        let end = listed_end(manifest, i);
        let Some(at) = found.iter().find(|f| f.header.first_lsn == entry.first_lsn) else {
            let path = dir.join(segment::file_name(entry.first_lsn));
            let evidence = LossEvidence::SegmentMissing { seq: entry.seq };
            lost.push(LostRecords { evidence, segment: path, from_lsn: entry.first_lsn, to_lsn: end, bytes: 0 });
            continue;
        };
        if at.header.seq != entry.seq || at.header.generation < entry.generation {
            let kind = CorruptionKind::StaleSegment {
                listed_seq: entry.seq,
                found_seq: at.header.seq,
                listed_generation: entry.generation,
                found_generation: at.header.generation,
            };
            return Err(Error::Corruption { segment: at.path.clone(), offset: 0, kind });
        }
        // The active segment's records below the tail record's LSN are durable only while it
        // is still the last segment found (a later one starts after its end).
        let tail_end = if entry.seq == manifest.tail.seq && last_found == Some(entry.first_lsn) {
            manifest.tail.next_lsn
        } else {
            0
        };
        let recorded = entry.end_lsn.max(tail_end);
        if at.next_lsn < recorded {
            let evidence = LossEvidence::EndsBeforeRecorded { recorded_next_lsn: recorded };
            lost.push(LostRecords {
                evidence,
                segment: at.path.clone(),
                from_lsn: at.next_lsn,
                to_lsn: recorded,
                bytes: 0,
            });
        }
    }
    Ok(())
}

/// The LSN after the records the manifest knows listed segment `i` held.
fn listed_end(manifest: &Manifest, i: usize) -> u64 {
    let entry = manifest.segments[i];
    let next_first = manifest.segments.get(i + 1).map_or(0, |next| next.first_lsn);
    let tail = if entry.seq == manifest.tail.seq { manifest.tail.next_lsn } else { 0 };
    entry.end_lsn.max(next_first).max(tail).max(entry.first_lsn)
}

/// A crash never makes a preallocated segment shorter: the last segment (written by the
/// writer) shorter than its header's `segment_bytes`, or than the length a clean close
/// recorded, was cut.
fn shorter_than_written(manifest: Option<&Manifest>, last: &FoundSegment) -> Option<LostRecords> {
    if last.header.is_compacted() {
        return None;
    }
    let trimmed = manifest
        .map(|m| m.tail)
        .filter(|tail| tail.seq == last.header.seq && tail.trimmed_bytes != 0)
        .map(|tail| tail.trimmed_bytes);
    let expected_bytes = trimmed.unwrap_or(last.header.segment_bytes);
    if last.file_bytes >= expected_bytes {
        return None;
    }
    let evidence = LossEvidence::ShorterThanWritten { file_bytes: last.file_bytes, expected_bytes };
    Some(LostRecords {
        evidence,
        segment: last.path.clone(),
        from_lsn: last.next_lsn,
        to_lsn: last.next_lsn,
        bytes: expected_bytes - last.file_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> Manifest {
        Manifest {
            store_id: 42,
            tail: TailRecord { seq: 3, next_lsn: 90, trimmed_bytes: 0 },
            segments: vec![
                ManifestEntry { seq: 1, first_lsn: 1, end_lsn: 40, generation: 2 },
                ManifestEntry { seq: 3, first_lsn: 40, end_lsn: 0, generation: 1 },
            ],
        }
    }

    #[test]
    fn a_manifest_round_trips_and_every_flipped_byte_is_refused() {
        let bytes = manifest().encode();
        assert_eq!(Manifest::decode(&bytes), Ok(manifest()));
        for at in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x10;
            assert!(Manifest::decode(&damaged).is_err(), "flip at {at} accepted");
        }
        assert!(Manifest::decode(&bytes[..bytes.len() - 1]).is_err());
        assert!(Manifest::decode(&[]).is_err());
    }

    fn found(seq: u64, first_lsn: u64, next_lsn: u64, generation: u32, file_bytes: u64) -> FoundSegment {
        let header = SegmentHeader {
            seq,
            first_lsn,
            segment_bytes: 4096,
            store_id: 42,
            end_lsn: 0,
            compressed: false,
            generation,
        };
        FoundSegment { path: PathBuf::from(segment::file_name(first_lsn)), header, next_lsn, file_bytes }
    }

    #[test]
    fn what_the_manifest_check_finds() {
        let dir = Path::new("/d");
        let m = manifest();
        let whole = [found(1, 1, 40, 2, 4096), found(3, 40, 95, 1, 4096)];
        assert_eq!(check(dir, Some(&m), &whole).map(|lost| lost.len()).ok(), Some(0));
        // The last segment deleted.
        let lost = check(dir, Some(&m), &whole[..1]).expect("no corruption");
        assert_eq!(lost.len(), 1);
        assert_eq!((lost[0].from_lsn, lost[0].to_lsn), (40, 90));
        // Cut at a frame boundary: shorter than preallocated, and below the tail record.
        let cut = [found(1, 1, 40, 2, 4096), found(3, 40, 60, 1, 1024)];
        let lost = check(dir, Some(&m), &cut).expect("no corruption");
        assert_eq!(lost.len(), 2, "{lost:?}");
        // An older copy of the rewritten first segment.
        let stale = [found(1, 1, 40, 1, 4096), found(3, 40, 95, 1, 4096)];
        assert!(matches!(
            check(dir, Some(&m), &stale),
            Err(Error::Corruption { kind: CorruptionKind::StaleSegment { .. }, .. })
        ));
        // A newer generation than listed is a rewrite the manifest had not caught up with.
        let newer = [found(1, 1, 40, 3, 4096), found(3, 40, 95, 1, 4096)];
        assert_eq!(check(dir, Some(&m), &newer).map(|lost| lost.len()).ok(), Some(0));
        // A trimmed tail is as long as the close recorded.
        let trimmed = Manifest { tail: TailRecord { seq: 3, next_lsn: 95, trimmed_bytes: 2000 }, ..m };
        let short = [found(1, 1, 40, 2, 4096), found(3, 40, 95, 1, 2000)];
        assert_eq!(check(dir, Some(&trimmed), &short).map(|lost| lost.len()).ok(), Some(0));
        // No manifest: only a new log's first segment may lack one.
        assert_eq!(check(dir, None, &[found(1, 1, 5, 1, 4096)]).map(|lost| lost.len()).ok(), Some(0));
        assert_eq!(check(dir, None, &whole).map(|lost| lost.len()).ok(), Some(1));
        assert_eq!(
            check(dir, None, &[found(1, 1, 40, 0, 4096), found(2, 40, 41, 0, 4096)]).map(|l| l.len()).ok(),
            Some(0)
        );
    }
}
