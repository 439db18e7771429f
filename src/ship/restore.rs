//! Restoring a shipped store on a fresh host: take it over first (the manifest's epoch + 1, by
//! a conditional write), then download and verify what the manifest lists, lay the files out
//! as the store's own, and open it.

use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt;
use object_store::ObjectStoreExt;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::limits;
use crate::log::manifest::{self as log_manifest, Manifest, ManifestEntry, TailRecord};
use crate::log::segment::{self, SegmentHeader};
use crate::ship::Remote;
use crate::ship::claim::{self, Owned};
use crate::ship::manifest::{
    ENCODING_PLAIN, ENCODING_ZSTD, ShippedIndex, ShippedManifest, ShippedSegment, ShippedSnapshot, remote_error,
};
use crate::snapshot;
use crate::storage::{OpenMode, Storage};
use crate::store::{Store, StoreBuilder};

/// What [`Store::restore_from`] did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RestoreReport {
    /// The epoch this host took.
    pub epoch: u64,
    /// Sealed segments downloaded.
    pub segments: usize,
    /// Whether the active segment's shipped prefix (the tail) was restored.
    pub tail: bool,
    /// Snapshot files downloaded and verified.
    pub snapshots: usize,
    /// Snapshots left out because their object is damaged (rebuilds fall back to an older
    /// snapshot or to the log, as on disk).
    pub damaged_snapshots: Vec<u64>,
    /// The LSN the restored index snapshot covers, if one was shipped and is intact: the open
    /// folds only the records after it (as a local reopen does). The open still checks it
    /// against the restored log ([`Store::index_snapshot`] says whether it used it).
    pub index_snapshot: Option<u64>,
    /// Bytes downloaded.
    pub bytes: u64,
    /// The LSN the restored log continues at.
    pub next_lsn: u64,
    /// How long the takeover and the downloads took (files written and synced included).
    pub downloaded_in: Duration,
    /// How long the restore took, the store's open included.
    pub took: Duration,
}

impl StoreBuilder {
    /// Restores the store shipped to this builder's [`Remote`] into its directory (which
    /// must hold no store) and opens it as the store's new owner: the bucket's epoch grows by
    /// one first, by a conditional write, so that exactly one of several hosts restoring at
    /// once wins and the previous owner is fenced at its next manifest write. Then every
    /// object the manifest lists is downloaded and its SHA-256 checked (a damaged segment is
    /// downloaded once more, then refused; a damaged snapshot is left out), and the store opens
    /// with the usual recovery, which checks every frame's CRC.
    ///
    /// # Errors
    /// [`Error::Fenced`] when another host took the store over first; [`Error::InvalidArgument`]
    /// without [`StoreBuilder::ship_to`] or on a directory that holds a store;
    /// [`Error::DamagedObject`] for a segment damaged in the bucket; [`Error::ObjectStore`] when
    /// the bucket fails; those of [`StoreBuilder::open`].
    pub fn restore(self) -> Result<(Store, RestoreReport)> {
        self.restore_taking_over(None)
    }

    /// [`StoreBuilder::restore`], taking the store over only from epoch `from`: what a host
    /// that saw the owner of epoch `from` fail does, so that of several hosts that saw it, one
    /// takes the store over and the others get [`Error::Fenced`] (rather than each taking it
    /// from the one before).
    ///
    /// # Errors
    /// As [`StoreBuilder::restore`]; [`Error::Fenced`] as well when the bucket's epoch is not
    /// `from`.
    pub fn restore_from_epoch(self, from: u64) -> Result<(Store, RestoreReport)> {
        self.restore_taking_over(Some(from))
    }

    fn restore_taking_over(mut self, from: Option<u64>) -> Result<(Store, RestoreReport)> {
        let started = Instant::now();
        let Some(remote) = self.remote.clone() else {
            return Err(Error::InvalidArgument { reason: "restore needs a remote: StoreBuilder::ship_to".into() });
        };
        let (dir, storage) = self.log.location();
        let (dir, storage) = (dir.to_path_buf(), std::sync::Arc::clone(storage));
        check_empty(storage.as_ref(), &dir)?;
        let segment_bytes = self.log.settings().segment_bytes;
        let mut report = remote.block_on(async {
            let owned = claim::take_over(remote.store.as_ref(), &remote.prefix, &remote.owner, from).await?;
            let report = download(&remote, &owned, &storage, &dir, segment_bytes).await?;
            claim::write(storage.as_ref(), &dir, owned.claim)?;
            Ok::<_, Error>(report)
        })?;
        self.remote = Some(remote);
        report.downloaded_in = started.elapsed();
        let store = self.open()?;
        report.took = started.elapsed();
        tracing::info!(epoch = report.epoch, segments = report.segments, bytes = report.bytes, "store restored");
        Ok((store, report))
    }
}

