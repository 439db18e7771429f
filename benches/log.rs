//! Benchmarks of [`continuum::Log`] on the real file system, all in one run:
//!
//! - `sync_append_512`: one 512-byte `Durability::Sync` append against the floor it is built
//!   on, a 512-byte `write` + `fdatasync` to a preallocated plain file;
//! - `group_commit`: `Sync` appends from 16 threads against 1 thread;
//! - `buffered_append_512`: single-writer `Buffered` and `None` appends;
//! - `iterate_1gib`: iterating a 1 GiB log warm;
//! - `open_1gib`: reopening (recovering) that log warm;
//! - `metrics_overhead`: `Buffered`, `None` and `Sync` appends with the metrics on and off
//!   (a hidden builder switch), interleaved, to measure what always-on metrics cost.
//!
//! Criterion reports each benchmark as usual. After each group a summary block (on stderr) gives
//! the figures docs/BENCHMARKS.md quotes, measured by a separate fixed-size loop: latency
//! percentiles and ratios that criterion does not compute. Files live under
//! `target/tmp` (`CARGO_TARGET_TMPDIR`), on the same disk as the build, never on tmpfs.
//!
//! Knobs: `CONTINUUM_BENCH_LOG_BYTES` sets the size of the iterated log (default 1 GiB). A
//! criterion filter (`cargo bench --bench log -- sync_append`) also selects which summary blocks
//! run: a block runs when its group name contains the filter or the filter starts with it.
//! Under `cargo test --benches` (criterion's `--test` mode) every loop runs only a few times.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use continuum::{Durability, Log, Lsn};
use criterion::{BenchmarkId, Criterion, Throughput, black_box};
use tempfile::TempDir;

/// Size of the records of the append benchmarks.
const RECORD_BYTES: usize = 512;
/// Size of each preallocated file of the raw baseline (the default segment size).
const RAW_FILE_BYTES: u64 = 64 * 1024 * 1024;
/// Size of the records of the iterated log.
const ITERATE_RECORD_BYTES: usize = 4096;
/// Records per batch while building the iterated log.
const ITERATE_BATCH_RECORDS: usize = 64;
/// Default size of the iterated log; `CONTINUUM_BENCH_LOG_BYTES` overrides it.
const ITERATE_LOG_BYTES_DEFAULT: u64 = 1024 * 1024 * 1024;
/// Size of the iterated log in `--test` mode when the variable is not set.
const ITERATE_LOG_BYTES_TEST: u64 = 8 * 1024 * 1024;
/// Threads of the concurrent group-commit benchmark.
const GROUP_COMMIT_THREADS: usize = 16;

/// Group names, as criterion prints them.
const SYNC_APPEND: &str = "sync_append_512";
const GROUP_COMMIT: &str = "group_commit";
const BUFFERED_APPEND: &str = "buffered_append_512";
const ITERATE: &str = "iterate_1gib";
const OPEN: &str = "open_1gib";
const METRICS_OVERHEAD: &str = "metrics_overhead";

fn main() {
    let options = Options::from_args();
    let mut criterion = Criterion::default().configure_from_args();
    if options.list {
        list_benchmarks(&mut criterion);
        return;
    }
    let root = bench_root();
    if options.runs(SYNC_APPEND) {
        bench_sync_append(&mut criterion, &options, root.path());
    }
    if options.runs(GROUP_COMMIT) {
        bench_group_commit(&mut criterion, &options, root.path());
    }
    if options.runs(BUFFERED_APPEND) {
        bench_buffered_append(&mut criterion, &options, root.path());
    }
    if options.runs(ITERATE) || options.runs(OPEN) {
        bench_big_log(&mut criterion, &options, root.path());
    }
    if options.runs(METRICS_OVERHEAD) {
        bench_metrics_overhead(&options, root.path());
    }
    criterion.final_summary();
}

