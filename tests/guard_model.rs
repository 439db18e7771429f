//! Idempotency guards against a model, over random sequences of what agents and retention do:
//! guarded effects in steps of several runs and agents (names holding the key's separators),
//! effects that die midway and are resolved, rollbacks and re-runs of steps, runs finished and
//! dropped by retention and their names reused, and reopens.
//!
//! The model: an effect is identified by (run, agent, step key, operation), where the run is
//! the run *instance* (a new run under a dropped run's name is another one). The first
//! `guarded` call of an identity runs the effect; every later one returns its recorded result
//! without running it, or, while an effect that died midway is unresolved, `GuardInDoubt`,
//! which `resolve_guard` settles once. A step re-run after a rollback keeps its identity.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use continuum::storage::sim::SimStorage;
use continuum::{AtomOutput, Error, RetentionPolicy, RunId, RunSpec, SnapshotPolicy, Store};
use proptest::collection::vec;
use proptest::prelude::*;

const RUNS: [&str; 3] = ["r", "r#1", "r/x"];
const AGENTS: [&str; 3] = ["a", "a/b", "b"];
const STEPS: [&str; 3] = ["c", "b/c", "%2F"];
const OPERATIONS: [&str; 2] = ["pay", "p/ay"];

#[derive(Clone, Debug)]
enum Action {
    /// A guarded effect in a step; `dies` makes the effect panic midway.
    Guarded { run: usize, agent: usize, step: usize, operation: usize, dies: bool },
    /// The agent rolls back to its first step of the run (its later steps are re-run anew).
    Rollback { run: usize, agent: usize },
    /// The run finishes and retention drops it; its name is free for a new run.
    Drop { run: usize },
    /// The store is closed and opened again.
    Reopen,
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        8 => (0..RUNS.len(), 0..AGENTS.len(), 0..STEPS.len(), 0..OPERATIONS.len(), prop::bool::weighted(0.15))
            .prop_map(|(run, agent, step, operation, dies)| Action::Guarded { run, agent, step, operation, dies }),
        1 => (0..RUNS.len(), 0..AGENTS.len()).prop_map(|(run, agent)| Action::Rollback { run, agent }),
        1 => (0..RUNS.len()).prop_map(|run| Action::Drop { run }),
        1 => Just(Action::Reopen),
    ]
}

fn open(sim: &SimStorage) -> Store {
    Store::builder(Path::new("/guards"))
        .storage(Arc::new(sim.clone()))
        .segment_bytes(64 * 1024)
        .snapshot_policy(SnapshotPolicy::NEVER)
        .retention(RetentionPolicy { snapshots_per_agent: 1, finished_run_age: Some(Duration::ZERO) })
        .background(false)
        .open()
        .expect("open")
}

/// What the model knows of one effect.
#[derive(Clone, Debug, PartialEq)]
enum Outcome {
    Recorded(Vec<u8>),
    InDoubt,
}

#[derive(Default)]
struct Model {
    /// Effects by (run instance, agent, step, operation).
    effects: BTreeMap<(u64, usize, usize, usize), Outcome>,
    /// Times each effect's closure ran.
    runs: BTreeMap<(u64, usize, usize, usize), u32>,
    /// Results handed out so far (each effect returns a new one).
    made: u32,
}

/// The step's atom: the one not abandoned, begun if there is none (and the run takes atoms).
fn step_atom(store: &Store, run: RunId, agent: &str, step: &str) -> Option<continuum::AtomId> {
    if let Some(atom) = store.atom_by_key(run, agent, step).expect("lookup") {
        return Some(atom);
    }
    let parent = store.last_agent_atom(run, agent);
    let parents: Vec<_> = parent.into_iter().collect();
    let atom = store.begin_atom(run, agent, step, &parents, "").expect("begin");
    Some(atom)
}