impl Store {
    /// Restores the store shipped to `remote` into `dir` and opens it there as its new owner:
    /// `Store::builder(dir).ship_to(remote).restore()` ([`StoreBuilder::restore`]).
    ///
    /// # Errors
    /// As [`StoreBuilder::restore`].
    pub fn restore_from(remote: Remote, dir: impl AsRef<Path>) -> Result<(Store, RestoreReport)> {
        Store::builder(dir).ship_to(remote).restore()
    }
}

/// Refuses a directory that holds a store (a segment, a claim).
fn check_empty(storage: &dyn Storage, dir: &Path) -> Result<()> {
    storage.create_dir_all(dir).map_err(|e| Error::io("create directory", dir, e))?;
    let names = storage.list_dir(dir).map_err(|e| Error::io("list directory", dir, e))?;
    let taken = names.iter().any(|name| {
        segment::parse_file_name(name).is_some()
            || name == claim::CLAIM_FILE
            || name == log_manifest::MANIFEST_FILE_NAME
    });
    if taken {
        return Err(Error::InvalidArgument { reason: format!("{} already holds a store", dir.display()) });
    }
    Ok(())
}

/// Downloads what `owned`'s manifest lists into `dir` and writes the log manifest.
async fn download(
    remote: &Remote,
    owned: &Owned,
    shared_storage: &std::sync::Arc<dyn Storage>,
    dir: &Path,
    segment_bytes: u64,
) -> Result<RestoreReport> {
    let storage = shared_storage.as_ref();
    let manifest = &owned.current.manifest;
    let mut report = RestoreReport { epoch: owned.claim.epoch, ..RestoreReport::default() };
    let segments: Vec<&ShippedSegment> = manifest.segments.iter().chain(manifest.tail.iter()).collect();
    let restore_segments = async {
        // Each segment is written (and synced) as soon as it is downloaded, beside the others.
        let mut restored = futures::stream::iter(segments.iter().copied())
            .map(|shipped| async move {
                let fetched = fetch_verified(remote, Wanted::segment(shipped)).await?;
                let (bytes, object_bytes) = fetched.ok_or_else(|| Error::DamagedObject { key: shipped.key.clone() })?;
                let (storage, dir, store_id) =
                    (std::sync::Arc::clone(shared_storage), dir.to_path_buf(), manifest.store_id);
                let shipped = shipped.clone();
                let header = crate::ship::blocking("write a restored segment", move || {
                    write_segment(storage.as_ref(), &dir, store_id, &shipped, &bytes)
                })
                .await??;
                Ok::<_, Error>((header, object_bytes))
            })
            .buffered(limits::SHIP_TRANSFERS_IN_FLIGHT);
        let (mut headers, mut downloaded) = (Vec::with_capacity(segments.len()), 0);
        while let Some(segment) = restored.next().await {
            let (header, object_bytes) = segment?;
            headers.push(header);
            downloaded += object_bytes;
        }
        Ok::<_, Error>((headers, downloaded))
    };
    // The index snapshot downloads beside the segments.
    let fetch_index = async {
        match &manifest.index {
            Some(index) => fetch_verified(remote, Wanted::index(index)).await,
            None => Ok(None),
        }
    };
    let (restored, index) = futures::future::join(restore_segments, fetch_index).await;
    let (headers, downloaded) = restored?;
    report.bytes += downloaded;
    report.segments = manifest.segments.len();
    report.tail = manifest.tail.is_some();
    restore_snapshots(remote, manifest, storage, dir, &mut report).await?;
    match (&manifest.index, index?) {
        (Some(index), Some((bytes, downloaded))) => {
            crate::store::index_snapshot::place(storage, dir, &bytes)?;
            report.index_snapshot = Some(index.covered);
            report.bytes += downloaded;
        }
        (Some(index), None) => {
            tracing::warn!(key = index.key, "the shipped index snapshot is damaged: the open folds the whole log")
        }
        (None, _) => {}
    }
    report.next_lsn = finish_log(storage, dir, manifest, &headers, segment_bytes)?;
    storage.sync_dir(dir).map_err(|e| Error::io("sync directory", dir, e))?;
    Ok(report)
}

