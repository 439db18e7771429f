//! Files that must belong to their store and generation (invariant 10). A snapshot copied in
//! from another store was used as this store's: `rebuild_context` returned the other store's
//! context. Records lost from the end of the log (the last segment replaced by an older copy
//! of itself) went unreported although the index snapshot and a snapshot, both written only
//! once the log was synced through them, showed that they had existed.

use std::path::{Path, PathBuf};

use continuum::{AtomId, AtomOutput, Error, LossEvidence, RecoveryMode, RunSpec, SnapshotPolicy, Store, StoreBuilder};

fn builder(dir: &Path) -> StoreBuilder {
    Store::builder(dir)
        .segment_bytes(1 << 20)
        .snapshot_policy(SnapshotPolicy::NEVER)
        .background(false)
        .index_snapshot_after(u64::MAX)
}

/// `count` atoms of agent "agent" in run "r", each the child of the one before; their ids.
fn atoms(store: &Store, count: usize, seed: u64) -> Vec<AtomId> {
    let run = match store.run_id("r") {
        Some(run) => run,
        None => store.create_run(RunSpec::new("r")).expect("run"),
    };
    let mut transcript = continuum::synthetic::Transcript::new(seed);
    let mut ids = Vec::new();
    for i in 0..count {
        let parents: Vec<_> = store.agent_atoms(run, "agent").last().copied().into_iter().collect();
        let atom = store.begin_atom(run, "agent", &format!("{seed}-{i}"), &parents, "").expect("begin");
        store
            .complete_atom(atom, &AtomOutput { delta: transcript.next_delta(300), result: vec![1] })
            .expect("complete");
        ids.push(atom);
    }
    ids
}

/// The log's files (its segments and its manifest), each with its bytes: restoring an older copy
/// of all of them leaves a log that is whole by its own account, so that only the store's files
/// witness what it lost.
fn segment_files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("list")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| {
            path.extension().is_some_and(|ext| ext == "seg")
                || path.file_name().is_some_and(|name| name == "log.manifest")
        })
        .map(|path| {
            let bytes = std::fs::read(&path).expect("read segment");
            (path, bytes)
        })
        .collect();
    files.sort();
    files
}

#[test]
fn a_snapshot_of_another_store_is_never_used() {
    let (a, b) = (tempfile::tempdir().expect("dir"), tempfile::tempdir().expect("dir"));
    let (atom, theirs) = {
        let store = builder(a.path()).open().expect("open");
        let atom = *atoms(&store, 5, 1).last().expect("an atom");
        store.snapshot_now(atom).expect("snapshot");
        (atom, store.rebuild_context(atom).expect("rebuild").context)
    };
    let ours = {
        let store = builder(b.path()).open().expect("open");
        assert_eq!(*atoms(&store, 5, 2).last().expect("an atom"), atom);
        store.rebuild_context(atom).expect("rebuild").context
    };
    assert_ne!(theirs, ours);
    let name = format!("snapshots/{:020}.snap", atom.get());
    std::fs::create_dir_all(b.path().join("snapshots")).expect("snapshot directory");
    std::fs::copy(a.path().join(&name), b.path().join(&name)).expect("copy the snapshot");
    let store = builder(b.path()).open().expect("open");
    let rebuilt = store.rebuild_context(atom).expect("rebuild");
    assert_eq!(rebuilt.snapshot, None, "another store's snapshot was used");
    assert_eq!(rebuilt.fallbacks.len(), 1, "{:?}", rebuilt.fallbacks);
    assert_eq!(rebuilt.fallbacks[0].reason, "the snapshot belongs to another store");
    assert_eq!(rebuilt.context, ours);
}

/// A store whose log lost its last atoms: 20 atoms, then 20 more, a snapshot of the last and an
/// index snapshot; then the segment files are replaced by their copies from after the first
/// 20. Returns the last atom (its snapshot survives) and the LSN the index snapshot covers.
fn store_with_a_lost_tail(dir: &Path) -> (AtomId, u64) {
    drop(atoms(&builder(dir).open().expect("open"), 20, 1));
    let older = segment_files(dir);
    let store = builder(dir).open().expect("open");
    let last = *atoms(&store, 20, 2).last().expect("an atom");
    store.snapshot_now(last).expect("snapshot");
    let covered = store.write_index_snapshot().expect("index snapshot").get();
    drop(store);
    for (path, _) in segment_files(dir) {
        std::fs::remove_file(path).expect("remove segment");
    }
    for (path, bytes) in older {
        std::fs::write(path, bytes).expect("restore the older copy");
    }
    (last, covered)
}

