//! Channels between agents: messages sent and received inside atoms (`Store::execute_with`),
//! consumed exactly once per consumer (broadcast: each consumer its own offset), a replay that
//! returns what an atom consumed and sends nothing again, blocking receive, concurrent
//! producers and consumers, and bad input refused with typed errors.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use continuum::channel::Exchange;
use continuum::limits::{CHANNEL_MESSAGE_BYTES_MAX, CHANNEL_SENDS_PER_ATOM_MAX};
use continuum::{AtomFailure, AtomOutput, Error, RunSpec, Store};

fn failure(error: Error) -> AtomFailure {
    AtomFailure { message: error.to_string(), retryable: true }
}

#[test]
fn each_consumer_processes_each_message_once_and_a_replay_returns_what_it_consumed() {
    let dir = tempfile::tempdir().expect("dir");
    let run = {
        let store = Store::open(dir.path()).expect("open");
        let run = store.create_run(RunSpec::new("team")).expect("run");
        store
            .execute_with(run, "planner", "plan", &[], |exchange| {
                for task in ["a", "b", "c"] {
                    exchange.send("tasks", task).map_err(failure)?;
                }
                Ok(AtomOutput::default())
            })
            .expect("send");
        let replayed = store.execute_with(run, "planner", "plan", &[], |_| panic!("sent twice")).expect("replay");
        assert!(replayed.executed.replayed);
        let take_two = |exchange: &mut Exchange<'_>| {
            let messages = exchange.receive("tasks", "researcher", 2).map_err(failure)?;
            Ok(AtomOutput { result: messages.iter().flat_map(|m| m.payload.clone()).collect(), ..Default::default() })
        };
        let first = store.execute_with(run, "researcher", "r1", &[], take_two).expect("r1");
        assert_eq!(first.executed.output.result, b"ab");
        let second = store.execute_with(run, "researcher", "r2", &[], take_two).expect("r2");
        assert_eq!(second.executed.output.result, b"c");
        let third = store.execute_with(run, "researcher", "r3", &[], take_two).expect("r3");
        assert!(third.received.is_empty() && third.executed.output.result.is_empty());
        // Broadcast: another consumer has its own offset.
        let writer = store.pending_messages(run, "tasks", "writer", 10).expect("writer's");
        assert_eq!(writer.iter().map(|m| m.payload.clone()).collect::<Vec<_>>(), [b"a", b"b", b"c"]);
        let plan = store.atom_by_key(run, "planner", "plan").expect("lookup").expect("plan");
        assert!(writer.iter().all(|m| m.sender == plan));
        store.write_index_snapshot().expect("the reopen starts from an index snapshot");
        run
    };
    let store = Store::open(dir.path()).expect("reopen");
    assert_eq!(store.pending_messages(run, "tasks", "auditor", 10).expect("all").len(), 3, "sent once");
    assert_eq!(store.pending_messages(run, "tasks", "researcher", 10).expect("none"), vec![]);
    let all = store.pending_messages(run, "tasks", "writer", 10).expect("all");
    assert_eq!(store.consumer_offset(run, "tasks", "researcher").expect("offset"), all[2].id.get());
    let again = store.execute_with(run, "researcher", "r1", &[], |_| panic!("consumed twice")).expect("replay r1");
    assert!(again.executed.replayed);
    assert_eq!(again.received.len(), 1);
    assert_eq!((again.received[0].channel.as_str(), again.received[0].consumer.as_str()), ("tasks", "researcher"));
    assert_eq!(again.received[0].messages, all[..2].to_vec());
    let again = store.execute_with(run, "researcher", "r3", &[], |_| panic!("consumed twice")).expect("replay r3");
    assert!(again.received.is_empty());
}

