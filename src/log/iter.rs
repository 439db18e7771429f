//! [`LogIter`]: reads records in LSN order across segments.

use bytes::Bytes;

use crate::error::Result;
use crate::log::Lsn;
use crate::log::index::{FrameAt, FrameCursor, ReadBatch, SegmentMeta};
use crate::log::record::read_u32_le;

/// Iterator over `(LSN, record)` pairs, oldest first, up to the newest record published when
/// it was created. Records are verified and sliced from the read window they were read into,
/// without a further copy. After an error it yields nothing more.
#[derive(Debug)]
pub struct LogIter {
    segments: std::vec::IntoIter<SegmentMeta>,
    cursor: Option<FrameCursor>,
    batch: Option<BatchReader>,
    from_lsn: u64,
    failed: bool,
}

#[derive(Debug)]
struct BatchReader {
    payload: Bytes,
    at: usize,
    lsn: u64,
    end_lsn: u64,
}

impl BatchReader {
    fn new(batch: ReadBatch) -> Self {
        let end_lsn = batch.first_lsn + u64::from(batch.record_count);
        Self { payload: batch.payload, at: 0, lsn: batch.first_lsn, end_lsn }
    }

    /// The next record; the payload verified as a whole, so its framing is sound.
    fn next_record(&mut self) -> Option<(u64, Bytes)> {
        if self.lsn >= self.end_lsn || self.at + 4 > self.payload.len() {
            return None;
        }
        let len = read_u32_le(&self.payload, self.at) as usize;
        let start = self.at + 4;
        let record = self.payload.slice(start..start + len);
        self.at = start + len;
        let lsn = self.lsn;
        self.lsn += 1;
        Some((lsn, record))
    }
}

impl LogIter {
    pub(crate) fn new(segments: Vec<SegmentMeta>, from_lsn: u64) -> Self {
        let relevant: Vec<SegmentMeta> = segments.into_iter().filter(|meta| meta.next_lsn > from_lsn).collect();
        Self { segments: relevant.into_iter(), cursor: None, batch: None, from_lsn, failed: false }
    }

    fn next_batch(&mut self) -> Result<Option<BatchReader>> {
        loop {
            if self.cursor.is_none() {
                let Some(meta) = self.segments.next() else { return Ok(None) };
                self.cursor = Some(FrameCursor::seek(meta, self.from_lsn));
            }
            let cursor = self.cursor.as_mut().expect("set above");
            match cursor.next_batch()? {
                Some(batch) => return Ok(Some(BatchReader::new(batch))),
                None => self.cursor = None,
            }
        }
    }
}

impl Iterator for LogIter {
    type Item = Result<(Lsn, Bytes)>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.failed {
            if let Some(batch) = &mut self.batch {
                match batch.next_record() {
                    Some((lsn, _)) if lsn < self.from_lsn => continue,
                    Some((lsn, record)) => return Some(Ok((Lsn::new(lsn), record))),
                    None => self.batch = None,
                }
            }
            match self.next_batch() {
                Ok(Some(batch)) => self.batch = Some(batch),
                Ok(None) => return None,
                Err(error) => {
                    self.failed = true;
                    return Some(Err(error));
                }
            }
        }
        None
    }
}

/// Bytes of the length before each record of a batch payload (`FORMAT.md` §3).
const RECORD_LEN_BYTES: usize = 4;

/// A record seen by [`crate::Log::visit`]: borrowed from its segment, made a shared slice only
/// on request.
#[derive(Clone, Copy, Debug)]
pub struct RecordRef<'a> {
    source: &'a Bytes,
    start: usize,
    end: usize,
}

impl<'a> RecordRef<'a> {
    /// The record's bytes.
    pub fn bytes(&self) -> &'a [u8] {
        &self.source[self.start..self.end]
    }

    /// The record as a shared slice of its segment (what [`LogIter`] yields).
    pub fn to_bytes(&self) -> Bytes {
        self.source.slice(self.start..self.end)
    }
}

/// Records kept past a [`crate::Log::visit`] callback without a reference count per record:
/// the segment maps (or read windows) they lie in, each held once for a run of records from
/// it, and each record as a [`HeldRange`] of one of them.
#[derive(Debug, Default)]
pub(crate) struct HeldSources {
    sources: Vec<Bytes>,
}

