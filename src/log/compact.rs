//! Rewriting a sealed segment without its dead records: the primitive compaction is built on.
//!
//! The rewritten segment keeps the original's name, sequence, salt and LSNs; it holds only the
//! records the caller keeps (some possibly replaced by smaller ones), so its frames may skip
//! LSNs, and its header records the LSN after the original's last record (`end_lsn`), which
//! keeps the log contiguous across segments. Because LSNs never change, nothing that refers to
//! a record by LSN has to be updated.
//!
//! Crash safety: the new file is written under a temporary name, synced, renamed over the
//! original and the directory synced. A crash leaves either the original or the rewritten
//! file, both complete; a leftover temporary file is deleted by the next recovery.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;

use crate::error::{Error, Result};
use crate::limits;
use crate::log::index::{SegmentMeta, SparseEntry};
use crate::log::iter::LogIter;
use crate::log::record::EncodedBatch;
use crate::log::segment::{self, SEGMENT_HEADER_BYTES, SegmentHeader};
use crate::log::{Log, Lsn};
use crate::storage::{OpenMode, StorageFile};

/// Payload bytes of one frame of a rewritten segment.
const REWRITE_FRAME_BYTES: usize = 1024 * 1024;
/// Bytes buffered before each write (and sync) of the rewritten file: syncing as it goes keeps
/// each `fdatasync` small, so that the log's own syncs never queue behind a big one.
const REWRITE_WRITE_BYTES: usize = 256 * 1024;
const _: () = assert!(REWRITE_FRAME_BYTES <= limits::BATCH_BYTES_MAX as usize);

/// What to do with one record when its segment is rewritten.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rewrite {
    /// Keep the record as it is.
    Keep,
    /// Leave the record out: reading its LSN returns `None` from then on.
    Drop,
    /// Keep the LSN with these bytes instead (for example, the record without a part that is
    /// no longer needed).
    Replace(Vec<u8>),
}

/// How [`Log::rewrite_segment_with`] writes the new segment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RewriteOptions {
    /// Compress the kept records (format version 2, `FORMAT.md` §5a); `None` writes plain
    /// frames (format version 1).
    pub compression: Option<FrameCompression>,
}

/// Compression of a rewritten segment's frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameCompression {
    /// zstd level, 1..=22.
    pub level: i32,
    /// Uncompressed bytes of records per frame, `FRAME_COMPRESSION_BYTES_MIN..=
    /// FRAME_COMPRESSION_BYTES_MAX` (a read of one record inflates its whole frame).
    pub frame_bytes: usize,
}

/// Smallest [`FrameCompression::frame_bytes`].
pub const FRAME_COMPRESSION_BYTES_MIN: usize = 4 * 1024;
/// Largest [`FrameCompression::frame_bytes`].
pub const FRAME_COMPRESSION_BYTES_MAX: usize = 4 * 1024 * 1024;
const _: () = assert!(FRAME_COMPRESSION_BYTES_MAX <= limits::BATCH_BYTES_MAX as usize);

impl FrameCompression {
    /// Checks the level and frame size.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the value out of range.
    pub fn validate(&self) -> Result<()> {
        if !(1..=22).contains(&self.level) {
            return Err(Error::InvalidConfig { reason: format!("zstd level {} is not in 1..=22", self.level) });
        }
        if !(FRAME_COMPRESSION_BYTES_MIN..=FRAME_COMPRESSION_BYTES_MAX).contains(&self.frame_bytes) {
            let reason = format!(
                "compressed frames of {} bytes: not in {FRAME_COMPRESSION_BYTES_MIN}..={FRAME_COMPRESSION_BYTES_MAX}",
                self.frame_bytes
            );
            return Err(Error::InvalidConfig { reason });
        }
        Ok(())
    }
}

/// What [`Log::rewrite_segment`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RewriteReport {
    /// Records kept unchanged.
    pub kept: u64,
    /// Records kept with new bytes.
    pub replaced: u64,
    /// Records left out.
    pub dropped: u64,
    /// Bytes of frames in the segment before.
    pub bytes_before: u64,
    /// Bytes of frames in the segment after.
    pub bytes_after: u64,
}

