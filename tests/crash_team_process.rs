//! Real-process crash test of agents working together: a child process runs four agent
//! threads on one store — two producers sending 10,000 messages on a channel, two consumers
//! each processing every message (broadcast) — and every atom updates shared state: producers
//! add to a counter without reading it (a merge), consumers read-modify-write one shared sum
//! (optimistic concurrency, so they conflict and retry) and add to their own counters. The
//! parent kills the child with SIGKILL at random moments, at least 50 times
//! (`CONTINUUM_CRASH_ITERATIONS` raises it), checks the reopened store after each kill, then
//! finishes the work in-process. Checks invariant 11 and the commit protocol under real
//! crashes: each message is processed by exactly one completed atom of each consumer, the
//! counters and the sum agree with the completed atoms (no update lost or doubled, no
//! conflict undetected).

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use continuum::shared_state::{StateValue, Versioned};
use continuum::{AtomFailure, AtomOutput, AtomStatus, RunId, RunSpec, Store};

const PRODUCERS: u64 = 2;
const MESSAGES_PER_PRODUCER: u64 = 5_000;
const MESSAGES_PER_ATOM: u64 = 25;
const CONSUMERS: [&str; 2] = ["c0", "c1"];
const CHILD_ENV: &str = "CONTINUUM_TEAM_CRASH_CHILD_DIR";

fn total_messages() -> u64 {
    PRODUCERS * MESSAGES_PER_PRODUCER
}

/// The value message `n` of producer `p` carries.
fn value(p: u64, n: u64) -> u64 {
    p * 1_000_000 + n
}

fn failure(error: continuum::Error) -> AtomFailure {
    AtomFailure { message: error.to_string(), retryable: true }
}

/// Producer `p` sends its messages, `MESSAGES_PER_ATOM` per atom.
fn produce(store: &Store, run: RunId, p: u64) -> continuum::Result<()> {
    for batch in 0..MESSAGES_PER_PRODUCER / MESSAGES_PER_ATOM {
        store.execute_with(run, &format!("p{p}"), &format!("send-{batch}"), &[], |exchange| {
            for n in batch * MESSAGES_PER_ATOM..(batch + 1) * MESSAGES_PER_ATOM {
                exchange.send("work", value(p, n).to_string().into_bytes()).map_err(failure)?;
            }
            exchange.add("sent", MESSAGES_PER_ATOM as i64).map_err(failure)?;
            Ok(AtomOutput::default())
        })?;
    }
    Ok(())
}

/// Consumer `name` processes every message: per atom, up to 100 of them, adding their values
/// to the shared sum (read, then put: a conflict re-runs the atom) and their number to its
/// counter; the atom's result lists the values it processed.
fn consume(store: &Store, run: RunId, name: &str) -> continuum::Result<()> {
    let mut step = 0u64;
    while counter(store, run, &format!("count-{name}"))? < total_messages() as i64 {
        if store.pending_messages(run, "work", name, 1)?.is_empty() {
            std::thread::sleep(Duration::from_millis(2));
            continue;
        }
        store.execute_retrying(run, name, &format!("take-{step}"), &[], 1_000, |exchange| {
            let messages = exchange.receive("work", name, 100).map_err(failure)?;
            let values: Vec<u64> = messages
                .iter()
                .map(|message| String::from_utf8_lossy(&message.payload).parse().expect("a number"))
                .collect();
            let sum = match exchange.read("sum").map_err(failure)? {
                Some(Versioned { value: StateValue::Bytes(bytes), .. }) => {
                    u64::from_le_bytes(bytes.try_into().expect("8"))
                }
                Some(other) => panic!("the sum holds bytes: {other:?}"),
                None => 0,
            };
            exchange.put("sum", (sum + values.iter().sum::<u64>()).to_le_bytes().to_vec()).map_err(failure)?;
            exchange.add(format!("count-{name}"), values.len() as i64).map_err(failure)?;
            let result = values.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
            Ok(AtomOutput { result: result.into_bytes(), ..AtomOutput::default() })
        })?;
        step += 1;
    }
    Ok(())
}

/// A counter's total, 0 before its first addition.
fn counter(store: &Store, run: RunId, key: &str) -> continuum::Result<i64> {
    match store.read_state(run, key)? {
        Some(Versioned { value: StateValue::Counter(total), .. }) => Ok(total),
        Some(other) => panic!("{key} holds a counter: {other:?}"),
        None => Ok(0),
    }
}

/// The four agents, each on its own thread, until every message is processed.
fn run_team(dir: &Path) {
    let store = Store::open(dir).expect("open");
    let run = match store.run_id("team") {
        Some(run) => run,
        None => store.create_run(RunSpec::new("team")).expect("run"),
    };
    std::thread::scope(|scope| {
        let store = &store;
        for p in 0..PRODUCERS {
            scope.spawn(move || produce(store, run, p).expect("producer"));
        }
        for name in CONSUMERS {
            scope.spawn(move || consume(store, run, name).expect("consumer"));
        }
    });
}

