//! Shipping against `object_store`'s in-memory backend: restore, takeover and fencing,
//! damaged objects, tail shipping, bucket retention. `tests/ship_s3.rs` runs the same protocol
//! against a real S3-compatible server.

use std::sync::Arc;
use std::time::Duration;

use object_store::path::Path as Key;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use sha2::{Digest, Sha256};

use crate::codec::proto::{ChatMessage, Delta};
use crate::ship::{Remote, layout, manifest};
use crate::{AtomId, AtomOutput, Error, RunSpec, Store};

fn output(i: usize) -> AtomOutput {
    let message = ChatMessage { role: "assistant".into(), content: format!("step {i} of the plan"), tool_call: None };
    AtomOutput { delta: Delta { messages: vec![message], ..Delta::default() }, result: format!("r{i}").into_bytes() }
}

fn open(dir: &std::path::Path, remote: &Remote) -> crate::Result<Store> {
    Store::builder(dir).segment_bytes(4096).ship_to(remote.clone().poll_interval(Duration::from_secs(3600))).open()
}

/// A store with `atoms` atoms of one agent, shipped; returns the atoms.
fn shipped(dir: &std::path::Path, remote: &Remote, atoms: usize) -> (Store, Vec<AtomId>) {
    let store = open(dir, remote).expect("open");
    let run = store.create_run(RunSpec::new("research")).expect("run");
    let mut ids: Vec<AtomId> = Vec::with_capacity(atoms);
    for i in 0..atoms {
        let parents: Vec<AtomId> = ids.last().copied().into_iter().collect();
        ids.push(store.record_atom(run, "planner", &format!("k{i}"), &parents, "", &output(i)).expect("atom"));
    }
    store.ship_now().expect("ship");
    (store, ids)
}

async fn bucket_manifest(remote: &Remote) -> manifest::ShippedManifest {
    manifest::fetch(remote.store.as_ref(), &remote.prefix).await.expect("fetch").expect("a manifest").manifest
}

#[test]
fn a_restored_store_has_every_shipped_atom_and_continues() {
    let remote = Remote::in_memory("stores/a");
    let (a, b) = (tempfile::tempdir().expect("dir"), tempfile::tempdir().expect("dir"));
    let (original, ids) = shipped(a.path(), &remote.clone().owner("a"), 300);
    let sealed_end =
        original.log().segments().iter().filter(|s| s.sealed).map(|s| s.next_lsn.get()).max().expect("sealed");
    assert!(original.log().segments().len() > 3, "the test needs several sealed segments");
    let status = original.shipping_status().expect("shipping");
    assert_eq!(status.shipped_next_lsn, sealed_end);
    assert!(status.lag_bytes > 0, "the active segment is not shipped without tail shipping");

    let (restored, report) = Store::restore_from(remote.clone().owner("b"), b.path()).expect("restore");
    assert_eq!((report.epoch, report.tail, report.next_lsn), (2, false, sealed_end));
    let mut present = 0;
    for &id in &ids {
        let atom = original.atom(id).expect("original");
        if atom.started_lsn.get() + 1 < sealed_end {
            assert_eq!(restored.atom(id).expect("restored"), atom);
            present += 1;
        } else if atom.started_lsn.get() >= sealed_end {
            assert!(matches!(restored.atom(id), Err(Error::UnknownAtom { .. })));
        }
    }
    assert!(present > 200, "only {present} atoms restored");
    // It continues: new atoms, and they ship under the new epoch.
    let run = restored.run_id("research").expect("run");
    let next = restored.record_atom(run, "planner", "after", &[], "", &output(9_999)).expect("continue");
    assert!(next.get() > 0);
    restored.ship_now().expect("the new owner ships");
    assert_eq!(restored.shipping_status().expect("status").epoch, 2);
}

