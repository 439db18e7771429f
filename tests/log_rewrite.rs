//! `Log::rewrite_segment`, compaction's primitive: a sealed segment is rewritten without some
//! records (and with others replaced), keeping every LSN of what stays, across reopen and
//! across a crash at every I/O call of the rewrite; with plain frames and with compressed ones
//! (`RewriteOptions::compression`, format version 2), which must also refuse every flipped byte.

mod common;

use std::collections::BTreeMap;

use common::{open, payload};
use continuum::log::{FrameCompression, Rewrite, RewriteOptions, RewriteReport};
use continuum::storage::sim::{CrashDamage, SimStorage};
use continuum::{Error, Log, Lsn, RecoveryMode};

const SEGMENT_BYTES: u64 = 4096;

/// Plain frames, and compressed frames small enough that a 4 KiB segment holds several.
const OPTIONS: [RewriteOptions; 2] = [
    RewriteOptions { compression: None },
    RewriteOptions { compression: Some(FrameCompression { level: 3, frame_bytes: 4096 }) },
];

/// What the test expects at each LSN: `None` for a dropped record.
type Expected = BTreeMap<u64, Option<Vec<u8>>>;

fn fill(log: &Log, count: u64) -> Expected {
    let mut expected = Expected::new();
    for i in 0..count {
        let record = payload(i);
        let lsn = log.append_with(&record, continuum::Durability::Sync).expect("append");
        expected.insert(lsn.get(), Some(record));
    }
    expected
}

/// The test's rule: drop LSNs divisible by 3, replace those divisible by 5 (and not 3).
fn decide(lsn: Lsn, _bytes: &bytes::Bytes) -> continuum::Result<Rewrite> {
    Ok(match lsn.get() {
        n if n % 3 == 0 => Rewrite::Drop,
        n if n % 5 == 0 => Rewrite::Replace(format!("replaced {n}").into_bytes()),
        _ => Rewrite::Keep,
    })
}

fn apply_rule(expected: &mut Expected, range: std::ops::Range<u64>) {
    for lsn in range {
        let value = match lsn {
            n if n % 3 == 0 => None,
            n if n % 5 == 0 => Some(format!("replaced {n}").into_bytes()),
            _ => continue,
        };
        expected.insert(lsn, value);
    }
}

fn check(log: &Log, expected: &Expected, context: &str) {
    for (lsn, want) in expected {
        let got = log.read(Lsn::new(*lsn)).unwrap_or_else(|e| panic!("{context}: read {lsn}: {e}"));
        assert_eq!(got.as_deref(), want.as_deref(), "{context}: LSN {lsn}");
    }
    let iterated: Vec<(u64, Vec<u8>)> = log
        .iter_from(Lsn::FIRST)
        .expect("iter")
        .map(|item| item.map(|(lsn, bytes)| (lsn.get(), bytes.to_vec())))
        .collect::<continuum::Result<_>>()
        .unwrap_or_else(|e| panic!("{context}: iterate: {e}"));
    let present: Vec<(u64, Vec<u8>)> =
        expected.iter().filter_map(|(lsn, want)| want.clone().map(|bytes| (*lsn, bytes))).collect();
    assert_eq!(iterated, present, "{context}: iteration");
}

fn sealed(log: &Log) -> Vec<(u64, u64)> {
    log.segments().into_iter().filter(|s| s.sealed).map(|s| (s.first_lsn.get(), s.next_lsn.get())).collect()
}

#[test]
fn rewriting_keeps_lsns_and_survives_reopen() {
    for options in OPTIONS {
        rewrite_and_reopen(options);
    }
}

fn rewrite_and_reopen(options: RewriteOptions) {
    let sim = SimStorage::new(1);
    let log = open(&sim, SEGMENT_BYTES).expect("open");
    let mut expected = fill(&log, 60);
    let segments = sealed(&log);
    assert!(segments.len() >= 3, "the workload spans several segments");
    let mut totals = RewriteReport::default();
    for &(first, next) in &segments {
        let report = log.rewrite_segment_with(Lsn::new(first), options, decide).expect("rewrite");
        assert!(report.bytes_after < report.bytes_before, "{report:?}");
        totals.dropped += report.dropped;
        apply_rule(&mut expected, first..next);
    }
    assert!(totals.dropped > 0);
    let compressed = log.segments().iter().filter(|s| s.compressed).count();
    assert_eq!(compressed, if options.compression.is_some() { segments.len() } else { 0 }, "{options:?}");
    check(&log, &expected, "after rewrite");
    // The segments keep their LSN ranges, so the log stays contiguous.
    assert_eq!(sealed(&log), segments);

    // Appends continue, and everything survives a reopen.
    let more = payload(1000);
    let lsn = log.append(&more).expect("append after rewrite");
    expected.insert(lsn.get(), Some(more));
    drop(log);
    sim.crash(CrashDamage::ALL[0]);
    let log = open(&sim, SEGMENT_BYTES).expect("reopen");
    check(&log, &expected, "after reopen");

    // A rewritten segment can be rewritten again, down to nothing.
    let (first, next) = segments[0];
    log.rewrite_segment(Lsn::new(first), |_, _| Ok(Rewrite::Drop)).expect("rewrite again");
    for lsn in first..next {
        expected.insert(lsn, None);
    }
    check(&log, &expected, "after emptying a segment");
    drop(log);
    let log = open(&sim, SEGMENT_BYTES).expect("reopen after emptying");
    check(&log, &expected, "after emptying and reopening");
    // An empty leading segment can be truncated away.
    assert_eq!(log.truncate_prefix(Lsn::new(next)).expect("truncate"), 1);
    assert_eq!(log.first_lsn(), Lsn::new(next));
}

