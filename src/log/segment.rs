//! Segment files: names, the 64-byte header, and creating a new segment atomically.
//!
//! ```text
//! segment := header frame* zero-fill
//! header  := magic:[u8;8] format_version:u32 header_bytes:u32 segment_seq:u64 first_lsn:u64
//!            segment_bytes:u64 store_id:u64 end_lsn:u64 generation:u32 header_crc:u32
//!            (64 bytes, LE)
//! ```
//!
//! `header_crc` is CRC-32 (IEEE) of bytes 0..60. `end_lsn` is 0 in a segment the writer
//! created; a segment rewritten by compaction holds a subset of the original's records (LSN
//! gaps allowed) and `end_lsn` is the LSN after the original's last record. `generation` is 1
//! in a segment the writer created (0 in one written before generations existed) and grows by
//! one with every rewrite, so that the log manifest can tell an older copy of a rewritten
//! segment from the current one. See `docs/FORMAT.md`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::log::record::{read_u32_le, read_u64_le};
use crate::storage::{OpenMode, Storage, StorageFile};

/// Bytes of a segment header; the first frame starts right after it.
pub(crate) const SEGMENT_HEADER_BYTES: usize = 64;
/// First bytes of every segment file.
pub(crate) const SEGMENT_MAGIC: [u8; 8] = *b"CONTLOG\0";
/// The format of a segment the writer creates (and of a plain compaction rewrite).
pub(crate) const FORMAT_VERSION: u32 = 1;
/// The format of a segment compaction rewrote with compressed frames (`FORMAT.md` §5a): the
/// same layout, and frames of kind 2 may appear. A reader that knows only version 1 refuses it
/// rather than misread it.
pub(crate) const FORMAT_VERSION_COMPRESSED: u32 = 2;
/// Suffix of segment files.
pub(crate) const SEGMENT_SUFFIX: &str = ".seg";
/// Suffix of files being created; recovery deletes leftovers.
pub(crate) const TEMP_SUFFIX: &str = ".tmp";

const MAGIC_AT: usize = 0;
const VERSION_AT: usize = 8;
const HEADER_BYTES_AT: usize = 12;
const SEQ_AT: usize = 16;
const FIRST_LSN_AT: usize = 24;
const SEGMENT_BYTES_AT: usize = 32;
const STORE_ID_AT: usize = 40;
const END_LSN_AT: usize = 48;
const GENERATION_AT: usize = 56;
const HEADER_CRC_AT: usize = 60;
const _: () = assert!(HEADER_CRC_AT + 4 == SEGMENT_HEADER_BYTES);
const _: () = assert!(SEGMENT_HEADER_BYTES.is_multiple_of(crate::log::record::FRAME_ALIGN_BYTES));

/// The fixed facts of one segment, stored in its header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SegmentHeader {
    /// Sequence number, unique and increasing across the store's segments; salts every frame
    /// checksum of the segment.
    pub seq: u64,
    /// LSN of the segment's first record (the next LSN when the segment was created).
    pub first_lsn: u64,
    /// Preallocated size of the file.
    pub segment_bytes: u64,
    /// Random id of the store, the same in every segment; salts frame checksums so that bytes
    /// from another store, or a frame image forged inside a record, never verify.
    pub store_id: u64,
    /// 0 for a segment the writer created. For a segment rewritten by compaction: the LSN after
    /// the last record of the segment it replaced; its frames may skip LSNs below it.
    pub end_lsn: u64,
    /// Whether compaction rewrote the segment with compressed frames (format version 2).
    pub compressed: bool,
    /// [`GENERATION_WRITER`] in a segment the writer created, one more with every rewrite; 0 in
    /// a segment written before generations existed.
    pub generation: u32,
}

/// The generation of a segment the writer creates.
pub(crate) const GENERATION_WRITER: u32 = 1;

