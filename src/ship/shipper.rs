//! The shipping thread: uploads what the bucket lacks, then changes the manifest by a
//! conditional write; fences the store when that write's condition fails.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use parking_lot::{Condvar, Mutex};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::limits;
use crate::log::SegmentFile;
use crate::ship::claim::Owned;
use crate::ship::manifest::{self, ShippedIndex, ShippedManifest, ShippedSegment, ShippedSnapshot, Versioned, Written};
use crate::ship::{Remote, layout};
use crate::snapshot;
use crate::store::{Shared, now_us};

/// What shipping has done so far ([`Store::shipping_status`](crate::Store::shipping_status)).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ShippingStatus {
    /// The owner's name, as the manifest records it.
    pub owner: String,
    /// The owner's epoch.
    pub epoch: u64,
    /// Whether another owner took the store over: it is read-only, nothing more is shipped.
    pub fenced: bool,
    /// Sealed segments the bucket's manifest lists.
    pub shipped_segments: usize,
    /// Snapshot files the bucket's manifest lists.
    pub shipped_snapshots: usize,
    /// Every record below this LSN is in the bucket (in a listed segment or the listed tail).
    pub shipped_next_lsn: u64,
    /// Bytes of the log not in the bucket yet: sealed segments not uploaded, and the active
    /// segment's records (all of them without tail shipping, those after the tail with it).
    pub lag_bytes: u64,
    /// For how long some of the log has waited to be shipped (0 when nothing waits).
    pub lag_seconds: f64,
    /// Manifest writes that succeeded.
    pub manifest_writes: u64,
    /// Objects uploaded.
    pub uploads: u64,
    /// Objects deleted by bucket retention.
    pub deletions: u64,
    /// Cycles that failed (and were retried).
    pub failed_cycles: u64,
    /// The last failure, if the last cycle failed.
    pub last_error: Option<String>,
}

/// The running shipping thread of a store.
pub(crate) struct Shipper {
    control: Arc<Control>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What the store's threads and the shipping thread share.
struct Control {
    state: Mutex<ControlState>,
    wake: Condvar,
    status: Mutex<ShippingStatus>,
}

#[derive(Default)]
struct ControlState {
    stop: bool,
    /// Cycles asked for by [`Shipper::ship_now`], and cycles finished.
    requested: u64,
    finished: u64,
    /// The outcome of the last finished cycle.
    last: Option<std::result::Result<(), Error>>,
}

impl Shipper {
    /// Starts shipping `shared`'s log and snapshots to `remote`, as the owner `owned` proved.
    pub fn start(shared: Arc<Shared>, remote: Remote, owned: Owned) -> Result<Shipper> {
        let status = ShippingStatus {
            owner: owned.current.manifest.owner.clone(),
            epoch: owned.claim.epoch,
            ..ShippingStatus::default()
        };
        let control = Arc::new(Control {
            state: Mutex::new(ControlState::default()),
            wake: Condvar::new(),
            status: Mutex::new(status),
        });
        let mut worker = Worker::new(shared, remote, owned, Arc::clone(&control));
        let thread = std::thread::Builder::new()
            .name("continuum-ship".into())
            .spawn(move || worker.run())
            .map_err(|e| Error::io("spawn the shipping thread", "", e))?;
        Ok(Shipper { control, thread: Some(thread) })
    }

    /// The status now.
    pub fn status(&self) -> ShippingStatus {
        self.control.status.lock().clone()
    }

    /// Runs a cycle now and waits for it: when it returns `Ok`, everything sealed before the
    /// call (and, with tail shipping on, every record appended before it) is in the bucket.
    pub fn ship_now(&self) -> Result<()> {
        let mut state = self.control.state.lock();
        state.requested += 1;
        let wanted = state.requested;
        self.control.wake.notify_all();
        while state.finished < wanted {
            if self.thread.as_ref().is_none_or(std::thread::JoinHandle::is_finished) {
                return Err(self.stopped_error());
            }
            self.control.wake.wait_for(&mut state, Duration::from_millis(50));
        }
        match &state.last {
            Some(Err(error)) => Err(error.replicate()),
            _ => Ok(()),
        }
    }

