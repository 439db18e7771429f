//! Optimistic concurrency on shared state against a plain atom, on disk, samples interleaved:
//!
//! - plain: `execute` of an atom (its start, then its synced completion).
//! - OCC: `execute_with` of the same atom that reads a key and puts it back changed (its start,
//!   then its completion and the key's new version in one synced batch, after the version
//!   check under the key's lock). No other writer: no conflict.
//!
//! Then throughput under conflict: the same OCC atom, where another agent writes the key
//! between the atom's read and its commit in 10 % (then 50 %) of the atoms, so the commit is
//! refused and `execute_retrying` runs the atom again. Committed atoms per second of the
//! contended agent, the other agent's writes excluded from the time.
//!
//! `cargo bench --bench shared_state` (`CONTINUUM_BENCH_DIR=/dev/shm` for the CPU cost alone); without `--bench` (as `cargo test --benches` runs it) a
//! few samples only. Prints to stderr.

use std::path::Path;
use std::time::{Duration, Instant};

use continuum::{AtomOutput, RunId, RunSpec, Store};

fn p50(samples: &mut [Duration]) -> Duration {
    samples.sort_unstable();
    samples[samples.len() / 2]
}

/// An OCC atom `key` of `agent` on state key `state`: read, put back incremented.
fn occ_atom(store: &Store, run: RunId, (agent, key): (&str, &str), state: &str, interfere: bool) -> Duration {
    let mut first = true;
    let mut interfering = Duration::ZERO;
    store
        .execute_retrying(run, agent, key, &[], 10, |exchange| {
            let version = exchange.read(state)?.map_or(0, |read| read.version);
            if std::mem::take(&mut first) && interfere {
                let started = Instant::now();
                store
                    .execute_with(run, "other", &format!("{key}-other"), &[], |other| {
                        other.put(state, b"theirs".to_vec())?;
                        Ok(AtomOutput::default())
                    })
                    .expect("interfering write");
                interfering = started.elapsed();
            }
            exchange.put(state, version.to_le_bytes().to_vec())?;
            Ok(AtomOutput { result: vec![7; 256], ..AtomOutput::default() })
        })
        .expect("occ atom");
    interfering
}

fn main() {
    let full = std::env::args().any(|arg| arg == "--bench");
    let samples = if full { 2_000 } else { 20 };
    // CONTINUUM_BENCH_DIR=/dev/shm measures the CPU cost alone (a tmpfs syncs at once).
    let root = std::env::var_os("CONTINUUM_BENCH_DIR")
        .map_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/tmp"), std::path::PathBuf::from);
    std::fs::create_dir_all(&root).expect("bench dir");
    let dir = tempfile::tempdir_in(&root).expect("dir");
    let store = Store::builder(dir.path())
        .snapshot_policy(continuum::SnapshotPolicy::NEVER)
        .background(false)
        .open()
        .expect("open");
    let run = store.create_run(RunSpec::new("bench")).expect("run");
    let output = AtomOutput { result: vec![7; 256], ..AtomOutput::default() };
    let (mut plain, mut occ) = (Vec::with_capacity(samples), Vec::with_capacity(samples));
    let (mut empty, mut blind) = (Vec::with_capacity(samples), Vec::with_capacity(samples));
    for i in 0..samples {
        let started = Instant::now();
        store.execute(run, "plain", &format!("{i}"), &[], |_| Ok(output.clone())).expect("execute");
        plain.push(started.elapsed());
        let started = Instant::now();
        occ_atom(&store, run, ("occ", &format!("{i}")), "k", false);
        occ.push(started.elapsed());
        let started = Instant::now();
        store.execute_with(run, "empty", &format!("{i}"), &[], |_| Ok(output.clone())).expect("execute_with");
        empty.push(started.elapsed());
        let started = Instant::now();
        store
            .execute_with(run, "blind", &format!("{i}"), &[], |exchange| {
                exchange.put("b", vec![1; 8])?;
                Ok(output.clone())
            })
            .expect("blind put");
        blind.push(started.elapsed());
    }
    let (plain, occ, empty, blind) = (p50(&mut plain), p50(&mut occ), p50(&mut empty), p50(&mut blind));
    eprintln!(
        "shared_state parts: execute_with without state p50 {:.1} µs, blind put p50 {:.1} µs",
        empty.as_secs_f64() * 1e6,
        blind.as_secs_f64() * 1e6
    );
    let mut rates = Vec::new();
    for percent in [0u64, 10, 50] {
        let started = Instant::now();
        let mut excluded = Duration::ZERO;
        for i in 0..samples as u64 {
            let interfere = (i * percent) % 100 + percent > 99 && percent > 0;
            let key = format!("{percent}-{i}");
            excluded += occ_atom(&store, run, ("contended", &key), &format!("c{percent}"), interfere);
        }
        let elapsed = started.elapsed().saturating_sub(excluded);
        rates.push((percent, samples as f64 / elapsed.as_secs_f64()));
    }
    let rates: Vec<String> = rates.iter().map(|(percent, rate)| format!("{percent} %: {rate:.0}/s")).collect();
    eprintln!(
        "==== summary shared_state: {samples} samples, plain execute p50 {:.1} µs, OCC read+put p50 {:.1} µs: \
         {:.3}x (goal <= 1.1x); committed OCC atoms/s by conflict rate: {}",
        plain.as_secs_f64() * 1e6,
        occ.as_secs_f64() * 1e6,
        occ.as_secs_f64() / plain.as_secs_f64(),
        rates.join(", "),
    );
}
