//! Injected I/O failures: every fsync path failing, EIO and ENOSPC on every write-path call,
//! a full disk, and a second opener. Guards invariant 4 (the first failed fdatasync poisons the
//! writer and nothing it covered is acknowledged) and the rule that ENOSPC is a typed error
//! that leaves no partial batch visible after reopen while reads keep working.

mod common;

use std::process::Command;

use common::{Acked, DIR, check_recovered, open, run_workload};
use continuum::storage::sim::{CrashDamage, DataDamage, DirDamage, Fault, FaultKind, Op, SimStorage};
use continuum::{Durability, Error, Log, Lsn};

const SEGMENT_BYTES: u64 = 4096;
const RECORDS: u64 = 120;

fn count_ops(op: Op) -> u64 {
    // Count how many calls of `op` the workload makes by failing a call far beyond it.
    let mut n = 1;
    loop {
        let sim = SimStorage::new(1);
        let log = open(&sim, SEGMENT_BYTES).expect("open");
        sim.inject(Fault { op: Some(op), nth: n, kind: FaultKind::Eio });
        if run_workload(&log, 0, RECORDS, &mut Acked::default()).is_ok() {
            return n - 1;
        }
        n += 1;
    }
}

/// Fails the `nth` call of `op` during the workload; checks the error, poisoning, reads, and a
/// reopen after a crash that drops everything unsynced.
fn fail_nth(op: Op, nth: u64, kind: FaultKind) {
    let context = format!("{kind:?} on {op:?} #{nth}");
    let sim = SimStorage::new(nth);
    let log = open(&sim, SEGMENT_BYTES).expect("open");
    sim.inject(Fault { op: Some(op), nth, kind });
    let mut acked = Acked::default();
    let failure = run_workload(&log, 0, RECORDS, &mut acked).expect_err("the injected fault must surface");
    match kind {
        FaultKind::NoSpace => assert!(matches!(failure, Error::NoSpace { .. }), "{context}: got {failure:?}"),
        FaultKind::Eio => assert!(matches!(failure, Error::Io { .. }), "{context}: got {failure:?}"),
    }
    // Reads keep working after any failure, and see every acknowledged record.
    for (lsn, want) in &acked.records {
        let got = log.read(Lsn::new(*lsn)).unwrap_or_else(|e| panic!("{context}: read {lsn}: {e}"));
        assert_eq!(got.as_deref(), Some(want.as_slice()), "{context}: read {lsn}");
    }
    let poisoned = matches!(log.append(b"after the failure"), Err(Error::Poisoned { .. }));
    // Running out of space while preparing the next segment, before it is published, changes
    // nothing on disk and does not poison.
    let creating_segment =
        matches!(&failure, Error::NoSpace { path, .. } if path.extension().is_some_and(|ext| ext == "tmp"));
    assert!(poisoned || creating_segment, "{context}: {failure:?} must poison the log");
    drop(log);
    sim.crash(CrashDamage { data: DataDamage::DropUnsynced, dir: DirDamage::ForgetUnsynced });
    let log = open(&sim, SEGMENT_BYTES).unwrap_or_else(|e| panic!("{context}: reopen: {e}"));
    check_recovered(&log, &acked, &context);
    log.append(b"the reopened log accepts appends").unwrap_or_else(|e| panic!("{context}: append: {e}"));
}

#[test]
fn every_fsync_failure_poisons_without_false_acknowledgement() {
    let mut cases = 0;
    for op in [Op::SyncData, Op::SyncDir] {
        let total = count_ops(op);
        assert!(total > 3, "the workload must sync through {op:?}");
        for nth in 1..=total {
            fail_nth(op, nth, FaultKind::Eio);
            cases += 1;
        }
    }
    eprintln!("fsync failures: {cases} cases");
}

#[test]
fn every_write_path_call_can_fail_with_eio_or_enospc() {
    let mut cases = 0;
    for op in [Op::Write, Op::Allocate, Op::Open, Op::Rename, Op::SyncData] {
        let total = count_ops(op);
        for nth in 1..=total {
            for kind in [FaultKind::Eio, FaultKind::NoSpace] {
                fail_nth(op, nth, kind);
                cases += 1;
            }
        }
    }
    eprintln!("write-path failures: {cases} cases");
}

