//! Benchmarks of the atom store against the raw log, side by side in one run.
//!
//! - `atom_sync/{raw_log,store}/{1,16}`: one atom = begin + complete with a realistic ~500-byte
//!   delta and `Sync` durability, on the real disk. The raw log appends the same bytes the
//!   store writes (start record unsynced, completion synced).
//! - `atom_cpu/{raw_log,store}`: the same on tmpfs (`/dev/shm`), where `fdatasync` costs almost
//!   nothing, so the difference is the store's CPU cost per atom (encoding, compression, index).
//! - A summary block (stderr) prints the per-atom overhead: criterion's last samples, and the
//!   thread CPU time of alternating blocks of raw-log, begin + complete and `record_atom` atoms
//!   on tmpfs, whose median difference is the figure the goal is checked against; the same
//!   with 16 threads on the disk (`Sync`, group commit) timed by the process's CPU clock. Then bytes
//!   on disk per atom after a realistic run with its trained dictionary (as appended, and at
//!   rest after a compaction round with cold compression at several zstd levels and frame
//!   sizes), index bytes per atom for 1,000,000 atoms, and their store's open time with and
//!   without an index snapshot.
//!
//! `cargo bench --bench store` (set `CONTINUUM_BENCH_INDEX_ATOMS` to change the 1,000,000).

use std::path::Path;
use std::time::{Duration, Instant};

use continuum::synthetic::Transcript;
use continuum::{AtomOutput, CompactionPolicy, Durability, FrameCompression, Log, RunSpec, Store};
use criterion::{BenchmarkId, Criterion, Throughput};

fn outputs(count: usize) -> Vec<AtomOutput> {
    let mut transcript = Transcript::new(42);
    (0..count)
        .map(|i| AtomOutput { delta: transcript.next_delta(500), result: format!("ok {i}").into_bytes() })
        .collect()
}

/// The store as these benchmarks measure it: no policy snapshots, no background thread (the
/// atom path alone).
fn open_store(dir: &Path) -> Store {
    open_store_compressing(dir, continuum::limits::COMPRESSION_MIN_BYTES, SPIN_DEFAULT)
}

/// Group-commit waiters' spin ([`continuum::Config::commit_spin`]): the default, and none for
/// the CPU measurements, where spinning through the syncs adds waiting to both sides of the
/// difference (and noise to it) but no work.
const SPIN_DEFAULT: Duration = Duration::from_micros(continuum::limits::COMMIT_SPIN_US_DEFAULT);
const SPIN_NONE: Duration = Duration::ZERO;

/// [`open_store`] compressing record bodies of `compress_from` bytes or more as they are
/// appended (the default 2 KiB leaves the benchmark's ~570-byte completions plain; 64 compresses
/// every completion with the trained dictionary, the layout the replay targets were set on).
fn open_store_compressing(dir: &Path, compress_from: usize, spin: Duration) -> Store {
    Store::builder(dir)
        .commit_spin(spin)
        .snapshot_policy(continuum::SnapshotPolicy::NEVER)
        .compress_records_from(compress_from)
        .background(false)
        .open()
        .expect("open store")
}

/// The earlier default: every completion compressed as it is appended.
const COMPRESS_ALL: usize = 64;

/// A store on `dir` with a run, warmed up past dictionary training.
fn warm_store(dir: &Path, outputs: &[AtomOutput], compress_from: usize, spin: Duration) -> (Store, continuum::RunId) {
    let store = open_store_compressing(dir, compress_from, spin);
    let run = store.create_run(RunSpec::new("bench")).expect("run");
    for (i, output) in outputs.iter().enumerate().take(2_100) {
        let atom = store.begin_atom(run, "warmup", &format!("w{i}"), &[], "").expect("begin");
        store.complete_atom(atom, output).expect("complete");
    }
    (store, run)
}

/// The bytes the store writes for one atom, for the raw-log baseline.
fn sample_records(dir: &Path, outputs: &[AtomOutput], compress_from: usize) -> (Vec<u8>, Vec<u8>) {
    let (store, run) = warm_store(dir, outputs, compress_from, SPIN_DEFAULT);
    let atom = store.begin_atom(run, "agent", "sample", &[], "").expect("begin");
    store.complete_atom(atom, &outputs[7]).expect("complete");
    let next = store.log().next_lsn().get();
    let start = store.log().read(continuum::Lsn::new(next - 2)).expect("read").expect("start").to_vec();
    let end = store.log().read(continuum::Lsn::new(next - 1)).expect("read").expect("end").to_vec();
    (start, end)
}

