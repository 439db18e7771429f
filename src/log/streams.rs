//! Streams: the records of one key (an agent, a Raft group, a tenant) found without reading
//! the others, as raft-engine's memtable finds one group's entries.
//!
//! The log stays a log of opaque records; a caller that opens it with a [`StreamKey`] (a
//! function that names the stream a record belongs to, from the record's bytes) gets an index
//! in memory, key → the LSNs of that stream's records in order, each with the offset of its
//! frame in its segment, so that a read jumps straight to it. Nothing of it is on disk: it is
//! built when the log opens (every record is read once, sealed segments in parallel) and kept
//! up to date lazily: each query first indexes the records appended since the last one, in
//! LSN order, so appends pay nothing for it. Memory: 12 bytes per record of a stream (and up
//! to as much again of vector growth), plus a map entry per key.
//!
//! A stream's LSNs are a pure function of the log's records, so the index never needs repair
//! after a crash: it is rebuilt from what recovery kept. Prefix truncation and segment
//! rewrites (which may drop records or replace them with others of another key) update it.

use std::collections::HashMap;
use std::ops::Range;

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::log::index::SegmentMeta;
use crate::log::iter;
use crate::log::record::{self, FrameHeader};
use crate::log::recovery::RecoveredStreams;

/// Names the stream a record belongs to, from its bytes; `None`: the record is in no stream.
/// It must be a pure function of the bytes (the index is rebuilt from them at every open).
pub type StreamKey = fn(&[u8]) -> Option<u64>;

/// The stream index of a log opened with a [`StreamKey`].
pub(crate) struct Streams {
    key_of: StreamKey,
    index: Mutex<StreamIndex>,
}

/// Key → the stream's records, for every record below `indexed_to`.
#[derive(Default)]
struct StreamIndex {
    /// Every record with an LSN below this one is indexed.
    indexed_to: u64,
    streams: StreamPart,
}

/// The streams of a part of the log: key → its records there.
pub(crate) type StreamPart = HashMap<u64, Stream>;

/// Appends `later` (the streams of the part of the log right after `into`'s) to `into`.
pub(crate) fn merge(into: &mut StreamPart, later: StreamPart) {
    for (key, stream) in later {
        into.entry(key).or_default().extend(stream);
    }
}

/// Indexes the records of the frame at `at` in `segment` (a segment's bytes), which recovery
/// has just verified (`header` is its header), into `part`; a compressed frame is inflated
/// first.
///
/// # Errors
/// If its records cannot be read (an inflation that fails, a record that runs past its frame).
pub(crate) fn index_frame(
    key_of: StreamKey,
    frame: &[u8],
    at: u64,
    header: &FrameHeader,
    salt: u64,
    part: &mut StreamPart,
) -> std::result::Result<(), ()> {
    let inflated;
    let payload = if header.is_compressed() {
        let frame = record::decode_frame(frame, salt).map_err(|_| ())?;
        inflated = record::inflate(&frame).map_err(|_| ())?;
        &inflated[..]
    } else {
        let start = record::FRAME_HEADER_BYTES;
        frame.get(start..start + header.payload_len as usize).ok_or(())?
    };
    let mut offset = 0;
    for lsn in header.first_lsn..header.next_lsn() {
        let len = payload.get(offset..offset + 4).ok_or(())?;
        let start = offset + 4;
        let end = start + record::read_u32_le(len, 0) as usize;
        let record = payload.get(start..end).ok_or(())?;
        if let Some(key) = key_of(record) {
            part.entry(key).or_default().push(lsn, at);
        }
        offset = end;
    }
    Ok(())
}

/// One stream's records: ascending LSNs, and the offset of each one's frame in its segment
/// (a segment is at most `limits::SEGMENT_BYTES_MAX`, which fits in 32 bits).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Stream {
    pub lsns: Vec<u64>,
    pub frames: Vec<u32>,
}

impl Stream {
    fn push(&mut self, lsn: u64, frame: u64) {
        self.lsns.push(lsn);
        self.frames.push(frame as u32);
    }

    fn extend(&mut self, other: Stream) {
        self.lsns.extend(other.lsns);
        self.frames.extend(other.frames);
    }

    /// Removes the records with LSNs in `range` and returns where they were.
    fn remove(&mut self, range: Range<u64>) -> usize {
        let start = self.lsns.partition_point(|lsn| *lsn < range.start);
        let end = self.lsns.partition_point(|lsn| *lsn < range.end);
        self.lsns.drain(start..end);
        self.frames.drain(start..end);
        start
    }

