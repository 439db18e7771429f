//! Replay benchmarks: rebuilding an agent's context from the log, side by side with the bound
//! (reading and decompressing the same records) and with itself on one thread.
//!
//! Stores are built on tmpfs (`/dev/shm`, so 1,000,000 atoms take seconds, not an hour of
//! fdatasyncs) and read warm. Deltas are realistic ~500-byte agent deltas; the agent keeps a
//! bounded window (it drops its oldest message once it holds 40), a few thousand state keys,
//! and 1,000 slots each of tool outputs and intermediate results.
//!
//! The targets are measured on records compressed one by one as they were appended
//! (`compress_records_from(64)`): what the parallel
//! replayer decompresses on several cores. The summary also prints the same rebuilds of the
//! default layout, whose ~570-byte records are appended plain: faster, with nothing to
//! decompress, so the replayer's sequential part weighs more against its bound. And a full
//! replay of 200,000 default-layout atoms before and after cold compression rewrote them.
//!
//! It also rebuilds one agent among 16 and among 256 that wrote in turn, as the store does it
//! (reading only the agent's own records when they are few enough in the range) and, side by
//! side, scanning every agent's records of the range; and every agent's head, one by one and
//! all together through `rebuild_contexts`, whose scans are shared.
//!
//! `cargo bench --bench replay` (`CONTINUUM_BENCH_REPLAY_ATOMS` changes the 1,000,000);
//! `cargo bench --bench replay -- interleaved` runs only the interleaved part, and the queries
//! and replay of a run begun after everything else against one spread across the store.

use std::path::Path;
use std::time::{Duration, Instant};

use continuum::synthetic::Transcript;
use continuum::{AtomId, AtomOutput, RunSpec, Store};
use criterion::Criterion;

/// Records compressed one by one as they are appended: the layout the targets are set on.
const COMPRESSED: usize = 64;

/// The store as these benchmarks use it: explicit snapshots only, all kept (time travel to
/// any atom needs every one of them), no background thread; record bodies of `compress_from`
/// bytes or more compressed as they are appended.
fn open(dir: &Path, compress_from: usize) -> Store {
    let keep_all = continuum::RetentionPolicy { snapshots_per_agent: usize::MAX, finished_run_age: None };
    Store::builder(dir)
        .snapshot_policy(continuum::SnapshotPolicy::NEVER)
        .compress_records_from(compress_from)
        .retention(keep_all)
        .background(false)
        .open()
        .expect("open")
}

/// Builds a one-agent linear history of `count` atoms; snapshots every `snapshot_every`.
fn build(
    root: &Path,
    count: u64,
    snapshot_every: Option<u64>,
    compress_from: usize,
) -> (tempfile::TempDir, Vec<AtomId>) {
    let dir = tempfile::tempdir_in(root).expect("dir");
    let store = open(dir.path(), compress_from);
    let ids = write_history(&store, count, snapshot_every);
    (dir, ids)
}

/// Writes the history [`build`] describes into `store`.
fn write_history(store: &Store, count: u64, snapshot_every: Option<u64>) -> Vec<AtomId> {
    let run = store.create_run(RunSpec::new("replay")).expect("run");
    let mut transcript = Transcript::new(1);
    let mut ids: Vec<AtomId> = Vec::with_capacity(count as usize);
    for i in 0..count {
        let delta = bounded_delta(&mut transcript, i);
        let parents: Vec<AtomId> = ids.last().copied().into_iter().collect();
        let atom = store.begin_atom(run, "agent", &i.to_string(), &parents, "").expect("begin");
        store.complete_atom(atom, &AtomOutput { delta, result: Vec::new() }).expect("complete");
        if snapshot_every.is_some_and(|every| (i + 1) % every == 0) {
            store.snapshot_now(atom).expect("snapshot");
        }
        ids.push(atom);
    }
    ids
}

