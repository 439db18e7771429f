//! The atom protocol against a model, over random sequences of what agents, reviewers and
//! retention do, with crashes: steps executed (some failing with a retryable error first,
//! some failing for good) or recorded whole (`record_atom`), rollbacks and re-runs, forks,
//! pins, runs finished and dropped by retention and their names reused, index checkpoints,
//! clean reopens, and power losses with each kind of damage.
//!
//! Every call below is acknowledged durably before it returns (an `execute` records its
//! completion or failure with a sync, a rollback and a drop are synced), so a power loss must
//! change nothing the model knows. After every action the store's answer is checked; after
//! every reopen, the whole store: each step's atom by key, its status and output, each
//! agent's head (and that its context rebuilds: compaction never takes what a head or a
//! pinned atom needs), and the resume report of each run.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use continuum::storage::sim::{CrashDamage, SimStorage};
use continuum::synthetic::Transcript;
use continuum::{
    AtomFailure, AtomId, AtomOutput, AtomStatus, CompactionPolicy, Error, RetentionPolicy, RunId, RunSpec,
    SnapshotPolicy, Store,
};
use proptest::collection::vec;
use proptest::prelude::*;

const RUNS: [&str; 2] = ["r", "s"];
const AGENTS: [&str; 2] = ["planner", "tool"];
const STEPS: usize = 4;

#[derive(Clone, Debug)]
enum Action {
    /// `execute` of a step; it may fail with a retryable error first, or for good.
    Execute { run: usize, agent: usize, step: usize, fails: Fails },
    /// `record_atom` of a step (refused if the step exists).
    Record { run: usize, agent: usize, step: usize },
    /// The agent's head is pinned.
    Pin { run: usize, agent: usize },
    /// The agent rolls back to its first completed atom still on its line.
    Rollback { run: usize, agent: usize },
    /// A new branch from the agent's first completed atom, under a fresh key.
    Fork { run: usize, agent: usize },
    /// The run finishes and retention drops it; its name is free for a new run.
    Drop { run: usize },
    /// An index checkpoint now.
    Checkpoint,
    /// A clean close and open.
    Reopen,
    /// A power loss with this kind of damage, and an open.
    Crash { damage: usize },
}

/// How a step's run goes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fails {
    Never,
    /// The first run fails with a retryable error, the second succeeds.
    Once,
    /// It fails with an error that is not retryable.
    ForGood,
}

fn action() -> impl Strategy<Value = Action> {
    let fails = prop_oneof![8 => Just(Fails::Never), 2 => Just(Fails::Once), 1 => Just(Fails::ForGood)];
    prop_oneof![
        10 => (0..RUNS.len(), 0..AGENTS.len(), 0..STEPS, fails)
            .prop_map(|(run, agent, step, fails)| Action::Execute { run, agent, step, fails }),
        3 => (0..RUNS.len(), 0..AGENTS.len(), 0..STEPS).prop_map(|(run, agent, step)| Action::Record { run, agent, step }),
        1 => (0..RUNS.len(), 0..AGENTS.len()).prop_map(|(run, agent)| Action::Pin { run, agent }),
        1 => (0..RUNS.len(), 0..AGENTS.len()).prop_map(|(run, agent)| Action::Rollback { run, agent }),
        1 => (0..RUNS.len(), 0..AGENTS.len()).prop_map(|(run, agent)| Action::Fork { run, agent }),
        1 => (0..RUNS.len()).prop_map(|run| Action::Drop { run }),
        1 => Just(Action::Checkpoint),
        1 => Just(Action::Reopen),
        1 => (0..CrashDamage::ALL.len()).prop_map(|damage| Action::Crash { damage }),
    ]
}

fn open(sim: &SimStorage, background: bool) -> Store {
    Store::builder(Path::new("/model"))
        .storage(Arc::new(sim.clone()))
        .segment_bytes(16 * 1024)
        .snapshot_policy(SnapshotPolicy { every_atoms: 3, every: Duration::ZERO })
        .retention(RetentionPolicy { snapshots_per_agent: 2, finished_run_age: Some(Duration::ZERO) })
        .index_checkpoint_after(u64::MAX)
        .compaction(CompactionPolicy { interval: None, ..CompactionPolicy::default() })
        .background(background)
        .open()
        .expect("open")
}

/// One atom as the model knows it.
#[derive(Clone, Debug)]
struct ModelAtom {
    id: AtomId,
    agent: usize,
    key: String,
    /// The output it completed with, if it did.
    output: Option<AtomOutput>,
    /// It failed for good.
    failed: bool,
    abandoned: bool,
}

