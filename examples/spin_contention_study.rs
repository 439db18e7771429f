//! Group commit on a CPU shared with other work: four threads append 512-byte `Sync` records to
//! a log on the real disk, with waiters spinning (the default `commit_spin`, 1 ms) and with
//! spinning off, alternating, three rounds each, beside `BUSY` threads of other work (default:
//! one more than the cores) and then with none. Prints appends/s and latency percentiles, and
//! how often waiters stopped spinning because a yield came back late. The figures go into
//! `docs/BENCHMARKS.md` §12.
//!
//! `cargo run --release --example spin_contention_study` (`BUSY=0` for an idle machine only)

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use continuum::Log;

const APPENDERS: usize = 4;
const PER_APPENDER: usize = 1_000;

fn main() {
    let cores = std::thread::available_parallelism().map_or(2, usize::from);
    let busy: usize = std::env::var("BUSY").ok().and_then(|v| v.parse().ok()).unwrap_or(cores + 1);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/tmp");
    std::fs::create_dir_all(&root).expect("target/tmp");
    for threads in [busy, 0] {
        if threads == 0 && busy == 0 {
            continue;
        }
        println!("{threads} busy threads beside {APPENDERS} appenders on {cores} cores:");
        let stop = AtomicBool::new(false);
        std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(|| {
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                });
            }
            for round in 0..3 {
                for spin in [Duration::from_millis(1), Duration::ZERO] {
                    println!("  round {round}, {}", trial(&root, spin));
                }
            }
            stop.store(true, Ordering::Relaxed);
        });
    }
}

/// One trial: every appender's `PER_APPENDER` appends, on a fresh log.
fn trial(root: &std::path::Path, spin: Duration) -> String {
    let dir = tempfile::tempdir_in(root).expect("dir");
    let log = Log::builder(dir.path()).commit_spin(spin).open().expect("open");
    let record = vec![7u8; 512];
    let started = Instant::now();
    let mut latencies: Vec<Duration> = std::thread::scope(|scope| {
        let appenders: Vec<_> = (0..APPENDERS)
            .map(|_| {
                let (log, record) = (&log, &record);
                scope.spawn(move || {
                    (0..PER_APPENDER)
                        .map(|_| {
                            let at = Instant::now();
                            log.append(record).expect("append");
                            at.elapsed()
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        appenders.into_iter().flat_map(|appender| appender.join().expect("appender")).collect()
    });
    let elapsed = started.elapsed();
    latencies.sort_unstable();
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e6;
    let metrics = log.metrics();
    format!(
        "spin {:>4} µs: {:>7.0} appends/s, p50 {:>6.0} µs, p99 {:>6.0} µs; spins stopped by a late yield {}, hold-offs {}",
        spin.as_micros(),
        (APPENDERS * PER_APPENDER) as f64 / elapsed.as_secs_f64(),
        at(0.5),
        at(0.99),
        metrics.commit_spin_slow_yields,
        metrics.commit_spin_hold_offs
    )
}
