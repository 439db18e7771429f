//! The log's stream index (`LogBuilder::stream_key`, `Log::visit_stream`): a stream's records
//! are exactly the records of the log whose key names it, in LSN order, whatever happened to
//! the log: appends (from several threads), power losses with every damage, clean reopens,
//! prefix truncations, and segment rewrites that drop records or replace them with records of
//! another stream. Checked against a full scan of the log after every step; a damaged frame the
//! index has not read is reported by every stream query, never passed over.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use continuum::log::Rewrite;
use continuum::storage::sim::{CrashDamage, SimStorage};
use continuum::{Durability, Error, Log, Lsn, RecoveryMode};
use proptest::collection::vec;
use proptest::prelude::*;

const DIR: &str = "/db";
/// Streams 0..KEYS; a record whose first byte is `NO_STREAM` belongs to none.
const KEYS: u8 = 4;
const NO_STREAM: u8 = 0xff;

/// The record's stream: its first byte, below [`KEYS`].
fn stream_of(record: &[u8]) -> Option<u64> {
    record.first().filter(|key| **key < KEYS).map(|key| u64::from(*key))
}

/// A record of stream `key` (or of none: [`NO_STREAM`]) with `len` bytes after the key.
fn record(key: u8, serial: u32, len: usize) -> Vec<u8> {
    let mut record = vec![key];
    record.extend(serial.to_le_bytes().iter().cycle().take(len));
    record
}

/// Each stream's LSNs and records, from a scan of the whole log.
fn scan(log: &Log) -> BTreeMap<u64, Vec<(u64, Vec<u8>)>> {
    let mut streams: BTreeMap<u64, Vec<(u64, Vec<u8>)>> = BTreeMap::new();
    for item in log.iter_from(Lsn::FIRST).expect("iterate") {
        let (lsn, bytes) = item.expect("scan");
        if let Some(key) = stream_of(&bytes) {
            streams.entry(key).or_default().push((lsn.get(), bytes.to_vec()));
        }
    }
    streams
}

