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