impl Log {
    /// Rewrites the sealed segment that starts at `first_lsn`, asking `decide` what to do with
    /// each of its records, in LSN order. Readers keep working throughout and see the same
    /// record at every kept LSN.
    ///
    /// # Errors
    /// [`Error::NotSealed`] if no sealed segment starts at `first_lsn`; `decide`'s errors
    /// (nothing changes then); read errors of the segment; [`Error::Io`] or
    /// [`Error::NoSpace`] from writing the new file (the original stays).
    pub fn rewrite_segment(
        &self,
        first_lsn: Lsn,
        decide: impl FnMut(Lsn, &Bytes) -> Result<Rewrite>,
    ) -> Result<RewriteReport> {
        self.rewrite_segment_with(first_lsn, RewriteOptions::default(), decide)
    }

    /// [`Log::rewrite_segment`], writing the new segment as `options` say: with compressed
    /// frames, records are read back exactly as before (each read of a record inflates its
    /// frame).
    ///
    /// # Errors
    /// As [`Log::rewrite_segment`]; [`Error::InvalidConfig`] for a compression out of range.
    pub fn rewrite_segment_with(
        &self,
        first_lsn: Lsn,
        options: RewriteOptions,
        mut decide: impl FnMut(Lsn, &Bytes) -> Result<Rewrite>,
    ) -> Result<RewriteReport> {
        if let Some(compression) = &options.compression {
            compression.validate()?;
        }
        let _one_at_a_time = self.inner.truncating.lock();
        let meta = self.sealed_meta(first_lsn.get())?;
        let header = SegmentHeader { compressed: options.compression.is_some(), ..compacted_header(&meta)? };
        let storage = self.inner.storage.as_ref();
        let temp =
            self.inner.dir.join(format!("{}.compact{}", segment::file_name(header.first_lsn), segment::TEMP_SUFFIX));
        let _ = storage.remove_file(&temp);
        let file = storage.open(&temp, OpenMode::CreateNew).map_err(|e| Error::io("create", &temp, e))?;
        let mut out = SegmentWriter::new(Arc::clone(&file), &temp, header, options.compression)?;
        let written = copy_records(&meta, &mut out, &mut decide).and_then(|mut report| {
            out.finish()?;
            report.bytes_before = meta.data_end;
            report.bytes_after = out.offset;
            Ok(report)
        });
        let report = match written {
            Ok(report) => report,
            Err(error) => {
                let _ = storage.remove_file(&temp);
                return Err(error);
            }
        };
        // IMPORTANT: the rewritten bytes are durable before the name points at them.
        file.sync_data().map_err(|e| Error::io("fdatasync", &temp, e))?;
        storage.rename(&temp, &meta.path).map_err(|e| Error::io("rename", &temp, e))?;
        // IMPORTANT: the replacement survives a crash only once the directory is synced.
        storage.sync_dir(&self.inner.dir).map_err(|e| Error::io("sync directory", &self.inner.dir, e))?;
        let rewritten = SegmentMeta {
            data_end: out.offset,
            sparse: Arc::new(out.sparse),
            skips: Arc::new(Vec::new()),
            file: Arc::clone(&file),
            next_lsn: header.end_lsn,
            compressed: header.compressed,
            generation: header.generation,
            ..meta
        };
        // Every rewrite moves frames, so the stream index's offsets into it change.
        let reindex = self.streams().is_some().then(|| rewritten.clone());
        let mut index = self.inner.index.write();
        if let Some(slot) = index.segments.iter_mut().find(|m| m.first_lsn == rewritten.first_lsn) {
            *slot = rewritten;
        }
        drop(index);
        // After the swap, so that a query catching up meanwhile reads the new segment, and
        // after this reindex the stream index holds what it holds.
        if let (Some(streams), Some(rewritten)) = (self.streams(), reindex) {
            streams.reindex(&rewritten);
        }
        // After the rename: a manifest listing the new generation never names a file that
        // does not exist yet, and one still listing the old generation accepts the new one.
        self.inner.manifest.publish(&self.inner.index, None)?;
        Ok(report)
    }

    /// The sealed segment starting at `first_lsn`.
    fn sealed_meta(&self, first_lsn: u64) -> Result<SegmentMeta> {
        let index = self.inner.index.read();
        let sealed = index.segments.len().saturating_sub(1);
        index.segments[..sealed]
            .iter()
            .find(|meta| meta.first_lsn == first_lsn)
            .cloned()
            .ok_or(Error::NotSealed { first_lsn })
    }
}

