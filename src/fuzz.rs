//! Entry points for the fuzz targets in `fuzz/` and for the test that replays their corpus.
//! Not part of the stable API.

use std::path::Path;
use std::sync::Arc;

use crate::config::RecoveryMode;
use crate::log::record;
use crate::log::segment::{self, SegmentHeader};
use crate::log::{Log, Lsn};
use crate::storage::sim::SimStorage;
use crate::storage::{OpenMode, Storage};

/// Decodes `data` as a frame (the first 8 bytes are the segment salt), inflating a compressed
/// one. Must never panic.
pub fn decode_batch(data: &[u8]) {
    let Some((salt, frame)) = data.split_first_chunk::<8>() else { return };
    let salt = u64::from_le_bytes(*salt);
    let Ok(decoded) = record::decode_frame(frame, salt) else { return };
    let inflated;
    let payload = if decoded.header.is_compressed() {
        let Ok(records) = record::inflate(&decoded) else { return };
        inflated = records;
        &inflated[..]
    } else {
        decoded.payload
    };
    let count = record::Records::new(payload).filter(Result::is_ok).count();
    assert_eq!(count as u64, u64::from(decoded.header.record_count), "a verified frame holds exactly its records");
}

/// Opens a log whose only segment file holds `data`, in every recovery mode, and reads back
/// every record it recovers. When `data` starts with a rewritten (compacted) segment's header,
/// it is opened as a sealed segment followed by an empty active one instead (a rewritten
/// segment is never the last). Must never panic.
pub fn recover_segment(data: &[u8]) {
    let compacted = SegmentHeader::decode(data).ok().filter(SegmentHeader::is_compacted);
    for mode in [RecoveryMode::TolerateTornTail, RecoveryMode::Strict, RecoveryMode::SkipCorrupted] {
        let storage = SimStorage::new(0);
        let dir = Path::new("/fuzz");
        if place_segment(&storage, dir, data).is_err() {
            return;
        }
        if let Some(header) = compacted
            && place_active_after(&storage, dir, &header).is_err()
        {
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

/// An empty active segment after the rewritten segment `sealed`.
fn place_active_after(storage: &SimStorage, dir: &Path, sealed: &SegmentHeader) -> std::io::Result<()> {
    let header = SegmentHeader {
        seq: sealed.seq.saturating_add(1),
        first_lsn: sealed.end_lsn,
        segment_bytes: 4096,
        store_id: sealed.store_id,
        end_lsn: 0,
        compressed: false,
        generation: segment::GENERATION_WRITER,
    };
    let file = storage.open(&dir.join(segment::file_name(header.first_lsn)), OpenMode::CreateNew)?;
    file.allocate(header.segment_bytes)?;
    file.write_all_at(&header.encode(), 0)?;
    file.sync_data()?;
    storage.sync_dir(dir)
}

fn place_segment(storage: &SimStorage, dir: &Path, data: &[u8]) -> std::io::Result<()> {
    storage.create_dir_all(dir)?;
    let path = dir.join("00000000000000000001.seg");
    let file = storage.open(&path, OpenMode::CreateNew)?;
    file.write_all_at(data, 0)?;
    file.sync_data()?;
    storage.sync_dir(dir)
}

/// Decodes `data` as a store record, with and without a dictionary loaded. Must never panic
/// nor allocate without bound; a record that decodes must encode and decode to itself.
pub fn decode_record(data: &[u8]) {
    let codec = crate::codec::Codec::default();
    let _ = codec.peek(data);
    if let Ok(record) = codec.decode(data) {
        let again = codec.decode(&codec.encode(&record));
        assert_eq!(again.as_ref(), Ok(&record), "a decoded record round-trips");
    }
}

/// Decodes `data` as a continuation control atom's result (`docs/FORMAT.md` §8a). Must never
/// panic; an event that decodes is within the bounds of `limits.rs` and encodes and decodes to
/// itself.
pub fn continuation_event(data: &[u8]) {
    use crate::continuation::encode;
    if let Ok(event) = encode::decode(data, 1) {
        assert_eq!(encode::decode(&encode::encode(&event), 1).ok(), Some(event), "a decoded event round-trips");
    }
}

/// Checks replay's zero-copy readers against prost on arbitrary bytes: the first byte picks
/// what the rest is (3: an encoded `Delta`, as `Store::record_atom_encoded` takes it; any other
/// value modulo 3 — 0: an `AtomCompleted` body, 1: an `AtomStarted` body, 2: a snapshot's
/// `Context`). Whatever the fast path accepts, prost must accept with the same result; where the
/// fast path applies a delta and fails, prost must reject it; an encoded delta is taken exactly
/// when prost decodes it. Must never panic otherwise.
pub fn replay_decode(data: &[u8]) {
    use prost::Message;

    use crate::codec::context::{Context, Rotation};
    use crate::codec::proto::{AtomCompleted, AtomStarted};
    use crate::codec::{delta_check, delta_view};

    let Some((&which, body)) = data.split_first() else { return };
    if which == 3 {
        let prost = crate::codec::proto::Delta::decode(body).is_ok();
        assert_eq!(crate::codec::check_encoded_delta(body), prost, "an encoded delta is taken as prost takes it");
        if delta_check::check_delta(body).is_ok() {
            assert!(prost, "the in-place check took a delta prost refuses");
        }
        return;
    }
    match which % 3 {
        0 => {
            let base = fuzz_base_context();
            let prost = AtomCompleted::decode(body).ok();
            for subject in [prost.as_ref().map_or(0, |done| done.atom), 1] {
                let mut ops = Vec::new();
                if delta_view::read_completion(body, subject, &mut ops).is_err() {
                    assert!(ops.is_empty(), "a refused read leaves no ops");
                    continue;
                }
                let mut fast = base.clone();
                let mut rotation = Rotation::default();
                let applied = fast.apply_ops(body, &ops, &mut rotation);
                fast.settle(&mut rotation);
                let by_prost = prost.clone().filter(|done| done.atom == subject).map(|done| {
                    let mut context = base.clone();
                    context.apply_owned(done.delta.unwrap_or_default());
                    context
                });
                match applied {
                    Ok(()) => assert_eq!(Some(fast), by_prost, "the fast path folds as prost decodes"),
                    Err(_) => assert!(by_prost.is_none(), "the fast path refused what prost accepts"),
                }
            }
        }
        1 => {
            let prost = AtomStarted::decode(body).ok();
            let subject = prost.as_ref().map_or(0, |started| started.atom);
            let mut parents = Vec::new();
            if let Ok(start) = delta_view::read_start(body, subject, &mut parents) {
                let prost = prost.expect("prost accepts what the fast path accepts");
                assert_eq!(start.run, prost.run);
                assert_eq!(start.agent.of(body), prost.agent.as_bytes());
                assert_eq!(start.key.of(body), prost.key.as_bytes());
                assert_eq!(parents, prost.parents);
            }
        }
        _ => {
            if let Ok(fast) = Context::decode_in_place(body) {
                assert_eq!(Ok(fast), Context::decode_with_prost(body), "snapshot decoders agree");
            }
        }
    }
}

/// A context with a window and keys, so that replay's buffer reuse is exercised.
fn fuzz_base_context() -> crate::codec::context::Context {
    let mut context = crate::codec::context::Context::new();
    let mut transcript = crate::synthetic::Transcript::new(7);
    for _ in 0..3 {
        context.apply(&transcript.next_delta(200));
    }
    context
}

/// Decodes `data` as the body of an index snapshot (the header is made for it, so that the
/// checksums match and the decoder is reached). Must never panic, and allocates at most a
/// bounded multiple of the input's size.
pub fn index_snapshot(data: &[u8]) {
    let _ = crate::store::index_snapshot_body_decodes(data);
}

/// Most records [`index_fold`] appends from one input.
const FOLD_RECORDS_MAX: usize = 512;

/// The records of an `index_fold` input: each is a little-endian `u16` length and that many
/// bytes (a store record: envelope and body); a cut last record is dropped.
fn fold_records(data: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = data;
    std::iter::from_fn(move || {
        let (len, tail) = rest.split_first_chunk::<2>()?;
        let record = tail.get(..usize::from(u16::from_le_bytes(*len)))?;
        rest = &tail[record.len()..];
        Some(record)
    })
    .take(FOLD_RECORDS_MAX)
}

/// Appends the records of `data` (each a little-endian `u16` length and its bytes, at most
/// 512) to a fresh log and rebuilds a store index from it: the whole fold, records to index,
/// as an open runs it. The fold on one thread and the pipelined fold must agree (the same
/// index, or both refuse the log); a read-only store open of the log returns `Ok` or a typed
/// `Err`. Never panics, and allocates within the bounds of `limits.rs` whatever sizes and ids
/// the records name.
pub fn index_fold(data: &[u8]) {
    let storage = fold_log(data);
    let dir = Path::new(FOLD_DIR);
    let Ok(log) = Log::builder(dir).storage(Arc::new(storage.clone())).open_read_only() else { return };
    crate::store::folds_agree(&log);
    drop(log);
    let _ = crate::Store::builder(dir).storage(Arc::new(storage)).background(false).open_read_only();
}

/// Where [`fold_log`] writes its log.
const FOLD_DIR: &str = "/fold";

/// A simulated disk holding a log of the records of `data` (appended until one is refused).
fn fold_log(data: &[u8]) -> SimStorage {
    let storage = SimStorage::new(0);
    let built = Log::builder(FOLD_DIR).storage(Arc::new(storage.clone())).segment_bytes(256 * 1024).open();
    if let Ok(log) = built {
        for record in fold_records(data) {
            if log.append(record).is_err() {
                break;
            }
        }
    }
    storage
}

/// An `index_fold` input holding `records`.
fn fold_input<'a>(records: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut input = Vec::new();
    for record in records {
        let Ok(len) = u16::try_from(record.len()) else { continue };
        input.extend_from_slice(&len.to_le_bytes());
        input.extend_from_slice(record);
    }
    input
}

/// Seeds of `index_fold`: the records of a small store with every kind of record, and the
/// hostile records that once aborted or overflowed the fold.
fn fold_seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    use crate::codec::StoreRecord;
    use crate::codec::proto::{CompressionDictionary, RunDropped};

    let storage = SimStorage::new(0);
    let dir = Path::new("/seed");
    seed_store(&storage, dir, false);
    let records = store_records(&storage, dir);
    let codec = crate::codec::Codec::default();
    let dropped =
        codec.encode(&StoreRecord::RunDropped(RunDropped { run: 1, next_atom: u64::MAX / 2, dropped_at_unix_us: 1 }));
    let dictionary =
        codec.encode(&StoreRecord::Dictionary(CompressionDictionary { id: u32::MAX, dictionary: vec![7; 16] }));
    let with = |extra: &[u8]| fold_input(records.iter().map(Vec::as_slice).chain([extra]));
    vec![
        ("index_fold", "seed-store".to_owned(), fold_input(records.iter().map(Vec::as_slice))),
        ("index_fold", "regression-run-dropped-next-atom".to_owned(), with(&dropped)),
        ("index_fold", "regression-dictionary-id-max".to_owned(), with(&dictionary)),
    ]
}

/// Every record of the store in `dir`, in log order.
fn store_records(storage: &SimStorage, dir: &Path) -> Vec<Vec<u8>> {
    let log = Log::builder(dir).storage(Arc::new(storage.clone())).open_read_only().expect("seed log opens");
    let mut records = Vec::new();
    log.visit(log.first_lsn(), Lsn::new(log.next_lsn().get().saturating_sub(1)), |_, record| {
        records.push(record.bytes().to_vec());
        Ok(true)
    })
    .expect("seed log reads");
    records
}

/// Hand-made seed inputs: `(target, file name, bytes)`. Valid frames and segments, so that the
/// fuzzers start from inputs that reach deep into the decoders.
pub fn seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut seeds = Vec::new();
    let shapes: [&[&[u8]]; 4] = [&[b"hello"], &[b"tool: ls", b"ok"], &[b""], &[&[0xAB; 300], b"x", b"yz"]];
    for (i, records) in shapes.iter().enumerate() {
        let salt = i as u64 + 1;
        let mut batch = record::EncodedBatch::encode(records).expect("seed records are within limits");
        let mut input = salt.to_le_bytes().to_vec();
        input.extend_from_slice(batch.seal(1 + i as u64 * 10, salt, 64));
        seeds.push(("decode_batch", format!("seed-{i}"), input));
    }
    {
        let records: [&[u8]; 3] = [b"tool: ls tool: ls tool: ls", &[0xAB; 300], b"ok"];
        let mut compressor = zstd::bulk::Compressor::new(3).expect("a zstd context");
        let mut batch = record::EncodedBatch::encode_compressed(&records, &mut compressor).expect("within limits");
        let mut input = 7u64.to_le_bytes().to_vec();
        input.extend_from_slice(batch.seal(5, 7, 64));
        seeds.push(("decode_batch", "seed-compressed".to_owned(), input));
    }
    for (i, records) in [1usize, 3, 40].into_iter().enumerate() {
        seeds.push(("recover_segment", format!("seed-{i}"), segment_with(records)));
    }
    seeds.push(("recover_segment", "seed-compacted".to_owned(), compacted_segment(None)));
    let compression = crate::log::FrameCompression { level: 3, frame_bytes: 4096 };
    seeds.push(("recover_segment", "seed-compressed".to_owned(), compacted_segment(Some(compression))));
    let codec = crate::codec::Codec::default();
    let mut transcript = crate::synthetic::Transcript::new(1);
    let records = [
        crate::codec::StoreRecord::AtomCompleted(crate::codec::proto::AtomCompleted {
            atom: 9,
            delta: Some(transcript.next_delta(500)),
            result: b"ok".to_vec(),
            ended_at_unix_us: 1,
        }),
        crate::codec::StoreRecord::AtomStarted(crate::codec::proto::AtomStarted {
            atom: 10,
            run: 1,
            agent: "planner".into(),
            key: "step-1".into(),
            parents: vec![9],
            ..Default::default()
        }),
        crate::codec::StoreRecord::GuardStarted(crate::codec::proto::GuardStarted {
            key: "r/a/k/op".into(),
            atom: 10,
            operation: "op".into(),
            started_at_unix_us: 3,
        }),
    ];
    for (i, record) in records.iter().enumerate() {
        seeds.push(("decode_record", format!("seed-{i}"), codec.encode(record)));
    }
    {
        use prost::Message;
        let mut delta = transcript.next_delta(500);
        delta.drop_oldest_messages = 1;
        delta.summarizations.push(crate::codec::proto::Summarization {
            from: 0,
            to: 2,
            role: "system".into(),
            summary: "earlier steps".into(),
        });
        let completed = crate::codec::proto::AtomCompleted {
            atom: 9,
            delta: Some(delta),
            result: b"ok".to_vec(),
            ended_at_unix_us: 1,
        };
        let started = crate::codec::proto::AtomStarted {
            atom: 10,
            run: 1,
            agent: "planner".into(),
            key: "step-1".into(),
            parents: vec![7, 9],
            ..Default::default()
        };
        let mut context = fuzz_base_context();
        context.apply(&transcript.next_delta(300));
        for (i, (which, body)) in [
            (0u8, completed.encode_to_vec()),
            (1, started.encode_to_vec()),
            (2, context.encode()),
            (3, completed.delta.clone().unwrap_or_default().encode_to_vec()),
        ]
        .into_iter()
        .enumerate()
        {
            let mut input = vec![which];
            input.extend_from_slice(&body);
            seeds.push(("replay_decode", format!("seed-{i}"), input));
        }
    }
    seeds.push(("index_snapshot", "seed-0".to_owned(), index_snapshot_body()));
    seeds.extend(fold_seeds());
    seeds.extend(continuation_seeds());
    seeds
}

