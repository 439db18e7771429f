//! Continuations through the public API: a nested three-level tree (hr → account →
//! authorize_account) suspends, its flattened pending list is right, decisions land on their
//! level, resume returns each level, across a reopen; bad input (another run's request,
//! resuming a run that is not suspended, suspending twice, empty and oversized fields) gives
//! typed errors, writes nothing and leaves the store usable; a suspended run takes no atoms,
//! rollbacks or forks; timers are due once their time passes; the table of suspended runs
//! survives reopen, rollback and fork; a suspension survives retention and compaction around
//! it; concurrent suspends and decisions of one run take effect once.

use continuum::continuation::{
    Continuation, ContinuationLevel, Decision, ReasonKind, SuspendReason, SuspendedFilter, Verdict,
};
use continuum::limits::{CONTINUATION_NAME_BYTES_MAX, CONTINUATION_TEXT_BYTES_MAX};
use continuum::{AtomId, AtomOutput, Error, RunId, RunSpec, RunStatus, Store};

/// A run of the talk's scenario: hr and account each have a turn; account's sub-agent
/// authorize_account asks to run two tools, hr asks one itself.
fn talk_run(store: &Store, name: &str) -> (RunId, [AtomId; 3]) {
    let run = store.create_run(RunSpec::new(name)).expect("run");
    let out = AtomOutput::default();
    let hr = store.record_atom(run, "hr", "turn-1", &[], "", &out).expect("hr");
    let account = store.record_atom(run, "account", "turn-1", &[hr], "", &out).expect("account");
    let authorize = store.record_atom(run, "authorize_account", "turn-1", &[account], "", &out).expect("authorize");
    (run, [hr, account, authorize])
}

