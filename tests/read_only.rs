//! Read-only opens, metrics and tracing (`read_only_process.rs` opens a store read-only while
//! another process holds it).
//!
//! - A torn tail is reported (and a tracing event says so), never cut, by a read-only open;
//!   a strict one refuses it; writes fail with `Error::ReadOnly`.
//! - `store.metrics()` counts what happened (appends, syncs, skipped atoms, snapshots,
//!   rebuilds, errors), so that a counter wired to the wrong place shows.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use continuum::{AtomOutput, Delta, Error, Log, RecoveryMode, RunSpec, Store};

fn output(step: u64) -> AtomOutput {
    AtomOutput { delta: continuum::synthetic::Transcript::new(step).next_delta(200), result: vec![step as u8] }
}

/// Collects the message and fields of every tracing event, as `name=value` words.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<String>>>);

struct Fields(String);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!("{}={:?} ", field.name(), value));
    }
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        self.0.lock().expect("capture lock").push(fields.0);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// The capturing subscriber, installed once as the global default for this test binary: a
/// thread-local (`with_default`) one misses events whose callsites other tests' threads hit
/// first, so tests find their own events by their fields instead.
fn capture() -> &'static Capture {
    static CAPTURE: OnceLock<Capture> = OnceLock::new();
    CAPTURE.get_or_init(|| {
        let capture = Capture::default();
        tracing::subscriber::set_global_default(capture.clone()).expect("the first global subscriber");
        capture
    })
}

/// A log of a few records whose last segment gets `garbage` bytes past its data; returns the
/// segment and the offset of the garbage.
fn torn_log(dir: &Path, garbage: usize) -> (PathBuf, u64) {
    let log = Log::builder(dir).segment_bytes(8192).open().expect("open");
    for i in 0..5u8 {
        log.append(&[i; 100]).expect("append");
    }
    let segment = log.segments().pop().expect("a segment");
    log.close().expect("close");
    let mut bytes = std::fs::read(&segment.path).expect("read");
    // The close trimmed the file to its data: the garbage a crash could leave goes past it.
    bytes.resize(bytes.len().max(segment.data_bytes as usize + garbage), 0);
    bytes[segment.data_bytes as usize..segment.data_bytes as usize + garbage].fill(0x5A);
    std::fs::write(&segment.path, bytes).expect("tear");
    (segment.path, segment.data_bytes)
}

#[test]
fn a_torn_tail_is_reported_by_a_read_only_open_and_cut_by_a_writable_one_with_events() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let (segment, offset) = torn_log(dir.path(), 300);
    let torn = std::fs::read(&segment).expect("read");
    let capture = capture();
    {
        let log = Log::open_read_only(dir.path()).expect("read-only open of a torn log");
        let tail = log.recovery_report().torn_tail.clone().expect("the torn tail is reported");
        assert_eq!((tail.offset, tail.bytes), (offset, 300));
        assert_eq!(log.metrics().recovery_torn_tails, 1);
        assert_eq!(log.iter_from(continuum::Lsn::FIRST).expect("iter").count(), 5);
        drop(log);
        assert_eq!(std::fs::read(&segment).expect("read"), torn, "a read-only open cut the tail");
        let strict = Log::builder(dir.path()).recovery_mode(RecoveryMode::Strict).open_read_only();
        assert!(matches!(strict, Err(Error::Corruption { .. })), "strict refuses a torn tail");
        let log = Log::open(dir.path()).expect("writable open cuts the tail");
        assert!(log.recovery_report().torn_tail.is_some());
    }
    let events = capture.0.lock().expect("events").clone();
    let segment_field = format!("segment={} offset={offset} ", segment.display());
    let found = |message: &str| events.iter().any(|e| e.contains(message) && e.contains(&segment_field));
    assert!(found("left in place"), "no read-only torn-tail event in {events:#?}");
    assert!(found("cut a torn tail"), "no torn-tail cut event in {events:#?}");
    let opened = |e: &&String| e.contains("log opened") && e.contains("torn_tail_bytes=300 ");
    assert!(events.iter().any(|e| opened(&e)), "no open event of this log in {events:#?}");
}

#[test]
fn a_read_only_open_of_a_directory_without_a_store_fails_and_creates_nothing() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let missing = dir.path().join("nothing-here");
    assert!(matches!(Log::open_read_only(&missing), Err(Error::Io { .. })));
    assert!(!missing.exists(), "a read-only open created the directory");
    assert!(matches!(Store::open_read_only(dir.path()), Err(Error::Io { .. })));
    assert_eq!(std::fs::read_dir(dir.path()).expect("list").count(), 0, "a read-only open created a file");
}

#[test]
fn store_metrics_count_what_happened() {
    let dir = tempfile::tempdir().expect("temporary directory");
    // No background thread: it would compact (and count) on its own schedule.
    let store = Store::builder(dir.path()).compress_records_from(64).background(false).open().expect("open");
    let run = store.create_run(RunSpec::new("metrics")).expect("run");
    let mut parents = Vec::new();
    let mut atoms = Vec::new();
    for step in 0..10 {
        let executed = store.execute(run, "agent", &format!("s{step}"), &parents, |_| Ok(output(step)));
        parents = vec![executed.expect("atom").atom];
        atoms.push(parents[0]);
    }
    // A step is found again on its branch: under the same parents.
    let again =
        store.execute(run, "agent", "s3", &[atoms[2]], |_| Ok(AtomOutput { delta: Delta::default(), result: vec![] }));
    assert!(again.expect("replayed").replayed);
    store.snapshot_now(parents[0]).expect("snapshot");
    store.rebuild_context(parents[0]).expect("rebuild");
    let metrics = store.metrics();
    // 1 run + 10 starts + 10 completions.
    assert_eq!(metrics.records, 21);
    assert_eq!(metrics.batches, 21);
    assert!(metrics.record_bytes > 0);
    assert_eq!(metrics.append_sync_ns.count, 11, "the run and the completions are Sync");
    assert!(metrics.fdatasyncs >= 11 && metrics.fdatasync_ns.count == metrics.fdatasyncs);
    assert!(metrics.fdatasync_ns.max > 0 && metrics.fdatasync_ns.max <= metrics.fdatasync_ns.sum);
    assert_eq!(metrics.atoms_skipped, 1);
    assert_eq!(metrics.snapshot_writes, 1);
    assert!(metrics.snapshot_bytes > 0);
    assert_eq!(metrics.context_rebuilds, 2, "snapshot_now rebuilds the context it writes");
    assert_eq!(metrics.index_rebuilds, 1);
    assert!(metrics.compression_ratio().is_some_and(|ratio| ratio < 1.0), "{:?}", metrics.compression_ratio());
    assert_eq!(metrics.compactions, 0);
    let round = store.compact().expect("a compaction round");
    let metrics = store.metrics();
    assert_eq!(metrics.compactions, 1);
    assert_eq!(metrics.compaction_bytes_read, round.bytes_read);
    assert_eq!(metrics.compaction_bytes_reclaimed, round.bytes_reclaimed);
    drop(store);
    let store = Store::builder(dir.path()).compress_records_from(64).background(false).open().expect("reopen");
    let metrics = store.metrics();
    assert_eq!((metrics.index_rebuilds, metrics.index_rebuild_atoms), (1, 10));
    assert!(metrics.time_to_resume_ns > 0);
    assert_eq!(metrics.records, 0, "metrics start at zero on open");
}
