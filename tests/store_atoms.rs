//! The atom protocol end to end on the real file system: runs, atoms as a DAG, every invalid
//! transition refused with a typed error and the log untouched, execute() never re-running a
//! completed atom across reopen, guarded effects running once, and resume reports.

use std::cell::Cell;
use std::time::Duration;

use continuum::synthetic::Transcript;
use continuum::{AtomFailure, AtomOutput, AtomStatus, Error, RetentionPolicy, RunSpec, RunStatus, Store};

fn output(seed: u64) -> AtomOutput {
    AtomOutput { delta: Transcript::new(seed).next_delta(500), result: format!("result {seed}").into_bytes() }
}

#[test]
fn atoms_form_a_dag_and_survive_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (run, a, b, c) = {
        let store = Store::open(dir.path()).expect("open");
        let run =
            store.create_run(RunSpec::new("run-1").pipeline("research", "1.0").env("host", "node-7")).expect("run");
        assert_eq!(store.create_run(RunSpec::new("run-1")).expect("same run"), run);
        let a = store.begin_atom(run, "planner", "step-1", &[], "").expect("a");
        store.complete_atom(a, &output(1)).expect("complete a");
        let b = store.begin_atom(run, "researcher", "step-1", &[a], "idem-b").expect("b");
        let c = store.begin_atom(run, "writer", "step-1", &[a, b], "").expect("c");
        store.complete_atom(b, &output(2)).expect("complete b");
        store.fail_atom(c, &AtomFailure { message: "rate limited".into(), retryable: true }).expect("fail c");
        (run, a, b, c)
    };
    let store = Store::open(dir.path()).expect("reopen");
    assert_eq!(store.run_id("run-1"), Some(run));
    let b_found = store.atom(b).expect("b");
    assert_eq!(b_found.parents, vec![a]);
    assert_eq!(b_found.idempotency_key, "idem-b");
    assert_eq!(b_found.status, AtomStatus::Completed);
    assert_eq!(b_found.output, Some(output(2)));
    assert_eq!(store.atom(c).expect("c").status, AtomStatus::Failed { retryable: true });
    assert_eq!(store.run_atoms(run), vec![a, b, c]);
    assert_eq!(store.agent_atoms(run, "researcher"), vec![b]);
    assert_eq!(store.incomplete_atoms(run), vec![c]);
    // A retryable failure may complete on a later attempt.
    store.complete_atom(c, &output(3)).expect("retry c");
    store.finish_run(run, true, "done").expect("finish");
    assert_eq!(
        store.run_status(run).expect("status"),
        RunStatus::Finished { success: true, resume_hint: "done".into() }
    );
}

#[test]
fn invalid_transitions_are_typed_errors_and_leave_the_log_untouched() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let run = store.create_run(RunSpec::new("r")).expect("run");
    let other = store.create_run(RunSpec::new("other")).expect("run");
    let a = store.begin_atom(run, "agent", "a", &[], "").expect("a");
    store.complete_atom(a, &output(1)).expect("complete");
    let before = store.log().next_lsn();
    assert!(matches!(store.complete_atom(a, &output(2)), Err(Error::InvalidTransition { .. })));
    assert!(matches!(
        store.fail_atom(a, &AtomFailure { message: "x".into(), retryable: false }),
        Err(Error::InvalidTransition { .. })
    ));
    assert!(matches!(
        store.complete_atom(continuum::AtomId::from_raw(999), &output(2)),
        Err(Error::UnknownAtom { .. })
    ));
    assert!(matches!(store.begin_atom(run, "agent", "a", &[], ""), Err(Error::AtomExists { .. })));
    assert!(matches!(
        store.begin_atom(run, "agent", "b", &[continuum::AtomId::from_raw(42)], ""),
        Err(Error::InvalidParent { .. })
    ));
    assert!(matches!(store.begin_atom(other, "agent", "b", &[a], ""), Err(Error::InvalidParent { .. })));
    assert!(matches!(
        store.begin_atom(continuum::RunId::from_raw(77), "agent", "b", &[], ""),
        Err(Error::UnknownRun { .. })
    ));
    assert_eq!(store.log().next_lsn(), before, "refused transitions write nothing");
    store.finish_run(run, false, "stopped").expect("finish");
    assert!(matches!(store.begin_atom(run, "agent", "c", &[], ""), Err(Error::RunFinished { .. })));
    assert!(matches!(store.finish_run(run, true, ""), Err(Error::RunFinished { .. })));
}

#[test]
fn record_atom_writes_a_finished_atom_in_one_batch() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (run, a, b) = {
        let store = Store::open(dir.path()).expect("open");
        let run = store.create_run(RunSpec::new("index snapshots")).expect("run");
        let before = store.log().next_lsn().get();
        let a = store.record_atom(run, "graph", "node-1", &[], "idem-a", &output(1)).expect("a");
        assert_eq!(store.log().next_lsn().get(), before + 2, "a start and a completion");
        let b = store.record_atom(run, "graph", "node-2", &[a], "", &output(2)).expect("b");
        let found = store.atom(b).expect("b");
        assert_eq!(found.status, AtomStatus::Completed);
        assert_eq!(found.parents, vec![a]);
        assert_eq!(found.output, Some(output(2)));
        // Refused atoms write nothing, as with begin_atom.
        let before = store.log().next_lsn();
        assert!(matches!(
            store.record_atom(run, "graph", "node-1", &[], "", &output(3)),
            Err(Error::AtomExists { .. })
        ));
        assert!(matches!(
            store.record_atom(run, "graph", "node-3", &[continuum::AtomId::from_raw(99)], "", &output(3)),
            Err(Error::InvalidParent { .. })
        ));
        assert_eq!(store.log().next_lsn(), before);
        (run, a, b)
    };
    let store = Store::open(dir.path()).expect("reopen");
    let found = store.atom(a).expect("a");
    assert_eq!((found.status, found.idempotency_key.as_str()), (AtomStatus::Completed, "idem-a"));
    assert_eq!(found.output, Some(output(1)));
    assert_eq!(store.run_atoms(run), vec![a, b]);
    assert!(store.incomplete_atoms(run).is_empty());
    // execute() sees a recorded atom as done and hands back its output.
    let executed = store.execute(run, "graph", "node-2", &[a], |_| panic!("must not run again")).expect("execute");
    assert!(executed.replayed);
    assert_eq!(executed.output, output(2));
    let resumed = store.resume(run).expect("resume");
    assert_eq!(resumed.agents[0].last_completed, Some(b));
}

