//! continuum against the engines users would pick instead (issue 6), all in one run, on the
//! same disk, with the same atoms: SQLite (WAL; `synchronous=FULL` durable, `NORMAL`
//! buffered), tikv/raft-engine 0.4.2, okaywal 0.3.1, continuum's raw log and its atom store.
//!
//! - `fdatasync`: the floor, a 512-byte `pwrite` + `fdatasync` on a preallocated file.
//! - `durable_append_1` (workload 1): one writer, durable appends: p50/p99 and appends/s.
//! - `durable_append_16` (workload 2): 16 writers (one agent each): appends/s and p99; beside
//!   them, in each trial, two ceilings measured with no engine (`group_floor`): one thread
//!   syncing 16 appends per `fdatasync`, and the ideal 16-thread group commit.
//! - `buffered_append_1` (workload 3): one writer, buffered appends: appends/s.
//! - `resume_open` (workloads 4 and 5): a data set of 1 GiB of atoms (agents of 10,000 and
//!   1,000,000 atoms among fillers, interleaved) is loaded into each engine and synced; then
//!   the engine is reopened (timed: workload 5) and each of the two agents is rebuilt (timed:
//!   workload 4); then every atom of the 10,000-atom agent is read back with its output, in
//!   order (timed: W4h; the store through `Store::agent_history`, the peers as in W4).
//! - Bytes on disk per atom after each of them (workload 6), and `at_rest`: a sample of the
//!   data set's atoms in a continuum store with every delta kept (no policy snapshots), after
//!   one compaction round with cold compression (the store's default), as a long-running
//!   store holds its history.
//!
//! An atom is a ~510-byte protobuf delta from `continuum_peers::Deltas`. Criterion measures
//! workloads 1–3 as usual; after each workload a separate fixed-size loop prints a
//! `==== summary: <workload> ====` block on stderr with the figures docs/BENCHMARKS.md §8
//! quotes, and the run ends with all of them again in `==== summary: peers ====`.
//!
//! `cargo bench -p continuum-peers --bench peers` (about 15 minutes on 2 cores);
//! `PEERS_SCALE=small` shrinks every loop and the data set (10,000 → 1,000 atoms,
//! 1,000,000 → 20,000, 1 GiB → 64 MiB) for a run of a few minutes. A criterion filter selects
//! workloads as in the other benches: a workload runs when its name contains the filter or
//! the filter starts with it. Files live under `target/tmp`, never on tmpfs.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use continuum_peers::{
    AtRestLog, AtRestStore, AtomRef, AtomSink, Deltas, Encoded, Engine, FdatasyncProbe, Machine, Mode, disk_usage,
    group_floor,
};
use criterion::{BenchmarkId, Criterion, Throughput, black_box};

/// Workload names, as criterion prints them.
const FDATASYNC: &str = "fdatasync";
const DURABLE_1: &str = "durable_append_1";
const DURABLE_16: &str = "durable_append_16";
const BUFFERED_1: &str = "buffered_append_1";
const RESUME_OPEN: &str = "resume_open";
const AT_REST: &str = "at_rest";
/// Pause before each fixed-size trial of workload 2.
const TRIAL_SETTLE: Duration = Duration::from_millis(250);
/// After that pause, a workload 2 trial waits until the process is idle (see [`settle`]):
/// threads of the process used less than this much CPU over [`IDLE_WINDOW`]...
const IDLE_CPU_MAX: Duration = Duration::from_millis(5);
/// ... of this much wall time.
const IDLE_WINDOW: Duration = Duration::from_millis(100);
/// The longest a trial waits for the process to become idle.
const IDLE_WAIT_MAX: Duration = Duration::from_secs(30);

/// Writers of workload 2.
const WRITERS: u32 = 16;
/// Distinct deltas the append workloads cycle through.
const POOL_DELTAS: usize = 65_536;
/// Atoms per batch while loading the data set.
const LOAD_BATCH_ATOMS: usize = 256;
/// Filler agents of the data set, besides the small and the big one.
const FILLER_AGENTS: u32 = 8;
/// The data set's agents: the one of 10,000 atoms and the one of 1,000,000.
const SMALL_AGENT: u32 = 0;
const BIG_AGENT: u32 = 1;

fn main() {
    let options = Options::from_args();
    let mut criterion = Criterion::default().configure_from_args();
    if options.list {
        list_benchmarks(&mut criterion);
        return;
    }
    let scale = Scale::new(&options);
    let root = bench_root();
    let machine = Machine::describe(root.path());
    let mut report = Report::default();
    report.machine(&machine, &scale);
    let pool = delta_pool(scale.pool_deltas);

    let probe = fdatasync_floor(&options, &scale, root.path());
    report.section(&options, FDATASYNC, probe.lines());
    if options.runs(DURABLE_1) {
        durable_append_1(&mut criterion, &options, &scale, root.path(), &pool, &mut report);
    }
    if options.runs(DURABLE_16) {
        durable_append_16(&mut criterion, &options, &scale, root.path(), &pool, &mut report);
    }
    if options.runs(BUFFERED_1) {
        buffered_append_1(&mut criterion, &options, &scale, root.path(), &pool, &mut report);
    }
    if options.runs(RESUME_OPEN) {
        resume_open(&options, &scale, root.path(), &mut report);
    }
    if options.runs(AT_REST) {
        at_rest(&options, &scale, root.path(), &mut report);
    }
    report.space(&options);
    report.finish(&options);
    criterion.final_summary();
}

/// Registers every benchmark with an empty body, so `--list` names them without building.
fn list_benchmarks(criterion: &mut Criterion) {
    criterion.bench_function(&format!("{DURABLE_1}/raw_fdatasync"), |b| b.iter(|| ()));
    for engine in Engine::ALL {
        criterion.bench_function(&format!("{DURABLE_1}/{}", engine.id()), |b| b.iter(|| ()));
        criterion.bench_function(&format!("{DURABLE_16}/writers_16/{}", engine.id()), |b| b.iter(|| ()));
        if engine.supports(Mode::Buffered) {
            criterion.bench_function(&format!("{BUFFERED_1}/{}", engine.id()), |b| b.iter(|| ()));
        }
    }
    criterion.final_summary();
}

// ---------------------------------------------------------------------------------------------
// Options and scale

/// What the command line asks for, beyond what criterion itself parses.
struct Options {
    /// Criterion's positional filter.
    filter: Option<String>,
    /// Criterion's test mode (`--test`, or no `--bench`): every loop runs a few times only.
    test: bool,
    /// `--list`: name the benchmarks, run nothing.
    list: bool,
}

impl Options {
    /// Criterion options that take a value in the next argument.
    const VALUE_OPTIONS: &[&str] = &[
        "--color",
        "-c",
        "--save-baseline",
        "-s",
        "--baseline",
        "-b",
        "--baseline-lenient",
        "--format",
        "--profile-time",
        "--load-baseline",
        "--sample-size",
        "--warm-up-time",
        "--measurement-time",
        "--nresamples",
        "--noise-threshold",
        "--confidence-level",
        "--significance-level",
        "--plotting-backend",
        "--output-format",
    ];

    fn from_args() -> Self {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let mut filter = None;
        let mut previous: Option<&str> = None;
        for arg in &args {
            let is_value = previous.is_some_and(|option| Self::VALUE_OPTIONS.contains(&option));
            if !arg.starts_with('-') && !is_value && filter.is_none() {
                filter = Some(arg.clone());
            }
            previous = Some(arg);
        }
        let has = |flag: &str| args.iter().any(|arg| arg == flag);
        Self { filter, test: has("--test") || !has("--bench"), list: has("--list") }
    }

    /// Whether the workload's setup and summary should run under the filter.
    fn runs(&self, workload: &str) -> bool {
        self.filter.as_deref().is_none_or(|filter| workload.contains(filter) || filter.starts_with(workload))
    }
}

