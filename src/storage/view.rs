//! [`ReadView`]: immutable bytes of a file, read into memory.

use std::fmt;
use std::ops::Deref;

/// Immutable bytes of a whole file, read into memory (never mapped: see
/// [`StorageFile::view`](super::StorageFile::view)). Cheap to share behind an `Arc`.
pub struct ReadView {
    bytes: Vec<u8>,
}

impl ReadView {
    /// A view over bytes the caller owns.
    pub fn from_vec(bytes: Vec<u8>) -> Self {
        Self { bytes }
    }
}

impl Deref for ReadView {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

impl AsRef<[u8]> for ReadView {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl fmt::Debug for ReadView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadView").field("len", &self.len()).finish()
    }
}
