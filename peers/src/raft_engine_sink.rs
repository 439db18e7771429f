//! tikv/raft-engine 0.4.2: one Raft group per agent, one log entry per atom.
//!
//! raft-engine stores protobuf messages (rust-protobuf 2). An atom is a
//! `google.protobuf.BytesValue` holding the atom id (8 bytes, little-endian: the entry's Raft
//! index, which raft-engine's `MessageExt` must be able to read back) followed by the delta.
//! A Raft `Entry` would carry the same index and data plus a term and a type.

use std::path::Path;

use protobuf::well_known_types::BytesValue;
use raft_engine::{Config, Engine, LogBatch, MessageExt};

use crate::{AtomRef, AtomSink, Error, Mode, Result, Resumed};

const ENGINE: &str = "raft-engine";
/// Entries fetched per read while resuming: bounds memory for a long history.
const FETCH_ENTRIES_MAX: u64 = 4096;
/// The key written with `sync = true` to make earlier unsynced writes durable (raft-engine
/// 0.4.2's `Engine::sync` writes an empty batch, which returns before syncing).
const SYNC_KEY: &[u8] = b"sync";

/// Tells raft-engine where an atom entry keeps its Raft index.
struct AtomEntry;

impl MessageExt for AtomEntry {
    type Entry = BytesValue;

    fn index(entry: &BytesValue) -> u64 {
        entry.value.get(..8).and_then(|bytes| bytes.try_into().ok()).map_or(0, u64::from_le_bytes)
    }
}

/// A raft-engine directory.
pub(crate) struct RaftEngineSink {
    engine: Engine,
    /// `sync` argument of every write: true for durable appends.
    sync: bool,
}

impl RaftEngineSink {
    /// Opens the engine with its default configuration (128 MiB files, LZ4 only for batches
    /// over 8 KiB, which one-atom writes never reach), recovering what the directory holds.
    pub(crate) fn open(dir: &Path, mode: Mode) -> Result<Self> {
        let config = Config { dir: dir.to_string_lossy().into_owned(), ..Config::default() };
        let engine = Engine::open(config)?;
        Ok(Self { engine, sync: mode == Mode::Durable })
    }

    fn group(agent: u32) -> u64 {
        u64::from(agent) + 1
    }
}

fn entry(atom: &AtomRef<'_>) -> BytesValue {
    let mut value = Vec::with_capacity(8 + atom.encoded.len());
    value.extend_from_slice(&atom.atom_id.to_le_bytes());
    value.extend_from_slice(atom.encoded);
    BytesValue { value, ..BytesValue::default() }
}

impl AtomSink for RaftEngineSink {
    fn append(&self, atom: &AtomRef<'_>) -> Result<()> {
        let mut batch = LogBatch::with_capacity(1);
        batch.add_entries::<AtomEntry>(Self::group(atom.agent), &[entry(atom)])?;
        self.engine.write(&mut batch, self.sync)?;
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        let mut batch = LogBatch::with_capacity(1);
        batch.put(0, SYNC_KEY.to_vec(), b"1".to_vec())?;
        self.engine.write(&mut batch, true)?;
        Ok(())
    }

    fn resume(&self, agent: u32) -> Result<Resumed> {
        let group = Self::group(agent);
        let (Some(first), Some(last)) = (self.engine.first_index(group), self.engine.last_index(group)) else {
            return Ok(Resumed::default());
        };
        let mut atoms = 0;
        let mut entries = Vec::new();
        let mut begin = first;
        while begin <= last {
            let end = (begin + FETCH_ENTRIES_MAX).min(last + 1);
            entries.clear();
            self.engine.fetch_entries_to::<AtomEntry>(group, begin, end, None, &mut entries)?;
            for entry in &entries {
                let delta = entry.value.get(8..).ok_or(Error::Malformed { engine: ENGINE, reason: "no atom id" })?;
                std::hint::black_box(<continuum::Delta as prost::Message>::decode(delta)?);
                atoms += 1;
            }
            begin = end;
        }
        Ok(Resumed { atoms })
    }

    fn close(self: Box<Self>) -> Result<()> {
        drop(self.engine);
        Ok(())
    }
}