    fn stopped_error(&self) -> Error {
        let status = self.control.status.lock();
        if status.fenced { Error::Fenced { epoch: status.epoch, current: 0 } } else { Error::Closed }
    }

    /// Stops the thread after a last cycle, and waits for it.
    pub fn stop(&mut self) {
        self.control.state.lock().stop = true;
        self.control.wake.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Shipper {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The shipping thread's state.
struct Worker {
    shared: Arc<Shared>,
    remote: Remote,
    owned: Owned,
    control: Arc<Control>,
    /// When the active segment's prefix is next due.
    tail_due: Instant,
    /// Since when some of the log has waited.
    lag_since: Option<Instant>,
    /// When bucket retention last ran.
    retention_ran: Option<Instant>,
    /// Objects this owner's manifests stopped listing, and when.
    dropped: HashMap<String, Instant>,
}

impl Worker {
    fn new(shared: Arc<Shared>, remote: Remote, owned: Owned, control: Arc<Control>) -> Self {
        Worker {
            shared,
            remote,
            owned,
            control,
            tail_due: Instant::now(),
            lag_since: None,
            retention_ran: None,
            dropped: HashMap::new(),
        }
    }

    fn run(&mut self) {
        let poll = self.remote.options.poll;
        let mut wait = poll;
        loop {
            let (stop, requested, asked) = {
                let mut state = self.control.state.lock();
                if !state.stop && state.requested == state.finished {
                    self.control.wake.wait_for(&mut state, wait);
                }
                (state.stop, state.requested, state.requested > state.finished)
            };
            // A cycle someone waits for (or the last one) ships the tail whether it is due or not.
            let remote = self.remote.clone();
            let outcome = remote.block_on(self.cycle(asked || stop));
            let fenced = matches!(outcome, Err(Error::Fenced { .. }));
            self.note(&outcome);
            wait = match &outcome {
                Ok(()) => poll,
                Err(_) => (wait * 2).clamp(poll, Duration::from_millis(limits::SHIP_BACKOFF_MS_MAX).max(poll)),
            };
            {
                let mut state = self.control.state.lock();
                state.finished = state.finished.max(requested);
                state.last = Some(outcome);
                self.control.wake.notify_all();
            }
            if stop || fenced {
                return;
            }
        }
    }

    /// Records a cycle's outcome in the status; fences the log on [`Error::Fenced`].
    fn note(&self, outcome: &Result<()>) {
        let mut status = self.control.status.lock();
        match outcome {
            Ok(()) => status.last_error = None,
            Err(error) => {
                status.failed_cycles += 1;
                status.last_error = Some(error.to_string());
                if let Error::Fenced { epoch, current } = error {
                    // IMPORTANT: from now on the store refuses appends: nothing it writes could
                    // reach the bucket, and the new owner continues the store.
                    self.shared.log.fence(*epoch, *current);
                    status.fenced = true;
                    tracing::error!(epoch, current, "the store was taken over by another owner: it is read-only now");
                } else {
                    tracing::warn!(%error, "a shipping cycle failed; it is retried");
                }
            }
        }
    }

    /// One cycle: uploads what the manifest lacks, writes the manifest if it changed (or checks
    /// that it is still ours), runs bucket retention when due.
    async fn cycle(&mut self, tail_now: bool) -> Result<()> {
        let files = self.shared.log.segment_files();
        let next = self.next_manifest(&files, tail_now).await?;
        let current = &self.owned.current.manifest;
        let changed = next.segments != current.segments
            || next.snapshots != current.snapshots
            || next.tail != current.tail
            || next.index != current.index;
        if changed {
            self.publish(next).await?;
        } else {
            self.check_still_owner().await?;
        }
        self.note_lag(&files);
        self.retention().await
    }

    /// The manifest of what is shipped once every missing object is uploaded.
    async fn next_manifest(&mut self, files: &[SegmentFile], tail_now: bool) -> Result<ShippedManifest> {
        let tail_due = match self.remote.options.ship_interval {
            Some(interval) if tail_now || Instant::now() >= self.tail_due => {
                self.tail_due = Instant::now() + interval;
                true
            }
            _ => false,
        };
        let current = &self.owned.current.manifest;
        let listed: HashMap<(u64, u32), &ShippedSegment> =
            current.segments.iter().map(|segment| ((segment.seq, segment.generation), segment)).collect();
        let mut segments = Vec::new();
        for file in files.iter().filter(|file| file.sealed) {
            match listed.get(&(file.seq, file.generation)) {
                Some(&shipped) => segments.push(shipped.clone()),
                None => segments.push(self.upload_segment(file, false).await?),
            }
        }
        let active = files.last().filter(|file| !file.sealed);
        let tail = match (active, self.remote.options.ship_interval) {
            (Some(active), Some(_)) if tail_due => {
                let shipped = current.tail.as_ref().filter(|tail| tail.seq == active.seq);
                match shipped {
                    Some(tail) if tail.next_lsn >= active.next_lsn => Some(tail.clone()),
                    _ if active.next_lsn == active.first_lsn => None,
                    _ => Some(self.upload_segment(active, true).await?),
                }
            }
            // Not due (or tail shipping off, on a store restored from a tail): the shipped tail
            // stays listed while its segment is still the active one, never dropped.
            (Some(active), _) => current.tail.clone().filter(|tail| tail.seq == active.seq),
            (None, _) => None,
        };
        let active = active.map_or((0, 0), |active| (active.seq, active.first_lsn));
        let mut next = ShippedManifest {
            segments,
            snapshots: Vec::new(),
            tail,
            active_seq: active.0,
            active_first_lsn: active.1,
            written_at_unix_us: now_us(),
            ..current.clone()
        };
        next.snapshots = self.snapshots(next.shipped_next_lsn()).await?;
        next.index = self.index(&next).await?;
        Ok(next)
    }

    /// The index snapshot to list beside `next`'s segments: the listed one while the segments
    /// below it are unchanged, replaced by one covering every shipped record once as many
    /// records came after it as the store waits for before it writes one locally (at least a
    /// quarter of those it covers), or at once when the local one covers exactly the shipped
    /// records (a close's, with tail shipping on).
    async fn index(&self, next: &ShippedManifest) -> Result<Option<ShippedIndex>> {
        let current = &self.owned.current.manifest;
        fn below(manifest: &ShippedManifest, covered: u64) -> impl Iterator<Item = &ShippedSegment> {
            manifest.segments.iter().filter(move |segment| segment.first_lsn < covered)
        }
        let until = next.shipped_next_lsn();
        // IMPORTANT: a manifest never lists an index snapshot past its records (it would not decode).
        let listed = current
            .index
            .clone()
            .filter(|index| index.covered <= until && below(current, index.covered).eq(below(next, index.covered)));
        let covered = listed.as_ref().map_or(0, |index| index.covered);
        let first = next.segments.first().or(next.tail.as_ref()).map_or(until, |segment| segment.first_lsn);
        let (after, before) = (until.saturating_sub(covered.max(first)), covered.saturating_sub(first));
        let local = self.shared.index_snapshot.covered();
        let due = after > 0 && (local == until || after >= self.shared.policies.index_snapshot_after.max(before / 4));
        if !due {
            return Ok(listed);
        }
        let shared = Arc::clone(&self.shared);
        let bytes =
            crate::ship::blocking("build an index snapshot to ship", move || shared.index_snapshot_until(until))
                .await??;
        assert_eq!(crate::store::index_snapshot::covered_by(&bytes), Some(until), "an index snapshot of other records");
        let sha256: [u8; 32] = Sha256::digest(&bytes).into();
        let key = layout::index(&self.remote.prefix, until, self.owned.claim.epoch, &sha256);
        let len = bytes.len() as u64;
        self.upload(&key, bytes).await?;
        Ok(Some(ShippedIndex { key: key.to_string(), covered: until, bytes: len, sha256: sha256.into() }))
    }

    /// The snapshot files to list: those already listed that still exist, and the new ones of
    /// atoms whose completion is below `shipped` (in a shipped segment or the tail: a restore
    /// holds it), uploaded.
    async fn snapshots(&self, shipped: u64) -> Result<Vec<ShippedSnapshot>> {
        let atoms: Vec<u64> = self.shared.snapshots.lock().iter().copied().collect();
        let ended = |atom: u64| {
            let index = self.shared.index.read();
            index.atom(crate::AtomId(atom)).map_or(0, |entry| entry.ended_lsn)
        };
        let listed: HashMap<u64, ShippedSnapshot> =
            self.owned.current.manifest.snapshots.iter().map(|shipped| (shipped.atom, shipped.clone())).collect();
        let (storage, dir) = (self.shared.log.storage(), self.shared.log.dir());
        let shipped_next = shipped;
        let mut shipped = Vec::with_capacity(atoms.len());
        for atom in atoms {
            if let Some(listed) = listed.get(&atom) {
                shipped.push(listed.clone());
                continue;
            }
            // IMPORTANT: a snapshot of an atom whose completion the bucket lacks would be
            // evidence of lost records in the restored store.
            if !(1..shipped_next).contains(&ended(atom)) {
                continue;
            }
            // A snapshot deleted since the listing, or unreadable, is not shipped.
            let Ok(bytes) = snapshot::read(storage.as_ref(), dir, atom)? else { continue };
            let sha256: [u8; 32] = Sha256::digest(&bytes).into();
            let key = layout::snapshot(&self.remote.prefix, atom, self.owned.claim.epoch, &sha256);
            self.upload(&key, bytes.clone()).await?;
            shipped.push(ShippedSnapshot {
                key: key.to_string(),
                atom,
                bytes: bytes.len() as u64,
                sha256: sha256.into(),
            });
        }
        Ok(shipped)
    }

    /// Uploads a sealed segment, compressed (or the active one's prefix, `tail`, plain: it is
    /// uploaded anew at every tail cycle): its header and frames.
    async fn upload_segment(&self, file: &SegmentFile, tail: bool) -> Result<ShippedSegment> {
        let len = usize::try_from(file.data_end).map_err(|_| Error::LimitExceeded {
            what: "bytes of a segment to ship".into(),
            limit: usize::MAX as u64,
        })?;
        let mut bytes = vec![0u8; len];
        file.file.read_exact_at(&mut bytes, 0).map_err(|e| Error::io("read a segment to ship", "", e))?;
        let header = crate::log::segment::SegmentHeader::decode(&bytes)
            .map_err(|why| Error::InvalidArgument { reason: format!("segment {} to ship: {why}", file.seq) })?;
        assert_eq!(header.seq, file.seq, "a segment file's header names another segment");
        assert_eq!(header.generation.max(1), file.generation.max(1), "a segment file holds another generation");
        let sha256: [u8; 32] = Sha256::digest(&bytes).into();
        let epoch = self.owned.claim.epoch;
        let (key, encoding, object) = if tail {
            let key = layout::tail(&self.remote.prefix, file.first_lsn, file.next_lsn, epoch, &sha256);
            (key, manifest::ENCODING_PLAIN, bytes)
        } else {
            let key = layout::segment(&self.remote.prefix, file.first_lsn, file.generation, epoch, &sha256);
            let compressed = zstd::bulk::compress(&bytes, limits::SHIP_SEGMENT_ZSTD_LEVEL)
                .map_err(|e| Error::io("compress a segment to ship", "", e))?;
            (key, manifest::ENCODING_ZSTD, compressed)
        };
        let object_bytes = object.len() as u64;
        self.upload(&key, object).await?;
        Ok(ShippedSegment {
            key: key.to_string(),
            seq: file.seq,
            first_lsn: file.first_lsn,
            next_lsn: file.next_lsn,
            generation: file.generation,
            bytes: file.data_end,
            sha256: sha256.into(),
            encoding,
            object_bytes,
        })
    }

    /// Uploads one object, never over another: an object already at the key has the same
    /// bytes (the key names their hash), uploaded by an earlier attempt.
    async fn upload(&self, key: &object_store::path::Path, bytes: Vec<u8>) -> Result<()> {
        let options = PutOptions::from(PutMode::Create);
        match self.remote.store.put_opts(key, PutPayload::from(bytes), options).await {
            Ok(_) | Err(object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. }) => {
                self.control.status.lock().uploads += 1;
                Ok(())
            }
            Err(error) => Err(manifest::remote_error("put", key.as_ref(), &error)),
        }
    }

    /// Writes `next` over the manifest this owner wrote last, by a conditional write.
    async fn publish(&mut self, next: ShippedManifest) -> Result<()> {
        let store: &dyn ObjectStore = self.remote.store.as_ref();
        let version = &self.owned.current.version;
        match manifest::write(store, &self.remote.prefix, &next, Some(version)).await? {
            Written::Done(version) => {
                let before = std::mem::replace(&mut self.owned.current, Versioned { manifest: next, version });
                self.note_dropped(&before.manifest);
                let mut status = self.control.status.lock();
                status.manifest_writes += 1;
                let manifest = &self.owned.current.manifest;
                status.shipped_segments = manifest.segments.len();
                status.shipped_snapshots = manifest.snapshots.len();
                Ok(())
            }
            Written::Refused => Err(self.fenced().await),
        }
    }

    /// Checks that the manifest is still the one this owner wrote last (a takeover changes it).
    async fn check_still_owner(&self) -> Result<()> {
        let key = layout::manifest(&self.remote.prefix);
        let ours = &self.owned.current.version;
        match self.remote.store.head(&key).await {
            Ok(meta) if meta.e_tag == ours.e_tag && meta.version == ours.version => Ok(()),
            Ok(_) | Err(object_store::Error::NotFound { .. }) => {
                // Changed: it may still be ours (a store that reports no tag); read it.
                match manifest::fetch(self.remote.store.as_ref(), &self.remote.prefix).await? {
                    Some(read)
                        if self.owned.claim.owns(&read.manifest) && read.manifest == self.owned.current.manifest =>
                    {
                        Ok(())
                    }
                    _ => Err(self.fenced().await),
                }
            }
            Err(error) => Err(manifest::remote_error("head", key.as_ref(), &error)),
        }
    }

    /// The error of an owner that lost the store, with the bucket's epoch if it can be read.
    async fn fenced(&self) -> Error {
        let current = manifest::fetch(self.remote.store.as_ref(), &self.remote.prefix)
            .await
            .ok()
            .flatten()
            .map_or(0, |read| read.manifest.epoch);
        Error::Fenced { epoch: self.owned.claim.epoch, current }
    }

    /// Notes the objects `before` listed and the current manifest does not.
    fn note_dropped(&mut self, before: &ShippedManifest) {
        let now = &self.owned.current.manifest;
        let kept: std::collections::HashSet<&str> = keys(now).collect();
        for key in keys(before).filter(|key| !kept.contains(key)) {
            self.dropped.entry(key.to_owned()).or_insert_with(Instant::now);
        }
    }

    /// Updates the lag figures from the segments as they were at the cycle's start.
    fn note_lag(&mut self, files: &[SegmentFile]) {
        let manifest = &self.owned.current.manifest;
        let shipped: std::collections::HashSet<(u64, u32)> =
            manifest.segments.iter().map(|segment| (segment.seq, segment.generation)).collect();
        let header = crate::log::segment::SEGMENT_HEADER_BYTES as u64;
        let mut lag = 0;
        for file in files {
            if file.sealed {
                if !shipped.contains(&(file.seq, file.generation)) {
                    lag += file.data_end;
                }
            } else {
                let tail = manifest.tail.as_ref().filter(|tail| tail.seq == file.seq).map_or(header, |tail| tail.bytes);
                lag += file.data_end.saturating_sub(tail);
            }
        }
        let since = match (lag, self.lag_since) {
            (0, _) => None,
            (_, Some(since)) => Some(since),
            (_, None) => Some(Instant::now()),
        };
        self.lag_since = since;
        let lag_seconds = since.map_or(0.0, |since| since.elapsed().as_secs_f64());
        let shipped_next_lsn = manifest
            .tail
            .as_ref()
            .map(|tail| tail.next_lsn)
            .or_else(|| manifest.segments.last().map(|segment| segment.next_lsn))
            .unwrap_or(0);
        let mut status = self.control.status.lock();
        status.lag_bytes = lag;
        status.lag_seconds = lag_seconds;
        status.shipped_next_lsn = shipped_next_lsn;
        let prefix = self.remote.prefix.clone();
        metrics::gauge!("continuum_ship_lag_bytes", "prefix" => prefix.clone()).set(lag as f64);
        metrics::gauge!("continuum_ship_lag_seconds", "prefix" => prefix).set(lag_seconds);
    }

    /// Bucket retention, when due: deletes the objects under the prefix that the manifest does
    /// not list, once they are older than the grace period and (if this owner's manifests
    /// dropped them) were dropped longer than the grace period ago. Runs only after a manifest
    /// of this owner's is written or checked, so never before the manifest that drops them.
    async fn retention(&mut self) -> Result<()> {
        use futures::TryStreamExt;
        let grace = self.remote.options.grace;
        let due = self.retention_ran.is_none_or(|ran| ran.elapsed() >= grace / 4);
        if !due {
            return Ok(());
        }
        self.retention_ran = Some(Instant::now());
        let listed: std::collections::HashSet<String> = keys(&self.owned.current.manifest).map(str::to_owned).collect();
        // Object stores date objects in wall-clock time.
        let now = now_us();
        let mut deleted = 0;
        for folder in layout::data_folders(&self.remote.prefix) {
            let objects: Vec<object_store::ObjectMeta> = self
                .remote
                .store
                .list(Some(&folder))
                .try_collect()
                .await
                .map_err(|error| manifest::remote_error("list", folder.as_ref(), &error))?;
            for object in objects {
                let key = object.location.to_string();
                let old = now.saturating_sub(object.last_modified.timestamp_micros().max(0) as u64)
                    >= grace.as_micros() as u64;
                let dropped_long_ago = self.dropped.get(&key).is_none_or(|at| at.elapsed() >= grace);
                if listed.contains(&key) || !old || !dropped_long_ago {
                    continue;
                }
                match self.remote.store.delete(&object.location).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {
                        self.dropped.remove(&key);
                        deleted += 1;
                    }
                    Err(error) => return Err(manifest::remote_error("delete", &key, &error)),
                }
            }
        }
        if deleted > 0 {
            self.control.status.lock().deletions += deleted;
            tracing::info!(deleted, "bucket retention deleted objects no manifest lists");
        }
        Ok(())
    }
}

/// Every object key `manifest` lists.
fn keys(manifest: &ShippedManifest) -> impl Iterator<Item = &str> {
    let segments = manifest.segments.iter().chain(manifest.tail.iter()).map(|segment| segment.key.as_str());
    let snapshots = manifest.snapshots.iter().map(|snapshot| snapshot.key.as_str());
    segments.chain(snapshots).chain(manifest.index.iter().map(|index| index.key.as_str()))
}
