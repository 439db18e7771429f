//! The shipped manifest: the one object of a store's prefix that changes, and only by a
//! conditional write, so that exactly one owner at a time can change it (`docs/FORMAT.md`,
//! "Shipped manifest").
//!
//! ```text
//! object := magic "CONTSHIP" version:u32 payload crc:u32     (little-endian; crc is CRC-32
//!                                                             of every byte before it)
//! payload := ShippedManifest, protobuf (below)
//! ```

use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};

use crate::error::{Error, Result};
use crate::limits;
use crate::ship::layout;

const MAGIC: [u8; 8] = *b"CONTSHIP";
const VERSION: u32 = 1;
const HEADER_BYTES: usize = 12;
const CRC_BYTES: usize = 4;

/// What the bucket holds of a store: its owner and the objects a restore needs.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ShippedManifest {
    /// The store's id (every segment header's).
    #[prost(uint64, tag = "1")]
    pub store_id: u64,
    /// Grows by one at every takeover; the owner whose claim names it may write.
    #[prost(uint64, tag = "2")]
    pub epoch: u64,
    /// The owner's name, for people.
    #[prost(string, tag = "3")]
    pub owner: String,
    /// A random number the owner chose when it took the epoch (its local claim repeats it).
    #[prost(uint64, tag = "4")]
    pub nonce: u64,
    /// When it was written, in microseconds since the Unix epoch.
    #[prost(uint64, tag = "5")]
    pub written_at_unix_us: u64,
    /// Sealed segments, in LSN order, consecutive.
    #[prost(message, repeated, tag = "6")]
    pub segments: Vec<ShippedSegment>,
    /// Snapshot files, by atom.
    #[prost(message, repeated, tag = "7")]
    pub snapshots: Vec<ShippedSnapshot>,
    /// The active segment's prefix, when tail shipping is on.
    #[prost(message, optional, tag = "8")]
    pub tail: Option<ShippedSegment>,
    /// The active segment's sequence number and first LSN when the manifest was written: where
    /// a restore without a tail starts its new active segment.
    #[prost(uint64, tag = "9")]
    pub active_seq: u64,
    #[prost(uint64, tag = "10")]
    pub active_first_lsn: u64,
    /// An index snapshot of the shipped log, covering records below an LSN the listed segments
    /// (or the tail) reach: a restore's open folds only the records after it.
    #[prost(message, optional, tag = "11")]
    pub index: Option<ShippedIndex>,
}

/// How a shipped segment's object holds its bytes.
pub(crate) const ENCODING_PLAIN: u32 = 0;
/// One zstd frame of the segment's bytes.
pub(crate) const ENCODING_ZSTD: u32 = 1;

/// One shipped segment (or the active segment's prefix).
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub(crate) struct ShippedSegment {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(uint64, tag = "2")]
    pub seq: u64,
    #[prost(uint64, tag = "3")]
    pub first_lsn: u64,
    /// The LSN after its last record.
    #[prost(uint64, tag = "4")]
    pub next_lsn: u64,
    #[prost(uint32, tag = "5")]
    pub generation: u32,
    /// The segment's length: its header and frames, without its zero fill.
    #[prost(uint64, tag = "6")]
    pub bytes: u64,
    /// SHA-256 of those bytes (of the segment, not of a compressed object).
    #[prost(bytes = "vec", tag = "7")]
    pub sha256: Vec<u8>,
    /// [`ENCODING_PLAIN`] or [`ENCODING_ZSTD`].
    #[prost(uint32, tag = "8")]
    pub encoding: u32,
    /// The object's length as uploaded (the compressed length for [`ENCODING_ZSTD`]).
    #[prost(uint64, tag = "9")]
    pub object_bytes: u64,
}

/// One shipped index snapshot (`docs/FORMAT.md` §9a), byte for byte.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub(crate) struct ShippedIndex {
    #[prost(string, tag = "1")]
    pub key: String,
    /// Every record below this LSN is in it.
    #[prost(uint64, tag = "2")]
    pub covered: u64,
    #[prost(uint64, tag = "3")]
    pub bytes: u64,
    #[prost(bytes = "vec", tag = "4")]
    pub sha256: Vec<u8>,
}