/// Registers every benchmark with an empty body, so `--list` names them without building logs.
fn list_benchmarks(criterion: &mut Criterion) {
    let ids = [
        format!("{SYNC_APPEND}/raw_baseline"),
        format!("{SYNC_APPEND}/continuum"),
        format!("{GROUP_COMMIT}/threads/1"),
        format!("{GROUP_COMMIT}/threads/{GROUP_COMMIT_THREADS}"),
        format!("{BUFFERED_APPEND}/buffered"),
        format!("{BUFFERED_APPEND}/none"),
        format!("{ITERATE}/4kib_records"),
        format!("{OPEN}/4kib_records"),
        format!("{METRICS_OVERHEAD}/summary_only"),
    ];
    for id in &ids {
        criterion.bench_function(id, |b| b.iter(|| ()));
    }
    criterion.final_summary();
}

/// What the command line asks for, beyond what criterion itself parses.
struct Options {
    /// Criterion's positional filter.
    filter: Option<String>,
    /// Criterion's test mode (`--test`, or no `--bench`): run every loop only a few times.
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
        // As criterion decides: without `--bench` (`cargo test --benches`) it only tests.
        Self { filter, test: has("--test") || !has("--bench"), list: has("--list") }
    }

    /// Whether the group's setup and summary should run under the filter.
    fn runs(&self, group: &str) -> bool {
        self.filter.as_deref().is_none_or(|filter| group.contains(filter) || filter.starts_with(group))
    }

    /// `full` normally, a handful in `--test` mode.
    fn count(&self, full: usize) -> usize {
        if self.test { full.clamp(1, 16) } else { full }
    }
}

/// A temporary directory on the real disk, inside the target directory.
fn bench_root() -> TempDir {
    let target_tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(target_tmp).expect("the target tmp directory should be creatable");
    tempfile::Builder::new()
        .prefix("continuum-bench-")
        .tempdir_in(target_tmp)
        .expect("a temporary directory under the target directory")
}

fn open_log(dir: &Path, durability: Durability) -> Log {
    Log::builder(dir).durability(durability).open().expect("the bench log should open")
}

/// Deletes the sealed segments of a log so long runs do not fill the disk. Never timed.
fn discard_sealed(log: &Log) {
    log.truncate_prefix(log.next_lsn()).expect("sealed segments should be deletable");
}

// ---------------------------------------------------------------------------------------------
// sync_append_512

/// The floor under a `Sync` append: positioned 512-byte writes to a preallocated file, each
/// followed by `fdatasync`. A full file is replaced by a fresh preallocated one, as the log
/// rotates its segments.
struct RawAppender {
    dir: PathBuf,
    file: File,
    file_index: u64,
    offset: u64,
}

impl RawAppender {
    fn new(dir: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let file = Self::create_file(dir, 0)?;
        Ok(Self { dir: dir.to_path_buf(), file, file_index: 0, offset: 0 })
    }

    fn create_file(dir: &Path, index: u64) -> io::Result<File> {
        let file = File::options().read(true).write(true).create_new(true).open(dir.join(format!("raw-{index}")))?;
        rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, RAW_FILE_BYTES)?;
        file.sync_all()?;
        Ok(file)
    }

    fn append(&mut self, record: &[u8]) -> io::Result<()> {
        if self.offset + record.len() as u64 > RAW_FILE_BYTES {
            self.rotate()?;
        }
        self.file.write_all_at(record, self.offset)?;
        self.file.sync_data()?;
        self.offset += record.len() as u64;
        Ok(())
    }

    fn rotate(&mut self) -> io::Result<()> {
        let next = self.file_index + 1;
        self.file = Self::create_file(&self.dir, next)?;
        std::fs::remove_file(self.dir.join(format!("raw-{}", self.file_index)))?;
        self.file_index = next;
        self.offset = 0;
        Ok(())
    }
}

