//! Batch framing: pure functions from records to frame bytes and back. No I/O.
//!
//! ```text
//! frame   := header payload padding
//! header  := header_crc:u32 payload_crc:u32 payload_len:u32 kind:u8 flags:u8 reserved:u16
//!            first_lsn:u64 record_count:u32 synced_through:u32    (32 bytes, little-endian)
//! payload := (record_len:u32 record_bytes)*                       (kind 1: record_count times)
//!          | raw_len:u32 zstd_frame                                (kind 2: the kind-1 payload, compressed)
//! padding := 0x00{0..7}                                           (frame length is a multiple of 8)
//! ```
//!
//! `payload_crc` is CRC-32 (IEEE) of the payload. `header_crc` is CRC-32 of the segment salt
//! (derived from the store's random id and the segment sequence, u64 little-endian) followed by
//! header bytes 4..32, so it covers the length, the LSN and, through `payload_crc`, the payload;
//! a frame copied from another segment or store, left from an older file, or forged inside a
//! record's bytes never verifies. `synced_through` is the segment offset up to which the
//! segment was known durable when the frame was written. See `docs/FORMAT.md`.

use crate::limits;

/// Bytes of a frame header.
pub(crate) const FRAME_HEADER_BYTES: usize = 32;
/// Frames start and end at multiples of this many bytes inside a segment.
pub(crate) const FRAME_ALIGN_BYTES: usize = 8;
/// A batch of opaque records (the only kind the writer writes).
pub(crate) const KIND_RECORDS: u8 = 1;
/// A batch of records compressed as one zstd frame: written only by compaction, into
/// segments of format version 2 (`FORMAT.md` §5a).
pub(crate) const KIND_COMPRESSED_RECORDS: u8 = 2;
/// Bytes before the zstd frame of a compressed payload: the length of the records it holds.
pub(crate) const RAW_LEN_BYTES: usize = 4;

// Header field offsets; the layout is the table in the module docs.
const HEADER_CRC_AT: usize = 0;
const PAYLOAD_CRC_AT: usize = 4;
const PAYLOAD_LEN_AT: usize = 8;
const KIND_AT: usize = 12;
const FLAGS_AT: usize = 13;
const RESERVED_16_AT: usize = 14;
const FIRST_LSN_AT: usize = 16;
const RECORD_COUNT_AT: usize = 24;
const SYNCED_THROUGH_AT: usize = 28;
const _: () = assert!(SYNCED_THROUGH_AT + 4 == FRAME_HEADER_BYTES);
const _: () = assert!(FRAME_HEADER_BYTES.is_multiple_of(FRAME_ALIGN_BYTES));

/// Why bytes are not a valid frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FrameError {
    /// Fewer bytes than a header, or than the header's length says.
    Truncated,
    /// All-zero header: nothing was ever written here.
    Zeroed,
    /// The header fails its checksum or has impossible field values.
    BadHeader(&'static str),
    /// The header is valid but the payload fails its checksum or framing.
    BadPayload(&'static str),
}

/// A decoded, verified frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FrameHeader {
    /// [`KIND_RECORDS`] or [`KIND_COMPRESSED_RECORDS`].
    pub kind: u8,
    pub payload_len: u32,
    pub first_lsn: u64,
    pub record_count: u32,
    /// Segment offset below which every byte was durable when this frame was written.
    pub synced_through: u32,
    /// The header checksum: with the segment's salt and the frame's offset, it names the
    /// frame's exact content (it covers the payload checksum).
    pub checksum: u32,
}

impl FrameHeader {
    /// Total bytes of the frame, padding included.
    pub fn frame_len(&self) -> usize {
        frame_len_for(self.payload_len as usize)
    }

    /// The LSN after this frame's last record.
    pub fn next_lsn(&self) -> u64 {
        self.first_lsn + u64::from(self.record_count)
    }

    /// Whether the payload is compressed (kind 2): its records must be inflated to be read.
    pub fn is_compressed(&self) -> bool {
        self.kind == KIND_COMPRESSED_RECORDS
    }
}

/// Frame length for a payload of `payload_len` bytes.
pub(crate) fn frame_len_for(payload_len: usize) -> usize {
    (FRAME_HEADER_BYTES + payload_len).next_multiple_of(FRAME_ALIGN_BYTES)
}

