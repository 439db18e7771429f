//! The in-memory segment index: which segments exist, what each one holds, and how to find a
//! record's frame. Rebuilt by recovery, extended by the writer, read by readers.

use std::path::Path;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use crate::error::{CorruptionKind, Error, Result};
use crate::limits;
use crate::log::inflated;
use crate::log::record::{self, FRAME_HEADER_BYTES, FrameHeader};
use crate::log::segment::SEGMENT_HEADER_BYTES;
use crate::storage::StorageFile;

/// First positioned read of a cursor on the active segment.
const READ_WINDOW_BYTES_MIN: usize = 4 * 1024;

/// One entry of a segment's sparse index: the frame starting at `offset` begins with `lsn`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SparseEntry {
    pub lsn: u64,
    pub offset: u64,
}

/// What readers know of one segment. Cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct SegmentMeta {
    pub seq: u64,
    /// The header's generation (`segment.rs`), listed in the log manifest.
    pub generation: u32,
    /// Salt of the segment's frame checksums.
    pub salt: u64,
    /// Whether compressed frames may appear (a format-version-2 rewrite).
    pub compressed: bool,
    pub first_lsn: u64,
    /// LSN after the last published record.
    pub next_lsn: u64,
    /// Offset after the last published frame.
    pub data_end: u64,
    pub path: Arc<Path>,
    pub sparse: Arc<Vec<SparseEntry>>,
    /// Byte ranges recovery skipped (only under `RecoveryMode::SkipCorrupted`), sorted.
    pub skips: Arc<Vec<(u64, u64)>>,
    /// The segment file, read with positioned reads below `data_end` (never through a map,
    /// so that a read the disk fails is an error, not a `SIGBUS`).
    pub file: Arc<dyn StorageFile>,
}

impl SegmentMeta {
    /// Whether the segment holds `lsn` (it may still fall in a skipped gap).
    pub fn covers(&self, lsn: u64) -> bool {
        lsn >= self.first_lsn && lsn < self.next_lsn
    }

    /// Offset of the last indexed frame at or before `lsn`.
    pub fn seek_offset(&self, lsn: u64) -> u64 {
        let at = self.sparse.partition_point(|entry| entry.lsn <= lsn);
        match at.checked_sub(1) {
            Some(i) => self.sparse[i].offset,
            None => SEGMENT_HEADER_BYTES as u64,
        }
    }

    fn corruption(&self, offset: u64, reason: &'static str) -> Error {
        Error::Corruption { segment: self.path.to_path_buf(), offset, kind: CorruptionKind::BadBatch { reason } }
    }
}

/// A verified frame of [`FrameCursor::next_frame`].
#[derive(Debug)]
pub(crate) struct FrameAt {
    /// The frame's offset in its segment.
    pub offset: u64,
    pub first_lsn: u64,
    pub record_count: u32,
    /// The payload's range in [`FrameCursor::source`].
    pub payload: std::ops::Range<usize>,
}

/// A verified batch read from a segment.
#[derive(Debug)]
pub(crate) struct ReadBatch {
    pub first_lsn: u64,
    pub record_count: u32,
    /// The payload; records are sliced out of it without copying.
    pub payload: Bytes,
}

/// Walks a segment's frames from an offset, verifying each one again as it is read; a
/// compressed frame's records are inflated into a buffer of their own.
#[derive(Debug)]
pub(crate) struct FrameCursor {
    meta: SegmentMeta,
    pos: u64,
    window: Bytes,
    window_start: u64,
    /// The records of the last frame read, when it was compressed.
    inflated: Option<Bytes>,
    /// Bytes the next positioned read fetches: small for point reads, doubling as a scan goes
    /// on, up to `READ_CHUNK_BYTES_MAX`.
    window_bytes: usize,
}

