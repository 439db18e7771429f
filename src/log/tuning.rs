//! The group-commit writer's speed mechanisms, each measured to pay for itself
//! (`docs/BENCHMARKS.md` §12), behind one interface: [`Spinning`] (waiters and a gathering
//! leader yield the CPU in a loop instead of sleeping while syncs are fast, and stop doing so
//! for a while when yields come back late: the CPU is shared with other work) and
//! [`gather_budget`] (how long a leader waits for the group it expects).
//!
//! Environment variables turn each speed mechanism of the log and the store off for A/B runs of
//! the benchmarks (read once per process; none is set in normal use):
//! `CONTINUUM_AB_NO_SPIN` (no spinning, as `commit_spin` zero), `CONTINUUM_AB_NO_HOLDOFF`
//! (slow yields never hold spinning off), `CONTINUUM_AB_NO_GATHER` (a leader commits what is
//! queued without waiting), `CONTINUUM_AB_NO_WRITE_MAP` (groups that do not sync are written
//! with `pwrite`, not copied through the segment's map), `CONTINUUM_AB_NO_ZERO_AHEAD` (no
//! zeros written ahead of the data before a sync).

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::metrics::nanos;

/// Whether the environment variable `name` is set (to anything).
fn flag(name: &str) -> bool {
    std::env::var_os(name).is_some()
}

static NO_SPIN: LazyLock<bool> = LazyLock::new(|| flag("CONTINUUM_AB_NO_SPIN"));
static NO_HOLDOFF: LazyLock<bool> = LazyLock::new(|| flag("CONTINUUM_AB_NO_HOLDOFF"));
static NO_GATHER: LazyLock<bool> = LazyLock::new(|| flag("CONTINUUM_AB_NO_GATHER"));

static NO_WRITE_MAP: LazyLock<bool> = LazyLock::new(|| flag("CONTINUUM_AB_NO_WRITE_MAP"));
static NO_ZERO_AHEAD: LazyLock<bool> = LazyLock::new(|| flag("CONTINUUM_AB_NO_ZERO_AHEAD"));

/// Whether a leader waits for its group to gather at all (`CONTINUUM_AB_NO_GATHER` unset).
pub(crate) fn gathers() -> bool {
    !*NO_GATHER
}

/// Whether groups that do not sync are copied through the segment's writable map.
pub(crate) fn maps_writes() -> bool {
    !*NO_WRITE_MAP
}

/// Whether zeros are written ahead of the data before a sync.
pub(crate) fn zeroes_ahead() -> bool {
    !*NO_ZERO_AHEAD
}

/// A `yield_now` that returns this late means threads beyond the cores (another process's,
/// or more of ours) held the CPU meanwhile: there, a spinning thread only hands them the CPU
/// in turn, and every group waits for its leader and members to get it back. Measured on two
/// cores: four spinning appenders alone, every one of 127,000 yields under 250 µs but one
/// (2-4 ms, once in a few seconds); beside three busy loops, 2,000 of 2,200 slow ones took
/// 2-4 ms (a scheduler slice of the other process).
pub(crate) const YIELD_SLOW: Duration = Duration::from_millis(1);

/// Three stalls within this hold spinning off: one alone is a hiccup (the hypervisor, a
/// kernel thread), and on this virtual machine two close together are too; a steady stream of
/// them is a CPU shared with other work. Measured (2026-12-04, 16 threads spinning on two
/// vCPUs, every slow yield recorded): on the idle machine 91 stalls in 30 s, two of them within
/// 50 ms of each other 10 times (false alarms for a rule of two), three within 25 ms never
/// (three within 50 ms once); beside one busy loop (or three), a stall every 7.7 ms, so three
/// within 25 ms at every stall from the third on.
const STALLS_WINDOW: Duration = Duration::from_millis(25);

/// A hold-off that begins less than this after the last one ended (spinning stalled again as
/// soon as it was tried) lasts twice as long as that one ([`SPIN_HOLD_OFF_MAX`]).
const HOLD_OFF_RECURS_WITHIN: Duration = Duration::from_millis(50);

