//! [`Metrics`]: what the log and the store count, emitted through the [`metrics`] crate facade
//! and kept for [`MetricsSnapshot`]; observed, never consulted.
//!
//! Every series goes to the recorder the application installs (`metrics-exporter-prometheus`,
//! StatsD, OpenTelemetry: any [`metrics::Recorder`]); with none installed, each emission is a
//! branch on an empty handle. A log registers its series when it opens, with the recorder
//! installed then: install the recorder before opening a store. `log.metrics()` and
//! `store.metrics()` return the same counts as plain data, with each distribution reduced to
//! its count, sum and maximum (the recorder computes quantiles).
//!
//! Every series carries the label `store="<name>"` when the store or log was opened with
//! `.metrics_label("<name>")` (two stores in one process then keep their series apart), and
//! no `store` label otherwise. Logs opened with the same label, or both with none, share their
//! series in the recorder: their counts add up.
//!
//! | series | kind | labels | what |
//! | --- | --- | --- | --- |
//! | `continuum_records_total` | counter | | records appended |
//! | `continuum_record_bytes_total` | counter | | bytes of frames appended (headers and padding included) |
//! | `continuum_batches_total` | counter | | batches appended (an `append` is a batch of one) |
//! | `continuum_commit_groups_total` | counter | | commit groups written (one write, at most one `fdatasync`) |
//! | `continuum_commit_group_batches` | histogram | | batches per commit group |
//! | `continuum_fdatasyncs_total` | counter | | `fdatasync` calls on segments |
//! | `continuum_fdatasync_seconds` | histogram | | their latency |
//! | `continuum_segment_rotations_total` | counter | | segments sealed and replaced |
//! | `continuum_append_seconds` | histogram | `durability` | append latency, call to acknowledgement (`sync` all, `buffered` and `none` one in [`UNSYNCED_SAMPLE_EVERY`]) |
//! | `continuum_commit_waits_total` | counter | | appends that waited for another thread's commit group |
//! | `continuum_commit_wait_sleeps_total` | counter | | those that slept instead of spinning |
//! | `continuum_commit_spin_hold_offs_total` | counter | | times spinning was held off on a busy CPU |
//! | `continuum_commit_spin_slow_yields_total` | counter | | spins stopped by a yield that came back late |
//! | `continuum_encoded_raw_bytes_total` | counter | | store record bytes before compression |
//! | `continuum_encoded_stored_bytes_total` | counter | | store record bytes as written |
//! | `continuum_snapshot_writes_total` | counter | | snapshot files written |
//! | `continuum_snapshot_bytes_total` | counter | | their bytes |
//! | `continuum_snapshot_write_seconds` | histogram | | time to encode and publish one |
//! | `continuum_snapshot_fallbacks_total` | counter | | snapshots a rebuild skipped (failed verification) |
//! | `continuum_policy_snapshot_failures_total` | counter | | policy snapshots that failed (no caller sees the error) |
//! | `continuum_maintenance_failures_total` | counter | | compaction rounds, index snapshots, dictionaries that failed (no caller sees the error) |
//! | `continuum_rebuild_targeted_scans_total` | counter | | rebuild scans that read only their run's records |
//! | `continuum_rebuild_scan_fallbacks_total` | counter | | targeted scans that fell back to the whole range |
//! | `continuum_rebuild_shared_scans_total` | counter | | rebuilds that shared one pass over the log |
//! | `continuum_index_rebuilds_total` | counter | | store indexes rebuilt from the log (once per open) |
//! | `continuum_index_rebuild_atoms_total` | counter | | atoms those rebuilds indexed |
//! | `continuum_time_to_resume_seconds` | gauge | | recovery and index rebuild time of the last open |
//! | `continuum_context_rebuilds_total` | counter | | contexts rebuilt |
//! | `continuum_context_rebuild_atoms_total` | counter | | deltas those rebuilds applied |
//! | `continuum_context_rebuild_seconds` | histogram | | their latency |
//! | `continuum_atoms_skipped_total` | counter | | completed atoms `execute` did not run again |
//! | `continuum_checkpoints_written_total` | counter | | run checkpoints written |
//! | `continuum_checkpoints_stale_total` | counter | | run checkpoints refused as stale (a sequence not above the newest) |
//! | `continuum_migrations_total` | counter | `outcome` | checkpoint loads that migrated (`applied`) or could not (`failed`: no chain, a step's error or panic) |
//! | `continuum_suspensions_total` | counter | | runs suspended (`Store::suspend`) |
//! | `continuum_decisions_total` | counter | | decisions recorded on pending requests (an idempotent repeat is not counted) |
//! | `continuum_resumes_total` | counter | | suspended runs resumed |
//! | `continuum_suspended_seconds` | histogram | | time a resumed run spent suspended (suspension to resumption, wall clock) |
//! | `continuum_suspension_resume_seconds` | histogram | | time to resume: latency of `Store::resume_suspended` |
//! | `continuum_stop_requests_total` | counter | | stop requests that stopped the store's new atoms (the first of each store) |
//! | `continuum_graceful_stops_total` | counter | `outcome` | graceful stops that ended within their budget (`completed`) or ran out of it (`over_budget`) |
//! | `continuum_stop_checkpoints_total` | counter | | run checkpoints written by graceful stops |
//! | `continuum_compactions_total` | counter | | compaction runs |
//! | `continuum_compaction_read_bytes_total` | counter | | bytes compaction read |
//! | `continuum_compaction_written_bytes_total` | counter | | bytes compaction wrote |
//! | `continuum_compaction_reclaimed_bytes_total` | counter | | bytes compaction gave back to the file system |
//! | `continuum_recovery_torn_tails_total` | counter | | torn tails recovery found on open |
//! | `continuum_recovery_skipped_ranges_total` | counter | | invalid ranges recovery skipped on open |
//! | `continuum_errors_total` | counter | `kind` | errors returned to callers, by kind ([`ERROR_KINDS`]) |
//!
//! Cheap enough to be always on (`docs/BENCHMARKS.md` §9): the kept counts are relaxed atomics;
//! the group-commit leader, which holds the leader lock, updates its own with plain loads and
//! stores. Appends that do not sync are timed one in [`UNSYNCED_SAMPLE_EVERY`], since reading
//! the clock twice would cost several percent of a one-microsecond append; their counts are
//! exact.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use metrics::{Label, Unit};