#[test]
fn strict_recovery_refuses_a_store_whose_index_snapshot_and_snapshot_outlive_the_log() {
    let dir = tempfile::tempdir().expect("dir");
    store_with_a_lost_tail(dir.path());
    let opened = builder(dir.path()).recovery_mode(RecoveryMode::Strict).open();
    assert!(
        matches!(opened, Err(Error::RecordsLost { evidence: LossEvidence::IndexSnapshot { .. }, .. })),
        "{opened:?}"
    );
    assert!(dir.path().join("index.snapshot").exists(), "a refused open changed nothing");
}

#[test]
fn the_default_open_reports_the_loss_once_and_never_reuses_a_lost_atom_s_snapshot() {
    let dir = tempfile::tempdir().expect("dir");
    let (last, covered) = store_with_a_lost_tail(dir.path());
    let snapshot = dir.path().join(format!("snapshots/{:020}.snap", last.get()));
    // A read-only open reports and changes nothing.
    let read_only = builder(dir.path()).open_read_only().expect("read-only open");
    let report = read_only.recovery_report().clone();
    let log_end = read_only.log().next_lsn();
    drop(read_only);
    assert_eq!(
        report.lost,
        [
            LossEvidence::IndexSnapshot { covered: continuum::Lsn::new(covered), log_end },
            LossEvidence::Snapshot { atom: last },
        ]
    );
    assert_eq!(report.lost_records, covered - log_end.get());
    assert_eq!(report.lost_atoms, 1);
    assert!(snapshot.exists());
    // The writable open reports the same, then clears the evidence.
    let store = builder(dir.path()).open().expect("the default mode opens");
    assert_eq!(*store.recovery_report(), report);
    assert!(!snapshot.exists(), "the lost atom's snapshot is kept");
    assert!(snapshot.with_extension("snap.lost").exists(), "the lost atom's snapshot is set aside");
    assert!(!dir.path().join("index.snapshot").exists(), "the index snapshot past the log is kept");
    // The lost atoms' ids are given again: none may start from the lost atom's snapshot.
    let again = atoms(&store, 20, 3);
    assert!(again.contains(&last));
    let rebuilt = store.rebuild_context(last).expect("rebuild");
    assert_eq!(rebuilt.snapshot, None);
    drop(store);
    assert!(builder(dir.path()).open().expect("open").recovery_report().is_lossless());
}

/// The version-1 bytes of a version-2 snapshot file: what a store wrote before snapshots named
/// their store (72-byte header, the digest at 40 over bytes 0..40 and the payload).
fn unbound(bytes: &[u8]) -> Vec<u8> {
    use sha2::{Digest, Sha256};
    let (header, payload) = bytes.split_at(80);
    let mut old = header[..40].to_vec();
    old[8..12].copy_from_slice(&1u32.to_le_bytes());
    let digest = Sha256::new().chain_update(&old).chain_update(payload).finalize();
    old.extend_from_slice(&digest);
    old.extend_from_slice(payload);
    old
}

#[test]
fn a_writable_open_binds_the_store_s_version_1_snapshots_once() {
    let dir = tempfile::tempdir().expect("dir");
    let atom = {
        let store = builder(dir.path()).open().expect("open");
        let atom = *atoms(&store, 5, 1).last().expect("an atom");
        store.snapshot_now(atom).expect("snapshot");
        atom
    };
    let path = dir.path().join(format!("snapshots/{:020}.snap", atom.get()));
    let bound = std::fs::read(&path).expect("read the snapshot");
    // The store as an older version left it: a version-1 file, no marker.
    std::fs::write(&path, unbound(&bound)).expect("write a version-1 file");
    std::fs::remove_file(dir.path().join("snapshots/BOUND")).expect("remove the marker");
    let refused = |store: &Store| {
        let rebuilt = store.rebuild_context(atom).expect("rebuild");
        assert_eq!(rebuilt.snapshot, None);
        assert_eq!(rebuilt.fallbacks.len(), 1);
        assert_eq!(rebuilt.fallbacks[0].reason, "format version 1 names no store");
    };
    // A read-only open changes nothing: the file is refused.
    refused(&builder(dir.path()).open_read_only().expect("read-only open"));
    // The first writable open binds it to the store.
    let store = builder(dir.path()).open().expect("open");
    assert_eq!(store.rebuild_context(atom).expect("rebuild").snapshot, Some(atom));
    drop(store);
    assert_eq!(std::fs::read(&path).expect("read"), bound, "bound: the version-2 file, payload kept");
    // Once bound, a version-1 file could be any store's: refused.
    std::fs::write(&path, unbound(&bound)).expect("write a version-1 file");
    refused(&builder(dir.path()).open().expect("open"));
}