/// Records encoded into a frame whose header is not yet filled in (the LSN and salt are known
/// only to the group-commit leader). Built outside any lock.
#[derive(Debug)]
pub(crate) struct EncodedBatch {
    frame: Vec<u8>,
    kind: u8,
    payload_len: u32,
    record_count: u32,
    payload_crc: u32,
}

impl EncodedBatch {
    /// Encodes `records`, checking every limit first.
    pub fn encode<R: AsRef<[u8]>>(records: &[R]) -> crate::Result<Self> {
        let payload_len = checked_payload_len(records)?;
        let mut frame = Vec::with_capacity(frame_len_for(payload_len));
        frame.resize(FRAME_HEADER_BYTES, 0);
        for record in records {
            let record = record.as_ref();
            let len = u32::try_from(record.len()).expect("record length was checked against RECORD_BYTES_MAX");
            frame.extend_from_slice(&len.to_le_bytes());
            frame.extend_from_slice(record);
        }
        let payload_crc = crc32(&frame[FRAME_HEADER_BYTES..]);
        frame.resize(frame_len_for(payload_len), 0);
        let record_count = u32::try_from(records.len()).expect("record count was checked against BATCH_RECORDS_MAX");
        let payload_len = u32::try_from(payload_len).expect("payload length was checked against BATCH_BYTES_MAX");
        Ok(Self { frame, kind: KIND_RECORDS, payload_len, record_count, payload_crc })
    }

    /// Encodes `records` as one compressed frame (kind 2) with `compressor`, or as a plain
    /// frame if compression would not make it smaller.
    pub fn encode_compressed<R: AsRef<[u8]>>(
        records: &[R],
        compressor: &mut zstd::bulk::Compressor<'_>,
    ) -> crate::Result<Self> {
        let plain = Self::encode(records)?;
        let raw = &plain.frame[FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + plain.payload_len as usize];
        let Ok(compressed) = compressor.compress(raw) else { return Ok(plain) };
        if RAW_LEN_BYTES + compressed.len() >= raw.len() {
            return Ok(plain);
        }
        let payload_len = RAW_LEN_BYTES + compressed.len();
        let mut frame = Vec::with_capacity(frame_len_for(payload_len));
        frame.resize(FRAME_HEADER_BYTES, 0);
        frame.extend_from_slice(&plain.payload_len.to_le_bytes());
        frame.extend_from_slice(&compressed);
        let payload_crc = crc32(&frame[FRAME_HEADER_BYTES..]);
        frame.resize(frame_len_for(payload_len), 0);
        let payload_len = u32::try_from(payload_len).expect("smaller than the plain payload");
        Ok(Self { frame, kind: KIND_COMPRESSED_RECORDS, payload_len, record_count: plain.record_count, payload_crc })
    }

    /// Records in the batch.
    pub fn record_count(&self) -> u32 {
        self.record_count
    }

    /// Bytes of the whole frame.
    pub fn frame_len(&self) -> usize {
        self.frame.len()
    }

    /// Fills in the header for `first_lsn` in the segment salted with `salt`, written when the
    /// segment was durable up to offset `synced_through`; returns the frame.
    pub fn seal(&mut self, first_lsn: u64, salt: u64, synced_through: u32) -> &[u8] {
        let payload_len = self.payload_len;
        let header = &mut self.frame[..FRAME_HEADER_BYTES];
        header[PAYLOAD_CRC_AT..PAYLOAD_LEN_AT].copy_from_slice(&self.payload_crc.to_le_bytes());
        header[PAYLOAD_LEN_AT..KIND_AT].copy_from_slice(&payload_len.to_le_bytes());
        header[KIND_AT] = self.kind;
        header[FLAGS_AT] = 0;
        header[RESERVED_16_AT..FIRST_LSN_AT].fill(0);
        header[FIRST_LSN_AT..RECORD_COUNT_AT].copy_from_slice(&first_lsn.to_le_bytes());
        header[RECORD_COUNT_AT..SYNCED_THROUGH_AT].copy_from_slice(&self.record_count.to_le_bytes());
        header[SYNCED_THROUGH_AT..FRAME_HEADER_BYTES].copy_from_slice(&synced_through.to_le_bytes());
        let header_crc = header_checksum(salt, header);
        header[HEADER_CRC_AT..PAYLOAD_CRC_AT].copy_from_slice(&header_crc.to_le_bytes());
        debug_assert_eq!(decode_frame(&self.frame, salt).map(|f| f.header.first_lsn), Ok(first_lsn));
        &self.frame
    }
}

