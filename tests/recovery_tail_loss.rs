//! Records lost from the end of the log, stale rewritten segments, and the space a closed log
//! keeps, on real files.
//!
//! Guards against: a last segment cut at a frame boundary, a deleted last segment, or a
//! missing manifest opening as a shorter log with nothing reported (synced records silently
//! gone); an older copy of a rewritten middle segment accepted (records retention had dropped
//! come back); a frame larger than a commit group rotating an empty segment; a closed log
//! keeping its active segment's whole preallocation on disk.

use std::path::{Path, PathBuf};

use continuum::error::CorruptionKind;
use continuum::log::Rewrite;
use continuum::log::{LossEvidence, MANIFEST_FILE_NAME};
use continuum::{Durability, Error, Log, Lsn, RecoveryMode};

const SMALL_SEGMENT_BYTES: u64 = 4096;

fn record(i: u64) -> Vec<u8> {
    format!("record {i:05} ").repeat(4).into_bytes()
}

/// Appends records `from..to` with `Sync`.
fn append(log: &Log, from: u64, to: u64) {
    for i in from..to {
        log.append_with(&record(i), Durability::Sync).expect("append");
    }
}

/// Copies every file of the store but its lock: the image a crash (or a backup) leaves of a
/// log that is open, every appended record synced.
fn copy_store(from: &Path) -> tempfile::TempDir {
    let to = tempfile::tempdir().expect("temporary directory");
    for entry in std::fs::read_dir(from).expect("list") {
        let entry = entry.expect("entry");
        if entry.file_name() != "LOCK" {
            std::fs::copy(entry.path(), to.path().join(entry.file_name())).expect("copy");
        }
    }
    to
}

fn open(dir: &Path, mode: RecoveryMode) -> continuum::Result<Log> {
    Log::builder(dir).segment_bytes(SMALL_SEGMENT_BYTES).recovery_mode(mode).open()
}

fn truncate(path: &Path, len: u64) {
    std::fs::OpenOptions::new().write(true).open(path).expect("open").set_len(len).expect("truncate");
}

fn assert_records_lost(error: Error) {
    assert!(
        matches!(error, Error::Corruption { kind: CorruptionKind::RecordsLost { .. }, .. }),
        "expected RecordsLost, got {error}"
    );
}

/// Strict refuses the log, the default mode opens it and reports the loss (from `from_lsn`),
/// a read-only open reports it too.
fn assert_loss_found(dir: &Path, from_lsn: u64) -> Vec<continuum::log::LostRecords> {
    assert_records_lost(open(dir, RecoveryMode::Strict).expect_err("strict open"));
    let read_only = Log::builder(dir).open_read_only().expect("read-only open");
    assert!(!read_only.recovery_report().lost_records.is_empty(), "read-only open reports it");
    drop(read_only);
    let log = open(dir, RecoveryMode::TolerateTornTail).expect("default open");
    let lost = log.recovery_report().lost_records.clone();
    assert!(!lost.is_empty(), "the default open reports the loss");
    assert!(log.recovery_report().found_loss());
    assert_eq!(lost[0].from_lsn, from_lsn, "{lost:?}");
    assert_eq!(log.next_lsn(), Lsn::new(from_lsn));
    lost
}

#[test]
fn a_last_segment_cut_at_a_frame_boundary_is_lost_records() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let log = open(dir.path(), RecoveryMode::TolerateTornTail).expect("open");
    append(&log, 1, 6);
    let boundary = log.segments().last().expect("a segment").data_bytes;
    append(&log, 6, 10);
    let last = log.segments().last().expect("a segment").path.clone();
    let image = copy_store(dir.path());
    let copied = image.path().join(last.file_name().expect("a file name"));
    truncate(&copied, boundary);
    let lost = assert_loss_found(image.path(), 6);
    assert!(matches!(lost[0].evidence, LossEvidence::ShorterThanWritten { .. }), "{lost:?}");
    // Reported once: the open that found it records the log as it is from then on.
    drop(log);
    let reopened = open(image.path(), RecoveryMode::Strict).expect("strict open after the loss was reported");
    assert!(reopened.recovery_report().lost_records.is_empty());
}