/// Applies `action` (all but [`Action::Reopen`]) to the store and the model, checking the
/// store's answers against the model's.
fn apply(store: &Store, model: &mut Model, action: &Action) {
    match *action {
        Action::Guarded { run, agent, step, operation, dies } => {
            let run_id = store.create_run(RunSpec::new(RUNS[run])).expect("run");
            let Some(atom) = step_atom(store, run_id, AGENTS[agent], STEPS[step]) else { return };
            let identity = (run_id.get(), agent, step, operation);
            let result = format!("effect {}", model.made).into_bytes();
            let mut ran = false;
            let called = std::panic::catch_unwind(AssertUnwindSafe(|| {
                store.guarded(atom, OPERATIONS[operation], |_| {
                    ran = true;
                    assert!(!dies, "the process died during the effect");
                    result.clone()
                })
            }));
            if ran {
                *model.runs.entry(identity).or_default() += 1;
            }
            let expected = model.effects.get(&identity).cloned();
            match (called, expected) {
                (Err(_), None) => {
                    assert!(ran && dies, "only a dying effect panics");
                    model.effects.insert(identity, Outcome::InDoubt);
                }
                (Ok(Ok(got)), None) => {
                    assert!(ran, "a new effect runs");
                    assert_eq!(got, result);
                    model.made += 1;
                    model.effects.insert(identity, Outcome::Recorded(got));
                }
                (Ok(Ok(got)), Some(Outcome::Recorded(want))) => {
                    assert!(!ran, "{identity:?}: a recorded effect runs again");
                    assert_eq!(got, want, "{identity:?}: the recorded result");
                }
                (Ok(Err(Error::GuardInDoubt { key })), Some(Outcome::InDoubt)) => {
                    assert!(!ran);
                    let settled = format!("resolved {}", model.made).into_bytes();
                    model.made += 1;
                    store.resolve_guard(&key, &settled).expect("resolve");
                    assert!(matches!(store.resolve_guard(&key, b"again"), Err(Error::GuardNotInDoubt { .. })));
                    model.effects.insert(identity, Outcome::Recorded(settled));
                }
                (called, expected) => {
                    let called = called.map_err(|_| "panicked");
                    panic!("{identity:?}: the store gave {called:?}, the model expects {expected:?} (ran: {ran})")
                }
            }
        }
        Action::Rollback { run, agent } => {
            let Some(run_id) = store.run_id(RUNS[run]) else { return };
            let first = store.agent_atoms(run_id, AGENTS[agent]).into_iter().find(|atom| {
                let found = store.atom(*atom).expect("atom");
                !found.abandoned
            });
            if let Some(first) = first {
                store.rollback(run_id, AGENTS[agent], first, "model").expect("rollback");
            }
        }
        Action::Drop { run } => {
            let Some(run_id) = store.run_id(RUNS[run]) else { return };
            // Atoms still running finish first (a run is finished when its agents are).
            for atom in store.incomplete_atoms(run_id) {
                store.complete_atom(atom, &AtomOutput::default()).expect("complete");
            }
            store.finish_run(run_id, true, "").expect("finish");
            std::thread::sleep(Duration::from_micros(2));
            let report = store.compact().expect("compact");
            assert_eq!(report.runs_dropped, 1, "{report:?}");
        }
        Action::Reopen => unreachable!("the caller reopens"),
    }
}

/// Keeps the panics of effects that die on purpose out of the test's output.
fn silence_dying_effects() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let message = info.payload().downcast_ref::<&str>().copied().unwrap_or_default();
            if !message.contains("the process died during the effect") {
                default(info);
            }
        }));
    });
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn guards_follow_the_model(actions in vec(action(), 1..60)) {
        silence_dying_effects();
        let sim = SimStorage::new(5);
        let mut store = open(&sim);
        let mut model = Model::default();
        for action in &actions {
            if let Action::Reopen = action {
                drop(store);
                store = open(&sim);
            } else {
                apply(&store, &mut model, action);
            }
        }
        for (identity, runs) in &model.runs {
            prop_assert_eq!(*runs, 1, "{:?} ran {} times", identity, runs);
        }
    }
}