/// Sizes of every loop and of the data set.
struct Scale {
    name: &'static str,
    fdatasync_samples: usize,
    durable_samples: usize,
    warmup_samples: usize,
    concurrent_trials: usize,
    concurrent_per_writer: u64,
    buffered_trials: usize,
    buffered_appends: u64,
    small_agent_atoms: u64,
    big_agent_atoms: u64,
    data_set_bytes: u64,
    opens: usize,
    pool_deltas: usize,
    /// Atoms of the at-rest sample.
    at_rest_atoms: u64,
}

impl Scale {
    fn new(options: &Options) -> Self {
        let full = Self {
            name: "default",
            fdatasync_samples: 2000,
            durable_samples: 2000,
            warmup_samples: 200,
            // Trials of 40-50 ms swing by +-15 % on a shared 2-vCPU host: the median of seven
            // is steadier than that of three.
            concurrent_trials: 7,
            concurrent_per_writer: 250,
            buffered_trials: 3,
            buffered_appends: 100_000,
            small_agent_atoms: 10_000,
            big_agent_atoms: 1_000_000,
            data_set_bytes: 1 << 30,
            opens: 3,
            pool_deltas: POOL_DELTAS,
            at_rest_atoms: 600_000,
        };
        if options.test {
            return Self {
                name: "test (criterion --test: the figures mean nothing)",
                fdatasync_samples: 16,
                durable_samples: 16,
                warmup_samples: 2,
                concurrent_trials: 1,
                concurrent_per_writer: 2,
                buffered_trials: 1,
                buffered_appends: 200,
                small_agent_atoms: 50,
                big_agent_atoms: 300,
                data_set_bytes: 1 << 20,
                opens: 1,
                pool_deltas: 512,
                at_rest_atoms: 3_000,
            };
        }
        match std::env::var("PEERS_SCALE").as_deref() {
            Ok("small") => Self {
                name: "small (PEERS_SCALE=small)",
                fdatasync_samples: 500,
                durable_samples: 300,
                warmup_samples: 50,
                concurrent_trials: 2,
                concurrent_per_writer: 100,
                buffered_trials: 2,
                buffered_appends: 20_000,
                small_agent_atoms: 1_000,
                big_agent_atoms: 20_000,
                data_set_bytes: 64 << 20,
                opens: 2,
                pool_deltas: 8192,
                at_rest_atoms: 40_000,
            },
            Ok("default") | Ok("") | Err(_) => full,
            Ok(other) => panic!("PEERS_SCALE should be `small` or `default`, not {other:?}"),
        }
    }
}

/// A temporary directory on the real disk, inside the target directory.
fn bench_root() -> tempfile::TempDir {
    let target_tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(target_tmp).expect("the target tmp directory should be creatable");
    tempfile::Builder::new()
        .prefix("continuum-peers-")
        .tempdir_in(target_tmp)
        .expect("a temporary directory under the target directory")
}

fn delta_pool(count: usize) -> Vec<Encoded> {
    let mut deltas = Deltas::new(42);
    (0..count).map(|_| deltas.next_encoded()).collect()
}

// ---------------------------------------------------------------------------------------------
// The engines under one workload

/// One engine opened for one workload, with the next atom id of each agent.
struct Subject {
    engine: Engine,
    dir: PathBuf,
    sink: Box<dyn AtomSink>,
    next_ids: Vec<AtomicU64>,
}

impl Subject {
    fn open(root: &Path, workload: &str, engine: Engine, mode: Mode) -> Self {
        let dir = root.join(workload).join(engine.id());
        let sink = engine.open(&dir, mode).unwrap_or_else(|error| panic!("{} should open: {error}", engine.name()));
        let next_ids = (0..continuum_peers::AGENTS_MAX).map(|_| AtomicU64::new(0)).collect();
        Self { engine, dir, sink, next_ids }
    }

    /// Appends the agent's next atom, with a delta from the pool.
    fn append(&self, agent: u32, pool: &[Encoded]) {
        let id = self.next_ids[agent as usize].fetch_add(1, Ordering::Relaxed) + 1;
        let delta = &pool[(id as usize * 31 + agent as usize * 7919) % pool.len()];
        self.sink
            .append(&delta.atom(agent, id))
            .unwrap_or_else(|error| panic!("{} should append: {error}", self.engine.name()));
    }

    fn atoms(&self) -> u64 {
        self.next_ids.iter().map(|id| id.load(Ordering::Relaxed)).sum()
    }

    /// Records the bytes on disk per atom, closes the engine and deletes its files.
    fn finish(self, workload: &'static str, report: &mut Report) {
        self.sink.sync().unwrap_or_else(|error| panic!("{} should sync: {error}", self.engine.name()));
        report.record_space(workload, self.engine, &self.dir, self.sink.as_ref(), self.atoms(), None);
        self.sink.close().unwrap_or_else(|error| panic!("{} should close: {error}", self.engine.name()));
        std::fs::remove_dir_all(&self.dir).expect("the workload's files should be removable");
    }
}

fn time(operation: impl FnOnce()) -> Duration {
    let start = Instant::now();
    operation();
    start.elapsed()
}

// ---------------------------------------------------------------------------------------------
// The fdatasync floor

struct Floor {
    samples: usize,
    latencies: Vec<Duration>,
}

impl Floor {
    fn p50(&self) -> Duration {
        percentile(&self.latencies, 50.0)
    }

    fn lines(&self) -> Vec<String> {
        vec![format!(
            "512 B pwrite + fdatasync, preallocated file, {} samples: p50 {}  p99 {}",
            self.samples,
            micros(self.p50()),
            micros(percentile(&self.latencies, 99.0))
        )]
    }
}

fn fdatasync_floor(options: &Options, scale: &Scale, root: &Path) -> Floor {
    let mut probe = FdatasyncProbe::new(&root.join("fdatasync")).expect("the fdatasync probe file should be creatable");
    let warmup = if options.test { 2 } else { 200 };
    let mut latencies: Vec<Duration> = (0..warmup + scale.fdatasync_samples)
        .map(|_| probe.write_and_sync().expect("a raw write + fdatasync should succeed"))
        .skip(warmup)
        .collect();
    latencies.sort_unstable();
    Floor { samples: scale.fdatasync_samples, latencies }
}

// ---------------------------------------------------------------------------------------------
// Workload 1: durable appends, one writer

fn durable_append_1(
    criterion: &mut Criterion,
    options: &Options,
    scale: &Scale,
    root: &Path,
    pool: &[Encoded],
    report: &mut Report,
) {
    let subjects: Vec<Subject> =
        Engine::ALL.iter().map(|e| Subject::open(root, DURABLE_1, *e, Mode::Durable)).collect();
    let mut raw = FdatasyncProbe::new(&root.join(DURABLE_1).join("raw")).expect("the raw baseline should be creatable");

    let mut group = criterion.benchmark_group(DURABLE_1);
    group.throughput(Throughput::Elements(1)).sample_size(20);
    group.warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    group.bench_function("raw_fdatasync", |b| b.iter(|| raw.write_and_sync().expect("raw write + fdatasync")));
    for subject in &subjects {
        group.bench_function(subject.engine.id(), |b| b.iter(|| subject.append(0, pool)));
    }
    group.finish();

    // Interleaved one for one, rotating which goes first, so drift in the device hits all.
    let rows = subjects.len() + 1;
    let mut latencies: Vec<Vec<Duration>> = vec![Vec::with_capacity(scale.durable_samples); rows];
    for sample in 0..scale.warmup_samples + scale.durable_samples {
        for turn in 0..rows {
            let row = (sample + turn) % rows;
            let latency = match row {
                0 => raw.write_and_sync().expect("raw write + fdatasync"),
                _ => time(|| subjects[row - 1].append(0, pool)),
            };
            if sample >= scale.warmup_samples {
                latencies[row].push(latency);
            }
        }
    }
    for row in &mut latencies {
        row.sort_unstable();
    }
    let stats = |row: usize| Latency::of(&latencies[row]);
    let raw_stats = stats(0);
    let engine_stats: Vec<(Engine, Latency)> =
        subjects.iter().enumerate().map(|(at, s)| (s.engine, stats(at + 1))).collect();
    report.durable_1(options, scale.durable_samples, raw_stats, &engine_stats);
    for subject in subjects {
        subject.finish(DURABLE_1, report);
    }
}

