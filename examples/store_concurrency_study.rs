//! Where 16 agent threads' time goes in the store (issue 6, workload 2): atoms per second,
//! commit groups and `fdatasync`s per atom, and how busy the disk is syncing the log, for three
//! snapshot policies. Each of 16 agents (its own run) first runs `WARM` atoms (default 3,000),
//! so that its context is as large as a long-running agent's, then three trials of 250 atoms
//! per agent are timed. The figures go into `docs/BENCHMARKS.md` §8.
//!
//! `cargo run --release --example store_concurrency_study -- [default|every200|never]`

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use continuum::synthetic::Transcript;
use continuum::{AtomId, AtomOutput, RunSpec, SnapshotPolicy, Store};

const AGENTS: usize = 16;
const PER_TRIAL: u64 = 250;

fn main() {
    let policy = std::env::args().nth(1).unwrap_or_else(|| "default".to_owned());
    let warm: u64 = std::env::var("WARM").ok().and_then(|v| v.parse().ok()).unwrap_or(3_000);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/tmp");
    std::fs::create_dir_all(&root).expect("target/tmp");
    let dir = tempfile::tempdir_in(&root).expect("dir");
    let builder = Store::builder(dir.path());
    let store = match policy.as_str() {
        "default" => builder.open(),
        "every200" => {
            builder.snapshot_policy(SnapshotPolicy { every_atoms: 200, every: Duration::from_secs(600) }).open()
        }
        "never" => builder.snapshot_policy(SnapshotPolicy::NEVER).open(),
        other => panic!("the policy is default, every200 or never, not {other}"),
    }
    .expect("open the store");
    let mut transcript = Transcript::new(1);
    let outputs: Vec<AtomOutput> =
        (0..256).map(|_| AtomOutput { delta: transcript.next_delta(500), result: Vec::new() }).collect();
    let runs: Vec<_> =
        (0..AGENTS).map(|agent| store.create_run(RunSpec::new(format!("agent-{agent}"))).expect("run")).collect();
    let lasts: Vec<Mutex<Option<AtomId>>> = (0..AGENTS).map(|_| Mutex::new(None)).collect();
    let keys = AtomicU64::new(0);
    let go = |per: u64| {
        std::thread::scope(|scope| {
            for agent in 0..AGENTS {
                let (store, outputs, runs, lasts, keys) = (&store, &outputs, &runs, &lasts, &keys);
                scope.spawn(move || {
                    for i in 0..per {
                        let mut last = lasts[agent].lock().expect("lock");
                        let parents: Vec<AtomId> = last.iter().copied().collect();
                        let key = keys.fetch_add(1, Ordering::Relaxed).to_string();
                        let atom = store.begin_atom(runs[agent], "agent", &key, &parents, "").expect("begin");
                        store.complete_atom(atom, &outputs[(i as usize + agent) % outputs.len()]).expect("complete");
                        *last = Some(atom);
                    }
                });
            }
        });
    };
    go(warm);
    for _ in 0..3 {
        let before = store.metrics();
        let started = Instant::now();
        go(PER_TRIAL);
        let elapsed = started.elapsed().as_secs_f64();
        let after = store.metrics();
        let atoms = (AGENTS as u64 * PER_TRIAL) as f64;
        let groups = (after.groups - before.groups) as f64;
        let syncs = (after.fdatasyncs - before.fdatasyncs) as f64;
        let sync_ns = (after.fdatasync_ns.sum - before.fdatasync_ns.sum) as f64;
        let snapshots = (after.snapshot_writes - before.snapshot_writes) as f64;
        println!(
            "{policy}: {:.0} atoms/s; per atom {:.3} commit groups, {:.3} fdatasyncs, {:.3} snapshots; \
             mean fdatasync {:.0} µs; log fdatasync busy {:.0} % of the time",
            atoms / elapsed,
            groups / atoms,
            syncs / atoms,
            snapshots / atoms,
            sync_ns / syncs.max(1.0) / 1e3,
            100.0 * sync_ns / 1e9 / elapsed
        );
    }
}
