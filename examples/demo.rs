//! The crash-safety promise, shown with a real crash: run
//! `cargo run --release --example demo`.
//!
//! The demo starts a child process (this same program, run with `--child DIR`) in which four
//! agents append their steps to one log with [`Durability::Sync`]: single records and small
//! batches, sharing `fdatasync`s through group commit. The child prints every append the log
//! acknowledged. After about 300 ms the parent kills it with `SIGKILL`, in the middle of its
//! writes, then reopens the log, which runs recovery, and checks that every acknowledged record
//! is there, byte for byte. It prints what it found and exits non-zero if anything is missing.
//!
//! Options: `--dir DIR` keeps the log in `DIR` (a run on an existing log appends after its
//! records) instead of a temporary directory; `--kill-after-ms N` changes the 300 ms.

use std::collections::BTreeMap;
use std::error::Error;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use continuum::{Durability, Log, Lsn};

/// Agents appending concurrently in the child.
const AGENTS: u64 = 4;
/// Segment size of the demo log: small enough that a run rotates segments.
const SEGMENT_BYTES: u64 = 1024 * 1024;
const KILL_AFTER_MS_DEFAULT: u64 = 300;

type DemoResult<T> = Result<T, Box<dyn Error + Send + Sync>>;

fn main() -> ExitCode {
    match parse_args(std::env::args().skip(1)) {
        Ok(Mode::Child { dir }) => match run_child(&dir) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(&format!("child: {e}")),
        },
        Ok(Mode::Parent { dir, kill_after }) => match run_parent(dir, kill_after) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::FAILURE,
            Err(e) => fail(&e.to_string()),
        },
        Ok(Mode::Help) => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        Err(e) => fail(&format!("{e}\n{USAGE}")),
    }
}

const USAGE: &str = "usage: demo [--dir DIR] [--kill-after-ms N]";

fn fail(message: &str) -> ExitCode {
    eprintln!("demo: {message}");
    ExitCode::FAILURE
}

enum Mode {
    Parent { dir: Option<PathBuf>, kill_after: Duration },
    Child { dir: PathBuf },
    Help,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> DemoResult<Mode> {
    let mut dir = None;
    let mut kill_after = Duration::from_millis(KILL_AFTER_MS_DEFAULT);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--child" => return Ok(Mode::Child { dir: args.next().ok_or("--child needs a directory")?.into() }),
            "--dir" => dir = Some(args.next().ok_or("--dir needs a directory")?.into()),
            "--kill-after-ms" => {
                let ms = args.next().ok_or("--kill-after-ms needs a number")?;
                kill_after = Duration::from_millis(ms.parse().map_err(|_| format!("not a number of ms: {ms}"))?);
            }
            "-h" | "--help" => return Ok(Mode::Help),
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }
    Ok(Mode::Parent { dir, kill_after })
}

/// The record `step` of `agent`: readable text, with a length that varies from step to step.
fn record(agent: u64, step: u64) -> Vec<u8> {
    const KINDS: [&str; 3] = ["thought", "tool call", "tool output"];
    let kind = KINDS[usize::try_from(step % 3).expect("a small index fits in usize")];
    let line = format!("agent {agent} step {step}: {kind} ");
    line.repeat(usize::try_from(1 + (step * 7 + agent) % 40).expect("a small count fits in usize")).into_bytes()
}

/// The child: prints `OPEN next_lsn`, then every agent appends forever; each acknowledged
/// append is printed as `ACK first_lsn count agent first_step`.
fn run_child(dir: &Path) -> DemoResult<()> {
    let log = Arc::new(open_log(dir)?);
    let mut stdout = std::io::stdout();
    stdout.write_all(format!("OPEN {}\n", log.next_lsn()).as_bytes())?;
    stdout.flush()?;
    let out = Arc::new(Mutex::new(stdout));
    let agents: Vec<_> = (0..AGENTS)
        .map(|agent| {
            let log = Arc::clone(&log);
            let out = Arc::clone(&out);
            thread::spawn(move || run_agent(&log, &out, agent))
        })
        .collect();
    for agent in agents {
        agent.join().map_err(|_| "an agent thread panicked")??;
    }
    Ok(())
}

fn run_agent(log: &Log, out: &Mutex<std::io::Stdout>, agent: u64) -> DemoResult<()> {
    let mut step = 0;
    loop {
        // Every third step is a tool call and its output, appended as one atomic batch.
        let (first, count) = if step % 3 == 1 {
            let range = log.append_batch(&[&record(agent, step), &record(agent, step + 1)])?;
            (range.first(), 2)
        } else {
            (log.append(&record(agent, step))?, 1)
        };
        let line = format!("ACK {first} {count} {agent} {step}\n");
        let mut out = out.lock().map_err(|_| "stdout lock poisoned")?;
        out.write_all(line.as_bytes())?;
        out.flush()?;
        step += count;
    }
}

fn open_log(dir: &Path) -> continuum::Result<Log> {
    Log::builder(dir).segment_bytes(SEGMENT_BYTES).durability(Durability::Sync).open()
}