#[test]
fn execute_never_runs_a_completed_atom_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let calls = Cell::new(0);
    let work = |_| {
        calls.set(calls.get() + 1);
        Ok(output(7))
    };
    {
        let store = Store::open(dir.path()).expect("open");
        let run = store.create_run(RunSpec::new("r")).expect("run");
        let first = store.execute(run, "agent", "step-1", &[], work).expect("execute");
        assert!(!first.replayed);
        let again = store.execute(run, "agent", "step-1", &[], work).expect("execute again");
        assert!(again.replayed);
        assert_eq!(again.output, first.output);
    }
    let store = Store::open(dir.path()).expect("reopen");
    let run = store.run_id("r").expect("run");
    let replayed = store.execute(run, "agent", "step-1", &[], work).expect("execute after reopen");
    assert!(replayed.replayed);
    assert_eq!(replayed.output, output(7));
    assert_eq!(calls.get(), 1, "the closure ran exactly once");
    // A failure is recorded; a permanent one is returned without running again.
    let failing = |_| Err(AtomFailure { message: "bad input".into(), retryable: false });
    assert!(matches!(
        store.execute(run, "agent", "step-2", &[], failing),
        Err(Error::AtomFailed { retryable: false, .. })
    ));
    assert!(matches!(store.execute(run, "agent", "step-2", &[], work), Err(Error::AtomFailed { .. })));
    assert_eq!(calls.get(), 1);
}

#[test]
fn guarded_effects_run_once_per_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let effects = Cell::new(0);
    let (run, atom) = {
        let store = Store::open(dir.path()).expect("open");
        let run = store.create_run(RunSpec::new("r")).expect("run");
        let atom = store.begin_atom(run, "mailer", "step-3", &[], "").expect("atom");
        let key = store.guard_key(atom, "send_email").expect("key");
        assert_eq!(key, "r#1/mailer/step-3/send_email");
        let result = store
            .guarded(atom, "send_email", |key| {
                effects.set(effects.get() + 1);
                Ok(format!("sent with {key}").into_bytes())
            })
            .expect("guarded");
        assert_eq!(result, b"sent with r#1/mailer/step-3/send_email");
        (run, atom)
    };
    let store = Store::open(dir.path()).expect("reopen");
    let again = store.guarded(atom, "send_email", |_| {
        effects.set(effects.get() + 1);
        Ok(Vec::new())
    });
    assert_eq!(again.expect("recorded"), b"sent with r#1/mailer/step-3/send_email");
    assert_eq!(effects.get(), 1);
    let _ = run;
}

/// A store that drops finished runs at once (`finished_run_age` zero) and has no background
/// thread.
fn dropping_store(dir: &std::path::Path) -> Store {
    let retention = RetentionPolicy { snapshots_per_agent: 1, finished_run_age: Some(Duration::ZERO) };
    Store::builder(dir).retention(retention).background(false).open().expect("open")
}

#[test]
fn a_run_that_reuses_a_dropped_runs_name_runs_its_guarded_effects_anew() {
    // A daily job's run, finished and dropped by retention, then the next day's run under the
    // same name: its "send" is a new effect, with a new key, not the old run's result.
    let dir = tempfile::tempdir().expect("tempdir");
    let sent = Cell::new(0);
    let send = |day: &str| {
        let sent = &sent;
        let day = day.to_owned();
        move |key: &str| {
            sent.set(sent.get() + 1);
            Ok(format!("{day} sent with {key}").into_bytes())
        }
    };
    let store = dropping_store(dir.path());
    let monday = store.create_run(RunSpec::new("daily-report")).expect("run");
    let step = store.begin_atom(monday, "mailer", "send", &[], "").expect("atom");
    assert_eq!(
        store.guarded(step, "email", send("monday")).expect("guarded"),
        b"monday sent with daily-report#1/mailer/send/email"
    );
    store.complete_atom(step, &output(1)).expect("complete");
    store.finish_run(monday, true, "").expect("finish");
    std::thread::sleep(Duration::from_millis(2));
    assert_eq!(store.compact().expect("round").runs_dropped, 1);
    let tuesday = store.create_run(RunSpec::new("daily-report")).expect("the name is free again");
    assert_ne!(tuesday, monday);
    let step = store.begin_atom(tuesday, "mailer", "send", &[], "").expect("atom");
    let key = store.guard_key(step, "email").expect("key");
    assert_eq!(key, format!("daily-report#{}/mailer/send/email", tuesday.get()));
    assert_eq!(
        store.guarded(step, "email", send("tuesday")).expect("guarded"),
        format!("tuesday sent with {key}").into_bytes()
    );
    assert_eq!(sent.get(), 2, "tuesday's email is sent");
    drop(store);
    // After a reopen the old run's guard records are still in the log (compaction has not
    // rewritten their segment): they belong to the dropped run, not to this one.
    let store = dropping_store(dir.path());
    let step = store.atom_by_key(tuesday, "mailer", "send").expect("read").expect("tuesday's step");
    assert_eq!(
        store.guarded(step, "email", send("again")).expect("recorded"),
        format!("tuesday sent with {key}").into_bytes()
    );
    assert_eq!(sent.get(), 2, "no email is sent twice");
}

