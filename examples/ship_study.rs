//! Object storage figures (`docs/BENCHMARKS.md` §17): the foreground cost of shipping (W1 and
//! W2 with shipping on, against off, in alternating pairs) and the time to restore a shipped
//! store on another directory (a 10,000-atom run; a large store against its local reopen).
//!
//! Against the server in `CONTINUUM_S3_ENDPOINT` / `CONTINUUM_S3_BUCKET` (start one with
//! `eval "$(scripts/s3-server.sh start target/s3-server)"`), else `object_store`'s in-memory
//! backend, and says which.
//!
//! `cargo run --release --features object-store --example ship_study [BIG_ATOMS] [PAIRS] [TEXT_ATOMS]`

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use continuum::codec::proto::{ChatMessage, Delta};
use continuum::ship::Remote;
use continuum::{AtomOutput, Durability, RunSpec, Store};

fn main() -> continuum::Result<()> {
    let mut args = std::env::args().skip(1);
    let big: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1_000_000);
    let pairs: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(3);
    let text: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(300_000);
    let (remote, server) = remote("study");
    println!("object store: {server}");
    let output = Arc::new(output());

    println!("\n== foreground: shipping on (tail every 1 s, 4 MiB segments) against off, {pairs} alternating pairs");
    let (mut w1_ratio, mut w2_ratio) = (Vec::new(), Vec::new());
    for pair in 0..pairs {
        let (on_w1, on_w2) = workload(Some(remote_for(&remote, &format!("w-{pair}"))), &output)?;
        let (off_w1, off_w2) = workload(None, &output)?;
        println!(
            "pair {pair}: W1 p50 on {on_w1:?} off {off_w1:?} (ratio off/on {:.3}); W2 on {on_w2:.0} off {off_w2:.0} atoms/s (on/off {:.3})",
            off_w1.as_secs_f64() / on_w1.as_secs_f64(),
            on_w2 / off_w2
        );
        w1_ratio.push(off_w1.as_secs_f64() / on_w1.as_secs_f64());
        w2_ratio.push(on_w2 / off_w2);
    }
    println!("W1 throughput on/off: {}; W2 on/off: {}", list(&w1_ratio), list(&w2_ratio));

    println!("\n== restore of a 10,000-atom run");
    let run_remote = remote_for(&remote, "run10k");
    let restore = restore_after(&run_remote, 10_000, 1, &|_| (*output).clone())?;
    println!("restore of 10,000 atoms: {:.3} s ({})", restore.0.as_secs_f64(), restore.1);

    println!("\n== restore of a {big}-atom store against its local reopen");
    let big_remote = remote_for(&remote, "big");
    let (restored, local) = restore_and_reopen(&big_remote, big, &|_| (*output).clone())?;
    println!(
        "{big} atoms: restore {:.2} s, local reopen {:.2} s: restore / reopen {:.2}x",
        restored.as_secs_f64(),
        local.as_secs_f64(),
        restored.as_secs_f64() / local.as_secs_f64()
    );

    println!("\n== restore of a {text}-atom store of varied text (~1 KB a step) against its local reopen");
    let text_remote = remote_for(&remote, "text");
    let (restored, local) = restore_and_reopen(&text_remote, text, &text_output)?;
    println!(
        "{text} atoms of text: restore {:.2} s, local reopen {:.2} s: restore / reopen {:.2}x",
        restored.as_secs_f64(),
        local.as_secs_f64(),
        restored.as_secs_f64() / local.as_secs_f64()
    );
    Ok(())
}

/// W1 (one thread, 1,000 durable `record_atom`s: p50 latency) and W2 (16 threads × 150 durable
/// atoms: atoms/s) on a fresh store, shipping to `remote` if given.
fn workload(remote: Option<Remote>, output: &Arc<AtomOutput>) -> continuum::Result<(Duration, f64)> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut builder = Store::builder(dir.path()).segment_bytes(4 << 20);
    if let Some(remote) = remote {
        builder = builder.ship_to(remote.ship_interval(Some(Duration::from_secs(1))));
    }
    let store = Arc::new(builder.open()?);
    let run = store.create_run(RunSpec::new("w"))?;
    let mut latencies = Vec::with_capacity(1_000);
    for i in 0..1_000 {
        let started = Instant::now();
        store.record_atom(run, "w1", &format!("k{i}"), &[], "", output)?;
        latencies.push(started.elapsed());
    }
    latencies.sort_unstable();
    let started = Instant::now();
    std::thread::scope(|scope| {
        for t in 0..16 {
            let (store, output) = (Arc::clone(&store), Arc::clone(output));
            scope.spawn(move || {
                for i in 0..150 {
                    store.record_atom(run, &format!("w2-{t}"), &format!("k{i}"), &[], "", &output).expect("atom");
                }
            });
        }
    });
    let w2 = 2_400.0 / started.elapsed().as_secs_f64();
    Ok((latencies[latencies.len() / 2], w2))
}

/// Writes `atoms` atoms in `runs` runs, ships them (tail included), restores into a fresh
/// directory: the restore's time.
fn restore_after(
    remote: &Remote,
    atoms: usize,
    runs: usize,
    output: &Outputs<'_>,
) -> continuum::Result<(Duration, String)> {
    let source = tempfile::tempdir().expect("a temporary directory");
    {
        let store = Store::builder(source.path())
            .atom_durability(Durability::Buffered)
            .ship_to(remote.clone().ship_interval(Some(Duration::from_secs(3600))))
            .open()?;
        fill(&store, atoms, runs, output)?;
        store.sync()?;
        store.ship_now()?;
    }
    let target = tempfile::tempdir().expect("a temporary directory");
    let started = Instant::now();
    let (store, report) = Store::restore_from(remote.clone().owner("restorer"), target.path())?;
    let took = started.elapsed();
    assert!(store.run_id("run-0").is_some());
    Ok((took, format!("{} segments, tail {}, {} bytes", report.segments, report.tail, report.bytes)))
}