#[test]
fn team_crash_child() {
    let Ok(dir) = std::env::var(CHILD_ENV) else { return };
    run_team(Path::new(&dir));
    println!("FINISHED");
}

/// Checks the store against its completed atoms; returns how many messages were sent and how
/// many each consumer processed.
fn check(dir: &Path, context: &str) -> (u64, Vec<usize>) {
    let store = Store::open(dir).expect("reopen after SIGKILL");
    let Some(run) = store.run_id("team") else { return (0, vec![0; CONSUMERS.len()]) };
    let completed = |agent: &str| -> Vec<Vec<u8>> {
        let atoms = store.agent_atoms(run, agent);
        let atoms = atoms.into_iter().map(|atom| store.atom(atom).expect("atom"));
        atoms
            .filter(|atom| atom.status == AtomStatus::Completed)
            .map(|atom| atom.output.expect("output").result)
            .collect()
    };
    let sent: u64 = (0..PRODUCERS).map(|p| completed(&format!("p{p}")).len() as u64 * MESSAGES_PER_ATOM).sum();
    assert_eq!(counter(&store, run, "sent").expect("sent") as u64, sent, "{context}: the sent counter");
    let mut sum = 0u64;
    let mut processed = Vec::new();
    for name in CONSUMERS {
        let mut seen: BTreeMap<u64, u32> = BTreeMap::new();
        for result in completed(name) {
            for value in String::from_utf8(result).expect("text").split(',').filter(|v| !v.is_empty()) {
                *seen.entry(value.parse().expect("a number")).or_default() += 1;
            }
        }
        let twice: Vec<_> = seen.iter().filter(|(_, count)| **count > 1).collect();
        assert!(twice.is_empty(), "{context}: {name} processed messages twice: {twice:?}");
        let count = seen.len() as u64;
        assert_eq!(counter(&store, run, &format!("count-{name}")).expect("count") as u64, count, "{context}: {name}");
        // The processed messages are exactly the channel's first `count`, as the offset says.
        let offset = store.consumer_offset(run, "work", name).expect("offset");
        let pending = store.pending_messages(run, "work", name, 4096).expect("pending");
        assert!(pending.iter().all(|message| message.id.get() > offset), "{context}: {name} offset");
        assert_eq!(pending.len() as u64, (sent - count).min(4096), "{context}: {name} sees every other message");
        sum += seen.keys().sum::<u64>();
        processed.push(seen.len());
    }
    let stored = match store.read_state(run, "sum").expect("sum") {
        Some(Versioned { value: StateValue::Bytes(bytes), .. }) => u64::from_le_bytes(bytes.try_into().expect("8")),
        None => 0,
        other => panic!("{context}: the sum holds bytes: {other:?}"),
    };
    assert_eq!(stored, sum, "{context}: the shared sum is every processed value once (no lost update)");
    (sent, processed)
}

#[test]
fn sigkill_keeps_messages_exactly_once_and_shared_state_serializable() {
    let iterations: u32 = std::env::var("CONTINUUM_CRASH_ITERATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(50);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut rng = continuum::synthetic::SplitMix64::new(0x7ea3);
    let mut finished_early = 0;
    for iteration in 0..iterations.max(50) {
        let delay = Duration::from_millis(30 + rng.below(170));
        let lines = common::run_child_until_killed("team_crash_child", CHILD_ENV, dir.path(), delay);
        if lines.iter().any(|line| line == "FINISHED") {
            finished_early += 1;
        }
        check(dir.path(), &format!("after kill {iteration}"));
    }
    run_team(dir.path());
    let (sent, processed) = check(dir.path(), "at the end");
    assert_eq!(sent, total_messages());
    assert_eq!(processed, vec![total_messages() as usize; CONSUMERS.len()], "every message processed by each");
    let all: u64 = (0..PRODUCERS).flat_map(|p| (0..MESSAGES_PER_PRODUCER).map(move |n| value(p, n))).sum();
    let store = Store::open(dir.path()).expect("open");
    let run = store.run_id("team").expect("run");
    assert_eq!(counter(&store, run, "sent").expect("sent") as u64, total_messages());
    let sum = store.read_state(run, "sum").expect("sum").expect("written");
    assert_eq!(sum.value, StateValue::Bytes((all * CONSUMERS.len() as u64).to_le_bytes().to_vec()));
    eprintln!(
        "{iterations} SIGKILLs ({finished_early} runs finished before their kill); sum at version {}",
        sum.version
    );
}