/// What a shipped object holds, and how to check it.
struct Wanted<'a> {
    key: &'a str,
    /// The content's length and SHA-256.
    bytes: u64,
    sha256: &'a [u8],
    /// [`ENCODING_PLAIN`] or [`ENCODING_ZSTD`].
    encoding: u32,
    /// The largest content a restore accepts of this kind of object.
    limit: u64,
}

impl<'a> Wanted<'a> {
    fn segment(shipped: &'a ShippedSegment) -> Self {
        let (key, bytes, sha256, encoding) = (&shipped.key, shipped.bytes, &shipped.sha256, shipped.encoding);
        Wanted { key, bytes, sha256, encoding, limit: limits::SEGMENT_BYTES_MAX }
    }

    fn snapshot(shipped: &'a ShippedSnapshot) -> Self {
        let (key, bytes, sha256) = (&shipped.key, shipped.bytes, &shipped.sha256);
        Wanted { key, bytes, sha256, encoding: ENCODING_PLAIN, limit: limits::SNAPSHOT_BYTES_MAX }
    }

    fn index(shipped: &'a ShippedIndex) -> Self {
        let (key, bytes, sha256) = (&shipped.key, shipped.bytes, &shipped.sha256);
        Wanted { key, bytes, sha256, encoding: ENCODING_PLAIN, limit: limits::INDEX_SNAPSHOT_BYTES_MAX }
    }
}

/// An object's content and the bytes downloaded for it, if its length and SHA-256 (after
/// decompression) are the manifest's (downloaded twice at most); `None` if it is damaged.
async fn fetch_verified(remote: &Remote, wanted: Wanted<'_>) -> Result<Option<(Vec<u8>, u64)>> {
    let key = wanted.key;
    if wanted.bytes > wanted.limit {
        return Err(Error::LimitExceeded { what: format!("bytes of the shipped object {key}"), limit: wanted.limit });
    }
    let path = object_store::path::Path::from(key);
    for _ in 0..2 {
        let got = remote.store.get(&path).await.map_err(|error| remote_error("get", key, &error))?;
        // Nothing is read of an object larger than its content can compress to.
        let bound = zstd::zstd_safe::compress_bound(wanted.bytes as usize) as u64;
        if got.meta.size > wanted.bytes.max(bound) {
            tracing::warn!(key, size = got.meta.size, "a shipped object is larger than its content can be");
            continue;
        }
        let object = got.bytes().await.map_err(|error| remote_error("get", key, &error))?.to_vec();
        let (bytes, sha256, encoding) = (wanted.bytes, wanted.sha256.to_vec(), wanted.encoding);
        // Decompressing and hashing run beside the downloads still in flight.
        let checked = crate::ship::blocking("check a downloaded object", move || {
            let downloaded = object.len() as u64;
            let content = match encoding {
                ENCODING_ZSTD => zstd::bulk::decompress(&object, bytes as usize).ok()?,
                _ => object,
            };
            let intact = content.len() as u64 == bytes && Sha256::digest(&content).as_slice() == sha256.as_slice();
            intact.then_some((content, downloaded))
        })
        .await?;
        if checked.is_some() {
            return Ok(checked);
        }
        tracing::warn!(key, "a downloaded object's SHA-256 is not the manifest's");
    }
    Ok(None)
}

/// Writes one downloaded segment where the store keeps it, padded with zeros to its size when
/// the writer created it; returns its header.
fn write_segment(
    storage: &dyn Storage,
    dir: &Path,
    store_id: u64,
    shipped: &ShippedSegment,
    bytes: &[u8],
) -> Result<SegmentHeader> {
    let damaged = || Error::DamagedObject { key: shipped.key.clone() };
    let header = SegmentHeader::decode(bytes).map_err(|_| damaged())?;
    if header.seq != shipped.seq || header.first_lsn != shipped.first_lsn || header.store_id != store_id {
        return Err(damaged());
    }
    let path = dir.join(segment::file_name(header.first_lsn));
    let temp = dir.join(format!("{}.restore.tmp", segment::file_name(header.first_lsn)));
    let _ = storage.remove_file(&temp);
    let file = storage.open(&temp, OpenMode::CreateNew).map_err(|e| Error::io("create", &temp, e))?;
    file.write_all_at(bytes, 0).map_err(|e| Error::io("write", &temp, e))?;
    if header.end_lsn == 0 && header.segment_bytes > bytes.len() as u64 {
        file.set_len(header.segment_bytes).map_err(|e| Error::io("set length", &temp, e))?;
    }
    file.sync_data().map_err(|e| Error::io("fdatasync", &temp, e))?;
    storage.rename(&temp, &path).map_err(|e| Error::io("rename", &temp, e))?;
    Ok(header)
}

