//! A store whose disk fills up and stays full (the simulated disk's capacity: every write,
//! preallocation or length change past it fails with `ENOSPC` and changes nothing).
//!
//! New work is refused with `Error::NoSpace` (typed, retryable, never `Poisoned`), while what
//! was acknowledged stays readable and rebuildable. The records that let space be freed (a run
//! finished, then dropped by retention) still fit: every segment keeps a reserve at its end
//! that other appends leave free; the compaction round that drops the run first deletes its
//! snapshot files, then rewrites the segments it shared with a live run into that room. Once
//! retention has freed space, agents go on; after a power loss, with the disk still capped, the
//! store opens whole. A dropped run without snapshots frees no room before the rewrites: on a
//! disk without a free byte only a ballast (`StoreBuilder::ballast_bytes`) gets them going.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use continuum::storage::sim::{CrashDamage, SimStorage};
use continuum::synthetic::Transcript;
use continuum::{AtomId, AtomOutput, CompactionPolicy, Error, RetentionPolicy, RunId, RunSpec, SnapshotPolicy, Store};

const SEGMENT_BYTES: u64 = 16 * 1024;

fn open(sim: &SimStorage) -> continuum::Result<Store> {
    Store::builder(Path::new("/store"))
        .storage(Arc::new(sim.process()))
        .segment_bytes(SEGMENT_BYTES)
        .snapshot_policy(SnapshotPolicy { every_atoms: 5, every: Duration::ZERO })
        .retention(RetentionPolicy { snapshots_per_agent: 2, finished_run_age: Some(Duration::ZERO) })
        .compaction(CompactionPolicy { interval: None, ..CompactionPolicy::default() })
        .index_snapshot_after(u64::MAX)
        .background(false)
        .open()
}

fn output(n: u64) -> AtomOutput {
    AtomOutput { delta: Transcript::new(n).next_delta(300), result: n.to_le_bytes().to_vec() }
}

/// The atoms acknowledged so far, with the results they were given.
#[derive(Default)]
struct Acked {
    atoms: Vec<(AtomId, Vec<u8>)>,
    next: u64,
}

impl Acked {
    /// Records the next atom of a chain in `run`; returns the store's answer.
    fn record(&mut self, store: &Store, run: RunId) -> continuum::Result<AtomId> {
        let parents: Vec<AtomId> = self.atoms.last().map(|(atom, _)| *atom).into_iter().collect();
        let output = output(self.next);
        let atom = store.record_atom(run, "agent", &format!("step-{}", self.next), &parents, "", &output)?;
        self.next += 1;
        self.atoms.push((atom, output.result));
        Ok(atom)
    }

    /// Every acknowledged atom is there, completed with its result, and the last one's context
    /// rebuilds.
    fn check(&self, store: &Store, context: &str) {
        for (atom, result) in &self.atoms {
            let found = store.atom(*atom).unwrap_or_else(|e| panic!("{context}: atom {atom}: {e}"));
            assert_eq!(found.output.map(|o| o.result).as_ref(), Some(result), "{context}: atom {atom}");
        }
        if let Some((last, _)) = self.atoms.last() {
            store.rebuild_context(*last).unwrap_or_else(|e| panic!("{context}: rebuild {last}: {e}"));
        }
    }
}

fn no_space<T: std::fmt::Debug>(result: continuum::Result<T>, what: &str) {
    assert!(matches!(result, Err(Error::NoSpace { .. })), "{what}: {result:?}");
}

/// Fills the disk: an old run (not finished) and a live one, their atoms interleaved (so that
/// dropping the old run leaves every segment partly live), then the live run's atoms until the
/// disk is too full for the next segment, then small records until even they no longer fit
/// before the segment's reserve.
fn fill(sim: &SimStorage, store: &Store) -> (RunId, RunId, Acked) {
    let old = store.create_run(RunSpec::new("old")).expect("run");
    let live = store.create_run(RunSpec::new("live")).expect("run");
    let mut history = Acked::default();
    let mut acked = Acked { next: 1_000, ..Acked::default() };
    for _ in 0..60 {
        history.record(store, old).expect("old atom");
        acked.record(store, live).expect("live atom");
    }
    sim.set_capacity(Some(sim.used_bytes() + 3 * SEGMENT_BYTES));
    let full = loop {
        if let Err(error) = acked.record(store, live) {
            break error;
        }
        assert!(acked.atoms.len() < 1_000, "the disk never filled");
    };
    assert!(matches!(full, Error::NoSpace { .. }), "{full:?}");
    assert!(acked.atoms.len() > 70, "{} atoms before the disk was full", acked.atoms.len());
    let mut fillers = 0;
    while store.create_run(RunSpec::new(format!("filler-{fillers}"))).is_ok() {
        fillers += 1;
        assert!(fillers < 1_000, "small records never filled the segment");
    }
    (old, live, acked)
}

