//! Lulls in the appends: cold compression, which holds a core for seconds, waits for one, so that it runs between the agents' bursts of atoms instead of inside them.
//! Agents usually pause between atoms (a model call takes seconds), so a lull comes soon.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How long cold compression waits at most for a lull before it gives up and leaves its
/// segments to the next round.
pub(crate) const LULL_WAIT_MAX: Duration = Duration::from_secs(2);
/// One probe of the append rate while waiting for a lull.
const LULL_PROBE: Duration = Duration::from_millis(5);
/// A probe that saw fewer records appended than this is quiet: 6,400 records a second, the
/// pace of about 3,200 atoms a second, far above agents' usual pace (seconds per atom) and far
/// below a burst's (a hundred thousand atoms a second with 16 agents in the peers suite's W2).
const LULL_RECORDS_MAX: u64 = 32;
/// Consecutive quiet probes that make a lull: one stalled appender is not a lull.
const LULL_PROBES: u32 = 2;

/// Waits until the log is in a lull: [`LULL_PROBES`] consecutive probes of [`LULL_PROBE`]
/// each saw fewer than [`LULL_RECORDS_MAX`] records appended (`next_lsn` says how many so far).
/// Gives up at `deadline` or when the store is closing. Returns whether it saw a lull.
pub(crate) fn wait_for_lull(mut next_lsn: impl FnMut() -> u64, deadline: Instant, stopping: &AtomicBool) -> bool {
    if !crate::log::waits_for_lulls() {
        return true;
    }
    let mut quiet = 0;
    let mut before = next_lsn();
    while quiet < LULL_PROBES {
        if stopping.load(Ordering::Acquire) || Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(LULL_PROBE);
        let now = next_lsn();
        quiet = if now.saturating_sub(before) < LULL_RECORDS_MAX { quiet + 1 } else { 0 };
        before = now;
    }
    true
}

/// Notices a burst of appends starting while background work runs, from samples of the log's
/// next LSN taken between pieces of that work: a burst is at least [`LULL_RECORDS_MAX`]
/// records per [`LULL_PROBE`] since the last sample (the lull's threshold, as a rate).
#[derive(Debug)]
pub(crate) struct BurstWatch {
    sampled_at: Instant,
    next_lsn: u64,
}

impl BurstWatch {
    /// Starts watching at `next_lsn`, now.
    pub(crate) fn new(next_lsn: u64, now: Instant) -> Self {
        Self { sampled_at: now, next_lsn }
    }

    /// Whether the appends since the last sample make a burst. Samples (reads `next_lsn`, which
    /// takes the log index's lock) only once a probe's time has passed since the last one
    /// (before that it says no), so that it can be asked after every record at the cost of a
    /// clock read.
    pub(crate) fn burst(&mut self, next_lsn: impl FnOnce() -> u64, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.sampled_at);
        if elapsed < LULL_PROBE || !crate::log::waits_for_lulls() {
            return false;
        }
        let next_lsn = next_lsn();
        let probes = u64::try_from(elapsed.as_nanos() / LULL_PROBE.as_nanos()).unwrap_or(u64::MAX);
        let appended = next_lsn.saturating_sub(self.next_lsn);
        (self.sampled_at, self.next_lsn) = (now, next_lsn);
        appended >= LULL_RECORDS_MAX.saturating_mul(probes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_snapshots_wait_for_consecutive_quiet_probes() {
        // Busy for three probes, then one quiet probe, one busy, then quiet for good.
        let lsns = [0, 1000, 2000, 3000, 3001, 4000, 4010, 4020, 4030];
        let mut calls = 0;
        let progress = || {
            calls += 1;
            lsns[(calls - 1).min(lsns.len() - 1)]
        };
        let far = Instant::now() + Duration::from_secs(3600);
        assert!(wait_for_lull(progress, far, &AtomicBool::new(false)), "a lull was seen");
        assert_eq!(calls, 8, "one read before the probes, then probes until two quiet ones in a row");
    }

    #[test]
    fn a_sustained_burst_delays_policy_snapshots_only_until_the_deadline() {
        let mut lsn = 0;
        let busy = || {
            lsn += LULL_RECORDS_MAX;
            lsn
        };
        let started = Instant::now();
        let wait = Duration::from_millis(40);
        assert!(!wait_for_lull(busy, started + wait, &AtomicBool::new(false)), "no lull");
        assert!(started.elapsed() >= wait, "it waited until the deadline");
        let closing = AtomicBool::new(true);
        let started = Instant::now();
        assert!(!wait_for_lull(|| 0, started + Duration::from_secs(3600), &closing), "a closing store does not wait");
        assert!(started.elapsed() < Duration::from_secs(60));
    }

    #[test]
    fn a_burst_is_the_lull_threshold_as_a_rate_sampled_once_per_probe() {
        let start = Instant::now();
        let mut watch = BurstWatch::new(100, start);
        assert!(!watch.burst(|| 100 + 1000, start + LULL_PROBE / 2), "no sample before a probe's time");
        assert!(watch.burst(|| 100 + LULL_RECORDS_MAX, start + LULL_PROBE), "a probe's worth in a probe");
        let at = start + LULL_PROBE;
        // Ten probes' time (a frame compressed in one piece) needs ten probes' worth of records.
        let base = 100 + LULL_RECORDS_MAX;
        assert!(!watch.burst(|| base + 9 * LULL_RECORDS_MAX, at + LULL_PROBE * 10), "below the rate");
        let at = at + LULL_PROBE * 10;
        let base = base + 9 * LULL_RECORDS_MAX;
        assert!(watch.burst(|| base + 10 * LULL_RECORDS_MAX, at + LULL_PROBE * 10), "at the rate");
        assert!(!watch.burst(|| 0, at + LULL_PROBE * 30), "an LSN that went back is no burst");
    }
}