#[test]
fn guards_recorded_under_keys_without_the_run_id_are_honoured_for_their_own_run() {
    // A store written before guard keys named the run's id: a completed guard and one in
    // doubt, recorded under "<run name>/<agent>/<atom key>/<operation>", and a dropped run of
    // the same name whose guard must not be taken for the new run's.
    use continuum::codec::StoreRecord;
    use continuum::codec::proto::{AtomStarted, GuardCompleted, GuardStarted, RunCreated, RunDropped};
    let dir = tempfile::tempdir().expect("tempdir");
    let run = |id: u64, name: &str| {
        StoreRecord::RunCreated(RunCreated { run: id, run_name: name.into(), ..RunCreated::default() })
    };
    let start = |atom: u64, run: u64, key: &str| {
        StoreRecord::AtomStarted(AtomStarted {
            atom,
            run,
            agent: "tool".into(),
            key: key.into(),
            ..AtomStarted::default()
        })
    };
    let guard_started = |atom: u64, key: &str| {
        StoreRecord::GuardStarted(GuardStarted {
            key: key.into(),
            atom,
            operation: "pay".into(),
            started_at_unix_us: 1,
        })
    };
    let guard_completed = |key: &str, result: &[u8]| {
        StoreRecord::GuardCompleted(GuardCompleted { key: key.into(), result: result.to_vec(), ended_at_unix_us: 2 })
    };
    let records = [
        // Run 1 "shop", dropped: its step "checkout" paid under the old key.
        run(1, "shop"),
        start(1, 1, "checkout"),
        guard_started(1, "shop/tool/checkout/pay"),
        guard_completed("shop/tool/checkout/pay", b"paid by run 1"),
        StoreRecord::RunDropped(RunDropped { run: 1, next_atom: 2, dropped_at_unix_us: 3 }),
        // Run 2 "orders": a completed guard and one in doubt, under old keys.
        run(2, "orders"),
        start(2, 2, "checkout"),
        guard_started(2, "orders/tool/checkout/pay"),
        guard_completed("orders/tool/checkout/pay", b"paid by run 2"),
        start(3, 2, "refund"),
        guard_started(3, "orders/tool/refund/pay"),
    ];
    let log = continuum::Log::open(dir.path()).expect("log");
    for record in &records {
        log.append(&continuum::inspect::encode_record(record)).expect("append");
    }
    log.close().expect("close");
    let store = Store::builder(dir.path()).background(false).open().expect("open");
    let effects = Cell::new(0);
    let pay = |_: &str| {
        effects.set(effects.get() + 1);
        Ok(b"paid now".to_vec())
    };
    let orders = store.create_run(RunSpec::new("orders")).expect("existing run");
    let checkout = store.atom_by_key(orders, "tool", "checkout").expect("read").expect("atom 2");
    assert_eq!(store.guarded(checkout, "pay", pay).expect("recorded"), b"paid by run 2");
    let refund = store.atom_by_key(orders, "tool", "refund").expect("read").expect("atom 3");
    match store.guarded(refund, "pay", pay) {
        Err(Error::GuardInDoubt { key }) => {
            assert_eq!(key, "orders/tool/refund/pay", "in doubt under the key it was recorded with");
            store.resolve_guard(&key, b"refund checked: paid").expect("resolve");
        }
        other => panic!("the old guard is in doubt: {other:?}"),
    }
    assert_eq!(store.guarded(refund, "pay", pay).expect("resolved"), b"refund checked: paid");
    // A new run named like the dropped one pays anew.
    let shop = store.create_run(RunSpec::new("shop")).expect("new run");
    let checkout = store.begin_atom(shop, "tool", "checkout", &[], "").expect("atom");
    assert_eq!(store.guarded(checkout, "pay", pay).expect("new effect"), b"paid now");
    assert_eq!(effects.get(), 1, "only the new run's effect ran");
}

#[test]
fn guard_keys_of_different_atoms_or_operations_never_coincide() {
    // Names holding the key's separators: agent "a/b" with step "c" against agent "a" with
    // step "b/c", and a run whose name looks like another run's key.
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let run = store.create_run(RunSpec::new("team#1/x")).expect("run");
    let first = store.begin_atom(run, "a/b", "c", &[], "").expect("atom");
    let second = store.begin_atom(run, "a", "b/c", &[], "").expect("atom");
    let effects = Cell::new(0);
    let effect = |key: &str| {
        effects.set(effects.get() + 1);
        Ok(key.as_bytes().to_vec())
    };
    let one = store.guarded(first, "op", effect).expect("first");
    let two = store.guarded(second, "op", effect).expect("second");
    let three = store.guarded(second, "b/op", effect).expect("third");
    assert_eq!(effects.get(), 3, "three different effects");
    assert_eq!(one, b"team%231%2Fx#1/a%2Fb/c/op");
    assert_eq!(two, b"team%231%2Fx#1/a/b%2Fc/op");
    assert_eq!(three, b"team%231%2Fx#1/a/b%2Fc/b%2Fop");
}

