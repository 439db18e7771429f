//! Conversions between continuum's values and Python's: deltas and contexts as dicts, atoms
//! as [`PyAtom`], reports and metrics as dicts. Bytes are `bytes`, ids are `int`.

use continuum::codec::proto::{
    ChatMessage, Delete, IntermediateResult, StateChange, Summarization, ToolCall, ToolOutput, state_change::Change,
};
use continuum::metrics::{ERROR_KINDS, HistogramSnapshot};
use continuum::{Atom, AtomStatus, Context, Delta, MetricsSnapshot, ResumeReport, RunStatus};
use prost::Message;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use crate::errors::invalid_argument;

/// The keys a delta dict may hold.
const DELTA_KEYS: [&str; 6] =
    ["messages", "tool_outputs", "intermediate_results", "state", "drop_oldest_messages", "summarizations"];

/// A delta from Python: `None` (empty), the protobuf encoding as `bytes`, or a dict (see the
/// `Delta` type in `_continuum.pyi`).
pub(crate) fn delta_from_py(value: Option<&Bound<'_, PyAny>>) -> PyResult<Delta> {
    let Some(value) = value.filter(|value| !value.is_none()) else { return Ok(Delta::default()) };
    let py = value.py();
    if let Ok(bytes) = value.cast::<PyBytes>() {
        return Delta::decode(bytes.as_bytes())
            .map_err(|_| invalid_argument(py, "the delta bytes are not a continuum.Delta protobuf message"));
    }
    let dict = value.cast::<PyDict>().map_err(|_| invalid_argument(py, "a delta is a dict, bytes or None"))?;
    for key in dict.keys() {
        let key: String = key.extract()?;
        if !DELTA_KEYS.contains(&key.as_str()) {
            return Err(invalid_argument(py, &format!("unknown delta key {key:?} (expected one of {DELTA_KEYS:?})")));
        }
    }
    let mut delta = Delta::default();
    if let Some(messages) = dict.get_item("messages")? {
        for message in messages.try_iter()? {
            delta.messages.push(message_from_py(&message?)?);
        }
    }
    for (key, value) in items(dict, "tool_outputs")? {
        delta.tool_outputs.push(ToolOutput { tool_call_id: key.extract()?, output: value.extract()? });
    }
    for (key, value) in items(dict, "intermediate_results")? {
        delta.intermediate_results.push(IntermediateResult { name: key.extract()?, value: value.extract()? });
    }
    for (key, value) in items(dict, "state")? {
        let change = if value.is_none() { Change::Delete(Delete {}) } else { Change::Set(value.extract()?) };
        delta.state_changes.push(StateChange { key: key.extract()?, change: Some(change) });
    }
    if let Some(count) = dict.get_item("drop_oldest_messages")? {
        delta.drop_oldest_messages = count.extract()?;
    }
    if let Some(summaries) = dict.get_item("summarizations")? {
        for summary in summaries.try_iter()? {
            delta.summarizations.push(summarization_from_py(&summary?)?);
        }
    }
    Ok(delta)
}

/// The entries of the mapping `dict[key]`, in its order (empty when absent).
fn items<'py>(dict: &Bound<'py, PyDict>, key: &str) -> PyResult<Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)>> {
    let Some(mapping) = dict.get_item(key)? else { return Ok(Vec::new()) };
    let mapping = mapping.cast_into::<PyDict>().map_err(|_| invalid_argument(dict.py(), "expected a dict"))?;
    Ok(mapping.iter().collect())
}

fn message_from_py(message: &Bound<'_, PyAny>) -> PyResult<ChatMessage> {
    let tool_call = match message.get_item("tool_call").ok().filter(|call| !call.is_none()) {
        Some(call) => Some(ToolCall {
            id: call.get_item("id")?.extract()?,
            name: call.get_item("name")?.extract()?,
            arguments: call.get_item("arguments")?.extract()?,
        }),
        None => None,
    };
    Ok(ChatMessage {
        role: message.get_item("role")?.extract()?,
        content: message.get_item("content")?.extract()?,
        tool_call,
    })
}

