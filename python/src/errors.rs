//! Maps [`continuum::Error`] to the exception classes of `continuum.errors`, one class per
//! kind of error a caller handles, with the error's facts as attributes.

use continuum::Error;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// A fact an exception carries as an attribute.
enum Fact {
    Int(u64),
    Str(String),
    Bool(bool),
}

/// The `continuum.errors` class for `error`, and the facts it carries.
fn classify(error: &Error) -> (&'static str, Vec<(&'static str, Fact)>) {
    use Fact::{Bool, Int, Str};
    match error {
        Error::NoSpace { path, .. } => ("NoSpaceError", vec![("path", Str(path.display().to_string()))]),
        Error::Io { path, .. } => ("IoError", vec![("path", Str(path.display().to_string()))]),
        Error::Corruption { segment, offset, .. } => {
            ("CorruptionError", vec![("path", Str(segment.display().to_string())), ("offset", Int(*offset))])
        }
        Error::Codec { lsn, .. } | Error::InconsistentLog { lsn, .. } => ("CorruptionError", vec![("lsn", Int(*lsn))]),
        Error::RecordsLost { log_end, .. } => ("CorruptionError", vec![("lsn", Int(*log_end))]),
        Error::Poisoned { .. } => ("PoisonedError", Vec::new()),
        Error::Locked { dir } => ("LockedError", vec![("path", Str(dir.display().to_string()))]),
        Error::Closed => ("ClosedError", Vec::new()),
        Error::ReadOnly => ("ReadOnlyError", Vec::new()),
        Error::Fenced { epoch, current } => ("ReadOnlyError", vec![("epoch", Int(*epoch)), ("current", Int(*current))]),
        Error::ObjectStore { key, .. } => ("IoError", vec![("path", Str(key.clone()))]),
        Error::DamagedObject { key } => ("CorruptionError", vec![("path", Str(key.clone()))]),
        Error::RecordTooLarge { .. }
        | Error::BatchTooLarge { .. }
        | Error::EmptyBatch
        | Error::InvalidDelta { .. }
        | Error::InvalidConfig { .. }
        | Error::InvalidArgument { .. } => ("InvalidArgumentError", Vec::new()),
        Error::LimitExceeded { .. } => ("LimitExceededError", Vec::new()),
        Error::InvalidParent { parent, .. } => ("InvalidArgumentError", vec![("atom", Int(*parent))]),
        Error::UnknownRun { run } => ("UnknownRunError", vec![("run", Str(run.clone()))]),
        Error::UnknownAtom { atom } => ("UnknownAtomError", vec![("atom", Int(*atom))]),
        Error::AtomExists { atom } => ("ConflictError", vec![("atom", Int(*atom))]),
        Error::Conflict { key, expected, found } => {
            ("ConflictError", vec![("key", Str(key.clone())), ("expected", Int(*expected)), ("found", Int(*found))])
        }
        Error::KeyCollision { key } => ("KeyCollisionError", vec![("key", Str(key.clone()))]),
        Error::InvalidTransition { atom, from, to } => (
            "InvalidTransitionError",
            vec![("atom", Int(*atom)), ("from_status", Str((*from).to_owned())), ("to_status", Str((*to).to_owned()))],
        ),
        Error::RunFinished { run } => ("RunFinishedError", vec![("run", Int(*run))]),
        Error::RunSuspended { run, suspension } => {
            ("RunSuspendedError", vec![("run", Int(*run)), ("suspension", Int(*suspension))])
        }
        Error::Stopping { run } => ("StoppingError", vec![("run", Int(*run))]),
        Error::AtomFailed { atom, message, retryable } => (
            "AtomFailedError",
            vec![("atom", Int(*atom)), ("message", Str(message.clone())), ("retryable", Bool(*retryable))],
        ),
        Error::OutputNotRecorded { atom, .. } => ("OutputNotRecordedError", vec![("atom", Int(*atom))]),
        Error::GuardInDoubt { key } => ("InDoubtError", vec![("key", Str(key.clone()))]),
        Error::GuardFailed { key, message, retryable } => (
            "GuardFailedError",
            vec![("key", Str(key.clone())), ("message", Str(message.clone())), ("retryable", Bool(*retryable))],
        ),
        Error::GuardNotInDoubt { key } => ("GuardNotInDoubtError", vec![("key", Str(key.clone()))]),
        Error::HistoryReclaimed { atom, reclaimed } => {
            ("HistoryReclaimedError", vec![("atom", Int(*atom)), ("reclaimed", Int(*reclaimed))])
        }
        Error::NotSealed { .. } => ("InvalidArgumentError", Vec::new()),
        Error::LeaseHeld { run, holder, token, expires_at_unix_us } => (
            "ConflictError",
            vec![
                ("run", Int(*run)),
                ("holder", Str(holder.clone())),
                ("token", Int(*token)),
                ("expires_at_unix_us", Int(*expires_at_unix_us)),
            ],
        ),
        Error::StaleLease { run, token, current } => {
            ("ConflictError", vec![("run", Int(*run)), ("token", Int(*token)), ("current", Int(*current))])
        }
        Error::Disconnected { path } => ("ClosedError", vec![("path", Str(path.display().to_string()))]),
        Error::Protocol { .. } | Error::ProtocolVersion { .. } | Error::Remote { .. } => ("Error", Vec::new()),
        _ => ("Error", Vec::new()),
    }
}

/// An instance of the `continuum.errors` class `name` with `message`.
pub(crate) fn new_error(py: Python<'_>, name: &str, message: &str) -> PyErr {
    match instantiate(py, name, message) {
        Ok(exception) => PyErr::from_value(exception),
        Err(error) => error,
    }
}

fn instantiate<'py>(py: Python<'py>, name: &str, message: &str) -> PyResult<Bound<'py, PyAny>> {
    py.import("continuum.errors")?.getattr(name)?.call1((message,))
}

/// The Python exception for `error`.
pub(crate) fn to_py(py: Python<'_>, error: Error) -> PyErr {
    match build(py, &error) {
        Ok(exception) => exception,
        Err(failed) => failed,
    }
}

fn build(py: Python<'_>, error: &Error) -> PyResult<PyErr> {
    let (name, facts) = classify(error);
    let exception = instantiate(py, name, &error.to_string())?;
    for (attribute, fact) in facts {
        match fact {
            Fact::Int(value) => exception.setattr(attribute, value)?,
            Fact::Str(value) => exception.setattr(attribute, value)?,
            Fact::Bool(value) => exception.setattr(attribute, value)?,
        }
    }
    if let Error::OutputNotRecorded { output, source, .. } = error {
        exception.setattr("result", PyBytes::new(py, &output.result))?;
        exception.setattr("delta", crate::convert::delta_to_py(py, &output.delta)?)?;
        exception.setattr("__cause__", build(py, source)?.into_value(py))?;
    }
    Ok(PyErr::from_value(exception))
}

/// The exception for use of a closed store.
pub(crate) fn closed(py: Python<'_>) -> PyErr {
    new_error(py, "ClosedError", "the store is closed")
}

/// The exception for an argument continuum refuses before reaching the store.
pub(crate) fn invalid_argument(py: Python<'_>, message: &str) -> PyErr {
    new_error(py, "InvalidArgumentError", message)
}