/// The `i`-th delta of an agent whose context stays bounded, as the issue describes it: it
/// drops its oldest message once it holds 40, and tool outputs and intermediate results are
/// keyed by one of 1,000 slots (the generator's own keys are unique per step, which would grow
/// the context by one entry per atom).
fn bounded_delta(transcript: &mut Transcript, i: u64) -> continuum::Delta {
    let mut delta = transcript.next_delta(500);
    delta.drop_oldest_messages = u32::from(i >= 40);
    for output in &mut delta.tool_outputs {
        output.tool_call_id = format!("call-{}", i % 1000);
    }
    for result in &mut delta.intermediate_results {
        result.name = format!("step-{}.summary", i % 1000);
    }
    for message in &mut delta.messages {
        if let Some(call) = &mut message.tool_call {
            call.id = format!("call-{}", i % 1000);
        }
    }
    delta
}

/// What [`interleaved_replay`] measured.
struct Interleaved {
    /// One agent's full replay as the store does it, and scanning every agent's records.
    targeted: Duration,
    whole: Duration,
    /// Deltas that replay applies.
    applied: usize,
    /// Every agent's head rebuilt one by one (`rebuild_context` each), and all together
    /// (`rebuild_contexts`, their scans shared).
    one_by_one: Duration,
    together: Duration,
}

/// One agent among `agents` writing in turn (`per_agent` atoms each, default layout, no
/// snapshots): the full replay of its head as the store does it (reading only its run's
/// records if they are few enough in the range), and with every rebuild scanning the whole
/// range (every agent's records), alternating; then every agent's head, one by one and all
/// together, alternating; medians of `repeats` each (of a third as many for all the heads).
fn interleaved_replay(root: &Path, agents: usize, per_agent: u64, repeats: usize) -> Interleaved {
    let dir = tempfile::tempdir_in(root).expect("dir");
    let store = open(dir.path(), continuum::limits::COMPRESSION_MIN_BYTES);
    let runs: Vec<_> =
        (0..agents).map(|a| store.create_run(RunSpec::new(format!("agent-{a}"))).expect("run")).collect();
    let mut transcripts: Vec<Transcript> = (0..agents).map(|a| Transcript::new(a as u64 + 1)).collect();
    let mut heads: Vec<Option<AtomId>> = vec![None; agents];
    for i in 0..per_agent {
        for (a, run) in runs.iter().enumerate() {
            let output = AtomOutput { delta: bounded_delta(&mut transcripts[a], i), result: Vec::new() };
            let parents: Vec<AtomId> = heads[a].into_iter().collect();
            heads[a] = Some(store.record_atom(*run, "agent", &i.to_string(), &parents, "", &output).expect("record"));
        }
    }
    let head = heads[0].expect("atoms");
    let applied = store.rebuild_context(head).expect("rebuild").atoms_applied;
    let (mut targeted, mut whole) = (Vec::new(), Vec::new());
    for _ in 0..repeats {
        for (on, times) in [(true, &mut targeted), (false, &mut whole)] {
            store.set_targeted_scans(on);
            let started = Instant::now();
            drop(store.rebuild_context(head).expect("rebuild"));
            times.push(started.elapsed());
        }
    }
    store.set_targeted_scans(true);
    let heads: Vec<AtomId> = heads.into_iter().flatten().collect();
    let (mut one_by_one, mut together) = (Vec::new(), Vec::new());
    for _ in 0..repeats.div_ceil(3) {
        let started = Instant::now();
        for head in &heads {
            drop(store.rebuild_context(*head).expect("rebuild"));
        }
        one_by_one.push(started.elapsed());
        let started = Instant::now();
        for rebuilt in store.rebuild_contexts(&heads) {
            drop(rebuilt.expect("rebuild"));
        }
        together.push(started.elapsed());
    }
    Interleaved {
        targeted: median(targeted),
        whole: median(whole),
        applied,
        one_by_one: median(one_by_one),
        together: median(together),
    }
}