/// A suspension with a nested tree, a decision and a resumption, encoded.
fn continuation_seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    use crate::continuation::encode::{self, ContinuationEvent, StoredDecision, StoredSuspension};
    use crate::continuation::{ContinuationLevel, Decision, SuspendReason};
    let mut root = ContinuationLevel::new("hr").child(
        ContinuationLevel::new("account").head(crate::AtomId::from_raw(2)).request("call-7", "authorize_account", "{}"),
    );
    encode::fill_paths(&mut root, &mut Vec::new());
    let events = [
        ContinuationEvent::Suspension(StoredSuspension {
            number: 1,
            reason: SuspendReason::Timer { resume_at_unix_us: 5 },
            since_unix_us: 1,
            root,
        }),
        ContinuationEvent::Decision(StoredDecision {
            suspension: 1,
            tool_call_id: "call-7".into(),
            decision: Decision::approve("ada").message("ok").edited_arguments("{\"a\":1}"),
        }),
        ContinuationEvent::Resumption { suspension: 1, resumed_at_unix_us: 9 },
    ];
    events
        .iter()
        .enumerate()
        .map(|(i, event)| ("continuation_event", format!("seed-{i}"), encode::encode(event)))
        .collect()
}

/// The body of the index snapshot of a small store with two runs, a failed and a running
/// atom, a guard and a pin.
fn index_snapshot_body() -> Vec<u8> {
    let storage = SimStorage::new(0);
    let dir = Path::new("/seed");
    seed_store(&storage, dir, true);
    let bytes = storage.file_bytes(&dir.join(crate::store::INDEX_SNAPSHOT_FILE_NAME)).unwrap_or_default();
    bytes.get(48..).unwrap_or_default().to_vec()
}

