//! Real-process crashes: a child process appends with [`Durability::Sync`] while the parent
//! kills it with `SIGKILL` at a random moment, then reopens the log and checks that every
//! acknowledged record is there, byte for byte, with no gap in the LSNs. The same directory is
//! reused across iterations, so every recovery runs on top of the earlier ones and every child
//! appends after a recovered tail.
//!
//! Guards the promise the whole crate rests on: an acknowledged append survives a crash
//! (including a crash during segment rotation, recovery, or a group-commit write). The log is
//! opened with a stream key (each record's counter modulo [`STREAMS`]), so every reopen also
//! checks that the stream index recovery builds holds exactly each stream's records.
//!
//! The test binary is its own child: [`crash_child`] returns at once unless
//! `CONTINUUM_CRASH_CHILD_DIR` is set. `CONTINUUM_CRASH_ITERATIONS` sets the number of kills
//! (default 50) and `CONTINUUM_CRASH_SEED` replays a failing run (the seed is printed on
//! failure).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use continuum::synthetic::SplitMix64;
use continuum::{Durability, Log, Lsn};

/// Store directory of the child; set only in the child.
const CHILD_DIR_ENV: &str = "CONTINUUM_CRASH_CHILD_DIR";
/// Seed of the child's payloads and batch sizes; set only in the child.
const CHILD_SEED_ENV: &str = "CONTINUUM_CRASH_CHILD_SEED";
/// Number of kills the parent performs.
const ITERATIONS_ENV: &str = "CONTINUUM_CRASH_ITERATIONS";
/// Seed of the parent's PRNG, to replay a failing run.
const SEED_ENV: &str = "CONTINUUM_CRASH_SEED";

const ITERATIONS_DEFAULT: u64 = 50;
/// Streams the records are spread over, by counter.
const STREAMS: u64 = 4;
/// Small segments, so that children rotate often and some die mid-rotation.
const SEGMENT_BYTES: u64 = 64 * 1024;
const KILL_DELAY_MS_MIN: u64 = 5;
const KILL_DELAY_MS_MAX: u64 = 150;
/// Most records in one batch; with [`LARGE_FILLER_BYTES_MAX`] a batch fits in a segment.
const BATCH_RECORDS_MAX: u64 = 4;
const SMALL_FILLER_BYTES_MAX: u64 = 1024;
const LARGE_FILLER_BYTES_MAX: u64 = 12 * 1024;

// The largest batch (records plus their prefixes) must fit in one segment.
const _: () = assert!(BATCH_RECORDS_MAX * (LARGE_FILLER_BYTES_MAX + 64) < SEGMENT_BYTES - 4096);

/// The child: appends forever and reports every acknowledged append on stdout as
/// `ACK first_lsn count counter_start`, after first reporting `OPEN next_lsn records`.
/// Does nothing unless [`CHILD_DIR_ENV`] is set, so a normal test run skips it.
#[test]
fn crash_child() {
    let Some(dir) = std::env::var_os(CHILD_DIR_ENV) else { return };
    let seed: u64 = std::env::var(CHILD_SEED_ENV)
        .expect("the parent should set the child seed")
        .parse()
        .expect("the child seed should be a u64");
    let log = open_log(Path::new(&dir));
    // Direct writes to stdout bypass libtest's capture; one `write_all` per line, then flush.
    let mut out = std::io::stdout().lock();
    let report = log.recovery_report();
    // libtest has printed "test crash_child ... " without a newline; end that line first.
    write_line(&mut out, "");
    write_line(&mut out, &format!("OPEN {} {}", log.next_lsn(), report.records));
    let mut rng = SplitMix64::new(seed);
    let mut counter = 0u64;
    loop {
        let count = if rng.below(3) == 0 { 2 + rng.below(BATCH_RECORDS_MAX - 1) } else { 1 };
        let records: Vec<Vec<u8>> = (counter..counter + count).map(|c| payload(seed, c)).collect();
        let first = if count == 1 {
            log.append(&records[0]).expect("append should succeed")
        } else {
            let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
            let range = log.append_batch(&refs).expect("append_batch should succeed");
            assert_eq!(u64::from(range.len()), count, "a batch gets one LSN per record");
            range.first()
        };
        write_line(&mut out, &format!("ACK {first} {count} {counter}"));
        counter += count;
    }
}