#[test]
fn only_sealed_segments_can_be_rewritten() {
    let sim = SimStorage::new(2);
    let log = open(&sim, SEGMENT_BYTES).expect("open");
    fill(&log, 3);
    let active = log.segments().last().expect("active").first_lsn;
    assert!(matches!(log.rewrite_segment(active, decide), Err(Error::NotSealed { .. })));
    assert!(matches!(log.rewrite_segment(Lsn::new(2), decide), Err(Error::NotSealed { first_lsn: 2 })));
}

#[test]
fn a_failing_decision_changes_nothing() {
    let sim = SimStorage::new(3);
    let log = open(&sim, SEGMENT_BYTES).expect("open");
    let expected = fill(&log, 40);
    let (first, _) = sealed(&log)[0];
    let outcome = log.rewrite_segment(Lsn::new(first), |lsn, _| {
        if lsn.get() == first + 2 { Err(Error::UnknownAtom { atom: 7 }) } else { Ok(Rewrite::Drop) }
    });
    assert!(matches!(outcome, Err(Error::UnknownAtom { atom: 7 })));
    check(&log, &expected, "after a refused rewrite");
    assert!(sim.file_names(std::path::Path::new(common::DIR)).iter().all(|name| !name.ends_with(".tmp")));
}

/// Crash after every I/O call of a rewrite, with every damage kind: each segment holds either
/// all of its original records or exactly the rewritten ones, and nothing else changes.
#[test]
fn a_crash_at_any_point_of_a_rewrite_leaves_the_original_or_the_rewrite() {
    for options in OPTIONS {
        crash_during_rewrite(options);
    }
}

fn crash_during_rewrite(options: RewriteOptions) {
    let ops = {
        let sim = SimStorage::new(4);
        let log = open(&sim, SEGMENT_BYTES).expect("open");
        fill(&log, 40);
        let (first, _) = sealed(&log)[0];
        let before = sim.op_count();
        log.rewrite_segment_with(Lsn::new(first), options, decide).expect("rewrite");
        sim.op_count() - before
    };
    let mut states = 0;
    for crash_at in 0..=ops {
        for damage in CrashDamage::ALL {
            let sim = SimStorage::new(100 + crash_at);
            let log = open(&sim, SEGMENT_BYTES).expect("open");
            let original = fill(&log, 40);
            let (first, next) = sealed(&log)[0];
            sim.halt_after(crash_at);
            let outcome = log.rewrite_segment_with(Lsn::new(first), options, decide);
            drop(log);
            sim.crash(damage);
            let context = format!("crash after op {crash_at} of {ops} with {damage:?} ({outcome:?})");
            let log = open(&sim, SEGMENT_BYTES).unwrap_or_else(|e| panic!("{context}: reopen: {e}"));
            let mut rewritten = original.clone();
            apply_rule(&mut rewritten, first..next);
            let kept = log.read(Lsn::new(first + 2)).expect("read").is_some(); // first + 2 is 3: dropped
            let want = if kept { &original } else { &rewritten };
            assert!(outcome.is_err() || !kept, "{context}: an acknowledged rewrite was undone");
            check(&log, want, &context);
            states += 1;
        }
    }
    eprintln!(
        "rewrite crash points ({options:?}): {ops} I/O calls × {} damage kinds = {states} states",
        CrashDamage::ALL.len()
    );
    assert!(ops >= 4, "a rewrite makes at least create, write, sync, rename, sync-dir calls");
}

