//! Injected I/O failures under the agent protocol: `execute` (begin, run the step, complete or
//! fail) and an idempotency-guarded side effect inside each tool step. One `EIO` or `ENOSPC`
//! on the nth I/O call of the workload, for every call it makes; the agent goes on as a real
//! one would (a step that failed without poisoning the store is executed again under the
//! same key; a guard found in doubt is settled against the external system and resolved);
//! then the process "crashes" with one kind of damage, the store is reopened, and the agent
//! resumes by executing its whole plan again from the first step.
//!
//! What must hold, whatever failed and whatever the crash dropped:
//! - a step whose `execute` returned its output never runs again, not in the running store and
//!   not after the crash (its recorded output comes back, `replayed`);
//! - a guarded effect's closure runs at most once per idempotency key, and after the resume
//!   every tool step's effect has happened exactly once in the external system;
//! - after the resume every step is completed with the output its last run produced, and the
//!   report of `Store::resume` lists each acknowledged step as completed.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use continuum::storage::sim::{CrashDamage, Fault, FaultKind, SimStorage};
use continuum::synthetic::Transcript;
use continuum::{AtomFailure, AtomId, AtomOutput, AtomStatus, Error, RunId, RunSpec, SnapshotPolicy, Store};

/// Steps of the plan: the planner's and the tool's in turn.
const STEPS: usize = 16;
/// The step whose first run fails with a retryable error (`fail_atom`).
const FLAKY_STEP: usize = 5;
/// The simulated disk's seed, the same in every case.
const SEED: u64 = 3;

/// Opens the store on `sim`; with `background`, its thread writes the policy snapshots.
fn open(sim: &SimStorage, background: bool) -> continuum::Result<Store> {
    Store::builder(Path::new("/agent"))
        .storage(Arc::new(sim.clone()))
        .segment_bytes(16 * 1024)
        .snapshot_policy(SnapshotPolicy { every_atoms: 4, every: Duration::ZERO })
        .background(background)
        .open()
}

/// The agent of step `i`, and whether it is a tool step (with a guarded effect).
fn agent_of(i: usize) -> (&'static str, bool) {
    if i.is_multiple_of(2) { ("planner", false) } else { ("tool", true) }
}

/// The output of step `i`'s `run`th run (1-based): each run produces a different one, so that
/// a replayed output shows which run it came from.
fn output_of(i: usize, run: u32) -> AtomOutput {
    let mut transcript = Transcript::new(i as u64 + 1);
    AtomOutput { delta: transcript.next_delta(300), result: format!("step-{i} run {run}").into_bytes() }
}

/// What the agent and the outside world saw, across the crash.
#[derive(Default)]
struct World {
    /// Runs of each step's closure.
    runs: BTreeMap<usize, u32>,
    /// Runs of each guarded effect's closure, by idempotency key.
    effect_runs: BTreeMap<String, u32>,
    /// Effects the external system received, by idempotency key (the closure's, and those the
    /// agent sent itself while settling a guard in doubt).
    received: BTreeMap<String, u32>,
    /// Steps whose `execute` returned their output, with the atom and that output's run.
    acked: BTreeMap<usize, (AtomId, u32)>,
    /// Steps acknowledged before the crash, with their runs then.
    acked_before_crash: BTreeMap<usize, u32>,
    /// Errors the store returned, as text.
    errors: Vec<String>,
}

impl World {
    fn error(&mut self, what: String, error: &Error) {
        // A completion that failed hands the output back with the I/O error.
        let error = match error {
            Error::OutputNotRecorded { source, .. } => source.as_ref(),
            error => error,
        };
        let typed = matches!(error, Error::Io { .. } | Error::NoSpace { .. } | Error::Poisoned { .. });
        assert!(typed, "{what}: an injected I/O failure became {error:?}");
        self.errors.push(format!("{what}: {error}"));
    }
}