/// Two runs of `run_atoms` atoms each in a store of `total` atoms: one written across the
/// whole store (one of its atoms every `total / run_atoms`, among a bulk run's), so its atom
/// span covers the whole table, and one begun after all of them. Medians over `repeats` of
/// `agent_atoms` + `incomplete_atoms`, and of the full replay of the run's head: (spread
/// queries, late queries, spread replay, late replay).
fn late_run_queries(root: &Path, total: u64, run_atoms: u64, repeats: usize) -> [Duration; 4] {
    let dir = tempfile::tempdir_in(root).expect("dir");
    let store = open(dir.path(), continuum::limits::COMPRESSION_MIN_BYTES);
    let [bulk, spread] = ["bulk", "spread"].map(|name| store.create_run(RunSpec::new(name)).expect("run"));
    let mut transcript = Transcript::new(7);
    let mut write = |run, count: u64, every: u64| {
        let mut head = None;
        for i in 0..count {
            let output = AtomOutput { delta: bounded_delta(&mut transcript, i), result: Vec::new() };
            let (run, parents): (_, Vec<AtomId>) =
                if i % every == 0 { (run, head.into_iter().collect()) } else { (bulk, Vec::new()) };
            let atom = store.record_atom(run, "agent", &i.to_string(), &parents, "", &output).expect("record");
            if run != bulk {
                head = Some(atom);
            }
        }
        head.expect("atoms")
    };
    let spread_head = write(spread, total - run_atoms, (total - run_atoms) / run_atoms);
    let late = store.create_run(RunSpec::new("late")).expect("late run");
    let late_head = write(late, run_atoms, 1);
    let measure = |run, head| {
        let queries = time(repeats, || {
            std::hint::black_box((store.agent_atoms(run, "agent"), store.incomplete_atoms(run)));
        });
        let replay = time(repeats, || drop(store.rebuild_context(head).expect("rebuild")));
        (queries, replay)
    };
    let (spread_queries, spread_replay) = measure(spread, spread_head);
    let (late_queries, late_replay) = measure(late, late_head);
    [spread_queries, late_queries, spread_replay, late_replay]
}

