//! Golden tests of `examples/dump.rs`, the store inspection tool (`dump_live.rs` runs the
//! compiled tool against a store another process is writing).
//!
//! The store is built record by record with fixed timestamps, so every output is
//! deterministic; each is compared byte for byte with `tests/golden/dump/*` (text and JSON).
//! `UPDATE_GOLDEN=1 cargo test --test dump` rewrites them. Guards against: output that drifts
//! silently, `--json` that stops parsing, `verify` that misses damage or names the wrong file
//! or offset (the corrupted-store case).

#[allow(dead_code, reason = "the example's `main` is not called here")]
#[path = "../examples/dump.rs"]
mod dump;

use std::path::{Path, PathBuf};

use continuum::codec::StoreRecord;
use continuum::codec::proto::{
    ApprovalReason, ContinuationEvent, ContinuationLevel, DecisionRecord, PendingToolCall, Resumption, SuspendReason,
    Suspension, continuation_event, suspend_reason,
};
use continuum::codec::proto::{
    AtomCompleted, AtomFailed, AtomStarted, AtomsAbandoned, ChatMessage, Delta, GuardCompleted, GuardStarted,
    IntermediateResult, RunCreated, RunTerminal, StateChange, ToolCall, ToolOutput, state_change,
};
use continuum::{AtomId, Log, Store};

/// 2026-01-01T00:00:00Z in microseconds.
const T0: u64 = 1_767_225_600_000_000;
const SEGMENT_BYTES: u64 = 4096;

fn started(atom: u64, run: u64, agent: &str, key: &str, parents: &[u64], idempotency: &str, at_ms: u64) -> StoreRecord {
    StoreRecord::AtomStarted(AtomStarted {
        atom,
        run,
        agent: agent.into(),
        key: key.into(),
        parents: parents.to_vec(),
        idempotency_key: idempotency.into(),
        started_at_unix_us: T0 + at_ms * 1000,
    })
}

fn completed(atom: u64, delta: Delta, result: &str, at_ms: u64) -> StoreRecord {
    StoreRecord::AtomCompleted(AtomCompleted {
        atom,
        delta: Some(delta),
        result: result.as_bytes().to_vec(),
        ended_at_unix_us: T0 + at_ms * 1000,
    })
}

fn message(role: &str, content: &str) -> ChatMessage {
    ChatMessage { role: role.into(), content: content.into(), tool_call: None }
}

fn set(key: &str, value: &str) -> StateChange {
    StateChange { key: key.into(), change: Some(state_change::Change::Set(value.as_bytes().to_vec())) }
}

/// A tool output of `lines` lines of pseudo-random fares: large enough to fill segments even
/// compressed.
fn report_text(seed: u64, lines: u64) -> String {
    let mut random = continuum::synthetic::SplitMix64::new(seed);
    (0..lines).map(|i| format!("row {i}: fare {:012x}\n", random.next_u64() >> 16)).collect()
}

