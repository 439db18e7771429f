//! Idempotency guards against a model, over random sequences of what agents and retention do:
//! guarded effects in steps of several runs and agents (names holding the key's separators),
//! effects that die midway and are resolved, rollbacks and re-runs of steps, runs finished and
//! dropped by retention and their names reused, reopens, power losses, and processes that die
//! in the middle of an action (after a chosen number of storage calls), then lose power; and
//! effects that fail, retryably (the key stays free: the next call runs the effect again) or
//! for good (the failure is the key's outcome, returned by every later call).
//!
//! The model: an effect is identified by (run, agent, step key, operation), where the run is
//! the run *instance* (a new run under a dropped run's name is another one). The first
//! `guarded` call of an identity runs the effect; every later one returns its recorded result
//! (or recorded failure) without running it, a retryable failure records nothing, or, while an effect that died midway is unresolved, `GuardInDoubt`,
//! which `resolve_guard` settles once. A step re-run after a rollback keeps its identity.
//! After a process died during a `guarded` call, the effect is recorded, in doubt, or unknown
//! to the store; but never unknown if its closure ran (it would run again), and recorded if
//! the call returned its result.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use continuum::storage::sim::{CrashDamage, SimStorage};
use continuum::{AtomFailure, AtomOutput, Error, RetentionPolicy, RunId, RunSpec, SnapshotPolicy, Store};
use proptest::collection::vec;
use proptest::prelude::*;

const RUNS: [&str; 3] = ["r", "r#1", "r/x"];
const AGENTS: [&str; 3] = ["a", "a/b", "b"];
const STEPS: [&str; 3] = ["c", "b/c", "%2F"];
const OPERATIONS: [&str; 2] = ["pay", "p/ay"];

#[derive(Clone, Debug)]
enum Action {
    /// A guarded effect in a step; `dies` makes the effect panic midway; `fails` makes it
    /// report a failure (`Some(retryable)`).
    Guarded { run: usize, agent: usize, step: usize, operation: usize, dies: bool, fails: Option<bool> },
    /// The agent rolls back to its first step of the run (its later steps are re-run anew).
    Rollback { run: usize, agent: usize },
    /// The run finishes and retention drops it; its name is free for a new run.
    Drop { run: usize },
    /// The store is closed and opened again.
    Reopen,
    /// A power loss with this kind of damage, and an open.
    Crash { damage: usize },
    /// The process dies after `after` more storage calls while it does `action` (the calls
    /// after that fail), then a power loss with this kind of damage, and an open.
    Interrupted { action: Box<Action>, after: u64, damage: usize },
}

/// What agents and retention do; `dying`: effects may die midway.
fn work(dying: f64) -> impl Strategy<Value = Action> {
    prop_oneof![
        8 => (
            (0..RUNS.len(), 0..AGENTS.len(), 0..STEPS.len(), 0..OPERATIONS.len()),
            prop::bool::weighted(dying),
            prop_oneof![6 => Just(None), 2 => Just(Some(true)), 1 => Just(Some(false))],
        )
            .prop_map(|((run, agent, step, operation), dies, fails)| Action::Guarded {
                run,
                agent,
                step,
                operation,
                dies,
                fails
            }),
        1 => (0..RUNS.len(), 0..AGENTS.len()).prop_map(|(run, agent)| Action::Rollback { run, agent }),
        1 => (0..RUNS.len()).prop_map(|run| Action::Drop { run }),
    ]
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        10 => work(0.15),
        1 => Just(Action::Reopen),
        1 => (0..CrashDamage::ALL.len()).prop_map(|damage| Action::Crash { damage }),
        // A `guarded` call makes a few storage calls (its two records' syncs); a drop's round,
        // many more.
        3 => (work(0.0), prop_oneof![3 => 0..6u64, 1 => 0..200u64], 0..CrashDamage::ALL.len())
            .prop_map(|(action, after, damage)| Action::Interrupted { action: Box::new(action), after, damage }),
    ]
}

/// Opens the store as a new process would: its calls stop reaching the disk at the next crash.
fn open(sim: &SimStorage) -> Store {
    Store::builder(Path::new("/guards"))
        .storage(Arc::new(sim.process()))
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
    /// It failed for good with this message.
    Failed(String),
}

