//! An agent survives `SIGKILL`: run `cargo run --release --example demo`.
//!
//! A child process (this program, run with `--child DIR`) runs a simulated research agent: a
//! deterministic fake LLM plans each step, fake tools answer, and every fifth step books
//! something through a guarded side effect. Every step is one atom, run through
//! [`Store::execute`]. After about 400 ms the parent kills the child with `SIGKILL` in the middle
//! of its work, reopens the store (timing the rebuild), asks where the agent stands, and
//! resumes it in this process until the plan is done. It prints how many atoms were completed
//! before the crash, proves that none of them ran again and that no booking happened twice,
//! and reports the bytes on disk per atom. It exits non-zero if any promise was broken.
//!
//! Options: `--dir DIR` keeps the store in `DIR` (inspect it afterwards), `--kill-after-ms N`.

use std::collections::BTreeSet;
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use continuum::codec::proto::{ChatMessage, ToolCall, ToolOutput};
use continuum::synthetic::Transcript;
use continuum::{AtomFailure, AtomOutput, Error, RunSpec, Store};

const STEPS: u64 = 3_000;
const RUN: &str = "trip-research";
const AGENT: &str = "researcher";

type DemoResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("usage: demo [--dir DIR] [--kill-after-ms N]");
        return ExitCode::SUCCESS;
    }
    let outcome = match value("--child") {
        Some(dir) => run_plan(Path::new(&dir), &mut |line| {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        })
        .map(|_| true),
        None => {
            let kill_after = value("--kill-after-ms").and_then(|v| v.parse().ok()).unwrap_or(400);
            run_parent(value("--dir").map(PathBuf::from), Duration::from_millis(kill_after))
        }
    };
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("demo: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The agent: runs every step of the plan not yet completed. `report` hears "RUN n" when a
/// step's work starts and "DONE n" when the store acknowledged it.
fn run_plan(dir: &Path, report: &mut dyn FnMut(String)) -> DemoResult<u64> {
    let store = Store::open(dir)?;
    let run = store.create_run(RunSpec::new(RUN).pipeline("trip-research", "1.0").env("model", "fake-llm-1"))?;
    let mut parents = Vec::new();
    let mut replayed = 0;
    for step in 0..STEPS {
        let executed = store.execute(run, AGENT, &format!("step-{step}"), &parents, |atom| {
            report(format!("RUN {step}"));
            let output = fake_llm_and_tools(step);
            if step % 5 == 0 {
                book(&store, dir, atom).map_err(|e| AtomFailure { message: e.to_string(), retryable: true })?;
            }
            Ok(output)
        })?;
        replayed += u64::from(executed.replayed);
        report(format!("DONE {step}"));
        parents = vec![executed.atom];
    }
    store.sync()?;
    Ok(replayed)
}

/// A deterministic fake LLM thinking for a millisecond, then fake tools answering.
fn fake_llm_and_tools(step: u64) -> AtomOutput {
    std::thread::sleep(Duration::from_millis(1));
    let mut delta = Transcript::new(step).next_delta(500);
    let call_id = format!("call-{step}");
    delta.messages.push(ChatMessage {
        role: "assistant".into(),
        content: format!("Step {step}: checking flight options."),
        tool_call: Some(ToolCall {
            id: call_id.clone(),
            name: "flight_search".into(),
            arguments: format!("{{\"day\": {}}}", step % 30),
        }),
    });
    delta.tool_outputs.push(ToolOutput {
        tool_call_id: call_id,
        output: format!("{{\"fares\": [{}]}}", 90 + step % 50).into_bytes(),
    });
    AtomOutput { delta, result: format!("step {step} ok").into_bytes() }
}

/// A booking through an API that accepts idempotency keys; `bookings.txt` plays its ledger.
fn book(store: &Store, dir: &Path, atom: continuum::AtomId) -> continuum::Result<()> {
    let ledger = dir.join("bookings.txt");
    let perform = |key: &str| -> Result<Vec<u8>, continuum::AtomFailure> {
        if let Ok(mut file) = OpenOptions::new().create(true).append(true).open(&ledger) {
            // One write per line, so that a SIGKILL cannot leave half a line.
            let _ = file.write_all(format!("{key}\n").as_bytes());
            let _ = file.sync_all();
        }
        Ok(b"booked".to_vec())
    };
    match store.guarded(atom, "book", perform) {
        Ok(_) => Ok(()),
        Err(Error::GuardInDoubt { key }) => {
            // The ledger (the external API) knows whether the booking happened.
            let booked = std::fs::read_to_string(&ledger).unwrap_or_default().lines().any(|line| line == key);
            let result = if booked { b"booked".to_vec() } else { perform(&key).unwrap_or_default() };
            store.resolve_guard(&key, &result)
        }
        Err(error) => Err(error),
    }
}

fn run_parent(dir: Option<PathBuf>, kill_after: Duration) -> DemoResult<bool> {
    let temp = tempfile::tempdir()?;
    let dir = dir.unwrap_or_else(|| temp.path().to_path_buf());
    println!("continuum demo: an agent is killed with SIGKILL mid-run and resumes from its store");
    println!("  store:            {}", dir.display());
    let (acknowledged, started) = run_child_until_killed(&dir, kill_after)?;
    let opened = Instant::now();
    let store = Store::open(&dir)?;
    let rebuild = opened.elapsed();
    let run = store.run_id(RUN).ok_or("the child never created its run")?;
    let report = store.resume(run)?;
    let agent = report.agents.first().ok_or("the child completed no atom")?;
    println!("  child:            killed after {kill_after:?}; it had acknowledged {} atoms", acknowledged.len());
    println!(
        "  store on reopen:  {} atoms completed, resume at {}; rebuilt in {:.2} ms",
        agent.completed.len(),
        agent.first_incomplete.map_or("the next step".to_owned(), |a| format!("{a}")),
        rebuild.as_secs_f64() * 1e3
    );
    drop(store);
    let mut reran = Vec::new();
    let replayed = run_plan(&dir, &mut |line| {
        let step = line.strip_prefix("RUN ").and_then(|s| s.parse::<u64>().ok());
        if let Some(step) = step.filter(|step| acknowledged.contains(step)) {
            reran.push(step);
        }
    })?;
    let store = Store::open(&dir)?;
    let bookings = std::fs::read_to_string(dir.join("bookings.txt")).unwrap_or_default();
    let booking_keys: BTreeSet<&str> = bookings.lines().collect();
    let disk: u64 = store.log().segments().iter().map(|segment| segment.data_bytes).sum();
    let in_flight = started.len().saturating_sub(acknowledged.len());
    println!("  resumed:          {replayed} completed atoms returned their recorded output without running");
    println!("                    ({in_flight} step(s) had started but were not acknowledged when the child died)");
    println!("  re-executed:      {} of the {} acknowledged atoms", reran.len(), acknowledged.len());
    println!(
        "  bookings:         {} made, {} distinct (guarded, at most once per key)",
        bookings.lines().count(),
        booking_keys.len()
    );
    println!(
        "  on disk:          {} bytes for {STEPS} atoms = {:.0} bytes per atom as appended (500-byte deltas, stored plain until\n                    their segment is sealed and compaction compresses it: ~140 bytes per atom at rest)",
        disk,
        disk as f64 / STEPS as f64
    );
    println!("  index in memory:  {} bytes", store.index_heap_bytes());
    let ok = reran.is_empty()
        && bookings.lines().count() == booking_keys.len()
        && booking_keys.len() as u64 == STEPS.div_ceil(5);
    println!(
        "{}",
        if ok { "  result:           every promise kept" } else { "  result:           A PROMISE WAS BROKEN" }
    );
    Ok(ok)
}

/// Runs the agent in a child process and kills it; returns the steps it acknowledged and
/// the steps it started.
fn run_child_until_killed(dir: &Path, kill_after: Duration) -> DemoResult<(BTreeSet<u64>, BTreeSet<u64>)> {
    let mut child = Command::new(std::env::current_exe()?).arg("--child").arg(dir).stdout(Stdio::piped()).spawn()?;
    let stdout = child.stdout.take().ok_or("no child stdout")?;
    let reader = std::thread::spawn(move || BufReader::new(stdout).lines().map_while(Result::ok).collect::<Vec<_>>());
    std::thread::sleep(kill_after);
    child.kill()?;
    child.wait()?;
    let lines = reader.join().map_err(|_| "reader thread panicked")?;
    let steps =
        |prefix: &str| lines.iter().filter_map(|l| l.strip_prefix(prefix)?.parse().ok()).collect::<BTreeSet<u64>>();
    Ok((steps("DONE "), steps("RUN ")))
}