#[test]
fn a_full_disk_refuses_new_work_and_still_lets_retention_free_space() {
    for (case, damage) in CrashDamage::ALL.iter().enumerate() {
        let context = format!("case {case} ({damage:?})");
        let sim = SimStorage::new(case as u64);
        let store = open(&sim).expect("open");
        let (old, live, mut acked) = fill(&sim, &store);
        // Another process takes the last free bytes.
        sim.set_capacity(Some(sim.used_bytes()));

        // Full: new work is refused with a typed error, again and again, and nothing is lost.
        for _ in 0..3 {
            no_space(acked.record(&store, live), "an atom on a full disk");
            no_space(store.create_run(RunSpec::new("another")), "a run on a full disk");
        }
        acked.check(&store, &context);

        // Finishing the old run and dropping it fit in the reserve and free its space: the drop
        // deletes the run's snapshot files before the round rewrites the segments it shared
        // with the live run, so the rewrites find room even on a disk without a free byte.
        store.finish_run(old, true, "done").unwrap_or_else(|e| panic!("{context}: finish on a full disk: {e}"));
        std::thread::sleep(Duration::from_micros(2));
        let used = sim.used_bytes();
        let report = store.compact().unwrap_or_else(|e| panic!("{context}: compact on a full disk: {e}"));
        assert_eq!(report.runs_dropped, 1, "{context}");
        assert!(sim.used_bytes() + 2 * SEGMENT_BYTES < used, "{context}: {used} -> {} bytes", sim.used_bytes());
        assert!(store.run_id("old").is_none(), "{context}");

        // The agent goes on: into a new segment, and past it.
        for _ in 0..30 {
            acked.record(&store, live).unwrap_or_else(|e| panic!("{context}: after space was freed: {e}"));
        }
        acked.check(&store, &context);

        // A power loss, with the disk still capped: the store opens whole and goes on.
        sim.crash(*damage);
        drop(store);
        let store = open(&sim).unwrap_or_else(|e| panic!("{context}: reopen: {e}"));
        acked.check(&store, &format!("{context}, reopened"));
        assert!(store.run_id("old").is_none(), "{context}: the dropped run came back");
        acked.record(&store, live).unwrap_or_else(|e| panic!("{context}: after the reopen: {e}"));
    }
}

#[test]
fn the_reserve_is_for_freeing_space_only_and_runs_out_with_a_typed_error() {
    let sim = SimStorage::new(7);
    let store = open(&sim).expect("open");
    let pending: Vec<RunId> =
        (0..100).map(|n| store.create_run(RunSpec::new(format!("pending-{n}"))).expect("run")).collect();
    let (_, live, mut acked) = fill(&sim, &store);
    // Runs finished one after another use the reserve up; then they too are refused.
    let mut finished = 0;
    let refused = loop {
        let Some(run) = pending.get(finished) else { panic!("the reserve never ran out") };
        if let Err(error) = store.finish_run(*run, true, "") {
            break error;
        }
        finished += 1;
    };
    assert!(matches!(refused, Error::NoSpace { .. }), "{refused:?}");
    assert!(finished >= 5, "the reserve held {finished} finished runs");
    no_space(acked.record(&store, live), "an atom once the reserve is used up");
    acked.check(&store, "reserve used up");
    // Nothing freed space, and nothing can: the store stays readable, and reopens whole.
    sim.crash(CrashDamage::ALL[0]);
    drop(store);
    let store = open(&sim).expect("reopen");
    acked.check(&store, "reopened");
    for (n, run) in pending.iter().enumerate() {
        let status = store.run_status(*run).expect("a run");
        assert_eq!(status == continuum::RunStatus::Running, n >= finished, "pending-{n}: {status:?}");
    }
}

#[test]
fn a_ballast_lets_retention_free_space_when_not_a_byte_is_left() {
    // The dropped run has no snapshots, so deleting them frees nothing: on a disk without a
    // free byte, the round's rewrites of the segments it shared with the live run need room
    // only the ballast can give.
    for ballast in [0, SEGMENT_BYTES] {
        let context = format!("ballast of {ballast} bytes");
        let sim = SimStorage::new(21);
        let open = |sim: &SimStorage| {
            Store::builder(Path::new("/store"))
                .storage(Arc::new(sim.process()))
                .segment_bytes(SEGMENT_BYTES)
                .snapshot_policy(SnapshotPolicy::NEVER)
                .retention(RetentionPolicy { snapshots_per_agent: 2, finished_run_age: Some(Duration::ZERO) })
                .compaction(CompactionPolicy { interval: None, ..CompactionPolicy::default() })
                .index_snapshot_after(u64::MAX)
                .ballast_bytes(ballast)
                .background(false)
                .open()
        };
        let ballast_len =
            |sim: &SimStorage| sim.file_bytes(Path::new("/store/ballast")).map(|bytes| bytes.len() as u64);
        let store = open(&sim).expect("open");
        assert_eq!(ballast_len(&sim), (ballast > 0).then_some(ballast), "{context}: set aside at open");
        let (old, live, mut acked) = fill(&sim, &store);
        sim.set_capacity(Some(sim.used_bytes()));
        store.finish_run(old, true, "").unwrap_or_else(|e| panic!("{context}: finish: {e}"));
        std::thread::sleep(Duration::from_micros(2));
        let round = store.compact();
        if ballast == 0 {
            // Stuck until space is freed outside, with a typed error and nothing lost.
            no_space(round, "a round without a ballast");
            no_space(store.compact(), "the next round without a ballast");
            no_space(acked.record(&store, live), "an atom");
            acked.check(&store, &context);
            continue;
        }
        let report = round.unwrap_or_else(|e| panic!("{context}: the round: {e}"));
        assert_eq!(report.runs_dropped, 1, "{context}: {report:?}");
        assert!(report.segments_rewritten > 0, "{context}: {report:?}");
        assert_eq!(ballast_len(&sim), None, "{context}: given back");
        for _ in 0..20 {
            acked.record(&store, live).unwrap_or_else(|e| panic!("{context}: after the round: {e}"));
        }
        acked.check(&store, &context);
        // A power loss; the next open sets the ballast aside again once there is room.
        sim.crash(CrashDamage::ALL[0]);
        drop(store);
        sim.set_capacity(None);
        let store = open(&sim).unwrap_or_else(|e| panic!("{context}: reopen: {e}"));
        assert_eq!(ballast_len(&sim), Some(ballast), "{context}: set aside again");
        acked.check(&store, &format!("{context}, reopened"));
        assert!(store.run_id("old").is_none(), "{context}: the dropped run came back");
    }
}
