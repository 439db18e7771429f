//! Channels across crashes, on the simulator: producer atoms send messages and consumer atoms
//! receive them (`Store::execute_with`), and the process is crashed after every single I/O
//! call (three kinds of damage), then reopened. At every crash point a message exists iff the
//! atom that sent it completed, the consumer's offset and the atoms that consumed agree (the
//! completed consumer atoms hold exactly the messages up to the offset, each once, in channel
//! order, and each atom's output is what it received), and an acknowledged atom is there.
//! Resuming then finishes the exchange with every message consumed exactly once. Each producer
//! also sends to a store-wide topic (another run, the same batch): its message exists iff the
//! producer completed. Every atom also writes shared state in its batch (producers add to a
//! counter, consumers read-modify-write one key and add to another): at every crash point the
//! state agrees with the completed atoms.

use std::cell::RefCell;
use std::path::Path;
use std::sync::Arc;

use continuum::channel::{Exchange, Message};
use continuum::shared_state::{StateValue, Versioned};
use continuum::storage::sim::{CrashDamage, SimStorage};
use continuum::{AtomFailure, AtomOutput, AtomStatus, RunSpec, Store};

/// The atoms in the order they run: `p<i>` sends two messages, `c<i>` receives up to three.
const STEPS: [&str; 8] = ["p0", "p1", "c0", "p2", "c1", "c2", "p3", "c3"];

fn open(sim: &SimStorage) -> continuum::Result<Store> {
    Store::builder(Path::new("/store")).storage(Arc::new(sim.clone())).segment_bytes(8 * 1024).background(false).open()
}

