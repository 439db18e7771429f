//! [`FileStorage`]: the real file system.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use super::{DirLock, OpenMode, ReadView, Storage, StorageFile, WriteMap};

/// The operating system's file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct FileStorage;

impl FileStorage {
    /// The real file system.
    pub fn new() -> Self {
        Self
    }
}

impl Storage for FileStorage {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        fs::create_dir_all(dir)
    }

    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            if !entry.file_type()?.is_file() {
                continue;
            }
            if let Ok(name) = entry.file_name().into_string() {
                names.push(name);
            }
        }
        Ok(names)
    }

    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn StorageFile>> {
        let mut options = OpenOptions::new();
        match mode {
            OpenMode::CreateNew => options.read(true).write(true).create_new(true),
            OpenMode::ReadWrite => options.read(true).write(true),
            OpenMode::ReadOnly => options.read(true),
        };
        Ok(Arc::new(RealFile { file: options.open(path)? }))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        // IMPORTANT: creates, renames and unlinks are durable only once the directory is synced.
        File::open(dir)?.sync_all()
    }

    fn lock_dir(&self, dir: &Path) -> io::Result<DirLock> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join(super::LOCK_FILE_NAME))?;
        // flock(2) locks belong to the open file description, so a second open in this same
        // process conflicts too, as it must.
        match file.try_lock() {
            Ok(()) => Ok(DirLock::new(Box::new(file))),
            Err(fs::TryLockError::WouldBlock) => Err(io::ErrorKind::WouldBlock.into()),
            Err(fs::TryLockError::Error(error)) => Err(error),
        }
    }
}

#[derive(Debug)]
struct RealFile {
    file: File,
}

impl StorageFile for RealFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(buf, offset)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    fn allocate(&self, len: u64) -> io::Result<()> {
        match rustix::fs::fallocate(&self.file, rustix::fs::FallocateFlags::empty(), 0, len) {
            Ok(()) => Ok(()),
            // Some file systems (tmpfs on old kernels, some FUSE mounts) cannot preallocate:
            // extending the length still gives zero-filled space, only without the reservation.
            Err(rustix::io::Errno::OPNOTSUPP) => {
                if self.len()? < len {
                    self.file.set_len(len)?;
                }
                Ok(())
            }
            Err(errno) => Err(errno.into()),
        }
    }

    fn writable_map(&self) -> io::Result<Option<WriteMap>> {
        let len = self.len()?;
        // Reserve every block again (a no-op when they are): without the reservation a write
        // through the map could hit a full disk as SIGBUS instead of an error.
        if len == 0 || rustix::fs::fallocate(&self.file, rustix::fs::FallocateFlags::empty(), 0, len).is_err() {
            return Ok(None);
        }
        crate::storage::mmap::map_writable(&self.file).map(Some)
    }

    fn data_end_hint(&self) -> io::Result<Option<u64>> {
        // Walk the data regions with SEEK_DATA / SEEK_HOLE (Linux reports never-written
        // preallocated extents as holes, and dirty page-cache pages as data). A file system
        // that does not support them, or a file of many regions, gives no hint.
        use rustix::fs::{SeekFrom, seek};
        const REGIONS_MAX: usize = 64;
        let (mut at, mut end) = (0u64, 0u64);
        for _ in 0..REGIONS_MAX {
            let data = match seek(&self.file, SeekFrom::Data(at)) {
                Ok(data) => data,
                Err(rustix::io::Errno::NXIO) => return Ok(Some(end)),
                Err(_) => return Ok(None),
            };
            match seek(&self.file, SeekFrom::Hole(data)) {
                Ok(hole) => (at, end) = (hole, hole),
                Err(_) => return Ok(None),
            }
        }
        Ok(None)
    }

    fn view(&self) -> io::Result<ReadView> {
        // A copy read with `pread`, never a map: a read the disk fails is an error here, where
        // through a map it would be a `SIGBUS` at whatever instruction touched the page.
        let len = usize::try_from(self.len()?).map_err(|_| io::Error::from(io::ErrorKind::OutOfMemory))?;
        let mut bytes = vec![0u8; len];
        self.file.read_exact_at(&mut bytes, 0)?;
        Ok(ReadView::from_vec(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hint may overstate the written end, never understate it: recovery trusts that
    /// nothing past it was ever written. Checked on a preallocated file written in two places,
    /// through `pwrite` and through the writable map (dirty pages, not yet written back).
    #[test]
    fn the_data_end_hint_never_falls_below_a_written_byte() {
        let dir = tempfile::tempdir().expect("tempdir");
        let storage = FileStorage::new();
        let file = storage.open(&dir.path().join("seg"), OpenMode::CreateNew).expect("create");
        file.allocate(4 << 20).expect("allocate");
        let written_end = |hint: Option<u64>, end: u64| hint.is_none_or(|hint| hint >= end);
        assert!(written_end(file.data_end_hint().expect("hint"), 0));
        file.write_all_at(&[7u8; 5000], 0).expect("write");
        assert!(written_end(file.data_end_hint().expect("hint"), 5000));
        file.write_all_at(&[9u8; 100], 1 << 20).expect("write");
        assert!(written_end(file.data_end_hint().expect("hint"), (1 << 20) + 100));
        if let Some(mut map) = file.writable_map().expect("map") {
            assert!(map.write_at(&[3u8; 10], 3 << 20));
            assert!(written_end(file.data_end_hint().expect("hint"), (3 << 20) + 10));
        }
        file.sync_data().expect("sync");
        let hint = file.data_end_hint().expect("hint");
        assert!(written_end(hint, (3 << 20) + 10) || file.writable_map().expect("map").is_none());
        eprintln!("data end hint after writes at 0, 1 MiB and 3 MiB of a 4 MiB file: {hint:?}");
    }
}