fn bench_sync_append(criterion: &mut Criterion, options: &Options, root: &Path) {
    let record = [0xA5_u8; RECORD_BYTES];
    let mut raw = RawAppender::new(&root.join("raw")).expect("the raw baseline file should be creatable");
    let log = open_log(&root.join("sync"), Durability::Sync);

    let mut group = criterion.benchmark_group(SYNC_APPEND);
    group.throughput(Throughput::Elements(1));
    group.measurement_time(Duration::from_secs(5));
    group.bench_function("raw_baseline", |b| {
        b.iter(|| raw.append(black_box(&record)).expect("raw write + fdatasync should succeed"));
    });
    group.bench_function("continuum", |b| {
        b.iter(|| log.append(black_box(&record)).expect("a Sync append should succeed"));
    });
    group.finish();

    // Interleaved, alternating which goes first, so drift in the device's latency hits both.
    let samples = options.count(2000);
    let mut raw_latencies = Vec::with_capacity(samples);
    let mut log_latencies = Vec::with_capacity(samples);
    for i in 0..options.count(200) + samples {
        let mut time_raw = || time(|| raw.append(&record).expect("raw write + fdatasync should succeed"));
        let time_log = || time(|| log.append(&record).expect("a Sync append should succeed"));
        let (raw_latency, log_latency) = if i % 2 == 0 {
            let raw_latency = time_raw();
            (raw_latency, time_log())
        } else {
            let log_latency = time_log();
            (time_raw(), log_latency)
        };
        if i >= options.count(200) {
            raw_latencies.push(raw_latency);
            log_latencies.push(log_latency);
        }
    }
    raw_latencies.sort_unstable();
    log_latencies.sort_unstable();
    let p50_ratio = ratio(percentile(&log_latencies, 50.0), percentile(&raw_latencies, 50.0));
    summary(
        options,
        SYNC_APPEND,
        &[
            format!("samples: {samples} of each, interleaved"),
            format!(
                "raw write 512 B + fdatasync : p50 {}  p99 {}",
                micros(percentile(&raw_latencies, 50.0)),
                micros(percentile(&raw_latencies, 99.0))
            ),
            format!(
                "continuum append 512 B Sync : p50 {}  p99 {}",
                micros(percentile(&log_latencies, 50.0)),
                micros(percentile(&log_latencies, 99.0))
            ),
            format!(
                "p99 ratio continuum / raw   : {:.3}",
                ratio(percentile(&log_latencies, 99.0), percentile(&raw_latencies, 99.0))
            ),
            verdict("p50 ratio continuum / raw   ", p50_ratio, "<= 1.15", p50_ratio <= 1.15, 3),
        ],
    );
    log.close().expect("the sync bench log should close");
}

// ---------------------------------------------------------------------------------------------
// group_commit

/// Appends `total` 512-byte `Sync` records from `threads` threads and returns the wall time from
/// the moment all threads are ready until the last append returns.
fn concurrent_appends(log: &Log, threads: usize, total: u64) -> Duration {
    let record = [0x5A_u8; RECORD_BYTES];
    if threads == 1 {
        let start = Instant::now();
        for _ in 0..total {
            log.append(&record).expect("a Sync append should succeed");
        }
        return start.elapsed();
    }
    let ready = Barrier::new(threads + 1);
    std::thread::scope(|scope| {
        let record = &record;
        let ready = &ready;
        let workers: Vec<_> = (0..threads as u64)
            .map(|t| {
                let share = total / threads as u64 + u64::from(t < total % threads as u64);
                scope.spawn(move || {
                    ready.wait();
                    for _ in 0..share {
                        log.append(record).expect("a Sync append should succeed");
                    }
                })
            })
            .collect();
        ready.wait();
        let start = Instant::now();
        for worker in workers {
            worker.join().expect("an appending thread should not panic");
        }
        start.elapsed()
    })
}

