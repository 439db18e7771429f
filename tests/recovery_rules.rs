//! The recovery rules of docs/FORMAT.md §6, one scenario each, on the simulator: a damaged
//! frame followed by valid ones is corruption (never a torn tail), except for a hole of whole
//! zero sectors in the last segment, which is a write the kernel never wrote back; a sealed
//! segment may not end in garbage; Strict refuses a torn tail; SkipCorrupted salvages.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use continuum::storage::sim::SimStorage;
use continuum::storage::{OpenMode, Storage};
use continuum::{CorruptionKind, Error, Log, Lsn, RecoveryMode};

const SEGMENT_BYTES: u64 = 16 * 1024;

/// A log with two sealed segments and an active one, all synced; returns the segment paths.
fn build(sim: &SimStorage) -> Vec<PathBuf> {
    let log = common::open(sim, SEGMENT_BYTES).expect("open");
    for i in 0..300u64 {
        log.append(&common::payload(i)).expect("append");
    }
    let segments: Vec<PathBuf> = log.segments().into_iter().map(|s| s.path).collect();
    assert!(segments.len() >= 3, "need sealed segments and an active one");
    segments
}

fn reopen(sim: &SimStorage, mode: RecoveryMode) -> continuum::Result<Log> {
    Log::builder(Path::new(common::DIR))
        .storage(Arc::new(sim.clone()))
        .segment_bytes(SEGMENT_BYTES)
        .recovery_mode(mode)
        .open()
}

#[test]
fn a_flipped_byte_before_valid_frames_is_corruption_in_the_last_segment() {
    let sim = SimStorage::new(1);
    let segments = build(&sim);
    let last = segments.last().expect("segments");
    sim.overwrite(last, 64 + 40, &[0x5A]);
    match reopen(&sim, RecoveryMode::TolerateTornTail) {
        Err(Error::Corruption { segment, offset, kind: CorruptionKind::InvalidBatchBeforeValid { .. } }) => {
            assert_eq!(&segment, last);
            assert_eq!(offset, 64, "the error names the damaged frame");
        }
        other => panic!("expected corruption, got {other:?}"),
    }
}

#[test]
fn a_zero_sector_hole_in_unsynced_frames_of_the_last_segment_is_a_torn_write() {
    // Pages of unsynced writes reach the disk in any order: a page that never did reads as
    // zeros, while later frames of the same unsynced stretch may be intact.
    let sim = SimStorage::new(2);
    let segments = build(&sim);
    let last = segments.last().expect("segments");
    let synced_end = reopen(&sim, RecoveryMode::Strict).expect("clean").segments().last().expect("s").data_bytes;
    let unsynced_start = append_unsynced_keeping_all(&sim);
    assert_eq!(unsynced_start, synced_end);
    let hole = unsynced_start.next_multiple_of(512);
    sim.overwrite(last, hole, &[0u8; 512]);
    let log = reopen(&sim, RecoveryMode::TolerateTornTail).expect("a zero hole in unsynced frames is a torn write");
    let torn = log.recovery_report().torn_tail.clone().expect("reported as a torn tail");
    assert_eq!(&torn.segment, last);
    assert!(torn.offset >= unsynced_start && torn.offset <= hole);
    // Every synced record is intact.
    let records: Vec<_> = log.iter_from(Lsn::FIRST).expect("iter").collect::<Result<_, _>>().expect("read");
    assert!(records.len() >= 300);
    for (lsn, bytes) in records.iter().take(300) {
        assert_eq!(bytes.as_ref(), common::payload(lsn.get() - 1).as_slice());
    }
}

/// Appends 20 unsynced records and keeps them all through a power loss (as if every page had
/// been written back); returns where they start.
fn append_unsynced_keeping_all(sim: &SimStorage) -> u64 {
    let log = common::open(sim, SEGMENT_BYTES).expect("open");
    let start = log.segments().last().expect("segments").data_bytes;
    for i in 0..20u64 {
        log.append_with(&common::payload(1000 + i), continuum::Durability::None).expect("append");
    }
    drop(log); // close syncs: the bytes are all on disk, but their frames say they were unsynced
    start
}

