//! Atoms recorded with their delta already encoded (`Store::record_atom_encoded`,
//! `Store::complete_atom_encoded`), as a binding or a framework that serializes its own
//! index snapshots hands them over: the store holds, returns and replays exactly what it would from
//! the `Delta` itself, before and after a reopen; bytes that are not a `Delta` are refused with
//! `Error::InvalidDelta` and leave no trace.

use continuum::synthetic::Transcript;
use continuum::{AtomId, AtomOutput, AtomStatus, Error, RunSpec, Store};
use prost::Message;

const ATOMS: u64 = 60;

fn output(n: u64) -> AtomOutput {
    AtomOutput { delta: Transcript::new(n).next_delta(300 + (n as usize % 7) * 100), result: n.to_le_bytes().to_vec() }
}

/// Records the same chain of atoms in `store`, from the deltas or from their bytes, every
/// third one through `begin_atom` and a completion.
fn record_chain(store: &Store, encoded: bool) -> Vec<AtomId> {
    let run = store.create_run(RunSpec::new("run")).expect("run");
    let mut atoms: Vec<AtomId> = Vec::new();
    for n in 0..ATOMS {
        let parents: Vec<AtomId> = atoms.last().copied().into_iter().collect();
        let (key, output) = (format!("step-{n}"), output(n));
        let bytes = output.delta.encode_to_vec();
        let atom = if n % 3 == 0 {
            let atom = store.begin_atom(run, "agent", &key, &parents, "").expect("begin");
            if encoded {
                store.complete_atom_encoded(atom, &bytes, &output.result).expect("complete encoded");
            } else {
                store.complete_atom(atom, &output).expect("complete");
            }
            atom
        } else if encoded {
            store.record_atom_encoded(run, "agent", &key, &parents, "", &bytes, &output.result).expect("record encoded")
        } else {
            store.record_atom(run, "agent", &key, &parents, "", &output).expect("record")
        };
        atoms.push(atom);
    }
    atoms
}

/// Every atom's output and every context, as each store returns them.
fn contents(store: &Store, atoms: &[AtomId]) -> Vec<(Option<AtomOutput>, continuum::Context)> {
    atoms
        .iter()
        .map(|atom| {
            let output = store.atom(*atom).expect("atom").output;
            (output, store.rebuild_context(*atom).expect("rebuild").context)
        })
        .collect()
}

#[test]
fn encoded_deltas_are_stored_and_replayed_as_the_deltas_themselves() {
    let (dir_a, dir_b) = (tempfile::tempdir().expect("dir"), tempfile::tempdir().expect("dir"));
    let (from_deltas, from_bytes) =
        (Store::open(dir_a.path()).expect("open"), Store::open(dir_b.path()).expect("open"));
    let atoms = record_chain(&from_deltas, false);
    assert_eq!(record_chain(&from_bytes, true), atoms, "the same atoms");
    let want = contents(&from_deltas, &atoms);
    assert_eq!(want[7].0, Some(output(7)), "the outputs are the atoms'");
    assert!(contents(&from_bytes, &atoms) == want, "the same outputs and contexts");
    drop((from_deltas, from_bytes));
    let (from_deltas, from_bytes) =
        (Store::open(dir_a.path()).expect("open"), Store::open(dir_b.path()).expect("open"));
    assert!(contents(&from_deltas, &atoms) == want, "after a reopen");
    assert!(contents(&from_bytes, &atoms) == want, "after a reopen, from bytes");
}

#[test]
fn bytes_that_are_not_a_delta_are_refused_and_leave_no_trace() {
    let dir = tempfile::tempdir().expect("dir");
    let store = Store::open(dir.path()).expect("open");
    let run = store.create_run(RunSpec::new("run")).expect("run");
    let valid = output(1).delta.encode_to_vec();
    let mut bad_text = output(2).delta.encode_to_vec();
    // The first message's role is a string: make one of its bytes invalid UTF-8.
    let role_at = bad_text.iter().position(|b| b.is_ascii_alphabetic()).expect("a letter");
    bad_text[role_at] = 0xff;
    let next = store.log().next_lsn();
    for (bytes, what) in [
        (&b"\xff"[..], "a truncated varint"),
        (&valid[..valid.len() - 1], "a truncated delta"),
        (&bad_text[..], "a string that is not UTF-8"),
        (&[0x0a, 0x05, 0x0a][..], "a message longer than its bytes"),
    ] {
        let refused = store.record_atom_encoded(run, "agent", "step", &[], "", bytes, b"");
        assert!(matches!(refused, Err(Error::InvalidDelta { .. })), "{what}: {refused:?}");
    }
    assert_eq!(store.log().next_lsn(), next, "nothing was appended");
    let atom = store.record_atom_encoded(run, "agent", "step", &[], "", &valid, b"ok").expect("the key is still free");
    let begun = store.begin_atom(run, "agent", "next", &[atom], "").expect("begin");
    let refused = store.complete_atom_encoded(begun, &bad_text, b"");
    assert!(matches!(refused, Err(Error::InvalidDelta { .. })), "{refused:?}");
    assert_eq!(store.atom(begun).expect("atom").status, AtomStatus::Running, "still running");
    store.complete_atom_encoded(begun, &valid, b"done").expect("completes after the refusal");
    assert_eq!(
        store.atom(begun).expect("atom").output,
        Some(AtomOutput { delta: output(1).delta, result: b"done".to_vec() })
    );
}
