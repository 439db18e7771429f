//! Fork and rollback: a reviewer says "go back to step 6 and try again". A fork starts a new
//! branch from a completed atom while the old one stays readable; a rollback abandons the
//! atoms after a point so the agent continues from it, re-running those steps as new atoms,
//! across reopen. Guards against abandoned work leaking into the new branch's context.

use std::cell::Cell;

use continuum::synthetic::Transcript;
use continuum::{AtomFailure, AtomId, AtomOutput, Context, Error, RunSpec, Store};

fn output(step: u64) -> AtomOutput {
    AtomOutput { delta: Transcript::new(step).next_delta(200), result: step.to_le_bytes().to_vec() }
}

fn fold(steps: &[u64]) -> Vec<u8> {
    let mut context = Context::new();
    for step in steps {
        context.apply(&output(*step).delta);
    }
    context.encode()
}

/// A chain of ten completed steps s0..s9 of agent "a".
fn chain(store: &Store) -> (continuum::RunId, Vec<AtomId>) {
    let run = store.create_run(RunSpec::new("review")).expect("run");
    let mut ids: Vec<AtomId> = Vec::new();
    for step in 0..10u64 {
        let parents: Vec<AtomId> = ids.last().copied().into_iter().collect();
        let executed = store.execute(run, "a", &format!("s{step}"), &parents, |_| Ok(output(step))).expect("execute");
        ids.push(executed.atom);
    }
    (run, ids)
}

#[test]
fn independent_branches_rebuild_in_parallel_exactly_as_one_by_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let (run, ids) = chain(&store);
    // Three branches off the chain, each a few atoms long, and a second agent's own chain.
    let mut heads = vec![ids[9]];
    for (from, base) in [(2usize, 200u64), (5, 300), (7, 400)] {
        let mut parent = store.fork(run, "a", ids[from], &format!("fork-{base}")).expect("fork");
        store.complete_atom(parent, &output(base)).expect("complete");
        for step in 1..4 {
            let next = store.begin_atom(run, "a", &format!("fork-{base}-{step}"), &[parent], "").expect("begin");
            store.complete_atom(next, &output(base + step)).expect("complete");
            parent = next;
        }
        heads.push(parent);
    }
    let mut parent: Vec<AtomId> = Vec::new();
    for step in 500..520u64 {
        let executed = store.execute(run, "b", &format!("b{step}"), &parent, |_| Ok(output(step))).expect("execute");
        parent = vec![executed.atom];
    }
    heads.extend(parent);
    heads.push(ids[3]);
    let together = store.rebuild_contexts(&heads);
    assert_eq!(together.len(), heads.len());
    for (head, rebuilt) in heads.iter().zip(together) {
        let alone = store.rebuild_context(*head).expect("rebuild alone");
        assert_eq!(rebuilt.expect("rebuild together").context.encode(), alone.context.encode(), "{head:?}");
    }
    assert_eq!(
        store.rebuild_contexts(&heads[1..2])[0].as_ref().expect("fork head").context.encode(),
        fold(&[0, 1, 2, 200, 201, 202, 203])
    );
    let unknown = store.rebuild_contexts(&[AtomId::from_raw(999_999)]);
    assert!(matches!(unknown[0], Err(Error::UnknownAtom { .. })));
}

#[test]
fn a_fork_branches_from_a_completed_atom_and_the_old_branch_stays_readable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let (run, ids) = chain(&store);
    let fork = store.fork(run, "a", ids[6], "s7-retry").expect("fork");
    store.complete_atom(fork, &output(100)).expect("complete");
    assert_eq!(store.rebuild_context(fork).expect("new branch").context.encode(), fold(&[0, 1, 2, 3, 4, 5, 6, 100]));
    assert_eq!(store.rebuild_context(ids[9]).expect("old branch").context.encode(), fold(&(0..10).collect::<Vec<_>>()));
    let running = store.begin_atom(run, "a", "unfinished", &[], "").expect("begin");
    assert!(matches!(store.fork(run, "a", running, "x"), Err(Error::InvalidParent { .. })));
}

