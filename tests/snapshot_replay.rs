//! Snapshots and DAG replay: for random atom DAGs with random deltas, failures and snapshots,
//! the context rebuilt at every atom equals a naive sequential fold from the beginning; a
//! snapshot damaged at any byte is never used (the rebuild falls back and is still right); a
//! crash at any point of publishing a snapshot leaves either no snapshot or a valid one.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use continuum::storage::sim::{CrashDamage, SimStorage};
use continuum::synthetic::SplitMix64;
use continuum::{AtomFailure, AtomId, AtomOutput, Context, Delta, RunSpec, Store};
use proptest::prelude::*;

fn open(sim: &SimStorage) -> Store {
    Store::builder(Path::new("/store")).storage(Arc::new(sim.clone())).segment_bytes(256 * 1024).open().expect("open")
}

/// A plan: for each atom, its parents (indices of earlier atoms), whether it completes, its delta.
#[derive(Debug, Clone)]
struct Plan {
    atoms: Vec<(Vec<usize>, bool, Delta)>,
}

fn plan(seed: u64, count: usize) -> Plan {
    let mut rng = SplitMix64::new(seed);
    let mut transcript = continuum::synthetic::Transcript::new(seed);
    let atoms = (0..count)
        .map(|i| {
            let parents: BTreeSet<usize> =
                (0..rng.below(3)).filter(|_| i > 0).map(|_| rng.below(i as u64) as usize).collect();
            let completes = rng.below(8) != 0;
            let mut delta = transcript.next_delta(200);
            if rng.below(4) == 0 {
                delta.drop_oldest_messages = rng.below(3) as u32;
            }
            if rng.below(5) == 0 {
                delta.summarizations.push(continuum::codec::proto::Summarization {
                    from: rng.below(3) as u32,
                    to: rng.below(6) as u32,
                    role: "system".into(),
                    summary: format!("summary {i}"),
                });
            }
            (parents.into_iter().collect(), completes, delta)
        })
        .collect();
    Plan { atoms }
}

/// Runs the plan; returns the atom ids.
fn run(store: &Store, plan: &Plan) -> Vec<AtomId> {
    let run = store.create_run(RunSpec::new("dag")).expect("run");
    let mut ids: Vec<AtomId> = Vec::new();
    for (i, (parents, completes, delta)) in plan.atoms.iter().enumerate() {
        let parent_ids: Vec<AtomId> = parents.iter().map(|p| ids[*p]).collect();
        let atom =
            store.begin_atom(run, &format!("agent-{}", i % 3), &format!("a{i}"), &parent_ids, "").expect("begin");
        if *completes {
            store.complete_atom(atom, &AtomOutput { delta: delta.clone(), result: Vec::new() }).expect("complete");
        } else {
            store.fail_atom(atom, &AtomFailure { message: "boom".into(), retryable: false }).expect("fail");
        }
        ids.push(atom);
    }
    ids
}

