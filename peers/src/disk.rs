//! Bytes on disk, the raw `fdatasync` floor, and the machine the figures come from.

use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Bytes one directory holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskUsage {
    /// Blocks the file system allocated to its files (`st_blocks` × 512).
    pub allocated: u64,
    /// The sum of its files' lengths (`st_size`), preallocated tails included.
    pub length: u64,
    /// Regular files counted.
    pub files: u64,
}

/// The bytes the regular files under `dir` (recursively) take.
///
/// # Errors
/// A directory or file that cannot be listed or inspected.
pub fn disk_usage(dir: &Path) -> std::io::Result<DiskUsage> {
    let mut usage = DiskUsage::default();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            // A file removed while the walk runs (a store's background thread replacing a
            // snapshot or deleting a compacted segment) holds no bytes any more.
            let metadata = match entry.metadata() {
                Ok(metadata) => metadata,
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
                Err(error) => return Err(error),
            };
            if metadata.is_dir() {
                pending.push(entry.path());
            } else if metadata.is_file() {
                usage.allocated += metadata.blocks() * 512;
                usage.length += metadata.len();
                usage.files += 1;
            }
        }
    }
    Ok(usage)
}

/// The floor under every durable append: a 512-byte positioned write to a preallocated file,
/// then `fdatasync`. A full file is replaced by a fresh preallocated one.
#[derive(Debug)]
pub struct FdatasyncProbe {
    dir: PathBuf,
    file: File,
    file_index: u64,
    offset: u64,
}

impl FdatasyncProbe {
    /// Size of each preallocated file (continuum's default segment size).
    pub const FILE_BYTES: u64 = 64 << 20;
    /// Bytes written before each `fdatasync`.
    pub const WRITE_BYTES: usize = 512;

    /// A probe writing files in `dir`.
    ///
    /// # Errors
    /// The file cannot be created, preallocated or synced.
    pub fn new(dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let file = Self::create_file(dir, 0)?;
        Ok(Self { dir: dir.to_path_buf(), file, file_index: 0, offset: 0 })
    }

    fn create_file(dir: &Path, index: u64) -> std::io::Result<File> {
        let path = dir.join(format!("raw-{index}"));
        let file = File::options().read(true).write(true).create_new(true).open(path)?;
        rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, Self::FILE_BYTES)?;
        file.sync_all()?;
        Ok(file)
    }

    /// One 512-byte write and `fdatasync`; returns how long both took.
    ///
    /// # Errors
    /// The write, the sync, or a rotation failed.
    pub fn write_and_sync(&mut self) -> std::io::Result<Duration> {
        if self.offset + Self::WRITE_BYTES as u64 > Self::FILE_BYTES {
            self.rotate()?;
        }
        let block = [0xA5_u8; Self::WRITE_BYTES];
        let start = Instant::now();
        self.file.write_all_at(&block, self.offset)?;
        self.file.sync_data()?;
        let elapsed = start.elapsed();
        self.offset += Self::WRITE_BYTES as u64;
        Ok(elapsed)
    }

    fn rotate(&mut self) -> std::io::Result<()> {
        let next = self.file_index + 1;
        self.file = Self::create_file(&self.dir, next)?;
        std::fs::remove_file(self.dir.join(format!("raw-{}", self.file_index)))?;
        self.file_index = next;
        self.offset = 0;
        Ok(())
    }
}

/// Facts about the machine, as the suite prints them before its figures.
#[derive(Clone, Debug)]
pub struct Machine {
    /// Logical cores available to this process.
    pub cores: usize,
    /// The CPU's model name, from `/proc/cpuinfo`.
    pub cpu: String,
    /// Total memory, from `/proc/meminfo`.
    pub memory: String,
    /// The kernel release.
    pub kernel: String,
    /// The file system and device of the benchmark directory, as `df -T` prints them.
    pub file_system: String,
}

impl Machine {
    /// Describes this machine and the file system holding `dir`. Facts that cannot be read are
    /// reported as `unknown`.
    pub fn describe(dir: &Path) -> Self {
        let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
        let field = |text: &str, name: &str| {
            text.lines()
                .find(|line| line.starts_with(name))
                .and_then(|line| line.split_once(':'))
                .map_or_else(|| "unknown".to_owned(), |(_, value)| value.trim().to_owned())
        };
        let df = std::process::Command::new("df").arg("-T").arg(dir).output();
        let file_system = df
            .ok()
            .and_then(|out| String::from_utf8(out.stdout).ok())
            .and_then(|text| {
                text.lines().nth(1).map(|line| line.split_whitespace().take(2).collect::<Vec<_>>().join(" "))
            })
            .unwrap_or_else(|| "unknown".to_owned());
        Self {
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu: field(&read("/proc/cpuinfo"), "model name"),
            memory: field(&read("/proc/meminfo"), "MemTotal"),
            kernel: read("/proc/sys/kernel/osrelease").trim().to_owned(),
            file_system,
        }
    }

    /// Whether the benchmark directory is on a memory file system (figures would be meaningless).
    pub fn on_tmpfs(&self) -> bool {
        self.file_system.contains("tmpfs") || self.file_system.contains("ramfs")
    }
}
