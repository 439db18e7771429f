//! Graceful shutdown: agents stop at their next atom boundary, each run in flight gets a
//! checkpoint, the store closes, within a time budget.
//!
//! [`graceful_stop`] does the stopping for an application with its own signal handling (an
//! async runtime, a Python host): it requests the stop ([`Store::request_stop`]), waits up to
//! the budget for the atoms in flight to end, then writes a checkpoint of each run in flight
//! (`Running`, with an atom begun or recorded in this process) with a resume hint, and reports
//! which runs it checkpointed at which sequence. [`close`] then makes everything durable and
//! closes the store. On unix, [`Shutdown::install`] does both on SIGTERM or SIGINT and exits the
//! process: 0 after a stop within budget, [`EXIT_OVER_BUDGET`] if the budget runs out first,
//! 128 + the signal's number at once on a second signal.
//!
//! Exiting early loses nothing acknowledged: an atom is acknowledged only once its records are
//! as durable as the store's [`Durability`](crate::Durability) promises, and every durability
//! survives the process's end; an atom in flight at the exit is found running on the next open
//! (`Store::resume`), as after a crash. `docs/ARCHITECTURE.md`, "Graceful shutdown", has the
//! design.

#[cfg(unix)]
mod signals;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::checkpoint::CheckpointDraft;
use crate::error::{Error, Result};
use crate::store::{RunId, RunStatus, Store};

#[cfg(unix)]
pub use signals::{EXIT_OVER_BUDGET, EXIT_STOP_FAILED, Shutdown};

/// The default time budget of a graceful stop: 10 s, a third of Kubernetes' default grace
/// period before it sends SIGKILL.
pub const STOP_BUDGET_DEFAULT: Duration = Duration::from_secs(10);

/// The default resume hint of the checkpoints a graceful stop writes.
pub const STOP_RESUME_HINT_DEFAULT: &str = "stopped at an atom boundary";

/// Supplies the checkpoint draft of one run at a graceful stop: given the store, the run and
/// the draft the stop would write (following the run's newest checkpoint, or a fresh one, with
/// the stop's resume hint), returns the draft to write.
pub type DraftHook = Arc<dyn Fn(&Store, RunId, CheckpointDraft) -> CheckpointDraft + Send + Sync>;

/// How a graceful stop proceeds.
///
/// ```
/// use std::time::Duration;
/// use continuum::shutdown::StopOptions;
/// let options = StopOptions::default()
///     .budget(Duration::from_secs(5))
///     .resume_hint("redeploy")
///     .draft(|_store, _run, draft| draft.env("host", "worker-7"));
/// assert_eq!(options.budget, Duration::from_secs(5));
/// ```
#[derive(Clone)]
pub struct StopOptions {
    /// The time from the stop request to a written last checkpoint (to the exit, for
    /// [`Shutdown`]). Default [`STOP_BUDGET_DEFAULT`].
    pub budget: Duration,
    /// The resume hint of the checkpoints written. Default [`STOP_RESUME_HINT_DEFAULT`];
    /// [`Shutdown`] writes "stopped on signal SIGTERM" (or SIGINT) instead.
    pub resume_hint: String,
    /// The application's hook that supplies each run's draft, if any.
    pub draft: Option<DraftHook>,
}

impl Default for StopOptions {
    fn default() -> Self {
        Self { budget: STOP_BUDGET_DEFAULT, resume_hint: STOP_RESUME_HINT_DEFAULT.to_owned(), draft: None }
    }
}

impl std::fmt::Debug for StopOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StopOptions")
            .field("budget", &self.budget)
            .field("resume_hint", &self.resume_hint)
            .field("draft", &self.draft.is_some())
            .finish()
    }
}

impl StopOptions {
    /// Sets the time budget.
    #[must_use]
    pub fn budget(mut self, budget: Duration) -> Self {
        self.budget = budget;
        self
    }