/// A store of `atoms` atoms shipped, then: its restore's time, and its local reopen's.
fn restore_and_reopen(remote: &Remote, atoms: usize, output: &Outputs<'_>) -> continuum::Result<(Duration, Duration)> {
    let source = tempfile::tempdir().expect("a temporary directory");
    {
        let store = Store::builder(source.path())
            .atom_durability(Durability::Buffered)
            .ship_to(remote.clone().ship_interval(Some(Duration::from_secs(3600))))
            .open()?;
        fill(&store, atoms, 100, output)?;
        store.sync()?;
        store.ship_now()?;
        store.close()?;
    }
    let log_bytes: u64 = std::fs::read_dir(source.path())
        .expect("the store directory")
        .filter_map(|entry| entry.ok())
        .filter(|entry| entry.file_name().to_string_lossy().ends_with(".seg"))
        .map(|entry| entry.metadata().map_or(0, |meta| meta.len()))
        .sum();
    let started = Instant::now();
    drop(Store::open(source.path())?);
    let local = started.elapsed();
    // The same store's open without its index snapshot: the whole log folded, as a restore's is.
    std::fs::remove_file(source.path().join("index.snapshot")).expect("an index snapshot");
    let started = Instant::now();
    drop(Store::builder(source.path()).index_snapshot_after(u64::MAX).open()?);
    println!("  local reopen folding the whole log (no index snapshot): {:.2} s", started.elapsed().as_secs_f64());
    let target = tempfile::tempdir().expect("a temporary directory");
    let started = Instant::now();
    let (store, report) = Store::restore_from(remote.clone().owner("restorer"), target.path())?;
    let restored = started.elapsed();
    println!(
        "  restored {} segments: {} bytes downloaded for {} bytes of log ({:.1}x); takeover and downloads {:.2} s ({:.0} MB/s downloaded), open {:.2} s from index snapshot {:?} (opened from {:?})",
        report.segments,
        report.bytes,
        log_bytes,
        log_bytes as f64 / report.bytes as f64,
        report.downloaded_in.as_secs_f64(),
        report.bytes as f64 / 1e6 / report.downloaded_in.as_secs_f64(),
        (report.took - report.downloaded_in).as_secs_f64(),
        report.index_snapshot,
        store.index_snapshot().opened_from,
    );
    drop(store);
    Ok((restored, local))
}

/// The output of the atom numbered `i`.
type Outputs<'a> = dyn Fn(usize) -> AtomOutput + Sync + 'a;

fn fill(store: &Store, atoms: usize, runs: usize, output: &Outputs<'_>) -> continuum::Result<()> {
    let ids: Vec<_> =
        (0..runs).map(|r| store.create_run(RunSpec::new(format!("run-{r}")))).collect::<Result<_, _>>()?;
    std::thread::scope(|scope| {
        let per = atoms / 4;
        for t in 0..4 {
            let ids = &ids;
            scope.spawn(move || {
                for i in 0..per {
                    let run = ids[(t * per + i) % ids.len()];
                    let output = output(t * per + i);
                    store.record_atom(run, &format!("agent-{t}"), &format!("k{i}"), &[], "", &output).expect("atom");
                }
            });
        }
    });
    Ok(())
}

fn output() -> AtomOutput {
    let message = ChatMessage { role: "assistant".into(), content: "x".repeat(200), tool_call: None };
    AtomOutput { delta: Delta { messages: vec![message], ..Delta::default() }, result: b"ok".to_vec() }
}

/// A step of varied text: 30 to 330 words (~1 KB) drawn from 3,000 made-up words, skewed
/// towards the frequent ones as a language is; no two steps alike.
fn text_output(i: usize) -> AtomOutput {
    static WORDS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    let words = WORDS.get_or_init(|| {
        (0..3_000u64)
            .map(|w| {
                let mut x = w.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                (0..3 + w % 7)
                    .map(|_| {
                        x ^= x >> 13;
                        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
                        char::from(b'a' + (x % 26) as u8)
                    })
                    .collect()
            })
            .collect()
    });
    let mut seed = (i as u64).wrapping_mul(0x2545_F491_4F6C_DD1D) | 1;
    let count = 30 + (i * 7_919) % 300;
    let text: Vec<&str> = (0..count)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let r = (seed % 3_000) as usize;
            words[r * r / 3_000].as_str()
        })
        .collect();
    let message = ChatMessage { role: "assistant".into(), content: text.join(" "), tool_call: None };
    AtomOutput { delta: Delta { messages: vec![message], ..Delta::default() }, result: b"ok".to_vec() }
}

fn remote(name: &str) -> (Remote, String) {
    match (std::env::var("CONTINUUM_S3_ENDPOINT"), std::env::var("CONTINUUM_S3_BUCKET")) {
        (Ok(endpoint), Ok(bucket)) => {
            let remote = Remote::s3(&endpoint, &bucket, name, "", "").expect("an S3 remote");
            (remote, format!("S3 at {endpoint}, bucket {bucket}"))
        }
        _ => (Remote::in_memory(name), "in memory (no CONTINUUM_S3_ENDPOINT)".into()),
    }
}

/// `remote`'s object store under a prefix of its own.
fn remote_for(remote: &Remote, name: &str) -> Remote {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    Remote::new(Arc::clone(remote.object_store()), &format!("{}/{name}-{nanos}", remote.prefix()))
}

fn list(values: &[f64]) -> String {
    values.iter().map(|v| format!("{v:.3}")).collect::<Vec<_>>().join(" / ")
}