fn produce(step: &str) -> impl FnOnce(&mut Exchange<'_>) -> Result<AtomOutput, AtomFailure> + '_ {
    move |exchange| {
        for part in ["a", "b"] {
            exchange.send("tasks", format!("{step}{part}").into_bytes()).expect("a valid message");
        }
        // A topic's message lives in another run, in the same batch.
        // Creating the topics run on first use may fail: the atom fails, retryably.
        exchange.send_topic("news", step.as_bytes().to_vec())?;
        exchange.add("sent", 2)?;
        Ok(AtomOutput::default())
    }
}

fn consume(exchange: &mut Exchange<'_>) -> Result<AtomOutput, AtomFailure> {
    let failure = |e: continuum::Error| AtomFailure { message: e.to_string(), retryable: true };
    let messages = exchange.receive("tasks", "worker", 3).map_err(failure)?;
    // Shared state in the same batch: a read-modify-write of "seen" and a merge into "consumed".
    let seen = match exchange.read("seen").map_err(failure)? {
        Some(Versioned { value: StateValue::Bytes(bytes), .. }) => u64::from_le_bytes(bytes.try_into().expect("8")),
        _ => 0,
    };
    exchange.put("seen", (seen + messages.len() as u64).to_le_bytes().to_vec()).map_err(failure)?;
    exchange.add("consumed", messages.len() as i64).map_err(failure)?;
    Ok(AtomOutput { result: joined(&messages), ..AtomOutput::default() })
}

fn joined(messages: &[Message]) -> Vec<u8> {
    messages.iter().flat_map(|message| [&message.payload[..], b";"].concat()).collect()
}

/// Runs the steps not yet completed, noting each acknowledged one; stops at the first error.
fn write(store: &Store, acknowledged: &RefCell<Vec<&'static str>>) -> continuum::Result<()> {
    let run = match store.run_id("exchange") {
        Some(run) => run,
        None => store.create_run(RunSpec::new("exchange"))?,
    };
    for step in STEPS {
        if step.starts_with('p') {
            store.execute_with(run, "producer", step, &[], produce(step))?;
        } else {
            store.execute_with(run, "consumer", step, &[], consume)?;
        }
        acknowledged.borrow_mut().push(step);
    }
    Ok(())
}

/// Checks a reopened store against the acknowledged steps; returns the messages consumed.
fn check(store: &Store, acknowledged: &[&str], context: &str) -> Vec<Vec<u8>> {
    let Some(run) = store.run_id("exchange") else {
        assert!(acknowledged.is_empty(), "{context}: the run is gone");
        return Vec::new();
    };
    let completed = |agent: &str, step: &str| {
        let atom = store.atom_by_key(run, agent, step).expect("lookup");
        atom.is_some_and(|atom| store.atom(atom).expect("atom").status == AtomStatus::Completed)
    };
    let all = store.pending_messages(run, "tasks", "auditor", 4096).expect("messages");
    let mut expected_payloads = Vec::new();
    for step in STEPS.iter().filter(|step| step.starts_with('p')) {
        let sent = completed("producer", step);
        assert!(sent || !acknowledged.contains(step), "{context}: acknowledged {step} lost");
        let from_step: Vec<_> = all.iter().filter(|m| m.payload.starts_with(step.as_bytes())).collect();
        assert_eq!(from_step.len(), if sent { 2 } else { 0 }, "{context}: {step}'s messages vs its atom");
        let topics = store.run_id(continuum::channel::TOPICS_RUN);
        let news =
            topics.map_or_else(Vec::new, |topics| store.pending_messages(topics, "news", "auditor", 64).expect("news"));
        let on_topic = news.iter().filter(|m| m.payload == step.as_bytes()).count();
        assert_eq!(on_topic, usize::from(sent), "{context}: {step}'s topic message vs its atom");
        expected_payloads.extend(from_step.iter().map(|m| m.payload.clone()));
    }
    let counter = |key: &str| match store.read_state(run, key).expect("state") {
        Some(Versioned { value: StateValue::Counter(total), .. }) => total as usize,
        None => 0,
        other => panic!("{context}: {key} holds a counter: {other:?}"),
    };
    assert_eq!(counter("sent"), expected_payloads.len(), "{context}: the sent counter vs the producers");
    let mut consumed: Vec<Message> = Vec::new();
    let mut consumers = 0;
    for step in STEPS.iter().filter(|step| step.starts_with('c')) {
        consumers += usize::from(completed("consumer", step));
        if !completed("consumer", step) {
            assert!(!acknowledged.contains(step), "{context}: acknowledged {step} lost");
            continue;
        }
        let replayed = store.execute_with(run, "consumer", step, &[], |_| panic!("{context}: {step} ran again"));
        let replayed = replayed.unwrap_or_else(|e| panic!("{context}: replay {step}: {e}"));
        let messages: Vec<Message> = replayed.received.into_iter().flat_map(|r| r.messages).collect();
        assert_eq!(replayed.executed.output.result, joined(&messages), "{context}: {step}'s output vs its offset");
        consumed.extend(messages);
    }
    assert_eq!(consumed, all[..consumed.len()].to_vec(), "{context}: consumed is not a prefix, once each");
    assert_eq!(counter("consumed"), consumed.len(), "{context}: the consumed counter vs the consuming atoms");
    let seen = store.read_state(run, "seen").expect("seen");
    let expected = (consumers > 0).then(|| Versioned {
        version: consumers as u64,
        value: StateValue::Bytes((consumed.len() as u64).to_le_bytes().to_vec()),
    });
    assert_eq!(seen, expected, "{context}: one version of \"seen\" per consuming atom, holding what they consumed");
    let offset = store.consumer_offset(run, "tasks", "worker").expect("offset");
    assert_eq!(offset, consumed.last().map_or(0, |m| m.id.get()), "{context}: offset vs consuming atoms");
    assert_eq!(all.iter().map(|m| m.payload.clone()).collect::<Vec<_>>(), expected_payloads, "{context}: order");
    consumed.into_iter().map(|m| m.payload).collect()
}

#[test]
fn messages_and_offsets_agree_with_their_atoms_at_every_crash_point() {
    let sim = SimStorage::new(0);
    let store = open(&sim).expect("open");
    let before = sim.op_count();
    write(&store, &RefCell::new(Vec::new())).expect("clean run");
    drop(store);
    let total = sim.op_count() - before;
    let mut states = 0;
    for crash_at in 0..=total {
        for damage in [CrashDamage::ALL[0], CrashDamage::ALL[4], CrashDamage::ALL[8]] {
            let context = format!("crash at {crash_at} ({damage:?})");
            let sim = SimStorage::new(crash_at);
            let store = open(&sim).expect("open");
            sim.halt_after(crash_at);
            let acknowledged = RefCell::new(Vec::new());
            let _ = write(&store, &acknowledged);
            drop(store);
            sim.crash(damage);
            let store = open(&sim).unwrap_or_else(|e| panic!("{context}: reopen: {e}"));
            check(&store, &acknowledged.borrow(), &context);
            write(&store, &RefCell::new(Vec::new())).unwrap_or_else(|e| panic!("{context}: resume: {e}"));
            let consumed = check(&store, &STEPS, &context);
            let every: Vec<Vec<u8>> = ["p0", "p1", "p2", "p3"]
                .iter()
                .flat_map(|p| [format!("{p}a"), format!("{p}b")])
                .map(String::into_bytes)
                .collect();
            assert_eq!(consumed, every, "{context}: after the resume every message is consumed once");
            states += 1;
        }
    }
    eprintln!("channel crash points: {states} crash states checked");
}
