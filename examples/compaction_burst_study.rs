//! Cold compression beside a burst of durable atoms: a store holds a 30,000-atom history in 1 MiB
//! sealed segments that are due for cold compression only (no policy snapshots, so no delta is
//! reclaimable); 16 agents (one thread each) then record `Sync` atoms for 4 s while the
//! background thread runs a compaction round, asked for 0.5 s into the burst. Prints the agents'
//! atoms per second and what the round did: what cold compression costs the agents beside it
//! (`docs/BENCHMARKS.md` §12).
//!
//! `cargo run --release --example compaction_burst_study`

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use continuum::synthetic::Transcript;
use continuum::{AtomOutput, CompactionPolicy, RunSpec, SnapshotPolicy, Store};

const HISTORY: usize = 30_000;
const AGENTS: usize = 16;
const BURST: Duration = Duration::from_secs(4);

fn main() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/tmp");
    std::fs::create_dir_all(&root).expect("target/tmp");
    let dir = tempfile::tempdir_in(&root).expect("dir");
    let store = Store::builder(dir.path())
        .segment_bytes(1 << 20)
        .snapshot_policy(SnapshotPolicy::NEVER)
        .compaction(CompactionPolicy { interval: None, ..CompactionPolicy::default() })
        .open()
        .expect("open");
    let history = store.create_run(RunSpec::new("history")).expect("run");
    let mut transcript = Transcript::new(7);
    let mut parent = None;
    for step in 0..HISTORY {
        let output = AtomOutput { delta: transcript.next_delta(500), result: Vec::new() };
        let parents: Vec<_> = parent.into_iter().collect();
        parent = Some(store.record_atom(history, "old", &format!("{step}"), &parents, "", &output).expect("history"));
    }
    let burst = store.create_run(RunSpec::new("burst")).expect("run");
    let atoms = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    std::thread::scope(|scope| {
        for agent in 0..AGENTS {
            let (store, atoms, stop) = (&store, &atoms, &stop);
            scope.spawn(move || {
                let mut transcript = Transcript::new(agent as u64);
                let name = format!("agent-{agent}");
                for step in 0.. {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let output = AtomOutput { delta: transcript.next_delta(500), result: Vec::new() };
                    store.record_atom(burst, &name, &format!("{step}"), &[], "", &output).expect("atom");
                    atoms.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        std::thread::sleep(Duration::from_millis(500));
        assert!(store.compact_in_background(), "the background thread takes the round");
        std::thread::sleep(BURST - Duration::from_millis(500));
        stop.store(true, Ordering::Relaxed);
    });
    let rate = atoms.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
    let deadline = Instant::now() + Duration::from_secs(60);
    while store.metrics().compactions == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let report = store.last_compaction().unwrap_or_default();
    println!("{rate:.0} atoms/s during the burst; the round compressed {} segments", report.segments_compressed);
    store.close().expect("close");
}