fn talk_tree([hr, account, authorize]: [AtomId; 3]) -> ContinuationLevel {
    ContinuationLevel::new("hr").head(hr).request("hr-1", "send_welcome", r#"{"to":"ada"}"#).child(
        ContinuationLevel::new("account").head(account).child(
            ContinuationLevel::new("authorize_account")
                .head(authorize)
                .request("auth-1", "authorize_account", r#"{"user":"ada","role":"admin"}"#)
                .request("auth-2", "grant_vpn", r#"{"user":"ada"}"#),
        ),
    )
}

fn records(store: &Store) -> u64 {
    store.log().next_lsn().get()
}

#[test]
fn a_nested_tree_suspends_flattens_decides_by_level_and_resumes_after_reopen() {
    let dir = tempfile::tempdir().expect("dir");
    let (run, heads) = {
        let store = Store::open(dir.path()).expect("open");
        let (run, heads) = talk_run(&store, "onboarding");
        let id = store.suspend(run, &Continuation::new(SuspendReason::Approval, talk_tree(heads))).expect("suspend");
        assert_eq!((id.run, id.number), (run, 1));
        let pending = store.pending(run).expect("pending");
        let flat: Vec<(&str, Vec<&str>)> =
            pending.iter().map(|p| (p.tool_call_id.as_str(), p.path.iter().map(String::as_str).collect())).collect();
        assert_eq!(
            flat,
            [
                ("hr-1", vec!["hr"]),
                ("auth-1", vec!["hr", "account", "authorize_account"]),
                ("auth-2", vec!["hr", "account", "authorize_account"]),
            ]
        );
        store
            .decide(run, "auth-1", &Decision::approve("it-lead").edited_arguments(r#"{"user":"ada","role":"user"}"#))
            .expect("decide");
        (run, heads)
    };
    // Every process exited; another one decides the rest and resumes.
    let store = Store::open(dir.path()).expect("reopen");
    assert!(matches!(store.run_status(run), Ok(RunStatus::Suspended { reason: SuspendReason::Approval, .. })));
    let open: Vec<String> = store.pending(run).expect("pending").into_iter().map(|p| p.tool_call_id).collect();
    assert_eq!(open, ["hr-1", "auth-2"], "the decision survived the reopen");
    match store.resume_suspended(run) {
        Err(Error::UndecidedRequests { open, .. }) => assert_eq!(open, ["hr-1", "auth-2"]),
        other => panic!("resumed with undecided requests: {other:?}"),
    }
    store.decide(run, "hr-1", &Decision::approve("hr-lead")).expect("decide");
    store.decide(run, "auth-2", &Decision::reject("it-lead").message("no VPN for new hires")).expect("decide");
    let view = store.suspension(run).expect("view").expect("suspended");
    let authorize_level = &view.root.children[0].children[0];
    let processed: Vec<&str> = authorize_level.processed.iter().map(|d| d.request.tool_call_id.as_str()).collect();
    assert_eq!(processed, ["auth-1", "auth-2"], "decisions land on their level");
    assert_eq!(view.root.processed.len(), 1);
    assert!(view.root.children[0].processed.is_empty());

    let resumed = store.resume_suspended(run).expect("resume");
    assert_eq!(store.run_status(run).expect("status"), RunStatus::Running);
    let paths: Vec<Vec<String>> = resumed.levels.iter().map(|l| l.path.clone()).collect();
    assert_eq!(paths.len(), 3);
    assert_eq!(resumed.levels.iter().map(|l| l.head).collect::<Vec<_>>(), heads.map(Some));
    let authorize = resumed.level(&["hr", "account", "authorize_account"]).expect("level");
    assert_eq!(authorize.decided[0].arguments(), r#"{"user":"ada","role":"user"}"#);
    assert_eq!(authorize.decided[1].decision.verdict, Verdict::Reject);
    assert_eq!(store.resumed(run).expect("resumed"), Some(resumed.clone()), "the resume reads back the same");
    // Each agent continues from its head: the contexts rebuild and the run takes atoms again.
    assert_eq!(resumed.heads(), heads);
    assert!(store.rebuild_contexts(&resumed.heads()).into_iter().all(|rebuilt| rebuilt.is_ok()));
    store.record_atom(run, "authorize_account", "turn-2", &[heads[2]], "", &AtomOutput::default()).expect("atom");
    drop(store);
    let store = Store::open(dir.path()).expect("reopen");
    assert_eq!(store.run_status(run).expect("status"), RunStatus::Running, "the resume survived the reopen");
    assert_eq!(store.resumed(run).expect("resumed"), Some(resumed));
}

#[test]
fn an_approved_call_runs_once_a_rejected_one_never() {
    let dir = tempfile::tempdir().expect("dir");
    let store = Store::open(dir.path()).expect("open");
    let (run, heads) = talk_run(&store, "onboarding");
    store.suspend(run, &Continuation::new(SuspendReason::Approval, talk_tree(heads))).expect("suspend");
    store.decide(run, "hr-1", &Decision::approve("a")).expect("decide");
    store.decide(run, "auth-1", &Decision::approve("a")).expect("decide");
    store.decide(run, "auth-2", &Decision::reject("a")).expect("decide");
    let view = store.suspension(run).expect("view").expect("suspended");
    let early = view.decided.iter().find(|d| d.request.tool_call_id == "auth-1").expect("decided").clone();
    assert!(matches!(store.run_approved(&early, |_| Ok(Vec::new())), Err(Error::RunSuspended { .. })));
    let resumed = store.resume_suspended(run).expect("resume");
    let mut ran = Vec::new();
    for decided in resumed.decided() {
        for _ in 0..2 {
            let result = store.run_approved(decided, |call| {
                ran.push((call.decided.request.tool_call_id.clone(), call.idempotency_key.to_owned()));
                Ok(b"done".to_vec())
            });
            match decided.decision.verdict {
                Verdict::Approve => assert_eq!(result.expect("approved"), b"done"),
                Verdict::Reject => assert!(matches!(result, Err(Error::RequestRejected { .. }))),
            }
        }
    }
    let ids: Vec<&str> = ran.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["hr-1", "auth-1"], "each approved call once, the rejected one never");
    assert_eq!(ran[1].1, store.approved_call_key(&early).expect("key"));
}

#[test]
fn bad_input_gives_typed_errors_writes_nothing_and_leaves_the_store_usable() {
    let dir = tempfile::tempdir().expect("dir");
    let store = Store::open(dir.path()).expect("open");
    let (run, heads) = talk_run(&store, "one");
    let (other, other_heads) = talk_run(&store, "two");
    let before = records(&store);
    let approval = |root| Continuation::new(SuspendReason::Approval, root);
    // Not suspended yet.
    assert!(matches!(store.resume_suspended(run), Err(Error::NotSuspended { .. })));
    assert!(matches!(store.decide(run, "hr-1", &Decision::approve("a")), Err(Error::NotSuspended { .. })));
    assert!(matches!(store.resume_suspended(RunId::from_raw(99)), Err(Error::UnknownRun { .. })));
    // Malformed continuations.
    let long_name = "x".repeat(CONTINUATION_NAME_BYTES_MAX + 1);
    let long_text = "x".repeat(CONTINUATION_TEXT_BYTES_MAX + 1);
    let refused = [
        store.suspend(run, &approval(ContinuationLevel::new(""))),
        store.suspend(run, &approval(ContinuationLevel::new("hr"))),
        store.suspend(run, &approval(ContinuationLevel::new("hr").request("", "t", "{}"))),
        store.suspend(run, &approval(ContinuationLevel::new("hr").request("a", "t", "{}").request("a", "t", "{}"))),
        store.suspend(run, &approval(ContinuationLevel::new(long_name.clone()).request("a", "t", "{}"))),
        store.suspend(run, &approval(ContinuationLevel::new("hr").request("a", "t", long_text.clone()))),
        store.suspend(run, &approval(ContinuationLevel::new("hr").head(other_heads[0]).request("a", "t", "{}"))),
        store.suspend(run, &approval(ContinuationLevel::new("hr").head(heads[1]).request("a", "t", "{}"))),
        store.suspend(run, &approval(ContinuationLevel::new("hr").head(AtomId::from_raw(999)).request("a", "t", "{}"))),
        store.suspend(
            run,
            &Continuation::new(SuspendReason::Budget { what: String::new() }, ContinuationLevel::new("hr")),
        ),
    ];
    for (i, result) in refused.into_iter().enumerate() {
        assert!(
            matches!(result, Err(Error::InvalidArgument { .. } | Error::LimitExceeded { .. })),
            "case {i}: {result:?}"
        );
    }
    let mut deep = ContinuationLevel::new("leaf").request("a", "t", "{}");
    for _ in 0..continuum::limits::CONTINUATION_DEPTH_MAX {
        deep = ContinuationLevel::new("level").child(deep);
    }
    assert!(matches!(store.suspend(run, &approval(deep)), Err(Error::LimitExceeded { .. })));
    assert_eq!(records(&store), before, "nothing was written");
    assert_eq!(store.run_status(run).expect("status"), RunStatus::Running);

    store.suspend(run, &approval(talk_tree(heads))).expect("suspend");
    store.suspend(other, &approval(talk_tree(other_heads))).expect("suspend the other");
    let after_suspend = records(&store);
    // Suspending twice, deciding unknown requests or badly.
    assert!(matches!(store.suspend(run, &approval(talk_tree(heads))), Err(Error::RunSuspended { suspension: 1, .. })));
    assert!(matches!(store.decide(run, "nope", &Decision::approve("a")), Err(Error::UnknownRequest { .. })));
    assert!(matches!(store.decide(run, "", &Decision::approve("a")), Err(Error::InvalidArgument { .. })));
    assert!(matches!(store.decide(run, "hr-1", &Decision::approve("")), Err(Error::InvalidArgument { .. })));
    let bad = Decision::reject("a").edited_arguments("{}");
    assert!(matches!(store.decide(run, "hr-1", &bad), Err(Error::InvalidArgument { .. })));
    let long = Decision::approve("a").message(long_text);
    assert!(matches!(store.decide(run, "hr-1", &long), Err(Error::LimitExceeded { .. })));
    assert_eq!(records(&store), after_suspend, "nothing was written");
    // A request of another run: both trees hold "hr-1"; deciding it in one leaves the other open.
    store.decide(other, "hr-1", &Decision::approve("a")).expect("decide other");
    assert_eq!(store.pending(run).expect("pending").len(), 3);
    let only_other = ContinuationLevel::new("x").request("only-other", "t", "{}");
    let third = store.create_run(RunSpec::new("three")).expect("run");
    store.suspend(third, &approval(only_other)).expect("suspend");
    assert!(matches!(store.decide(run, "only-other", &Decision::approve("a")), Err(Error::UnknownRequest { .. })));
    // Deciding again: the same decision is idempotent, another is refused.
    let first = store.decide(run, "hr-1", &Decision::reject("b").message("no")).expect("decide");
    let written = records(&store);
    assert_eq!(store.decide(run, "hr-1", &Decision::reject("b").message("no")).expect("again"), first);
    assert!(matches!(
        store.decide(run, "hr-1", &Decision::approve("b")),
        Err(Error::AlreadyDecided { approved: false, .. })
    ));
    assert_eq!(records(&store), written, "an idempotent or refused decision writes nothing");
    // Still usable: the rest resumes.
    store.decide(run, "auth-1", &Decision::approve("a")).expect("decide");
    store.decide(run, "auth-2", &Decision::approve("a")).expect("decide");
    store.resume_suspended(run).expect("resume");
    assert!(matches!(store.resume_suspended(run), Err(Error::NotSuspended { .. })));
}

#[test]
fn a_suspended_run_takes_no_atoms_rollbacks_or_forks_until_resumed() {
    let dir = tempfile::tempdir().expect("dir");
    let store = Store::open(dir.path()).expect("open");
    let (run, heads) = talk_run(&store, "paused");
    let turn2 = store.record_atom(run, "hr", "turn-2", &[heads[0]], "", &AtomOutput::default()).expect("atom");
    let in_flight = store.begin_atom(run, "account", "turn-2", &[heads[1]], "").expect("begin");
    let wait = SuspendReason::Requested { by: "operator".into() };
    store.suspend(run, &Continuation::new(wait, ContinuationLevel::new("hr").head(turn2))).expect("suspend");
    let out = AtomOutput::default();
    store.complete_atom(in_flight, &out).expect("an atom begun before the suspension completes");
    let suspended = |result: continuum::Result<AtomId>| matches!(result, Err(Error::RunSuspended { .. }));
    assert!(suspended(store.record_atom(run, "hr", "turn-3", &[turn2], "", &out)));
    assert!(suspended(store.begin_atom(run, "hr", "turn-3", &[turn2], "")));
    assert!(suspended(store.execute(run, "hr", "turn-3", &[turn2], |_| Ok(out.clone())).map(|e| e.atom)));
    assert!(suspended(store.fork(run, "hr", heads[0], "turn-2b")));
    assert!(matches!(store.rollback(run, "hr", heads[0], "undo"), Err(Error::RunSuspended { .. })));
    assert!(matches!(
        store.rollback(run, continuum::continuation::CONTINUATION_AGENT, heads[0], "undo"),
        Err(Error::InvalidArgument { .. })
    ));
    // Other runs go on.
    let (other, _) = talk_run(&store, "busy");
    assert_eq!(store.run_status(other).expect("status"), RunStatus::Running);
    // A request needs no decision: it resumes at once, and everything works again.
    let resumed = store.resume_suspended(run).expect("resume");
    assert!(resumed.levels[0].decided.is_empty());
    store.rollback(run, "hr", heads[0], "undo").expect("rollback");
    let fork = store.fork(run, "hr", heads[0], "turn-2b").expect("fork");
    store.complete_atom(fork, &out).expect("complete");
    // Suspended again after the rollback and fork: the table follows, across a reopen.
    let id = store
        .suspend(
            run,
            &Continuation::new(
                SuspendReason::Approval,
                ContinuationLevel::new("hr").head(fork).request("c", "t", "{}"),
            ),
        )
        .expect("suspend again");
    assert_eq!(id.number, 2);
    drop(store);
    let store = Store::open(dir.path()).expect("reopen");
    let view = store.suspension(run).expect("view").expect("suspended after reopen");
    assert_eq!((view.id, view.root.head), (id, Some(fork)));
    assert!(store.record_atom(run, "hr", "turn-9", &[fork], "", &out).is_err());
    store.decide(run, "c", &Decision::approve("a")).expect("decide");
    assert_eq!(store.resume_suspended(run).expect("resume").id.number, 2);
}

#[test]
fn finding_work_filters_by_reason_and_age_and_timers_fall_due() {
    let dir = tempfile::tempdir().expect("dir");
    let store = Store::open(dir.path()).expect("open");
    let reasons = [
        SuspendReason::Approval,
        SuspendReason::Timer { resume_at_unix_us: 2_000 },
        SuspendReason::Timer { resume_at_unix_us: 1_000 },
        SuspendReason::Budget { what: "tokens".into() },
        SuspendReason::Deadline { at_unix_us: 5 },
    ];
    for (i, reason) in reasons.iter().enumerate() {
        let run = store.create_run(RunSpec::new(format!("r{i}"))).expect("run");
        let root = ContinuationLevel::new("a").request(format!("c{i}"), "t", "{}");
        store.suspend(run, &Continuation::new(reason.clone(), root)).expect("suspend");
    }
    store.create_run(RunSpec::new("running")).expect("run");
    let names =
        |runs: Vec<continuum::continuation::SuspendedRun>| runs.into_iter().map(|r| r.run_name).collect::<Vec<_>>();
    assert_eq!(names(store.suspended_runs(&SuspendedFilter::default())), ["r0", "r1", "r2", "r3", "r4"]);
    let timers = SuspendedFilter { reason: Some(ReasonKind::Timer), ..SuspendedFilter::default() };
    assert_eq!(names(store.suspended_runs(&timers)), ["r1", "r2"]);
    let limited = SuspendedFilter { limit: Some(2), ..SuspendedFilter::default() };
    assert_eq!(names(store.suspended_runs(&limited)), ["r0", "r1"]);
    let ancient = SuspendedFilter { suspended_before_unix_us: Some(1), ..SuspendedFilter::default() };
    assert!(store.suspended_runs(&ancient).is_empty());
    assert!(store.due(999).is_empty());
    assert_eq!(names(store.due(1_500)), ["r2"]);
    assert_eq!(names(store.due(u64::MAX)), ["r2", "r1"], "earliest first");
    // A due timer resumes without decisions; a finished run leaves the table.
    store.resume_suspended(store.run_id("r2").expect("r2")).expect("resume");
    store.finish_run(store.run_id("r1").expect("r1"), false, "gave up").expect("finish");
    assert!(store.due(u64::MAX).is_empty());
    drop(store);
    let store = Store::open(dir.path()).expect("reopen");
    assert_eq!(names(store.suspended_runs(&SuspendedFilter::default())), ["r0", "r3", "r4"]);
    let read_only = Store::open_read_only(dir.path());
    drop(read_only);
}

#[test]
fn metrics_count_suspensions_decisions_and_resumes() {
    let dir = tempfile::tempdir().expect("dir");
    let store = Store::open(dir.path()).expect("open");
    let (run, heads) = talk_run(&store, "m");
    store.suspend(run, &Continuation::new(SuspendReason::Approval, talk_tree(heads))).expect("suspend");
    for id in ["hr-1", "auth-1", "auth-2"] {
        store.decide(run, id, &Decision::approve("a")).expect("decide");
    }
    store.decide(run, "hr-1", &Decision::approve("a")).expect("idempotent");
    std::thread::sleep(std::time::Duration::from_millis(2));
    store.resume_suspended(run).expect("resume");
    let metrics = store.metrics();
    assert_eq!((metrics.suspensions, metrics.decisions, metrics.resumes), (1, 3, 1));
    assert_eq!(metrics.suspended_ns.count, 1);
    assert!(metrics.suspended_ns.sum >= 2_000_000, "suspended at least 2 ms: {:?}", metrics.suspended_ns);
    assert_eq!(metrics.suspension_resume_ns.count, 1);
}

#[test]
fn a_suspension_and_its_decisions_survive_retention_and_compaction() {
    use continuum::synthetic::Transcript;
    use continuum::{RetentionPolicy, SnapshotPolicy};
    let dir = tempfile::tempdir().expect("dir");
    let open = || {
        Store::builder(dir.path())
            .segment_bytes(8 * 1024)
            .background(false)
            .snapshot_policy(SnapshotPolicy { every_atoms: 10, every: std::time::Duration::from_secs(3600) })
            .retention(RetentionPolicy { snapshots_per_agent: 1, finished_run_age: Some(std::time::Duration::ZERO) })
            .open()
            .expect("open")
    };
    let store = open();
    let chain = |store: &Store, run: RunId, agent: &str, atoms: u64| {
        let mut parents = Vec::new();
        for step in 0..atoms {
            let output = AtomOutput { delta: Transcript::new(step).next_delta(300), result: vec![step as u8] };
            parents = vec![store.record_atom(run, agent, &format!("s{step}"), &parents, "", &output).expect("atom")];
        }
        parents[0]
    };
    let old = store.create_run(RunSpec::new("old")).expect("run");
    let waiting = store.create_run(RunSpec::new("waiting")).expect("run");
    chain(&store, old, "worker", 30);
    let head = chain(&store, waiting, "account", 25);
    let tree = ContinuationLevel::new("account").head(head).request("a", "t", "{}").request("b", "t", "{}");
    let id = store.suspend(waiting, &Continuation::new(SuspendReason::Approval, tree)).expect("suspend");
    store.decide(waiting, "a", &Decision::approve("ada")).expect("decide");
    chain(&store, old, "worker-2", 30);
    store.finish_run(old, true, "done").expect("finish");
    let report = store.compact().expect("compact");
    assert_eq!(report.runs_dropped, 1, "{report:?}");
    let check = |store: &Store| {
        let view = store.suspension(waiting).expect("view").expect("still suspended");
        assert_eq!(view.id, id);
        assert_eq!(view.decided.len(), 1);
        assert_eq!(view.pending[0].tool_call_id, "b");
        store.rebuild_context(head).expect("the head rebuilds");
    };
    check(&store);
    drop(store);
    let store = open();
    check(&store);
    store.decide(waiting, "b", &Decision::reject("ada")).expect("decide");
    let resumed = store.resume_suspended(waiting).expect("resume");
    let approved = resumed.decided().find(|d| d.decision.approved()).expect("approved");
    assert_eq!(store.run_approved(approved, |_| Ok(b"ran".to_vec())).expect("run"), b"ran");
}

#[test]
fn concurrent_suspends_and_decisions_of_one_run_take_effect_once() {
    let dir = tempfile::tempdir().expect("dir");
    let store = Store::open(dir.path()).expect("open");
    let run = store.create_run(RunSpec::new("race")).expect("run");
    let tree = || ContinuationLevel::new("agent").request("call", "pay", "{}");
    let suspended: Vec<bool> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..8)
            .map(|_| scope.spawn(|| store.suspend(run, &Continuation::new(SuspendReason::Approval, tree())).is_ok()))
            .collect();
        threads.into_iter().map(|t| t.join().expect("thread")).collect()
    });
    assert_eq!(suspended.iter().filter(|ok| **ok).count(), 1, "one suspension wins");
    let verdicts: Vec<Result<Decision, Error>> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let store = &store;
                scope.spawn(move || {
                    let decision =
                        if i % 2 == 0 { Decision::approve(format!("p{i}")) } else { Decision::reject(format!("p{i}")) };
                    store.decide(run, "call", &decision)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().expect("thread")).collect()
    });
    assert_eq!(verdicts.iter().filter(|v| v.is_ok()).count(), 1, "one decision wins: {verdicts:?}");
    assert!(verdicts.iter().filter_map(|v| v.as_ref().err()).all(|e| matches!(e, Error::AlreadyDecided { .. })));
    let decided = store.suspension(run).expect("view").expect("suspended").decided;
    assert_eq!(decided.len(), 1);
    assert_eq!(Some(&decided[0].decision), verdicts.iter().find_map(|v| v.as_ref().ok()));
    assert_eq!(store.metrics().decisions, 1);
}