/// Bytes held by a [`HeldSources`]: which source, and the byte range there.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HeldRange {
    source: u32,
    start: u32,
    end: u32,
}

impl HeldRange {
    /// The part `range` of these bytes (offsets relative to their start), if it lies within.
    pub fn sub(&self, range: std::ops::Range<usize>) -> Option<HeldRange> {
        let start = self.start.checked_add(u32::try_from(range.start).ok()?)?;
        let end = self.start.checked_add(u32::try_from(range.end).ok()?)?;
        (start <= end && end <= self.end).then_some(HeldRange { source: self.source, start, end })
    }
}

impl HeldSources {
    /// Holds `record` (and its source, unless the last record held came from the same one);
    /// `None` if it lies past 4 GiB of its source.
    pub fn hold(&mut self, record: &RecordRef<'_>) -> Option<HeldRange> {
        if self.sources.last().is_none_or(|last| !std::ptr::eq(last.as_ptr(), record.source.as_ptr())) {
            self.sources.push(record.source.clone());
        }
        Some(HeldRange {
            source: u32::try_from(self.sources.len() - 1).ok()?,
            start: u32::try_from(record.start).ok()?,
            end: u32::try_from(record.end).ok()?,
        })
    }

    /// The bytes of `held` (empty if it is not one of these sources' ranges).
    pub fn bytes(&self, held: HeldRange) -> &[u8] {
        let source = self.sources.get(held.source as usize);
        source.and_then(|bytes| bytes.get(held.start as usize..held.end as usize)).unwrap_or_default()
    }
}

