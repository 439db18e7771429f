//! [`Metrics`]: counters and latency histograms owned by the [`Log`](crate::Log), observed,
//! never consulted. `log.metrics()` and `store.metrics()` return a [`MetricsSnapshot`].
//!
//! Cheap enough to be always on (`docs/BENCHMARKS.md` §9): counters are relaxed atomics;
//! histograms are fixed arrays of atomic buckets, four per power of two (so a percentile read
//! from them is at most 25% above the true value, and never above the exact maximum). The
//! group-commit leader, which holds the leader lock, updates its own counters with plain
//! loads and stores rather than read-modify-write instructions. Appends that do not sync are
//! timed one in [`UNSYNCED_SAMPLE_EVERY`], since reading the clock twice would cost several
//! percent of a one-microsecond append; their counts are exact.
//!
//! No global registry: each log has its own. To export them, poll `metrics()` and print or
//! serve [`MetricsSnapshot::to_prometheus`] (see `examples/metrics.rs`).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::config::Durability;
use crate::error::Error;

/// Appends that do not sync are timed once in this many (by batch count).
pub const UNSYNCED_SAMPLE_EVERY: u64 = 64;

/// Buckets of one histogram: values 0..4 exactly, then four per power of two up to 2^64.
const BUCKETS: usize = 4 + 62 * 4;

/// Kinds of errors counted by [`Metrics`]; the order of [`MetricsSnapshot::errors`].
pub const ERROR_KINDS: [&str; 7] = ["io", "no_space", "corruption", "poisoned", "codec", "closed", "other"];

/// A histogram of `u64` values in fixed logarithmic buckets.
pub(crate) struct Histogram {
    buckets: [AtomicU64; BUCKETS],
    count: AtomicU64,
    sum: AtomicU64,
    max: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            count: AtomicU64::new(0),
            sum: AtomicU64::new(0),
            max: AtomicU64::new(0),
        }
    }
}

/// The bucket of `value`.
fn bucket_of(value: u64) -> usize {
    if value < 4 {
        return value as usize;
    }
    let exponent = 63 - value.leading_zeros() as usize;
    let sub = ((value >> (exponent - 2)) & 3) as usize;
    4 + (exponent - 2) * 4 + sub
}

/// The largest value that falls in `bucket`.
fn bucket_high(bucket: usize) -> u64 {
    if bucket < 4 {
        return bucket as u64;
    }
    let exponent = (bucket - 4) / 4 + 2;
    let sub = ((bucket - 4) % 4) as u64;
    let next_low = (5 + sub).checked_shl(exponent as u32 - 2).filter(|v| v >> (exponent - 2) == 5 + sub);
    next_low.map_or(u64::MAX, |low| low - 1)
}

impl Histogram {
    /// Records one value (any thread).
    pub fn record(&self, value: u64) {
        self.buckets[bucket_of(value)].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(value, Ordering::Relaxed);
        self.max.fetch_max(value, Ordering::Relaxed);
    }

    /// Records one value with plain loads and stores: only for a histogram that a single thread
    /// at a time updates (under a lock the caller holds).
    pub fn record_exclusive(&self, value: u64) {
        bump(&self.buckets[bucket_of(value)], 1);
        bump(&self.count, 1);
        bump(&self.sum, value);
        if value > self.max.load(Ordering::Relaxed) {
            self.max.store(value, Ordering::Relaxed);
        }
    }

    fn snapshot(&self) -> HistogramSnapshot {
        let buckets: Vec<u64> = self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).collect();
        let count: u64 = buckets.iter().sum();
        let max = self.max.load(Ordering::Relaxed);
        let quantile = |q: f64| {
            if count == 0 {
                return 0;
            }
            let rank = ((q * count as f64).ceil() as u64).clamp(1, count);
            let mut seen = 0;
            for (bucket, n) in buckets.iter().enumerate() {
                seen += n;
                if seen >= rank {
                    return bucket_high(bucket).min(max);
                }
            }
            max
        };
        HistogramSnapshot {
            count: self.count.load(Ordering::Relaxed),
            sum: self.sum.load(Ordering::Relaxed),
            p50: quantile(0.50),
            p99: quantile(0.99),
            max,
        }
    }
}