#[test]
fn a_cut_after_a_clean_close_is_told_from_the_trim() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let log = open(dir.path(), RecoveryMode::TolerateTornTail).expect("open");
    append(&log, 1, 6);
    let boundary = log.segments().last().expect("a segment").data_bytes;
    append(&log, 6, 10);
    let last = log.segments().last().expect("a segment").path.clone();
    log.close().expect("close");
    let closed = open(dir.path(), RecoveryMode::Strict).expect("a trimmed log opens in strict mode");
    assert!(closed.recovery_report().lost_records.is_empty());
    closed.close().expect("close");
    truncate(&last, boundary);
    let lost = assert_loss_found(dir.path(), 6);
    assert!(
        lost.iter().any(|l| l.evidence == LossEvidence::EndsBeforeRecorded { recorded_next_lsn: 10 } && l.to_lsn == 10),
        "{lost:?}"
    );
}

/// A log of at least three segments, open, and its segment files.
fn three_segments(dir: &Path) -> (Log, Vec<PathBuf>) {
    let log = open(dir, RecoveryMode::TolerateTornTail).expect("open");
    let mut i = 1;
    while log.segments().len() < 3 {
        append(&log, i, i + 1);
        i += 1;
    }
    append(&log, i, i + 3);
    let paths = log.segments().into_iter().map(|segment| segment.path).collect();
    (log, paths)
}

#[test]
fn a_deleted_last_segment_is_lost_records() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let (log, paths) = three_segments(dir.path());
    let last_first_lsn = log.segments().last().expect("a segment").first_lsn.get();
    let image = copy_store(dir.path());
    std::fs::remove_file(image.path().join(paths[2].file_name().expect("a file name"))).expect("delete");
    let lost = assert_loss_found(image.path(), last_first_lsn);
    assert!(matches!(lost[0].evidence, LossEvidence::SegmentMissing { .. }), "{lost:?}");
    // The same after a clean close.
    log.close().expect("close");
    std::fs::remove_file(&paths[2]).expect("delete");
    assert_loss_found(dir.path(), last_first_lsn);
}

#[test]
fn a_deleted_manifest_is_lost_evidence() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let (log, _) = three_segments(dir.path());
    log.close().expect("close");
    std::fs::remove_file(dir.path().join(MANIFEST_FILE_NAME)).expect("delete");
    assert_records_lost(open(dir.path(), RecoveryMode::Strict).expect_err("strict open"));
    let log = open(dir.path(), RecoveryMode::TolerateTornTail).expect("default open");
    assert_eq!(log.recovery_report().lost_records[0].evidence, LossEvidence::ManifestMissing);
}

#[test]
fn an_older_copy_of_a_rewritten_middle_segment_is_refused() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let (log, paths) = three_segments(dir.path());
    let middle = log.segments()[1].clone();
    let older = std::fs::read(&middle.path).expect("read");
    let report = log
        .rewrite_segment(middle.first_lsn, |lsn, _| Ok(if lsn.get() % 2 == 0 { Rewrite::Drop } else { Rewrite::Keep }));
    assert!(report.expect("rewrite").dropped > 0);
    log.close().expect("close");
    std::fs::write(&paths[1], &older).expect("copy the older segment back");
    for mode in [RecoveryMode::Strict, RecoveryMode::TolerateTornTail] {
        let error = open(dir.path(), mode).expect_err("the older copy is refused");
        assert!(
            matches!(&error, Error::Corruption { kind: CorruptionKind::StaleSegment { listed_generation: 2, found_generation: 1, .. }, segment, .. } if *segment == paths[1]),
            "{error}"
        );
    }
    assert!(Log::builder(dir.path()).open_read_only().is_err(), "a read-only open refuses it too");
    let verified = continuum::inspect::verify(dir.path(), &mut |_, _| {}).expect("verify");
    assert!(!verified.is_clean(), "verify reports it");
}