#[test]
fn sigkill_loses_no_acknowledged_record() {
    let iterations = env_u64(ITERATIONS_ENV).unwrap_or(ITERATIONS_DEFAULT);
    let seed = env_u64(SEED_ENV).unwrap_or_else(time_seed);
    // Captured by libtest and shown if the test fails.
    eprintln!("crash_process: seed {seed}, {iterations} iterations; replay with {SEED_ENV}={seed}");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut rng = SplitMix64::new(seed);
    let mut model = Model::default();
    let started = Instant::now();
    for iteration in 0..iterations {
        let child_seed = rng.next_u64();
        let delay = Duration::from_millis(KILL_DELAY_MS_MIN + rng.below(KILL_DELAY_MS_MAX - KILL_DELAY_MS_MIN + 1));
        let context = format!("iteration {iteration}, seed {seed}, child seed {child_seed}, kill after {delay:?}");
        let run = run_child(dir.path(), child_seed, delay, &context);
        model.record_run(&run, child_seed, &context);
        model.verify(dir.path(), &context);
    }
    let summary = format!(
        "crash_process: {iterations} SIGKILLs in {:.1?}: {} acknowledged records checked byte for byte, \
         {} records in the final log, {} kills before the log was open, {} torn tails cut, seed {seed}\n",
        started.elapsed(),
        model.acked.len(),
        model.next_lsn - 1,
        model.kills_before_open,
        model.torn_tails,
    );
    // Written past libtest's capture so the numbers show in a normal run.
    let _ = std::io::stderr().write_all(summary.as_bytes());
}

/// What the parent knows about the log: every acknowledged record and where the log ended.
struct Model {
    /// Acknowledged LSN → (child seed, counter) of its payload.
    acked: BTreeMap<u64, (u64, u64)>,
    /// The LSN the next append receives, as of the last verification.
    next_lsn: u64,
    kills_before_open: u64,
    torn_tails: u64,
}

impl Default for Model {
    fn default() -> Self {
        Self { acked: BTreeMap::new(), next_lsn: Lsn::FIRST.get(), kills_before_open: 0, torn_tails: 0 }
    }
}

impl Model {
    /// Checks the child's report for consistency and adds its acknowledged records.
    fn record_run(&mut self, run: &ChildRun, child_seed: u64, context: &str) {
        let Some((open_next_lsn, open_records)) = run.open else {
            assert!(run.acks.is_empty(), "{context}: acknowledgements without an OPEN line");
            self.kills_before_open += 1;
            return;
        };
        // Recovery is idempotent: the child finds exactly the log the parent verified.
        assert_eq!(open_next_lsn, self.next_lsn, "{context}: the child reopened at another LSN");
        assert_eq!(open_records, self.next_lsn - 1, "{context}: the child recovered another record count");
        let mut expected_lsn = open_next_lsn;
        let mut expected_counter = 0;
        for ack in &run.acks {
            assert_eq!(ack.first_lsn, expected_lsn, "{context}: acknowledged LSNs are not consecutive");
            assert_eq!(ack.counter_start, expected_counter, "{context}: counters are not consecutive");
            for i in 0..ack.count {
                let previous = self.acked.insert(ack.first_lsn + i, (child_seed, ack.counter_start + i));
                assert!(previous.is_none(), "{context}: LSN {} acknowledged twice", ack.first_lsn + i);
            }
            expected_lsn += ack.count;
            expected_counter += ack.count;
        }
    }

    /// Reopens the log and checks it against the model, then records where it ends.
    fn verify(&mut self, dir: &Path, context: &str) {
        let log = open_log(dir);
        let report = log.recovery_report().clone();
        assert_eq!(report.first_lsn, Lsn::FIRST.get(), "{context}: the log lost its first records");
        assert!(report.lost_lsns.is_empty(), "{context}: recovery lost LSNs {:?}", report.lost_lsns);
        assert!(report.skipped.is_empty(), "{context}: recovery skipped {:?}", report.skipped);
        assert_eq!(report.records, report.next_lsn - 1, "{context}: record count and LSNs disagree");
        assert!(
            report.next_lsn >= self.next_lsn,
            "{context}: the log shrank from {} to {}",
            self.next_lsn,
            report.next_lsn
        );
        let acked_end = self.acked.last_key_value().map_or(Lsn::FIRST.get(), |(lsn, _)| lsn + 1);
        assert!(
            report.next_lsn >= acked_end,
            "{context}: log ends at {} before acknowledged LSN {}",
            report.next_lsn,
            acked_end - 1
        );
        if report.torn_tail.is_some() {
            self.torn_tails += 1;
        }
        let checked = self.verify_records(&log, context);
        assert_eq!(checked, report.records, "{context}: iteration and recovery count different records");
        log.close().expect("closing the verified log should succeed");
        self.next_lsn = report.next_lsn;
    }

