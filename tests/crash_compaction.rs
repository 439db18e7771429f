//! Crash-point enumeration through a whole round of retention and compaction (a finished run
//! dropped, snapshots pruned, segments rewritten, empty segments deleted): crash after every
//! single I/O call, with every kind of damage the simulator knows. After each crash nothing
//! live is lost (every atom of the live run, its result, and the exact context of every
//! target), the dropped run is either wholly there or wholly gone, and once a round has
//! returned, nothing it removed comes back. A second test runs a round that only strips deltas
//! (no run is dropped) of a store with an index snapshot, which the round deletes and then
//! writes again patched, and crashes it after every I/O call in the same way. Both rounds also
//! compress every sealed segment (cold compression, on by default).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use continuum::storage::sim::{CrashDamage, SimStorage};
use continuum::synthetic::Transcript;
use continuum::{
    AtomId, AtomOutput, AtomStatus, CompactionPolicy, Context, Error, RetentionPolicy, RunSpec, RunStatus,
    SnapshotPolicy, Store,
};

const SEGMENT_BYTES: u64 = 8 * 1024;
const OLD_ATOMS: usize = 24;
const LIVE_ATOMS: usize = 48;

/// What a round does to the finished run: drop it (retention's age zero), or keep it (and the
/// store has an index snapshot, which the round patches).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Round {
    DropsTheOldRun,
    PatchesTheIndexSnapshot,
}

fn open_for(sim: &SimStorage, round: Round) -> continuum::Result<Store> {
    let age = match round {
        Round::DropsTheOldRun => Some(Duration::ZERO),
        Round::PatchesTheIndexSnapshot => None,
    };
    Store::builder(Path::new("/store"))
        .storage(Arc::new(sim.clone()))
        .segment_bytes(SEGMENT_BYTES)
        .snapshot_policy(SnapshotPolicy { every_atoms: 6, every: Duration::ZERO })
        .retention(RetentionPolicy { snapshots_per_agent: 2, finished_run_age: age })
        .compaction(CompactionPolicy { live_fraction_min: 0.7, interval: None, ..CompactionPolicy::default() })
        .index_snapshot_after(u64::MAX)
        .background(false)
        .open()
}

fn open(sim: &SimStorage) -> continuum::Result<Store> {
    open_for(sim, Round::DropsTheOldRun)
}

fn chain(store: &Store, name: &str, count: usize, seed: u64) -> Vec<AtomId> {
    let run = store.create_run(RunSpec::new(name)).expect("run");
    let mut transcript = Transcript::new(seed);
    let mut ids: Vec<AtomId> = Vec::new();
    for i in 0..count {
        let parents: Vec<AtomId> = ids.last().copied().into_iter().collect();
        let atom = store.begin_atom(run, "agent", &format!("step-{i}"), &parents, "").expect("begin");
        if i == 3 {
            store.guarded(atom, "send-email", |_| Ok(b"sent".to_vec())).expect("guard");
        }
        let output = AtomOutput { delta: transcript.next_delta(400), result: format!("r{i}").into_bytes() };
        store.complete_atom(atom, &output).expect("complete");
        ids.push(atom);
    }
    ids
}

struct World {
    sim: SimStorage,
    store: Store,
    old: Vec<AtomId>,
    live: Vec<AtomId>,
    expected: Vec<Context>,
}

fn world(seed: u64) -> World {
    world_for(seed, Round::DropsTheOldRun)
}

fn world_for(seed: u64, round: Round) -> World {
    let sim = SimStorage::new(seed);
    let store = open_for(&sim, round).expect("open");
    let old = chain(&store, "old", OLD_ATOMS, 1);
    let live = chain(&store, "live", LIVE_ATOMS, 2);
    let old_run = store.run_id("old").expect("run");
    store.finish_run(old_run, true, "done").expect("finish");
    let expected = live.iter().map(|id| store.rebuild_context(*id).expect("rebuild").context).collect();
    if round == Round::PatchesTheIndexSnapshot {
        store.write_index_snapshot().expect("index snapshot");
    }
    World { sim, store, old, live, expected }
}

fn log_bytes(store: &Store) -> u64 {
    store.log().segments().iter().map(|s| s.data_bytes).sum()
}

