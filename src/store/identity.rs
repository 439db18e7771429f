//! Which store a file belongs to, and what a segment's header says: the store id the log's
//! segment headers carry (`docs/FORMAT.md` §4), which snapshots and index snapshots repeat
//! under their digest so that a file from another store is never used.

use std::path::Path;

use crate::error::{CorruptionKind, Error, Result};
use crate::log::Log;
use crate::log::segment::{self, SEGMENT_HEADER_BYTES, SegmentHeader};
use crate::storage::{OpenMode, Storage};

/// The header of the segment file at `path`.
///
/// # Errors
/// [`Error::Io`] if it cannot be read; [`Error::Corruption`] if it does not verify.
pub(crate) fn segment_header(storage: &dyn Storage, path: &Path) -> Result<SegmentHeader> {
    let file = storage.open(path, OpenMode::ReadOnly).map_err(|e| Error::io("open", path, e))?;
    let mut bytes = [0u8; SEGMENT_HEADER_BYTES];
    file.read_exact_at(&mut bytes, 0).map_err(|e| Error::io("read", path, e))?;
    SegmentHeader::decode(&bytes).map_err(|reason| Error::Corruption {
        segment: path.to_path_buf(),
        offset: 0,
        kind: CorruptionKind::BadSegmentHeader { reason },
    })
}

/// The id of the store whose log is `log` (every segment holds the same one; recovery checked).
///
/// # Errors
/// As [`segment_header`].
pub(crate) fn store_id(log: &Log) -> Result<u64> {
    let segments = log.segments();
    let first = segments.first().ok_or(Error::InconsistentLog { lsn: 0, reason: "the log has no segment" })?;
    Ok(segment_header(log.storage().as_ref(), &first.path)?.store_id)
}

/// The store id of the log in `dir`, read from its oldest segment file without opening the
/// log; `None` if there is no segment.
///
/// # Errors
/// As [`segment_header`], and [`Error::Io`] if the directory cannot be listed.
pub(crate) fn store_id_in(storage: &dyn Storage, dir: &Path) -> Result<Option<u64>> {
    let names = storage.list_dir(dir).map_err(|e| Error::io("list directory", dir, e))?;
    let oldest = names.iter().filter_map(|name| Some((segment::parse_file_name(name)?, name))).min();
    match oldest {
        Some((_, name)) => Ok(Some(segment_header(storage, &dir.join(name))?.store_id)),
        None => Ok(None),
    }
}