/// Latency figures of one engine in one workload.
#[derive(Clone, Copy)]
struct Latency {
    p50: Duration,
    p99: Duration,
    /// Appends per second: one over the mean latency (one writer), or measured (many).
    rate: f64,
}

impl Latency {
    fn of(sorted: &[Duration]) -> Self {
        let mean = sorted.iter().sum::<Duration>().as_secs_f64() / sorted.len() as f64;
        Self { p50: percentile(sorted, 50.0), p99: percentile(sorted, 99.0), rate: 1.0 / mean }
    }
}

// ---------------------------------------------------------------------------------------------
// Workload 2: durable appends, 16 writers

/// Workload 2's appends/s trial by trial, in round order (a round runs every engine's trial,
/// then the ceilings', back to back).
struct W2Rounds {
    engines: Vec<(Engine, Vec<f64>)>,
    ideal: Vec<f64>,
    /// What continuum's commit path did in each of its engines' trials.
    commits: Vec<(Engine, Vec<CommitTrial>)>,
}

/// What continuum's commit path did in one workload-2 trial: the difference of its metrics
/// (`AtomSink::commit_metrics`) across the trial, beside the trial's rate.
#[derive(Clone, Copy, Debug)]
struct CommitTrial {
    rate: f64,
    batches: u64,
    fdatasyncs: u64,
    fdatasync_ns: u64,
    waits: u64,
    slept: u64,
    hold_offs: u64,
}

impl CommitTrial {
    fn of(rate: f64, before: &continuum::MetricsSnapshot, after: &continuum::MetricsSnapshot) -> Self {
        Self {
            rate,
            batches: after.batches.saturating_sub(before.batches),
            fdatasyncs: after.fdatasyncs.saturating_sub(before.fdatasyncs),
            fdatasync_ns: after.fdatasync_ns.sum.saturating_sub(before.fdatasync_ns.sum),
            waits: after.commit_waits.saturating_sub(before.commit_waits),
            slept: after.commit_wait_sleeps.saturating_sub(before.commit_wait_sleeps),
            hold_offs: after.commit_spin_hold_offs.saturating_sub(before.commit_spin_hold_offs),
        }
    }
}

/// One row of the commit-path table: appends per `fdatasync`, its mean latency, the share of
/// waits that slept, the hold-offs of spinning (and in how many trials), and the median rate
/// of the trials without a hold-off and of those with one.
fn commit_row(engine: Engine, trials: &[CommitTrial]) -> Vec<String> {
    let sum = |field: fn(&CommitTrial) -> u64| trials.iter().map(field).sum::<u64>();
    let (syncs, waits) = (sum(|t| t.fdatasyncs).max(1), sum(|t| t.waits).max(1));
    let held = trials.iter().filter(|t| t.hold_offs > 0).count();
    let mut with: Vec<f64> = trials.iter().filter(|t| t.hold_offs > 0).map(|t| t.rate).collect();
    let mut without: Vec<f64> = trials.iter().filter(|t| t.hold_offs == 0).map(|t| t.rate).collect();
    let median_or_none =
        |rates: &mut Vec<f64>| if rates.is_empty() { "none".to_owned() } else { thousands(median(rates)) };
    vec![
        engine.name().to_owned(),
        format!("{:.2}", sum(|t| t.batches) as f64 / syncs as f64),
        format!("{:.1} µs", sum(|t| t.fdatasync_ns) as f64 / syncs as f64 / 1000.0),
        format!("{:.0} %", 100.0 * sum(|t| t.slept) as f64 / waits as f64),
        format!("{} ({held} of {})", sum(|t| t.hold_offs), trials.len()),
        format!("{} / {}", median_or_none(&mut without), median_or_none(&mut with)),
    ]
}

impl W2Rounds {
    fn of(&self, engine: Engine) -> &[f64] {
        self.engines.iter().find(|(e, _)| *e == engine).map(|(_, rates)| rates.as_slice()).expect("every engine ran")
    }
}

/// Each round's `ours ÷ theirs`: the median over the rounds, the lowest and the highest. The
/// trials of one round ran back to back, so a drift of the host's speed between rounds (it can
/// halve every engine's rate for minutes) cancels out of these ratios.
fn paired(ours: &[f64], theirs: &[f64]) -> (f64, f64, f64) {
    let mut ratios: Vec<f64> = ours.iter().zip(theirs).map(|(ours, theirs)| ours / theirs).collect();
    let (low, high) = ratios.iter().fold((f64::INFINITY, 0.0_f64), |(low, high), r| (low.min(*r), high.max(*r)));
    (median(&mut ratios), low, high)
}

/// Workload 2's ceilings, measured with no engine (`continuum_peers::group_floor`): medians of
/// the trials' appends per second.
#[derive(Clone, Copy)]
struct Ceilings {
    /// One thread writing `WRITERS` appends per `pwrite` + `fdatasync`: the disk's ceiling.
    one_thread: f64,
    /// `WRITERS` threads each waiting for its own append, doing nothing else: the ceiling of
    /// group commit on these cores.
    ideal: f64,
}

/// Waits [`TRIAL_SETTLE`], then until the process is idle: its threads used less than
/// [`IDLE_CPU_MAX`] of CPU in the last [`IDLE_WINDOW`] (at most [`IDLE_WAIT_MAX`]). Returns how
/// long it waited. Background work one engine leaves behind (the continuum store's policy
/// snapshots, paced to a quarter of a core; okaywal's checkpoints) would otherwise run inside
/// the next engines' trials: a low-priority thread busy on one of two cores halved the raw
/// log's rate here (measured 2026-12-01).
fn settle() -> Duration {
    let started = Instant::now();
    std::thread::sleep(TRIAL_SETTLE);
    let mut before = process_cpu();
    while started.elapsed() < IDLE_WAIT_MAX {
        std::thread::sleep(IDLE_WINDOW);
        let now = process_cpu();
        if now.saturating_sub(before) < IDLE_CPU_MAX {
            break;
        }
        before = now;
    }
    started.elapsed()
}

/// CPU time the process's live threads have used (`/proc/self/task/*/schedstat`, nanoseconds).
fn process_cpu() -> Duration {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return Duration::ZERO };
    let nanos: u64 = tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|stat| stat.split_whitespace().next().and_then(|ns| ns.parse::<u64>().ok()))
        .sum();
    Duration::from_nanos(nanos)
}

/// `per_writer` appends from each of `WRITERS` threads, each its own agent; returns the wall
/// time from the moment all threads are ready, and every append's latency if asked.
fn concurrent_appends(subject: &Subject, pool: &[Encoded], per_writer: u64, keep: bool) -> (Duration, Vec<Duration>) {
    let ready = Barrier::new(WRITERS as usize + 1);
    let latencies = Mutex::new(Vec::new());
    let elapsed = std::thread::scope(|scope| {
        let ready = &ready;
        let latencies = &latencies;
        let writers: Vec<_> = (0..WRITERS)
            .map(|agent| {
                scope.spawn(move || {
                    let mut mine = Vec::with_capacity(if keep { per_writer as usize } else { 0 });
                    ready.wait();
                    for _ in 0..per_writer {
                        let latency = time(|| subject.append(agent, pool));
                        if keep {
                            mine.push(latency);
                        }
                    }
                    latencies.lock().expect("no writer panicked").extend(mine);
                })
            })
            .collect();
        ready.wait();
        let start = Instant::now();
        for writer in writers {
            writer.join().expect("a writer should not panic");
        }
        start.elapsed()
    });
    (elapsed, latencies.into_inner().expect("no writer panicked"))
}