#[test]
fn a_rollback_abandons_later_atoms_and_the_agent_reruns_those_steps() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (run, ids) = {
        let store = Store::open(dir.path()).expect("open");
        let (run, ids) = chain(&store);
        let abandoned = store.rollback(run, "a", ids[6], "reviewer: redo from step 7").expect("rollback");
        assert_eq!(abandoned, ids[7..].to_vec());
        (run, ids)
    };
    // After reopen the rollback still holds (it is in the log).
    let store = Store::open(dir.path()).expect("reopen");
    assert!(store.atom(ids[8]).expect("readable").abandoned);
    assert!(!store.atom(ids[6]).expect("kept").abandoned);
    let report = store.resume(run).expect("resume");
    assert_eq!(report.agents[0].last_completed, Some(ids[6]));
    assert!(matches!(store.complete_atom(ids[9], &output(9)), Err(Error::InvalidTransition { .. })));
    assert!(matches!(store.begin_atom(run, "a", "x", &[ids[8]], ""), Err(Error::InvalidParent { .. })));
    // The agent re-runs steps 7..9: new atoms, the closures run again, with new outputs.
    let runs = Cell::new(0);
    let mut parent = ids[6];
    for step in 7..10u64 {
        let executed = store
            .execute(run, "a", &format!("s{step}"), &[parent], |_| {
                runs.set(runs.get() + 1);
                Ok(output(step + 50))
            })
            .expect("re-run");
        assert!(!executed.replayed);
        assert!(executed.atom > ids[9], "a new atom, not the abandoned one");
        parent = executed.atom;
    }
    assert_eq!(runs.get(), 3);
    assert_eq!(
        store.rebuild_context(parent).expect("new head").context.encode(),
        fold(&[0, 1, 2, 3, 4, 5, 6, 57, 58, 59])
    );
    // Time travel into the abandoned branch still works.
    assert_eq!(store.rebuild_context(ids[9]).expect("old head").context.encode(), fold(&(0..10).collect::<Vec<_>>()));
    let failed =
        store.execute(run, "a", "s10", &[parent], |_| Err(AtomFailure { message: "x".into(), retryable: true }));
    assert!(failed.is_err());
    assert!(store.incomplete_atoms(run).iter().all(|atom| !store.atom(*atom).expect("atom").abandoned));
}

#[test]
fn a_step_run_again_after_a_rollback_does_not_repeat_its_guarded_effect() {
    // Step 7 booked a flight; the reviewer rolls back to step 6. The booking happened in the
    // world: re-running step 7 gets its recorded result instead of booking again, and a new
    // booking needs another operation name.
    let dir = tempfile::tempdir().expect("tempdir");
    let bookings = Cell::new(0);
    let book = |_: &str| {
        bookings.set(bookings.get() + 1);
        Ok(format!("booking {}", bookings.get()).into_bytes())
    };
    let (run, six) = {
        let store = Store::open(dir.path()).expect("open");
        let (run, ids) = chain(&store);
        let seven = store.begin_atom(run, "a", "s10", &[ids[9]], "").expect("s10");
        assert_eq!(store.guarded(seven, "book", book).expect("booked"), b"booking 1");
        store.complete_atom(seven, &output(10)).expect("complete");
        store.rollback(run, "a", ids[9], "reviewer: other dates").expect("rollback");
        (run, ids[9])
    };
    let store = Store::open(dir.path()).expect("reopen");
    let again = store.begin_atom(run, "a", "s10", &[six], "").expect("the step again, a new atom");
    assert_eq!(store.guarded(again, "book", book).expect("recorded"), b"booking 1");
    assert_eq!(bookings.get(), 1, "the effect is not repeated");
    assert_eq!(store.guarded(again, "rebook", book).expect("another operation"), b"booking 2");
}

#[test]
fn a_rollback_before_a_fork_keeps_the_fork_and_one_after_it_abandons_it() {
    // "Go back to step 6 and try again, dropping 7..9": roll back to 6, then fork from it.
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let (run, ids) = chain(&store);
    store.rollback(run, "a", ids[6], "reviewer").expect("rollback");
    let fork = store.fork(run, "a", ids[6], "s7-retry").expect("fork");
    store.complete_atom(fork, &output(100)).expect("the fork completes");
    assert!(!store.atom(fork).expect("fork").abandoned);
    assert_eq!(store.last_agent_atom(run, "a"), Some(fork));
    // The other order: a rollback to 6 after forking from it abandons the fork as well, since
    // it abandons every atom of the agent after 6 in id order (the fork's documentation says so).
    let second = store.fork(run, "a", ids[6], "s7-third-try").expect("fork again");
    let abandoned = store.rollback(run, "a", ids[6], "reviewer, again").expect("rollback");
    assert_eq!(abandoned, vec![fork, second]);
    assert!(matches!(store.complete_atom(second, &output(101)), Err(Error::InvalidTransition { .. })));
    assert_eq!(store.last_agent_atom(run, "a"), Some(ids[6]));
}

