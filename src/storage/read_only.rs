//! [`ReadOnlyStorage`]: reads through another [`Storage`] and refuses every change.
//!
//! A read-only open (`Log::open_read_only`, `Store::open_read_only`) runs on this wrapper, so
//! that no code path, present or future, can write, truncate, sync, create, rename, delete or
//! lock anything in the store: every byte continuum touches goes through `Storage`, and here
//! every mutating call fails with [`io::ErrorKind::ReadOnlyFilesystem`].
//!
//! Views are copies, not memory maps: another process may hold the store open for writing and,
//! after its own crash recovery, truncate a segment; a map of a file truncated under it faults
//! (`SIGBUS`), a copy does not.

use std::io;
use std::path::Path;
use std::sync::Arc;

use super::{DirLock, OpenMode, ReadView, Storage, StorageFile, WriteMap};

/// A [`Storage`] that only reads.
#[derive(Debug, Clone)]
pub struct ReadOnlyStorage {
    inner: Arc<dyn Storage>,
}

impl ReadOnlyStorage {
    /// Reads through `inner`.
    pub fn new(inner: Arc<dyn Storage>) -> Self {
        Self { inner }
    }
}

fn refused() -> io::Error {
    io::Error::new(io::ErrorKind::ReadOnlyFilesystem, "the store is open read-only")
}

impl Storage for ReadOnlyStorage {
    fn create_dir_all(&self, _dir: &Path) -> io::Result<()> {
        Err(refused())
    }

    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.inner.list_dir(dir)
    }

    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn StorageFile>> {
        if mode != OpenMode::ReadOnly {
            return Err(refused());
        }
        Ok(Arc::new(ReadOnlyFile { inner: self.inner.open(path, OpenMode::ReadOnly)? }))
    }

    fn rename(&self, _from: &Path, _to: &Path) -> io::Result<()> {
        Err(refused())
    }

    fn remove_file(&self, _path: &Path) -> io::Result<()> {
        Err(refused())
    }

    fn sync_dir(&self, _dir: &Path) -> io::Result<()> {
        Err(refused())
    }

    fn lock_dir(&self, _dir: &Path) -> io::Result<DirLock> {
        Err(refused())
    }
}

#[derive(Debug)]
struct ReadOnlyFile {
    inner: Arc<dyn StorageFile>,
}

impl StorageFile for ReadOnlyFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_exact_at(buf, offset)
    }

    fn write_all_at(&self, _buf: &[u8], _offset: u64) -> io::Result<()> {
        Err(refused())
    }

    fn sync_data(&self) -> io::Result<()> {
        Err(refused())
    }

    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }

    fn set_len(&self, _len: u64) -> io::Result<()> {
        Err(refused())
    }

    fn allocate(&self, _len: u64) -> io::Result<()> {
        Err(refused())
    }

    fn writable_map(&self) -> io::Result<Option<WriteMap>> {
        Ok(None)
    }

    fn view(&self) -> io::Result<ReadView> {
        let len = usize::try_from(self.inner.len()?).map_err(|_| io::Error::from(io::ErrorKind::OutOfMemory))?;
        let mut bytes = vec![0u8; len];
        // A file that shrank since `len` (another process cut its torn tail) reads short.
        read_prefix(self.inner.as_ref(), &mut bytes)?;
        Ok(ReadView::from_vec(bytes))
    }
}

/// Fills `buf` from offset 0, leaving zeros past the end of a file that shrank meanwhile.
fn read_prefix(file: &dyn StorageFile, buf: &mut [u8]) -> io::Result<()> {
    const CHUNK_BYTES: usize = 4 << 20;
    let mut at = 0;
    while at < buf.len() {
        let end = (at + CHUNK_BYTES).min(buf.len());
        match file.read_exact_at(&mut buf[at..end], at as u64) {
            Ok(()) => at = end,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::sim::SimStorage;

    #[test]
    fn every_change_is_refused_and_reads_pass_through() {
        let sim = SimStorage::new(7);
        let dir = Path::new("/d");
        sim.create_dir_all(dir).expect("create");
        let file = sim.open(&dir.join("f"), OpenMode::CreateNew).expect("create file");
        file.write_all_at(b"hello", 0).expect("write");
        let storage = ReadOnlyStorage::new(Arc::new(sim));
        let kind = |r: io::Result<()>| r.expect_err("refused").kind();
        assert_eq!(kind(storage.create_dir_all(dir)), io::ErrorKind::ReadOnlyFilesystem);
        assert_eq!(kind(storage.rename(&dir.join("f"), &dir.join("g"))), io::ErrorKind::ReadOnlyFilesystem);
        assert_eq!(kind(storage.remove_file(&dir.join("f"))), io::ErrorKind::ReadOnlyFilesystem);
        assert_eq!(kind(storage.sync_dir(dir)), io::ErrorKind::ReadOnlyFilesystem);
        assert!(storage.lock_dir(dir).is_err());
        assert!(storage.open(&dir.join("f"), OpenMode::ReadWrite).is_err());
        assert!(storage.open(&dir.join("h"), OpenMode::CreateNew).is_err());
        let file = storage.open(&dir.join("f"), OpenMode::ReadOnly).expect("open read-only");
        assert_eq!(kind(file.write_all_at(b"x", 0)), io::ErrorKind::ReadOnlyFilesystem);
        assert_eq!(kind(file.sync_data()), io::ErrorKind::ReadOnlyFilesystem);
        assert_eq!(kind(file.set_len(0)), io::ErrorKind::ReadOnlyFilesystem);
        assert_eq!(kind(file.allocate(100)), io::ErrorKind::ReadOnlyFilesystem);
        assert!(file.writable_map().expect("no map").is_none());
        assert_eq!(&*file.view().expect("view"), b"hello");
        assert_eq!(storage.list_dir(dir).expect("list"), vec!["f".to_owned()]);
    }
}
