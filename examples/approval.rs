//! A human approval across three processes: `cargo run --example approval`.
//!
//! An HR agent onboards a new hire and hands the account work to an `account` sub-agent, whose
//! `authorize_account` tool needs a person's approval. The scenario runs as three processes
//! (this program run with a phase), as it would in production, days apart:
//!
//! 1. `start DIR`: the agents work until the tool call; the run suspends with its nested
//!    continuation (`hr → account`, the pending `authorize_account` call), and the process exits.
//! 2. `approve DIR`: another process lists what waits across the store and approves it (who and
//!    when are recorded).
//! 3. `resume DIR`: a third resumes the run, rebuilds each agent's context from the store, runs
//!    the approved tool exactly once (through the idempotency guard: it appends a line to
//!    `DIR/../authorized-accounts.txt`), records the tool's result and HR's reply, and finishes
//!    the run. Running `resume` again runs nothing twice.
//!
//! Without a phase it runs the three in turn as child processes, in a temporary directory (or
//! `--dir DIR`), then prints how to look at the store with the dump tool:
//! `cargo run --example dump -- DIR suspended` between phases 1 and 3 shows the tree.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use continuum::codec::proto::{ChatMessage, ToolCall, ToolOutput};
use continuum::continuation::{Continuation, ContinuationLevel, Decision, SuspendReason, SuspendedFilter};
use continuum::{AtomOutput, Delta, Error, RunSpec, RunStatus, Store};

/// The run's name.
pub const RUN: &str = "onboard-ada";
/// The tool call that waits for approval.
pub const CALL: &str = "call-authorize-1";

type DemoResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// One chat message as an atom's output.
fn said(role: &str, content: &str, tool_call: Option<ToolCall>) -> AtomOutput {
    let message = ChatMessage { role: role.into(), content: content.into(), tool_call };
    AtomOutput { delta: Delta { messages: vec![message], ..Delta::default() }, result: Vec::new() }
}

/// Phase 1: the agents work until `authorize_account` needs approval; the run suspends.
pub fn start(dir: &Path) -> DemoResult<()> {
    let store = Store::open(dir)?;
    let run = store.create_run(RunSpec::new(RUN).pipeline("onboarding", "1.0"))?;
    let hr = store.record_atom(
        run,
        "hr",
        "plan",
        &[],
        "",
        &said("assistant", "Ada starts Monday: she needs an account.", None),
    )?;
    let call = ToolCall {
        id: CALL.into(),
        name: "authorize_account".into(),
        arguments: r#"{"user":"ada","groups":["engineering"]}"#.into(),
    };
    let account =
        store.record_atom(run, "account", "request", &[hr], "", &said("assistant", "", Some(call.clone())))?;
    let tree = ContinuationLevel::new("hr").head(hr).child(ContinuationLevel::new("account").head(account).request(
        call.id,
        call.name,
        call.arguments,
    ));
    let suspended = store.suspend(run, &Continuation::new(SuspendReason::Approval, tree))?;
    println!("[start] run {RUN} suspended (suspension {}): waiting for approval", suspended.number);
    store.close()?;
    Ok(())
}

/// Phase 2: list what waits across the store, and approve it.
pub fn approve(dir: &Path, by: &str) -> DemoResult<()> {
    let store = Store::open(dir)?;
    for waiting in store.suspended_runs(&SuspendedFilter::default()) {
        for request in &waiting.pending {
            println!(
                "[approve] {} waits on {} {} asked by {}",
                waiting.run_name,
                request.tool_name,
                request.arguments,
                request.path.join(" > ")
            );
            store.decide(waiting.id.run, &request.tool_call_id, &Decision::approve(by).message("welcome, Ada"))?;
            println!("[approve] approved by {by}");
        }
    }
    store.close()?;
    Ok(())
}

