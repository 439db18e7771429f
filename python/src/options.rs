//! The keyword options of `continuum.Store(path, **options)`, applied to a
//! [`continuum::StoreBuilder`].

use std::time::Duration;

use continuum::{Durability, RecoveryMode, RetentionPolicy, SnapshotPolicy, StoreBuilder};
use pyo3::prelude::*;

use crate::errors::invalid_argument;

/// The options a Python caller may set; `None` keeps the Rust default.
#[derive(Default)]
pub(crate) struct Options {
    pub durability: Option<String>,
    pub flush_interval: Option<f64>,
    pub recovery_mode: Option<String>,
    pub segment_bytes: Option<u64>,
    pub snapshot_every_atoms: Option<u32>,
    pub snapshot_every: Option<f64>,
    pub snapshots_per_agent: Option<usize>,
    pub finished_run_age: Option<f64>,
    pub commit_spin: Option<f64>,
    pub background: Option<bool>,
}

/// Seconds as a duration; a negative or non-finite value is refused.
fn seconds(py: Python<'_>, name: &str, value: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(value)
        .map_err(|_| invalid_argument(py, &format!("{name} must be a finite, non-negative number of seconds")))
}

fn durability(py: Python<'_>, name: &str) -> PyResult<Durability> {
    match name {
        "sync" => Ok(Durability::Sync),
        "buffered" => Ok(Durability::Buffered),
        "none" => Ok(Durability::None),
        other => Err(invalid_argument(py, &format!("durability {other:?} is not one of 'sync', 'buffered', 'none'"))),
    }
}

fn recovery_mode(py: Python<'_>, name: &str) -> PyResult<RecoveryMode> {
    match name {
        "tolerate_torn_tail" => Ok(RecoveryMode::TolerateTornTail),
        "strict" => Ok(RecoveryMode::Strict),
        "skip_corrupted" => Ok(RecoveryMode::SkipCorrupted),
        other => Err(invalid_argument(
            py,
            &format!("recovery_mode {other:?} is not one of 'tolerate_torn_tail', 'strict', 'skip_corrupted'"),
        )),
    }
}

impl Options {
    /// `builder` with every option set.
    pub(crate) fn apply(self, py: Python<'_>, mut builder: StoreBuilder) -> PyResult<StoreBuilder> {
        if let Some(name) = &self.durability {
            builder = builder.atom_durability(durability(py, name)?);
        }
        if let Some(value) = self.flush_interval {
            builder = builder.flush_interval(seconds(py, "flush_interval", value)?);
        }
        if let Some(name) = &self.recovery_mode {
            builder = builder.recovery_mode(recovery_mode(py, name)?);
        }
        if let Some(bytes) = self.segment_bytes {
            builder = builder.segment_bytes(bytes);
        }
        if self.snapshot_every_atoms.is_some() || self.snapshot_every.is_some() {
            let default = SnapshotPolicy::default();
            let every = match self.snapshot_every {
                Some(value) => seconds(py, "snapshot_every", value)?,
                None => default.every,
            };
            builder = builder.snapshot_policy(SnapshotPolicy {
                every_atoms: self.snapshot_every_atoms.unwrap_or(default.every_atoms),
                every,
            });
        }
        if self.snapshots_per_agent.is_some() || self.finished_run_age.is_some() {
            let default = RetentionPolicy::default();
            let finished_run_age = match self.finished_run_age {
                Some(value) => Some(seconds(py, "finished_run_age", value)?),
                None => default.finished_run_age,
            };
            builder = builder.retention(RetentionPolicy {
                snapshots_per_agent: self.snapshots_per_agent.unwrap_or(default.snapshots_per_agent),
                finished_run_age,
            });
        }
        if let Some(value) = self.commit_spin {
            builder = builder.commit_spin(seconds(py, "commit_spin", value)?);
        }
        if let Some(enabled) = self.background {
            builder = builder.background(enabled);
        }
        Ok(builder)
    }
}