#[derive(Default)]
struct Model {
    /// Each live run's atoms in id order, by the run's current id.
    runs: BTreeMap<usize, (RunId, Vec<ModelAtom>)>,
    /// Outputs handed out so far (each run of a step makes a new one).
    made: u64,
    forks: u64,
    /// Atoms of dropped runs: gone.
    dropped: Vec<AtomId>,
    /// Pinned atoms of live runs.
    pinned: Vec<AtomId>,
}

impl Model {
    fn output(&mut self) -> AtomOutput {
        self.made += 1;
        AtomOutput { delta: Transcript::new(self.made).next_delta(200), result: self.made.to_le_bytes().to_vec() }
    }

    /// The step's atom no rollback abandoned.
    fn step(&self, run: usize, agent: usize, key: &str) -> Option<&ModelAtom> {
        self.runs.get(&run)?.1.iter().find(|atom| atom.agent == agent && atom.key == key && !atom.abandoned)
    }

    /// The agent's head: its newest atom no rollback abandoned.
    fn head(&self, run: usize, agent: usize) -> Option<AtomId> {
        self.runs.get(&run)?.1.iter().rev().find(|atom| atom.agent == agent && !atom.abandoned).map(|atom| atom.id)
    }
}

fn run_id(store: &Store, model: &mut Model, run: usize) -> RunId {
    let id = store.create_run(RunSpec::new(RUNS[run])).expect("run");
    let entry = model.runs.entry(run).or_insert_with(|| (id, Vec::new()));
    assert_eq!(entry.0, id, "run {} keeps its id while it lives", RUNS[run]);
    id
}