    /// Iterates over the whole log: consecutive LSNs from 1, every record a well-formed payload,
    /// every acknowledged record byte-equal to what was appended. Returns the records seen.
    fn verify_records(&self, log: &Log, context: &str) -> u64 {
        let mut expected_lsn = Lsn::FIRST.get();
        let mut streams: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for item in log.iter_from(Lsn::FIRST).expect("iter_from should succeed") {
            let (lsn, bytes) = item.unwrap_or_else(|e| panic!("{context}: reading LSN {expected_lsn} failed: {e}"));
            assert_eq!(lsn.get(), expected_lsn, "{context}: LSN gap");
            let (seed, counter) =
                parse_payload(&bytes).unwrap_or_else(|| panic!("{context}: LSN {lsn} holds a malformed record"));
            streams.entry(counter % STREAMS).or_default().push(lsn.get());
            assert!(bytes.as_ref() == payload(seed, counter), "{context}: LSN {lsn} holds damaged bytes");
            if let Some(&acked) = self.acked.get(&lsn.get()) {
                assert_eq!((seed, counter), acked, "{context}: LSN {lsn} holds another record than acknowledged");
            }
            expected_lsn += 1;
        }
        // Random access agrees with iteration for the newest acknowledged records.
        for (&lsn, &(seed, counter)) in self.acked.iter().rev().take(16) {
            let bytes = log.read(Lsn::new(lsn)).expect("read should succeed");
            assert_eq!(bytes.as_deref(), Some(payload(seed, counter).as_slice()), "{context}: read({lsn}) differs");
        }
        // Each stream is exactly its records, and reads them back whole.
        for key in 0..STREAMS {
            let want = streams.remove(&key).unwrap_or_default();
            let lsns = log.stream_lsns(key, Lsn::FIRST).expect("stream_lsns should succeed");
            assert!(lsns == want, "{context}: stream {key} holds {} LSNs, the log {}", lsns.len(), want.len());
            let visited = log
                .visit_stream(key, Lsn::FIRST, |lsn, record| {
                    let (seed, counter) = parse_payload(record.bytes()).expect("a stream's record is well formed");
                    assert_eq!(counter % STREAMS, key, "{context}: LSN {lsn} is in stream {key}");
                    assert!(record.bytes() == payload(seed, counter), "{context}: stream {key}, LSN {lsn} differs");
                    Ok(true)
                })
                .expect("visit_stream should succeed");
            assert_eq!(visited, want.len(), "{context}: stream {key} visited");
        }
        expected_lsn - 1
    }
}

/// One acknowledged append, as the child reported it.
struct Ack {
    first_lsn: u64,
    count: u64,
    counter_start: u64,
}

/// What the parent learned from one killed child.
struct ChildRun {
    /// `next_lsn` and record count the child's recovery reported.
    open: Option<(u64, u64)>,
    acks: Vec<Ack>,
}

/// Kills the child if the parent panics before it does.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs one child against `dir`, kills it after `delay`, and collects its report.
fn run_child(dir: &Path, child_seed: u64, delay: Duration, context: &str) -> ChildRun {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut child = KillOnDrop(
        Command::new(exe)
            .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
            .env(CHILD_DIR_ENV, dir)
            .env(CHILD_SEED_ENV, child_seed.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning the child should succeed"),
    );
    let stdout = child.0.stdout.take().expect("the child's stdout is piped");
    let stderr = child.0.stderr.take().expect("the child's stderr is piped");
    let lines = thread::spawn(move || read_complete_lines(stdout));
    let errors: JoinHandle<String> = thread::spawn(move || {
        let mut text = String::new();
        let _ = BufReader::new(stderr).read_to_string(&mut text);
        text
    });
    thread::sleep(delay);
    let exited_early = child.0.try_wait().expect("try_wait should succeed");
    child.0.kill().expect("killing the child should succeed");
    let status = child.0.wait().expect("waiting for the child should succeed");
    let lines = lines.join().expect("the stdout reader should not panic");
    let errors = errors.join().expect("the stderr reader should not panic");
    assert!(exited_early.is_none(), "{context}: the child exited by itself ({status}); its stderr:\n{errors}");
    assert_killed(&status, context);
    parse_child_lines(&lines, context)
}

#[cfg(unix)]
fn assert_killed(status: &std::process::ExitStatus, context: &str) {
    use std::os::unix::process::ExitStatusExt;
    const SIGKILL: i32 = 9;
    assert_eq!(status.signal(), Some(SIGKILL), "{context}: the child did not die of SIGKILL ({status})");
}

#[cfg(not(unix))]
fn assert_killed(status: &std::process::ExitStatus, context: &str) {
    assert!(!status.success(), "{context}: the child exited successfully instead of being killed");
}

/// Every line that ends in a newline; a line cut short by the kill was never acknowledged to
/// the parent, so it is dropped.
fn read_complete_lines(stdout: impl Read) -> Vec<String> {
    let mut reader = BufReader::new(stdout);
    let mut lines = Vec::new();
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return lines,
            Ok(_) if line.ends_with(b"\n") => lines.push(String::from_utf8_lossy(&line).trim_end().to_owned()),
            Ok(_) => return lines,
        }
    }
}

