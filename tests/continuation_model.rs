//! The continuation state machine against a model, over random sequences of suspensions (for
//! approval or until a time, with a random set of requests), decisions (approve or reject, by
//! one of two people, repeated and contradicted), resumes, approved calls run through their
//! guard, caller atoms, clean reopens and power losses between calls (with each kind of
//! damage). Every call is durable before it returns, so a power loss changes nothing the
//! model knows. After every action the call's answer is checked against the model, and the
//! store's view of every run: its status, its open requests, its decisions. The outside world
//! counts each approved call: never more than once, and never a rejected one.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use continuum::continuation::{Continuation, ContinuationLevel, Decision, SuspendReason, Verdict};
use continuum::storage::sim::{CrashDamage, SimStorage};
use continuum::{AtomOutput, Error, RunId, RunSpec, RunStatus, Store};
use proptest::collection::vec;
use proptest::prelude::*;

const RUNS: usize = 2;
const REQUESTS: [&str; 3] = ["a", "b", "c"];
const PEOPLE: [&str; 2] = ["ada", "bob"];

#[derive(Clone, Debug)]
enum Action {
    /// Suspend for approval of the requests in `mask` (bit i: `REQUESTS[i]`), or until a time.
    Suspend {
        run: usize,
        mask: u8,
        timer: bool,
    },
    Decide {
        run: usize,
        request: usize,
        approve: bool,
        by: usize,
    },
    Resume {
        run: usize,
    },
    /// Run the approved call of `request` from the run's newest resumption.
    RunTool {
        run: usize,
        request: usize,
    },
    /// A caller's atom.
    Atom {
        run: usize,
    },
    Reopen,
    Crash {
        damage: usize,
    },
}

fn action() -> impl Strategy<Value = Action> {
    let run = 0..RUNS;
    let request = 0..REQUESTS.len();
    prop_oneof![
        3 => (run.clone(), 0u8..8, any::<bool>()).prop_map(|(run, mask, timer)| Action::Suspend { run, mask, timer }),
        5 => (run.clone(), request.clone(), any::<bool>(), 0..PEOPLE.len())
            .prop_map(|(run, request, approve, by)| Action::Decide { run, request, approve, by }),
        3 => run.clone().prop_map(|run| Action::Resume { run }),
        2 => (run.clone(), request).prop_map(|(run, request)| Action::RunTool { run, request }),
        2 => run.prop_map(|run| Action::Atom { run }),
        1 => Just(Action::Reopen),
        1 => (0..CrashDamage::ALL.len()).prop_map(|damage| Action::Crash { damage }),
    ]
}

/// One suspension in the model.
#[derive(Clone, Debug, Default)]
struct Suspension {
    number: u64,
    requests: Vec<&'static str>,
    needs_decisions: bool,
    /// Request → (approved, by).
    decided: BTreeMap<&'static str, (bool, &'static str)>,
}

#[derive(Clone, Debug, Default)]
struct RunModel {
    suspended: Option<Suspension>,
    suspensions: u64,
    last_resumed: Option<Suspension>,
    atoms: u64,
}

struct Harness {
    sim: SimStorage,
    store: Option<Store>,
    runs: Vec<RunId>,
    model: Vec<RunModel>,
    /// Approved calls performed in the outside world, by idempotency key: (tool call id, count).
    effects: BTreeMap<String, (String, u32)>,
}

impl Harness {
    fn new() -> Self {
        let sim = SimStorage::new(7);
        let store = open(&sim);
        let runs = (0..RUNS).map(|i| store.create_run(RunSpec::new(format!("run-{i}"))).expect("run")).collect();
        Harness { sim, store: Some(store), runs, model: vec![RunModel::default(); RUNS], effects: BTreeMap::new() }
    }

    fn store(&self) -> &Store {
        self.store.as_ref().expect("open")
    }

