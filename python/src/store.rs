//! `continuum.Store`: the Rust [`Store`] behind a Python class. Every call that can wait on
//! the disk releases the GIL, so Python threads share group commits.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use continuum::{AtomFailure, AtomId, AtomOutput, Executed, RunId, RunSpec, Store};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};

use crate::convert::{self, PyAtom};
use crate::errors::{closed, invalid_argument, to_py};
use crate::options::Options;

/// An open continuum store: one directory, opened by one process at a time.
///
/// Runs hold agents' atoms (one unit of work each: a step, a tool call); every write is
/// durable when its call returns, and after a crash a completed atom is never run again.
/// Ids are ints, bytes are ``bytes``, deltas and contexts are dicts. Errors raise
/// ``continuum.Error`` subclasses.
///
/// Options (keyword-only; ``None`` keeps the default): ``durability`` of atoms ('sync',
/// 'buffered' or 'none'), ``flush_interval`` (seconds), ``recovery_mode``
/// ('tolerate_torn_tail', 'strict' or 'skip_corrupted'), ``segment_bytes``,
/// ``snapshot_every_atoms``, ``snapshot_every`` (seconds), ``snapshots_per_agent``,
/// ``finished_run_age`` (seconds), ``commit_spin`` (seconds), ``background`` (bool), and
/// ``read_only`` (open without the lock; no writes).
///
/// Example::
///
///     with continuum.Store("/tmp/agent-store") as store:
///         run = store.create_run("trip-42")
///         step = store.execute(run, "planner", "step-1", [], lambda atom: b"plan")
///         assert step.result == b"plan"
#[pyclass(name = "Store", module = "continuum", frozen)]
pub struct PyStore {
    inner: Mutex<Option<Arc<Store>>>,
    path: PathBuf,
}

/// What `Store.execute` returns: the atom and its output, recorded now or earlier.
#[pyclass(name = "Executed", module = "continuum", frozen, get_all)]
pub struct PyExecuted {
    /// The atom's id.
    atom: u64,
    /// Its result bytes.
    result: Py<PyBytes>,
    /// Its delta as a dict.
    delta: Py<PyDict>,
    /// True when the output was recorded earlier and the callable did not run.
    replayed: bool,
    /// True when retention reclaimed the recorded delta (it is then empty).
    delta_reclaimed: bool,
}

#[pymethods]
impl PyExecuted {
    fn __repr__(&self) -> String {
        let replayed = if self.replayed { "True" } else { "False" };
        format!("Executed(atom={}, replayed={replayed})", self.atom)
    }
}

/// Iterator over atoms read by `Store.agent_history` or `Store.run_history`.
#[pyclass(name = "History", module = "continuum")]
pub struct PyHistory {
    atoms: std::collections::VecDeque<continuum::Atom>,
}

#[pymethods]
impl PyHistory {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<PyAtom>> {
        self.atoms.pop_front().map(|atom| convert::atom_to_py(py, atom)).transpose()
    }

    fn __len__(&self) -> usize {
        self.atoms.len()
    }
}

fn atom_ids(ids: &[u64]) -> Vec<AtomId> {
    ids.iter().map(|id| AtomId::from_raw(*id)).collect()
}

/// An atom's output from what a callable returned: `bytes` (the result), `None`, or a
/// `(result, delta)` tuple.
fn output_from_py(value: &Bound<'_, PyAny>) -> PyResult<AtomOutput> {
    if value.is_none() {
        return Ok(AtomOutput::default());
    }
    if let Ok(result) = value.cast::<PyBytes>() {
        return Ok(AtomOutput { delta: continuum::Delta::default(), result: result.as_bytes().to_vec() });
    }
    if let Ok(pair) = value.cast::<PyTuple>()
        && pair.len() == 2
    {
        let result: Vec<u8> = pair.get_item(0)?.extract()?;
        let delta = convert::delta_from_py(Some(&pair.get_item(1)?))?;
        return Ok(AtomOutput { delta, result });
    }
    Err(invalid_argument(value.py(), "the callable must return bytes, None or a (result, delta) tuple"))
}

/// The failure recorded for a Python exception: retryable unless its `retryable` attribute is
/// false (as `continuum.Failure` sets it by default).
fn failure_of(py: Python<'_>, error: &PyErr) -> AtomFailure {
    let value = error.value(py);
    let retryable = value.getattr("retryable").and_then(|flag| flag.is_truthy()).unwrap_or(true);
    AtomFailure { message: error.to_string(), retryable }
}

