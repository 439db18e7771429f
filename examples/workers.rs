//! Several worker processes sharing one store through its server: this process opens the
//! store, creates the runs and serves them on the store's socket; each worker process
//! connects, takes a lease on whichever run is free, executes that run's steps as leased
//! atoms (each adds one to the run's `steps` counter), and releases it. A run's steps are
//! executed once whatever the interleaving: a step another worker completed replays. At the
//! end the server checks every run's counter and prints the figures.
//!
//! `cargo run --release --example workers [workers] [runs] [steps]` (defaults 4, 16, 50).

use std::sync::Arc;
use std::time::{Duration, Instant};

use continuum::serve::Client;
use continuum::shared_state::StateValue;
use continuum::{AtomOutput, Error, RunSpec, Store};

const TTL: Duration = Duration::from_secs(30);

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("worker") {
        worker(&args[2], &args[3], args[4].parse().expect("runs"), args[5].parse().expect("steps"));
        return;
    }
    let number = |at: usize, default: usize| args.get(at).map_or(default, |arg| arg.parse().expect("a number"));
    let (workers, runs, steps) = (number(1, 4), number(2, 16), number(3, 50));
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = Arc::new(Store::open(dir.path()).expect("open"));
    for run in 0..runs {
        store.create_run(RunSpec::new(format!("run-{run}"))).expect("run");
    }
    let server = store.serve(None).expect("serve");
    let socket = server.path().to_str().expect("a UTF-8 path").to_owned();
    let started = Instant::now();
    let children: Vec<_> = (0..workers)
        .map(|id| {
            std::process::Command::new(std::env::current_exe().expect("this example"))
                .args(["worker", &socket, &format!("worker-{id}"), &runs.to_string(), &steps.to_string()])
                .spawn()
                .expect("spawn a worker")
        })
        .collect();
    for mut child in children {
        assert!(child.wait().expect("wait").success(), "a worker failed");
    }
    let elapsed = started.elapsed();
    for run in 0..runs {
        let id = store.run_id(&format!("run-{run}")).expect("run");
        let done = store.read_state(id, "steps").expect("read").map(|versioned| versioned.value);
        assert_eq!(done, Some(StateValue::Counter(steps as i64)), "run-{run}'s steps ran once each");
    }
    server.stop();
    let atoms = runs * steps;
    println!(
        "{workers} workers, {runs} runs x {steps} steps: {atoms} leased atoms in {:.2} s, {:.0} atoms/s, {:.0} us per atom",
        elapsed.as_secs_f64(),
        atoms as f64 / elapsed.as_secs_f64(),
        elapsed.as_secs_f64() * 1e6 / atoms as f64,
    );
}

/// Visits the runs from its own offset, executing every step of each run it can lease,
/// until it finds every run finished.
fn worker(socket: &str, id: &str, runs: usize, steps: usize) {
    let mut client = Client::connect(socket).expect("connect");
    let offset: usize = id.trim_start_matches("worker-").parse().expect("worker number");
    let mut finished = vec![false; runs];
    while finished.iter().any(|done| !done) {
        for at in (0..runs).map(|i| (i + offset) % runs) {
            if finished[at] {
                continue;
            }
            let run = client.run_id(&format!("run-{at}")).expect("run_id").expect("created by the server");
            let lease = match client.acquire_lease(run, id, TTL) {
                Ok(lease) => lease,
                Err(Error::LeaseHeld { .. }) => continue,
                Err(error) => panic!("acquire: {error}"),
            };
            for step in 0..steps {
                client
                    .execute_leased(&lease, "agent", &format!("step-{step}"), &[], |exchange| {
                        exchange.add("steps", 1)?;
                        Ok(AtomOutput { result: format!("{id} did step {step}").into_bytes(), ..AtomOutput::default() })
                    })
                    .expect("leased step");
            }
            client.release_lease(lease).expect("release");
            finished[at] = true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}
