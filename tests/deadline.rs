//! `Store::run_with_deadline`: work that stops at an atom boundary ahead of a hard deadline
//! leaves its run suspended with reason `Deadline` and the agents' heads, durably; work that
//! finishes or fails leaves the run as it was.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use continuum::continuation::{
    ContinuationLevel, DEADLINE_ROOT, DeadlineOutcome, DeadlineStep, ReasonKind, SuspendReason, SuspendedFilter,
};
use continuum::{AtomOutput, Error, RunSpec, RunStatus, Store};

fn output(step: u32) -> AtomOutput {
    AtomOutput { result: format!("step {step}").into_bytes(), ..AtomOutput::default() }
}

#[test]
fn work_that_stops_for_the_deadline_leaves_the_run_suspended_at_its_agents_heads_across_a_reopen() {
    let dir = tempfile::tempdir().expect("dir");
    let deadline = SystemTime::now() + Duration::from_millis(400);
    let buffer = Duration::from_millis(250);
    let (run, heads) = {
        let store = Store::open(dir.path()).expect("open");
        let run = store.create_run(RunSpec::new("spot-job")).expect("run");
        let mut heads = Vec::new();
        let outcome = store
            .run_with_deadline(run, deadline, buffer, |watch| {
                for step in 0..1_000 {
                    if watch.expired() {
                        return Ok(DeadlineStep::Stopped(None));
                    }
                    for agent in ["planner", "coder"] {
                        let parents: Vec<_> = store.last_agent_atom(run, agent).into_iter().collect();
                        let key = format!("step-{step}");
                        heads.push(store.record_atom(run, agent, &key, &parents, "", &output(step))?);
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                Ok(DeadlineStep::Done(()))
            })
            .expect("run with deadline");
        assert!(matches!(outcome, DeadlineOutcome::Suspended(_)), "{outcome:?}");
        assert!(SystemTime::now() < deadline, "it stopped ahead of the deadline");
        (run, heads)
    };
    let store = Store::open(dir.path()).expect("reopen");
    let at_unix_us = u64::try_from(deadline.duration_since(UNIX_EPOCH).expect("epoch").as_micros()).expect("u64");
    match store.run_status(run).expect("status") {
        RunStatus::Suspended { reason, .. } => assert_eq!(reason, SuspendReason::Deadline { at_unix_us }),
        other => panic!("not suspended: {other:?}"),
    }
    let listed = store.suspended_runs(&SuspendedFilter { reason: Some(ReasonKind::Deadline), ..Default::default() });
    assert_eq!(listed.len(), 1);
    let root = &listed[0].root;
    assert_eq!(root.agent, DEADLINE_ROOT);
    let children: Vec<_> = root.children.iter().map(|level| (level.agent.as_str(), level.head)).collect();
    let newest = |agent: &str| store.last_agent_atom(run, agent);
    assert_eq!(children, [("planner", newest("planner")), ("coder", newest("coder"))]);
    assert_eq!(newest("coder"), heads.last().copied(), "the heads are the newest atoms");
    let resumed = store.resume_suspended(run).expect("a deadline needs no decision");
    assert_eq!(resumed.heads().len(), 2);
    assert_eq!(store.run_status(run).expect("status"), RunStatus::Running);
}

#[test]
fn work_that_finishes_or_fails_leaves_the_run_running_and_a_given_tree_is_the_one_suspended() {
    let dir = tempfile::tempdir().expect("dir");
    let store = Store::open(dir.path()).expect("open");
    let run = store.create_run(RunSpec::new("job")).expect("run");
    let far = SystemTime::now() + Duration::from_secs(3600);
    let done = store.run_with_deadline(run, far, Duration::from_secs(60), |watch| {
        assert!(!watch.expired() && watch.remaining() > Duration::from_secs(3000));
        store.record_atom(run, "worker", "only", &[], "", &output(0))?;
        Ok(DeadlineStep::Done(7))
    });
    assert_eq!(done.expect("done"), DeadlineOutcome::Finished(7));
    assert_eq!(store.run_status(run).expect("status"), RunStatus::Running);

    let failed = store.run_with_deadline(run, far, Duration::ZERO, |_| -> continuum::Result<DeadlineStep<()>> {
        Err(Error::InvalidArgument { reason: "the work's own error".into() })
    });
    assert!(matches!(failed, Err(Error::InvalidArgument { .. })), "{failed:?}");
    assert_eq!(store.run_status(run).expect("status"), RunStatus::Running, "a failed work suspends nothing");

    // A deadline already within the buffer: the watch is expired from the start.
    let head = store.last_agent_atom(run, "worker").expect("head");
    let tree = ContinuationLevel::new("worker").head(head);
    let stopped = store
        .run_with_deadline(run, SystemTime::now(), Duration::from_secs(1), |watch| {
            assert!(watch.expired());
            Ok(DeadlineStep::<()>::Stopped(Some(tree.clone())))
        })
        .expect("stopped");
    assert!(matches!(stopped, DeadlineOutcome::Suspended(_)));
    let suspended = store.suspension(run).expect("read").expect("suspended");
    assert_eq!((suspended.root.agent.as_str(), suspended.root.head), ("worker", Some(head)));
    let before_epoch = UNIX_EPOCH - Duration::from_secs(1);
    let refused = store.run_with_deadline(run, before_epoch, Duration::ZERO, |_| Ok(DeadlineStep::Done(())));
    assert!(matches!(refused, Err(Error::InvalidArgument { .. })), "{refused:?}");
}