/// The error a call whose Python callable raised `raised` ends with: the callable's own
/// exception when the store recorded the failure, otherwise the store's error (caused by it).
fn callback_error(py: Python<'_>, error: continuum::Error, raised: Option<PyErr>) -> PyErr {
    match (raised, &error) {
        (Some(raised), continuum::Error::AtomFailed { .. } | continuum::Error::GuardFailed { .. }) => raised,
        (Some(raised), _) => {
            let error = to_py(py, error);
            error.set_cause(py, Some(raised));
            error
        }
        (None, _) => to_py(py, error),
    }
}

fn executed_to_py(py: Python<'_>, executed: Executed) -> PyResult<PyExecuted> {
    Ok(PyExecuted {
        atom: executed.atom.get(),
        result: PyBytes::new(py, &executed.output.result).unbind(),
        delta: convert::delta_to_py(py, &executed.output.delta)?.unbind(),
        replayed: executed.replayed,
        delta_reclaimed: executed.delta_reclaimed,
    })
}

impl PyStore {
    fn slot(&self) -> MutexGuard<'_, Option<Arc<Store>>> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The open store, or `ClosedError`.
    fn handle(&self, py: Python<'_>) -> PyResult<Arc<Store>> {
        self.slot().as_ref().map(Arc::clone).ok_or_else(|| closed(py))
    }

    /// Runs `call` on the open store with the GIL released.
    fn call<T: Send>(&self, py: Python<'_>, call: impl FnOnce(&Store) -> continuum::Result<T> + Send) -> PyResult<T> {
        let store = self.handle(py)?;
        py.detach(|| call(&store)).map_err(|error| to_py(py, error))
    }
}

