//! A process crash, a restart, then a power loss. A process crash keeps the page cache: the
//! bytes and directory entries the dead process never synced are still there when the next
//! process opens the store, and a power loss later drops them. The restarted process must not
//! acknowledge anything that depends on them before it has made them durable: without the
//! directory syncs at open, a segment renamed into place just before the crash (its directory
//! entry never synced) took the restarted process's acknowledged `Sync` records with it at the
//! power loss, and a compaction round stripped history covered by a policy snapshot found at
//! open whose name a power loss then undid. Guards invariants 1 and 7 across restarts.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::{Acked, check_recovered, run_workload};
use continuum::storage::sim::{CrashDamage, DataDamage, DirDamage, Fault, FaultKind, Op, SimStorage};
use continuum::synthetic::Transcript;
use continuum::{AtomId, AtomOutput, Log, RunSpec, SnapshotPolicy, Store};

const SEGMENT_BYTES: u64 = 4096;

const POWER_LOSS: CrashDamage = CrashDamage { data: DataDamage::DropUnsynced, dir: DirDamage::ForgetUnsynced };

/// Opens the log as one process: its calls fail once that process has crashed.
fn open(sim: &SimStorage) -> continuum::Result<Log> {
    Log::builder(Path::new(common::DIR)).storage(Arc::new(sim.process())).segment_bytes(SEGMENT_BYTES).open()
}

/// Appends `count` records with `Sync` durability, none of which rotates the segment.
fn append_synced(log: &Log, first_payload: u64, count: u64, acked: &mut Acked) {
    let segments = log.segments().len();
    for i in first_payload..first_payload + count {
        let record = common::payload(i % 3);
        let lsn = log.append(&record).expect("append after the restart");
        acked.records.insert(lsn.get(), record);
        acked.durable_through = lsn.get();
    }
    assert_eq!(log.segments().len(), segments, "the appends stay in the segment found at open");
}

/// The issue's case: the process dies between renaming a new segment into place and syncing
/// the directory (here the directory sync fails, then the process dies). The restart finds the
/// segment, continues it, and acknowledges `Sync` appends in it; they must survive a power loss.
#[test]
fn records_acknowledged_in_a_segment_whose_name_was_never_synced_survive_a_power_loss() {
    let sim = SimStorage::new(1);
    let log = open(&sim).expect("open");
    let mut acked = Acked::default();
    sim.inject(Fault { op: Some(Op::SyncDir), nth: 1, kind: FaultKind::Eio });
    let outcome = run_workload(&log, 0, 200, &mut acked);
    assert!(outcome.is_err(), "the rotation's directory sync failed: {outcome:?}");
    let renamed = sim.file_names(Path::new(common::DIR));
    // The process dies: its handles fail from now on, so dropping the log writes nothing.
    sim.crash_process();
    drop(log);
    assert_eq!(sim.file_names(Path::new(common::DIR)), renamed, "a process crash keeps every directory entry");

    let log = open(&sim).expect("reopen after the process crash");
    let recovered = check_recovered(&log, &acked, "after the process crash");
    assert_eq!(log.segments().last().map(|s| s.data_bytes), Some(64), "the active segment is the new, empty one");
    let mut more = Acked { records: recovered, durable_through: 0 };
    append_synced(&log, 1000, 3, &mut more);
    sim.crash(POWER_LOSS);
    drop(log);

    let log = open(&sim).expect("reopen after the power loss");
    check_recovered(&log, &more, "a power loss after the restart");
}