fn durable_append_16(
    criterion: &mut Criterion,
    options: &Options,
    scale: &Scale,
    root: &Path,
    pool: &[Encoded],
    report: &mut Report,
) {
    let subjects: Vec<Subject> =
        Engine::ALL.iter().map(|e| Subject::open(root, DURABLE_16, *e, Mode::Durable)).collect();

    let mut group = criterion.benchmark_group(DURABLE_16);
    group.throughput(Throughput::Elements(1)).sample_size(10);
    group.warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(4));
    for subject in &subjects {
        group.bench_with_input(BenchmarkId::new("writers_16", subject.engine.id()), subject, |b, subject| {
            b.iter_custom(|appends| {
                let per_writer = appends.div_ceil(u64::from(WRITERS));
                let (elapsed, _) = concurrent_appends(subject, pool, per_writer, false);
                elapsed.mul_f64(appends as f64 / (per_writer * u64::from(WRITERS)) as f64)
            });
        });
    }
    group.finish();

    // Fixed-size trials, engines in turn; the median trial's rate and the p99 of every append.
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); subjects.len()];
    let mut latencies: Vec<Vec<Duration>> = vec![Vec::new(); subjects.len()];
    let mut commits: Vec<Vec<CommitTrial>> = vec![Vec::new(); subjects.len()];
    let (mut one_thread, mut ideal) = (Vec::new(), Vec::new());
    let mut longest_settle = Duration::ZERO;
    let ceilings = root.join(DURABLE_16).join("ceilings");
    for _ in 0..scale.concurrent_trials {
        for (at, subject) in subjects.iter().enumerate() {
            // Background work an engine left behind (the store's paced policy snapshots, an
            // engine's purge or checkpoint) finishes before the next trial, not inside it.
            longest_settle = longest_settle.max(settle());
            let before = subject.sink.commit_metrics();
            let (elapsed, mine) = concurrent_appends(subject, pool, scale.concurrent_per_writer, true);
            let rate = (scale.concurrent_per_writer * u64::from(WRITERS)) as f64 / elapsed.as_secs_f64();
            if let (Some(before), Some(after)) = (before, subject.sink.commit_metrics()) {
                commits[at].push(CommitTrial::of(rate, &before, &after));
            }
            rates[at].push(rate);
            latencies[at].extend(mine);
        }
        // The same number of appends with no engine: the ceilings the engines are read against.
        longest_settle = longest_settle.max(settle());
        let rounds = scale.concurrent_per_writer;
        one_thread.push(group_floor::one_thread_groups(&ceilings, WRITERS, rounds).expect("the disk ceiling runs"));
        longest_settle = longest_settle.max(settle());
        ideal.push(group_floor::ideal_group_commit(&ceilings, WRITERS, rounds).expect("the ideal group commit runs"));
    }
    // In round order, before the medians sort them: each round's trials ran back to back.
    let rounds = W2Rounds {
        engines: subjects.iter().zip(&rates).map(|(subject, rates)| (subject.engine, rates.clone())).collect(),
        ideal: ideal.clone(),
        commits: subjects
            .iter()
            .zip(commits)
            .filter(|(_, trials)| !trials.is_empty())
            .map(|(s, t)| (s.engine, t))
            .collect(),
    };
    let ceilings = Ceilings { one_thread: median(&mut one_thread), ideal: median(&mut ideal) };
    let figures: Vec<(Engine, Latency)> = subjects
        .iter()
        .enumerate()
        .map(|(at, subject)| {
            latencies[at].sort_unstable();
            let mut latency = Latency::of(&latencies[at]);
            latency.rate = median(&mut rates[at]);
            (subject.engine, latency)
        })
        .collect();
    report.durable_16(options, scale, &figures, ceilings, longest_settle, &rounds);
    for subject in subjects {
        subject.finish(DURABLE_16, report);
    }
}

// ---------------------------------------------------------------------------------------------
// Workload 3: buffered appends, one writer

fn buffered_append_1(
    criterion: &mut Criterion,
    options: &Options,
    scale: &Scale,
    root: &Path,
    pool: &[Encoded],
    report: &mut Report,
) {
    let subjects: Vec<Subject> = Engine::ALL
        .iter()
        .filter(|engine| engine.supports(Mode::Buffered))
        .map(|e| Subject::open(root, BUFFERED_1, *e, Mode::Buffered))
        .collect();
    let sequential = |subject: &Subject, appends: u64| {
        time(|| {
            for _ in 0..appends {
                subject.append(0, black_box(pool));
            }
        })
    };

    let mut group = criterion.benchmark_group(BUFFERED_1);
    group.throughput(Throughput::Elements(1)).sample_size(10);
    group.warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    for subject in &subjects {
        group.bench_function(subject.engine.id(), |b| b.iter_custom(|appends| sequential(subject, appends)));
    }
    group.finish();

    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); subjects.len()];
    for _ in 0..scale.buffered_trials {
        for (at, subject) in subjects.iter().enumerate() {
            let elapsed = sequential(subject, scale.buffered_appends);
            rates[at].push(scale.buffered_appends as f64 / elapsed.as_secs_f64());
        }
    }
    let figures: Vec<(Engine, f64)> =
        subjects.iter().enumerate().map(|(at, subject)| (subject.engine, median(&mut rates[at]))).collect();
    report.buffered_1(options, scale, &figures);
    for subject in subjects {
        subject.finish(BUFFERED_1, report);
    }
}

// ---------------------------------------------------------------------------------------------
// Workloads 4 and 5: resume and open after reopening a data set of 1 GiB of atoms

/// Which agent writes the data set's next atom: the small agent, the big one and the fillers
/// each get their share spread evenly over the whole set (largest deficit first).
struct Schedule {
    total: u64,
    targets: [u64; 3],
    written: [u64; 3],
}

impl Schedule {
    fn new(scale: &Scale) -> Self {
        let total = (scale.data_set_bytes / 510).max(scale.small_agent_atoms + scale.big_agent_atoms);
        let fillers = total - scale.small_agent_atoms - scale.big_agent_atoms;
        Self { total, targets: [scale.small_agent_atoms, scale.big_agent_atoms, fillers], written: [0; 3] }
    }

    /// The data set's schedule shrunk to `total` atoms, each class keeping its share.
    fn sample(scale: &Scale, total: u64) -> Self {
        let full = Self::new(scale);
        let share = |class: usize| full.targets[class] * total / full.total;
        let (small, big) = (share(0), share(1));
        Self { total, targets: [small, big, total - small - big], written: [0; 3] }
    }

    fn next_agent(&mut self, at: u64) -> u32 {
        let deficit = |class: usize| {
            self.targets[class] as f64 * (at + 1) as f64 / self.total as f64 - self.written[class] as f64
        };
        let class = (0..3)
            .filter(|class| self.written[*class] < self.targets[*class])
            .max_by(|a, b| deficit(*a).total_cmp(&deficit(*b)))
            .expect("the schedule should not run past its total");
        let agent = match class {
            0 => SMALL_AGENT,
            1 => BIG_AGENT,
            _ => 2 + (self.written[2] % u64::from(FILLER_AGENTS)) as u32,
        };
        self.written[class] += 1;
        agent
    }
}

/// What loading the data set into one engine produced.
struct Loaded {
    atoms: u64,
    delta_bytes: u64,
    load: Duration,
}

