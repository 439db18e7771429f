//! `dump`: see what a continuum store holds, without writing code.
//!
//! ```sh
//! cargo run --release --example dump -- <store-dir> [command] [--json]
//! cargo run --release --example dump -- --help
//! ```
//!
//! Opens the store read-only (`Store::open_read_only`): no lock, no write of any kind, so it
//! works while an agent process has the store open, and on a torn or corrupted store (it
//! reports damage; it never repairs). Exit codes: 0 success (for `verify`: clean), 1 `verify`
//! found problems, 2 the store could not be read or the arguments are wrong.
//!
//! The logic lives in [`run`], which `tests/dump.rs` calls directly for its golden tests.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};
use continuum::checkpoint::RunCheckpoint;
use continuum::codec::StoreRecord;
use continuum::codec::proto::{self, Delta, state_change};
use continuum::continuation::{ContinuationLevel, Decision, SuspendReason, SuspendedFilter, SuspendedRun};
use continuum::inspect::{self, SnapshotFile};
use continuum::store::{RecordDecoder, RecordInfo};
use continuum::{Atom, AtomId, AtomStatus, Context, Log, LogView, Lsn, RecoveryMode, RunId, RunStatus, Store};
use serde_json::{Value, json};

type Failure = Box<dyn std::error::Error>;

/// Inspect a continuum store: what it holds, its runs and atoms, contexts, and its integrity.
///
/// The store is opened read-only: no lock is taken and no file is changed, so dump works while
/// an agent has the store open for writing (it sees the records written up to the moment it
/// starts) and on a damaged store (torn tails and corruption are reported, never repaired).
///
/// Exit codes: 0 success (verify: the store is clean); 1 verify found problems; 2 the store
/// could not be read or the arguments are wrong.
#[derive(Debug, Parser)]
#[command(name = "dump", version)]
pub struct Cli {
    /// The store directory.
    pub dir: PathBuf,
    /// Machine-readable output: one JSON document, or one JSON object per line for listings
    /// (records, runs).
    #[arg(long, global = true)]
    pub json: bool,
    /// What to show (default: summary).
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// The commands.
#[derive(Clone, Debug, Subcommand)]
pub enum Command {
    /// Segments (name, LSN range, size, sealed or active), snapshot files, recovery findings,
    /// runs, agents, atoms by status, bytes on disk, compression ratio, live fraction and space
    /// amplification.
    Summary,
    /// Every record decoded, one line each: LSN, kind, what it says, its stored size and
    /// compression. Filters: --from / --to (inclusive LSNs), --kind (e.g. atom-started).
    Records {
        /// First LSN to show.
        #[arg(long)]
        from: Option<u64>,
        /// Last LSN to show.
        #[arg(long)]
        to: Option<u64>,
        /// Only this kind: run-created, atom-started, atom-completed, atom-failed, run-terminal,
        /// guard-started, guard-completed, dictionary, atoms-abandoned.
        #[arg(long)]
        kind: Option<String>,
    },
    /// Every run: id, name, status, agents and atom counts.
    Runs,
    /// One run (by id or name): its pipeline, agents, and its atom DAG as a tree (status,
    /// idempotency key, parents, duration); forks show as branches, merges as references.
    Run {
        /// Run id (as in `runs`) or name.
        run: String,
    },
    /// One atom in full: identity, parents, timing, its delta (messages, tool outputs,
    /// intermediate results, state changes) and result pretty-printed, or its error.
    Atom {
        /// Atom id.
        atom: u64,
    },
    /// The context of an agent rebuilt by the replayer (snapshot + deltas), as of its last
    /// completed atom or of --at ATOM (time travel).
    Context {
        /// Run id or name.
        run: String,
        /// Agent name.
        agent: String,
        /// Rebuild as of this atom instead of the agent's last completed one.
        #[arg(long)]
        at: Option<u64>,
    },
    /// A run's checkpoints (by run id or name), newest first: sequence, position, pipeline
    /// version, terminal or not, resume hint, committed side effects, agent heads, shared
    /// context.
    Checkpoints {
        /// Run id or name.
        run: String,
        /// Show at most this many.
        #[arg(long)]
        limit: Option<usize>,
    },
    /// Suspended runs: why and since when, their pending requests with the agent path that
    /// asks, the decisions taken (who, when, approve or reject), and the continuation tree of
    /// each (every agent level with the atom it continues from).
    Suspended,
    /// Check every frame checksum of every segment (scanning past damage) and every snapshot's
    /// SHA-256; print each problem with its file and byte offset. Exit 0 when clean, 1 otherwise.
    Verify,
}

#[allow(dead_code, reason = "tests/dump.rs includes this file and calls `run` instead")]
fn main() {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let code = run(std::env::args_os(), &mut out, &mut std::io::stderr());
    let _ = out.flush();
    std::process::exit(code);
}

/// Parses `args` (the program name first) and runs the command; returns the exit code.
pub fn run<I, T>(args: I, out: &mut dyn Write, err: &mut dyn Write) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(error) => {
            if error.use_stderr() {
                let _ = write!(err, "{}", error.render());
                return 2;
            }
            let _ = write!(out, "{}", error.render());
            return 0;
        }
    };
    match execute(&cli, out) {
        Ok(code) => code,
        Err(error) => {
            let _ = writeln!(err, "dump: {error}");
            2
        }
    }
}

fn execute(cli: &Cli, out: &mut dyn Write) -> Result<i32, Failure> {
    let command = cli.command.clone().unwrap_or(Command::Summary);
    if let Command::Verify = command {
        return verify(&cli.dir, cli.json, out);
    }
    // SkipCorrupted: show whatever verifies; the summary lists what was skipped.
    let store = match Store::builder(&cli.dir).recovery_mode(RecoveryMode::SkipCorrupted).open_read_only() {
        Ok(store) => store,
        Err(error) => return without_index(cli, &command, &error, out),
    };
    let json = cli.json;
    let decode = |bytes: &[u8]| store.decode_record(bytes);
    match command {
        Command::Summary => summary(store.log(), Some(&store), &decode, &cli.dir, json, out)?,
        Command::Records { from, to, kind } => records(store.log(), &decode, from, to, kind.as_deref(), json, out)?,
        Command::Runs => runs(&store, json, out)?,
        Command::Run { run } => run_tree(&store, &run, json, out)?,
        Command::Atom { atom } => atom_detail(&store, AtomId::from_raw(atom), json, out)?,
        Command::Context { run, agent, at } => context(&store, &run, &agent, at, json, out)?,
        Command::Checkpoints { run, limit } => checkpoints(&store, &run, limit, json, out)?,
        Command::Suspended => suspended(&store, json, out)?,
        Command::Verify => unreachable!("handled above"),
    }
    Ok(0)
}

/// A store whose index cannot be rebuilt (records lost to corruption that later records
/// depend on): `records` still shows every record that verifies, `summary` what the log alone
/// tells (and fails, naming the reason); the other commands need the index.
fn without_index(cli: &Cli, command: &Command, error: &continuum::Error, out: &mut dyn Write) -> Result<i32, Failure> {
    let unavailable = || format!("cannot read the store: {error} (`dump <dir> verify` lists the damage)");
    let log = Log::builder(&cli.dir)
        .recovery_mode(RecoveryMode::SkipCorrupted)
        .open_read_only()
        .map_err(|_| unavailable())?;
    let decoder = RecordDecoder::new();
    let decode = |bytes: &[u8]| decoder.decode(bytes);
    match command {
        Command::Summary => {
            summary(LogView::from(&log), None, &decode, &cli.dir, cli.json, out)?;
            Err(unavailable().into())
        }
        Command::Records { from, to, kind } => {
            records(LogView::from(&log), &decode, *from, *to, kind.as_deref(), cli.json, out)?;
            Ok(0)
        }
        _ => Err(unavailable().into()),
    }
}