/// One shipped snapshot file.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub(crate) struct ShippedSnapshot {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(uint64, tag = "2")]
    pub atom: u64,
    #[prost(uint64, tag = "3")]
    pub bytes: u64,
    #[prost(bytes = "vec", tag = "4")]
    pub sha256: Vec<u8>,
}

impl ShippedManifest {
    /// The object's bytes.
    pub fn encode_object(&self) -> Vec<u8> {
        let payload = prost::Message::encode_to_vec(self);
        let mut bytes = Vec::with_capacity(HEADER_BYTES + payload.len() + CRC_BYTES);
        bytes.extend_from_slice(&MAGIC);
        bytes.extend_from_slice(&VERSION.to_le_bytes());
        bytes.extend_from_slice(&payload);
        let crc = crc32fast::hash(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// Decodes an object's bytes.
    pub fn decode_object(bytes: &[u8]) -> std::result::Result<Self, &'static str> {
        if bytes.len() < HEADER_BYTES + CRC_BYTES {
            return Err("shorter than its header");
        }
        let (body, crc) = bytes.split_at(bytes.len() - CRC_BYTES);
        let crc = u32::from_le_bytes(crc.try_into().map_err(|_| "no checksum")?);
        if crc32fast::hash(body) != crc {
            return Err("its checksum does not match");
        }
        if body[..8] != MAGIC {
            return Err("not a manifest (magic)");
        }
        let version = u32::from_le_bytes(body[8..12].try_into().map_err(|_| "no version")?);
        if version != VERSION {
            return Err("an unknown version");
        }
        let manifest: Self = prost::Message::decode(&body[HEADER_BYTES..]).map_err(|_| "undecodable")?;
        manifest.check()?;
        Ok(manifest)
    }

    /// Every record below this LSN is in a listed segment or the tail (0: none is listed).
    pub fn shipped_next_lsn(&self) -> u64 {
        let last = self.tail.as_ref().or(self.segments.last());
        last.map_or(0, |segment| segment.next_lsn)
    }

    /// The invariants a restore relies on: consecutive segments, hashes of 32 bytes.
    fn check(&self) -> std::result::Result<(), &'static str> {
        for pair in self.segments.windows(2) {
            if pair[0].next_lsn != pair[1].first_lsn || pair[0].seq >= pair[1].seq {
                return Err("its segments are not consecutive");
            }
        }
        let hashes = self.segments.iter().map(|s| &s.sha256).chain(self.snapshots.iter().map(|s| &s.sha256));
        let mut hashes = hashes.chain(self.tail.iter().map(|t| &t.sha256)).chain(self.index.iter().map(|i| &i.sha256));
        if hashes.any(|sha| sha.len() != 32) {
            return Err("a hash is not 32 bytes");
        }
        if self.segments.iter().chain(self.tail.iter()).any(|s| s.encoding > ENCODING_ZSTD) {
            return Err("a segment's encoding is unknown");
        }
        if let Some(index) = &self.index
            && index.covered > self.shipped_next_lsn()
        {
            return Err("its index snapshot covers records it does not list");
        }
        if let (Some(last), Some(tail)) = (self.segments.last(), &self.tail)
            && (tail.first_lsn != last.next_lsn || tail.seq <= last.seq)
        {
            return Err("its tail does not follow its segments");
        }
        Ok(())
    }
}

/// The manifest and the version of its object (for the next conditional write).
#[derive(Clone, Debug)]
pub(crate) struct Versioned {
    pub manifest: ShippedManifest,
    pub version: UpdateVersion,
}

/// How a conditional write of the manifest ended.
pub(crate) enum Written {
    /// It is the manifest now; the object's new version.
    Done(UpdateVersion),
    /// Its condition failed: another writer changed (or created) the manifest first.
    Refused,
}

/// The manifest under `prefix`, `None` if there is none.
///
/// # Errors
/// [`Error::ObjectStore`] when the get fails, [`Error::InvalidArgument`] for an object that is
/// not a manifest or is larger than [`limits::SHIP_MANIFEST_BYTES_MAX`].
pub(crate) async fn fetch(store: &dyn ObjectStore, prefix: &str) -> Result<Option<Versioned>> {
    let key = layout::manifest(prefix);
    let got = match store.get(&key).await {
        Ok(got) => got,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(error) => return Err(remote_error("get", key.as_ref(), &error)),
    };
    if got.meta.size > limits::SHIP_MANIFEST_BYTES_MAX {
        return Err(Error::InvalidArgument { reason: format!("the manifest {key} is {} bytes", got.meta.size) });
    }
    let version = UpdateVersion { e_tag: got.meta.e_tag.clone(), version: got.meta.version.clone() };
    let bytes = got.bytes().await.map_err(|error| remote_error("get", key.as_ref(), &error))?;
    let manifest = ShippedManifest::decode_object(&bytes).map_err(|why| Error::InvalidArgument {
        reason: format!("the object {key} is not a usable manifest: {why}"),
    })?;
    Ok(Some(Versioned { manifest, version }))
}