#[test]
fn a_frame_larger_than_a_commit_group_does_not_rotate_an_empty_segment() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let log = Log::open(dir.path()).expect("open");
    let big = vec![7u8; 9 * 1024 * 1024];
    for _ in 0..10 {
        log.append_with(&big, Durability::Sync).expect("append");
    }
    // 64 MiB segments hold seven 9 MiB frames each.
    assert_eq!(log.segments().len(), 2, "{:?}", log.segments());
    assert_eq!(log.read(Lsn::new(10)).expect("read").as_deref(), Some(&big[..]));
}

/// Sum of the segment files' lengths in `dir`.
fn segment_file_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .expect("list")
        .map(|entry| entry.expect("entry"))
        .filter(|entry| entry.file_name().to_string_lossy().ends_with(".seg"))
        .map(|entry| entry.metadata().expect("metadata").len())
        .sum()
}

#[test]
fn a_clean_close_gives_back_the_preallocation_and_the_next_open_takes_it_again() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let log = Log::open(dir.path()).expect("open");
    append(&log, 1, 1001);
    let used: u64 = log.segments().iter().map(|segment| segment.data_bytes).sum();
    assert_eq!(segment_file_bytes(dir.path()), 64 * 1024 * 1024, "the active segment is preallocated");
    log.close().expect("close");
    assert_eq!(segment_file_bytes(dir.path()), used, "a closed log's segment files hold only their data");
    let reopened = Log::open(dir.path()).expect("reopen");
    assert_eq!(segment_file_bytes(dir.path()), 64 * 1024 * 1024, "preallocated again");
    append(&reopened, 1001, 1101);
    assert_eq!(reopened.read(Lsn::new(1100)).expect("read").as_deref(), Some(&record(1100)[..]));
    drop(reopened);
    let log = Log::builder(dir.path()).recovery_mode(RecoveryMode::Strict).open().expect("strict reopen");
    assert_eq!(log.next_lsn(), Lsn::new(1101));
}

/// Bytes per atom of a store by file lengths (what `du --apparent-size` shows), open and after
/// a clean close: the figure `docs/BENCHMARKS.md` records for the close trim. Run with
/// `CONTINUUM_BYTES_PER_ATOM_ATOMS=200000 cargo test --release --test recovery_tail_loss
/// store_bytes_per_atom -- --nocapture` (20,000 atoms by default).
#[test]
fn store_bytes_per_atom_after_a_clean_close() {
    use continuum::synthetic::Transcript;
    use continuum::{AtomOutput, RunSpec, Store};
    const AGENTS: u64 = 16;
    let atoms_var = std::env::var("CONTINUUM_BYTES_PER_ATOM_ATOMS").ok();
    let atoms: u64 = atoms_var.and_then(|atoms| atoms.parse().ok()).unwrap_or(20_000);
    let dir = tempfile::tempdir().expect("temporary directory");
    let store = Store::builder(dir.path()).atom_durability(Durability::Buffered).open().expect("open");
    let run = store.create_run(RunSpec::new("bytes-per-atom")).expect("run");
    let mut transcript = Transcript::new(6);
    let mut last = vec![None; AGENTS as usize];
    for i in 0..atoms {
        let agent = (i % AGENTS) as usize;
        let parents: Vec<_> = last[agent].into_iter().collect();
        let output = AtomOutput { delta: transcript.next_delta(511), result: format!("result {i}").into_bytes() };
        let name = format!("agent-{agent}");
        let atom = store.record_atom(run, &name, &format!("step-{i}"), &parents, "", &output).expect("record");
        last[agent] = Some(atom);
    }
    let open_bytes = all_file_bytes(dir.path());
    store.close().expect("close");
    let closed_bytes = all_file_bytes(dir.path());
    let closed = Log::open_read_only(dir.path()).expect("read-only open");
    let segments = closed.segments();
    drop(closed);
    let used: u64 = segments.iter().map(|segment| segment.data_bytes).sum();
    let active = segments.last().expect("a segment");
    let active_bytes = std::fs::metadata(&active.path).expect("metadata").len();
    assert_eq!(active_bytes, active.data_bytes, "a closed store's active segment holds only its data");
    let per_atom = |bytes: u64| bytes as f64 / atoms as f64;
    eprintln!(
        "{atoms} atoms: {:.1} bytes per atom open, {:.1} after a clean close ({:.1} of them segment data)",
        per_atom(open_bytes),
        per_atom(closed_bytes),
        per_atom(used)
    );
    assert!(closed_bytes < open_bytes, "the close gave the preallocation back");
    let store = Store::open(dir.path()).expect("reopen");
    assert_eq!(store.log().recovery_report().lost_records, Vec::new());
}