// ---------------------------------------------------------------------------------------------
// summary

/// Atom counts by status.
#[derive(Debug, Default)]
struct AtomCounts {
    completed: u64,
    running: u64,
    failed: u64,
    failed_retryable: u64,
    abandoned: u64,
}

impl AtomCounts {
    fn add(&mut self, atom: &Atom) {
        match atom.status {
            AtomStatus::Completed => self.completed += 1,
            AtomStatus::Running => self.running += 1,
            AtomStatus::Failed { retryable: false } => self.failed += 1,
            AtomStatus::Failed { retryable: true } => self.failed_retryable += 1,
        }
        self.abandoned += u64::from(atom.abandoned);
    }

    fn total(&self) -> u64 {
        self.completed + self.running + self.failed + self.failed_retryable
    }

    fn json(&self) -> Value {
        json!({
            "total": self.total(), "completed": self.completed, "running": self.running,
            "failed": self.failed, "failed_retryable": self.failed_retryable, "abandoned": self.abandoned,
        })
    }

    fn text(&self) -> String {
        format!(
            "{} (completed {}, running {}, failed {}, failed retryable {}; abandoned {})",
            self.total(),
            self.completed,
            self.running,
            self.failed,
            self.failed_retryable,
            self.abandoned
        )
    }
}

/// Records by kind and their sizes, from one pass over the log.
#[derive(Debug, Default)]
struct RecordTotals {
    count: u64,
    by_kind: BTreeMap<String, u64>,
    stored_bytes: u64,
    body_bytes: u64,
}

/// Decodes one record of the log: with the store's dictionaries, or (when the store index
/// cannot be rebuilt) with a decoder that learns them as it goes.
type Decode<'a> = &'a dyn Fn(&[u8]) -> Result<RecordInfo, continuum::codec::CodecError>;

fn record_totals(log: LogView<'_>, decode: Decode<'_>) -> Result<RecordTotals, Failure> {
    let mut totals = RecordTotals::default();
    for item in log.iter_from(Lsn::FIRST)? {
        let (_, bytes) = item?;
        totals.count += 1;
        let Ok(info) = decode(&bytes) else {
            *totals.by_kind.entry("Undecodable".to_owned()).or_default() += 1;
            continue;
        };
        *totals.by_kind.entry(kind_name(&info)).or_default() += 1;
        totals.stored_bytes += info.stored_bytes;
        totals.body_bytes += info.body_bytes;
    }
    Ok(totals)
}

/// What only the store (its rebuilt index) knows.
struct StoreFacts {
    runs: usize,
    running: usize,
    suspended: usize,
    finished: usize,
    dropped: usize,
    agents: usize,
    atoms: AtomCounts,
    live_bytes: u64,
    index_snapshot: continuum::IndexSnapshotInfo,
}

fn store_facts(store: &Store) -> Result<StoreFacts, Failure> {
    let runs = store.runs();
    let mut atoms = AtomCounts::default();
    let mut agents = 0;
    for run in &runs {
        let (run_agents, counts) = run_atoms(store, run.id)?;
        agents += run_agents.len();
        atoms.completed += counts.completed;
        atoms.running += counts.running;
        atoms.failed += counts.failed;
        atoms.failed_retryable += counts.failed_retryable;
        atoms.abandoned += counts.abandoned;
    }
    let running = runs.iter().filter(|run| run.status == RunStatus::Running).count();
    let suspended = runs.iter().filter(|run| matches!(run.status, RunStatus::Suspended { .. })).count();
    let dropped = runs.iter().filter(|run| run.status == RunStatus::Dropped).count();
    Ok(StoreFacts {
        runs: runs.len(),
        running,
        suspended,
        finished: runs.len() - running - suspended - dropped,
        dropped,
        agents,
        atoms,
        live_bytes: inspect::live_bytes(store)?,
        index_snapshot: store.index_snapshot(),
    })
}

/// The figures of a summary.
struct Summary {
    segments: Vec<continuum::log::SegmentInfo>,
    snapshots: Vec<SnapshotFile>,
    totals: RecordTotals,
    store: Option<StoreFacts>,
    disk_bytes: u64,
    segment_file_bytes: u64,
    snapshot_bytes: u64,
    log_data_bytes: u64,
}

fn ratio(a: u64, b: u64) -> Option<f64> {
    if b == 0 { None } else { Some(a as f64 / b as f64) }
}

/// The summary of the store in `dir`: `store` is `None` when its index cannot be rebuilt, and
/// then runs, agents, atoms and liveness are left out.
fn summary(
    log: LogView<'_>,
    store: Option<&Store>,
    decode: Decode<'_>,
    dir: &Path,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), Failure> {
    let storage: std::sync::Arc<dyn continuum::storage::Storage> =
        std::sync::Arc::new(continuum::storage::FileStorage::new());
    let snapshots = inspect::snapshot_files(storage.clone(), dir)?;
    let files = inspect::disk_usage(storage, dir)?;
    let segments = log.segments();
    let summary = Summary {
        log_data_bytes: segments.iter().map(|segment| segment.data_bytes).sum(),
        segments,
        snapshot_bytes: snapshots.iter().map(|file| file.bytes).sum(),
        snapshots,
        totals: record_totals(log, decode)?,
        store: store.map(store_facts).transpose()?,
        disk_bytes: files.iter().map(|(_, bytes)| bytes).sum(),
        segment_file_bytes: files.iter().filter(|(name, _)| name.ends_with(".seg")).map(|(_, b)| b).sum(),
    };
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(&summary_json(&summary, log, dir))?)?;
        Ok(())
    } else {
        summary_text(&summary, log, dir, out)
    }
}

fn summary_json(summary: &Summary, log: LogView<'_>, dir: &Path) -> Value {
    let Summary { totals, disk_bytes, segment_file_bytes, snapshot_bytes, log_data_bytes, .. } = summary;
    let facts = summary.store.as_ref();
    json!({
        "segments": summary.segments.iter().map(|s| json!({
            "file": file_name(&s.path), "first_lsn": s.first_lsn.get(), "last_lsn": s.next_lsn.get().saturating_sub(1),
            "data_bytes": s.data_bytes, "sealed": s.sealed,
        })).collect::<Vec<_>>(),
        "snapshots": summary.snapshots.iter().map(|f| snapshot_json(dir, f)).collect::<Vec<_>>(),
        "recovery": recovery_json(dir, log.recovery_report()),
        "runs": facts.map(|f| json!({"total": f.runs, "running": f.running, "suspended": f.suspended,
            "finished": f.finished, "dropped": f.dropped})),
        "agents": facts.map(|f| f.agents),
        "atoms": facts.map(|f| f.atoms.json()),
        "index_snapshot": facts.map(|f| json!({
            "covered_lsn": f.index_snapshot.covered.map(Lsn::get),
            "opened_from_lsn": f.index_snapshot.opened_from.map(Lsn::get),
            "records_after": f.index_snapshot.records_after,
            "ignored_at_open": f.index_snapshot.ignored_at_open,
        })),
        "records": {"total": totals.count, "by_kind": totals.by_kind},
        "bytes_on_disk": {"total": disk_bytes, "segment_files": segment_file_bytes,
            "segment_used": log_data_bytes, "segment_preallocated": segment_file_bytes.saturating_sub(*log_data_bytes),
            "snapshots": snapshot_bytes, "other": other_bytes(summary)},
        "log_data_bytes": log_data_bytes,
        "compression": {"record_bytes_stored": totals.stored_bytes, "record_bytes_raw": totals.body_bytes,
            "ratio": ratio(totals.stored_bytes, totals.body_bytes)},
        "live": facts.map(|f| json!({"bytes": f.live_bytes, "fraction_of_log_data": ratio(f.live_bytes, *log_data_bytes),
            "space_amplification": ratio(*log_data_bytes, f.live_bytes),
            "disk_amplification": ratio(*disk_bytes, f.live_bytes)})),
    })
}