impl SegmentHeader {
    /// The header's bytes.
    pub fn encode(&self) -> [u8; SEGMENT_HEADER_BYTES] {
        let mut bytes = [0u8; SEGMENT_HEADER_BYTES];
        bytes[MAGIC_AT..VERSION_AT].copy_from_slice(&SEGMENT_MAGIC);
        let version = if self.compressed { FORMAT_VERSION_COMPRESSED } else { FORMAT_VERSION };
        bytes[VERSION_AT..HEADER_BYTES_AT].copy_from_slice(&version.to_le_bytes());
        let header_bytes = SEGMENT_HEADER_BYTES as u32;
        bytes[HEADER_BYTES_AT..SEQ_AT].copy_from_slice(&header_bytes.to_le_bytes());
        bytes[SEQ_AT..FIRST_LSN_AT].copy_from_slice(&self.seq.to_le_bytes());
        bytes[FIRST_LSN_AT..SEGMENT_BYTES_AT].copy_from_slice(&self.first_lsn.to_le_bytes());
        bytes[SEGMENT_BYTES_AT..STORE_ID_AT].copy_from_slice(&self.segment_bytes.to_le_bytes());
        bytes[STORE_ID_AT..END_LSN_AT].copy_from_slice(&self.store_id.to_le_bytes());
        bytes[END_LSN_AT..GENERATION_AT].copy_from_slice(&self.end_lsn.to_le_bytes());
        bytes[GENERATION_AT..HEADER_CRC_AT].copy_from_slice(&self.generation.to_le_bytes());
        let crc = crc32fast::hash(&bytes[..HEADER_CRC_AT]);
        bytes[HEADER_CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// Parses and verifies a header; the error says what is wrong.
    pub fn decode(bytes: &[u8]) -> Result<Self, &'static str> {
        let Some(bytes) = bytes.get(..SEGMENT_HEADER_BYTES) else {
            return Err("the file is shorter than a segment header");
        };
        if bytes[MAGIC_AT..VERSION_AT] != SEGMENT_MAGIC {
            return Err("wrong magic bytes");
        }
        if read_u32_le(bytes, HEADER_CRC_AT) != crc32fast::hash(&bytes[..HEADER_CRC_AT]) {
            return Err("header checksum mismatch");
        }
        let compressed = match read_u32_le(bytes, VERSION_AT) {
            FORMAT_VERSION => false,
            FORMAT_VERSION_COMPRESSED => true,
            _ => return Err("unsupported format version"),
        };
        if read_u32_le(bytes, HEADER_BYTES_AT) as usize != SEGMENT_HEADER_BYTES {
            return Err("unsupported header size");
        }
        let header = Self {
            seq: read_u64_le(bytes, SEQ_AT),
            first_lsn: read_u64_le(bytes, FIRST_LSN_AT),
            segment_bytes: read_u64_le(bytes, SEGMENT_BYTES_AT),
            store_id: read_u64_le(bytes, STORE_ID_AT),
            end_lsn: read_u64_le(bytes, END_LSN_AT),
            compressed,
            generation: read_u32_le(bytes, GENERATION_AT),
        };
        if header.first_lsn == 0 || header.seq == 0 {
            return Err("sequence or first LSN is zero");
        }
        if header.end_lsn != 0 && header.end_lsn < header.first_lsn {
            return Err("end LSN is below the first LSN");
        }
        if header.compressed && header.end_lsn == 0 {
            return Err("only a compaction rewrite may hold compressed frames");
        }
        if header.segment_bytes < crate::limits::SEGMENT_BYTES_MIN
            || header.segment_bytes > crate::limits::SEGMENT_BYTES_MAX
        {
            return Err("segment size is out of bounds");
        }
        Ok(header)
    }
}

impl SegmentHeader {
    /// The salt of this segment's frame checksums: the store id and the segment sequence,
    /// mixed so that no two segments of any two stores share a salt in practice.
    pub fn salt(&self) -> u64 {
        mix64(self.store_id ^ mix64(self.seq))
    }

    /// Whether compaction rewrote this segment.
    pub fn is_compacted(&self) -> bool {
        self.end_lsn != 0
    }