    /// Sets the resume hint of the checkpoints written.
    #[must_use]
    pub fn resume_hint(mut self, hint: impl Into<String>) -> Self {
        self.resume_hint = hint.into();
        self
    }

    /// Sets the hook that supplies each run's draft ([`DraftHook`]).
    #[must_use]
    pub fn draft(
        mut self,
        hook: impl Fn(&Store, RunId, CheckpointDraft) -> CheckpointDraft + Send + Sync + 'static,
    ) -> Self {
        self.draft = Some(Arc::new(hook));
        self
    }
}

/// One run a graceful stop checkpointed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoppedRun {
    /// The run.
    pub run: RunId,
    /// The sequence of the checkpoint written.
    pub sequence: u64,
}

/// What a graceful stop did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StopReport {
    /// The runs checkpointed, in run order.
    pub checkpointed: Vec<StoppedRun>,
    /// The time the atoms in flight took to end.
    pub waited: Duration,
    /// The time the whole stop took.
    pub elapsed: Duration,
}

/// Stops the store's agents at their next atom boundary and checkpoints each run in flight:
/// requests the stop ([`Store::request_stop`]), waits up to `options.budget` for the atoms in
/// flight to end ([`Store::atoms_in_flight`]), then writes one checkpoint (status `Running`) of
/// each run still running that began or recorded an atom in this process: the draft follows
/// the run's newest checkpoint ([`CheckpointDraft::following`], each agent's head taken
/// afresh) or is a fresh one, with `options.resume_hint`, and `options.draft` may replace it.
/// The store stays open ([`close`] closes it). A run finished meanwhile is skipped.
///
/// ```
/// # fn main() -> continuum::Result<()> {
/// use continuum::shutdown::{StopOptions, graceful_stop};
/// use continuum::{AtomOutput, RunSpec, Store};
/// let dir = tempfile::tempdir().unwrap();
/// let store = Store::open(dir.path())?;
/// let run = store.create_run(RunSpec::new("trip"))?;
/// let step = store.execute(run, "planner", "step-1", &[], |_| Ok(AtomOutput::default()))?;
/// let report = graceful_stop(&store, &StopOptions::default().resume_hint("redeploy"))?;
/// assert_eq!(report.checkpointed.len(), 1);
/// let checkpoint = store.load_latest_checkpoint(run)?.expect("written at the stop");
/// assert_eq!((checkpoint.resume_hint.as_str(), checkpoint.agent_heads["planner"]), ("redeploy", step.atom));
/// # Ok(())
/// # }
/// ```
///
/// # Errors
/// [`Error::StopBudgetExceeded`] if the budget ran out with atoms in flight or before every
/// checkpoint was written (those written stay); the errors of
/// [`Store::write_checkpoint`] but [`Error::RunFinished`]. Every acknowledged atom is durable
/// whatever the outcome.
pub fn graceful_stop(store: &Store, options: &StopOptions) -> Result<StopReport> {
    let started = Instant::now();
    let deadline = started + options.budget;
    store.request_stop();
    let metrics = store.shared.log.metrics_handle();
    let in_flight = store.wait_for_atoms_in_flight(deadline);
    if in_flight > 0 {
        metrics.record_graceful_stop(true);
        return Err(Error::StopBudgetExceeded { atoms_in_flight: in_flight, checkpoints_written: 0 });
    }
    let waited = started.elapsed();
    let checkpointed = checkpoint_runs_in_flight(store, options, deadline)?;
    metrics.record_graceful_stop(false);
    Ok(StopReport { checkpointed, waited, elapsed: started.elapsed() })
}