fn bench_group_commit(criterion: &mut Criterion, options: &Options, root: &Path) {
    let log = open_log(&root.join("group"), Durability::Sync);
    let thread_counts = [1, GROUP_COMMIT_THREADS];

    let mut group = criterion.benchmark_group(GROUP_COMMIT);
    group.throughput(Throughput::Elements(1));
    group.sample_size(20);
    group.measurement_time(Duration::from_secs(8));
    for threads in thread_counts {
        group.bench_with_input(BenchmarkId::new("threads", threads), &threads, |b, &threads| {
            b.iter_custom(|appends| {
                let elapsed = concurrent_appends(&log, threads, appends);
                discard_sealed(&log);
                elapsed
            });
        });
    }
    group.finish();

    // Fixed-size trials, alternating thread counts; the median trial of each is reported.
    let trials = options.count(5);
    let mut rates: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for _ in 0..trials {
        for (at, threads) in thread_counts.iter().enumerate() {
            let total = options.count(*threads * 250) as u64;
            let elapsed = concurrent_appends(&log, *threads, total);
            rates[at].push(total as f64 / elapsed.as_secs_f64());
        }
    }
    let one = median(&mut rates[0]);
    let many = median(&mut rates[1]);
    let ratio = many / one;
    summary(
        options,
        GROUP_COMMIT,
        &[
            format!("trials: {trials} per thread count (median reported); 512 B records, Durability::Sync"),
            format!("1 thread   : {} appends/s", thousands(one)),
            format!("{GROUP_COMMIT_THREADS} threads  : {} appends/s", thousands(many)),
            verdict(&format!("ratio {GROUP_COMMIT_THREADS} / 1"), ratio, ">= 8", ratio >= 8.0, 2),
        ],
    );
    log.close().expect("the group commit bench log should close");
}

// ---------------------------------------------------------------------------------------------
// buffered_append_512

fn sequential_appends(log: &Log, appends: u64) -> Duration {
    let record = [0x3C_u8; RECORD_BYTES];
    let start = Instant::now();
    for _ in 0..appends {
        log.append(black_box(&record)).expect("an append should succeed");
    }
    start.elapsed()
}

/// The 99.9th percentile and the longest of `appends` sequential 512-byte appends to `log`,
/// in seconds.
fn append_stalls(log: &Log, appends: u64) -> (f64, f64) {
    let record = vec![0xA5u8; 512];
    let mut took: Vec<f64> = (0..appends)
        .map(|_| {
            let started = Instant::now();
            log.append(black_box(&record)).expect("an append should succeed");
            started.elapsed().as_secs_f64()
        })
        .collect();
    discard_sealed(log);
    took.sort_by(f64::total_cmp);
    let p999 = took[(took.len() * 999 / 1000).min(took.len() - 1)];
    (p999, took.last().copied().unwrap_or(0.0))
}

fn bench_buffered_append(criterion: &mut Criterion, options: &Options, root: &Path) {
    let modes = [("buffered", Durability::Buffered), ("none", Durability::None)];
    let logs: Vec<Log> = modes.iter().map(|(name, durability)| open_log(&root.join(name), *durability)).collect();

    let mut group = criterion.benchmark_group(BUFFERED_APPEND);
    group.throughput(Throughput::Elements(1));
    group.measurement_time(Duration::from_secs(5));
    for ((name, _), log) in modes.iter().zip(&logs) {
        group.bench_function(*name, |b| {
            b.iter_custom(|appends| {
                let elapsed = sequential_appends(log, appends);
                discard_sealed(log);
                elapsed
            });
        });
    }
    group.finish();

    let trials = options.count(3);
    let appends = options.count(500_000) as u64;
    let mut lines = vec![format!("trials: {trials} x {appends} appends of 512 B per mode (median reported)")];
    for ((name, _), log) in modes.iter().zip(&logs) {
        let mut rates: Vec<f64> = (0..trials)
            .map(|_| {
                let elapsed = sequential_appends(log, appends);
                discard_sealed(log);
                appends as f64 / elapsed.as_secs_f64()
            })
            .collect();
        let rate = median(&mut rates);
        lines.push(verdict(&format!("{name:<8} appends/s"), rate, ">= 1,000,000", rate >= 1e6, 0));
    }
    // The stalls behind the flusher's sync: each append of one more trial timed on its own.
    let (p999, longest) = append_stalls(&logs[0], appends);
    lines.push(format!("buffered append p99.9 {:.1} us, longest {:.2} ms", p999 * 1e6, longest * 1e3));
    summary(options, BUFFERED_APPEND, &lines);
    for log in logs {
        log.close().expect("the buffered bench log should close");
    }
}

