//! Snapshot files: a full [`Context`] as of one atom, zstd-compressed, with a SHA-256 digest
//! checked on every load, published atomically (temporary name, sync, rename, directory sync).
//!
//! ```text
//! snapshot := magic:"CONTSNAP" version:u32 reserved:u32 atom:u64 uncompressed_len:u64
//!             payload_len:u64 sha256:[u8;32] payload          (72-byte header, little-endian)
//! ```
//!
//! `sha256` covers header bytes 0..40 and the payload; the payload is a zstd frame of the
//! context's protobuf encoding. See `docs/FORMAT.md`.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::context::Context;
use crate::error::{Error, Result};
use crate::limits;
use crate::log::record::{read_u32_le, read_u64_le};
use crate::storage::{OpenMode, Storage};

/// Directory of snapshot files inside the store directory.
pub(crate) const SNAPSHOT_DIR: &str = "snapshots";
const MAGIC: [u8; 8] = *b"CONTSNAP";
const VERSION: u32 = 1;
const HEADER_BYTES: usize = 72;
const DIGEST_AT: usize = 40;
const SUFFIX: &str = ".snap";
const TEMP_SUFFIX: &str = ".snap.tmp";

/// Why a snapshot file cannot be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SnapshotError {
    Truncated,
    BadHeader(&'static str),
    DigestMismatch,
    TooLarge,
    Decompress,
    Decode,
    /// Deleted (by retention) between the choice and the read.
    Missing,
}

impl SnapshotError {
    /// Offset in the file of the field at fault (docs/FORMAT.md §9).
    pub fn offset(self) -> u64 {
        match self {
            SnapshotError::Truncated | SnapshotError::BadHeader(_) | SnapshotError::Missing => 0,
            SnapshotError::TooLarge => 24,
            SnapshotError::DigestMismatch => DIGEST_AT as u64,
            SnapshotError::Decompress | SnapshotError::Decode => HEADER_BYTES as u64,
        }
    }

    /// A sentence for reports and log lines.
    pub fn reason(self) -> &'static str {
        match self {
            SnapshotError::Truncated => "the file is truncated",
            SnapshotError::BadHeader(reason) => reason,
            SnapshotError::DigestMismatch => "the SHA-256 digest does not match",
            SnapshotError::TooLarge => "the declared size exceeds the limit",
            SnapshotError::Decompress => "the payload does not decompress",
            SnapshotError::Decode => "the payload does not decode",
            SnapshotError::Missing => "the file was deleted by retention",
        }
    }
}