/// Bytes on disk that are neither segment files nor snapshots. The snapshots and the directory
/// are listed one after the other, so with a live writer (which writes and deletes policy
/// snapshots) the parts may not add up: never below zero.
fn other_bytes(summary: &Summary) -> u64 {
    summary.disk_bytes.saturating_sub(summary.segment_file_bytes).saturating_sub(summary.snapshot_bytes)
}

fn summary_text(summary: &Summary, log: LogView<'_>, dir: &Path, out: &mut dyn Write) -> Result<(), Failure> {
    let Summary { totals, disk_bytes, segment_file_bytes, snapshot_bytes, log_data_bytes, .. } = summary;
    writeln!(out, "segments: {}", summary.segments.len())?;
    for s in &summary.segments {
        let state = if s.sealed { "sealed" } else { "active" };
        let (first, next) = (s.first_lsn.get(), s.next_lsn.get());
        let name = file_name(&s.path);
        writeln!(out, "  {name}  LSN {first}..={}  {} data bytes  {state}", next.saturating_sub(1), s.data_bytes)?;
    }
    writeln!(out, "snapshots: {}", summary.snapshots.len())?;
    for file in &summary.snapshots {
        let state = file.problem.map_or("ok".to_owned(), |(_, reason)| format!("UNUSABLE: {reason}"));
        writeln!(out, "  {}  {}  {} bytes  {state}", relative(dir, &file.path), file.atom, file.bytes)?;
    }
    write_recovery(dir, log.recovery_report(), out)?;
    match &summary.store {
        Some(f) => {
            let (runs, running, suspended, finished, dropped) = (f.runs, f.running, f.suspended, f.finished, f.dropped);
            writeln!(
                out,
                "runs: {runs} ({running} running, {suspended} suspended, {finished} finished, {dropped} dropped)"
            )?;
            writeln!(out, "agents: {}", f.agents)?;
            writeln!(out, "atoms: {}", f.atoms.text())?;
            writeln!(out, "index snapshot: {}", index_snapshot_text(&f.index_snapshot))?;
        }
        None => writeln!(out, "runs, agents, atoms: unavailable (the store index cannot be rebuilt)")?,
    }
    let kinds: Vec<String> = totals.by_kind.iter().map(|(kind, n)| format!("{kind} {n}")).collect();
    writeln!(out, "records: {} ({})", totals.count, kinds.join(", "))?;
    let other = other_bytes(summary);
    let preallocated = segment_file_bytes.saturating_sub(*log_data_bytes);
    writeln!(
        out,
        "bytes on disk: {disk_bytes} (segment files {segment_file_bytes}: {log_data_bytes} used, {preallocated} preallocated; snapshots {snapshot_bytes}; other {other})"
    )?;
    writeln!(out, "log data: {log_data_bytes} bytes (segment headers, frame headers and records)")?;
    let (stored, raw) = (totals.stored_bytes, totals.body_bytes);
    writeln!(out, "compression: records stored in {stored} bytes, {raw} raw: ratio {}", fixed(ratio(stored, raw)))?;
    let Some(f) = &summary.store else {
        writeln!(out, "live: unavailable (the store index cannot be rebuilt)")?;
        return Ok(());
    };
    let live = f.live_bytes;
    writeln!(
        out,
        "live: {live} bytes, {} of log data (records retention keeps, as compaction plans them)",
        fixed(ratio(live, *log_data_bytes))
    )?;
    writeln!(
        out,
        "space amplification: {} (log data / live); {} counting preallocation and snapshots (bytes on disk / live)",
        fixed(ratio(*log_data_bytes, live)),
        fixed(ratio(*disk_bytes, live))
    )?;
    Ok(())
}

/// How the open built the index: from an index snapshot (and how many records it folded after it),
/// or from every record (and why an index snapshot it found was ignored).
fn index_snapshot_text(info: &continuum::IndexSnapshotInfo) -> String {
    match (info.opened_from, &info.ignored_at_open) {
        (Some(lsn), _) => {
            format!("used (covers the records below LSN {}; {} records folded after it)", lsn.get(), info.records_after)
        }
        (None, Some(reason)) => format!("IGNORED ({reason}); the open folded every record"),
        (None, None) => "none; the open folded every record".to_owned(),
    }
}

fn fixed(value: Option<f64>) -> String {
    value.map_or("-".to_owned(), |v| format!("{v:.3}"))
}

fn recovery_json(dir: &Path, report: &continuum::RecoveryReport) -> Value {
    let range = |r: &continuum::log::InvalidRange| json!({"file": relative(dir, &r.segment), "offset": r.offset, "bytes": r.bytes});
    json!({
        "torn_tail": report.torn_tail.as_ref().map(range),
        "skipped": report.skipped.iter().map(range).collect::<Vec<_>>(),
        "lost_lsns": report.lost_lsns.iter().map(|(from, to)| json!([from, to])).collect::<Vec<_>>(),
        "lost_records": report.lost_records.iter().map(|lost| json!({
            "file": relative(dir, &lost.segment), "evidence": lost.evidence.to_string(),
            "from_lsn": lost.from_lsn, "to_lsn": lost.to_lsn, "bytes": lost.bytes,
        })).collect::<Vec<_>>(),
    })
}

fn write_recovery(dir: &Path, report: &continuum::RecoveryReport, out: &mut dyn Write) -> Result<(), Failure> {
    if report.torn_tail.is_none() && !report.found_loss() {
        writeln!(out, "recovery: clean")?;
        return Ok(());
    }
    if let Some(tail) = &report.torn_tail {
        writeln!(
            out,
            "recovery: torn tail in {} at offset {}, {} bytes (left in place; a writable open cuts it)",
            relative(dir, &tail.segment),
            tail.offset,
            tail.bytes
        )?;
    }
    for skipped in &report.skipped {
        writeln!(
            out,
            "recovery: CORRUPTION skipped in {} at offset {}, {} bytes",
            relative(dir, &skipped.segment),
            skipped.offset,
            skipped.bytes
        )?;
    }
    for (from, to) in &report.lost_lsns {
        match to - from {
            1 => writeln!(out, "recovery: LSN {from} lost in skipped bytes")?,
            _ => writeln!(out, "recovery: LSNs {from}..={} lost in skipped bytes", to - 1)?,
        }
    }
    for lost in &report.lost_records {
        let known = if lost.to_lsn > lost.from_lsn {
            format!("LSNs {}..={}", lost.from_lsn, lost.to_lsn - 1)
        } else {
            format!("LSNs from {} on", lost.from_lsn)
        };
        writeln!(out, "recovery: RECORDS LOST ({}) in {}: {known}", lost.evidence, relative(dir, &lost.segment))?;
    }
    Ok(())
}

fn snapshot_json(dir: &Path, file: &SnapshotFile) -> Value {
    json!({
        "file": relative(dir, &file.path), "atom": file.atom.get(), "bytes": file.bytes,
        "ok": file.problem.is_none(), "problem": file.problem.map(|(_, reason)| reason),
    })
}

// ---------------------------------------------------------------------------------------------
// records

fn kind_name(info: &RecordInfo) -> String {
    format!("{:?}", info.kind)
}

/// `atom-started`, `AtomStarted` and `atom_started` all name the same kind.
fn normalize_kind(kind: &str) -> String {
    kind.chars().filter(|c| c.is_ascii_alphanumeric()).map(|c| c.to_ascii_lowercase()).collect()
}