fn summarization_from_py(summary: &Bound<'_, PyAny>) -> PyResult<Summarization> {
    Ok(Summarization {
        from: summary.get_item("from")?.extract()?,
        to: summary.get_item("to")?.extract()?,
        role: summary.get_item("role")?.extract()?,
        summary: summary.get_item("summary")?.extract()?,
    })
}

fn message_to_py<'py>(py: Python<'py>, message: &ChatMessage) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("role", &message.role)?;
    dict.set_item("content", &message.content)?;
    if let Some(call) = &message.tool_call {
        let call_dict = PyDict::new(py);
        call_dict.set_item("id", &call.id)?;
        call_dict.set_item("name", &call.name)?;
        call_dict.set_item("arguments", &call.arguments)?;
        dict.set_item("tool_call", call_dict)?;
    }
    Ok(dict)
}

fn messages_to_py<'py>(py: Python<'py>, messages: &[ChatMessage]) -> PyResult<Bound<'py, PyList>> {
    let list = PyList::empty(py);
    for message in messages {
        list.append(message_to_py(py, message)?)?;
    }
    Ok(list)
}

/// A delta as the dict `delta_from_py` takes.
pub(crate) fn delta_to_py<'py>(py: Python<'py>, delta: &Delta) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("messages", messages_to_py(py, &delta.messages)?)?;
    let tool_outputs = PyDict::new(py);
    for output in &delta.tool_outputs {
        tool_outputs.set_item(&output.tool_call_id, PyBytes::new(py, &output.output))?;
    }
    dict.set_item("tool_outputs", tool_outputs)?;
    let results = PyDict::new(py);
    for result in &delta.intermediate_results {
        results.set_item(&result.name, PyBytes::new(py, &result.value))?;
    }
    dict.set_item("intermediate_results", results)?;
    let state = PyDict::new(py);
    for change in &delta.state_changes {
        match &change.change {
            Some(Change::Set(value)) => state.set_item(&change.key, PyBytes::new(py, value))?,
            Some(Change::Delete(_)) | None => state.set_item(&change.key, py.None())?,
        }
    }
    dict.set_item("state", state)?;
    dict.set_item("drop_oldest_messages", delta.drop_oldest_messages)?;
    let summaries = PyList::empty(py);
    for summary in &delta.summarizations {
        let entry = PyDict::new(py);
        entry.set_item("from", summary.from)?;
        entry.set_item("to", summary.to)?;
        entry.set_item("role", &summary.role)?;
        entry.set_item("summary", &summary.summary)?;
        summaries.append(entry)?;
    }
    dict.set_item("summarizations", summaries)?;
    Ok(dict)
}

/// A context as a dict: `messages` (oldest first), and `tool_outputs`, `intermediate_results`
/// and `state` as dicts of bytes ordered by key.
pub(crate) fn context_to_py<'py>(py: Python<'py>, context: &Context) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("messages", messages_to_py(py, context.messages())?)?;
    let maps = [
        ("tool_outputs", context.tool_outputs()),
        ("intermediate_results", context.intermediate_results()),
        ("state", context.state()),
    ];
    for (name, values) in maps {
        let mut sorted: Vec<_> = values.iter().collect();
        sorted.sort_unstable_by(|left, right| left.0.cmp(right.0));
        let map = PyDict::new(py);
        for (key, value) in sorted {
            map.set_item(key, PyBytes::new(py, value))?;
        }
        dict.set_item(name, map)?;
    }
    Ok(dict)
}