fn check(store: &Store, w: &World, context: &str) {
    let live_run = store.run_id("live").expect("live run");
    let oldest = store.snapshots().into_iter().filter(|s| w.live.contains(s)).min();
    for (i, (id, want)) in w.live.iter().zip(&w.expected).enumerate() {
        let atom = store.atom(*id).unwrap_or_else(|e| panic!("{context}: live atom {id}: {e}"));
        assert_eq!(atom.status, AtomStatus::Completed, "{context}: atom {id}");
        assert_eq!(atom.output.expect("output").result, format!("r{i}").into_bytes(), "{context}: result of {id}");
        let target = oldest.is_none_or(|oldest| *id >= oldest);
        // Every target, and a sample of the older atoms (rebuilds dominate the test's time).
        if !target && i % 8 != 0 {
            continue;
        }
        match store.rebuild_context(*id) {
            Ok(rebuilt) => assert_eq!(&rebuilt.context, want, "{context}: context of {id}"),
            Err(Error::HistoryReclaimed { .. }) if !target => {}
            Err(error) => panic!("{context}: rebuild of {id} (target: {target}): {error}"),
        }
    }
    assert_eq!(store.resume(live_run).expect("resume").agents[0].completed.len(), LIVE_ATOMS, "{context}");
    // The guarded effect of the live run is recorded exactly once and still answers.
    let again = store.guarded(w.live[3], "send-email", |_| panic!("{context}: the effect ran twice"));
    assert_eq!(again.expect("guard"), b"sent".to_vec());
    // The dropped run is wholly there or wholly gone.
    let old_run = continuum::RunId::from_raw(1);
    match store.run_status(old_run).expect("old run") {
        RunStatus::Dropped => {
            for id in &w.old {
                assert!(matches!(store.atom(*id), Err(Error::UnknownAtom { .. })), "{context}: {id} came back");
            }
        }
        RunStatus::Finished { .. } => {
            for (i, id) in w.old.iter().enumerate() {
                let atom = store.atom(*id).unwrap_or_else(|e| panic!("{context}: old atom {id}: {e}"));
                assert_eq!(atom.output.expect("output").result, format!("r{i}").into_bytes(), "{context}");
            }
        }
        RunStatus::Running | RunStatus::Suspended { .. } => panic!("{context}: the finished run is running again"),
    }
}

#[test]
fn a_crash_anywhere_in_compaction_loses_nothing_live_and_revives_nothing_dead() {
    let ops = {
        let w = world(1);
        let before = w.sim.op_count();
        let report = w.store.compact().expect("compact");
        assert_eq!(report.runs_dropped, 1);
        assert!(report.segments_rewritten > 0 && report.deltas_reclaimed > 0, "{report:?}");
        // Cold compression (the default) rewrote every segment with compressed frames.
        assert_eq!(report.segments_compressed, report.segments_rewritten, "{report:?}");
        assert!(w.store.log().segments().iter().filter(|s| s.sealed && s.data_bytes > 64).all(|s| s.compressed));
        check(&w.store, &w, "without a crash");
        w.sim.op_count() - before
    };
    let mut states = 0;
    for crash_at in 0..=ops {
        for damage in CrashDamage::ALL {
            let w = world(1);
            w.sim.halt_after(crash_at);
            let outcome = w.store.compact();
            let compacted_bytes = outcome.is_ok().then(|| log_bytes(&w.store));
            let World { sim, store, old, live, expected } = w;
            drop(store);
            sim.crash(damage);
            let context = format!("crash after op {crash_at} of {ops} with {damage:?} ({:?})", outcome.as_ref().err());
            let store = open(&sim).unwrap_or_else(|e| panic!("{context}: reopen: {e}"));
            let w = World { sim, store, old, live, expected };
            check(&w.store, &w, &context);
            if let Some(bytes) = compacted_bytes {
                assert!(log_bytes(&w.store) <= bytes, "{context}: reclaimed bytes came back");
                assert_eq!(w.store.run_status(continuum::RunId::from_raw(1)).expect("run"), RunStatus::Dropped);
            }
            // A later round finishes the job, and everything still holds.
            w.store.compact().unwrap_or_else(|e| panic!("{context}: compaction after recovery: {e}"));
            check(&w.store, &w, &format!("{context}, then compacted again"));
            assert_eq!(w.store.run_status(continuum::RunId::from_raw(1)).expect("run"), RunStatus::Dropped);
            states += 1;
        }
    }
    eprintln!(
        "compaction crash points: {ops} I/O calls × {} damage kinds = {states} crash states",
        CrashDamage::ALL.len()
    );
    assert!(ops >= 20, "a round makes many I/O calls ({ops})");
}

#[test]
fn a_crash_anywhere_in_a_round_that_patches_the_index_snapshot_loses_nothing() {
    let round = Round::PatchesTheIndexSnapshot;
    let ops = {
        let w = world_for(1, round);
        let before = w.sim.op_count();
        let covered = w.store.index_snapshot().covered.expect("an index snapshot");
        let report = w.store.compact().expect("compact");
        assert_eq!(report.runs_dropped, 0);
        assert!(report.segments_rewritten > 0 && report.deltas_reclaimed > 0, "{report:?}");
        // Cold compression (the default) rewrote every segment with compressed frames.
        assert_eq!(report.segments_compressed, report.segments_rewritten, "{report:?}");
        assert!(w.store.log().segments().iter().filter(|s| s.sealed && s.data_bytes > 64).all(|s| s.compressed));
        assert_eq!(w.store.index_snapshot().covered, Some(covered), "the round patched the index snapshot");
        check(&w.store, &w, "without a crash");
        w.sim.op_count() - before
    };
    let (mut states, mut patched) = (0, 0);
    for crash_at in 0..=ops {
        for damage in CrashDamage::ALL {
            let w = world_for(1, round);
            w.sim.halt_after(crash_at);
            let outcome = w.store.compact();
            let World { sim, store, old, live, expected } = w;
            drop(store);
            sim.crash(damage);
            let context = format!("crash after op {crash_at} of {ops} with {damage:?} ({:?})", outcome.as_ref().err());
            let store = open_for(&sim, round).unwrap_or_else(|e| panic!("{context}: reopen: {e}"));
            patched += u64::from(store.index_snapshot().opened_from.is_some());
            let w = World { sim, store, old, live, expected };
            check(&w.store, &w, &context);
            w.store.compact().unwrap_or_else(|e| panic!("{context}: compaction after recovery: {e}"));
            check(&w.store, &w, &format!("{context}, then compacted again"));
            states += 1;
        }
    }
    eprintln!("patching compaction crash points: {states} crash states, {patched} reopened from an index snapshot");
    assert!(patched > 0 && patched < states, "{patched} of {states} reopens used an index snapshot");
}