// ---------------------------------------------------------------------------------------------
// iterate_1gib and open_1gib

/// The iterated log's size: `CONTINUUM_BENCH_LOG_BYTES`, or the default.
fn big_log_bytes(options: &Options) -> u64 {
    match std::env::var("CONTINUUM_BENCH_LOG_BYTES") {
        Ok(value) => value.trim().parse().expect("CONTINUUM_BENCH_LOG_BYTES should be a number of bytes"),
        Err(_) if options.test => ITERATE_LOG_BYTES_TEST,
        Err(_) => ITERATE_LOG_BYTES_DEFAULT,
    }
}

/// Writes `records` records of 4 KiB in batches of 64 with `Durability::None`, then closes the
/// log (which syncs it). Returns how long that took.
fn build_big_log(dir: &Path, records: u64) -> Duration {
    let start = Instant::now();
    let log = open_log(dir, Durability::None);
    let payload: Vec<u8> = (0..ITERATE_RECORD_BYTES).map(|i| (i % 251) as u8).collect();
    let batch: Vec<&[u8]> = vec![payload.as_slice(); ITERATE_BATCH_RECORDS];
    let mut written = 0;
    while written < records {
        let count = (records - written).min(ITERATE_BATCH_RECORDS as u64) as usize;
        log.append_batch(&batch[..count]).expect("a batch append should succeed");
        written += count as u64;
    }
    log.close().expect("the big log should close");
    start.elapsed()
}

/// Reads every record from the first and returns the sum of their lengths.
fn iterate_all(log: &Log) -> u64 {
    let mut bytes = 0;
    for entry in log.iter_from(Lsn::FIRST).expect("an iterator should open") {
        let (_, record) = entry.expect("every record should verify");
        bytes += record.len() as u64;
    }
    bytes
}

fn bench_big_log(criterion: &mut Criterion, options: &Options, root: &Path) {
    let dir = root.join("big");
    let records = (big_log_bytes(options) / ITERATE_RECORD_BYTES as u64).max(1);
    let payload_bytes = records * ITERATE_RECORD_BYTES as u64;
    let build = build_big_log(&dir, records);
    if options.runs(ITERATE) {
        bench_iterate(criterion, options, &dir, records, payload_bytes, build);
    }
    if options.runs(OPEN) {
        bench_open(criterion, options, &dir, records, payload_bytes);
    }
}

fn bench_iterate(
    criterion: &mut Criterion,
    options: &Options,
    dir: &Path,
    records: u64,
    payload_bytes: u64,
    build: Duration,
) {
    let log = open_log(dir, Durability::None);
    assert_eq!(log.next_lsn().get(), records + 1, "the reopened log should hold every record");
    let segment_count = log.segments().len();
    let passes = Mutex::new(Vec::new());

    let mut group = criterion.benchmark_group(ITERATE);
    group.throughput(Throughput::Bytes(payload_bytes));
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(10));
    group.bench_function("4kib_records", |b| {
        b.iter_custom(|iterations| {
            let start = Instant::now();
            for _ in 0..iterations {
                assert_eq!(black_box(iterate_all(&log)), payload_bytes, "a pass should read every byte");
            }
            let elapsed = start.elapsed();
            passes.lock().expect("no pass panicked").push(elapsed / iterations as u32);
            elapsed
        });
    });
    group.finish();
    log.close().expect("the iterated log should close");

    let mut passes = passes.into_inner().expect("no pass panicked");
    passes.sort_unstable();
    let pass = percentile(&passes, 50.0);
    let rate = payload_bytes as f64 / pass.as_secs_f64();
    summary(
        options,
        ITERATE,
        &[
            format!(
                "log: {} of payload in {records} records of 4 KiB, {} segments; built in {:.1} s",
                gib(payload_bytes),
                segment_count,
                build.as_secs_f64()
            ),
            format!("median full pass ({} passes): {:.3} s", passes.len(), pass.as_secs_f64()),
            verdict("payload GB/s (10^9 B/s)", rate / 1e9, ">= 1", rate >= 1e9, 2),
        ],
    );
}

