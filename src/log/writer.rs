//! Group commit: appenders queue encoded batches; one of them becomes the leader, writes every
//! queued batch with one `write`, syncs once if any of them asked for `Sync`, publishes the
//! new records to readers, and acknowledges the whole group.
//!
//! Protocol (docs/ARCHITECTURE.md, "Write path"):
//! 1. An appender encodes its batch (and computes its payload CRC) outside any lock.
//! 2. Under the commit lock it waits for queue room, enqueues, and either waits on its own slot
//!    (so that an acknowledgement wakes exactly its thread) or, if no leader is active, leads.
//!    While the log's syncs are fast, a waiting appender first yields the CPU in a loop for up
//!    to [`Config::commit_spin`](crate::Config::commit_spin), checking its slot, and sleeps only
//!    after that ("Spinning waiters" in docs/ARCHITECTURE.md). A spin stops at a yield that
//!    comes back late (the CPU is busy with other work), and a stream of those holds spinning
//!    off for a while.
//!    A gathering leader (step 3) spins the same way while waiters spin.
//! 3. The leader *gathers*: if the last group synced, it waits (at most that sync's time while
//!    gathers complete their groups, half of it after one that ran out) until as many requests
//!    are queued as the last group held plus those that queued during its sync, so that
//!    appenders acknowledged together commit together again.
//! 4. It takes a group from the front of the queue (bounded in bytes, never crossing a segment
//!    boundary), assigns LSNs, seals frame headers, and releases the commit lock, so that the
//!    next group forms while it writes and syncs.
//! 5. It writes the group with one positioned write, then `fdatasync`s if any member asked for
//!    `Sync`. Rotation first syncs the full segment, then creates the next one atomically.
//! 6. It publishes the group to the segment index, hands leadership to the oldest waiter, and
//!    only then wakes its group's members. A failed write or sync poisons the log: members get
//!    the error, later appenders `Poisoned`.

use std::cell::Cell;
use std::collections::VecDeque;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard, RwLock};

use crate::config::Durability;
use crate::error::{Error, Result};
use crate::limits;
use crate::log::index::{SegmentIndex, SparseEntry};
use crate::log::manifest::{ManifestWriter, TailRecord};
use crate::log::record::EncodedBatch;
use crate::log::recovery::{self, ActiveState};
use crate::log::segment::{self, SegmentHeader};
use crate::log::tuning::OwnWork;
use crate::log::tuning::{self, SpinEnd, Spinning, gather_budget, spin_until};
use crate::log::{Lsn, LsnRange};
use crate::metrics::Metrics;
use crate::storage::Storage;

/// Where one queued request learns its outcome, or that it must lead. Each appender waits on
/// its own slot, so an acknowledgement wakes exactly the thread it is for.
struct Slot {
    state: Mutex<SlotState>,
    ready: Condvar,
    /// Set (after `state`) when the state leaves `Waiting`: what a spinning waiter polls.
    changed: AtomicBool,
}

enum SlotState {
    Waiting,
    /// The previous leader handed leadership to this request's thread.
    Lead,
    Done(Result<LsnRange>),
}

impl Slot {
    fn new() -> Arc<Self> {
        Arc::new(Self { state: Mutex::new(SlotState::Waiting), ready: Condvar::new(), changed: AtomicBool::new(false) })
    }

    /// A waiting slot: this thread's spare from its last append if nothing else holds it any
    /// more (the leader drops its copy just after answering), else a new one.
    fn take_spare() -> Arc<Self> {
        if let Some(mut slot) = SPARE_SLOT.take()
            && let Some(spare) = Arc::get_mut(&mut slot)
        {
            *spare.state.get_mut() = SlotState::Waiting;
            *spare.changed.get_mut() = false;
            return slot;
        }
        Self::new()
    }

    fn set(&self, state: SlotState) {
        *self.state.lock() = state;
        self.changed.store(true, Ordering::Release);
        self.ready.notify_one();
    }

