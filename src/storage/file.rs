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
            .open(dir.join(crate::log::LOCK_FILE_NAME))?;
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

    fn live_view(&self) -> io::Result<Option<ReadView>> {
        // A shared map shows later writes (by `pwrite` or through the writable map) at once:
        // both go to the page cache the map reads.
        if self.len()? == 0 {
            return Ok(None);
        }
        crate::storage::mmap::map_read_only(&self.file).map(Some)
    }

    fn view(&self) -> io::Result<ReadView> {
        if self.len()? == 0 {
            return Ok(ReadView::empty());
        }
        crate::storage::mmap::map_read_only(&self.file)
    }
}