    /// At most `max` of the records with LSNs in `lsns`, the first ones.
    fn slice(&self, lsns: Range<u64>, max: usize) -> Stream {
        let start = self.lsns.partition_point(|lsn| *lsn < lsns.start);
        let end = self.lsns.partition_point(|lsn| *lsn < lsns.end).min(start.saturating_add(max));
        Stream { lsns: self.lsns[start..end].to_vec(), frames: self.frames[start..end].to_vec() }
    }
}

impl Streams {
    /// The stream index of a log just recovered: `recovered` holds the streams recovery
    /// indexed while it verified the sealed segments, and the LSN they end at; the records of
    /// `segments` (all of the log, oldest first) from there on are read now. A read error
    /// leaves the index short of the damaged frame: every later query tries to index it again
    /// and returns the error (the log's other reads are unaffected).
    pub fn new(recovered: RecoveredStreams, segments: &[SegmentMeta]) -> Self {
        let RecoveredStreams { key_of, part: streams, indexed_to } = recovered;
        let first = segments.first().map_or(indexed_to, |meta| meta.first_lsn);
        let indexed_to = indexed_to.max(first);
        let streams = Self { key_of, index: Mutex::new(StreamIndex { indexed_to, streams }) };
        // Indexing the rest now keeps the first query fast; its error, if any, is reported by
        // every query.
        drop(streams.catch_up(segments));
        streams
    }

    /// The first `max` of `key`'s records with LSNs in `lsns`, after indexing every record
    /// `segments` (the log's current segments) hold beyond the last query.
    ///
    /// # Errors
    /// [`Error::Corruption`] if a frame not yet indexed no longer verifies.
    pub fn stream(&self, key: u64, lsns: Range<u64>, max: usize, segments: &[SegmentMeta]) -> Result<Stream> {
        let index = self.catch_up(segments)?;
        let first = segments.first().map_or(lsns.start, |meta| lsns.start.max(meta.first_lsn));
        Ok(index.streams.get(&key).map_or_else(Stream::default, |stream| stream.slice(first..lsns.end, max)))
    }

    /// The keys of every stream that holds at least one record, ascending (after indexing what
    /// is new).
    ///
    /// # Errors
    /// As [`Streams::stream`].
    pub fn keys(&self, segments: &[SegmentMeta]) -> Result<Vec<u64>> {
        let index = self.catch_up(segments)?;
        let mut keys: Vec<u64> =
            index.streams.iter().filter(|(_, stream)| !stream.lsns.is_empty()).map(|(key, _)| *key).collect();
        keys.sort_unstable();
        Ok(keys)
    }

    /// Forgets every LSN below `first` (the log's records below it were truncated).
    pub fn forget_below(&self, first: u64) {
        let mut index = self.index.lock();
        index.streams.retain(|_, stream| {
            stream.remove(0..first);
            !stream.lsns.is_empty()
        });
    }

    /// Indexes `rewritten` (a sealed segment just rewritten: its frames moved, and it may have
    /// dropped records or replaced them with records of other keys) again: its LSN range is
    /// forgotten and what it holds now indexed in its place. If the new segment does not
    /// verify, everything from its first LSN on is forgotten instead, so that the next query
    /// reads it again and reports the error rather than miss its records.
    pub fn reindex(&self, rewritten: &SegmentMeta) {
        let range = rewritten.first_lsn..rewritten.next_lsn;
        let mut index = self.index.lock();
        if range.start >= index.indexed_to {
            // Not indexed yet: the next query reads the rewritten segment itself.
            return;
        }
        let fresh = index_range(self.key_of, vec![rewritten.clone()], range.clone());
        let StreamIndex { indexed_to, streams } = &mut *index;
        let Ok(fresh) = fresh else {
            for stream in streams.values_mut() {
                stream.remove(range.start..u64::MAX);
            }
            streams.retain(|_, stream| !stream.lsns.is_empty());
            *indexed_to = range.start;
            return;
        };
        for stream in streams.values_mut() {
            stream.remove(range.clone());
        }
        for (key, new) in fresh {
            let stream = streams.entry(key).or_default();
            let at = stream.lsns.partition_point(|lsn| *lsn < range.start);
            stream.lsns.splice(at..at, new.lsns);
            stream.frames.splice(at..at, new.frames);
        }
        streams.retain(|_, stream| !stream.lsns.is_empty());
        // The whole range is indexed now, even if an earlier query stopped inside it.
        *indexed_to = (*indexed_to).max(range.end);
    }