/// A small store with two runs, a failed and a running atom, a guard and a pin; then either
/// (`index snapshot`) an index snapshot of it, or a rollback, a fork and a finished run.
fn seed_store(storage: &SimStorage, dir: &Path, index_snapshot: bool) {
    {
        let store = crate::Store::builder(dir)
            .storage(Arc::new(storage.clone()))
            .background(false)
            .open()
            .expect("seed store opens");
        for name in ["first", "second"] {
            let run = store.create_run(crate::RunSpec::new(name)).expect("seed run");
            let mut parents = Vec::new();
            for i in 0..12 {
                let atom = store.begin_atom(run, "agent", &i.to_string(), &parents, "").expect("seed atom");
                match i {
                    5 => store
                        .fail_atom(atom, &crate::AtomFailure { message: "no".into(), retryable: true })
                        .expect("seed failure"),
                    11 => {}
                    _ => store.complete_atom(atom, &crate::AtomOutput::default()).expect("seed completion"),
                }
                if i == 3 {
                    store.guarded(atom, "email", |_| Ok(b"sent".to_vec())).expect("seed guard");
                    store.pin(atom, true).expect("seed pin");
                }
                parents = vec![atom];
            }
        }
        if index_snapshot {
            store.write_index_snapshot().expect("seed index snapshot");
        } else {
            let run = store.run_id("first").expect("seed run");
            let to = store.agent_atoms(run, "agent")[2];
            store.rollback(run, "agent", to, "seed").expect("seed rollback");
            store.fork(run, "agent", to, "seed-fork").expect("seed fork");
            store.finish_run(store.run_id("second").expect("seed run"), true, "").expect("seed finish");
        }
    }
}