/// Full replay and the read-only pass over a default-layout history of `count` atoms, as
/// appended and after one compaction round has cold-compressed its sealed segments (8 MiB, so
/// that most of the history is sealed): (replay, read only) before, the round's time, and
/// (replay, read only) after.
fn cold_replay(root: &Path, count: u64, repeats: usize) -> [Duration; 5] {
    let dir = tempfile::tempdir_in(root).expect("dir");
    let store = Store::builder(dir.path())
        .snapshot_policy(continuum::SnapshotPolicy::NEVER)
        .segment_bytes(8 << 20)
        .compaction(continuum::CompactionPolicy { interval: None, ..continuum::CompactionPolicy::default() })
        .background(false)
        .open()
        .expect("open");
    let head = *write_history(&store, count, None).last().expect("atoms");
    let measure = |store: &Store| {
        let replay = time(repeats, || drop(store.rebuild_context(head).expect("rebuild")));
        let read = time(repeats, || {
            let _ = store.read_and_decompress_run(head).expect("read");
        });
        (replay, read)
    };
    let (replay_before, read_before) = measure(&store);
    let started = Instant::now();
    let round = store.compact().expect("compact");
    let compaction = started.elapsed();
    assert!(round.segments_compressed > 0, "{round:?}");
    let (replay_after, read_after) = measure(&store);
    [replay_before, read_before, compaction, replay_after, read_after]
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn time(repeats: usize, mut f: impl FnMut()) -> Duration {
    median(
        (0..repeats)
            .map(|_| {
                let started = Instant::now();
                f();
                started.elapsed()
            })
            .collect(),
    )
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    let test_mode = test_mode();
    let shm = Path::new("/dev/shm");
    let root = if shm.is_dir() { shm.to_path_buf() } else { Path::new(env!("CARGO_MANIFEST_DIR")).join("target/tmp") };
    std::fs::create_dir_all(&root).expect("bench dir");
    let big: u64 = std::env::var("CONTINUUM_BENCH_REPLAY_ATOMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if test_mode { 20_000 } else { 1_000_000 });
    let small = 10_000u64.min(big);
    let mut lines = Vec::new();

    // One agent among 16 and among 256 writing in turn: its rebuild reads only its own records
    // when they are few enough in the range (`interleaved` alone runs just this part).
    let interleaved_atoms = if test_mode { 8_192 } else { 160_000 };
    for agents in [16, 256] {
        let per_agent = interleaved_atoms / agents as u64;
        let found = interleaved_replay(&root, agents, per_agent, if test_mode { 1 } else { 15 });
        lines.push(format!(
            "one agent of {agents} writing in turn, {per_agent} atoms each (default layout, no snapshot): full replay ({} deltas) {:.2} ms, {:.2} ms scanning every agent's records; {:.2}x",
            found.applied,
            found.targeted.as_secs_f64() * 1e3,
            found.whole.as_secs_f64() * 1e3,
            found.whole.as_secs_f64() / found.targeted.as_secs_f64()
        ));
        lines.push(format!(
            "all {agents} agents' heads: rebuild_contexts (scans shared) {:.1} ms, one by one {:.1} ms; {:.2}x",
            found.together.as_secs_f64() * 1e3,
            found.one_by_one.as_secs_f64() * 1e3,
            found.one_by_one.as_secs_f64() / found.together.as_secs_f64()
        ));
    }
    // A run begun after everything else walks only its own span of the index.
    let (total, run_atoms) = if test_mode { (8_192, 64) } else { (160_000, 100) };
    let [spread_q, late_q, spread_r, late_r] =
        late_run_queries(&root, total, run_atoms, if test_mode { 1 } else { 15 });
    lines.push(format!(
        "a run of {run_atoms} atoms in a store of {total}: agent_atoms + incomplete_atoms {:.3} ms spread across the store, {:.3} ms begun after it ({:.0}x); its full replay {:.2} ms and {:.2} ms",
        spread_q.as_secs_f64() * 1e3,
        late_q.as_secs_f64() * 1e3,
        spread_q.as_secs_f64() / late_q.as_secs_f64(),
        spread_r.as_secs_f64() * 1e3,
        late_r.as_secs_f64() * 1e3
    ));
    if std::env::args().skip(1).any(|arg| arg == "interleaved") {
        print_summary(&lines);
        return;
    }

    let (small_dir, small_ids) = build(&root, small, None, COMPRESSED);
    let store = open(small_dir.path(), COMPRESSED);
    let head = *small_ids.last().expect("atoms");
    let mut group = criterion.benchmark_group("replay");
    group.sample_size(20);
    group.bench_function(format!("head_{small}_atoms"), |b| b.iter(|| store.rebuild_context(head).expect("rebuild")));
    group.finish();
    let full = time(9, || drop(store.rebuild_context(head).expect("rebuild")));
    let bound = time(9, || {
        let _ = store.read_and_decompress_run(head).expect("read");
    });
    lines
        .push(format!("{small} atoms, full replay, no snapshot: {:.2} ms (target <= 10 ms)", full.as_secs_f64() * 1e3));
    lines.push(format!(
        "{small} atoms, read + decompress only (bound): {:.2} ms; replay / bound = {:.2} (target <= 1.5)",
        bound.as_secs_f64() * 1e3,
        full.as_secs_f64() / bound.as_secs_f64()
    ));
    drop(store);

    let started = Instant::now();
    let (big_dir, big_ids) = build(&root, big, None, COMPRESSED);
    lines.push(format!("{big} atoms built in {:.1} s", started.elapsed().as_secs_f64()));
    let store = open(big_dir.path(), COMPRESSED);
    let head = *big_ids.last().expect("atoms");
    let repeats = if test_mode { 1 } else { 3 };
    let parallel = time(repeats, || drop(store.rebuild_context(head).expect("rebuild")));
    let one = time(repeats, || drop(store.rebuild_context_with_threads(head, 1).expect("rebuild")));
    let bound = time(repeats, || {
        let _ = store.read_and_decompress_run(head).expect("read");
    });
    lines.push(format!("{big} atoms, full replay, no snapshot: {:.3} s (target <= 1 s)", parallel.as_secs_f64()));
    lines.push(format!(
        "{big} atoms, one replay thread: {:.3} s; speedup {:.2}x (target >= 1.7x)",
        one.as_secs_f64(),
        one.as_secs_f64() / parallel.as_secs_f64()
    ));
    lines.push(format!(
        "{big} atoms, read + decompress only (bound): {:.3} s; replay / bound = {:.2} (target <= 1.5)",
        bound.as_secs_f64(),
        parallel.as_secs_f64() / bound.as_secs_f64()
    ));
    drop(store);
    drop(big_dir);

    // The default layout: records under 2 KiB appended plain (left to cold compression).
    let default = continuum::limits::COMPRESSION_MIN_BYTES;
    for count in [small, big] {
        let (dir, ids) = build(&root, count, None, default);
        let store = open(dir.path(), default);
        let head = *ids.last().expect("atoms");
        let repeats = if count == small { 9 } else { repeats };
        let parallel = time(repeats, || drop(store.rebuild_context(head).expect("rebuild")));
        let one = time(repeats, || drop(store.rebuild_context_with_threads(head, 1).expect("rebuild")));
        let bound = time(repeats, || {
            let _ = store.read_and_decompress_run(head).expect("read");
        });
        lines.push(format!(
            "default layout (records plain), {count} atoms: full replay {:.2} ms, one thread {:.2} ms (speedup {:.2}x), read only {:.2} ms (replay / bound {:.2})",
            parallel.as_secs_f64() * 1e3,
            one.as_secs_f64() * 1e3,
            one.as_secs_f64() / parallel.as_secs_f64(),
            bound.as_secs_f64() * 1e3,
            parallel.as_secs_f64() / bound.as_secs_f64()
        ));
    }

    // History at rest: the same rebuild after cold compression rewrote the sealed segments.
    let cold_atoms = if test_mode { 20_000 } else { 200_000 };
    let [replay_before, read_before, compaction, replay_after, read_after] = cold_replay(&root, cold_atoms, repeats);
    lines.push(format!(
        "default layout, {cold_atoms} atoms in 8 MiB segments: full replay {:.1} ms as appended, {:.1} ms after cold compression (read only {:.1} → {:.1} ms; the round took {:.1} s)",
        replay_before.as_secs_f64() * 1e3,
        replay_after.as_secs_f64() * 1e3,
        read_before.as_secs_f64() * 1e3,
        read_after.as_secs_f64() * 1e3,
        compaction.as_secs_f64()
    ));

    // The figure: any atom of the 1,000,000-atom history, with a snapshot every 50.
    let travel_atoms = if test_mode { 2_000 } else { big };
    let started = Instant::now();
    let (travel_dir, travel_ids) = build(&root, travel_atoms, Some(50), COMPRESSED);
    lines.push(format!(
        "{travel_atoms} atoms with a snapshot every 50 built in {:.1} s",
        started.elapsed().as_secs_f64()
    ));
    let store = open(travel_dir.path(), COMPRESSED);
    let mut worst = Duration::ZERO;
    let mut total = Duration::ZERO;
    let picks = 200;
    for k in 0..picks {
        let atom = travel_ids[(k * 7919) % travel_ids.len()];
        let started = Instant::now();
        let rebuilt = store.rebuild_context(atom).expect("time travel");
        let elapsed = started.elapsed();
        assert!(rebuilt.snapshot.is_some() || atom.get() < 50);
        worst = worst.max(elapsed);
        total += elapsed;
    }
    lines.push(format!(
        "time travel, {travel_atoms}-atom history, snapshot every 50: mean {:.2} ms, worst {:.2} ms of {picks} random atoms (target <= 5 ms)",
        total.as_secs_f64() * 1e3 / picks as f64,
        worst.as_secs_f64() * 1e3
    ));
    print_summary(&lines);
    criterion.final_summary();
}

fn print_summary(lines: &[String]) {
    eprintln!("==== summary: replay ====");
    for line in lines {
        eprintln!("  {line}");
    }
    eprintln!("==== end replay ====");
}

/// Whether criterion runs in test mode (`cargo test --benches`, or `cargo bench -- --test`):
/// as criterion decides it, when `--bench` is absent or `--test` is given.
fn test_mode() -> bool {
    let args: Vec<String> = std::env::args().collect();
    !args.iter().any(|a| a == "--bench") || args.iter().any(|a| a == "--test")
}