fn load_data_set(engine: Engine, dir: &Path, scale: &Scale) -> Loaded {
    let start = Instant::now();
    let sink = engine.open(dir, Mode::Load).unwrap_or_else(|error| panic!("{} should open: {error}", engine.name()));
    let (atoms, delta_bytes) = load_into(sink.as_ref(), engine.name(), Schedule::new(scale));
    sink.sync().unwrap_or_else(|error| panic!("{} should sync: {error}", engine.name()));
    sink.close().unwrap_or_else(|error| panic!("{} should close: {error}", engine.name()));
    Loaded { atoms, delta_bytes, load: start.elapsed() }
}

/// Appends the atoms of `schedule` to `sink` in batches; returns the atoms and delta bytes.
fn load_into(sink: &dyn AtomSink, name: &str, mut schedule: Schedule) -> (u64, u64) {
    let mut deltas = Deltas::new(6);
    let mut next_ids = [0u64; (2 + FILLER_AGENTS) as usize];
    let mut delta_bytes = 0;
    let mut at = 0;
    while at < schedule.total {
        let count = (schedule.total - at).min(LOAD_BATCH_ATOMS as u64);
        let batch: Vec<(u32, u64, Encoded)> = (0..count)
            .map(|offset| {
                let agent = schedule.next_agent(at + offset);
                next_ids[agent as usize] += 1;
                (agent, next_ids[agent as usize], deltas.next_encoded())
            })
            .collect();
        delta_bytes += batch.iter().map(|(_, _, delta)| delta.bytes.len() as u64).sum::<u64>();
        let atoms: Vec<AtomRef<'_>> = batch.iter().map(|(agent, id, delta)| delta.atom(*agent, *id)).collect();
        sink.append_batch(&atoms).unwrap_or_else(|error| panic!("{name} should load: {error}"));
        at += count;
    }
    (schedule.total, delta_bytes)
}

/// Workload 6 at rest: a sample of the data set's atoms in a continuum store that keeps every
/// delta, after one compaction round with cold compression; then the same sample in the raw
/// log, its sealed segments rewritten with the same compression.
fn at_rest(options: &Options, scale: &Scale, root: &Path, report: &mut Report) {
    let dir = root.join(AT_REST);
    let store = AtRestStore::open(&dir).expect("the at-rest store should open");
    let started = Instant::now();
    let (atoms, delta_bytes) =
        load_into(store.sink(), "the at-rest store", Schedule::sample(scale, scale.at_rest_atoms));
    store.sink().sync().expect("the at-rest store should sync");
    let load = started.elapsed();
    let started = Instant::now();
    let round = store.compact().expect("the at-rest round should run");
    let compact = started.elapsed();
    assert_eq!(round.deltas_reclaimed, 0, "no snapshots: the round reclaims nothing");
    report.record_space(AT_REST, Engine::ContinuumStore, &dir, store.sink(), atoms, Some(delta_bytes));
    let (compressed, appended, checkpoint) = store.breakdown();
    store.close().expect("the at-rest store should close");
    let mut lines = vec![
        format!("sample: {atoms} atoms of the data set's deltas and agents, loaded in {:.1} s", load.as_secs_f64()),
        format!(
            "compaction round: {} sealed segments compressed in {:.1} s ({:.1} µs per atom; half of it the round's yield to the foreground)",
            round.segments_compressed,
            compact.as_secs_f64(),
            compact.as_secs_f64() * 1e6 / atoms as f64
        ),
        format!(
            "log bytes: {} → {} in the compressed segments; the active segment stays as appended",
            round.bytes_read, round.bytes_written
        ),
        format!(
            "where the bytes are, per atom of the sample: compressed segments {:.1}, segments as appended (the active one) {:.1}, index snapshot {:.1}",
            compressed as f64 / atoms as f64,
            appended as f64 / atoms as f64,
            checkpoint as f64 / atoms as f64
        ),
    ];
    std::fs::remove_dir_all(&dir).expect("the sample should be removable");

    // The same sample in the raw log, its sealed segments compressed with the same settings.
    let log = AtRestLog::open(&dir).expect("the at-rest log should open");
    let (log_atoms, log_delta_bytes) =
        load_into(log.sink(), "the at-rest log", Schedule::sample(scale, scale.at_rest_atoms));
    log.sink().sync().expect("the at-rest log should sync");
    let started = Instant::now();
    let (segments, before, after) = log.compress_sealed().expect("the at-rest log should compress");
    let compress = started.elapsed();
    report.record_space(AT_REST, Engine::ContinuumLog, &dir, log.sink(), log_atoms, Some(log_delta_bytes));
    log.close().expect("the at-rest log should close");
    lines.push(format!(
        "raw log, same sample: {segments} sealed segments rewritten compressed (`Log::rewrite_segment_with`, the store's cold-compression settings) in {:.1} s, {before} → {after} frame bytes",
        compress.as_secs_f64()
    ));
    report.section(options, AT_REST, lines);
    std::fs::remove_dir_all(&dir).expect("the sample should be removable");
}

/// Workload 4 and 5 figures of one engine.
struct Reopened {
    engine: Engine,
    loaded: Loaded,
    open: Duration,
    small: Duration,
    big: Duration,
    /// Every atom of the small agent read back with its output (`AtomSink::history`).
    history: Duration,
}

fn resume_open(options: &Options, scale: &Scale, root: &Path, report: &mut Report) {
    let mut figures = Vec::new();
    for engine in Engine::ALL {
        let dir = root.join(RESUME_OPEN).join(engine.id());
        let loaded = load_data_set(engine, &dir, scale);
        eprintln!(
            "{RESUME_OPEN}: loaded {} atoms into {} in {:.1} s",
            loaded.atoms,
            engine.name(),
            loaded.load.as_secs_f64()
        );
        let (mut opens, mut smalls, mut bigs, mut histories) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..scale.opens {
            let start = Instant::now();
            let sink = engine
                .open(&dir, Mode::Durable)
                .unwrap_or_else(|error| panic!("{} should reopen: {error}", engine.name()));
            opens.push(start.elapsed());
            for (agent, expected, times) in
                [(SMALL_AGENT, scale.small_agent_atoms, &mut smalls), (BIG_AGENT, scale.big_agent_atoms, &mut bigs)]
            {
                let start = Instant::now();
                let resumed =
                    sink.resume(agent).unwrap_or_else(|error| panic!("{} should resume: {error}", engine.name()));
                times.push(start.elapsed());
                assert_eq!(resumed.atoms, expected, "{} should resume every atom of agent {agent}", engine.name());
            }
            let start = Instant::now();
            let read = sink
                .history(SMALL_AGENT)
                .unwrap_or_else(|error| panic!("{} should read the history: {error}", engine.name()));
            histories.push(start.elapsed());
            assert_eq!(read.atoms, scale.small_agent_atoms, "{} should read every atom", engine.name());
            if opens.len() == scale.opens {
                report.record_space(RESUME_OPEN, engine, &dir, sink.as_ref(), loaded.atoms, Some(loaded.delta_bytes));
            }
            sink.close().unwrap_or_else(|error| panic!("{} should close: {error}", engine.name()));
            if opens.len() == scale.opens {
                report.record_space_closed(RESUME_OPEN, engine, &dir);
            }
        }
        let reopened = Reopened {
            engine,
            loaded,
            open: median_duration(&mut opens),
            small: median_duration(&mut smalls),
            big: median_duration(&mut bigs),
            history: median_duration(&mut histories),
        };
        eprintln!(
            "{RESUME_OPEN}: {}: open {:.3} s, resume {:.3} s / {:.3} s",
            engine.name(),
            reopened.open.as_secs_f64(),
            reopened.small.as_secs_f64(),
            reopened.big.as_secs_f64()
        );
        figures.push(reopened);
        std::fs::remove_dir_all(&dir).expect("the data set should be removable");
    }
    report.resume_open(options, scale, &figures);
}

// ---------------------------------------------------------------------------------------------
// Figures

