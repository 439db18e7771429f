//! [`Problem`]: one piece of damage a verification found, where and what.

use std::path::{Path, PathBuf};

use crate::error::Error;

/// One problem a verification found (`inspect::verify`): the file, the byte offset in it, and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The segment or snapshot file.
    pub file: PathBuf,
    /// Byte offset of the problem in that file.
    pub offset: u64,
    /// What is wrong, as a sentence.
    pub what: String,
}

impl Problem {
    /// The problem an error names (its segment and offset for corruption; the path for I/O).
    pub(crate) fn from_error(path: &Path, error: &Error) -> Self {
        match error {
            Error::Corruption { segment, offset, kind } => {
                Problem { file: segment.clone(), offset: *offset, what: kind.to_string() }
            }
            other => Problem { file: path.to_path_buf(), offset: 0, what: other.to_string() },
        }
    }
}