/// Writes the stop's checkpoint of each run in flight, until `deadline`.
fn checkpoint_runs_in_flight(store: &Store, options: &StopOptions, deadline: Instant) -> Result<Vec<StoppedRun>> {
    let metrics = store.shared.log.metrics_handle();
    let mut checkpointed = Vec::new();
    for run in store.runs_worked_here() {
        if Instant::now() >= deadline {
            metrics.record_graceful_stop(true);
            let written = checkpointed.len() as u64;
            return Err(Error::StopBudgetExceeded { atoms_in_flight: 0, checkpoints_written: written });
        }
        // A run a refused call named may not exist; a finished one has nothing to resume.
        match store.run_status(run) {
            Ok(RunStatus::Running) => {}
            Ok(_) | Err(Error::UnknownRun { .. }) => continue,
            Err(error) => return Err(error),
        }
        let draft = match store.load_latest_checkpoint(run)? {
            Some(previous) => CheckpointDraft::following(&previous),
            None => CheckpointDraft::default(),
        };
        let draft = draft.resume_hint(options.resume_hint.clone());
        let draft = match &options.draft {
            Some(hook) => hook(store, run, draft),
            None => draft,
        };
        match store.write_checkpoint(run, draft) {
            Ok(sequence) => {
                metrics.record_stop_checkpoint();
                checkpointed.push(StoppedRun { run, sequence });
            }
            // Finished between the status check and the write: nothing to resume.
            Err(Error::RunFinished { .. }) => {}
            Err(error) => return Err(error),
        }
    }
    Ok(checkpointed)
}

