//! What reading a run's checkpoints costs on a run of many atoms (`docs/BENCHMARKS.md`, "Run
//! checkpoints"): `load_latest_checkpoint` when the checkpoint is the run's newest atom and
//! when `ATOMS` atoms came after it, `checkpoints(run, 10)`, and `write_checkpoint`.
//!
//! `cargo run --release --example checkpoint_study` (`ATOMS`, default 100,000)

use std::time::{Duration, Instant};

use continuum::checkpoint::CheckpointDraft;
use continuum::synthetic::Transcript;
use continuum::{AtomId, AtomOutput, Durability, RunId, RunSpec, Store};

const LOADS: u32 = 2_000;

fn main() {
    let atoms: usize = std::env::var("ATOMS").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/tmp");
    std::fs::create_dir_all(&root).expect("target/tmp");
    let dir = tempfile::tempdir_in(&root).expect("dir");
    let store = Store::builder(dir.path()).atom_durability(Durability::Buffered).open().expect("open");
    let run = store.create_run(RunSpec::new("long").pipeline("study", "1")).expect("run");
    let last = record(&store, run, None, atoms, 1);
    let writes: Vec<Duration> = (0..50)
        .map(|_| {
            let started = Instant::now();
            store.write_checkpoint(run, CheckpointDraft::at("agent", "p").shared("k", vec![7; 256])).expect("write");
            started.elapsed()
        })
        .collect();
    println!("write_checkpoint (synced), heads found on a run of {atoms} atoms: median {:?}", median(writes));
    let named: Vec<Duration> = (0..50)
        .map(|_| {
            let started = Instant::now();
            store.write_checkpoint(run, CheckpointDraft::at("agent", "p").head("agent", last)).expect("write");
            started.elapsed()
        })
        .collect();
    println!("write_checkpoint (synced), heads named: median {:?}", median(named));
    let synced: Vec<Duration> = (0..50)
        .map(|step| {
            let started = Instant::now();
            let output = AtomOutput::default();
            store.record_atom(run, "other", &format!("sync-{step}"), &[], "", &output).expect("atom");
            store.sync().expect("sync");
            started.elapsed()
        })
        .collect();
    println!("record_atom + sync, for comparison: median {:?}", median(synced));
    println!("load_latest_checkpoint, checkpoint newest of {atoms} atoms: {:?}", per_load(&store, run));
    record(&store, run, Some(last), atoms, 2);
    println!("load_latest_checkpoint, {atoms} atoms after it: {:?}", per_load(&store, run));
    let started = Instant::now();
    for _ in 0..100 {
        assert_eq!(store.checkpoints(run, 10).expect("list").len(), 10);
    }
    println!("checkpoints(run, 10) on a run of {} atoms: {:?}", 2 * atoms + 150, started.elapsed() / 100);
}

/// `count` atoms of one agent with small deltas, after `after`; returns the last.
fn record(store: &Store, run: RunId, after: Option<AtomId>, count: usize, seed: u64) -> AtomId {
    let mut transcript = Transcript::new(seed);
    let mut parent = after;
    for step in 0..count {
        let output = AtomOutput { delta: transcript.next_delta(200), result: Vec::new() };
        let parents: Vec<AtomId> = parent.into_iter().collect();
        let key = format!("{seed}-{step}");
        parent = Some(store.record_atom(run, "agent", &key, &parents, "", &output).expect("atom"));
    }
    store.sync().expect("sync");
    parent.expect("at least one atom")
}

fn per_load(store: &Store, run: RunId) -> Duration {
    let started = Instant::now();
    for _ in 0..LOADS {
        store.load_latest_checkpoint(run).expect("load").expect("a checkpoint");
    }
    started.elapsed() / LOADS
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort_unstable();
    samples[samples.len() / 2]
}
