//! Retention of channel messages (design invariant 7): compaction keeps every message some live
//! consumer has not consumed, byte for byte, and reclaims the payloads of the rest. Two
//! consumers read one channel, one all of it and the other half; rounds of compaction, a
//! reopen, and a crash after every I/O call of a round (simulator) must leave the lagging
//! consumer every message it has not consumed, and once both have consumed, the payloads go.
//! It guards against a plan that reclaims by one consumer's offset, or before the offsets that
//! allow it are durable.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use continuum::storage::sim::{CrashDamage, SimStorage};
use continuum::synthetic::Transcript;
use continuum::{
    AtomFailure, AtomId, AtomOutput, CompactionPolicy, Error, RetentionPolicy, RunId, RunSpec, SnapshotPolicy, Store,
    StoreBuilder,
};

const SEGMENT_BYTES: u64 = 8 * 1024;
const MESSAGES: usize = 40;
const PAYLOAD_BYTES: usize = 300;

fn failure(error: Error) -> AtomFailure {
    AtomFailure { message: error.to_string(), retryable: true }
}

/// Every round rewrites every sealed segment (plain frames, so sizes are comparable).
fn configure(builder: StoreBuilder) -> StoreBuilder {
    builder
        .segment_bytes(SEGMENT_BYTES)
        .snapshot_policy(SnapshotPolicy::NEVER)
        .retention(RetentionPolicy { snapshots_per_agent: 2, finished_run_age: Some(Duration::ZERO) })
        .compaction(CompactionPolicy { live_fraction_min: 1.0, interval: None, cold_compression: None })
        .background(false)
}

/// Message `i`'s payload: distinct bytes, so that a payload read from the wrong place shows.
fn payload(i: usize) -> Vec<u8> {
    (0..PAYLOAD_BYTES).map(|at| (i * 31 + at * 7) as u8).collect()
}

/// Sends the messages (8 per atom), then `fast` consumes all of them and `slow` the first half;
/// then enough other atoms that the messages' segments are sealed. Returns the run and the
/// messages' ids in channel order.
fn exchange(store: &Store) -> (RunId, Vec<AtomId>) {
    let run = store.create_run(RunSpec::new("team")).expect("run");
    for batch in 0..MESSAGES / 8 {
        store
            .execute_with(run, "planner", &format!("plan-{batch}"), &[], |exchange| {
                for i in batch * 8..batch * 8 + 8 {
                    exchange.send("tasks", payload(i)).map_err(failure)?;
                }
                Ok(AtomOutput::default())
            })
            .expect("send");
    }
    let fast = consume(store, run, "fast", "fast-1", MESSAGES);
    assert_eq!(fast.len(), MESSAGES);
    consume(store, run, "slow", "slow-1", MESSAGES / 2);
    let mut transcript = Transcript::new(3);
    for i in 0..40 {
        let output = AtomOutput { delta: transcript.next_delta(400), result: Vec::new() };
        store.record_atom(run, "filler", &i.to_string(), &[], "", &output).expect("filler");
    }
    let sealed = store.log().segments().iter().filter(|s| s.sealed).count();
    assert!(sealed >= 3, "the messages' segments are sealed ({sealed})");
    (run, fast.iter().map(|(id, _)| *id).collect())
}

/// One atom of `consumer` that receives up to `max` messages; returns them (id, payload).
fn consume(store: &Store, run: RunId, consumer: &str, key: &str, max: usize) -> Vec<(AtomId, Vec<u8>)> {
    let done = store
        .execute_with(run, consumer, key, &[], |exchange| {
            exchange.receive("tasks", consumer, max).map_err(failure)?;
            Ok(AtomOutput::default())
        })
        .expect("consume");
    done.received.into_iter().flat_map(|r| r.messages).map(|m| (m.id, m.payload)).collect()
}

/// What `consumer` has not consumed, (id, payload), without consuming it.
fn pending(store: &Store, run: RunId, consumer: &str) -> Vec<(AtomId, Vec<u8>)> {
    let pending = store.pending_messages(run, "tasks", consumer, 4096).expect("pending");
    pending.into_iter().map(|m| (m.id, m.payload)).collect()
}

/// The second half of the messages, as the lagging consumer must still receive them.
fn second_half(ids: &[AtomId]) -> Vec<(AtomId, Vec<u8>)> {
    ids.iter().enumerate().skip(MESSAGES / 2).map(|(i, id)| (*id, payload(i))).collect()
}

/// The bytes of a message's result in the log: its sender's id, and its payload unless reclaimed.
fn result_bytes(store: &Store, id: AtomId) -> usize {
    store.atom(id).expect("message").output.expect("completed").result.len()
}