use crate::config::Durability;
use crate::error::Error;

/// Appends that do not sync are timed once in this many (by batch count).
pub const UNSYNCED_SAMPLE_EVERY: u64 = 64;

/// Values of the `kind` label of `continuum_errors_total`; the order of
/// [`MetricsSnapshot::errors`].
pub const ERROR_KINDS: [&str; 7] = ["io", "no_space", "corruption", "poisoned", "codec", "closed", "other"];

/// Values of the `durability` label of `continuum_append_seconds`, by [`durability_index`].
const DURABILITIES: [&str; 3] = ["sync", "buffered", "none"];

/// Nanoseconds to the seconds the series are in.
const SECONDS_PER_NANO: f64 = 1e-9;

/// A duration in whole nanoseconds, saturating at `u64::MAX` (584 years).
pub(crate) fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// A counter kept in an atomic (for the snapshot) and emitted to the recorder's series.
#[derive(Debug)]
pub(crate) struct Count {
    value: AtomicU64,
    series: metrics::Counter,
}

impl Count {
    fn new(series: metrics::Counter) -> Self {
        Self { value: AtomicU64::new(0), series }
    }

    /// Adds `n` (any thread).
    pub(crate) fn add(&self, n: u64) {
        self.value.fetch_add(n, Ordering::Relaxed);
        self.series.increment(n);
    }

    /// Adds `n` with a plain load and store: only for a counter that one thread at a time
    /// updates (under a lock the caller holds).
    fn add_exclusive(&self, n: u64) {
        self.value.store(self.value.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
        self.series.increment(n);
    }

    fn get(&self) -> u64 {
        self.value.load(Ordering::Relaxed)
    }
}

/// A distribution: its count, sum and maximum kept in atomics, every value emitted to the
/// recorder's histogram (scaled to the series' unit), which keeps the quantiles.
#[derive(Debug)]
struct Spread {
    count: AtomicU64,
    sum: AtomicU64,
    max: AtomicU64,
    series: metrics::Histogram,
    /// Series units per kept unit (seconds per nanosecond, or 1).
    scale: f64,
}

impl Spread {
    fn new(series: metrics::Histogram, scale: f64) -> Self {
        Self { count: AtomicU64::new(0), sum: AtomicU64::new(0), max: AtomicU64::new(0), series, scale }
    }

    /// Records one value (any thread).
    fn record(&self, value: u64) {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(value, Ordering::Relaxed);
        self.max.fetch_max(value, Ordering::Relaxed);
        self.series.record(value as f64 * self.scale);
    }

    /// Records one value with plain loads and stores (single writer, as
    /// [`Count::add_exclusive`]).
    fn record_exclusive(&self, value: u64) {
        let bump = |counter: &AtomicU64, n: u64| {
            counter.store(counter.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
        };
        bump(&self.count, 1);
        bump(&self.sum, value);
        if value > self.max.load(Ordering::Relaxed) {
            self.max.store(value, Ordering::Relaxed);
        }
        self.series.record(value as f64 * self.scale);
    }

    fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            count: self.count.load(Ordering::Relaxed),
            sum: self.sum.load(Ordering::Relaxed),
            max: self.max.load(Ordering::Relaxed),
        }
    }
}