#[test]
fn a_failed_or_conflicting_atom_sends_and_consumes_nothing() {
    let dir = tempfile::tempdir().expect("dir");
    let store = Store::open(dir.path()).expect("open");
    let run = store.create_run(RunSpec::new("team")).expect("run");
    let failed = store.execute_with(run, "planner", "plan", &[], |exchange| {
        exchange.send("tasks", "lost").map_err(failure)?;
        Err(AtomFailure { message: "tool down".into(), retryable: true })
    });
    assert!(matches!(failed, Err(Error::AtomFailed { .. })));
    assert_eq!(store.pending_messages(run, "tasks", "w", 10).expect("none"), vec![]);
    store
        .execute_with(run, "planner", "plan", &[], |x| {
            x.send("tasks", "kept").map(|()| AtomOutput::default()).map_err(failure)
        })
        .expect("retry sends");
    // Two atoms of one consumer read the same offset: the second to complete is refused and
    // consumes nothing; executed again, it finds the message taken.
    let inner = |exchange: &mut Exchange<'_>| {
        let messages = exchange.receive("tasks", "w", 1).map_err(failure)?;
        assert_eq!(messages.len(), 1);
        let nested = store.execute_with(run, "worker", "inner", &[], |x| {
            x.receive("tasks", "w", 1).map(|_| AtomOutput::default()).map_err(failure)
        });
        assert!(nested.is_ok(), "{nested:?}");
        Ok(AtomOutput::default())
    };
    let outer = store.execute_with(run, "worker", "outer", &[], inner);
    let Err(Error::OutputNotRecorded { source, .. }) = outer else { panic!("{outer:?}") };
    assert!(matches!(*source, Error::ConsumerConflict { expected: 0, .. }), "{source:?}");
    let retried = store
        .execute_with(run, "worker", "outer", &[], |x| {
            x.receive("tasks", "w", 1)
                .map(|m| AtomOutput { result: m.len().to_le_bytes().to_vec(), ..Default::default() })
                .map_err(failure)
        })
        .expect("retry");
    assert_eq!(retried.executed.output.result, 0usize.to_le_bytes());
}

#[test]
fn bad_names_sizes_and_counts_are_refused_with_typed_errors() {
    let dir = tempfile::tempdir().expect("dir");
    let store = Store::open(dir.path()).expect("open");
    let run = store.create_run(RunSpec::new("team")).expect("run");
    store
        .execute_with(run, "agent", "bad", &[], |exchange| {
            let invalid = |result: continuum::Result<()>| matches!(result, Err(Error::InvalidArgument { .. }));
            for name in ["", "a/b", "with space", "continuum.topics", &"x".repeat(129)] {
                assert!(invalid(exchange.send(name, "m")), "channel {name:?}");
                assert!(invalid(exchange.receive(name, "c", 1).map(|_| ())), "channel {name:?}");
                assert!(invalid(exchange.receive("tasks", name, 1).map(|_| ())), "consumer {name:?}");
            }
            assert!(invalid(exchange.receive("tasks", "c", 0).map(|_| ())));
            assert!(invalid(exchange.receive("tasks", "c", 1 << 20).map(|_| ())));
            let too_big = exchange.send("tasks", vec![0; CHANNEL_MESSAGE_BYTES_MAX + 1]);
            assert!(matches!(too_big, Err(Error::LimitExceeded { .. })), "{too_big:?}");
            exchange.send("tasks", vec![0; CHANNEL_MESSAGE_BYTES_MAX]).expect("at the bound");
            for _ in 1..CHANNEL_SENDS_PER_ATOM_MAX {
                exchange.send("tasks", "m").expect("within the bound");
            }
            assert!(matches!(exchange.send("tasks", "m"), Err(Error::LimitExceeded { .. })));
            Ok(AtomOutput::default())
        })
        .expect("the atom completes with the messages within the bounds");
    assert_eq!(store.pending_messages(run, "tasks", "c", 4096).expect("sent").len(), CHANNEL_SENDS_PER_ATOM_MAX);
    assert!(matches!(store.pending_messages(run, "tasks", "continuum.x", 1), Err(Error::InvalidArgument { .. })));
    assert!(matches!(store.consumer_offset(run, "continuum.x", "c"), Err(Error::InvalidArgument { .. })));
    let refused = store.execute_with(run, "continuum.channel/tasks", "k", &[], |_| Ok(AtomOutput::default()));
    assert!(matches!(refused, Err(Error::InvalidArgument { .. })), "the store's own agents");
}

