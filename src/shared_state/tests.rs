//! Shared state's unit tests, and the model-based test of its concurrency control: random
//! interleavings of atoms that read and write keys, committed against a serial model.

use std::collections::BTreeMap;

use proptest::prelude::*;

use crate::channel::Exchange;
use crate::error::Error;
use crate::shared_state::{StateKey, StateValue, Versioned};
use crate::store::{AtomOutput, AtomStatus, RunId, RunSpec, Store};

fn open(dir: &std::path::Path) -> Store {
    Store::builder(dir).background(false).open().expect("open")
}

fn bytes(value: u64) -> StateValue {
    StateValue::Bytes(value.to_le_bytes().to_vec())
}

#[test]
fn puts_adds_and_appends_are_versioned_and_survive_a_reopen() {
    let dir = tempfile::tempdir().expect("dir");
    let store = open(dir.path());
    let run = store.create_run(RunSpec::new("r")).expect("run");
    assert_eq!(store.read_state(run, "k").expect("read"), None);
    for step in 0..3u64 {
        store
            .execute_with(run, "agent", &format!("s{step}"), &[], |exchange| {
                exchange.put("k", step.to_le_bytes().to_vec())?;
                exchange.add("n", 5)?;
                exchange.add("n", -2)?;
                exchange.append("log", vec![step as u8])?;
                exchange.add(StateKey::store("global"), 1)?;
                Ok(AtomOutput::default())
            })
            .expect("commit");
    }
    let check = |store: &Store| {
        let read = |key: StateKey| store.read_state(run, key).expect("read").expect("written");
        assert_eq!(read("k".into()), Versioned { version: 3, value: bytes(2) });
        assert_eq!(read("n".into()), Versioned { version: 6, value: StateValue::Counter(9) });
        assert_eq!(
            read("log".into()),
            Versioned { version: 3, value: StateValue::List(vec![vec![0], vec![1], vec![2]]) }
        );
        assert_eq!(read(StateKey::store("global")), Versioned { version: 3, value: StateValue::Counter(3) });
        assert_eq!(store.read_state(run, StateKey::run("global")).expect("read"), None, "run and store keys differ");
    };
    check(&store);
    drop(store);
    let store = open(dir.path());
    check(&store);
    // After the reopen the versions go on from the log.
    store
        .execute_with(run, "agent", "s3", &[], |exchange| {
            assert_eq!(exchange.read("n")?.map(|read| read.version), Some(6));
            exchange.add("n", 1)?;
            assert_eq!(
                exchange.read("n")?,
                Some(Versioned { version: 6, value: StateValue::Counter(10) }),
                "own writes"
            );
            Ok(AtomOutput::default())
        })
        .expect("commit");
    assert_eq!(store.read_state(run, "n").expect("read").map(|read| read.version), Some(7));
}

#[test]
fn a_stale_read_refuses_the_whole_commit_and_a_retry_reads_again() {
    let dir = tempfile::tempdir().expect("dir");
    let store = open(dir.path());
    let run = store.create_run(RunSpec::new("r")).expect("run");
    let write = |key: &str, value: u64| {
        store.execute_with(run, "setup", key, &[], |exchange| {
            exchange.put("k", value.to_le_bytes().to_vec())?;
            Ok(AtomOutput::default())
        })
    };
    write("v1", 1).expect("v1");
    // The atom reads version 1; another atom writes version 2 before it commits.
    let refused = store.execute_with(run, "agent", "step", &[], |exchange| {
        assert_eq!(exchange.read("k")?.map(|read| read.version), Some(1));
        write("v2", 2).expect("v2");
        exchange.put("k", b"lost".to_vec())?;
        exchange.add("side", 1)?;
        exchange.send("out", b"lost".to_vec())?;
        Ok(AtomOutput::default())
    });
    let Err(Error::OutputNotRecorded { atom, source, .. }) = refused else { panic!("{refused:?}") };
    assert!(matches!(*source, Error::Conflict { ref key, expected: 1, found: 2 } if key == "k"), "{source:?}");
    assert_eq!(store.atom(crate::AtomId(atom)).expect("atom").status, AtomStatus::Running);
    assert_eq!(store.read_state(run, "k").expect("read").map(|read| read.value), Some(bytes(2)));
    assert_eq!(store.read_state(run, "side").expect("read"), None, "nothing of the atom was written");
    assert!(store.pending_messages(run, "out", "c", 10).expect("pending").is_empty(), "nor its message");
    // A retry of the same atom reads version 2 and commits.
    let mut runs = 0;
    let done = store
        .execute_retrying(run, "agent", "step", &[], 3, |exchange| {
            runs += 1;
            let read = exchange.read("k")?.expect("written");
            exchange.put("k", (read.version * 10).to_le_bytes().to_vec())?;
            Ok(AtomOutput::default())
        })
        .expect("retry");
    assert_eq!((done.executed.atom.get(), runs), (atom, 1));
    assert_eq!(store.read_state(run, "k").expect("read"), Some(Versioned { version: 3, value: bytes(20) }));
}

