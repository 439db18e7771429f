//! Basic behaviour of the log on the real file system: append, read, iterate, reopen, rotate,
//! truncate, lock, and invalid input. Guards the contract every other layer builds on.

use std::sync::Arc;

use continuum::{Durability, Error, Log, Lsn};

fn record(i: u64) -> Vec<u8> {
    format!("record {i} ").repeat((i % 7 + 1) as usize).into_bytes()
}

#[test]
fn appends_read_back_across_reopen_and_rotation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::builder(dir.path()).segment_bytes(8 * 1024).open().expect("open");
    let mut lsns = Vec::new();
    for i in 0..500u64 {
        lsns.push(log.append(&record(i)).expect("append"));
    }
    assert_eq!(lsns[0], Lsn::FIRST);
    assert!(lsns.windows(2).all(|w| w[1] == w[0].next()));
    assert!(log.segments().len() > 5, "8 KiB segments must rotate");
    for (i, lsn) in lsns.iter().enumerate() {
        assert_eq!(log.read(*lsn).expect("read").as_deref(), Some(record(i as u64).as_slice()));
    }
    drop(log);
    let log = Log::builder(dir.path()).segment_bytes(8 * 1024).open().expect("reopen");
    assert_eq!(log.recovery_report().records, 500);
    assert_eq!(log.recovery_report().torn_tail, None);
    let all: Vec<_> = log.iter_from(Lsn::FIRST).expect("iter").collect::<Result<_, _>>().expect("records");
    assert_eq!(all.len(), 500);
    for (i, (lsn, bytes)) in all.iter().enumerate() {
        assert_eq!(*lsn, lsns[i]);
        assert_eq!(bytes.as_ref(), record(i as u64).as_slice());
    }
    let next = log.append(b"after reopen").expect("append after reopen");
    assert_eq!(next, Lsn::new(501));
}

#[test]
fn batches_get_consecutive_lsns_and_iteration_starts_anywhere() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::builder(dir.path()).segment_bytes(16 * 1024).open().expect("open");
    let records: Vec<Vec<u8>> = (0..40).map(record).collect();
    let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
    let range = log.append_batch(&refs).expect("batch");
    assert_eq!(range.len(), 40);
    assert_eq!(range.last(), Lsn::new(40));
    let from_17: Vec<_> = log.iter_from(Lsn::new(17)).expect("iter").map(|r| r.expect("record").0).collect();
    assert_eq!(from_17, (17..=40).map(Lsn::new).collect::<Vec<_>>());
    assert_eq!(log.read(Lsn::new(41)).expect("read"), None);
    assert_eq!(log.read(Lsn::new(0)).expect("read"), None);
}

#[test]
fn truncate_prefix_deletes_only_whole_old_segments() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::builder(dir.path()).segment_bytes(4 * 1024).open().expect("open");
    for i in 0..300u64 {
        log.append(&record(i)).expect("append");
    }
    let before = log.segments();
    let cut = before[3].first_lsn;
    let removed = log.truncate_prefix(cut).expect("truncate");
    assert_eq!(removed, 3);
    assert_eq!(log.first_lsn(), cut);
    assert_eq!(log.read(Lsn::new(1)).expect("read"), None);
    assert!(log.read(cut).expect("read").is_some());
    // The active segment is never removed.
    log.truncate_prefix(Lsn::new(u64::MAX)).expect("truncate all");
    assert_eq!(log.segments().len(), 1);
    drop(log);
    let log = Log::builder(dir.path()).segment_bytes(4 * 1024).open().expect("reopen after truncation");
    assert_eq!(log.next_lsn(), Lsn::new(301));
}

#[test]
fn second_open_is_refused_while_locked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::open(dir.path()).expect("open");
    match Log::open(dir.path()) {
        Err(Error::Locked { dir: locked }) => assert_eq!(locked, dir.path()),
        other => panic!("expected Locked, got {other:?}"),
    }
    drop(log);
    Log::open(dir.path()).expect("open after the first handle closed");
}

