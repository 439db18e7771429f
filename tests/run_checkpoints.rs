//! Run checkpoints: sequences that only grow (a stale writer, in this process or after a
//! reopen, never overwrites a newer checkpoint), the heads and side effects a checkpoint
//! names, bad input refused with nothing written, and invariant 7: the agent heads the newest
//! checkpoint names stay rebuildable through rollbacks, compaction rounds and reopens (a
//! checkpoint naming an atom that compaction then released could not be resumed).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use continuum::checkpoint::{CHECKPOINT_AGENT, CheckpointDraft};
use continuum::limits::{CHECKPOINT_BYTES_MAX, CHECKPOINT_NAME_BYTES_MAX};
use continuum::storage::sim::SimStorage;
use continuum::synthetic::Transcript;
use continuum::{
    AtomFailure, AtomId, AtomOutput, CompactionPolicy, Error, RetentionPolicy, RunId, RunSpec, SnapshotPolicy, Store,
};

fn open(sim: &SimStorage) -> Store {
    Store::builder(Path::new("/store"))
        .storage(Arc::new(sim.clone()))
        .segment_bytes(16 * 1024)
        .compress_records_from(64)
        .snapshot_policy(SnapshotPolicy { every_atoms: 10, every: Duration::ZERO })
        .retention(RetentionPolicy { snapshots_per_agent: 1, finished_run_age: None })
        .compaction(CompactionPolicy { live_fraction_min: 0.7, interval: None, ..CompactionPolicy::default() })
        .background(false)
        .open()
        .expect("open")
}

/// `count` more atoms of `agent`, each the previous one's child; returns them.
fn steps(store: &Store, run: RunId, agent: &str, after: Option<AtomId>, count: usize, seed: u64) -> Vec<AtomId> {
    let mut transcript = Transcript::new(seed);
    let mut ids = Vec::new();
    let mut parent = after;
    for _ in 0..count {
        let key = format!("step-{}-{}", seed, ids.len());
        let output = AtomOutput { delta: transcript.next_delta(500), result: b"ok".to_vec() };
        let atom = store.record_atom(run, agent, &key, &parent.into_iter().collect::<Vec<_>>(), "", &output);
        let atom = atom.expect("record");
        ids.push(atom);
        parent = Some(atom);
    }
    ids
}

#[test]
fn sequences_grow_and_a_stale_writer_is_refused_with_the_newest() {
    let sim = SimStorage::new(1);
    let store = open(&sim);
    let run = store.create_run(RunSpec::new("trip").pipeline("travel", "1.0").env("host", "a")).expect("run");
    let planner = steps(&store, run, "planner", None, 3, 1);
    assert_eq!(store.write_checkpoint(run, CheckpointDraft::at("planner", "p1")).expect("first"), 1);
    assert_eq!(store.write_checkpoint(run, CheckpointDraft::at("planner", "p2").sequence(5)).expect("jump"), 5);
    assert_eq!(store.write_checkpoint(run, CheckpointDraft::at("planner", "p3")).expect("next"), 6);
    for stale in [6, 5, 2] {
        let refused = store.write_checkpoint(run, CheckpointDraft::at("planner", "old").sequence(stale));
        assert!(
            matches!(refused, Err(Error::StaleCheckpoint { sequence, newest: 6, .. }) if sequence == stale),
            "{refused:?}"
        );
    }
    assert!(matches!(
        store.write_checkpoint(run, CheckpointDraft::at("planner", "zero").sequence(0)),
        Err(Error::InvalidArgument { .. })
    ));
    let latest = store.load_latest_checkpoint(run).expect("load").expect("a checkpoint");
    assert_eq!((latest.sequence, latest.position.as_str()), (6, "p3"));
    assert_eq!((latest.pipeline.as_str(), latest.pipeline_version.as_str()), ("travel", "1.0"));
    assert_eq!(latest.environment.get("host").map(String::as_str), Some("a"));
    assert_eq!(latest.agent_heads, BTreeMap::from([("planner".to_owned(), planner[2])]));
    let listed: Vec<u64> = store.checkpoints(run, 10).expect("list").iter().map(|c| c.sequence).collect();
    assert_eq!(listed, [6, 5, 1], "newest first");
    assert_eq!(store.checkpoints(run, 2).expect("list").len(), 2);
    assert_eq!(store.load_checkpoint(run, 5).expect("load").map(|c| c.position), Some("p2".into()));
    assert_eq!(store.load_checkpoint(run, 4).expect("load"), None);
    let metrics = store.metrics();
    assert_eq!((metrics.checkpoints_written, metrics.checkpoints_stale), (3, 3));
    drop(store);

    // After a reopen the newest is still 6: a stale writer stays refused, the next is 7.
    let store = open(&sim);
    let refused = store.write_checkpoint(run, CheckpointDraft::at("planner", "old").sequence(6));
    assert!(matches!(refused, Err(Error::StaleCheckpoint { newest: 6, .. })), "{refused:?}");
    assert_eq!(store.write_checkpoint(run, CheckpointDraft::at("planner", "p4")).expect("next"), 7);
    assert_eq!(store.checkpoints(run, usize::MAX).expect("list").len(), 4, "no stale write landed");
}