/// Phase 3: resume, run the approved tool once, finish the run. Safe to run again.
pub fn resume(dir: &Path, world: &Path) -> DemoResult<()> {
    let store = Store::open(dir)?;
    let run = store.run_id(RUN).ok_or("no such run")?;
    let resumed = match store.run_status(run)? {
        RunStatus::Suspended { .. } => store.resume_suspended(run)?,
        // Resumed before (a process died after it): the same answer, read back.
        _ => store.resumed(run)?.ok_or("the run was never suspended")?,
    };
    let account = resumed.level(&["hr", "account"]).ok_or("no account level")?;
    let history = store.rebuild_context(account.head.ok_or("no head")?)?.context;
    println!("[resume] account continues after {} message(s) of its context", history.messages().len());
    for decided in resumed.decided() {
        let result = store.run_approved(decided, |call| {
            // The side effect: at most once, whatever happens to this process.
            let line = format!("{} {}\n", call.idempotency_key, call.arguments);
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(world)
                .and_then(|mut file| std::io::Write::write_all(&mut file, line.as_bytes()))
                .map_err(|e| continuum::AtomFailure { message: e.to_string(), retryable: true })?;
            Ok(b"account ada created".to_vec())
        })?;
        let output = AtomOutput {
            delta: Delta {
                tool_outputs: vec![ToolOutput { tool_call_id: decided.request.tool_call_id.clone(), output: result }],
                ..Delta::default()
            },
            result: Vec::new(),
        };
        record_once(&store, run, "account", "tool-result", account.head, &output)?;
    }
    let parent = store.last_agent_atom(run, "account");
    record_once(&store, run, "hr", "reply", parent, &said("assistant", "Ada's account is ready.", None))?;
    if store.run_status(run)? == RunStatus::Running {
        store.finish_run(run, true, "onboarded")?;
    }
    println!("[resume] {RUN} finished; the tool ran {} time(s)", tool_runs(world));
    store.close()?;
    Ok(())
}

/// Records a step unless an earlier process recorded it (its key names it across processes).
fn record_once(
    store: &Store,
    run: continuum::RunId,
    agent: &str,
    key: &str,
    parent: Option<continuum::AtomId>,
    output: &AtomOutput,
) -> DemoResult<()> {
    let parents: Vec<_> = parent.into_iter().collect();
    match store.record_atom(run, agent, key, &parents, "", output) {
        Ok(_) | Err(Error::AtomExists { .. }) | Err(Error::RunFinished { .. }) => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// How many times the approved tool ran (lines in the side-effect file).
pub fn tool_runs(world: &Path) -> usize {
    std::fs::read_to_string(world).map_or(0, |text| text.lines().count())
}

/// The side-effect file of a store at `dir`.
pub fn world_of(dir: &Path) -> PathBuf {
    dir.with_file_name(format!(
        "{}-authorized-accounts.txt",
        dir.file_name().map_or_else(|| "store".into(), |n| n.to_string_lossy())
    ))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("start") => start(Path::new(&args[1])),
        Some("approve") => approve(Path::new(&args[1]), "it-lead@example.com"),
        Some("resume") => resume(Path::new(&args[1]), &world_of(Path::new(&args[1]))),
        _ => all_phases(args.iter().position(|a| a == "--dir").and_then(|i| args.get(i + 1)).map(PathBuf::from)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("approval: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the three phases as child processes of this program.
fn all_phases(dir: Option<PathBuf>) -> DemoResult<()> {
    let temp = tempfile::tempdir()?;
    let dir = dir.unwrap_or_else(|| temp.path().join("store"));
    let exe = std::env::current_exe()?;
    for phase in ["start", "approve", "resume", "resume"] {
        let status = Command::new(&exe).arg(phase).arg(&dir).status()?;
        if !status.success() {
            return Err(format!("phase {phase} failed: {status}").into());
        }
    }
    let runs = tool_runs(&world_of(&dir));
    println!("The tool ran {runs} time(s) over two resumes.");
    if dir.starts_with(temp.path()) {
        println!("Run with --dir DIR to keep the store and look at it with the dump tool.");
    } else {
        println!("Look at the store: cargo run --example dump -- {} run {RUN}", dir.display());
    }
    if runs != 1 {
        return Err("the approved tool did not run exactly once".into());
    }
    Ok(())
}
