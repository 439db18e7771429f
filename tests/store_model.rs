//! The atom protocol against a model, over random sequences of what agents, reviewers and
//! retention do, with crashes: steps executed (some failing with a retryable error first,
//! some failing for good) or recorded whole (`record_atom`), rollbacks and re-runs, forks,
//! pins, runs finished and dropped by retention and their names reused, index snapshots,
//! clean reopens, and power losses with each kind of damage: between actions, and in the middle
//! of one (the process dies after a chosen number of storage calls, the calls after that fail,
//! then the power goes).
//!
//! Every call below is acknowledged durably before it returns (an `execute` records its
//! completion or failure with a sync, a rollback and a drop are synced), so a power loss must
//! change nothing the model knows. After every action the store's answer is checked; after
//! every reopen, the whole store: each step's atom by key, its status and output, each
//! agent's head (and that its context rebuilds: compaction never takes what a head or a
//! pinned atom needs), and the resume report of each run. After a crash in the middle of an
//! action, what its calls acknowledged must be there; what they did not may be there or not,
//! but whole (a `record_atom` never left begun, a rollback never half done, a step's outcome
//! only one it could have had), and the model takes on what is there.

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
const STEPS: usize = 12;

#[derive(Clone, Debug)]
enum Action {
    /// `execute` of a step; it may fail with a retryable error first, or for good.
    Execute { run: usize, agent: usize, step: usize, fails: Fails },
    /// `record_atom` of a step (refused if the step exists).
    Record { run: usize, agent: usize, step: usize },
    /// The agent's head is pinned.
    Pin { run: usize, agent: usize },
    /// The agent rolls back to one of its completed atoms still on its line (the `pick`-th,
    /// modulo their number).
    Rollback { run: usize, agent: usize, pick: usize },
    /// A new branch from one of the agent's completed atoms still on its line, under a fresh
    /// key.
    Fork { run: usize, agent: usize, pick: usize },
    /// A compaction round (retention, then compaction) now.
    Compact,
    /// The run finishes and retention drops it; its name is free for a new run.
    Drop { run: usize },
    /// An index snapshot now.
    IndexSnapshot,
    /// A clean close and open.
    Reopen,
    /// A power loss with this kind of damage, and an open.
    Crash { damage: usize },
    /// The process dies after `after` more storage calls while it does `action` (the calls
    /// after that fail), then a power loss with this kind of damage, and an open. What the
    /// action's calls acknowledged must survive; what they did not may or may not have.
    Interrupted { action: Box<Action>, after: u64, damage: usize },
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

/// What one agent, reviewer or retention does (no reopen, no crash).
fn work() -> impl Strategy<Value = Action> {
    let fails = prop_oneof![8 => Just(Fails::Never), 2 => Just(Fails::Once), 1 => Just(Fails::ForGood)];
    prop_oneof![
        10 => (0..RUNS.len(), 0..AGENTS.len(), 0..STEPS, fails)
            .prop_map(|(run, agent, step, fails)| Action::Execute { run, agent, step, fails }),
        3 => (0..RUNS.len(), 0..AGENTS.len(), 0..STEPS).prop_map(|(run, agent, step)| Action::Record { run, agent, step }),
        1 => (0..RUNS.len(), 0..AGENTS.len()).prop_map(|(run, agent)| Action::Pin { run, agent }),
        2 => (0..RUNS.len(), 0..AGENTS.len(), 0..2 * STEPS)
            .prop_map(|(run, agent, pick)| Action::Rollback { run, agent, pick }),
        1 => (0..RUNS.len(), 0..AGENTS.len(), 0..2 * STEPS).prop_map(|(run, agent, pick)| Action::Fork { run, agent, pick }),
        2 => Just(Action::Compact),
        1 => (0..RUNS.len()).prop_map(|run| Action::Drop { run }),
        1 => Just(Action::IndexSnapshot),
    ]
}

impl Fails {
    /// What the step's `ran`-th run returns.
    fn outcome(self, ran: u32, output: &AtomOutput) -> Result<AtomOutput, AtomFailure> {
        match self {
            Fails::Once if ran == 1 => Err(AtomFailure { message: "timeout".into(), retryable: true }),
            Fails::ForGood => Err(AtomFailure { message: "refused".into(), retryable: false }),
            _ => Ok(output.clone()),
        }
    }
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        19 => work(),
        1 => Just(Action::Reopen),
        1 => (0..CrashDamage::ALL.len()).prop_map(|damage| Action::Crash { damage }),
        // Most actions make a few storage calls; a drop's compaction round makes hundreds.
        2 => (work(), prop_oneof![3 => 0..6u64, 2 => 0..30u64, 1 => 0..400u64], 0..CrashDamage::ALL.len())
            .prop_map(|(action, after, damage)| Action::Interrupted { action: Box::new(action), after, damage }),
    ]
}

