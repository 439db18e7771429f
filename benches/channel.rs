//! The durable message round trip against one durable atom, on disk, samples interleaved:
//!
//! - `record_atom`: one atom of an agent, start and completion in one synced batch.
//! - round trip: a producer atom sends one 256-byte message (`execute_with`: its start, then its
//!   completion and the message in one synced batch), and a consumer atom receives it (the same,
//!   with its offset atom in the batch).
//!
//! - two plain `execute`s (no channel): the floor of a round trip of two atoms run that way.
//!
//! Prints the p50s and the round trip's ratio to `record_atom` (goal ≤ 2×) to stderr. `cargo bench --bench channel`;
//! without `--bench` (as `cargo test --benches` runs it) a few samples only.

use std::path::Path;
use std::time::{Duration, Instant};

use continuum::{AtomOutput, RunSpec, Store};

fn p50(samples: &mut [Duration]) -> Duration {
    samples.sort_unstable();
    samples[samples.len() / 2]
}

fn main() {
    let full = std::env::args().any(|arg| arg == "--bench");
    let samples = if full { 2_000 } else { 20 };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/tmp");
    std::fs::create_dir_all(&root).expect("bench dir");
    let dir = tempfile::tempdir_in(&root).expect("dir");
    let store = Store::builder(dir.path())
        .snapshot_policy(continuum::SnapshotPolicy::NEVER)
        .background(false)
        .open()
        .expect("open");
    let run = store.create_run(RunSpec::new("bench")).expect("run");
    let payload = vec![7u8; 256];
    let output = AtomOutput { result: payload.clone(), ..AtomOutput::default() };
    let (mut atoms, mut trips) = (Vec::with_capacity(samples), Vec::with_capacity(samples));
    let mut plain = Vec::with_capacity(samples);
    for i in 0..samples {
        let started = Instant::now();
        store.record_atom(run, "solo", &format!("{i}"), &[], "", &output).expect("record");
        atoms.push(started.elapsed());
        let started = Instant::now();
        store.execute(run, "plain", &format!("{i}"), &[], |_| Ok(output.clone())).expect("execute");
        store.execute(run, "plain", &format!("{i}b"), &[], |_| Ok(output.clone())).expect("execute");
        plain.push(started.elapsed());
        let started = Instant::now();
        store
            .execute_with(run, "producer", &format!("{i}"), &[], |x| {
                x.send("tasks", payload.clone())?;
                Ok(AtomOutput::default())
            })
            .expect("send");
        let received = store
            .execute_with(run, "consumer", &format!("{i}"), &[], |x| {
                let messages = x.receive("tasks", "consumer", 1)?;
                Ok(AtomOutput { result: messages[0].payload.clone(), ..AtomOutput::default() })
            })
            .expect("receive");
        trips.push(started.elapsed());
        assert_eq!(received.executed.output.result, payload);
    }
    let (atom, trip, two) = (p50(&mut atoms), p50(&mut trips), p50(&mut plain));
    eprintln!(
        "==== summary channel: {samples} samples, record_atom p50 {:.1} µs, two `execute` p50 {:.1} µs, \
         round trip p50 {:.1} µs: {:.2}x (goal <= 2x)",
        atom.as_secs_f64() * 1e6,
        two.as_secs_f64() * 1e6,
        trip.as_secs_f64() * 1e6,
        trip.as_secs_f64() / atom.as_secs_f64(),
    );
}