    fn apply(&mut self, action: &Action) {
        match *action {
            Action::Suspend { run, mask, timer } => self.suspend(run, mask, timer),
            Action::Decide { run, request, approve, by } => self.decide(run, REQUESTS[request], approve, PEOPLE[by]),
            Action::Resume { run } => self.resume(run),
            Action::RunTool { run, request } => self.run_tool(run, REQUESTS[request]),
            Action::Atom { run } => self.atom(run),
            Action::Reopen => {
                drop(self.store.take());
                self.store = Some(open(&self.sim));
            }
            Action::Crash { damage } => {
                drop(self.store.take());
                self.sim.crash(CrashDamage::ALL[damage]);
                self.store = Some(open(&self.sim));
            }
        }
        self.check_all();
    }

    fn suspend(&mut self, run: usize, mask: u8, timer: bool) {
        let requests: Vec<&'static str> =
            (0..REQUESTS.len()).filter(|i| mask & (1 << i) != 0).map(|i| REQUESTS[i]).collect();
        let mut root = ContinuationLevel::new("agent");
        for id in &requests {
            root = root.request(*id, "tool", format!("{{\"id\":\"{id}\"}}"));
        }
        let reason = if timer { SuspendReason::Timer { resume_at_unix_us: 1 } } else { SuspendReason::Approval };
        let result = self.store().suspend(self.runs[run], &Continuation::new(reason, root));
        let model = &mut self.model[run];
        if !timer && requests.is_empty() {
            // Checked before anything else: nothing to approve.
            assert!(matches!(result, Err(Error::InvalidArgument { .. })), "{result:?}");
            return;
        }
        match (&model.suspended, result) {
            (Some(current), Err(Error::RunSuspended { suspension, .. })) => assert_eq!(suspension, current.number),
            (None, Ok(id)) => {
                model.suspensions += 1;
                assert_eq!(id.number, model.suspensions);
                model.suspended =
                    Some(Suspension { number: id.number, requests, needs_decisions: !timer, ..Suspension::default() });
            }
            (expected, result) => panic!("suspend: model {expected:?}, store {result:?}"),
        }
    }

    fn decide(&mut self, run: usize, request: &'static str, approve: bool, by: &'static str) {
        let decision = if approve { Decision::approve(by) } else { Decision::reject(by) };
        let result = self.store().decide(self.runs[run], request, &decision);
        let model = &mut self.model[run];
        let Some(suspension) = model.suspended.as_mut() else {
            assert!(matches!(result, Err(Error::NotSuspended { .. })), "decide unsuspended: {result:?}");
            return;
        };
        if !suspension.requests.contains(&request) {
            assert!(matches!(result, Err(Error::UnknownRequest { .. })), "decide unknown: {result:?}");
            return;
        }
        match (suspension.decided.get(request).copied(), result) {
            (Some(recorded), Ok(_)) => assert_eq!(recorded, (approve, by), "an idempotent repeat is the same"),
            (Some(recorded), Err(Error::AlreadyDecided { approved, decided_by, .. })) => {
                assert_eq!((approved, decided_by.as_str()), recorded);
                assert_ne!(recorded, (approve, by));
            }
            (None, Ok(recorded)) => {
                assert_eq!((recorded.approved(), recorded.decided_by.as_str()), (approve, by));
                suspension.decided.insert(request, (approve, by));
            }
            (expected, result) => panic!("decide: model {expected:?}, store {result:?}"),
        }
    }

    fn resume(&mut self, run: usize) {
        let result = self.store().resume_suspended(self.runs[run]);
        let model = &mut self.model[run];
        let Some(suspension) = model.suspended.clone() else {
            assert!(matches!(result, Err(Error::NotSuspended { .. })), "resume unsuspended: {result:?}");
            return;
        };
        let open: Vec<String> = suspension
            .requests
            .iter()
            .filter(|r| !suspension.decided.contains_key(*r))
            .map(|r| r.to_string())
            .collect();
        match result {
            Err(Error::UndecidedRequests { open: reported, .. }) => {
                assert!(suspension.needs_decisions);
                assert_eq!(reported, open);
            }
            Ok(resumed) => {
                assert!(!suspension.needs_decisions || open.is_empty(), "resumed with {open:?} open");
                assert_eq!(resumed.id.number, suspension.number);
                assert_eq!(resumed.levels[0].decided.len(), suspension.decided.len());
                model.suspended = None;
                model.last_resumed = Some(suspension);
            }
            Err(error) => panic!("resume: {error}"),
        }
    }