/// Opens the store as a new process would: its calls stop reaching the disk at the next crash.
fn open(sim: &SimStorage, background: bool) -> Store {
    Store::builder(Path::new("/model"))
        .storage(Arc::new(sim.process()))
        .segment_bytes(4 * 1024)
        .snapshot_policy(SnapshotPolicy { every_atoms: 3, every: Duration::ZERO })
        .retention(RetentionPolicy { snapshots_per_agent: 2, finished_run_age: Some(Duration::ZERO) })
        .index_snapshot_after(u64::MAX)
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
    /// The parents it was begun with: a key names a step on a branch.
    parents: Vec<AtomId>,
    /// The output it completed with, if it did.
    output: Option<AtomOutput>,
    /// It failed for good.
    failed: bool,
    /// It failed with a retryable error and has not run since (only a crash between an
    /// attempt and its retry leaves one so).
    retry: bool,
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

impl ModelAtom {
    /// A new atom of the agent's, completed with `output` if it is `Some`.
    fn new(id: AtomId, agent: usize, key: String, parents: Vec<AtomId>, output: Option<AtomOutput>) -> Self {
        Self { id, agent, key, parents, output, failed: false, retry: false, abandoned: false }
    }
}

impl Model {
    /// The agent's `pick`-th completed atom still on its line (modulo their number): what a
    /// rollback goes back to and a fork starts from.
    fn completed(&self, run: usize, agent: usize, pick: usize) -> Option<(RunId, AtomId)> {
        let (id, atoms) = self.runs.get(&run)?;
        let line: Vec<&ModelAtom> =
            atoms.iter().filter(|a| a.agent == agent && !a.abandoned && a.output.is_some()).collect();
        let atom = line.get(pick % line.len().max(1))?;
        Some((*id, atom.id))
    }

    fn output(&mut self) -> AtomOutput {
        self.made += 1;
        AtomOutput { delta: Transcript::new(self.made).next_delta(200), result: self.made.to_le_bytes().to_vec() }
    }

    /// The step's newest atom no rollback abandoned, on any branch (`atom_by_key`).
    fn step(&self, run: usize, agent: usize, key: &str) -> Option<&ModelAtom> {
        self.runs.get(&run)?.1.iter().rev().find(|atom| atom.agent == agent && atom.key == key && !atom.abandoned)
    }

    /// The step's atom on the branch of `parents` (`execute`, `record_atom`): the newest no
    /// rollback abandoned whose parents are the same set, or that is an ancestor of one of them.
    fn step_on(&self, run: usize, agent: usize, key: &str, parents: &[AtomId]) -> Option<&ModelAtom> {
        let atoms = &self.runs.get(&run)?.1;
        let set = |atoms: &[AtomId]| atoms.iter().copied().collect::<std::collections::BTreeSet<_>>();
        let mut ancestors = std::collections::BTreeSet::new();
        let mut stack: Vec<AtomId> = parents.to_vec();
        while let Some(atom) = stack.pop() {
            if ancestors.insert(atom)
                && let Some(found) = atoms.iter().find(|a| a.id == atom)
            {
                stack.extend(found.parents.iter().copied());
            }
        }
        atoms.iter().rev().find(|atom| {
            atom.agent == agent
                && atom.key == key
                && !atom.abandoned
                && (set(&atom.parents) == set(parents) || ancestors.contains(&atom.id))
        })
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
            let known = model.step_on(run, agent, &key, &parents).cloned();
            let output = model.output();
            let mut ran = 0;
            let mut attempt = |_: AtomId| {
                ran += 1;
                fails.outcome(ran, &output)
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
                    Some(known) => {
                        known.failed = true;
                        known.retry = false;
                    }
                    None => atoms.push(ModelAtom { failed: true, ..ModelAtom::new(atom, agent, key, parents, None) }),
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
                        Some(atom) => {
                            atom.output = Some(output);
                            atom.retry = false;
                        }
                        None => atoms.push(ModelAtom::new(executed.atom, agent, key, parents, Some(output))),
                    }
                }
            }
        }
        Action::Record { run, agent, step } => {
            let id = run_id(store, model, run);
            let key = format!("step-{step}");
            let parents: Vec<AtomId> = model.head(run, agent).into_iter().collect();
            let known = model.step_on(run, agent, &key, &parents).map(|atom| atom.id);
            let output = model.output();
            let recorded = store.record_atom(id, AGENTS[agent], &key, &parents, "", &output);
            match (recorded, known) {
                (Err(Error::AtomExists { atom }), Some(known)) => assert_eq!(atom, known.get()),
                (Ok(atom), None) => {
                    let atoms = &mut model.runs.get_mut(&run).expect("run").1;
                    atoms.push(ModelAtom::new(atom, agent, key, parents, Some(output)));
                }
                (recorded, known) => panic!("record_atom of {key}: {recorded:?}, the model knows {known:?}"),
            }
        }
        Action::Pin { run, agent } => {
            let Some(head) = model.head(run, agent) else { return };
            store.pin(head, true).unwrap_or_else(|e| panic!("pin the head {head}: {e}"));
            model.pinned.push(head);
        }
        Action::Rollback { run, agent, pick } => {
            let Some((id, to)) = model.completed(run, agent, pick) else { return };
            let mut abandoned = match store.rollback(id, AGENTS[agent], to, "model") {
                // The agent continues from `to`: its context must rebuild.
                Ok(abandoned) => {
                    store.rebuild_context(to).unwrap_or_else(|e| panic!("the rollback's head {to}: {e}"));
                    abandoned
                }
                // An atom whose history retention released cannot be rolled back to; nothing
                // changes. Never the agent's head or a pinned atom: retention keeps those.
                Err(Error::HistoryReclaimed { .. }) => {
                    assert_ne!(model.head(run, agent), Some(to), "the head {to} is refused");
                    assert!(!model.pinned.contains(&to), "the pinned atom {to} is refused");
                    return;
                }
                Err(error) => panic!("rollback to {to}: {error}"),
            };
            let mut expected: Vec<AtomId> = Vec::new();
            let atoms = &mut model.runs.get_mut(&run).expect("run").1;
            for atom in atoms.iter_mut().filter(|a| a.agent == agent && a.id > to && !a.abandoned) {
                atom.abandoned = true;
                expected.push(atom.id);
            }
            abandoned.sort_unstable();
            assert_eq!(abandoned, expected, "the rollback abandons the agent's later atoms");
        }
        Action::Fork { run, agent, pick } => {
            let Some((id, from)) = model.completed(run, agent, pick) else { return };
            model.forks += 1;
            let key = format!("fork-{}", model.forks);
            let atom = match store.fork(id, AGENTS[agent], from, &key) {
                Ok(atom) => atom,
                Err(Error::InvalidParent { .. } | Error::HistoryReclaimed { .. }) => {
                    assert_ne!(model.head(run, agent), Some(from), "a fork from the head {from} is refused");
                    assert!(!model.pinned.contains(&from), "a fork from the pinned atom {from} is refused");
                    return;
                }
                Err(error) => panic!("fork from {from}: {error}"),
            };
            let output = model.output();
            store.complete_atom(atom, &output).expect("complete the fork");
            store.rebuild_context(atom).unwrap_or_else(|e| panic!("the fork {atom}: {e}"));
            let atoms = &mut model.runs.get_mut(&run).expect("run").1;
            atoms.push(ModelAtom::new(atom, agent, key, vec![from], Some(output)));
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
        Action::IndexSnapshot => {
            store.write_index_snapshot().expect("index snapshot");
        }
        Action::Compact => {
            store.compact().expect("compact");
        }
        Action::Reopen | Action::Crash { .. } | Action::Interrupted { .. } => unreachable!("the caller reopens"),
    }
}

