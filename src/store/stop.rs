//! The stop request: agents stop at their next atom boundary. Once a stop is requested, the
//! store begins no new atom of a caller's agent ([`Error::Stopping`]); atoms begun before it
//! may still end, completed atoms still replay, and the store's own control atoms (the
//! checkpoints a stopping process writes) still go through.
//!
//! The request and the admission of new atoms share one lock, so an atom is either admitted
//! before the request (and counted in flight until its end record's append returns) or refused
//! after it: a graceful stop that sees no atom in flight knows none will begin.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use crate::error::{Error, Result};
use crate::metrics::Count;
use crate::store::Store;
use crate::store::types::{AtomId, RunId};

/// A handle on a store's stop request, shared with the agents of a process: cheap to clone,
/// `Send + Sync`, and independent of the store's lifetime (it holds no file).
///
/// ```
/// # fn main() -> continuum::Result<()> {
/// use continuum::{AtomOutput, Error, RunSpec, Store};
/// let dir = tempfile::tempdir().unwrap();
/// let store = Store::open(dir.path())?;
/// let run = store.create_run(RunSpec::new("trip"))?;
/// let token = store.stop_token();
/// let mut step = 0;
/// while !token.is_stop_requested() {
///     store.execute(run, "planner", &format!("step-{step}"), &[], |_| Ok(AtomOutput::default()))?;
///     step += 1;
///     if step == 3 {
///         token.request_stop();
///     }
/// }
/// let refused = store.execute(run, "planner", "step-3", &[], |_| Ok(AtomOutput::default()));
/// assert!(matches!(refused, Err(Error::Stopping { .. })));
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct StopToken {
    state: Arc<StopState>,
}

impl std::fmt::Debug for StopToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StopToken").field("requested", &self.is_stop_requested()).finish()
    }
}

impl StopToken {
    /// Asks the store's agents to stop at their next atom boundary (see
    /// [`Store::request_stop`]). Returns whether this call made the request (`false` if the
    /// store was already stopping).
    pub fn request_stop(&self) -> bool {
        self.state.request()
    }

    /// Whether a stop was requested: an agent's loop checks it between steps.
    pub fn is_stop_requested(&self) -> bool {
        self.state.requested.load(Ordering::Acquire)
    }
}

/// The stop request and what is in flight, shared by a store and its stop tokens.
pub(crate) struct StopState {
    /// Mirrors `activity.requested`, for polling without the lock.
    requested: AtomicBool,
    activity: Mutex<Activity>,
    /// Notified when an atom in flight ends or an admission is given back.
    ended: Condvar,
    /// The store's count of stop requests.
    requests: Arc<Count>,
}

/// What the stop lock guards.
#[derive(Default)]
struct Activity {
    requested: bool,
    /// Admitted calls not yet registered as a begun atom nor given back.
    admitted: u64,
    /// Atoms begun in this process whose end record's append has not returned.
    begun: HashSet<u64>,
    /// Runs that admitted an atom in this process and have not finished since.
    runs: BTreeSet<u64>,
}

impl StopState {
    /// A state with no stop requested, counting requests in `requests`.
    pub(crate) fn new(requests: Arc<Count>) -> Self {
        Self { requested: AtomicBool::new(false), activity: Mutex::default(), ended: Condvar::new(), requests }
    }

    /// Makes the stop request; returns whether it was the first.
    fn request(&self) -> bool {
        let mut activity = self.activity.lock();
        if activity.requested {
            return false;
        }
        activity.requested = true;
        self.requested.store(true, Ordering::Release);
        self.requests.add(1);
        true
    }

    /// Admits new work of `run`, unless a stop was requested.
    pub(crate) fn admit(&self, run: RunId) -> Result<Admission<'_>> {
        let mut activity = self.activity.lock();
        if activity.requested {
            return Err(Error::Stopping { run: run.get() });
        }
        activity.admitted += 1;
        activity.runs.insert(run.get());
        Ok(Admission { state: self, registered: false })
    }

    /// `atom`'s end record's append returned (written or not): it is no longer in flight.
    pub(crate) fn ended(&self, atom: AtomId) {
        let mut activity = self.activity.lock();
        if activity.begun.remove(&atom.get()) {
            self.ended.notify_all();
        }
    }

    /// `run` finished: it is no longer in flight (the set stays as small as the runs at work).
    pub(crate) fn run_finished(&self, run: RunId) {
        self.activity.lock().runs.remove(&run.get());
    }

    /// Atoms begun in this process and not ended, and admitted calls not yet done.
    fn in_flight(activity: &Activity) -> u64 {
        activity.admitted + activity.begun.len() as u64
    }
}

