//! What the lease check costs an atom of a run that is not leased: thread CPU time per
//! `record_atom` and per `begin_atom` + `complete_atom`, on tmpfs (`/dev/shm`, where a sync
//! costs almost nothing, so CPU is what differs), in alternating blocks on three stores: one
//! in which no run was ever leased (the completions hold only the gate), one in which another
//! run holds a lease (each completion takes its run's lease lock and one index lookup), and
//! the leased run itself under `execute_leased` for scale. Each block is a new agent's (an
//! agent's atoms cost more as its history grows). Prints the medians (µs per atom).
//!
//! `cargo run --release --example lease_overhead [rounds] [block]`; `docs/BENCHMARKS.md` §14
//! has the A/B against a build without the check.

use std::path::Path;
use std::time::Duration;

use continuum::{AtomOutput, RunId, RunSpec, Store};

fn thread_cpu_us() -> f64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    now.tv_sec as f64 * 1e6 + now.tv_nsec as f64 / 1e3
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn open(dir: &Path) -> Store {
    Store::builder(dir).background(false).open().expect("open")
}

/// µs of thread CPU per atom for `block` atoms made by `atom(i)`.
fn per_atom(block: u64, mut atom: impl FnMut(u64)) -> f64 {
    let started = thread_cpu_us();
    for i in 0..block {
        atom(i);
    }
    (thread_cpu_us() - started) / block as f64
}

fn main() {
    let mut args = std::env::args().skip(1).map(|arg| arg.parse::<u64>().expect("a number"));
    let rounds = args.next().unwrap_or(30);
    let block = args.next().unwrap_or(2000);
    let root = if Path::new("/dev/shm").is_dir() { Path::new("/dev/shm") } else { Path::new("/tmp") };
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir_in(root).expect("dir")).collect();
    let (never, other, leased) = (open(dirs[0].path()), open(dirs[1].path()), open(dirs[2].path()));
    let run_of = |store: &Store| store.create_run(RunSpec::new("r")).expect("run");
    let (never_run, other_run, leased_run) = (run_of(&never), run_of(&other), run_of(&leased));
    let elsewhere = other.create_run(RunSpec::new("leased elsewhere")).expect("run");
    let _held = other.acquire_lease(elsewhere, "someone", Duration::from_secs(3600)).expect("lease");
    let lease = leased.acquire_lease(leased_run, "me", Duration::from_secs(3600)).expect("lease");
    let output = AtomOutput { result: vec![7; 200], ..AtomOutput::default() };
    let record = |store: &Store, run: RunId, tag: &str, round: u64| {
        per_atom(block, |i| {
            let agent = format!("agent-{round}");
            store.record_atom(run, &agent, &format!("{tag}{round}-{i}"), &[], "", &output).expect("record");
        })
    };
    let begin_complete = |store: &Store, run: RunId, round: u64| {
        per_atom(block, |i| {
            let atom =
                store.begin_atom(run, &format!("agent-{round}"), &format!("b{round}-{i}"), &[], "").expect("begin");
            store.complete_atom(atom, &output).expect("complete");
        })
    };
    let mut figures: [Vec<f64>; 5] = Default::default();
    for round in 0..rounds {
        figures[0].push(record(&never, never_run, "r", round));
        figures[1].push(record(&other, other_run, "r", round));
        figures[2].push(begin_complete(&never, never_run, round));
        figures[3].push(begin_complete(&other, other_run, round));
        // A build without the fence writes no deferred start: it skips this case.
        if std::env::var_os("LEASE_OVERHEAD_NO_LEASED").is_some() {
            figures[4].push(0.0);
            continue;
        }
        figures[4].push(per_atom(block, |i| {
            let key = format!("l{round}-{i}");
            let agent = format!("agent-{round}");
            leased.execute_leased(&lease, &agent, &key, &[], |_| Ok(output.clone())).expect("leased");
        }));
    }
    let [a, b, c, d, e] = figures.map(median);
    println!("thread CPU per atom, median of {rounds} blocks of {block} (µs):");
    println!("  record_atom, no run ever leased:           {a:.3}");
    println!("  record_atom, another run leased:           {b:.3}");
    println!("  begin + complete, no run ever leased:      {c:.3}");
    println!("  begin + complete, another run leased:      {d:.3}");
    println!("  execute_leased on the leased run:          {e:.3}");
}