fn records(
    log: LogView<'_>,
    decode: Decode<'_>,
    from: Option<u64>,
    to: Option<u64>,
    kind: Option<&str>,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), Failure> {
    let wanted = kind.map(normalize_kind);
    for item in log.iter_from(Lsn::new(from.unwrap_or(1).max(1)))? {
        let (lsn, bytes) = item?;
        if to.is_some_and(|to| lsn.get() > to) {
            break;
        }
        let info = match decode(&bytes) {
            Ok(info) => info,
            Err(error) => {
                writeln!(out, "{lsn:>6}  UNDECODABLE  {error} ({} bytes)", bytes.len())?;
                continue;
            }
        };
        if wanted.as_ref().is_some_and(|wanted| *wanted != normalize_kind(&kind_name(&info))) {
            continue;
        }
        if json {
            let value = json!({
                "lsn": lsn.get(), "kind": kind_name(&info), "subject": info.subject,
                "stored_bytes": info.stored_bytes, "body_bytes": info.body_bytes,
                "compression": info.compression, "record": record_json(&info.record),
            });
            writeln!(out, "{}", serde_json::to_string(&value)?)?;
        } else {
            writeln!(
                out,
                "{lsn:>6}  {:<15} {}  [{} B, {}]",
                kind_name(&info),
                record_text(&info.record),
                info.stored_bytes,
                info.compression
            )?;
        }
    }
    Ok(())
}

fn record_text(record: &StoreRecord) -> String {
    match record {
        StoreRecord::RunCreated(m) => format!(
            "run#{} {:?} pipeline {:?} v{:?} env {{{}}} at {}",
            m.run,
            m.run_name,
            m.pipeline,
            m.pipeline_version,
            m.environment
                .iter()
                .collect::<BTreeMap<_, _>>()
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(", "),
            time(m.created_at_unix_us)
        ),
        StoreRecord::AtomStarted(m) => format!(
            "atom#{} run#{} agent {:?} key {:?} parents {:?} idempotency {:?} at {}",
            m.atom,
            m.run,
            m.agent,
            m.key,
            m.parents,
            m.idempotency_key,
            time(m.started_at_unix_us)
        ),
        StoreRecord::AtomCompleted(m) => format!(
            "atom#{} delta {{{}}} result {} at {}",
            m.atom,
            delta_counts(m.delta.as_ref()),
            bytes_text(&m.result, 60),
            time(m.ended_at_unix_us)
        ),
        StoreRecord::AtomFailed(m) => {
            format!("atom#{} error {:?} retryable {} at {}", m.atom, m.error, m.retryable, time(m.ended_at_unix_us))
        }
        StoreRecord::RunTerminal(m) => {
            format!("run#{} success {} hint {:?} at {}", m.run, m.success, m.resume_hint, time(m.ended_at_unix_us))
        }
        StoreRecord::GuardStarted(m) => {
            format!("atom#{} operation {:?} key {:?} at {}", m.atom, m.operation, m.key, time(m.started_at_unix_us))
        }
        StoreRecord::GuardCompleted(m) => {
            format!("key {:?} result {} at {}", m.key, bytes_text(&m.result, 60), time(m.ended_at_unix_us))
        }
        StoreRecord::GuardFailed(m) => {
            format!("key {:?} error {:?} retryable {} at {}", m.key, m.error, m.retryable, time(m.ended_at_unix_us))
        }
        StoreRecord::AtomReclaimed(m) => format!(
            "atom#{} delta reclaimed by retention; result {} at {}",
            m.atom,
            bytes_text(&m.result, 60),
            time(m.ended_at_unix_us)
        ),
        StoreRecord::RunDropped(m) => {
            format!("run#{} dropped by retention (next atom {}) at {}", m.run, m.next_atom, time(m.dropped_at_unix_us))
        }
        StoreRecord::Dictionary(m) => format!("dictionary#{} {} bytes", m.id, m.dictionary.len()),
        StoreRecord::AtomsAbandoned(m) => format!(
            "run#{} agent {:?} after atom#{} reason {:?} at {}",
            m.run,
            m.agent,
            m.after_atom,
            m.reason,
            time(m.at_unix_us)
        ),
        other => format!("{other:?}"),
    }
}

fn record_json(record: &StoreRecord) -> Value {
    match record {
        StoreRecord::RunCreated(m) => json!({
            "run": m.run, "name": m.run_name, "pipeline": m.pipeline, "pipeline_version": m.pipeline_version,
            "environment": m.environment.iter().collect::<BTreeMap<_, _>>(), "created_at_unix_us": m.created_at_unix_us,
            "snapshot_every_atoms": m.snapshot_every_atoms, "snapshot_every_ms": m.snapshot_every_ms,
        }),
        StoreRecord::AtomStarted(m) => json!({
            "atom": m.atom, "run": m.run, "agent": m.agent, "key": m.key, "parents": m.parents,
            "idempotency_key": m.idempotency_key, "started_at_unix_us": m.started_at_unix_us,
        }),
        StoreRecord::AtomCompleted(m) => json!({
            "atom": m.atom, "delta": delta_json(m.delta.as_ref()), "result": bytes_json(&m.result),
            "ended_at_unix_us": m.ended_at_unix_us,
        }),
        StoreRecord::AtomFailed(m) => json!({
            "atom": m.atom, "error": m.error, "retryable": m.retryable, "ended_at_unix_us": m.ended_at_unix_us,
        }),
        StoreRecord::RunTerminal(m) => json!({
            "run": m.run, "success": m.success, "resume_hint": m.resume_hint, "ended_at_unix_us": m.ended_at_unix_us,
        }),
        StoreRecord::GuardStarted(m) => json!({
            "key": m.key, "atom": m.atom, "operation": m.operation, "started_at_unix_us": m.started_at_unix_us,
        }),
        StoreRecord::GuardCompleted(m) => json!({
            "key": m.key, "result": bytes_json(&m.result), "ended_at_unix_us": m.ended_at_unix_us,
        }),
        StoreRecord::GuardFailed(m) => json!({
            "key": m.key, "error": m.error, "retryable": m.retryable, "ended_at_unix_us": m.ended_at_unix_us,
        }),
        StoreRecord::AtomReclaimed(m) => json!({
            "atom": m.atom, "delta": Value::Null, "result": bytes_json(&m.result), "ended_at_unix_us": m.ended_at_unix_us,
        }),
        StoreRecord::RunDropped(m) => json!({
            "run": m.run, "next_atom": m.next_atom, "dropped_at_unix_us": m.dropped_at_unix_us,
        }),
        StoreRecord::Dictionary(m) => json!({"id": m.id, "bytes": m.dictionary.len()}),
        StoreRecord::AtomsAbandoned(m) => json!({
            "run": m.run, "agent": m.agent, "after_atom": m.after_atom, "reason": m.reason, "at_unix_us": m.at_unix_us,
        }),
        other => json!({"debug": format!("{other:?}")}),
    }
}

fn delta_counts(delta: Option<&Delta>) -> String {
    let Some(delta) = delta else { return "empty".to_owned() };
    format!(
        "{} messages, {} tool outputs, {} results, {} state changes",
        delta.messages.len(),
        delta.tool_outputs.len(),
        delta.intermediate_results.len(),
        delta.state_changes.len()
    )
}

// ---------------------------------------------------------------------------------------------
// runs and run

/// The agents of a run (name → atom counts) and the run's atom counts.
fn run_atoms(store: &Store, run: RunId) -> Result<(BTreeMap<String, AtomCounts>, AtomCounts), Failure> {
    let mut agents: BTreeMap<String, AtomCounts> = BTreeMap::new();
    let mut total = AtomCounts::default();
    for id in store.run_atoms(run) {
        let atom = store.atom(id)?;
        agents.entry(atom.agent.clone()).or_default().add(&atom);
        total.add(&atom);
    }
    Ok((agents, total))
}