/// Slow yields within this of the first are one stall: when the hypervisor holds a vCPU for a
/// millisecond or two, every thread spinning on it comes back late at once. Measured here
/// (2026-12-01): 16 spinning appenders on an idle machine reported stalls of 1.3-2.1 ms as
/// 5-10 slow yields within 0.25 ms; counted as two stalls, they held spinning off for 100 ms
/// in four of five 0.3 s trials (104-108 k appends/s against 115-126 k without). Beside
/// a busy loop, slow yields keep coming a scheduler slice (a few milliseconds) apart.
const SAME_STALL: Duration = Duration::from_millis(5);

/// How long waiters and gatherers first sleep instead of spinning once spinning is held off.
/// Measured (2026-12-01): four `Sync` appenders beside three busy loops on two cores, with no
/// hold-off, 1,000 appends/s spinning against 28-33 k with spinning off. Short, because a
/// hold-off may be a false alarm: on a virtual machine whose host stalls a vCPU now and then,
/// stalls can land within [`STALLS_WINDOW`] with no other work on the CPU, and then sleeping
/// waiters only cost throughput (16 writers: 24-42 % fewer appends/s in the trials a
/// fixed 100 ms hold-off hit, peers suite W2, 2026-12-04).
const SPIN_HOLD_OFF_MIN: Duration = Duration::from_millis(10);

/// The longest hold-off. A hold-off that begins within [`HOLD_OFF_RECURS_WITHIN`] of the end
/// of the last one (spinning stalled again as soon as it was tried) lasts twice as long as that
/// one, up to this; any other begins at [`SPIN_HOLD_OFF_MIN`]. So a CPU that stays shared
/// with other work sees spinning tried for a few milliseconds every 640 ms, and a sporadic
/// stall costs 10 ms of sleeping waiters.
const SPIN_HOLD_OFF_MAX: Duration = Duration::from_millis(640);

/// How a spin ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SpinEnd {
    /// What it waited for happened.
    Done,
    /// Its time ran out.
    Deadline,
    /// A yield came back later than [`YIELD_SLOW`].
    SlowYield,
}

/// Yields the CPU in a loop until `done()`, until `deadline`, or until a yield comes back late.
pub(crate) fn spin_until(deadline: Instant, done: impl Fn() -> bool) -> SpinEnd {
    loop {
        if done() {
            return SpinEnd::Done;
        }
        let before = Instant::now();
        if before >= deadline {
            return SpinEnd::Deadline;
        }
        std::thread::yield_now();
        if before.elapsed() > YIELD_SLOW {
            return SpinEnd::SlowYield;
        }
    }
}

/// The longest a leader waits for its group to gather.
const GATHER_BUDGET_MAX: Duration = Duration::from_millis(1);

/// How long a leader may wait for its group to gather after a group whose `fdatasync` took
/// `last_sync`: all of that time while the last gather completed its group, half of it after
/// one that ran out, at most [`GATHER_BUDGET_MAX`]. Appenders acknowledged together come back
/// together, but how long their next appends take to arrive depends on their work and the
/// CPUs, not on the disk: the store's 16 writers on two vCPUs took 45–60 µs, past half of a
/// fast sync, and a third of a trial's gathers ran out short of a member or several (a trace
/// of the peers suite's W2, 2026-12-04). Where the members expected do not come back (agents
/// that pause between atoms), a gather runs out and the next waits half as long.
pub(crate) fn gather_budget(last_sync: Duration, last_gather_completed: bool) -> Duration {
    let budget = if last_gather_completed { last_sync } else { last_sync / 2 };
    budget.min(GATHER_BUDGET_MAX)
}

/// How long a waiting appender spins before sleeping, given the configured spin and the last
/// group's `fdatasync`: the whole spin while that sync took at most half of it, else none (a
/// slow disk would make the waiter spin for nothing and then sleep anyway, and there the
/// wake-up is a small part of the wait).
fn spin_for(commit_spin: Duration, last_sync: Duration) -> Duration {
    if last_sync.saturating_mul(2) <= commit_spin { commit_spin } else { Duration::ZERO }
}

