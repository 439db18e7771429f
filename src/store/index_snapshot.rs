//! Index snapshots: the state of the index rebuild (a [`FoldState`]) saved with the LSN it
//! covers, so that the next open folds only the records after it.
//!
//! An index snapshot is a cache, never the truth: the log is. It is used only when every check
//! passes (its checksums, its format version, its store id, the identity hasher's test vector,
//! and a fingerprint of the log below the LSN it covers: the same segments with the same
//! sequence numbers, first LSNs, end LSNs and sealed sizes, the same last bytes of every
//! segment compaction rewrote, the same first and last covered records, nothing skipped or
//! lost by recovery); otherwise the store folds the whole log, as if there were no index snapshot.
//! An index snapshot of this store that covers LSNs past the end of the log is more than unusable:
//! it is evidence of records lost from the end of the log ([`beyond_log`]).
//! Compaction deletes it before it changes any segment (and writes it again, patched, after a
//! round that only stripped deltas). It is written only from a fold of the log (after an open
//! that folded many records, or by [`Store::write_index_snapshot`](crate::Store::write_index_snapshot),
//! which folds the records after the newest index snapshot), never from the live index, so that it
//! holds exactly what a rebuild would. See `docs/FORMAT.md`, §9a "Index snapshot".

use std::path::PathBuf;

use crate::codec::{Codec, StoreRecord};
use crate::error::{Error, Result};
use crate::log::record::{read_u32_le, read_u64_le};
use crate::log::{Log, Lsn};
use crate::storage::OpenMode;
use crate::store::atom_table::PAGE_ATOMS;
use crate::store::identity;
use crate::store::index::{AtomEntry, EntryState, GuardEntry, IdentityHasher, RunEntry, StoreIndex};
use crate::store::rebuild::{FoldState, Orphans};
use crate::store::types::{RunId, RunStatus};

/// The index snapshot's file name in the store directory.
pub(crate) const FILE_NAME: &str = "index.snapshot";
/// The index snapshot's former file name; a writable open deletes a file of that name.
const LEGACY_FILE_NAME: &str = "index.ckpt";
/// Its temporary name while it is written (the log's recovery deletes leftover `.tmp` files).
const TEMP_NAME: &str = "index.snapshot.tmp";
const MAGIC: [u8; 8] = *b"CONTIDX1";
/// Version 2 binds the file to its store; version 3 adds the keys' older holders (files of
/// earlier versions are ignored and rebuilt).
const VERSION: u32 = 3;
/// magic, version, reserved, covered LSN, store id, body length, body CRC, header CRC.
const HEADER_BYTES: usize = 48;
const COVERED_AT: usize = 16;
const STORE_ID_AT: usize = 24;
const BODY_LEN_AT: usize = 32;
const BODY_CRC_AT: usize = 40;
const HEADER_CRC_AT: usize = 44;
const _: () = assert!(HEADER_CRC_AT + 4 == HEADER_BYTES);
/// Bytes at the end of a rewritten segment's data the fingerprint hashes.
const TAIL_BYTES: u64 = 4096;
/// Records a fold must cover beyond the newest index snapshot before another is written at open
/// or close: below this, folding them on the next open costs less than writing the file.
#[cfg(not(test))]
pub(crate) const MIN_NEW_RECORDS: u64 = 1 << 16;
/// Small in unit tests, so that every test store of more than a few hundred records goes
/// through index snapshots when it is dropped and reopened.
#[cfg(test)]
pub(crate) const MIN_NEW_RECORDS: u64 = 512;

/// Path of the index snapshot of the store in `log`'s directory.
fn path(log: &Log) -> PathBuf {
    log.dir().join(FILE_NAME)
}

/// Encodes `state` (which must be a fold of `log` up to `state.next_lsn`) with the log's
/// fingerprint and store id.
///
/// # Errors
/// The log's read errors, and [`Error::InvalidConfig`] if the index snapshot would be larger than
/// [`INDEX_SNAPSHOT_BYTES_MAX`](crate::limits::INDEX_SNAPSHOT_BYTES_MAX) (no open would read it).
pub(crate) fn encode(state: &FoldState, log: &Log) -> Result<Vec<u8>> {
    let mut body = Writer::default();
    fingerprint(log, state.next_lsn)?.put(&mut body);
    put_state(&mut body, state);
    let bytes = frame(state.next_lsn, identity::store_id(log)?, &body.0);
    if bytes.len() as u64 > crate::limits::INDEX_SNAPSHOT_BYTES_MAX {
        let what = format!("bytes of the index snapshot ({} needed)", bytes.len());
        return Err(Error::LimitExceeded { what, limit: crate::limits::INDEX_SNAPSHOT_BYTES_MAX });
    }
    Ok(bytes)
}

