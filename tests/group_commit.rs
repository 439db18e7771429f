//! Group commit's waiting appenders (`Config::commit_spin`): while the log's `fdatasync`s are
//! fast, an appender waiting for another thread's group yields the CPU in a loop and sees its
//! answer without sleeping; once a sync takes over half the spin, waiters sleep at once. Either
//! way every appender gets exactly its own acknowledgement. The simulated disk's sync delay
//! stands in for a fast and a slow disk.

mod common;

use std::path::Path;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use continuum::storage::sim::SimStorage;
use continuum::{Error, Log, limits};

const THREADS: usize = 8;

fn open(sim: &SimStorage, spin: Duration) -> continuum::Result<Log> {
    Log::builder(Path::new(common::DIR)).storage(Arc::new(sim.clone())).segment_bytes(1 << 20).commit_spin(spin).open()
}

/// Appends `per_thread` `Sync` records from each of [`THREADS`] threads released together, on a
/// disk whose syncs take `sync_delay`, after one append has measured a sync. Checks that every
/// record got its own LSN and reads back, and returns the waits and sleeps the threads caused.
fn waits_and_sleeps(sync_delay: Duration, spin: Duration, per_thread: usize) -> (u64, u64) {
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
    (after.commit_waits - before.commit_waits, after.commit_wait_sleeps - before.commit_wait_sleeps)
}

#[test]
fn waiters_spin_through_fast_syncs_without_sleeping() {
    // Each waiter is answered within about two syncs and a gather (~3 ms), well inside its spin.
    let (waits, sleeps) = waits_and_sleeps(Duration::from_millis(1), Duration::from_millis(10), 3);
    assert!(waits > 0, "with {THREADS} threads some appends wait for another's group");
    assert_eq!(sleeps, 0, "{sleeps} of {waits} waits slept although every answer came within the spin");
}

#[test]
fn waiters_sleep_at_once_when_syncs_take_over_half_the_spin() {
    let (waits, sleeps) = waits_and_sleeps(Duration::from_millis(6), Duration::from_millis(10), 2);
    assert!(waits > 0, "with {THREADS} threads some appends wait for another's group");
    assert_eq!(sleeps, waits, "a 6 ms sync is over half a 10 ms spin: every waiter sleeps without spinning");
}

#[test]
fn waiters_sleep_when_spinning_is_off() {
    let (waits, sleeps) = waits_and_sleeps(Duration::from_millis(5), Duration::ZERO, 2);
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