#[test]
fn a_waiting_receiver_wakes_when_a_message_lands_and_times_out_without_one() {
    let dir = tempfile::tempdir().expect("dir");
    let store = Arc::new(Store::open(dir.path()).expect("open"));
    let run = store.create_run(RunSpec::new("team")).expect("run");
    let started = Instant::now();
    let empty = store
        .execute_with(run, "worker", "idle", &[], |x| {
            let messages = x.receive_wait("tasks", "w", 1, Duration::from_millis(50)).map_err(failure)?;
            Ok(AtomOutput { result: messages.len().to_le_bytes().to_vec(), ..Default::default() })
        })
        .expect("idle");
    assert!(started.elapsed() >= Duration::from_millis(50));
    assert_eq!(empty.executed.output.result, 0usize.to_le_bytes());
    let sender = {
        let store = Arc::clone(&store);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            store.execute_with(run, "planner", "plan", &[], |x| {
                x.send("tasks", "go").map(|()| AtomOutput::default()).map_err(failure)
            })
        })
    };
    let started = Instant::now();
    let woken = store
        .execute_with(run, "worker", "wait", &[], |x| {
            let messages = x.receive_wait("tasks", "w", 1, Duration::from_secs(30)).map_err(failure)?;
            Ok(AtomOutput { result: messages[0].payload.clone(), ..Default::default() })
        })
        .expect("woken");
    assert_eq!(woken.executed.output.result, b"go");
    assert!(started.elapsed() < Duration::from_secs(10), "woken by the message, not the timeout");
    sender.join().expect("sender").expect("sent");
}

/// Two producers and two consumers (broadcast: each its own offset), each on its own thread,
/// thousands of messages: each consumer's completed atoms hold every message exactly once, in
/// channel order, and a reopen agrees.
#[test]
fn concurrent_producers_and_consumers_process_every_message_exactly_once() {
    const PRODUCERS: usize = 2;
    const ATOMS: usize = 100;
    const PER_ATOM: usize = 10;
    const TOTAL: usize = PRODUCERS * ATOMS * PER_ATOM;
    let dir = tempfile::tempdir().expect("dir");
    let store = Arc::new(Store::builder(dir.path()).commit_spin(Duration::ZERO).open().expect("open"));
    let run = store.create_run(RunSpec::new("team")).expect("run");
    let mut threads = Vec::new();
    for producer in 0..PRODUCERS {
        let store = Arc::clone(&store);
        threads.push(std::thread::spawn(move || {
            for atom in 0..ATOMS {
                store
                    .execute_with(run, &format!("producer-{producer}"), &format!("{atom}"), &[], |x| {
                        for at in 0..PER_ATOM {
                            x.send("tasks", format!("{producer}/{atom}/{at}")).map_err(failure)?;
                        }
                        Ok(AtomOutput::default())
                    })
                    .expect("send");
            }
            Vec::new()
        }));
    }
    for consumer in ["c1", "c2"] {
        let store = Arc::clone(&store);
        threads.push(std::thread::spawn(move || {
            let mut got: Vec<Vec<u8>> = Vec::new();
            let mut step = 0;
            while got.len() < TOTAL {
                let exchanged = store
                    .execute_with(run, consumer, &format!("{step}"), &[], |x| {
                        let messages =
                            x.receive_wait("tasks", consumer, 37, Duration::from_secs(5)).map_err(failure)?;
                        Ok(AtomOutput { result: messages.len().to_le_bytes().to_vec(), ..Default::default() })
                    })
                    .expect("receive");
                got.extend(exchanged.received.into_iter().flat_map(|r| r.messages).map(|m| m.payload));
                step += 1;
            }
            got
        }));
    }
    let results: Vec<Vec<Vec<u8>>> = threads.into_iter().map(|t| t.join().expect("thread")).collect();
    let order: Vec<Vec<u8>> =
        store.pending_messages(run, "tasks", "auditor", 4096).expect("all").into_iter().map(|m| m.payload).collect();
    assert_eq!(order.len(), TOTAL, "every message sent once");
    for got in &results[PRODUCERS..] {
        assert_eq!(got, &order, "every message processed once, in channel order");
    }
    let mut per_producer: BTreeMap<String, usize> = BTreeMap::new();
    for payload in &order {
        let text = String::from_utf8(payload.clone()).expect("utf-8");
        *per_producer.entry(text.split('/').next().expect("producer").to_owned()).or_default() += 1;
    }
    assert!(per_producer.values().all(|count| *count == ATOMS * PER_ATOM));
    drop(results);
    let store = Arc::into_inner(store).expect("the last handle");
    drop(store);
    let store = Store::open(dir.path()).expect("reopen");
    for consumer in ["c1", "c2"] {
        assert_eq!(store.pending_messages(run, "tasks", consumer, 10).expect("none left"), vec![]);
        let mut replayed = Vec::new();
        for step in 0.. {
            let Some(_) = store.atom_by_key(run, consumer, &format!("{step}")).expect("lookup") else { break };
            let again =
                store.execute_with(run, consumer, &format!("{step}"), &[], |_| panic!("ran again")).expect("replay");
            replayed.extend(again.received.into_iter().flat_map(|r| r.messages).map(|m| m.payload));
        }
        assert_eq!(replayed, order, "{consumer}: the replayed view is the exchange");
    }
}