/// Parses the protocol lines, ignoring libtest's own output ("running 1 test", …).
fn parse_child_lines(lines: &[String], context: &str) -> ChildRun {
    let mut run = ChildRun { open: None, acks: Vec::new() };
    for line in lines {
        let Some((tag, rest)) = line.split_once(' ') else { continue };
        if tag != "OPEN" && tag != "ACK" {
            continue;
        }
        let numbers: Vec<u64> = rest
            .split(' ')
            .map(|field| field.parse().unwrap_or_else(|_| panic!("{context}: bad protocol line {line:?}")))
            .collect();
        match (tag, numbers.as_slice()) {
            ("OPEN", &[next_lsn, records]) => run.open = Some((next_lsn, records)),
            ("ACK", &[first_lsn, count, counter_start]) => run.acks.push(Ack { first_lsn, count, counter_start }),
            _ => panic!("{context}: bad protocol line {line:?}"),
        }
    }
    run
}

/// The stream of a record: its counter modulo [`STREAMS`].
fn stream_of(bytes: &[u8]) -> Option<u64> {
    parse_payload(bytes).map(|(_, counter)| counter % STREAMS)
}

fn open_log(dir: &Path) -> Log {
    Log::builder(dir)
        .stream_key(stream_of)
        .segment_bytes(SEGMENT_BYTES)
        .durability(Durability::Sync)
        .open()
        .unwrap_or_else(|e| panic!("opening the log in {} should succeed: {e}", dir.display()))
}

fn write_line(out: &mut impl Write, line: &str) {
    out.write_all(format!("{line}\n").as_bytes()).expect("writing to stdout should succeed");
    out.flush().expect("flushing stdout should succeed");
}

/// The record with `counter` of the child with `seed`: `"{seed:016x}/{counter}/"` followed by
/// pseudo-random filler of a pseudo-random length (mostly small, sometimes several KiB).
fn payload(seed: u64, counter: u64) -> Vec<u8> {
    let mut rng = SplitMix64::new(seed ^ counter.wrapping_mul(0xD1B5_4A32_D192_ED03));
    let filler_len =
        if rng.below(16) == 0 { rng.below(LARGE_FILLER_BYTES_MAX + 1) } else { rng.below(SMALL_FILLER_BYTES_MAX + 1) };
    let mut bytes = format!("{seed:016x}/{counter}/").into_bytes();
    let len = bytes.len() + usize::try_from(filler_len).expect("filler length fits in usize");
    while bytes.len() < len {
        bytes.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    bytes.truncate(len);
    bytes
}

/// The `(seed, counter)` a payload names, if it is well formed.
fn parse_payload(bytes: &[u8]) -> Option<(u64, u64)> {
    let seed = u64::from_str_radix(std::str::from_utf8(bytes.get(..16)?).ok()?, 16).ok()?;
    let rest = bytes.get(16..)?.strip_prefix(b"/")?;
    let end = rest.iter().position(|&b| b == b'/')?;
    let counter = std::str::from_utf8(&rest[..end]).ok()?.parse().ok()?;
    Some((seed, counter))
}

fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(value.parse().unwrap_or_else(|_| panic!("{name} should be a u64, not {value:?}")))
}

fn time_seed() -> u64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).expect("the clock should be after 1970");
    now.as_secs() ^ u64::from(now.subsec_nanos()) ^ u64::from(std::process::id())
}