/// What an interrupted action tried, and what its calls acknowledged before the process died.
#[derive(Debug)]
enum Attempt {
    /// `execute` (`record: false`) or `record_atom` of a step.
    Step {
        run: usize,
        agent: usize,
        key: String,
        /// The parents it was attempted with.
        parents: Vec<AtomId>,
        output: AtomOutput,
        record: bool,
        fails: Fails,
        acked: Acked,
    },
    Pin {
        atom: AtomId,
        acked: bool,
    },
    /// A rollback that would abandon `expected`; `refused`: the store said the target's
    /// history is reclaimed.
    Rollback {
        expected: Vec<AtomId>,
        acked: bool,
        refused: bool,
    },
    /// A fork begun under `key`; `completed`: its completion was acknowledged.
    Fork {
        run: usize,
        agent: usize,
        key: String,
        output: AtomOutput,
        completed: bool,
    },
    Drop {
        run: usize,
        acked: bool,
    },
    Nothing,
}

/// The last outcome of a step the store acknowledged.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Acked {
    Nothing,
    /// A retryable failure was recorded (its retry was not acknowledged).
    RetryableFailure,
    /// A failure for good was recorded.
    Failure,
    Completion,
}

/// Does `action` as [`apply`] does, on a store whose process dies partway: every call may
/// fail, and nothing is checked yet (the crash comes before the answers could be acted on).
fn attempt(store: &Store, model: &mut Model, action: &Action) -> Attempt {
    match *action {
        Action::Execute { run, agent, step, fails } => {
            let key = format!("step-{step}");
            let output = model.output();
            let mut acked = Acked::Nothing;
            let parents: Vec<AtomId> = model.head(run, agent).into_iter().collect();
            if let Ok(id) = store.create_run(RunSpec::new(RUNS[run])) {
                let mut ran = 0;
                let mut work = |_: AtomId| {
                    ran += 1;
                    fails.outcome(ran, &output)
                };
                for _ in 0..2 {
                    match store.execute(id, AGENTS[agent], &key, &parents, &mut work) {
                        Ok(_) => acked = Acked::Completion,
                        Err(Error::AtomFailed { retryable: true, .. }) => {
                            acked = Acked::RetryableFailure;
                            continue;
                        }
                        Err(Error::AtomFailed { retryable: false, .. }) => acked = Acked::Failure,
                        Err(_) => {}
                    }
                    break;
                }
            }
            Attempt::Step { run, agent, key, parents, output, record: false, fails, acked }
        }
        Action::Record { run, agent, step } => {
            let key = format!("step-{step}");
            let output = model.output();
            let mut acked = Acked::Nothing;
            let parents: Vec<AtomId> = model.head(run, agent).into_iter().collect();
            if let Ok(id) = store.create_run(RunSpec::new(RUNS[run]))
                && store.record_atom(id, AGENTS[agent], &key, &parents, "", &output).is_ok()
            {
                acked = Acked::Completion;
            }
            Attempt::Step { run, agent, key, parents, output, record: true, fails: Fails::Never, acked }
        }
        Action::Pin { run, agent } => match model.head(run, agent) {
            Some(atom) => Attempt::Pin { atom, acked: store.pin(atom, true).is_ok() },
            None => Attempt::Nothing,
        },
        Action::Rollback { run, agent, pick } => {
            let Some((id, to)) = model.completed(run, agent, pick) else { return Attempt::Nothing };
            let atoms = &model.runs[&run].1;
            let expected: Vec<AtomId> =
                atoms.iter().filter(|a| a.agent == agent && a.id > to && !a.abandoned).map(|a| a.id).collect();
            match store.rollback(id, AGENTS[agent], to, "model") {
                Ok(mut abandoned) => {
                    abandoned.sort_unstable();
                    assert_eq!(abandoned, expected, "the rollback abandons the agent's later atoms");
                    Attempt::Rollback { expected, acked: true, refused: false }
                }
                Err(Error::HistoryReclaimed { .. }) => Attempt::Rollback { expected, acked: false, refused: true },
                Err(_) => Attempt::Rollback { expected, acked: false, refused: false },
            }
        }
        Action::Fork { run, agent, pick } => {
            let Some((id, from)) = model.completed(run, agent, pick) else { return Attempt::Nothing };
            model.forks += 1;
            let key = format!("fork-{}", model.forks);
            let output = model.output();
            let completed =
                store.fork(id, AGENTS[agent], from, &key).is_ok_and(|atom| store.complete_atom(atom, &output).is_ok());
            Attempt::Fork { run, agent, key, output, completed }
        }
        Action::Drop { run } => {
            let Some((id, _)) = model.runs.get(&run) else { return Attempt::Nothing };
            let finished = store.finish_run(*id, true, "").is_ok();
            std::thread::sleep(Duration::from_micros(2));
            let acked = finished && store.compact().is_ok_and(|report| report.runs_dropped == 1);
            Attempt::Drop { run, acked }
        }
        Action::IndexSnapshot => {
            let _ = store.write_index_snapshot();
            Attempt::Nothing
        }
        Action::Compact => {
            let _ = store.compact();
            Attempt::Nothing
        }
        Action::Reopen | Action::Crash { .. } | Action::Interrupted { .. } => unreachable!("not interrupted"),
    }
}