    /// Blocks until the slot is done (returns its result) or handed leadership (returns `None`).
    /// Yields the CPU in a loop for up to `spin` first, then sleeps on the condition variable;
    /// also returns whether it slept, and whether a yield came back late ([`YIELD_SLOW`](crate::log::tuning::YIELD_SLOW): the
    /// spin then stops at once).
    fn wait(&self, spin: Duration) -> (Option<Result<LsnRange>>, Waited) {
        let mut waited = Waited::default();
        if !spin.is_zero() {
            let end = spin_until(Instant::now() + spin, || self.changed.load(Ordering::Acquire));
            waited.slow_yield = end == SpinEnd::SlowYield;
        }
        // The state is authoritative: whether the spin saw the change or gave up, the lock below
        // reads it, and a change after that wakes the condition variable.
        let mut state = self.state.lock();
        loop {
            match std::mem::replace(&mut *state, SlotState::Waiting) {
                SlotState::Waiting => {
                    waited.slept = true;
                    self.ready.wait(&mut state);
                }
                SlotState::Lead => return (None, waited),
                SlotState::Done(result) => return (Some(result), waited),
            }
        }
    }

    fn take_done(&self) -> Option<Result<LsnRange>> {
        let mut state = self.state.lock();
        match std::mem::replace(&mut *state, SlotState::Waiting) {
            SlotState::Done(result) => Some(result),
            other => {
                *state = other;
                None
            }
        }
    }
}

/// How a waiter's wait went.
#[derive(Clone, Copy, Debug, Default)]
struct Waited {
    /// It slept on its slot (the spin ran out, was off, or stopped).
    slept: bool,
    /// One of its yields was slow ([`YIELD_SLOW`](crate::log::tuning::YIELD_SLOW)), which stopped the spin.
    slow_yield: bool,
}

thread_local! {
    /// The member list of the last group this thread led, emptied, for its next group: a
    /// leader takes a group and acknowledges it on its own thread, so the list is reused
    /// rather than allocated per group (per append, for a single writer).
    static SPARE_MEMBERS: Cell<Vec<Pending>> = const { Cell::new(Vec::new()) };
    /// This thread's slot from its last append, for its next one if nothing else holds it
    /// any more: one allocation fewer per append.
    static SPARE_SLOT: Cell<Option<Arc<Slot>>> = const { Cell::new(None) };
}

/// One queued request: a batch to append, or (with `batch: None`) a request to sync.
struct Pending {
    batch: Option<EncodedBatch>,
    durability: Durability,
    /// It may use the reserve at the end of the active segment (`limits::segment_reserve_bytes`).
    reserved: bool,
    slot: Arc<Slot>,
    /// The LSNs its batch was given, once its group is written (empty for a sync request).
    lsns: LsnRange,
}

impl Pending {
    fn frame_len(&self) -> usize {
        self.batch.as_ref().map_or(0, EncodedBatch::frame_len)
    }
}