/// The tool step's side effect, guarded by its idempotency key; a guard in doubt is settled by
/// asking the external system whether the effect arrived (sending it if not) and resolved.
fn guarded_effect(store: &Store, world: &RefCell<World>, atom: AtomId) -> Result<(), AtomFailure> {
    let failure = |error: Error| AtomFailure { message: format!("the guarded effect: {error}"), retryable: true };
    match store.guarded(atom, "send", |key| {
        let mut world = world.borrow_mut();
        *world.effect_runs.entry(key.to_owned()).or_default() += 1;
        *world.received.entry(key.to_owned()).or_default() += 1;
        Ok(b"sent".to_vec())
    }) {
        Ok(result) => {
            assert_eq!(result, b"sent", "a guard returns its effect's recorded result");
            Ok(())
        }
        Err(Error::GuardInDoubt { key }) => {
            let arrived = world.borrow().received.get(&key).copied().unwrap_or(0) > 0;
            if !arrived {
                *world.borrow_mut().received.entry(key.clone()).or_default() += 1;
            }
            store.resolve_guard(&key, b"sent").map_err(failure)
        }
        Err(error) => Err(failure(error)),
    }
}

/// Executes step `i` until it succeeds, fails for good, or the store is poisoned. Returns
/// whether the agent may go on.
fn execute_step(store: &Store, run: RunId, world: &RefCell<World>, i: usize) -> bool {
    let (agent, tool) = agent_of(i);
    let key = format!("step-{i}");
    let parents: Vec<AtomId> = (0..i)
        .rev()
        .filter(|j| agent_of(*j).0 == agent)
        .find_map(|j| world.borrow().acked.get(&j).map(|(atom, _)| *atom))
        .into_iter()
        .collect();
    // Enough attempts for a failure in the step, one in its guard, and the flaky first run.
    for _ in 0..4 {
        let executed = store.execute(run, agent, &key, &parents, |atom| {
            let attempt = {
                let mut world = world.borrow_mut();
                let runs = world.runs.entry(i).or_default();
                *runs += 1;
                *runs
            };
            if tool {
                guarded_effect(store, world, atom)?;
            }
            if i == FLAKY_STEP && attempt == 1 {
                return Err(AtomFailure { message: "the model timed out".into(), retryable: true });
            }
            Ok(output_of(i, attempt))
        });
        match executed {
            Ok(executed) => {
                let run_no = world.borrow().runs.get(&i).copied().unwrap_or(0);
                let expected = if executed.replayed {
                    // The output of the run that was recorded, whichever it was.
                    (1..=run_no).find(|r| output_of(i, *r) == executed.output)
                } else {
                    Some(run_no)
                };
                let recorded = expected.unwrap_or_else(|| panic!("step {i}: an output no run of it produced"));
                assert_eq!(executed.output, output_of(i, recorded), "step {i}");
                world.borrow_mut().acked.insert(i, (executed.atom, recorded));
                return true;
            }
            Err(Error::AtomFailed { retryable: true, .. }) => {}
            Err(error @ Error::Poisoned { .. }) => {
                world.borrow_mut().error(format!("step {i}"), &error);
                return false;
            }
            Err(error) => world.borrow_mut().error(format!("step {i}"), &error),
        }
    }
    false
}

/// Executes the plan from its first step; stops where the agent cannot go on.
fn execute_plan(store: &Store, world: &RefCell<World>) {
    // After the crash this finds the run again, if its record survived.
    let run = match store.create_run(RunSpec::new("plan")) {
        Ok(run) => run,
        Err(error) => {
            world.borrow_mut().error("create the run".into(), &error);
            return;
        }
    };
    for i in 0..STEPS {
        if !execute_step(store, run, world, i) {
            return;
        }
    }
}

