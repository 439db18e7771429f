//! What each durability mode promises across a simulated power loss: Sync appends survive at
//! once, Buffered appends survive once the background flusher has run, None appends survive
//! once `sync()` (or close) ran. Guards the `Durability` docs against drifting from the code.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use continuum::storage::sim::{CrashDamage, DataDamage, DirDamage, SimStorage};
use continuum::{Durability, Log, Lsn};

const POWER_LOSS: CrashDamage = CrashDamage { data: DataDamage::DropUnsynced, dir: DirDamage::ForgetUnsynced };

fn open(sim: &SimStorage) -> Log {
    Log::builder(Path::new(common::DIR))
        .storage(Arc::new(sim.clone()))
        .segment_bytes(1 << 20)
        .flush_interval(Duration::from_millis(5))
        .open()
        .expect("open")
}

fn records_after_power_loss(sim: &SimStorage, log: Log) -> u64 {
    std::mem::forget(log); // the process dies: no close, no final sync
    sim.crash(POWER_LOSS);
    let log = open(sim);
    log.next_lsn().get() - 1
}

#[test]
fn sync_appends_survive_power_loss_immediately() {
    let sim = SimStorage::new(1);
    let log = open(&sim);
    for i in 0..10u64 {
        log.append(&common::payload(i)).expect("append");
    }
    assert_eq!(records_after_power_loss(&sim, log), 10);
}

#[test]
fn buffered_appends_survive_power_loss_after_the_flush_interval() {
    let sim = SimStorage::new(2);
    let log = open(&sim);
    for i in 0..10u64 {
        log.append_with(&common::payload(i), Durability::Buffered).expect("append");
    }
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(records_after_power_loss(&sim, log), 10, "the flusher must have synced");
}

#[test]
fn none_appends_need_an_explicit_sync() {
    let sim = SimStorage::new(3);
    let log = open(&sim);
    for i in 0..10u64 {
        log.append_with(&common::payload(i), Durability::None).expect("append");
    }
    std::thread::sleep(Duration::from_millis(50));
    // No flusher runs for None: the appends are readable but not durable.
    assert!(log.read(Lsn::new(10)).expect("read").is_some());
    assert_eq!(records_after_power_loss(&sim, log), 0);

    let log = open(&sim);
    for i in 0..10u64 {
        log.append_with(&common::payload(i), Durability::None).expect("append");
    }
    log.sync().expect("sync");
    assert_eq!(records_after_power_loss(&sim, log), 10);
}

#[test]
fn close_syncs_what_is_left() {
    let sim = SimStorage::new(4);
    let log = open(&sim);
    log.append_with(b"unsynced", Durability::None).expect("append");
    log.close().expect("close");
    sim.crash(POWER_LOSS);
    assert_eq!(open(&sim).next_lsn(), Lsn::new(2));
}

/// Before a sync, the writer zeroes the segment ahead of its data a chunk at a time, so that
/// the sync does not also convert preallocated extents (docs/ARCHITECTURE.md, "Zeroing ahead").
/// Appends that do not sync write only their frames, and the zeros never cost a record.
#[test]
fn syncing_appends_zero_the_segment_ahead_a_chunk_at_a_time() {
    use continuum::limits::{ZERO_AHEAD_CHUNK_BYTES, ZERO_AHEAD_MARGIN_BYTES};
    let chunk = ZERO_AHEAD_CHUNK_BYTES as u64;
    let sim = SimStorage::new(5);
    let log = Log::builder(Path::new(common::DIR))
        .storage(Arc::new(sim.clone()))
        .segment_bytes(4 * chunk)
        .open()
        .expect("open");
    let record = [7u8; 500];
    let written = |append: &dyn Fn()| {
        let before = sim.bytes_written();
        append();
        sim.bytes_written() - before
    };
    let frame = written(&|| {
        log.append_with(&record, Durability::None).expect("append");
    });
    assert!(frame < 600, "an append that does not sync writes its frame only: {frame} bytes");
    assert_eq!(
        written(&|| {
            log.append(&record).expect("append");
        }),
        frame + chunk,
        "the first sync zeroes a chunk"
    );
    // The next chunk is zeroed, from where the zeros end, when the data comes within the
    // margin of that end. The segment header is 64 bytes.
    let mut data_end = 64 + 2 * frame;
    let mut zeroed_end = data_end + chunk;
    let mut zeroings = 1;
    while zeroings < 3 {
        let bytes = written(&|| {
            log.append(&record).expect("append");
        });
        data_end += frame;
        if zeroed_end - data_end < ZERO_AHEAD_MARGIN_BYTES {
            assert_eq!(bytes, frame + chunk, "zeroing {} at data end {data_end}", zeroings + 1);
            zeroed_end += chunk;
            zeroings += 1;
        } else {
            assert_eq!(bytes, frame, "no zeroing at data end {data_end}");
        }
    }
    let acknowledged = log.next_lsn().get() - 1;
    assert_eq!(records_after_power_loss(&sim, log), acknowledged);
}