/// Every crash point of a rotating workload: the process dies there (nothing synced is lost,
/// nothing unsynced is dropped yet), a new process opens the log and acknowledges `Sync`
/// appends, then the power fails with each kind of directory damage. Every record acknowledged
/// as durable by either process survives.
#[test]
fn every_process_crash_point_then_a_power_loss_keeps_every_durable_record() {
    let total_ops = {
        let sim = SimStorage::new(0);
        let log = open(&sim).expect("open");
        let before = sim.op_count();
        run_workload(&log, 0, 120, &mut Acked::default()).expect("clean workload");
        sim.op_count() - before
    };
    let mut states = 0u64;
    for crash_at in 0..=total_ops {
        for dir in [DirDamage::ForgetUnsynced, DirDamage::KeepRandomPrefix] {
            let sim = SimStorage::new(crash_at * 4 + dir as u64);
            let log = open(&sim).expect("open");
            sim.halt_after(crash_at);
            let mut acked = Acked::default();
            let outcome = run_workload(&log, 0, 120, &mut acked);
            sim.crash_process();
            drop(log);
            let context = format!("process crash after op {crash_at} ({outcome:?}), then a power loss with {dir:?}");
            let log = open(&sim).unwrap_or_else(|e| panic!("{context}: restart: {e}"));
            let recovered = check_recovered(&log, &acked, &context);
            let mut more = Acked { records: recovered, durable_through: 0 };
            let next = log.next_lsn().get();
            let room = log.segments().last().map_or(0, |s| SEGMENT_BYTES.saturating_sub(s.data_bytes));
            if room > 400 {
                append_synced(&log, next, 1, &mut more);
            }
            more.durable_through = more.records.keys().next_back().copied().unwrap_or(0);
            sim.crash(CrashDamage { data: DataDamage::DropUnsynced, dir });
            drop(log);
            let log = open(&sim).unwrap_or_else(|e| panic!("{context}: reopen: {e}"));
            check_recovered(&log, &more, &context);
            states += 1;
        }
    }
    eprintln!("process crash points: {total_ops} I/O calls × 2 damage kinds = {states} states checked");
}

/// Opens a store as one process, with a policy snapshot every 10 atoms and no background
/// thread (so nothing syncs the snapshot directory unless the test asks).
fn open_store(sim: &SimStorage) -> continuum::Result<Store> {
    Store::builder(Path::new(common::DIR))
        .storage(Arc::new(sim.process()))
        .segment_bytes(8 * 1024)
        .snapshot_policy(SnapshotPolicy { every_atoms: 10, every: std::time::Duration::ZERO })
        .background(false)
        .open()
}

/// A policy snapshot's name becomes durable at the snapshot directory's next sync. The process
/// dies before one; the restart finds the snapshot and a compaction round reclaims the history
/// it covers. After a power loss, every atom's context still rebuilds.
#[test]
fn a_snapshot_found_at_open_is_durable_before_compaction_relies_on_it() {
    let sim = SimStorage::new(7);
    let store = open_store(&sim).expect("open");
    let run = store.create_run(RunSpec::new("r")).expect("run");
    let mut transcript = Transcript::new(7);
    let mut atoms: Vec<AtomId> = Vec::new();
    for i in 0..25 {
        let parents: Vec<_> = atoms.last().copied().into_iter().collect();
        let output = AtomOutput { delta: transcript.next_delta(400), result: Vec::new() };
        atoms.push(store.record_atom(run, "agent", &i.to_string(), &parents, "", &output).expect("atom"));
    }
    assert_eq!(store.snapshots().len(), 2, "policy snapshots at the 10th and 20th atoms");
    // From the newest snapshot on, every context rebuilds whatever the round reclaims.
    let kept = &atoms[19..];
    let expected: Vec<_> = kept.iter().map(|&atom| store.rebuild_context(atom).expect("rebuild").context).collect();
    // The process dies before any sync of the snapshot directory (a close would sync it).
    sim.crash_process();
    drop(store);

    let store = open_store(&sim).expect("restart");
    assert_eq!(store.snapshots().len(), 2, "the restart finds both snapshots");
    let report = store.compact().expect("compact");
    assert!(report.deltas_reclaimed > 0, "the round reclaimed history: {report:?}");
    sim.crash(POWER_LOSS);
    drop(store);

    let store = open_store(&sim).expect("reopen after the power loss");
    for (atom, want) in kept.iter().zip(&expected) {
        let got = store.rebuild_context(*atom).unwrap_or_else(|e| panic!("atom {atom:?}: {e}"));
        assert_eq!(&got.context, want, "atom {atom:?}");
    }
}
