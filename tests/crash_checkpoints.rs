//! Run checkpoints across crashes, on the simulator: a writer interleaves atoms and
//! checkpoints, and the process is crashed after every single I/O call (three kinds of
//! damage), then reopened. A checkpoint acknowledged before the crash is there, whole; one not
//! acknowledged is whole or absent; the sequences present are 1..=k with k at least every
//! acknowledged one; and a writer after the crash never reuses an acknowledged sequence. The
//! second test runs with buffered atom durability, where a checkpoint must still be durable
//! when `write_checkpoint` returns (a checkpoint acknowledged from an unsynced batch would be
//! lost by the crash).

use std::cell::RefCell;
use std::path::Path;
use std::sync::Arc;

use continuum::checkpoint::CheckpointDraft;
use continuum::storage::sim::{CrashDamage, SimStorage};
use continuum::synthetic::Transcript;
use continuum::{AtomOutput, Durability, Error, RunSpec, Store};

const CHECKPOINTS: u64 = 6;

fn open(sim: &SimStorage, durability: Durability) -> continuum::Result<Store> {
    Store::builder(Path::new("/store"))
        .storage(Arc::new(sim.clone()))
        .segment_bytes(8 * 1024)
        .atom_durability(durability)
        .background(false)
        .open()
}

/// Writes atoms and checkpoints 1..=CHECKPOINTS (each at position `p<sequence>`), noting each
/// acknowledged sequence; stops at the first error.
fn write(store: &Store, acknowledged: &RefCell<Vec<u64>>) -> continuum::Result<()> {
    let run = store.create_run(RunSpec::new("crashy").pipeline("p", "1"))?;
    let next = store.load_latest_checkpoint(run)?.map_or(1, |c| c.sequence + 1);
    for sequence in next..=CHECKPOINTS {
        let output = AtomOutput { delta: Transcript::new(sequence).next_delta(200), result: Vec::new() };
        let key = format!("step-{sequence}");
        // The crash may have come between the step and its checkpoint.
        if store.atom_by_key(run, "worker", &key)?.is_none() {
            store.record_atom(run, "worker", &key, &[], "", &output)?;
        }
        let draft = CheckpointDraft::at("worker", format!("p{sequence}")).shared("n", sequence.to_le_bytes().to_vec());
        let written = store.write_checkpoint(run, draft)?;
        assert_eq!(written, sequence);
        acknowledged.borrow_mut().push(written);
    }
    Ok(())
}

/// Checks what a reopened store holds against what was acknowledged before the crash.
fn check(store: &Store, acknowledged: &[u64], context: &str) {
    let Some(run) = store.run_id("crashy") else {
        assert!(acknowledged.is_empty(), "{context}: the run is gone");
        return;
    };
    let present = store.checkpoints(run, usize::MAX).unwrap_or_else(|e| panic!("{context}: list: {e}"));
    let sequences: Vec<u64> = present.iter().rev().map(|c| c.sequence).collect();
    assert_eq!(sequences, (1..=sequences.len() as u64).collect::<Vec<_>>(), "{context}: not a prefix");
    for checkpoint in &present {
        let n = checkpoint.sequence.to_le_bytes().to_vec();
        assert_eq!(checkpoint.position, format!("p{}", checkpoint.sequence), "{context}: torn checkpoint");
        assert_eq!(checkpoint.shared_context.get("n"), Some(&n), "{context}: torn checkpoint");
        store.rebuild_context(checkpoint.agent_heads["worker"]).unwrap_or_else(|e| panic!("{context}: head: {e}"));
    }
    let newest = sequences.last().copied().unwrap_or(0);
    for sequence in acknowledged {
        assert!(*sequence <= newest, "{context}: acknowledged checkpoint {sequence} lost");
        let refused = store.write_checkpoint(run, CheckpointDraft::default().sequence(*sequence));
        assert!(matches!(refused, Err(Error::StaleCheckpoint { .. })), "{context}: {sequence} reused: {refused:?}");
    }
}

fn crash_everywhere(durability: Durability) -> u64 {
    let sim = SimStorage::new(0);
    let store = open(&sim, durability).expect("open");
    let before = sim.op_count();
    write(&store, &RefCell::new(Vec::new())).expect("clean run");
    drop(store);
    let total = sim.op_count() - before;
    let mut states = 0;
    for crash_at in 0..=total {
        for damage in [CrashDamage::ALL[0], CrashDamage::ALL[4], CrashDamage::ALL[8]] {
            let context = format!("crash at {crash_at} ({damage:?}, {durability:?})");
            let sim = SimStorage::new(crash_at);
            let store = open(&sim, durability).expect("open");
            sim.halt_after(crash_at);
            let acknowledged = RefCell::new(Vec::new());
            let _ = write(&store, &acknowledged);
            drop(store);
            sim.crash(damage);
            let store = open(&sim, durability).unwrap_or_else(|e| panic!("{context}: reopen: {e}"));
            check(&store, &acknowledged.borrow(), &context);
            // The writer resumes after the newest checkpoint and finishes.
            write(&store, &RefCell::new(Vec::new())).unwrap_or_else(|e| panic!("{context}: resume: {e}"));
            let run = store.run_id("crashy").expect("run");
            assert_eq!(store.checkpoints(run, usize::MAX).expect("list").len() as u64, CHECKPOINTS, "{context}");
            states += 1;
        }
    }
    states
}

#[test]
fn acknowledged_checkpoints_survive_every_crash_point() {
    let states = crash_everywhere(Durability::Sync);
    eprintln!("checkpoint crash points: {states} crash states checked");
}

#[test]
fn checkpoints_are_durable_on_return_under_buffered_atoms() {
    let states = crash_everywhere(Durability::Buffered);
    eprintln!("checkpoint crash points (buffered atoms): {states} crash states checked");
}