fn status_text(status: &RunStatus) -> String {
    match status {
        RunStatus::Running => "running".to_owned(),
        RunStatus::Finished { success: true, .. } => "succeeded".to_owned(),
        RunStatus::Finished { success: false, .. } => "failed".to_owned(),
        RunStatus::Dropped => "dropped".to_owned(),
        RunStatus::Suspended { reason, .. } => format!("suspended ({})", reason_text(reason)),
    }
}

fn runs(store: &Store, json: bool, out: &mut dyn Write) -> Result<(), Failure> {
    for run in store.runs() {
        let (agents, atoms) = run_atoms(store, run.id)?;
        if json {
            let value = json!({
                "run": run.id.get(), "name": run.name, "status": status_text(&run.status),
                "agents": agents.keys().collect::<Vec<_>>(), "atoms": atoms.json(),
            });
            writeln!(out, "{}", serde_json::to_string(&value)?)?;
        } else {
            let names: Vec<&str> = agents.keys().map(String::as_str).collect();
            writeln!(
                out,
                "{}  {:?}  {}  agents [{}]  atoms {}",
                run.id,
                run.name,
                status_text(&run.status),
                names.join(", "),
                atoms.text()
            )?;
        }
    }
    Ok(())
}

fn find_run(store: &Store, run: &str) -> Result<continuum::store::RunInfo, Failure> {
    let runs = store.runs();
    let by_id = run.trim_start_matches("run#").parse::<u64>().ok();
    runs.into_iter()
        .find(|info| Some(info.id.get()) == by_id || info.name == run)
        .ok_or_else(|| format!("no run {run:?} (see the `runs` command)").into())
}

/// The run's `RunCreated` record (pipeline, environment, creation time).
fn run_created(store: &Store, run: RunId) -> Result<Option<proto::RunCreated>, Failure> {
    for item in store.log().iter_from(Lsn::FIRST)? {
        let (_, bytes) = item?;
        if let Ok(info) = store.decode_record(&bytes)
            && let StoreRecord::RunCreated(created) = info.record
            && created.run == run.get()
        {
            return Ok(Some(created));
        }
    }
    Ok(None)
}

fn run_tree(store: &Store, run: &str, json: bool, out: &mut dyn Write) -> Result<(), Failure> {
    let info = find_run(store, run)?;
    let created = run_created(store, info.id)?.unwrap_or_default();
    let atoms: Vec<Atom> = store.run_atoms(info.id).into_iter().map(|id| store.atom(id)).collect::<Result<_, _>>()?;
    let (agents, counts) = run_atoms(store, info.id)?;
    let hint = match &info.status {
        RunStatus::Finished { resume_hint, .. } => resume_hint.clone(),
        _ => String::new(),
    };
    if json {
        let value = json!({
            "run": info.id.get(), "name": info.name, "status": status_text(&info.status), "resume_hint": hint,
            "pipeline": created.pipeline, "pipeline_version": created.pipeline_version,
            "created_at_unix_us": created.created_at_unix_us,
            "agents": agents.iter().map(|(name, c)| json!({"agent": name, "atoms": c.json()})).collect::<Vec<_>>(),
            "atoms": atoms.iter().map(atom_summary_json).collect::<Vec<_>>(),
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&value)?)?;
        return Ok(());
    }
    writeln!(
        out,
        "{} {:?}  {}  created {}",
        info.id,
        info.name,
        status_text(&info.status),
        time(created.created_at_unix_us)
    )?;
    writeln!(out, "pipeline: {:?} version {:?}", created.pipeline, created.pipeline_version)?;
    if !hint.is_empty() {
        writeln!(out, "resume hint: {hint:?}")?;
    }
    writeln!(out, "atoms: {}", counts.text())?;
    writeln!(out, "agents:")?;
    for (name, c) in &agents {
        writeln!(out, "  {name:?}: {}", c.text())?;
    }
    writeln!(out, "DAG (children under their first parent; a merge is listed again under its other parents):")?;
    write_dag(&atoms, out)
}

fn atom_summary_json(atom: &Atom) -> Value {
    json!({
        "atom": atom.id.get(), "agent": atom.agent, "key": atom.key, "status": atom_status(atom),
        "abandoned": atom.abandoned, "idempotency_key": atom.idempotency_key,
        "parents": atom.parents.iter().map(|p| p.get()).collect::<Vec<_>>(),
        "started_at_unix_us": atom.started_at_unix_us, "ended_at_unix_us": atom.ended_at_unix_us,
    })
}

fn atom_status(atom: &Atom) -> &'static str {
    match atom.status {
        AtomStatus::Completed => "completed",
        AtomStatus::Running => "running",
        AtomStatus::Failed { retryable: false } => "failed",
        AtomStatus::Failed { retryable: true } => "failed-retryable",
    }
}

fn atom_line(atom: &Atom) -> String {
    let mut line = format!("{} {}/{} {}", atom.id, atom.agent, atom.key, atom_status(atom));
    if atom.abandoned {
        line.push_str(" ABANDONED");
    }
    if !atom.idempotency_key.is_empty() {
        line.push_str(&format!(" idempotency {:?}", atom.idempotency_key));
    }
    if !atom.parents.is_empty() {
        let parents: Vec<String> = atom.parents.iter().map(|p| p.get().to_string()).collect();
        line.push_str(&format!(" parents [{}]", parents.join(", ")));
    }
    line.push_str(&format!(" {}", duration(atom.started_at_unix_us, atom.ended_at_unix_us)));
    line
}

/// One line of the tree to draw: the atom, whether it is drawn here (else it is a merge drawn
/// under its first parent), the text before its glyph, its glyph, and its children's prefix.
struct TreeLine {
    id: AtomId,
    owned: bool,
    prefix: String,
    glyph: &'static str,
    child_prefix: String,
}

const BRANCH: &str = "├─ ";
const LAST_BRANCH: &str = "└─ ";

/// The DAG as a tree: roots are atoms without parents in the run; each atom is drawn under its
/// first parent and listed as a reference under any other parent (a merge). An only child is
/// drawn in its parent's column, so a long linear history does not indent; the walk uses an
/// explicit stack, so a history of any depth cannot overflow the stack.
fn write_dag(atoms: &[Atom], out: &mut dyn Write) -> Result<(), Failure> {
    let ids: BTreeSet<AtomId> = atoms.iter().map(|atom| atom.id).collect();
    let by_id: BTreeMap<AtomId, &Atom> = atoms.iter().map(|atom| (atom.id, atom)).collect();
    let mut children: BTreeMap<AtomId, Vec<(AtomId, bool)>> = BTreeMap::new();
    let mut roots = Vec::new();
    for atom in atoms {
        let parents: Vec<AtomId> = atom.parents.iter().copied().filter(|p| ids.contains(p)).collect();
        match parents.split_first() {
            None => roots.push((atom.id, true)),
            Some((first, others)) => {
                children.entry(*first).or_default().push((atom.id, true));
                for other in others {
                    children.entry(*other).or_default().push((atom.id, false));
                }
            }
        }
    }
    let mut stack = Vec::new();
    push_branches(&mut stack, &roots, "");
    while let Some(line) = stack.pop() {
        let Some(atom) = by_id.get(&line.id) else { continue };
        if !line.owned {
            let first = atom.parents.first().map_or(0, |p| p.get());
            writeln!(out, "{}{}{} (merge: drawn under atom#{first})", line.prefix, line.glyph, line.id)?;
            continue;
        }
        writeln!(out, "{}{}{}", line.prefix, line.glyph, atom_line(atom))?;
        let kids = children.get(&line.id).map(Vec::as_slice).unwrap_or_default();
        if let [(only, true)] = kids {
            let glyph = match line.glyph {
                BRANCH => "│  ",
                LAST_BRANCH => "   ",
                other => other,
            };
            stack.push(TreeLine {
                id: *only,
                owned: true,
                prefix: line.prefix,
                glyph,
                child_prefix: line.child_prefix,
            });
        } else {
            push_branches(&mut stack, kids, &line.child_prefix);
        }
    }
    Ok(())
}