fn checked_payload_len<R: AsRef<[u8]>>(records: &[R]) -> crate::Result<usize> {
    if records.is_empty() {
        return Err(crate::Error::EmptyBatch);
    }
    let mut payload_len: u64 = 0;
    for record in records {
        let len = record.as_ref().len() as u64;
        check_record_len(len)?;
        payload_len += 4 + len;
    }
    check_batch_size(records.len() as u64, payload_len)?;
    Ok(usize::try_from(payload_len).expect("payload length is below BATCH_BYTES_MAX"))
}

/// A record of `len` bytes is within [`limits::RECORD_BYTES_MAX`].
fn check_record_len(len: u64) -> crate::Result<()> {
    if len > u64::from(limits::RECORD_BYTES_MAX) {
        return Err(crate::Error::RecordTooLarge { bytes: len, max: u64::from(limits::RECORD_BYTES_MAX) });
    }
    Ok(())
}

/// A batch of `records` records and `payload_len` bytes of payload is within
/// [`limits::BATCH_RECORDS_MAX`] and [`limits::BATCH_BYTES_MAX`].
fn check_batch_size(records: u64, payload_len: u64) -> crate::Result<()> {
    if records > u64::from(limits::BATCH_RECORDS_MAX) || payload_len > u64::from(limits::BATCH_BYTES_MAX) {
        return Err(crate::Error::BatchTooLarge {
            records,
            bytes: payload_len,
            records_max: u64::from(limits::BATCH_RECORDS_MAX),
            bytes_max: u64::from(limits::BATCH_BYTES_MAX),
        });
    }
    Ok(())
}

/// Builds an [`EncodedBatch`] whose records are written straight into its frame, each by a
/// closure, instead of being encoded into buffers of their own and then copied (the store's
/// start and completion records of an atom: two allocations and a copy fewer per atom). The
/// frame is byte for byte what [`EncodedBatch::encode`] makes of the same records, and the
/// same limits are checked.
#[derive(Debug)]
pub(crate) struct BatchBuilder {
    frame: Vec<u8>,
    record_count: usize,
}

impl BatchBuilder {
    /// An empty batch with room for about `payload_bytes` of records and their length
    /// prefixes (a guess: the frame grows past it if need be).
    pub fn with_capacity(payload_bytes: usize) -> Self {
        let mut frame = Vec::with_capacity(frame_len_for(payload_bytes));
        frame.resize(FRAME_HEADER_BYTES, 0);
        Self { frame, record_count: 0 }
    }

    /// Appends one record, the bytes `write` appends to the buffer it is given (it must only
    /// append). A record over [`limits::RECORD_BYTES_MAX`] is taken back out and refused with
    /// [`crate::Error::RecordTooLarge`]; the batch is then as it was before.
    pub fn push_with(&mut self, write: impl FnOnce(&mut Vec<u8>)) -> crate::Result<()> {
        let at = self.frame.len();
        self.frame.extend_from_slice(&[0; 4]);
        write(&mut self.frame);
        let len = self.frame.len() - at - 4;
        if let Err(error) = check_record_len(len as u64) {
            self.frame.truncate(at);
            return Err(error);
        }
        let len = u32::try_from(len).expect("record length was checked against RECORD_BYTES_MAX");
        self.frame[at..at + 4].copy_from_slice(&len.to_le_bytes());
        self.record_count += 1;
        Ok(())
    }