/// Fails the `nth` I/O call after the store's open with `kind`, crashes with `damage`, and
/// resumes; checks the module's claims. Returns whether a store call returned an error.
fn fail_nth(nth: u64, kind: FaultKind, damage: CrashDamage, background: bool) -> bool {
    let context = format!("{kind:?} on I/O call #{nth}, then {damage:?} (background thread: {background})");
    let sim = SimStorage::new(SEED);
    let world = RefCell::new(World::default());
    {
        let store = open(&sim, background).expect("open");
        sim.inject(Fault { op: None, nth, kind });
        execute_plan(&store, &world);
        // The agent's loop starts over from the first step in the same process: every step
        // acknowledged so far comes back replayed (a poisoned store still reads).
        let runs_then = acked_runs(&world.borrow());
        execute_plan(&store, &world);
        for (i, runs) in runs_then {
            assert_eq!(world.borrow().runs[&i], runs, "{context}: step {i} was acknowledged, yet it ran again");
        }
    }
    let surfaced = !world.borrow().errors.is_empty();
    {
        let mut world = world.borrow_mut();
        world.acked_before_crash = acked_runs(&world);
        world.acked.clear();
    }
    // The crash also disarms the fault, if it never fired.
    sim.crash(damage);
    let store = open(&sim, background).unwrap_or_else(|e| panic!("{context}: reopen: {e}"));
    match plan_run(&store) {
        Some(run) => {
            // Before the agent resumes, the report already lists every step acknowledged
            // before the crash as completed.
            let report = store.resume(run).unwrap_or_else(|e| panic!("{context}: resume report: {e}"));
            let completed = completed_keys(&store, &report);
            for i in world.borrow().acked_before_crash.keys() {
                assert!(completed.contains(&format!("step-{i}")), "{context}: acknowledged step {i} is completed");
            }
            assert!(report.agents.iter().all(|a| a.failed.is_empty()), "{context}: no step failed for good");
        }
        None => assert!(
            world.borrow().acked_before_crash.is_empty(),
            "{context}: acknowledged steps, yet the run is gone after the crash"
        ),
    }
    execute_plan(&store, &world);
    let world = world.into_inner();
    assert_eq!(world.acked.len(), STEPS, "{context}: every step completes after the resume: {:?}", world.errors);
    for (i, runs_then) in &world.acked_before_crash {
        assert_eq!(world.runs[i], *runs_then, "{context}: step {i} was acknowledged, yet it ran again after the crash");
    }
    let run = plan_run(&store).expect("the run");
    let report = store.resume(run).expect("resume report");
    let completed: BTreeSet<AtomId> = report.agents.iter().flat_map(|agent| agent.completed.iter().copied()).collect();
    for (i, (atom, recorded)) in &world.acked {
        assert!(completed.contains(atom), "{context}: step {i} is listed as completed");
        let found = store.atom(*atom).unwrap_or_else(|e| panic!("{context}: step {i}: {e}"));
        assert_eq!(found.output, Some(output_of(*i, *recorded)), "{context}: step {i}");
    }
    assert!(report.agents.iter().all(|agent| agent.first_incomplete.is_none()), "{context}: nothing is left to resume");
    for (key, runs) in &world.effect_runs {
        assert_eq!(*runs, 1, "{context}: the guarded effect {key} ran {runs} times");
    }
    let tool_steps = (0..STEPS).filter(|i| agent_of(*i).1).count();
    assert_eq!(world.received.len(), tool_steps, "{context}: every tool step's effect arrived");
    for (key, received) in &world.received {
        assert_eq!(*received, 1, "{context}: the external system received {key} {received} times");
    }
    surfaced
}

/// Each acknowledged step with the number of times it has run.
fn acked_runs(world: &World) -> BTreeMap<usize, u32> {
    world.acked.keys().map(|i| (*i, world.runs[i])).collect()
}

/// The plan's run, if the store holds it.
fn plan_run(store: &Store) -> Option<RunId> {
    store.runs().into_iter().find(|run| run.name == "plan").map(|run| run.id)
}