/// Pushes `kids` as branches under `prefix`, the first on top of the stack.
fn push_branches(stack: &mut Vec<TreeLine>, kids: &[(AtomId, bool)], prefix: &str) {
    for (i, (id, owned)) in kids.iter().enumerate().rev() {
        let last = i + 1 == kids.len();
        stack.push(TreeLine {
            id: *id,
            owned: *owned,
            prefix: prefix.to_owned(),
            glyph: if last { LAST_BRANCH } else { BRANCH },
            child_prefix: format!("{prefix}{}", if last { "   " } else { "│  " }),
        });
    }
}

// ---------------------------------------------------------------------------------------------
// atom

fn atom_detail(store: &Store, id: AtomId, json: bool, out: &mut dyn Write) -> Result<(), Failure> {
    let atom = store.atom(id)?;
    if json {
        let mut value = atom_summary_json(&atom);
        value["run"] = json!(atom.run.get());
        value["started_lsn"] = json!(atom.started_lsn.get());
        value["delta"] = atom.output.as_ref().map_or(Value::Null, |o| delta_json(Some(&o.delta)));
        value["result"] = atom.output.as_ref().map_or(Value::Null, |o| bytes_json(&o.result));
        if let Some(decoded) = atom.output.as_ref().and_then(|o| control_result(&atom.agent, &o.result)) {
            value["result_decoded"] = json!(decoded);
        }
        value["error"] = json!(atom.error);
        writeln!(out, "{}", serde_json::to_string_pretty(&value)?)?;
        return Ok(());
    }
    writeln!(out, "{}  {}  agent {:?}  key {:?}", atom.id, atom.run, atom.agent, atom.key)?;
    writeln!(out, "status: {}{}", atom_status(&atom), if atom.abandoned { " (abandoned by a rollback)" } else { "" })?;
    let parents: Vec<String> = atom.parents.iter().map(ToString::to_string).collect();
    writeln!(out, "parents: [{}]", parents.join(", "))?;
    writeln!(out, "idempotency key: {:?}", atom.idempotency_key)?;
    writeln!(out, "started: {} (LSN {})", time(atom.started_at_unix_us), atom.started_lsn)?;
    match atom.ended_at_unix_us {
        Some(ended) => writeln!(out, "ended: {} ({})", time(ended), duration(atom.started_at_unix_us, Some(ended)))?,
        None => writeln!(out, "ended: -")?,
    }
    if let Some(error) = &atom.error {
        writeln!(out, "error: {error:?}")?;
    }
    if let Some(output) = &atom.output {
        writeln!(out, "delta:")?;
        write_delta(&output.delta, out)?;
        writeln!(out, "result: {}", bytes_text(&output.result, usize::MAX))?;
        if let Some(decoded) = control_result(&atom.agent, &output.result) {
            writeln!(out, "result decoded:\n{decoded}")?;
        }
    }
    Ok(())
}

/// The result of one of the store's own atoms decoded (a continuation event, a run checkpoint,
/// a migration, a channel's message, a consumer's offset, a shared-state version, a lease event), pretty-printed; `None` for another agent or bytes that do not decode.
fn control_result(agent: &str, result: &[u8]) -> Option<String> {
    use continuum::codec::proto;
    use prost::Message;
    match agent {
        continuum::continuation::CONTINUATION_AGENT => {
            proto::ContinuationEvent::decode(result).ok().map(|event| format!("{event:#?}"))
        }
        continuum::checkpoint::CHECKPOINT_AGENT => {
            proto::RunCheckpoint::decode(result).ok().map(|checkpoint| format!("{checkpoint:#?}"))
        }
        continuum::checkpoint::MIGRATION_AGENT => {
            proto::MigrationApplied::decode(result).ok().map(|migration| format!("{migration:#?}"))
        }
        continuum::lease::LEASE_AGENT => continuum::lease::describe_event(result),
        _ if agent.starts_with(continuum::channel::CHANNEL_AGENT_PREFIX) => {
            // FORMAT.md §8, "Control atoms: channels": sender:u64le payload.
            let (sender, payload) = result.split_at_checked(8)?;
            let sender = u64::from_le_bytes(sender.try_into().ok()?);
            Some(format!("message from atom {sender}: {}", bytes_text(payload, usize::MAX)))
        }
        _ if agent.starts_with(continuum::channel::CONSUMER_AGENT_PREFIX) => {
            // from:u64le to:u64le, the message ids (from, to] the consuming atom took.
            let from = u64::from_le_bytes(result.get(..8)?.try_into().ok()?);
            let to = u64::from_le_bytes(result.get(8..16)?.try_into().ok()?);
            Some(format!("consumed messages {}..={to}", from + 1))
        }
        _ if agent.starts_with(continuum::shared_state::STATE_AGENT_PREFIX) => {
            // FORMAT.md §8, "Control atoms: shared state": version:u64le kind:u8 payload.
            let version = u64::from_le_bytes(result.get(..8)?.try_into().ok()?);
            let payload = result.get(9..)?;
            match result.get(8)? {
                1 => Some(format!("version {version}: {}", bytes_text(payload, usize::MAX))),
                2 => Some(format!("version {version}: counter {}", i64::from_le_bytes(payload.try_into().ok()?))),
                3 => Some(format!("version {version}: list item {}", bytes_text(payload, usize::MAX))),
                _ => None,
            }
        }
        _ => None,
    }
}

fn write_delta(delta: &Delta, out: &mut dyn Write) -> Result<(), Failure> {
    for summary in &delta.summarizations {
        writeln!(
            out,
            "  summarize messages {}..{} as {}: {:?}",
            summary.from, summary.to, summary.role, summary.summary
        )?;
    }
    if delta.drop_oldest_messages > 0 {
        writeln!(out, "  drop the {} oldest messages", delta.drop_oldest_messages)?;
    }
    for message in &delta.messages {
        write_message(message, "  ", out)?;
    }
    for output in &delta.tool_outputs {
        writeln!(out, "  tool output {:?}: {}", output.tool_call_id, bytes_text(&output.output, usize::MAX))?;
    }
    for result in &delta.intermediate_results {
        writeln!(out, "  result {:?}: {}", result.name, bytes_text(&result.value, usize::MAX))?;
    }
    for change in &delta.state_changes {
        match &change.change {
            Some(state_change::Change::Set(value)) => {
                writeln!(out, "  state {:?} = {}", change.key, bytes_text(value, usize::MAX))?;
            }
            Some(state_change::Change::Delete(_)) => writeln!(out, "  state {:?} deleted", change.key)?,
            None => writeln!(out, "  state {:?} (no change)", change.key)?,
        }
    }
    Ok(())
}

fn write_message(message: &proto::ChatMessage, indent: &str, out: &mut dyn Write) -> Result<(), Failure> {
    writeln!(out, "{indent}[{}] {:?}", message.role, message.content)?;
    if let Some(call) = &message.tool_call {
        writeln!(out, "{indent}    calls {}({}) id {:?}", call.name, call.arguments, call.id)?;
    }
    Ok(())
}

