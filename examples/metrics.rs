//! Exporting continuum's metrics with a real exporter: installs `metrics-exporter-prometheus`
//! as the application's `metrics` recorder, serving `/metrics` on 127.0.0.1, runs a small
//! agent workload (four agents executing atoms concurrently) while printing `store.metrics()`
//! once a second, then scrapes its own endpoint once and prints the continuum series.
//!
//! ```sh
//! cargo run --release --example metrics            # 3 seconds of workload
//! cargo run --release --example metrics -- 10      # 10 seconds
//! ```
//!
//! continuum emits through the `metrics` facade, so any recorder works the same way (StatsD,
//! OpenTelemetry, ...). Install it before opening the store: a store registers its series when
//! it opens. `.metrics_label("name")` puts `store="name"` on every series of that store.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use continuum::synthetic::Transcript;
use continuum::{AtomOutput, MetricsSnapshot, RunSpec, Store};
use metrics_exporter_prometheus::PrometheusBuilder;

const AGENTS: usize = 4;

type Failure = Box<dyn std::error::Error>;

fn main() -> Result<(), Failure> {
    let seconds: u64 = std::env::args().nth(1).and_then(|arg| arg.parse().ok()).unwrap_or(3);
    let address = free_local_address()?;
    PrometheusBuilder::new().with_http_listener(address).install()?;
    println!("serving http://{address}/metrics");
    let dir = tempfile::tempdir()?;
    let store = Arc::new(Store::builder(dir.path()).metrics_label("demo").open()?);
    run_workload(&store, Duration::from_secs(seconds))?;
    println!("\n# GET /metrics, the continuum series:");
    for line in scrape(address)?.lines().filter(|line| line.contains("continuum_")) {
        println!("{line}");
    }
    Ok(())
}

/// An address on 127.0.0.1 with a port free a moment ago.
fn free_local_address() -> std::io::Result<SocketAddr> {
    TcpListener::bind("127.0.0.1:0")?.local_addr()
}

/// Four agents executing atoms (a snapshot every 100) for `duration`; prints the figures an
/// operator looks at first once a second.
fn run_workload(store: &Arc<Store>, duration: Duration) -> continuum::Result<()> {
    let run = store.create_run(RunSpec::new("metrics-demo"))?;
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..AGENTS)
        .map(|agent| {
            let (store, stop) = (Arc::clone(store), Arc::clone(&stop));
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
    while started.elapsed() < duration {
        std::thread::sleep(Duration::from_secs(1));
        println!("{}", one_line(&store.metrics()));
    }
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.join().map_err(|_| continuum::Error::Closed)??;
    }
    Ok(())
}

/// The body of one `GET /metrics` over plain TCP (HTTP/1.0: the server closes when done).
fn scrape(address: SocketAddr) -> Result<String, Failure> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut stream = loop {
        match TcpStream::connect(address) {
            Ok(stream) => break stream,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(error) => return Err(error.into()),
        }
    };
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").ok_or("a response without a header end")?;
    if !head.starts_with("HTTP/1.") || !head.contains(" 200 ") {
        return Err(format!("unexpected response: {head}").into());
    }
    Ok(body.to_owned())
}

/// The figures an operator looks at first.
fn one_line(m: &MetricsSnapshot) -> String {
    let us = |ns: u64| ns as f64 / 1000.0;
    format!(
        "appends {} ({} bytes) in {} groups | fdatasync {} mean {:.0} us max {:.0} us | \
         Sync append mean {:.0} us max {:.0} us | compression {:.2} | snapshots {} | errors {}",
        m.records,
        m.record_bytes,
        m.groups,
        m.fdatasyncs,
        us(m.fdatasync_ns.mean()),
        us(m.fdatasync_ns.max),
        us(m.append_sync_ns.mean()),
        us(m.append_sync_ns.max),
        m.compression_ratio().unwrap_or(1.0),
        m.snapshot_writes,
        m.errors.iter().sum::<u64>()
    )
}