/// The nearest-rank percentile of sorted durations.
fn percentile(sorted: &[Duration], percent: f64) -> Duration {
    assert!(!sorted.is_empty(), "a percentile needs samples");
    let rank = ((percent / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn median(values: &mut [f64]) -> f64 {
    assert!(!values.is_empty(), "a median needs values");
    values.sort_unstable_by(f64::total_cmp);
    values[(values.len() - 1) / 2]
}

fn median_duration(values: &mut [Duration]) -> Duration {
    values.sort_unstable();
    values[(values.len() - 1) / 2]
}

fn micros(duration: Duration) -> String {
    format!("{:.1} µs", duration.as_secs_f64() * 1e6)
}

/// Seconds, or milliseconds below one second.
fn seconds(duration: Duration) -> String {
    if duration < Duration::from_secs(1) {
        format!("{:.2} ms", duration.as_secs_f64() * 1e3)
    } else {
        format!("{:.3} s", duration.as_secs_f64())
    }
}

/// `1234567.8` as `1,234,568`.
fn thousands(value: f64) -> String {
    let digits = format!("{value:.0}");
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// A ratio as `2.31×`.
fn times(value: f64) -> String {
    format!("{value:.2}×")
}

fn met(condition: bool) -> &'static str {
    if condition { "met" } else { "MISSED" }
}

/// Columns padded to their widest cell, `|`-separated (Markdown-ready).
fn table(header: &[&str], rows: &[Vec<String>]) -> Vec<String> {
    let mut widths: Vec<usize> = header.iter().map(|cell| cell.chars().count()).collect();
    for row in rows {
        for (at, cell) in row.iter().enumerate() {
            widths[at] = widths[at].max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> =
            cells.iter().enumerate().map(|(at, cell)| format!("{cell:<width$}", width = widths[at])).collect();
        format!("| {} |", padded.join(" | "))
    };
    let mut lines = vec![line(header.iter().map(|cell| (*cell).to_owned()).collect())];
    lines.push(line(widths.iter().map(|width| "-".repeat(*width)).collect()));
    lines.extend(rows.iter().map(|row| line(row.clone())));
    lines
}

/// One engine's bytes on disk after one workload.
struct Space {
    workload: &'static str,
    engine: Engine,
    atoms: u64,
    allocated: u64,
    /// Blocks allocated once the engine was closed cleanly (what `du` shows of a closed store),
    /// where the workload measures it.
    allocated_closed: Option<u64>,
    used: u64,
    delta_bytes: Option<u64>,
}

/// Every block printed so far, printed again at the end as one summary.
#[derive(Default)]
struct Report {
    lines: Vec<String>,
    space: Vec<Space>,
    /// Each goal's verdict, repeated at the end.
    goals: Vec<String>,
}

impl Report {
    fn machine(&mut self, machine: &Machine, scale: &Scale) {
        let lines = [
            format!("cores (available_parallelism): {}", machine.cores),
            format!("cpu: {}", machine.cpu),
            format!("memory: {}", machine.memory),
            format!("kernel: {}", machine.kernel),
            format!("bench directory file system (df -T): {}", machine.file_system),
            format!("scale: {}", scale.name),
            format!("load average at the start (/proc/loadavg): {}", load_average()),
            format!("continuum store protocol: {}", continuum_peers::store_protocol()),
        ];
        assert!(!machine.on_tmpfs(), "the bench directory is on tmpfs: the figures would be meaningless");
        self.lines.push("==== machine ====".to_owned());
        self.lines.extend(lines.iter().map(|line| format!("  {line}")));
        for line in &self.lines {
            eprintln!("{line}");
        }
    }

    fn section(&mut self, options: &Options, workload: &str, lines: Vec<String>) {
        let mut block = vec![String::new(), format!("==== summary: {workload} ====")];
        if options.test {
            block.push("  (test mode: loops ran a few times only; the figures mean nothing)".to_owned());
        }
        block.extend(lines.iter().map(|line| format!("  {line}")));
        block.push(format!("==== end {workload} ===="));
        for line in &block {
            eprintln!("{line}");
        }
        self.lines.extend(block);
    }

    fn durable_1(&mut self, options: &Options, samples: usize, raw: Latency, figures: &[(Engine, Latency)]) {
        let find =
            |engine: Engine| figures.iter().find(|(e, _)| *e == engine).map(|(_, l)| *l).expect("every engine ran");
        let (log, store) = (find(Engine::ContinuumLog), find(Engine::ContinuumStore));
        let mut rows = vec![vec![
            "raw 512 B pwrite + fdatasync".to_owned(),
            micros(raw.p50),
            micros(raw.p99),
            thousands(raw.rate),
            times(log.p50.as_secs_f64() / raw.p50.as_secs_f64()),
            times(store.p50.as_secs_f64() / raw.p50.as_secs_f64()),
        ]];
        for (engine, latency) in figures {
            rows.push(vec![
                engine.name().to_owned(),
                micros(latency.p50),
                micros(latency.p99),
                thousands(latency.rate),
                ratio_cell(*engine, latency.p50.as_secs_f64() / log.p50.as_secs_f64()),
                ratio_cell(*engine, latency.p50.as_secs_f64() / store.p50.as_secs_f64()),
            ]);
        }
        let mut lines = vec![format!("{samples} samples per engine, interleaved; appends/s = 1 / mean latency")];
        lines.extend(table(
            &["engine", "p50", "p99", "appends/s", "log: peer p50 ÷ log p50", "store: peer p50 ÷ store p50"],
            &rows,
        ));
        lines.push("(raw row: continuum p50 ÷ raw p50, the overhead over the floor)".to_owned());
        let raft = find(Engine::RaftEngine);
        let goals = [
            format!(
                "W1 log p50 ÷ raw fdatasync p50 = {:.3} (goal ≤ 1.15: {})",
                log.p50.as_secs_f64() / raw.p50.as_secs_f64(),
                met(log.p50.as_secs_f64() / raw.p50.as_secs_f64() <= 1.15)
            ),
            format!(
                "W1 store p50 ÷ raw fdatasync p50 = {:.3} (goal ≤ 1.15: {})",
                store.p50.as_secs_f64() / raw.p50.as_secs_f64(),
                met(store.p50.as_secs_f64() / raw.p50.as_secs_f64() <= 1.15)
            ),
            at_least_raft("W1 appends/s", log.rate / raft.rate, store.rate / raft.rate),
        ];
        lines.extend(goals.iter().cloned());
        self.goals.extend(goals);
        self.section(options, DURABLE_1, lines);
    }

    fn durable_16(
        &mut self,
        options: &Options,
        scale: &Scale,
        figures: &[(Engine, Latency)],
        ceilings: Ceilings,
        longest_settle: Duration,
        rounds: &W2Rounds,
    ) {
        let find =
            |engine: Engine| figures.iter().find(|(e, _)| *e == engine).map(|(_, l)| *l).expect("every engine ran");
        let (log, store) = (find(Engine::ContinuumLog), find(Engine::ContinuumStore));
        let rows: Vec<Vec<String>> = figures
            .iter()
            .map(|(engine, latency)| {
                vec![
                    engine.name().to_owned(),
                    thousands(latency.rate),
                    micros(latency.p50),
                    micros(latency.p99),
                    ratio_cell(*engine, log.rate / latency.rate),
                    ratio_cell(*engine, store.rate / latency.rate),
                ]
            })
            .collect();
        let mut lines = vec![format!(
            "{WRITERS} writers (one agent each) × {} appends, {} trials per engine; median trial's appends/s, p50/p99 over every append",
            scale.concurrent_per_writer, scale.concurrent_trials
        )];
        lines.extend(table(&["engine", "appends/s", "p50", "p99", "log ÷ peer", "store ÷ peer"], &rows));
        let (raft, sqlite) = (find(Engine::RaftEngine), find(Engine::Sqlite));
        let share = |rate: f64, ceiling: f64| format!("{:.0} %", 100.0 * rate / ceiling);
        let ceiling_rows = [
            ("one thread, 16 appends per pwrite + fdatasync (the disk's ceiling)", ceilings.one_thread),
            ("16 threads, ideal group commit (nothing but a shared pwrite + fdatasync)", ceilings.ideal),
        ]
        .map(|(name, rate)| {
            vec![
                name.to_owned(),
                thousands(rate),
                times(rate / sqlite.rate),
                times(rate / raft.rate),
                share(log.rate, rate),
                share(store.rate, rate),
            ]
        });
        lines.push(String::new());
        lines.push(format!(
            "ceilings with no engine, {} rounds of {WRITERS} × 512 B per trial, median trial (into written zeros: no extent to convert)",
            scale.concurrent_per_writer
        ));
        let idle = format!(
            "every trial waited {} ms, then until the process was idle (< {} ms of CPU in {} ms); the longest wait: {:.2} s",
            TRIAL_SETTLE.as_millis(),
            IDLE_CPU_MAX.as_millis(),
            IDLE_WINDOW.as_millis(),
            longest_settle.as_secs_f64()
        );
        lines.extend(table(
            &["ceiling", "appends/s", "÷ SQLite", "÷ raft-engine", "log reaches", "store reaches"],
            &ceiling_rows,
        ));
        lines.push(idle);
        let (log_rounds, store_rounds) = (rounds.of(Engine::ContinuumLog), rounds.of(Engine::ContinuumStore));
        let cell = |(median, low, high): (f64, f64, f64)| format!("{} ({}–{})", times(median), times(low), times(high));
        let share_cell = |(median, low, high): (f64, f64, f64)| {
            format!("{:.0} % ({:.0}–{:.0} %)", 100.0 * median, 100.0 * low, 100.0 * high)
        };
        let mut paired_rows: Vec<Vec<String>> = figures
            .iter()
            .filter(|(engine, _)| !engine.is_continuum())
            .map(|(engine, _)| {
                let theirs = rounds.of(*engine);
                vec![engine.name().to_owned(), cell(paired(log_rounds, theirs)), cell(paired(store_rounds, theirs))]
            })
            .collect();
        paired_rows.push(vec![
            "ideal group commit (share)".to_owned(),
            share_cell(paired(log_rounds, &rounds.ideal)),
            share_cell(paired(store_rounds, &rounds.ideal)),
        ]);
        lines.push(String::new());
        lines.push(format!(
            "paired ratios (not the goals' figures, which are the ratios of the medians above): each round's continuum trial ÷ the same round's trial of the other, median over the {} rounds (lowest–highest)",
            log_rounds.len()
        ));
        lines.extend(table(&["against", "log ÷ it", "store ÷ it"], &paired_rows));
        lines.push(String::new());
        lines.push(
            "continuum's commit path in these trials (its metrics across each trial): spinning is held off after three stalls (yields back over 1 ms late) within 25 ms, and its waiters then sleep (docs/ARCHITECTURE.md, \"Spinning stands aside on a busy CPU\")".to_owned(),
        );
        let commit_rows: Vec<Vec<String>> =
            rounds.commits.iter().map(|(engine, trials)| commit_row(*engine, trials)).collect();
        lines.extend(table(
            &[
                "engine",
                "appends per fdatasync",
                "fdatasync mean",
                "waits that slept",
                "hold-offs (trials)",
                "median trial without / with a hold-off",
            ],
            &commit_rows,
        ));
        let goals = [
            format!(
                "W2 log: {} raft-engine (goal ≥ 2: {}), {} SQLite (goal ≥ 14: {})",
                times(log.rate / raft.rate),
                met(log.rate / raft.rate >= 2.0),
                times(log.rate / sqlite.rate),
                met(log.rate / sqlite.rate >= 14.0)
            ),
            format!(
                "W2 store: {} raft-engine (goal ≥ 2: {}), {} SQLite (goal ≥ 14: {})",
                times(store.rate / raft.rate),
                met(store.rate / raft.rate >= 2.0),
                times(store.rate / sqlite.rate),
                met(store.rate / sqlite.rate >= 14.0)
            ),
            format!(
                "W2 ceiling (not a goal): the ideal 16-thread group commit does {} SQLite; log {}, store {} of it",
                times(ceilings.ideal / sqlite.rate),
                share(log.rate, ceilings.ideal),
                share(store.rate, ceilings.ideal)
            ),
        ];
        lines.extend(goals.iter().cloned());
        self.goals.extend(goals);
        self.section(options, DURABLE_16, lines);
    }

    fn buffered_1(&mut self, options: &Options, scale: &Scale, figures: &[(Engine, f64)]) {
        let find = |engine: Engine| figures.iter().find(|(e, _)| *e == engine).map(|(_, r)| *r).expect("engine ran");
        let log = find(Engine::ContinuumLog);
        let store = find(Engine::ContinuumStore);
        let mut rows: Vec<Vec<String>> = figures
            .iter()
            .map(|(engine, rate)| {
                let (by_log, by_store) = (ratio_cell(*engine, log / rate), ratio_cell(*engine, store / rate));
                vec![engine.name().to_owned(), thousands(*rate), by_log, by_store]
            })
            .collect();
        for engine in Engine::ALL.iter().filter(|engine| !engine.supports(Mode::Buffered)) {
            rows.push(vec![
                engine.name().to_owned(),
                "n/a: every commit syncs".to_owned(),
                "".to_owned(),
                "".to_owned(),
            ]);
        }
        let mut lines = vec![format!(
            "{} trials × {} appends per engine, median reported (SQLite synchronous=NORMAL, raft-engine sync=false, log Durability::Buffered, store atom_durability(Buffered))",
            scale.buffered_trials,
            thousands(scale.buffered_appends as f64)
        )];
        lines.extend(table(&["engine", "appends/s", "log ÷ peer", "store ÷ peer"], &rows));
        let raft = find(Engine::RaftEngine);
        let goal = format!(
            "W3 appends/s ÷ raft-engine: log {} ({}), store {} ({}) (goal ≥ 1)",
            times(log / raft),
            met(log >= raft),
            times(store / raft),
            met(store >= raft)
        );
        lines.push(goal.clone());
        self.goals.push(goal);
        self.section(options, BUFFERED_1, lines);
    }

    fn resume_open(&mut self, options: &Options, scale: &Scale, figures: &[Reopened]) {
        let find = |engine: Engine| figures.iter().find(|r| r.engine == engine).expect("every engine ran");
        let (log, store, raft) = (find(Engine::ContinuumLog), find(Engine::ContinuumStore), find(Engine::RaftEngine));
        let first = &figures[0].loaded;
        let mut lines = vec![format!(
            "data set: {} atoms, {:.2} GiB of deltas ({:.1} B each), agents of {} and {} atoms among {FILLER_AGENTS} fillers, interleaved; median of {} reopens",
            thousands(first.atoms as f64),
            first.delta_bytes as f64 / (1u64 << 30) as f64,
            first.delta_bytes as f64 / first.atoms as f64,
            thousands(scale.small_agent_atoms as f64),
            thousands(scale.big_agent_atoms as f64),
            scale.opens
        )];
        let column = |pick: fn(&Reopened) -> Duration| -> Vec<Vec<String>> {
            figures
                .iter()
                .map(|r| {
                    vec![
                        r.engine.name().to_owned(),
                        seconds(pick(r)),
                        ratio_cell(r.engine, pick(r).as_secs_f64() / pick(log).as_secs_f64()),
                        ratio_cell(r.engine, pick(r).as_secs_f64() / pick(store).as_secs_f64()),
                    ]
                })
                .collect()
        };
        let header = ["engine", "time", "log: peer ÷ log", "store: peer ÷ store"];
        lines.push(format!(
            "W4 resume, agent of {} atoms (after reopening):",
            thousands(scale.small_agent_atoms as f64)
        ));
        lines.extend(table(&header, &column(|r| r.small)));
        lines.push(format!("W4 resume, agent of {} atoms (after reopening):", thousands(scale.big_agent_atoms as f64)));
        lines.extend(table(&header, &column(|r| r.big)));
        lines.push(format!(
            "W4h every atom of the agent of {} atoms with its output, in order (after reopening; the store: `agent_history`):",
            thousands(scale.small_agent_atoms as f64)
        ));
        lines.extend(table(&header, &column(|r| r.history)));
        lines.push("W5 open (recovery) of the whole data set:".to_owned());
        lines.extend(table(&header, &column(|r| r.open)));
        lines.push("load (setup, not a goal):".to_owned());
        lines.extend(table(
            &["engine", "time"],
            &figures.iter().map(|r| vec![r.engine.name().to_owned(), seconds(r.loaded.load)]).collect::<Vec<_>>(),
        ));
        let against_raft = |pick: fn(&Reopened) -> Duration| {
            (pick(raft).as_secs_f64() / pick(log).as_secs_f64(), pick(raft).as_secs_f64() / pick(store).as_secs_f64())
        };
        let goals = [
            {
                let (l, s) = against_raft(|r| r.small);
                at_least_raft("W4 small-agent resume speed", l, s)
            },
            {
                let (l, s) = against_raft(|r| r.big);
                at_least_raft("W4 big-agent resume speed", l, s)
            },
            {
                let (l, s) = against_raft(|r| r.history);
                at_least_raft("W4h small-agent history speed", l, s)
            },
            {
                let (l, s) = against_raft(|r| r.open);
                at_least_raft("W5 open speed", l, s)
            },
        ];
        lines.extend(goals.iter().cloned());
        self.goals.extend(goals);
        self.section(options, RESUME_OPEN, lines);
    }

    fn record_space(
        &mut self,
        workload: &'static str,
        engine: Engine,
        dir: &Path,
        sink: &dyn AtomSink,
        atoms: u64,
        delta_bytes: Option<u64>,
    ) {
        let usage = disk_usage(dir).expect("the engine's directory should be readable");
        let used = sink.used_bytes().expect("the engine should report its bytes").unwrap_or(usage.length);
        let allocated_closed = None;
        self.space.push(Space {
            workload,
            engine,
            atoms,
            allocated: usage.allocated,
            allocated_closed,
            used,
            delta_bytes,
        });
    }

    /// Records what `engine`'s files of `workload` take once it was closed cleanly.
    fn record_space_closed(&mut self, workload: &'static str, engine: Engine, dir: &Path) {
        let usage = disk_usage(dir).expect("the engine's directory should be readable");
        if let Some(space) = self.space.iter_mut().rev().find(|s| s.workload == workload && s.engine == engine) {
            space.allocated_closed = Some(usage.allocated);
        }
    }

    fn space(&mut self, options: &Options) {
        if self.space.is_empty() {
            return;
        }
        let mut lines = vec![
            "bytes per atom = bytes ÷ atoms stored; allocated = st_blocks × 512 (open, and after a clean close: what `du` shows); used = file lengths, except for the engines that preallocate: continuum (segments up to their last record) and okaywal (files up to their last entry)".to_owned(),
        ];
        let mut rows = Vec::new();
        let workloads: Vec<&'static str> = self.space.iter().map(|s| s.workload).fold(Vec::new(), |mut seen, w| {
            if !seen.contains(&w) {
                seen.push(w);
            }
            seen
        });
        for workload in &workloads {
            let of = |engine: Engine| self.space.iter().find(|s| s.workload == *workload && s.engine == engine);
            let per_atom = |space: &Space, bytes: u64| bytes as f64 / space.atoms.max(1) as f64;
            for space in self.space.iter().filter(|s| s.workload == *workload) {
                let ratio = |continuum: Engine| {
                    of(continuum).map_or_else(String::new, |c| {
                        if space.engine.is_continuum() {
                            String::new()
                        } else {
                            times(per_atom(c, c.used) / per_atom(space, space.used))
                        }
                    })
                };
                rows.push(vec![
                    (*workload).to_owned(),
                    space.engine.name().to_owned(),
                    thousands(space.atoms as f64),
                    format!("{:.1}", per_atom(space, space.used)),
                    format!("{:.1}", per_atom(space, space.allocated)),
                    space.allocated_closed.map_or_else(String::new, |bytes| format!("{:.1}", per_atom(space, bytes))),
                    space.delta_bytes.map_or_else(String::new, |bytes| format!("{:.1}", per_atom(space, bytes))),
                    ratio(Engine::ContinuumLog),
                    ratio(Engine::ContinuumStore),
                ]);
            }
        }
        lines.extend(table(
            &[
                "after",
                "engine",
                "atoms",
                "used B/atom",
                "allocated B/atom",
                "closed: allocated B/atom",
                "delta B/atom",
                "log ÷ peer (used)",
                "store ÷ peer (used)",
            ],
            &rows,
        ));
        if let Some(goal) = self.space_goal() {
            lines.push(goal.clone());
            self.goals.push(goal);
        }
        self.section(options, "bytes_per_atom", lines);
    }

    /// Workload 6's goal on the data set (the largest sample): continuum ≤ 0.3× every peer.
    fn space_goal(&self) -> Option<String> {
        let set: Vec<&Space> = self.space.iter().filter(|s| s.workload == RESUME_OPEN).collect();
        let per_atom =
            |engine: Engine| set.iter().find(|s| s.engine == engine).map(|s| s.used as f64 / s.atoms.max(1) as f64);
        let peers_min = set
            .iter()
            .filter(|s| !s.engine.is_continuum())
            .map(|s| s.used as f64 / s.atoms.max(1) as f64)
            .reduce(f64::min)?;
        let (log, store) = (per_atom(Engine::ContinuumLog)?, per_atom(Engine::ContinuumStore)?);
        let at_rest = |engine: Engine, what: &str| {
            self.space.iter().find(|s| s.workload == AT_REST && s.engine == engine).map_or_else(String::new, |s| {
                let ratio = s.used as f64 / s.atoms.max(1) as f64 / peers_min;
                format!(
                    "; {what} at rest (sealed segments compressed, sample) {} ({})",
                    times(ratio),
                    met(ratio <= 0.3)
                )
            })
        };
        let at_rest = at_rest(Engine::ContinuumLog, "log") + &at_rest(Engine::ContinuumStore, "store");
        Some(format!(
            "W6 (data set) used bytes per atom ÷ smallest peer: log {} ({}), store {} ({}){at_rest} (goal ≤ 0.30×)",
            times(log / peers_min),
            met(log / peers_min <= 0.3),
            times(store / peers_min),
            met(store / peers_min <= 0.3)
        ))
    }

    fn finish(&mut self, options: &Options) {
        // Other processes on the machine show up here: the figures are only as quiet as it was.
        let load = vec![format!("load average at the end (/proc/loadavg): {}", load_average())];
        self.section(options, "load", load);
        if !self.goals.is_empty() {
            let goals = self.goals.clone();
            self.section(options, "goals", goals);
        }
        eprintln!();
        eprintln!("==== summary: peers ====");
        for line in &self.lines {
            eprintln!("{line}");
        }
        eprintln!("==== end peers ====");
    }
}

/// The 1-, 5- and 15-minute load averages.
fn load_average() -> String {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

/// A ratio cell: blank for continuum's own rows.
fn ratio_cell(engine: Engine, value: f64) -> String {
    if engine.is_continuum() { String::new() } else { times(value) }
}

fn at_least_raft(figure: &str, log: f64, store: f64) -> String {
    format!(
        "{figure} ÷ raft-engine: log {} ({}), store {} ({}) (goal ≥ 1)",
        times(log),
        met(log >= 1.0),
        times(store),
        met(store >= 1.0)
    )
}
