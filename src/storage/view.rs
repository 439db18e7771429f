//! [`ReadView`]: immutable bytes of a file, memory-mapped or owned.

use std::fmt;
use std::ops::Deref;

/// Immutable bytes of a whole file: a read-only memory map for real files, an owned copy for
/// simulated ones. Cheap to share behind an `Arc`.
pub struct ReadView {
    inner: Inner,
}

enum Inner {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
    Empty,
}

impl ReadView {
    /// A view over bytes the caller owns.
    pub fn from_vec(bytes: Vec<u8>) -> Self {
        Self { inner: Inner::Owned(bytes) }
    }

    pub(crate) fn from_mmap(map: memmap2::Mmap) -> Self {
        Self { inner: Inner::Mapped(map) }
    }

    pub(crate) fn empty() -> Self {
        Self { inner: Inner::Empty }
    }
}

impl Deref for ReadView {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.inner {
            Inner::Mapped(map) => map,
            Inner::Owned(bytes) => bytes,
            Inner::Empty => &[],
        }
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
