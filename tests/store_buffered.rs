//! A store whose atoms end with `Durability::Buffered` (`StoreBuilder::atom_durability`):
//! an atom's call returns before its records are synced, and a power loss may take back the
//! atoms ended since the last sync, but only as a suffix of the history, never one a sync
//! (`Store::sync`, the background flusher, a snapshot, a guarded effect) made durable, and
//! nothing on disk ever refers to an atom that was taken back: after the crash the agents go
//! on, and every context rebuilds to exactly the deltas of the atoms that are there.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use continuum::storage::sim::{CrashDamage, DataDamage, DirDamage, SimStorage};
use continuum::synthetic::Transcript;
use continuum::{AtomId, AtomOutput, Context, Durability, Error, RunId, RunSpec, SnapshotPolicy, Store};

const DROP_UNSYNCED: CrashDamage = CrashDamage { data: DataDamage::DropUnsynced, dir: DirDamage::ForgetUnsynced };

fn open(sim: &SimStorage, flush_interval: Duration, snapshots: SnapshotPolicy) -> Store {
    Store::builder(Path::new("/store"))
        .storage(Arc::new(sim.process()))
        .segment_bytes(64 * 1024)
        .atom_durability(Durability::Buffered)
        .flush_interval(flush_interval)
        .snapshot_policy(snapshots)
        .index_snapshot_after(u64::MAX)
        .background(false)
        .open()
        .expect("open")
}

/// Opens with no timed flush and no policy snapshots: only what the test syncs is synced.
fn open_quiet(sim: &SimStorage) -> Store {
    open(sim, Duration::from_secs(3600), SnapshotPolicy::NEVER)
}

fn output(n: u64) -> AtomOutput {
    AtomOutput { delta: Transcript::new(n).next_delta(300), result: n.to_le_bytes().to_vec() }
}

/// One agent's chain of atoms, as the test made them: `(atom, n)` with `output(n)` its output.
#[derive(Default)]
struct Chain {
    atoms: Vec<(AtomId, u64)>,
    next: u64,
}

impl Chain {
    fn record(&mut self, store: &Store, run: RunId) -> AtomId {
        let parents: Vec<AtomId> = self.atoms.last().map(|(atom, _)| *atom).into_iter().collect();
        let n = self.next;
        let atom = store.record_atom(run, "agent", &format!("step-{n}"), &parents, "", &output(n)).expect("record");
        self.next += 1;
        self.atoms.push((atom, n));
        atom
    }

    /// After a crash: the atoms the store still has are a prefix of the chain holding at least
    /// its first `durable` atoms, each completed with its own output; the chain is cut to them.
    /// Returns how many survived.
    fn survivors(&mut self, store: &Store, run: RunId, durable: usize, context: &str) -> usize {
        let kept = self
            .atoms
            .iter()
            .take_while(|(atom, n)| match store.atom(*atom) {
                Ok(found) => {
                    assert_eq!(found.key, format!("step-{n}"), "{context}: atom {atom} is another atom");
                    true
                }
                Err(Error::UnknownAtom { .. }) => false,
                Err(error) => panic!("{context}: atom {atom}: {error}"),
            })
            .count();
        assert!(kept >= durable, "{context}: {kept} atoms survived, {durable} were synced");
        for (atom, n) in &self.atoms[..kept] {
            let found = store.atom(*atom).expect("atom");
            assert_eq!(found.output.map(|o| o.result), Some(output(*n).result), "{context}: atom {atom} completed");
        }
        for (atom, n) in &self.atoms[kept..] {
            if let Ok(found) = store.atom(*atom) {
                assert_ne!(found.key, format!("step-{n}"), "{context}: atom {atom} survived after a lost one");
            }
        }
        self.atoms.truncate(kept);
        self.next = self.atoms.last().map_or(0, |(_, n)| n + 1);
        assert_eq!(store.last_agent_atom(run, "agent"), self.atoms.last().map(|(atom, _)| *atom), "{context}");
        kept
    }

    /// The newest atom's context rebuilds to exactly the chain's deltas.
    fn check_context(&self, store: &Store, context: &str) {
        let Some((last, _)) = self.atoms.last() else { return };
        let mut want = Context::new();
        for (_, n) in &self.atoms {
            want.apply(&output(*n).delta);
        }
        let rebuilt = store.rebuild_context(*last).unwrap_or_else(|e| panic!("{context}: rebuild: {e}"));
        assert!(
            rebuilt.context == want,
            "{context}: the context of {last} is not the chain's (from {:?})",
            rebuilt.snapshot
        );
    }
}

