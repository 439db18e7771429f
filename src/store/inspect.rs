//! The store's read-only open and what inspection tools read from it: runs, decoded records
//! with their sizes, and metrics.

use std::path::Path;
use std::sync::Arc;

use crate::codec::envelope::{self, Compression};
use crate::codec::{Codec, CodecError, RecordKind, StoreRecord};
use crate::error::Result;
use crate::metrics::MetricsSnapshot;
use crate::store::{RunId, RunStatus, Shared, Store, StoreBuilder};

/// One run, as [`Store::runs`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunInfo {
    /// Its id.
    pub id: RunId,
    /// Its name.
    pub name: String,
    /// Its status.
    pub status: RunStatus,
}

/// A store record decoded, with how it is stored.
#[derive(Clone, Debug, PartialEq)]
pub struct RecordInfo {
    /// Its kind.
    pub kind: RecordKind,
    /// The atom, run or dictionary it is about (0 for guard records).
    pub subject: u64,
    /// Bytes of the record in the log (envelope included).
    pub stored_bytes: u64,
    /// Bytes of its protobuf body once decompressed.
    pub body_bytes: u64,
    /// How the body is stored: `none`, `zstd`, or `zstd+dictionary` (with the id).
    pub compression: String,
    /// The record.
    pub record: StoreRecord,
}

/// A record decoded with `codec`, with how it is stored.
pub(crate) fn record_info(codec: &Codec, bytes: &[u8]) -> std::result::Result<RecordInfo, CodecError> {
    let (kind, subject) = codec.peek(bytes)?;
    let compression = match envelope::parse(bytes)?.compression {
        Compression::None => "none".to_owned(),
        Compression::Zstd { .. } => "zstd".to_owned(),
        Compression::ZstdDictionary { dictionary_id, .. } => format!("zstd+dictionary#{dictionary_id}"),
    };
    Ok(RecordInfo {
        kind,
        subject,
        stored_bytes: bytes.len() as u64,
        body_bytes: codec.decompressed_body_len(bytes)? as u64,
        compression,
        record: codec.decode(bytes)?,
    })
}

/// Decodes the records of a log without a store, for a damaged store whose index cannot be
/// rebuilt: compression dictionaries are learnt from the records as they are met, so decode
/// them in log order.
#[derive(Debug, Default)]
pub struct RecordDecoder {
    codec: Codec,
}

impl RecordDecoder {
    /// A decoder that knows no dictionary yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Decodes one record; a dictionary record is remembered for the records after it.
    ///
    /// # Errors
    /// A [`CodecError`] for bytes that are not a valid record (or need an unknown dictionary).
    pub fn decode(&self, bytes: &[u8]) -> std::result::Result<RecordInfo, CodecError> {
        let info = record_info(&self.codec, bytes)?;
        if let StoreRecord::Dictionary(dictionary) = &info.record {
            self.codec.add_dictionary(dictionary.id, &dictionary.dictionary);
        }
        Ok(info)
    }
}

impl StoreBuilder {
    /// Opens the store read-only: the log through [`LogBuilder::open_read_only`] (no lock, no
    /// write of any kind; a torn tail is reported, not cut), then the index rebuilt in memory.
    /// Every write (atoms, runs, guards, snapshots) fails.
    ///
    /// [`LogBuilder::open_read_only`]: crate::LogBuilder::open_read_only
    ///
    /// # Errors
    /// As [`LogBuilder::open_read_only`](crate::LogBuilder::open_read_only), plus
    /// [`Error::Codec`](crate::Error::Codec) and
    /// [`Error::InconsistentLog`](crate::Error::InconsistentLog) for records the index cannot
    /// take (which a damaged log opened with `SkipCorrupted` can hold).
    pub fn open_read_only(self) -> Result<Store> {
        self.policies.validate()?;
        // Listing snapshots tries to delete leftover temporary files; the read-only storage
        // refuses, and the listing goes on.
        let shared = Arc::new(Shared::new(self.log.open_read_only()?, self.policies, true, None)?);
        // No background thread: it would write policy snapshots and compact.
        let store = Store::view(shared);
        store.load_suspensions()?;
        Ok(store)
    }
}

impl Store {
    /// Opens the store in `dir` read-only with default settings; see
    /// [`StoreBuilder::open_read_only`].
    ///
    /// # Errors
    /// As [`StoreBuilder::open_read_only`].
    pub fn open_read_only(dir: impl AsRef<Path>) -> Result<Self> {
        Self::builder(dir).open_read_only()
    }

    /// The log's metrics plus the store's: compression of encoded records, snapshots, rebuilds
    /// and skipped atoms (see [`crate::metrics`]).
    pub fn metrics(&self) -> MetricsSnapshot {
        let mut snapshot = self.shared.log.metrics();
        (snapshot.encoded_raw_bytes, snapshot.encoded_stored_bytes) = self.shared.codec.encoded_bytes();
        snapshot
    }

    /// Every run, in id order.
    pub fn runs(&self) -> Vec<RunInfo> {
        let index = self.shared.index.read();
        (1..=index.runs.len() as u64)
            .filter_map(|id| {
                let entry = index.run(RunId(id))?;
                let status = self.overlaid_status(RunId(id), &entry.status);
                Some(RunInfo { id: RunId(id), name: entry.name.clone(), status })
            })
            .collect()
    }

    /// Decodes one record of this store's log (with the store's dictionaries).
    ///
    /// # Errors
    /// A [`CodecError`] for bytes that are not a valid record.
    pub fn decode_record(&self, bytes: &[u8]) -> std::result::Result<RecordInfo, CodecError> {
        record_info(&self.shared.codec, bytes)
    }
}