/// The naive fold: every completed ancestor-or-self of atom `i`, in index order, from scratch.
fn naive(plan: &Plan, i: usize) -> Context {
    let mut ancestry = BTreeSet::new();
    let mut stack = vec![i];
    while let Some(a) = stack.pop() {
        if ancestry.insert(a) {
            stack.extend(plan.atoms[a].0.iter().copied());
        }
    }
    let mut context = Context::new();
    for a in ancestry {
        if plan.atoms[a].1 {
            context.apply(&plan.atoms[a].2);
        }
    }
    context
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn rebuilt_context_at_every_atom_equals_the_naive_fold(seed in any::<u64>(), count in 1usize..40, snap_every in 2usize..9) {
        let plan = plan(seed, count);
        let sim = SimStorage::new(seed);
        let store = open(&sim);
        let ids = run(&store, &plan);
        for (i, id) in ids.iter().enumerate() {
            if i % snap_every == 0 && plan.atoms[i].1 {
                store.snapshot_now(*id).expect("snapshot");
            }
        }
        drop(store);
        let store = open(&sim);
        for (i, id) in ids.iter().enumerate() {
            let rebuilt = store.rebuild_context(*id).expect("rebuild");
            prop_assert_eq!(rebuilt.context.encode(), naive(&plan, i).encode(), "atom {}", i);
            prop_assert!(rebuilt.fallbacks.is_empty());
            // Rebuilding twice gives byte-identical contexts.
            prop_assert_eq!(store.rebuild_context(*id).expect("again").context.encode(), rebuilt.context.encode());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]

    /// The same on real files, with small segments: replay then reads sealed segments and the
    /// active one through memory maps (the simulator has no live map), histories long enough
    /// for several decode chunks and for the early dictionary (256 deltas), and every head
    /// rebuilt at once through `rebuild_contexts` agrees with the naive fold too.
    #[test]
    fn on_real_files_every_atom_rebuilds_to_the_naive_fold(seed in any::<u64>(), count in 200usize..700) {
        let plan = plan(seed, count);
        let dir = tempfile::tempdir().expect("tempdir");
        let open_real = || {
            let keep_all = continuum::RetentionPolicy { snapshots_per_agent: usize::MAX, finished_run_age: None };
            Store::builder(dir.path())
                .segment_bytes(32 * 1024)
                .snapshot_policy(continuum::SnapshotPolicy::NEVER)
                .retention(keep_all)
                .background(false)
                .open()
                .expect("open")
        };
        let store = open_real();
        let ids = run(&store, &plan);
        // Before any reopen: the active segment's map was made when it was created, and must
        // show every record appended since.
        for i in (0..ids.len()).rev().step_by(37) {
            prop_assert_eq!(store.rebuild_context(ids[i]).expect("rebuild live").context.encode(), naive(&plan, i).encode(), "atom {} live", i);
        }
        for (i, id) in ids.iter().enumerate() {
            if i % 97 == 5 && plan.atoms[i].1 {
                store.snapshot_now(*id).expect("snapshot");
            }
        }
        drop(store);
        let store = open_real();
        prop_assert!(store.log().segments().len() > 2, "several segments");
        let together = store.rebuild_contexts(&ids);
        for (i, (id, rebuilt)) in ids.iter().zip(together).enumerate() {
            let expected = naive(&plan, i).encode();
            prop_assert_eq!(rebuilt.expect("rebuild together").context.encode(), expected.clone(), "atom {} together", i);
            prop_assert_eq!(store.rebuild_context(*id).expect("rebuild").context.encode(), expected, "atom {}", i);
        }
    }
}

#[test]
fn a_snapshot_damaged_at_any_byte_is_never_used() {
    let plan = plan(7, 12);
    let sim = SimStorage::new(7);
    let store = open(&sim);
    let ids = run(&store, &plan);
    let target = (0..ids.len()).rev().find(|i| plan.atoms[*i].1).expect("a completed atom");
    store.snapshot_now(ids[target]).expect("snapshot");
    let path = Path::new("/store/snapshots").join(format!("{:020}.snap", ids[target].get()));
    let original = sim.file_bytes(&path).expect("snapshot file");
    let expected = naive(&plan, target).encode();
    drop(store);
    let mut cases = 0;
    for (at, byte) in original.iter().enumerate() {
        sim.overwrite(&path, at as u64, &[byte ^ 0x5A]);
        let store = open(&sim);
        let rebuilt = store.rebuild_context(ids[target]).expect("rebuild");
        assert_eq!(rebuilt.snapshot, None, "a snapshot damaged at byte {at} was used");
        assert_eq!(rebuilt.fallbacks.len(), 1, "byte {at}: the fallback is reported");
        assert_eq!(rebuilt.context.encode(), expected, "byte {at}: the rebuilt context is still right");
        drop(store);
        sim.overwrite(&path, at as u64, &[*byte]);
        cases += 1;
    }
    let store = open(&sim);
    assert_eq!(
        store.rebuild_context(ids[target]).expect("rebuild").snapshot,
        Some(ids[target]),
        "the restored snapshot verifies"
    );
    eprintln!("snapshot corruption: {cases} single-byte flips, all refused, all rebuilt correctly");
}

#[test]
fn a_crash_while_publishing_a_snapshot_leaves_none_or_a_valid_one() {
    let plan = plan(9, 10);
    let mut states = 0;
    for crash_at in 0..12 {
        for damage in CrashDamage::ALL {
            let sim = SimStorage::new(crash_at);
            let store = open(&sim);
            let ids = run(&store, &plan);
            let target = (0..ids.len()).rev().find(|i| plan.atoms[*i].1).expect("a completed atom");
            sim.halt_after(crash_at);
            let _ = store.snapshot_now(ids[target]);
            drop(store);
            sim.crash(damage);
            let store = open(&sim);
            let rebuilt = store.rebuild_context(ids[target]).expect("rebuild");
            assert!(rebuilt.fallbacks.is_empty(), "crash at {crash_at} ({damage:?}): a torn snapshot became visible");
            assert_eq!(rebuilt.context.encode(), naive(&plan, target).encode());
            states += 1;
        }
    }
    eprintln!("snapshot publish crash points: {states} states");
}

#[test]
fn a_linear_history_rebuilds_from_its_newest_snapshot_and_travels_back_in_time() {
    let sim = SimStorage::new(3);
    let store = open(&sim);
    let run = store.create_run(RunSpec::new("chain")).expect("run");
    let mut transcript = continuum::synthetic::Transcript::new(3);
    let mut ids = Vec::new();
    let mut expected = Vec::new();
    let mut context = Context::new();
    for i in 0..20 {
        let parents: Vec<AtomId> = ids.last().copied().into_iter().collect();
        let delta = transcript.next_delta(300);
        let atom = store.begin_atom(run, "agent", &format!("s{i}"), &parents, "").expect("begin");
        store.complete_atom(atom, &AtomOutput { delta: delta.clone(), result: Vec::new() }).expect("complete");
        context.apply(&delta);
        expected.push(context.encode());
        ids.push(atom);
    }
    store.snapshot_now(ids[9]).expect("snapshot");
    let head = store.rebuild_context(ids[19]).expect("head");
    assert_eq!(head.snapshot, Some(ids[9]));
    assert_eq!(head.atoms_applied, 10);
    assert_eq!(head.context.encode(), expected[19]);
    let past = store.rebuild_context(ids[4]).expect("time travel");
    assert_eq!(past.snapshot, None, "a later snapshot is not on an earlier atom's ancestry");
    assert_eq!(past.context.encode(), expected[4]);
    assert_eq!(store.snapshots(), vec![ids[9]]);
}
