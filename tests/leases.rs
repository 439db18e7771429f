//! Leases with fencing tokens (`docs/ARCHITECTURE.md`, "Leases"): one holder of a run at a
//! time, tokens that only grow (across crashes too), a killed holder's lease passing on after
//! its time, and the fence: a completion under a stale token, or without the token of a live
//! lease, is refused and writes nothing of the atom's end. Guards against two workers both running a
//! run's steps, and against a worker that lost its lease (paused, partitioned, killed and
//! restarted) writing over its successor.

use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use continuum::storage::sim::{CrashDamage, SimStorage};
use continuum::{AtomFailure, AtomOutput, AtomStatus, Error, Lease, RunId, RunSpec, Store};

const CHILD_ENV: &str = "CONTINUUM_LEASES_CHILD_DIR";
const LONG: Duration = Duration::from_secs(60);

fn output(text: &str) -> AtomOutput {
    AtomOutput { result: text.as_bytes().to_vec(), ..AtomOutput::default() }
}

/// Waits (without asserting on time) until `lease` has expired by the wall clock.
fn wait_until_expired(lease: &Lease) {
    while continuum_now_us() <= lease.expires_at_unix_us {
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn continuum_now_us() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock after 1970");
    u64::try_from(since.as_micros()).expect("microseconds fit")
}

#[test]
fn two_workers_racing_for_one_run_hold_it_one_at_a_time_with_growing_tokens() {
    const GRANTS: u64 = 1000;
    let dir = tempfile::tempdir().expect("dir");
    let store = Arc::new(Store::open(dir.path()).expect("open"));
    let run = store.create_run(RunSpec::new("contended")).expect("run");
    let granted = Arc::new(AtomicU64::new(0));
    let holders = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> = ["w1", "w2"]
        .into_iter()
        .map(|name| {
            let (store, granted, holders, tokens) =
                (Arc::clone(&store), Arc::clone(&granted), Arc::clone(&holders), Arc::clone(&tokens));
            std::thread::spawn(move || {
                while granted.load(Ordering::SeqCst) < GRANTS {
                    let lease = match store.acquire_lease(run, name, LONG) {
                        Ok(lease) => lease,
                        Err(Error::LeaseHeld { .. }) => {
                            std::thread::yield_now();
                            continue;
                        }
                        Err(error) => panic!("acquire: {error}"),
                    };
                    assert_eq!(holders.fetch_add(1, Ordering::SeqCst), 0, "two holders at once");
                    let n = granted.fetch_add(1, Ordering::SeqCst);
                    {
                        let mut tokens = tokens.lock().expect("tokens");
                        assert!(tokens.last().is_none_or(|last| *last < lease.token), "tokens grow");
                        tokens.push(lease.token);
                    }
                    if n % 100 == 0 {
                        let key = format!("step-{n}");
                        store.execute_leased(&lease, name, &key, &[], |_| Ok(output(name))).expect("leased step");
                    }
                    assert_eq!(holders.fetch_sub(1, Ordering::SeqCst), 1, "two holders at once");
                    store.release_lease(lease).expect("release");
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().expect("worker");
    }
    let tokens = tokens.lock().expect("tokens");
    assert!(tokens.len() as u64 >= GRANTS);
    assert!(tokens.windows(2).all(|pair| pair[0] < pair[1]));
    assert_eq!(store.lease_of(run).expect("lease_of"), None, "every lease was released");
}

/// The child: takes and releases two leases, then takes a short one and reports it, and
/// waits to be killed.
#[test]
fn lease_holder_child() {
    let Ok(dir) = std::env::var(CHILD_ENV) else { return };
    let store = Store::open(&dir).expect("child open");
    let run = store.create_run(RunSpec::new("handed-over")).expect("run");
    for _ in 0..2 {
        let lease = store.acquire_lease(run, "child", LONG).expect("child lease");
        store.release_lease(lease).expect("child release");
    }
    let lease = store.acquire_lease(run, "child", Duration::from_secs(5)).expect("child lease");
    store.execute_leased(&lease, "agent", "step-1", &[], |_| Ok(output("child"))).expect("child step");
    // On a line of its own: the test harness prints the test's name before its output.
    println!("\nLEASED {} {}", lease.token, lease.expires_at_unix_us);
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[test]
fn a_killed_holder_s_lease_passes_on_after_its_time_with_a_greater_token() {
    let dir = tempfile::tempdir().expect("dir");
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "lease_holder_child", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child");
    let stdout = std::io::BufReader::new(child.stdout.take().expect("piped stdout"));
    let line = stdout.lines().map_while(Result::ok).find(|line| line.starts_with("LEASED "));
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
    let line = line.expect("the child reported its lease");
    let fields: Vec<u64> = line.split(' ').skip(1).map(|field| field.parse().expect("number")).collect();
    let (token, expires_at_unix_us) = (fields[0], fields[1]);
    assert_eq!(token, 3, "the child's third grant");

    let store = Store::open(dir.path()).expect("open after SIGKILL");
    let run = store.run_id("handed-over").expect("run");
    let killed = Lease { run, holder: "child".into(), token, expires_at_unix_us };
    if continuum_now_us() < expires_at_unix_us {
        match store.acquire_lease(run, "parent", LONG) {
            Err(Error::LeaseHeld { holder, token: held, expires_at_unix_us: until, .. }) => {
                assert_eq!((holder.as_str(), held, until), ("child", token, expires_at_unix_us));
            }
            // The clock passed the expiry between the check and the call.
            other => assert!(continuum_now_us() >= expires_at_unix_us, "{other:?}"),
        }
        let refused = store.record_atom(run, "agent", "step-2", &[], "", &output("parent"));
        assert!(matches!(refused, Err(Error::LeaseHeld { .. })) || continuum_now_us() >= expires_at_unix_us);
    }
    wait_until_expired(&killed);
    let lease = store.acquire_lease(run, "parent", LONG).expect("the lease passed on");
    assert!(lease.token > token, "{} after {token}", lease.token);
    let step = store.atom_by_key(run, "agent", "step-1").expect("lookup").expect("the child's step");
    assert_eq!(store.atom(step).expect("atom").output, Some(output("child")));
}

#[test]
fn a_stale_token_s_completion_is_refused_and_writes_no_end() {
    let dir = tempfile::tempdir().expect("dir");
    let store = Store::open(dir.path()).expect("open");
    let run = store.create_run(RunSpec::new("fenced")).expect("run");
    let a = store.acquire_lease(run, "a", Duration::from_millis(200)).expect("a's lease");
    let mut b = None;
    let refused = store.execute_leased(&a, "agent", "a-step", &[], |exchange| {
        exchange.send("out", b"from a".to_vec()).expect("send");
        // A pauses past its lease, and B takes the run meanwhile.
        wait_until_expired(&a);
        b = Some(store.acquire_lease(run, "b", LONG).expect("b's lease"));
        Ok(output("a"))
    });
    let b = b.expect("b acquired");
    assert_eq!(b.token, a.token + 1);
    match refused {
        Err(Error::OutputNotRecorded { output: kept, source, .. }) => {
            assert_eq!(*kept, output("a"), "the work's output goes back unrecorded");
            assert!(
                matches!(*source, Error::StaleLease { token, current, .. } if token == a.token && current == b.token),
                "{source:?}"
            );
        }
        other => panic!("a's completion landed: {other:?}"),
    }
    assert!(matches!(store.renew_lease(&a, LONG), Err(Error::StaleLease { .. })));
    assert!(matches!(store.release_lease(a.clone()), Err(Error::StaleLease { .. })));
    let refused = store.execute_leased(&a, "agent", "a-step-2", &[], |_| panic!("a stale lease begins nothing"));
    assert!(matches!(refused, Err(Error::StaleLease { .. })), "{refused:?}");
    store.execute_leased(&b, "agent", "b-step", &[], |_| Ok(output("b"))).expect("b's step");
    drop(store);

    let store = Store::open(dir.path()).expect("reopen");
    // A's step began (its start is in the log, so work inside it could use guards) and never
    // ended; a stale lease began nothing more.
    let a_step = store.atom_by_key(run, "agent", "a-step").expect("lookup").expect("a's start");
    assert_eq!(store.atom(a_step).expect("atom").status, continuum::AtomStatus::Running, "a's end is not in the log");
    assert_eq!(store.atom_by_key(run, "agent", "a-step-2").expect("lookup"), None);
    assert_eq!(store.pending_messages(run, "out", "reader", 10).expect("messages"), vec![], "a's message");
    let b_step = store.atom_by_key(run, "agent", "b-step").expect("lookup").expect("b's step");
    assert_eq!(store.atom(b_step).expect("atom").output, Some(output("b")));
    assert_eq!(store.lease_of(run).expect("lease_of"), Some(b.clone()));
    // The run's holder executes A's step again and completes it.
    let done = store.execute_leased(&b, "agent", "a-step", &[], |_| Ok(output("b for a"))).expect("b takes a-step");
    assert_eq!((done.executed.atom, done.executed.output), (a_step, output("b for a")));
}

#[test]
fn two_threads_executing_one_key_under_one_lease_run_the_work_once() {
    let dir = tempfile::tempdir().expect("dir");
    let store = Store::open(dir.path()).expect("open");
    let run = store.create_run(RunSpec::new("shared")).expect("run");
    let lease = store.acquire_lease(run, "pool", LONG).expect("lease");
    for round in 0..20 {
        let key = format!("step-{round}");
        let runs = AtomicUsize::new(0);
        let start = Barrier::new(2);
        let results: Vec<_> = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    scope.spawn(|| {
                        start.wait();
                        store.execute_leased(&lease, "agent", &key, &[], |_| {
                            runs.fetch_add(1, Ordering::SeqCst);
                            std::thread::sleep(Duration::from_millis(5));
                            Ok(output(&key))
                        })
                    })
                })
                .collect();
            threads.into_iter().map(|thread| thread.join().expect("thread")).collect()
        });
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{key}: the work ran once");
        let executed: Vec<_> = results.into_iter().map(|result| result.expect("execute_leased").executed).collect();
        assert_eq!(executed[0].atom, executed[1].atom);
        assert_eq!(executed[0].output, output(&key));
        assert_eq!(executed.iter().filter(|e| e.replayed).count(), 1, "{key}: one replays the other's atom");
    }
}

fn sim_open(sim: &SimStorage) -> continuum::Result<Store> {
    Store::builder(Path::new("/store")).storage(Arc::new(sim.clone())).background(false).open()
}

/// Grants and releases leases until an error; returns the tokens acknowledged.
fn grant_until_error(store: &Store, run: RunId, acknowledged: &mut Vec<u64>) -> continuum::Result<()> {
    loop {
        let lease = store.acquire_lease(run, "worker", LONG)?;
        acknowledged.push(lease.token);
        store.execute_leased(&lease, "agent", &format!("step-{}", lease.token), &[], |_| Ok(output("x")))?;
        store.release_lease(lease)?;
    }
}

#[test]
fn tokens_survive_power_loss_at_every_point() {
    let mut states = 0;
    for crash_at in (0..200).step_by(5) {
        for damage in [CrashDamage::ALL[0], CrashDamage::ALL[8]] {
            let context = format!("crash at {crash_at} ({damage:?})");
            let sim = SimStorage::new(crash_at);
            let store = sim_open(&sim).expect("open");
            let run = store.create_run(RunSpec::new("tokens")).expect("run");
            // A grant that is refused leaves the token free.
            sim.halt_after(crash_at);
            let mut acknowledged = Vec::new();
            let failed = grant_until_error(&store, run, &mut acknowledged);
            assert!(failed.is_err());
            drop(store);
            sim.crash(damage);
            let store = sim_open(&sim).unwrap_or_else(|e| panic!("{context}: reopen: {e}"));
            let newest = acknowledged.last().copied().unwrap_or(0);
            if let Some(live) = store.lease_of(run).unwrap_or_else(|e| panic!("{context}: lease_of: {e}")) {
                assert!(live.token >= newest, "{context}: live token {} below {newest}", live.token);
                store.release_lease(live).unwrap_or_else(|e| panic!("{context}: release: {e}"));
            }
            let next = store.acquire_lease(run, "next", LONG).unwrap_or_else(|e| panic!("{context}: acquire: {e}"));
            assert!(next.token > newest, "{context}: token {} after acknowledged {newest}", next.token);
            states += 1;
        }
    }
    eprintln!("lease crash points: {states} crash states checked");
}

#[test]
fn plain_completions_on_a_leased_run_are_refused_and_on_other_runs_work_as_before() {
    let dir = tempfile::tempdir().expect("dir");
    let store = Store::open(dir.path()).expect("open");
    let leased = store.create_run(RunSpec::new("leased")).expect("run");
    let free = store.create_run(RunSpec::new("free")).expect("run");
    let before = store.record_atom(leased, "agent", "before", &[], "", &output("before")).expect("before any lease");
    let begun = store.begin_atom(leased, "agent", "begun", &[before], "").expect("begin");
    let lease = store.acquire_lease(leased, "holder", LONG).expect("lease");
    check_refused(&store, (leased, free), begun, "open");
    // The lease holds across a reopen: its expiry is wall-clock time.
    drop(store);
    let store = Store::open(dir.path()).expect("reopen");
    assert_eq!(store.lease_of(leased).expect("lease_of"), Some(lease.clone()));
    check_refused(&store, (leased, free), begun, "reopened");
    // After the release, plain completions on the run land again.
    store.release_lease(lease).expect("release");
    assert_eq!(store.lease_of(leased).expect("lease_of"), None);
    store.complete_atom(begun, &output("begun")).expect("complete after the release");
    store.record_atom(leased, "agent", "r", &[], "", &output("r")).expect("record after the release");
}

/// Every plain way to end an atom of `leased` is refused with `LeaseHeld` and leaves `begun`
/// running; `free` takes atoms as before.
fn check_refused(store: &Store, (leased, free): (RunId, RunId), begun: continuum::AtomId, context: &str) {
    let held = |result: continuum::Result<()>| matches!(result, Err(Error::LeaseHeld { token: 1, .. }));
    let held_inside = |result: continuum::Result<()>| match result {
        Err(Error::OutputNotRecorded { source, .. }) => matches!(*source, Error::LeaseHeld { .. }),
        _ => false,
    };
    assert!(held(store.record_atom(leased, "agent", "r", &[], "", &output("r")).map(|_| ())), "{context}");
    assert!(held(store.record_atom_encoded(leased, "agent", "r", &[], "", b"", b"r").map(|_| ())), "{context}");
    assert!(held(store.complete_atom(begun, &output("begun"))), "{context}");
    assert!(held(store.complete_atom_encoded(begun, b"", b"begun")), "{context}");
    assert!(held(store.fail_atom(begun, &AtomFailure { message: "no".into(), retryable: true })), "{context}");
    assert!(held_inside(store.execute(leased, "agent", "e", &[], |_| Ok(output("e"))).map(|_| ())), "{context}");
    let with = store.execute_with(leased, "agent", "w", &[], |exchange| {
        exchange.send("c", b"m".to_vec()).expect("send");
        Ok(output("w"))
    });
    assert!(held_inside(with.map(|_| ())), "{context}");
    assert_eq!(store.atom(begun).expect("atom").status, AtomStatus::Running, "{context}");
    assert_eq!(store.atom_by_key(leased, "agent", "r").expect("lookup"), None, "{context}");
    let key = format!("r-{context}");
    store.record_atom(free, "agent", &key, &[], "", &output("r")).expect("an unleased run");
    store.execute(free, "agent", &format!("e-{context}"), &[], |_| Ok(output("e"))).expect("an unleased run");
}