/// Asserts that every stream query agrees with a scan of the log.
fn check_streams(log: &Log, context: &str) {
    let want = scan(log);
    let keys: Vec<u64> = want.keys().copied().collect();
    assert_eq!(log.stream_keys().expect("stream keys"), keys, "{context}: keys");
    for key in 0..u64::from(KEYS) + 1 {
        let records = want.get(&key).cloned().unwrap_or_default();
        let lsns: Vec<u64> = records.iter().map(|(lsn, _)| *lsn).collect();
        assert_eq!(log.stream_lsns(key, Lsn::FIRST).expect("stream lsns"), lsns, "{context}: stream {key}");
        let mut got = Vec::new();
        let visited = log
            .visit_stream(key, Lsn::FIRST, |lsn, record| {
                got.push((lsn, record.bytes().to_vec()));
                Ok(true)
            })
            .expect("visit stream");
        assert_eq!(visited, records.len(), "{context}: stream {key} visited");
        assert_eq!(got, records, "{context}: stream {key} records");
        // From the middle of the stream on.
        if let Some((middle, _)) = records.get(records.len() / 2) {
            let tail = log.stream_lsns(key, Lsn::new(*middle)).expect("stream lsns from");
            assert_eq!(tail, lsns[records.len() / 2..], "{context}: stream {key} from {middle}");
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    /// Records of the given streams (`NO_STREAM` for none), as one batch when more than one.
    Append { keys: Vec<u8>, len: usize, durability: Durability },
    /// Power loss with `CrashDamage::ALL[damage]`, then reopen.
    Crash { damage: usize },
    /// Clean close, then reopen.
    Reopen,
    /// Truncate below `first + (next - first) * permille / 1000`.
    Truncate { permille: u64 },
    /// Rewrite the sealed segment `pick % sealed`: for each record, by `choices` in turn,
    /// keep (0), drop (1) or replace it with a record of stream `(key + 1) % (KEYS + 1)` (2).
    Rewrite { pick: usize, choices: Vec<u8>, compress: bool },
}

fn op() -> impl Strategy<Value = Op> {
    let key = prop_oneof![4 => 0..KEYS, 1 => Just(NO_STREAM)];
    let durability = prop_oneof![Just(Durability::Sync), Just(Durability::Buffered), Just(Durability::None)];
    prop_oneof![
        12 => (vec(key, 1..4), 0usize..300, durability).prop_map(|(keys, len, durability)| Op::Append { keys, len, durability }),
        2 => (0..CrashDamage::ALL.len()).prop_map(|damage| Op::Crash { damage }),
        1 => Just(Op::Reopen),
        1 => (0u64..1000).prop_map(|permille| Op::Truncate { permille }),
        2 => (any::<usize>(), vec(0u8..3, 1..8), any::<bool>()).prop_map(|(pick, choices, compress)| Op::Rewrite { pick, choices, compress }),
    ]
}

struct Harness {
    sim: SimStorage,
    log: Option<Log>,
    serial: u32,
}

impl Harness {
    fn open(sim: &SimStorage) -> Log {
        Log::builder(DIR)
            .storage(Arc::new(sim.clone()))
            .segment_bytes(4096)
            .flush_interval(Duration::from_secs(3600))
            .stream_key(stream_of)
            .open()
            .expect("open")
    }

    fn log(&self) -> &Log {
        self.log.as_ref().expect("open")
    }

    fn run(&mut self, op: &Op) {
        match op {
            Op::Append { keys, len, durability } => {
                let records: Vec<Vec<u8>> = keys
                    .iter()
                    .map(|key| {
                        self.serial += 1;
                        record(*key, self.serial, *len)
                    })
                    .collect();
                let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
                self.log().append_batch_with(&refs, *durability).expect("append");
            }
            Op::Crash { damage } => {
                self.sim.crash(CrashDamage::ALL[*damage]);
                drop(self.log.take());
                self.log = Some(Self::open(&self.sim));
            }
            Op::Reopen => {
                self.log.take().expect("open").close().expect("close");
                self.log = Some(Self::open(&self.sim));
            }
            Op::Truncate { permille } => {
                let log = self.log();
                let (first, next) = (log.first_lsn().get(), log.next_lsn().get());
                log.truncate_prefix(Lsn::new(first + (next - first) * permille / 1000)).expect("truncate");
            }
            Op::Rewrite { pick, choices, compress } => {
                let log = self.log();
                let sealed: Vec<_> = log.segments().into_iter().filter(|segment| segment.sealed).collect();
                if sealed.is_empty() {
                    return;
                }
                let segment = &sealed[pick % sealed.len()];
                let options = continuum::RewriteOptions {
                    compression: compress.then_some(continuum::CompactionPolicy::COLD_COMPRESSION),
                };
                let mut choice = choices.iter().cycle();
                log.rewrite_segment_with(segment.first_lsn, options, |_, bytes| {
                    Ok(match choice.next() {
                        Some(1) => Rewrite::Drop,
                        Some(2) => {
                            let mut new = bytes.to_vec();
                            new[0] = if new[0] >= KEYS { 0 } else { (new[0] + 1) % (KEYS + 1) };
                            Rewrite::Replace(new)
                        }
                        _ => Rewrite::Keep,
                    })
                })
                .expect("rewrite");
            }
        }
    }
}

/// 200 cases, or `PROPTEST_CASES` for a longer run.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|cases| cases.parse().ok()).unwrap_or(200)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    /// After every step, every stream query agrees with a scan of the whole log.
    #[test]
    fn streams_match_a_scan_of_the_log(seed in any::<u64>(), ops in vec(op(), 1..60)) {
        let sim = SimStorage::new(seed);
        let mut harness = Harness { log: Some(Harness::open(&sim)), sim, serial: 0 };
        for (step, op) in ops.iter().enumerate() {
            harness.run(op);
            check_streams(harness.log(), &format!("step {step}: {op:?}"));
        }
    }
}

/// Streams appended from several threads at once, each its own stream, queried while they
/// grow: each query sees a prefix of its stream in order, and at the end the whole of it, on
/// the real file system, after a reopen too, with the sealed segments indexed in parallel.
#[test]
fn concurrent_appenders_each_see_their_stream_in_order() {
    const PER_THREAD: u32 = 2_000;
    let dir = tempfile::tempdir().expect("tempdir");
    let open = || Log::builder(dir.path()).segment_bytes(64 * 1024).stream_key(stream_of).open().expect("open");
    let log = open();
    std::thread::scope(|scope| {
        for key in 0..KEYS {
            let log = &log;
            scope.spawn(move || {
                for serial in 0..PER_THREAD {
                    let durability = if serial % 50 == 0 { Durability::Sync } else { Durability::None };
                    log.append_with(&record(key, serial, 40), durability).expect("append");
                    if serial % 200 == 0 {
                        let mut want: u32 = 0;
                        log.visit_stream(u64::from(key), Lsn::FIRST, |_, record| {
                            assert_eq!(record.bytes()[1..5], want.to_le_bytes(), "stream {key} out of order");
                            want += 1;
                            Ok(true)
                        })
                        .expect("visit");
                        assert!(want > serial, "stream {key}: {want} records after appending {}", serial + 1);
                    }
                }
            });
        }
    });
    check_streams(&log, "after the appenders");
    assert!(log.segments().len() > 8, "the records must fill several segments");
    log.close().expect("close");
    let log = open();
    check_streams(&log, "after a reopen");
    for key in 0..KEYS {
        assert_eq!(log.stream_lsns(u64::from(key), Lsn::FIRST).expect("lsns").len(), PER_THREAD as usize);
    }
}

/// Appends 400 records of streams 0..3 to a log in `dir` and syncs it.
fn fill(log: &Log, first_serial: u32) {
    for serial in first_serial..first_serial + 400 {
        log.append_with(&record((serial % 3) as u8, serial, 100), Durability::None).expect("append");
    }
    log.sync().expect("sync");
}

/// Flips a byte in the middle of the frames of `segment`.
fn flip_byte(segment: &continuum::log::SegmentInfo, from: u64) {
    let mut bytes = std::fs::read(&segment.path).expect("read segment");
    let at = ((from + segment.data_bytes) / 2) as usize;
    bytes[at] ^= 0x40;
    std::fs::write(&segment.path, &bytes).expect("write segment");
}

/// A flipped byte in frames the index has not read yet (appended after the open, damaged
/// before the first query): every stream query reports the damage, again and again, instead
/// of returning the streams without the damaged frame's records; reads of other records keep
/// working. A sealed segment damaged before the open and salvaged with
/// `RecoveryMode::SkipCorrupted`: the streams are what the salvaged log holds.
#[test]
fn damaged_frames_are_reported_or_salvaged_never_passed_over() {
    let dir = tempfile::tempdir().expect("tempdir");
    let open = |mode: RecoveryMode| {
        Log::builder(dir.path())
            .segment_bytes(256 * 1024)
            .recovery_mode(mode)
            .stream_key(stream_of)
            .open()
            .expect("open")
    };
    let log = open(RecoveryMode::default());
    fill(&log, 0);
    check_streams(&log, "before the damage");
    let indexed_to = log.segments().last().expect("a segment").data_bytes;
    let first_new = log.next_lsn().get();
    fill(&log, 400);
    let active = log.segments().last().expect("a segment").clone();
    assert!(active.data_bytes > indexed_to + 4096, "the new records stay in the active segment");
    flip_byte(&active, indexed_to);
    for attempt in 0..2 {
        for key in 0..u64::from(KEYS) {
            let error = log.stream_lsns(key, Lsn::FIRST).expect_err("a damaged frame must be reported");
            assert!(matches!(error, Error::Corruption { .. }), "attempt {attempt}, stream {key}: {error:?}");
            let error = log.visit_stream(key, Lsn::FIRST, |_, _| Ok(true)).expect_err("visit must fail too");
            assert!(matches!(error, Error::Corruption { .. }), "attempt {attempt}, stream {key}: {error:?}");
        }
    }
    assert!(log.read(Lsn::FIRST).expect("read before the damage").is_some(), "other reads keep working");
    assert!(log.read(Lsn::new(first_new)).expect("read of the first new record").is_some());
    drop(log);

    // The damaged segment is sealed once more records follow it; salvaged, the streams are
    // what recovery kept.
    let log = open(RecoveryMode::SkipCorrupted);
    assert!(!log.recovery_report().skipped.is_empty(), "recovery must skip the damage");
    for round in 2..8 {
        fill(&log, round * 400);
    }
    assert!(log.segments().len() >= 2, "the damaged segment is sealed");
    drop(log);
    let log = open(RecoveryMode::SkipCorrupted);
    check_streams(&log, "salvaged");
    drop(log);

    // Without a stream key, the stream queries are a configuration error.
    let log = Log::builder(dir.path()).recovery_mode(RecoveryMode::SkipCorrupted).open().expect("open");
    let error = log.visit_stream(0, Lsn::FIRST, |_, _| Ok(true)).expect_err("no stream key");
    assert!(matches!(error, Error::InvalidArgument { .. }), "{error:?}");
}

/// A read-only log has streams too, and a truncated stream no longer counts among the keys.
#[test]
fn read_only_streams_and_truncated_keys() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::builder(dir.path()).segment_bytes(8 * 1024).stream_key(stream_of).open().expect("open");
    // Stream 3 only in the first segments, then streams 0 and 1.
    for serial in 0..60 {
        log.append_with(&record(3, serial, 100), Durability::None).expect("append");
    }
    for serial in 0..300 {
        log.append_with(&record((serial % 2) as u8, serial, 100), Durability::None).expect("append");
    }
    log.sync().expect("sync");
    let reader = Log::builder(dir.path()).stream_key(stream_of).open_read_only().expect("read only");
    check_streams(&reader, "read only");
    assert_eq!(reader.stream_keys().expect("keys"), vec![0, 1, 3]);
    drop(reader);
    let first_of_0 = log.stream_lsns(0, Lsn::FIRST).expect("lsns")[0];
    assert!(log.truncate_prefix(Lsn::new(first_of_0 + 100)).expect("truncate") > 0);
    check_streams(&log, "after the truncation");
    assert_eq!(log.stream_keys().expect("keys"), vec![0, 1], "stream 3 was truncated away");
}