#[test]
fn a_write_of_another_kind_is_refused_and_writes_nothing() {
    let dir = tempfile::tempdir().expect("dir");
    let store = open(dir.path());
    let run = store.create_run(RunSpec::new("r")).expect("run");
    store
        .execute_with(run, "a", "1", &[], |exchange| {
            exchange.add("n", i64::MAX)?;
            Ok(AtomOutput::default())
        })
        .expect("counter");
    for (key, work) in [
        ("put", Box::new(|e: &mut Exchange<'_>| e.put("n", b"x".to_vec())) as Box<dyn Fn(&mut Exchange<'_>) -> _>),
        ("append", Box::new(|e: &mut Exchange<'_>| e.append("n", b"x".to_vec()))),
        ("overflow", Box::new(|e: &mut Exchange<'_>| e.add("n", 1))),
    ] {
        let refused = store.execute_with(run, "a", key, &[], |exchange| {
            exchange.add("other", 1)?;
            work(exchange)?;
            Ok(AtomOutput::default())
        });
        let Err(Error::OutputNotRecorded { source, .. }) = refused else { panic!("{key}: {refused:?}") };
        assert!(matches!(*source, Error::InvalidArgument { .. }), "{key}: {source:?}");
    }
    assert_eq!(store.read_state(run, "other").expect("read"), None);
    assert_eq!(store.read_state(run, "n").expect("read").map(|read| read.value), Some(StateValue::Counter(i64::MAX)));
    let bad = store.execute_with(run, "a", "bad", &[], |exchange| {
        exchange.put("a b", b"x".to_vec())?;
        Ok(AtomOutput::default())
    });
    assert!(matches!(bad, Err(Error::AtomFailed { .. })), "a bad key fails the atom: {bad:?}");
    assert!(matches!(store.read_state(run, "a b"), Err(Error::InvalidArgument { .. })));
}

/// One transaction of the model-based test: which keys it reads, which it writes (a value
/// computed from what it read) and what it adds to the counter.
#[derive(Clone, Debug)]
struct Transaction {
    reads: Vec<bool>,
    writes: Vec<bool>,
    add: Option<i8>,
}

const KEYS: [&str; 3] = ["a", "b", "c"];

fn transaction() -> impl Strategy<Value = Transaction> {
    (prop::collection::vec(any::<bool>(), 3), prop::collection::vec(any::<bool>(), 3), any::<Option<i8>>())
        .prop_map(|(reads, writes, add)| Transaction { reads, writes, add })
}

/// A history: transactions, and the order their opens and commits interleave in (each index
/// twice: the first is the open, the second the commit).
fn history() -> impl Strategy<Value = (Vec<Transaction>, Vec<usize>)> {
    prop::collection::vec(transaction(), 2..7).prop_flat_map(|transactions| {
        let events: Vec<usize> = (0..transactions.len()).flat_map(|at| [at, at]).collect();
        (Just(transactions), Just(events).prop_shuffle())
    })
}

/// What an open transaction saw: per key read, its version and value.
type Seen = BTreeMap<&'static str, (u64, Option<u64>)>;

fn value_of(read: Option<Versioned>) -> (u64, Option<u64>) {
    match read {
        None => (0, None),
        Some(Versioned { version, value: StateValue::Bytes(bytes) }) => {
            (version, Some(u64::from_le_bytes(bytes.try_into().expect("8 bytes"))))
        }
        Some(other) => panic!("keys hold bytes: {other:?}"),
    }
}

/// Opens transaction `at`: begins its atom, reads its keys and notes its writes.
fn open_transaction<'a>(store: &'a Store, run: RunId, at: usize, tx: &Transaction) -> (Exchange<'a>, Seen) {
    let atom = store.begin_atom(run, &format!("tx{at}"), "k", &[], "").expect("begin");
    let mut exchange = Exchange::new(store, run, atom);
    let mut seen = Seen::new();
    for (key, _) in KEYS.iter().zip(&tx.reads).filter(|(_, read)| **read) {
        seen.insert(key, value_of(exchange.read(*key).expect("read")));
    }
    let sum: u64 = seen.values().filter_map(|(_, value)| *value).sum();
    for (slot, (key, _)) in KEYS.iter().zip(&tx.writes).enumerate().filter(|(_, (_, write))| **write) {
        exchange.put(*key, (sum + 1000 * at as u64 + slot as u64).to_le_bytes().to_vec()).expect("put");
    }
    if let Some(add) = tx.add {
        exchange.add("n", i64::from(add)).expect("add");
    }
    (exchange, seen)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Every committed transaction saw exactly the state of a serial execution in commit order
    /// (so the history is serializable), every refused one read a key that had changed, and
    /// the store ends, and reopens, in the serial model's state.
    #[test]
    fn committed_histories_are_serializable((transactions, events) in history()) {
        let dir = tempfile::tempdir().expect("dir");
        let store = open(dir.path());
        let run = store.create_run(RunSpec::new("r")).expect("run");
        let mut model: BTreeMap<&str, (u64, Option<u64>)> = KEYS.iter().map(|key| (*key, (0, None))).collect();
        let mut counter = (0u64, 0i64);
        let mut open_ones: Vec<Option<(Exchange<'_>, Seen)>> = (0..transactions.len()).map(|_| None).collect();
        let mut opened = vec![false; transactions.len()];
        for at in events {
            if !opened[at] {
                opened[at] = true;
                open_ones[at] = Some(open_transaction(&store, run, at, &transactions[at]));
                continue;
            }
            let (exchange, seen) = open_ones[at].take().expect("opened before its commit");
            match store.commit_exchange(exchange, AtomOutput::default()) {
                Ok(_) => {
                    for (key, read) in &seen {
                        prop_assert_eq!(model[key], *read, "tx{} read {} as the serial order has it", at, key);
                    }
                    let sum: u64 = seen.values().filter_map(|(_, value)| *value).sum();
                    for (slot, (key, _)) in KEYS.iter().zip(&transactions[at].writes).enumerate().filter(|(_, (_, w))| **w) {
                        let entry = model.get_mut(key).expect("a key");
                        *entry = (entry.0 + 1, Some(sum + 1000 * at as u64 + slot as u64));
                    }
                    if let Some(add) = transactions[at].add {
                        counter = (counter.0 + 1, counter.1 + i64::from(add));
                    }
                }
                Err(Error::OutputNotRecorded { source, .. }) => {
                    let Error::Conflict { key, expected, found } = *source else { panic!("{source:?}") };
                    let key = KEYS.iter().find(|k| **k == key).expect("a model key");
                    prop_assert_eq!(seen[key].0, expected);
                    prop_assert_eq!(model[key].0, found, "the conflict reports the newest version");
                    prop_assert_ne!(expected, found, "a conflict only when the key changed");
                }
                Err(other) => panic!("{other:?}"),
            }
        }
        let check = |store: &Store| -> Result<(), TestCaseError> {
            for key in KEYS {
                prop_assert_eq!(value_of(store.read_state(run, key).expect("read")), model[key]);
            }
            let n = store.read_state(run, "n").expect("read");
            let expected = (counter.0 > 0).then_some(Versioned { version: counter.0, value: StateValue::Counter(counter.1) });
            prop_assert_eq!(n, expected);
            Ok(())
        };
        check(&store)?;
        drop(open_ones);
        drop(store);
        check(&open(dir.path()))?;
    }
}