/// Registers a log's series with the recorder installed now, each with the log's labels, and
/// describes them (help text and unit) to it.
#[derive(Clone, Debug, Default)]
struct Registrar {
    labels: Vec<Label>,
}

impl Registrar {
    /// `store="<label>"` on every series, or no label.
    fn new(label: Option<&str>) -> Self {
        Self { labels: label.map(|name| vec![Label::new("store", name.to_owned())]).unwrap_or_default() }
    }

    /// The log's labels and `extra`.
    fn labels_and(&self, extra: Option<(&'static str, &'static str)>) -> Vec<Label> {
        let mut labels = self.labels.clone();
        labels.extend(extra.map(|(key, value)| Label::from_static_parts(key, value)));
        labels
    }

    fn count(&self, name: &'static str, unit: Unit, help: &'static str) -> Count {
        self.count_of(name, unit, help, None)
    }

    fn count_of(
        &self,
        name: &'static str,
        unit: Unit,
        help: &'static str,
        label: Option<(&'static str, &'static str)>,
    ) -> Count {
        metrics::describe_counter!(name, unit, help);
        Count::new(metrics::counter!(name, self.labels_and(label)))
    }

    fn seconds(&self, name: &'static str, help: &'static str) -> Spread {
        self.spread(name, help, None)
    }

    fn spread(&self, name: &'static str, help: &'static str, label: Option<(&'static str, &'static str)>) -> Spread {
        let (unit, scale) =
            if name.ends_with("_seconds") { (Unit::Seconds, SECONDS_PER_NANO) } else { (Unit::Count, 1.0) };
        metrics::describe_histogram!(name, unit, help);
        Spread::new(metrics::histogram!(name, self.labels_and(label)), scale)
    }

    fn gauge_seconds(&self, name: &'static str, help: &'static str) -> metrics::Gauge {
        metrics::describe_gauge!(name, Unit::Seconds, help);
        metrics::gauge!(name, self.labels.clone())
    }
}

/// The store's encoded-record byte counters, held by its codec: bytes of protobuf bodies and
/// of the envelopes they became. Unregistered (the snapshot only) by default.
#[derive(Debug)]
pub(crate) struct EncodedBytes {
    raw: Count,
    stored: Count,
}

impl Default for EncodedBytes {
    fn default() -> Self {
        Self { raw: Count::new(metrics::Counter::noop()), stored: Count::new(metrics::Counter::noop()) }
    }
}

impl EncodedBytes {
    /// One body of `raw` bytes encoded into an envelope of `stored` bytes.
    pub(crate) fn record(&self, raw: u64, stored: u64) {
        self.raw.add(raw);
        self.stored.add(stored);
    }

    /// Bytes of bodies encoded so far, and of their envelopes.
    pub(crate) fn get(&self) -> (u64, u64) {
        (self.raw.get(), self.stored.get())
    }
}

/// How a log's metrics are set up (by its builder).
#[derive(Clone, Debug)]
pub(crate) struct MetricsOptions {
    /// Whether appends are counted and timed (default yes; off only to measure the cost).
    pub enabled: bool,
    /// The value of the `store` label on every series, if any.
    pub label: Option<String>,
}

impl Default for MetricsOptions {
    fn default() -> Self {
        Self { enabled: true, label: None }
    }
}

/// The write path's counts: the group-commit leader's, the appenders', recovery's.
#[derive(Debug)]
struct WritePath {
    // Written by the group-commit leader only (plain stores).
    records: Count,
    record_bytes: Count,
    batches: Count,
    groups: Count,
    group_batches: Spread,
    fdatasyncs: Count,
    fdatasync_ns: Spread,
    rotations: Count,
    // Written by appending threads.
    append_ns: [Spread; 3],
    commit_waits: Count,
    commit_wait_sleeps: Count,
    commit_spin_hold_offs: Count,
    commit_spin_slow_yields: Count,
    recovery_torn_tails: Count,
    recovery_skipped_ranges: Count,
}

