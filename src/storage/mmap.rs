//! The one place continuum maps files into memory.
#![expect(unsafe_code, reason = "memory-mapping a file is unsafe in memmap2's API")]

use std::fs::File;
use std::io;

use super::ReadView;

/// Maps `file` read-only.
pub(crate) fn map_read_only(file: &File) -> io::Result<ReadView> {
    // SAFETY: a mapping is undefined behaviour only if the file is changed or truncated while
    // mapped. The log maps only sealed segments, which it never writes again, and the active
    // segment below its published write offset, which it never rewrites; the store directory is
    // held under an exclusive lock (`Storage::lock_dir`), so no other continuum process writes
    // it. Segments are deleted only by unlinking, which keeps the mapped inode alive.
    let map = unsafe { memmap2::Mmap::map(file)? };
    Ok(ReadView::from_mmap(map))
}