/// The store of the golden tests: two runs; a fork (atoms 2 and 3 from 1), a merge (4 from 2
/// and 3), a rollback that abandons 4, a retryable failure, a guard, a finished run and a
/// running atom; two segments and one snapshot.
fn build_store(dir: &Path) {
    let run1 = StoreRecord::RunCreated(RunCreated {
        run: 1,
        run_name: "trip-42".into(),
        pipeline: "travel-agent".into(),
        pipeline_version: "1.3".into(),
        environment: [("model".to_owned(), "m-1".to_owned())].into_iter().collect(),
        created_at_unix_us: T0,
        ..RunCreated::default()
    });
    let plan = Delta {
        messages: vec![
            message("user", "Book me a trip to Paris on Tuesday"),
            ChatMessage {
                role: "assistant".into(),
                content: "Searching flights".into(),
                tool_call: Some(ToolCall {
                    id: "call-1".into(),
                    name: "search_flights".into(),
                    arguments: r#"{"to":"CDG","day":"tue"}"#.into(),
                }),
            },
        ],
        tool_outputs: vec![ToolOutput { tool_call_id: "call-1".into(), output: br#"{"flights":["AF123"]}"#.to_vec() }],
        state_changes: vec![set("destination", "Paris")],
        ..Delta::default()
    };
    let book = Delta {
        messages: vec![message("assistant", "Booked AF123")],
        intermediate_results: vec![IntermediateResult { name: "booking".into(), value: b"ABC123".to_vec() }],
        state_changes: vec![
            set("booking", "ABC123"),
            StateChange { key: "destination".into(), change: Some(state_change::Change::Delete(Default::default())) },
        ],
        ..Delta::default()
    };
    let records = vec![
        run1,
        started(1, 1, "planner", "step-1", &[], "", 1),
        completed(1, plan, "plan ready", 5),
        started(2, 1, "planner", "step-2", &[1], "trip-42/planner/step-2/book", 6),
        StoreRecord::GuardStarted(GuardStarted {
            key: "trip-42/planner/step-2/book".into(),
            atom: 2,
            operation: "book".into(),
            started_at_unix_us: T0 + 7000,
        }),
        StoreRecord::GuardCompleted(GuardCompleted {
            key: "trip-42/planner/step-2/book".into(),
            result: b"ABC123".to_vec(),
            ended_at_unix_us: T0 + 9000,
        }),
        completed(2, book, "booked", 10),
        started(3, 1, "researcher", "hotels", &[1], "", 11),
        StoreRecord::AtomFailed(AtomFailed {
            atom: 3,
            error: "hotel API timed out".into(),
            retryable: true,
            ended_at_unix_us: T0 + 20_000,
        }),
        started(4, 1, "planner", "step-3", &[2, 3], "", 21),
        completed(
            4,
            Delta {
                tool_outputs: vec![ToolOutput {
                    tool_call_id: "call-2".into(),
                    output: report_text(4, 60).into_bytes(),
                }],
                ..Delta::default()
            },
            "itinerary v1",
            25,
        ),
        StoreRecord::AtomsAbandoned(AtomsAbandoned {
            after_atom: 2,
            run: 1,
            agent: "planner".into(),
            reason: "wrong dates".into(),
            at_unix_us: T0 + 26_000,
        }),
        started(5, 1, "planner", "step-3", &[2], "", 27),
        completed(
            5,
            Delta {
                messages: vec![message("assistant", "Itinerary: AF123 on Wednesday")],
                tool_outputs: vec![ToolOutput {
                    tool_call_id: "call-3".into(),
                    output: report_text(5, 60).into_bytes(),
                }],
                ..Delta::default()
            },
            "itinerary v2",
            30,
        ),
        StoreRecord::RunTerminal(RunTerminal {
            run: 1,
            success: true,
            resume_hint: "booked AF123, itinerary sent".into(),
            ended_at_unix_us: T0 + 31_000,
        }),
        StoreRecord::RunCreated(RunCreated {
            run: 2,
            run_name: "nightly-report".into(),
            pipeline: "research".into(),
            pipeline_version: "0.9".into(),
            environment: Default::default(),
            created_at_unix_us: T0 + 40_000,
            ..RunCreated::default()
        }),
        started(6, 2, "writer", "draft", &[], "", 41),
        completed(
            6,
            Delta {
                tool_outputs: vec![ToolOutput {
                    tool_call_id: "fetch".into(),
                    output: report_text(6, 150).into_bytes(),
                }],
                ..Delta::default()
            },
            "draft 1",
            45,
        ),
        started(7, 2, "writer", "polish", &[6], "", 46),
    ];
    let log = Log::builder(dir).segment_bytes(SEGMENT_BYTES).open().expect("open the log");
    for record in &records {
        log.append(&continuum::inspect::encode_record(record)).expect("append");
    }
    log.close().expect("close the log");
    let store = Store::builder(dir).segment_bytes(SEGMENT_BYTES).background(false).open().expect("open the store");
    store.snapshot_now(AtomId::from_raw(2)).expect("snapshot of atom 2");
    drop(store);
}

/// A continuation event as a control atom's result.
fn event(event: continuation_event::Event) -> Vec<u8> {
    use prost::Message;
    ContinuationEvent { event: Some(event) }.encode_to_vec()
}

/// A control atom's completion: an empty delta, `result`.
fn control_completed(atom: u64, result: Vec<u8>, at_ms: u64) -> StoreRecord {
    StoreRecord::AtomCompleted(AtomCompleted {
        atom,
        delta: Some(Delta::default()),
        result,
        ended_at_unix_us: T0 + at_ms * 1000,
    })
}

/// The store of the suspended-runs golden tests, with fixed times: the talk's run (hr →
/// account → authorize_account) suspended for approval of two calls, one approved with edited
/// arguments; a run waiting on a timer; a run suspended and resumed.
fn build_suspended_store(dir: &Path) {
    let run = |run: u64, name: &str| {
        StoreRecord::RunCreated(RunCreated {
            run,
            run_name: name.into(),
            created_at_unix_us: T0,
            ..RunCreated::default()
        })
    };
    let call = |id: &str, name: &str, arguments: &str| PendingToolCall {
        tool_call_id: id.into(),
        tool_name: name.into(),
        arguments: arguments.into(),
    };
    let level = |agent: &str, head: u64, calls: Vec<PendingToolCall>, children: Vec<ContinuationLevel>| {
        ContinuationLevel { agent: agent.into(), head_atom: head, resume_request: calls, children }
    };
    let suspension = |number: u64, reason: suspend_reason::Reason, at_ms: u64, root: ContinuationLevel| {
        event(continuation_event::Event::Suspension(Suspension {
            number,
            reason: Some(SuspendReason { reason: Some(reason) }),
            since_unix_us: T0 + at_ms * 1000,
            root: Some(root),
        }))
    };
    let tree = level(
        "hr",
        1,
        vec![],
        vec![level(
            "account",
            2,
            vec![],
            vec![level(
                "authorize_account",
                3,
                vec![
                    call("call-7", "authorize_account", r#"{"user":"ada","role":"admin"}"#),
                    call("call-8", "grant_vpn", r#"{"user":"ada"}"#),
                ],
                vec![],
            )],
        )],
    );
    let approval = suspend_reason::Reason::Approval(ApprovalReason {});
    let decision = event(continuation_event::Event::Decision(DecisionRecord {
        suspension: 1,
        tool_call_id: "call-7".into(),
        approved: true,
        message: Some("as a user, not an admin".into()),
        edited_arguments: Some(r#"{"user":"ada","role":"user"}"#.into()),
        decided_by: "it-lead".into(),
        decided_at_unix_us: T0 + 20_000,
    }));
    let timer = suspend_reason::Reason::TimerResumeAtUnixUs(T0 + 3_600_000_000);
    let agent = "continuum.continuation";
    let resumption =
        event(continuation_event::Event::Resumption(Resumption { suspension: 1, resumed_at_unix_us: T0 + 40_000 }));
    let records = vec![
        run(1, "onboarding"),
        started(1, 1, "hr", "turn-1", &[], "", 1),
        completed(1, Delta::default(), "delegate", 2),
        started(2, 1, "account", "turn-1", &[1], "", 3),
        completed(2, Delta::default(), "delegate", 4),
        started(3, 1, "authorize_account", "turn-1", &[2], "", 5),
        completed(3, Delta::default(), "needs approval", 6),
        started(4, 1, agent, "suspend/1", &[], "", 10),
        control_completed(4, suspension(1, approval.clone(), 10, tree), 10),
        started(5, 1, agent, "decision/1/call-7", &[], "", 20),
        control_completed(5, decision, 20),
        run(2, "reminder"),
        started(6, 2, agent, "suspend/1", &[], "", 30),
        control_completed(6, suspension(1, timer, 30, level("scheduler", 0, vec![], vec![])), 30),
        run(3, "resumed"),
        started(7, 3, agent, "suspend/1", &[], "", 35),
        control_completed(7, suspension(1, approval, 35, level("a", 0, vec![call("c", "t", "{}")], vec![])), 35),
        started(8, 3, agent, "resume/1", &[], "", 40),
        control_completed(8, resumption, 40),
    ];
    let log = Log::builder(dir).segment_bytes(SEGMENT_BYTES).open().expect("open the log");
    for record in &records {
        log.append(&continuum::inspect::encode_record(record)).expect("append");
    }
    log.close().expect("close the log");
}

#[test]
fn golden_outputs_of_suspended_runs() {
    let dir = tempfile::tempdir().expect("temporary directory");
    build_suspended_store(dir.path());
    let cases: &[(&str, &[&str], Option<bool>)] = &[
        ("suspended.txt", &["suspended"], None),
        ("suspended.jsonl", &["suspended", "--json"], Some(true)),
        ("runs-suspended.txt", &["runs"], None),
        ("summary-suspended.json", &["summary", "--json"], Some(false)),
    ];
    for (name, args, json) in cases {
        let (code, out, err) = dump(dir.path(), args);
        assert_eq!(code, 0, "dump {args:?} failed: {err}");
        if let Some(lines) = json {
            check_json(&out, *lines);
        }
        check_golden(name, &out);
    }
    let (_, text, _) = dump(dir.path(), &["suspended"]);
    assert!(text.contains("hr > account > authorize_account"), "the path of a nested request:\n{text}");
    assert!(text.contains("approved by it-lead"), "{text}");
    assert!(!text.contains("\"resumed\""), "a resumed run is not suspended:\n{text}");
}

/// A fresh golden store in a temporary directory.
fn golden_store() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temporary directory");
    build_store(dir.path());
    dir
}

/// Runs dump in-process; returns (exit code, stdout, stderr).
fn dump(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let mut argv = vec!["dump".to_owned(), dir.display().to_string()];
    argv.extend(args.iter().map(|a| (*a).to_owned()));
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = dump::run(argv, &mut out, &mut err);
    (code, String::from_utf8(out).expect("UTF-8 stdout"), String::from_utf8(err).expect("UTF-8 stderr"))
}

fn golden_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/dump").join(name)
}

/// Compares `actual` with the golden file, or rewrites it under `UPDATE_GOLDEN=1`.
fn check_golden(name: &str, actual: &str) {
    let path = golden_path(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().expect("golden dir")).expect("create golden dir");
        std::fs::write(&path, actual).expect("write golden file");
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with UPDATE_GOLDEN=1 to create it)", path.display()));
    if expected != actual {
        panic!(
            "dump output differs from {} (UPDATE_GOLDEN=1 rewrites it)\n--- expected\n{expected}\n--- actual\n{actual}",
            path.display()
        );
    }
}

/// Every JSON output parses: one document, or one per line.
fn check_json(output: &str, lines: bool) {
    if lines {
        for line in output.lines() {
            serde_json::from_str::<serde_json::Value>(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        }
    } else {
        serde_json::from_str::<serde_json::Value>(output).unwrap_or_else(|e| panic!("{e}: {output}"));
    }
}

#[test]
fn golden_outputs_of_every_command() {
    let store = golden_store();
    let cases: &[(&str, &[&str], Option<bool>)] = &[
        ("summary.txt", &[], None),
        ("summary.json", &["summary", "--json"], Some(false)),
        ("records.txt", &["records"], None),
        ("records.jsonl", &["records", "--json"], Some(true)),
        ("records-filtered.txt", &["records", "--from", "3", "--to", "14", "--kind", "atom-started"], None),
        ("runs.txt", &["runs"], None),
        ("runs.jsonl", &["runs", "--json"], Some(true)),
        ("run-1.txt", &["run", "1"], None),
        ("run-1.json", &["run", "trip-42", "--json"], Some(false)),
        ("atom-1.txt", &["atom", "1"], None),
        ("atom-2.json", &["atom", "2", "--json"], Some(false)),
        ("context-planner.txt", &["context", "trip-42", "planner"], None),
        ("context-planner-at-4.json", &["context", "1", "planner", "--at", "4", "--json"], Some(false)),
        ("verify.txt", &["verify"], None),
        ("verify.json", &["verify", "--json"], Some(false)),
    ];
    for (name, args, json) in cases {
        let (code, out, err) = dump(store.path(), args);
        assert_eq!(code, 0, "dump {args:?} failed: {err}");
        assert!(err.is_empty(), "dump {args:?} wrote to stderr: {err}");
        if let Some(lines) = json {
            check_json(&out, *lines);
        }
        check_golden(name, &out);
    }
}

#[test]
fn help_explains_every_command() {
    let store = golden_store();
    let (code, out, _) = dump(store.path(), &["--help"]);
    assert_eq!(code, 0);
    for command in
        ["summary", "records", "runs", "run", "atom", "context", "checkpoints", "suspended", "verify", "--json"]
    {
        assert!(out.contains(command), "--help does not mention {command}:\n{out}");
    }
    check_golden("help.txt", &out);
    let (code, _, err) = dump(store.path(), &["no-such-command"]);
    assert_eq!(code, 2);
    assert!(err.contains("no-such-command"), "{err}");
}

#[test]
fn verify_reports_the_file_and_offset_of_every_problem_and_fails() {
    let store = golden_store();
    let segment = store.path().join("00000000000000000001.seg");
    let snapshot = store.path().join("snapshots/00000000000000000002.snap");
    // The first frame starts right after the 64-byte segment header; its payload at 64 + 32.
    flip_byte(&segment, 64 + 40);
    flip_byte(&snapshot, 100);
    let (code, out, err) = dump(store.path(), &["verify"]);
    assert_eq!(code, 1, "verify of a corrupted store must fail: {out}{err}");
    assert!(out.contains("PROBLEM 00000000000000000001.seg offset 64: "), "{out}");
    assert!(out.contains("PROBLEM snapshots/00000000000000000002.snap offset 48: "), "{out}");
    check_golden("verify-corrupted.txt", &out);
    let (code, out, _) = dump(store.path(), &["verify", "--json"]);
    assert_eq!(code, 1);
    check_json(&out, false);
    check_golden("verify-corrupted.json", &out);
    // Record 1 (run 1's creation) is lost, so the index cannot be rebuilt: the summary shows
    // what the log alone tells and fails; every record that verifies is still listed.
    let (code, out, err) = dump(store.path(), &["summary"]);
    assert_eq!(code, 2, "the lost record breaks the index: {out}");
    assert!(err.contains("cannot read the store"), "{err}");
    check_golden("summary-corrupted.txt", &out);
    let (code, out, err) = dump(store.path(), &["records"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 18, "every record but the lost one: {out}");
    assert!(out.starts_with("     2  AtomStarted"), "{out}");
    let (code, _, err) = dump(store.path(), &["runs"]);
    assert_eq!(code, 2);
    assert!(err.contains("verify"), "{err}");
}

#[test]
fn a_torn_tail_is_reported_not_cut() {
    let store = golden_store();
    let segments = Log::open_read_only(store.path()).expect("read-only open").segments();
    assert_eq!(segments.len(), 2, "the golden store has a sealed and an active segment");
    let (last, data_end) = (segments[1].path.clone(), segments[1].data_bytes);
    let before = std::fs::read(&last).expect("read");
    let mut torn = before.clone();
    // The close trimmed the file to its data: the garbage a crash could leave goes past it.
    torn.resize(torn.len().max(data_end as usize + 100), 0);
    torn[data_end as usize..data_end as usize + 100].fill(0xEE);
    std::fs::write(&last, &torn).expect("tear");
    let (code, out, _) = dump(store.path(), &["summary"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!("recovery: torn tail in 00000000000000000018.seg at offset {data_end}, 100 bytes")),
        "{out}"
    );
    let (code, out, _) = dump(store.path(), &["verify"]);
    assert_eq!(code, 1);
    assert!(
        out.contains(&format!("PROBLEM 00000000000000000018.seg offset {data_end}: torn tail: 100 invalid bytes")),
        "{out}"
    );
    assert_eq!(std::fs::read(&last).expect("read"), torn, "dump changed the segment");
}

#[test]
fn the_summary_says_whether_the_index_came_from_an_index_snapshot() {
    let store = golden_store();
    let covered = {
        let opened = Store::builder(store.path()).background(false).open().expect("open");
        opened.write_index_snapshot().expect("index snapshot")
    };
    let (code, out, _) = dump(store.path(), &["summary"]);
    assert_eq!(code, 0, "{out}");
    let expected =
        format!("index snapshot: used (covers the records below LSN {}; 0 records folded after it)", covered.get());
    assert!(out.contains(&expected), "{out}");
    let path = store.path().join("index.snapshot");
    // The first body byte: after the 48-byte header (docs/FORMAT.md §9a).
    flip_byte(&path, 49);
    let (code, out, _) = dump(store.path(), &["summary"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("index snapshot: IGNORED (body checksum mismatch); the open folded every record"), "{out}");
}

#[test]
fn verify_reports_records_lost_from_the_end_of_the_log() {
    // The last segment replaced by an older copy of itself: every frame verifies, but the index
    // index snapshot covers records the log no longer has. `verify` exited 0.
    let store = golden_store();
    let segments = |dir: &Path| -> Vec<(PathBuf, Vec<u8>)> {
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .expect("list")
            .map(|entry| entry.expect("entry").path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "seg"))
            .map(|path| (path.clone(), std::fs::read(&path).expect("read")))
            .collect();
        files.sort();
        files
    };
    let older = segments(store.path());
    {
        let opened = Store::builder(store.path()).background(false).open().expect("open");
        let run = opened.create_run(continuum::RunSpec::new("lost")).expect("run");
        let atom = opened.begin_atom(run, "planner", "lost-step", &[], "").expect("begin");
        opened.complete_atom(atom, &continuum::AtomOutput::default()).expect("complete");
        opened.write_index_snapshot().expect("index snapshot");
    }
    for (path, _) in segments(store.path()) {
        std::fs::remove_file(path).expect("remove");
    }
    for (path, bytes) in older {
        std::fs::write(path, bytes).expect("restore the older copy");
    }
    let (code, out, err) = dump(store.path(), &["verify"]);
    assert_eq!(code, 1, "verify of a store that lost records must fail: {out}{err}");
    // The log manifest is the first witness (the segment ends before the end it recorded); the
    // index snapshot's is reported when the segments themselves verify.
    assert!(out.contains("records lost"), "{out}");
}

fn flip_byte(path: &Path, offset: usize) {
    let mut bytes = std::fs::read(path).expect("read file");
    bytes[offset] ^= 0x40;
    std::fs::write(path, bytes).expect("write file");
}

#[test]
fn verify_fails_on_records_lost_from_the_end_of_the_log() {
    let store = golden_store();
    let segments = Log::open_read_only(store.path()).expect("read-only open").segments();
    let last = segments[1].path.clone();
    // Cut at the first frame boundary: records 18 and 19 are gone, nothing torn is left.
    let file = std::fs::OpenOptions::new().write(true).open(&last).expect("open");
    file.set_len(64).expect("truncate");
    drop(file);
    let (code, out, _) = dump(store.path(), &["verify"]);
    assert_eq!(code, 1, "verify of a store that lost records must fail: {out}");
    assert!(out.contains("PROBLEM 00000000000000000018.seg offset 0: records lost from the end of the log"), "{out}");
    let (code, out, _) = dump(store.path(), &["summary"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("recovery: RECORDS LOST"), "{out}");
    assert!(out.contains("LSNs 18..=19"), "{out}");
}

/// A store with one run, one agent atom and two checkpoints (the newest terminal), written
/// record by record with fixed timestamps.
fn checkpoint_store(dir: &Path) {
    use continuum::codec::proto::RunCheckpoint;
    use prost::Message;
    let checkpoint = |sequence: u64, position: &str, terminal: bool| RunCheckpoint {
        sequence,
        run: 1,
        pipeline: "travel-agent".into(),
        pipeline_version: "1.3".into(),
        current_agent: "planner".into(),
        position: position.into(),
        shared_context: [("plan".to_owned(), b"fly tuesday".to_vec())].into_iter().collect(),
        agent_heads: [("planner".to_owned(), 1)].into_iter().collect(),
        environment: [("model".to_owned(), "m-1".to_owned())].into_iter().collect(),
        is_terminal: terminal,
        resume_hint: format!("resume at {position}"),
        side_effects_committed: vec!["trip-42#1/planner/step-1/book_flight".into()],
        written_at_unix_us: T0 + sequence * 1_000_000,
        ..RunCheckpoint::default()
    };
    let records = [
        StoreRecord::RunCreated(RunCreated {
            run: 1,
            run_name: "trip-42".into(),
            pipeline: "travel-agent".into(),
            pipeline_version: "1.3".into(),
            created_at_unix_us: T0,
            ..RunCreated::default()
        }),
        started(1, 1, "planner", "step-1", &[], "", 0),
        completed(1, Delta { messages: vec![message("user", "Paris")], ..Delta::default() }, "ok", 1),
        started(2, 1, "continuum.checkpoint", "checkpoint/1", &[], "", 1000),
        StoreRecord::AtomCompleted(AtomCompleted {
            atom: 2,
            delta: Some(Delta::default()),
            result: checkpoint(1, "step-2", false).encode_to_vec(),
            ended_at_unix_us: T0 + 1_000_000,
        }),
        started(3, 1, "continuum.checkpoint", "checkpoint/2", &[], "", 2000),
        StoreRecord::AtomCompleted(AtomCompleted {
            atom: 3,
            delta: Some(Delta::default()),
            result: checkpoint(2, "done", true).encode_to_vec(),
            ended_at_unix_us: T0 + 2_000_000,
        }),
    ];
    let log = Log::builder(dir).segment_bytes(SEGMENT_BYTES).open().expect("open the log");
    for record in &records {
        log.append(&continuum::inspect::encode_record(record)).expect("append");
    }
    log.close().expect("close the log");
}

#[test]
fn checkpoints_are_listed_newest_first_in_text_and_json() {
    let dir = tempfile::tempdir().expect("temporary directory");
    checkpoint_store(dir.path());
    let cases: &[(&str, &[&str], bool)] = &[
        ("checkpoints.txt", &["checkpoints", "trip-42"], false),
        ("checkpoints.json", &["checkpoints", "1", "--json"], true),
    ];
    for (name, args, json) in cases {
        let (code, out, err) = dump(dir.path(), args);
        assert_eq!(code, 0, "dump {args:?} failed: {err}");
        if *json {
            check_json(&out, false);
        }
        check_golden(name, &out);
    }
    let (code, out, _) = dump(dir.path(), &["checkpoints", "trip-42", "--limit", "1"]);
    assert_eq!(code, 0);
    assert!(out.contains("#2 ") && !out.contains("#1 "), "{out}");
    let (code, _, err) = dump(dir.path(), &["checkpoints", "no-such-run"]);
    assert_eq!((code, err.contains("no-such-run")), (2, true), "{err}");
}

/// `dump DIR atom N` decodes a channel's message (its sender and payload) and a consumer's
/// offset atom (the message ids it consumed).
#[test]
fn atom_decodes_channel_messages_and_consumer_offsets() {
    let dir = tempfile::tempdir().expect("dir");
    let (message, offset) = {
        let store = continuum::Store::open(dir.path()).expect("open");
        let run = store.create_run(continuum::RunSpec::new("team")).expect("run");
        let sent = store
            .execute_with(run, "planner", "plan", &[], |x| {
                x.send("tasks", "book a flight")?;
                Ok(continuum::AtomOutput::default())
            })
            .expect("send");
        store
            .execute_with(run, "worker", "w1", &[], |x| {
                x.receive("tasks", "w", 1)?;
                Ok(continuum::AtomOutput::default())
            })
            .expect("receive");
        let message = store.agent_atoms(run, "continuum.channel/tasks")[0];
        let offset = store.agent_atoms(run, "continuum.consumer/tasks/w")[0];
        assert!(message > sent.executed.atom);
        (message, offset)
    };
    let (code, out, err) = dump(dir.path(), &["atom", &message.get().to_string()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("message from atom 1: \"book a flight\""), "{out}");
    let (code, out, err) = dump(dir.path(), &["atom", &offset.get().to_string()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&format!("consumed messages {}..={}", 1, message.get())), "{out}");
}

/// `dump DIR atom N` decodes a shared-state version atom (bytes and counter).
#[test]
fn atom_decodes_shared_state_versions() {
    let dir = tempfile::tempdir().expect("dir");
    let (put, add) = {
        let store = continuum::Store::open(dir.path()).expect("open");
        let run = store.create_run(continuum::RunSpec::new("team")).expect("run");
        store
            .execute_with(run, "writer", "w1", &[], |x| {
                x.put("plan", "fly tuesday")?;
                x.add("spent", -42)?;
                Ok(continuum::AtomOutput::default())
            })
            .expect("write");
        (store.agent_atoms(run, "continuum.state/plan")[0], store.agent_atoms(run, "continuum.state/spent")[0])
    };
    let (code, out, err) = dump(dir.path(), &["atom", &put.get().to_string()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("version 1: \"fly tuesday\""), "{out}");
    let (code, out, err) = dump(dir.path(), &["atom", &add.get().to_string()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("version 1: counter -42"), "{out}");
}
