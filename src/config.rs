//! [`Config`], its modes ([`Durability`], [`RecoveryMode`]) and its validation.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::limits;

/// What an acknowledged append survives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Durability {
    /// Acknowledged after `fdatasync` returned: survives a process crash and power loss.
    /// Concurrent appenders share one `fdatasync` (group commit).
    #[default]
    Sync,
    /// Acknowledged once the operating system has the bytes (`write` returned): survives a
    /// process crash; on power loss, at most the last
    /// [`Config::flush_interval`] of appends is lost, since a background flusher syncs that often.
    Buffered,
    /// Acknowledged once the operating system has the bytes, with no background flusher:
    /// survives a process crash; on power loss, everything since the last [`Log::sync`],
    /// segment rotation or close may be lost.
    ///
    /// [`Log::sync`]: crate::Log::sync
    None,
}

/// How recovery treats invalid bytes found when the log is opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RecoveryMode {
    /// Cut an invalid tail of the last segment (what a crash during a write leaves) and report
    /// how many bytes were cut. Invalid bytes anywhere else fail the open.
    #[default]
    TolerateTornTail,
    /// Any invalid byte fails the open, a torn tail included.
    Strict,
    /// Skip invalid byte ranges anywhere, keep every valid batch, and report what was skipped.
    /// Records inside skipped ranges are lost, leaving LSN gaps. Invalid segment headers still
    /// fail the open. Use this to salvage a damaged store, never by default.
    SkipCorrupted,
}

/// Settings of a [`Log`](crate::Log). Build one with [`Log::builder`](crate::Log::builder).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Size of each segment file, preallocated when the segment is created.
    /// Default [`limits::SEGMENT_BYTES_DEFAULT`] (64 MiB); between [`limits::SEGMENT_BYTES_MIN`]
    /// and [`limits::SEGMENT_BYTES_MAX`]. The largest batch must fit in one segment.
    pub segment_bytes: u64,
    /// Durability of appends that do not name their own. Default [`Durability::Sync`].
    pub durability: Durability,
    /// How recovery treats invalid bytes. Default [`RecoveryMode::TolerateTornTail`].
    pub recovery_mode: RecoveryMode,
    /// How often the background flusher syncs under [`Durability::Buffered`].
    /// Default [`limits::FLUSH_INTERVAL_MS_DEFAULT`] ms; between 1 ms and
    /// [`limits::FLUSH_INTERVAL_MS_MAX`] ms.
    pub flush_interval: Duration,
    /// How long an appender waiting for its group's `fdatasync` yields the CPU in a loop (checking
    /// for its acknowledgement) before it sleeps, while the log's syncs are fast: only when the
    /// last group's `fdatasync` took at most half of this. Sleeping costs a wake-up per waiting
    /// thread per group, which on a disk whose `fdatasync` takes ~100 µs is most of what 16
    /// writers spend besides the sync (docs/BENCHMARKS.md §1–4 and §12); spinning spends CPU time instead.
    /// `Duration::ZERO` always sleeps. Spinning pays when the appending threads have little
    /// else to do between appends; when the CPU is short (more runnable threads than cores
    /// doing real work), sleeping leaves it to them: a spin stops at a yield that comes back
    /// over a millisecond late, and three of those within 25 ms turn spinning off for 10 ms, or
    /// longer (up to 640 ms) while it keeps stalling as soon as it is tried again
    /// (docs/ARCHITECTURE.md, "Spinning stands aside on a busy CPU"). Default
    /// [`limits::COMMIT_SPIN_US_DEFAULT`] µs; at most [`limits::COMMIT_SPIN_US_MAX`] µs.
    pub commit_spin: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            segment_bytes: limits::SEGMENT_BYTES_DEFAULT,
            durability: Durability::default(),
            recovery_mode: RecoveryMode::default(),
            flush_interval: Duration::from_millis(limits::FLUSH_INTERVAL_MS_DEFAULT),
            commit_spin: Duration::from_micros(limits::COMMIT_SPIN_US_DEFAULT),
        }
    }
}

impl Config {
    /// Checks every value and combination.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the first value out of bounds.
    pub fn validate(&self) -> Result<()> {
        if self.segment_bytes < limits::SEGMENT_BYTES_MIN || self.segment_bytes > limits::SEGMENT_BYTES_MAX {
            return Err(Error::InvalidConfig {
                reason: format!(
                    "segment_bytes is {} but must be between {} and {}",
                    self.segment_bytes,
                    limits::SEGMENT_BYTES_MIN,
                    limits::SEGMENT_BYTES_MAX
                ),
            });
        }
        let interval_ms = self.flush_interval.as_millis();
        if interval_ms < 1 || interval_ms > u128::from(limits::FLUSH_INTERVAL_MS_MAX) {
            return Err(Error::InvalidConfig {
                reason: format!(
                    "flush_interval is {interval_ms} ms but must be between 1 and {} ms",
                    limits::FLUSH_INTERVAL_MS_MAX
                ),
            });
        }
        if self.commit_spin > Duration::from_micros(limits::COMMIT_SPIN_US_MAX) {
            return Err(Error::InvalidConfig {
                reason: format!(
                    "commit_spin is {} µs but must be at most {} µs",
                    self.commit_spin.as_micros(),
                    limits::COMMIT_SPIN_US_MAX
                ),
            });
        }
        Ok(())
    }
}
