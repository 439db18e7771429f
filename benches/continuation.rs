//! Benchmarks of finding suspended work: a store of 10,000 runs, 1,000 of them suspended (two
//! levels, two pending requests each, a third with one decided; every tenth on a timer), and
//! 1,000 more suspended and resumed.
//!
//! - `continuation/suspended_runs/all`: every suspended run with its pending requests,
//!   decisions and tree (a dashboard's page of everything); goal ≤ 50 ms.
//! - `continuation/suspended_runs/approval_oldest_50`: the 50 oldest waiting for approval.
//! - `continuation/due`: the timers due now.
//! - stderr: the open of that store (which rebuilds the table of suspended runs from the
//!   control atoms) and the time to build it.
//!
//! Built on tmpfs (`/dev/shm`) when there is one: the listing reads memory only, and creating
//! 10,000 runs on a disk costs 10,000 `fdatasync`s. `cargo bench --bench continuation`.

use std::path::Path;
use std::time::Instant;

use continuum::continuation::{Continuation, ContinuationLevel, Decision, ReasonKind, SuspendReason, SuspendedFilter};
use continuum::{AtomOutput, RunSpec, Store};
use criterion::Criterion;

const RUNS: usize = 10_000;
const SUSPENDED: usize = 1_000;

fn open(dir: &Path) -> Store {
    Store::builder(dir).snapshot_policy(continuum::SnapshotPolicy::NEVER).background(false).open().expect("open")
}

/// Fills `dir`: every run has a turn of its agent; runs `0..SUSPENDED` stay suspended, the
/// next `SUSPENDED` were suspended and resumed.
fn fill(dir: &Path) {
    let store = open(dir);
    let output = AtomOutput { result: b"turn".to_vec(), ..AtomOutput::default() };
    for i in 0..RUNS {
        let run = store.create_run(RunSpec::new(format!("run-{i:05}"))).expect("run");
        let head = store.record_atom(run, "account", "turn-1", &[], "", &output).expect("atom");
        if i >= 2 * SUSPENDED {
            continue;
        }
        let reason =
            if i % 10 == 9 { SuspendReason::Timer { resume_at_unix_us: i as u64 } } else { SuspendReason::Approval };
        let tree = ContinuationLevel::new("hr").child(
            ContinuationLevel::new("account")
                .head(head)
                .request(format!("auth-{i}"), "authorize_account", r#"{"user":"ada","role":"admin"}"#)
                .request(format!("vpn-{i}"), "grant_vpn", r#"{"user":"ada"}"#),
        );
        store.suspend(run, &Continuation::new(reason, tree)).expect("suspend");
        if i % 3 == 0 || i >= SUSPENDED {
            store.decide(run, &format!("auth-{i}"), &Decision::approve("it-lead")).expect("decide");
        }
        if i >= SUSPENDED {
            store.decide(run, &format!("vpn-{i}"), &Decision::reject("it-lead")).expect("decide");
            store.resume_suspended(run).expect("resume");
        }
    }
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    let shm = Path::new("/dev/shm");
    let root = if shm.is_dir() { shm.to_path_buf() } else { Path::new(env!("CARGO_MANIFEST_DIR")).join("target/tmp") };
    std::fs::create_dir_all(&root).expect("bench dir");
    let dir = tempfile::tempdir_in(&root).expect("dir");
    let started = Instant::now();
    fill(dir.path());
    let filled = started.elapsed();
    let started = Instant::now();
    let store = open(dir.path());
    let opened = started.elapsed();
    assert_eq!(store.suspended_runs(&SuspendedFilter::default()).len(), SUSPENDED);
    let mut group = criterion.benchmark_group("continuation");
    group.sample_size(20);
    group.bench_function("suspended_runs/all", |b| b.iter(|| store.suspended_runs(&SuspendedFilter::default())));
    let oldest = SuspendedFilter { reason: Some(ReasonKind::Approval), limit: Some(50), ..SuspendedFilter::default() };
    group.bench_function("suspended_runs/approval_oldest_50", |b| b.iter(|| store.suspended_runs(&oldest)));
    group.bench_function("due", |b| b.iter(|| store.due(u64::MAX)));
    group.finish();
    let started = Instant::now();
    let listed = store.suspended_runs(&SuspendedFilter::default());
    let once = started.elapsed();
    let pending: usize = listed.iter().map(|run| run.pending.len()).sum();
    eprintln!(
        "continuation: {RUNS} runs, {} suspended ({pending} pending requests): listed in {:.2} ms once; \
         store built in {:.1} s, opened (table rebuilt) in {:.1} ms",
        listed.len(),
        once.as_secs_f64() * 1e3,
        filled.as_secs_f64(),
        opened.as_secs_f64() * 1e3,
    );
}