/// Closes a store shared behind an `Arc`, as a process about to exit does: [`Store::close`]
/// if this is the last handle; otherwise (agents' threads still hold it) what closing makes
/// durable, through the shared handle: the log synced (a store with buffered atoms included),
/// the snapshot directory synced, an index snapshot written if one is due. The background
/// thread is then told to stop, not joined: the exit ends it, which compaction survives as it
/// survives a crash.
///
/// ```
/// # fn main() -> continuum::Result<()> {
/// use std::sync::Arc;
/// let dir = tempfile::tempdir().unwrap();
/// let store = Arc::new(continuum::Store::open(dir.path())?);
/// let agent = Arc::clone(&store);
/// continuum::shutdown::close(store)?;
/// drop(agent);
/// # Ok(())
/// # }
/// ```
///
/// # Errors
/// The errors of [`Store::close`] and [`Store::sync`].
pub fn close(store: Arc<Store>) -> Result<()> {
    match Arc::try_unwrap(store) {
        Ok(store) => store.close(),
        Err(shared) => shared.close_shared(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{AtomOutput, RunSpec};

    fn step(store: &Store, run: RunId, agent: &str, key: &str) -> crate::AtomId {
        store.execute(run, agent, key, &[], |_| Ok(AtomOutput::default())).expect("execute").atom
    }

    #[test]
    fn a_graceful_stop_checkpoints_the_runs_in_flight_and_only_them() {
        let dir = tempfile::tempdir().expect("dir");
        let store = Store::open(dir.path()).expect("open");
        let worked = store.create_run(RunSpec::new("worked")).expect("run");
        let idle = store.create_run(RunSpec::new("idle")).expect("run");
        let finished = store.create_run(RunSpec::new("finished")).expect("run");
        step(&store, worked, "a", "1");
        store.write_checkpoint(worked, CheckpointDraft::at("b", "p").shared("plan", b"x".to_vec())).expect("first");
        let head_a = step(&store, worked, "a", "2");
        let head_b = step(&store, worked, "b", "1");
        step(&store, finished, "a", "1");
        store.finish_run(finished, true, "").expect("finish");

        let report = graceful_stop(&store, &StopOptions::default().resume_hint("redeploy")).expect("stop");
        assert_eq!(report.checkpointed, vec![StoppedRun { run: worked, sequence: 2 }]);
        let checkpoint = store.load_latest_checkpoint(worked).expect("load").expect("written");
        assert_eq!((checkpoint.current_agent.as_str(), checkpoint.position.as_str()), ("b", "p"), "follows the first");
        assert_eq!(checkpoint.shared_context["plan"], b"x");
        assert_eq!(checkpoint.resume_hint, "redeploy");
        assert!(!checkpoint.is_terminal);
        assert_eq!(checkpoint.agent_heads, [("a".to_owned(), head_a), ("b".to_owned(), head_b)].into());
        assert_eq!(store.load_latest_checkpoint(idle).expect("load"), None);
        let metrics = store.metrics();
        assert_eq!((metrics.stop_requests, metrics.graceful_stops_completed, metrics.stop_checkpoints), (1, 1, 1));
        assert_eq!(metrics.graceful_stops_over_budget, 0);
    }

    #[test]
    fn a_graceful_stop_waits_for_the_atom_in_flight_and_names_it_as_head() {
        let dir = tempfile::tempdir().expect("dir");
        let store = Store::open(dir.path()).expect("open");
        let run = store.create_run(RunSpec::new("r")).expect("run");
        let begun = store.begin_atom(run, "a", "1", &[], "").expect("begin");
        let hook = StopOptions::default().draft(|_, _, draft| draft.env("host", "w7"));
        let report = std::thread::scope(|scope| {
            scope.spawn(|| {
                std::thread::sleep(Duration::from_millis(100));
                store.complete_atom(begun, &AtomOutput::default()).expect("complete");
            });
            graceful_stop(&store, &hook).expect("stop")
        });
        assert!(report.waited >= Duration::from_millis(50), "waited {:?}", report.waited);
        let checkpoint = store.load_latest_checkpoint(run).expect("load").expect("written");
        assert_eq!((checkpoint.sequence, checkpoint.agent_heads["a"]), (1, begun));
        assert_eq!(checkpoint.environment["host"], "w7", "the hook's draft");
        assert_eq!(checkpoint.resume_hint, STOP_RESUME_HINT_DEFAULT);
    }

    #[test]
    fn a_refused_atom_of_an_unknown_run_does_not_fail_the_stop() {
        let dir = tempfile::tempdir().expect("dir");
        let store = Store::open(dir.path()).expect("open");
        let unknown = RunId::from_raw(99);
        assert!(matches!(store.begin_atom(unknown, "a", "1", &[], ""), Err(Error::UnknownRun { .. })));
        let report = graceful_stop(&store, &StopOptions::default()).expect("stop");
        assert!(report.checkpointed.is_empty());
    }

    #[test]
    fn a_graceful_stop_over_budget_writes_no_checkpoint() {
        let dir = tempfile::tempdir().expect("dir");
        let store = Store::open(dir.path()).expect("open");
        let run = store.create_run(RunSpec::new("r")).expect("run");
        step(&store, run, "a", "1");
        store.begin_atom(run, "a", "2", &[], "").expect("begin, never ended");
        let budget = Duration::from_millis(50);
        let started = Instant::now();
        let stopped = graceful_stop(&store, &StopOptions::default().budget(budget));
        assert!(started.elapsed() >= budget);
        assert!(matches!(stopped, Err(Error::StopBudgetExceeded { atoms_in_flight: 1, checkpoints_written: 0 })));
        assert_eq!(store.load_latest_checkpoint(run).expect("load"), None);
        assert_eq!(store.metrics().graceful_stops_over_budget, 1);
    }

    #[test]
    fn closing_a_shared_store_makes_it_durable_and_the_last_handle_closes_it() {
        let dir = tempfile::tempdir().expect("dir");
        let store = Store::builder(dir.path())
            .atom_durability(crate::Durability::None)
            .index_snapshot_after(1)
            .open()
            .expect("open");
        let store = Arc::new(store);
        let run = store.create_run(RunSpec::new("r")).expect("run");
        let atom = step(&store, run, "a", "1");
        let agent = Arc::clone(&store);
        close(store).expect("close shared");
        assert!(agent.index_snapshot().covered.is_some(), "the index snapshot was due and written");
        close(agent).expect("close the last handle");
        let reopened = Store::open(dir.path()).expect("reopen");
        assert_eq!(reopened.atom(atom).expect("atom").status, crate::AtomStatus::Completed);
    }
}
