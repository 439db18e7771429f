//! Snapshot files: a full [`Context`] as of one atom, zstd-compressed, with a SHA-256 digest
//! checked on every load, published atomically (temporary name, sync, rename, directory sync).
//!
//! ```text
//! snapshot := magic:"CONTSNAP" version:u32 reserved:u32 atom:u64 uncompressed_len:u64
//!             payload_len:u64 store_id:u64 sha256:[u8;32] payload  (80-byte header, LE)
//! ```
//!
//! `sha256` covers header bytes 0..48 and the payload; the payload is a zstd frame of the
//! context's protobuf encoding. `store_id` is the log's (every segment header holds it): a
//! snapshot of another store is never used. See `docs/FORMAT.md`, §9.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::codec::context::Context;
use crate::error::{Error, Result};
use crate::limits;
use crate::log::record::{read_u32_le, read_u64_le};
use crate::storage::{OpenMode, Storage};

/// Directory of snapshot files inside the store directory.
pub(crate) const SNAPSHOT_DIR: &str = "snapshots";
const MAGIC: [u8; 8] = *b"CONTSNAP";
const VERSION: u32 = 2;
/// The format before snapshots carried their store's id: bound once by a writable open
/// ([`bind_all`]), refused otherwise (`docs/FORMAT.md` §9).
const VERSION_UNBOUND: u32 = 1;
const HEADER_BYTES: usize = 80;
const STORE_ID_AT: usize = 40;
const DIGEST_AT: usize = 48;
const _: () = assert!(DIGEST_AT + 32 == HEADER_BYTES);
const SUFFIX: &str = ".snap";
const TEMP_SUFFIX: &str = ".snap.tmp";
const LOST_SUFFIX: &str = ".snap.lost";

/// Why a snapshot file cannot be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SnapshotError {
    Truncated,
    BadHeader(&'static str),
    /// A format-version-1 file: it names no store, so it cannot be told from another store's.
    Unbound,
    /// The file belongs to another store (its store id is not the log's).
    ForeignStore,
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
            SnapshotError::Unbound => 8,
            SnapshotError::ForeignStore => STORE_ID_AT as u64,
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
            SnapshotError::Unbound => "format version 1 names no store",
            SnapshotError::ForeignStore => "the snapshot belongs to another store",
            SnapshotError::DigestMismatch => "the SHA-256 digest does not match",
            SnapshotError::TooLarge => "the declared size exceeds the limit",
            SnapshotError::Decompress => "the payload does not decompress",
            SnapshotError::Decode => "the payload does not decode",
            SnapshotError::Missing => "the file was deleted by retention",
        }
    }
}

/// The bytes of a snapshot of `context` as of `atom`, in the store whose id is `store_id`.
pub(crate) fn encode(atom: u64, store_id: u64, context: &Context) -> Result<Vec<u8>> {
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
    bytes.extend_from_slice(&store_id.to_le_bytes());
    let digest = digest(&bytes[..DIGEST_AT], &payload);
    bytes.extend_from_slice(&digest);
    bytes.extend_from_slice(&payload);
    Ok(bytes)
}

