//! Store-level crash tests on the simulator: an agent runs a fixed plan of atoms through
//! `execute`, with a guarded side effect in every third atom; the process is crashed after
//! every single I/O call of the run (with several kinds of damage), then the agent is resumed
//! until the plan completes. Checks invariant 8: every atom acknowledged complete before a
//! crash is still complete and its closure never runs again, and every guarded effect happens
//! exactly once in the outside world (an in-doubt effect is settled through its key, as an
//! agent would with an API that accepts idempotency keys). The second test does the same with
//! index snapshots written along the way (explicitly after every fourth atom, and by the
//! store at open and close after 4 records), so crashes also land inside index snapshot writes and
//! reopens start from index snapshots.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use continuum::storage::sim::{CrashDamage, SimStorage};
use continuum::synthetic::Transcript;
use continuum::{AtomOutput, Error, RunSpec, Store};

const STEPS: u64 = 12;

/// The outside world: what happened, which survives any crash of the agent.
#[derive(Default)]
struct World {
    /// Closure runs per atom key.
    runs: BTreeMap<String, u32>,
    /// Effects performed per idempotency key.
    effects: BTreeMap<String, u32>,
    /// Atoms whose execute() returned Ok.
    acknowledged: BTreeSet<String>,
}

/// Index snapshots: none but the default ones (never reached here), or often.
#[derive(Clone, Copy, Debug, PartialEq)]
enum IndexSnapshots {
    Default,
    Often,
}

fn open(sim: &SimStorage, index_snapshots: IndexSnapshots) -> continuum::Result<Store> {
    let builder = Store::builder(Path::new("/store")).storage(Arc::new(sim.clone())).segment_bytes(8 * 1024);
    match index_snapshots {
        IndexSnapshots::Default => builder.open(),
        IndexSnapshots::Often => builder.index_snapshot_after(4).open(),
    }
}

/// Runs the agent's plan from wherever the store says it stands; stops at the first error.
fn run_agent(store: &Store, world: &RefCell<World>, index_snapshots: IndexSnapshots) -> continuum::Result<()> {
    let run = store.create_run(RunSpec::new("trip-planner"))?;
    let mut parents = Vec::new();
    for step in 0..STEPS {
        let key = format!("step-{step}");
        let executed = store.execute(run, "planner", &key, &parents, |atom| {
            *world.borrow_mut().runs.entry(key.clone()).or_default() += 1;
            if step % 3 == 0 {
                guarded_effect(store, world, atom)?;
            }
            Ok(AtomOutput { delta: Transcript::new(step).next_delta(300), result: key.clone().into_bytes() })
        })?;
        assert_eq!(executed.output.result, key.as_bytes(), "the recorded output is this step's");
        world.borrow_mut().acknowledged.insert(key);
        parents = vec![executed.atom];
        if index_snapshots == IndexSnapshots::Often && step % 4 == 3 {
            store.write_index_snapshot()?;
        }
    }
    Ok(())
}

/// Books something through an API that accepts idempotency keys.
fn guarded_effect(
    store: &Store,
    world: &RefCell<World>,
    atom: continuum::AtomId,
) -> Result<(), continuum::AtomFailure> {
    let failure = |error: Error| continuum::AtomFailure { message: error.to_string(), retryable: true };
    let perform = |key: &str| -> Result<Vec<u8>, continuum::AtomFailure> {
        *world.borrow_mut().effects.entry(key.to_owned()).or_default() += 1;
        Ok(format!("booked:{key}").into_bytes())
    };
    match store.guarded(atom, "book", perform) {
        Ok(_) => Ok(()),
        Err(Error::GuardInDoubt { key }) => {
            // Ask the outside world whether the effect happened, as with a real idempotent API.
            let happened = world.borrow().effects.contains_key(&key);
            let result =
                if happened { format!("booked:{key}").into_bytes() } else { perform(&key).unwrap_or_default() };
            store.resolve_guard(&key, &result).map_err(failure)
        }
        Err(error) => Err(failure(error)),
    }
}

fn total_ops(index_snapshots: IndexSnapshots) -> u64 {
    let sim = SimStorage::new(0);
    let store = open(&sim, index_snapshots).expect("open");
    let before = sim.op_count();
    run_agent(&store, &RefCell::new(World::default()), index_snapshots).expect("clean run");
    drop(store);
    sim.op_count() - before
}

#[test]
fn no_completed_atom_reruns_and_every_effect_happens_once_across_crashes() {
    let (states, _) = crash_everywhere(IndexSnapshots::Default);
    eprintln!("store crash points: {states} crash states checked");
}

#[test]
fn index_snapshots_change_nothing_across_crashes() {
    let (states, from_index_snapshot) = crash_everywhere(IndexSnapshots::Often);
    assert!(
        from_index_snapshot > states / 4,
        "only {from_index_snapshot} of {states} reopens started from an index snapshot"
    );
    eprintln!(
        "store crash points with index snapshots: {states} crash states, {from_index_snapshot} reopened from one"
    );
}

/// Checks that no step acknowledged before the crash ran again after it.
fn assert_none_reran(world: &World, acknowledged_before: &BTreeSet<String>, context: &str) {
    for key in acknowledged_before {
        assert_eq!(world.runs[key], 1, "{context}: {key} ran again after it was acknowledged");
    }
}