#[test]
fn a_lagging_consumer_keeps_its_messages_and_consumed_ones_are_reclaimed() {
    let dir = tempfile::tempdir().expect("dir");
    let store = configure(Store::builder(dir.path())).open().expect("open");
    let (run, ids) = exchange(&store);

    let first = store.compact().expect("compact");
    assert_eq!(first.messages_reclaimed, (MESSAGES / 2) as u64, "{first:?}");
    assert_eq!(pending(&store, run, "slow"), second_half(&ids), "the lagging consumer's messages, byte for byte");
    for (i, id) in ids.iter().enumerate() {
        let held = if i < MESSAGES / 2 { 8 } else { 8 + PAYLOAD_BYTES };
        assert_eq!(result_bytes(&store, *id), held, "message {i}");
    }
    // A replay returns the messages of its range still held: the consumed half is gone.
    let replayed = store.execute_with(run, "fast", "fast-1", &[], |_| panic!("consumed twice")).expect("replay");
    let view: Vec<AtomId> = replayed.received.iter().flat_map(|r| r.messages.iter().map(|m| m.id)).collect();
    assert_eq!(view, ids[MESSAGES / 2..].to_vec());
    // A consumer that starts now starts at the oldest message still held.
    assert_eq!(pending(&store, run, "late"), second_half(&ids));
    drop(store);

    let store = configure(Store::builder(dir.path())).open().expect("reopen");
    assert_eq!(pending(&store, run, "slow"), second_half(&ids), "after a reopen");
    assert_eq!(result_bytes(&store, ids[0]), 8, "a reclaimed payload stays reclaimed");
    let again = store.compact().expect("compact again");
    assert_eq!(again.messages_reclaimed, 0, "nothing more is consumed: {again:?}");
    assert_eq!(pending(&store, run, "slow"), second_half(&ids), "after a second round");

    assert_eq!(consume(&store, run, "slow", "slow-2", MESSAGES), second_half(&ids), "received byte for byte");
    let bytes_before: u64 = store.log().segments().iter().map(|s| s.data_bytes).sum();
    let last = store.compact().expect("compact after both consumed");
    assert_eq!(last.messages_reclaimed, (MESSAGES / 2) as u64, "{last:?}");
    let bytes_after: u64 = store.log().segments().iter().map(|s| s.data_bytes).sum();
    assert!(
        bytes_after + (MESSAGES / 2 * PAYLOAD_BYTES) as u64 <= bytes_before + 1024,
        "the payloads' bytes are given back: {bytes_before} -> {bytes_after}"
    );
    assert!(ids.iter().all(|id| result_bytes(&store, *id) == 8), "every payload is reclaimed");
    assert_eq!(pending(&store, run, "slow"), vec![]);
    assert_eq!(pending(&store, run, "fast"), vec![]);
}

#[test]
fn a_channel_no_consumer_has_read_keeps_every_message() {
    let dir = tempfile::tempdir().expect("dir");
    let store = configure(Store::builder(dir.path())).open().expect("open");
    let run = store.create_run(RunSpec::new("team")).expect("run");
    store
        .execute_with(run, "planner", "plan", &[], |exchange| {
            (0..8).try_for_each(|i| exchange.send("unread", payload(i))).map_err(failure)?;
            Ok(AtomOutput::default())
        })
        .expect("send");
    let mut transcript = Transcript::new(4);
    for i in 0..40 {
        let output = AtomOutput { delta: transcript.next_delta(400), result: Vec::new() };
        store.record_atom(run, "filler", &i.to_string(), &[], "", &output).expect("filler");
    }
    let report = store.compact().expect("compact");
    assert_eq!(report.messages_reclaimed, 0, "{report:?}");
    let pending = store.pending_messages(run, "unread", "first", 100).expect("pending");
    assert_eq!(pending.into_iter().map(|m| m.payload).collect::<Vec<_>>(), (0..8).map(payload).collect::<Vec<_>>());
}

#[test]
fn the_topics_run_is_never_dropped_and_keeps_what_a_consumer_has_not_read() {
    let dir = tempfile::tempdir().expect("dir");
    let store = configure(Store::builder(dir.path())).open().expect("open");
    let run = store.create_run(RunSpec::new("team")).expect("run");
    store
        .execute_with(run, "planner", "plan", &[], |exchange| {
            (0..8).try_for_each(|i| exchange.send_topic("news", payload(i))).map_err(failure)?;
            Ok(AtomOutput::default())
        })
        .expect("send");
    store
        .execute_with(run, "reader", "read", &[], |exchange| {
            exchange.receive_topic("news", "reader", 2).map_err(failure)?;
            Ok(AtomOutput::default())
        })
        .expect("read");
    let topics = store.topics_run().expect("topics");
    // Even finished, with retention dropping finished runs at once, the topics run stays.
    store.finish_run(topics, true, "").expect("finish");
    let mut transcript = Transcript::new(5);
    for i in 0..40 {
        let output = AtomOutput { delta: transcript.next_delta(400), result: Vec::new() };
        store.record_atom(run, "filler", &i.to_string(), &[], "", &output).expect("filler");
    }
    let report = store.compact().expect("compact");
    assert_eq!((report.runs_dropped, report.messages_reclaimed), (0, 2), "{report:?}");
    let pending = store.pending_messages(topics, "news", "reader", 100).expect("pending");
    assert_eq!(pending.into_iter().map(|m| m.payload).collect::<Vec<_>>(), (2..8).map(payload).collect::<Vec<_>>());
}