    fn run_tool(&mut self, run: usize, request: &'static str) {
        let Some(resumed) = self.store().resumed(self.runs[run]).expect("resumed") else {
            let model = &self.model[run];
            assert!(model.last_resumed.is_none() || model.suspended.is_some(), "a resumption was lost");
            return;
        };
        let expected = self.model[run].last_resumed.clone().expect("the model knows the resumption");
        assert_eq!(resumed.id.number, expected.number);
        let Some(decided) = resumed.decided().find(|d| d.request.tool_call_id == request).cloned() else {
            assert!(!expected.decided.contains_key(request));
            return;
        };
        let effects = &mut self.effects;
        let result = self.store.as_ref().expect("open").run_approved(&decided, |call| {
            let entry = effects.entry(call.idempotency_key.to_owned()).or_insert_with(|| (request.to_owned(), 0));
            entry.1 += 1;
            Ok(b"done".to_vec())
        });
        match (expected.decided[request].0, result) {
            (true, Ok(done)) => assert_eq!(done, b"done"),
            (false, Err(Error::RequestRejected { .. })) => assert_eq!(decided.decision.verdict, Verdict::Reject),
            (approved, result) => panic!("run_tool: approved {approved}, store {result:?}"),
        }
    }

    fn atom(&mut self, run: usize) {
        let model = &mut self.model[run];
        let key = format!("step-{}", model.atoms);
        let result = self.store.as_ref().expect("open").record_atom(
            self.runs[run],
            "agent",
            &key,
            &[],
            "",
            &AtomOutput::default(),
        );
        match (&model.suspended, result) {
            (Some(_), Err(Error::RunSuspended { .. })) => {}
            (None, Ok(_)) => model.atoms += 1,
            (suspended, result) => panic!("atom: model {suspended:?}, store {result:?}"),
        }
    }

    /// The store's view of every run against the model, and the outside world's counts.
    fn check_all(&self) {
        for (run, model) in self.runs.iter().zip(&self.model) {
            let status = self.store().run_status(*run).expect("status");
            let view = self.store().suspension(*run).expect("view");
            match (&model.suspended, view) {
                (None, None) => assert_eq!(status, RunStatus::Running),
                (Some(expected), Some(view)) => {
                    assert!(matches!(status, RunStatus::Suspended { .. }), "{status:?}");
                    assert_eq!(view.id.number, expected.number);
                    let open: Vec<&str> = view.pending.iter().map(|p| p.tool_call_id.as_str()).collect();
                    let model_open: Vec<&str> =
                        expected.requests.iter().copied().filter(|r| !expected.decided.contains_key(r)).collect();
                    assert_eq!(open, model_open);
                    let decided: BTreeMap<&str, (bool, &str)> = view
                        .decided
                        .iter()
                        .map(|d| {
                            (d.request.tool_call_id.as_str(), (d.decision.approved(), d.decision.decided_by.as_str()))
                        })
                        .collect();
                    assert_eq!(decided, expected.decided);
                }
                (expected, view) => panic!("model {expected:?}, store {view:?}"),
            }
        }
        for (key, (request, count)) in &self.effects {
            assert_eq!(*count, 1, "{request} ({key}) ran {count} times");
        }
    }
}

fn open(sim: &SimStorage) -> Store {
    Store::builder(Path::new("/store")).storage(Arc::new(sim.clone())).segment_bytes(8 * 1024).open().expect("open")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn continuations_follow_the_model_across_crashes(actions in vec(action(), 1..50)) {
        let mut harness = Harness::new();
        for action in &actions {
            harness.apply(action);
        }
    }
}