/// The header of `meta`'s rewrite: the original's, with the end of its LSN range recorded.
fn compacted_header(meta: &SegmentMeta) -> Result<SegmentHeader> {
    let mut bytes = [0u8; segment::SEGMENT_HEADER_BYTES];
    meta.file.read_exact_at(&mut bytes, 0).map_err(|e| Error::io("read", meta.path.to_path_buf(), e))?;
    let original = SegmentHeader::decode(&bytes).map_err(|reason| Error::Corruption {
        segment: meta.path.to_path_buf(),
        offset: 0,
        kind: crate::error::CorruptionKind::BadSegmentHeader { reason },
    })?;
    let generation = original.next_generation().ok_or_else(|| Error::LimitExceeded {
        what: format!("rewrites of segment {}", meta.path.display()),
        limit: u64::from(u32::MAX),
    })?;
    Ok(SegmentHeader { end_lsn: meta.next_lsn, generation, ..original })
}

/// Streams the records of `meta` through `decide` into `out`.
fn copy_records(
    meta: &SegmentMeta,
    out: &mut SegmentWriter,
    decide: &mut impl FnMut(Lsn, &Bytes) -> Result<Rewrite>,
) -> Result<RewriteReport> {
    let mut report = RewriteReport::default();
    for item in LogIter::new(vec![meta.clone()], meta.first_lsn) {
        let (lsn, bytes) = item?;
        match decide(lsn, &bytes)? {
            Rewrite::Keep => {
                report.kept += 1;
                out.push(lsn.get(), bytes)?;
            }
            Rewrite::Replace(new) => {
                report.replaced += 1;
                out.push(lsn.get(), Bytes::from(new))?;
            }
            Rewrite::Drop => report.dropped += 1,
        }
    }
    Ok(report)
}

/// Writes frames of contiguous kept records into the new segment file.
struct SegmentWriter {
    file: Arc<dyn StorageFile>,
    path: PathBuf,
    salt: u64,
    /// Records of the frame being built, and the LSN of its first one.
    pending: Vec<Bytes>,
    pending_first: u64,
    pending_bytes: usize,
    /// Sealed frames not yet written, and the file offset they start at.
    buf: Vec<u8>,
    buf_at: u64,
    /// Offset after the last frame.
    offset: u64,
    sparse: Vec<SparseEntry>,
    last_indexed: Option<u64>,
    /// The compressor of a compressed rewrite, and its frames' uncompressed size.
    compressor: Option<zstd::bulk::Compressor<'static>>,
    frame_bytes: usize,
}

impl SegmentWriter {
    fn new(
        file: Arc<dyn StorageFile>,
        path: &Path,
        header: SegmentHeader,
        compression: Option<FrameCompression>,
    ) -> Result<Self> {
        let mut buf = Vec::with_capacity(REWRITE_WRITE_BYTES);
        buf.extend_from_slice(&header.encode());
        let compressor = match compression {
            Some(compression) => Some(compressor(compression.level).map_err(|e| Error::io("zstd", path, e))?),
            None => None,
        };
        Ok(Self {
            file,
            path: path.to_path_buf(),
            salt: header.salt(),
            pending: Vec::new(),
            pending_first: 0,
            pending_bytes: 0,
            buf,
            buf_at: 0,
            offset: SEGMENT_HEADER_BYTES as u64,
            sparse: Vec::new(),
            last_indexed: None,
            compressor,
            frame_bytes: compression.map_or(REWRITE_FRAME_BYTES, |c| c.frame_bytes),
        })
    }

    fn push(&mut self, lsn: u64, record: Bytes) -> Result<()> {
        let contiguous = self.pending_first + self.pending.len() as u64 == lsn;
        if !self.pending.is_empty() && (!contiguous || self.pending_bytes + record.len() > self.frame_bytes) {
            self.seal_frame()?;
        }
        if self.pending.is_empty() {
            self.pending_first = lsn;
        }
        self.pending_bytes += record.len() + 4;
        self.pending.push(record);
        Ok(())
    }