impl WritePath {
    fn register(r: &Registrar) -> Self {
        Self {
            records: r.count("continuum_records_total", Unit::Count, "Records appended."),
            record_bytes: r.count("continuum_record_bytes_total", Unit::Bytes, "Bytes of frames appended."),
            batches: r.count("continuum_batches_total", Unit::Count, "Batches appended."),
            groups: r.count("continuum_commit_groups_total", Unit::Count, "Commit groups written."),
            group_batches: r.spread("continuum_commit_group_batches", "Batches per commit group.", None),
            fdatasyncs: r.count("continuum_fdatasyncs_total", Unit::Count, "fdatasync calls on segments."),
            fdatasync_ns: r.seconds("continuum_fdatasync_seconds", "Latency of fdatasync on segments."),
            rotations: r.count("continuum_segment_rotations_total", Unit::Count, "Segments sealed and replaced."),
            append_ns: DURABILITIES.map(|durability| {
                r.spread("continuum_append_seconds", "Append latency by durability.", Some(("durability", durability)))
            }),
            commit_waits: r.count(
                "continuum_commit_waits_total",
                Unit::Count,
                "Appends that waited for another thread's commit group.",
            ),
            commit_wait_sleeps: r.count(
                "continuum_commit_wait_sleeps_total",
                Unit::Count,
                "Commit waits that slept instead of spinning.",
            ),
            commit_spin_hold_offs: r.count(
                "continuum_commit_spin_hold_offs_total",
                Unit::Count,
                "Times commit waits stopped spinning on a busy CPU.",
            ),
            commit_spin_slow_yields: r.count(
                "continuum_commit_spin_slow_yields_total",
                Unit::Count,
                "Commit spins stopped by a yield that came back late.",
            ),
            recovery_torn_tails: r.count(
                "continuum_recovery_torn_tails_total",
                Unit::Count,
                "Torn tails recovery found on open.",
            ),
            recovery_skipped_ranges: r.count(
                "continuum_recovery_skipped_ranges_total",
                Unit::Count,
                "Invalid ranges recovery skipped on open.",
            ),
        }
    }
}

/// The store's counts: snapshots, rebuilds, compaction, failures no caller sees.
#[derive(Debug)]
struct StoreCounts {
    snapshot_writes: Count,
    snapshot_bytes: Count,
    snapshot_write_ns: Spread,
    snapshot_fallbacks: Count,
    policy_snapshot_failures: Count,
    maintenance_failures: Count,
    rebuild_targeted_scans: Count,
    rebuild_scan_fallbacks: Count,
    rebuild_shared_scans: Count,
    index_rebuilds: Count,
    index_rebuild_atoms: Count,
    context_rebuilds: Count,
    context_rebuild_atoms: Count,
    context_rebuild_ns: Spread,
    atoms_skipped: Count,
    checkpoints_written: Count,
    checkpoints_stale: Count,
    migrations_applied: Count,
    migrations_failed: Count,
    /// Shared with the store's stop tokens, which count the request that stops the store.
    stop_requests: std::sync::Arc<Count>,
    graceful_stops_completed: Count,
    graceful_stops_over_budget: Count,
    stop_checkpoints: Count,
    compactions: Count,
    compaction_bytes_read: Count,
    compaction_bytes_written: Count,
    compaction_bytes_reclaimed: Count,
    suspensions: Count,
    decisions: Count,
    resumes: Count,
    suspended_ns: Spread,
    suspension_resume_ns: Spread,
}