/// One recorded atom: its identity, status and output.
#[pyclass(name = "Atom", module = "continuum", frozen, get_all)]
pub struct PyAtom {
    /// The atom's id.
    id: u64,
    /// Its run's id.
    run: u64,
    /// Its agent.
    agent: String,
    /// The caller's name for the step within (run, agent).
    key: String,
    /// Ids of the atoms it depends on.
    parents: Vec<u64>,
    /// The caller's label stored with it ("" if none).
    idempotency_key: String,
    /// "running", "completed" or "failed".
    status: &'static str,
    /// For a failed atom: whether running it again may succeed.
    retryable: bool,
    /// When it started, in microseconds since the Unix epoch.
    started_at_unix_us: u64,
    /// When it finished, if it did.
    ended_at_unix_us: Option<u64>,
    /// Its result bytes, if it completed.
    result: Option<Py<PyBytes>>,
    /// Its delta as a dict, if it completed.
    delta: Option<Py<PyDict>>,
    /// Its error message, if it failed.
    error: Option<String>,
    /// Whether a rollback abandoned it.
    abandoned: bool,
    /// Whether retention reclaimed its delta (the delta is then empty; the result stays).
    delta_reclaimed: bool,
}

#[pymethods]
impl PyAtom {
    fn __repr__(&self) -> String {
        format!(
            "Atom(id={}, run={}, agent={:?}, key={:?}, status={:?}, parents={:?})",
            self.id, self.run, self.agent, self.key, self.status, self.parents
        )
    }
}

/// `atom` as a Python `Atom`.
pub(crate) fn atom_to_py(py: Python<'_>, atom: Atom) -> PyResult<PyAtom> {
    let (status, retryable) = match atom.status {
        AtomStatus::Running => ("running", false),
        AtomStatus::Completed => ("completed", false),
        AtomStatus::Failed { retryable } => ("failed", retryable),
    };
    let (result, delta) = match &atom.output {
        Some(output) => {
            (Some(PyBytes::new(py, &output.result).unbind()), Some(delta_to_py(py, &output.delta)?.unbind()))
        }
        None => (None, None),
    };
    Ok(PyAtom {
        id: atom.id.get(),
        run: atom.run.get(),
        agent: atom.agent,
        key: atom.key,
        parents: atom.parents.iter().map(|parent| parent.get()).collect(),
        idempotency_key: atom.idempotency_key,
        status,
        retryable,
        started_at_unix_us: atom.started_at_unix_us,
        ended_at_unix_us: atom.ended_at_unix_us,
        result,
        delta,
        error: atom.error,
        abandoned: atom.abandoned,
        delta_reclaimed: atom.delta_reclaimed,
    })
}

/// A run's status as a dict: `status` ("running", "suspended", "finished" or "dropped"); for a
/// finished run `success` and `resume_hint`; for a suspended one `reason` (approval, timer,
/// budget, requested, deadline), `since_unix_us` and the reason's detail (`resume_at_unix_us`,
/// `what`, `by`, `at_unix_us`).
pub(crate) fn run_status_to_py<'py>(py: Python<'py>, status: &RunStatus) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    match status {
        RunStatus::Running => dict.set_item("status", "running")?,
        RunStatus::Finished { success, resume_hint } => {
            dict.set_item("status", "finished")?;
            dict.set_item("success", success)?;
            dict.set_item("resume_hint", resume_hint)?;
        }
        RunStatus::Dropped => dict.set_item("status", "dropped")?,
        RunStatus::Suspended { reason, since_unix_us } => {
            dict.set_item("status", "suspended")?;
            dict.set_item("since_unix_us", since_unix_us)?;
            suspend_reason_to_py(&dict, reason)?;
        }
    }
    Ok(dict)
}

fn ids(atoms: &[continuum::AtomId]) -> Vec<u64> {
    atoms.iter().map(|atom| atom.get()).collect()
}