/// After the crash and an open: what the interrupted action left must be what it
/// acknowledged, or more of what it tried (never part of one record batch, never something it
/// did not try); the model takes it on.
fn reconcile(store: &Store, model: &mut Model, attempt: Attempt) {
    match attempt {
        Attempt::Step { run, agent, key, parents, output, record, fails, acked } => {
            let name = format!("{}/{}/{key}", RUNS[run], AGENTS[agent]);
            let id = match model.runs.get(&run) {
                Some((id, _)) => *id,
                None => match store.run_id(RUNS[run]) {
                    Some(id) => {
                        model.runs.insert(run, (id, Vec::new()));
                        id
                    }
                    None => {
                        assert_eq!(acked, Acked::Nothing, "{name}: acknowledged in a run that is gone");
                        return;
                    }
                },
            };
            let known = model.step_on(run, agent, &key, &parents).cloned();
            let Some(atom) = store.atom_by_key_on(id, AGENTS[agent], &key, &parents).expect("lookup") else {
                assert!(known.is_none(), "{name}: the atom {known:?} is gone");
                assert_eq!(acked, Acked::Nothing, "{name}: acknowledged, then lost");
                return;
            };
            if let Some(known) = &known {
                assert_eq!(known.id, atom, "{name}");
                // A finished step does not change, nor does one `record_atom` found begun; the
                // final check holds them to what the model knows.
                if known.output.is_some() || known.failed || record {
                    return;
                }
            }
            let retry_known = known.as_ref().is_some_and(|known| known.retry);
            let status = store.atom(atom).expect("atom").status;
            let allowed = match status {
                AtomStatus::Completed => {
                    fails != Fails::ForGood
                        && matches!(acked, Acked::Nothing | Acked::RetryableFailure | Acked::Completion)
                }
                AtomStatus::Failed { retryable: false } => {
                    fails == Fails::ForGood && matches!(acked, Acked::Nothing | Acked::Failure)
                }
                AtomStatus::Failed { retryable: true } => {
                    (fails == Fails::Once || retry_known) && matches!(acked, Acked::Nothing | Acked::RetryableFailure)
                }
                // `record_atom` writes the start and the completion in one batch.
                AtomStatus::Running => !record && acked == Acked::Nothing,
            };
            assert!(
                allowed,
                "{name}: {status:?} after {acked:?} (record: {record}, fails: {fails:?}, known: {known:?})"
            );
            let atoms = &mut model.runs.get_mut(&run).expect("run").1;
            let index = match atoms.iter().position(|a| a.id == atom) {
                Some(index) => index,
                None => {
                    assert!(atoms.iter().all(|a| a.id < atom), "{name}: a new atom {atom} older than the run's");
                    atoms.push(ModelAtom::new(atom, agent, key, parents, None));
                    atoms.len() - 1
                }
            };
            let entry = &mut atoms[index];
            match status {
                AtomStatus::Completed => {
                    entry.output = Some(output);
                    entry.retry = false;
                }
                AtomStatus::Failed { retryable: false } => {
                    entry.failed = true;
                    entry.retry = false;
                }
                AtomStatus::Failed { retryable: true } => entry.retry = true,
                AtomStatus::Running => {}
            }
        }
        Attempt::Pin { atom, acked } => {
            if acked {
                model.pinned.push(atom);
            }
        }
        Attempt::Rollback { expected, acked, refused } => {
            let abandoned: Vec<bool> = expected.iter().map(|atom| store.atom(*atom).expect("atom").abandoned).collect();
            let all = abandoned.iter().all(|a| *a);
            let none = abandoned.iter().all(|a| !a);
            assert!(all || none, "a rollback abandons all or nothing: {expected:?} {abandoned:?}");
            assert!(!acked || all, "an acknowledged rollback is undone: {expected:?}");
            assert!(!refused || none, "a refused rollback abandoned {expected:?}");
            if all {
                for atom in model.runs.values_mut().flat_map(|(_, atoms)| atoms.iter_mut()) {
                    if expected.contains(&atom.id) {
                        atom.abandoned = true;
                    }
                }
            }
        }
        Attempt::Fork { run, agent, key, output, completed } => {
            let id = model.runs.get(&run).expect("a fork's run").0;
            let Some(atom) = store.atom_by_key(id, AGENTS[agent], &key).expect("lookup") else {
                assert!(!completed, "the fork {key}: acknowledged, then lost");
                return;
            };
            let status = store.atom(atom).expect("atom").status;
            let output = match status {
                AtomStatus::Completed => Some(output),
                AtomStatus::Running if !completed => None,
                _ => panic!("the fork {key}: {status:?} (completion acknowledged: {completed})"),
            };
            let parents = store.atom(atom).expect("the fork").parents;
            let atoms = &mut model.runs.get_mut(&run).expect("run").1;
            atoms.push(ModelAtom::new(atom, agent, key, parents, output));
        }
        Attempt::Drop { run, acked } => {
            let id = model.runs.get(&run).expect("a dropped run").0;
            if let Some(found) = store.run_id(RUNS[run]) {
                assert_eq!(found, id, "run {}", RUNS[run]);
                assert!(!acked, "run {}: an acknowledged drop is undone", RUNS[run]);
                // The operator drops it again.
                match store.finish_run(id, true, "") {
                    Ok(()) | Err(Error::RunFinished { .. }) => {}
                    Err(error) => panic!("finish {}: {error}", RUNS[run]),
                }
                std::thread::sleep(Duration::from_micros(2));
                assert_eq!(store.compact().expect("compact").runs_dropped, 1);
            }
            let (_, atoms) = model.runs.remove(&run).expect("run");
            model.dropped.extend(atoms.iter().map(|atom| atom.id));
            model.pinned.retain(|pinned| !atoms.iter().any(|atom| atom.id == *pinned));
        }
        Attempt::Nothing => {}
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
            let want = match (&atom.output, atom.failed, atom.retry) {
                (Some(_), _, _) => AtomStatus::Completed,
                (None, true, _) => AtomStatus::Failed { retryable: false },
                (None, false, true) => AtomStatus::Failed { retryable: true },
                (None, false, false) => AtomStatus::Running,
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
                // The process dies: nothing of the close that follows reaches the disk.
                sim.crash(CrashDamage::ALL[damage]);
                drop(store);
                store = open(&sim, background);
                check(&store, &model);
            }
            Action::Interrupted { ref action, after, damage } => {
                sim.halt_after(after);
                let attempt = attempt(&store, &mut model, action);
                sim.crash(CrashDamage::ALL[damage]);
                drop(store);
                store = open(&sim, background);
                reconcile(&store, &mut model, attempt);
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
