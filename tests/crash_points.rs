//! Crash-point enumeration: an append-and-rotate workload is crashed after every single I/O
//! call it makes, with every kind of damage the simulator knows (unsynced data dropped, torn
//! at a sector, followed by garbage; unsynced directory entries forgotten, kept, or partly
//! kept). After each crash the log must reopen and hold every durable acknowledged record.
//! Guards invariants 1, 2 and 5: an ack that ran ahead of its fdatasync, a segment published
//! before it was durable, or recovery mistaking a torn tail for corruption all fail here.

mod common;

use common::{Acked, check_recovered, open, run_workload};
use continuum::storage::sim::{CrashDamage, SimStorage};

const SEGMENT_BYTES: u64 = 4096;
const RECORDS: u64 = 150;

/// How many I/O calls the workload makes after open, without faults.
fn workload_ops() -> u64 {
    let sim = SimStorage::new(0);
    let log = open(&sim, SEGMENT_BYTES).expect("open");
    let before = sim.op_count();
    run_workload(&log, 0, RECORDS, &mut Acked::default()).expect("clean workload");
    sim.op_count() - before
}

#[test]
fn every_crash_point_with_every_damage_keeps_every_durable_record() {
    let total_ops = workload_ops();
    let mut states = 0u64;
    for crash_at in 0..=total_ops {
        for (d, damage) in CrashDamage::ALL.into_iter().enumerate() {
            let sim = SimStorage::new(crash_at * 16 + d as u64);
            let log = open(&sim, SEGMENT_BYTES).expect("open");
            sim.halt_after(crash_at);
            let mut acked = Acked::default();
            let outcome = run_workload(&log, 0, RECORDS, &mut acked);
            drop(log);
            sim.crash(damage);
            let context = format!("crash after op {crash_at} with {damage:?} ({outcome:?})");
            let log = open(&sim, SEGMENT_BYTES).unwrap_or_else(|e| panic!("{context}: reopen failed: {e}"));
            let recovered = check_recovered(&log, &acked, &context);
            // The recovered log accepts appends and survives another clean reopen.
            let mut more = Acked { records: recovered.into_iter().collect(), durable_through: 0 };
            run_workload(&log, 1000, 7, &mut more).unwrap_or_else(|e| panic!("{context}: append after recovery: {e}"));
            more.durable_through = more.records.keys().next_back().copied().unwrap_or(0);
            drop(log);
            sim.crash(CrashDamage::ALL[0]);
            let log = open(&sim, SEGMENT_BYTES).unwrap_or_else(|e| panic!("{context}: second reopen: {e}"));
            check_recovered(&log, &more, &format!("{context}, then a second crash"));
            states += 1;
        }
    }
    eprintln!(
        "crash points: {total_ops} I/O calls × {} damage kinds = {states} crash states checked",
        CrashDamage::ALL.len()
    );
    assert!(states > 100, "the workload must make enough I/O calls to be meaningful");
}

#[test]
fn crashes_during_recovery_are_recovered_too() {
    // Leave a torn tail, then crash recovery itself (its cut and zero-fill) at every call.
    let mut states = 0u64;
    for crash_at in 0..40u64 {
        for damage in CrashDamage::ALL {
            let sim = SimStorage::new(7000 + crash_at);
            let log = open(&sim, SEGMENT_BYTES).expect("open");
            let mut acked = Acked::default();
            run_workload(&log, 0, 23, &mut acked).expect("workload");
            // Unsynced appends that the crash will tear.
            for i in 0..5u64 {
                let record = common::payload(500 + i);
                let lsn = log.append_with(&record, continuum::Durability::None).expect("append");
                acked.records.insert(lsn.get(), record);
            }
            drop(log);
            sim.crash(CrashDamage { data: continuum::storage::sim::DataDamage::TornPrefixWithGarbage, ..damage });
            sim.halt_after(crash_at);
            let _ = open(&sim, SEGMENT_BYTES);
            sim.crash(damage);
            let context = format!("recovery crashed after op {crash_at} with {damage:?}");
            let log = open(&sim, SEGMENT_BYTES).unwrap_or_else(|e| panic!("{context}: reopen failed: {e}"));
            check_recovered(&log, &acked, &context);
            states += 1;
        }
    }
    eprintln!("recovery crash points: {states} crash states checked");
}

#[test]
fn crashes_during_prefix_truncation_leave_a_contiguous_log() {
    let mut states = 0u64;
    for crash_at in 0..12u64 {
        for damage in CrashDamage::ALL {
            let sim = SimStorage::new(9000 + crash_at);
            let log = open(&sim, SEGMENT_BYTES).expect("open");
            let mut acked = Acked::default();
            run_workload(&log, 0, RECORDS, &mut acked).expect("workload");
            let segments = log.segments();
            assert!(segments.len() > 4, "the workload must fill several segments");
            let cut = segments[segments.len() - 2].first_lsn;
            sim.halt_after(crash_at);
            let outcome = log.truncate_prefix(cut);
            drop(log);
            sim.crash(damage);
            let context = format!("truncation crashed after op {crash_at} with {damage:?} ({outcome:?})");
            let log = open(&sim, SEGMENT_BYTES).unwrap_or_else(|e| panic!("{context}: reopen failed: {e}"));
            // Whatever the truncation got to, the log is contiguous and holds every record
            // from its first LSN on, and nothing at or after the cut is gone.
            let first = log.first_lsn().get();
            assert!(first <= cut.get(), "{context}: truncation went past its LSN");
            let kept = Acked {
                records: acked.records.range(first..).map(|(k, v)| (*k, v.clone())).collect(),
                durable_through: acked.durable_through,
            };
            check_recovered(&log, &kept, &context);
            states += 1;
        }
    }
    eprintln!("truncation crash points: {states} crash states checked");
}