/// Store-wide topics: a message sent in one run's atom is received by consumers in other runs
/// (each its own offset), once each, and a replay after a reopen returns it with its run.
#[test]
fn a_topic_carries_messages_between_runs_once_per_consumer() {
    let dir = tempfile::tempdir().expect("dir");
    let (alerts, billing) = {
        let store = Store::open(dir.path()).expect("open");
        let (monitor, alerts, billing) = (
            store.create_run(RunSpec::new("monitor")).expect("run"),
            store.create_run(RunSpec::new("alerts")).expect("run"),
            store.create_run(RunSpec::new("billing")).expect("run"),
        );
        store
            .execute_with(monitor, "watch", "w1", &[], |x| {
                x.send_topic("incidents", "disk full").map(|()| AtomOutput::default()).map_err(failure)
            })
            .expect("send");
        assert_eq!(store.pending_messages(monitor, "incidents", "pager", 10).expect("none in the run"), vec![]);
        for (run, consumer) in [(alerts, "pager"), (billing, "ledger")] {
            let got = store
                .execute_with(run, "agent", "k1", &[], |x| {
                    let messages = x.receive_topic("incidents", consumer, 10).map_err(failure)?;
                    Ok(AtomOutput { result: messages[0].payload.clone(), ..Default::default() })
                })
                .expect("receive");
            assert_eq!(got.executed.output.result, b"disk full");
            let again = store.execute_with(run, "agent", "k2", &[], |x| {
                x.receive_topic("incidents", consumer, 10)
                    .map(|m| AtomOutput { result: m.len().to_le_bytes().to_vec(), ..Default::default() })
                    .map_err(failure)
            });
            assert_eq!(again.expect("receive").executed.output.result, 0usize.to_le_bytes(), "consumed once");
        }
        (alerts, billing)
    };
    let store = Store::open(dir.path()).expect("reopen");
    let topics = store.topics_run().expect("topics run");
    for run in [alerts, billing] {
        let replayed = store.execute_with(run, "agent", "k1", &[], |_| panic!("ran again")).expect("replay");
        assert_eq!(replayed.received.len(), 1);
        assert_eq!(replayed.received[0].run, topics);
        assert_eq!(replayed.received[0].messages[0].payload, b"disk full");
    }
    assert_eq!(store.pending_messages(topics, "incidents", "late", 10).expect("a new consumer").len(), 1);
}