/// The bytes of a snapshot of `context` as of `atom`.
pub(crate) fn encode(atom: u64, context: &Context) -> Result<Vec<u8>> {
    let body = context.encode();
    let payload = zstd::bulk::compress(&body, limits::COMPRESSION_LEVEL)
        .map_err(|e| Error::io("compress snapshot", PathBuf::new(), e))?;
    let mut bytes = Vec::with_capacity(HEADER_BYTES + payload.len());
    bytes.extend_from_slice(&MAGIC);
    bytes.extend_from_slice(&VERSION.to_le_bytes());
    bytes.extend_from_slice(&0u32.to_le_bytes());
    bytes.extend_from_slice(&atom.to_le_bytes());
    bytes.extend_from_slice(&(body.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    let digest = digest(&bytes[..DIGEST_AT], &payload);
    bytes.extend_from_slice(&digest);
    bytes.extend_from_slice(&payload);
    Ok(bytes)
}

/// Verifies and decodes snapshot bytes that should hold `atom`'s context.
pub(crate) fn decode(bytes: &[u8], atom: u64) -> Result<Context, SnapshotError> {
    let header = bytes.get(..HEADER_BYTES).ok_or(SnapshotError::Truncated)?;
    if header[..8] != MAGIC {
        return Err(SnapshotError::BadHeader("wrong magic bytes"));
    }
    if read_u32_le(header, 8) != VERSION || read_u32_le(header, 12) != 0 {
        return Err(SnapshotError::BadHeader("unsupported version"));
    }
    let payload_len = usize::try_from(read_u64_le(header, 32)).map_err(|_| SnapshotError::TooLarge)?;
    let payload = bytes.get(HEADER_BYTES..).filter(|p| p.len() == payload_len).ok_or(SnapshotError::Truncated)?;
    if digest(&header[..DIGEST_AT], payload)[..] != header[DIGEST_AT..HEADER_BYTES] {
        return Err(SnapshotError::DigestMismatch);
    }
    if read_u64_le(header, 16) != atom {
        return Err(SnapshotError::BadHeader("the snapshot is of another atom"));
    }
    let uncompressed = read_u64_le(header, 24);
    if uncompressed > limits::SNAPSHOT_BYTES_MAX {
        return Err(SnapshotError::TooLarge);
    }
    let body = zstd::bulk::decompress(payload, uncompressed as usize).map_err(|_| SnapshotError::Decompress)?;
    if body.len() as u64 != uncompressed {
        return Err(SnapshotError::Decompress);
    }
    Context::decode(&body).map_err(|_| SnapshotError::Decode)
}

fn digest(header: &[u8], payload: &[u8]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(header);
    hasher.update(payload);
    hasher.finalize().into()
}

/// Path of `atom`'s snapshot.
pub(crate) fn path(store_dir: &Path, atom: u64) -> PathBuf {
    store_dir.join(SNAPSHOT_DIR).join(format!("{atom:020}{SUFFIX}"))
}

/// When a written snapshot's name becomes durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NameDurability {
    /// The snapshot directory is synced before the write returns.
    Now,
    /// At the directory's next [`sync_dir`]: until then a power loss may lose the snapshot
    /// (never leave part of one), which costs only rebuild time.
    Deferred,
}

/// Publishes a snapshot so that it exists after a crash only complete: write under a temporary
/// name, sync it, rename it into place. Its name is durable once the caller runs [`sync_dir`].
pub(crate) fn publish(storage: &dyn Storage, store_dir: &Path, atom: u64, bytes: &[u8]) -> Result<()> {
    let dir = store_dir.join(SNAPSHOT_DIR);
    storage.create_dir_all(&dir).map_err(|e| Error::io("create directory", &dir, e))?;
    let target = path(store_dir, atom);
    let temp = dir.join(format!("{atom:020}{TEMP_SUFFIX}"));
    let _ = storage.remove_file(&temp);
    let file = storage.open(&temp, OpenMode::CreateNew).map_err(|e| Error::io("create", &temp, e))?;
    file.write_all_at(bytes, 0).map_err(|e| Error::io("write", &temp, e))?;
    // IMPORTANT: the snapshot's bytes are durable before its name is.
    file.sync_data().map_err(|e| Error::io("fdatasync", &temp, e))?;
    storage.rename(&temp, &target).map_err(|e| Error::io("rename", &temp, e))?;
    tracing::debug!(atom, bytes = bytes.len(), path = %target.display(), "snapshot published");
    Ok(())
}

/// Syncs the snapshot directory: every snapshot renamed into it or deleted from it before the
/// call is durably there or gone.
pub(crate) fn sync_dir(storage: &dyn Storage, store_dir: &Path) -> Result<()> {
    let dir = store_dir.join(SNAPSHOT_DIR);
    storage.sync_dir(&dir).map_err(|e| Error::io("sync directory", &dir, e))
}

/// Syncs the snapshot directory, if there is one, at a writable open: a process that died
/// before the directory's sync left the names of its policy snapshots in the page cache only,
/// and the open is about to rely on every snapshot it listed.
pub(crate) fn sync_dir_at_open(storage: &dyn Storage, store_dir: &Path) -> Result<()> {
    let dir = store_dir.join(SNAPSHOT_DIR);
    match storage.sync_dir(&dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io("sync directory", &dir, e)),
        _ => Ok(()),
    }
}

/// Reads a snapshot file's bytes (bounded by the limit, so a huge file is refused).
pub(crate) fn read(storage: &dyn Storage, store_dir: &Path, atom: u64) -> Result<Result<Vec<u8>, SnapshotError>> {
    let path = path(store_dir, atom);
    let file = match storage.open(&path, OpenMode::ReadOnly) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Err(SnapshotError::Missing)),
        Err(e) => return Err(Error::io("open", &path, e)),
    };
    let len = file.len().map_err(|e| Error::io("stat", &path, e))?;
    if len > limits::SNAPSHOT_BYTES_MAX + HEADER_BYTES as u64 {
        return Ok(Err(SnapshotError::TooLarge));
    }
    let mut bytes = vec![0u8; len as usize];
    file.read_exact_at(&mut bytes, 0).map_err(|e| Error::io("read", &path, e))?;
    Ok(Ok(bytes))
}

/// Atoms with a snapshot file, after deleting leftover temporary files.
pub(crate) fn list(storage: &dyn Storage, store_dir: &Path) -> Result<Vec<u64>> {
    let dir = store_dir.join(SNAPSHOT_DIR);
    let names = match storage.list_dir(&dir) {
        Ok(names) => names,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io("list directory", &dir, e)),
    };
    let mut atoms = Vec::new();
    for name in names {
        if name.ends_with(TEMP_SUFFIX) {
            let _ = storage.remove_file(&dir.join(&name));
        } else if let Some(atom) = name.strip_suffix(SUFFIX).and_then(|digits| digits.parse().ok()) {
            atoms.push(atom);
        }
    }
    atoms.sort_unstable();
    Ok(atoms)
}
