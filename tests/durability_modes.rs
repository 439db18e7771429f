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