fn delta_json(delta: Option<&Delta>) -> Value {
    let Some(delta) = delta else { return Value::Null };
    json!({
        "messages": delta.messages.iter().map(message_json).collect::<Vec<_>>(),
        "tool_outputs": delta.tool_outputs.iter().map(|o| json!({"tool_call_id": o.tool_call_id, "output": bytes_json(&o.output)})).collect::<Vec<_>>(),
        "intermediate_results": delta.intermediate_results.iter().map(|r| json!({"name": r.name, "value": bytes_json(&r.value)})).collect::<Vec<_>>(),
        "state_changes": delta.state_changes.iter().map(|c| match &c.change {
            Some(state_change::Change::Set(value)) => json!({"key": c.key, "set": bytes_json(value)}),
            _ => json!({"key": c.key, "delete": true}),
        }).collect::<Vec<_>>(),
        "drop_oldest_messages": delta.drop_oldest_messages,
        "summarizations": delta.summarizations.iter().map(|s| json!({"from": s.from, "to": s.to, "role": s.role, "summary": s.summary})).collect::<Vec<_>>(),
    })
}

fn message_json(message: &proto::ChatMessage) -> Value {
    let call = message.tool_call.as_ref().map(|c| json!({"id": c.id, "name": c.name, "arguments": c.arguments}));
    json!({"role": message.role, "content": message.content, "tool_call": call})
}

// ---------------------------------------------------------------------------------------------
// context

fn context(
    store: &Store,
    run: &str,
    agent: &str,
    at: Option<u64>,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), Failure> {
    let info = find_run(store, run)?;
    let at = match at {
        Some(at) => AtomId::from_raw(at),
        None => {
            let mut last = None;
            for id in store.agent_atoms(info.id, agent) {
                let atom = store.atom(id)?;
                if atom.status == AtomStatus::Completed && !atom.abandoned {
                    last = Some(id);
                }
            }
            last.ok_or_else(|| format!("agent {agent:?} of {} has no completed atom", info.id))?
        }
    };
    let rebuilt = store.rebuild_context(at)?;
    let fallbacks: Vec<Value> =
        rebuilt.fallbacks.iter().map(|f| json!({"atom": f.atom.get(), "reason": f.reason})).collect();
    if json {
        let value = json!({
            "run": info.id.get(), "agent": agent, "at": at.get(),
            "snapshot": rebuilt.snapshot.map(AtomId::get), "snapshot_fallbacks": fallbacks,
            "atoms_applied": rebuilt.atoms_applied, "context": context_json(&rebuilt.context),
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&value)?)?;
        return Ok(());
    }
    writeln!(out, "context of {agent:?} in {} as of {at}", info.id)?;
    match rebuilt.snapshot {
        Some(snapshot) => writeln!(out, "from the snapshot of {snapshot}, then {} deltas", rebuilt.atoms_applied)?,
        None => writeln!(out, "from the log: {} deltas", rebuilt.atoms_applied)?,
    }
    for fallback in &rebuilt.fallbacks {
        writeln!(out, "snapshot of {} skipped: {}", fallback.atom, fallback.reason)?;
    }
    let context = &rebuilt.context;
    writeln!(out, "messages: {}", context.messages().len())?;
    for message in context.messages() {
        write_message(message, "  ", out)?;
    }
    for (title, map) in [
        ("tool outputs", context.tool_outputs()),
        ("intermediate results", context.intermediate_results()),
        ("state", context.state()),
    ] {
        writeln!(out, "{title}: {}", map.len())?;
        let ordered: BTreeMap<&String, &Vec<u8>> = map.iter().collect();
        for (key, value) in ordered {
            writeln!(out, "  {key:?} = {}", bytes_text(value, CONTEXT_VALUE_CHARS_MAX))?;
        }
    }
    Ok(())
}

/// Characters of a context value shown in text (`--json` and `atom` show everything).
const CONTEXT_VALUE_CHARS_MAX: usize = 120;

fn context_json(context: &Context) -> Value {
    // serde_json's map is ordered by key: the output is deterministic.
    let map = |m: &continuum::KeyedValues| {
        m.iter().map(|(k, v)| (k.clone(), bytes_json(v))).collect::<serde_json::Map<_, _>>()
    };
    json!({
        "messages": context.messages().iter().map(message_json).collect::<Vec<_>>(),
        "tool_outputs": map(context.tool_outputs()),
        "intermediate_results": map(context.intermediate_results()),
        "state": map(context.state()),
    })
}

// ---------------------------------------------------------------------------------------------
// verify

fn verify(dir: &Path, json: bool, out: &mut dyn Write) -> Result<i32, Failure> {
    let bar = (!json && std::io::stderr().is_terminal()).then(|| {
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template("verifying {bar:40} {bytes}/{total_bytes} ({eta})")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    });
    let mut progress = |done: u64, total: u64| {
        if let Some(bar) = &bar {
            bar.set_length(total);
            bar.set_position(done);
        }
    };
    let report = inspect::verify(dir, &mut progress)?;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let code = if report.is_clean() { 0 } else { 1 };
    if json {
        let value = json!({
            "clean": report.is_clean(), "segments": report.segments, "segment_bytes": report.segment_bytes,
            "records": report.records, "snapshots": report.snapshots,
            "problems": report.problems.iter().map(|p| json!({"file": relative(dir, &p.file), "offset": p.offset, "problem": p.what})).collect::<Vec<_>>(),
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&value)?)?;
        return Ok(code);
    }
    for problem in &report.problems {
        writeln!(out, "PROBLEM {} offset {}: {}", relative(dir, &problem.file), problem.offset, problem.what)?;
    }
    let outcome = if report.is_clean() { "clean".to_owned() } else { format!("{} problems", report.problems.len()) };
    writeln!(
        out,
        "verified {} segments ({} bytes, {} records) and {} snapshots: {outcome}",
        report.segments, report.segment_bytes, report.records, report.snapshots
    )?;
    Ok(code)
}

// ---------------------------------------------------------------------------------------------
// formatting

/// A run's checkpoints, newest first.
fn checkpoints(store: &Store, run: &str, limit: Option<usize>, json: bool, out: &mut dyn Write) -> Result<(), Failure> {
    let info = find_run(store, run)?;
    let found = store.checkpoints(info.id, limit.unwrap_or(usize::MAX))?;
    if json {
        let listed: Vec<Value> = found.iter().map(checkpoint_json).collect();
        let document = json!({ "run": info.id.get(), "name": info.name, "checkpoints": listed });
        writeln!(out, "{}", serde_json::to_string_pretty(&document)?)?;
        return Ok(());
    }
    writeln!(out, "run {} {:?}: {} checkpoints, newest first", info.id.get(), info.name, found.len())?;
    for checkpoint in &found {
        checkpoint_text(checkpoint, out)?;
    }
    Ok(())
}

fn checkpoint_text(checkpoint: &RunCheckpoint, out: &mut dyn Write) -> Result<(), Failure> {
    let terminal = if checkpoint.is_terminal { "yes" } else { "no" };
    writeln!(
        out,
        "#{}  {}  at {} / {}  version {} {}  terminal {terminal}  (atom {})",
        checkpoint.sequence,
        time(checkpoint.written_at_unix_us),
        checkpoint.current_agent,
        checkpoint.position,
        checkpoint.pipeline,
        checkpoint.pipeline_version,
        checkpoint.atom.get(),
    )?;
    writeln!(out, "    resume hint: {}", checkpoint.resume_hint)?;
    writeln!(out, "    side effects: {}", list_text(checkpoint.side_effects_committed.iter().cloned()))?;
    let heads = checkpoint.agent_heads.iter().map(|(agent, atom)| format!("{agent} -> atom {}", atom.get()));
    writeln!(out, "    heads: {}", list_text(heads))?;
    let shared = checkpoint.shared_context.iter().map(|(key, value)| format!("{key} = {}", bytes_text(value, 40)));
    writeln!(out, "    shared: {}", list_text(shared))?;
    Ok(())
}

/// Items joined with commas, or `-` for none.
fn list_text(items: impl Iterator<Item = String>) -> String {
    let joined = items.collect::<Vec<_>>().join(", ");
    if joined.is_empty() { "-".to_owned() } else { joined }
}

