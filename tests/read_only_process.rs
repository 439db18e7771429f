//! A read-only open works while another *process* holds the store open (and locked) for
//! writing, and changes no byte and no modification time of any file in the store: guards
//! against an inspection tool that takes the writer's lock, syncs, cuts a tail or deletes
//! leftovers, which would disturb or corrupt a live agent.
//!
//! In its own test binary: a child process forked while another test of the same binary has a
//! store open would inherit (until its `exec`) the descriptor that holds that store's lock.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::SystemTime;

use continuum::{AtomOutput, Error, Log, RunSpec, Store};

const HOLDER_ENV: &str = "CONTINUUM_READ_ONLY_HOLDER_DIR";
const STOP_FILE: &str = "STOP";

fn output(step: u64) -> AtomOutput {
    AtomOutput { delta: continuum::synthetic::Transcript::new(step).next_delta(200), result: vec![step as u8] }
}

/// The child: opens the store for writing, executes a few atoms, says READY, and holds the
/// store open (locked) until told to stop.
#[test]
fn child_holder() {
    let Some(dir) = std::env::var_os(HOLDER_ENV) else { return };
    let store = Store::builder(&dir).segment_bytes(16 * 1024).open().expect("the holder opens the store");
    let run = store.create_run(RunSpec::new("held")).expect("create run");
    let mut parents = Vec::new();
    for step in 0..40 {
        let executed = store.execute(run, "agent", &format!("step-{step}"), &parents, |_| Ok(output(step)));
        parents = vec![executed.expect("atom").atom];
    }
    store.snapshot_now(parents[0]).expect("snapshot");
    println!("READY");
    while !Path::new(&dir).join(STOP_FILE).exists() {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    drop(store);
    println!("STOPPED");
}

/// Every file under `dir` with its bytes and modification time.
fn files(dir: &Path) -> BTreeMap<PathBuf, (Vec<u8>, SystemTime)> {
    let mut found = BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(at) = pending.pop() {
        for entry in std::fs::read_dir(&at).expect("list") {
            let entry = entry.expect("entry");
            let metadata = entry.metadata().expect("metadata");
            if metadata.is_dir() {
                pending.push(entry.path());
            } else {
                let bytes = std::fs::read(entry.path()).expect("read");
                found.insert(entry.path(), (bytes, metadata.modified().expect("mtime")));
            }
        }
    }
    found
}

#[test]
fn read_only_open_works_while_another_process_holds_the_store_and_changes_nothing() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let child = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "child_holder", "--nocapture", "--test-threads=1"])
        .env(HOLDER_ENV, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the holder");
    let mut holder = Holder { child, stop: dir.path().join(STOP_FILE) };
    let mut lines = BufReader::new(holder.child.stdout.take().expect("stdout")).lines();
    assert!(lines.by_ref().map_while(Result::ok).any(|line| line.contains("READY")), "the holder never became ready");
    // The holder has the lock: a writable open is refused.
    assert!(matches!(Store::open(dir.path()), Err(Error::Locked { .. })));
    let before = files(dir.path());

    let store = Store::open_read_only(dir.path()).expect("read-only open next to a writer");
    let run = store.run_id("held").expect("the run");
    let atoms = store.run_atoms(run);
    assert_eq!(atoms.len(), 40);
    for atom in &atoms {
        store.atom(*atom).expect("atom readable");
    }
    let last = *atoms.last().expect("atoms");
    let rebuilt = store.rebuild_context(last).expect("context rebuild");
    assert_eq!(rebuilt.snapshot, Some(last), "the holder's snapshot is used");
    assert!(matches!(store.create_run(RunSpec::new("refused")), Err(Error::ReadOnly)));
    assert!(store.snapshot_now(last).is_err(), "a read-only store writes no snapshot");
    assert!(matches!(store.sync(), Err(Error::ReadOnly)));
    assert_eq!(store.metrics().errors.iter().sum::<u64>(), 2, "sync and run creation counted");
    drop(store);
    let log = Log::open_read_only(dir.path()).expect("read-only log");
    assert_eq!(log.iter_from(continuum::Lsn::FIRST).expect("iter").count() as u64, log.next_lsn().get() - 1);
    drop(log);
    let report = continuum::inspect::verify(dir.path(), &mut |_, _| {}).expect("verify");
    assert!(report.is_clean(), "{:?}", report.problems);

    let after = files(dir.path());
    assert_eq!(before.keys().collect::<Vec<_>>(), after.keys().collect::<Vec<_>>(), "files created or deleted");
    for (path, (bytes, mtime)) in &before {
        let (bytes_after, mtime_after) = &after[path];
        assert!(bytes == bytes_after, "{} changed", path.display());
        assert_eq!(mtime, mtime_after, "{} was touched", path.display());
    }
    std::fs::write(&holder.stop, b"").expect("stop the holder");
    // Read to the end: closing the pipe early would fail the holder's last writes.
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(rest.iter().any(|line| line.contains("STOPPED")), "the holder did not stop cleanly: {rest:?}");
    assert!(holder.child.wait().expect("holder exit").success(), "the holder failed");
}

/// The holder process; told to stop (and killed if it does not) when the test ends, even by
/// a failed assertion.
struct Holder {
    child: std::process::Child,
    stop: PathBuf,
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.stop, b"");
        for _ in 0..500 {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