fn bench_open(criterion: &mut Criterion, options: &Options, dir: &Path, records: u64, payload_bytes: u64) {
    let opens = Mutex::new(Vec::new());

    let mut group = criterion.benchmark_group(OPEN);
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(10));
    group.bench_function("4kib_records", |b| {
        b.iter_custom(|iterations| {
            let mut elapsed = Duration::ZERO;
            for _ in 0..iterations {
                let start = Instant::now();
                let log = open_log(dir, Durability::None);
                let open = start.elapsed();
                elapsed += open;
                assert_eq!(log.next_lsn().get(), records + 1, "recovery should find every record");
                log.close().expect("the reopened log should close");
                opens.lock().expect("no open panicked").push(open);
            }
            elapsed
        });
    });
    group.finish();

    let mut opens = opens.into_inner().expect("no open panicked");
    opens.sort_unstable();
    let open = percentile(&opens, 50.0);
    summary(
        options,
        OPEN,
        &[
            format!("log: {} of payload in {records} records of 4 KiB", gib(payload_bytes)),
            format!(
                "opens: {}  p50 {:.3} s  max {:.3} s",
                opens.len(),
                open.as_secs_f64(),
                percentile(&opens, 100.0).as_secs_f64()
            ),
            verdict("median open, seconds", open.as_secs_f64(), "< 1", open < Duration::from_secs(1), 3),
        ],
    );
}

// ---------------------------------------------------------------------------------------------
// metrics_overhead

/// Appends per trial of the unsynced modes; `Sync` appends per setting.
const OVERHEAD_APPENDS: usize = 200_000;
const OVERHEAD_SYNC_APPENDS: usize = 4_000;