/// When appenders spin: the configured spin, scaled by the last sync ([`spin_for`]), and held
/// off after stalls. Shared by every appender of one log; lock-free.
pub(crate) struct Spinning {
    /// [`Config::commit_spin`](crate::Config::commit_spin) (zero under `CONTINUUM_AB_NO_SPIN`).
    commit_spin: Duration,
    /// How long a waiting appender spins now, in nanoseconds: [`spin_for`] of the last sync.
    spin_ns: AtomicU64,
    /// When this was made: the origin of `spin_held_off_until`.
    epoch: Instant,
    /// Until when (nanoseconds after `epoch`) nobody spins; 0: never held off.
    spin_held_off_until: AtomicU64,
    /// How long the last hold-off lasted, in nanoseconds (from [`SPIN_HOLD_OFF_MIN`], doubling
    /// up to [`SPIN_HOLD_OFF_MAX`] while hold-offs follow each other).
    spin_hold_off_ns: AtomicU64,
    /// When (nanoseconds after `epoch`) the last stall began (its first slow yield; see
    /// [`SAME_STALL`]); 0: never.
    last_stall: AtomicU64,
    /// When the stall before the last one began; 0: never.
    stall_before: AtomicU64,
    /// Pieces of CPU work of the store's own background thread in progress ([`OwnWork`]):
    /// while any is, a late yield is not a stall.
    own_work: AtomicUsize,
}

impl Spinning {
    /// Spinning for at most `commit_spin` per wait.
    pub(crate) fn new(commit_spin: Duration) -> Self {
        let commit_spin = if *NO_SPIN { Duration::ZERO } else { commit_spin };
        Self {
            commit_spin,
            spin_ns: AtomicU64::new(nanos(commit_spin)),
            epoch: Instant::now(),
            spin_held_off_until: AtomicU64::new(0),
            spin_hold_off_ns: AtomicU64::new(0),
            last_stall: AtomicU64::new(0),
            stall_before: AtomicU64::new(0),
            own_work: AtomicUsize::new(0),
        }
    }

    /// Sets how long waiters spin now (tests of the gather).
    #[cfg(test)]
    pub(crate) fn set_spin(&self, spin: Duration) {
        self.spin_ns.store(nanos(spin), Ordering::Relaxed);
    }

    /// A group's `fdatasync` took `sync`: waiters spin while syncs are fast ([`spin_for`]).
    pub(crate) fn after_sync(&self, sync: Duration) {
        self.spin_ns.store(nanos(spin_for(self.commit_spin, sync)), Ordering::Relaxed);
    }

    /// How long a waiter or gatherer spins now: [`spin_for`] of the last sync, or nothing while
    /// spinning is held off after a slow yield.
    pub(crate) fn spin_now(&self) -> Duration {
        let held_until = self.spin_held_off_until.load(Ordering::Relaxed);
        // Never held off (the usual case): no clock read on the waiting append's path.
        if held_until != 0 && nanos(self.epoch.elapsed()) < held_until {
            return Duration::ZERO;
        }
        Duration::from_nanos(self.spin_ns.load(Ordering::Relaxed))
    }

    /// Whether spinning is held off at `now` (since `epoch`).
    #[cfg(test)]
    fn held_off_at(&self, now: Duration) -> bool {
        nanos(now) < self.spin_held_off_until.load(Ordering::Relaxed)
    }

    /// A yield came back late; returns whether that started a hold-off. If it is not part of the last stall (within [`SAME_STALL`] of
    /// its first slow yield), it starts a new one, and the third stall since the last hold-off
    /// ended within [`STALLS_WINDOW`] holds spinning off from now: for [`SPIN_HOLD_OFF_MIN`],
    /// or twice the last hold-off if that ended less than [`HOLD_OFF_RECURS_WITHIN`] ago (at
    /// most [`SPIN_HOLD_OFF_MAX`]).
    pub(crate) fn note_slow_yield(&self) -> bool {
        self.note_slow_yield_at(self.epoch.elapsed())
    }

