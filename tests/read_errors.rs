//! Read errors are typed errors, never a signal. A read of a memory map whose page the disk
//! cannot deliver (an `EIO`), or which lies past the end of a file cut short under the map,
//! raises `SIGBUS` and kills the process wherever the page is touched. Segments are read with
//! positioned reads, so the same failures are an `Error::Io` of the call that read: recovery
//! and `dump verify` report them, a reader gets them, and the log goes on (a failed read
//! changes nothing on disk).
//!
//! The real-file test cuts a sealed segment short under an open log, which through a map was a
//! `SIGBUS`; it runs the reads in a child process (this test binary, re-run with
//! [`CHILD_DIR_ENV`] set), so that a signal fails the test instead of killing the test binary.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use continuum::storage::sim::{Fault, FaultKind, Op, SimStorage};
use continuum::{Error, Log, Lsn};

/// Store directory of the child; set only in the child.
const CHILD_DIR_ENV: &str = "CONTINUUM_READ_ERROR_CHILD_DIR";
/// What the child prints once every read failed with a typed error.
const CHILD_DONE: &str = "READS FAILED WITH TYPED ERRORS";

const SEGMENT_BYTES: u64 = 64 * 1024;

/// Fills several segments; returns the LSN of a record in the first, sealed one.
fn fill(log: &Log) -> Lsn {
    for i in 0..300u64 {
        log.append(&[i as u8; 1000]).expect("append");
    }
    assert!(log.segments().len() > 3, "sealed segments to read");
    Lsn::new(40)
}

fn is_read_error(error: &Error) -> bool {
    matches!(error, Error::Io { op: "read", .. })
}

#[test]
fn a_failed_read_of_a_sealed_segment_is_an_io_error() {
    let sim = SimStorage::new(1);
    let log = common::open(&sim, SEGMENT_BYTES).expect("open");
    let lsn = fill(&log);
    sim.inject(Fault { op: Some(Op::Read), nth: 1, kind: FaultKind::Eio });
    let error = log.read(lsn).expect_err("the read failed");
    assert!(is_read_error(&error), "{error:?}");
    // Nothing changed: the next read, and appends, go on.
    assert_eq!(log.read(lsn).expect("read").expect("record").as_ref(), &[39u8; 1000]);
    log.append(b"after").expect("append after a failed read");
}

#[test]
fn a_failed_read_during_recovery_fails_the_open_with_an_io_error() {
    let sim = SimStorage::new(2);
    let log = common::open(&sim, SEGMENT_BYTES).expect("open");
    fill(&log);
    log.close().expect("close");
    sim.inject(Fault { op: Some(Op::Read), nth: 2, kind: FaultKind::Eio });
    let error = common::open(&sim, SEGMENT_BYTES).expect_err("the open failed");
    assert!(is_read_error(&error), "{error:?}");
    let log = common::open(&sim, SEGMENT_BYTES).expect("the next open reads everything");
    assert_eq!(log.next_lsn(), Lsn::new(301));
}

#[test]
fn a_failed_read_fails_verify_with_an_io_error() {
    let sim = SimStorage::new(3);
    let log = common::open(&sim, SEGMENT_BYTES).expect("open");
    fill(&log);
    log.close().expect("close");
    let storage: Arc<dyn continuum::storage::Storage> = Arc::new(sim.clone());
    let verify = |storage| continuum::inspect::verify_with(storage, Path::new(common::DIR), &mut |_, _| {});
    verify(Arc::clone(&storage)).expect("a clean store verifies");
    sim.inject(Fault { op: Some(Op::Read), nth: 1, kind: FaultKind::Eio });
    let error = verify(storage).expect_err("the read failed");
    assert!(is_read_error(&error), "{error:?}");
}

/// On real files: a sealed segment is cut short under the open log (as a failing disk or
/// another program might leave it), then read. Every read fails with `Error::Io`.
#[test]
fn a_segment_cut_short_under_the_reader_is_an_error_not_a_sigbus() {
    let dir = tempfile::tempdir().expect("tempdir");
    let output = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "read_error_child", "--nocapture", "--test-threads=1"])
        .env(CHILD_DIR_ENV, dir.path())
        .output()
        .expect("run the child");
    let stdout = String::from_utf8_lossy(&output.stdout);
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert_ne!(output.status.signal(), Some(7), "the child died of SIGBUS:\n{stdout}");
    }
    assert!(output.status.success(), "the child failed ({:?}):\n{stdout}", output.status);
    assert!(stdout.contains(CHILD_DONE), "the child did not finish its reads:\n{stdout}");
}

/// The child of [`a_segment_cut_short_under_the_reader_is_an_error_not_a_sigbus`]; does nothing
/// unless [`CHILD_DIR_ENV`] is set.
#[test]
fn read_error_child() {
    let Some(dir) = std::env::var_os(CHILD_DIR_ENV) else { return };
    let log = Log::builder(Path::new(&dir)).segment_bytes(SEGMENT_BYTES).open().expect("open");
    let lsn = fill(&log);
    let first = log.segments()[0].path.clone();
    std::fs::OpenOptions::new().write(true).open(&first).expect("open the segment").set_len(4096).expect("cut");
    let error = log.read(lsn).expect_err("the record's bytes are gone");
    assert!(is_read_error(&error), "{error:?}");
    let error = log.iter_from(Lsn::FIRST).expect("iter").find_map(Result::err).expect("a failed read");
    assert!(is_read_error(&error), "{error:?}");
    log.append(b"after").expect("the log goes on");
    println!("{CHILD_DONE}");
}