/// Verifies and decodes snapshot bytes that should hold `atom`'s context in the store whose
/// id is `store_id`.
pub(crate) fn decode(bytes: &[u8], atom: u64, store_id: u64) -> Result<Context, SnapshotError> {
    let (header, payload) = verify(bytes, atom, store_id)?;
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

/// Checks a snapshot's header and digest (not its payload's decoding): its header and payload
/// if it is `atom`'s snapshot in the store whose id is `store_id`.
pub(crate) fn verify(bytes: &[u8], atom: u64, store_id: u64) -> Result<(&[u8], &[u8]), SnapshotError> {
    if is_unbound(bytes) {
        return Err(SnapshotError::Unbound);
    }
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
    if read_u64_le(header, STORE_ID_AT) != store_id {
        return Err(SnapshotError::ForeignStore);
    }
    if read_u64_le(header, 16) != atom {
        return Err(SnapshotError::BadHeader("the snapshot is of another atom"));
    }
    Ok((header, payload))
}

/// Whether `bytes` are a format-version-1 snapshot (which names no store).
fn is_unbound(bytes: &[u8]) -> bool {
    bytes.get(..8).is_some_and(|magic| magic == MAGIC) && bytes.get(8..12) == Some(&VERSION_UNBOUND.to_le_bytes())
}

/// The version-2 bytes of a verified version-1 snapshot of `atom` (72-byte header, digest at
/// 40 over bytes 0..40 and the payload), bound to `store_id`; the payload is kept as it is.
fn bind_unbound(bytes: &[u8], atom: u64, store_id: u64) -> Result<Vec<u8>, SnapshotError> {
    const UNBOUND_HEADER_BYTES: usize = 72;
    const UNBOUND_DIGEST_AT: usize = 40;
    let header = bytes.get(..UNBOUND_HEADER_BYTES).ok_or(SnapshotError::Truncated)?;
    let payload = &bytes[UNBOUND_HEADER_BYTES..];
    if read_u64_le(header, 32) != payload.len() as u64 {
        return Err(SnapshotError::Truncated);
    }
    if digest(&header[..UNBOUND_DIGEST_AT], payload)[..] != header[UNBOUND_DIGEST_AT..] {
        return Err(SnapshotError::DigestMismatch);
    }
    if read_u32_le(header, 12) != 0 || read_u64_le(header, 16) != atom {
        return Err(SnapshotError::BadHeader("the snapshot is of another atom"));
    }
    let mut bound = Vec::with_capacity(HEADER_BYTES + payload.len());
    bound.extend_from_slice(&header[..UNBOUND_DIGEST_AT]);
    bound[8..12].copy_from_slice(&VERSION.to_le_bytes());
    bound.extend_from_slice(&store_id.to_le_bytes());
    let digest = digest(&bound[..DIGEST_AT], payload);
    bound.extend_from_slice(&digest);
    bound.extend_from_slice(payload);
    Ok(bound)
}

/// Marks a snapshot directory whose files are all bound to the store: version-1 files found
/// once it exists are refused; before it exists, a writable open binds them ([`bind_all`]).
pub(crate) const BOUND_MARKER: &str = "BOUND";

/// Binds the store's version-1 snapshot files to it, once: if `snapshots/` has no
/// [`BOUND_MARKER`], every version-1 file that verifies and whose atom `is_ours` (a completed
/// atom of the store) is rewritten as version 2 with `store_id` (published as any snapshot),
/// then the marker is created; from then on a version-1 file is never used. A store without
/// snapshots gets the marker at once. Returns the files bound.
///
/// # Errors
/// [`Error::Io`] from reading, publishing, syncing or creating the marker; the files already
/// bound stay bound, and the next writable open goes on.
pub(crate) fn bind_all(
    storage: &dyn Storage,
    store_dir: &Path,
    store_id: u64,
    atoms: &std::collections::BTreeSet<u64>,
    is_ours: impl Fn(u64) -> bool,
) -> Result<usize> {
    let dir = store_dir.join(SNAPSHOT_DIR);
    let marker = dir.join(BOUND_MARKER);
    match storage.open(&marker, OpenMode::ReadOnly) {
        Ok(_) => return Ok(0),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io("open", &marker, e)),
    }
    storage.create_dir_all(&dir).map_err(|e| Error::io("create directory", &dir, e))?;
    let mut bound = 0;
    for &atom in atoms {
        let Ok(bytes) = read(storage, store_dir, atom)? else { continue };
        if !is_unbound(&bytes) || !is_ours(atom) {
            continue;
        }
        // A damaged version-1 file stays as it is, refused as any unusable snapshot.
        if let Ok(bytes) = bind_unbound(&bytes, atom, store_id) {
            publish(storage, store_dir, atom, &bytes)?;
            bound += 1;
        }
    }
    // IMPORTANT: the bound files' names are durable before the marker that refuses version 1.
    sync_dir(storage, store_dir)?;
    let file = match storage.open(&marker, OpenMode::CreateNew) {
        Ok(file) => Ok(file),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => storage.open(&marker, OpenMode::ReadWrite),
        Err(e) => Err(e),
    }
    .map_err(|e| Error::io("create", &marker, e))?;
    file.sync_data().map_err(|e| Error::io("fdatasync", &marker, e))?;
    sync_dir(storage, store_dir)?;
    if bound > 0 {
        tracing::info!(bound, "version-1 snapshots bound to the store");
    }
    Ok(bound)
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

/// Path a snapshot is set aside at when it is evidence of lost records: no longer a snapshot
/// (never listed, never used), kept for whoever salvages the store.
pub(crate) fn lost_path(store_dir: &Path, atom: u64) -> PathBuf {
    store_dir.join(SNAPSHOT_DIR).join(format!("{atom:020}{LOST_SUFFIX}"))
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