/// Sum of the lengths of every file under `dir`.
fn all_file_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).expect("list") {
        let entry = entry.expect("entry");
        let metadata = entry.metadata().expect("metadata");
        total += if metadata.is_dir() { all_file_bytes(&entry.path()) } else { metadata.len() };
    }
    total
}

/// A log on the simulator in `/store`, with small segments, in `mode`.
fn sim_open(sim: &continuum::storage::sim::SimStorage, mode: RecoveryMode) -> continuum::Result<Log> {
    Log::builder("/store")
        .storage(std::sync::Arc::new(sim.clone()))
        .segment_bytes(SMALL_SEGMENT_BYTES)
        .recovery_mode(mode)
        .open()
}

/// Records 1..=80 over several segments, every one synced.
const SIM_RECORDS: u64 = 80;

#[test]
fn a_crash_anywhere_in_a_close_or_in_the_open_after_it_is_never_lost_records() {
    use continuum::storage::sim::{CrashDamage, SimStorage};
    // I/O calls of a clean close, and of the open after it.
    let sim = SimStorage::new(0);
    let log = sim_open(&sim, RecoveryMode::Strict).expect("open");
    append(&log, 1, SIM_RECORDS + 1);
    let before = sim.op_count();
    log.close().expect("close");
    let close_ops = sim.op_count() - before;
    let before = sim.op_count();
    drop(sim_open(&sim, RecoveryMode::Strict).expect("reopen"));
    let reopen_ops = sim.op_count() - before;
    let mut states = 0;
    for in_close in [true, false] {
        let ops = if in_close { close_ops } else { reopen_ops };
        for crash_at in 0..=ops {
            for (d, damage) in CrashDamage::ALL.into_iter().enumerate() {
                let sim = SimStorage::new(crash_at * 16 + d as u64);
                let log = sim_open(&sim, RecoveryMode::Strict).expect("open");
                append(&log, 1, SIM_RECORDS + 1);
                if in_close {
                    sim.halt_after(crash_at);
                    let _ = log.close();
                } else {
                    log.close().expect("close");
                    sim.halt_after(crash_at);
                    drop(sim_open(&sim, RecoveryMode::Strict));
                }
                sim.crash(damage);
                let context = format!(
                    "crash after call {crash_at} of the {}, {damage:?}",
                    if in_close { "close" } else { "reopen" }
                );
                // Not strict: unsynced zeros written ahead of the data may come back torn.
                let log =
                    sim_open(&sim, RecoveryMode::TolerateTornTail).unwrap_or_else(|e| panic!("{context}: reopen: {e}"));
                assert_eq!(log.recovery_report().lost_records, Vec::new(), "{context}");
                assert_eq!(log.next_lsn(), Lsn::new(SIM_RECORDS + 1), "{context}");
                assert_eq!(log.read(Lsn::new(SIM_RECORDS)).expect("read").as_deref(), Some(&record(SIM_RECORDS)[..]));
                states += 1;
            }
        }
    }
    assert!(states > 50, "{states} crash states");
}
