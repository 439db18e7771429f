//! Snapshot policy, retention and compaction: policy snapshots are written when due; each
//! agent keeps its newest K snapshots; compaction reclaims what no kept snapshot or live run
//! needs and nothing else: every atom at or after its agent's oldest kept snapshot rebuilds
//! exactly as a naive fold from the beginning says, before and after compaction and reopen;
//! older atoms either rebuild correctly or fail with `HistoryReclaimed`, never with a wrong
//! context. Dropped runs stay dropped and their ids are never reused.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use continuum::storage::sim::SimStorage;
use continuum::synthetic::{SplitMix64, Transcript};
use continuum::{
    AtomFailure, AtomId, AtomOutput, AtomStatus, CompactionPolicy, Context, Delta, Error, RetentionPolicy, RunId,
    RunSpec, RunStatus, SnapshotPolicy, Store,
};
use proptest::prelude::*;

const SEGMENT_BYTES: u64 = 16 * 1024;

fn open_with(sim: &SimStorage, snapshot: SnapshotPolicy, retention: RetentionPolicy) -> Store {
    Store::builder(Path::new("/store"))
        .storage(Arc::new(sim.clone()))
        .segment_bytes(SEGMENT_BYTES)
        // Small records compressed as appended: the segment layout these tests were sized for.
        .compress_records_from(64)
        .snapshot_policy(snapshot)
        .retention(retention)
        .compaction(CompactionPolicy { live_fraction_min: 0.7, interval: None, ..CompactionPolicy::default() })
        .background(false)
        .open()
        .expect("open")
}

fn every(atoms: u32) -> SnapshotPolicy {
    SnapshotPolicy { every_atoms: atoms, every: Duration::ZERO }
}

fn keep(k: usize) -> RetentionPolicy {
    RetentionPolicy { snapshots_per_agent: k, finished_run_age: None }
}

fn output(delta: Delta) -> AtomOutput {
    AtomOutput { delta, result: b"result".to_vec() }
}

/// A linear chain of `count` atoms of one agent; returns their ids.
fn chain(store: &Store, run_name: &str, count: usize, seed: u64) -> Vec<AtomId> {
    let run = store.create_run(RunSpec::new(run_name)).expect("run");
    let mut ids: Vec<AtomId> = Vec::new();
    extend_chain(store, run, &mut ids, count, &mut Transcript::new(seed));
    ids
}

/// Adds `count` atoms of the agent to the chain `ids` of `run`, each the previous one's child.
fn extend_chain(store: &Store, run: RunId, ids: &mut Vec<AtomId>, count: usize, transcript: &mut Transcript) {
    for _ in 0..count {
        let parents: Vec<AtomId> = ids.last().copied().into_iter().collect();
        let atom = store.begin_atom(run, "agent", &format!("step-{}", ids.len()), &parents, "").expect("begin");
        store.complete_atom(atom, &output(transcript.next_delta(500))).expect("complete");
        ids.push(atom);
    }
}

#[test]
fn policy_snapshots_follow_the_atom_count_and_a_run_may_override_it() {
    let sim = SimStorage::new(1);
    let store = open_with(&sim, every(5), keep(100));
    let ids = chain(&store, "store-policy", 12, 1);
    assert_eq!(store.snapshots(), vec![ids[4], ids[9]]);

    let run = store.create_run(RunSpec::new("own-policy").snapshot_policy(every(3))).expect("run");
    let mut last = None;
    let mut own = Vec::new();
    for i in 0..7 {
        let parents: Vec<AtomId> = last.into_iter().collect();
        let atom = store.begin_atom(run, "other", &format!("s{i}"), &parents, "").expect("begin");
        store.complete_atom(atom, &output(Delta::default())).expect("complete");
        own.push(atom);
        last = Some(atom);
    }
    let snapshots: BTreeSet<AtomId> = store.snapshots().into_iter().collect();
    assert!(snapshots.contains(&own[2]) && snapshots.contains(&own[5]), "{snapshots:?}");
    assert!(!snapshots.contains(&own[4]));
    drop(store);

    // The override is stored with the run: it holds after reopen.
    let store = open_with(&sim, every(1000), keep(100));
    for i in 7..10 {
        let parents: Vec<AtomId> = last.into_iter().collect();
        let atom = store.begin_atom(run, "other", &format!("s{i}"), &parents, "").expect("begin");
        store.complete_atom(atom, &output(Delta::default())).expect("complete");
        last = Some(atom);
    }
    assert!(store.snapshots().contains(&last.expect("atom")), "the third atom after reopen is snapshotted");
}

#[test]
fn policy_snapshots_follow_the_clock() {
    let sim = SimStorage::new(2);
    let policy = SnapshotPolicy { every_atoms: 0, every: Duration::from_millis(30) };
    let store = open_with(&sim, policy, keep(100));
    let ids = chain(&store, "clock", 2, 2);
    assert!(store.snapshots().is_empty(), "nothing is due yet");
    std::thread::sleep(Duration::from_millis(40));
    let more = chain(&store, "clock", 0, 3);
    assert!(more.is_empty());
    let run = store.run_id("clock").expect("run");
    let atom = store.begin_atom(run, "agent", "late", &[ids[1]], "").expect("begin");
    store.complete_atom(atom, &output(Delta::default())).expect("complete");
    assert_eq!(store.snapshots(), vec![atom]);
}