#[test]
fn only_a_guard_in_doubt_can_be_resolved() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let run = store.create_run(RunSpec::new("r")).expect("run");
    let atom = store.begin_atom(run, "mailer", "step-1", &[], "").expect("atom");
    // A completed guard keeps its recorded result.
    let sent = store.guarded(atom, "send", |_| Ok(b"sent".to_vec())).expect("guarded");
    let key = store.guard_key(atom, "send").expect("key");
    assert!(matches!(store.resolve_guard(&key, b"other"), Err(Error::GuardNotInDoubt { .. })));
    assert_eq!(store.guarded(atom, "send", |_| unreachable!()).expect("recorded"), sent);
    // A key nothing was started under (a typo) is refused, and creates no guard.
    let typo = format!("{key}x");
    assert!(matches!(store.resolve_guard(&typo, b"x"), Err(Error::GuardNotInDoubt { key }) if key == typo));
    // An effect that died midway (here a panic; a crash after a reopen) is in doubt, and
    // resolving it records the outcome once.
    let died = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = store.guarded(atom, "charge", |_| panic!("the process died during the effect"));
    }));
    assert!(died.is_err());
    let key = match store.guarded(atom, "charge", |_| unreachable!()) {
        Err(Error::GuardInDoubt { key }) => key,
        other => panic!("in doubt: {other:?}"),
    };
    store.resolve_guard(&key, b"charged once").expect("resolve");
    assert!(matches!(store.resolve_guard(&key, b"again"), Err(Error::GuardNotInDoubt { .. })));
    drop(store);
    let store = Store::open(dir.path()).expect("reopen");
    assert_eq!(store.guarded(atom, "charge", |_| unreachable!()).expect("resolved"), b"charged once");
    assert!(matches!(store.resolve_guard(&typo, b"x"), Err(Error::GuardNotInDoubt { .. })));
}

#[test]
fn resume_reports_each_agent_position() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let run = store.create_run(RunSpec::new("r")).expect("run");
    let a1 = store.begin_atom(run, "a", "1", &[], "").expect("a1");
    store.complete_atom(a1, &output(1)).expect("c");
    let a2 = store.begin_atom(run, "a", "2", &[a1], "").expect("a2");
    store.complete_atom(a2, &output(2)).expect("c");
    let a3 = store.begin_atom(run, "a", "3", &[a2], "").expect("a3");
    let b1 = store.begin_atom(run, "b", "1", &[], "").expect("b1");
    store.fail_atom(b1, &AtomFailure { message: "no".into(), retryable: false }).expect("f");
    let report = store.resume(run).expect("resume");
    let a = report.agents.iter().find(|agent| agent.agent == "a").expect("agent a");
    assert_eq!(a.completed, vec![a1, a2]);
    assert_eq!(a.last_completed, Some(a2));
    assert_eq!(a.first_incomplete, Some(a3));
    let b = report.agents.iter().find(|agent| agent.agent == "b").expect("agent b");
    assert_eq!(b.failed, vec![b1]);
    assert_eq!(b.first_incomplete, None);
}

#[test]
fn a_dictionary_is_trained_and_used_across_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut transcript = Transcript::new(5);
    let outputs: Vec<AtomOutput> =
        (0..2_100).map(|i| AtomOutput { delta: transcript.next_delta(500), result: vec![i as u8] }).collect();
    {
        let store = Store::builder(dir.path()).compress_records_from(64).open().expect("open");
        let run = store.create_run(RunSpec::new("r")).expect("run");
        for (i, out) in outputs.iter().enumerate() {
            let atom = store.begin_atom(run, "agent", &format!("step-{i}"), &[], "").expect("begin");
            store.complete_atom(atom, out).expect("complete");
        }
    }
    let store = Store::open(dir.path()).expect("reopen");
    let run = store.run_id("r").expect("run");
    for (i, atom) in store.run_atoms(run).into_iter().enumerate() {
        assert_eq!(store.atom(atom).expect("atom").output.as_ref(), Some(&outputs[i]));
    }
}

/// The dictionaries in the log (id, bytes), and the compression of each completion, in order.
fn dictionaries_and_completions(store: &Store) -> (Vec<(u64, usize)>, Vec<String>) {
    let (mut dictionaries, mut completions) = (Vec::new(), Vec::new());
    for item in store.log().iter_from(continuum::Lsn::FIRST).expect("iterate") {
        let (_, bytes) = item.expect("record");
        let info = store.decode_record(&bytes).expect("decode");
        match info.record {
            continuum::codec::StoreRecord::Dictionary(dictionary) => {
                dictionaries.push((u64::from(dictionary.id), dictionary.dictionary.len()));
            }
            continuum::codec::StoreRecord::AtomCompleted(_) => completions.push(info.compression),
            _ => {}
        }
    }
    (dictionaries, completions)
}