/// Writes `manifest` under `prefix` if the object is still at `version` (`None`: if there is
/// no manifest yet).
///
/// # Errors
/// [`Error::ObjectStore`] when the put fails otherwise.
pub(crate) async fn write(
    store: &dyn ObjectStore,
    prefix: &str,
    manifest: &ShippedManifest,
    version: Option<&UpdateVersion>,
) -> Result<Written> {
    let key = layout::manifest(prefix);
    let mode = match version {
        Some(version) => PutMode::Update(version.clone()),
        None => PutMode::Create,
    };
    let payload = PutPayload::from(manifest.encode_object());
    match store.put_opts(&key, payload, PutOptions::from(mode)).await {
        Ok(put) => Ok(Written::Done(UpdateVersion { e_tag: put.e_tag, version: put.version })),
        Err(object_store::Error::Precondition { .. } | object_store::Error::AlreadyExists { .. }) => {
            Ok(Written::Refused)
        }
        Err(error) => Err(remote_error("put", key.as_ref(), &error)),
    }
}

/// An object store failure as the crate's error.
pub(crate) fn remote_error(op: &'static str, key: &str, error: &object_store::Error) -> Error {
    Error::ObjectStore { op, key: key.to_owned(), message: error.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ShippedManifest {
        let segment = |seq: u64, first: u64, next: u64| ShippedSegment {
            key: format!("s{seq}"),
            seq,
            first_lsn: first,
            next_lsn: next,
            generation: 1,
            bytes: 100,
            sha256: vec![seq as u8; 32],
            encoding: u32::from(seq == 1),
            object_bytes: 60,
        };
        ShippedManifest {
            store_id: 7,
            epoch: 2,
            owner: "a".into(),
            nonce: 9,
            written_at_unix_us: 1,
            segments: vec![segment(1, 1, 10), segment(2, 10, 20)],
            snapshots: vec![ShippedSnapshot { key: "x".into(), atom: 3, bytes: 5, sha256: vec![1; 32] }],
            tail: Some(segment(3, 20, 25)),
            active_seq: 3,
            active_first_lsn: 20,
            index: Some(ShippedIndex { key: "i".into(), covered: 25, bytes: 9, sha256: vec![2; 32] }),
        }
    }

    #[test]
    fn an_object_round_trips_and_every_flipped_byte_is_refused() {
        let object = sample().encode_object();
        assert_eq!(ShippedManifest::decode_object(&object), Ok(sample()));
        for at in 0..object.len() {
            let mut damaged = object.clone();
            damaged[at] ^= 0x10;
            assert!(ShippedManifest::decode_object(&damaged).is_err(), "flip at {at} accepted");
        }
        assert!(ShippedManifest::decode_object(&object[..object.len() - 1]).is_err());
    }

    #[test]
    fn segments_that_are_not_consecutive_are_refused() {
        let mut manifest = sample();
        manifest.segments[1].first_lsn = 11;
        assert!(ShippedManifest::decode_object(&manifest.encode_object()).is_err());
        let mut manifest = sample();
        if let Some(tail) = manifest.tail.as_mut() {
            tail.first_lsn = 21;
        }
        assert!(ShippedManifest::decode_object(&manifest.encode_object()).is_err());
    }

    #[test]
    fn an_index_snapshot_past_the_shipped_records_or_an_unknown_encoding_is_refused() {
        let mut manifest = sample();
        if let Some(index) = manifest.index.as_mut() {
            index.covered = 26;
        }
        assert!(ShippedManifest::decode_object(&manifest.encode_object()).is_err());
        let mut manifest = sample();
        manifest.segments[0].encoding = 2;
        assert!(ShippedManifest::decode_object(&manifest.encode_object()).is_err());
    }
}