/// What the store-against-log measurements share: outputs, the store's two records for the
/// raw log, a raw log and a warmed store on `root` (the directories live as long as it).
struct Fixture {
    outputs: Vec<AtomOutput>,
    start: Vec<u8>,
    end: Vec<u8>,
    log: Log,
    store: Store,
    run: continuum::RunId,
    _dirs: [tempfile::TempDir; 3],
}

impl Fixture {
    fn new(root: &Path, compress_from: usize) -> Self {
        let outputs = outputs(4_096);
        let dirs = [(); 3].map(|()| tempfile::tempdir_in(root).expect("dir"));
        let (start, end) = sample_records(dirs[0].path(), &outputs, compress_from);
        let log = Log::builder(dirs[1].path()).commit_spin(SPIN_NONE).open().expect("log");
        let (store, run) = warm_store(dirs[2].path(), &outputs, compress_from, SPIN_NONE);
        Self { outputs, start, end, log, store, run, _dirs: dirs }
    }
}

fn raw_atoms(log: &Log, start: &[u8], end: &[u8], count: u64) {
    for _ in 0..count {
        log.append_with(start, Durability::None).expect("append");
        log.append_with(end, Durability::Sync).expect("append");
    }
}

fn store_atoms(store: &Store, run: continuum::RunId, outputs: &[AtomOutput], thread: usize, from: u64, count: u64) {
    for i in from..from + count {
        let atom = store.begin_atom(run, &format!("agent-{thread}"), &format!("s{i}"), &[], "").expect("begin");
        store.complete_atom(atom, &outputs[i as usize % outputs.len()]).expect("complete");
    }
}

fn parallel(threads: usize, per_thread: u64, work: impl Fn(usize, u64) + Sync) -> Duration {
    let started = Instant::now();
    std::thread::scope(|scope| {
        for thread in 0..threads {
            let work = &work;
            scope.spawn(move || work(thread, per_thread));
        }
    });
    started.elapsed()
}

fn bench_atoms(c: &mut Criterion, group_name: &str, root: &Path, threads_list: &[usize]) -> Vec<(String, f64)> {
    let Fixture { _dirs, outputs, start, end, log, store, run } =
        Fixture::new(root, continuum::limits::COMPRESSION_MIN_BYTES);
    let counter = std::sync::atomic::AtomicU64::new(0);
    let mut group = c.benchmark_group(group_name);
    group.sample_size(10).measurement_time(Duration::from_secs(4)).throughput(Throughput::Elements(1));
    let mut figures = Vec::new();
    for &threads in threads_list {
        let mut per_atom = [0.0f64; 2];
        group.bench_function(BenchmarkId::new("raw_log", threads), |b| {
            b.iter_custom(|iters| {
                let per = iters.div_ceil(threads as u64);
                let elapsed = parallel(threads, per, |_, n| raw_atoms(&log, &start, &end, n));
                per_atom[0] = elapsed.as_secs_f64() * 1e6 / (per * threads as u64) as f64;
                elapsed.mul_f64(iters as f64 / (per * threads as u64) as f64)
            })
        });
        group.bench_function(BenchmarkId::new("store", threads), |b| {
            b.iter_custom(|iters| {
                let per = iters.div_ceil(threads as u64);
                let elapsed = parallel(threads, per, |t, n| {
                    let from = counter.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
                    store_atoms(&store, run, &outputs, t, from, n);
                });
                per_atom[1] = elapsed.as_secs_f64() * 1e6 / (per * threads as u64) as f64;
                elapsed.mul_f64(iters as f64 / (per * threads as u64) as f64)
            })
        });
        figures.push((format!("{group_name} {threads} thread(s): raw log µs/atom"), per_atom[0]));
        figures.push((format!("{group_name} {threads} thread(s): store µs/atom"), per_atom[1]));
        figures
            .push((format!("{group_name} {threads} thread(s): store − raw log, µs/atom"), per_atom[1] - per_atom[0]));
    }
    group.finish();
    figures
}