#[test]
fn a_small_dictionary_comes_early_and_the_final_one_later_across_reopens() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut transcript = Transcript::new(8);
    let mut outputs = Vec::new();
    let mut write = |count: usize, outputs: &mut Vec<AtomOutput>| {
        // Without a background thread the dictionary is trained inline, at a known atom.
        let store = Store::builder(dir.path()).compress_records_from(64).background(false).open().expect("open");
        let run = store.create_run(RunSpec::new("r")).expect("run");
        for _ in 0..count {
            let out = AtomOutput { delta: transcript.next_delta(500), result: Vec::new() };
            let atom = store.begin_atom(run, "agent", &format!("step-{}", outputs.len()), &[], "").expect("begin");
            store.complete_atom(atom, &out).expect("complete");
            outputs.push(out);
        }
    };
    // 300 atoms: the first dictionary (at most 16 KiB) is trained on the 256th delta, which is
    // the first one compressed with it.
    write(300, &mut outputs);
    let store = Store::open(dir.path()).expect("reopen");
    let (dictionaries, completions) = dictionaries_and_completions(&store);
    assert_eq!(dictionaries.len(), 1, "one early dictionary: {dictionaries:?}");
    assert!(dictionaries[0].1 <= 16 * 1024);
    assert_eq!(completions[..255].iter().filter(|c| c.contains("dictionary")).count(), 0);
    assert!(
        completions[255..].iter().all(|c| *c == format!("zstd+dictionary#{}", dictionaries[0].0)),
        "{completions:?}"
    );
    drop(store);
    // 2,100 more, after a reopen: the final dictionary comes after 2,000 new samples.
    write(2_100, &mut outputs);
    let store = Store::open(dir.path()).expect("reopen");
    let (dictionaries, completions) = dictionaries_and_completions(&store);
    assert_eq!(dictionaries.len(), 2, "the early dictionary, then the final one: {dictionaries:?}");
    assert!(dictionaries[1].1 > 16 * 1024, "the final dictionary is the bigger one: {dictionaries:?}");
    let last = completions.last().expect("completions");
    assert_eq!(*last, format!("zstd+dictionary#{}", dictionaries[1].0));
    drop(store);
    // Once the final one exists, no more are trained; every output reads back.
    write(300, &mut outputs);
    let store = Store::open(dir.path()).expect("reopen");
    assert_eq!(dictionaries_and_completions(&store).0.len(), 2);
    let run = store.run_id("r").expect("run");
    let atoms = store.run_atoms(run);
    assert_eq!(atoms.len(), outputs.len());
    for (atom, out) in atoms.into_iter().zip(&outputs) {
        assert_eq!(store.atom(atom).expect("atom").output.as_ref(), Some(out));
    }
}

