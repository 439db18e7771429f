//! `Durability::Buffered` and `None` promise that an acknowledged append survives a process
//! crash. On the real file system their appends are copies into a writable shared map of the
//! segment (no `write` call), so this test kills a child that appends that way with SIGKILL and
//! checks that every acknowledged record is in the reopened log, byte for byte.

mod common;

use std::io::Write;
use std::time::Duration;

use continuum::{Durability, Log, Lsn};

const CHILD_ENV: &str = "CONTINUUM_BUFFERED_CHILD_DIR";

fn payload(i: u64) -> Vec<u8> {
    format!("buffered record {i} ").repeat(1 + (i % 40) as usize).into_bytes()
}

#[test]
fn buffered_child() {
    let Ok(dir) = std::env::var(CHILD_ENV) else { return };
    let log = Log::builder(&dir).segment_bytes(256 * 1024).durability(Durability::Buffered).open().expect("child open");
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out);
    let start = log.next_lsn().get();
    for i in 0.. {
        let durability = if i % 2 == 0 { Durability::Buffered } else { Durability::None };
        let lsn = log.append_with(&payload(start + i), durability).expect("append");
        assert_eq!(lsn.get(), start + i);
        let _ = writeln!(out, "ACK {}", lsn.get());
        let _ = out.flush();
    }
}

#[test]
fn sigkill_keeps_every_acknowledged_buffered_append() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut acknowledged = 0u64;
    for round in 0..6u64 {
        let delay = Duration::from_millis(150 + 60 * round);
        let lines = common::run_child_until_killed("buffered_child", CHILD_ENV, dir.path(), delay);
        let acks: Vec<u64> = lines.iter().filter_map(|l| l.strip_prefix("ACK ")?.parse().ok()).collect();
        acknowledged = acknowledged.max(acks.iter().copied().max().unwrap_or(0));
        let log = Log::builder(dir.path()).segment_bytes(256 * 1024).open().expect("reopen");
        assert!(log.next_lsn().get() > acknowledged, "round {round}: acknowledged LSN {acknowledged} is missing");
        for (i, item) in log.iter_from(Lsn::FIRST).expect("iter").enumerate() {
            let (lsn, bytes) = item.expect("record");
            assert_eq!(lsn.get(), i as u64 + 1);
            assert_eq!(bytes.as_ref(), payload(lsn.get()).as_slice(), "round {round}: record {lsn} changed");
        }
    }
    assert!(acknowledged > 1000, "the child must have appended for real ({acknowledged})");
    eprintln!("6 SIGKILLs of a Buffered/None appender: {acknowledged} acknowledged records, all recovered");
}