fn checkpoint_json(checkpoint: &RunCheckpoint) -> Value {
    let heads: BTreeMap<&str, u64> =
        checkpoint.agent_heads.iter().map(|(agent, atom)| (agent.as_str(), atom.get())).collect();
    let shared: BTreeMap<&str, Value> =
        checkpoint.shared_context.iter().map(|(key, value)| (key.as_str(), bytes_json(value))).collect();
    json!({
        "sequence": checkpoint.sequence,
        "atom": checkpoint.atom.get(),
        "written_at": time(checkpoint.written_at_unix_us),
        "pipeline": checkpoint.pipeline,
        "pipeline_version": checkpoint.pipeline_version,
        "current_agent": checkpoint.current_agent,
        "position": checkpoint.position,
        "is_terminal": checkpoint.is_terminal,
        "resume_hint": checkpoint.resume_hint,
        "side_effects_committed": checkpoint.side_effects_committed,
        "agent_heads": heads,
        "environment": checkpoint.environment,
        "shared_context": shared,
    })
}

fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(|| path.display().to_string(), |name| name.to_string_lossy().into_owned())
}

/// `path` relative to the store directory (so output does not depend on where the store is).
fn relative(dir: &Path, path: &Path) -> String {
    path.strip_prefix(dir).map_or_else(|_| path.display().to_string(), |rel| rel.display().to_string())
}

/// Bytes as a quoted string when they are UTF-8, else as hex; cut after `max` characters.
fn bytes_text(bytes: &[u8], max: usize) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) if text.chars().count() > max => {
            let cut: String = text.chars().take(max).collect();
            format!("{cut:?}… ({} bytes)", bytes.len())
        }
        Ok(text) => format!("{text:?}"),
        Err(_) => format!("0x{} ({} bytes)", hex(&bytes[..bytes.len().min(max / 2)]), bytes.len()),
    }
}

/// Bytes in JSON: a string when they are UTF-8, else `{"hex": "…"}`.
fn bytes_json(bytes: &[u8]) -> Value {
    match std::str::from_utf8(bytes) {
        Ok(text) => json!(text),
        Err(_) => json!({"hex": hex(bytes)}),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Microseconds since the Unix epoch as `YYYY-MM-DDTHH:MM:SS.ffffffZ` (UTC).
fn time(unix_us: u64) -> String {
    if unix_us == 0 {
        return "-".to_owned();
    }
    let seconds = unix_us / 1_000_000;
    let (year, month, day) = civil_from_days((seconds / 86_400) as i64);
    let in_day = seconds % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        in_day / 3600,
        in_day % 3600 / 60,
        in_day % 60,
        unix_us % 1_000_000
    )
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

fn duration(started_us: u64, ended_us: Option<u64>) -> String {
    match ended_us {
        Some(ended) if ended >= started_us => format!("took {:.1} ms", (ended - started_us) as f64 / 1000.0),
        _ => "unfinished".to_owned(),
    }
}

fn reason_text(reason: &SuspendReason) -> String {
    match reason {
        SuspendReason::Approval => "approval".to_owned(),
        SuspendReason::Timer { resume_at_unix_us } => format!("timer until {}", time(*resume_at_unix_us)),
        SuspendReason::Budget { what } => format!("budget: {what}"),
        SuspendReason::Requested { by } => format!("requested by {by}"),
        SuspendReason::Deadline { at_unix_us } => format!("deadline {}", time(*at_unix_us)),
    }
}

/// The suspended runs, oldest suspension first: one block of text each, or one JSON object per
/// line.
fn suspended(store: &Store, json: bool, out: &mut dyn Write) -> Result<(), Failure> {
    for run in store.suspended_runs(&SuspendedFilter::default()) {
        if json {
            writeln!(out, "{}", serde_json::to_string(&suspended_json(&run))?)?;
            continue;
        }
        writeln!(
            out,
            "{} {:?}  suspension {}  {}  since {}  ({} pending, {} decided)",
            run.id.run,
            run.run_name,
            run.id.number,
            reason_text(&run.reason),
            time(run.since_unix_us),
            run.pending.len(),
            run.decided.len()
        )?;
        write_level(&run.root, 1, out)?;
    }
    Ok(())
}

/// One level of a continuation tree and its requests, indented by `depth`, then its children.
fn write_level(level: &ContinuationLevel, depth: usize, out: &mut dyn Write) -> Result<(), Failure> {
    let indent = "  ".repeat(depth);
    let head = level.head.map_or("no head".to_owned(), |atom| format!("head {atom}"));
    writeln!(out, "{indent}{}  {head}", level.agent)?;
    for request in &level.resume_request {
        let decided = level.processed.iter().find(|d| d.request.tool_call_id == request.tool_call_id);
        let state = decided.map_or("pending".to_owned(), |d| decision_text(&d.decision));
        let (id, tool, arguments) = (&request.tool_call_id, &request.tool_name, &request.arguments);
        writeln!(out, "{indent}  ? {id} {tool}({arguments})  [{}]  {state}", request.path.join(" > "))?;
    }
    for child in &level.children {
        write_level(child, depth + 1, out)?;
    }
    Ok(())
}

fn decision_text(decision: &Decision) -> String {
    let verdict = if decision.approved() { "approved" } else { "rejected" };
    let mut text = format!("{verdict} by {} at {}", decision.decided_by, time(decision.decided_at_unix_us));
    if let Some(arguments) = &decision.edited_arguments {
        text.push_str(&format!(" with arguments {arguments}"));
    }
    if let Some(message) = &decision.message {
        text.push_str(&format!(": {message:?}"));
    }
    text
}

fn suspended_json(run: &SuspendedRun) -> Value {
    json!({
        "run": run.id.run.get(), "name": run.run_name, "suspension": run.id.number, "atom": run.id.atom.get(),
        "reason": reason_json(&run.reason), "since_unix_us": run.since_unix_us,
        "pending": run.pending.iter().map(|r| json!({"tool_call_id": r.tool_call_id, "tool_name": r.tool_name,
            "arguments": r.arguments, "path": r.path})).collect::<Vec<_>>(),
        "decided": run.decided.iter().map(|d| json!({"tool_call_id": d.request.tool_call_id,
            "path": d.request.path, "decision": decision_json(&d.decision), "atom": d.atom.get()})).collect::<Vec<_>>(),
        "tree": level_json(&run.root),
    })
}

fn reason_json(reason: &SuspendReason) -> Value {
    match reason {
        SuspendReason::Approval => json!({"kind": "approval"}),
        SuspendReason::Timer { resume_at_unix_us } => json!({"kind": "timer", "resume_at_unix_us": resume_at_unix_us}),
        SuspendReason::Budget { what } => json!({"kind": "budget", "what": what}),
        SuspendReason::Requested { by } => json!({"kind": "requested", "by": by}),
        SuspendReason::Deadline { at_unix_us } => json!({"kind": "deadline", "at_unix_us": at_unix_us}),
    }
}

fn decision_json(decision: &Decision) -> Value {
    json!({"approved": decision.approved(), "decided_by": decision.decided_by,
        "decided_at_unix_us": decision.decided_at_unix_us, "message": decision.message,
        "edited_arguments": decision.edited_arguments})
}

fn level_json(level: &ContinuationLevel) -> Value {
    json!({
        "agent": level.agent, "head": level.head.map(AtomId::get),
        "resume_request": level.resume_request.iter().map(|r| json!({"tool_call_id": r.tool_call_id,
            "tool_name": r.tool_name, "arguments": r.arguments})).collect::<Vec<_>>(),
        "processed": level.processed.iter().map(|d| json!({"tool_call_id": d.request.tool_call_id,
            "decision": decision_json(&d.decision)})).collect::<Vec<_>>(),
        "children": level.children.iter().map(level_json).collect::<Vec<_>>(),
    })
}
