//! The identifiers the store assigns and every layer above the log names records by: runs and
//! atoms. They live below the codec, which writes them into records.

use std::fmt;

/// A run's store-assigned number (dense from 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RunId(pub(crate) u64);

/// An atom's store-assigned number (dense from 1, unique across runs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AtomId(pub(crate) u64);

impl RunId {
    /// A run id from its raw number (as printed by tools); it may name no run.
    pub fn from_raw(run: u64) -> Self {
        Self(run)
    }

    /// The raw number.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl AtomId {
    /// An atom id from its raw number (as printed by tools); it may name no atom.
    pub fn from_raw(atom: u64) -> Self {
        Self(atom)
    }

    /// The raw number.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "run#{}", self.0)
    }
}

impl fmt::Display for AtomId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "atom#{}", self.0)
    }
}