/// A key names a step on a branch: after a fork, `execute` of a step the old branch already
/// ran ("summarize") runs it on the new branch (a new atom whose parent is the fork) instead of
/// answering with the old branch's atom, while the old branch's own call still replays its
/// atom, before and after reopen, and whichever branch holds the key last.
#[test]
fn a_forked_branch_runs_its_own_step_under_a_key_the_old_branch_used() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ran = Cell::new(0);
    let summarize = |step: u64| {
        let ran = &ran;
        move |_: AtomId| {
            ran.set(ran.get() + 1);
            Ok(output(step))
        }
    };
    let (run, plan, old, fork, new) = {
        let store = Store::open(dir.path()).expect("open");
        let run = store.create_run(RunSpec::new("fork-keys")).expect("run");
        let plan = store.execute(run, "planner", "plan", &[], |_| Ok(output(1))).expect("plan").atom;
        let old = store.execute(run, "planner", "summarize", &[plan], summarize(2)).expect("summarize").atom;
        let fork = store.fork(run, "planner", plan, "plan-retry").expect("fork");
        store.complete_atom(fork, &output(3)).expect("complete the fork");
        let on_fork = store.execute(run, "planner", "summarize", &[fork], summarize(4)).expect("on the fork");
        assert!(!on_fork.replayed, "the old branch's atom answered on the fork");
        assert_ne!(on_fork.atom, old);
        assert_eq!(store.atom(on_fork.atom).expect("new").parents, vec![fork]);
        assert_eq!(ran.get(), 2);
        (run, plan, old, fork, on_fork.atom)
    };
    for reopen in 0..2 {
        let store = Store::open(dir.path()).expect("reopen");
        let again = store.execute(run, "planner", "summarize", &[fork], summarize(5)).expect("fork again");
        assert!(again.replayed && again.atom == new, "reopen {reopen}: the fork's own atom");
        assert_eq!(again.output, output(4));
        let old_again = store.execute(run, "planner", "summarize", &[plan], summarize(6)).expect("old again");
        assert!(old_again.replayed && old_again.atom == old, "reopen {reopen}: the old branch's own atom");
        assert_eq!(old_again.output, output(2));
        assert!(matches!(
            store.begin_atom(run, "planner", "summarize", &[plan], ""),
            Err(Error::AtomExists { atom }) if atom == old.get()
        ));
        assert!(matches!(
            store.record_atom(run, "planner", "summarize", &[fork], "", &output(7)),
            Err(Error::AtomExists { atom }) if atom == new.get()
        ));
        assert_eq!(ran.get(), 2, "no completed step ran again");
        store.write_index_snapshot().expect("the second open starts from an index snapshot");
    }
    // A rollback to the fork abandons the fork's step: on the fork it runs again, and the old
    // branch still finds its own, though the key's newest atom is now an abandoned one.
    let store = Store::open(dir.path()).expect("reopen");
    store.rollback(run, "planner", fork, "redo the summary").expect("rollback");
    let redone = store.execute(run, "planner", "summarize", &[fork], summarize(8)).expect("redo");
    assert!(!redone.replayed && redone.atom > new);
    store.rollback(run, "planner", fork, "and again").expect("rollback");
    let old_again = store.execute(run, "planner", "summarize", &[plan], summarize(9)).expect("old");
    assert!(old_again.replayed && old_again.atom == old);
    assert_eq!(ran.get(), 3);
}

/// A step whose start could not be written (the disk is full) gives its key back to the atom
/// that held it before, on another branch: that branch still finds its completed step, so
/// `execute` there returns it instead of running it again.
#[test]
fn a_failed_start_on_a_fork_gives_the_key_back_to_the_other_branch() {
    use continuum::storage::sim::SimStorage;
    let sim = SimStorage::new(21);
    let store = Store::builder(std::path::Path::new("/store"))
        .storage(std::sync::Arc::new(sim.clone()))
        .segment_bytes(16 * 1024)
        .background(false)
        .open()
        .expect("open");
    let run = store.create_run(RunSpec::new("r")).expect("run");
    let x1 = store.record_atom(run, "agent", "k1", &[], "", &output(1)).expect("x1");
    let x2 = store.record_atom(run, "agent", "k2", &[x1], "", &output(2)).expect("x2");
    let fork = store.fork(run, "agent", x1, "fork").expect("fork");
    // Fill the disk: another agent's steps until one is refused.
    sim.set_capacity(Some(sim.used_bytes()));
    let mut filler = 0;
    while store.record_atom(run, "filler", &format!("f{filler}"), &[], "", &output(100 + filler)).is_ok() {
        filler += 1;
        assert!(filler < 10_000, "the disk never filled up");
    }
    // On the fork, step k2 is a new atom; its start is refused.
    let refused = store.begin_atom(run, "agent", "k2", &[fork], "");
    assert!(matches!(refused, Err(Error::NoSpace { .. })), "{refused:?}");
    assert_eq!(store.atom_by_key_on(run, "agent", "k2", &[x1]).expect("lookup"), Some(x2), "the original branch's k2");
    let again = store.execute(run, "agent", "k2", &[x1], |_| panic!("a completed step ran again")).expect("execute");
    assert!(again.replayed && again.atom == x2);
}