    /// Marks CPU work of the store's own background thread (policy snapshots, dictionary
    /// training) until the returned guard drops.
    pub(crate) fn own_work(&self) -> OwnWork<'_> {
        self.own_work.fetch_add(1, Ordering::Relaxed);
        OwnWork(&self.own_work)
    }

    /// [`Spinning::note_slow_yield`] at `now` (since `epoch`).
    fn note_slow_yield_at(&self, now: Duration) -> bool {
        if *NO_HOLDOFF {
            return false;
        }
        // The CPU the yield waited for went to our own background thread, which is niced and
        // paced and gives it back: not other work that keeps it. Holding spinning off then
        // only put the waiters to sleep (`OwnWork`).
        if self.own_work.load(Ordering::Relaxed) > 0 {
            return false;
        }
        let now_ns = nanos(now).max(1);
        let mut stall = self.last_stall.load(Ordering::Relaxed);
        let previous = loop {
            if stall != 0 && now_ns.saturating_sub(stall) <= nanos(SAME_STALL) {
                return false;
            }
            // One of the threads that come back late from a stall starts it; the others then
            // find it started.
            match self.last_stall.compare_exchange_weak(stall, now_ns, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(previous) => break previous,
                Err(current) => stall = current,
            }
        };
        // One thread wins each new stall above, so the stalls shift through here one at a time.
        let earlier = self.stall_before.swap(previous, Ordering::Relaxed);
        let mut held_off = false;
        let held_until = self.spin_held_off_until.load(Ordering::Relaxed);
        // Only stalls after the last hold-off ended count (so a stall during one neither starts
        // nor lengthens one): `earlier` is the first of the three.
        if earlier != 0 && earlier >= held_until && now_ns.saturating_sub(earlier) <= nanos(STALLS_WINDOW) {
            let last = self.spin_hold_off_ns.load(Ordering::Relaxed);
            let recurs = held_until != 0 && now_ns.saturating_sub(held_until) <= nanos(HOLD_OFF_RECURS_WITHIN);
            let length =
                if recurs { last.saturating_mul(2).min(nanos(SPIN_HOLD_OFF_MAX)) } else { nanos(SPIN_HOLD_OFF_MIN) };
            // Of the threads that see the same stall, one starts the hold-off.
            held_off = self
                .spin_held_off_until
                .compare_exchange(held_until, now_ns + length, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok();
            if held_off {
                self.spin_hold_off_ns.store(length, Ordering::Relaxed);
            }
        }
        held_off
    }
}

/// Held while the store's own background thread does CPU work ([`Spinning::own_work`]): a yield
/// that comes back late meanwhile neither starts a stall nor holds spinning off. That thread
/// gets a vCPU when the spinning waiters yield and keeps it for a scheduler slice, and the
/// late yields read as a CPU shared with other work: in a probe of 16 writers on two vCPUs
/// (the peers suite's W2 pattern, 2026-12-04) the store held spinning off in 27 of 50 trials with its
/// policy snapshots on and in 2 of 50 with them off, and its trials that held off did about
/// half the appends of those that did not.
pub(crate) struct OwnWork<'a>(&'a AtomicUsize);

