//! Entry points for the fuzz targets in `fuzz/` and for the test that replays their corpus.
//! Not part of the stable API.

use std::path::Path;
use std::sync::Arc;

use crate::config::RecoveryMode;
use crate::log::Log;
use crate::log::record;
use crate::storage::sim::SimStorage;
use crate::storage::{OpenMode, Storage};

/// Decodes `data` as a frame (the first 8 bytes are the segment salt). Must never panic.
pub fn decode_batch(data: &[u8]) {
    let Some((salt, frame)) = data.split_first_chunk::<8>() else { return };
    let salt = u64::from_le_bytes(*salt);
    if let Ok(decoded) = record::decode_frame(frame, salt) {
        let count = record::Records::new(decoded.payload).filter(Result::is_ok).count();
        assert_eq!(count as u64, u64::from(decoded.header.record_count), "a verified frame holds exactly its records");
    }
}

/// Opens a log whose only segment file holds `data`, in every recovery mode, and reads back
/// every record it recovers. Must never panic.
pub fn recover_segment(data: &[u8]) {
    for mode in [RecoveryMode::TolerateTornTail, RecoveryMode::Strict, RecoveryMode::SkipCorrupted] {
        let storage = SimStorage::new(0);
        let dir = Path::new("/fuzz");
        if place_segment(&storage, dir, data).is_err() {
            return;
        }
        let opened = Log::builder(dir).storage(Arc::new(storage)).recovery_mode(mode).segment_bytes(1 << 20).open();
        let Ok(log) = opened else { continue };
        let first = log.first_lsn();
        let Ok(records) = log.iter_from(first) else { continue };
        for item in records {
            let Ok((lsn, bytes)) = item else { break };
            let read = log.read(lsn).ok().flatten();
            assert_eq!(read.as_deref(), Some(&bytes[..]), "read and iteration agree");
        }
    }
}

fn place_segment(storage: &SimStorage, dir: &Path, data: &[u8]) -> std::io::Result<()> {
    storage.create_dir_all(dir)?;
    let path = dir.join("00000000000000000001.seg");
    let file = storage.open(&path, OpenMode::CreateNew)?;
    file.write_all_at(data, 0)?;
    file.sync_data()?;
    storage.sync_dir(dir)
}
