//! The compiled `examples/dump.rs` run as a real process, again and again, against a store a
//! child process is writing (atoms, `Sync` appends, and its background thread's policy
//! snapshots, snapshot retention and compaction): every dump must succeed and the writer must
//! not notice. Guards against a dump that takes the writer's lock, trips over files the writer
//! deletes or replaces, or reads a half-written frame as corruption.
//!
//! In its own test binary: a child process forked while another test of the same binary has a
//! store open would inherit (until its `exec`) the descriptor that holds that store's lock.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use continuum::{AtomOutput, RunSpec, Store};

/// The compiled example (`cargo test` builds examples next to the test's own directory).
fn dump_binary() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let profile_dir = exe.parent()?.parent()?;
    let binary = profile_dir.join("examples").join("dump");
    binary.exists().then_some(binary)
}

const WRITER_ENV: &str = "CONTINUUM_DUMP_WRITER_DIR";
/// The child writer stops once this file exists in the store directory.
const STOP_FILE: &str = "STOP";
/// Dump runs (of four commands each) made while the writer writes.
const DUMP_ROUNDS: usize = 6;

/// The child: executes atoms one after another (Sync) until told to stop, printing each
/// acknowledgement; fails loudly on any error, so that a dump that disturbed it shows in its
/// exit status.
#[test]
fn child_writer() {
    let Some(dir) = std::env::var_os(WRITER_ENV) else { return };
    let store = Store::builder(&dir).segment_bytes(64 * 1024).open().expect("the writer opens the store");
    let run = store.create_run(RunSpec::new("live")).expect("create run");
    let mut parents = Vec::new();
    let mut step = 0;
    while !Path::new(&dir).join(STOP_FILE).exists() {
        let executed = store
            .execute(run, "agent", &format!("step-{step}"), &parents, |_| {
                let delta = continuum::synthetic::Transcript::new(step).next_delta(300);
                Ok(AtomOutput { delta, result: step.to_le_bytes().to_vec() })
            })
            .expect("the writer's atom succeeds");
        parents = vec![executed.atom];
        println!("ACK {step}");
        step += 1;
    }
    store.sync().expect("final sync");
    println!("DONE");
}

#[test]
fn dump_runs_against_a_store_a_child_process_is_writing() {
    let Some(binary) = dump_binary() else {
        eprintln!("skipped: the dump example is not built next to this test");
        return;
    };
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "child_writer", "--nocapture", "--test-threads=1"])
        .env(WRITER_ENV, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the writer");
    // Wait until the store exists and the writer is appending.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !dir.path().join("00000000000000000001.seg").exists() {
        assert!(Instant::now() < deadline, "the writer never created the store");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(50));
    for _ in 0..DUMP_ROUNDS {
        assert!(child.try_wait().expect("poll the writer").is_none(), "the writer stopped early");
        for command in [&["summary"][..], &["records", "--json"], &["verify"], &["run", "1"]] {
            let output = Command::new(&binary).arg(dir.path()).args(command).output().expect("run dump");
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert_eq!(output.status.code(), Some(0), "dump {command:?} against a live writer: {stderr}");
            assert!(stderr.is_empty(), "dump {command:?} wrote to stderr: {stderr}");
        }
    }
    std::fs::write(dir.path().join(STOP_FILE), b"").expect("tell the writer to stop");
    let output = child.wait_with_output().expect("the writer finishes");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "the writer failed: {}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("DONE"), "the writer did not finish: {stdout}");
    let acks = stdout.matches("ACK ").count();
    assert!(acks > 0, "the writer acknowledged nothing");
    // Everything the writer acknowledged is there, and the store is clean.
    let store = Store::open_read_only(dir.path()).expect("read-only open after the writer");
    let run = store.run_id("live").expect("the run");
    assert_eq!(store.run_atoms(run).len(), acks);
    drop(store);
    let output = Command::new(&binary).arg(dir.path()).arg("verify").output().expect("run dump verify");
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stdout));
}