#[test]
fn a_zero_sector_hole_in_synced_frames_of_the_last_segment_is_corruption() {
    // Later frames were written after the damaged range was synced: it cannot be a torn write.
    let sim = SimStorage::new(7);
    let segments = build(&sim);
    let last = segments.last().expect("segments");
    sim.overwrite(last, 1024, &[0u8; 512]);
    match reopen(&sim, RecoveryMode::TolerateTornTail) {
        Err(Error::Corruption { segment, kind: CorruptionKind::InvalidBatchBeforeValid { .. }, .. }) => {
            assert_eq!(&segment, last)
        }
        other => panic!("expected corruption, got {other:?}"),
    }
}

#[test]
fn a_zero_sector_hole_in_a_sealed_segment_is_corruption() {
    let sim = SimStorage::new(3);
    let segments = build(&sim);
    sim.overwrite(&segments[0], 1024, &[0u8; 512]);
    match reopen(&sim, RecoveryMode::TolerateTornTail) {
        Err(Error::Corruption { segment, .. }) => assert_eq!(segment, segments[0]),
        other => panic!("expected corruption, got {other:?}"),
    }
}

#[test]
fn strict_refuses_a_torn_tail_that_tolerate_cuts() {
    let sim = SimStorage::new(4);
    let segments = build(&sim);
    let last = segments.last().expect("segments");
    let data_end = {
        let log = reopen(&sim, RecoveryMode::Strict).expect("a clean log opens strictly");
        log.segments().last().expect("segments").data_bytes
    };
    // Past the end of the file a clean close trimmed: the bytes a crash could leave there.
    let file = sim.open(last, OpenMode::ReadWrite).expect("open the segment");
    file.write_all_at(&[0xEE; 100], data_end).expect("write garbage");
    file.sync_data().expect("sync");
    drop(file);
    match reopen(&sim, RecoveryMode::Strict) {
        Err(Error::Corruption { offset, kind: CorruptionKind::TornTail { bytes: 100 }, .. }) => {
            assert_eq!(offset, data_end)
        }
        other => panic!("expected a strict torn-tail error, got {other:?}"),
    }
    let log = reopen(&sim, RecoveryMode::TolerateTornTail).expect("tolerated");
    let torn = log.recovery_report().torn_tail.clone().expect("torn tail reported");
    assert_eq!((torn.offset, torn.bytes), (data_end, 100));
    drop(log);
    // The cut was durable and zero-filled: the next open is clean, even in strict mode.
    let log = reopen(&sim, RecoveryMode::Strict).expect("clean after the cut");
    assert_eq!(log.recovery_report().torn_tail, None);
}

#[test]
fn skip_corrupted_salvages_every_valid_frame_and_reports_the_loss() {
    let sim = SimStorage::new(5);
    let segments = build(&sim);
    sim.overwrite(&segments[1], 64 + 8, &[0xFF, 0xFF]);
    assert!(reopen(&sim, RecoveryMode::TolerateTornTail).is_err());
    let log = reopen(&sim, RecoveryMode::SkipCorrupted).expect("salvage");
    let report = log.recovery_report();
    assert_eq!(report.skipped.len(), 1);
    assert_eq!(report.skipped[0].segment, segments[1]);
    assert_eq!(report.lost_lsns.len(), 1);
    let (lost_from, lost_to) = report.lost_lsns[0];
    for item in log.iter_from(Lsn::FIRST).expect("iter") {
        let (lsn, bytes) = item.expect("record");
        assert!(lsn.get() < lost_from || lsn.get() >= lost_to, "lost LSN {lsn} returned");
        assert_eq!(bytes.as_ref(), common::payload(lsn.get() - 1).as_slice());
    }
    assert_eq!(log.read(Lsn::new(lost_from)).expect("read"), None);
}

#[test]
fn a_missing_middle_segment_is_an_lsn_gap() {
    let sim = SimStorage::new(6);
    let segments = build(&sim);
    let log = common::open(&sim, SEGMENT_BYTES).expect("open");
    drop(log);
    // Remove the middle segment behind the log's back.
    let storage: &dyn continuum::storage::Storage = &sim;
    storage.remove_file(&segments[1]).expect("remove");
    storage.sync_dir(Path::new(common::DIR)).expect("sync");
    match reopen(&sim, RecoveryMode::TolerateTornTail) {
        Err(Error::Corruption { segment, kind: CorruptionKind::LsnGap { .. }, .. }) => assert_eq!(segment, segments[2]),
        other => panic!("expected an LSN gap, got {other:?}"),
    }
}