#[pymethods]
impl PyStore {
    #[new]
    #[pyo3(signature = (
        path, *, durability=None, flush_interval=None, recovery_mode=None, segment_bytes=None,
        snapshot_every_atoms=None, snapshot_every=None, snapshots_per_agent=None, finished_run_age=None,
        commit_spin=None, background=None, read_only=false,
    ))]
    #[expect(clippy::too_many_arguments, reason = "Python keyword options, one per argument")]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        durability: Option<String>,
        flush_interval: Option<f64>,
        recovery_mode: Option<String>,
        segment_bytes: Option<u64>,
        snapshot_every_atoms: Option<u32>,
        snapshot_every: Option<f64>,
        snapshots_per_agent: Option<usize>,
        finished_run_age: Option<f64>,
        commit_spin: Option<f64>,
        background: Option<bool>,
        read_only: bool,
    ) -> PyResult<Self> {
        let options = Options {
            durability,
            flush_interval,
            recovery_mode,
            segment_bytes,
            snapshot_every_atoms,
            snapshot_every,
            snapshots_per_agent,
            finished_run_age,
            commit_spin,
            background,
        };
        let builder = options.apply(py, Store::builder(&path))?;
        let store = py
            .detach(|| if read_only { builder.open_read_only() } else { builder.open() })
            .map_err(|error| to_py(py, error))?;
        Ok(PyStore { inner: Mutex::new(Some(Arc::new(store))), path })
    }

    /// The store's directory.
    #[getter]
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    /// True once ``close()`` has been called.
    #[getter]
    fn closed(&self) -> bool {
        self.slot().is_none()
    }

    /// Closes the store: waits for calls in progress on other threads, stops the background
    /// thread, writes the index snapshot if one is due and releases the directory's lock.
    /// Closing twice does nothing. Every later call raises ``ClosedError``.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let Some(mut shared) = self.slot().take() else { return Ok(()) };
        let store = py.detach(move || {
            loop {
                match Arc::try_unwrap(shared) {
                    Ok(store) => break store,
                    Err(still_shared) => {
                        shared = still_shared;
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
            }
        });
        py.detach(|| store.close()).map_err(|error| to_py(py, error))
    }

    /// Returns the store; leaving the ``with`` block closes it.
    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Closes the store (``close()``); exceptions propagate.
    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        let state = if self.closed() { "closed" } else { "open" };
        format!("Store({:?}, {state})", self.path.display().to_string())
    }

    /// Creates the run called ``name`` (or returns the existing one's id).
    ///
    /// Example: ``run = store.create_run("trip-42", pipeline="travel", pipeline_version="1.3")``
    #[pyo3(signature = (name, *, pipeline="", pipeline_version="", environment=None))]
    fn create_run(
        &self,
        py: Python<'_>,
        name: String,
        pipeline: &str,
        pipeline_version: &str,
        environment: Option<std::collections::BTreeMap<String, String>>,
    ) -> PyResult<u64> {
        let mut spec = RunSpec::new(name).pipeline(pipeline, pipeline_version);
        spec.environment = environment.unwrap_or_default();
        self.call(py, |store| store.create_run(spec)).map(RunId::get)
    }

    /// Every run of the store, oldest first, as dicts: ``id``, ``name`` and ``status`` (as
    /// ``run_status`` returns it). Example: ``[run["name"] for run in store.runs()]``
    fn runs<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let runs = self.handle(py)?.runs();
        runs.iter()
            .map(|run| {
                let dict = PyDict::new(py);
                dict.set_item("id", run.id.get())?;
                dict.set_item("name", &run.name)?;
                dict.set_item("status", convert::run_status_to_py(py, &run.status)?)?;
                Ok(dict)
            })
            .collect()
    }

    /// The id of the run called ``name``, or None.
    fn run_id(&self, py: Python<'_>, name: &str) -> PyResult<Option<u64>> {
        Ok(self.handle(py)?.run_id(name).map(RunId::get))
    }

    /// The run's status as a dict: ``{"status": "running" | "suspended" | "finished" |
    /// "dropped"}``, with ``success`` and ``resume_hint`` for a finished run, ``reason`` and
    /// ``since_unix_us`` (and the reason's detail) for a suspended one.
    fn run_status<'py>(&self, py: Python<'py>, run: u64) -> PyResult<Bound<'py, PyDict>> {
        let status = self.call(py, |store| store.run_status(RunId::from_raw(run)))?;
        convert::run_status_to_py(py, &status)
    }

    /// Finishes the run: it takes no more atoms. Example: ``store.finish_run(run, True)``
    #[pyo3(signature = (run, success=true, resume_hint=""))]
    fn finish_run(&self, py: Python<'_>, run: u64, success: bool, resume_hint: &str) -> PyResult<()> {
        self.call(py, |store| store.finish_run(RunId::from_raw(run), success, resume_hint))
    }

    /// Records a step that already ran: its start and completion in one durable batch.
    /// ``delta`` is a dict (see ``Delta``), protobuf bytes or None. Recording the same step
    /// again raises ``ConflictError`` (its ``atom`` is the recorded one).
    ///
    /// Example: ``step = store.record_atom(run, "planner", "step-1", [], b"plan")``
    #[pyo3(
        signature = (run, agent, key, parents=Vec::new(), result=Vec::new(), delta=None, idempotency_key=""),
        text_signature = "(self, /, run, agent, key, parents=(), result=b'', delta=None, idempotency_key='')"
    )]
    #[expect(clippy::too_many_arguments, reason = "the Python method's parameters")]
    fn record_atom(
        &self,
        py: Python<'_>,
        run: u64,
        agent: &str,
        key: &str,
        parents: Vec<u64>,
        result: Vec<u8>,
        delta: Option<&Bound<'_, PyAny>>,
        idempotency_key: &str,
    ) -> PyResult<u64> {
        let output = AtomOutput { delta: convert::delta_from_py(delta)?, result };
        let parents = atom_ids(&parents);
        let run = RunId::from_raw(run);
        self.call(py, |store| store.record_atom(run, agent, key, &parents, idempotency_key, &output)).map(AtomId::get)
    }

    /// Records that a step starts; ``complete_atom`` or ``fail_atom`` ends it. Returns the
    /// atom's id. Example: ``atom = store.begin_atom(run, "planner", "step-2", [step])``
    #[pyo3(
        signature = (run, agent, key, parents=Vec::new(), idempotency_key=""),
        text_signature = "(self, /, run, agent, key, parents=(), idempotency_key='')"
    )]
    fn begin_atom(
        &self,
        py: Python<'_>,
        run: u64,
        agent: &str,
        key: &str,
        parents: Vec<u64>,
        idempotency_key: &str,
    ) -> PyResult<u64> {
        let parents = atom_ids(&parents);
        let run = RunId::from_raw(run);
        self.call(py, |store| store.begin_atom(run, agent, key, &parents, idempotency_key)).map(AtomId::get)
    }

    /// Records that the atom completed with ``result`` and ``delta``; durable on return.
    /// Example: ``store.complete_atom(atom, b"done", {"state": {"k": b"v"}})``
    #[pyo3(signature = (atom, result=Vec::new(), delta=None), text_signature = "(self, /, atom, result=b'', delta=None)")]
    fn complete_atom(
        &self,
        py: Python<'_>,
        atom: u64,
        result: Vec<u8>,
        delta: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let output = AtomOutput { delta: convert::delta_from_py(delta)?, result };
        self.call(py, |store| store.complete_atom(AtomId::from_raw(atom), &output))
    }

    /// Records that the atom failed; a ``retryable`` failure may run again.
    /// Example: ``store.fail_atom(atom, "tool timed out", retryable=True)``
    #[pyo3(signature = (atom, message, retryable=false))]
    fn fail_atom(&self, py: Python<'_>, atom: u64, message: String, retryable: bool) -> PyResult<()> {
        let failure = AtomFailure { message, retryable };
        self.call(py, |store| store.fail_atom(AtomId::from_raw(atom), &failure))
    }

    /// Runs one step exactly once across crashes. If the step (``agent`` of ``run`` called
    /// ``key`` on the branch of ``parents``) completed before, returns its recorded output
    /// without calling ``fn``. Otherwise records it as running, calls ``fn(atom_id)``, which
    /// returns ``bytes`` (the result), ``None`` or ``(result, delta)``, and records the
    /// completion durably before returning. An exception from ``fn`` fails the atom and
    /// propagates; the failure is retryable unless the exception's ``retryable`` attribute is
    /// False (``continuum.Failure``).
    ///
    /// Example: ``step = store.execute(run, "planner", "step-1", [], lambda atom: call_llm())``
    #[pyo3(signature = (run, agent, key, parents, r#fn))]
    fn execute(
        &self,
        py: Python<'_>,
        run: u64,
        agent: &str,
        key: &str,
        parents: Vec<u64>,
        r#fn: Py<PyAny>,
    ) -> PyResult<PyExecuted> {
        let store = self.handle(py)?;
        let parents = atom_ids(&parents);
        let raised = Mutex::new(None);
        let work = |atom: AtomId| {
            Python::attach(|py| {
                let output = r#fn.call1(py, (atom.get(),)).and_then(|value| output_from_py(value.bind(py)));
                output.map_err(|error| {
                    let failure = failure_of(py, &error);
                    *raised.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(error);
                    failure
                })
            })
        };
        let executed = py.detach(|| store.execute(RunId::from_raw(run), agent, key, &parents, work));
        let raised = raised.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
        match executed {
            Ok(executed) => executed_to_py(py, executed),
            Err(error) => Err(callback_error(py, error, raised)),
        }
    }

    /// Runs a side effect of ``atom`` at most once per idempotency key across crashes:
    /// ``fn(key)`` gets the key (for the external API) and returns the result bytes, which
    /// every later call returns without running it. An effect that raises is not recorded
    /// as done: its exception propagates and (unless its ``retryable`` attribute is False)
    /// the next call runs it again. One a crash interrupted raises ``InDoubtError``.
    ///
    /// Example: ``pnr = store.guarded(step, "book_flight", lambda key: book(key))``
    #[pyo3(signature = (atom, operation, r#fn))]
    fn guarded<'py>(
        &self,
        py: Python<'py>,
        atom: u64,
        operation: &str,
        r#fn: Py<PyAny>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let store = self.handle(py)?;
        let raised = Mutex::new(None);
        let effect = |key: &str| {
            Python::attach(|py| {
                let result = r#fn.call1(py, (key,)).and_then(|value| value.extract::<Vec<u8>>(py));
                result.map_err(|error| {
                    let failure = failure_of(py, &error);
                    *raised.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(error);
                    failure
                })
            })
        };
        let result = py.detach(|| store.guarded(AtomId::from_raw(atom), operation, effect));
        let raised = raised.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
        match result {
            Ok(bytes) => Ok(PyBytes::new(py, &bytes)),
            Err(error) => Err(callback_error(py, error, raised)),
        }
    }

    /// The idempotency key ``guarded(atom, operation, fn)`` hands to its effect.
    fn guard_key(&self, py: Python<'_>, atom: u64, operation: &str) -> PyResult<String> {
        self.call(py, |store| store.guard_key(AtomId::from_raw(atom), operation))
    }

    /// Records the outcome of an effect in doubt after checking the external system with its
    /// key; later ``guarded`` calls return ``result``.
    fn resolve_guard(&self, py: Python<'_>, key: &str, result: Vec<u8>) -> PyResult<()> {
        self.call(py, |store| store.resolve_guard(key, &result))
    }

    /// Everything recorded about one atom, as an ``Atom``.
    fn atom(&self, py: Python<'_>, atom: u64) -> PyResult<PyAtom> {
        let found = self.call(py, |store| store.atom(AtomId::from_raw(atom)))?;
        convert::atom_to_py(py, found)
    }

    /// The atom ``agent`` of ``run`` calls ``key`` (on the branch of ``parents`` if given), or
    /// None.
    #[pyo3(signature = (run, agent, key, parents=None))]
    fn atom_by_key(
        &self,
        py: Python<'_>,
        run: u64,
        agent: &str,
        key: &str,
        parents: Option<Vec<u64>>,
    ) -> PyResult<Option<u64>> {
        let run = RunId::from_raw(run);
        let found = match parents {
            Some(parents) => self.call(py, |store| store.atom_by_key_on(run, agent, key, &atom_ids(&parents)))?,
            None => self.call(py, |store| store.atom_by_key(run, agent, key))?,
        };
        Ok(found.map(AtomId::get))
    }

    /// The agent's head: its newest atom no rollback abandoned, or None.
    fn last_agent_atom(&self, py: Python<'_>, run: u64, agent: &str) -> PyResult<Option<u64>> {
        Ok(self.handle(py)?.last_agent_atom(RunId::from_raw(run), agent).map(AtomId::get))
    }

    /// Ids of every atom of the run, oldest first.
    fn run_atoms(&self, py: Python<'_>, run: u64) -> PyResult<Vec<u64>> {
        Ok(self.handle(py)?.run_atoms(RunId::from_raw(run)).into_iter().map(AtomId::get).collect())
    }

    /// Ids of every atom of one agent of the run, oldest first.
    fn agent_atoms(&self, py: Python<'_>, run: u64, agent: &str) -> PyResult<Vec<u64>> {
        Ok(self.handle(py)?.agent_atoms(RunId::from_raw(run), agent).into_iter().map(AtomId::get).collect())
    }

    /// The atoms of one agent of the run, with their outputs, read in one pass over the log
    /// when this is called. Example: ``for atom in store.agent_history(run, "planner",
    /// newest_first=True, limit=10): print(atom.key, atom.result)``
    #[pyo3(signature = (run, agent, *, newest_first=false, limit=None))]
    fn agent_history(
        &self,
        py: Python<'_>,
        run: u64,
        agent: &str,
        newest_first: bool,
        limit: Option<usize>,
    ) -> PyResult<PyHistory> {
        self.history(py, run, Some(agent), newest_first, limit)
    }

    /// The atoms of every agent of the run, with their outputs; see ``agent_history``.
    #[pyo3(signature = (run, *, newest_first=false, limit=None))]
    fn run_history(&self, py: Python<'_>, run: u64, newest_first: bool, limit: Option<usize>) -> PyResult<PyHistory> {
        self.history(py, run, None, newest_first, limit)
    }

    /// Where each agent of the run stands after a crash, as a dict: ``run``, ``status`` and
    /// ``agents`` (each with ``completed``, ``last_completed``, ``first_incomplete``,
    /// ``failed``).
    fn resume<'py>(&self, py: Python<'py>, run: u64) -> PyResult<Bound<'py, PyDict>> {
        let report = self.call(py, |store| store.resume(RunId::from_raw(run)))?;
        convert::resume_to_py(py, &report)
    }

    /// The agent's context as of ``atom`` (a snapshot plus the deltas after it), as a dict:
    /// ``messages``, ``tool_outputs``, ``intermediate_results``, ``state``.
    fn rebuild_context<'py>(&self, py: Python<'py>, atom: u64) -> PyResult<Bound<'py, PyDict>> {
        let rebuilt = self.call(py, |store| store.rebuild_context(AtomId::from_raw(atom)))?;
        convert::context_to_py(py, &rebuilt.context)
    }

    /// Writes a SHA-256-verified snapshot of the context as of the completed ``atom``.
    fn snapshot_now(&self, py: Python<'_>, atom: u64) -> PyResult<()> {
        self.call(py, |store| store.snapshot_now(AtomId::from_raw(atom)))
    }

    /// Starts a new branch of ``agent`` from the completed atom ``from_atom``: a running atom
    /// called ``key`` whose parent is ``from_atom``. Returns its id.
    fn fork(&self, py: Python<'_>, run: u64, agent: &str, from_atom: u64, key: &str) -> PyResult<u64> {
        self.call(py, |store| store.fork(RunId::from_raw(run), agent, AtomId::from_raw(from_atom), key))
            .map(AtomId::get)
    }

    /// Abandons every atom of ``agent`` after ``to``, so that the agent continues from ``to``.
    /// Returns the abandoned atoms' ids.
    #[pyo3(signature = (run, agent, to, reason=""))]
    fn rollback(&self, py: Python<'_>, run: u64, agent: &str, to: u64, reason: &str) -> PyResult<Vec<u64>> {
        let abandoned =
            self.call(py, |store| store.rollback(RunId::from_raw(run), agent, AtomId::from_raw(to), reason))?;
        Ok(abandoned.into_iter().map(AtomId::get).collect())
    }

    /// Pins ``atom`` (or unpins it): retention keeps everything its context needs.
    #[pyo3(signature = (atom, pinned=true))]
    fn pin(&self, py: Python<'_>, atom: u64, pinned: bool) -> PyResult<()> {
        self.call(py, |store| store.pin(AtomId::from_raw(atom), pinned))
    }

    /// Runs one compaction round now; returns what it did as a dict: ``round``,
    /// ``runs_dropped``, ``snapshots_deleted``, ``deltas_reclaimed``, ``messages_reclaimed``,
    /// ``segments_rewritten``, ``segments_compressed``, ``segments_deleted``, ``bytes_read``,
    /// ``bytes_written``, ``bytes_reclaimed`` and ``aborted``.
    fn compact<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let report = self.call(py, Store::compact)?;
        let dict = PyDict::new(py);
        dict.set_item("round", report.round)?;
        dict.set_item("runs_dropped", report.runs_dropped)?;
        dict.set_item("snapshots_deleted", report.snapshots_deleted)?;
        dict.set_item("deltas_reclaimed", report.deltas_reclaimed)?;
        dict.set_item("messages_reclaimed", report.messages_reclaimed)?;
        dict.set_item("segments_rewritten", report.segments_rewritten)?;
        dict.set_item("segments_compressed", report.segments_compressed)?;
        dict.set_item("segments_deleted", report.segments_deleted)?;
        dict.set_item("bytes_read", report.bytes_read)?;
        dict.set_item("bytes_written", report.bytes_written)?;
        dict.set_item("bytes_reclaimed", report.bytes_reclaimed)?;
        dict.set_item("aborted", report.aborted)?;
        Ok(dict)
    }

    /// Asks the store's agents to stop at their next atom boundary (a graceful shutdown): from
    /// now on new atoms raise ``StoppingError``, atoms begun may still end, completed ones still
    /// replay. Returns whether this call made the request.
    fn request_stop(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.handle(py)?.request_stop())
    }

    /// Whether a stop was requested: an agent's loop checks it between steps.
    fn is_stop_requested(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.handle(py)?.is_stop_requested())
    }

    /// Makes every ended atom durable (for ``durability='buffered'`` or ``'none'``).
    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        self.call(py, Store::sync)
    }

    /// The store's counters and latency distributions (``count``, ``sum``, ``max``) as a dict.
    /// Example: ``store.metrics()["fdatasync_ns"]["max"]``
    fn metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let metrics = self.handle(py)?.metrics();
        convert::metrics_to_py(py, &metrics)
    }
}

impl PyStore {
    fn history(
        &self,
        py: Python<'_>,
        run: u64,
        agent: Option<&str>,
        newest_first: bool,
        limit: Option<usize>,
    ) -> PyResult<PyHistory> {
        let atoms = self.call(py, |store| {
            let run = RunId::from_raw(run);
            let mut history = match agent {
                Some(agent) => store.agent_history(run, agent),
                None => store.run_history(run),
            };
            if newest_first {
                history = history.newest_first();
            }
            history.limit(limit.unwrap_or(usize::MAX)).collect::<continuum::Result<_>>()
        })?;
        Ok(PyHistory { atoms })
    }
}