#[test]
fn the_background_thread_writes_policy_snapshots() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::builder(dir.path()).snapshot_policy(every(4)).open().expect("open");
    let ids = chain(&store, "bg", 9, 4);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while store.snapshots().last() != Some(&ids[7]) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    // When the thread falls behind it coalesces requests to the newest atom of the agent.
    let snapshots = store.snapshots();
    assert_eq!(snapshots.last(), Some(&ids[7]), "{snapshots:?}");
    assert!(snapshots.iter().all(|s| *s == ids[3] || *s == ids[7]), "{snapshots:?}");
}

#[test]
fn agents_half_way_to_a_snapshot_join_a_round_whose_rebuilds_share_one_read() {
    // Eight agents, each its own run, write side by side, round robin: agents 5-7 ten atoms
    // each (their snapshots fall due at the tenth, in the last round), agents 0-4 five to
    // nine (half way or more, none due). The round the background thread writes once agent 5
    // falls due takes the others too, at the atom each has then (agents 0-4 have finished), and
    // the rebuilds share a read of the log. Every snapshot must hold exactly its agent's fold.
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::builder(dir.path()).snapshot_policy(every(10)).open().expect("open");
    let totals = [5, 6, 7, 8, 9, 10, 10, 10];
    let runs: Vec<_> =
        (0..totals.len()).map(|k| store.create_run(RunSpec::new(format!("agent-{k}"))).expect("run")).collect();
    let mut transcript = Transcript::new(41);
    let mut heads: Vec<Vec<(AtomId, Delta)>> = vec![Vec::new(); totals.len()];
    for round in 0..10 {
        for (k, total) in totals.iter().enumerate() {
            if round >= *total {
                continue;
            }
            let parents: Vec<AtomId> = heads[k].last().map(|(atom, _)| *atom).into_iter().collect();
            let delta = transcript.next_delta(400);
            let atom = store
                .record_atom(runs[k], "agent", &format!("step-{round}"), &parents, "", &output(delta.clone()))
                .expect("record");
            heads[k].push((atom, delta));
        }
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while store.snapshots().len() < totals.len() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    // The round starts when the first agent falls due; the others join it at the atom each had
    // then (an agent snapshotted moments ago waits out its interval before the next).
    let snapshots: BTreeSet<AtomId> = store.snapshots().into_iter().collect();
    let shared = store.log().metrics().rebuild_shared_scans;
    assert!(shared >= 6, "{shared} rebuilds shared a read of the log");
    for chain in &heads {
        let taken: Vec<usize> = (0..chain.len()).filter(|i| snapshots.contains(&chain[*i].0)).collect();
        assert_eq!(taken.len(), 1, "one snapshot per agent: {snapshots:?}");
        let (atom, _) = chain[taken[0]];
        assert!(taken[0] + 1 >= chain.len().min(5), "agents half way or more join the round: {atom:?}");
        let rebuilt = store.rebuild_context(atom).expect("rebuild");
        assert_eq!(rebuilt.snapshot, Some(atom), "the rebuild starts from the snapshot itself");
        let mut expected = Context::new();
        for (_, delta) in &chain[..=taken[0]] {
            expected.apply(delta);
        }
        assert_eq!(rebuilt.context.encode(), expected.encode(), "the snapshot of {atom:?}");
    }
}

#[test]
fn a_clean_close_writes_the_snapshots_still_due() {
    let dir = tempfile::tempdir().expect("tempdir");
    let open = |background: bool| {
        Store::builder(dir.path())
            .snapshot_policy(every(5))
            .compaction(CompactionPolicy { live_fraction_min: 0.7, interval: None, ..CompactionPolicy::default() })
            .background(background)
            .open()
            .expect("open")
    };
    let ids = {
        let store = open(true);
        chain(&store, "close", 200, 13)
    };
    // Dropping the store let its thread finish the snapshots still queued: the last atom due
    // (the 200th) has one, so the next open resumes from it.
    let store = open(false);
    assert_eq!(store.snapshots().last(), Some(&ids[199]));
    assert_eq!(store.rebuild_context(ids[199]).expect("rebuild").snapshot, Some(ids[199]));
}

#[test]
fn retention_keeps_the_newest_k_snapshots_of_each_agent() {
    let sim = SimStorage::new(3);
    let store = open_with(&sim, every(2), keep(2));
    let ids = chain(&store, "k", 10, 5);
    // Retention decides in a compaction round's plan, which knows what each snapshot serves.
    assert_eq!(store.snapshots(), vec![ids[1], ids[3], ids[5], ids[7], ids[9]]);
    store.compact().expect("compact");
    assert_eq!(store.snapshots(), vec![ids[7], ids[9]]);
    let mut files = sim.file_names(Path::new("/store/snapshots"));
    files.retain(|name| name.ends_with(".snap"));
    assert_eq!(files.len(), 2, "{files:?}");
    drop(store);
    let store = open_with(&sim, every(2), keep(2));
    assert_eq!(store.snapshots(), vec![ids[7], ids[9]]);
}

#[test]
fn compaction_reclaims_old_deltas_and_keeps_every_target_rebuildable() {
    let sim = SimStorage::new(4);
    let store = open_with(&sim, every(10), keep(2));
    let ids = chain(&store, "long", 300, 6);
    let expected: Vec<Context> = ids.iter().map(|id| store.rebuild_context(*id).expect("rebuild").context).collect();
    let before = store.space_report().expect("space");
    let report = store.compact().expect("compact");
    let after = store.space_report().expect("space");
    eprintln!("{report:?}\nbefore {before:?}\nafter  {after:?}");
    assert!(report.deltas_reclaimed > 200, "{report:?}");
    assert!(report.segments_rewritten > 0 && report.bytes_reclaimed > 0, "{report:?}");
    assert!(after.log_bytes < before.log_bytes / 2, "{before:?} → {after:?}");
    assert!(after.amplification() <= 1.5, "space amplification {} after compaction", after.amplification());

    let check = |store: &Store, context: &str| {
        let oldest = store.snapshots()[0];
        for (id, want) in ids.iter().zip(&expected) {
            match store.rebuild_context(*id) {
                Ok(rebuilt) => assert_eq!(&rebuilt.context, want, "{context}: atom {id}"),
                Err(Error::HistoryReclaimed { .. }) => assert!(*id < oldest, "{context}: target {id} lost"),
                Err(error) => panic!("{context}: atom {id}: {error}"),
            }
            // The atom itself, its result and its status survive: completed work is never redone.
            let atom = store.atom(*id).expect("atom");
            assert_eq!(atom.output.expect("output").result, b"result".to_vec());
        }
    };
    check(&store, "after compaction");
    // Resume still knows every completed atom.
    let resume = store.resume(store.run_id("long").expect("run")).expect("resume");
    assert_eq!(resume.agents[0].completed.len(), 300);
    drop(store);
    let store = open_with(&sim, every(10), keep(2));
    check(&store, "after reopen");
    // Appending goes on, and a second round finds little left to do.
    let more = chain(&store, "long-2", 5, 7);
    assert_eq!(more.len(), 5);
    let again = store.compact().expect("compact again");
    assert_eq!(again.deltas_reclaimed, 0, "{again:?}");
}

#[test]
fn a_branch_cannot_start_from_a_reclaimed_atom_except_at_its_snapshot() {
    let sim = SimStorage::new(5);
    let store = open_with(&sim, every(10), keep(1));
    let ids = chain(&store, "fork", 120, 8);
    store.compact().expect("compact");
    let run = store.run_id("fork").expect("run");
    let refused = store.begin_atom(run, "agent", "from-old", &[ids[3]], "");
    assert!(matches!(refused, Err(Error::InvalidParent { .. })), "{refused:?}");
    let snapshot = store.snapshots()[0];
    let branch = store.begin_atom(run, "agent", "from-snapshot", &[snapshot], "").expect("branch from the snapshot");
    store.complete_atom(branch, &output(Delta::default())).expect("complete");
    let rebuilt = store.rebuild_context(branch).expect("rebuild the branch");
    assert_eq!(rebuilt.snapshot, Some(snapshot));
}

#[test]
fn compaction_keeps_the_history_an_agent_rolled_back_to() {
    // Snapshots at atoms 10, 20 and 30 (the newest two kept); a reviewer rolls the agent back
    // to atom 5, abandoning 6..30 and with them every kept snapshot. The agent continues from
    // atom 5, so compaction must keep the history it is rebuilt from (it used to take atom 5
    // and its ancestors as covered by the abandoned branch's snapshots, and the agent could
    // neither rebuild nor continue from atom 5).
    let sim = SimStorage::new(9);
    let store = open_with(&sim, every(10), keep(2));
    let ids = chain(&store, "review", 30, 4);
    let expected = store.rebuild_context(ids[4]).expect("rebuild").context;
    let run = store.run_id("review").expect("run");
    store.rollback(run, "agent", ids[4], "redo from 5").expect("rollback");
    store.compact().expect("compact");
    assert_eq!(store.rebuild_context(ids[4]).expect("the head's history is kept").context, expected);
    let next = store.begin_atom(run, "agent", "step-5-again", &[ids[4]], "").expect("continues from the head");
    store.complete_atom(next, &output(Delta::default())).expect("complete");
    drop(store);
    let store = open_with(&sim, every(10), keep(2));
    store.compact().expect("compact after reopening");
    assert_eq!(store.rebuild_context(ids[4]).expect("still kept").context, expected);
    store.rebuild_context(next).expect("the new line rebuilds");
}

#[test]
fn a_rollback_is_refused_to_a_reclaimed_atom_and_taken_to_its_snapshot() {
    // The agent could not continue from an atom whose history is gone: the rollback is
    // refused before it abandons anything, and taken to the kept snapshot (atom 120 of 125).
    let sim = SimStorage::new(5);
    let store = open_with(&sim, every(10), keep(1));
    let ids = chain(&store, "back", 125, 8);
    store.compact().expect("compact");
    let run = store.run_id("back").expect("run");
    let refused = store.rollback(run, "agent", ids[3], "too far back");
    assert!(matches!(refused, Err(Error::HistoryReclaimed { atom, .. }) if atom == ids[3].get()), "{refused:?}");
    assert!(!store.atom(ids[124]).expect("head").abandoned, "nothing was abandoned");
    let snapshot = store.snapshots()[0];
    assert_eq!(snapshot, ids[119]);
    let abandoned = store.rollback(run, "agent", snapshot, "back to the snapshot").expect("rollback");
    assert_eq!(abandoned, ids[120..].to_vec());
    let next = store.begin_atom(run, "agent", "after-rollback", &[snapshot], "").expect("continues from it");
    store.complete_atom(next, &output(Delta::default())).expect("complete");
    assert_eq!(store.rebuild_context(next).expect("rebuild").snapshot, Some(snapshot));
}

#[test]
fn a_pinned_atom_keeps_its_history_until_unpinned() {
    let sim = SimStorage::new(7);
    let store = open_with(&sim, every(10), keep(1));
    let ids = chain(&store, "pinned", 120, 11);
    let expected = store.rebuild_context(ids[20]).expect("rebuild").context;
    store.pin(ids[20], true).expect("pin");
    let report = store.compact().expect("compact");
    assert!(report.deltas_reclaimed > 50, "{report:?}");
    assert_eq!(store.rebuild_context(ids[20]).expect("pinned atom").context, expected);
    assert!(matches!(store.rebuild_context(ids[40]), Err(Error::HistoryReclaimed { .. })), "unpinned history goes");
    let run = store.run_id("pinned").expect("run");
    store.begin_atom(run, "agent", "branch", &[ids[20]], "").expect("a branch from a pinned atom");
    drop(store);

    // The pin is durable.
    let store = open_with(&sim, every(10), keep(1));
    store.compact().expect("compact");
    assert_eq!(store.rebuild_context(ids[20]).expect("pinned after reopen").context, expected);

    // Unpinned, its history stays as long as the branch from it (a target with no kept
    // snapshot on its ancestry) needs it: a retained fork point.
    store.pin(ids[20], false).expect("unpin");
    store.compact().expect("compact");
    assert_eq!(store.rebuild_context(ids[20]).expect("fork point").context, expected);
    assert!(matches!(store.pin(ids[40], true), Err(Error::HistoryReclaimed { .. })), "too late to pin");
    store.pin(ids[119], true).expect("pin the newest atom");
}

#[test]
fn an_unpinned_atom_loses_its_history() {
    let sim = SimStorage::new(8);
    let store = open_with(&sim, every(10), keep(1));
    let ids = chain(&store, "unpinned", 120, 12);
    store.pin(ids[20], true).expect("pin");
    store.compact().expect("compact");
    store.rebuild_context(ids[20]).expect("pinned");
    store.pin(ids[20], false).expect("unpin");
    store.compact().expect("compact");
    assert!(matches!(store.rebuild_context(ids[20]), Err(Error::HistoryReclaimed { .. })));
}

#[test]
fn finished_runs_past_their_age_are_dropped_for_good() {
    let sim = SimStorage::new(6);
    let retention = RetentionPolicy { snapshots_per_agent: 2, finished_run_age: Some(Duration::ZERO) };
    let store = open_with(&sim, every(10), retention);
    let old = chain(&store, "old", 60, 9);
    let old_run = store.run_id("old").expect("run");
    let kept = chain(&store, "kept", 40, 10);
    let kept_contexts: Vec<Context> =
        kept.iter().map(|id| store.rebuild_context(*id).expect("rebuild").context).collect();
    store.finish_run(old_run, true, "done").expect("finish");
    let report = store.compact().expect("compact");
    assert_eq!(report.runs_dropped, 1, "{report:?}");
    assert_eq!(store.run_status(old_run).expect("status"), RunStatus::Dropped);
    assert!(matches!(store.atom(old[0]), Err(Error::UnknownAtom { .. })));
    assert!(store.snapshots().iter().all(|s| !old.contains(s)), "the dropped run's snapshots are deleted");

    let check = |store: &Store| {
        assert_eq!(store.run_status(old_run).expect("status"), RunStatus::Dropped);
        assert!(store.run_id("old").is_none());
        for atom in &old {
            assert!(matches!(store.atom(*atom), Err(Error::UnknownAtom { .. })));
        }
        let oldest = store.snapshots()[0];
        for (id, want) in kept.iter().zip(&kept_contexts) {
            match store.rebuild_context(*id) {
                Ok(rebuilt) => assert_eq!(&rebuilt.context, want),
                Err(Error::HistoryReclaimed { .. }) => assert!(*id < oldest, "target {id} lost"),
                Err(error) => panic!("atom {id}: {error}"),
            }
        }
    };
    check(&store);
    drop(store);
    let store = open_with(&sim, every(10), retention);
    check(&store);
    // The name is free again, but neither the run number nor any atom id is reused.
    let reborn = store.create_run(RunSpec::new("old")).expect("run");
    assert_ne!(reborn, old_run);
    let atom = store.begin_atom(reborn, "agent", "first", &[], "").expect("begin");
    assert!(atom.get() > kept.last().expect("atom").get());
}

#[test]
fn a_dropped_run_gives_its_index_memory_back() {
    // 9,000 atoms of a run that is then dropped (two whole pages of the index's atom table, its
    // atom keys and its guards), beside a run that is kept: the index shrinks, live and after a
    // reopen, and the kept run's atoms and keys work as before.
    let sim = SimStorage::new(11);
    // No index snapshot, and no segment rewritten: the reopen folds the dropped run's
    // records and then the drop's.
    let open_on = |sim: &SimStorage| {
        Store::builder(Path::new("/store"))
            .storage(Arc::new(sim.clone()))
            .segment_bytes(SEGMENT_BYTES)
            .snapshot_policy(SnapshotPolicy::NEVER)
            .retention(RetentionPolicy { snapshots_per_agent: 1, finished_run_age: Some(Duration::ZERO) })
            .compaction(CompactionPolicy { live_fraction_min: 0.0, interval: None, cold_compression: None })
            .index_snapshot_after(u64::MAX)
            .background(false)
            .open()
            .expect("open")
    };
    let open = || open_on(&sim);
    let record = |store: &Store, run: RunId, count: usize| -> Vec<AtomId> {
        let outputs = AtomOutput { delta: Delta::default(), result: b"r".to_vec() };
        (0..count)
            .map(|i| store.record_atom(run, "agent", &format!("step-{i}"), &[], "", &outputs).expect("record"))
            .collect()
    };
    // What an index holding only the kept run takes.
    let alone = {
        let store = open_on(&SimStorage::new(12));
        store.create_run(RunSpec::new("old")).expect("run");
        let kept_run = store.create_run(RunSpec::new("kept")).expect("run");
        record(&store, kept_run, 100);
        store.index_heap_bytes()
    };
    let store = open();
    let old_run = store.create_run(RunSpec::new("old")).expect("run");
    let old = record(&store, old_run, 9_000);
    // And 2,000 guarded effects, whose guards go too.
    for atom in &old[..2_000] {
        store.guarded(*atom, "send", |_| Ok(b"sent".to_vec())).expect("guarded");
    }
    let kept_run = store.create_run(RunSpec::new("kept")).expect("run");
    let kept = record(&store, kept_run, 100);
    let before = store.index_heap_bytes();
    store.finish_run(old_run, true, "done").expect("finish");
    assert_eq!(store.compact().expect("compact").runs_dropped, 1);
    // About what an index that never held the dropped run takes (its pages, keys and guards
    // are gone; a few slots of the page list stay).
    let after = store.index_heap_bytes();
    assert!(after <= alone + 8 * 1024, "index {before} -> {after} bytes, {alone} without the dropped run");
    let check = |store: &Store| {
        assert_eq!(store.atom_by_key(old_run, "agent", "step-5").expect("lookup"), None);
        assert!(matches!(store.atom(old[8_999]), Err(Error::UnknownAtom { .. })));
        for (i, atom) in kept.iter().enumerate() {
            assert_eq!(store.atom_by_key(kept_run, "agent", &format!("step-{i}")).expect("lookup"), Some(*atom));
            assert_eq!(store.atom(*atom).expect("kept atom").status, AtomStatus::Completed);
        }
        // A kept key is still taken; a new one is not.
        let again = store.begin_atom(kept_run, "agent", "step-3", &[], "");
        assert!(matches!(again, Err(Error::AtomExists { atom }) if atom == kept[3].get()), "{again:?}");
    };
    check(&store);
    drop(store);
    let store = open();
    check(&store);
    // The fold forgets the dropped run's atoms and keys; its guards, which its records still
    // in the log bring back, go with the next round (a fold cannot tell them from a live
    // run's without reading their starts).
    store.compact().expect("a round");
    assert!(store.index_heap_bytes() <= alone + 8 * 1024, "reopened: {} bytes", store.index_heap_bytes());
    store.begin_atom(kept_run, "agent", "step-100", &[], "").expect("a new step");
}

/// A random DAG of a few agents, with failures, forks and merges.
fn run_dag(store: &Store, seed: u64, count: usize) -> (Vec<AtomId>, BTreeMap<AtomId, String>) {
    let mut rng = SplitMix64::new(seed);
    let mut transcript = Transcript::new(seed);
    let run = store.create_run(RunSpec::new("dag")).expect("run");
    let mut ids: Vec<AtomId> = Vec::new();
    let mut agents = BTreeMap::new();
    let mut failed = BTreeSet::new();
    for i in 0..count {
        // Mostly extend a recent atom; sometimes fork from an old one or merge two.
        let mut parents = BTreeSet::new();
        if i > 0 {
            let recent = i - 1 - (rng.below(3.min(i as u64)) as usize);
            parents.insert(recent);
            if rng.below(10) == 0 {
                parents.insert(rng.below(i as u64) as usize);
            }
        }
        let parents: Vec<AtomId> = parents.into_iter().filter(|p| !failed.contains(p)).map(|p| ids[p]).collect();
        let agent = format!("agent-{}", rng.below(2));
        let atom = match store.begin_atom(run, &agent, &format!("a{i}"), &parents, "") {
            Ok(atom) => atom,
            Err(error) => panic!("begin {i} with parents {parents:?}: {error}"),
        };
        if rng.below(10) == 0 {
            store.fail_atom(atom, &AtomFailure { message: "boom".into(), retryable: false }).expect("fail");
            failed.insert(i);
        } else {
            store.complete_atom(atom, &output(transcript.next_delta(300))).expect("complete");
        }
        agents.insert(atom, agent);
        ids.push(atom);
    }
    (ids, agents)
}

fn check_dag(store: &Store, ids: &[AtomId], agents: &BTreeMap<AtomId, String>, expected: &[Context], context: &str) {
    let mut oldest: BTreeMap<&str, AtomId> = BTreeMap::new();
    for snapshot in store.snapshots() {
        let agent = agents[&snapshot].as_str();
        oldest.entry(agent).or_insert(snapshot);
    }
    for (id, want) in ids.iter().zip(expected) {
        let target = oldest.get(agents[id].as_str()).is_none_or(|first| id >= first);
        match store.rebuild_context(*id) {
            Ok(rebuilt) => assert_eq!(&rebuilt.context, want, "{context}: atom {id}"),
            Err(Error::HistoryReclaimed { .. }) if !target => {}
            Err(error) => panic!("{context}: atom {id} (target: {target}): {error}"),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// Random DAGs, random snapshot frequency and K: every target rebuilds exactly as before
    /// compaction, after compaction, and after reopening.
    #[test]
    fn compaction_never_changes_a_target_context(seed in 0u64..1_000_000, every_atoms in 3u32..12, k in 1usize..4) {
        let sim = SimStorage::new(seed);
        let store = open_with(&sim, every(every_atoms), keep(k));
        let (ids, agents) = run_dag(&store, seed, 160);
        let expected: Vec<Context> =
            ids.iter().map(|id| store.rebuild_context(*id).expect("rebuild before").context).collect();
        let report = store.compact().expect("compact");
        // The workload always leaves history to reclaim: the check is not vacuous.
        prop_assert!(report.deltas_reclaimed > 0, "{:?}", report);
        check_dag(&store, &ids, &agents, &expected, "after compaction");
        drop(store);
        let store = open_with(&sim, every(every_atoms), keep(k));
        check_dag(&store, &ids, &agents, &expected, "after reopen");
        store.compact().expect("compact again");
        check_dag(&store, &ids, &agents, &expected, "after a second compaction");
    }
}

/// A rebuild finds an agent's only kept snapshot however many newer snapshots other agents of
/// its run took since: the purge plan strips the deltas below it, counting on the rebuild to
/// start there, and the rebuild does.
#[test]
fn a_rebuild_finds_its_snapshot_behind_many_newer_ones_of_other_agents() {
    let sim = SimStorage::new(17);
    let store = open_with(&sim, every(u32::MAX), keep(30));
    let run = store.create_run(RunSpec::new("team")).expect("run");
    let mut transcript = Transcript::new(8);
    let mut line = |agent: &str, parents: &mut Vec<AtomId>, count: usize, snapshot_each: bool| {
        for _ in 0..count {
            let key = format!("{agent}-{}", parents.len());
            let atom =
                store.begin_atom(run, agent, &key, &parents[parents.len().saturating_sub(1)..], "").expect("begin");
            store.complete_atom(atom, &output(transcript.next_delta(500))).expect("complete");
            if snapshot_each {
                store.snapshot_now(atom).expect("snapshot");
            }
            parents.push(atom);
        }
    };
    let (mut a, mut b) = (Vec::new(), Vec::new());
    line("a", &mut a, 10, false);
    store.snapshot_now(a[9]).expect("snapshot");
    line("b", &mut b, 20, true);
    line("a", &mut a, 10, false);
    let head = *a.last().expect("head");
    let want = store.rebuild_context(head).expect("rebuild before compaction").context;
    store.compact().expect("compact");
    let check = |store: &Store| {
        let rebuilt = store.rebuild_context(head).expect("the head rebuilds after compaction");
        assert_eq!(rebuilt.context, want);
        assert_eq!(rebuilt.snapshot, Some(a[9]), "from the agent's own snapshot");
        assert!(matches!(store.rebuild_context(a[3]), Err(Error::HistoryReclaimed { .. })), "below it: stripped");
    };
    check(&store);
    drop(store);
    check(&open_with(&sim, every(u32::MAX), keep(30)));
}

/// A dropped run takes its guard records with it, those of failed effects too: after the round
/// no record of the log names one of its keys, and a reopen finds the same.
#[test]
fn a_dropped_runs_guard_records_go_with_it_failed_ones_included() {
    let sim = SimStorage::new(16);
    let retention = RetentionPolicy { snapshots_per_agent: 2, finished_run_age: Some(Duration::ZERO) };
    let store = open_with(&sim, every(10), retention);
    let old = chain(&store, "old", 30, 3);
    let kept = chain(&store, "kept", 30, 4);
    for (i, atom) in old.iter().chain(&kept).enumerate() {
        let outcome = match i % 3 {
            0 => Ok(b"sent".to_vec()),
            1 => Err(continuum::AtomFailure { message: "declined".into(), retryable: false }),
            _ => Err(continuum::AtomFailure { message: "timeout".into(), retryable: true }),
        };
        let _ = store.guarded(*atom, "send", |_| outcome);
    }
    // Enough after them that the segments holding the guard records are sealed.
    chain(&store, "filler", 60, 5);
    let is_guard = |record: &continuum::codec::StoreRecord| -> Option<String> {
        use continuum::codec::StoreRecord::{GuardCompleted, GuardFailed, GuardStarted};
        match record {
            GuardStarted(guard) => Some(guard.key.clone()),
            GuardCompleted(guard) => Some(guard.key.clone()),
            GuardFailed(guard) => Some(guard.key.clone()),
            _ => None,
        }
    };
    let guard_keys = |store: &Store| -> Vec<String> { decoded_log(store).values().filter_map(is_guard).collect() };
    let before = guard_keys(&store);
    assert!(before.iter().any(|key| key.starts_with("old#")), "the old run's guards are in the log");
    let failed_before = decoded_log(&store)
        .values()
        .filter(|r| matches!(r, continuum::codec::StoreRecord::GuardFailed(g) if g.key.starts_with("old#")))
        .count();
    assert!(failed_before >= 10, "{failed_before} failed guard records of the old run");
    store.finish_run(store.run_id("old").expect("run"), true, "done").expect("finish");
    let report = store.compact().expect("compact");
    assert_eq!(report.runs_dropped, 1, "{report:?}");
    let check = |store: &Store| {
        let after = guard_keys(store);
        let old_left: Vec<&String> = after.iter().filter(|key| key.starts_with("old#")).collect();
        assert!(old_left.is_empty(), "guard records of the dropped run left: {old_left:?}");
        let kept_before = before.iter().filter(|key| key.starts_with("kept#")).count();
        assert_eq!(after.iter().filter(|key| key.starts_with("kept#")).count(), kept_before, "the kept run's stay");
    };
    check(&store);
    drop(store);
    let store = open_with(&sim, every(10), retention);
    check(&store);
    // The kept run's non-retryable failure is still its key's outcome.
    let failed = store.guarded(kept[1], "send", |_| Ok(b"again".to_vec()));
    assert!(matches!(failed, Err(Error::GuardFailed { retryable: false, .. })), "{failed:?}");
}

/// Every record of the log, decoded, by LSN.
fn decoded_log(store: &Store) -> BTreeMap<u64, continuum::codec::StoreRecord> {
    let mut records = BTreeMap::new();
    for item in store.log().iter_from(continuum::Lsn::FIRST).expect("iter") {
        let (lsn, bytes) = item.expect("record");
        records.insert(lsn.get(), store.decode_record(&bytes).expect("decode").record);
    }
    records
}

/// Cold compression (on by default) rewrites every sealed segment with its records stored plain
/// and compressed together: the log shrinks, every record decodes to exactly what it was, every
/// context rebuilds the same, across reopen with and without the index snapshot; a second
/// round has nothing left to compress, and a later round compresses only the newly sealed
/// segments. With no snapshots, nothing is reclaimable, so nothing else changes.
#[test]
fn cold_compression_keeps_every_record_and_shrinks_the_log() {
    let sim = SimStorage::new(11);
    let store = open_with(&sim, SnapshotPolicy::NEVER, keep(2));
    let ids = chain(&store, "cold", 240, 12);
    let expected: Vec<Context> = ids.iter().map(|id| store.rebuild_context(*id).expect("rebuild").context).collect();
    let records = decoded_log(&store);
    let sealed_before = store.log().segments().iter().filter(|s| s.sealed).count();
    assert!(sealed_before >= 3, "the run spans several sealed segments");
    let bytes =
        |store: &Store| -> u64 { store.log().segments().iter().filter(|s| s.sealed).map(|s| s.data_bytes).sum() };
    let before = bytes(&store);

    let report = store.compact().expect("compact");
    assert_eq!(report.deltas_reclaimed, 0, "{report:?}");
    assert_eq!(report.segments_compressed, sealed_before, "{report:?}");
    assert!(store.log().segments().iter().filter(|s| s.sealed).all(|s| s.compressed));
    let after = bytes(&store);
    eprintln!("cold compression: sealed segments {before} → {after} bytes ({report:?})");
    assert!(after * 2 < before, "sealed segments {before} → {after} bytes");

    let check = |store: &Store, context: &str| {
        assert_eq!(decoded_log(store), records, "{context}: every record decodes as before");
        for (id, want) in ids.iter().zip(&expected) {
            assert_eq!(&store.rebuild_context(*id).expect("rebuild").context, want, "{context}: atom {id}");
        }
    };
    check(&store, "after cold compression");
    let again = store.compact().expect("compact again");
    assert_eq!((again.segments_rewritten, again.segments_compressed), (0, 0), "{again:?}");
    store.write_index_snapshot().expect("index snapshot");
    drop(store);
    let store = open_with(&sim, SnapshotPolicy::NEVER, keep(2));
    assert!(store.index_snapshot().opened_from.is_some(), "{:?}", store.index_snapshot());
    check(&store, "reopened from the index snapshot");
    drop(store);
    continuum::storage::Storage::remove_file(&sim, Path::new("/store/index.snapshot"))
        .expect("remove the index snapshot");
    let store = open_with(&sim, SnapshotPolicy::NEVER, keep(2));
    assert!(store.index_snapshot().opened_from.is_none());
    check(&store, "reopened by folding the compressed log");

    let more = chain(&store, "cold-2", 60, 13);
    let sealed_now = store.log().segments().iter().filter(|s| s.sealed && !s.compressed).count();
    assert!(sealed_now > 0, "the new run sealed segments");
    let third = store.compact().expect("compact the new segments");
    assert_eq!(third.segments_compressed, sealed_now, "{third:?}");
    let atom = store.atom(*more.last().expect("atoms")).expect("atom");
    assert_eq!(atom.output.expect("output").result, b"result".to_vec());
}

/// A burst of due policy snapshots (every atom of three agents, interleaved) while the
/// background thread paces itself: requests coalesce to each agent's newest atom, none is
/// lost to a full queue, and a clean close writes each agent's newest.
#[test]
fn a_burst_of_due_snapshots_coalesces_and_a_clean_close_writes_each_agents_newest() {
    let sim = SimStorage::new(21);
    let store = Store::builder(Path::new("/store"))
        .storage(Arc::new(sim.clone()))
        .snapshot_policy(every(1))
        .retention(keep(2))
        .open()
        .expect("open");
    let runs: Vec<_> = (0..3).map(|a| store.create_run(RunSpec::new(format!("agent {a}"))).expect("run")).collect();
    let mut transcript = Transcript::new(5);
    let mut last: Vec<Option<AtomId>> = vec![None; runs.len()];
    for i in 0..500 {
        for (agent, run) in runs.iter().enumerate() {
            let parents: Vec<AtomId> = last[agent].into_iter().collect();
            let out = output(transcript.next_delta(200));
            last[agent] =
                Some(store.record_atom(*run, "agent", &format!("step-{i}"), &parents, "", &out).expect("record"));
        }
    }
    drop(store);
    let store = open_with(&sim, every(1), keep(2));
    let snapshots: BTreeSet<AtomId> = store.snapshots().into_iter().collect();
    for newest in last.into_iter().flatten() {
        assert!(snapshots.contains(&newest), "the agent's last atom {newest:?} is snapshotted: {snapshots:?}");
    }
}

#[test]
fn a_bursting_agent_is_snapshotted_at_most_once_a_second_and_its_newest_atom_after_that() {
    // Every atom is due (`every(1)`). The agent completes 40 atoms in a burst: once it pauses,
    // its newest atom is snapshotted. A second burst follows at once: its due snapshots
    // coalesce and wait until a second after the first one.
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::builder(dir.path()).snapshot_policy(every(1)).open().expect("open");
    let run = store.create_run(RunSpec::new("burst")).expect("run");
    let mut transcript = Transcript::new(17);
    let mut ids: Vec<AtomId> = Vec::new();
    let mut burst = |ids: &mut Vec<AtomId>| extend_chain(&store, run, ids, 40, &mut transcript);
    let wait_for_snapshot_of = |atom: AtomId| {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while store.snapshots().last() != Some(&atom) {
            assert!(std::time::Instant::now() < deadline, "{atom:?} was never snapshotted");
            std::thread::sleep(Duration::from_millis(2));
        }
        std::time::Instant::now()
    };
    burst(&mut ids);
    let first = wait_for_snapshot_of(ids[39]);
    burst(&mut ids);
    let second = wait_for_snapshot_of(ids[79]);
    // The second began at least a second after the first began, which was before `first`.
    let apart = second - first;
    assert!(apart >= Duration::from_millis(900), "the second snapshot came {apart:?} after the first");
    let snapshots = store.snapshots();
    assert!(snapshots.len() <= 3, "two bursts of 40 due atoms wrote {} snapshots: {snapshots:?}", snapshots.len());
}
