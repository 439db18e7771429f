//! Version migration of run checkpoints: a three-version chain applied in order to the shared
//! context and the agents' rebuilt contexts, recorded once (and found recorded after a
//! reopen), the stored checkpoint never rewritten; a missing link, a step returning an error
//! and a panicking step give typed errors, record nothing and leave the store usable.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use continuum::checkpoint::{CheckpointDraft, MIGRATION_AGENT, Migrations};
use continuum::codec::proto::{ChatMessage, Delta};
use continuum::{AtomOutput, Error, RunId, RunSpec, Store};

/// A run of pipeline version "1" with one agent message and a checkpoint of it.
fn run_at_v1(store: &Store) -> RunId {
    let run = store.create_run(RunSpec::new("trip").pipeline("travel", "1")).expect("run");
    let message = ChatMessage { role: "user".into(), content: "fly to Oslo".into(), tool_call: None };
    let output = AtomOutput { delta: Delta { messages: vec![message], ..Delta::default() }, result: Vec::new() };
    store.record_atom(run, "planner", "step-1", &[], "", &output).expect("atom");
    store.write_checkpoint(run, CheckpointDraft::at("planner", "step-2").shared("city", b"Oslo".to_vec())).expect("cp");
    run
}

/// v1 → v2 renames `city` to `destination`; v2 → v3 upper-cases it and adds a message to the planner's context.
/// `calls` counts the steps run.
fn chain(calls: &Arc<AtomicU32>) -> Migrations {
    let mut migrations = Migrations::new();
    let counted = Arc::clone(calls);
    migrations
        .register("1", "2", move |state| {
            counted.fetch_add(1, Ordering::SeqCst);
            assert_eq!(state.version, "1", "steps run in order");
            let city = state.shared_context.remove("city").ok_or("no city")?;
            state.shared_context.insert("destination".into(), city);
            Ok(())
        })
        .expect("register");
    let counted = Arc::clone(calls);
    migrations
        .register("2", "3", move |state| {
            counted.fetch_add(1, Ordering::SeqCst);
            assert_eq!(state.version, "2", "steps run in order");
            let destination = state.shared_context.get_mut("destination").ok_or("no destination")?;
            destination.make_ascii_uppercase();
            let note = ChatMessage { role: "system".into(), content: "migrated to v3".into(), tool_call: None };
            let planner = state.agents.get_mut("planner").ok_or("no planner")?;
            planner.apply(&Delta { messages: vec![note], ..Delta::default() });
            Ok(())
        })
        .expect("register");
    migrations
}

#[test]
fn a_three_version_chain_applies_in_order_and_is_recorded_once() {
    let dir = tempfile::tempdir().expect("dir");
    let calls = Arc::new(AtomicU32::new(0));
    let migrations = chain(&calls);
    let store = Store::open(dir.path()).expect("open");
    let run = run_at_v1(&store);
    let loaded = store.load_migrated_checkpoint(run, None, "3", &migrations).expect("migrate").expect("checkpoint");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(loaded.path, ["1", "2", "3"]);
    assert_eq!(loaded.state.version, "3");
    assert_eq!(loaded.state.shared_context.get("destination").map(Vec::as_slice), Some(&b"OSLO"[..]));
    assert!(!loaded.state.shared_context.contains_key("city"));
    let contents: Vec<&str> = loaded.state.agents["planner"].messages().iter().map(|m| m.content.as_str()).collect();
    assert_eq!(contents, ["fly to Oslo", "migrated to v3"]);
    assert!(!loaded.recorded_before);
    let recorded = loaded.recorded.expect("recorded");
    assert_eq!(store.agent_atoms(run, MIGRATION_AGENT), [recorded]);
    // History is never rewritten: the stored checkpoint and context are version 1's.
    let stored = store.load_latest_checkpoint(run).expect("load").expect("checkpoint");
    assert_eq!((stored.pipeline_version.as_str(), stored.shared_context.contains_key("city")), ("1", true));
    let head = stored.agent_heads["planner"];
    assert_eq!(store.rebuild_context(head).expect("rebuild").context.messages().len(), 1);

    // Loading again applies the chain and finds it recorded, before and after a reopen.
    let again = store.load_migrated_checkpoint(run, Some(1), "3", &migrations).expect("again").expect("cp");
    assert_eq!((again.recorded, again.recorded_before), (Some(recorded), true));
    assert_eq!(again.state, loaded.state);
    drop(store);
    let store = Store::open(dir.path()).expect("reopen");
    let reopened = store.load_migrated_checkpoint(run, None, "3", &migrations).expect("reopened").expect("cp");
    assert_eq!((reopened.recorded, reopened.recorded_before), (Some(recorded), true));
    assert_eq!(reopened.state, loaded.state);
    assert_eq!(store.agent_atoms(run, MIGRATION_AGENT).len(), 1, "recorded once");
    // Part of the chain is a migration of its own; the checkpoint's own version needs none.
    let to_v2 = store.load_migrated_checkpoint(run, None, "2", &migrations).expect("to v2").expect("cp");
    assert_eq!((to_v2.path.len(), to_v2.recorded_before), (2, false));
    let same = store.load_migrated_checkpoint(run, None, "1", &migrations).expect("v1").expect("cp");
    assert!(same.path.is_empty() && same.recorded.is_none());
    let metrics = store.metrics();
    assert_eq!((metrics.migrations_applied, metrics.migrations_failed), (2, 0), "counted since the reopen");
}