/// An admitted call of new work: counted in flight until it registers the atom it began or is
/// dropped.
pub(crate) struct Admission<'a> {
    state: &'a StopState,
    registered: bool,
}

impl Admission<'_> {
    /// The admitted call began `atom`: it stays in flight until it ends.
    pub(crate) fn begun(mut self, atom: AtomId) {
        let mut activity = self.state.activity.lock();
        activity.admitted -= 1;
        activity.begun.insert(atom.get());
        self.registered = true;
    }
}

impl Drop for Admission<'_> {
    fn drop(&mut self) {
        if self.registered {
            return;
        }
        let mut activity = self.state.activity.lock();
        activity.admitted -= 1;
        self.state.ended.notify_all();
    }
}

impl Store {
    /// Asks the agents of this process to stop at their next atom boundary: from now on,
    /// [`Store::execute`], [`Store::begin_atom`], [`Store::record_atom`] and
    /// [`Store::record_atom_encoded`] of an atom that would run or be written return
    /// [`Error::Stopping`] and write nothing. An atom begun before the request may still
    /// complete or fail, [`Store::execute`] of a completed atom still returns its recorded
    /// output (replay is not work), and the store's own control atoms (run checkpoints) are
    /// still written. The request lasts as long as the store is open. Returns whether this call
    /// made it. [`crate::shutdown::graceful_stop`] makes it, waits for the atoms in flight and
    /// checkpoints the runs in flight.
    ///
    /// ```
    /// # fn main() -> continuum::Result<()> {
    /// use continuum::{AtomOutput, Error, RunSpec, Store};
    /// let dir = tempfile::tempdir().unwrap();
    /// let store = Store::open(dir.path())?;
    /// let run = store.create_run(RunSpec::new("trip"))?;
    /// let first = store.execute(run, "planner", "step-1", &[], |_| Ok(AtomOutput::default()))?;
    /// let begun = store.begin_atom(run, "planner", "step-2", &[first.atom], "")?;
    /// assert!(store.request_stop());
    /// // The atom in flight ends; a new one is refused; a completed one replays.
    /// store.complete_atom(begun, &AtomOutput::default())?;
    /// assert!(matches!(store.begin_atom(run, "planner", "step-3", &[begun], ""), Err(Error::Stopping { .. })));
    /// assert!(store.execute(run, "planner", "step-1", &[], |_| unreachable!())?.replayed);
    /// # Ok(())
    /// # }
    /// ```
    pub fn request_stop(&self) -> bool {
        self.shared.stop.request()
    }

    /// Whether a stop was requested ([`Store::request_stop`]): an agent's loop checks it
    /// between steps.
    pub fn is_stop_requested(&self) -> bool {
        self.shared.stop.requested.load(Ordering::Acquire)
    }

    /// A token on this store's stop request, for agents that should not hold the store, or
    /// for whatever decides to stop them ([`StopToken`]).
    pub fn stop_token(&self) -> StopToken {
        StopToken { state: Arc::clone(&self.shared.stop) }
    }

    /// Atoms in flight in this process: begun ([`Store::begin_atom`], [`Store::execute`]) and
    /// whose completion or failure has not been appended, and [`Store::record_atom`] calls
    /// under way.
    pub fn atoms_in_flight(&self) -> u64 {
        StopState::in_flight(&self.shared.stop.activity.lock())
    }

    /// Waits until no atom is in flight, or until `deadline`; returns the atoms still in
    /// flight then (0: none).
    pub(crate) fn wait_for_atoms_in_flight(&self, deadline: Instant) -> u64 {
        let stop = &self.shared.stop;
        let mut activity = stop.activity.lock();
        while StopState::in_flight(&activity) > 0 {
            if stop.ended.wait_until(&mut activity, deadline).timed_out() {
                break;
            }
        }
        StopState::in_flight(&activity)
    }