    fn seal_frame(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let mut batch = match &mut self.compressor {
            Some(compressor) => EncodedBatch::encode_compressed(&self.pending, compressor)?,
            None => EncodedBatch::encode(&self.pending)?,
        };
        if self.last_indexed.is_none_or(|at| self.offset - at >= limits::SPARSE_INDEX_STRIDE_BYTES) {
            self.sparse.push(SparseEntry { lsn: self.pending_first, offset: self.offset });
            self.last_indexed = Some(self.offset);
        }
        // Everything before this frame is written by the time the file is published.
        let synced_through = u32::try_from(self.offset).expect("segments are at most SEGMENT_BYTES_MAX < 4 GiB");
        let frame = batch.seal(self.pending_first, self.salt, synced_through);
        self.offset += frame.len() as u64;
        self.buf.extend_from_slice(frame);
        self.pending.clear();
        self.pending_bytes = 0;
        if self.buf.len() >= REWRITE_WRITE_BYTES {
            self.write_buf()?;
        }
        Ok(())
    }

    fn write_buf(&mut self) -> Result<()> {
        self.file.write_all_at(&self.buf, self.buf_at).map_err(|e| Error::io("write", &self.path, e))?;
        self.file.sync_data().map_err(|e| Error::io("fdatasync", &self.path, e))?;
        self.buf_at += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        self.seal_frame()?;
        self.write_buf()
    }
}

/// A zstd compressor at `level` whose frames carry no checksum (the frame's CRC-32 covers
/// them) and no dictionary id.
fn compressor(level: i32) -> std::io::Result<zstd::bulk::Compressor<'static>> {
    let mut compressor = zstd::bulk::Compressor::new(level)?;
    compressor.include_checksum(false)?;
    compressor.include_dictid(false)?;
    Ok(compressor)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::log::record::{self, FRAME_HEADER_BYTES, RAW_LEN_BYTES};
    use crate::storage::sim::SimStorage;
    use crate::{Durability, Error};

    /// A compressed frame whose checksums verify but whose zstd frame does not decompress
    /// (forged by a writer who knew the salt, or a bug): the open accepts it (recovery checks
    /// checksums only), a read of its records is `Corruption` naming the frame, and
    /// `dump verify` reports it.
    #[test]
    fn a_resealed_undecompressable_frame_is_corruption_for_readers_and_verify() {
        let sim = SimStorage::new(1);
        let dir = Path::new("/db");
        let open = || Log::builder(dir).storage(Arc::new(sim.clone())).segment_bytes(4096).open().expect("open");
        let log = open();
        for i in 0..40u8 {
            log.append_with(&[b'a' + i % 7; 200], Durability::Sync).expect("append");
        }
        let first = log.segments()[0].first_lsn;
        let compression = Some(FrameCompression { level: 3, frame_bytes: 4096 });
        log.rewrite_segment_with(first, RewriteOptions { compression }, |_, _| Ok(Rewrite::Keep)).expect("rewrite");
        let path = log.segments()[0].path.clone();
        drop(log);

        let mut bytes = sim.file_bytes(&path).expect("segment");
        let salt = SegmentHeader::decode(&bytes).expect("header").salt();
        let at = SEGMENT_HEADER_BYTES;
        let frame = record::decode_frame(&bytes[at..], salt).expect("a valid frame");
        assert!(frame.header.is_compressed(), "the rewrite compressed the frame");
        // The zstd frame's magic number, damaged: nothing decompresses it.
        let magic = at + FRAME_HEADER_BYTES + RAW_LEN_BYTES;
        bytes[magic] ^= 0xFF;
        record::reseal(&mut bytes[at..], salt);
        sim.overwrite(&path, 0, &bytes);

        let log = open();
        match log.read(first) {
            Err(Error::Corruption { segment, offset, .. }) => {
                assert_eq!((segment, offset), (path.clone(), at as u64), "the error names the frame");
            }
            other => panic!("a read of the forged frame's record returned {other:?}"),
        }
        drop(log);
        let report = crate::inspect::verify_with(Arc::new(sim.clone()), dir, &mut |_, _| {}).expect("verify");
        let found =
            report.problems.iter().any(|p| p.file == path && p.offset == at as u64 && p.what.contains("compressed"));
        assert!(found, "verify reports the frame: {:?}", report.problems);
    }
}