/// µs of CPU per atom that `work` (on `atoms` atoms) takes by `clock`: the calling thread's
/// (`ThreadCPUTime`: time preempted by other processes is not counted) or the whole process's
/// (`ProcessCPUTime`: every thread, wake-ups included, no time spent waiting for the disk).
fn cpu_micros(clock: rustix::time::ClockId, atoms: f64, work: impl FnOnce()) -> f64 {
    let now = || {
        let now = rustix::time::clock_gettime(clock);
        Duration::new(u64::try_from(now.tv_sec).unwrap_or(0), u32::try_from(now.tv_nsec).unwrap_or(0))
    };
    let started = now();
    work();
    (now() - started).as_secs_f64() * 1e6 / atoms
}

/// Per-round differences `a − b`.
fn differences(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(a, b)| a - b).collect()
}

/// The store's CPU cost per atom over the raw log's, measured on `root` (tmpfs) in alternating
/// blocks of `block` atoms (raw log appending the store's own two records, store with begin +
/// complete, store with `record_atom`), each timed by the thread's CPU clock, for a store
/// compressing bodies of `compress_from` bytes or more. Returns the medians (µs per atom) of
/// the raw log, the two store protocols, and the per-round differences store − raw (25th,
/// 50th, 75th percentile) and record_atom − raw (50th).
fn cpu_overhead(root: &Path, rounds: usize, block: u64, compress_from: usize) -> [f64; 7] {
    let Fixture { _dirs, outputs, start, end, log, store, run } = Fixture::new(root, compress_from);
    let micros = |work: &mut dyn FnMut()| cpu_micros(rustix::time::ClockId::ThreadCPUTime, block as f64, work);
    let (mut raw, mut begin_complete, mut record) = (Vec::new(), Vec::new(), Vec::new());
    let mut next = 0u64;
    for round in 0..rounds {
        raw.push(micros(&mut || raw_atoms(&log, &start, &end, block)));
        begin_complete.push(micros(&mut || store_atoms(&store, run, &outputs, 0, next, block)));
        next += block;
        record.push(micros(&mut || {
            for i in 0..block {
                let output = &outputs[(next + i) as usize % outputs.len()];
                store.record_atom(run, "recorder", &format!("r{round}-{i}"), &[], "", output).expect("record");
            }
        }));
    }
    let (differences, record_differences) = (differences(&begin_complete, &raw), differences(&record, &raw));
    [
        quantile(&raw, 0.5),
        quantile(&begin_complete, 0.5),
        quantile(&record, 0.5),
        quantile(&differences, 0.25),
        quantile(&differences, 0.5),
        quantile(&differences, 0.75),
        quantile(&record_differences, 0.5),
    ]
}

/// The same comparison with `threads` agent threads sharing group commit on the real disk
/// (`Sync`, so the 16 threads' appends share each `fdatasync`): alternating blocks of raw-log
/// and store atoms (begin + complete), each timed by the process's CPU clock (every thread's
/// work, wake-ups included, none of the time spent waiting for the disk). Returns the medians
/// (µs of CPU per atom) of the raw log and the store, and the per-round differences (25th,
/// 50th, 75th percentile).
fn cpu_overhead_threads(root: &Path, threads: usize, rounds: usize, per_thread: u64, compress_from: usize) -> [f64; 5] {
    let Fixture { _dirs, outputs, start, end, log, store, run } = Fixture::new(root, compress_from);
    let atoms = (threads as u64 * per_thread) as f64;
    let micros = |work: &dyn Fn()| cpu_micros(rustix::time::ClockId::ProcessCPUTime, atoms, work);
    let counter = std::sync::atomic::AtomicU64::new(0);
    let (mut raw, mut atoms_cpu) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        raw.push(micros(&|| {
            parallel(threads, per_thread, |_, n| raw_atoms(&log, &start, &end, n));
        }));
        atoms_cpu.push(micros(&|| {
            parallel(threads, per_thread, |t, n| {
                let from = counter.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
                store_atoms(&store, run, &outputs, t, from, n);
            });
        }));
    }
    let differences = differences(&atoms_cpu, &raw);
    [
        quantile(&raw, 0.5),
        quantile(&atoms_cpu, 0.5),
        quantile(&differences, 0.25),
        quantile(&differences, 0.5),
        quantile(&differences, 0.75),
    ]
}

