//! Bursts of atoms beside the store's own background work: 16 agents (one thread each) record
//! atoms with realistic ~500-byte deltas as fast as they can, in bursts of `BURST` atoms (100)
//! separated by a pause of `PAUSE_MS` (300: a model call), on a store with the default policies
//! (a snapshot every 50 atoms per agent, written by the background thread). Prints the atoms per
//! second inside the bursts (atoms over the time the bursts took): what background work costs
//! the agents (`docs/BENCHMARKS.md` §12).
//!
//! `cargo run --release --example burst_study` (`DIR=/dev/shm` to run it on tmpfs, where the
//! disk's sync time does not hide the CPU the appenders lose).

use std::time::{Duration, Instant};

use continuum::synthetic::Transcript;
use continuum::{AtomOutput, RunSpec, Store};

const AGENTS: usize = 16;
const BURSTS: usize = 6;

/// A number from the environment variable `name`, or `default`.
fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() {
    let root = std::env::var_os("DIR")
        .map_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/tmp"), Into::into);
    std::fs::create_dir_all(&root).expect("target/tmp");
    let dir = tempfile::tempdir_in(&root).expect("dir");
    let store = Store::open(dir.path()).expect("open");
    let run = store.create_run(RunSpec::new("burst-study")).expect("run");
    let bursting: Vec<Duration> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..AGENTS)
            .map(|agent| {
                let store = &store;
                scope.spawn(move || agent_bursts(store, run, agent))
            })
            .collect();
        threads.into_iter().map(|t| t.join().expect("agent")).collect()
    });
    let atoms = (AGENTS * BURSTS) as f64 * setting("BURST", 100) as f64;
    // The agents burst together: the slowest agent's burst time is the bursts' time.
    let slowest = bursting.iter().max().copied().unwrap_or_default();
    let metrics = store.metrics();
    println!(
        "{:.0} atoms/s inside the bursts ({} snapshots written)",
        atoms / slowest.as_secs_f64(),
        metrics.snapshot_writes
    );
    store.close().expect("close");
}

/// One agent's bursts; returns the time spent inside them.
fn agent_bursts(store: &Store, run: continuum::RunId, agent: usize) -> Duration {
    let name = format!("agent-{agent}");
    let mut transcript = Transcript::new(agent as u64);
    let mut parent = None;
    let mut inside = Duration::ZERO;
    let (atoms, pause) = (setting("BURST", 100), Duration::from_millis(setting("PAUSE_MS", 300)));
    for burst in 0..BURSTS {
        let started = Instant::now();
        for step in 0..atoms {
            let output = AtomOutput { delta: transcript.next_delta(500), result: Vec::new() };
            let parents: Vec<_> = parent.into_iter().collect();
            let key = format!("{burst}-{step}");
            parent = Some(store.record_atom(run, &name, &key, &parents, "", &output).expect("record"));
        }
        inside += started.elapsed();
        std::thread::sleep(pause);
    }
    inside
}