#[test]
fn the_previous_owner_is_fenced_and_none_of_its_writes_reach_the_manifest() {
    let remote = Remote::in_memory("stores/b");
    let (a, b) = (tempfile::tempdir().expect("dir"), tempfile::tempdir().expect("dir"));
    let (stale, _) = shipped(a.path(), &remote.clone().owner("a"), 100);
    let (_owner, _) = Store::restore_from(remote.clone().owner("b"), b.path()).expect("restore");
    let after_takeover = remote.block_on(bucket_manifest(&remote));
    // The stale owner keeps writing until its next cycle, which fails its condition.
    let run = stale.run_id("research").expect("run");
    for i in 0..200 {
        stale.record_atom(run, "planner", &format!("late{i}"), &[], "", &output(i)).expect("local appends go on");
    }
    assert!(matches!(stale.ship_now(), Err(Error::Fenced { epoch: 1, current: 2 })));
    assert!(stale.shipping_status().expect("status").fenced);
    assert!(matches!(
        stale.record_atom(run, "planner", "after-fence", &[], "", &output(0)),
        Err(Error::Fenced { epoch: 1, .. })
    ));
    assert_eq!(remote.block_on(bucket_manifest(&remote)), after_takeover, "the stale owner changed the manifest");
    drop(stale);
    // Its directory can no longer open as an owner.
    assert!(matches!(open(a.path(), &remote), Err(Error::Fenced { epoch: 1, current: 2 })));
}

#[test]
fn sixteen_hosts_racing_to_take_over_have_exactly_one_winner() {
    let remote = Remote::in_memory("stores/c");
    let origin = tempfile::tempdir().expect("dir");
    let (store, _) = shipped(origin.path(), &remote.clone().owner("origin"), 50);
    drop(store);
    for round in 0..10 {
        let dirs: Vec<_> = (0..16).map(|_| tempfile::tempdir().expect("dir")).collect();
        let outcomes: Vec<_> = std::thread::scope(|scope| {
            let racers: Vec<_> = dirs
                .iter()
                .enumerate()
                .map(|(i, dir)| {
                    let remote = Remote::new(Arc::clone(&remote.store), "stores/c").owner(&format!("host{i}"));
                    let builder = Store::builder(dir.path()).ship_to(remote);
                    scope.spawn(move || builder.restore_from_epoch(round + 1).map(|(_, report)| report.epoch))
                })
                .collect();
            racers.into_iter().map(|racer| racer.join().expect("no panic")).collect()
        });
        let winners: Vec<u64> = outcomes.iter().filter_map(|outcome| outcome.as_ref().ok().copied()).collect();
        assert_eq!(winners, vec![round + 2], "round {round}: {outcomes:?}");
        assert!(outcomes.iter().filter(|o| o.is_err()).all(|o| matches!(o, Err(Error::Fenced { .. }))));
    }
}

#[test]
fn a_damaged_snapshot_is_left_out_and_rebuilds_fall_back() {
    let remote = Remote::in_memory("stores/d");
    let (a, b) = (tempfile::tempdir().expect("dir"), tempfile::tempdir().expect("dir"));
    let (store, ids) = shipped(a.path(), &remote.clone().owner("a"), 120);
    let (older, newer) = (ids[40], ids[60]);
    store.snapshot_now(older).expect("snapshot");
    store.snapshot_now(newer).expect("snapshot");
    // Enough atoms after them that the snapshots' completions are in sealed segments.
    let run = store.run_id("research").expect("run");
    for i in 0..200 {
        store.record_atom(run, "planner", &format!("more{i}"), &[], "", &output(i)).expect("atom");
    }
    store.ship_now().expect("ship");
    let expected = store.rebuild_context(ids[100]).expect("rebuild");
    assert_eq!(expected.snapshot, Some(newer), "the original rebuild starts from the newer snapshot");
    let expected = expected.context;
    drop(store);
    let listed = remote.block_on(bucket_manifest(&remote));
    let damaged = listed.snapshots.iter().find(|s| s.atom == newer.get()).expect("the newer snapshot is shipped");
    flip_a_byte(&remote, &damaged.key);

    let (restored, report) = Store::restore_from(remote.clone().owner("b"), b.path()).expect("restore");
    assert_eq!(report.damaged_snapshots, vec![newer.get()]);
    assert_eq!(report.snapshots, listed.snapshots.len() - 1);
    let rebuilt = restored.rebuild_context(ids[100]).expect("rebuild");
    assert_eq!(rebuilt.context, expected);
    // The next older snapshot (a policy snapshot may lie between `older` and `newer`).
    let next_older = listed.snapshots.iter().map(|s| s.atom).filter(|&atom| atom < newer.get()).max();
    assert!(next_older >= Some(older.get()));
    assert_eq!(rebuilt.snapshot.map(AtomId::get), next_older, "the next older snapshot is used");
}