fn open_sim(sim: &SimStorage) -> continuum::Result<Store> {
    configure(Store::builder(Path::new("/store")).storage(Arc::new(sim.clone()))).open()
}

/// A crash after every I/O call of a round that reclaims the consumed half, with every kind of
/// damage the simulator knows: after the reopen, the lagging consumer still has every message
/// it has not consumed, byte for byte, and a round after recovery reclaims no more than the
/// consumed half.
#[test]
fn a_crash_anywhere_in_a_round_loses_no_unconsumed_message() {
    let world = || {
        let sim = SimStorage::new(7);
        let store = open_sim(&sim).expect("open");
        let (run, ids) = exchange(&store);
        (sim, store, run, ids)
    };
    let ops = {
        let (sim, store, _, _) = world();
        let before = sim.op_count();
        let report = store.compact().expect("compact");
        assert_eq!(report.messages_reclaimed, (MESSAGES / 2) as u64, "{report:?}");
        sim.op_count() - before
    };
    let mut states = 0;
    for crash_at in 0..=ops {
        for damage in CrashDamage::ALL {
            let (sim, store, run, ids) = world();
            sim.halt_after(crash_at);
            let outcome = store.compact().map(|report| report.messages_reclaimed);
            drop(store);
            sim.crash(damage);
            let context = format!("crash after op {crash_at} of {ops} with {damage:?} ({outcome:?})");
            let store = open_sim(&sim).unwrap_or_else(|e| panic!("{context}: reopen: {e}"));
            assert_eq!(pending(&store, run, "slow"), second_half(&ids), "{context}");
            assert_eq!(pending(&store, run, "fast"), vec![], "{context}");
            let report = store.compact().unwrap_or_else(|e| panic!("{context}: compaction after recovery: {e}"));
            assert!(report.messages_reclaimed <= (MESSAGES / 2) as u64, "{context}: {report:?}");
            assert_eq!(pending(&store, run, "slow"), second_half(&ids), "{context}, then compacted again");
            assert!(ids[..MESSAGES / 2].iter().all(|id| result_bytes(&store, *id) == 8), "{context}");
            states += 1;
        }
    }
    eprintln!("message retention crash points: {ops} I/O calls, {states} crash states");
    assert!(ops >= 10, "a round makes many I/O calls ({ops})");
}

/// With `Buffered` atoms a consumer's completed offset atom may not be durable when a round
/// plans: the round makes it durable before it rewrites a payload away, so that a power loss
/// right after the round never leaves a consumer's offset below a reclaimed message. The
/// consumers consume last, after the messages' segments sealed, so their offset atoms sit
/// unsynced in the active segment when the round starts.
#[test]
fn a_round_makes_the_offsets_it_relies_on_durable_first() {
    let sim = SimStorage::new(11);
    let open = |sim: &SimStorage| {
        configure(Store::builder(Path::new("/store")).storage(Arc::new(sim.clone())))
            .atom_durability(continuum::Durability::Buffered)
            // Only the round's own syncs make the offsets durable, not the timed flusher.
            .flush_interval(Duration::from_secs(3600))
            .open()
    };
    let store = open(&sim).expect("open");
    let run = store.create_run(RunSpec::new("team")).expect("run");
    store
        .execute_with(run, "planner", "plan", &[], |exchange| {
            (0..8).try_for_each(|i| exchange.send("tasks", payload(i))).map_err(failure)?;
            Ok(AtomOutput::default())
        })
        .expect("send");
    let mut transcript = Transcript::new(6);
    for i in 0..40 {
        let output = AtomOutput { delta: transcript.next_delta(400), result: Vec::new() };
        store.record_atom(run, "filler", &i.to_string(), &[], "", &output).expect("filler");
    }
    consume(&store, run, "fast", "fast-1", 8);
    consume(&store, run, "slow", "slow-1", 4);
    let report = store.compact().expect("compact");
    assert_eq!(report.messages_reclaimed, 4, "{report:?}");
    // Power is lost right after the round: the store's close syncs nothing more.
    sim.halt_after(0);
    drop(store);
    sim.crash(CrashDamage { data: continuum::storage::sim::DataDamage::DropUnsynced, ..CrashDamage::ALL[0] });

    let store = open(&sim).expect("reopen");
    let ids: Vec<AtomId> = store.agent_atoms(run, "continuum.channel/tasks");
    assert_eq!(ids.len(), 8, "every message survived");
    // The offsets that let the round reclaim survived the power loss with it.
    assert_eq!(store.consumer_offset(run, "tasks", "fast").expect("offset"), ids[7].get());
    assert_eq!(store.consumer_offset(run, "tasks", "slow").expect("offset"), ids[3].get());
    let slow = pending(&store, run, "slow");
    assert_eq!(slow, (4..8).map(|i| (ids[i], payload(i))).collect::<Vec<_>>(), "byte for byte");
}