/// An index snapshot file: the header (covering `next_lsn`, in store `store_id`) and `body`.
fn frame(next_lsn: u64, store_id: u64, body: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(HEADER_BYTES + body.len());
    bytes.extend_from_slice(&MAGIC);
    bytes.extend_from_slice(&VERSION.to_le_bytes());
    bytes.extend_from_slice(&0u32.to_le_bytes());
    bytes.extend_from_slice(&next_lsn.to_le_bytes());
    bytes.extend_from_slice(&store_id.to_le_bytes());
    bytes.extend_from_slice(&(body.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
    let header_crc = crc32fast::hash(&bytes);
    bytes.extend_from_slice(&header_crc.to_le_bytes());
    bytes.extend_from_slice(body);
    bytes
}

/// Writes an index snapshot so that it exists after a crash only complete: temporary name, sync,
/// rename, directory sync. The log must be synced through the LSN it covers first.
pub(crate) fn publish(log: &Log, bytes: &[u8]) -> Result<()> {
    let storage = log.storage();
    let temp = log.dir().join(TEMP_NAME);
    let target = path(log);
    let _ = storage.remove_file(&temp);
    let file = storage.open(&temp, OpenMode::CreateNew).map_err(|e| Error::io("create", &temp, e))?;
    file.write_all_at(bytes, 0).map_err(|e| Error::io("write", &temp, e))?;
    // IMPORTANT: the index snapshot's bytes are durable before its name is.
    file.sync_data().map_err(|e| Error::io("fdatasync", &temp, e))?;
    storage.rename(&temp, &target).map_err(|e| Error::io("rename", &temp, e))?;
    storage.sync_dir(log.dir()).map_err(|e| Error::io("sync directory", log.dir(), e))?;
    tracing::info!(bytes = bytes.len(), path = %target.display(), "index snapshot written");
    Ok(())
}

/// The bytes of the index snapshot file in `log`'s directory if it covers exactly the records
/// below `until` and its header checks (its body is checked where it is used).
#[cfg(feature = "object-store")]
pub(crate) fn file_covering(log: &Log, until: u64) -> Option<Vec<u8>> {
    let file = log.storage().open(&path(log), OpenMode::ReadOnly).ok()?;
    let len = file.len().ok().filter(|len| *len <= crate::limits::INDEX_SNAPSHOT_BYTES_MAX)?;
    let mut bytes = vec![0u8; usize::try_from(len).ok()?];
    file.read_exact_at(&mut bytes, 0).ok()?;
    let (covered, _, body_len) = parse_header(&bytes).ok()?;
    (covered == until && HEADER_BYTES as u64 + body_len == len).then_some(bytes)
}

/// The LSN an index snapshot's bytes cover, if its header checks.
#[cfg(feature = "object-store")]
pub(crate) fn covered_by(bytes: &[u8]) -> Option<u64> {
    parse_header(bytes).ok().map(|(covered, _, _)| covered)
}

/// Writes `bytes` (an index snapshot of the store in `dir`, downloaded) as its index snapshot
/// file: temporary name, sync, rename (the caller syncs the directory).
#[cfg(feature = "object-store")]
pub(crate) fn place(storage: &dyn crate::storage::Storage, dir: &std::path::Path, bytes: &[u8]) -> Result<()> {
    let temp = dir.join(TEMP_NAME);
    let target = dir.join(FILE_NAME);
    let _ = storage.remove_file(&temp);
    let file = storage.open(&temp, OpenMode::CreateNew).map_err(|e| Error::io("create", &temp, e))?;
    file.write_all_at(bytes, 0).map_err(|e| Error::io("write", &temp, e))?;
    file.sync_data().map_err(|e| Error::io("fdatasync", &temp, e))?;
    storage.rename(&temp, &target).map_err(|e| Error::io("rename", &temp, e))
}

/// Deletes the index snapshot, durably, if there is one (before anything changes the log below
/// the LSN it covers).
pub(crate) fn remove(log: &Log) -> Result<()> {
    remove_durably(log, &path(log))
}

/// Deletes `target` (if it exists) and syncs the directory.
fn remove_durably(log: &Log, target: &std::path::Path) -> Result<()> {
    match log.storage().remove_file(target) {
        Ok(()) => log.storage().sync_dir(log.dir()).map_err(|e| Error::io("sync directory", log.dir(), e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io("remove", target, e)),
    }
}

/// Deletes the index snapshot a store of an earlier version left under its older name
/// ([`LEGACY_FILE_NAME`]): it is never read, and would only take space.
pub(crate) fn remove_legacy(log: &Log) -> Result<()> {
    remove_durably(log, &log.dir().join(LEGACY_FILE_NAME))
}

/// The index snapshot of `log`'s store, if there is one and every check passes; its dictionaries
/// are loaded into `codec`. An unusable or unreadable index snapshot is reported (logged) and
/// ignored: it costs the open time, never the open.
pub(crate) fn load(log: &Log, codec: &Codec) -> Option<FoldState> {
    accept(read(log.storage().as_ref(), log.dir()), log, codec).ok()
}

/// An index snapshot file read and decoded, not yet checked against the log.
pub(crate) struct Parsed {
    store_id: u64,
    fingerprint: Fingerprint,
    state: FoldState,
}

/// What reading the index snapshot in a directory found.
pub(crate) enum Read {
    /// There is none.
    Absent,
    /// There is one, decoded; it still has to be checked against the log.
    Parsed(Box<Parsed>),
    /// There is one that cannot be used, and why.
    Unusable(Unusable),
}

/// Reads and decodes the index snapshot in `dir`, without the log: this can run while the log
/// recovers (`StoreBuilder::open` does), and [`accept`] checks it against the log after.
pub(crate) fn read(storage: &dyn crate::storage::Storage, dir: &std::path::Path) -> Read {
    let target = dir.join(FILE_NAME);
    let file = match storage.open(&target, OpenMode::ReadOnly) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Read::Absent,
        Err(_) => return Read::Unusable("it cannot be opened"),
    };
    let Ok(len) = file.len() else { return Read::Unusable("it cannot be measured") };
    // Nothing is allocated for a file larger than any index snapshot written, nor for a body
    // longer than its checksummed header declares.
    if len > crate::limits::INDEX_SNAPSHOT_BYTES_MAX {
        return Read::Unusable("too large");
    }
    let mut header = [0u8; HEADER_BYTES];
    if len < HEADER_BYTES as u64 || file.read_exact_at(&mut header, 0).is_err() {
        return Read::Unusable("not an index snapshot");
    }
    if let Err(reason) = parse_header(&header).and_then(|(_, _, body_len)| {
        (HEADER_BYTES as u64).checked_add(body_len).filter(|total| *total == len).ok_or("length mismatch")
    }) {
        return Read::Unusable(reason);
    }
    let mut bytes = vec![0u8; len as usize];
    if file.read_exact_at(&mut bytes, 0).is_err() {
        return Read::Unusable("it cannot be read");
    }
    match parse(&bytes) {
        Ok(parsed) => Read::Parsed(Box::new(parsed)),
        Err(reason) => Read::Unusable(reason),
    }
}

/// The LSN an index snapshot [`read`] found covers, if it is this store's (`store_id`), intact, and
/// covers LSNs past the end of `log`: records below it were durable when it was written (it is
/// written only after the log is synced through it), so the log lost the records from its end
/// up to it.
pub(crate) fn beyond_log(read: &Read, log: &Log, store_id: u64) -> Option<u64> {
    let Read::Parsed(parsed) = read else { return None };
    (parsed.store_id == store_id && parsed.state.next_lsn > log.next_lsn().get()).then_some(parsed.state.next_lsn)
}

/// The state of an index snapshot [`read`] found, if it passes the checks against `log` (its
/// dictionaries are then loaded into `codec`); otherwise why it was not used (`None` if there
/// was none), which is also logged.
pub(crate) fn accept(read: Read, log: &Log, codec: &Codec) -> std::result::Result<FoldState, Option<Unusable>> {
    let reason = match read {
        Read::Absent => return Err(None),
        Read::Unusable(reason) => reason,
        Read::Parsed(parsed) => match check(*parsed, log).and_then(|state| load_dictionaries(state, log, codec)) {
            Ok(state) => return Ok(state),
            Err(reason) => reason,
        },
    };
    tracing::warn!(reason, path = %path(log).display(), "index snapshot ignored; folding the whole log");
    Err(Some(reason))
}

/// Why an index snapshot cannot be used.
pub(crate) type Unusable = &'static str;

/// Checks and decodes an index snapshot's bytes against `log`.
#[cfg(test)]
fn decode(bytes: &[u8], log: &Log) -> std::result::Result<FoldState, Unusable> {
    check(parse(bytes)?, log)
}

/// Checks an index snapshot's header: the LSN it covers, its store id and its body's length.
fn parse_header(bytes: &[u8]) -> std::result::Result<(u64, u64, u64), Unusable> {
    if bytes.len() < HEADER_BYTES || bytes[..8] != MAGIC {
        return Err("not an index snapshot");
    }
    if read_u32_le(bytes, 8) != VERSION {
        return Err("another format version");
    }
    if read_u32_le(bytes, HEADER_CRC_AT) != crc32fast::hash(&bytes[..HEADER_CRC_AT]) {
        return Err("header checksum mismatch");
    }
    Ok((read_u64_le(bytes, COVERED_AT), read_u64_le(bytes, STORE_ID_AT), read_u64_le(bytes, BODY_LEN_AT)))
}

/// Checks an index snapshot's framing and decodes it.
fn parse(bytes: &[u8]) -> std::result::Result<Parsed, Unusable> {
    let (next_lsn, store_id, body_len) = parse_header(bytes)?;
    let body = &bytes[HEADER_BYTES..];
    if body_len != body.len() as u64 {
        return Err("length mismatch");
    }
    if read_u32_le(bytes, BODY_CRC_AT) != crc32fast::hash(body) {
        return Err("body checksum mismatch");
    }
    let mut reader = Reader { bytes: body, at: 0 };
    let fingerprint = Fingerprint::get(&mut reader).ok_or("malformed fingerprint")?;
    let mut state = get_state(&mut reader).ok_or("malformed body")?;
    if reader.at != body.len() {
        return Err("trailing bytes");
    }
    state.next_lsn = next_lsn;
    Ok(Parsed { store_id, fingerprint, state })
}

/// Decodes `body` as an index snapshot's body under a header made for it (valid checksums, so that
/// a fuzzer reaches the decoder); returns whether it decoded. Must never panic.
pub(crate) fn parse_body(body: &[u8]) -> bool {
    parse(&frame(1, 1, body)).is_ok()
}

/// The state of `parsed` if the log below its LSN is still the one it was folded from.
fn check(parsed: Parsed, log: &Log) -> std::result::Result<FoldState, Unusable> {
    let report = log.recovery_report();
    if report.found_loss() {
        return Err("recovery skipped or lost records");
    }
    if identity::store_id(log).ok() != Some(parsed.store_id) {
        return Err("the index snapshot belongs to another store");
    }
    let next_lsn = parsed.state.next_lsn;
    if log.next_lsn().get() < next_lsn {
        return Err("the log ends before the index snapshot's LSN");
    }
    let now = fingerprint(log, next_lsn).map_err(|_| "the log cannot be read")?;
    if now != parsed.fingerprint {
        return Err("the log below the index snapshot's LSN changed");
    }
    Ok(parsed.state)
}

/// Loads the dictionaries the index snapshot names into `codec`.
fn load_dictionaries(state: FoldState, log: &Log, codec: &Codec) -> std::result::Result<FoldState, Unusable> {
    for &lsn in &state.dictionary_lsns {
        let bytes = log.read(Lsn::new(lsn)).ok().flatten().ok_or("a dictionary record is missing")?;
        match codec.decode(&bytes) {
            Ok(StoreRecord::Dictionary(dictionary)) => codec.add_dictionary(dictionary.id, &dictionary.dictionary),
            _ => return Err("a dictionary record is not one"),
        }
    }
    Ok(state)
}

// ---------------------------------------------------------------------------------------------
// The log's fingerprint below the covered LSN

/// What must not have changed in the log below the index snapshot's LSN.
#[derive(Debug, PartialEq, Eq)]
struct Fingerprint {
    first_lsn: u64,
    /// Every segment that begins below the covered LSN.
    segments: Vec<SegmentPrint>,
    /// CRC of the log's first record and of the last covered one (0 when there is none).
    first_record: u32,
    last_record: u32,
}

/// What identifies one segment and the version of its content: a compaction rewrite keeps the
/// sequence number and first LSN but sets the end LSN (a writer's segment has none), and a
/// rewrite of a rewrite changes the data's size or its last bytes.
#[derive(Debug, PartialEq, Eq)]
struct SegmentPrint {
    seq: u64,
    first_lsn: u64,
    /// The header's end LSN: 0 for a segment the writer created.
    end_lsn: u64,
    /// Whether its frames may be compressed.
    compressed: bool,
    /// Data bytes if sealed and wholly covered, else `u64::MAX`.
    data_bytes: u64,
    /// CRC of the last [`TAIL_BYTES`] of its data if compaction rewrote it and it is wholly
    /// covered, else 0.
    tail_crc: u32,
}

fn fingerprint(log: &Log, next_lsn: u64) -> Result<Fingerprint> {
    let storage = log.storage().as_ref();
    let mut segments = Vec::new();
    for segment in log.segments().iter().filter(|segment| segment.first_lsn.get() < next_lsn) {
        let header = identity::segment_header(storage, &segment.path)?;
        let whole = segment.sealed && segment.next_lsn.get() <= next_lsn;
        let tail_crc = if whole && header.is_compacted() { data_tail_crc(log, segment)? } else { 0 };
        segments.push(SegmentPrint {
            seq: segment.seq,
            first_lsn: segment.first_lsn.get(),
            end_lsn: header.end_lsn,
            compressed: header.compressed,
            data_bytes: if whole { segment.data_bytes } else { u64::MAX },
            tail_crc,
        });
    }
    let first_lsn = log.first_lsn().get();
    let record_crc = |lsn: u64| -> Result<u32> {
        if lsn < first_lsn || lsn >= next_lsn {
            return Ok(0);
        }
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&lsn.to_le_bytes());
        match log.read(Lsn::new(lsn))? {
            Some(bytes) => hasher.update(&bytes),
            None => hasher.update(b"none"),
        }
        Ok(hasher.finalize())
    };
    Ok(Fingerprint {
        first_lsn,
        segments,
        first_record: record_crc(first_lsn)?,
        last_record: record_crc(next_lsn.wrapping_sub(1))?,
    })
}

/// CRC of the last [`TAIL_BYTES`] of a sealed segment's data (header and frames).
fn data_tail_crc(log: &Log, segment: &crate::log::SegmentInfo) -> Result<u32> {
    let start = segment.data_bytes.saturating_sub(TAIL_BYTES);
    let mut tail = vec![0u8; (segment.data_bytes - start) as usize];
    let file =
        log.storage().open(&segment.path, OpenMode::ReadOnly).map_err(|e| Error::io("open", &segment.path, e))?;
    file.read_exact_at(&mut tail, start).map_err(|e| Error::io("read", &segment.path, e))?;
    Ok(crc32fast::hash(&tail))
}

impl Fingerprint {
    fn put(&self, out: &mut Writer) {
        out.varint(self.first_lsn);
        out.varint(self.segments.len() as u64);
        for segment in &self.segments {
            out.varint(segment.seq);
            out.varint(segment.first_lsn);
            out.varint(segment.end_lsn);
            out.byte(u8::from(segment.compressed));
            out.fixed64(segment.data_bytes);
            out.fixed32(segment.tail_crc);
        }
        out.fixed32(self.first_record);
        out.fixed32(self.last_record);
    }

    fn get(input: &mut Reader<'_>) -> Option<Self> {
        let first_lsn = input.varint()?;
        let count = input.count()?;
        let mut segments = Vec::with_capacity(count);
        for _ in 0..count {
            segments.push(SegmentPrint {
                seq: input.varint()?,
                first_lsn: input.varint()?,
                end_lsn: input.varint()?,
                compressed: match input.byte()? {
                    0 => false,
                    1 => true,
                    _ => return None,
                },
                data_bytes: input.fixed64()?,
                tail_crc: input.fixed32()?,
            });
        }
        Some(Self { first_lsn, segments, first_record: input.fixed32()?, last_record: input.fixed32()? })
    }
}

// ---------------------------------------------------------------------------------------------
// The fold state

fn put_state(out: &mut Writer, state: &FoldState) {
    let index = &state.index;
    out.fixed64(index.identity.seed());
    for hash in index.identity.test_vector() {
        out.fixed64(hash);
    }
    out.varint(u64::from(index.next_dictionary));
    out.varint(state.dictionary_lsns.len() as u64);
    state.dictionary_lsns.iter().for_each(|lsn| out.varint(*lsn));
    // Runs and their names.
    out.varint(index.runs.len() as u64);
    for run in &index.runs {
        put_run(out, run);
    }
    out.varint(index.run_names.len() as u64);
    for (name, id) in &index.run_names {
        out.bytes(name.as_bytes());
        out.varint(u64::from(*id));
    }
    // Agents (their ids by name follow from this list).
    out.varint(index.agents.len() as u64);
    for (run, name) in &index.agents {
        out.varint(u64::from(*run));
        out.bytes(name.as_bytes());
    }
    // Atoms: the written pages, entries delta-coded.
    out.varint(index.atoms.len() as u64);
    let pages: Vec<_> = index.atoms.written_pages().collect();
    out.varint(pages.len() as u64);
    let mut previous = 0u64;
    for (page, entries) in pages {
        out.varint(page as u64);
        for entry in entries {
            put_entry(out, entry, &mut previous);
        }
    }
    out.varint(index.atom_keys.len() as u64);
    for (hash, id) in &index.atom_keys {
        out.fixed64(*hash);
        out.varint(u64::from(*id));
    }
    out.varint(index.older_key_holders.len() as u64);
    for (hash, older) in &index.older_key_holders {
        out.fixed64(*hash);
        out.varint(older.len() as u64);
        for id in older {
            out.varint(u64::from(*id));
        }
    }
    out.varint(index.guards.len() as u64);
    for (hash, guard) in &index.guards {
        out.fixed64(*hash);
        out.varint(guard.started_lsn);
        out.varint(guard.completed_lsn);
    }
    // Orphans.
    let orphans = &state.orphans;
    out.varint(orphans.ends.len() as u64);
    for &(lsn, atom) in &orphans.ends {
        out.varint(lsn);
        out.varint(atom);
    }
    out.varint(orphans.rollbacks.len() as u64);
    for &(lsn, run) in &orphans.rollbacks {
        out.varint(lsn);
        out.varint(run.0);
    }
    out.varint(orphans.dropped_below);
    // Released atoms, as ranges (the entry's flags byte has no bit left).
    let released = index.released_ranges();
    out.varint(released.len() as u64);
    for (first, count) in released {
        out.varint(first);
        out.varint(count);
    }
}

fn get_state(input: &mut Reader<'_>) -> Option<FoldState> {
    let identity = IdentityHasher::with_seed(input.fixed64()?);
    if identity.test_vector() != [input.fixed64()?, input.fixed64()?] {
        return None;
    }
    let mut index = StoreIndex { identity, ..StoreIndex::default() };
    index.next_dictionary = u32::try_from(input.varint()?).ok()?;
    let dictionary_lsns = (0..input.count()?).map(|_| input.varint()).collect::<Option<Vec<_>>>()?;
    index.runs = (0..input.count()?).map(|_| get_run(input)).collect::<Option<_>>()?;
    for _ in 0..input.count()? {
        let name = input.text()?;
        index.run_names.insert(name, input.u32()?);
    }
    for _ in 0..input.count()? {
        let run = input.u32()?;
        let name: Box<str> = input.text()?.into();
        index.agents.push((run, name.clone()));
        let id = u32::try_from(index.agents.len()).ok()?;
        index.agent_ids.entry(run).or_default().insert(name, id);
    }
    let len = input.varint().filter(|len| *len <= crate::limits::ATOM_ID_MAX)?;
    let len = usize::try_from(len).ok()?;
    index.atoms.extend_to(len);
    let mut previous = 0u64;
    for _ in 0..input.count()? {
        let page = usize::try_from(input.varint()?).ok()?;
        let entries = (0..PAGE_ATOMS).map(|_| get_entry(input, &mut previous)).collect::<Option<Box<[_]>>>()?;
        index.atoms.put_page(page, entries)?;
    }
    let keys = input.count()?;
    index.atom_keys.reserve(keys);
    for _ in 0..keys {
        let hash = input.fixed64()?;
        index.atom_keys.insert(hash, input.u32()?);
    }
    for _ in 0..input.count()? {
        let hash = input.fixed64()?;
        let older = (0..input.count()?).map(|_| input.u32()).collect::<Option<Vec<u32>>>()?;
        if older.is_empty() {
            return None;
        }
        index.older_key_holders.insert(hash, older);
    }
    for _ in 0..input.count()? {
        let hash = input.fixed64()?;
        index.guards.insert(hash, GuardEntry { started_lsn: input.varint()?, completed_lsn: input.varint()? });
    }
    let mut orphans = Orphans::default();
    for _ in 0..input.count()? {
        orphans.ends.push((input.varint()?, input.varint()?));
    }
    for _ in 0..input.count()? {
        orphans.rollbacks.push((input.varint()?, RunId(input.varint()?)));
    }
    orphans.dropped_below = input.varint()?;
    let (mut first, mut count) = (Vec::new(), Vec::new());
    for _ in 0..input.count()? {
        first.push(input.varint()?);
        count.push(input.varint()?);
    }
    index.release(&first, &count)?;
    // The records after the index snapshot are folded into runs whose spans must already cover
    // their atoms (a rollback walks its run's span).
    index.note_atom_spans();
    Some(FoldState { index, orphans, dictionary_lsns, next_lsn: 0 })
}

fn put_run(out: &mut Writer, run: &RunEntry) {
    out.bytes(run.name.as_bytes());
    match &run.status {
        // The index never holds a suspension (control atoms do, `Store::load_suspensions`).
        RunStatus::Running | RunStatus::Suspended { .. } => out.byte(0),
        RunStatus::Finished { success, resume_hint } => {
            out.byte(1 + u8::from(*success));
            out.bytes(resume_hint.as_bytes());
        }
        RunStatus::Dropped => out.byte(3),
    }
    match run.snapshot_policy {
        None => out.byte(0),
        Some(policy) => {
            out.byte(1);
            out.varint(u64::from(policy.every_atoms));
            out.varint(policy.every.as_secs());
            out.varint(u64::from(policy.every.subsec_nanos()));
        }
    }
    out.varint(run.ended_at_unix_us);
}

fn get_run(input: &mut Reader<'_>) -> Option<RunEntry> {
    let name = input.text()?;
    let status = match input.byte()? {
        0 => RunStatus::Running,
        tag @ (1 | 2) => RunStatus::Finished { success: tag == 2, resume_hint: input.text()? },
        3 => RunStatus::Dropped,
        _ => return None,
    };
    let snapshot_policy = match input.byte()? {
        0 => None,
        1 => {
            let every_atoms = input.u32()?;
            let secs = input.varint()?;
            let nanos = input.u32()?.min(999_999_999);
            Some(crate::store::SnapshotPolicy { every_atoms, every: std::time::Duration::new(secs, nanos) })
        }
        _ => return None,
    };
    // The atom spans are set from the atom table once the atoms are read.
    Some(RunEntry { name, status, snapshot_policy, ended_at_unix_us: input.varint()?, atom_span: (0, 0) })
}

const STATES: [EntryState; 7] = [
    EntryState::Vacant,
    EntryState::Starting,
    EntryState::Running,
    EntryState::Finishing,
    EntryState::Completed,
    EntryState::Failed,
    EntryState::FailedRetryable,
];
const ABANDONED: u8 = 1 << 3;
const RECLAIMED: u8 = 1 << 4;
const PINNED: u8 = 1 << 5;
/// The entry's numbers follow (a vacant entry is the flags byte alone).
const NUMBERS: u8 = 1 << 6;
/// The entry has an end LSN.
const ENDED: u8 = 1 << 7;

/// One atom entry: a flags byte, then (unless vacant) the start LSN as a zigzag difference from
/// the previous entry's, the end LSN as one from the start, the run and the agent.
fn put_entry(out: &mut Writer, entry: &AtomEntry, previous: &mut u64) {
    let state = STATES.iter().position(|state| *state == entry.state).unwrap_or(0) as u8;
    let mut flags = state
        | if entry.abandoned { ABANDONED } else { 0 }
        | if entry.reclaimed { RECLAIMED } else { 0 }
        | if entry.pinned { PINNED } else { 0 };
    if *entry == AtomEntry::VACANT {
        out.byte(flags);
        return;
    }
    flags |= NUMBERS | if entry.ended_lsn != 0 { ENDED } else { 0 };
    out.byte(flags);
    out.varint(zigzag(entry.started_lsn.wrapping_sub(*previous)));
    if entry.ended_lsn != 0 {
        out.varint(zigzag(entry.ended_lsn.wrapping_sub(entry.started_lsn)));
    }
    out.varint(u64::from(entry.run));
    out.varint(u64::from(entry.agent));
    *previous = entry.started_lsn;
}

fn get_entry(input: &mut Reader<'_>, previous: &mut u64) -> Option<AtomEntry> {
    let flags = input.byte()?;
    let mut entry = AtomEntry::VACANT;
    entry.state = *STATES.get(usize::from(flags & 0b111))?;
    entry.abandoned = flags & ABANDONED != 0;
    entry.reclaimed = flags & RECLAIMED != 0;
    entry.pinned = flags & PINNED != 0;
    if flags & NUMBERS != 0 {
        entry.started_lsn = previous.wrapping_add(unzigzag(input.varint()?));
        if flags & ENDED != 0 {
            entry.ended_lsn = entry.started_lsn.wrapping_add(unzigzag(input.varint()?));
        }
        entry.run = input.u32()?;
        entry.agent = input.u32()?;
        *previous = entry.started_lsn;
    }
    Some(entry)
}

fn zigzag(difference: u64) -> u64 {
    let signed = difference as i64;
    ((signed << 1) ^ (signed >> 63)) as u64
}

fn unzigzag(value: u64) -> u64 {
    (value >> 1) ^ (value & 1).wrapping_neg()
}

// ---------------------------------------------------------------------------------------------
// Bytes

#[derive(Default)]
struct Writer(Vec<u8>);

impl Writer {
    fn byte(&mut self, value: u8) {
        self.0.push(value);
    }

    fn varint(&mut self, mut value: u64) {
        while value >= 0x80 {
            self.0.push(value as u8 | 0x80);
            value >>= 7;
        }
        self.0.push(value as u8);
    }

    fn fixed32(&mut self, value: u32) {
        self.0.extend_from_slice(&value.to_le_bytes());
    }

    fn fixed64(&mut self, value: u64) {
        self.0.extend_from_slice(&value.to_le_bytes());
    }

    fn bytes(&mut self, bytes: &[u8]) {
        self.varint(bytes.len() as u64);
        self.0.extend_from_slice(bytes);
    }
}

/// A cursor over untrusted bytes: every read is bounds-checked and returns `None` past the end
/// or on a malformed value.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> Option<u8> {
        let byte = *self.bytes.get(self.at)?;
        self.at += 1;
        Some(byte)
    }

    fn varint(&mut self) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.byte()?;
            value |= u64::from(byte & 0x7f).checked_shl(shift)?;
            if byte & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }

    fn u32(&mut self) -> Option<u32> {
        u32::try_from(self.varint()?).ok()
    }

    /// A count of items that take at least one byte each: never more than the bytes left, so
    /// that a damaged count cannot make the reader allocate more than the file's size.
    fn count(&mut self) -> Option<usize> {
        usize::try_from(self.varint()?).ok().filter(|count| *count <= self.bytes.len() - self.at)
    }

    fn take(&mut self, len: usize) -> Option<&[u8]> {
        let end = self.at.checked_add(len).filter(|end| *end <= self.bytes.len())?;
        let bytes = &self.bytes[self.at..end];
        self.at = end;
        Some(bytes)
    }

    fn fixed32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn fixed64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn text(&mut self) -> Option<String> {
        let len = self.count()?;
        String::from_utf8(self.take(len)?.to_vec()).ok()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::storage::sim::{CrashDamage, SimStorage};
    use crate::store::rebuild::{self, tests::busy_store};
    use crate::{AtomOutput, RunSpec, SnapshotPolicy, Store};

    fn fresh(seed: u64) -> FoldState {
        FoldState::new(IdentityHasher::with_seed(seed))
    }

    /// The whole log folded from nothing with `seed`, finished.
    fn whole(log: &Log, seed: u64) -> StoreIndex {
        rebuild::fold_from(log, &Codec::default(), fresh(seed), log.next_lsn().get())
            .and_then(FoldState::finish)
            .expect("fold")
    }

    /// The index of `store` as it was rebuilt on open, against a fold of its whole log.
    fn assert_index_is_the_whole_fold(store: &Store) {
        let index = store.shared.index.read();
        let expected = whole(&store.shared.log, index.identity.seed());
        assert!(*index == expected, "the index rebuilt from an index snapshot differs from the whole fold");
    }

    #[test]
    fn an_index_snapshot_plus_the_records_after_it_equals_the_whole_fold() {
        let dir = tempfile::tempdir().expect("dir");
        busy_store(dir.path());
        let log = Log::open(dir.path()).expect("log");
        let next = log.next_lsn().get();
        let expected = whole(&log, 9);
        assert!(expected.atoms.len() > 2_000 && expected.next_dictionary == 3);
        for covered in [1, 2, 300, next / 3, next / 2 + 17, next - 1, next] {
            let state = rebuild::fold_from(&log, &Codec::default(), fresh(9), covered).expect("fold");
            let bytes = encode(&state, &log).expect("encode");
            publish(&log, &bytes).expect("publish");
            let codec = Codec::default();
            let loaded = load(&log, &codec).expect("a usable index snapshot");
            assert!(loaded == state, "the index snapshot of LSN {covered} does not round-trip");
            let resumed = rebuild::fold_from(&log, &codec, loaded, next).and_then(FoldState::finish).expect("fold");
            assert!(resumed == expected, "index snapshot at LSN {covered} + the rest differs from the whole fold");
        }
    }

    #[test]
    fn a_writable_open_deletes_the_file_of_the_former_name_and_a_read_only_open_keeps_it() {
        let dir = tempfile::tempdir().expect("dir");
        busy_store(dir.path());
        let legacy = dir.path().join(LEGACY_FILE_NAME);
        std::fs::write(&legacy, b"an index snapshot under its former name").expect("write");
        Store::open_read_only(dir.path()).expect("read-only open").close().expect("close");
        assert!(legacy.exists(), "a read-only open changes nothing");
        Store::open(dir.path()).expect("open").close().expect("close");
        assert!(!legacy.exists(), "a writable open deletes it");
    }

    #[test]
    fn a_damaged_or_truncated_index_snapshot_is_never_used() {
        let dir = tempfile::tempdir().expect("dir");
        busy_store(dir.path());
        let log = Log::open(dir.path()).expect("log");
        let state = rebuild::fold_from(&log, &Codec::default(), fresh(3), log.next_lsn().get() / 2).expect("fold");
        let bytes = encode(&state, &log).expect("encode");
        assert!(decode(&bytes, &log).is_ok());
        let mut checked = 0;
        for at in (0..bytes.len()).filter(|at| *at < 2 * HEADER_BYTES || at % 13 == 0) {
            for flip in [0x01, 0x80] {
                let mut damaged = bytes.clone();
                damaged[at] ^= flip;
                assert!(decode(&damaged, &log).is_err(), "a flip at byte {at} went unnoticed");
                checked += 1;
            }
        }
        for len in [0, 7, HEADER_BYTES - 1, HEADER_BYTES, bytes.len() / 2, bytes.len() - 1] {
            assert!(decode(&bytes[..len], &log).is_err(), "an index snapshot cut to {len} bytes was accepted");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode(&longer, &log).is_err());
        assert!(checked > 1_000, "{checked} cases");
    }

    #[test]
    fn a_malformed_body_with_valid_checksums_is_refused_without_panicking() {
        // What a bug in an encoder (or a crafted file) would produce: checksums that match a
        // body that does not decode, and a foreign hasher whose test vector does not match.
        let dir = tempfile::tempdir().expect("dir");
        busy_store(dir.path());
        let log = Log::open(dir.path()).expect("log");
        let state = rebuild::fold_from(&log, &Codec::default(), fresh(5), log.next_lsn().get()).expect("fold");
        let bytes = encode(&state, &log).expect("encode");
        let reseal = |mut bytes: Vec<u8>| {
            let body_crc = crc32fast::hash(&bytes[HEADER_BYTES..]);
            let body_len = (bytes.len() - HEADER_BYTES) as u64;
            bytes[BODY_LEN_AT..BODY_CRC_AT].copy_from_slice(&body_len.to_le_bytes());
            bytes[BODY_CRC_AT..HEADER_CRC_AT].copy_from_slice(&body_crc.to_le_bytes());
            let header_crc = crc32fast::hash(&bytes[..HEADER_CRC_AT]);
            bytes[HEADER_CRC_AT..HEADER_BYTES].copy_from_slice(&header_crc.to_le_bytes());
            bytes
        };
        assert!(decode(&reseal(bytes.clone()), &log).is_ok());
        // Every single-byte change of the body, resealed, either decodes or is refused.
        let mut refused = 0;
        for at in (HEADER_BYTES..bytes.len()).step_by(7) {
            let mut changed = bytes.clone();
            changed[at] ^= 0xff;
            refused += usize::from(decode(&reseal(changed), &log).is_err());
        }
        assert!(refused > 0);
        // Cut bodies are refused.
        for len in [HEADER_BYTES, HEADER_BYTES + 9, (bytes.len() + HEADER_BYTES) / 2] {
            assert!(decode(&reseal(bytes[..len].to_vec()), &log).is_err());
        }
    }

    #[test]
    fn an_index_snapshot_of_another_log_is_refused() {
        // Same shape (one segment, same first LSN), different records.
        let (a, b) = (tempfile::tempdir().expect("dir"), tempfile::tempdir().expect("dir"));
        for (dir, agent) in [(&a, "x"), (&b, "y")] {
            let store = Store::builder(dir.path()).background(false).open().expect("open");
            let run = store.create_run(RunSpec::new("r")).expect("run");
            for i in 0..20 {
                let atom = store.begin_atom(run, agent, &i.to_string(), &[], "").expect("begin");
                store.complete_atom(atom, &AtomOutput::default()).expect("complete");
            }
            store.write_index_snapshot().expect("index snapshot");
        }
        std::fs::copy(a.path().join(FILE_NAME), b.path().join(FILE_NAME)).expect("copy");
        let log = Log::open(b.path()).expect("log");
        assert!(load(&log, &Codec::default()).is_none());
    }

    fn store_on(storage: &SimStorage) -> Store {
        Store::builder("/store")
            .storage(Arc::new(storage.clone()))
            .segment_bytes(128 * 1024)
            .snapshot_policy(SnapshotPolicy::NEVER)
            .background(false)
            .open()
            .expect("open")
    }

    /// A store in `dir` that compacts on request only: no policy snapshots, one snapshot kept
    /// per agent, finished runs dropped after `finished_run_age` (never if `None`).
    fn compacting_store(
        dir: &std::path::Path,
        segment_bytes: u64,
        finished_run_age: Option<std::time::Duration>,
    ) -> crate::StoreBuilder {
        Store::builder(dir)
            .segment_bytes(segment_bytes)
            .snapshot_policy(SnapshotPolicy::NEVER)
            .retention(crate::RetentionPolicy { snapshots_per_agent: 1, finished_run_age })
            .background(false)
    }

    fn atoms(store: &Store, run: &str, count: u64) {
        let run = store.create_run(RunSpec::new(run)).expect("run");
        let mut transcript = crate::synthetic::Transcript::new(count);
        for i in 0..count {
            let atom = store.begin_atom(run, "agent", &i.to_string(), &[], "").expect("begin");
            let output = AtomOutput { delta: transcript.next_delta(300), result: Vec::new() };
            store.complete_atom(atom, &output).expect("complete");
        }
    }

    #[test]
    fn a_crash_at_any_step_of_writing_an_index_snapshot_leaves_a_store_that_opens_to_the_whole_fold() {
        let probe = SimStorage::new(1);
        {
            let store = store_on(&probe);
            atoms(&store, "a", 150);
            let before = probe.op_count();
            store.write_index_snapshot().expect("index snapshot");
            assert!(probe.op_count() > before + 5);
        }
        let steps = {
            let storage = SimStorage::new(1);
            let store = store_on(&storage);
            atoms(&store, "a", 150);
            let before = storage.op_count();
            store.write_index_snapshot().expect("index snapshot");
            storage.op_count() - before
        };
        let mut states = 0;
        for step in 0..=steps {
            for damage in CrashDamage::ALL {
                let storage = SimStorage::new(step);
                {
                    let store = store_on(&storage);
                    atoms(&store, "a", 150);
                    // An older index snapshot, so that the crash may also leave that one behind.
                    store.write_index_snapshot().expect("index snapshot");
                    atoms(&store, "b", 40);
                    storage.halt_after(step);
                    let _ = store.write_index_snapshot();
                    storage.crash(damage);
                }
                let store = store_on(&storage);
                assert_index_is_the_whole_fold(&store);
                assert_eq!(store.run_atoms(store.run_id("a").expect("a")).len(), 150);
                states += 1;
            }
        }
        assert!(states >= 9 * 6, "{states} crash states");
    }

    #[test]
    fn the_store_writes_index_snapshots_at_close_and_uses_them_and_compaction_deletes_them() {
        let dir = tempfile::tempdir().expect("dir");
        let open = || compacting_store(dir.path(), 128 * 1024, None).open().expect("open");
        {
            let store = open();
            atoms(&store, "a", MIN_NEW_RECORDS); // two records per atom: enough for an index snapshot at close
        }
        assert!(dir.path().join(FILE_NAME).exists(), "no index snapshot written at close");
        let covered = {
            let log = Log::open(dir.path()).expect("log");
            decode(&std::fs::read(dir.path().join(FILE_NAME)).expect("read"), &log).expect("usable").next_lsn
        };
        {
            let store = open();
            assert_eq!(store.records_after_index_snapshot(), 0, "the index snapshot covers the whole log");
            assert_index_is_the_whole_fold(&store);
            // Atoms after the index snapshot are folded on the next open.
            atoms(&store, "b", 30);
        }
        {
            let store = open();
            assert!(store.records_after_index_snapshot() > 60);
            assert_eq!(store.shared.index_snapshot.covered.load(std::sync::atomic::Ordering::Relaxed), covered);
            assert_index_is_the_whole_fold(&store);
            // A snapshot makes the deltas before it reclaimable: compaction rewrites segments.
            let run = store.run_id("a").expect("run");
            let last = *store.run_atoms(run).last().expect("an atom");
            store.snapshot_now(last).expect("snapshot");
            let report = store.compact().expect("compact");
            assert!(report.segments_rewritten > 0 && report.deltas_reclaimed > 0, "{report:?}");
            // The round only stripped deltas: it patched the index snapshot instead of leaving none.
            assert_eq!(store.index_snapshot().covered, Some(Lsn::new(covered)));
        }
        let store = open();
        assert_eq!(store.index_snapshot().opened_from, Some(Lsn::new(covered)));
        assert!(store.shared.index.read().atoms.iter().any(|(_, atom)| atom.reclaimed));
        assert_index_is_the_whole_fold(&store);
    }

    #[test]
    fn a_compaction_round_that_drops_records_deletes_the_index_snapshot() {
        let dir = tempfile::tempdir().expect("dir");
        let open = || compacting_store(dir.path(), 128 * 1024, Some(std::time::Duration::ZERO)).open().expect("open");
        let store = open();
        atoms(&store, "doomed", 300);
        atoms(&store, "kept", 300);
        store.write_index_snapshot().expect("index snapshot");
        store.finish_run(store.run_id("doomed").expect("run"), true, "").expect("finish");
        let report = store.compact().expect("compact");
        assert!(report.runs_dropped == 1 && report.segments_rewritten > 0, "{report:?}");
        assert_eq!(store.index_snapshot().covered, None);
        assert!(!dir.path().join(FILE_NAME).exists(), "a round that dropped records left an index snapshot");
        drop(store);
        let store = open();
        assert_index_is_the_whole_fold(&store);
    }

    #[test]
    fn the_background_thread_index_snapshots_after_a_compaction_round() {
        let dir = tempfile::tempdir().expect("dir");
        let store = Store::builder(dir.path())
            .snapshot_policy(SnapshotPolicy::NEVER)
            .compaction(crate::CompactionPolicy {
                live_fraction_min: 0.7,
                interval: Some(std::time::Duration::from_millis(20)),
                ..crate::CompactionPolicy::default()
            })
            .open()
            .expect("open");
        atoms(&store, "a", MIN_NEW_RECORDS);
        // The thread may write one while the atoms are written, and again once enough follow
        // it: wait until fewer than the threshold are left after the newest.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let covered = loop {
            let info = store.index_snapshot();
            match info.covered {
                Some(covered) if info.records_after < MIN_NEW_RECORDS => break covered,
                _ => assert!(std::time::Instant::now() < deadline, "no background index snapshot within 20 s"),
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        assert!(covered.get() > MIN_NEW_RECORDS, "{covered:?}");
        // Stopped, with fewer than the threshold after it: nothing writes another.
        drop(store);
        let log = Log::open_read_only(dir.path()).expect("log");
        let bytes = std::fs::read(dir.path().join(FILE_NAME)).expect("the index snapshot file");
        assert_eq!(decode(&bytes, &log).expect("usable").next_lsn, covered.get());
    }

    #[test]
    fn the_store_reports_its_index_snapshot_and_close_writes_one() {
        let dir = tempfile::tempdir().expect("dir");
        let open = || Store::builder(dir.path()).snapshot_policy(SnapshotPolicy::NEVER).background(false).open();
        let store = open().expect("open");
        let fresh = store.index_snapshot();
        assert_eq!((fresh.covered, fresh.opened_from, fresh.ignored_at_open), (None, None, None));
        atoms(&store, "a", MIN_NEW_RECORDS);
        assert!(store.index_snapshot().records_after >= 2 * MIN_NEW_RECORDS);
        let end = store.log().next_lsn();
        store.close().expect("close");
        let store = open().expect("open");
        let info = store.index_snapshot();
        assert_eq!((info.covered, info.opened_from, info.records_after), (Some(end), Some(end), 0));
        assert_eq!(info.ignored_at_open, None);
        drop(store);
        // A damaged index snapshot: ignored, with the reason; the open folds everything and, having
        // folded that many records, writes a new one.
        let path = dir.path().join(FILE_NAME);
        let mut bytes = std::fs::read(&path).expect("read");
        let at = bytes.len() / 2;
        bytes[at] ^= 0x10;
        std::fs::write(&path, bytes).expect("write");
        let store = open().expect("open");
        store.wait_for_index_snapshot_writer();
        let info = store.index_snapshot();
        assert_eq!(info.opened_from, None);
        assert_eq!(info.ignored_at_open.as_deref(), Some("body checksum mismatch"));
        assert_eq!((info.covered, info.records_after), (Some(end), 0));
        assert_index_is_the_whole_fold(&store);
    }

    #[test]
    fn an_open_that_folds_many_records_writes_one_and_a_read_only_open_never_does() {
        let dir = tempfile::tempdir().expect("dir");
        {
            let store = Store::builder(dir.path())
                .snapshot_policy(SnapshotPolicy::NEVER)
                .background(false)
                .index_snapshot_after(u64::MAX)
                .open()
                .expect("open");
            atoms(&store, "a", MIN_NEW_RECORDS);
        }
        assert!(!dir.path().join(FILE_NAME).exists(), "u64::MAX leaves index snapshots to write_index_snapshot");
        let read_only = Store::open_read_only(dir.path()).expect("read-only open");
        assert_eq!(read_only.index_snapshot().opened_from, None);
        drop(read_only);
        assert!(!dir.path().join(FILE_NAME).exists(), "a read-only open wrote an index snapshot");
        let store = Store::builder(dir.path()).background(false).open().expect("open");
        // The open left the index snapshot of its fold to a thread of its own.
        store.wait_for_index_snapshot_writer();
        let info = store.index_snapshot();
        assert_eq!((info.opened_from, info.covered), (None, Some(store.log().next_lsn())));
        assert!(dir.path().join(FILE_NAME).exists(), "the open folded every record and wrote no index snapshot");
        drop(store);
        let read_only = Store::open_read_only(dir.path()).expect("read-only open");
        assert_eq!(read_only.index_snapshot().opened_from, Some(read_only.log().next_lsn()));
    }

    #[test]
    fn the_open_s_index_snapshot_is_not_published_after_compaction_changed_the_log() {
        use std::sync::atomic::Ordering;
        let dir = tempfile::tempdir().expect("dir");
        let store = Store::builder(dir.path()).background(false).open().expect("open");
        atoms(&store, "a", 40);
        store.write_index_snapshot().expect("index snapshot");
        let on_disk = std::fs::read(dir.path().join(FILE_NAME)).expect("read");
        // What the open's writer thread would hold: another encoding of the same log.
        let next = store.log().next_lsn().get();
        let state = rebuild::fold_from(&store.shared.log, &Codec::default(), fresh(99), next).expect("fold");
        let other = encode(&state, &store.shared.log).expect("encode");
        assert_ne!(other, on_disk);
        let index_snapshot = &store.shared.index_snapshot;
        let publish = |changes: u64| {
            index_snapshot.covered.store(0, Ordering::Relaxed);
            index_snapshot.log_changes.store(changes, Ordering::Relaxed);
            *index_snapshot.pending.lock() = Some((next, other.clone()));
            let writer = crate::store::Shared::write_pending_index_snapshot(&store.shared).expect("a writer");
            writer.join().expect("join");
            std::fs::read(dir.path().join(FILE_NAME)).expect("read")
        };
        assert_eq!(publish(1), on_disk, "published although compaction changed the log since the fold");
        assert_eq!(publish(0), other, "not published although nothing changed");
    }

    #[test]
    fn an_index_snapshot_taken_before_compaction_rewrote_its_segment_is_never_used() {
        // The index snapshot covers part of segment 1 while it is active; compaction later rewrites
        // it. Its sequence, first LSN and first and last covered records are unchanged: only
        // the rewrite's end LSN tells. Used, it said the reclaimed deltas were still there.
        let dir = tempfile::tempdir().expect("dir");
        let open = || compacting_store(dir.path(), 128 * 1024, None).index_snapshot_after(u64::MAX).open();
        let stale = {
            let store = open().expect("open");
            atoms(&store, "a", 40);
            assert_eq!(store.log().segments().len(), 1);
            store.write_index_snapshot().expect("index snapshot");
            std::fs::read(dir.path().join(FILE_NAME)).expect("read the index snapshot")
        };
        let reclaimed = {
            let store = open().expect("open");
            atoms(&store, "b", 600);
            let run = store.run_id("a").expect("run");
            let atoms = store.run_atoms(run);
            // Not the last atom's: the last covered record (its completion) keeps its delta.
            store.snapshot_now(atoms[atoms.len() - 5]).expect("snapshot");
            let report = store.compact().expect("compact");
            assert!(report.segments_rewritten > 0 && report.deltas_reclaimed > 0, "{report:?}");
            let first = store.log().segments()[0].path.clone();
            let header = identity::segment_header(store.shared.log.storage().as_ref(), &first).expect("header");
            assert!(header.is_compacted(), "segment 1 was rewritten");
            assert!(store.atom(atoms[0]).expect("atom").delta_reclaimed);
            atoms[0]
        };
        std::fs::write(dir.path().join(FILE_NAME), &stale).expect("copy the old index snapshot back");
        let store = open().expect("open");
        let info = store.index_snapshot();
        assert_eq!(info.opened_from, None, "an index snapshot of a segment since rewritten was used");
        assert_eq!(info.ignored_at_open.as_deref(), Some("the log below the index snapshot's LSN changed"));
        assert!(store.atom(reclaimed).expect("atom").delta_reclaimed);
        assert_index_is_the_whole_fold(&store);
    }

    #[test]
    fn a_rewrite_of_a_rewritten_segment_changes_the_fingerprint() {
        let dir = tempfile::tempdir().expect("dir");
        let store = compacting_store(dir.path(), 64 * 1024, None).index_snapshot_after(u64::MAX).open().expect("open");
        atoms(&store, "a", 400);
        let run = store.run_id("a").expect("run");
        let atoms = store.run_atoms(run);
        store.snapshot_now(atoms[100]).expect("snapshot");
        assert!(store.compact().expect("compact").segments_rewritten > 0);
        let next = store.log().next_lsn().get();
        let before = fingerprint(&store.shared.log, next).expect("fingerprint");
        store.snapshot_now(atoms[300]).expect("snapshot");
        assert!(store.compact().expect("compact").segments_rewritten > 0);
        let after = fingerprint(&store.shared.log, next).expect("fingerprint");
        let rewritten_again = before.segments.iter().zip(&after.segments).any(|(b, a)| b.end_lsn != 0 && b != a);
        assert!(rewritten_again, "{before:?} {after:?}");
    }

    #[test]
    fn another_store_s_index_snapshot_is_never_used() {
        // Two logs with the same records: before index snapshots carried the store id, the
        // fingerprint (sizes, sequence numbers, sampled records) could not tell them apart.
        let (a, b) = (tempfile::tempdir().expect("dir"), tempfile::tempdir().expect("dir"));
        let delta = crate::synthetic::Transcript::new(3).next_delta(200);
        for dir in [a.path(), b.path()] {
            crate::store::test_logs::write_run(dir, &[(1, vec![], Some(&delta)), (2, vec![1], Some(&delta))]);
        }
        let open = |dir: &std::path::Path| Store::builder(dir).background(false).open().expect("open");
        open(a.path()).write_index_snapshot().expect("index snapshot");
        std::fs::copy(a.path().join(FILE_NAME), b.path().join(FILE_NAME)).expect("copy");
        let store = open(b.path());
        let info = store.index_snapshot();
        assert_eq!(info.opened_from, None);
        assert_eq!(info.ignored_at_open.as_deref(), Some("the index snapshot belongs to another store"));
        assert_index_is_the_whole_fold(&store);
        drop(store);
        assert!(open(a.path()).index_snapshot().opened_from.is_some(), "its own store uses it");
    }

    /// A file of `len` bytes that starts with `header` and records the largest read asked of it.
    #[derive(Debug)]
    struct HugeFile {
        len: u64,
        header: Vec<u8>,
        largest_read: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl crate::storage::StorageFile for HugeFile {
        fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
            self.largest_read.fetch_max(buf.len(), std::sync::atomic::Ordering::Relaxed);
            if offset == 0 && buf.len() <= self.header.len() {
                buf.copy_from_slice(&self.header[..buf.len()]);
                return Ok(());
            }
            Err(std::io::Error::other("a read of the whole huge file"))
        }
        fn write_all_at(&self, _: &[u8], _: u64) -> std::io::Result<()> {
            Err(std::io::Error::other("read-only"))
        }
        fn sync_data(&self) -> std::io::Result<()> {
            Ok(())
        }
        fn len(&self) -> std::io::Result<u64> {
            Ok(self.len)
        }
        fn set_len(&self, _: u64) -> std::io::Result<()> {
            Err(std::io::Error::other("read-only"))
        }
        fn allocate(&self, _: u64) -> std::io::Result<()> {
            Err(std::io::Error::other("read-only"))
        }
        fn view(&self) -> std::io::Result<crate::storage::ReadView> {
            Err(std::io::Error::other("a view of the whole huge file"))
        }
    }

    /// A directory holding one [`HugeFile`].
    #[derive(Debug)]
    struct HugeStorage(Arc<HugeFile>);

    impl crate::storage::Storage for HugeStorage {
        fn create_dir_all(&self, _: &std::path::Path) -> std::io::Result<()> {
            Ok(())
        }
        fn list_dir(&self, _: &std::path::Path) -> std::io::Result<Vec<String>> {
            Ok(vec![FILE_NAME.to_owned()])
        }
        fn open(&self, _: &std::path::Path, _: OpenMode) -> std::io::Result<Arc<dyn crate::storage::StorageFile>> {
            Ok(self.0.clone())
        }
        fn rename(&self, _: &std::path::Path, _: &std::path::Path) -> std::io::Result<()> {
            Err(std::io::Error::other("read-only"))
        }
        fn remove_file(&self, _: &std::path::Path) -> std::io::Result<()> {
            Err(std::io::Error::other("read-only"))
        }
        fn sync_dir(&self, _: &std::path::Path) -> std::io::Result<()> {
            Ok(())
        }
        fn lock_dir(&self, _: &std::path::Path) -> std::io::Result<crate::storage::DirLock> {
            Err(std::io::Error::other("read-only"))
        }
    }

    #[test]
    fn a_huge_index_snapshot_file_is_refused_before_it_is_read() {
        // Before the bound, a file up to 64 GiB was allocated and read whole.
        let largest_read = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let header = frame(100, 7, b"a short body")[..HEADER_BYTES].to_vec();
        for (len, reason) in [(5u64 << 30, "too large"), (3 << 30, "length mismatch")] {
            let file = HugeFile { len, header: header.clone(), largest_read: Arc::clone(&largest_read) };
            match read(&HugeStorage(Arc::new(file)), std::path::Path::new("/huge")) {
                Read::Unusable(found) => assert_eq!(found, reason),
                _ => panic!("a {len}-byte index snapshot was taken"),
            }
            let largest = largest_read.load(std::sync::atomic::Ordering::Relaxed);
            assert!(largest <= HEADER_BYTES, "read {largest} bytes of a {len}-byte file");
        }
    }

    /// One step of a random store history.
    #[derive(Clone, Debug)]
    enum Step {
        /// `n` atoms of agent `agent` in run `run` (completed, failed or left running by `i % 5`).
        Atoms { run: u8, agent: u8, n: u16 },
        /// A guarded effect and a pin on the newest completed atom.
        GuardAndPin,
        /// Roll agent 0 of run 0 back to its oldest completed atom, and fork from there.
        RollbackAndFork,
        /// Finish run `run` (dropped by retention at the next compaction).
        Finish { run: u8 },
        /// A snapshot of the newest completed atom, then a compaction round.
        SnapshotAndCompact,
        /// An explicit index snapshot.
        IndexSnapshot,
        /// Drop the store (which may index snapshot) and open it again.
        Reopen,
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (0u8..3, 0u8..2, 1u16..120).prop_map(|(run, agent, n)| Step::Atoms { run, agent, n }),
            1 => Just(Step::GuardAndPin),
            1 => Just(Step::RollbackAndFork),
            1 => (0u8..3).prop_map(|run| Step::Finish { run }),
            2 => Just(Step::SnapshotAndCompact),
            2 => Just(Step::IndexSnapshot),
            2 => Just(Step::Reopen),
        ]
    }

    /// Plays `steps`, ignoring the typed refusals a random history runs into (a finished run
    /// takes no atoms, a pinned history cannot be reclaimed, ...); every reopen must rebuild
    /// exactly the index a fold of the whole log builds, whichever index snapshot it starts from.
    fn play(steps: &[Step]) -> usize {
        let dir = tempfile::tempdir().expect("dir");
        let open = || {
            compacting_store(dir.path(), 64 * 1024, Some(std::time::Duration::ZERO))
                .index_snapshot_after(64)
                .open()
                .expect("open")
        };
        let mut store = open();
        let mut transcript = crate::synthetic::Transcript::new(steps.len() as u64);
        let mut key = 0u64;
        let mut from_index_snapshot = 0;
        for step in steps {
            match *step {
                Step::Atoms { run, agent, n } => {
                    let Ok(run) = store.create_run(RunSpec::new(format!("run-{run}"))) else { continue };
                    let agent = format!("agent-{agent}");
                    for i in 0..n {
                        key += 1;
                        let parents: Vec<_> = store.agent_atoms(run, &agent).last().copied().into_iter().collect();
                        let Ok(atom) = store.begin_atom(run, &agent, &key.to_string(), &parents, "") else { break };
                        let _ = match i % 5 {
                            3 => store.fail_atom(atom, &crate::AtomFailure { message: "x".into(), retryable: true }),
                            4 if i % 2 == 0 => Ok(()),
                            _ => store.complete_atom(
                                atom,
                                &AtomOutput { delta: transcript.next_delta(200), result: vec![1] },
                            ),
                        };
                    }
                }
                Step::GuardAndPin => {
                    if let Some(atom) = newest_completed(&store) {
                        let _ = store.guarded(atom, "effect", |_| Ok(b"done".to_vec()));
                        let _ = store.pin(atom, true);
                    }
                }
                Step::RollbackAndFork => {
                    if let Some(run) = store.run_id("run-0") {
                        let completed = |atom: &crate::AtomId| {
                            store.atom(*atom).is_ok_and(|a| a.status == crate::AtomStatus::Completed)
                        };
                        if let Some(&to) = store.agent_atoms(run, "agent-0").iter().find(|a| completed(a)) {
                            key += 1;
                            let _ = store.rollback(run, "agent-0", to, "review");
                            let _ = store.fork(run, "agent-0", to, &format!("fork-{key}"));
                        }
                    }
                }
                Step::Finish { run } => {
                    if let Some(run) = store.run_id(&format!("run-{run}")) {
                        let _ = store.finish_run(run, true, "");
                    }
                }
                Step::SnapshotAndCompact => {
                    if let Some(atom) = newest_completed(&store) {
                        let _ = store.snapshot_now(atom);
                    }
                    store.compact().expect("compact");
                }
                Step::IndexSnapshot => {
                    store.write_index_snapshot().expect("index snapshot");
                }
                Step::Reopen => {
                    drop(store);
                    store = open();
                    from_index_snapshot += usize::from(store.index_snapshot().opened_from.is_some());
                    assert_index_is_the_whole_fold(&store);
                }
            }
        }
        drop(store);
        let store = open();
        assert_index_is_the_whole_fold(&store);
        from_index_snapshot
    }

    fn newest_completed(store: &Store) -> Option<crate::AtomId> {
        let runs = store.runs();
        let atoms = runs.iter().flat_map(|run| store.run_atoms(run.id));
        atoms.filter(|atom| store.atom(*atom).is_ok_and(|a| a.status == crate::AtomStatus::Completed)).max()
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 24, failure_persistence: None, ..Default::default() })]
        #[test]
        fn any_history_reopens_to_the_whole_fold(steps in proptest::collection::vec(step(), 1..24)) {
            play(&steps);
        }
    }

    #[test]
    fn a_history_with_every_step_reopens_from_index_snapshots() {
        use Step::*;
        let steps = [
            Atoms { run: 0, agent: 0, n: 100 },
            Atoms { run: 1, agent: 1, n: 80 },
            IndexSnapshot,
            GuardAndPin,
            Atoms { run: 2, agent: 0, n: 50 },
            Reopen,
            RollbackAndFork,
            Finish { run: 2 },
            SnapshotAndCompact,
            Reopen,
            Atoms { run: 0, agent: 1, n: 60 },
            SnapshotAndCompact,
            IndexSnapshot,
            Reopen,
        ];
        assert!(play(&steps) >= 2, "the reopens should start from index snapshots");
    }
}