#[test]
fn invalid_input_is_a_typed_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::builder(dir.path()).segment_bytes(4096).open().expect("open");
    assert!(matches!(log.append_batch(&[]), Err(Error::EmptyBatch)));
    assert!(matches!(log.append(&vec![0u8; 8192]), Err(Error::RecordTooLarge { .. })));
    assert!(matches!(Log::builder(dir.path()).segment_bytes(10).open(), Err(Error::InvalidConfig { .. })));
    // Refused appends leave the log untouched.
    assert_eq!(log.append(b"ok").expect("append"), Lsn::FIRST);
}

#[test]
fn concurrent_appenders_share_the_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Arc::new(Log::builder(dir.path()).segment_bytes(64 * 1024).open().expect("open"));
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                (0..100u64)
                    .map(|i| {
                        let durability = [Durability::Sync, Durability::Buffered, Durability::None][(i % 3) as usize];
                        let payload = format!("thread {t} record {i}");
                        (log.append_with(payload.as_bytes(), durability).expect("append"), payload)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let written: Vec<_> = threads.into_iter().flat_map(|t| t.join().expect("thread")).collect();
    log.sync().expect("sync");
    for (lsn, payload) in &written {
        assert_eq!(log.read(*lsn).expect("read").as_deref(), Some(payload.as_bytes()));
    }
    let mut lsns: Vec<u64> = written.iter().map(|(lsn, _)| lsn.get()).collect();
    lsns.sort_unstable();
    assert_eq!(lsns, (1..=800).collect::<Vec<_>>());
}

/// Records as `(lsn, bytes)`.
type Records = Vec<(u64, Vec<u8>)>;

/// Every record `visit_lsns` calls back with, and its count.
fn visit_lsns(log: &Log, lsns: &[u64]) -> continuum::Result<(usize, Records)> {
    let mut seen = Vec::new();
    let count = log.visit_lsns(lsns, |lsn, record| {
        seen.push((lsn, record.bytes().to_vec()));
        Ok(true)
    })?;
    Ok((count, seen))
}

#[test]
fn visit_lsns_reads_the_records_asked_for_across_frames_and_segments() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::builder(dir.path()).segment_bytes(4 * 1024).open().expect("open");
    // Single appends and batches of three: frames of one record and of several.
    let mut written = Vec::new();
    for i in 0..200u64 {
        if i % 5 == 0 {
            let batch: Vec<Vec<u8>> = (0..3).map(|j| record(i * 10 + j)).collect();
            let refs: Vec<&[u8]> = batch.iter().map(Vec::as_slice).collect();
            let range = log.append_batch(&refs).expect("batch");
            written.extend(range.iter().map(Lsn::get).zip(batch));
        } else {
            let bytes = record(i * 10);
            written.push((log.append(&bytes).expect("append").get(), bytes));
        }
    }
    assert!(log.segments().len() > 3, "4 KiB segments must rotate");
    // One record in seven, the middle record of some batches, and LSNs the log does not hold.
    let wanted: Vec<&(u64, Vec<u8>)> = written.iter().filter(|(lsn, _)| lsn % 7 == 3).collect();
    let mut lsns: Vec<u64> = wanted.iter().map(|(lsn, _)| *lsn).collect();
    lsns.extend([written.len() as u64 + 1, written.len() as u64 + 50]);
    let (count, seen) = visit_lsns(&log, &lsns).expect("visit");
    assert_eq!(count, wanted.len());
    assert_eq!(seen, wanted.into_iter().cloned().collect::<Vec<_>>());
    // LSN 0 precedes every record; an empty list visits nothing.
    assert_eq!(visit_lsns(&log, &[0, 1]).expect("visit").1, vec![written[0].clone()]);
    assert_eq!(visit_lsns(&log, &[]).expect("visit").0, 0);
    // The callback stops the visit.
    let mut calls = 0;
    let count = log
        .visit_lsns(&lsns, |_, _| {
            calls += 1;
            Ok(calls < 3)
        })
        .expect("visit");
    assert_eq!((count, calls), (3, 3));
    // Unsorted or repeated LSNs are refused.
    assert!(matches!(log.visit_lsns(&[5, 3], |_, _| Ok(true)), Err(Error::InvalidArgument { .. })));
    assert!(matches!(log.visit_lsns(&[5, 5], |_, _| Ok(true)), Err(Error::InvalidArgument { .. })));
    // Records in truncated segments are passed over.
    let removed = log.truncate_prefix(Lsn::new(lsns[lsns.len() / 2])).expect("truncate");
    assert!(removed > 0);
    let first = log.first_lsn().get();
    let (count, seen) = visit_lsns(&log, &lsns).expect("visit after truncation");
    let kept: Vec<_> = written.iter().filter(|(lsn, _)| lsn % 7 == 3 && *lsn >= first).cloned().collect();
    assert_eq!((count, seen), (kept.len(), kept));
}