impl FrameCursor {
    /// A cursor at the indexed frame at or before `lsn`.
    pub fn seek(meta: SegmentMeta, lsn: u64) -> Self {
        let pos = meta.seek_offset(lsn);
        Self { meta, pos, window: Bytes::new(), window_start: 0, inflated: None, window_bytes: READ_WINDOW_BYTES_MIN }
    }

    /// The next frame, or `None` at the published end. The frame is verified in place; only
    /// its payload becomes a (reference-counted) slice.
    pub fn next_batch(&mut self) -> Result<Option<ReadBatch>> {
        let Some(frame) = self.next_frame()? else { return Ok(None) };
        let payload = self.source().slice(frame.payload);
        Ok(Some(ReadBatch { first_lsn: frame.first_lsn, record_count: frame.record_count, payload }))
    }

    /// The next frame, verified in place, or `None` at the published end; its payload (for a
    /// compressed frame: its inflated records) is at `payload` of [`FrameCursor::source`] until
    /// the next call.
    pub fn next_frame(&mut self) -> Result<Option<FrameAt>> {
        self.skip_gap();
        self.inflated = None;
        if self.pos >= self.meta.data_end {
            return Ok(None);
        }
        let (pos, salt) = (self.pos, self.meta.salt);
        let header = record::decode_header(self.fetch(pos, FRAME_HEADER_BYTES)?, salt);
        let header = header.map_err(|_| self.meta.corruption(pos, "frame header does not verify"))?;
        if header.is_compressed() && !self.meta.compressed {
            return Err(self.meta.corruption(pos, "a compressed frame in a segment of format version 1"));
        }
        // A compressed frame is verified on disk first, then inflated (or taken from the cache
        // of inflated frames, under its verified checksum).
        let key = (salt, pos, header.checksum);
        let frame = record::decode_frame(self.fetch(pos, header.frame_len())?, salt)
            .and_then(|frame| match frame.header.is_compressed() {
                true => match inflated::get(key) {
                    Some(records) => Ok(Some(records)),
                    None => record::inflate(&frame).map(|records| {
                        let records = Bytes::from(records);
                        inflated::put(key, records.clone());
                        Some(records)
                    }),
                },
                false => Ok(None),
            })
            .map_err(|_| self.meta.corruption(pos, "frame does not verify"))?;
        let payload = match frame {
            Some(records) => {
                let len = records.len();
                self.inflated = Some(records);
                0..len
            }
            None => {
                let start = (pos - self.window_start) as usize + FRAME_HEADER_BYTES;
                start..start + header.payload_len as usize
            }
        };
        self.pos += header.frame_len() as u64;
        Ok(Some(FrameAt { offset: pos, first_lsn: header.first_lsn, record_count: header.record_count, payload }))
    }

    /// Moves to the frame at `offset` (forward or back), which the caller took from an earlier
    /// read of this segment; [`FrameCursor::peek_header`] then verifies that a frame is there.
    pub fn jump_to(&mut self, offset: u64) {
        if offset < self.window_start || offset >= self.window_start + self.window.len() as u64 {
            self.window_bytes = READ_WINDOW_BYTES_MIN;
        }
        self.pos = offset;
    }

    /// Moves (forward or back) to the last indexed frame at or before `lsn`.
    pub fn rewind_to(&mut self, lsn: u64) {
        let offset = self.meta.seek_offset(lsn);
        self.jump_to(offset);
    }

    /// Moves forward to the last indexed frame at or before `lsn`, if that lies past the
    /// cursor (never backward). A jump out of the read window starts the window small again,
    /// so that hopping between scattered records reads little more than their frames.
    pub fn skip_toward(&mut self, lsn: u64) {
        let offset = self.meta.seek_offset(lsn);
        if offset > self.pos {
            if offset >= self.window_start + self.window.len() as u64 {
                self.window_bytes = READ_WINDOW_BYTES_MIN;
            }
            self.pos = offset;
        }
    }