/// State shared by appenders, guarded by the commit lock.
#[derive(Default)]
struct CommitState {
    queue: VecDeque<Pending>,
    leader_active: bool,
    poisoned: Option<(&'static str, io::ErrorKind)>,
    closed: bool,
    /// A read-only log: every append and sync is refused with `Error::ReadOnly`.
    read_only: bool,
    /// A fenced log (another owner took the store over, `ship/`): every append is refused
    /// with `Error::Fenced` carrying (this owner's epoch, the bucket's).
    fenced: Option<(u64, u64)>,
    /// How many requests the next group is expected to gather: the last group's members (who
    /// are likely appending again) plus those that queued while it synced.
    expected_group: usize,
    /// How long a leader may wait for the expected group to gather ([`gather_budget`]).
    gather_budget: Duration,
    /// Whether the last gather saw its expected group queued (at once, or before its budget
    /// ran out).
    last_gather_completed: bool,
    /// Whether a leader is waiting for arrivals.
    gathering: bool,
}

/// The leader's own state: the active segment being written. Locked only by the leader.
struct LeaderState {
    active: ActiveState,
    /// Whether bytes were written since the last sync of the active segment.
    dirty: bool,
    /// Offset below which the active segment is known durable; stamped into every frame.
    synced_end: u64,
    last_indexed: Option<u64>,
    buf: Vec<u8>,
    /// How long the last group's fdatasync took, if it synced (taken by the gatherer).
    last_sync: Option<Duration>,
    /// Whether the last group synced (decides between the map and a positioned write).
    last_group_synced: bool,
    /// Offset below which every byte of the active segment has been written, with data or with
    /// zeros ahead of it ("Zeroing ahead" in docs/ARCHITECTURE.md). Never below `data_end`'s
    /// value when zeros were last written, so zeros never land on data.
    zeroed_end: u64,
    /// Whether a clean close trimmed the active segment (it is done once).
    trimmed: bool,
}

/// The group-commit writer.
pub(crate) struct Writer {
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    segment_bytes: u64,
    /// When waiters spin instead of sleeping (`log/tuning.rs`).
    spinning: Spinning,
    /// The commit queue's length, stored under the commit lock at every arrival and when a
    /// leader starts gathering: what a spinning gatherer polls without taking the lock.
    queue_len: AtomicUsize,
    commit: Mutex<CommitState>,
    /// Signalled when the queue has room.
    room: Condvar,
    /// Signalled when a request arrives while a leader is gathering.
    arrivals: Condvar,
    leader: Mutex<LeaderState>,
    index: Arc<RwLock<SegmentIndex>>,
    /// Rewritten at every rotation and at a clean close's trim.
    manifest: Arc<ManifestWriter>,
    /// Whether the active segment may hold unsynced bytes (read by the flusher).
    dirty_hint: AtomicBool,
    metrics: Arc<Metrics>,
}

/// A group taken from the queue.
struct Group {
    members: Vec<Pending>,
    rotate_first: bool,
}

impl Writer {
    #[expect(clippy::too_many_arguments, reason = "one private constructor, called once by the log")]
    pub fn new(
        storage: Arc<dyn Storage>,
        dir: PathBuf,
        segment_bytes: u64,
        commit_spin: Duration,
        active: ActiveState,
        index: Arc<RwLock<SegmentIndex>>,
        manifest: Arc<ManifestWriter>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let last_indexed = index.read().segments.last().and_then(|meta| meta.sparse.last().map(|entry| entry.offset));
        Self {
            storage,
            dir,
            segment_bytes,
            spinning: Spinning::new(commit_spin),
            queue_len: AtomicUsize::new(0),
            commit: Mutex::new(CommitState::default()),
            room: Condvar::new(),
            arrivals: Condvar::new(),
            leader: Mutex::new(LeaderState {
                // Recovered bytes may be in the page cache only (the last process was killed
                // before its flusher ran): frames claim only the header durable until the
                // first sync after open, which makes the recovered bytes durable too.
                synced_end: segment::SEGMENT_HEADER_BYTES as u64,
                // What lies past the recovered data may be only preallocated: zero from there.
                zeroed_end: active.data_end,
                active,
                dirty: true,
                last_indexed,
                buf: Vec::new(),
                last_sync: None,
                last_group_synced: false,
                trimmed: false,
            }),
            index,
            manifest,
            dirty_hint: AtomicBool::new(true),
            metrics,
        }
    }

    /// Appends one encoded batch and returns its LSNs once it is as durable as asked. A
    /// `reserved` batch may use the reserve at the end of the active segment, which other
    /// batches leave free ("A full disk" in docs/ARCHITECTURE.md).
    pub fn append(&self, batch: EncodedBatch, durability: Durability, reserved: bool) -> Result<LsnRange> {
        let mut capacity = self.segment_bytes - segment::SEGMENT_HEADER_BYTES as u64;
        if !reserved {
            capacity -= limits::segment_reserve_bytes(self.segment_bytes);
        }
        if batch.frame_len() as u64 > capacity {
            return Err(Error::RecordTooLarge { bytes: batch.frame_len() as u64, max: capacity });
        }
        let timed = self.metrics.times_append(durability).then(Instant::now);
        let result = self.submit(Some(batch), durability, reserved);
        match &result {
            Ok(_) => {
                if let Some(started) = timed {
                    self.metrics.record_append(durability, started.elapsed());
                }
            }
            Err(error) => self.metrics.record_error(error),
        }
        result
    }

    /// Makes every acknowledged append durable.
    pub fn sync(&self) -> Result<()> {
        let result = self.submit(None, Durability::Sync, false).map(|_| ());
        if let Err(error) = &result {
            self.metrics.record_error(error);
        }
        result
    }

    /// Whether unsynced bytes may exist (for the background flusher).
    pub fn is_dirty(&self) -> bool {
        self.dirty_hint.load(Ordering::Acquire)
    }

    /// Refuses every append and sync from now on with `Error::ReadOnly`.
    pub fn refuse_writes(&self) {
        self.commit.lock().read_only = true;
    }

