//! okaywal 0.3.1: one committed entry per atom (one chunk holding agent, atom id and delta).
//!
//! okaywal is a write-ahead log that hands segments to a checkpointer and recycles them.
//! Holding agents' checkpoints means keeping every atom, so checkpointing is turned off
//! (`checkpoint_after_bytes = u64::MAX`) and the log keeps growing. okaywal has no index:
//! reopening replays every entry through the [`LogManager`], which here records where each
//! agent's atoms are, and resuming an agent reads them back with `read_at`.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use okaywal::{Configuration, Entry, EntryId, LogManager, LogPosition, ReadChunkResult, SegmentReader, WriteAheadLog};

use crate::workload::{decode_framed, framed, framed_agent};
use crate::{AtomRef, AtomSink, Error, Mode, Result, Resumed};

const ENGINE: &str = "okaywal";
/// Bytes preallocated per log file, as continuum preallocates its segments.
const PREALLOCATE_BYTES: u32 = 64 << 20;

/// Bytes okaywal writes around a chunk's data: a 5-byte header before it (kind, length), a
/// CRC-32 after it; and one end-of-entry byte after an entry's last chunk.
const CHUNK_OVERHEAD_BYTES: u64 = 9;
const END_OF_ENTRY_BYTES: u64 = 1;

/// Where each agent's atoms are, in atom order, and where each log file's last entry ends.
#[derive(Debug, Default)]
struct Index {
    positions: HashMap<u32, Vec<LogPosition>>,
    file_ends: HashMap<u64, u64>,
}

impl Index {
    fn add(
        &mut self,
        agent: u32,
        position: LogPosition,
        data_bytes: usize,
        last_of_entry: bool,
    ) -> std::io::Result<()> {
        let (file_id, offset) = file_and_offset(position)?;
        let end =
            offset + CHUNK_OVERHEAD_BYTES + data_bytes as u64 + if last_of_entry { END_OF_ENTRY_BYTES } else { 0 };
        let file_end = self.file_ends.entry(file_id).or_default();
        *file_end = (*file_end).max(end);
        self.positions.entry(agent).or_default().push(position);
        Ok(())
    }
}

/// A position's file id and offset, which okaywal exposes only through its serialisation.
fn file_and_offset(position: LogPosition) -> std::io::Result<(u64, u64)> {
    let mut bytes = Vec::with_capacity(usize::from(LogPosition::SERIALIZED_LENGTH));
    position.serialize_to(&mut bytes)?;
    let word = |at: usize| bytes.get(at..at + 8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes);
    word(0).zip(word(8)).ok_or_else(|| std::io::Error::other("a log position serialises to 16 bytes"))
}

type Positions = Arc<Mutex<Index>>;

fn lock(positions: &Positions) -> std::sync::MutexGuard<'_, Index> {
    positions.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Rebuilds [`Positions`] while okaywal replays the log on open.
#[derive(Debug)]
struct Indexer {
    positions: Positions,
}

impl Indexer {
    fn record_entry(&self, entry: &mut Entry<'_>) -> std::io::Result<()> {
        let mut found = Vec::new();
        loop {
            match entry.read_chunk()? {
                ReadChunkResult::Chunk(mut chunk) => {
                    let position = chunk.log_position();
                    let data = chunk.read_all()?;
                    if !chunk.check_crc()? {
                        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "okaywal chunk CRC mismatch"));
                    }
                    let agent = framed_agent(&data)
                        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "chunk without header"))?;
                    found.push((agent, position, data.len()));
                }
                ReadChunkResult::EndOfEntry => break,
                // An entry torn by a crash was never committed: none of its chunks count.
                ReadChunkResult::AbortedEntry => return Ok(()),
            }
        }
        let mut index = lock(&self.positions);
        let count = found.len();
        for (at, (agent, position, data_bytes)) in found.into_iter().enumerate() {
            index.add(agent, position, data_bytes, at + 1 == count)?;
        }
        Ok(())
    }
}

impl LogManager for Indexer {
    fn recover(&mut self, entry: &mut Entry<'_>) -> std::io::Result<()> {
        self.record_entry(entry)
    }

    fn checkpoint_to(
        &mut self,
        _last: EntryId,
        _entries: &mut SegmentReader,
        _wal: &WriteAheadLog,
    ) -> std::io::Result<()> {
        // Never called: checkpointing is off, the log keeps every atom.
        Ok(())
    }
}

/// An okaywal directory.
pub(crate) struct OkaywalSink {
    wal: WriteAheadLog,
    positions: Positions,
}

impl OkaywalSink {
    /// Opens (recovering) the log. okaywal always syncs a commit, so `mode` only matters to
    /// the caller: [`Mode::Buffered`] is refused before this is reached.
    pub(crate) fn open(dir: &Path, _mode: Mode) -> Result<Self> {
        let positions = Positions::default();
        let wal = Configuration::default_for(dir)
            .preallocate_bytes(PREALLOCATE_BYTES)
            .checkpoint_after_bytes(u64::MAX)
            .open(Indexer { positions: Arc::clone(&positions) })?;
        Ok(Self { wal, positions })
    }
}

impl AtomSink for OkaywalSink {
    fn append(&self, atom: &AtomRef<'_>) -> Result<()> {
        let record = framed(atom);
        let mut writer = self.wal.begin_entry()?;
        let chunk = writer.write_chunk(&record)?;
        writer.commit()?;
        lock(&self.positions).add(atom.agent, chunk.position, record.len(), true)?;
        Ok(())
    }

    /// One entry holding one chunk per atom, committed once: the same bytes per atom as one
    /// entry each, less one entry header and trailer.
    fn append_batch(&self, atoms: &[AtomRef<'_>]) -> Result<()> {
        let mut writer = self.wal.begin_entry()?;
        let mut written = Vec::with_capacity(atoms.len());
        for atom in atoms {
            let record = framed(atom);
            written.push((atom.agent, writer.write_chunk(&record)?.position, record.len()));
        }
        writer.commit()?;
        let mut index = lock(&self.positions);
        let count = written.len();
        for (at, (agent, position, data_bytes)) in written.into_iter().enumerate() {
            index.add(agent, position, data_bytes, at + 1 == count)?;
        }
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        // Every commit is synced already.
        Ok(())
    }

    fn resume(&self, agent: u32) -> Result<Resumed> {
        let positions = lock(&self.positions).positions.get(&agent).cloned().unwrap_or_default();
        let mut record = Vec::new();
        let mut atoms = 0;
        for position in positions {
            let mut reader = self.wal.read_at(position)?;
            record.clear();
            reader.read_to_end(&mut record)?;
            if !reader.crc_is_valid()? {
                return Err(Error::Malformed { engine: ENGINE, reason: "chunk CRC mismatch" });
            }
            std::hint::black_box(decode_framed(ENGINE, &record)?);
            atoms += 1;
        }
        Ok(Resumed { atoms })
    }

    /// Where each file's last entry ends: okaywal's files are preallocated (blocks and all)
    /// to a multiple of 64 MiB here, so their lengths say little.
    fn used_bytes(&self) -> Result<Option<u64>> {
        Ok(Some(lock(&self.positions).file_ends.values().sum()))
    }

    fn close(self: Box<Self>) -> Result<()> {
        self.wal.shutdown()?;
        Ok(())
    }
}
