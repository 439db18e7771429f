//! Group commit on a CPU shared with other work: waiters that yield in a loop ("Spinning
//! waiters" in docs/ARCHITECTURE.md) hand the CPU to whatever else is runnable, and a thread of
//! other work keeps it for a scheduler slice, so every commit group waited milliseconds for its
//! leader and members to get it back (four `Sync` appenders beside three busy loops on two
//! cores: 1,000 appends/s spinning against 28–33 k with spinning off). A spin now stops at a yield
//! that comes back over a millisecond late, and three such stalls within 25 ms hold spinning
//! off for a while.
//!
//! Its own test binary: its busy threads would slow the other group-commit tests' spinning
//! waiters, which are checked on a CPU nobody else wants.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use continuum::Log;
use continuum::storage::sim::SimStorage;

const APPENDERS: usize = 4;
/// Enough for the hold-off to settle: it starts at 10 ms and doubles while spinning stalls
/// again as soon as it is tried (at 150 appends a thread, a trial lasted about 40 ms, most of
/// it the first, short hold-offs).
const APPENDS_PER_THREAD: usize = 500;

/// `Sync` appends per second from [`APPENDERS`] threads on a disk whose syncs take 100 µs (the
/// simulator sleeps, as a thread in `fdatasync` does), and the log's spin hold-offs.
fn appends_per_second(spin: Duration) -> (f64, u64) {
    let sim = SimStorage::new(5);
    sim.set_sync_delay(Duration::from_micros(100));
    let log = Log::builder(Path::new("/store"))
        .storage(Arc::new(sim))
        .segment_bytes(4 << 20)
        .commit_spin(spin)
        .open()
        .expect("open");
    log.append(b"first").expect("append");
    let started = Instant::now();
    std::thread::scope(|scope| {
        for t in 0..APPENDERS {
            let log = &log;
            scope.spawn(move || {
                for i in 0..APPENDS_PER_THREAD {
                    log.append(format!("thread {t} record {i}").as_bytes()).expect("append");
                }
            });
        }
    });
    let rate = (APPENDERS * APPENDS_PER_THREAD) as f64 / started.elapsed().as_secs_f64();
    (rate, log.metrics().commit_spin_hold_offs)
}

#[test]
fn spinning_waiters_stand_aside_when_other_work_holds_the_cpu() {
    let cores = std::thread::available_parallelism().map_or(2, usize::from);
    let stop = AtomicBool::new(false);
    let ((spinning, hold_offs), (sleeping, _)) = std::thread::scope(|scope| {
        // More busy threads than cores: every core always has other work to run.
        for _ in 0..cores + 1 {
            scope.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            });
        }
        let figures = (appends_per_second(Duration::from_millis(1)), appends_per_second(Duration::ZERO));
        stop.store(true, Ordering::Relaxed);
        figures
    });
    // Without the hold-off, spinning was about 30 times slower than sleeping here; with it,
    // within 3x on a machine running nothing else, and up to 4x with one more busy loop
    // beside the test's (a tighter bound failed there in one run in twenty). With the
    // doubling hold-off that begins at three stalls within 25 ms, at 500 appends a thread,
    // sleeping did 1.47-2.38x the appends of spinning in twelve runs (2026-12-04), each
    // hold-off taking a stall to begin. The bound sits above. The hold-off must have engaged unless the scheduler handed the
    // yielding waiters the CPU in time anyway (once in CI: spinning 20,000 against
    // 10,654 appends/s sleeping, and no yield came back late).
    assert!(
        hold_offs > 0 || spinning >= sleeping,
        "spinning fell behind and was never held off: {spinning:.0} against {sleeping:.0} appends/s"
    );
    assert!(
        spinning * 6.0 >= sleeping,
        "spinning waiters: {spinning:.0} appends/s ({hold_offs} hold-offs); sleeping waiters: {sleeping:.0} appends/s"
    );
}