#[test]
fn the_background_thread_trains_the_dictionary_and_logs_it_before_its_first_use() {
    // With a background thread, the completion that brings the 256th sample does not wait
    // for the training: the thread trains, logs the dictionary, and only then do completions
    // use it. Every completion logged before the dictionary record is plain. Between the
    // record's append and the codec taking the dictionary up, completions may still be
    // compressed without it (harmless: readable either way); once one uses it, all do.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut transcript = Transcript::new(10);
    let store = Store::builder(dir.path()).compress_records_from(64).open().expect("open");
    let run = store.create_run(RunSpec::new("r")).expect("run");
    let mut complete = |i: usize| {
        let out = AtomOutput { delta: transcript.next_delta(500), result: Vec::new() };
        let atom = store.begin_atom(run, "agent", &format!("step-{i}"), &[], "").expect("begin");
        store.complete_atom(atom, &out).expect("complete");
    };
    for i in 0..256 {
        complete(i);
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while dictionaries_and_completions(&store).0.is_empty() {
        assert!(std::time::Instant::now() < deadline, "no dictionary was trained in 30 s");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // Completions until the newest uses the dictionary (the background thread may still be
    // between logging it and handing it to the codec), then ten more.
    let mut next = 256;
    loop {
        complete(next);
        next += 1;
        let (_, completions) = dictionaries_and_completions(&store);
        if completions.last().is_some_and(|newest| newest.contains("dictionary")) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the logged dictionary was not used in 30 s");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    for i in next..next + 10 {
        complete(i);
    }
    let (mut plain, mut before_use, mut used) = (0, 0, 0);
    let mut dictionary = None;
    for item in store.log().iter_from(continuum::Lsn::FIRST).expect("iterate") {
        let (_, bytes) = item.expect("record");
        let info = store.decode_record(&bytes).expect("decode");
        match info.record {
            continuum::codec::StoreRecord::Dictionary(logged) => dictionary = Some(logged.id),
            continuum::codec::StoreRecord::AtomCompleted(_) => match dictionary {
                None => {
                    assert!(!info.compression.contains("dictionary"), "used before it was logged");
                    plain += 1;
                }
                Some(id) if info.compression.contains("dictionary") => {
                    assert_eq!(info.compression, format!("zstd+dictionary#{id}"));
                    used += 1;
                }
                Some(_) => {
                    assert_eq!(used, 0, "a completion went back to no dictionary after one used it");
                    before_use += 1;
                }
            },
            _ => {}
        }
    }
    assert!(plain >= 255, "trained from 256 samples, so logged after at least 255 completions: {plain}");
    assert!(used >= 11, "the last eleven completions use the dictionary: {used}");
    assert_eq!(plain + before_use + used, next + 10);
}

#[test]
fn small_segments_still_get_both_dictionaries() {
    // A 64 KiB dictionary record does not fit in a 64 KiB segment: the final dictionary is
    // trained smaller so that it can be written (before, the append failed and the store kept
    // the first dictionary for good, silently).
    let dir = tempfile::tempdir().expect("tempdir");
    let segment_bytes = 64 * 1024;
    let mut transcript = Transcript::new(9);
    let mut outputs = Vec::new();
    {
        let store = Store::builder(dir.path())
            .segment_bytes(segment_bytes)
            .compress_records_from(64)
            .background(false)
            .open()
            .expect("open");
        let run = store.create_run(RunSpec::new("r")).expect("run");
        for i in 0..2_400 {
            let out = AtomOutput { delta: transcript.next_delta(500), result: Vec::new() };
            let atom = store.begin_atom(run, "agent", &format!("step-{i}"), &[], "").expect("begin");
            store.complete_atom(atom, &out).expect("complete");
            outputs.push(out);
        }
    }
    let store =
        Store::builder(dir.path()).segment_bytes(segment_bytes).compress_records_from(64).open().expect("reopen");
    let (dictionaries, completions) = dictionaries_and_completions(&store);
    assert_eq!(dictionaries.len(), 2, "{dictionaries:?}");
    assert!(dictionaries[0].1 <= 16 * 1024 && dictionaries[1].1 > dictionaries[0].1, "{dictionaries:?}");
    assert!(dictionaries[1].1 <= segment_bytes as usize - 1024, "{dictionaries:?}");
    assert_eq!(*completions.last().expect("completions"), format!("zstd+dictionary#{}", dictionaries[1].0));
    let run = store.run_id("r").expect("run");
    for (atom, out) in store.run_atoms(run).into_iter().zip(&outputs) {
        assert_eq!(store.atom(atom).expect("atom").output.as_ref(), Some(out));
    }
}

#[test]
fn by_default_only_large_records_are_compressed_as_they_are_appended() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut transcript = Transcript::new(12);
    let small = AtomOutput { delta: transcript.next_delta(500), result: Vec::new() };
    let large = AtomOutput { delta: transcript.next_delta(8_000), result: Vec::new() };
    let store = Store::open(dir.path()).expect("open");
    let run = store.create_run(RunSpec::new("r")).expect("run");
    let a = store.record_atom(run, "agent", "small", &[], "", &small).expect("small");
    let b = store.record_atom(run, "agent", "large", &[a], "", &large).expect("large");
    let (_, completions) = dictionaries_and_completions(&store);
    assert_eq!(completions, vec!["none".to_owned(), "zstd".to_owned()]);
    assert_eq!(store.atom(b).expect("b").output, Some(large));
    assert_eq!(store.atom(a).expect("a").output, Some(small));
}

#[test]
fn last_agent_atom_is_the_newest_atom_a_rollback_left_in_place() {
    // Three runs and three agents written in a random interleaving of completed atoms, atoms
    // left running and rollbacks: after every step, and after reopening from an index
    // index snapshot and by a whole fold, each agent's last_agent_atom must be the newest of its
    // atoms the test's own record says no rollback abandoned (and agent_atoms every atom).
    let dir = tempfile::tempdir().expect("tempdir");
    let open = || Store::builder(dir.path()).snapshot_policy(continuum::SnapshotPolicy::NEVER).background(false).open();
    let store = open().expect("open");
    let runs: Vec<_> =
        ["r0", "r1", "r2"].iter().map(|name| store.create_run(RunSpec::new(*name)).expect("run")).collect();
    let agents = ["planner", "coder", "critic"];
    // (run index, agent index) -> every atom, with whether a rollback abandoned it.
    let mut written = std::collections::BTreeMap::<(usize, usize), Vec<(continuum::AtomId, bool)>>::new();
    let check = |store: &Store,
                 written: &std::collections::BTreeMap<(usize, usize), Vec<(continuum::AtomId, bool)>>,
                 when: &str| {
        for (r, run) in runs.iter().enumerate() {
            for (a, agent) in agents.iter().enumerate() {
                let atoms = written.get(&(r, a)).cloned().unwrap_or_default();
                let head = atoms.iter().rev().find(|(_, abandoned)| !abandoned).map(|(atom, _)| *atom);
                assert_eq!(store.last_agent_atom(*run, agent), head, "{when}: head of {agent} in run {r}");
                let all: Vec<_> = atoms.iter().map(|(atom, _)| *atom).collect();
                assert_eq!(store.agent_atoms(*run, agent), all, "{when}: atoms of {agent} in run {r}");
            }
            assert_eq!(store.last_agent_atom(*run, "nobody"), None, "{when}");
        }
        assert_eq!(store.last_agent_atom(continuum::RunId::from_raw(99), "planner"), None, "{when}");
    };
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = |bound: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % bound
    };
    for step in 0..400 {
        let (r, a) = (next(3) as usize, next(3) as usize);
        let (run, agent) = (runs[r], agents[a]);
        let atoms = written.entry((r, a)).or_default();
        let live: Vec<_> = atoms.iter().filter(|(_, abandoned)| !abandoned).map(|(atom, _)| *atom).collect();
        match next(10) {
            0 if !live.is_empty() => {
                let to = live[next(live.len() as u64) as usize];
                let abandoned = store.rollback(run, agent, to, "retry").expect("rollback");
                let mut expected = Vec::new();
                for (atom, gone) in atoms.iter_mut().filter(|(atom, gone)| *atom > to && !*gone) {
                    *gone = true;
                    expected.push(*atom);
                }
                assert_eq!(abandoned, expected, "step {step}: rollback of {agent} in run {r}");
            }
            1 => {
                let atom = store.begin_atom(run, agent, &format!("{step}"), &[], "").expect("begin");
                atoms.push((atom, false));
            }
            _ => {
                let parents: Vec<_> = live.last().copied().into_iter().collect();
                let atom =
                    store.record_atom(run, agent, &format!("{step}"), &parents, "", &output(step)).expect("record");
                atoms.push((atom, false));
            }
        }
        check(&store, &written, &format!("step {step}"));
    }
    assert!(written.values().flatten().any(|(_, abandoned)| *abandoned), "the interleaving rolled something back");
    store.write_index_snapshot().expect("index snapshot");
    drop(store);
    let store = open().expect("reopen from the index snapshot");
    assert!(store.index_snapshot().opened_from.is_some());
    check(&store, &written, "reopened from an index snapshot");
    drop(store);
    std::fs::remove_file(dir.path().join("index.snapshot")).expect("remove the index snapshot");
    let store = open().expect("reopen");
    assert!(store.index_snapshot().opened_from.is_none());
    check(&store, &written, "reopened by a whole fold");
}