impl StoreCounts {
    fn register(r: &Registrar) -> Self {
        let count = |name, help| r.count(name, Unit::Count, help);
        let bytes = |name, help| r.count(name, Unit::Bytes, help);
        Self {
            snapshot_writes: count("continuum_snapshot_writes_total", "Snapshot files written."),
            snapshot_bytes: bytes("continuum_snapshot_bytes_total", "Bytes of snapshot files written."),
            snapshot_write_ns: r.seconds("continuum_snapshot_write_seconds", "Latency of snapshot writes."),
            snapshot_fallbacks: count("continuum_snapshot_fallbacks_total", "Snapshots skipped by rebuilds."),
            policy_snapshot_failures: count(
                "continuum_policy_snapshot_failures_total",
                "Policy snapshots that failed; no caller saw the error.",
            ),
            maintenance_failures: count(
                "continuum_maintenance_failures_total",
                "Compaction rounds, index snapshots and dictionaries that failed; no caller saw the error.",
            ),
            rebuild_targeted_scans: count(
                "continuum_rebuild_targeted_scans_total",
                "Rebuild scans that read only their run's records.",
            ),
            rebuild_scan_fallbacks: count(
                "continuum_rebuild_scan_fallbacks_total",
                "Targeted rebuild scans that fell back to the whole range.",
            ),
            rebuild_shared_scans: count(
                "continuum_rebuild_shared_scans_total",
                "Rebuilds that shared one pass over the log with others.",
            ),
            index_rebuilds: count("continuum_index_rebuilds_total", "Store index rebuilds."),
            index_rebuild_atoms: count("continuum_index_rebuild_atoms_total", "Atoms indexed by index rebuilds."),
            context_rebuilds: count("continuum_context_rebuilds_total", "Context rebuilds."),
            context_rebuild_atoms: count(
                "continuum_context_rebuild_atoms_total",
                "Deltas applied by context rebuilds.",
            ),
            context_rebuild_ns: r.seconds("continuum_context_rebuild_seconds", "Latency of context rebuilds."),
            atoms_skipped: count("continuum_atoms_skipped_total", "Completed atoms not executed again."),
            checkpoints_written: count("continuum_checkpoints_written_total", "Run checkpoints written."),
            checkpoints_stale: count("continuum_checkpoints_stale_total", "Run checkpoints refused as stale."),
            migrations_applied: r.count_of(
                "continuum_migrations_total",
                Unit::Count,
                "Checkpoint loads that migrated, or failed to.",
                Some(("outcome", "applied")),
            ),
            migrations_failed: r.count_of(
                "continuum_migrations_total",
                Unit::Count,
                "Checkpoint loads that migrated, or failed to.",
                Some(("outcome", "failed")),
            ),
            stop_requests: std::sync::Arc::new(count(
                "continuum_stop_requests_total",
                "Stop requests that stopped the store's new atoms.",
            )),
            graceful_stops_completed: r.count_of(
                "continuum_graceful_stops_total",
                Unit::Count,
                "Graceful stops, within their budget or over it.",
                Some(("outcome", "completed")),
            ),
            graceful_stops_over_budget: r.count_of(
                "continuum_graceful_stops_total",
                Unit::Count,
                "Graceful stops, within their budget or over it.",
                Some(("outcome", "over_budget")),
            ),
            stop_checkpoints: count("continuum_stop_checkpoints_total", "Run checkpoints written by graceful stops."),
            compactions: count("continuum_compactions_total", "Compaction runs."),
            compaction_bytes_read: bytes("continuum_compaction_read_bytes_total", "Bytes read by compaction."),
            compaction_bytes_written: bytes("continuum_compaction_written_bytes_total", "Bytes written by compaction."),
            compaction_bytes_reclaimed: bytes(
                "continuum_compaction_reclaimed_bytes_total",
                "Bytes compaction gave back to the file system.",
            ),
            suspensions: count("continuum_suspensions_total", "Runs suspended."),
            decisions: count("continuum_decisions_total", "Decisions recorded on pending requests."),
            resumes: count("continuum_resumes_total", "Suspended runs resumed."),
            suspended_ns: r.seconds("continuum_suspended_seconds", "Time resumed runs spent suspended."),
            suspension_resume_ns: r.seconds(
                "continuum_suspension_resume_seconds",
                "Time to resume a suspended run (latency of resume_suspended).",
            ),
        }
    }
}

/// The live counts of one log (and the store on it), emitted to the installed recorder.
pub struct Metrics {
    /// Whether appends are counted and timed (a hidden switch for measuring the cost).
    enabled: AtomicBool,
    write: WritePath,
    store: StoreCounts,
    time_to_resume_ns: AtomicU64,
    time_to_resume: metrics::Gauge,
    errors: [Count; ERROR_KINDS.len()],
    /// Registers the series created after open (the codec's).
    registrar: Registrar,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").field("enabled", &self.enabled()).finish_non_exhaustive()
    }
}

impl Metrics {
    /// Counts that count (`enabled`), registered with the installed recorder, each series
    /// labelled `store="<label>"` when a label is given.
    pub(crate) fn new(enabled: bool, label: Option<&str>) -> Self {
        let registrar = Registrar::new(label);
        Self {
            enabled: AtomicBool::new(enabled),
            write: WritePath::register(&registrar),
            store: StoreCounts::register(&registrar),
            time_to_resume_ns: AtomicU64::new(0),
            time_to_resume: registrar
                .gauge_seconds("continuum_time_to_resume_seconds", "Recovery and index rebuild time of the last open."),
            errors: ERROR_KINDS.map(|kind| {
                registrar.count_of(
                    "continuum_errors_total",
                    Unit::Count,
                    "Errors returned, by kind.",
                    Some(("kind", kind)),
                )
            }),
            registrar,
        }
    }

