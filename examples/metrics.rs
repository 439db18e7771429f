//! Exporting continuum's metrics: runs a small agent workload (four agents executing atoms
//! concurrently) and prints `store.metrics()` once a second, then the whole snapshot in the
//! Prometheus text format.
//!
//! ```sh
//! cargo run --release --example metrics            # 3 seconds of workload
//! cargo run --release --example metrics -- 10      # 10 seconds
//! ```
//!
//! A service would do the same from its own timer: call `metrics()` (a handful of atomic
//! loads) and serve `to_prometheus()` on its `/metrics` endpoint, or copy the plain fields of
//! `MetricsSnapshot` into whatever metrics library it uses. There is no global registry: each
//! store has its own metrics, so two stores in one process never mix their counters.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use continuum::synthetic::Transcript;
use continuum::{AtomOutput, MetricsSnapshot, RunSpec, Store};

const AGENTS: usize = 4;

fn main() -> continuum::Result<()> {
    let seconds: u64 = std::env::args().nth(1).and_then(|arg| arg.parse().ok()).unwrap_or(3);
    let dir = tempfile::tempdir().map_err(|e| continuum::Error::InvalidConfig { reason: e.to_string() })?;
    let store = Arc::new(Store::open(dir.path())?);
    let run = store.create_run(RunSpec::new("metrics-demo"))?;
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..AGENTS)
        .map(|agent| {
            let (store, stop) = (Arc::clone(&store), Arc::clone(&stop));
            std::thread::spawn(move || -> continuum::Result<()> {
                let name = format!("agent-{agent}");
                let mut parents = Vec::new();
                let mut step = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let executed = store.execute(run, &name, &format!("step-{step}"), &parents, |_| {
                        Ok(AtomOutput { delta: Transcript::new(step).next_delta(500), result: Vec::new() })
                    })?;
                    if step % 100 == 99 {
                        store.snapshot_now(executed.atom)?;
                    }
                    parents = vec![executed.atom];
                    step += 1;
                }
                Ok(())
            })
        })
        .collect();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(seconds) {
        std::thread::sleep(Duration::from_secs(1));
        println!("{}", one_line(&store.metrics()));
    }
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.join().map_err(|_| continuum::Error::Closed)??;
    }
    println!("\n# the whole snapshot, in the Prometheus text format:");
    print!("{}", store.metrics().to_prometheus());
    Ok(())
}

/// The figures an operator looks at first.
fn one_line(m: &MetricsSnapshot) -> String {
    let us = |ns: u64| ns as f64 / 1000.0;
    format!(
        "appends {} ({} bytes) in {} groups | fdatasync {} p50 {:.0} us p99 {:.0} us max {:.0} us | \
         Sync append p50 {:.0} us p99 {:.0} us | compression {:.2} | snapshots {} | errors {}",
        m.records,
        m.record_bytes,
        m.groups,
        m.fdatasyncs,
        us(m.fdatasync_ns.p50),
        us(m.fdatasync_ns.p99),
        us(m.fdatasync_ns.max),
        us(m.append_sync_ns.p50),
        us(m.append_sync_ns.p99),
        m.compression_ratio().unwrap_or(1.0),
        m.snapshot_writes,
        m.errors.iter().sum::<u64>()
    )
}