/// Policy snapshots defer the sync of the snapshot directory, so a policy snapshot's name is
/// durable only at the next sync of that directory. A compaction round reclaims the history
/// its kept snapshots cover, so it syncs the directory first: a power loss right after the
/// round must leave every atom from the snapshot on rebuildable, to the same context.
#[test]
fn a_round_makes_the_snapshots_it_relies_on_durable_first() {
    let sim = SimStorage::new(7);
    let open = || {
        Store::builder(Path::new("/store"))
            .storage(Arc::new(sim.clone()))
            .segment_bytes(SEGMENT_BYTES)
            .snapshot_policy(SnapshotPolicy { every_atoms: 20, every: Duration::ZERO })
            .retention(RetentionPolicy { snapshots_per_agent: 100, finished_run_age: None })
            .compaction(CompactionPolicy { live_fraction_min: 0.7, interval: None, ..CompactionPolicy::default() })
            .index_snapshot_after(u64::MAX)
            .background(false)
            .open()
    };
    let store = open().expect("open");
    let ids = chain(&store, "live", 30, 3);
    let snapshots = store.snapshots();
    assert_eq!(snapshots, vec![ids[19]], "one policy snapshot, of the 20th atom");
    let expected: Vec<Context> = ids.iter().map(|id| store.rebuild_context(*id).expect("rebuild").context).collect();
    let report = store.compact().expect("round");
    assert!(report.deltas_reclaimed > 0, "the round reclaims the history before the snapshot: {report:?}");
    // Power loss right after the round: no clean close (which would sync the directory too).
    std::mem::forget(store);
    sim.crash(CrashDamage {
        data: continuum::storage::sim::DataDamage::DropUnsynced,
        dir: continuum::storage::sim::DirDamage::ForgetUnsynced,
    });
    let store = open().expect("reopen");
    assert_eq!(store.snapshots(), snapshots, "the snapshot the round relied on survived");
    for (id, want) in ids.iter().zip(&expected).skip(19) {
        let rebuilt = store.rebuild_context(*id).unwrap_or_else(|e| panic!("rebuild of {id}: {e}"));
        assert_eq!(&rebuilt.context, want, "context of {id}");
    }
}

/// What deferring costs, and what does not defer: a power loss before any directory sync loses
/// a policy snapshot (never part of one) and nothing else, as every atom still rebuilds from the
/// log; an explicit `snapshot_now` syncs the directory before it returns (which makes the
/// earlier policy snapshot durable too); a clean close syncs it.
#[test]
fn policy_snapshot_names_become_durable_at_the_next_directory_sync() {
    let power_loss = CrashDamage {
        data: continuum::storage::sim::DataDamage::DropUnsynced,
        dir: continuum::storage::sim::DirDamage::ForgetUnsynced,
    };
    for case in ["power loss", "explicit snapshot", "clean close"] {
        let sim = SimStorage::new(11);
        let open = || {
            Store::builder(Path::new("/store"))
                .storage(Arc::new(sim.clone()))
                .snapshot_policy(SnapshotPolicy { every_atoms: 20, every: Duration::ZERO })
                .index_snapshot_after(u64::MAX)
                .background(false)
                .open()
        };
        let store = open().expect("open");
        let ids = chain(&store, "live", 25, 4);
        let expected = store.rebuild_context(ids[24]).expect("rebuild").context;
        assert_eq!(store.snapshots(), vec![ids[19]], "{case}: the policy snapshot");
        let survivors = match case {
            "power loss" => {
                std::mem::forget(store);
                sim.crash(power_loss);
                vec![]
            }
            "explicit snapshot" => {
                store.snapshot_now(ids[22]).expect("snapshot");
                std::mem::forget(store);
                sim.crash(power_loss);
                vec![ids[19], ids[22]]
            }
            _ => {
                drop(store);
                sim.crash(power_loss);
                vec![ids[19]]
            }
        };
        let store = open().expect("reopen");
        assert_eq!(store.snapshots(), survivors, "{case}");
        assert_eq!(store.rebuild_context(ids[24]).expect("rebuild").context, expected, "{case}");
    }
}
