//! Helpers shared by the simulator-based tests: a workload that records what was acknowledged,
//! and a checker for invariant 2 (recovery yields a prefix holding every durable record).

#![allow(dead_code, reason = "each test file uses a different subset")]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use continuum::storage::sim::SimStorage;
use continuum::{Durability, Log, Lsn};

/// The store directory used on the simulator.
pub const DIR: &str = "/store";

/// Opens the log on `sim` with small segments so that workloads rotate often.
pub fn open(sim: &SimStorage, segment_bytes: u64) -> continuum::Result<Log> {
    Log::builder(Path::new(DIR)).storage(Arc::new(sim.clone())).segment_bytes(segment_bytes).open()
}

/// A deterministic payload for the `i`-th record of a workload.
pub fn payload(i: u64) -> Vec<u8> {
    let len = 40 + (i * 37) % 300;
    (0..len).map(|j| (i.wrapping_mul(31).wrapping_add(j) % 251) as u8).collect()
}

/// What a workload was told: records acknowledged, and which of them are durable.
#[derive(Debug, Default, Clone)]
pub struct Acked {
    /// Every acknowledged record by LSN.
    pub records: BTreeMap<u64, Vec<u8>>,
    /// Records whose acknowledgement promised survival of power loss.
    pub durable_through: u64,
}

/// Appends `count` records: Sync singles, Sync batches, and unsynced appends that a later
/// Sync append or an explicit `sync()` makes durable.
/// Stops at the first error and returns what was acknowledged up to then.
pub fn run_workload(log: &Log, first_payload: u64, count: u64, acked: &mut Acked) -> continuum::Result<()> {
    let mut i = first_payload;
    while i < first_payload + count {
        match i % 5 {
            0 | 4 => {
                // A Sync append also makes every earlier unsynced append durable.
                let record = payload(i);
                let lsn = log.append(&record)?;
                acked.records.insert(lsn.get(), record);
                acked.durable_through = lsn.get();
                i += 1;
            }
            2 => {
                let records = [payload(i), payload(i + 1), payload(i + 2)];
                let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
                let range = log.append_batch(&refs)?;
                for (lsn, record) in range.iter().zip(records) {
                    acked.records.insert(lsn.get(), record);
                }
                acked.durable_through = range.last().get();
                i += 3;
            }
            _ => {
                let record = payload(i);
                let lsn = log.append_with(&record, Durability::None)?;
                acked.records.insert(lsn.get(), record);
                if i % 10 == 1 {
                    log.sync()?;
                    acked.durable_through = lsn.get();
                }
                i += 1;
            }
        }
    }
    Ok(())
}

/// Checks a recovered log against what was acknowledged before the crash: LSNs are
/// contiguous, every durable record is present byte for byte, every present record was
/// acknowledged or at least written (equal to the workload's payload), and lost records
/// form a suffix; recovery reports no evidence of lost records. Returns the recovered records.
pub fn check_recovered(log: &Log, acked: &Acked, context: &str) -> BTreeMap<u64, Vec<u8>> {
    // A crash or a failed call never looks like records taken from the end of the log.
    let lost = &log.recovery_report().lost_records;
    assert!(lost.is_empty(), "{context}: recovery reported lost records: {lost:?}");
    let mut recovered = BTreeMap::new();
    let records = log.iter_from(Lsn::FIRST).unwrap_or_else(|e| panic!("{context}: iter: {e}"));
    for (expected_lsn, item) in (log.first_lsn().get()..).zip(records) {
        let (lsn, bytes) = item.unwrap_or_else(|e| panic!("{context}: read: {e}"));
        assert_eq!(lsn.get(), expected_lsn, "{context}: LSN gap");
        if let Some(want) = acked.records.get(&lsn.get()) {
            assert_eq!(bytes.as_ref(), want.as_slice(), "{context}: record {lsn} changed");
        }
        recovered.insert(lsn.get(), bytes.to_vec());
    }
    for (lsn, want) in acked.records.range(..=acked.durable_through) {
        let got = recovered.get(lsn);
        assert_eq!(got, Some(want), "{context}: durable record {lsn} lost");
    }
    let last_recovered = recovered.keys().next_back().copied().unwrap_or(0);
    for lsn in acked.records.keys() {
        if *lsn <= last_recovered {
            assert!(recovered.contains_key(lsn), "{context}: record {lsn} lost before a later one survived");
        }
    }
    recovered
}

/// Runs the test `child_test` of this test binary as a child process with `env_key` set to
/// `dir`, kills it with SIGKILL after `delay`, and returns the lines it printed.
pub fn run_child_until_killed(child_test: &str, env_key: &str, dir: &Path, delay: std::time::Duration) -> Vec<String> {
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", child_test, "--nocapture", "--test-threads=1"])
        .env(env_key, dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("piped stdout");
    let reader =
        std::thread::spawn(move || std::io::BufReader::new(stdout).lines().map_while(Result::ok).collect::<Vec<_>>());
    std::thread::sleep(delay);
    let _ = child.kill();
    let _ = child.wait();
    reader.join().expect("reader thread")
}

/// The files of a closed store directory, every byte durable, to restore on a fresh simulated
/// disk as often as a campaign needs (one damaged copy per case).
pub struct DurableFiles {
    dir: std::path::PathBuf,
    files: Vec<(std::path::PathBuf, Vec<u8>)>,
}

impl DurableFiles {
    /// Takes the files of `dir` on `sim`, checking that everything in them is synced.
    pub fn take(sim: &SimStorage, dir: &Path) -> Self {
        let files = sim.file_names(dir).into_iter().map(|name| {
            let path = dir.join(name);
            let durable = sim.durable_bytes(&path).expect("a durable file");
            assert_eq!(sim.file_bytes(&path).as_ref(), Some(&durable), "everything is synced");
            (path, durable)
        });
        Self { dir: dir.to_path_buf(), files: files.collect() }
    }

    /// A fresh simulated disk holding exactly these files, durably.
    pub fn restore(&self) -> SimStorage {
        use continuum::storage::{OpenMode, Storage};
        let sim = SimStorage::new(0);
        sim.create_dir_all(&self.dir).expect("mkdir");
        for (path, bytes) in &self.files {
            let file = sim.open(path, OpenMode::CreateNew).expect("create");
            file.write_all_at(bytes, 0).expect("write");
            file.sync_data().expect("sync");
        }
        sim.sync_dir(&self.dir).expect("sync dir");
        sim
    }

    /// The length of the file at `path`.
    pub fn len(&self, path: &Path) -> u64 {
        let (_, bytes) = self.files.iter().find(|(at, _)| at == path).expect("the file is in the snapshot");
        bytes.len() as u64
    }

    /// The byte at `offset` of the file at `path`.
    pub fn byte(&self, path: &Path, offset: u64) -> u8 {
        let (_, bytes) = self.files.iter().find(|(at, _)| at == path).expect("the file is in the snapshot");
        bytes[offset as usize]
    }
}