#[test]
fn concurrent_appenders_in_a_failed_group_all_get_the_error() {
    let sim = SimStorage::new(3);
    let log = std::sync::Arc::new(open(&sim, 1 << 20).expect("open"));
    log.append(b"before").expect("append");
    sim.inject(Fault { op: Some(Op::SyncData), nth: 1, kind: FaultKind::Eio });
    let results: Vec<_> = (0..8)
        .map(|t| {
            let log = std::sync::Arc::clone(&log);
            std::thread::spawn(move || log.append(format!("thread {t}").as_bytes()))
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|handle| handle.join().expect("thread"))
        .collect();
    // Exactly the appends that shared the failed sync failed with the I/O error; everything
    // after it was refused as poisoned; none was acknowledged.
    assert!(results.iter().all(Result::is_err), "no append may be acknowledged: {results:?}");
    assert!(results.iter().any(|r| matches!(r, Err(Error::Io { .. }))));
    assert_eq!(log.next_lsn(), Lsn::new(2), "readers never see the failed group");
}

/// Synced and unsynced appends racing into a group whose `fdatasync` fails: no synced append
/// is acknowledged, every acknowledged append is readable, and readers see nothing else.
#[test]
fn a_failed_sync_among_mixed_appends_acknowledges_no_synced_one_and_shows_only_acknowledged_ones() {
    let sim = SimStorage::new(5);
    let log = std::sync::Arc::new(open(&sim, 1 << 20).expect("open"));
    log.append(b"before").expect("append");
    sim.inject(Fault { op: Some(Op::SyncData), nth: 1, kind: FaultKind::Eio });
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(16));
    let results: Vec<_> = (0..16)
        .map(|t| {
            let (log, barrier) = (std::sync::Arc::clone(&log), std::sync::Arc::clone(&barrier));
            std::thread::spawn(move || {
                let durability = if t % 2 == 0 { Durability::Sync } else { Durability::None };
                let record = format!("thread {t}").into_bytes();
                barrier.wait();
                (durability, record.clone(), log.append_with(&record, durability))
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|handle| handle.join().expect("thread"))
        .collect();
    let mut acknowledged = 0;
    for (durability, record, result) in &results {
        match (durability, result) {
            (Durability::Sync, Ok(lsn)) => panic!("a sync append at {lsn:?} was acknowledged"),
            (_, Ok(lsn)) => {
                acknowledged += 1;
                assert_eq!(log.read(*lsn).expect("read").as_deref(), Some(&record[..]), "acknowledged, so readable");
            }
            (_, Err(_)) => {}
        }
    }
    assert_eq!(log.next_lsn(), Lsn::new(2 + acknowledged), "readers see exactly the acknowledged appends");
}

#[test]
fn full_disk_at_rotation_is_a_typed_error_and_recoverable() {
    let sim = SimStorage::new(4);
    let log = open(&sim, SEGMENT_BYTES).expect("open");
    sim.set_capacity(Some(SEGMENT_BYTES + 512));
    let mut acked = Acked::default();
    let failure = run_workload(&log, 0, RECORDS, &mut acked).expect_err("the disk fills up");
    assert!(matches!(failure, Error::NoSpace { .. }), "got {failure:?}");
    assert!(!acked.records.is_empty());
    // Not poisoned: nothing was written. Once space is freed, appends continue.
    sim.set_capacity(None);
    let lsn = log.append(b"after space was freed").expect("append after freeing space");
    acked.records.insert(lsn.get(), b"after space was freed".to_vec());
    acked.durable_through = lsn.get();
    drop(log);
    sim.crash(CrashDamage::ALL[0]);
    let log = open(&sim, SEGMENT_BYTES).expect("reopen");
    check_recovered(&log, &acked, "full disk");
}

#[test]
fn a_full_disk_leaves_the_segment_reserve_to_reserved_appends() {
    // 4 KiB segments: the reserve is a sixteenth of the room for frames (252 bytes), 8-aligned.
    let reserve = continuum::limits::segment_reserve_bytes(SEGMENT_BYTES);
    assert_eq!(reserve, 248);
    let sim = SimStorage::new(5);
    let log = open(&sim, SEGMENT_BYTES).expect("open");
    log.append_with(b"first", Durability::Sync).expect("append");
    sim.set_capacity(Some(sim.used_bytes() + SEGMENT_BYTES / 2));
    let mut acked: Vec<(Lsn, Vec<u8>)> = Vec::new();
    let full = loop {
        let record = format!("ordinary {}", acked.len()).into_bytes();
        match log.append_with(&record, Durability::Sync) {
            Ok(lsn) => acked.push((lsn, record)),
            Err(error) => break error,
        }
    };
    assert!(matches!(full, Error::NoSpace { .. }), "{full:?}");
    let ordinary = acked.len();
    // The reserve: reserved appends (frames of 48 bytes) fit until it is used up; ordinary
    // ones are refused all along, and none of this poisons the log.
    let refused = loop {
        assert!(matches!(log.append(b"ordinary again"), Err(Error::NoSpace { .. })));
        let record = format!("reserved {}", acked.len() - ordinary).into_bytes();
        match log.append_reserved_with(&record, Durability::Sync) {
            Ok(lsn) => acked.push((lsn, record)),
            Err(error) => break error,
        }
    };
    assert!(matches!(refused, Error::NoSpace { .. }), "{refused:?}");
    let reserved = acked.len() - ordinary;
    assert!(reserved >= 4 && reserved as u64 * 48 <= reserve + 48, "{reserved} reserved appends in {reserve} bytes");
    for (lsn, record) in &acked {
        assert_eq!(log.read(*lsn).expect("read").as_deref(), Some(record.as_slice()));
    }
    // Space freed: ordinary appends go on in a new segment, which keeps its own reserve.
    sim.set_capacity(None);
    let lsn = log.append(b"after space was freed").expect("append");
    acked.push((lsn, b"after space was freed".to_vec()));
    drop(log);
    sim.crash(CrashDamage { data: DataDamage::DropUnsynced, dir: DirDamage::ForgetUnsynced });
    let log = open(&sim, SEGMENT_BYTES).expect("reopen");
    for (lsn, record) in &acked {
        assert_eq!(log.read(*lsn).expect("read").as_deref(), Some(record.as_slice()), "after the crash");
    }
}

#[test]
fn a_batch_may_use_the_reserve_only_if_reserved() {
    let sim = SimStorage::new(6);
    let log = open(&sim, SEGMENT_BYTES).expect("open");
    let reserve = continuum::limits::segment_reserve_bytes(SEGMENT_BYTES);
    // The largest record an empty segment holds: its room (the 64-byte header off) less a
    // frame's 32-byte header and the record's 4-byte length.
    let whole = (SEGMENT_BYTES - 64 - 32 - 4) as usize;
    let ordinary = whole - reserve as usize;
    assert!(matches!(log.append(&vec![1; ordinary + 1]), Err(Error::RecordTooLarge { .. })));
    log.append(&vec![2; ordinary]).expect("the largest ordinary record");
    assert!(matches!(
        log.append_reserved_with(&vec![3; whole + 1], Durability::Sync),
        Err(Error::RecordTooLarge { .. })
    ));
    let lsn = log.append_reserved_with(&vec![4; whole], Durability::Sync).expect("the largest reserved record");
    assert_eq!(log.read(lsn).expect("read").map(|r| r.len()), Some(whole));
}

#[test]
fn second_open_from_another_process_is_refused() {
    if let Ok(dir) = std::env::var("CONTINUUM_LOCK_CHILD_DIR") {
        match Log::open(&dir) {
            Err(Error::Locked { .. }) => std::process::exit(42),
            other => {
                eprintln!("child expected Locked, got {other:?}");
                std::process::exit(1);
            }
        }
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let _log = Log::open(dir.path()).expect("open");
    let status = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "second_open_from_another_process_is_refused", "--nocapture"])
        .env("CONTINUUM_LOCK_CHILD_DIR", dir.path())
        .status()
        .expect("spawn child");
    assert_eq!(status.code(), Some(42), "the child must see Error::Locked");
    let _ = DIR;
}