/// A stream longer than the part `visit_stream` looks up at a time (16,384 records): visited
/// whole and in order, from its middle, stopped past a part's end by its visitor; records
/// appended to it during a visit (by the visitor itself) are not visited, so the visit ends.
#[test]
fn long_streams_are_visited_in_parts() {
    const LONG: u32 = 40_000;
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::builder(dir.path()).stream_key(stream_of).open().expect("open");
    for serial in 0..LONG {
        log.append_with(&record(1, serial, 8), Durability::None).expect("append");
        if serial % 4 == 0 {
            log.append_with(&record(2, serial, 8), Durability::None).expect("append");
        }
    }
    let serial_of = |record: &[u8]| u32::from_le_bytes(record[1..5].try_into().expect("four bytes"));
    let mut want = 0;
    let visited = log
        .visit_stream(1, Lsn::FIRST, |_, record| {
            assert_eq!(serial_of(record.bytes()), want, "in order");
            want += 1;
            Ok(true)
        })
        .expect("visit");
    assert_eq!((visited, want), (LONG as usize, LONG));

    let lsns = log.stream_lsns(1, Lsn::FIRST).expect("lsns");
    let middle = lsns[LONG as usize / 2 - 7];
    let mut first = None;
    let visited = log
        .visit_stream(1, Lsn::new(middle), |lsn, _| {
            first.get_or_insert(lsn);
            Ok(true)
        })
        .expect("visit from the middle");
    assert_eq!((visited, first), (LONG as usize / 2 + 7, Some(middle)));

    let mut seen = 0;
    let visited = log
        .visit_stream(1, Lsn::FIRST, |_, _| {
            seen += 1;
            Ok(seen < 20_000)
        })
        .expect("visit stopped");
    assert_eq!((visited, seen), (20_000, 20_000), "the visitor stopped it past the first part");

    let mut appended = 0;
    let visited = log
        .visit_stream(1, Lsn::FIRST, |_, _| {
            log.append_with(&record(1, LONG + appended, 8), Durability::None)?;
            appended += 1;
            assert!(appended <= LONG, "the visit went on into the records it appended");
            Ok(true)
        })
        .expect("visit while appending");
    assert_eq!(visited, LONG as usize, "only the records there when the visit began");
    assert_eq!(log.stream_lsns(1, Lsn::FIRST).expect("lsns").len(), 2 * LONG as usize);
}
