//! Continuation crash tests on the simulator: a run suspends for approval of two tool calls,
//! one is approved and one rejected, the run resumes and the approved call runs through its
//! guard; the process is crashed after every single I/O call (with three kinds of damage),
//! reopened, and the workflow continues from what the store says. Checks invariant 11: no
//! decision acknowledged before the crash is lost or changed, an acknowledged resume stays
//! resumed, the approved call happens exactly once in the outside world (counted outside the
//! store), and the rejected call never happens.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use continuum::continuation::{Continuation, ContinuationLevel, DecidedRequest, Decision, SuspendReason, Verdict};
use continuum::storage::sim::{CrashDamage, SimStorage};
use continuum::{AtomFailure, AtomOutput, Error, RunSpec, RunStatus, Store};

/// The outside world: what happened, which survives any crash of the agent.
#[derive(Default)]
struct World {
    /// Tool calls performed, by idempotency key, with the tool call id.
    effects: BTreeMap<String, (String, u32)>,
    /// Decisions acknowledged (`decide` returned), by tool call id.
    decided: BTreeMap<String, Verdict>,
    /// Whether `resume_suspended` returned.
    resumed: bool,
}

fn open(sim: &SimStorage) -> continuum::Result<Store> {
    Store::builder(Path::new("/store")).storage(Arc::new(sim.clone())).segment_bytes(8 * 1024).open()
}

/// The whole workflow, from wherever the store says it stands; stops at the first error.
fn workflow(store: &Store, world: &RefCell<World>) -> continuum::Result<()> {
    let run = store.create_run(RunSpec::new("onboarding"))?;
    let head = match store.atom_by_key(run, "account", "turn-1")? {
        Some(atom) => atom,
        None => store.record_atom(run, "account", "turn-1", &[], "", &AtomOutput::default())?,
    };
    if store.suspension(run)?.is_none() && store.resumed(run)?.is_none() {
        let tree = ContinuationLevel::new("hr").child(
            ContinuationLevel::new("account")
                .head(head)
                .request("auth-1", "authorize_account", r#"{"user":"ada"}"#)
                .request("vpn-1", "grant_vpn", r#"{"user":"ada"}"#),
        );
        store.suspend(run, &Continuation::new(SuspendReason::Approval, tree))?;
    }
    if store.suspension(run)?.is_some() {
        for (id, decision) in [("auth-1", Decision::approve("it-lead")), ("vpn-1", Decision::reject("it-lead"))] {
            store.decide(run, id, &decision)?;
            world.borrow_mut().decided.insert(id.to_owned(), decision.verdict);
        }
        store.resume_suspended(run)?;
        world.borrow_mut().resumed = true;
    }
    let resumed = store.resumed(run)?.expect("a run past its suspension has a resumption");
    for decided in resumed.decided() {
        match (run_tool(store, world, decided), decided.decision.verdict) {
            (Ok(()), Verdict::Approve) | (Err(Error::RequestRejected { .. }), Verdict::Reject) => {}
            (Err(error), _) => return Err(error),
            (Ok(()), Verdict::Reject) => panic!("a rejected call ran"),
        }
    }
    Ok(())
}

/// Runs an approved call through its guard, settling an in-doubt one through its key, as an
/// agent would with an API that accepts idempotency keys.
fn run_tool(store: &Store, world: &RefCell<World>, decided: &DecidedRequest) -> continuum::Result<()> {
    let perform = |key: &str, id: &str| {
        let mut world = world.borrow_mut();
        let entry = world.effects.entry(key.to_owned()).or_insert_with(|| (id.to_owned(), 0));
        entry.1 += 1;
        format!("done:{key}").into_bytes()
    };
    let ran = store.run_approved(decided, |call| -> Result<Vec<u8>, AtomFailure> {
        Ok(perform(call.idempotency_key, &call.decided.request.tool_call_id))
    });
    match ran {
        Ok(_) => Ok(()),
        Err(Error::GuardInDoubt { key }) => {
            let happened = world.borrow().effects.contains_key(&key);
            let result = if happened {
                format!("done:{key}").into_bytes()
            } else {
                perform(&key, &decided.request.tool_call_id)
            };
            store.resolve_guard(&key, &result)
        }
        Err(error) => Err(error),
    }
}

/// Checks that nothing acknowledged before the crash was lost: decisions (in the suspension
/// or in the resumption) and the resume.
fn assert_acknowledged_survived(store: &Store, world: &World, context: &str) {
    let Some(run) = store.run_id("onboarding") else {
        assert!(world.decided.is_empty() && !world.resumed, "{context}: the run is gone");
        return;
    };
    let recorded: BTreeMap<String, Verdict> = match store.suspension(run).expect("suspension") {
        Some(view) => {
            assert!(!world.resumed, "{context}: an acknowledged resume was lost");
            assert!(matches!(store.run_status(run), Ok(RunStatus::Suspended { .. })));
            view.decided.iter().map(|d| (d.request.tool_call_id.clone(), d.decision.verdict)).collect()
        }
        None => match store.resumed(run).expect("resumed") {
            Some(resumed) => resumed.decided().map(|d| (d.request.tool_call_id.clone(), d.decision.verdict)).collect(),
            None => BTreeMap::new(),
        },
    };
    for (id, verdict) in &world.decided {
        assert_eq!(recorded.get(id), Some(verdict), "{context}: acknowledged decision {id} was lost or changed");
    }
}

fn total_ops() -> u64 {
    let sim = SimStorage::new(0);
    let store = open(&sim).expect("open");
    let before = sim.op_count();
    workflow(&store, &RefCell::new(World::default())).expect("clean run");
    drop(store);
    sim.op_count() - before
}

#[test]
fn no_decision_is_lost_and_an_approved_call_runs_once_across_crashes() {
    let total = total_ops();
    let mut states = 0;
    for crash_at in 0..=total {
        for damage in [CrashDamage::ALL[0], CrashDamage::ALL[4], CrashDamage::ALL[8]] {
            let context = format!("crash at {crash_at} ({damage:?})");
            let world = RefCell::new(World::default());
            let sim = SimStorage::new(crash_at);
            let store = open(&sim).expect("open");
            sim.halt_after(crash_at);
            let _ = workflow(&store, &world);
            drop(store);
            sim.crash(damage);
            let store = open(&sim).unwrap_or_else(|e| panic!("{context}: reopen: {e}"));
            assert_acknowledged_survived(&store, &world.borrow(), &context);
            workflow(&store, &world).unwrap_or_else(|e| panic!("{context}: continue: {e}"));
            let world = world.borrow();
            let effects: Vec<(&str, u32)> = world.effects.values().map(|(id, n)| (id.as_str(), *n)).collect();
            assert_eq!(effects, [("auth-1", 1)], "{context}: the approved call once, the rejected one never");
            states += 1;
        }
    }
    assert!(states > 100, "only {states} crash states");
    eprintln!("continuation crash points: {states} crash states checked");
}