#[test]
fn a_damaged_segment_fails_the_restore() {
    let remote = Remote::in_memory("stores/e");
    let (a, b) = (tempfile::tempdir().expect("dir"), tempfile::tempdir().expect("dir"));
    drop(shipped(a.path(), &remote.clone().owner("a"), 120));
    let listed = remote.block_on(bucket_manifest(&remote));
    flip_a_byte(&remote, &listed.segments[1].key);
    let restored = Store::restore_from(remote.clone().owner("b"), b.path());
    assert!(matches!(restored, Err(Error::DamagedObject { ref key }) if *key == listed.segments[1].key));
}

#[test]
fn tail_shipping_restores_the_active_segment_too() {
    let remote = Remote::in_memory("stores/f").ship_interval(Some(Duration::from_secs(3600)));
    let (a, b) = (tempfile::tempdir().expect("dir"), tempfile::tempdir().expect("dir"));
    let (store, ids) = shipped(a.path(), &remote.clone().owner("a"), 150);
    let end = store.log().next_lsn().get();
    let status = store.shipping_status().expect("status");
    assert_eq!((status.shipped_next_lsn, status.lag_bytes), (end, 0));
    let (restored, report) = Store::restore_from(remote.clone().owner("b"), b.path()).expect("restore");
    assert_eq!((report.tail, report.next_lsn), (true, end));
    for &id in &ids {
        assert_eq!(restored.atom(id).expect("every atom"), store.atom(id).expect("original"));
    }
    let run = restored.run_id("research").expect("run");
    restored.record_atom(run, "planner", "after", &[], "", &output(1)).expect("it continues after the tail");
    drop(restored);
    let reopened = Store::open(b.path()).expect("reopen without shipping");
    assert_eq!(reopened.run_atoms(run).len(), ids.len() + 1);
}

#[test]
fn retention_deletes_what_no_manifest_lists_after_the_grace_period() {
    let remote = Remote::in_memory("stores/g").ship_interval(Some(Duration::ZERO)).grace(Duration::ZERO);
    let dir = tempfile::tempdir().expect("dir");
    let store = open(dir.path(), &remote).expect("open");
    let run = store.create_run(RunSpec::new("r")).expect("run");
    let orphan = layout::tail("stores/g", 1, 2, 1, &[7; 32]);
    remote.block_on(remote.store.put(&orphan, PutPayload::from_static(b"left by a crash"))).expect("put");
    for round in 0..5 {
        store.record_atom(run, "a", &format!("k{round}"), &[], "", &output(round)).expect("atom");
        store.ship_now().expect("ship");
    }
    let listed = remote.block_on(bucket_manifest(&remote));
    let tails = list(&remote, "stores/g/tail");
    assert_eq!(tails, vec![listed.tail.expect("a tail").key], "superseded tails and orphans are deleted");
    assert!(store.shipping_status().expect("status").deletions >= 5);
}

#[test]
fn a_prefix_holding_another_store_is_refused() {
    let remote = Remote::in_memory("stores/h");
    let (a, b) = (tempfile::tempdir().expect("dir"), tempfile::tempdir().expect("dir"));
    drop(open(a.path(), &remote).expect("first store"));
    assert!(matches!(open(b.path(), &remote), Err(Error::InvalidArgument { .. })));
    // A restore into a directory that holds a store is refused before anything changes.
    assert!(matches!(Store::restore_from(remote.clone(), a.path()), Err(Error::InvalidArgument { .. })));
    assert_eq!(remote.block_on(bucket_manifest(&remote)).epoch, 1);
}