/// Atoms ended after the last `Store::sync` are lost by a power loss that drops every unsynced
/// write (they really were not synced), and with every other damage they survive at most as a
/// prefix; the synced ones always survive. The agent goes on, reusing the lost atoms' ids.
#[test]
fn buffered_atoms_are_lost_only_after_the_last_sync_and_only_as_a_suffix() {
    for (case, damage) in CrashDamage::ALL.iter().enumerate() {
        let context = format!("{damage:?}");
        let sim = SimStorage::new(case as u64 + 1);
        let store = open_quiet(&sim);
        let run = store.create_run(RunSpec::new("run")).expect("run");
        let mut chain = Chain::default();
        for _ in 0..20 {
            chain.record(&store, run);
        }
        store.sync().expect("sync");
        for _ in 0..15 {
            chain.record(&store, run);
        }
        sim.crash(*damage);
        drop(store);
        let store = open_quiet(&sim);
        let kept = chain.survivors(&store, run, 20, &context);
        if *damage == DROP_UNSYNCED {
            assert_eq!(kept, 20, "{context}: atoms after the sync were not buffered");
        }
        chain.check_context(&store, &context);
        for _ in 0..10 {
            chain.record(&store, run);
        }
        chain.check_context(&store, &format!("{context}, going on"));
        store.close().expect("close");
        let store = open_quiet(&sim);
        chain.survivors(&store, run, chain.atoms.len(), &format!("{context}, closed and reopened"));
        chain.check_context(&store, &format!("{context}, closed and reopened"));
    }
}

/// A snapshot syncs the log before it is written: after a power loss its atom is there, and the
/// atoms that reuse the ids of lost ones never rebuild from a snapshot of another atom.
#[test]
fn a_snapshot_never_refers_to_an_atom_a_crash_took_back() {
    // Explicit snapshots, and policy snapshots (every 4 atoms, written by the completing thread).
    for policy in [SnapshotPolicy::NEVER, SnapshotPolicy { every_atoms: 4, every: Duration::ZERO }] {
        let context = format!("{policy:?}");
        let sim = SimStorage::new(7);
        let store = open(&sim, Duration::from_secs(3600), policy);
        let run = store.create_run(RunSpec::new("run")).expect("run");
        let mut chain = Chain::default();
        for _ in 0..10 {
            chain.record(&store, run);
        }
        let snapshotted = chain.atoms[9].0;
        if policy == SnapshotPolicy::NEVER {
            store.snapshot_now(snapshotted).expect("snapshot");
        }
        for _ in 0..3 {
            chain.record(&store, run);
        }
        assert!(!store.snapshots().is_empty(), "{context}: a snapshot was written");
        sim.crash(DROP_UNSYNCED);
        drop(store);
        let store = open(&sim, Duration::from_secs(3600), policy);
        let kept = chain.survivors(&store, run, 0, &context);
        for snapshot in store.snapshots() {
            let found = store.atom(snapshot).unwrap_or_else(|e| panic!("{context}: snapshot of {snapshot}: {e}"));
            assert!(chain.atoms.iter().any(|(atom, n)| *atom == snapshot && found.key == format!("step-{n}")));
        }
        if policy == SnapshotPolicy::NEVER {
            assert!(kept >= 10, "{context}: the snapshot's atom was lost ({kept} atoms kept)");
        }
        // New atoms take the lost atoms' ids; each rebuilds to its own chain.
        for _ in 0..8 {
            chain.record(&store, run);
            chain.check_context(&store, &format!("{context}, going on"));
        }
    }
}

/// The background flusher syncs buffered atoms on its own, every `flush_interval`.
#[test]
fn the_flusher_makes_buffered_atoms_durable() {
    let sim = SimStorage::new(3);
    let store = open(&sim, Duration::from_millis(10), SnapshotPolicy::NEVER);
    let run = store.create_run(RunSpec::new("run")).expect("run");
    let mut chain = Chain::default();
    for _ in 0..12 {
        chain.record(&store, run);
    }
    std::thread::sleep(Duration::from_millis(300));
    sim.crash(DROP_UNSYNCED);
    drop(store);
    let store = open_quiet(&sim);
    assert_eq!(chain.survivors(&store, run, 12, "flushed"), 12);
    chain.check_context(&store, "flushed");
}

/// A guarded effect is synced before it runs: when a power loss takes back the atom's
/// completion, `execute` runs the atom again and the effect returns its recorded result
/// instead of running twice.
#[test]
fn a_rerun_atom_does_not_repeat_its_guarded_effect() {
    let sim = SimStorage::new(5);
    let store = open_quiet(&sim);
    let run = store.create_run(RunSpec::new("run")).expect("run");
    let sent = std::cell::Cell::new(0);
    let step = |store: &Store| {
        store
            .execute(run, "agent", "send-mail", &[], |atom| {
                let receipt = store
                    .guarded(atom, "send", |_| {
                        sent.set(sent.get() + 1);
                        Ok(b"receipt-1".to_vec())
                    })
                    .expect("guarded");
                Ok(AtomOutput { delta: Transcript::new(1).next_delta(200), result: receipt })
            })
            .expect("execute")
    };
    let first = step(&store);
    assert!(!first.replayed);
    sim.crash(DROP_UNSYNCED);
    drop(store);
    let store = open_quiet(&sim);
    let found = store.atom(first.atom).expect("the atom's start was synced with its guard");
    assert_eq!(found.status, continuum::AtomStatus::Running, "its completion was buffered, and lost");
    let again = step(&store);
    assert_eq!((again.atom, again.replayed, again.output.result.as_slice()), (first.atom, false, &b"receipt-1"[..]));
    assert_eq!(sent.get(), 1, "the effect ran once");
    store.sync().expect("sync");
    sim.crash(DROP_UNSYNCED);
    drop(store);
    let store = open_quiet(&sim);
    assert!(step(&store).replayed, "synced, the atom is not run again");
    assert_eq!(sent.get(), 1);
}