#[test]
fn with_buffered_atoms_an_acknowledged_suspension_and_decision_survive_a_power_loss() {
    use continuum::Durability;
    use continuum::storage::sim::{CrashDamage, SimStorage};
    let sim = SimStorage::new(3);
    let open = || {
        Store::builder(std::path::Path::new("/store"))
            .storage(std::sync::Arc::new(sim.process()))
            .atom_durability(Durability::Buffered)
            .flush_interval(std::time::Duration::from_secs(3600))
            .index_snapshot_after(u64::MAX)
            .background(false)
            .open()
            .expect("open")
    };
    let store = open();
    let run = store.create_run(RunSpec::new("buffered")).expect("run");
    let other = store.create_run(RunSpec::new("other")).expect("run");
    let tree = ContinuationLevel::new("agent").request("a", "t", "{}").request("b", "t", "{}");
    store.suspend(run, &Continuation::new(SuspendReason::Approval, tree)).expect("suspend");
    store.decide(run, "a", &Decision::approve("ada")).expect("decide");
    // An atom of another run after them, buffered: the power loss takes it, never them.
    store.record_atom(other, "agent", "s", &[], "", &AtomOutput::default()).expect("atom");
    sim.crash(CrashDamage::ALL[0]);
    drop(store);
    let store = open();
    assert!(store.run_atoms(other).is_empty(), "the power loss took the buffered atom");
    let view = store.suspension(run).expect("view").expect("the suspension survived");
    assert_eq!(view.decided.len(), 1, "the decision survived");
    store.decide(run, "b", &Decision::approve("ada")).expect("decide");
    store.resume_suspended(run).expect("resume");
    sim.crash(CrashDamage::ALL[0]);
    drop(store);
    assert_eq!(open().run_status(run).expect("status"), RunStatus::Running, "the resume survived");
}
