//! Retention and compaction against rollback and fork: one plan of what is live decides which
//! snapshots are kept and which deltas are reclaimed, so that every head an agent can reach
//! (after a rollback or a fork) can be rebuilt, and a rollback or fork to an atom whose history
//! is gone is refused instead of leaving the agent on a head nothing can rebuild.

use std::time::Duration;

use continuum::synthetic::Transcript;
use continuum::{AtomId, AtomOutput, CompactionPolicy, Error, RetentionPolicy, RunId, RunSpec, SnapshotPolicy, Store};

fn output(step: u64) -> AtomOutput {
    AtomOutput { delta: Transcript::new(step).next_delta(600), result: step.to_le_bytes().to_vec() }
}

/// Snapshots every 10 atoms of an agent, the newest 2 kept, no background thread, and every
/// sealed segment with a reclaimable delta rewritten.
fn open(dir: &std::path::Path) -> Store {
    Store::builder(dir)
        .segment_bytes(16 * 1024)
        .snapshot_policy(SnapshotPolicy { every_atoms: 10, every: Duration::ZERO })
        .retention(RetentionPolicy { snapshots_per_agent: 2, finished_run_age: None })
        .compaction(CompactionPolicy { live_fraction_min: 1.0, interval: None, cold_compression: None })
        .background(false)
        .open()
        .expect("open")
}

/// Records `count` atoms of agent "a", each the child of the agent's head; returns them.
fn record(store: &Store, run: RunId, count: u64) -> Vec<AtomId> {
    let mut atoms = Vec::new();
    for _ in 0..count {
        let parents: Vec<AtomId> = store.last_agent_atom(run, "a").into_iter().collect();
        let step = store.agent_atoms(run, "a").len() as u64;
        let atom = store.record_atom(run, "a", &format!("s{step}"), &parents, "", &output(step)).expect("record");
        atoms.push(atom);
    }
    atoms
}

/// A rollback to `to` and a fork from it either succeed and leave a head that rebuilds, or are
/// refused because `to`'s history is gone.
fn rollback_and_fork_rebuild_or_are_refused(store: &Store, run: RunId, to: AtomId) {
    match store.rollback(run, "a", to, "retry") {
        Ok(_) => {
            store.rebuild_context(to).expect("a rollback succeeded, so its head must rebuild");
        }
        Err(Error::HistoryReclaimed { .. }) => {}
        Err(other) => panic!("unexpected error {other}"),
    }
    match store.fork(run, "a", to, "fork") {
        Ok(fork) => {
            store.rebuild_context(fork).expect("a fork succeeded, so it must rebuild");
        }
        Err(Error::HistoryReclaimed { .. } | Error::InvalidParent { .. }) => {}
        Err(other) => panic!("unexpected error {other}"),
    }
}

/// The trigger: atoms 1..30, a compaction (deltas below the oldest kept snapshot, 20,
/// go), atoms 31..40 (the snapshot at 40 prunes the one at 20): nothing can rebuild 21..29 any
/// more, so a rollback or a fork to 25 must be refused, and leave the agent where it was.
#[test]
fn a_rollback_or_fork_to_an_atom_whose_history_is_gone_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    let run = store.create_run(RunSpec::new("r")).expect("run");
    let mut atoms = record(&store, run, 30);
    let report = store.compact().expect("compact");
    assert!(report.deltas_reclaimed > 0, "{report:?}");
    atoms.extend(record(&store, run, 10));
    store.compact().expect("compact");
    let to = atoms[24];
    rollback_and_fork_rebuild_or_are_refused(&store, run, to);
    assert_eq!(store.last_agent_atom(run, "a"), atoms.last().copied(), "a refused rollback abandons nothing");
    // The head is still whole, and stays so across a reopen.
    let head = store.last_agent_atom(run, "a").expect("head");
    store.rebuild_context(head).expect("head");
    drop(store);
    let store = open(dir.path());
    assert!(matches!(store.rollback(run, "a", to, "retry"), Err(Error::HistoryReclaimed { .. }) | Ok(_)));
    let head = store.last_agent_atom(run, "a").expect("head");
    store.rebuild_context(head).expect("head after reopen");
}

/// The same refusal survives a reopen before any new compaction round: what the round released
/// is durable, not only in the memory of the process that planned it.
#[test]
fn history_released_by_a_round_stays_released_after_a_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run;
    let to;
    {
        let store = open(dir.path());
        run = store.create_run(RunSpec::new("r")).expect("run");
        let mut atoms = record(&store, run, 30);
        store.compact().expect("compact");
        atoms.extend(record(&store, run, 10));
        store.compact().expect("compact");
        to = atoms[24];
    }
    let store = open(dir.path());
    rollback_and_fork_rebuild_or_are_refused(&store, run, to);
}

/// Snapshots on a branch a rollback abandoned do not count towards the K an agent keeps: after
/// a rollback to 25 (abandoning the snapshot at 30) and ten more atoms (a snapshot at their
/// end), the agent keeps the snapshots at 20 and at its newest atom, not the abandoned one at
/// 30, so every atom of its line from 20 on still rebuilds (time travel) and can be rolled
/// back to.
#[test]
fn snapshots_on_abandoned_branches_do_not_count_towards_retention() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    let run = store.create_run(RunSpec::new("r")).expect("run");
    let atoms = record(&store, run, 30);
    store.compact().expect("compact");
    store.rollback(run, "a", atoms[24], "retry").expect("rollback to 25: its history is whole");
    let line = record(&store, run, 10);
    store.compact().expect("compact");
    let snapshots = store.snapshots();
    assert!(!snapshots.contains(&atoms[29]), "the abandoned branch's snapshot goes first: {snapshots:?}");
    for atom in atoms[20..25].iter().chain(&line) {
        store.rebuild_context(*atom).unwrap_or_else(|e| panic!("atom {atom} of the live line: {e}"));
    }
    store.rollback(run, "a", line[4], "again").expect("rollback within the live line");
    store.rebuild_context(line[4]).expect("the new head");
}