#[test]
fn run_queries_find_every_atom_of_runs_interleaved_and_started_late() {
    // Run "early" writes throughout, "late" is created half-way and "burst" writes one short
    // stretch: each query walks only its run's span of the atom table, so it must find the
    // same atoms as the test's own record, live, after a reopen that folds the log, and after
    // one that starts from an index snapshot.
    let dir = tempfile::tempdir().expect("tempdir");
    // No snapshots: the late run's rebuild folds its whole chain.
    let open = || Store::builder(dir.path()).snapshot_policy(continuum::SnapshotPolicy::NEVER).background(false).open();
    let store = open().expect("open");
    let early = store.create_run(RunSpec::new("early")).expect("early");
    let mut late = None;
    let mut burst = None;
    let mut written = std::collections::BTreeMap::<(u64, &str), Vec<continuum::AtomId>>::new();
    let mut running = std::collections::BTreeMap::<u64, Vec<continuum::AtomId>>::new();
    let mut late_context = continuum::Context::new();
    for i in 0..600u64 {
        if i == 300 {
            late = Some(store.create_run(RunSpec::new("late")).expect("late"));
        }
        if i == 200 {
            burst = Some(store.create_run(RunSpec::new("burst")).expect("burst"));
        }
        let (run, agent) = match i % 4 {
            0 if late.is_some() => (late.expect("late"), "a"),
            1 if (200..260).contains(&i) => (burst.expect("burst"), "b"),
            2 => (early, "x"),
            _ => (early, "y"),
        };
        let key = i.to_string();
        // The late run's atoms form one chain, whose head's context the test folds itself.
        let late_head =
            if Some(run) == late { written.get(&(run.get(), agent)).and_then(|a| a.last().copied()) } else { None };
        let parents: Vec<_> = late_head.into_iter().collect();
        let atom = if i % 7 == 0 && Some(run) != late {
            let atom = store.begin_atom(run, agent, &key, &parents, "").expect("begin");
            running.entry(run.get()).or_default().push(atom);
            atom
        } else {
            if Some(run) == late {
                late_context.apply(&output(i).delta);
            }
            store.record_atom(run, agent, &key, &parents, "", &output(i)).expect("record")
        };
        written.entry((run.get(), agent)).or_default().push(atom);
    }
    let late_head = *written.get(&(late.expect("late").get(), "a")).and_then(|a| a.last()).expect("late atoms");
    let check = |store: &Store, when: &str| {
        for run in [Some(early), late, burst].into_iter().flatten() {
            let mut all: Vec<_> =
                written.iter().filter(|((r, _), _)| *r == run.get()).flat_map(|(_, a)| a.clone()).collect();
            all.sort();
            assert_eq!(store.run_atoms(run), all, "{when}: run_atoms of run {}", run.get());
            for ((_, agent), atoms) in written.iter().filter(|((r, _), _)| *r == run.get()) {
                assert_eq!(&store.agent_atoms(run, agent), atoms, "{when}: agent_atoms of {agent}");
            }
            let incomplete = running.get(&run.get()).cloned().unwrap_or_default();
            assert_eq!(store.incomplete_atoms(run), incomplete, "{when}: incomplete_atoms of run {}", run.get());
        }
        // Its rebuild walks the index from the late run's first atom on.
        let rebuilt = store.rebuild_context(late_head).expect("rebuild the late run's head");
        assert_eq!(rebuilt.atoms_applied, 75, "{when}");
        assert_eq!(rebuilt.context.encode(), late_context.encode(), "{when}: the late run's context");
    };
    check(&store, "live");
    store.write_index_snapshot().expect("index snapshot");
    drop(store);
    let store = open().expect("reopen from the index snapshot");
    assert!(store.index_snapshot().opened_from.is_some());
    check(&store, "reopened from an index snapshot");
    drop(store);
    std::fs::remove_file(dir.path().join("index.snapshot")).expect("remove the index snapshot");
    let store = open().expect("reopen");
    assert!(store.index_snapshot().opened_from.is_none());
    check(&store, "reopened by a whole fold");
}

/// Creating or finishing a run syncs its record; the index stays open to every other agent
/// meanwhile. An agent resuming from its recorded atoms (`execute` answering from the log, no
/// append) and readers on other threads return while the run's `fdatasync` is still in
/// progress, not after it. (A new record of any durability waits for the commit group in
/// flight, the log's group commit; it does not also wait for the index.)
#[test]
fn run_creation_and_end_do_not_hold_the_index_across_their_sync() {
    use std::sync::Arc;
    use std::time::Instant;

    use continuum::storage::sim::SimStorage;

    let sim = SimStorage::new(7);
    let store =
        Store::builder("/runs-and-atoms").storage(Arc::new(sim.process())).background(false).open().expect("open");
    let run = store.create_run(RunSpec::new("busy")).expect("run");
    let done = store.execute(run, "a", "k1", &[], |_| Ok(output(1))).expect("execute").atom;
    let delay = Duration::from_millis(1_500);
    sim.set_sync_delay(delay);
    std::thread::scope(|scope| {
        for action in ["create", "finish"] {
            let started = Instant::now();
            let store = &store;
            let slow = scope.spawn(move || match action {
                "create" => store.create_run(RunSpec::new("slow")).map(|_| ()),
                _ => store.finish_run(run, true, "done"),
            });
            // The run's record is being synced by now.
            std::thread::sleep(Duration::from_millis(300));
            let waited = Instant::now();
            let replayed = store.execute(run, "a", "k1", &[], |_| Ok(output(2))).expect("replay");
            assert!(replayed.replayed && replayed.atom == done);
            assert_eq!(store.atom(done).expect("a read").status, AtomStatus::Completed);
            assert_eq!(store.last_agent_atom(run, "a"), Some(done));
            let blocked = waited.elapsed();
            assert!(blocked < delay / 3, "{action}: another agent's resume waited {blocked:?} for the run's sync");
            slow.join().expect("thread").expect("the run's record");
            assert!(started.elapsed() >= delay, "{action}: the run's record waited for its sync");
        }
    });
    sim.set_sync_delay(Duration::ZERO);
    assert!(store.run_id("slow").is_some());
    assert!(matches!(store.run_status(run), Ok(RunStatus::Finished { success: true, .. })));
}