#[test]
fn racing_writers_of_one_sequence_leave_exactly_one_checkpoint() {
    let dir = tempfile::tempdir().expect("dir");
    let store = Arc::new(Store::open(dir.path()).expect("open"));
    let run = store.create_run(RunSpec::new("race")).expect("run");
    for round in 1..=20u64 {
        let writers: Vec<_> = (0..4)
            .map(|writer| {
                let store = Arc::clone(&store);
                std::thread::spawn(move || {
                    let draft = CheckpointDraft::at("agent", format!("writer-{writer}")).sequence(round);
                    store.write_checkpoint(run, draft)
                })
            })
            .collect();
        let results: Vec<_> = writers.into_iter().map(|w| w.join().expect("writer")).collect();
        let won = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(won, 1, "round {round}: {results:?}");
        for result in results.iter().filter(|r| r.is_err()) {
            assert!(matches!(result, Err(Error::StaleCheckpoint { newest, .. }) if *newest == round), "{result:?}");
        }
    }
    // Writers without a sequence all get one of their own.
    let writers: Vec<_> = (0..4)
        .map(|_| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                (0..5)
                    .map(|_| store.write_checkpoint(run, CheckpointDraft::default()).expect("write"))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut sequences: Vec<u64> = writers.into_iter().flat_map(|w| w.join().expect("writer")).collect();
    sequences.sort_unstable();
    assert_eq!(sequences, (21..=40).collect::<Vec<_>>());
    assert_eq!(store.agent_atoms(run, CHECKPOINT_AGENT).len(), 40);
}

#[test]
fn a_terminal_checkpoint_is_the_last_once_the_run_finishes() {
    let dir = tempfile::tempdir().expect("dir");
    let store = Store::open(dir.path()).expect("open");
    let run = store.create_run(RunSpec::new("done")).expect("run");
    store.write_checkpoint(run, CheckpointDraft::at("agent", "end").terminal().resume_hint("nothing left")).expect("w");
    store.finish_run(run, true, "ok").expect("finish");
    let refused = store.write_checkpoint(run, CheckpointDraft::at("agent", "after"));
    assert!(matches!(refused, Err(Error::RunFinished { .. })), "{refused:?}");
    let latest = store.load_latest_checkpoint(run).expect("load").expect("checkpoint");
    assert!(latest.is_terminal);
    assert_eq!((latest.sequence, latest.resume_hint.as_str()), (1, "nothing left"));
}

#[test]
fn the_run_s_committed_side_effects_are_in_its_checkpoints() {
    let dir = tempfile::tempdir().expect("dir");
    let store = Store::open(dir.path()).expect("open");
    let run = store.create_run(RunSpec::new("trip")).expect("run");
    let other = store.create_run(RunSpec::new("other")).expect("run");
    let step = steps(&store, run, "planner", None, 1, 1)[0];
    let elsewhere = steps(&store, other, "planner", None, 1, 2)[0];
    store.guarded(elsewhere, "book", |_| Ok(b"x".to_vec())).expect("other run's effect");
    let flight =
        store.guarded(step, "book_flight", |_| Ok(b"PNR".to_vec())).map(|_| store.guard_key(step, "book_flight"));
    let flight = flight.expect("effect").expect("key");
    let failed = store.guarded(step, "book_hotel", |_| Err(AtomFailure { message: "503".into(), retryable: true }));
    assert!(failed.is_err());
    store.write_checkpoint(run, CheckpointDraft::default()).expect("first");
    assert_eq!(
        store.load_latest_checkpoint(run).expect("load").expect("c").side_effects_committed,
        std::slice::from_ref(&flight)
    );

    let hotel = store.guarded(step, "book_hotel", |_| Ok(b"H".to_vec())).map(|_| store.guard_key(step, "book_hotel"));
    let hotel = hotel.expect("effect").expect("key");
    store.write_checkpoint(run, CheckpointDraft::default()).expect("second");
    let mut expected = vec![flight, hotel];
    expected.sort();
    assert_eq!(store.load_latest_checkpoint(run).expect("load").expect("c").side_effects_committed, expected);

    // A checkpoint written while an effect is in flight leaves it to the next one.
    let car = store.guarded(step, "book_car", |_| {
        store.write_checkpoint(run, CheckpointDraft::default()).expect("checkpoint during the effect");
        Ok(b"C".to_vec())
    });
    car.expect("effect");
    let during = store.load_latest_checkpoint(run).expect("load").expect("c");
    assert_eq!(during.side_effects_committed, expected, "the car was not booked yet");
    store.write_checkpoint(run, CheckpointDraft::default()).expect("after");
    expected.push(store.guard_key(step, "book_car").expect("key"));
    expected.sort();
    assert_eq!(store.load_latest_checkpoint(run).expect("load").expect("c").side_effects_committed, expected);
}

#[test]
fn bad_input_is_refused_with_nothing_written_and_the_store_usable() {
    let dir = tempfile::tempdir().expect("dir");
    let store = Store::open(dir.path()).expect("open");
    let run = store.create_run(RunSpec::new("trip")).expect("run");
    let other = store.create_run(RunSpec::new("other")).expect("run");
    let mine = steps(&store, run, "planner", None, 3, 1);
    let theirs = steps(&store, other, "planner", None, 1, 2)[0];
    let records = store.log().next_lsn();

    let unknown = store.write_checkpoint(RunId::from_raw(99), CheckpointDraft::default());
    assert!(matches!(unknown, Err(Error::UnknownRun { .. })), "{unknown:?}");
    assert!(matches!(store.load_latest_checkpoint(RunId::from_raw(99)), Err(Error::UnknownRun { .. })));
    let long = "x".repeat(CHECKPOINT_NAME_BYTES_MAX + 1);
    let refusals = [
        CheckpointDraft::at("planner", long.clone()),
        CheckpointDraft::at("planner", "p").resume_hint(long.clone()),
        CheckpointDraft::at("planner", "p").env(long, "v"),
        CheckpointDraft::at("planner", "p").shared("big", vec![7; CHECKPOINT_BYTES_MAX + 1]),
    ];
    for draft in refusals {
        let refused = store.write_checkpoint(run, draft);
        assert!(matches!(refused, Err(Error::LimitExceeded { .. })), "{refused:?}");
    }
    let heads = [
        CheckpointDraft::default().head("planner", theirs),
        CheckpointDraft::default().head("critic", mine[0]),
        CheckpointDraft::default().head("planner", AtomId::from_raw(10_000)),
        CheckpointDraft::default().head(CHECKPOINT_AGENT, mine[0]),
    ];
    for draft in heads {
        let refused = store.write_checkpoint(run, draft);
        assert!(matches!(refused, Err(Error::InvalidArgument { .. })), "{refused:?}");
    }
    store.rollback(run, "planner", mine[0], "again").expect("rollback");
    let abandoned = store.write_checkpoint(run, CheckpointDraft::default().head("planner", mine[2]));
    assert!(matches!(abandoned, Err(Error::InvalidArgument { .. })), "{abandoned:?}");
    let control = store.rollback(run, CHECKPOINT_AGENT, mine[0], "undo a checkpoint");
    assert!(matches!(control, Err(Error::InvalidArgument { .. })), "{control:?}");

    assert_eq!(store.log().next_lsn().get(), records.get() + 1, "only the rollback was written");
    assert!(store.checkpoints(run, 10).expect("list").is_empty());
    assert_eq!(store.write_checkpoint(run, CheckpointDraft::default().head("planner", mine[0])).expect("valid"), 1);
    // By default each agent's newest completed atom on its current branch is its head.
    let critic = steps(&store, run, "critic", Some(mine[0]), 2, 3);
    let running = store.begin_atom(run, "critic", "thinking", &[critic[1]], "").expect("begin");
    store.write_checkpoint(run, CheckpointDraft::default()).expect("default heads");
    let heads = store.load_latest_checkpoint(run).expect("load").expect("checkpoint").agent_heads;
    assert_eq!(heads, BTreeMap::from([("critic".to_owned(), critic[1]), ("planner".to_owned(), mine[0])]));
    assert_ne!(heads["critic"], running);
}

/// The heads a checkpoint names, rebuilt now, by agent.
fn rebuilt_heads(store: &Store, run: RunId) -> BTreeMap<String, continuum::Context> {
    let checkpoint = store.load_latest_checkpoint(run).expect("load").expect("a checkpoint");
    let rebuilt = checkpoint.agent_heads.iter().map(|(agent, head)| {
        let context = store.rebuild_context(*head).unwrap_or_else(|e| panic!("head {head:?} of {agent}: {e}"));
        (agent.clone(), context.context)
    });
    rebuilt.collect()
}

#[test]
fn the_heads_of_the_newest_checkpoint_survive_rollbacks_compaction_and_reopens() {
    let sim = SimStorage::new(2);
    let store = open(&sim);
    let run = store.create_run(RunSpec::new("long")).expect("run");
    let planner = steps(&store, run, "planner", None, 40, 1);
    let critic = steps(&store, run, "critic", None, 40, 2);
    store.write_checkpoint(run, CheckpointDraft::at("planner", "step-40")).expect("checkpoint");
    let expected = rebuilt_heads(&store, run);
    assert_eq!(expected.len(), 2);

    // The planner moves on; the critic rolls back below every snapshot and takes another branch.
    let more = steps(&store, run, "planner", planner.last().copied(), 120, 3);
    store.rollback(run, "critic", critic[5], "retry the review").expect("rollback");
    steps(&store, run, "critic", Some(critic[5]), 60, 4);
    let reclaimed: u64 = (0..3).map(|_| store.compact().expect("compact").deltas_reclaimed).sum();
    assert!(reclaimed > 50, "compaction reclaimed {reclaimed} deltas");
    assert!(
        matches!(store.rebuild_context(planner[20]), Err(Error::HistoryReclaimed { .. })),
        "compaction reclaimed what no checkpoint names"
    );
    assert_eq!(rebuilt_heads(&store, run), expected);
    drop(store);

    let store = open(&sim);
    store.compact().expect("compact after reopen");
    assert_eq!(rebuilt_heads(&store, run), expected);

    // A newer checkpoint names the new heads; the old ones may go.
    store.write_checkpoint(run, CheckpointDraft::at("planner", "step-160")).expect("checkpoint");
    let newer = rebuilt_heads(&store, run);
    store.compact().expect("compact");
    drop(store);
    let store = open(&sim);
    assert_eq!(rebuilt_heads(&store, run), newer);
    assert_eq!(
        store.load_latest_checkpoint(run).expect("load").expect("c").agent_heads["planner"],
        *more.last().expect("atoms")
    );
    // The abandoned critic head only the old checkpoint named is released now.
    store.compact().expect("compact");
    let released = store.rebuild_context(critic[39]);
    assert!(matches!(released, Err(Error::HistoryReclaimed { .. })), "{:?}", released.map(|r| r.atoms_applied));
}

#[test]
fn checkpoints_take_no_policy_snapshots() {
    let sim = SimStorage::new(3);
    let store = open(&sim);
    let run = store.create_run(RunSpec::new("snapshots")).expect("run");
    for _ in 0..25 {
        store.write_checkpoint(run, CheckpointDraft::default()).expect("checkpoint");
    }
    assert_eq!(store.metrics().snapshot_writes, 0, "a control agent's empty context is never snapshotted");
    steps(&store, run, "planner", None, 10, 1);
    assert_eq!(store.metrics().snapshot_writes, 1, "the caller's agents keep their policy");
}

#[test]
fn a_draft_following_a_checkpoint_keeps_its_position_and_takes_fresh_heads() {
    let dir = tempfile::tempdir().expect("dir");
    let store = Store::open(dir.path()).expect("open");
    let run = store.create_run(RunSpec::new("trip").pipeline("travel", "1")).expect("run");
    let first = steps(&store, run, "planner", None, 2, 1);
    let draft = CheckpointDraft::at("planner", "step-3").shared("plan", b"fly".to_vec()).pipeline_version("2");
    store.write_checkpoint(run, draft.env("host", "a").resume_hint("book next")).expect("checkpoint");
    let previous = store.load_latest_checkpoint(run).expect("load").expect("checkpoint");
    assert_eq!(previous.agent_heads["planner"], first[1]);
    let later = steps(&store, run, "planner", Some(first[1]), 3, 2);
    store.write_checkpoint(run, CheckpointDraft::following(&previous).resume_hint("stopped")).expect("following");
    let next = store.load_latest_checkpoint(run).expect("load").expect("checkpoint");
    assert_eq!(next.sequence, 2);
    assert_eq!((next.position.as_str(), next.pipeline_version.as_str()), ("step-3", "2"));
    assert_eq!((next.shared_context, next.environment), (previous.shared_context, previous.environment));
    assert_eq!((next.agent_heads["planner"], next.resume_hint.as_str()), (later[2], "stopped"));
}