/// Calls `visit` with every record of `segments` with an LSN in `from..=to`, in order, until it
/// returns `Ok(false)`. Frames are verified as [`LogIter`] verifies them; records are borrowed.
pub(crate) fn visit(
    segments: Vec<SegmentMeta>,
    from: u64,
    to: u64,
    mut visit: impl FnMut(u64, RecordRef<'_>) -> Result<bool>,
) -> Result<()> {
    visit_framed(segments, from, to, |lsn, _, record| visit(lsn, record))
}

/// [`visit`], also telling `visit` the offset in its segment of each record's frame.
pub(crate) fn visit_framed(
    segments: Vec<SegmentMeta>,
    from: u64,
    to: u64,
    mut visit: impl FnMut(u64, u64, RecordRef<'_>) -> Result<bool>,
) -> Result<()> {
    for meta in segments.into_iter().filter(|meta| meta.next_lsn > from) {
        if meta.first_lsn > to {
            break;
        }
        let mut cursor = FrameCursor::seek(meta, from);
        while let Some(frame) = cursor.next_frame()? {
            let go_on = frame_records(&cursor, &frame, |lsn, record| {
                if lsn > to {
                    return Ok(false);
                }
                if lsn >= from { visit(lsn, frame.offset, record) } else { Ok(true) }
            })?;
            if !go_on {
                return Ok(());
            }
        }
    }
    Ok(())
}

/// Calls `visit` with the record at each of `lsns` (ascending, without repeats) that
/// `segments` hold, in order, until it returns `Ok(false)`; returns how many it visited. Only
/// the frames holding one of them are read and verified; every other frame is stepped over on
/// its verified header, and a gap between two of them wider than the sparse index's stride is
/// crossed by seeking. LSNs the log does not hold are passed over.
pub(crate) fn visit_lsns(
    segments: Vec<SegmentMeta>,
    lsns: &[u64],
    mut visit: impl FnMut(u64, RecordRef<'_>) -> Result<bool>,
) -> Result<usize> {
    let mut wanted = lsns.iter().copied().peekable();
    let mut visited = 0;
    for meta in segments {
        // LSNs below this segment are in none (truncated, or a range recovery skipped).
        while wanted.next_if(|lsn| *lsn < meta.first_lsn).is_some() {}
        let Some(&first) = wanted.peek() else { break };
        if first >= meta.next_lsn {
            continue;
        }
        let segment_end = meta.next_lsn;
        let mut cursor = FrameCursor::seek(meta, first);
        // The LSN the cursor last sought through the sparse index.
        let mut sought = first;
        while let Some(&lsn) = wanted.peek().filter(|lsn| **lsn < segment_end) {
            if lsn != sought {
                cursor.skip_toward(lsn);
                sought = lsn;
            }
            let Some(header) = cursor.peek_header()? else { break };
            if header.next_lsn() <= lsn {
                cursor.skip_frame(&header);
                continue;
            }
            if header.first_lsn > lsn {
                // In no frame: a range recovery skipped.
                wanted.next();
                continue;
            }
            let Some(frame) = cursor.next_frame()? else { break };
            let go_on = frame_records(&cursor, &frame, |at, record| {
                if wanted.next_if_eq(&at).is_none() {
                    return Ok(true);
                }
                visited += 1;
                visit(at, record)
            })?;
            if !go_on {
                return Ok(visited);
            }
        }
    }
    Ok(visited)
}

/// [`visit_lsns`] for records whose frames' offsets are known: `frames[i]` is the offset in its
/// segment of the frame that held `lsns[i]` when it was indexed. The cursor jumps straight to
/// each frame instead of walking the frames before it; a frame not found there (the segment
/// was rewritten since) is looked for as [`visit_lsns`] looks, so a stale offset costs time,
/// never a wrong or missing record.
pub(crate) fn visit_at(
    segments: Vec<SegmentMeta>,
    lsns: &[u64],
    frames: &[u32],
    mut visit: impl FnMut(u64, RecordRef<'_>) -> Result<bool>,
) -> Result<usize> {
    debug_assert_eq!(lsns.len(), frames.len());
    let mut wanted = lsns.iter().copied().zip(frames.iter().copied()).peekable();
    let mut visited = 0;
    for meta in segments {
        while wanted.next_if(|(lsn, _)| *lsn < meta.first_lsn).is_some() {}
        let Some(&(first, _)) = wanted.peek() else { break };
        if first >= meta.next_lsn {
            continue;
        }
        let segment_end = meta.next_lsn;
        let mut cursor = FrameCursor::seek(meta, first);
        while let Some(&(lsn, offset)) = wanted.peek().filter(|(lsn, _)| *lsn < segment_end) {
            cursor.jump_to(u64::from(offset));
            let here =
                matches!(cursor.peek_header(), Ok(Some(header)) if header.first_lsn <= lsn && lsn < header.next_lsn());
            if !here {
                // Stale: find the frame from the sparse index, as `visit_lsns` does.
                cursor.rewind_to(lsn);
                while let Some(header) = cursor.peek_header()? {
                    if header.next_lsn() > lsn {
                        break;
                    }
                    cursor.skip_frame(&header);
                }
            }
            match cursor.peek_header()? {
                Some(header) if header.first_lsn <= lsn => {}
                // In no frame: dropped by a rewrite, or in a range recovery skipped.
                _ => {
                    wanted.next();
                    continue;
                }
            }
            let Some(frame) = cursor.next_frame()? else { break };
            let go_on = frame_records(&cursor, &frame, |at, record| {
                if wanted.next_if(|(lsn, _)| *lsn == at).is_none() {
                    return Ok(true);
                }
                visited += 1;
                visit(at, record)
            })?;
            if !go_on {
                return Ok(visited);
            }
            // A frame's LSNs are contiguous, so it held `lsn`; were it not so, `lsn` is passed
            // over rather than looked for again.
            wanted.next_if(|(next, _)| *next == lsn);
        }
    }
    Ok(visited)
}

/// Calls `visit` with each record of `frame`, the frame `cursor` just read, until it returns
/// `Ok(false)`; returns whether it went to the end.
fn frame_records(
    cursor: &FrameCursor,
    frame: &FrameAt,
    mut visit: impl FnMut(u64, RecordRef<'_>) -> Result<bool>,
) -> Result<bool> {
    let source = cursor.source();
    let (mut at, mut lsn) = (frame.payload.start, frame.first_lsn);
    for _ in 0..frame.record_count {
        let Some(len) = source.get(at..at + RECORD_LEN_BYTES).filter(|_| at + RECORD_LEN_BYTES <= frame.payload.end)
        else {
            return Err(cursor.corruption_here("a record runs past its frame"));
        };
        let start = at + RECORD_LEN_BYTES;
        let end = start + read_u32_le(len, 0) as usize;
        if end > frame.payload.end {
            return Err(cursor.corruption_here("a record runs past its frame"));
        }
        if !visit(lsn, RecordRef { source, start, end })? {
            return Ok(false);
        }
        (at, lsn) = (end, lsn + 1);
    }
    Ok(true)
}