    /// Indexes the records `segments` hold at or after `indexed_to` and returns the index.
    fn catch_up(&self, segments: &[SegmentMeta]) -> Result<parking_lot::MutexGuard<'_, StreamIndex>> {
        let mut index = self.index.lock();
        let end = segments.last().map_or(index.indexed_to, |meta| meta.next_lsn);
        if index.indexed_to >= end {
            return Ok(index);
        }
        let from = index.indexed_to.max(segments.first().map_or(0, |meta| meta.first_lsn));
        let StreamIndex { indexed_to, streams } = &mut *index;
        let key_of = self.key_of;
        let visited = iter::visit_framed(segments.to_vec(), from, end - 1, |lsn, frame, record| {
            if let Some(key) = key_of(record.bytes()) {
                streams.entry(key).or_default().push(lsn, frame);
            }
            *indexed_to = lsn + 1;
            Ok(true)
        });
        visited?;
        // Records between the last one visited and `end` are in no segment (a range recovery
        // skipped, or dropped by a rewrite).
        *indexed_to = end;
        Ok(index)
    }
}

/// Indexes every record of `segments` within `range`.
fn index_range(key_of: StreamKey, segments: Vec<SegmentMeta>, range: Range<u64>) -> Result<HashMap<u64, Stream>> {
    let mut streams: HashMap<u64, Stream> = HashMap::new();
    if range.is_empty() {
        return Ok(streams);
    }
    iter::visit_framed(segments, range.start, range.end - 1, |lsn, frame, record| {
        if let Some(key) = key_of(record.bytes()) {
            streams.entry(key).or_default().push(lsn, frame);
        }
        Ok(true)
    })?;
    Ok(streams)
}

/// The error of a stream query on a log opened without a [`StreamKey`].
pub(crate) fn no_stream_key() -> Error {
    Error::InvalidArgument { reason: "the log was opened without a stream key (LogBuilder::stream_key)".into() }
}

#[cfg(test)]
mod tests {
    use crate::log::{Log, Lsn, iter};

    fn agent(record: &[u8]) -> Option<u64> {
        record.first().map(|agent| u64::from(*agent % 3))
    }

    /// Frame offsets that no longer point at the records' frames (as after a rewrite, before
    /// the index catches up) cost time, never a wrong or missing record: `visit_at` finds
    /// every record through the sparse index instead.
    #[test]
    fn stale_frame_offsets_still_find_every_record() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = Log::builder(dir.path()).segment_bytes(64 * 1024).stream_key(agent).open().expect("open");
        for i in 0..3_000u32 {
            let record = [&[(i % 7) as u8][..], &i.to_le_bytes(), &[0u8; 40]].concat();
            log.append_with(&record, crate::Durability::None).expect("append");
        }
        let segments = log.inner.index.read().segments.clone();
        assert!(segments.len() > 2, "several segments");
        let lsns = log.stream_lsns(1, Lsn::FIRST).expect("lsns");
        let read = |frames: &[u32]| {
            let mut records = Vec::new();
            let visited = iter::visit_at(segments.clone(), &lsns, frames, |lsn, record| {
                records.push((lsn, record.bytes().to_vec()));
                Ok(true)
            })
            .expect("visit");
            assert_eq!(visited, records.len());
            records
        };
        let mut want = Vec::new();
        iter::visit_lsns(segments.clone(), &lsns, |lsn, record| {
            want.push((lsn, record.bytes().to_vec()));
            Ok(true)
        })
        .expect("visit_lsns");
        assert_eq!(want.len(), lsns.len());
        let stream =
            log.inner.streams.as_ref().expect("streams").stream(1, 1..u64::MAX, usize::MAX, &segments).expect("stream");
        assert_eq!(read(&stream.frames), want, "the indexed offsets");
        for stale in [0u32, 13, 64, 1 << 20, u32::MAX] {
            assert_eq!(read(&vec![stale; lsns.len()]), want, "every offset {stale}");
        }
        let shifted: Vec<u32> = stream.frames.iter().map(|frame| frame + 8).collect();
        assert_eq!(read(&shifted), want, "offsets one word off");
        let previous: Vec<u32> = stream.frames.iter().map(|frame| frame.saturating_sub(72)).collect();
        assert_eq!(read(&previous), want, "offsets of earlier frames");
    }
}