    /// The store codec's byte counters, registered with this log's labels.
    pub(crate) fn encoded_bytes(&self) -> EncodedBytes {
        let r = &self.registrar;
        EncodedBytes {
            raw: r.count("continuum_encoded_raw_bytes_total", Unit::Bytes, "Store record bytes before compression."),
            stored: r.count("continuum_encoded_stored_bytes_total", Unit::Bytes, "Store record bytes as written."),
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
        self.enabled()
            && (durability == Durability::Sync || self.write.batches.get().is_multiple_of(UNSYNCED_SAMPLE_EVERY))
    }

    /// One append's latency, from its call to its acknowledgement.
    pub(crate) fn record_append(&self, durability: Durability, latency: Duration) {
        self.write.append_ns[durability_index(durability)].record(nanos(latency));
    }

    /// One committed group (leader only, under the leader lock).
    pub(crate) fn record_group(&self, batches: u64, records: u64, bytes: u64) {
        if !self.enabled() {
            return;
        }
        let write = &self.write;
        write.groups.add_exclusive(1);
        write.batches.add_exclusive(batches);
        write.records.add_exclusive(records);
        write.record_bytes.add_exclusive(bytes);
        write.group_batches.record_exclusive(batches);
    }

    /// One `fdatasync` of a segment (leader only).
    pub(crate) fn record_fdatasync(&self, latency: Duration) {
        if self.enabled() {
            self.write.fdatasyncs.add_exclusive(1);
            self.write.fdatasync_ns.record_exclusive(nanos(latency));
        }
    }

    /// One segment rotation (leader only).
    pub(crate) fn record_rotation(&self) {
        if self.enabled() {
            self.write.rotations.add_exclusive(1);
        }
    }

    /// One appender's wait for a group-commit leader to answer it, and whether it had to sleep
    /// (its spin ran out, or spinning was off) instead of seeing the answer while spinning.
    pub(crate) fn record_commit_wait(&self, slept: bool) {
        if self.enabled() {
            self.write.commit_waits.add(1);
            if slept {
                self.write.commit_wait_sleeps.add(1);
            }
        }
    }

    /// A spin stopped because a yield came back late; `held_off`: it also held spinning off.
    pub(crate) fn record_slow_yield(&self, held_off: bool) {
        self.write.commit_spin_slow_yields.add(1);
        if held_off {
            self.write.commit_spin_hold_offs.add(1);
        }
    }

    /// What recovery found on open.
    pub(crate) fn record_recovery(&self, torn_tails: u64, skipped_ranges: u64) {
        self.write.recovery_torn_tails.add(torn_tails);
        self.write.recovery_skipped_ranges.add(skipped_ranges);
    }

    /// One snapshot file written.
    pub(crate) fn record_snapshot_write(&self, bytes: u64, latency: Duration) {
        self.store.snapshot_writes.add(1);
        self.store.snapshot_bytes.add(bytes);
        self.store.snapshot_write_ns.record(nanos(latency));
    }

    /// Snapshots a context rebuild could not use.
    pub(crate) fn record_snapshot_fallbacks(&self, count: u64) {
        self.store.snapshot_fallbacks.add(count);
    }

    /// A policy snapshot failed; its error reached no caller.
    pub(crate) fn record_policy_snapshot_failure(&self) {
        self.store.policy_snapshot_failures.add(1);
    }

    /// A compaction round of the background thread, an index snapshot written by the store
    /// on its own, or a trained dictionary's record failed; its error reached no caller.
    pub(crate) fn record_maintenance_failure(&self) {
        self.store.maintenance_failures.add(1);
    }

    /// A rebuild read its run's records at the LSNs its index holds for them; `fell_back`: the
    /// log did not hold them all there, and it scanned the whole range instead.
    pub(crate) fn record_targeted_scan(&self, fell_back: bool) {
        self.store.rebuild_targeted_scans.add(1);
        if fell_back {
            self.store.rebuild_scan_fallbacks.add(1);
        }
    }

    /// `rebuilds` rebuilds (a round of policy snapshots, or `rebuild_contexts`) read the log
    /// in one shared pass.
    pub(crate) fn record_shared_scan(&self, rebuilds: u64) {
        self.store.rebuild_shared_scans.add(rebuilds);
    }

    /// The store index rebuilt on open: atoms indexed, and the time from the start of the
    /// log's recovery to a usable store.
    pub(crate) fn record_index_rebuild(&self, atoms: u64, time_to_resume: Duration) {
        self.store.index_rebuilds.add(1);
        self.store.index_rebuild_atoms.add(atoms);
        self.time_to_resume_ns.store(nanos(time_to_resume), Ordering::Relaxed);
        self.time_to_resume.set(time_to_resume.as_secs_f64());
    }

    /// One context rebuild: deltas applied, and how long it took.
    pub(crate) fn record_context_rebuild(&self, atoms_applied: u64, latency: Duration) {
        self.store.context_rebuilds.add(1);
        self.store.context_rebuild_atoms.add(atoms_applied);
        self.store.context_rebuild_ns.record(nanos(latency));
    }

    /// An `execute` that returned a recorded output instead of running a completed atom again.
    /// A run suspended.
    pub(crate) fn record_suspension(&self) {
        self.store.suspensions.add(1);
    }

    /// A decision recorded.
    pub(crate) fn record_decision(&self) {
        self.store.decisions.add(1);
    }

    /// A run resumed after `suspended_us` suspended; the resume took `latency`.
    pub(crate) fn record_resume(&self, suspended_us: u64, latency: Duration) {
        self.store.resumes.add(1);
        self.store.suspended_ns.record(suspended_us.saturating_mul(1000));
        self.store.suspension_resume_ns.record(nanos(latency));
    }

    pub(crate) fn record_atom_skipped(&self) {
        self.store.atoms_skipped.add(1);
    }

    /// A run checkpoint written.
    pub(crate) fn record_checkpoint_written(&self) {
        self.store.checkpoints_written.add(1);
    }

    /// A run checkpoint refused as stale.
    pub(crate) fn record_stale_checkpoint(&self) {
        self.store.checkpoints_stale.add(1);
    }

    /// A checkpoint load that migrated (`applied`) or failed to.
    pub(crate) fn record_migration(&self, applied: bool) {
        if applied { self.store.migrations_applied.add(1) } else { self.store.migrations_failed.add(1) }
    }

    /// The counter of stop requests, which the store's stop tokens share.
    pub(crate) fn stop_requests(&self) -> std::sync::Arc<Count> {
        std::sync::Arc::clone(&self.store.stop_requests)
    }

    /// A graceful stop that ended within its budget, or ran out of it.
    pub(crate) fn record_graceful_stop(&self, over_budget: bool) {
        if over_budget {
            self.store.graceful_stops_over_budget.add(1)
        } else {
            self.store.graceful_stops_completed.add(1)
        }
    }

    /// A run checkpoint written by a graceful stop.
    pub(crate) fn record_stop_checkpoint(&self) {
        self.store.stop_checkpoints.add(1);
    }

    /// One compaction run: bytes it read, wrote, and gave back to the file system.
    pub(crate) fn record_compaction(&self, bytes_read: u64, bytes_written: u64, bytes_reclaimed: u64) {
        self.store.compactions.add(1);
        self.store.compaction_bytes_read.add(bytes_read);
        self.store.compaction_bytes_written.add(bytes_written);
        self.store.compaction_bytes_reclaimed.add(bytes_reclaimed);
    }

    /// An error returned to a caller, counted by kind.
    pub(crate) fn record_error(&self, error: &Error) {
        self.errors[error_kind_index(error)].add(1);
    }

    /// A consistent-enough copy of every count (each one is read atomically; the set is not
    /// one atomic snapshot).
    pub fn snapshot(&self) -> MetricsSnapshot {
        let (write, store) = (&self.write, &self.store);
        MetricsSnapshot {
            enabled: self.enabled(),
            records: write.records.get(),
            record_bytes: write.record_bytes.get(),
            batches: write.batches.get(),
            groups: write.groups.get(),
            group_batches: write.group_batches.snapshot(),
            fdatasyncs: write.fdatasyncs.get(),
            fdatasync_ns: write.fdatasync_ns.snapshot(),
            rotations: write.rotations.get(),
            commit_waits: write.commit_waits.get(),
            commit_wait_sleeps: write.commit_wait_sleeps.get(),
            commit_spin_hold_offs: write.commit_spin_hold_offs.get(),
            commit_spin_slow_yields: write.commit_spin_slow_yields.get(),
            append_sync_ns: write.append_ns[durability_index(Durability::Sync)].snapshot(),
            append_buffered_ns: write.append_ns[durability_index(Durability::Buffered)].snapshot(),
            append_none_ns: write.append_ns[durability_index(Durability::None)].snapshot(),
            encoded_raw_bytes: 0,
            encoded_stored_bytes: 0,
            snapshot_writes: store.snapshot_writes.get(),
            snapshot_bytes: store.snapshot_bytes.get(),
            snapshot_write_ns: store.snapshot_write_ns.snapshot(),
            snapshot_fallbacks: store.snapshot_fallbacks.get(),
            policy_snapshot_failures: store.policy_snapshot_failures.get(),
            maintenance_failures: store.maintenance_failures.get(),
            rebuild_targeted_scans: store.rebuild_targeted_scans.get(),
            rebuild_scan_fallbacks: store.rebuild_scan_fallbacks.get(),
            rebuild_shared_scans: store.rebuild_shared_scans.get(),
            index_rebuilds: store.index_rebuilds.get(),
            index_rebuild_atoms: store.index_rebuild_atoms.get(),
            time_to_resume_ns: self.time_to_resume_ns.load(Ordering::Relaxed),
            context_rebuilds: store.context_rebuilds.get(),
            context_rebuild_atoms: store.context_rebuild_atoms.get(),
            context_rebuild_ns: store.context_rebuild_ns.snapshot(),
            atoms_skipped: store.atoms_skipped.get(),
            checkpoints_written: store.checkpoints_written.get(),
            checkpoints_stale: store.checkpoints_stale.get(),
            migrations_applied: store.migrations_applied.get(),
            migrations_failed: store.migrations_failed.get(),
            suspensions: store.suspensions.get(),
            decisions: store.decisions.get(),
            resumes: store.resumes.get(),
            suspended_ns: store.suspended_ns.snapshot(),
            suspension_resume_ns: store.suspension_resume_ns.snapshot(),
            stop_requests: store.stop_requests.get(),
            graceful_stops_completed: store.graceful_stops_completed.get(),
            graceful_stops_over_budget: store.graceful_stops_over_budget.get(),
            stop_checkpoints: store.stop_checkpoints.get(),
            compactions: store.compactions.get(),
            compaction_bytes_read: store.compaction_bytes_read.get(),
            compaction_bytes_written: store.compaction_bytes_written.get(),
            compaction_bytes_reclaimed: store.compaction_bytes_reclaimed.get(),
            recovery_torn_tails: write.recovery_torn_tails.get(),
            recovery_skipped_ranges: write.recovery_skipped_ranges.get(),
            errors: std::array::from_fn(|i| self.errors[i].get()),
        }
    }
}

/// Time of `iterations` passes through what one unsynced, single-batch append adds to the
/// write path (the sampling check and the leader's group counters), with the metrics on and
/// then off: the cost of the metrics without the noise of the I/O around them.
#[doc(hidden)]
pub fn append_path_cost(iterations: u64) -> (Duration, Duration) {
    let run = |enabled: bool| {
        let metrics = Metrics::new(enabled, None);
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

/// Count, sum and maximum of one distribution, in the unit its field names; its quantiles are
/// the recorder's (the matching `continuum_*` histogram series).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// Values recorded.
    pub count: u64,
    /// Their sum.
    pub sum: u64,
    /// The largest value.
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
    /// Background compaction rounds, index snapshots the store writes on its own (at open,
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
    /// Run checkpoints written (`Store::write_checkpoint`).
    pub checkpoints_written: u64,
    /// Run checkpoints refused because their sequence was not above the run's newest.
    pub checkpoints_stale: u64,
    /// Checkpoint loads that migrated the state to another pipeline version.
    pub migrations_applied: u64,
    /// Checkpoint loads whose migration failed: no chain, a step's error or panic.
    pub migrations_failed: u64,
    /// Runs suspended.
    pub suspensions: u64,
    /// Decisions recorded on pending requests.
    pub decisions: u64,
    /// Suspended runs resumed.
    pub resumes: u64,
    /// Time resumed runs spent suspended (suspension to resumption).
    pub suspended_ns: HistogramSnapshot,
    /// Time to resume: latency of `Store::resume_suspended`.
    pub suspension_resume_ns: HistogramSnapshot,
    /// Stop requests that stopped the store's new atoms (`Store::request_stop`, a stop token's,
    /// a graceful stop's): at most one per store.
    pub stop_requests: u64,
    /// Graceful stops (`shutdown::graceful_stop`) that ended within their budget.
    pub graceful_stops_completed: u64,
    /// Graceful stops that ran out of their budget.
    pub graceful_stops_over_budget: u64,
    /// Run checkpoints written by graceful stops (also counted in `checkpoints_written`).
    pub stop_checkpoints: u64,
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spreads_keep_count_sum_and_max() {
        let metrics = Metrics::new(true, None);
        for value in 1..=1000u64 {
            metrics.record_context_rebuild(1, Duration::from_nanos(value * 1000));
        }
        let snapshot = metrics.snapshot().context_rebuild_ns;
        assert_eq!(snapshot.count, 1000);
        assert_eq!(snapshot.max, 1_000_000);
        assert_eq!(snapshot.mean(), 500_500);
        assert_eq!(Metrics::new(true, None).snapshot().context_rebuild_ns, HistogramSnapshot::default());
    }

    #[test]
    fn compaction_hook_and_errors_are_counted() {
        let metrics = Metrics::new(true, None);
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
    }

    #[test]
    fn disabled_metrics_count_no_appends() {
        let metrics = Metrics::new(false, None);
        assert!(!metrics.times_append(Durability::Sync));
        metrics.record_group(1, 1, 10);
        metrics.record_fdatasync(Duration::from_micros(5));
        assert_eq!(metrics.snapshot().records, 0);
        assert_eq!(metrics.snapshot().fdatasyncs, 0);
    }
}
