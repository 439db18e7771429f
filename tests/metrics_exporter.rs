//! Metrics through the `metrics` facade, scraped from a real exporter: with
//! `metrics-exporter-prometheus` installed as the recorder and serving `/metrics` on
//! 127.0.0.1, a log and a store each run a small workload, and one scrape over plain TCP must
//! show their `continuum_*` series with the counts the workload made, each under its own
//! `store` label (two stores in one process never mix their series), agreeing with
//! `metrics()`. Guards against a series that is not emitted, emitted under the wrong name or
//! label, or counted differently from the snapshot. A graceful stop of the store then shows
//! the shutdown series.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use continuum::{AtomOutput, Log, RunSpec, Store};
use metrics_exporter_prometheus::PrometheusBuilder;

const LOG_APPENDS: u64 = 37;
const ATOMS: u64 = 6;

/// The body of one `GET /metrics` over plain TCP.
fn scrape(address: SocketAddr) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut stream = loop {
        match TcpStream::connect(address) {
            Ok(stream) => break stream,
            Err(error) => {
                assert!(Instant::now() < deadline, "the exporter never listened on {address}: {error}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("a read timeout");
    stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").expect("send the request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read the response");
    let (head, body) = response.split_once("\r\n\r\n").expect("a response with a header end");
    assert!(head.starts_with("HTTP/1.") && head.contains(" 200 "), "{head}");
    body.to_owned()
}

/// The value of the one series named `name` whose labels are exactly `labels`, as written.
fn value(text: &str, name: &str, labels: &str) -> f64 {
    let prefix = format!("{name}{{{labels}}} ");
    let found: Vec<&str> = text.lines().filter_map(|line| line.strip_prefix(prefix.as_str())).collect();
    assert_eq!(found.len(), 1, "one line starting {prefix:?} in:\n{text}");
    found[0].trim().parse().unwrap_or_else(|_| panic!("a number after {prefix:?}: {:?}", found[0]))
}

/// `LOG_APPENDS` `Sync` appends to a labelled log, kept open (closing it would sync again).
fn log_workload(dir: &std::path::Path) -> Log {
    let log = Log::builder(dir).metrics_label("exporter-log").open().expect("open the log");
    for i in 0..LOG_APPENDS {
        log.append(&i.to_le_bytes()).expect("a Sync append");
    }
    log
}

/// `ATOMS` atoms and one snapshot in a labelled store, kept open (closing it would write an
/// index snapshot).
fn store_workload(dir: &std::path::Path) -> Store {
    let store = Store::builder(dir).metrics_label("exporter-store").background(false).open().expect("open the store");
    let run = store.create_run(RunSpec::new("exporter")).expect("a run");
    let mut parents = Vec::new();
    for step in 0..ATOMS {
        let delta = continuum::synthetic::Transcript::new(step).next_delta(300);
        let executed = store
            .execute(run, "agent", &format!("s{step}"), &parents, |_| Ok(AtomOutput { delta, result: Vec::new() }));
        parents = vec![executed.expect("an atom").atom];
    }
    store.snapshot_now(parents[0]).expect("a snapshot");
    store
}

#[test]
fn a_prometheus_scrape_shows_each_stores_series() {
    let address = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free local port");
    PrometheusBuilder::new().with_http_listener(address).install().expect("install the exporter");
    let dirs = (tempfile::tempdir().expect("a directory"), tempfile::tempdir().expect("a directory"));
    let (log, store_handle) = (log_workload(dirs.0.path()), store_workload(dirs.1.path()));
    let text = scrape(address);
    let (log, store) = (log.metrics(), store_handle.metrics());

    let of_log = r#"store="exporter-log""#;
    assert_eq!(value(&text, "continuum_records_total", of_log), LOG_APPENDS as f64);
    assert_eq!(value(&text, "continuum_batches_total", of_log), LOG_APPENDS as f64);
    assert_eq!(value(&text, "continuum_record_bytes_total", of_log), log.record_bytes as f64);
    assert_eq!(value(&text, "continuum_fdatasyncs_total", of_log), log.fdatasyncs as f64);
    assert!(log.fdatasyncs >= LOG_APPENDS, "every Sync append syncs: {}", log.fdatasyncs);
    let sync = r#"store="exporter-log",durability="sync""#;
    assert_eq!(value(&text, "continuum_append_seconds_count", sync), LOG_APPENDS as f64);
    let seconds = value(&text, "continuum_append_seconds_sum", sync);
    assert!(seconds > 0.0 && seconds < 60.0, "{LOG_APPENDS} Sync appends took {seconds} s");
    assert!((seconds - log.append_sync_ns.sum as f64 / 1e9).abs() < 1e-6, "{seconds} s against {log:?}");
    assert_eq!(value(&text, "continuum_errors_total", r#"store="exporter-log",kind="io""#), 0.0);

    let of_store = r#"store="exporter-store""#;
    assert_eq!(store.records, 1 + 2 * ATOMS, "a run, then a start and a completion per atom");
    assert_eq!(value(&text, "continuum_records_total", of_store), store.records as f64);
    assert_eq!(value(&text, "continuum_snapshot_writes_total", of_store), 1.0);
    assert_eq!(value(&text, "continuum_index_rebuilds_total", of_store), 1.0);
    assert_eq!(value(&text, "continuum_encoded_raw_bytes_total", of_store), store.encoded_raw_bytes as f64);
    assert!(store.encoded_raw_bytes > 0);
    assert!(value(&text, "continuum_time_to_resume_seconds", of_store) > 0.0);
    assert!(!text.lines().any(|line| line.starts_with("continuum_records_total ")), "an unlabelled series:\n{text}");

    // A graceful stop: its request, its checkpoint of the run, its outcome.
    let stopped = continuum::shutdown::graceful_stop(&store_handle, &Default::default()).expect("a graceful stop");
    assert_eq!(stopped.checkpointed.len(), 1);
    let text = scrape(address);
    assert_eq!(value(&text, "continuum_stop_requests_total", of_store), 1.0);
    assert_eq!(value(&text, "continuum_stop_checkpoints_total", of_store), 1.0);
    let outcome = |outcome: &str| format!(r#"store="exporter-store",outcome="{outcome}""#);
    assert_eq!(value(&text, "continuum_graceful_stops_total", &outcome("completed")), 1.0);
    assert_eq!(value(&text, "continuum_graceful_stops_total", &outcome("over_budget")), 0.0);
}