/// Runs `work` on a fresh simulated store that halts after `crash_at` I/O calls, crashes it
/// with `damage`, and returns the store reopened from what survived.
fn crashed(crash_at: u64, damage: CrashDamage, index_snapshots: IndexSnapshots, work: impl FnOnce(&Store)) -> Store {
    let sim = SimStorage::new(crash_at);
    let store = open(&sim, index_snapshots).expect("open");
    sim.halt_after(crash_at);
    work(&store);
    drop(store);
    sim.crash(damage);
    open(&sim, index_snapshots).unwrap_or_else(|e| panic!("crash at {crash_at} ({damage:?}): reopen: {e}"))
}

/// A checkpointer's agent: runs each step, then records it finished with `record_atom`
/// (start and completion in one batch). On resume, a step the store holds is never run again.
fn run_index_snapshoted_agent(store: &Store, world: &RefCell<World>) -> continuum::Result<()> {
    let run = store.create_run(RunSpec::new("covered by an index snapshot"))?;
    let mut parents = Vec::new();
    for step in 0..STEPS {
        let key = format!("step-{step}");
        if let Some(atom) = store.atom_by_key(run, "worker", &key)? {
            let found = store.atom(atom)?;
            assert_eq!(found.status, continuum::AtomStatus::Completed, "{key}: a recorded atom is complete");
            assert_eq!(found.output.map(|o| o.result), Some(key.clone().into_bytes()));
            parents = vec![atom];
            continue;
        }
        *world.borrow_mut().runs.entry(key.clone()).or_default() += 1;
        let output = AtomOutput { delta: Transcript::new(step).next_delta(300), result: key.clone().into_bytes() };
        let atom = store.record_atom(run, "worker", &key, &parents, "", &output)?;
        world.borrow_mut().acknowledged.insert(key);
        parents = vec![atom];
    }
    Ok(())
}

#[test]
fn a_recorded_atom_is_all_or_nothing_across_crashes() {
    let sim = SimStorage::new(0);
    let store = open(&sim, IndexSnapshots::Default).expect("open");
    let before = sim.op_count();
    run_index_snapshoted_agent(&store, &RefCell::new(World::default())).expect("clean run");
    drop(store);
    let total = sim.op_count() - before;
    let mut states = 0;
    for crash_at in 0..=total {
        for damage in [CrashDamage::ALL[0], CrashDamage::ALL[4], CrashDamage::ALL[8]] {
            let world = RefCell::new(World::default());
            let store = crashed(crash_at, damage, IndexSnapshots::Default, |store| {
                let _ = run_index_snapshoted_agent(store, &world);
            });
            let acknowledged_before = world.borrow().acknowledged.clone();
            if let Some(run) = store.run_id("covered by an index snapshot") {
                // A start without its completion would be a torn batch.
                assert!(store.incomplete_atoms(run).is_empty(), "crash at {crash_at} ({damage:?}): a half atom");
            }
            run_index_snapshoted_agent(&store, &world)
                .unwrap_or_else(|e| panic!("crash at {crash_at} ({damage:?}): resume: {e}"));
            let world = world.borrow();
            assert_none_reran(&world, &acknowledged_before, &format!("crash at {crash_at} ({damage:?})"));
            let run = store.run_id("covered by an index snapshot").expect("run");
            assert_eq!(store.run_atoms(run).len() as u64, STEPS);
            assert!(store.incomplete_atoms(run).is_empty());
            states += 1;
        }
    }
    eprintln!("record_atom crash points: {states} crash states checked");
}

/// Crashes the agent's run after every I/O call (the store's drop included) with three kinds
/// of damage, resumes it, and checks invariant 8; returns the crash states checked and how
/// many of the reopens started from an index snapshot.
fn crash_everywhere(index_snapshots: IndexSnapshots) -> (u64, u64) {
    let total = total_ops(index_snapshots);
    let (mut states, mut from_index_snapshot) = (0, 0);
    for crash_at in 0..=total {
        for damage in [CrashDamage::ALL[0], CrashDamage::ALL[4], CrashDamage::ALL[8]] {
            let world = RefCell::new(World::default());
            let store = crashed(crash_at, damage, index_snapshots, |store| {
                let _ = run_agent(store, &world, index_snapshots);
            });
            let acknowledged_before = world.borrow().acknowledged.clone();
            from_index_snapshot += u64::from(store.index_snapshot().opened_from.is_some());
            run_agent(&store, &world, index_snapshots)
                .unwrap_or_else(|e| panic!("crash at {crash_at} ({damage:?}): resume: {e}"));
            let world = world.borrow();
            assert_none_reran(&world, &acknowledged_before, &format!("crash at {crash_at} ({damage:?})"));
            for (key, count) in &world.effects {
                assert_eq!(*count, 1, "crash at {crash_at} ({damage:?}): effect {key} happened {count} times");
            }
            assert_eq!(world.effects.len() as u64, STEPS.div_ceil(3), "every effect happened");
            let run = store.run_id("trip-planner").expect("run");
            assert!(store.incomplete_atoms(run).is_empty());
            assert_eq!(store.run_atoms(run).len() as u64, STEPS);
            states += 1;
        }
    }
    (states, from_index_snapshot)
}