    /// Refuses every append from now on with `Error::Fenced { epoch, current }`: another
    /// owner took the store over.
    #[cfg(feature = "object-store")]
    pub fn fence(&self, epoch: u64, current: u64) {
        self.commit.lock().fenced.get_or_insert((epoch, current));
        self.room.notify_all();
    }

    /// Whether the writer takes appends (`Error::ReadOnly` if it never will).
    pub fn check_writable(&self) -> Result<()> {
        let commit = self.commit.lock();
        if commit.read_only {
            return Err(Error::ReadOnly);
        }
        match commit.fenced {
            Some((epoch, current)) => Err(Error::Fenced { epoch, current }),
            None => Ok(()),
        }
    }

    /// Refuses every later append.
    pub fn close(&self) {
        self.commit.lock().closed = true;
        self.room.notify_all();
    }

    fn submit(&self, batch: Option<EncodedBatch>, durability: Durability, reserved: bool) -> Result<LsnRange> {
        let slot = Slot::take_spare();
        let result = self.submit_on(&slot, batch, durability, reserved);
        SPARE_SLOT.set(Some(slot));
        result
    }

    /// [`Writer::submit`], answered on `slot`.
    fn submit_on(
        &self,
        slot: &Arc<Slot>,
        batch: Option<EncodedBatch>,
        durability: Durability,
        reserved: bool,
    ) -> Result<LsnRange> {
        let mut commit = self.commit.lock();
        loop {
            Self::check_open(&commit)?;
            if commit.queue.len() < limits::COMMIT_QUEUE_DEPTH_MAX {
                break;
            }
            self.room.wait(&mut commit);
        }
        commit.queue.push_back(Pending {
            batch,
            durability,
            reserved,
            slot: Arc::clone(slot),
            lsns: LsnRange::empty(),
        });
        self.queue_len.store(commit.queue.len(), Ordering::Release);
        // The gathering leader wakes once, when its group is complete, not at every arrival.
        if commit.gathering && commit.queue.len() >= commit.expected_group {
            self.arrivals.notify_one();
        }
        let lead_now = !commit.leader_active;
        commit.leader_active = true;
        let commit = if lead_now {
            commit
        } else {
            drop(commit);
            let (answer, waited) = slot.wait(self.spinning.spin_now());
            if waited.slow_yield {
                self.metrics.record_slow_yield(self.spinning.note_slow_yield());
            }
            self.metrics.record_commit_wait(waited.slept);
            if let Some(result) = answer {
                return result;
            }
            // Handed leadership.
            self.commit.lock()
        };
        self.lead(commit, slot);
        slot.take_done().expect("the leader leads until its own slot is filled")
    }

    /// Marks CPU work of the store's own background thread (policy snapshots, dictionary
    /// training) until the returned guard drops ([`OwnWork`]).
    pub(crate) fn own_work(&self) -> OwnWork<'_> {
        self.spinning.own_work()
    }

    fn check_open(commit: &CommitState) -> Result<()> {
        if commit.read_only {
            return Err(Error::ReadOnly);
        }
        if let Some((epoch, current)) = commit.fenced {
            return Err(Error::Fenced { epoch, current });
        }
        if commit.closed {
            return Err(Error::Closed);
        }
        if let Some((op, kind)) = commit.poisoned {
            return Err(Error::Poisoned { op, kind });
        }
        Ok(())
    }