#[test]
fn a_missing_link_is_a_typed_error_naming_from_and_to() {
    let dir = tempfile::tempdir().expect("dir");
    let store = Store::open(dir.path()).expect("open");
    let run = run_at_v1(&store);
    let mut migrations = Migrations::new();
    migrations.register("1", "2", |_| Ok(())).expect("register");
    migrations.register("3", "4", |_| Ok(())).expect("register");
    let missing = store.load_migrated_checkpoint(run, None, "4", &migrations);
    assert!(matches!(&missing, Err(Error::NoMigrationPath { from, to }) if from == "1" && to == "4"), "{missing:?}");
    // A cycle is no chain either.
    migrations.register("2", "1", |_| Ok(())).expect("register");
    assert!(matches!(store.load_migrated_checkpoint(run, None, "5", &migrations), Err(Error::NoMigrationPath { .. })));
    assert!(store.agent_atoms(run, MIGRATION_AGENT).is_empty(), "nothing recorded");
    assert!(matches!(migrations.register("1", "3", |_| Ok(())), Err(Error::InvalidArgument { .. })));
    assert!(matches!(migrations.register("7", "7", |_| Ok(())), Err(Error::InvalidArgument { .. })));
    assert_eq!(store.metrics().migrations_failed, 2);
}

#[test]
fn a_failing_or_panicking_step_records_nothing_and_leaves_the_store_usable() {
    let dir = tempfile::tempdir().expect("dir");
    let store = Store::open(dir.path()).expect("open");
    let run = run_at_v1(&store);
    let mut panicking = Migrations::new();
    panicking.register("1", "2", |_| Ok(())).expect("register");
    panicking.register("2", "3", |_| panic!("schema v3 is not ready")).expect("register");
    let panicked = store.load_migrated_checkpoint(run, None, "3", &panicking);
    assert!(
        matches!(&panicked, Err(Error::MigrationFailed { from, to, message, panicked: true })
            if from == "2" && to == "3" && message.contains("not ready")),
        "{panicked:?}"
    );
    let mut failing = Migrations::new();
    failing.register("1", "2", |_| Err("the plan is malformed".to_owned())).expect("register");
    let failed = store.load_migrated_checkpoint(run, None, "2", &failing);
    assert!(matches!(&failed, Err(Error::MigrationFailed { panicked: false, .. })), "{failed:?}");
    assert!(store.agent_atoms(run, MIGRATION_AGENT).is_empty(), "nothing recorded");

    // The store goes on: checkpoints, atoms and a good migration.
    store.record_atom(run, "planner", "step-2", &[], "", &AtomOutput::default()).expect("atom");
    assert_eq!(
        store
            .write_checkpoint(run, CheckpointDraft::at("planner", "step-3").shared("city", b"Rome".to_vec()))
            .expect("cp"),
        2
    );
    let calls = Arc::new(AtomicU32::new(0));
    let loaded = store.load_migrated_checkpoint(run, None, "3", &chain(&calls)).expect("migrate").expect("cp");
    assert!(loaded.recorded.is_some());
    assert_eq!(store.metrics().migrations_failed, 2);
}