/// The parent: crash a child, recover, verify, report. Returns whether every acknowledged
/// record was found.
fn run_parent(dir: Option<PathBuf>, kill_after: Duration) -> DemoResult<bool> {
    let temp;
    let dir = match dir {
        Some(dir) => dir,
        None => {
            temp = tempfile::tempdir()?;
            temp.path().to_path_buf()
        }
    };
    println!("continuum demo: crash a writer with SIGKILL, then recover its log");
    println!("  log directory:   {}", dir.display());
    let run = crash_child(&dir, kill_after)?;
    let acked = &run.acked;
    let log = open_log(&dir)?;
    let report = log.recovery_report();
    let missing = verify(&log, acked)?;
    let range = match (acked.first_key_value(), acked.last_key_value()) {
        (Some((first, _)), Some((last, _))) => format!(" (LSN {first}..={last})"),
        _ => String::new(),
    };
    println!("  acknowledged:    {} records{range}, by {AGENTS} agents appending with Durability::Sync", acked.len());
    println!(
        "  recovered:       {} records ({} segment files) in {:.2?}",
        report.records,
        log.segments().len(),
        report.duration
    );
    let earlier = run.open_next_lsn.map_or(0, |next| next - 1);
    if earlier > 0 {
        println!("                   ({earlier} of them from earlier runs in this directory)");
    }
    let unacknowledged = report.records.saturating_sub(earlier + acked.len() as u64);
    if unacknowledged > 0 {
        println!("                   ({unacknowledged} written but not yet acknowledged when the child died)");
    }
    match &report.torn_tail {
        None => println!("  torn tail:       none (the kill left no half-written batch)"),
        Some(torn) => println!(
            "  torn tail:       cut {} bytes at offset {} of {}",
            torn.bytes,
            torn.offset,
            torn.segment.file_name().map_or_else(|| torn.segment.display().to_string(), |n| n.display().to_string())
        ),
    }
    if missing.is_empty() {
        println!("  verified:        all {} acknowledged records were found, byte for byte", acked.len());
        return Ok(true);
    }
    println!(
        "  FAILED:          {} acknowledged records are missing or differ, e.g. LSN {}",
        missing.len(),
        missing[0]
    );
    Ok(false)
}

/// What the parent learned from the child's output.
struct ChildRun {
    /// The LSN the child's log started at, if it got as far as opening it.
    open_next_lsn: Option<u64>,
    /// Every acknowledged record: LSN → (agent, step).
    acked: BTreeMap<u64, (u64, u64)>,
}

/// Runs the child, kills it after `kill_after`, and returns what it reported.
fn crash_child(dir: &Path, kill_after: Duration) -> DemoResult<ChildRun> {
    let mut child = Command::new(std::env::current_exe()?)
        .arg("--child")
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("the child's stdout should be piped")?;
    let reader = thread::spawn(move || -> std::io::Result<Vec<String>> {
        let mut lines = Vec::new();
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        // A line the kill cut short never reached us, so its append does not count.
        while reader.read_line(&mut line)? > 0 && line.ends_with('\n') {
            lines.push(std::mem::take(&mut line));
        }
        Ok(lines)
    });
    thread::sleep(kill_after);
    if let Some(status) = child.try_wait()? {
        return Err(format!("the child exited by itself ({status}) before it was killed").into());
    }
    child.kill()?;
    let status = child.wait()?;
    let lines = reader.join().map_err(|_| "the stdout reader panicked")??;
    println!("  child process:   pid {} appended for {kill_after:?}, then was killed ({status})", child.id());
    let mut run = ChildRun { open_next_lsn: None, acked: BTreeMap::new() };
    for line in lines {
        let (tag, rest) = line.trim_end().split_once(' ').ok_or_else(|| format!("bad child line {line:?}"))?;
        let fields: Vec<u64> = rest.split(' ').map(str::parse).collect::<Result<_, _>>()?;
        match (tag, fields.as_slice()) {
            ("OPEN", &[next_lsn]) => run.open_next_lsn = Some(next_lsn),
            ("ACK", &[first, count, agent, step]) => {
                for i in 0..count {
                    run.acked.insert(first + i, (agent, step + i));
                }
            }
            _ => return Err(format!("bad child line {line:?}").into()),
        }
    }
    Ok(run)
}

/// Reads back every acknowledged record and returns the LSNs that are missing or differ.
fn verify(log: &Log, acked: &BTreeMap<u64, (u64, u64)>) -> continuum::Result<Vec<u64>> {
    let mut missing = Vec::new();
    let Some((&first, _)) = acked.first_key_value() else { return Ok(missing) };
    let mut found = BTreeMap::new();
    for item in log.iter_from(Lsn::new(first))? {
        let (lsn, bytes) = item?;
        found.insert(lsn.get(), bytes);
    }
    for (&lsn, &(agent, step)) in acked {
        if found.get(&lsn).map(|bytes| bytes.as_ref()) != Some(record(agent, step).as_slice()) {
            missing.push(lsn);
        }
    }
    Ok(missing)
}
