//! Compaction against the foreground, and the space a long run takes after it.
//!
//! - `compaction/round`: one round of retention and compaction over a long history (criterion).
//! - Summary (stderr): `Sync` atom latency (begin + complete, ~500-byte realistic delta) p50,
//!   p99 and max with no compaction, next to the same while a compaction round reclaims that
//!   history on another thread, in one run on the same store; then the space the store takes
//!   after compaction: log bytes, live bytes and snapshot bytes per live atom, and the space
//!   amplification.
//!
//! `cargo bench --bench compaction` (`CONTINUUM_BENCH_HISTORY_ATOMS` changes the 40,000-atom
//! history).

use std::path::Path;
use std::time::{Duration, Instant};

use continuum::synthetic::Transcript;
use continuum::{AtomId, AtomOutput, CompactionPolicy, RetentionPolicy, RunId, RunSpec, SnapshotPolicy, Store};
use criterion::Criterion;

/// Small segments, so that a benchmark-sized history spans many sealed segments.
const SEGMENT_BYTES: u64 = 1024 * 1024;

/// A store whose policy snapshots are written by the background thread (off the agents'
/// path, as by default); compaction runs only when called.
fn open(dir: &Path) -> Store {
    Store::builder(dir)
        .segment_bytes(SEGMENT_BYTES)
        .snapshot_policy(SnapshotPolicy { every_atoms: 50, every: Duration::from_secs(600) })
        .retention(RetentionPolicy { snapshots_per_agent: 5, finished_run_age: None })
        .compaction(CompactionPolicy { live_fraction_min: 0.7, interval: None, ..CompactionPolicy::default() })
        .open()
        .expect("open")
}

fn outputs(count: usize) -> Vec<AtomOutput> {
    let mut transcript = Transcript::new(7);
    (0..count)
        .map(|i| AtomOutput { delta: transcript.next_delta(500), result: format!("ok {i}").into_bytes() })
        .collect()
}

/// A long single-agent history: `atoms` completed atoms in a chain.
fn history(store: &Store, name: &str, atoms: usize, outputs: &[AtomOutput]) -> Vec<AtomId> {
    let run = store.create_run(RunSpec::new(name)).expect("run");
    let mut ids: Vec<AtomId> = Vec::with_capacity(atoms);
    for i in 0..atoms {
        let parents: Vec<AtomId> = ids.last().copied().into_iter().collect();
        let atom = store.begin_atom(run, "agent", &format!("h{i}"), &parents, "").expect("begin");
        store.complete_atom(atom, &outputs[i % outputs.len()]).expect("complete");
        ids.push(atom);
    }
    ids
}