    /// Commits groups until the one holding `own` is done, then hands leadership on and
    /// acknowledges that last group. Takes the commit lock and releases it.
    fn lead<'a>(&'a self, mut commit: MutexGuard<'a, CommitState>, own: &Arc<Slot>) {
        loop {
            self.gather(&mut commit);
            let mut leader = self.leader.lock();
            let mut group = Self::take_group(&mut commit, &leader);
            let refused = Self::check_open(&commit).err();
            let outcome = MutexGuard::unlocked(&mut commit, || match refused {
                Some(error) => Err(GroupError { error, poisons: false }),
                None => self.commit_group(&mut leader, &mut group),
            });
            let last_sync = leader.last_sync.take();
            drop(leader);
            if let Some(sync) = last_sync {
                self.spinning.after_sync(sync);
            }
            commit.expected_group = group.members.len() + commit.queue.len();
            commit.gather_budget =
                last_sync.map_or(Duration::ZERO, |sync| gather_budget(sync, commit.last_gather_completed));
            if let Err(GroupError { error, poisons: true }) = &outcome {
                let kind = error.io_kind().unwrap_or(io::ErrorKind::Other);
                if commit.poisoned.is_none() {
                    tracing::error!(op = error_op(error), ?kind, %error, "the log is poisoned: appends fail until it is reopened");
                }
                commit.poisoned.get_or_insert((error_op(error), kind));
            }
            self.room.notify_all();
            let own_group = group.members.iter().any(|member| Arc::ptr_eq(&member.slot, own));
            if own_group {
                // Hand leadership on before waking this group's members, so that the next
                // group's write and sync overlap with those wake-ups.
                match commit.queue.front() {
                    Some(next) => next.slot.set(SlotState::Lead),
                    None => commit.leader_active = false,
                }
            }
            drop(commit);
            Self::acknowledge(group, outcome.map_err(|failure| failure.error));
            if own_group {
                return;
            }
            commit = self.commit.lock();
        }
    }

    /// Waits, at most the gather budget, until as many requests are queued as the next group is
    /// expected to hold. Concurrent appenders acknowledged together come back together; without
    /// this they split into two cohorts that alternate, each syncing half as many appends.
    /// While waiters spin, the leader spins too (yielding, without the commit lock).
    fn gather(&self, commit: &mut MutexGuard<'_, CommitState>) {
        let target = commit.expected_group.min(limits::COMMIT_QUEUE_DEPTH_MAX);
        if commit.queue.len() >= target {
            commit.last_gather_completed = true;
            return;
        }
        if commit.gather_budget.is_zero() || !tuning::gathers() {
            return;
        }
        let deadline = Instant::now() + commit.gather_budget;
        if !self.spinning.spin_now().is_zero() {
            // Only a leader takes requests from the queue, so its length only grows meanwhile.
            self.queue_len.store(commit.queue.len(), Ordering::Release);
            MutexGuard::unlocked(commit, || {
                if spin_until(deadline, || self.queue_len.load(Ordering::Acquire) >= target) == SpinEnd::SlowYield {
                    self.metrics.record_slow_yield(self.spinning.note_slow_yield());
                }
            });
            commit.last_gather_completed = commit.queue.len() >= target;
            return;
        }
        commit.gathering = true;
        while commit.queue.len() < target && !commit.closed {
            if self.arrivals.wait_until(commit, deadline).timed_out() {
                break;
            }
        }
        commit.gathering = false;
        commit.last_gather_completed = commit.queue.len() >= target;
    }

    /// Takes the next group from the front of the queue: as many members as fit in the active
    /// segment and in one write; a member that may not use the segment's reserve must fit
    /// before it.
    fn take_group(commit: &mut CommitState, leader: &LeaderState) -> Group {
        let segment_bytes = leader.active.header.segment_bytes;
        let room = segment_bytes.saturating_sub(leader.active.data_end);
        let reserve = limits::segment_reserve_bytes(segment_bytes);
        let mut members = SPARE_MEMBERS.take();
        debug_assert!(members.is_empty());
        let mut bytes = 0u64;
        while let Some(next) = commit.queue.front() {
            let frame_len = next.frame_len() as u64;
            let held_back = if next.reserved { 0 } else { reserve };
            let fits_segment = bytes + frame_len <= room.saturating_sub(held_back);
            // A frame larger than a group's bytes goes alone, in the segment it fits in.
            let fits_group = bytes + frame_len <= limits::COMMIT_GROUP_BYTES_MAX as u64 || members.is_empty();
            if !fits_segment || !fits_group {
                break;
            }
            bytes += frame_len;
            members.push(commit.queue.pop_front().expect("front() was Some"));
        }
        let rotate_first = members.is_empty();
        if rotate_first {
            // The head does not fit in what is left of the segment: it opens the next one.
            members.push(commit.queue.pop_front().expect("the leader's own request is queued"));
        }
        Group { members, rotate_first }
    }

    /// Writes, syncs and publishes one group; gives each batch member its LSN range.
    fn commit_group(&self, leader: &mut LeaderState, group: &mut Group) -> Result<(), GroupError> {
        if group.rotate_first {
            self.rotate(leader)?;
        }
        let write_start = leader.active.data_end;
        // A frame claims durability only for bytes before it (recovery's rule 4).
        assert!(
            leader.synced_end <= write_start,
            "synced end {} past the write start {write_start}",
            leader.synced_end
        );
        let salt = leader.active.header.salt();
        let synced_through = u32::try_from(leader.synced_end).expect("segments are at most SEGMENT_BYTES_MAX < 4 GiB");
        let mut next_lsn = leader.active.next_lsn;
        let first_lsn = leader.active.next_lsn;
        let mut new_sparse = Vec::new();
        let mut need_sync = false;
        let mut batches = 0;
        leader.buf.clear();
        for member in &mut group.members {
            need_sync |= member.durability == Durability::Sync;
            let Some(batch) = &mut member.batch else { continue };
            batches += 1;
            let offset = write_start + leader.buf.len() as u64;
            if leader.last_indexed.is_none_or(|at| offset - at >= limits::SPARSE_INDEX_STRIDE_BYTES) {
                new_sparse.push(SparseEntry { lsn: next_lsn, offset });
                leader.last_indexed = Some(offset);
            }
            leader.buf.extend_from_slice(batch.seal(next_lsn, salt, synced_through));
            member.lsns = LsnRange::new(Lsn::new(next_lsn), batch.record_count());
            next_lsn += u64::from(batch.record_count());
        }
        // A group never runs past its segment: `gather` rotates first when it would.
        assert!(
            write_start + leader.buf.len() as u64 <= leader.active.header.segment_bytes,
            "a group of {} bytes at {write_start} runs past its segment",
            leader.buf.len()
        );
        self.write_buffer(leader, write_start, need_sync).map_err(GroupError::poisoning)?;
        leader.last_group_synced = need_sync;
        // After a failed sync below these stay ahead of what is published; the log is poisoned
        // then, so nothing is ever written after them.
        leader.active.data_end = write_start + leader.buf.len() as u64;
        leader.active.next_lsn = next_lsn;
        if need_sync {
            if tuning::zeroes_ahead() {
                Self::zero_ahead(leader).map_err(GroupError::poisoning)?;
            }
            leader.last_sync = self.sync_active(leader).map_err(GroupError::poisoning)?;
        }
        self.publish(leader, new_sparse);
        let records = next_lsn - first_lsn;
        self.metrics.record_group(batches, records, leader.buf.len() as u64);
        Ok(())
    }

    /// Writes the leader's buffer at `write_start`. During a run of groups that do not sync,
    /// groups are copied through the segment's writable map when there is one (no system
    /// call; 2–3× the throughput of `write` for small appends). A group about to `fdatasync`
    /// uses a positioned write, because syncing pages dirtied through a map costs about twice
    /// as much here; so does the first unsynced group after a sync, since an `fdatasync`
    /// write-protects the mapped pages again and the next copy would fault on them.
    fn write_buffer(&self, leader: &mut LeaderState, write_start: u64, need_sync: bool) -> Result<()> {
        if leader.buf.is_empty() {
            return Ok(());
        }
        debug_assert!(write_start + leader.buf.len() as u64 <= leader.active.header.segment_bytes);
        leader.dirty = true;
        self.dirty_hint.store(true, Ordering::Release);
        // Through the map, the OS has the bytes once the copy is done; past its end (a segment
        // file shorter than its header says), a positioned write does the same.
        let streak = !need_sync && !leader.last_group_synced && tuning::maps_writes();
        let LeaderState { active, buf, .. } = leader;
        if streak && active.map.as_mut().is_some_and(|map| map.write_at(buf, write_start)) {
            return Ok(());
        }
        active.file.write_all_at(buf, write_start).map_err(|e| Error::io("write", &active.path, e))
    }

    /// Before a sync, writes the next chunk of zeros past the data if the data has come within
    /// [`limits::ZERO_AHEAD_MARGIN_BYTES`] of the zeroed space. A segment is preallocated with
    /// `fallocate`, whose extents ext4 (and XFS) mark unwritten: an `fdatasync` covering the first
    /// write into such an extent must also commit the file system's journal to convert it, which
    /// took a 16-append group's sync from about 95 to 155 µs here. Zeroing a chunk at a time
    /// pays that conversion once per chunk instead of once per sync.
    ///
    /// A failed zero write fails the group like a failed data write: it poisons the log.
    fn zero_ahead(leader: &mut LeaderState) -> Result<()> {
        static ZEROS: [u8; limits::ZERO_AHEAD_CHUNK_BYTES] = [0; limits::ZERO_AHEAD_CHUNK_BYTES];
        let data_end = leader.active.data_end;
        let segment_end = leader.active.header.segment_bytes;
        // IMPORTANT: zeros start at or past the end of the data, never on a written frame.
        let start = leader.zeroed_end.max(data_end);
        if start >= segment_end || data_end + limits::ZERO_AHEAD_MARGIN_BYTES <= leader.zeroed_end {
            return Ok(());
        }
        let len = (segment_end - start).min(ZEROS.len() as u64);
        let zeros = &ZEROS[..usize::try_from(len).expect("at most one chunk")];
        let active = &leader.active;
        active.file.write_all_at(zeros, start).map_err(|e| Error::io("write", &active.path, e))?;
        leader.zeroed_end = start + len;
        Ok(())
    }

    /// `fdatasync`s the active segment if it holds unsynced bytes; returns how long that took
    /// (`None` if there was nothing to sync).
    fn sync_active(&self, leader: &mut LeaderState) -> Result<Option<Duration>> {
        if !leader.dirty {
            return Ok(None);
        }
        let started = Instant::now();
        // IMPORTANT: acknowledging a Sync append depends on this fdatasync returning Ok.
        leader.active.file.sync_data().map_err(|e| Error::io("fdatasync", &leader.active.path, e))?;
        let took = started.elapsed();
        self.metrics.record_fdatasync(took);
        leader.dirty = false;
        leader.synced_end = leader.active.data_end;
        self.dirty_hint.store(false, Ordering::Release);
        Ok(Some(took))
    }

    /// Makes the active segment's new bytes visible to readers.
    fn publish(&self, leader: &LeaderState, new_sparse: Vec<SparseEntry>) {
        let mut index = self.index.write();
        let meta = index.segments.last_mut().expect("the index always holds the active segment");
        assert_eq!(meta.seq, leader.active.header.seq, "the index's last segment is the active one");
        // Readers rely on a published end that only grows, in bytes and in LSNs.
        assert!(meta.data_end <= leader.active.data_end && meta.next_lsn <= leader.active.next_lsn);
        meta.data_end = leader.active.data_end;
        meta.next_lsn = leader.active.next_lsn;
        if !new_sparse.is_empty() {
            Arc::make_mut(&mut meta.sparse).extend(new_sparse);
        }
    }

    /// Seals the active segment and starts the next one.
    fn rotate(&self, leader: &mut LeaderState) -> Result<(), GroupError> {
        // IMPORTANT: the next segment's records depend on every byte of this one being durable.
        self.sync_active(leader).map_err(GroupError::poisoning)?;
        let header = SegmentHeader {
            seq: leader.active.header.seq + 1,
            first_lsn: leader.active.next_lsn,
            segment_bytes: self.segment_bytes,
            store_id: leader.active.header.store_id,
            end_lsn: 0,
            compressed: false,
            generation: segment::GENERATION_WRITER,
        };
        let created = segment::create(self.storage.as_ref(), &self.dir, header).map_err(|error| {
            // Running out of space before the new segment is published changes nothing on disk.
            let poisons = !matches!(error, Error::NoSpace { .. }) || created_published(&error);
            GroupError { error, poisons }
        })?;
        leader.active = ActiveState::new(
            header,
            created.path,
            created.file,
            segment::SEGMENT_HEADER_BYTES as u64,
            header.first_lsn,
        );
        leader.last_indexed = None;
        leader.synced_end = segment::SEGMENT_HEADER_BYTES as u64;
        leader.zeroed_end = leader.synced_end;
        let mut index = self.index.write();
        index.segments.push(recovery::active_meta(&leader.active, Vec::new(), Vec::new()));
        drop(index);
        // IMPORTANT: before any record is written to the new segment, the manifest lists it, so
        // that its loss (and the sealed segment's end) is evidence an open finds.
        let tail = TailRecord { seq: header.seq, next_lsn: header.first_lsn, trimmed_bytes: 0 };
        self.manifest.publish(&self.index, Some(tail)).map_err(GroupError::poisoning)?;
        self.metrics.record_rotation();
        tracing::debug!(seq = header.seq, first_lsn = header.first_lsn, path = %leader.active.path.display(), "segment rotated");
        Ok(())
    }

    /// After the final sync of a clean close: cuts the active segment's file to its data, once
    /// the manifest records that length (so that the next open tells the trimmed file from a
    /// truncated one). Does nothing on a read-only or poisoned log, or with unsynced bytes.
    ///
    /// # Errors
    /// The manifest write's or the truncation's; the file is left as long as it was or cut.
    pub fn trim_on_close(&self) -> Result<()> {
        {
            let commit = self.commit.lock();
            if commit.read_only || commit.poisoned.is_some() {
                return Ok(());
            }
        }
        let mut leader = self.leader.lock();
        if leader.trimmed || leader.dirty {
            return Ok(());
        }
        leader.trimmed = true;
        let active = &leader.active;
        let file_bytes = active.file.len().map_err(|e| Error::io("stat", &active.path, e))?;
        if file_bytes <= active.data_end {
            return Ok(());
        }
        let tail = TailRecord { seq: active.header.seq, next_lsn: active.next_lsn, trimmed_bytes: active.data_end };
        // IMPORTANT: the manifest records the trimmed length before the file is that short.
        self.manifest.publish(&self.index, Some(tail))?;
        active.file.set_len(active.data_end).map_err(|e| Error::io("truncate", &active.path, e))?;
        active.file.sync_data().map_err(|e| Error::io("fdatasync", &active.path, e))
    }

    fn acknowledge(group: Group, outcome: Result<()>) {
        let mut members = group.members;
        match outcome {
            Ok(()) => {
                for member in members.drain(..) {
                    member.slot.set(SlotState::Done(Ok(member.lsns)));
                }
            }
            Err(error) => {
                for member in members.drain(..) {
                    member.slot.set(SlotState::Done(Err(error.replicate())));
                }
            }
        }
        SPARE_MEMBERS.set(members);
    }
}