    /// The batch, checked as [`EncodedBatch::encode`] checks its records: at least one, at
    /// most [`limits::BATCH_RECORDS_MAX`] and [`limits::BATCH_BYTES_MAX`] of payload.
    pub fn finish(mut self) -> crate::Result<EncodedBatch> {
        if self.record_count == 0 {
            return Err(crate::Error::EmptyBatch);
        }
        let payload_len = self.frame.len() - FRAME_HEADER_BYTES;
        check_batch_size(self.record_count as u64, payload_len as u64)?;
        let payload_crc = crc32(&self.frame[FRAME_HEADER_BYTES..]);
        self.frame.resize(frame_len_for(payload_len), 0);
        let record_count =
            u32::try_from(self.record_count).expect("record count was checked against BATCH_RECORDS_MAX");
        let payload_len = u32::try_from(payload_len).expect("payload length was checked against BATCH_BYTES_MAX");
        Ok(EncodedBatch { frame: self.frame, kind: KIND_RECORDS, payload_len, record_count, payload_crc })
    }
}

/// A verified frame borrowed from a buffer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Frame<'a> {
    pub header: FrameHeader,
    pub payload: &'a [u8],
}

/// Decodes and verifies the header at the start of `bytes`.
pub(crate) fn decode_header(bytes: &[u8], salt: u64) -> Result<FrameHeader, FrameError> {
    let Some(header) = bytes.get(..FRAME_HEADER_BYTES) else {
        return Err(FrameError::Truncated);
    };
    if header.iter().all(|&b| b == 0) {
        return Err(FrameError::Zeroed);
    }
    let kind = header[KIND_AT];
    if kind != KIND_RECORDS && kind != KIND_COMPRESSED_RECORDS {
        return Err(FrameError::BadHeader("unknown batch kind"));
    }
    if header[FLAGS_AT] != 0 || header[RESERVED_16_AT..FIRST_LSN_AT] != [0, 0] {
        return Err(FrameError::BadHeader("reserved bits are set"));
    }
    if read_u32_le(header, HEADER_CRC_AT) != header_checksum(salt, header) {
        return Err(FrameError::BadHeader("header checksum mismatch"));
    }
    let parsed = FrameHeader {
        kind,
        payload_len: read_u32_le(header, PAYLOAD_LEN_AT),
        first_lsn: read_u64_le(header, FIRST_LSN_AT),
        record_count: read_u32_le(header, RECORD_COUNT_AT),
        synced_through: read_u32_le(header, SYNCED_THROUGH_AT),
        checksum: read_u32_le(header, HEADER_CRC_AT),
    };
    if parsed.payload_len > limits::BATCH_BYTES_MAX
        || parsed.record_count == 0
        || parsed.record_count > limits::BATCH_RECORDS_MAX
        || parsed.first_lsn == 0
    {
        return Err(FrameError::BadHeader("field out of bounds"));
    }
    if kind == KIND_RECORDS && u64::from(parsed.record_count) * 4 > u64::from(parsed.payload_len) {
        return Err(FrameError::BadHeader("more records than the payload can hold"));
    }
    if kind == KIND_COMPRESSED_RECORDS && parsed.payload_len as usize <= RAW_LEN_BYTES {
        return Err(FrameError::BadHeader("a compressed payload without a zstd frame"));
    }
    if parsed.first_lsn.checked_add(u64::from(parsed.record_count)).is_none() {
        return Err(FrameError::BadHeader("LSN overflow"));
    }
    Ok(parsed)
}

/// Decodes and verifies the whole frame at the start of `bytes`: header, payload checksum and
/// record framing. A compressed frame's records are framed inside its zstd frame: for it the
/// stated uncompressed length is checked here, the records by [`inflate`].
pub(crate) fn decode_frame(bytes: &[u8], salt: u64) -> Result<Frame<'_>, FrameError> {
    let header = decode_header(bytes, salt)?;
    let Some(frame) = bytes.get(..header.frame_len()) else {
        return Err(FrameError::Truncated);
    };
    let payload = &frame[FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + header.payload_len as usize];
    if crc32(payload) != read_u32_le(frame, PAYLOAD_CRC_AT) {
        return Err(FrameError::BadPayload("payload checksum mismatch"));
    }
    if frame[FRAME_HEADER_BYTES + payload.len()..].iter().any(|&b| b != 0) {
        return Err(FrameError::BadPayload("padding is not zero"));
    }
    let verified = Frame { header, payload };
    if header.is_compressed() {
        let raw_len = read_u32_le(payload, 0);
        if raw_len > limits::BATCH_BYTES_MAX || u64::from(header.record_count) * 4 > u64::from(raw_len) {
            return Err(FrameError::BadPayload("compressed records' length out of bounds"));
        }
    } else {
        check_records(&verified)?;
    }
    Ok(verified)
}