/// Adds `n` with a plain load and store (single writer; see [`Histogram::record_exclusive`]).
fn bump(counter: &AtomicU64, n: u64) {
    counter.store(counter.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

fn load(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

/// A duration in whole nanoseconds, saturating at `u64::MAX` (584 years).
pub(crate) fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// The live counters of one log (and the store on it).
pub struct Metrics {
    /// Whether appends are counted and timed (a hidden switch for measuring the cost).
    enabled: AtomicBool,
    // Written by the group-commit leader only (plain stores).
    records: AtomicU64,
    record_bytes: AtomicU64,
    batches: AtomicU64,
    groups: AtomicU64,
    group_batches: Histogram,
    fdatasyncs: AtomicU64,
    fdatasync_ns: Histogram,
    rotations: AtomicU64,
    // Written by appending threads.
    append_ns: [Histogram; 3],
    commit_waits: AtomicU64,
    commit_wait_sleeps: AtomicU64,
    commit_spin_hold_offs: AtomicU64,
    commit_spin_slow_yields: AtomicU64,
    // Store-level, written by any thread.
    snapshot_writes: AtomicU64,
    snapshot_bytes: AtomicU64,
    snapshot_write_ns: Histogram,
    snapshot_fallbacks: AtomicU64,
    policy_snapshot_failures: AtomicU64,
    maintenance_failures: AtomicU64,
    rebuild_targeted_scans: AtomicU64,
    rebuild_scan_fallbacks: AtomicU64,
    rebuild_shared_scans: AtomicU64,
    snapshot_lull_wait_ns: Histogram,
    snapshot_lull_timeouts: AtomicU64,
    index_rebuilds: AtomicU64,
    index_rebuild_atoms: AtomicU64,
    time_to_resume_ns: AtomicU64,
    context_rebuilds: AtomicU64,
    context_rebuild_atoms: AtomicU64,
    context_rebuild_ns: Histogram,
    atoms_skipped: AtomicU64,
    compactions: AtomicU64,
    compaction_bytes_read: AtomicU64,
    compaction_bytes_written: AtomicU64,
    compaction_bytes_reclaimed: AtomicU64,
    recovery_torn_tails: AtomicU64,
    recovery_skipped_ranges: AtomicU64,
    errors: [AtomicU64; ERROR_KINDS.len()],
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").field("enabled", &self.enabled()).finish_non_exhaustive()
    }
}

impl Metrics {
    /// Counters that count.
    pub(crate) fn new(enabled: bool) -> Self {
        Self {
            enabled: AtomicBool::new(enabled),
            records: AtomicU64::new(0),
            record_bytes: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            groups: AtomicU64::new(0),
            group_batches: Histogram::default(),
            fdatasyncs: AtomicU64::new(0),
            fdatasync_ns: Histogram::default(),
            rotations: AtomicU64::new(0),
            append_ns: std::array::from_fn(|_| Histogram::default()),
            commit_waits: AtomicU64::new(0),
            commit_wait_sleeps: AtomicU64::new(0),
            commit_spin_hold_offs: AtomicU64::new(0),
            commit_spin_slow_yields: AtomicU64::new(0),
            snapshot_writes: AtomicU64::new(0),
            snapshot_bytes: AtomicU64::new(0),
            snapshot_write_ns: Histogram::default(),
            snapshot_fallbacks: AtomicU64::new(0),
            policy_snapshot_failures: AtomicU64::new(0),
            maintenance_failures: AtomicU64::new(0),
            rebuild_targeted_scans: AtomicU64::new(0),
            rebuild_scan_fallbacks: AtomicU64::new(0),
            rebuild_shared_scans: AtomicU64::new(0),
            snapshot_lull_wait_ns: Histogram::default(),
            snapshot_lull_timeouts: AtomicU64::new(0),
            index_rebuilds: AtomicU64::new(0),
            index_rebuild_atoms: AtomicU64::new(0),
            time_to_resume_ns: AtomicU64::new(0),
            context_rebuilds: AtomicU64::new(0),
            context_rebuild_atoms: AtomicU64::new(0),
            context_rebuild_ns: Histogram::default(),
            atoms_skipped: AtomicU64::new(0),
            compactions: AtomicU64::new(0),
            compaction_bytes_read: AtomicU64::new(0),
            compaction_bytes_written: AtomicU64::new(0),
            compaction_bytes_reclaimed: AtomicU64::new(0),
            recovery_torn_tails: AtomicU64::new(0),
            recovery_skipped_ranges: AtomicU64::new(0),
            errors: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Turns the append-path metrics on or off.
    pub(crate) fn set_enabled(&self, enabled: bool) {
        self.enabled.store(enabled, Ordering::Relaxed);
    }

    /// Whether an append that will not sync should be timed (one in
    /// [`UNSYNCED_SAMPLE_EVERY`]; every `Sync` append is).
    #[inline]
    pub(crate) fn times_append(&self, durability: Durability) -> bool {
        self.enabled() && (durability == Durability::Sync || load(&self.batches).is_multiple_of(UNSYNCED_SAMPLE_EVERY))
    }

    /// One append's latency, from its call to its acknowledgement.
    pub(crate) fn record_append(&self, durability: Durability, latency: Duration) {
        self.append_ns[durability_index(durability)].record(nanos(latency));
    }

    /// One committed group (leader only, under the leader lock).
    pub(crate) fn record_group(&self, batches: u64, records: u64, bytes: u64) {
        if !self.enabled() {
            return;
        }
        bump(&self.groups, 1);
        bump(&self.batches, batches);
        bump(&self.records, records);
        bump(&self.record_bytes, bytes);
        self.group_batches.record_exclusive(batches);
    }

    /// One `fdatasync` of a segment (leader only).
    pub(crate) fn record_fdatasync(&self, latency: Duration) {
        if self.enabled() {
            bump(&self.fdatasyncs, 1);
            self.fdatasync_ns.record_exclusive(nanos(latency));
        }
    }

    /// One segment rotation (leader only).
    pub(crate) fn record_rotation(&self) {
        if self.enabled() {
            bump(&self.rotations, 1);
        }
    }

    /// One appender's wait for a group-commit leader to answer it, and whether it had to sleep
    /// (its spin ran out, or spinning was off) instead of seeing the answer while spinning.
    pub(crate) fn record_commit_wait(&self, slept: bool) {
        if self.enabled() {
            add(&self.commit_waits, 1);
            if slept {
                add(&self.commit_wait_sleeps, 1);
            }
        }
    }

    /// A spin stopped because a yield came back late; `held_off`: it also held spinning off.
    pub(crate) fn record_slow_yield(&self, held_off: bool) {
        add(&self.commit_spin_slow_yields, 1);
        if held_off {
            add(&self.commit_spin_hold_offs, 1);
        }
    }

    /// What recovery found on open.
    pub(crate) fn record_recovery(&self, torn_tails: u64, skipped_ranges: u64) {
        add(&self.recovery_torn_tails, torn_tails);
        add(&self.recovery_skipped_ranges, skipped_ranges);
    }

    /// One snapshot file written.
    pub(crate) fn record_snapshot_write(&self, bytes: u64, latency: Duration) {
        add(&self.snapshot_writes, 1);
        add(&self.snapshot_bytes, bytes);
        self.snapshot_write_ns.record(nanos(latency));
    }

    /// Snapshots a context rebuild could not use.
    pub(crate) fn record_snapshot_fallbacks(&self, count: u64) {
        add(&self.snapshot_fallbacks, count);
    }

    /// A policy snapshot failed; its error reached no caller.
    pub(crate) fn record_policy_snapshot_failure(&self) {
        add(&self.policy_snapshot_failures, 1);
    }

    /// A compaction round of the background thread, an index checkpoint written by the store
    /// on its own, or a trained dictionary's record failed; its error reached no caller.
    pub(crate) fn record_maintenance_failure(&self) {
        add(&self.maintenance_failures, 1);
    }

    /// A rebuild read its run's records at the LSNs its index holds for them; `fell_back`: the
    /// log did not hold them all there, and it scanned the whole range instead.
    pub(crate) fn record_targeted_scan(&self, fell_back: bool) {
        add(&self.rebuild_targeted_scans, 1);
        if fell_back {
            add(&self.rebuild_scan_fallbacks, 1);
        }
    }

    /// `rebuilds` rebuilds (a round of policy snapshots, or `rebuild_contexts`) read the log
    /// in one shared pass.
    pub(crate) fn record_shared_scan(&self, rebuilds: u64) {
        add(&self.rebuild_shared_scans, rebuilds);
    }

    /// The background thread waited `waited` for a lull in the appends before writing policy
    /// snapshots; `timed_out`: it gave up at its limit and wrote them anyway.
    pub(crate) fn record_snapshot_lull_wait(&self, waited: Duration, timed_out: bool) {
        self.snapshot_lull_wait_ns.record(nanos(waited));
        if timed_out {
            add(&self.snapshot_lull_timeouts, 1);
        }
    }

    /// The store index rebuilt on open: atoms indexed, and the time from the start of the
    /// log's recovery to a usable store.
    pub(crate) fn record_index_rebuild(&self, atoms: u64, time_to_resume: Duration) {
        add(&self.index_rebuilds, 1);
        add(&self.index_rebuild_atoms, atoms);
        self.time_to_resume_ns.store(nanos(time_to_resume), Ordering::Relaxed);
    }

    /// One context rebuild: deltas applied, and how long it took.
    pub(crate) fn record_context_rebuild(&self, atoms_applied: u64, latency: Duration) {
        add(&self.context_rebuilds, 1);
        add(&self.context_rebuild_atoms, atoms_applied);
        self.context_rebuild_ns.record(nanos(latency));
    }

    /// An `execute` that returned a recorded output instead of running a completed atom again.
    pub(crate) fn record_atom_skipped(&self) {
        add(&self.atoms_skipped, 1);
    }

    /// One compaction run: bytes it read, wrote, and gave back to the file system.
    pub(crate) fn record_compaction(&self, bytes_read: u64, bytes_written: u64, bytes_reclaimed: u64) {
        add(&self.compactions, 1);
        add(&self.compaction_bytes_read, bytes_read);
        add(&self.compaction_bytes_written, bytes_written);
        add(&self.compaction_bytes_reclaimed, bytes_reclaimed);
    }

    /// An error returned to a caller, counted by kind.
    pub(crate) fn record_error(&self, error: &Error) {
        add(&self.errors[error_kind_index(error)], 1);
    }

    /// A consistent-enough copy of every counter (each one is read atomically; the set is not
    /// one atomic snapshot).
    pub fn snapshot(&self) -> MetricsSnapshot {
        let append = |d: Durability| self.append_ns[durability_index(d)].snapshot();
        MetricsSnapshot {
            enabled: self.enabled(),
            records: load(&self.records),
            record_bytes: load(&self.record_bytes),
            batches: load(&self.batches),
            groups: load(&self.groups),
            group_batches: self.group_batches.snapshot(),
            fdatasyncs: load(&self.fdatasyncs),
            fdatasync_ns: self.fdatasync_ns.snapshot(),
            rotations: load(&self.rotations),
            commit_waits: load(&self.commit_waits),
            commit_wait_sleeps: load(&self.commit_wait_sleeps),
            commit_spin_hold_offs: load(&self.commit_spin_hold_offs),
            commit_spin_slow_yields: load(&self.commit_spin_slow_yields),
            append_sync_ns: append(Durability::Sync),
            append_buffered_ns: append(Durability::Buffered),
            append_none_ns: append(Durability::None),
            encoded_raw_bytes: 0,
            encoded_stored_bytes: 0,
            snapshot_writes: load(&self.snapshot_writes),
            snapshot_bytes: load(&self.snapshot_bytes),
            snapshot_write_ns: self.snapshot_write_ns.snapshot(),
            snapshot_fallbacks: load(&self.snapshot_fallbacks),
            policy_snapshot_failures: load(&self.policy_snapshot_failures),
            maintenance_failures: load(&self.maintenance_failures),
            rebuild_targeted_scans: load(&self.rebuild_targeted_scans),
            rebuild_scan_fallbacks: load(&self.rebuild_scan_fallbacks),
            rebuild_shared_scans: load(&self.rebuild_shared_scans),
            snapshot_lull_wait_ns: self.snapshot_lull_wait_ns.snapshot(),
            snapshot_lull_timeouts: load(&self.snapshot_lull_timeouts),
            index_rebuilds: load(&self.index_rebuilds),
            index_rebuild_atoms: load(&self.index_rebuild_atoms),
            time_to_resume_ns: load(&self.time_to_resume_ns),
            context_rebuilds: load(&self.context_rebuilds),
            context_rebuild_atoms: load(&self.context_rebuild_atoms),
            context_rebuild_ns: self.context_rebuild_ns.snapshot(),
            atoms_skipped: load(&self.atoms_skipped),
            compactions: load(&self.compactions),
            compaction_bytes_read: load(&self.compaction_bytes_read),
            compaction_bytes_written: load(&self.compaction_bytes_written),
            compaction_bytes_reclaimed: load(&self.compaction_bytes_reclaimed),
            recovery_torn_tails: load(&self.recovery_torn_tails),
            recovery_skipped_ranges: load(&self.recovery_skipped_ranges),
            errors: std::array::from_fn(|i| load(&self.errors[i])),
        }
    }
}

/// Time of `iterations` passes through what one unsynced, single-batch append adds to the
/// write path (the sampling check and the leader's group counters), with the metrics on and
/// then off: the cost of the metrics without the noise of the I/O around them.
#[doc(hidden)]
pub fn append_path_cost(iterations: u64) -> (Duration, Duration) {
    let run = |enabled: bool| {
        let metrics = Metrics::new(enabled);
        let started = std::time::Instant::now();
        for i in 0..iterations {
            let metrics = std::hint::black_box(&metrics);
            if metrics.times_append(Durability::Buffered) {
                metrics.record_append(Durability::Buffered, Duration::from_nanos(i));
            }
            metrics.record_group(1, 1, std::hint::black_box(552));
        }
        started.elapsed()
    };
    (run(true), run(false))
}

fn durability_index(durability: Durability) -> usize {
    match durability {
        Durability::Sync => 0,
        Durability::Buffered => 1,
        Durability::None => 2,
    }
}

fn error_kind_index(error: &Error) -> usize {
    match error {
        Error::Io { .. } => 0,
        Error::NoSpace { .. } => 1,
        Error::Corruption { .. } => 2,
        Error::Poisoned { .. } => 3,
        Error::Codec { .. } | Error::InconsistentLog { .. } => 4,
        Error::Closed | Error::ReadOnly => 5,
        _ => 6,
    }
}

/// Count, sum and percentiles of one histogram. Values are in the unit its field names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// Values recorded.
    pub count: u64,
    /// Their sum.
    pub sum: u64,
    /// Median, as the upper bound of its bucket (at most 25% high), capped at `max`.
    pub p50: u64,
    /// 99th percentile, as the upper bound of its bucket, capped at `max`.
    pub p99: u64,
    /// The exact largest value.
    pub max: u64,
}

impl HistogramSnapshot {
    /// The mean, or 0 with no values.
    pub fn mean(&self) -> u64 {
        self.sum.checked_div(self.count).unwrap_or(0)
    }
}

/// A copy of a log's (and its store's) metrics. Plain data: every field is public.
/// Durations are in nanoseconds (`_ns`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetricsSnapshot {
    /// Whether the metrics were counting (a hidden switch turns them off for benchmarks).
    pub enabled: bool,
    /// Records appended.
    pub records: u64,
    /// Bytes written for them: frames with their headers, length prefixes and padding.
    pub record_bytes: u64,
    /// Batches appended (each `append` is a batch of one).
    pub batches: u64,
    /// Commit groups written (one write and at most one `fdatasync` each).
    pub groups: u64,
    /// Batches per commit group.
    pub group_batches: HistogramSnapshot,
    /// `fdatasync` calls on segments.
    pub fdatasyncs: u64,
    /// Their latency.
    pub fdatasync_ns: HistogramSnapshot,
    /// Segments sealed and replaced by a new one.
    pub rotations: u64,
    /// Appends (and syncs) that waited for another thread's commit group to answer them.
    pub commit_waits: u64,
    /// Those of them that slept until answered: their spin ([`Config::commit_spin`]) ran out
    /// or was off. A high share with spinning on means syncs take longer than the spin.
    ///
    /// [`Config::commit_spin`]: crate::Config::commit_spin
    pub commit_wait_sleeps: u64,
    /// Times spinning was held off (for 10 ms, or up to 640 ms while hold-offs follow each
    /// other) because three stalls within 25 ms made yields come back over a millisecond late:
    /// the CPU is shared with other work, and spinning would hand it over
    /// (docs/ARCHITECTURE.md, "Spinning stands aside on a busy CPU"). Waits sleep meanwhile.
    pub commit_spin_hold_offs: u64,
    /// Spins (of waiters and gathering leaders) that stopped because a yield came back over a
    /// millisecond late; three stalls within 25 ms hold spinning off.
    pub commit_spin_slow_yields: u64,
    /// Latency of `Sync` appends, call to acknowledgement (every one timed).
    pub append_sync_ns: HistogramSnapshot,
    /// Latency of `Buffered` appends (one in [`UNSYNCED_SAMPLE_EVERY`] timed).
    pub append_buffered_ns: HistogramSnapshot,
    /// Latency of `None` appends (one in [`UNSYNCED_SAMPLE_EVERY`] timed).
    pub append_none_ns: HistogramSnapshot,
    /// Bytes of store records before compression (store only; 0 from `Log::metrics`).
    pub encoded_raw_bytes: u64,
    /// Bytes of those records as written, envelope included (store only).
    pub encoded_stored_bytes: u64,
    /// Snapshot files written.
    pub snapshot_writes: u64,
    /// Their total size.
    pub snapshot_bytes: u64,
    /// Time to encode and publish one (write, fdatasync, rename, directory sync).
    pub snapshot_write_ns: HistogramSnapshot,
    /// Snapshots a rebuild skipped because they failed verification.
    pub snapshot_fallbacks: u64,
    /// Policy snapshots that failed (an I/O error while rebuilding, writing or publishing
    /// one). No caller sees these errors: the atoms are acknowledged, and the agent's next
    /// snapshot is tried when it comes due; until then its rebuilds read more of the log.
    pub policy_snapshot_failures: u64,
    /// Background compaction rounds, index checkpoints the store writes on its own (at open,
    /// after a round, when due) and trained compression dictionaries that could not be written.
    /// No caller sees these errors: nothing is lost, but space is not reclaimed, the next open
    /// folds more of the log, or records go on without the new dictionary.
    pub maintenance_failures: u64,
    /// Rebuild scans that read only their run's records, at the LSNs the store's index holds
    /// for them, stepping over the other runs' (the run's records were at most one in 128 of
    /// the range; docs/ARCHITECTURE.md, "Replay").
    pub rebuild_targeted_scans: u64,
    /// Those of them whose LSNs did not all hold the run's records (the index disagreed with
    /// the log, which should never happen): each then scanned the whole range instead.
    pub rebuild_scan_fallbacks: u64,
    /// Rebuilds whose records were read in one pass over the log shared with others (a round
    /// of policy snapshots, `Store::rebuild_contexts`), instead of one pass each
    /// (docs/ARCHITECTURE.md, "A round of policy snapshots reads the log once").
    pub rebuild_shared_scans: u64,
    /// How long the background thread waited for a lull in the appends before it wrote the
    /// policy snapshots it had taken (one value per wait).
    pub snapshot_lull_wait_ns: HistogramSnapshot,
    /// Waits for a lull that reached their limit (2 s): the snapshots were written during a
    /// burst of appends.
    pub snapshot_lull_timeouts: u64,
    /// Store indexes rebuilt from the log (once per open).
    pub index_rebuilds: u64,
    /// Atoms those rebuilds indexed.
    pub index_rebuild_atoms: u64,
    /// Time from the start of the last open's recovery to a usable store.
    pub time_to_resume_ns: u64,
    /// Contexts rebuilt (`Store::rebuild_context`, snapshots included).
    pub context_rebuilds: u64,
    /// Deltas those rebuilds applied.
    pub context_rebuild_atoms: u64,
    /// Their latency.
    pub context_rebuild_ns: HistogramSnapshot,
    /// Completed atoms `execute` did not run again (their recorded output was returned).
    pub atoms_skipped: u64,
    /// Compaction runs.
    pub compactions: u64,
    /// Bytes compaction read.
    pub compaction_bytes_read: u64,
    /// Bytes compaction wrote.
    pub compaction_bytes_written: u64,
    /// Bytes compaction gave back to the file system.
    pub compaction_bytes_reclaimed: u64,
    /// Torn tails recovery found on open (cut, or reported by a read-only open).
    pub recovery_torn_tails: u64,
    /// Invalid ranges recovery skipped on open (`RecoveryMode::SkipCorrupted`).
    pub recovery_skipped_ranges: u64,
    /// Errors returned to callers, by kind, in the order of [`ERROR_KINDS`].
    pub errors: [u64; ERROR_KINDS.len()],
}

impl MetricsSnapshot {
    /// Stored bytes per raw byte of store records (below 1 when compression helps); `None`
    /// before any record was encoded.
    pub fn compression_ratio(&self) -> Option<f64> {
        (self.encoded_raw_bytes > 0).then(|| self.encoded_stored_bytes as f64 / self.encoded_raw_bytes as f64)
    }

    /// The metrics in the Prometheus text exposition format (version 0.0.4): counters as
    /// `continuum_*_total`, histograms as summaries in seconds with 0.5 and 0.99 quantiles.
    pub fn to_prometheus(&self) -> String {
        let mut out = String::new();
        let counters: [(&str, &str, u64); 30] = [
            ("records", "Records appended", self.records),
            ("record_bytes", "Bytes of frames appended (headers and padding included)", self.record_bytes),
            ("batches", "Batches appended", self.batches),
            ("groups", "Commit groups written", self.groups),
            ("fdatasyncs", "fdatasync calls on segments", self.fdatasyncs),
            ("rotations", "Segment rotations", self.rotations),
            ("commit_waits", "Appends that waited for another thread's commit group", self.commit_waits),
            ("commit_wait_sleeps", "Commit waits that slept instead of spinning", self.commit_wait_sleeps),
            ("commit_spin_hold_offs", "Times commit waits stopped spinning on a busy CPU", self.commit_spin_hold_offs),
            (
                "commit_spin_slow_yields",
                "Commit spins stopped by a yield that came back late",
                self.commit_spin_slow_yields,
            ),
            ("encoded_raw_bytes", "Store record bytes before compression", self.encoded_raw_bytes),
            ("encoded_stored_bytes", "Store record bytes as written", self.encoded_stored_bytes),
            ("snapshot_writes", "Snapshot files written", self.snapshot_writes),
            ("snapshot_bytes", "Bytes of snapshot files written", self.snapshot_bytes),
            ("snapshot_fallbacks", "Snapshots skipped by rebuilds", self.snapshot_fallbacks),
            ("policy_snapshot_failures", "Policy snapshots that failed", self.policy_snapshot_failures),
            (
                "maintenance_failures",
                "Background compaction rounds, index checkpoints and dictionaries that failed",
                self.maintenance_failures,
            ),
            ("rebuild_targeted_scans", "Rebuild scans that read only their run's records", self.rebuild_targeted_scans),
            (
                "rebuild_scan_fallbacks",
                "Targeted rebuild scans that fell back to the whole range",
                self.rebuild_scan_fallbacks,
            ),
            (
                "rebuild_shared_scans",
                "Rebuilds that shared one pass over the log with others",
                self.rebuild_shared_scans,
            ),
            (
                "snapshot_lull_timeouts",
                "Policy snapshot waits for a lull that reached their limit",
                self.snapshot_lull_timeouts,
            ),
            ("index_rebuilds", "Store index rebuilds", self.index_rebuilds),
            ("index_rebuild_atoms", "Atoms indexed by rebuilds", self.index_rebuild_atoms),
            ("context_rebuilds", "Context rebuilds", self.context_rebuilds),
            ("context_rebuild_atoms", "Deltas applied by context rebuilds", self.context_rebuild_atoms),
            ("atoms_skipped", "Completed atoms not executed again", self.atoms_skipped),
            ("compactions", "Compaction runs", self.compactions),
            ("compaction_bytes_read", "Bytes read by compaction", self.compaction_bytes_read),
            ("compaction_bytes_written", "Bytes written by compaction", self.compaction_bytes_written),
            ("compaction_bytes_reclaimed", "Bytes reclaimed by compaction", self.compaction_bytes_reclaimed),
        ];
        for (name, help, value) in counters {
            let _ = writeln!(out, "# HELP continuum_{name}_total {help}.\n# TYPE continuum_{name}_total counter");
            let _ = writeln!(out, "continuum_{name}_total {value}");
        }
        let _ = writeln!(
            out,
            "# HELP continuum_errors_total Errors returned, by kind.\n# TYPE continuum_errors_total counter"
        );
        for (kind, value) in ERROR_KINDS.iter().zip(self.errors) {
            let _ = writeln!(out, "continuum_errors_total{{kind=\"{kind}\"}} {value}");
        }
        let _ = writeln!(
            out,
            "# HELP continuum_time_to_resume_seconds Recovery and index rebuild time of the last open.\n\
             # TYPE continuum_time_to_resume_seconds gauge\ncontinuum_time_to_resume_seconds {}",
            seconds(self.time_to_resume_ns)
        );
        let summaries = [
            ("fdatasync_seconds", "Latency of fdatasync on segments", &self.fdatasync_ns, true),
            ("append_seconds{durability=\"sync\"}", "Append latency by durability", &self.append_sync_ns, true),
            ("append_seconds{durability=\"buffered\"}", "", &self.append_buffered_ns, true),
            ("append_seconds{durability=\"none\"}", "", &self.append_none_ns, true),
            ("snapshot_write_seconds", "Latency of snapshot writes", &self.snapshot_write_ns, true),
            (
                "snapshot_lull_wait_seconds",
                "Time policy snapshots waited for a lull in the appends",
                &self.snapshot_lull_wait_ns,
                true,
            ),
            ("context_rebuild_seconds", "Latency of context rebuilds", &self.context_rebuild_ns, true),
            ("group_batches", "Batches per commit group", &self.group_batches, false),
        ];
        for (name, help, histogram, in_seconds) in summaries {
            write_summary(&mut out, name, help, histogram, in_seconds);
        }
        out
    }
}

fn seconds(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// One histogram as a Prometheus summary; `name` may carry labels (`base{label="v"}`).
fn write_summary(out: &mut String, name: &str, help: &str, histogram: &HistogramSnapshot, in_seconds: bool) {
    let (base, labels) = match name.split_once('{') {
        Some((base, rest)) => (base, rest.trim_end_matches('}')),
        None => (name, ""),
    };
    if !help.is_empty() {
        let _ = writeln!(out, "# HELP continuum_{base} {help}.\n# TYPE continuum_{base} summary");
    }
    let value = |v: u64| if in_seconds { seconds(v) } else { v as f64 };
    let sep = if labels.is_empty() { "" } else { "," };
    for (quantile, v) in [("0.5", histogram.p50), ("0.99", histogram.p99), ("1", histogram.max)] {
        let _ = writeln!(out, "continuum_{base}{{{labels}{sep}quantile=\"{quantile}\"}} {}", value(v));
    }
    let braces = if labels.is_empty() { String::new() } else { format!("{{{labels}}}") };
    let _ = writeln!(out, "continuum_{base}_sum{braces} {}", value(histogram.sum));
    let _ = writeln!(out, "continuum_{base}_count{braces} {}", histogram.count);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_every_value_in_order() {
        let mut previous = 0;
        for value in (0..10_000u64).chain([u64::MAX / 3, u64::MAX - 1, u64::MAX]) {
            let bucket = bucket_of(value);
            assert!(bucket < BUCKETS, "value {value} → bucket {bucket}");
            assert!(bucket >= previous || value > 10_000);
            assert!(bucket_high(bucket) >= value, "value {value} above its bucket's high {}", bucket_high(bucket));
            if bucket > 0 {
                assert!(bucket_high(bucket - 1) < value, "value {value} belongs to an earlier bucket");
            }
            previous = bucket;
        }
        assert_eq!(bucket_high(BUCKETS - 1), u64::MAX);
    }

    #[test]
    fn percentiles_are_within_a_bucket_and_never_above_the_max() {
        let histogram = Histogram::default();
        for value in 1..=1000u64 {
            histogram.record(value * 1000);
        }
        let snapshot = histogram.snapshot();
        assert_eq!(snapshot.count, 1000);
        assert_eq!(snapshot.max, 1_000_000);
        assert!(snapshot.p50 >= 500_000 && snapshot.p50 <= 625_000, "p50 {}", snapshot.p50);
        assert!(snapshot.p99 >= 990_000 && snapshot.p99 <= 1_000_000, "p99 {}", snapshot.p99);
        assert_eq!(snapshot.mean(), 500_500);
        assert_eq!(Histogram::default().snapshot(), HistogramSnapshot::default());
    }

    #[test]
    fn compaction_hook_and_errors_are_counted() {
        let metrics = Metrics::new(true);
        metrics.record_compaction(100, 40, 60);
        metrics.record_error(&Error::Closed);
        metrics.record_error(&Error::Corruption {
            segment: "x".into(),
            offset: 0,
            kind: crate::CorruptionKind::BadBatch { reason: "test" },
        });
        let snapshot = metrics.snapshot();
        assert_eq!(
            (snapshot.compactions, snapshot.compaction_bytes_read, snapshot.compaction_bytes_written),
            (1, 100, 40)
        );
        assert_eq!(snapshot.compaction_bytes_reclaimed, 60);
        assert_eq!(snapshot.errors[2], 1);
        assert_eq!(snapshot.errors[5], 1);
        let text = snapshot.to_prometheus();
        assert!(text.contains("continuum_compaction_bytes_reclaimed_total 60\n"), "{text}");
        assert!(text.contains("continuum_errors_total{kind=\"corruption\"} 1\n"), "{text}");
        assert!(text.contains("continuum_append_seconds{durability=\"sync\",quantile=\"0.5\"} 0\n"), "{text}");
    }

    #[test]
    fn disabled_metrics_count_no_appends() {
        let metrics = Metrics::new(false);
        assert!(!metrics.times_append(Durability::Sync));
        metrics.record_group(1, 1, 10);
        metrics.record_fdatasync(Duration::from_micros(5));
        assert_eq!(metrics.snapshot().records, 0);
        assert_eq!(metrics.snapshot().fdatasyncs, 0);
    }
}