impl Drop for OwnWork<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    /// A [`Spinning`] with the default spin that counts its slow yields and hold-offs (what the
    /// writer reports as metrics).
    struct Probe {
        spinning: Spinning,
        slow_yields: Cell<u64>,
        hold_offs: Cell<u64>,
    }

    impl Probe {
        fn new() -> Self {
            let spin = Duration::from_micros(crate::limits::COMMIT_SPIN_US_DEFAULT);
            Self { spinning: Spinning::new(spin), slow_yields: Cell::new(0), hold_offs: Cell::new(0) }
        }

        fn note_slow_yield_at(&self, now: Duration) {
            self.slow_yields.set(self.slow_yields.get() + 1);
            if self.spinning.note_slow_yield_at(now) {
                self.hold_offs.set(self.hold_offs.get() + 1);
            }
        }
    }

    impl std::ops::Deref for Probe {
        type Target = Spinning;
        fn deref(&self) -> &Spinning {
            &self.spinning
        }
    }

    #[test]
    fn a_gather_waits_a_whole_sync_while_gathers_complete_and_half_after_one_ran_out() {
        let sync = Duration::from_micros(120);
        assert_eq!(gather_budget(sync, true), sync);
        assert_eq!(gather_budget(sync, false), sync / 2);
        assert_eq!(gather_budget(Duration::from_millis(5), true), GATHER_BUDGET_MAX);
        assert_eq!(gather_budget(Duration::from_millis(5), false), GATHER_BUDGET_MAX);
        assert_eq!(gather_budget(Duration::ZERO, true), Duration::ZERO);
    }

    #[test]
    fn waiters_spin_only_while_the_last_sync_took_at_most_half_the_spin() {
        let spin = Duration::from_micros(1000);
        assert_eq!(spin_for(spin, Duration::from_micros(100)), spin);
        assert_eq!(spin_for(spin, Duration::from_micros(500)), spin, "exactly half still spins");
        assert_eq!(spin_for(spin, Duration::from_micros(501)), Duration::ZERO);
        assert_eq!(spin_for(spin, Duration::from_secs(3)), Duration::ZERO);
        assert_eq!(spin_for(Duration::ZERO, Duration::ZERO), Duration::ZERO, "zero turns spinning off");
        assert_eq!(spin_for(spin, Duration::MAX), Duration::ZERO, "no overflow");
    }

    #[test]
    fn a_spin_ends_when_its_condition_holds_or_its_time_is_up() {
        let far = Instant::now() + Duration::from_secs(3600);
        assert_eq!(spin_until(far, || true), SpinEnd::Done, "a condition already true ends it at once");
        let polls = std::cell::Cell::new(0);
        let third = || {
            polls.set(polls.get() + 1);
            polls.get() == 3
        };
        // A yield on a busy test machine may come back late: that ends the spin too.
        assert!(matches!(spin_until(far, third), SpinEnd::Done | SpinEnd::SlowYield));
        let started = Instant::now();
        let end = spin_until(started + Duration::from_millis(5), || false);
        assert!(matches!(end, SpinEnd::Deadline | SpinEnd::SlowYield), "{end:?}");
        assert!(end == SpinEnd::SlowYield || started.elapsed() >= Duration::from_millis(5), "it ran to its deadline");
    }

    #[test]
    fn three_stalls_close_together_hold_spinning_off() {
        let writer = Probe::new();
        let spin = Duration::from_micros(crate::limits::COMMIT_SPIN_US_DEFAULT);
        assert_eq!(writer.spin_now(), spin);
        let t = writer.epoch.elapsed() + Duration::from_secs(1);
        writer.note_slow_yield_at(t);
        assert!(!writer.held_off_at(t), "one stall alone is a hiccup");
        for late in 1..10 {
            writer.note_slow_yield_at(t + Duration::from_micros(late * 30));
        }
        let second = t + SAME_STALL + Duration::from_millis(1);
        writer.note_slow_yield_at(second);
        assert!(!writer.held_off_at(second), "two stalls are hiccups on a virtual machine");
        let same_as_second = second + SAME_STALL;
        writer.note_slow_yield_at(same_as_second);
        assert!(!writer.held_off_at(same_as_second), "threads coming back late from the same stall are one stall");
        let third = second + SAME_STALL + Duration::from_millis(1);
        writer.note_slow_yield_at(third);
        assert!(writer.held_off_at(third), "a third stall within the window holds spinning off");
        assert!(writer.held_off_at(third + SPIN_HOLD_OFF_MIN - Duration::from_micros(1)));
        assert!(!writer.held_off_at(third + SPIN_HOLD_OFF_MIN), "the first hold-off is the shortest");
        assert_eq!((writer.slow_yields.get(), writer.hold_offs.get()), (13, 1));
        for more in 1..=3 {
            writer.note_slow_yield_at(third + (SAME_STALL + Duration::from_millis(1)) * more);
        }
        assert_eq!(writer.hold_offs.get(), 1, "stalls during a hold-off are not a new one");
        assert!(!writer.held_off_at(third + SPIN_HOLD_OFF_MIN), "nor do they lengthen it");
        // Three stalls further apart than the window do not hold spinning off.
        let writer = Probe::new();
        let t = writer.epoch.elapsed();
        writer.note_slow_yield_at(t);
        writer.note_slow_yield_at(t + STALLS_WINDOW / 2);
        writer.note_slow_yield_at(t + STALLS_WINDOW + Duration::from_millis(1));
        assert_eq!(writer.spin_now(), spin);
        assert_eq!(writer.hold_offs.get(), 0);
    }

    #[test]
    fn stalls_before_a_hold_off_ended_do_not_count_toward_the_next() {
        let writer = Probe::new();
        let at = writer.epoch.elapsed() + Duration::from_secs(1);
        let ended = three_stalls(&writer, at).expect("held off");
        // A stall during the hold-off, then two after it within the window: the first fell in
        // the hold-off and does not count; a third after it does.
        writer.note_slow_yield_at(ended - Duration::from_millis(4));
        writer.note_slow_yield_at(ended + Duration::from_millis(2));
        writer.note_slow_yield_at(ended + Duration::from_millis(8));
        assert!(!writer.held_off_at(ended + Duration::from_millis(8)));
        assert_eq!(writer.hold_offs.get(), 1);
        writer.note_slow_yield_at(ended + Duration::from_millis(14));
        assert!(writer.held_off_at(ended + Duration::from_millis(14)), "three stalls after it do");
    }

    #[test]
    fn stalls_during_the_stores_own_background_work_do_not_hold_spinning_off() {
        let writer = Probe::new();
        let at = writer.epoch.elapsed() + Duration::from_secs(1);
        {
            let _work = writer.own_work();
            assert_eq!(three_stalls(&writer, at), None, "the CPU went to our own background thread");
        }
        assert_eq!((writer.slow_yields.get(), writer.hold_offs.get()), (3, 0));
        // Its stalls were not kept: one more stall, after the work, is a hiccup.
        let after = at + Duration::from_millis(20);
        writer.note_slow_yield_at(after);
        assert!(!writer.held_off_at(after));
        assert!(three_stalls(&writer, after + SAME_STALL * 2).is_some(), "once the work ends, stalls count again");
    }

    /// Holds spinning off the way a CPU shared with other work does: three stalls just over
    /// `SAME_STALL` apart, starting `at`; returns when the hold-off they start ends, if they
    /// start one.
    fn three_stalls(writer: &Probe, at: Duration) -> Option<Duration> {
        let apart = SAME_STALL + Duration::from_millis(1);
        for stall in 0..3 {
            writer.note_slow_yield_at(at + apart * stall);
        }
        let third = at + apart * 2;
        writer.held_off_at(third).then(|| Duration::from_nanos(writer.spin_held_off_until.load(Ordering::Relaxed)))
    }

    #[test]
    fn hold_offs_that_follow_each_other_double_up_to_the_longest_and_a_lone_one_is_short() {
        let writer = Probe::new();
        let mut at = writer.epoch.elapsed() + Duration::from_secs(1);
        let mut lengths = Vec::new();
        for _ in 0..9 {
            // Spinning is tried again when the hold-off ends and stalls at once: the third stall
            // comes 14 ms after it ended, within `HOLD_OFF_RECURS_WITHIN`.
            let ended = three_stalls(&writer, at).expect("the three stalls hold spinning off");
            lengths.push(Duration::from_nanos(writer.spin_hold_off_ns.load(Ordering::Relaxed)).as_millis());
            at = ended + Duration::from_millis(2);
        }
        assert_eq!(lengths, [10, 20, 40, 80, 160, 320, 640, 640, 640]);
        assert_eq!(writer.hold_offs.get(), 9);
        // Spinning then ran clean for longer than the window: the next hold-off is short again.
        let later = at + HOLD_OFF_RECURS_WITHIN * 2;
        let ended = three_stalls(&writer, later).expect("held off");
        assert_eq!(ended - (later + (SAME_STALL + Duration::from_millis(1)) * 2), SPIN_HOLD_OFF_MIN);
    }
}