/// The `q` quantile of `values` (nearest rank).
fn quantile(values: &[f64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// Segment size of the space measurements: small, so that a 12,000-atom run seals segments
/// for cold compression to rewrite (the default 64 MiB would hold all of it in the active one).
const SPACE_SEGMENT_BYTES: u64 = 1 << 20;

/// Bytes on disk per atom for a realistic run of `count` atoms, with the trained dictionary.
/// Bytes on disk per atom: over all `count` atoms; from atom 2,100 on (the final dictionary
/// trained); and over atoms 256–2,099 (the first, early dictionary); and the delta's size.
fn bytes_per_atom(root: &Path, count: usize, compress_from: usize) -> (f64, f64, f64, f64) {
    let outputs = outputs(count);
    let dir = tempfile::tempdir_in(root).expect("dir");
    let (store, marks) = space_store(dir.path(), &outputs, None, compress_from);
    let (young_from, measured_from) = marks;
    let total: u64 = store.log().segments().iter().map(|s| s.data_bytes).sum();
    let delta_bytes: usize = outputs.iter().map(|o| prost::Message::encoded_len(&o.delta)).sum();
    let steady = (total - measured_from) as f64 / (count - 2_100) as f64;
    let young = (measured_from - young_from) as f64 / (2_100 - 256) as f64;
    (total as f64 / count as f64, steady, young, delta_bytes as f64 / count as f64)
}

/// A store of `outputs.len()` realistic atoms in 1 MiB segments, with `cold` compression for
/// its compaction rounds (none run here); returns it and its log's bytes before atoms 256 and
/// 2,100.
fn space_store(
    dir: &Path,
    outputs: &[AtomOutput],
    cold: Option<FrameCompression>,
    compress_from: usize,
) -> (Store, (u64, u64)) {
    let store = Store::builder(dir)
        .snapshot_policy(continuum::SnapshotPolicy::NEVER)
        .compress_records_from(compress_from)
        .segment_bytes(SPACE_SEGMENT_BYTES)
        .compaction(CompactionPolicy { interval: None, cold_compression: cold, ..CompactionPolicy::default() })
        .background(false)
        .open()
        .expect("open store");
    let run = store.create_run(RunSpec::new("space")).expect("run");
    let (mut young_from, mut measured_from) = (0, 0);
    let mut parents = Vec::new();
    let log_bytes = |store: &Store| store.log().segments().iter().map(|s| s.data_bytes).sum::<u64>();
    for (i, output) in outputs.iter().enumerate() {
        if i == 256 {
            young_from = log_bytes(&store);
        }
        if i == 2_100 {
            measured_from = log_bytes(&store);
        }
        let atom = store.begin_atom(run, "researcher", &format!("step-{i}"), &parents, "").expect("begin");
        store.complete_atom(atom, output).expect("complete");
        parents = vec![atom];
    }
    (store, (young_from, measured_from))
}

/// Bytes per atom at rest after one compaction round with cold compression `cold` (no
/// snapshots, so nothing is reclaimed: every delta is kept): over the compressed segments
/// that hold only atoms after the final dictionary, their bytes over the atoms whose start
/// records they hold. Also the round's wall time per atom compressed (half of it is the
/// round's yield to the foreground: it sleeps as long as each segment took), and the mean
/// time of `Store::atom` before and after the round.
fn bytes_per_atom_at_rest(root: &Path, outputs: &[AtomOutput], cold: FrameCompression) -> (f64, f64, f64, f64) {
    let dir = tempfile::tempdir_in(root).expect("dir");
    let (store, _) = space_store(dir.path(), outputs, Some(cold), continuum::limits::COMPRESSION_MIN_BYTES);
    let steady_from = continuum::Lsn::new(2 * 2_100 + 8);
    let read_before = atom_read_micros(&store, outputs.len() as u64);
    let started = Instant::now();
    let report = store.compact().expect("compact");
    let elapsed = started.elapsed();
    let read_after = atom_read_micros(&store, outputs.len() as u64);
    assert_eq!(report.deltas_reclaimed, 0, "no snapshots: nothing is reclaimable");
    let (mut bytes, mut atoms, mut compressed_atoms) = (0u64, 0u64, 0u64);
    for segment in store.log().segments().iter().filter(|s| s.compressed) {
        let mut starts = 0u64;
        for item in store.log().iter_from(segment.first_lsn).expect("iter") {
            let (lsn, record) = item.expect("record");
            if lsn >= segment.next_lsn {
                break;
            }
            let kind = store.decode_record(&record).expect("decode").kind;
            starts += u64::from(kind == continuum::codec::RecordKind::AtomStarted);
        }
        compressed_atoms += starts;
        if segment.first_lsn >= steady_from {
            bytes += segment.data_bytes;
            atoms += starts;
        }
    }
    assert!(atoms > 0, "the run sealed segments after the dictionary was trained");
    let per_atom = elapsed.as_secs_f64() * 1e6 / compressed_atoms as f64;
    (bytes as f64 / atoms as f64, per_atom, read_before, read_after)
}

/// Mean µs of `Store::atom` (start and end record read and decoded) over atoms 2,200–4,199 in
/// order (the last 2,000 of a shorter run), as an agent re-executing its completed steps after a
/// restart reads them.
fn atom_read_micros(store: &Store, atoms: u64) -> f64 {
    let last = atoms.min(4_200);
    let first = last.saturating_sub(2_000).max(1);
    let started = Instant::now();
    for id in first..last {
        store.atom(continuum::AtomId::from_raw(id)).expect("atom");
    }
    started.elapsed().as_secs_f64() * 1e6 / (last - first) as f64
}

/// Index heap bytes per atom for `count` atoms (tiny outputs: the index does not hold them),
/// and the open's time with the index snapshot written when the store was dropped, and
/// without one (the first open after a crash; it folds every record and writes an index snapshot).
fn index_bytes_per_atom(root: &Path, count: u64) -> (f64, Duration, Duration) {
    let dir = tempfile::tempdir_in(root).expect("dir");
    {
        let store = open_store(dir.path());
        let run = store.create_run(RunSpec::new("big")).expect("run");
        let empty = AtomOutput::default();
        let mut parents = Vec::new();
        for i in 0..count {
            let atom = store.begin_atom(run, "agent", &format!("{i}"), &parents, "").expect("begin");
            store.complete_atom(atom, &empty).expect("complete");
            parents = vec![atom];
        }
    }
    let started = Instant::now();
    let store = open_store(dir.path());
    let with_index_snapshot = started.elapsed();
    let bytes = store.index_heap_bytes() as f64 / count as f64;
    drop(store);
    let _ = std::fs::remove_file(dir.path().join("index.snapshot"));
    let started = Instant::now();
    let store = open_store(dir.path());
    let without = started.elapsed();
    drop(store);
    (bytes, with_index_snapshot, without)
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    let disk = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/tmp");
    std::fs::create_dir_all(&disk).expect("bench dir");
    let shm = Path::new("/dev/shm");
    let mut figures = bench_atoms(&mut criterion, "atom_sync", &disk, &[1, 16]);
    if shm.is_dir() {
        figures.extend(bench_atoms(&mut criterion, "atom_cpu", shm, &[1]));
    }
    let test_mode = std::env::args().any(|a| a == "--test");
    let default = continuum::limits::COMPRESSION_MIN_BYTES;
    let settings =
        [(default, "default: records under 2 KiB appended plain"), (COMPRESS_ALL, "compress_records_from(64)")];
    let cpu: Vec<[f64; 7]> = if shm.is_dir() {
        let (rounds, block) = if test_mode { (3, 50) } else { (61, 2_000) };
        settings.iter().map(|(from, _)| cpu_overhead(shm, rounds, block, *from)).collect()
    } else {
        Vec::new()
    };
    let cpu_16: Vec<[f64; 5]> = {
        let (rounds, per_thread) = if test_mode { (3, 10) } else { (21, 250) };
        settings.iter().map(|(from, _)| cpu_overhead_threads(&disk, 16, rounds, per_thread, *from)).collect()
    };
    let atoms = if test_mode { 10_000 } else { 12_000 };
    let space_root = if shm.is_dir() { shm } else { &disk };
    let (all, steady, young, delta) = bytes_per_atom(space_root, atoms, COMPRESS_ALL);
    let (all_plain, steady_plain, _, _) = bytes_per_atom(space_root, atoms, default);
    let space_outputs = outputs(atoms);
    let defaults = CompactionPolicy::COLD_COMPRESSION;
    let levels: &[(i32, usize)] = if test_mode {
        &[(defaults.level, defaults.frame_bytes)]
    } else {
        &[(9, 256 << 10), (15, 256 << 10), (17, 256 << 10), (17, 512 << 10), (19, 512 << 10), (17, 1024 << 10)]
    };
    let at_rest: Vec<(FrameCompression, (f64, f64, f64, f64))> = levels
        .iter()
        .map(|&(level, frame_bytes)| {
            let cold = FrameCompression { level, frame_bytes };
            (cold, bytes_per_atom_at_rest(space_root, &space_outputs, cold))
        })
        .collect();
    let index_atoms = std::env::var("CONTINUUM_BENCH_INDEX_ATOMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if test_mode { 10_000 } else { 1_000_000 });
    let (index, with_index_snapshot, without) =
        index_bytes_per_atom(if shm.is_dir() { shm } else { &disk }, index_atoms);
    eprintln!("==== summary: store ====");
    for (name, value) in figures {
        eprintln!("  {name:<55} {value:>9.2}");
    }
    for ([raw, store, record, low, overhead, high, record_overhead], (_, setting)) in cpu.iter().zip(&settings) {
        eprintln!("  thread CPU time, tmpfs, alternating blocks (medians), {setting}:");
        eprintln!("    raw log (the store's two records)                     {raw:>9.2} µs/atom");
        eprintln!("    store, begin_atom + complete_atom                     {store:>9.2} µs/atom");
        eprintln!("    store, record_atom                                    {record:>9.2} µs/atom");
        eprintln!(
            "    store − raw log, begin + complete                     {overhead:>9.2} µs/atom (quartiles {low:.2}–{high:.2}; goal <= 5)"
        );
        eprintln!("    store − raw log, record_atom                          {record_overhead:>9.2} µs/atom");
    }
    for ([raw, store, low, overhead, high], (_, setting)) in cpu_16.iter().zip(&settings) {
        eprintln!("  process CPU time, 16 threads, Sync on the disk, alternating blocks (medians), {setting}:");
        eprintln!("    raw log (the store's two records)                     {raw:>9.2} µs/atom");
        eprintln!("    store, begin_atom + complete_atom                     {store:>9.2} µs/atom");
        eprintln!(
            "    store − raw log                                       {overhead:>9.2} µs/atom (quartiles {low:.2}–{high:.2}; goal <= 5)"
        );
    }
    eprintln!("  delta size (protobuf, before compression)               {delta:>9.1} bytes/atom");
    eprintln!("  as appended, default (records under 2 KiB plain), {atoms} atoms {all_plain:>9.1} bytes/atom");
    eprintln!("  as appended, default, from atom 2,100                   {steady_plain:>9.1} bytes/atom");
    eprintln!("  as appended, compress_records_from(64), {atoms} atoms {all:>9.1} bytes/atom");
    eprintln!(
        "  as appended, compress_records_from(64), atoms 256-2,099 (first, early dictionary) {young:>9.1} bytes/atom"
    );
    eprintln!("  as appended, compress_records_from(64), from atom 2,100 (final dictionary) {steady:>9.1} bytes/atom");
    for (cold, (bytes, micros, read_before, read_after)) in &at_rest {
        let default = if *cold == defaults { ", the default" } else { "" };
        eprintln!(
            "  at rest, cold compression level {:>2}, {:>4} KiB frames   {bytes:>9.1} bytes/atom (goal <= 150; round {micros:.1} µs/atom; Store::atom {read_before:.1} → {read_after:.1} µs{default})",
            cold.level,
            cold.frame_bytes >> 10
        );
    }
    eprintln!("  index for {index_atoms} atoms                           {index:>9.1} bytes/atom (goal <= 64)");
    eprintln!(
        "  open of {index_atoms} atoms, index snapshot          {:>9.1} ms",
        with_index_snapshot.as_secs_f64() * 1e3
    );
    eprintln!(
        "  open of {index_atoms} atoms, no index snapshot (fold all)  {:>9.1} ms (encodes one; a thread writes it)",
        without.as_secs_f64() * 1e3
    );
    eprintln!("==== end store ====");
    criterion.final_summary();
}