#[test]
fn visit_lsns_verifies_the_frames_it_reads_and_steps_over_the_others() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::builder(dir.path()).segment_bytes(64 * 1024).open().expect("open");
    for i in 1..=60u64 {
        log.append(format!("marker-{i:05} {}", "x".repeat(200)).as_bytes()).expect("append");
    }
    // Damage record 20's payload (one frame of its own) on disk.
    let segment = &log.segments()[0].path;
    let bytes = std::fs::read(segment).expect("read");
    let at = bytes.windows(12).position(|w| w == b"marker-00020").expect("marker") + 3;
    let mut file = std::fs::OpenOptions::new().write(true).open(segment).expect("open segment");
    std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(at as u64)).expect("seek");
    std::io::Write::write_all(&mut file, &[bytes[at] ^ 0x20]).expect("flip");
    drop(file);
    // A visit of the whole range meets it; a visit of other records steps over its frame.
    let whole = log.visit(Lsn::new(1), Lsn::new(60), |_, _| Ok(true));
    assert!(matches!(whole, Err(Error::Corruption { .. })), "{whole:?}");
    let (count, seen) = visit_lsns(&log, &[10, 30, 60]).expect("visit around the damage");
    assert_eq!(count, 3);
    assert!(
        seen.iter()
            .zip([10, 30, 60])
            .all(|((lsn, bytes), i)| *lsn == i && bytes.starts_with(format!("marker-{i:05}").as_bytes()))
    );
    let asked = visit_lsns(&log, &[10, 20]);
    assert!(matches!(asked, Err(Error::Corruption { .. })), "{asked:?}");
}

#[test]
fn visit_lsns_seeks_across_wide_gaps_on_mapped_and_read_segments() {
    let dir = tempfile::tempdir().expect("tempdir");
    let real = Log::builder(dir.path()).segment_bytes(1 << 20).open().expect("open");
    // The simulator has no live map: its active segment is read with positioned reads.
    let sim = continuum::storage::sim::SimStorage::new(7);
    let simulated =
        Log::builder("/store").storage(Arc::new(sim)).segment_bytes(1 << 20).open().expect("open on the simulator");
    for log in [real, simulated] {
        let written: Vec<Vec<u8>> = (0..6_000u64).map(|i| format!("{i:06} {}", "y".repeat(290)).into_bytes()).collect();
        for bytes in &written {
            log.append_with(bytes, Durability::None).expect("append");
        }
        // Two segments of about 1 MiB: each wanted record lies past many 32 KiB index strides.
        assert!(log.segments().len() >= 2);
        let lsns: Vec<u64> = (1..=6_000).step_by(487).chain([5_999, 6_000]).collect();
        let (count, seen) = visit_lsns(&log, &lsns).expect("visit");
        assert_eq!(count, lsns.len());
        let expected: Vec<_> = lsns.iter().map(|lsn| (*lsn, written[*lsn as usize - 1].clone())).collect();
        assert_eq!(seen, expected);
    }
}