#[derive(Default)]
struct Model {
    /// Effects by (run instance, agent, step, operation).
    effects: BTreeMap<(u64, usize, usize, usize), Outcome>,
    /// Times each effect's closure ran and succeeded.
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

/// What an effect returns: `result`, or a failure with `message` if `fails` says so.
fn outcome(fails: Option<bool>, result: &[u8], message: &str) -> Result<Vec<u8>, AtomFailure> {
    match fails {
        None => Ok(result.to_vec()),
        Some(retryable) => Err(AtomFailure { message: message.to_owned(), retryable }),
    }
}

/// Applies `action` (all but [`Action::Reopen`]) to the store and the model, checking the
/// store's answers against the model's.
fn apply(store: &Store, model: &mut Model, action: &Action) {
    match *action {
        Action::Guarded { run, agent, step, operation, dies, fails } => {
            let run_id = store.create_run(RunSpec::new(RUNS[run])).expect("run");
            let Some(atom) = step_atom(store, run_id, AGENTS[agent], STEPS[step]) else { return };
            let identity = (run_id.get(), agent, step, operation);
            let result = format!("effect {}", model.made).into_bytes();
            let failure = format!("failure {}", model.made);
            let mut ran = false;
            let called = std::panic::catch_unwind(AssertUnwindSafe(|| {
                store.guarded(atom, OPERATIONS[operation], |_| {
                    ran = true;
                    assert!(!dies, "the process died during the effect");
                    outcome(fails, &result, &failure)
                })
            }));
            if ran && fails.is_none() {
                *model.runs.entry(identity).or_default() += 1;
            }
            let expected = model.effects.get(&identity).cloned();
            match (called, expected) {
                (Err(_), None) => {
                    assert!(ran && dies, "only a dying effect panics");
                    model.effects.insert(identity, Outcome::InDoubt);
                }
                (Ok(Ok(got)), None) => {
                    assert!(ran && fails.is_none(), "a new effect runs, and only a success is a result");
                    assert_eq!(got, result);
                    model.made += 1;
                    model.effects.insert(identity, Outcome::Recorded(got));
                }
                (Ok(Err(Error::GuardFailed { message, retryable, .. })), None) => {
                    assert!(ran && fails == Some(retryable), "{identity:?}: a failure the effect did not report");
                    assert_eq!(message, failure);
                    model.made += 1;
                    if !retryable {
                        model.effects.insert(identity, Outcome::Failed(message));
                    }
                }
                (Ok(Ok(got)), Some(Outcome::Recorded(want))) => {
                    assert!(!ran, "{identity:?}: a recorded effect runs again");
                    assert_eq!(got, want, "{identity:?}: the recorded result");
                }
                (Ok(Err(Error::GuardFailed { message, retryable: false, .. })), Some(Outcome::Failed(want))) => {
                    assert!(!ran, "{identity:?}: an effect that failed for good runs again");
                    assert_eq!(message, want, "{identity:?}: the recorded failure");
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
        Action::Reopen | Action::Crash { .. } | Action::Interrupted { .. } => unreachable!("the caller reopens"),
    }
}

/// What an interrupted `guarded` call did before the process died.
struct Attempt {
    run: usize,
    agent: usize,
    step: usize,
    operation: usize,
    /// The result the effect would have returned.
    result: Vec<u8>,
    /// Whether the effect reported a failure (`Some(retryable)`) instead.
    fails: Option<bool>,
    /// Its closure ran.
    ran: bool,
    /// The call returned the result.
    acked: bool,
}

/// Does `action` on a store whose process dies partway: every call may fail. A `guarded` call
/// is returned for [`reconcile`]; the other actions need nothing reconciled (a rollback or a
/// drop the crash undid is redone or not as the model does not track them).
fn attempt(store: &Store, model: &mut Model, action: &Action) -> Option<Attempt> {
    match *action {
        Action::Guarded { run, agent, step, operation, fails, .. } => {
            let result = format!("effect {}", model.made).into_bytes();
            let failure = format!("failure {}", model.made);
            model.made += 1;
            let mut attempt = Attempt { run, agent, step, operation, result, fails, ran: false, acked: false };
            let Ok(run_id) = store.create_run(RunSpec::new(RUNS[run])) else { return Some(attempt) };
            let atom = match store.atom_by_key(run_id, AGENTS[agent], STEPS[step]) {
                Ok(Some(atom)) => atom,
                Ok(None) => {
                    let parents: Vec<_> = store.last_agent_atom(run_id, AGENTS[agent]).into_iter().collect();
                    match store.begin_atom(run_id, AGENTS[agent], STEPS[step], &parents, "") {
                        Ok(atom) => atom,
                        Err(_) => return Some(attempt),
                    }
                }
                Err(_) => return Some(attempt),
            };
            let mut ran = false;
            let called = store.guarded(atom, OPERATIONS[operation], |_| {
                ran = true;
                outcome(fails, &attempt.result, &failure)
            });
            attempt.ran = ran;
            attempt.acked = called.is_ok_and(|got| got == attempt.result);
            if ran && fails.is_none() {
                *model.runs.entry((run_id.get(), agent, step, operation)).or_default() += 1;
            }
            Some(attempt)
        }
        Action::Rollback { run, agent } => {
            let run_id = store.run_id(RUNS[run])?;
            let first = store
                .agent_atoms(run_id, AGENTS[agent])
                .into_iter()
                .find(|atom| store.atom(*atom).is_ok_and(|found| !found.abandoned));
            if let Some(first) = first {
                let _ = store.rollback(run_id, AGENTS[agent], first, "model");
            }
            None
        }
        Action::Drop { run } => {
            let run_id = store.run_id(RUNS[run])?;
            for atom in store.incomplete_atoms(run_id) {
                let _ = store.complete_atom(atom, &AtomOutput::default());
            }
            let _ = store.finish_run(run_id, true, "");
            std::thread::sleep(Duration::from_micros(2));
            let _ = store.compact();
            None
        }
        Action::Reopen | Action::Crash { .. } | Action::Interrupted { .. } => unreachable!("not interrupted"),
    }
}

/// After the crash and an open: a run left finished but not dropped is dropped (the operator
/// redoes the drop), and an interrupted `guarded` call's effect is found recorded (with its
/// result if the call returned it), in doubt, or unknown (only if its closure never ran), by
/// calling `guarded` again, as the agent would.
fn reconcile(store: &Store, model: &mut Model, attempt: Option<Attempt>) {
    for name in RUNS {
        if let Some(run_id) = store.run_id(name)
            && store.run_status(run_id).expect("status") != continuum::RunStatus::Running
        {
            std::thread::sleep(Duration::from_micros(2));
            assert_eq!(store.compact().expect("compact").runs_dropped, 1, "the finished run {name} is dropped");
        }
    }
    let Some(Attempt { run, agent, step, operation, result, fails, ran, acked }) = attempt else { return };
    let what = format!(
        "{}/{}/{}/{} (ran: {ran}, acked: {acked})",
        RUNS[run], AGENTS[agent], STEPS[step], OPERATIONS[operation]
    );
    let Some(run_id) = store.run_id(RUNS[run]) else {
        assert!(!ran, "{what}: the effect ran and its run is gone");
        return;
    };
    let Some(atom) = store.atom_by_key(run_id, AGENTS[agent], STEPS[step]).expect("lookup") else {
        assert!(!ran, "{what}: the effect ran and its step is gone");
        return;
    };
    let identity = (run_id.get(), agent, step, operation);
    let again = format!("effect {}", model.made).into_bytes();
    model.made += 1;
    let mut ran_again = false;
    let called = store.guarded(atom, OPERATIONS[operation], |_| {
        ran_again = true;
        Ok(again.clone())
    });
    match (called, model.effects.get(&identity).cloned()) {
        (Ok(got), Some(Outcome::Recorded(want))) => {
            assert!(!ran_again && got == want, "{what}: a recorded effect changed or ran again");
        }
        (Err(Error::GuardInDoubt { .. }), Some(Outcome::InDoubt)) => {}
        (Err(Error::GuardFailed { message, retryable: false, .. }), Some(Outcome::Failed(want))) => {
            assert!(!ran_again && message == want, "{what}: a recorded failure changed or ran again");
        }
        (Ok(got), None) if !ran_again => {
            assert!(ran && fails.is_none() && got == result, "{what}: recorded {got:?} without running");
            model.effects.insert(identity, Outcome::Recorded(got));
        }
        (Err(Error::GuardFailed { message, retryable: false, .. }), None) => {
            assert!(ran && fails == Some(false) && !ran_again, "{what}: a failure recorded that did not happen");
            model.effects.insert(identity, Outcome::Failed(message));
        }
        (Ok(got), None) => {
            // The store knew nothing of the effect: so its closure must never have run, or
            // ran and reported a failure (which leaves the key free).
            assert!((!ran || fails.is_some()) && !acked, "{what}: the effect ran, and the store let it run again");
            *model.runs.entry(identity).or_default() += 1;
            model.effects.insert(identity, Outcome::Recorded(got));
        }
        (Err(Error::GuardInDoubt { .. }), None) => {
            assert!(!acked, "{what}: the call returned its result, and the effect is in doubt");
            model.effects.insert(identity, Outcome::InDoubt);
        }
        (called, expected) => panic!("{what}: the store gave {called:?}, the model expects {expected:?}"),
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
            match action {
                Action::Reopen => {
                    drop(store);
                    store = open(&sim);
                }
                Action::Crash { damage } => {
                    // Every call above was acknowledged durably: the model does not change.
                    sim.crash(CrashDamage::ALL[*damage]);
                    drop(store);
                    store = open(&sim);
                }
                Action::Interrupted { action, after, damage } => {
                    sim.halt_after(*after);
                    let attempt = attempt(&store, &mut model, action);
                    sim.crash(CrashDamage::ALL[*damage]);
                    drop(store);
                    store = open(&sim);
                    reconcile(&store, &mut model, attempt);
                }
                _ => apply(&store, &mut model, action),
            }
        }
        for (identity, runs) in &model.runs {
            prop_assert_eq!(*runs, 1, "{:?} ran {} times", identity, runs);
        }
    }
}