/// After a rollback, a step whose key the abandoned branch used is recorded without reading
/// the branch's history: the lookup reads the atoms that took the key, not every ancestor
/// (counted as storage calls, not timed).
#[test]
fn a_step_after_a_rollback_reads_the_keys_holders_not_the_history() {
    use continuum::storage::sim::SimStorage;
    let sim = SimStorage::new(22);
    let store = Store::builder(std::path::Path::new("/store"))
        .storage(std::sync::Arc::new(sim.clone()))
        .background(false)
        .open()
        .expect("open");
    let run = store.create_run(RunSpec::new("r")).expect("run");
    let mut ids = Vec::new();
    for step in 0..2_000u64 {
        let parents: Vec<AtomId> = ids.last().copied().into_iter().collect();
        ids.push(
            store.record_atom(run, "agent", &format!("step-{step}"), &parents, "", &output(step)).expect("record"),
        );
    }
    store.rollback(run, "agent", ids[1_899], "try again").expect("rollback");
    let before = sim.op_count();
    let mut parent = ids[1_899];
    for step in 1_900..1_910u64 {
        let key = format!("step-{step}");
        let atom = store.record_atom(run, "agent", &key, &[parent], "", &output(step + 10_000)).expect("record");
        assert!(atom > *ids.last().expect("ids"), "a new atom, not the abandoned one");
        parent = atom;
    }
    let calls = sim.op_count() - before;
    // Each record: its appends and syncs, and one read of the abandoned holder's start. The
    // old lookup read every ancestor: about 1,900 per record.
    assert!(calls < 200, "{calls} storage calls for 10 records after a rollback");
    // The same keys on the branch found again, and the abandoned atoms not.
    let again = store.execute(run, "agent", "step-1900", &[ids[1_899]], |_| panic!("ran again")).expect("execute");
    assert!(again.replayed && again.atom != ids[1_900]);
}

/// Branches stay branches: after a fork at atom 2, `execute` of step 3's key on the new
/// branch runs the step as a new atom instead of answering with the old branch's step 3
/// (`replayed = true`); the same after a rollback to atom 2, and after a reopen.
#[test]
fn a_step_key_executed_on_a_branch_from_atom_2_is_a_new_atom_after_fork_rollback_and_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let never = |_: AtomId| -> Result<AtomOutput, AtomFailure> { panic!("a completed step ran again") };
    let (run, a2, a3, on_fork, fork) = {
        let store = Store::open(dir.path()).expect("open");
        let run = store.create_run(RunSpec::new("branches")).expect("run");
        let a1 = store.execute(run, "a", "s1", &[], |_| Ok(output(1))).expect("s1").atom;
        let a2 = store.execute(run, "a", "s2", &[a1], |_| Ok(output(2))).expect("s2").atom;
        let a3 = store.execute(run, "a", "s3", &[a2], |_| Ok(output(3))).expect("s3").atom;
        let fork = store.fork(run, "a", a2, "s2-retry").expect("fork at atom 2");
        store.complete_atom(fork, &output(20)).expect("complete the fork");
        let on_fork = store.execute(run, "a", "s3", &[fork], |_| Ok(output(30))).expect("s3 on the fork");
        assert!(!on_fork.replayed, "the old branch's s3 answered on the fork");
        assert_ne!(on_fork.atom, a3);
        assert_eq!(on_fork.output, output(30));
        (run, a2, a3, on_fork.atom, fork)
    };
    let store = Store::open(dir.path()).expect("reopen");
    let again = store.execute(run, "a", "s3", &[fork], never).expect("s3 on the fork after reopen");
    assert!(again.replayed && again.atom == on_fork, "after a reopen the fork finds its own s3");
    store.rollback(run, "a", a2, "redo step 3").expect("rollback to atom 2");
    let redone = store.execute(run, "a", "s3", &[a2], |_| Ok(output(31))).expect("s3 after the rollback");
    assert!(!redone.replayed, "the abandoned s3 answered after the rollback");
    assert!(redone.atom != a3 && redone.atom != on_fork);
    drop(store);
    let store = Store::open(dir.path()).expect("reopen after the rollback");
    let replayed = store.execute(run, "a", "s3", &[a2], never).expect("s3 after reopen");
    assert!(replayed.replayed && replayed.atom == redone.atom, "after a reopen the new branch finds its own s3");
    assert_eq!(replayed.output, output(31));
}
