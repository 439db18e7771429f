//! Finding work: the suspended runs of a store (for a dashboard) and the timers that are due.
//! Both read the in-memory table, never the log.

use crate::continuation::types::{SuspendReason, SuspendedFilter, SuspendedRun};
use crate::store::Store;
use crate::store::types::RunId;

impl Store {
    /// The suspended runs that pass `filter`, oldest suspension first, each with its open
    /// requests, its decisions and its tree. Reads memory only (the table of suspended runs
    /// the store keeps and rebuilds at open): a dashboard over 10,000 runs with 1,000 suspended
    /// lists them in well under 50 ms (`docs/BENCHMARKS.md`).
    ///
    /// # Example
    /// ```
    /// # fn main() -> continuum::Result<()> {
    /// use continuum::continuation::{Continuation, ContinuationLevel, ReasonKind, SuspendReason, SuspendedFilter};
    /// use continuum::{RunSpec, Store};
    /// let dir = tempfile::tempdir().unwrap();
    /// let store = Store::open(dir.path())?;
    /// for name in ["a", "b"] {
    ///     let run = store.create_run(RunSpec::new(name))?;
    ///     let tree = ContinuationLevel::new("agent").request(format!("{name}-1"), "pay", "{}");
    ///     store.suspend(run, &Continuation::new(SuspendReason::Approval, tree))?;
    /// }
    /// let filter = SuspendedFilter { reason: Some(ReasonKind::Approval), ..SuspendedFilter::default() };
    /// let waiting = store.suspended_runs(&filter);
    /// assert_eq!(waiting.iter().map(|run| run.run_name.as_str()).collect::<Vec<_>>(), ["a", "b"]);
    /// assert_eq!(waiting[1].pending[0].tool_call_id, "b-1");
    /// # Ok(())
    /// # }
    /// ```
    pub fn suspended_runs(&self, filter: &SuspendedFilter) -> Vec<SuspendedRun> {
        let mut chosen: Vec<(u64, RunId)> = {
            let table = self.shared.continuations.read();
            table
                .runs
                .values()
                .filter(|s| filter.reason.is_none_or(|kind| s.reason.kind() == kind))
                .filter(|s| filter.suspended_before_unix_us.is_none_or(|before| s.since_unix_us <= before))
                .map(|s| (s.since_unix_us, s.id.run))
                .collect()
        };
        chosen.sort_unstable();
        chosen.truncate(filter.limit.unwrap_or(usize::MAX));
        self.views(chosen.into_iter().map(|(_, run)| run))
    }

    /// The runs suspended with [`SuspendReason::Timer`] whose time is at or before
    /// `now_unix_us`, the earliest first: what a poller resumes. No thread fires timers; the
    /// caller polls.
    ///
    /// # Example
    /// ```
    /// # fn main() -> continuum::Result<()> {
    /// use continuum::continuation::{Continuation, ContinuationLevel, SuspendReason};
    /// use continuum::{RunSpec, Store};
    /// let dir = tempfile::tempdir().unwrap();
    /// let store = Store::open(dir.path())?;
    /// let run = store.create_run(RunSpec::new("reminder"))?;
    /// let wait = SuspendReason::Timer { resume_at_unix_us: 1_000 };
    /// store.suspend(run, &Continuation::new(wait, ContinuationLevel::new("agent")))?;
    /// assert!(store.due(999).is_empty());
    /// assert_eq!(store.due(1_000)[0].id.run, run);
    /// store.resume_suspended(run)?;
    /// assert!(store.due(u64::MAX).is_empty());
    /// # Ok(())
    /// # }
    /// ```
    pub fn due(&self, now_unix_us: u64) -> Vec<SuspendedRun> {
        let mut chosen: Vec<(u64, RunId)> = {
            let table = self.shared.continuations.read();
            table
                .runs
                .values()
                .filter_map(|s| match s.reason {
                    SuspendReason::Timer { resume_at_unix_us } if resume_at_unix_us <= now_unix_us => {
                        Some((resume_at_unix_us, s.id.run))
                    }
                    _ => None,
                })
                .collect()
        };
        chosen.sort_unstable();
        self.views(chosen.into_iter().map(|(_, run)| run))
    }

    /// The public views of `runs` still suspended, in that order.
    fn views(&self, runs: impl Iterator<Item = RunId>) -> Vec<SuspendedRun> {
        let runs: Vec<RunId> = runs.collect();
        let names: Vec<String> = {
            let index = self.shared.index.read();
            runs.iter().map(|run| index.run(*run).map(|entry| entry.name.clone()).unwrap_or_default()).collect()
        };
        let table = self.shared.continuations.read();
        runs.iter()
            .zip(names)
            .filter_map(|(run, name)| table.runs.get(&run.get()).map(|suspended| suspended.view(&name)))
            .collect()
    }
}