/// The records payload of a verified compressed frame: decompressed into a buffer of exactly
/// the length the frame states (at most `BATCH_BYTES_MAX`; zstd fails rather than write more),
/// then checked as a plain frame's payload is.
pub(crate) fn inflate(frame: &Frame<'_>) -> Result<Vec<u8>, FrameError> {
    let raw_len = read_u32_le(frame.payload, 0) as usize;
    let raw = zstd::bulk::decompress(&frame.payload[RAW_LEN_BYTES..], raw_len)
        .map_err(|_| FrameError::BadPayload("compressed records do not decompress"))?;
    if raw.len() != raw_len {
        return Err(FrameError::BadPayload("compressed records decompress to another length"));
    }
    check_records(&Frame { header: frame.header, payload: &raw })?;
    Ok(raw)
}

fn check_records(frame: &Frame<'_>) -> Result<(), FrameError> {
    let mut records = Records::new(frame.payload);
    let mut count = 0u32;
    for record in &mut records {
        record?;
        count += 1;
    }
    if count != frame.header.record_count {
        return Err(FrameError::BadPayload("record count does not match the payload"));
    }
    Ok(())
}

/// Iterator over the records of a verified payload.
#[derive(Clone, Debug)]
pub(crate) struct Records<'a> {
    payload: &'a [u8],
    at: usize,
}

impl<'a> Records<'a> {
    pub fn new(payload: &'a [u8]) -> Self {
        Self { payload, at: 0 }
    }
}

impl<'a> Iterator for Records<'a> {
    /// `(offset of the record bytes inside the payload, record bytes)`.
    type Item = Result<(usize, &'a [u8]), FrameError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.at == self.payload.len() {
            return None;
        }
        let Some(len_bytes) = self.payload.get(self.at..self.at + 4) else {
            self.at = self.payload.len();
            return Some(Err(FrameError::BadPayload("record length prefix is cut")));
        };
        let len = read_u32_le(len_bytes, 0) as usize;
        let start = self.at + 4;
        let Some(record) = self.payload.get(start..start.saturating_add(len)) else {
            self.at = self.payload.len();
            return Some(Err(FrameError::BadPayload("record runs past the payload")));
        };
        self.at = start + len;
        Some(Ok((start, record)))
    }
}

/// A fresh CRC-32 hasher. `crc32fast::Hasher::new` detects the CPU's features every time (1 %
/// of a store's open, which checks two CRCs per frame); a clone of one detected once does not.
fn crc_hasher() -> crc32fast::Hasher {
    static DETECTED: std::sync::OnceLock<crc32fast::Hasher> = std::sync::OnceLock::new();
    DETECTED.get_or_init(crc32fast::Hasher::new).clone()
}

/// The CRC-32 of `bytes` (what `crc32fast::hash` returns).
fn crc32(bytes: &[u8]) -> u32 {
    let mut hasher = crc_hasher();
    hasher.update(bytes);
    hasher.finalize()
}

fn header_checksum(salt: u64, header: &[u8]) -> u32 {
    let mut hasher = crc_hasher();
    hasher.update(&salt.to_le_bytes());
    hasher.update(&header[PAYLOAD_CRC_AT..FRAME_HEADER_BYTES]);
    hasher.finalize()
}

/// Recomputes both checksums of the frame at the start of `frame` (payload first, then header),
/// as a writer who knew the salt would: lets tests forge frames whose damage the checksums do
/// not catch, to reach the checks behind them.
#[cfg(test)]
pub(crate) fn reseal(frame: &mut [u8], salt: u64) {
    let payload_len = read_u32_le(frame, PAYLOAD_LEN_AT) as usize;
    let payload_crc = crc32(&frame[FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + payload_len]);
    frame[PAYLOAD_CRC_AT..PAYLOAD_LEN_AT].copy_from_slice(&payload_crc.to_le_bytes());
    let header_crc = header_checksum(salt, &frame[..FRAME_HEADER_BYTES]);
    frame[HEADER_CRC_AT..PAYLOAD_CRC_AT].copy_from_slice(&header_crc.to_le_bytes());
}

