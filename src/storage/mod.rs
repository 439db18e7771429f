//! The file-system boundary: every byte continuum reads or writes goes through [`Storage`].
//!
//! Two implementations exist:
//! - [`FileStorage`]: the real file system (positioned I/O, `fdatasync`, `fallocate`, `flock`, and a
//!   writable map of the active segment).
//! - [`ReadOnlyStorage`]: reads through another one and refuses every change (read-only opens).
//! - [`SimStorage`](sim::SimStorage): an in-memory file system for tests that keeps written but
//!   unsynced data apart from durable data, can crash with several kinds of damage, and can fail
//!   any chosen call with `EIO` or `ENOSPC`.
//!
//! The trait is deliberately small: it is exactly what the log needs, so that a simulated
//! implementation can model every call's crash behaviour.

mod file;
mod mmap;
mod read_only;
mod view;

// Test support (the simulated file system the tests crash, tear and fail), not API.
#[doc(hidden)]
pub mod sim;

use std::fmt;
use std::io;
use std::path::Path;
use std::sync::Arc;

/// Name of the lock file inside a store directory.
pub const LOCK_FILE_NAME: &str = "LOCK";

pub use file::FileStorage;
pub use mmap::WriteMap;
pub use read_only::ReadOnlyStorage;
pub use view::ReadView;

/// How [`Storage::open`] opens a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// Create a new file for reading and writing; fails if it exists.
    CreateNew,
    /// Open an existing file for reading and writing.
    ReadWrite,
    /// Open an existing file for reading only.
    ReadOnly,
}

/// A file system, real or simulated.
///
/// Paths are absolute or relative to the process's working directory; the log only ever passes
/// paths inside its own store directory. Errors are plain [`io::Error`]s: the log adds the
/// operation and path when it turns them into [`crate::Error`]. `ENOSPC` must surface as
/// [`io::ErrorKind::StorageFull`], and a lock held elsewhere as [`io::ErrorKind::WouldBlock`].
pub trait Storage: Send + Sync + fmt::Debug {
    /// Creates `dir` and its missing parents.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;

    /// Lists the names of the regular files directly inside `dir`.
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>>;

    /// Opens (or creates) the file at `path`.
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn StorageFile>>;

    /// Atomically renames `from` to `to`, replacing `to` if it exists.
    ///
    /// The rename is durable only after [`Storage::sync_dir`] on the parent directory.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;

    /// Removes the file at `path`; durable only after [`Storage::sync_dir`].
    fn remove_file(&self, path: &Path) -> io::Result<()>;

    /// Makes every create, rename and removal inside `dir` durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;

    /// Takes an exclusive lock on `dir`, held until the returned guard is dropped.
    ///
    /// # Errors
    /// [`io::ErrorKind::WouldBlock`] when the lock is held, by this process or another one.
    fn lock_dir(&self, dir: &Path) -> io::Result<DirLock>;
}

/// An open file of a [`Storage`].
#[expect(clippy::len_without_is_empty, reason = "files are sized, not collections")]
pub trait StorageFile: Send + Sync + fmt::Debug {
    /// Reads exactly `buf.len()` bytes at `offset`; a short file is an
    /// [`io::ErrorKind::UnexpectedEof`] error.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;

    /// Writes all of `buf` at `offset`. The bytes are visible to readers at once and durable
    /// only after [`StorageFile::sync_data`].
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;

    /// Makes every written byte, and the file's length, durable (`fdatasync`).
    fn sync_data(&self) -> io::Result<()>;

    /// The file's current length in bytes.
    fn len(&self) -> io::Result<u64>;

    /// Sets the file's length, cutting or zero-extending it. Durable after
    /// [`StorageFile::sync_data`].
    fn set_len(&self, len: u64) -> io::Result<()>;

    /// Reserves disk space so that writes below `len` cannot fail with `ENOSPC`, extending the
    /// file with zeros to at least `len` bytes.
    fn allocate(&self, len: u64) -> io::Result<()>;

    /// A writable shared map of the whole file, if the implementation offers one and the
    /// file's blocks are reserved (so that writes through it cannot run out of space). Bytes
    /// written through it are visible to positioned reads at once and durable after
    /// [`StorageFile::sync_data`], exactly as written ones.
    fn writable_map(&self) -> io::Result<Option<WriteMap>> {
        Ok(None)
    }

    /// An offset from which the file holds only zeros because nothing was ever written there
    /// (holes, or preallocated extents never written), if the file system can tell; `None`
    /// otherwise. Recovery scans a preallocated segment only up to it, instead of reading tens
    /// of megabytes of zeros. It may be larger than the written end, never smaller.
    fn data_end_hint(&self) -> io::Result<Option<u64>> {
        Ok(None)
    }

    /// The whole file's bytes as they are now, read with positioned reads.
    ///
    /// Never a memory map: a read the disk fails, or a file cut short meanwhile, is an error
    /// of this call, not a `SIGBUS` wherever the bytes are touched later. Callers use it only
    /// for files that no longer change (sealed segments) or for bytes below a length they
    /// know to be written.
    fn view(&self) -> io::Result<ReadView>;
}

/// Proof that a directory is locked; the lock is released on drop.
pub struct DirLock {
    _guard: Box<dyn Send + Sync>,
}

impl DirLock {
    /// Wraps whatever keeps the lock held (an open file, a registration in a simulator).
    pub fn new(guard: Box<dyn Send + Sync>) -> Self {
        Self { _guard: guard }
    }
}

impl fmt::Debug for DirLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DirLock")
    }
}