/// A compressed rewrite is smaller than a plain one of the same records, and a plain rewrite
/// of a compressed segment turns it back into format version 1.
#[test]
fn compressed_frames_are_smaller_and_can_be_rewritten_plain() {
    let sizes: Vec<u64> = OPTIONS
        .iter()
        .map(|options| {
            let sim = SimStorage::new(5);
            let log = open(&sim, SEGMENT_BYTES).expect("open");
            fill(&log, 40);
            let (first, _) = sealed(&log)[0];
            log.rewrite_segment_with(Lsn::new(first), *options, |_, _| Ok(Rewrite::Keep)).expect("rewrite").bytes_after
        })
        .collect();
    assert!(sizes[1] * 2 < sizes[0], "compressed {} bytes against plain {}", sizes[1], sizes[0]);

    let sim = SimStorage::new(6);
    let log = open(&sim, SEGMENT_BYTES).expect("open");
    let expected = fill(&log, 40);
    let (first, _) = sealed(&log)[0];
    log.rewrite_segment_with(Lsn::new(first), OPTIONS[1], |_, _| Ok(Rewrite::Keep)).expect("compress");
    assert!(log.segments()[0].compressed);
    check(&log, &expected, "compressed");
    log.rewrite_segment(Lsn::new(first), |_, _| Ok(Rewrite::Keep)).expect("rewrite plain");
    assert!(!log.segments()[0].compressed);
    drop(log);
    let log = open(&sim, SEGMENT_BYTES).expect("reopen");
    assert!(!log.segments()[0].compressed);
    check(&log, &expected, "compressed, then plain, then reopened");
}

/// Out-of-range compression settings are refused before anything is written.
#[test]
fn compression_settings_out_of_range_are_refused() {
    let sim = SimStorage::new(7);
    let log = open(&sim, SEGMENT_BYTES).expect("open");
    let expected = fill(&log, 40);
    let (first, _) = sealed(&log)[0];
    for compression in [
        FrameCompression { level: 0, frame_bytes: 4096 },
        FrameCompression { level: 23, frame_bytes: 4096 },
        FrameCompression { level: 3, frame_bytes: 16 },
        FrameCompression { level: 3, frame_bytes: 64 << 20 },
    ] {
        let options = RewriteOptions { compression: Some(compression) };
        let outcome = log.rewrite_segment_with(Lsn::new(first), options, |_, _| Ok(Rewrite::Keep));
        assert!(matches!(outcome, Err(Error::InvalidConfig { .. })), "{compression:?}: {outcome:?}");
    }
    check(&log, &expected, "after refused settings");
}

/// Every byte of a compressed segment flipped, one at a time, in every recovery mode: the open
/// fails naming the segment, or every record read back is the one written (a record may be
/// missing only where `SkipCorrupted` reported a skip); never changed bytes returned as valid.
#[test]
fn flips_in_a_compressed_segment_are_never_returned() {
    let sim = SimStorage::new(8);
    let (expected, path, len) = {
        let log = open(&sim, SEGMENT_BYTES).expect("open");
        let expected = fill(&log, 40);
        let (first, _) = sealed(&log)[0];
        log.rewrite_segment_with(Lsn::new(first), OPTIONS[1], |_, _| Ok(Rewrite::Keep)).expect("compress");
        let segment = log.segments()[0].clone();
        (expected, segment.path, segment.data_bytes)
    };
    let pristine = sim.file_bytes(&path).expect("segment bytes");
    assert_eq!(pristine.len() as u64, len, "a rewritten segment is exactly as long as its frames");
    let files = common::DurableFiles::take(&sim, std::path::Path::new(common::DIR));
    let (mut refused, mut read_back) = (0, 0);
    for (at, &byte) in pristine.iter().enumerate() {
        for mode in [RecoveryMode::TolerateTornTail, RecoveryMode::Strict, RecoveryMode::SkipCorrupted] {
            let damaged = files.restore();
            damaged.overwrite(&path, at as u64, &[byte ^ 0x01]);
            let context = format!("flip at {at} in {mode:?}");
            let log = match continuum::Log::builder(common::DIR)
                .storage(std::sync::Arc::new(damaged))
                .segment_bytes(SEGMENT_BYTES)
                .recovery_mode(mode)
                .open()
            {
                Ok(log) => log,
                Err(Error::Corruption { segment, .. }) => {
                    assert_eq!(segment, path, "{context}: the error names the damaged segment");
                    refused += 1;
                    continue;
                }
                Err(other) => panic!("{context}: {other}"),
            };
            let skipped = !log.recovery_report().lost_lsns.is_empty() || !log.recovery_report().skipped.is_empty();
            for (lsn, want) in &expected {
                match log.read(Lsn::new(*lsn)) {
                    Ok(Some(got)) => assert_eq!(Some(got.to_vec()), *want, "{context}: LSN {lsn}"),
                    Ok(None) => assert!(skipped, "{context}: LSN {lsn} lost without a report"),
                    Err(Error::Corruption { .. }) => {}
                    Err(other) => panic!("{context}: read {lsn}: {other}"),
                }
            }
            read_back += 1;
        }
    }
    eprintln!("compressed segment: {} flips × 3 modes: {refused} opens refused, {read_back} read back", pristine.len());
    assert!(refused > 0);
}