/// A guarded effect that fails is not recorded as a result. A retryable failure leaves the key
/// free, also after a reopen (it is not in doubt): the next call runs the effect again and its
/// success is recorded. A failure for good is the key's outcome: later calls return it, before
/// and after a reopen, without running the effect.
#[test]
fn a_failed_guarded_effect_is_retried_or_recorded_as_failed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runs = Cell::new(0);
    let effect = |outcome: Result<&'static [u8], bool>| {
        let runs = &runs;
        move |_: &str| {
            runs.set(runs.get() + 1);
            outcome.map(<[u8]>::to_vec).map_err(|retryable| AtomFailure { message: "HTTP 503".into(), retryable })
        }
    };
    let (pay, refund) = {
        let store = Store::open(dir.path()).expect("open");
        let run = store.create_run(RunSpec::new("r")).expect("run");
        let pay = store.begin_atom(run, "agent", "pay", &[], "").expect("atom");
        let refund = store.begin_atom(run, "agent", "refund", &[], "").expect("atom");
        let failed = store.guarded(pay, "charge", effect(Err(true)));
        assert!(
            matches!(&failed, Err(Error::GuardFailed { message, retryable: true, .. }) if message == "HTTP 503"),
            "{failed:?}"
        );
        let failed = store.guarded(refund, "refund", effect(Err(false)));
        assert!(matches!(failed, Err(Error::GuardFailed { retryable: false, .. })), "{failed:?}");
        assert_eq!(runs.get(), 2);
        (pay, refund)
    };
    let store = Store::open(dir.path()).expect("reopen");
    assert_eq!(store.guarded(pay, "charge", effect(Ok(b"charged"))).expect("the retry"), b"charged");
    assert_eq!(runs.get(), 3, "the retry ran the effect");
    assert_eq!(store.guarded(pay, "charge", effect(Ok(b"twice"))).expect("recorded"), b"charged");
    let again = store.guarded(refund, "refund", effect(Ok(b"refunded")));
    assert!(matches!(again, Err(Error::GuardFailed { retryable: false, .. })), "{again:?}");
    assert_eq!(runs.get(), 3, "no recorded outcome ran again");
    let key = store.guard_key(refund, "refund").expect("key");
    assert!(matches!(store.resolve_guard(&key, b"x"), Err(Error::GuardNotInDoubt { .. })));
    drop(store);
    let store = Store::open(dir.path()).expect("reopen");
    assert_eq!(store.guarded(pay, "charge", effect(Ok(b"twice"))).expect("recorded"), b"charged");
    assert!(matches!(store.guarded(refund, "refund", effect(Ok(b"x"))), Err(Error::GuardFailed { .. })));
    assert_eq!(runs.get(), 3);
}

/// The contract of `record_atom`'s arguments: the identity the store enforces is (run, agent,
/// key) on the branch of the parents, so recording a step again returns `AtomExists` with the
/// recorded atom, whatever its idempotency key; the idempotency key is the caller's label,
/// stored and returned, not enforced (two steps may carry the same one).
#[test]
fn record_atom_enforces_the_step_and_stores_the_idempotency_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let run = store.create_run(RunSpec::new("r")).expect("run");
    let first = store.record_atom(run, "a", "step-1", &[], "checkpoint-1", &output(1)).expect("record");
    for idempotency_key in ["checkpoint-1", "checkpoint-2", ""] {
        let again = store.record_atom(run, "a", "step-1", &[], idempotency_key, &output(2));
        assert!(matches!(again, Err(Error::AtomExists { atom }) if atom == first.get()), "{again:?}");
    }
    let other = store.record_atom(run, "a", "step-2", &[first], "checkpoint-1", &output(3)).expect("another step");
    assert_eq!(store.atom(first).expect("first").idempotency_key, "checkpoint-1");
    assert_eq!(store.atom(other).expect("other").idempotency_key, "checkpoint-1");
    assert_eq!(store.atom(first).expect("first").output, Some(output(1)), "the recorded output stays");
}

/// An atom id is meaningful across a crash only once its start is durable: the start of an
/// atom begun and never ended is taken back by a power loss, and the next process may give its
/// id to another atom; an atom whose completion returned keeps its id, and its key (on its
/// branch) finds it in every later process.
#[test]
fn an_atom_id_names_its_atom_across_a_crash_once_its_start_is_durable() {
    use std::sync::Arc;

    use continuum::storage::sim::{CrashDamage, DataDamage, DirDamage, SimStorage};

    let sim = SimStorage::new(11);
    let open = || Store::builder("/ids").storage(Arc::new(sim.process())).background(false).open().expect("open");
    let store = open();
    let run = store.create_run(RunSpec::new("r")).expect("run");
    let done = store.execute(run, "a", "done", &[], |_| Ok(output(1))).expect("execute").atom;
    let pending = store.begin_atom(run, "a", "pending", &[done], "").expect("begin");
    sim.crash(CrashDamage { data: DataDamage::DropUnsynced, dir: DirDamage::KeepAll });
    drop(store);
    let store = open();
    assert!(store.atom_by_key(run, "a", "pending").expect("lookup").is_none(), "the start was not durable");
    let other = store.begin_atom(run, "a", "other", &[done], "").expect("begin");
    assert_eq!(other, pending, "the id of a start a crash took back may name another atom");
    assert_eq!(store.atom(other).expect("atom").key, "other");
    assert_eq!(store.atom(done).expect("durable").key, "done", "a durable atom keeps its id");
    assert_eq!(store.atom_by_key_on(run, "a", "done", &[]).expect("lookup"), Some(done));
}
