//! Store-level crash tests on the simulator: an agent runs a fixed plan of atoms through
//! `execute`, with a guarded side effect in every third atom; the process is crashed after
//! every single I/O call of the run (with several kinds of damage), then the agent is resumed
//! until the plan completes. Checks invariant 8: every atom acknowledged complete before a
//! crash is still complete and its closure never runs again, and every guarded effect happens
//! exactly once in the outside world (an in-doubt effect is settled through its key, as an
//! agent would with an API that accepts idempotency keys).

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

fn open(sim: &SimStorage) -> continuum::Result<Store> {
    Store::builder(Path::new("/store")).storage(Arc::new(sim.clone())).segment_bytes(8 * 1024).open()
}

/// Runs the agent's plan from wherever the store says it stands; stops at the first error.
fn run_agent(store: &Store, world: &RefCell<World>) -> continuum::Result<()> {
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
    let perform = |key: &str| {
        *world.borrow_mut().effects.entry(key.to_owned()).or_default() += 1;
        format!("booked:{key}").into_bytes()
    };
    match store.guarded(atom, "book", perform) {
        Ok(_) => Ok(()),
        Err(Error::GuardInDoubt { key }) => {
            // Ask the outside world whether the effect happened, as with a real idempotent API.
            let happened = world.borrow().effects.contains_key(&key);
            let result = if happened { format!("booked:{key}").into_bytes() } else { perform(&key) };
            store.resolve_guard(&key, &result).map_err(failure)
        }
        Err(error) => Err(failure(error)),
    }
}

fn total_ops() -> u64 {
    let sim = SimStorage::new(0);
    let store = open(&sim).expect("open");
    let before = sim.op_count();
    run_agent(&store, &RefCell::new(World::default())).expect("clean run");
    sim.op_count() - before
}

#[test]
fn no_completed_atom_reruns_and_every_effect_happens_once_across_crashes() {
    let total = total_ops();
    let mut states = 0;
    for crash_at in 0..=total {
        for damage in [CrashDamage::ALL[0], CrashDamage::ALL[4], CrashDamage::ALL[8]] {
            let world = RefCell::new(World::default());
            let sim = SimStorage::new(crash_at);
            let store = open(&sim).expect("open");
            sim.halt_after(crash_at);
            let _ = run_agent(&store, &world);
            drop(store);
            sim.crash(damage);
            let acknowledged_before = world.borrow().acknowledged.clone();
            let store = open(&sim).unwrap_or_else(|e| panic!("crash at {crash_at} ({damage:?}): reopen: {e}"));
            run_agent(&store, &world).unwrap_or_else(|e| panic!("crash at {crash_at} ({damage:?}): resume: {e}"));
            let world = world.borrow();
            for key in &acknowledged_before {
                assert_eq!(
                    world.runs[key], 1,
                    "crash at {crash_at} ({damage:?}): {key} ran again after it was acknowledged"
                );
            }
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
    eprintln!("store crash points: {total} I/O calls × 3 damage kinds = {states} crash states checked");
}