    /// The next frame's header, verified, without reading its payload; `None` at the
    /// published end. [`FrameCursor::next_frame`] reads that frame, [`FrameCursor::skip_frame`]
    /// steps over it.
    pub fn peek_header(&mut self) -> Result<Option<FrameHeader>> {
        self.skip_gap();
        if self.pos >= self.meta.data_end {
            return Ok(None);
        }
        let (pos, salt) = (self.pos, self.meta.salt);
        let header = record::decode_header(self.fetch(pos, FRAME_HEADER_BYTES)?, salt);
        header.map(Some).map_err(|_| self.meta.corruption(pos, "frame header does not verify"))
    }

    /// Steps over the frame whose header [`FrameCursor::peek_header`] just returned, unread:
    /// its payload is neither verified nor inflated.
    pub fn skip_frame(&mut self, header: &FrameHeader) {
        self.pos += header.frame_len() as u64;
    }

    /// The bytes the last frame's `payload` range indexes: the read window, or the inflated
    /// records of a compressed frame.
    pub fn source(&self) -> &Bytes {
        self.inflated.as_ref().unwrap_or(&self.window)
    }

    /// Where the cursor is reading, for errors.
    pub fn corruption_here(&self, reason: &'static str) -> Error {
        self.meta.corruption(self.pos, reason)
    }

    fn skip_gap(&mut self) {
        // The skips are sorted and disjoint, and a valid frame follows each: one lookup, so
        // reading a segment with many damaged ranges costs frames × log(ranges).
        let skips = &self.meta.skips;
        let after = skips.partition_point(|&(start, _)| start <= self.pos);
        if let Some(&(_, end)) = after.checked_sub(1).and_then(|i| skips.get(i))
            && self.pos < end
        {
            self.pos = end;
        }
    }

    /// `len` bytes at `offset`, all below the published end, borrowed from the read window
    /// (which this refills with a positioned read if it does not hold them).
    fn fetch(&mut self, offset: u64, len: usize) -> Result<&[u8]> {
        let end = offset + len as u64;
        if end > self.meta.data_end {
            return Err(self.meta.corruption(offset, "frame runs past the published end"));
        }
        let window_end = self.window_start + self.window.len() as u64;
        if offset < self.window_start || end > window_end {
            let want = (len.max(self.window_bytes) as u64).min(self.meta.data_end - offset) as usize;
            self.window_bytes = (self.window_bytes * 2).min(limits::READ_CHUNK_BYTES_MAX);
            // The last window's memory is reused when no record read from it is still held: a
            // scan that keeps nothing reads into one buffer instead of faulting in fresh ones.
            let mut buf = match std::mem::take(&mut self.window).try_into_mut() {
                Ok(mut reused) if reused.capacity() >= want => {
                    reused.clear();
                    reused.resize(want, 0);
                    reused
                }
                _ => BytesMut::zeroed(want),
            };
            self.meta
                .file
                .read_exact_at(&mut buf, offset)
                .map_err(|e| Error::io("read", self.meta.path.to_path_buf(), e))?;
            self.window = buf.freeze();
            self.window_start = offset;
        }
        let at = (offset - self.window_start) as usize;
        Ok(&self.window[at..at + len])
    }
}

/// The ordered list of segments, oldest first; the last one is the active segment.
#[derive(Debug, Default)]
pub(crate) struct SegmentIndex {
    pub segments: Vec<SegmentMeta>,
}

impl SegmentIndex {
    /// The segment that holds `lsn`.
    pub fn find(&self, lsn: u64) -> Option<&SegmentMeta> {
        let at = self.segments.partition_point(|meta| meta.first_lsn <= lsn);
        let meta = self.segments.get(at.checked_sub(1)?)?;
        meta.covers(lsn).then_some(meta)
    }

    /// LSN of the oldest record still in the log.
    pub fn first_lsn(&self) -> u64 {
        self.segments.first().map_or(1, |meta| meta.first_lsn)
    }

    /// LSN after the newest published record.
    pub fn next_lsn(&self) -> u64 {
        self.segments.last().map_or(1, |meta| meta.next_lsn)
    }
}