/// Appends with the metrics on and off, on the same log (a hidden switch flips them between
/// trials, so the file, its flusher and its page cache are the same for both): `Buffered` and
/// `None` in trials of sequential appends, alternating on/off; `Sync` in single appends,
/// alternating, comparing p50 latencies. The A/A figure compares the two halves of the "off"
/// trials with each other: the noise floor.
fn bench_metrics_overhead(options: &Options, root: &Path) {
    let trials = options.count(30);
    let appends = options.count(OVERHEAD_APPENDS) as u64;
    let mut lines = vec![format!(
        "unsynced: {trials} trials each of {appends} appends of 512 B, metrics on and off alternating on one log \
         (median rate); sync: {} single appends each, alternating (p50 latency)",
        options.count(OVERHEAD_SYNC_APPENDS)
    )];
    for (name, durability) in [("buffered", Durability::Buffered), ("none", Durability::None)] {
        let log = open_log(&root.join(format!("metrics-{name}")), durability);
        let mut rates = [Vec::new(), Vec::new()];
        for trial in 0..2 * trials {
            let on = (trial / 2 + trial) % 2 == 0; // on, off, off, on, on, off, ...
            log.set_metrics_enabled(on);
            let elapsed = sequential_appends(&log, appends);
            discard_sealed(&log);
            rates[usize::from(!on)].push(appends as f64 / elapsed.as_secs_f64());
        }
        let (noise_a, noise_b) = halves(&rates[1]);
        let [on, off] = rates.map(|mut r| median(&mut r));
        lines.push(format!("{name:<8} appends/s  metrics on {}  off {}", thousands(on), thousands(off)));
        lines.push(overhead_line(name, off / on - 1.0, noise_b / noise_a - 1.0));
        log.close().expect("the overhead bench log should close");
    }
    let iterations = options.count(50_000_000) as u64;
    let (on, off) = continuum::metrics::append_path_cost(iterations);
    let per_append = |d: Duration| d.as_secs_f64() * 1e9 / iterations as f64;
    lines.push(format!(
        "isolated   what the metrics add per unsynced append: on {:.2} ns, off {:.2} ns ({iterations} iterations)",
        per_append(on),
        per_append(off)
    ));
    let log = open_log(&root.join("metrics-sync"), Durability::Sync);
    let record = [0x7E_u8; RECORD_BYTES];
    let mut latencies = [Vec::new(), Vec::new()];
    for round in 0..2 * options.count(OVERHEAD_SYNC_APPENDS) {
        let on = (round / 2 + round) % 2 == 0;
        log.set_metrics_enabled(on);
        latencies[usize::from(!on)].push(time(|| log.append(&record).expect("a Sync append should succeed")));
    }
    let p50 = |mut l: Vec<Duration>| {
        l.sort_unstable();
        percentile(&l, 50.0)
    };
    let (first, second): (Vec<_>, Vec<_>) = latencies[1].iter().enumerate().partition(|(i, _)| i % 2 == 0);
    let noise =
        ratio(p50(second.into_iter().map(|(_, d)| *d).collect()), p50(first.into_iter().map(|(_, d)| *d).collect()));
    let [on, off] = latencies.map(p50);
    lines.push(format!("sync     append p50  metrics on {}  off {}", micros(on), micros(off)));
    lines.push(overhead_line("sync", ratio(on, off) - 1.0, noise - 1.0));
    log.close().expect("the overhead bench log should close");
    summary(options, METRICS_OVERHEAD, &lines);
}

/// Medians of the even-indexed and the odd-indexed values.
fn halves(values: &[f64]) -> (f64, f64) {
    let mut even: Vec<f64> = values.iter().step_by(2).copied().collect();
    let mut odd: Vec<f64> = values.iter().skip(1).step_by(2).copied().collect();
    (median(&mut even), median(&mut odd))
}

/// The overhead (cost with the metrics on, relative to off) next to the A/A difference.
fn overhead_line(name: &str, overhead: f64, noise: f64) -> String {
    let label = format!("{name:<8} overhead % (A/A noise {:+.2} %)", noise * 100.0);
    verdict(&label, overhead * 100.0, "< 2", overhead < 0.02, 2)
}

// ---------------------------------------------------------------------------------------------
// Figures

fn time<T>(operation: impl FnOnce() -> T) -> Duration {
    let start = Instant::now();
    black_box(operation());
    start.elapsed()
}

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

fn ratio(numerator: Duration, denominator: Duration) -> f64 {
    numerator.as_secs_f64() / denominator.as_secs_f64()
}

fn micros(duration: Duration) -> String {
    format!("{:>9.1} us", duration.as_secs_f64() * 1e6)
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// `1234567.8` as `1,234,568`.
fn thousands(value: f64) -> String {
    let digits = format!("{:.0}", value);
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

fn verdict(label: &str, value: f64, target: &str, met: bool, decimals: usize) -> String {
    let shown = if decimals == 0 { thousands(value) } else { format!("{value:.decimals$}") };
    let outcome = if met { "met" } else { "MISSED" };
    format!("{label}: {shown}  (target {target}: {outcome})")
}

fn summary(options: &Options, group: &str, lines: &[String]) {
    eprintln!();
    eprintln!("==== summary: {group} ====");
    if options.test {
        eprintln!("  (test mode: loops ran a few times only; the figures mean nothing)");
    }
    for line in lines {
        eprintln!("  {line}");
    }
    eprintln!("==== end {group} ====");
    eprintln!();
}