    /// The runs that admitted an atom of a caller's agent in this process and have not
    /// finished since, in order.
    pub(crate) fn runs_worked_here(&self) -> Vec<RunId> {
        self.shared.stop.activity.lock().runs.iter().map(|run| RunId(*run)).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::checkpoint::CheckpointDraft;
    use crate::store::RunSpec;
    use crate::store::types::AtomOutput;

    fn output(result: &str) -> AtomOutput {
        AtomOutput { delta: crate::Delta::default(), result: result.as_bytes().to_vec() }
    }

    fn is_stopping(result: Result<AtomId>) -> bool {
        matches!(result, Err(Error::Stopping { .. }))
    }

    #[test]
    fn a_stop_refuses_new_atoms_and_writes_nothing() {
        let dir = tempfile::tempdir().expect("dir");
        let store = Store::open(dir.path()).expect("open");
        let run = store.create_run(RunSpec::new("r")).expect("run");
        let first = store.record_atom(run, "a", "k1", &[], "", &output("one")).expect("record");
        assert!(store.request_stop());
        let (lsn, atoms) = (store.log().next_lsn(), store.run_atoms(run));
        assert!(is_stopping(store.begin_atom(run, "a", "k2", &[first], "")));
        assert!(is_stopping(store.record_atom(run, "a", "k2", &[first], "", &output("two"))));
        assert!(is_stopping(store.record_atom_encoded(run, "a", "k2", &[first], "", b"", b"two")));
        let mut called = false;
        let executed = store.execute(run, "a", "k2", &[first], |_| {
            called = true;
            Ok(output("two"))
        });
        assert!(is_stopping(executed.map(|e| e.atom)));
        assert!(!called, "a refused atom's work never runs");
        assert_eq!(store.log().next_lsn(), lsn, "a refused call writes nothing");
        assert_eq!(store.run_atoms(run), atoms);
        assert_eq!(store.atoms_in_flight(), 0);
    }

    #[test]
    fn begun_atoms_end_replays_answer_and_checkpoints_are_written_after_a_stop() {
        let dir = tempfile::tempdir().expect("dir");
        let store = Store::open(dir.path()).expect("open");
        let run = store.create_run(RunSpec::new("r")).expect("run");
        let done = store.execute(run, "a", "k1", &[], |_| Ok(output("one"))).expect("execute");
        let begun = store.begin_atom(run, "a", "k2", &[done.atom], "").expect("begin");
        let failing = store.begin_atom(run, "b", "k1", &[], "").expect("begin");
        assert_eq!(store.atoms_in_flight(), 2);
        assert!(store.request_stop());
        assert!(!store.request_stop(), "the first request made it");
        // Executing the begun atom would run its work again: that is new work, refused.
        assert!(is_stopping(store.execute(run, "a", "k2", &[done.atom], |_| Ok(output("x"))).map(|e| e.atom)));
        store.complete_atom(begun, &output("two")).expect("a begun atom completes");
        let failure = crate::AtomFailure { message: "no".into(), retryable: true };
        store.fail_atom(failing, &failure).expect("a begun atom fails");
        assert_eq!(store.atoms_in_flight(), 0);
        let replayed = store.execute(run, "a", "k1", &[], |_| unreachable!()).expect("replay");
        assert!(replayed.replayed);
        assert_eq!(replayed.output.result, b"one");
        let sequence = store.write_checkpoint(run, CheckpointDraft::at("a", "k3")).expect("checkpoint");
        let checkpoint = store.load_latest_checkpoint(run).expect("load").expect("written");
        assert_eq!((checkpoint.sequence, checkpoint.agent_heads["a"]), (sequence, begun));
        assert_eq!(store.metrics().stop_requests, 1);
    }

    #[test]
    fn the_wait_for_atoms_in_flight_ends_when_they_end_or_at_its_deadline() {
        let dir = tempfile::tempdir().expect("dir");
        let store = Store::open(dir.path()).expect("open");
        let run = store.create_run(RunSpec::new("r")).expect("run");
        let begun = store.begin_atom(run, "a", "k", &[], "").expect("begin");
        let token = store.stop_token();
        assert!(token.request_stop());
        assert!(store.is_stop_requested() && token.is_stop_requested());
        let short = Instant::now() + Duration::from_millis(20);
        assert_eq!(store.wait_for_atoms_in_flight(short), 1, "the atom is still in flight at the deadline");
        std::thread::scope(|scope| {
            scope.spawn(|| {
                std::thread::sleep(Duration::from_millis(50));
                store.complete_atom(begun, &output("done")).expect("complete");
            });
            let long = Instant::now() + Duration::from_secs(30);
            assert_eq!(store.wait_for_atoms_in_flight(long), 0);
        });
        assert_eq!(store.atom(begun).expect("atom").status, crate::AtomStatus::Completed, "ended before the wait");
        assert_eq!(store.runs_worked_here(), vec![run]);
        store.finish_run(run, true, "").expect("finish");
        assert!(store.runs_worked_here().is_empty(), "a finished run is not in flight");
    }

    #[test]
    fn control_atoms_and_runs_without_caller_atoms_are_not_in_flight() {
        let dir = tempfile::tempdir().expect("dir");
        let store = Store::open(dir.path()).expect("open");
        let run = store.create_run(RunSpec::new("r")).expect("run");
        store.write_checkpoint(run, CheckpointDraft::at("a", "start")).expect("checkpoint");
        assert!(store.runs_worked_here().is_empty());
        assert_eq!(store.atoms_in_flight(), 0);
    }
}
