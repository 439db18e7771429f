//! Group commit's waiting appenders (`Config::commit_spin`): while the log's `fdatasync`s are
//! fast, an appender waiting for another thread's group yields the CPU in a loop and sees its
//! answer without sleeping; once a sync takes over half the spin, waiters sleep at once. Either
//! way every appender gets exactly its own acknowledgement. A store passes its setting to its
//! log. The simulated disk's sync delay stands in for a fast and a slow disk.

mod common;

use std::path::Path;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use continuum::storage::sim::SimStorage;
use continuum::synthetic::Transcript;
use continuum::{AtomOutput, Error, Log, RunSpec, Store, limits};

const THREADS: usize = 8;

fn open(sim: &SimStorage, spin: Duration) -> continuum::Result<Log> {
    Log::builder(Path::new(common::DIR)).storage(Arc::new(sim.clone())).segment_bytes(1 << 20).commit_spin(spin).open()
}

/// Appends `per_thread` `Sync` records from each of [`THREADS`] threads released together, on a
/// disk whose syncs take `sync_delay`, after one append has measured a sync. Checks that every
/// record got its own LSN and reads back, and returns the waits and sleeps the threads caused
/// and the spins that a late yield stopped (the CPU was busy with other work).
fn waits_and_sleeps(sync_delay: Duration, spin: Duration, per_thread: usize) -> (u64, u64, u64) {
    let sim = SimStorage::new(11);
    sim.set_sync_delay(sync_delay);
    let log = Arc::new(open(&sim, spin).expect("open"));
    log.append(b"first").expect("append");
    let before = log.metrics();
    let barrier = Arc::new(Barrier::new(THREADS));
    let written: Vec<_> = (0..THREADS)
        .map(|t| {
            let (log, barrier) = (Arc::clone(&log), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                (0..per_thread)
                    .map(|i| {
                        let record = format!("thread {t} record {i}").into_bytes();
                        (log.append(&record).expect("append"), record)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .flat_map(|handle| handle.join().expect("thread"))
        .collect();
    let mut lsns: Vec<u64> = written.iter().map(|(lsn, _)| lsn.get()).collect();
    lsns.sort_unstable();
    assert_eq!(lsns, (2..2 + (THREADS * per_thread) as u64).collect::<Vec<_>>(), "one LSN each, no gaps");
    for (lsn, record) in &written {
        assert_eq!(log.read(*lsn).expect("read").as_deref(), Some(&record[..]));
    }
    let after = log.metrics();
    (
        after.commit_waits - before.commit_waits,
        after.commit_wait_sleeps - before.commit_wait_sleeps,
        after.commit_spin_slow_yields - before.commit_spin_slow_yields,
    )
}

#[test]
fn waiters_spin_through_fast_syncs_without_sleeping() {
    // Each waiter is answered within about two syncs and a gather (well under 1 ms), far inside
    // its 10 ms spin, and every sync takes far less than half the spin: on an idle machine no
    // wait sleeps. On a CPU busy with other work a waiter stops spinning when a yield comes
    // back late, and sleeps (`commit_spin_contention.rs` checks that); a quarter of the waits
    // may sleep for other hiccups of the test machine (a sync stretched past 5 ms). With
    // spinning off, or syncs over half the spin, every wait sleeps (the tests below).
    let (waits, sleeps, slow_yields) = waits_and_sleeps(Duration::from_micros(200), Duration::from_millis(10), 5);
    assert!(waits >= 10, "with {THREADS} threads many appends wait for another's group: {waits}");
    assert!(
        slow_yields > 0 || sleeps * 4 <= waits,
        "{sleeps} of {waits} waits slept although their answers came within the spin and no yield was late"
    );
}

#[test]
fn waiters_sleep_at_once_when_syncs_take_over_half_the_spin() {
    let (waits, sleeps, _) = waits_and_sleeps(Duration::from_millis(6), Duration::from_millis(10), 2);
    assert!(waits > 0, "with {THREADS} threads some appends wait for another's group");
    assert_eq!(sleeps, waits, "a 6 ms sync is over half a 10 ms spin: every waiter sleeps without spinning");
}

#[test]
fn waiters_sleep_when_spinning_is_off() {
    let (waits, sleeps, _) = waits_and_sleeps(Duration::from_millis(5), Duration::ZERO, 2);
    assert!(waits > 0, "with {THREADS} threads some appends wait for another's group");
    assert_eq!(sleeps, waits);
}

#[test]
fn a_spin_above_the_limit_is_refused() {
    let sim = SimStorage::new(1);
    let too_long = Duration::from_micros(limits::COMMIT_SPIN_US_MAX + 1);
    assert!(matches!(open(&sim, too_long), Err(Error::InvalidConfig { .. })));
    open(&sim, Duration::from_micros(limits::COMMIT_SPIN_US_MAX)).expect("the limit itself is allowed");
}

/// A store passes its spin to its log: the log's default unless the builder sets it; with
/// spinning off its waiters all sleep.
#[test]
fn a_store_passes_its_spin_to_its_log() {
    let sim = SimStorage::new(13);
    let default = Store::builder("/default").storage(Arc::new(sim.clone())).open().expect("open");
    assert_eq!(default.log().config().commit_spin, Duration::from_micros(limits::COMMIT_SPIN_US_DEFAULT));
    sim.set_sync_delay(Duration::from_millis(5));
    let store = Arc::new(
        Store::builder(common::DIR)
            .storage(Arc::new(sim.clone()))
            .background(false)
            .commit_spin(Duration::ZERO)
            .open()
            .expect("open"),
    );
    let runs: Vec<_> = (0..THREADS).map(|t| store.create_run(RunSpec::new(format!("run {t}"))).expect("run")).collect();
    let before = store.metrics();
    let barrier = Arc::new(Barrier::new(THREADS));
    let threads: Vec<_> = runs
        .into_iter()
        .enumerate()
        .map(|(t, run)| {
            let (store, barrier) = (Arc::clone(&store), Arc::clone(&barrier));
            std::thread::spawn(move || {
                let output = AtomOutput { delta: Transcript::new(t as u64).next_delta(500), result: Vec::new() };
                barrier.wait();
                store.record_atom(run, "agent", "step", &[], "", &output).expect("record")
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("thread");
    }
    let after = store.metrics();
    let (waits, sleeps) =
        (after.commit_waits - before.commit_waits, after.commit_wait_sleeps - before.commit_wait_sleeps);
    assert!(waits > 0, "with {THREADS} agents some appends wait for another's group");
    assert_eq!(sleeps, waits, "with commit_spin zero every waiter sleeps");
    let too_long = Duration::from_micros(limits::COMMIT_SPIN_US_MAX + 1);
    let refused = Store::builder("/other").storage(Arc::new(sim.clone())).commit_spin(too_long).open();
    assert!(matches!(refused, Err(Error::InvalidConfig { .. })), "the store passes its spin to its log");
}