/// Waits until the background thread's policy snapshots have caught up with `last`.
fn settle(store: &Store, last: AtomId) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while store.snapshots().last().is_none_or(|newest| newest.get() + 50 < last.get()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// One `Sync` atom of the foreground agent; returns its latency.
fn timed_atom(store: &Store, run: RunId, i: usize, output: &AtomOutput) -> Duration {
    let started = Instant::now();
    let atom = store.begin_atom(run, "foreground", &format!("f{i}"), &[], "").expect("begin");
    store.complete_atom(atom, output).expect("complete");
    started.elapsed()
}

fn percentiles(mut samples: Vec<Duration>) -> (Duration, Duration, Duration, usize) {
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
    (at(0.5), at(0.99), *samples.last().expect("samples"), samples.len())
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Latency of foreground atoms with and without a concurrent compaction round.
fn foreground_latency(root: &Path, history_atoms: usize, outputs: &[AtomOutput]) -> String {
    let dir = tempfile::tempdir_in(root).expect("dir");
    let store = open(dir.path());
    let ids = history(&store, "history", history_atoms, outputs);
    settle(&store, *ids.last().expect("history"));
    let run = store.create_run(RunSpec::new("foreground")).expect("run");
    let quiet: Vec<Duration> = (0..2_000).map(|i| timed_atom(&store, run, i, &outputs[i % outputs.len()])).collect();

    // The round runs on the store's own background thread, at its lowered priority.
    let before = store.last_compaction().map(|report| report.round);
    let started = Instant::now();
    assert!(store.compact_in_background(), "the store has a background thread");
    let mut busy = Vec::new();
    let mut i = 2_000;
    while store.last_compaction().map(|report| report.round) == before {
        busy.push(timed_atom(&store, run, i, &outputs[i % outputs.len()]));
        i += 1;
    }
    let took = started.elapsed();
    let report = store.last_compaction().expect("a round completed");
    let (q50, q99, qmax, qn) = percentiles(quiet);
    let (b50, b99, bmax, bn) = percentiles(busy);
    format!(
        "history {history_atoms} atoms; compaction round took {:.2} s: {report:?}\n\
         atom (begin+complete, Sync)   p50 µs   p99 µs   max µs   samples\n\
         no compaction              {:>9.1} {:>8.1} {:>8.1} {:>9}\n\
         during compaction          {:>9.1} {:>8.1} {:>8.1} {:>9}\n\
         ratio (during / none)      {:>9.2} {:>8.2}\n",
        took.as_secs_f64(),
        micros(q50),
        micros(q99),
        micros(qmax),
        qn,
        micros(b50),
        micros(b99),
        micros(bmax),
        bn,
        micros(b50) / micros(q50),
        micros(b99) / micros(q99),
    )
}

/// Allocated bytes of every file under `dir` (st_blocks × 512).
fn allocated_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    for entry in std::fs::read_dir(dir).expect("read dir").flatten() {
        let meta = entry.metadata().expect("metadata");
        total += if meta.is_dir() { allocated_bytes(&entry.path()) } else { meta.blocks() * 512 };
    }
    total
}

/// The space of a long run after retention and compaction.
fn space(root: &Path, history_atoms: usize, outputs: &[AtomOutput]) -> String {
    let dir = tempfile::tempdir_in(root).expect("dir");
    let store = open(dir.path());
    // Several rounds, as the background thread would run them over a long run.
    let rounds = 4;
    for round in 0..rounds {
        let ids = history(&store, &format!("run-{round}"), history_atoms / rounds, outputs);
        settle(&store, *ids.last().expect("history"));
        store.compact().expect("compact");
    }
    let space = store.space_report().expect("space");
    let atoms = history_atoms as f64;
    let allocated = allocated_bytes(dir.path());
    let preallocated_tail = {
        let segments = store.log().segments();
        let active = segments.last().expect("active segment");
        SEGMENT_BYTES - active.data_bytes
    };
    format!(
        "{history_atoms} atoms in {rounds} runs, 500-byte deltas, snapshots every 50, last 5 kept per agent\n\
         log bytes / atom            {:>8.1}\n\
         live bytes / atom           {:>8.1}   (live data)\n\
         space amplification         {:>8.2}   (log / live; goal ≤ 1.5)\n\
         snapshot bytes (kept)       {:>8}   ({} bytes / atom)\n\
         allocated on disk / atom    {:>8.1}   (every file, minus the active segment's unused preallocation of {} bytes)\n",
        space.log_bytes as f64 / atoms,
        space.live_bytes as f64 / atoms,
        space.amplification(),
        space.snapshot_bytes,
        space.snapshot_bytes as f64 / atoms,
        allocated.saturating_sub(preallocated_tail) as f64 / atoms,
        preallocated_tail,
    )
}

/// Atoms of the history one measured round compacts (fewer under `cargo test --benches`).
fn round_atoms() -> usize {
    if test_mode() { 500 } else { 10_000 }
}

fn bench_round(c: &mut Criterion, root: &Path, outputs: &[AtomOutput]) {
    let mut group = c.benchmark_group("compaction");
    group.sample_size(10);
    group.bench_function(format!("round/{}_atoms", round_atoms()), |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let dir = tempfile::tempdir_in(root).expect("dir");
                let store = open(dir.path());
                let ids = history(&store, "h", round_atoms(), outputs);
                settle(&store, *ids.last().expect("history"));
                let started = Instant::now();
                store.compact().expect("compact");
                total += started.elapsed();
            }
            total
        });
    });
    group.finish();
}

fn main() {
    let test_mode = test_mode();
    let history_atoms: usize = std::env::var("CONTINUUM_BENCH_HISTORY_ATOMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if test_mode { 2_000 } else { 40_000 });
    let root = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let outputs = outputs(1_000);
    let mut criterion = Criterion::default().configure_from_args();
    bench_round(&mut criterion, root, &outputs);
    let latency = foreground_latency(root, history_atoms, &outputs);
    let space = space(root, history_atoms, &outputs);
    eprintln!("==== summary: compaction ====\n{latency}\n{space}");
    criterion.final_summary();
}

/// Whether criterion runs in test mode (`cargo test --benches`, or `cargo bench -- --test`):
/// as criterion decides it, when `--bench` is absent or `--test` is given.
fn test_mode() -> bool {
    let args: Vec<String> = std::env::args().collect();
    !args.iter().any(|a| a == "--bench") || args.iter().any(|a| a == "--test")
}