/// Downloads the snapshot files, leaving out (and reporting) damaged ones.
async fn restore_snapshots(
    remote: &Remote,
    manifest: &ShippedManifest,
    storage: &dyn Storage,
    dir: &Path,
    report: &mut RestoreReport,
) -> Result<()> {
    let shipped: Vec<&ShippedSnapshot> = manifest.snapshots.iter().collect();
    let mut fetched = futures::stream::iter(shipped.iter().copied())
        .map(|shipped| fetch_verified(remote, Wanted::snapshot(shipped)))
        .buffered(limits::SHIP_TRANSFERS_IN_FLIGHT);
    let mut at = 0;
    while let Some(fetched) = fetched.next().await {
        let shipped = shipped[at];
        at += 1;
        match fetched? {
            Some((bytes, downloaded)) if snapshot::verify(&bytes, shipped.atom, manifest.store_id).is_ok() => {
                snapshot::publish(storage, dir, shipped.atom, &bytes)?;
                report.snapshots += 1;
                report.bytes += downloaded;
            }
            _ => report.damaged_snapshots.push(shipped.atom),
        }
    }
    // Every restored snapshot names its store (version 2): the marker that says so.
    let snapshots = dir.join(snapshot::SNAPSHOT_DIR);
    storage.create_dir_all(&snapshots).map_err(|e| Error::io("create directory", &snapshots, e))?;
    let marker = snapshots.join(snapshot::BOUND_MARKER);
    let file = storage.open(&marker, OpenMode::CreateNew).map_err(|e| Error::io("create", &marker, e))?;
    file.sync_data().map_err(|e| Error::io("fdatasync", &marker, e))?;
    snapshot::sync_dir(storage, dir)
}

/// Creates the active segment when no tail was shipped, and writes the log manifest that lists
/// the restored segments; returns the LSN the log continues at.
fn finish_log(
    storage: &dyn Storage,
    dir: &Path,
    manifest: &ShippedManifest,
    headers: &[SegmentHeader],
    segment_bytes: u64,
) -> Result<u64> {
    let mut entries: Vec<ManifestEntry> = manifest
        .segments
        .iter()
        .zip(headers)
        .map(|(shipped, header)| ManifestEntry {
            seq: shipped.seq,
            first_lsn: shipped.first_lsn,
            end_lsn: shipped.next_lsn,
            generation: header.generation,
        })
        .collect();
    // The active segment: the shipped tail, or a new empty segment after the sealed ones.
    let active = match &manifest.tail {
        Some(tail) => {
            ManifestEntry { seq: tail.seq, first_lsn: tail.first_lsn, end_lsn: 0, generation: tail.generation }
        }
        None => {
            let (seq, first_lsn) = match manifest.segments.last() {
                Some(last) => (last.seq + 1, last.next_lsn),
                None => (manifest.active_seq.max(1), manifest.active_first_lsn.max(1)),
            };
            let header = SegmentHeader {
                seq,
                first_lsn,
                segment_bytes,
                store_id: manifest.store_id,
                end_lsn: 0,
                compressed: false,
                generation: segment::GENERATION_WRITER,
            };
            drop(segment::create(storage, dir, header)?);
            ManifestEntry { seq, first_lsn, end_lsn: 0, generation: segment::GENERATION_WRITER }
        }
    };
    let next_lsn = manifest.tail.as_ref().map_or(active.first_lsn, |tail| tail.next_lsn);
    let tail = TailRecord { seq: active.seq, next_lsn, trimmed_bytes: 0 };
    entries.push(active);
    let log = Manifest { store_id: manifest.store_id, tail, segments: entries };
    log_manifest::write(storage, dir, &log)?;
    Ok(tail.next_lsn)
}