#[test]
fn sealed_segments_ship_compressed_and_restore_byte_for_byte() {
    let remote = Remote::in_memory("stores/i");
    let (a, b) = (tempfile::tempdir().expect("dir"), tempfile::tempdir().expect("dir"));
    let (original, _) = shipped(a.path(), &remote.clone().owner("a"), 200);
    let listed = remote.block_on(bucket_manifest(&remote));
    assert!(listed.segments.len() > 3);
    for segment in &listed.segments {
        assert_eq!(segment.encoding, manifest::ENCODING_ZSTD);
        assert!(segment.object_bytes < segment.bytes, "a compressed segment is smaller: {segment:?}");
        assert!(segment.key.ends_with(".seg.zst"));
    }
    let (_restored, report) = Store::restore_from(remote.clone().owner("b"), b.path()).expect("restore");
    let plain: u64 = listed.segments.iter().map(|segment| segment.bytes).sum();
    assert!(report.bytes < plain, "{} bytes downloaded for {plain} of segments", report.bytes);
    for segment in original.log().segments().iter().filter(|segment| segment.sealed) {
        let name = segment.path.file_name().expect("a name");
        let (from, to) =
            (std::fs::read(&segment.path).expect("read"), std::fs::read(b.path().join(name)).expect("read"));
        let data = segment.data_bytes as usize;
        assert_eq!(from[..data], to[..data], "segment {} differs", segment.seq);
    }
}

#[test]
fn the_shipped_index_snapshot_spares_the_restore_s_open_a_fold() {
    let remote = Remote::in_memory("stores/j").owner("a");
    let (a, b) = (tempfile::tempdir().expect("dir"), tempfile::tempdir().expect("dir"));
    let store = Store::builder(a.path())
        .segment_bytes(4096)
        .index_snapshot_after(100)
        .ship_to(remote.clone().poll_interval(Duration::from_secs(3600)))
        .open()
        .expect("open");
    let run = store.create_run(RunSpec::new("research")).expect("run");
    let ids: Vec<AtomId> = (0..400)
        .map(|i| store.record_atom(run, "planner", &format!("k{i}"), &[], "", &output(i)).expect("atom"))
        .collect();
    store.ship_now().expect("ship");
    let listed = remote.block_on(bucket_manifest(&remote));
    let index = listed.index.clone().expect("an index snapshot is shipped once enough records are");
    // Without tail shipping it covers the sealed segments, exactly.
    assert_eq!(index.covered, listed.shipped_next_lsn());
    assert!(index.covered < store.log().next_lsn().get());

    let (restored, report) = Store::restore_from(remote.clone().owner("b"), b.path()).expect("restore");
    assert_eq!(report.index_snapshot, Some(index.covered));
    let info = restored.index_snapshot();
    assert_eq!((info.opened_from, info.ignored_at_open), (Some(crate::Lsn::new(index.covered)), None));
    assert!(restored.recovery_report().is_lossless());
    let restored_atoms = restored.run_atoms(run);
    assert!(restored_atoms.len() > 300, "{} atoms restored", restored_atoms.len());
    for &id in ids.iter().filter(|id| restored_atoms.contains(id)) {
        assert_eq!(restored.atom(id).expect("restored"), store.atom(id).expect("original"));
    }
}