fn apply(store: &Store, model: &mut Model, action: &Action) {
    match *action {
        Action::Execute { run, agent, step, fails } => {
            let id = run_id(store, model, run);
            let key = format!("step-{step}");
            let parents: Vec<AtomId> = model.head(run, agent).into_iter().collect();
            let known = model.step(run, agent, &key).cloned();
            let output = model.output();
            let mut ran = 0;
            let mut attempt = |_: AtomId| {
                ran += 1;
                match fails {
                    Fails::Once if ran == 1 => Err(AtomFailure { message: "timeout".into(), retryable: true }),
                    Fails::ForGood => Err(AtomFailure { message: "refused".into(), retryable: false }),
                    _ => Ok(output.clone()),
                }
            };
            let mut executed = store.execute(id, AGENTS[agent], &key, &parents, &mut attempt);
            if matches!(executed, Err(Error::AtomFailed { retryable: true, .. })) {
                executed = store.execute(id, AGENTS[agent], &key, &parents, &mut attempt);
            }
            if known.as_ref().is_some_and(|atom| atom.failed) {
                // A step that failed for good is not run again: its failure comes back.
                assert!(matches!(executed, Err(Error::AtomFailed { retryable: false, .. })), "{executed:?}");
                assert_eq!(ran, 0, "a step that failed for good runs again");
                return;
            }
            if fails == Fails::ForGood && known.as_ref().is_none_or(|atom| atom.output.is_none()) {
                let Err(Error::AtomFailed { atom, retryable: false, .. }) = executed else {
                    panic!("a step failing for good: {executed:?}")
                };
                assert_eq!(ran, 1);
                let atom = AtomId::from_raw(atom);
                let atoms = &mut model.runs.get_mut(&run).expect("run").1;
                match atoms.iter_mut().find(|a| a.id == atom) {
                    Some(known) => known.failed = true,
                    None => {
                        atoms.push(ModelAtom { id: atom, agent, key, output: None, failed: true, abandoned: false })
                    }
                }
                return;
            }
            let executed = executed.unwrap_or_else(|e| panic!("execute {}/{}/{key}: {e}", RUNS[run], AGENTS[agent]));
            match known.as_ref().and_then(|atom| atom.output.clone().map(|output| (atom.id, output))) {
                Some((atom, recorded)) => {
                    assert!(executed.replayed && ran == 0, "a completed step runs again");
                    assert_eq!(executed.atom, atom);
                    // A delta retention reclaimed is said to be, and the result stays.
                    let found = store.atom(atom).expect("atom");
                    assert_eq!(executed.delta_reclaimed, found.delta_reclaimed, "atom {atom}");
                    if executed.delta_reclaimed {
                        assert_eq!(executed.output.result, recorded.result, "atom {atom}");
                    } else {
                        assert_eq!(executed.output, recorded, "atom {atom}");
                    }
                }
                None => {
                    assert!(!executed.replayed && ran >= 1, "a step not completed runs");
                    assert_eq!(executed.output, output);
                    if let Some(atom) = &known {
                        assert_eq!(executed.atom, atom.id, "a begun step keeps its atom");
                    }
                    let atoms = &mut model.runs.get_mut(&run).expect("run").1;
                    match atoms.iter_mut().find(|atom| atom.id == executed.atom) {
                        Some(atom) => atom.output = Some(output),
                        None => atoms.push(ModelAtom {
                            id: executed.atom,
                            agent,
                            key,
                            output: Some(output),
                            failed: false,
                            abandoned: false,
                        }),
                    }
                }
            }
        }
        Action::Record { run, agent, step } => {
            let id = run_id(store, model, run);
            let key = format!("step-{step}");
            let parents: Vec<AtomId> = model.head(run, agent).into_iter().collect();
            let known = model.step(run, agent, &key).map(|atom| atom.id);
            let output = model.output();
            let recorded = store.record_atom(id, AGENTS[agent], &key, &parents, "", &output);
            match (recorded, known) {
                (Err(Error::AtomExists { atom }), Some(known)) => assert_eq!(atom, known.get()),
                (Ok(atom), None) => {
                    let atoms = &mut model.runs.get_mut(&run).expect("run").1;
                    atoms.push(ModelAtom {
                        id: atom,
                        agent,
                        key,
                        output: Some(output),
                        failed: false,
                        abandoned: false,
                    });
                }
                (recorded, known) => panic!("record_atom of {key}: {recorded:?}, the model knows {known:?}"),
            }
        }
        Action::Pin { run, agent } => {
            let Some(head) = model.head(run, agent) else { return };
            store.pin(head, true).unwrap_or_else(|e| panic!("pin the head {head}: {e}"));
            model.pinned.push(head);
        }
        Action::Rollback { run, agent } => {
            let Some((id, atoms)) = model.runs.get_mut(&run) else { return };
            let Some(to) = atoms.iter().find(|a| a.agent == agent && !a.abandoned && a.output.is_some()).map(|a| a.id)
            else {
                return;
            };
            let mut abandoned = match store.rollback(*id, AGENTS[agent], to, "model") {
                Ok(abandoned) => abandoned,
                // An atom retention reclaimed the history of (an agent's old atom) cannot be
                // rolled back to; nothing changes.
                Err(Error::HistoryReclaimed { .. }) => {
                    assert!(store.atom(to).expect("atom").delta_reclaimed, "atom {to} is refused, not reclaimed");
                    return;
                }
                Err(error) => panic!("rollback to {to}: {error}"),
            };
            let mut expected: Vec<AtomId> = Vec::new();
            for atom in atoms.iter_mut().filter(|a| a.agent == agent && a.id > to && !a.abandoned) {
                atom.abandoned = true;
                expected.push(atom.id);
            }
            abandoned.sort_unstable();
            assert_eq!(abandoned, expected, "the rollback abandons the agent's later atoms");
        }
        Action::Fork { run, agent } => {
            let Some((id, atoms)) = model.runs.get(&run) else { return };
            let Some(from) =
                atoms.iter().find(|a| a.agent == agent && !a.abandoned && a.output.is_some()).map(|a| a.id)
            else {
                return;
            };
            let id = *id;
            model.forks += 1;
            let key = format!("fork-{}", model.forks);
            let atom = match store.fork(id, AGENTS[agent], from, &key) {
                Ok(atom) => atom,
                Err(Error::InvalidParent { .. }) => {
                    assert!(store.atom(from).expect("atom").delta_reclaimed, "atom {from} is refused, not reclaimed");
                    return;
                }
                Err(error) => panic!("fork from {from}: {error}"),
            };
            let output = model.output();
            store.complete_atom(atom, &output).expect("complete the fork");
            let atoms = &mut model.runs.get_mut(&run).expect("run").1;
            atoms.push(ModelAtom { id: atom, agent, key, output: Some(output), failed: false, abandoned: false });
        }
        Action::Drop { run } => {
            let Some((id, atoms)) = model.runs.remove(&run) else { return };
            model.dropped.extend(atoms.iter().map(|atom| atom.id));
            model.pinned.retain(|pinned| !atoms.iter().any(|atom| atom.id == *pinned));
            store.finish_run(id, true, "").expect("finish");
            std::thread::sleep(Duration::from_micros(2));
            assert_eq!(store.compact().expect("compact").runs_dropped, 1);
            assert!(store.run_id(RUNS[run]).is_none(), "the name is free");
        }
        Action::Checkpoint => {
            store.checkpoint_index().expect("checkpoint");
        }
        Action::Reopen | Action::Crash { .. } => unreachable!("the caller reopens"),
    }
}