/// The bytes of a first segment rewritten by compaction, with LSN gaps and a replaced record,
/// its frames compressed as `compression` says.
fn compacted_segment(compression: Option<crate::log::FrameCompression>) -> Vec<u8> {
    let storage = SimStorage::new(0);
    let dir = Path::new("/seed");
    let log = Log::builder(dir).storage(Arc::new(storage.clone())).segment_bytes(4096).open().expect("seed log opens");
    for i in 0..60 {
        if log.append(format!("seed record {i}").repeat(i % 4 + 1).as_bytes()).is_err() {
            break;
        }
    }
    let options = crate::log::RewriteOptions { compression };
    let _ = log.rewrite_segment_with(crate::log::Lsn::FIRST, options, |lsn, _| {
        Ok(match lsn.get() % 3 {
            0 => crate::log::Rewrite::Drop,
            1 => crate::log::Rewrite::Keep,
            _ => crate::log::Rewrite::Replace(b"replaced".to_vec()),
        })
    });
    drop(log);
    storage.file_bytes(&dir.join("00000000000000000001.seg")).unwrap_or_default()
}

/// The bytes of a first segment holding `records` appended records (4 KiB segments).
fn segment_with(records: usize) -> Vec<u8> {
    let storage = SimStorage::new(0);
    let dir = Path::new("/seed");
    let log = Log::builder(dir).storage(Arc::new(storage.clone())).segment_bytes(4096).open().expect("seed log opens");
    for i in 0..records {
        let record = format!("seed record {i}").repeat(i % 4 + 1);
        if log.append(record.as_bytes()).is_err() {
            break;
        }
    }
    drop(log);
    storage.file_bytes(&dir.join("00000000000000000001.seg")).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_index_fold_seeds_reach_the_fold() {
        let seeds = fold_seeds();
        let opened: Vec<bool> = seeds
            .iter()
            .map(|(_, _, input)| {
                let storage = fold_log(input);
                crate::Store::builder(FOLD_DIR).storage(Arc::new(storage)).background(false).open_read_only().is_ok()
            })
            .collect();
        // The store's records rebuild its index; each hostile record is refused with a typed error.
        assert_eq!(opened, [true, false, false]);
        let store = crate::Store::builder(FOLD_DIR)
            .storage(Arc::new(fold_log(&seeds[0].2)))
            .background(false)
            .open_read_only()
            .expect("the store seed opens");
        assert_eq!(store.runs().len(), 2);
    }
}