/// A failed group: the error and whether it poisons the log.
struct GroupError {
    error: Error,
    poisons: bool,
}

impl GroupError {
    fn poisoning(error: Error) -> Self {
        Self { error, poisons: true }
    }
}

impl From<GroupError> for Error {
    fn from(failure: GroupError) -> Self {
        failure.error
    }
}

/// Whether a failed segment creation got as far as publishing the file (rename or directory
/// sync failed), after which the directory's state is uncertain.
fn created_published(error: &Error) -> bool {
    matches!(error, Error::NoSpace { op: "rename" | "sync directory", .. })
}

fn error_op(error: &Error) -> &'static str {
    match error {
        Error::Io { op, .. } | Error::NoSpace { op, .. } => op,
        _ => "write",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gather_records_whether_its_expected_group_came() {
        let log = sim_log("/gather", 3);
        let writer = &log.inner.writer;
        let request = || Pending {
            batch: None,
            durability: Durability::Sync,
            reserved: false,
            slot: Slot::new(),
            lsns: LsnRange::empty(),
        };
        let mut commit = writer.commit.lock();
        commit.queue.extend([request(), request()]);
        (commit.expected_group, commit.gather_budget) = (2, Duration::from_millis(1));
        writer.gather(&mut commit);
        assert!(commit.last_gather_completed, "the expected group was queued already");
        // Two of three expected: the gather waits its budget out (spinning or not) and says so.
        commit.expected_group = 3;
        for spin in [true, false] {
            writer.spinning.set_spin(if spin { Duration::from_millis(1) } else { Duration::ZERO });
            commit.last_gather_completed = true;
            writer.gather(&mut commit);
            assert!(!commit.last_gather_completed, "spinning: {spin}");
        }
        commit.queue.push_back(request());
        writer.gather(&mut commit);
        assert!(commit.last_gather_completed);
        commit.queue.clear();
    }

    /// A log at `dir` on simulated storage (seeded `seed`), whose writer the spin tests drive.
    fn sim_log(dir: &str, seed: u64) -> crate::Log {
        crate::Log::builder(std::path::Path::new(dir))
            .storage(Arc::new(crate::storage::sim::SimStorage::new(seed)))
            .open()
            .expect("open")
    }
}