pub(crate) fn read_u32_le(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(word)
}

pub(crate) fn read_u64_le(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn built(records: &[Vec<u8>]) -> crate::Result<EncodedBatch> {
        let mut batch = BatchBuilder::with_capacity(8);
        for record in records {
            batch.push_with(|out| out.extend_from_slice(record))?;
        }
        batch.finish()
    }

    proptest! {
        /// A batch built in place is the batch `encode` makes of the same records, down to its
        /// sealed bytes, and decodes to them.
        #[test]
        fn a_batch_built_in_place_is_the_encoded_batch(
            records in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..300), 1..8),
            first_lsn in 1u64..1 << 40,
            salt in any::<u64>(),
        ) {
            let mut encoded = EncodedBatch::encode(&records).expect("encode");
            let mut built = built(&records).expect("build");
            prop_assert_eq!(built.record_count(), encoded.record_count());
            prop_assert_eq!(built.frame_len(), encoded.frame_len());
            let sealed = built.seal(first_lsn, salt, 64).to_vec();
            prop_assert_eq!(&sealed, encoded.seal(first_lsn, salt, 64));
            let frame = decode_frame(&sealed, salt).expect("decode");
            prop_assert_eq!(frame.header.first_lsn, first_lsn);
            prop_assert_eq!(frame.header.record_count as usize, records.len());
        }
    }

    #[test]
    fn a_batch_built_in_place_is_refused_as_encode_refuses_it() {
        assert!(matches!(BatchBuilder::with_capacity(0).finish(), Err(crate::Error::EmptyBatch)));
        assert!(matches!(EncodedBatch::encode::<&[u8]>(&[]), Err(crate::Error::EmptyBatch)));
        // A record over the limit is taken back out: the batch is as it was.
        let too_large = vec![7u8; limits::RECORD_BYTES_MAX as usize + 1];
        let mut batch = BatchBuilder::with_capacity(0);
        batch.push_with(|out| out.extend_from_slice(b"kept")).expect("push");
        let refused = batch.push_with(|out| out.extend_from_slice(&too_large));
        let max = u64::from(limits::RECORD_BYTES_MAX);
        assert!(matches!(refused, Err(crate::Error::RecordTooLarge { bytes, max: m }) if bytes == max + 1 && m == max));
        assert!(matches!(
            EncodedBatch::encode(&[too_large.as_slice()]),
            Err(crate::Error::RecordTooLarge { bytes, .. }) if bytes == max + 1
        ));
        let mut kept = batch.finish().expect("finish");
        let mut alone = EncodedBatch::encode(&[b"kept"]).expect("encode");
        assert_eq!(kept.seal(1, 2, 0).to_vec(), alone.seal(1, 2, 0));
        // A record exactly at the limit is taken.
        let mut at_limit = BatchBuilder::with_capacity(0);
        at_limit.push_with(|out| out.resize(out.len() + limits::RECORD_BYTES_MAX as usize, 1)).expect("at the limit");
        assert_eq!(at_limit.finish().expect("finish").record_count(), 1);
        // Past the batch's byte limit: two records at the record limit and more.
        let mut over = BatchBuilder::with_capacity(0);
        for _ in 0..2 {
            over.push_with(|out| out.resize(out.len() + limits::RECORD_BYTES_MAX as usize, 1)).expect("push");
        }
        assert!(matches!(over.finish(), Err(crate::Error::BatchTooLarge { records: 2, .. })));
        // Past the batch's record limit: empty records, one too many.
        let mut many = BatchBuilder::with_capacity(0);
        for _ in 0..=limits::BATCH_RECORDS_MAX {
            many.push_with(|_| {}).expect("an empty record");
        }
        let records = u64::from(limits::BATCH_RECORDS_MAX) + 1;
        assert!(matches!(many.finish(), Err(crate::Error::BatchTooLarge { records: r, .. }) if r == records));
    }
}
