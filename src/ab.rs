//! Environment switches that turn the group-commit writer's spinning, its hold-off and the gather off, for A/B
//! runs of the benchmarks (`docs/BENCHMARKS.md` §12). Each is read once per process; with
//! none set the writer runs as documented.

use std::sync::LazyLock;

/// Whether the environment variable `name` is set (to anything).
fn flag(name: &str) -> bool {
    std::env::var_os(name).is_some()
}

/// `CONTINUUM_AB_NO_SPIN`: waiters and gatherers never spin (as `commit_spin` zero).
pub(crate) static NO_SPIN: LazyLock<bool> = LazyLock::new(|| flag("CONTINUUM_AB_NO_SPIN"));
/// `CONTINUUM_AB_NO_HOLDOFF`: slow yields never hold spinning off.
pub(crate) static NO_HOLDOFF: LazyLock<bool> = LazyLock::new(|| flag("CONTINUUM_AB_NO_HOLDOFF"));
/// `CONTINUUM_AB_NO_GATHER`: a leader commits what is queued without waiting for its group.
pub(crate) static NO_GATHER: LazyLock<bool> = LazyLock::new(|| flag("CONTINUUM_AB_NO_GATHER"));
