//! The one place continuum maps a file into memory: the writer's writable map of the active
//! segment (docs/FORMAT.md M7). Nothing is read through a map (docs/ARCHITECTURE.md, "I/O").
#![expect(unsafe_code, reason = "memory-mapping a file is unsafe in memmap2's API")]

use std::fs::File;
use std::io;

/// A writable shared mapping of a whole preallocated file: writing into it puts the bytes in the
/// page cache, where every reader of the file sees them, without a system call. `fdatasync` on
/// the file makes them durable like written ones.
pub struct WriteMap {
    map: memmap2::MmapMut,
}

impl std::fmt::Debug for WriteMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteMap").field("len", &self.map.len()).finish()
    }
}

impl WriteMap {
    /// Copies `bytes` to `offset`; returns `false` (and copies nothing) if they do not fit.
    pub fn write_at(&mut self, bytes: &[u8], offset: u64) -> bool {
        let Ok(start) = usize::try_from(offset) else { return false };
        let Some(target) = start.checked_add(bytes.len()).and_then(|end| self.map.get_mut(start..end)) else {
            return false;
        };
        target.copy_from_slice(bytes);
        true
    }
}

/// Maps `file` writable and shared. The caller has reserved its blocks (`fallocate`), so a
/// write through the map can never fail for lack of space (which would be a `SIGBUS`).
pub(crate) fn map_writable(file: &File) -> io::Result<WriteMap> {
    // SAFETY: the mapping is written only by the log's group-commit leader (one at a time,
    // under the leader lock) and only past the segment's published end; nothing ever reads
    // through it. Readers use positioned reads of bytes below the published end, which the
    // leader never rewrites. The store directory is under
    // an exclusive lock, so no other process changes or truncates the file, and the file's
    // blocks were reserved with fallocate before it was mapped.
    let map = unsafe { memmap2::MmapMut::map_mut(file)? };
    Ok(WriteMap { map })
}