/// A resume report as a dict: `run`, `status` (as `run_status_to_py`) and `agents`, one dict
/// per agent with `agent`, `completed`, `last_completed`, `first_incomplete` and `failed`.
pub(crate) fn resume_to_py<'py>(py: Python<'py>, report: &ResumeReport) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("run", report.run.get())?;
    dict.set_item("status", run_status_to_py(py, &report.status)?)?;
    let agents = PyList::empty(py);
    for agent in &report.agents {
        let entry = PyDict::new(py);
        entry.set_item("agent", &agent.agent)?;
        entry.set_item("completed", ids(&agent.completed))?;
        entry.set_item("last_completed", agent.last_completed.map(|atom| atom.get()))?;
        entry.set_item("first_incomplete", agent.first_incomplete.map(|atom| atom.get()))?;
        entry.set_item("failed", ids(&agent.failed))?;
        agents.append(entry)?;
    }
    dict.set_item("agents", agents)?;
    Ok(dict)
}

fn histogram_to_py<'py>(py: Python<'py>, histogram: &HistogramSnapshot) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("count", histogram.count)?;
    dict.set_item("sum", histogram.sum)?;
    dict.set_item("max", histogram.max)?;
    Ok(dict)
}

/// The store's metrics as a dict: counters as ints, distributions as dicts (`count`, `sum`,
/// `max`), and `errors` by kind. Quantiles come from a `metrics` recorder (docs/ARCHITECTURE.md).
pub(crate) fn metrics_to_py<'py>(py: Python<'py>, metrics: &MetricsSnapshot) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    macro_rules! counters {
        ($($field:ident),* $(,)?) => { $(dict.set_item(stringify!($field), metrics.$field)?;)* };
    }
    macro_rules! histograms {
        ($($field:ident),* $(,)?) => { $(dict.set_item(stringify!($field), histogram_to_py(py, &metrics.$field)?)?;)* };
    }
    counters!(
        enabled,
        records,
        record_bytes,
        batches,
        groups,
        fdatasyncs,
        rotations,
        commit_waits,
        commit_wait_sleeps,
        commit_spin_hold_offs,
        commit_spin_slow_yields,
        encoded_raw_bytes,
        encoded_stored_bytes,
        snapshot_writes,
        snapshot_bytes,
        snapshot_fallbacks,
        policy_snapshot_failures,
        maintenance_failures,
        rebuild_targeted_scans,
        rebuild_scan_fallbacks,
        rebuild_shared_scans,
        index_rebuilds,
        index_rebuild_atoms,
        time_to_resume_ns,
        context_rebuilds,
        context_rebuild_atoms,
        atoms_skipped,
        compactions,
        compaction_bytes_read,
        compaction_bytes_written,
        compaction_bytes_reclaimed,
        recovery_torn_tails,
        recovery_skipped_ranges,
    );
    histograms!(
        group_batches,
        fdatasync_ns,
        append_sync_ns,
        append_buffered_ns,
        append_none_ns,
        snapshot_write_ns,
        context_rebuild_ns,
    );
    let errors = PyDict::new(py);
    for (kind, count) in ERROR_KINDS.iter().zip(metrics.errors) {
        errors.set_item(kind, count)?;
    }
    dict.set_item("errors", errors)?;
    Ok(dict)
}

/// Sets `reason` and the reason's detail on a suspended run's status dict.
fn suspend_reason_to_py(dict: &Bound<'_, PyDict>, reason: &continuum::continuation::SuspendReason) -> PyResult<()> {
    use continuum::continuation::SuspendReason;
    match reason {
        SuspendReason::Approval => dict.set_item("reason", "approval"),
        SuspendReason::Timer { resume_at_unix_us } => {
            dict.set_item("reason", "timer")?;
            dict.set_item("resume_at_unix_us", resume_at_unix_us)
        }
        SuspendReason::Budget { what } => {
            dict.set_item("reason", "budget")?;
            dict.set_item("what", what)
        }
        SuspendReason::Requested { by } => {
            dict.set_item("reason", "requested")?;
            dict.set_item("by", by)
        }
        SuspendReason::Deadline { at_unix_us } => {
            dict.set_item("reason", "deadline")?;
            dict.set_item("at_unix_us", at_unix_us)
        }
    }
}