#[test]
fn with_tail_shipping_a_close_ships_its_index_snapshot() {
    let remote = Remote::in_memory("stores/k").ship_interval(Some(Duration::from_secs(3600)));
    let (a, b) = (tempfile::tempdir().expect("dir"), tempfile::tempdir().expect("dir"));
    let store = Store::builder(a.path())
        .index_snapshot_after(100)
        .ship_to(remote.clone().owner("a").poll_interval(Duration::from_secs(3600)))
        .open()
        .expect("open");
    let run = store.create_run(RunSpec::new("research")).expect("run");
    for i in 0..300 {
        store.record_atom(run, "planner", &format!("k{i}"), &[], "", &output(i)).expect("atom");
    }
    store.close().expect("close");
    let listed = remote.block_on(bucket_manifest(&remote));
    // The close's index snapshot covers every record, the close's own included, as the tail does.
    let end = listed.shipped_next_lsn();
    assert_eq!(listed.index.as_ref().map(|index| index.covered), Some(end), "the close's index snapshot");
    let local = std::fs::read(a.path().join(crate::store::INDEX_SNAPSHOT_FILE_NAME)).expect("the local one");
    assert_eq!(Sha256::digest(&local).to_vec(), listed.index.expect("listed").sha256, "shipped byte for byte");
    let (restored, report) = Store::restore_from(remote.clone().owner("b"), b.path()).expect("restore");
    assert_eq!((report.index_snapshot, report.next_lsn), (Some(end), end));
    assert_eq!(restored.index_snapshot().opened_from, Some(crate::Lsn::new(end)));
    assert_eq!(restored.run_atoms(run).len(), 300);
}

#[test]
fn a_damaged_index_snapshot_is_left_out_and_the_open_folds_the_log() {
    let remote = Remote::in_memory("stores/l").ship_interval(Some(Duration::from_secs(3600)));
    let (a, b) = (tempfile::tempdir().expect("dir"), tempfile::tempdir().expect("dir"));
    let store =
        Store::builder(a.path()).index_snapshot_after(100).ship_to(remote.clone().owner("a")).open().expect("open");
    let run = store.create_run(RunSpec::new("research")).expect("run");
    for i in 0..300 {
        store.record_atom(run, "planner", &format!("k{i}"), &[], "", &output(i)).expect("atom");
    }
    store.close().expect("close");
    let listed = remote.block_on(bucket_manifest(&remote));
    flip_a_byte(&remote, &listed.index.expect("an index snapshot").key);
    let (restored, report) = Store::restore_from(remote.clone().owner("b"), b.path()).expect("restore");
    assert_eq!(report.index_snapshot, None);
    assert_eq!(restored.index_snapshot().opened_from, None);
    assert_eq!(restored.run_atoms(run).len(), 300);
}

#[test]
fn a_snapshot_of_an_atom_the_bucket_lacks_is_not_listed() {
    let remote = Remote::in_memory("stores/m");
    let (a, b) = (tempfile::tempdir().expect("dir"), tempfile::tempdir().expect("dir"));
    let (store, ids) = shipped(a.path(), &remote.clone().owner("a"), 120);
    let (early, last) = (ids[10], *ids.last().expect("atoms"));
    store.snapshot_now(early).expect("snapshot");
    store.snapshot_now(last).expect("snapshot");
    store.ship_now().expect("ship");
    let listed = remote.block_on(bucket_manifest(&remote));
    let atoms: Vec<u64> = listed.snapshots.iter().map(|snapshot| snapshot.atom).collect();
    assert!(atoms.contains(&early.get()), "{atoms:?}");
    assert!(!atoms.contains(&last.get()), "its completion is in the active segment, not shipped: {atoms:?}");
    let (restored, _) = Store::restore_from(remote.clone().owner("b"), b.path()).expect("restore");
    assert!(restored.recovery_report().is_lossless(), "{:?}", restored.recovery_report());
}

fn flip_a_byte(remote: &Remote, key: &str) {
    let key = Key::from(key);
    remote.block_on(async {
        let mut bytes = remote.store.get(&key).await.expect("get").bytes().await.expect("bytes").to_vec();
        let at = bytes.len() / 2;
        bytes[at] ^= 0x20;
        remote.store.put(&key, PutPayload::from(bytes)).await.expect("put");
    });
}

fn list(remote: &Remote, folder: &str) -> Vec<String> {
    use futures::TryStreamExt;
    let store: &dyn ObjectStore = remote.store.as_ref();
    let objects: Vec<_> = remote.block_on(store.list(Some(&Key::from(folder))).try_collect()).expect("list");
    objects.into_iter().map(|meta: object_store::ObjectMeta| meta.location.to_string()).collect()
}
