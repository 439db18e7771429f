//! Running against a hard deadline: the work checks a [`DeadlineWatch`] at each atom boundary,
//! and once the time left is within the buffer it stops there; the run is then suspended with
//! reason [`SuspendReason::Deadline`], so that another process (or this one, later) resumes it
//! where it stopped. A spot instance's two-minute notice, a pod's termination grace period or a
//! serverless function's time limit are such deadlines.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::continuation::{Continuation, ContinuationLevel, SuspendReason, SuspensionId};
use crate::error::{Error, Result};
use crate::store::Store;
use crate::store::types::RunId;

/// The root level's name in the tree [`Store::run_with_deadline`] builds when the work gives
/// none (its children are the run's agents).
pub const DEADLINE_ROOT: &str = "run";

/// What the work of [`Store::run_with_deadline`] tells it when it returns.
#[derive(Debug)]
pub enum DeadlineStep<T> {
    /// The work is done: its value.
    Done(T),
    /// The work stopped at an atom boundary because the watch expired. The tree says where each
    /// agent continues; `None` lets the store build it: a root level [`DEADLINE_ROOT`] with one
    /// level per agent of the run, each at its newest completed atom.
    Stopped(Option<ContinuationLevel>),
}

/// What [`Store::run_with_deadline`] came to.
#[derive(Debug, PartialEq, Eq)]
pub enum DeadlineOutcome<T> {
    /// The work finished before the deadline (or without stopping for it).
    Finished(T),
    /// The work stopped for the deadline and the run is suspended.
    Suspended(SuspensionId),
}

/// The time a run has: checked by the work at each atom boundary.
#[derive(Clone, Copy, Debug)]
pub struct DeadlineWatch {
    deadline: SystemTime,
    stop_at: SystemTime,
}

impl DeadlineWatch {
    /// A watch that expires `buffer` before `deadline`.
    pub fn new(deadline: SystemTime, buffer: Duration) -> Self {
        let stop_at = deadline.checked_sub(buffer).unwrap_or(UNIX_EPOCH);
        DeadlineWatch { deadline, stop_at }
    }

    /// The hard deadline.
    pub fn deadline(&self) -> SystemTime {
        self.deadline
    }

    /// Whether the work must stop at this boundary: the time left is within the buffer.
    pub fn expired(&self) -> bool {
        SystemTime::now() >= self.stop_at
    }

    /// The time left before the work must stop (zero once expired).
    pub fn remaining(&self) -> Duration {
        self.stop_at.duration_since(SystemTime::now()).unwrap_or(Duration::ZERO)
    }
}

impl Store {
    /// Runs `work` on `run` against the hard `deadline`: `work` checks the [`DeadlineWatch`] it
    /// is given at each atom boundary and, once [`DeadlineWatch::expired`] (`buffer` before the
    /// deadline), returns [`DeadlineStep::Stopped`] instead of starting the next atom. The run
    /// is then suspended with [`SuspendReason::Deadline`] and the tree the work gives (or one
    /// the store builds from the agents' newest atoms), durably, before this returns: the
    /// buffer must leave time for that one synced write. A run suspended for a deadline needs
    /// no decision to resume ([`Store::resume_suspended`]).
    ///
    /// ```
    /// # fn main() -> continuum::Result<()> {
    /// use std::time::{Duration, SystemTime};
    /// use continuum::continuation::{DeadlineOutcome, DeadlineStep};
    /// use continuum::{AtomOutput, RunSpec, RunStatus, Store};
    /// let dir = tempfile::tempdir().unwrap();
    /// let store = Store::open(dir.path())?;
    /// let run = store.create_run(RunSpec::new("nightly"))?;
    /// // The instance is reclaimed in 50 ms; stop 40 ms before.
    /// let deadline = SystemTime::now() + Duration::from_millis(50);
    /// let outcome = store.run_with_deadline(run, deadline, Duration::from_millis(40), |watch| {
    ///     for step in 0.. {
    ///         if watch.expired() {
    ///             return Ok(DeadlineStep::Stopped(None));
    ///         }
    ///         store.record_atom(run, "worker", &format!("step-{step}"), &[], "", &AtomOutput::default())?;
    ///         std::thread::sleep(Duration::from_millis(5));
    ///     }
    ///     Ok(DeadlineStep::Done(()))
    /// })?;
    /// assert!(matches!(outcome, DeadlineOutcome::Suspended(_)));
    /// assert!(matches!(store.run_status(run)?, RunStatus::Suspended { .. }));
    /// store.resume_suspended(run)?; // no decision needed
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// `work`'s error (the run is then left as it is); [`Error::InvalidArgument`] for a deadline
    /// before the Unix epoch; and as [`Store::suspend`].
    pub fn run_with_deadline<T>(
        &self,
        run: RunId,
        deadline: SystemTime,
        buffer: Duration,
        work: impl FnOnce(&DeadlineWatch) -> Result<DeadlineStep<T>>,
    ) -> Result<DeadlineOutcome<T>> {
        let at_unix_us = deadline
            .duration_since(UNIX_EPOCH)
            .map_err(|_| Error::InvalidArgument { reason: "a deadline before the Unix epoch".into() })?;
        let at_unix_us = u64::try_from(at_unix_us.as_micros()).unwrap_or(u64::MAX);
        let watch = DeadlineWatch::new(deadline, buffer);
        match work(&watch)? {
            DeadlineStep::Done(value) => Ok(DeadlineOutcome::Finished(value)),
            DeadlineStep::Stopped(tree) => {
                let root = match tree {
                    Some(root) => root,
                    None => self.agents_level(run)?,
                };
                let reason = SuspendReason::Deadline { at_unix_us };
                Ok(DeadlineOutcome::Suspended(self.suspend(run, &Continuation::new(reason, root))?))
            }
        }
    }

    /// A continuation tree of `run` as it stands: a root level [`DEADLINE_ROOT`], with one level
    /// per agent of the run (the store's own aside), each at its newest completed atom.
    fn agents_level(&self, run: RunId) -> Result<ContinuationLevel> {
        let mut root = ContinuationLevel::new(DEADLINE_ROOT);
        for agent in self.resume(run)?.agents {
            if crate::is_control_agent(&agent.agent) {
                continue;
            }
            let level = ContinuationLevel::new(agent.agent);
            root = root.child(match agent.last_completed {
                Some(head) => level.head(head),
                None => level,
            });
        }
        Ok(root)
    }
}
