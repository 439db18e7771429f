//! Inspection of a store without changing it: what `examples/dump.rs` is built on.
//!
//! Open the store with [`Store::open_read_only`] (or the log with
//! [`Log::open_read_only`](crate::Log::open_read_only)) to read it while another process writes
//! it; use [`verify`] to check every frame checksum and every snapshot digest; [`disk_usage`]
//! and [`live_bytes`] give the figures of a space summary.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::codec::{Codec, StoreRecord};
use crate::error::{Error, Result};
use crate::snapshot::{self, SnapshotError};
use crate::storage::{FileStorage, OpenMode, ReadOnlyStorage, Storage};
use crate::store::{AtomId, Store};

pub use crate::log::Problem;

/// What [`verify`] checked and found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Segment files checked.
    pub segments: usize,
    /// Bytes of them read.
    pub segment_bytes: u64,
    /// Records in valid frames.
    pub records: u64,
    /// Snapshot files checked.
    pub snapshots: usize,
    /// Every problem, in file order.
    pub problems: Vec<Problem>,
}

impl VerifyReport {
    /// Whether nothing is wrong.
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Checks the store in `dir` on the real file system; see [`verify_with`].
///
/// # Errors
/// As [`verify_with`].
pub fn verify(dir: &Path, progress: &mut dyn FnMut(u64, u64)) -> Result<VerifyReport> {
    verify_with(Arc::new(FileStorage::new()), dir, progress)
}

/// Checks every frame of every segment (header and payload checksums, framing, LSN order),
/// scanning past damage so that every problem is reported with its file and offset, and every
/// snapshot file (its SHA-256 digest, store id, header and payload). A torn tail of the last
/// segment is a problem too (a writable open would cut it). When the segments and snapshots
/// are sound, the index is rebuilt as a read-only open does: a record it cannot take, evidence
/// of records lost from the end of the log ([`Store::recovery_report`]) and an index
/// index snapshot that is damaged, stale or another store's are problems too. Reads only; takes no
/// lock. `progress` is called with the segment bytes read so far and their total.
///
/// # Errors
/// [`Error::Io`] when a file cannot be listed, opened or read; damage is a [`Problem`], not an
/// error.
pub fn verify_with(storage: Arc<dyn Storage>, dir: &Path, progress: &mut dyn FnMut(u64, u64)) -> Result<VerifyReport> {
    let segments = crate::log::recovery::read_only::verify_segments(Arc::clone(&storage), dir, progress)?;
    let snapshots = snapshot_files(Arc::clone(&storage), dir)?;
    let mut problems = segments.problems;
    for file in &snapshots {
        if let Some((offset, reason)) = file.problem {
            problems.push(Problem { file: file.path.clone(), offset, what: format!("snapshot unusable: {reason}") });
        }
    }
    // Store-level checks need the index, which only a log without damage rebuilds exactly.
    if problems.is_empty() {
        problems.extend(store_problems(storage, dir));
    }
    Ok(VerifyReport {
        segments: segments.segments,
        segment_bytes: segments.bytes,
        records: segments.records,
        snapshots: snapshots.len(),
        problems,
    })
}

/// What rebuilding the index of the store in `dir` read-only finds wrong.
fn store_problems(storage: Arc<dyn Storage>, dir: &Path) -> Vec<Problem> {
    let store = match Store::builder(dir).storage(storage).background(false).open_read_only() {
        Ok(store) => store,
        Err(error) => return vec![Problem::from_error(dir, &error)],
    };
    let mut problems = Vec::new();
    for evidence in &store.recovery_report().lost {
        let (file, offset) = match evidence {
            crate::store::LossEvidence::IndexSnapshot { .. } => (dir.join(crate::store::INDEX_SNAPSHOT_FILE_NAME), 16),
            crate::store::LossEvidence::Snapshot { atom } => (snapshot::path(dir, atom.get()), 0),
        };
        problems.push(Problem { file, offset, what: format!("records lost: {evidence}") });
    }
    // A version-1 index snapshot is only older (the next writable open replaces it); one past the
    // log's end is the loss above.
    let benign = ["another format version", "the log ends before the index snapshot's LSN"];
    if let Some(reason) = store.index_snapshot().ignored_at_open.filter(|reason| !benign.contains(&reason.as_str())) {
        let file = dir.join(crate::store::INDEX_SNAPSHOT_FILE_NAME);
        problems.push(Problem { file, offset: 0, what: format!("index snapshot unusable: {reason}") });
    }
    problems
}

/// One snapshot file and whether it verifies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotFile {
    /// The atom it is a snapshot of.
    pub atom: AtomId,
    /// The file.
    pub path: PathBuf,
    /// Its size.
    pub bytes: u64,
    /// Why it cannot be used, with the offset of the field at fault; `None` if it verifies.
    pub problem: Option<(u64, &'static str)>,
}

/// Every snapshot file of the store in `dir`, oldest atom first, each verified (SHA-256,
/// header, the store id its segments carry, decompression, decoding). Reads only.
///
/// # Errors
/// [`Error::Io`] when the snapshot directory cannot be listed or a file read.
pub fn snapshot_files(storage: Arc<dyn Storage>, dir: &Path) -> Result<Vec<SnapshotFile>> {
    let storage = ReadOnlyStorage::new(storage);
    // Without a segment there is no store id: every snapshot is then another store's.
    let store_id = crate::store::identity::store_id_in(&storage, dir)?;
    let mut files = Vec::new();
    for atom in snapshot::list(&storage, dir)? {
        let path = snapshot::path(dir, atom);
        let (bytes, problem) = match snapshot::read(&storage, dir, atom)? {
            Ok(bytes) => {
                let problem = match store_id {
                    Some(store_id) => snapshot::decode(&bytes, atom, store_id).err(),
                    None => Some(SnapshotError::ForeignStore),
                };
                (bytes.len() as u64, problem)
            }
            // Deleted by retention since the listing: not a problem, not a file any more.
            Err(SnapshotError::Missing) => continue,
            Err(error) => match file_len(&storage, &path)? {
                Some(len) => (len, Some(error)),
                None => continue,
            },
        };
        let problem = problem.map(|error| (error.offset(), error.reason()));
        files.push(SnapshotFile { atom: AtomId::from_raw(atom), path, bytes, problem });
    }
    Ok(files)
}

/// The length of the file at `path`, or `None` if it no longer exists.
fn file_len(storage: &dyn Storage, path: &Path) -> Result<Option<u64>> {
    match storage.open(path, OpenMode::ReadOnly).and_then(|file| file.len()) {
        Ok(len) => Ok(Some(len)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io("stat", path, e)),
    }
}

/// Every file of the store (segments, snapshots, the lock file, anything else), by path
/// relative to `dir`, with its size in bytes (segments are preallocated: their size is the
/// configured segment size however full they are, except the active segment of a closed log,
/// which a clean close trims to its data).
///
/// # Errors
/// [`Error::Io`] when a directory cannot be listed or a file opened.
pub fn disk_usage(storage: Arc<dyn Storage>, dir: &Path) -> Result<Vec<(String, u64)>> {
    let storage = ReadOnlyStorage::new(storage);
    let mut files = Vec::new();
    for (sub, required) in [("", true), (snapshot::SNAPSHOT_DIR, false)] {
        let at = if sub.is_empty() { dir.to_path_buf() } else { dir.join(sub) };
        let names = match storage.list_dir(&at) {
            Ok(names) => names,
            Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::io("list directory", &at, e)),
        };
        for name in names {
            // A file deleted since the listing (retention, compaction) is not counted.
            let Some(bytes) = file_len(&storage, &at.join(&name))? else { continue };
            let shown = if sub.is_empty() { name } else { format!("{sub}/{name}") };
            files.push((shown, bytes));
        }
    }
    files.sort();
    Ok(files)
}

/// Bytes of live records in the store's log: what retention keeps, as compaction's planning
/// scan computes it ([`Store::space_report`]; reclaimable deltas count as their estimated
/// remains, the active segment as all live). Reads only.
///
/// # Errors
/// Read and decode errors of the log.
pub fn live_bytes(store: &Store) -> Result<u64> {
    Ok(store.space_report()?.live_bytes)
}

/// The bytes a store built with `compress_records_from(64)` writes for `record` (no
/// dictionary; every body of 64 bytes or more compressed): lets tests build a log record by
/// record, with fixed timestamps, that shows both plain and compressed records.
#[doc(hidden)]
pub fn encode_record(record: &StoreRecord) -> Vec<u8> {
    Codec::compressing_from(64).encode(record)
}