    /// The generation a rewrite of this segment carries: one more than this one's (a segment
    /// written before generations existed counts as the writer's).
    pub fn next_generation(&self) -> Option<u32> {
        self.generation.max(GENERATION_WRITER).checked_add(1)
    }
}

/// splitmix64's finaliser: a bijective mix of 64 bits.
fn mix64(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A fresh random store id, from the standard library's randomly keyed hasher, the time and
/// the process id (no cryptographic strength is needed: it only has to be unguessable to
/// whoever writes record bytes, and different across stores).
pub(crate) fn new_store_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    hasher.write_u32(std::process::id());
    hasher.finish()
}

/// File name of the segment whose first record is `first_lsn`: 20 zero-padded decimal digits,
/// so that names sort in LSN order.
pub(crate) fn file_name(first_lsn: u64) -> String {
    format!("{first_lsn:020}{SEGMENT_SUFFIX}")
}

/// The first LSN named by a segment file name, or `None` for any other file.
pub(crate) fn parse_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(SEGMENT_SUFFIX)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// A freshly created, empty, preallocated and durable segment.
pub(crate) struct CreatedSegment {
    pub path: PathBuf,
    pub file: Arc<dyn StorageFile>,
}

/// Creates a segment so that it becomes visible only complete: write the header and
/// preallocate under a temporary name, sync, rename into place, sync the directory.
///
/// On failure the temporary file is removed (best effort) and nothing visible changed.
pub(crate) fn create(storage: &dyn Storage, dir: &Path, header: SegmentHeader) -> Result<CreatedSegment> {
    let path = dir.join(file_name(header.first_lsn));
    let temp = dir.join(format!("{}{TEMP_SUFFIX}", file_name(header.first_lsn)));
    let written = write_temp(storage, &temp, header);
    let file = match written {
        Ok(file) => file,
        Err(error) => {
            let _ = storage.remove_file(&temp);
            return Err(error);
        }
    };
    storage.rename(&temp, &path).map_err(|e| Error::io("rename", &temp, e))?;
    // IMPORTANT: the segment exists after a crash only once its directory entry is synced.
    storage.sync_dir(dir).map_err(|e| Error::io("sync directory", dir, e))?;
    Ok(CreatedSegment { path, file })
}

fn write_temp(storage: &dyn Storage, temp: &Path, header: SegmentHeader) -> Result<Arc<dyn StorageFile>> {
    let file = storage.open(temp, OpenMode::CreateNew).map_err(|e| Error::io("create", temp, e))?;
    file.allocate(header.segment_bytes).map_err(|e| Error::io("preallocate", temp, e))?;
    file.write_all_at(&header.encode(), 0).map_err(|e| Error::io("write", temp, e))?;
    // IMPORTANT: header and allocation must be durable before the rename publishes the file.
    file.sync_data().map_err(|e| Error::io("fdatasync", temp, e))?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The header the tests vary.
    fn header(end_lsn: u64) -> SegmentHeader {
        SegmentHeader {
            seq: 7,
            first_lsn: 1234,
            segment_bytes: 1 << 20,
            store_id: 99,
            end_lsn,
            compressed: false,
            generation: GENERATION_WRITER,
        }
    }

    #[test]
    fn header_round_trips() {
        let header = header(0);
        assert_eq!(SegmentHeader::decode(&header.encode()), Ok(header));
    }

    #[test]
    fn compacted_header_round_trips() {
        let header = header(2000);
        assert_eq!(SegmentHeader::decode(&header.encode()), Ok(header));
        assert!(header.is_compacted());
        let backwards = SegmentHeader { end_lsn: 1000, ..header };
        assert!(SegmentHeader::decode(&backwards.encode()).is_err());
    }

    #[test]
    fn compressed_header_is_format_version_2_and_only_for_a_rewrite() {
        let compressed = SegmentHeader { compressed: true, ..header(2000) };
        let bytes = compressed.encode();
        assert_eq!(read_u32_le(&bytes, VERSION_AT), FORMAT_VERSION_COMPRESSED);
        assert_eq!(SegmentHeader::decode(&bytes), Ok(compressed));
        let written_by_the_writer = SegmentHeader { compressed: true, ..header(0) };
        assert!(SegmentHeader::decode(&written_by_the_writer.encode()).is_err());
    }

    #[test]
    fn every_flipped_header_byte_is_refused() {
        let bytes = header(0).encode();
        for at in 0..bytes.len() {
            let mut damaged = bytes;
            damaged[at] ^= 0x40;
            assert!(SegmentHeader::decode(&damaged).is_err(), "flip at {at} accepted");
        }
    }

    #[test]
    fn names_round_trip_and_sort() {
        assert_eq!(parse_file_name(&file_name(42)), Some(42));
        assert!(file_name(9) < file_name(10));
        assert_eq!(parse_file_name("LOCK"), None);
        assert_eq!(parse_file_name("00000000000000000042.seg.tmp"), None);
    }
}