/// The whole store against the model.
fn check(store: &Store, model: &Model) {
    for atom in &model.dropped {
        assert!(matches!(store.atom(*atom), Err(Error::UnknownAtom { .. })), "atom {atom} of a dropped run");
    }
    for (run, (id, atoms)) in &model.runs {
        assert_eq!(store.run_id(RUNS[*run]), Some(*id), "run {}", RUNS[*run]);
        for atom in atoms {
            let found = store.atom(atom.id).unwrap_or_else(|e| panic!("atom {}: {e}", atom.id));
            assert_eq!((found.key.as_str(), found.abandoned), (atom.key.as_str(), atom.abandoned), "atom {}", atom.id);
            // Compaction may have reclaimed a delta an agent's kept snapshot covers; the result
            // stays.
            if found.delta_reclaimed {
                let result = |output: &Option<AtomOutput>| output.as_ref().map(|o| o.result.clone());
                assert_eq!(result(&found.output), result(&atom.output), "atom {}", atom.id);
            } else {
                assert_eq!(found.output, atom.output, "atom {}", atom.id);
            }
            let by_key = store.atom_by_key(*id, AGENTS[atom.agent], &atom.key).expect("lookup");
            let current = model.step(*run, atom.agent, &atom.key).map(|a| a.id);
            assert_eq!(by_key, current, "{}/{}/{}", RUNS[*run], AGENTS[atom.agent], atom.key);
        }
        let report = store.resume(*id).expect("resume");
        for (agent, name) in AGENTS.iter().enumerate() {
            assert_eq!(store.last_agent_atom(*id, name), model.head(*run, agent), "head of {}/{name}", RUNS[*run]);
            let completed: Vec<AtomId> =
                atoms.iter().filter(|a| a.agent == agent && !a.abandoned && a.output.is_some()).map(|a| a.id).collect();
            let reported =
                report.agents.iter().find(|a| a.agent == *name).map(|a| a.completed.clone()).unwrap_or_default();
            assert_eq!(reported, completed, "completed atoms of {}/{name}", RUNS[*run]);
        }
        for atom in atoms.iter().filter(|a| !a.abandoned) {
            let status = store.atom(atom.id).expect("atom").status;
            let want = match (&atom.output, atom.failed) {
                (Some(_), _) => AtomStatus::Completed,
                (None, true) => AtomStatus::Failed { retryable: false },
                (None, false) => AtomStatus::Running,
            };
            assert_eq!(status, want, "atom {}", atom.id);
        }
        for (agent, name) in AGENTS.iter().enumerate() {
            let failed: Vec<AtomId> =
                atoms.iter().filter(|a| a.agent == agent && !a.abandoned && a.failed).map(|a| a.id).collect();
            let reported =
                report.agents.iter().find(|a| a.agent == *name).map(|a| a.failed.clone()).unwrap_or_default();
            assert_eq!(reported, failed, "failed atoms of {}/{name}", RUNS[*run]);
            // What an agent continues from is never reclaimed.
            if let Some(head) = model.head(*run, agent) {
                store.rebuild_context(head).unwrap_or_else(|e| panic!("the head {head} of {}/{name}: {e}", RUNS[*run]));
            }
        }
    }
    for pinned in &model.pinned {
        store.rebuild_context(*pinned).unwrap_or_else(|e| panic!("the pinned atom {pinned}: {e}"));
    }
}

/// Runs `actions` on a store (its policy snapshots written by its background thread, with
/// `background`) and on the model, checking each answer, and the whole store after every
/// reopen and at the end.
fn run_actions(actions: &[Action], background: bool) {
    let sim = SimStorage::new(21);
    let mut store = open(&sim, background);
    let mut model = Model::default();
    for action in actions {
        match *action {
            Action::Reopen => {
                drop(store);
                store = open(&sim, background);
                check(&store, &model);
            }
            Action::Crash { damage } => {
                // The process dies: nothing of a close runs.
                std::mem::forget(store);
                sim.crash(CrashDamage::ALL[damage]);
                store = open(&sim, background);
                check(&store, &model);
            }
            _ => apply(&store, &mut model, action),
        }
    }
    check(&store, &model);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn the_store_follows_the_model_across_crashes(actions in vec(action(), 1..60)) {
        run_actions(&actions, false);
    }

    #[test]
    fn the_store_follows_the_model_beside_its_background_thread(actions in vec(action(), 1..60)) {
        run_actions(&actions, true);
    }
}