/// The keys of the atoms `report` lists as completed.
fn completed_keys(store: &Store, report: &continuum::ResumeReport) -> BTreeSet<String> {
    let atoms = report.agents.iter().flat_map(|agent| agent.completed.iter().copied());
    atoms
        .map(|atom| {
            let found = store.atom(atom).expect("a completed atom reads");
            assert_eq!(found.status, AtomStatus::Completed);
            found.key
        })
        .collect()
}

/// I/O calls the plan makes after the store's open when nothing fails.
fn calls_in_plan() -> u64 {
    let sim = SimStorage::new(SEED);
    let store = open(&sim, false).expect("open");
    let before = sim.op_count();
    let world = RefCell::new(World::default());
    execute_plan(&store, &world);
    let world = world.into_inner();
    assert!(world.errors.is_empty(), "no fault, no error: {:?}", world.errors);
    assert_eq!(world.acked.len(), STEPS);
    assert_eq!(world.runs[&FLAKY_STEP], 2, "the flaky step fails once, then succeeds");
    sim.op_count() - before
}

#[test]
fn a_failed_io_call_anywhere_in_the_agent_protocol_never_repeats_an_acknowledged_step_or_effect() {
    let calls = calls_in_plan();
    assert!(calls > 50, "the plan makes {calls} I/O calls");
    let (mut cases, mut surfaced) = (0, 0);
    for nth in 1..=calls {
        for kind in [FaultKind::Eio, FaultKind::NoSpace] {
            let damage = CrashDamage::ALL[cases % CrashDamage::ALL.len()];
            surfaced += usize::from(fail_nth(nth, kind, damage, false));
            cases += 1;
        }
    }
    eprintln!("{cases} cases ({calls} I/O calls, each failed with EIO and ENOSPC); {surfaced} surfaced as an error");
    assert!(surfaced > cases / 2, "too few failures reached the agent: {surfaced} of {cases}");
}

#[test]
fn a_failed_io_call_beside_the_background_thread_never_repeats_an_acknowledged_step_or_effect() {
    // The background thread writes the policy snapshots while the agent runs: which call fails
    // depends on how the threads interleave, so every third call of the single-threaded count
    // is failed, with both kinds.
    let calls = calls_in_plan();
    let mut cases = 0;
    for nth in (1..=calls).step_by(3) {
        for kind in [FaultKind::Eio, FaultKind::NoSpace] {
            fail_nth(nth, kind, CrashDamage::ALL[cases % CrashDamage::ALL.len()], true);
            cases += 1;
        }
    }
    eprintln!("{cases} cases beside the background thread");
}

/// `execute` whose work succeeded and whose completion's `fdatasync` failed hands the work's
/// output back with the error instead of dropping it: the agent records it after a reopen
/// without running the work again.
#[test]
fn a_completion_that_is_not_recorded_hands_the_output_back() {
    use continuum::storage::sim::Op;

    let sim = SimStorage::new(SEED);
    let store = open(&sim, false).expect("open");
    let run = store.create_run(RunSpec::new("plan")).expect("run");
    sim.inject(Fault { op: Some(Op::SyncData), nth: 1, kind: FaultKind::Eio });
    let executed = store.execute(run, "planner", "step-0", &[], |_| Ok(output_of(0, 1)));
    let Err(Error::OutputNotRecorded { output, source, .. }) = executed else {
        panic!("the output is dropped: {executed:?}")
    };
    assert_eq!(*output, output_of(0, 1));
    assert!(matches!(*source, Error::Io { .. } | Error::Poisoned { .. }), "{source:?}");
    sim.crash(CrashDamage::ALL[0]);
    drop(store);
    let store = open(&sim, false).expect("reopen");
    let recorded = store
        .execute(run, "planner", "step-0", &[], |_| Ok(*output.clone()))
        .expect("the step is recorded from the output handed back");
    assert_eq!(recorded.output, output_of(0, 1));
    let again = store.execute(run, "planner", "step-0", &[], |_| panic!("the step ran again")).expect("replay");
    assert!(again.replayed);
}