/// A consumer group as one consumer name shared by its members: members on three threads take
/// turns (a member whose offset moved gets `ConsumerConflict` and executes its atom again), so
/// each message is processed by exactly one member's completed atom.
#[test]
fn members_sharing_a_consumer_each_take_distinct_messages() {
    const MESSAGES: usize = 300;
    let dir = tempfile::tempdir().expect("dir");
    let store = Arc::new(Store::builder(dir.path()).commit_spin(Duration::ZERO).open().expect("open"));
    let run = store.create_run(RunSpec::new("team")).expect("run");
    for batch in 0..MESSAGES / 10 {
        store
            .execute_with(run, "producer", &format!("{batch}"), &[], |x| {
                for at in 0..10 {
                    x.send("jobs", format!("{}", batch * 10 + at)).map_err(failure)?;
                }
                Ok(AtomOutput::default())
            })
            .expect("send");
    }
    let members: Vec<_> = (0..3)
        .map(|member| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                let (mut got, mut conflicts) = (Vec::new(), 0);
                for step in 0.. {
                    let key = format!("{step}");
                    let exchanged = loop {
                        let attempt = store.execute_with(run, &format!("member-{member}"), &key, &[], |x| {
                            x.receive("jobs", "pool", 7).map(|_| AtomOutput::default()).map_err(failure)
                        });
                        match attempt {
                            Ok(exchanged) => break exchanged,
                            Err(Error::OutputNotRecorded { source, .. })
                                if matches!(*source, Error::ConsumerConflict { .. }) =>
                            {
                                conflicts += 1;
                            }
                            Err(other) => panic!("member {member}: {other}"),
                        }
                    };
                    let messages: Vec<_> = exchanged.received.into_iter().flat_map(|r| r.messages).collect();
                    if messages.is_empty() {
                        break;
                    }
                    got.extend(messages.into_iter().map(|m| String::from_utf8(m.payload).expect("utf-8")));
                }
                (got, conflicts)
            })
        })
        .collect();
    let mut all: Vec<usize> = Vec::new();
    for member in members {
        let (got, _conflicts) = member.join().expect("member");
        all.extend(got.iter().map(|text| text.parse::<usize>().expect("number")));
    }
    all.sort_unstable();
    assert_eq!(all, (0..MESSAGES).collect::<Vec<_>>(), "each message to exactly one member");
    assert_eq!(store.pending_messages(run, "jobs", "pool", 10).expect("none left"), vec![]);
}

/// An atom that sent or received messages ends like any other for a graceful stop: the stop
/// does not wait for it, and checkpoints its run.
#[test]
fn a_graceful_stop_does_not_wait_for_atoms_that_exchanged_messages() {
    use continuum::shutdown::{StopOptions, graceful_stop};
    let dir = tempfile::tempdir().expect("dir");
    let store = Store::open(dir.path()).expect("open");
    let run = store.create_run(RunSpec::new("exchange")).expect("run");
    store
        .execute_with(run, "planner", "plan", &[], |x| {
            x.send("tasks", b"one".to_vec())?;
            Ok(AtomOutput::default())
        })
        .expect("send");
    let received = store
        .execute_with(run, "worker", "step-1", &[], |x| {
            assert_eq!(x.receive("tasks", "worker", 10)?.len(), 1);
            Ok(AtomOutput::default())
        })
        .expect("receive");
    assert!(!received.executed.replayed);
    let started = Instant::now();
    let report = graceful_stop(&store, &StopOptions::default().budget(Duration::from_secs(5))).expect("stop");
    assert!(started.elapsed() < Duration::from_secs(2), "the stop waited for atoms that had ended");
    assert_eq!(report.checkpointed.len(), 1, "{report:?}");
}
