//! Unit tests of leases on one open store: grants, renewals, releases, expiry, the fence's
//! refusals, and the table read back from the log after a reopen.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;
use crate::lease::LEASE_AGENT;
use crate::storage::sim::{Fault, FaultKind, Op, SimStorage};
use crate::store::{AtomOutput, RunSpec, Store, now_us};

const LONG: Duration = Duration::from_secs(60);

fn open(sim: &SimStorage) -> Store {
    Store::builder(Path::new("/store")).storage(Arc::new(sim.clone())).background(false).open().expect("open")
}

#[test]
fn grants_renewals_and_releases_are_control_atoms_read_back_after_a_reopen() {
    let sim = SimStorage::new(1);
    let store = open(&sim);
    let run = store.create_run(RunSpec::new("r")).expect("run");
    assert_eq!(store.lease_of(run).expect("lease_of"), None);
    let first = store.acquire_lease(run, "w1", LONG).expect("grant");
    assert_eq!((first.token, first.holder.as_str()), (1, "w1"));
    let renewed = store.renew_lease(&first, LONG * 2).expect("renew");
    assert_eq!(renewed.token, 1);
    assert!(renewed.expires_at_unix_us > first.expires_at_unix_us);
    assert_eq!(store.lease_of(run).expect("lease_of"), Some(renewed.clone()));
    let keys: Vec<String> = store.agent_history(run, LEASE_AGENT).map(|atom| atom.expect("atom").key).collect();
    assert_eq!(keys, ["1", "2"], "one control atom per event, keyed by its number");
    drop(store);
    let store = open(&sim);
    assert_eq!(store.lease_of(run).expect("lease_of"), Some(renewed.clone()), "read back from the log");
    assert!(matches!(store.acquire_lease(run, "w2", LONG), Err(Error::LeaseHeld { token: 1, .. })));
    store.release_lease(renewed).expect("release");
    drop(store);
    let store = open(&sim);
    assert_eq!(store.lease_of(run).expect("lease_of"), None, "the release is durable");
    assert_eq!(store.acquire_lease(run, "w2", LONG).expect("grant").token, 2);
}

#[test]
fn an_expired_lease_holds_nothing_and_its_token_writes_nothing() {
    let dir = tempfile::tempdir().expect("dir");
    let store = Store::open(dir.path()).expect("open");
    let run = store.create_run(RunSpec::new("r")).expect("run");
    let lease = store.acquire_lease(run, "w1", Duration::from_millis(1)).expect("grant");
    while now_us() <= lease.expires_at_unix_us {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(store.lease_of(run).expect("lease_of"), None);
    let refused = store.execute_leased(&lease, "a", "k", &[], |_| Ok(AtomOutput::default()));
    assert!(matches!(refused, Err(Error::StaleLease { token: 1, current: 1, .. })), "{refused:?}");
    assert!(matches!(store.renew_lease(&lease, LONG), Err(Error::StaleLease { .. })));
    assert!(store.record_atom(run, "a", "k", &[], "", &AtomOutput::default()).is_ok(), "no live lease");
    assert_eq!(store.acquire_lease(run, "w2", LONG).expect("grant").token, 2);
}

#[test]
fn bad_arguments_are_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().expect("dir");
    let store = Store::open(dir.path()).expect("open");
    let run = store.create_run(RunSpec::new("r")).expect("run");
    let invalid = |result: crate::Result<crate::Lease>| matches!(result, Err(Error::InvalidArgument { .. }));
    assert!(invalid(store.acquire_lease(run, "", LONG)));
    assert!(invalid(store.acquire_lease(run, &"h".repeat(crate::limits::LEASE_HOLDER_BYTES_MAX + 1), LONG)));
    assert!(invalid(store.acquire_lease(run, "w", Duration::ZERO)));
    assert!(invalid(store.acquire_lease(run, "w", Duration::from_secs(2 * 24 * 3600))));
    let unknown = crate::RunId::from_raw(99);
    assert!(matches!(store.acquire_lease(unknown, "w", LONG), Err(Error::UnknownRun { .. })));
    assert!(matches!(store.lease_of(unknown), Err(Error::UnknownRun { .. })));
    assert!(store.agent_history(run, LEASE_AGENT).next().is_none(), "nothing was written");
    let refused = store.record_atom(run, LEASE_AGENT, "1", &[], "", &AtomOutput::default());
    assert!(matches!(refused, Err(Error::InvalidArgument { .. })), "callers cannot forge a lease atom");
}

#[test]
fn a_grant_that_fails_to_land_grants_nothing() {
    let sim = SimStorage::new(3);
    let store = open(&sim);
    let run = store.create_run(RunSpec::new("r")).expect("run");
    sim.inject(Fault { op: Some(Op::Write), nth: 1, kind: FaultKind::NoSpace });
    assert!(matches!(store.acquire_lease(run, "w1", LONG), Err(Error::NoSpace { .. })));
    assert_eq!(store.lease_of(run).expect("lease_of"), None);
    drop(store);
    let store = open(&sim);
    assert_eq!(store.lease_of(run).expect("lease_of"), None);
    assert_eq!(store.acquire_lease(run, "w1", LONG).expect("grant").token, 1);
}

#[test]
fn a_leased_atom_is_fenced_for_its_own_thread_only() {
    let dir = tempfile::tempdir().expect("dir");
    let store = Store::open(dir.path()).expect("open");
    let run = store.create_run(RunSpec::new("r")).expect("run");
    let lease = store.acquire_lease(run, "w1", LONG).expect("grant");
    let outcome = store.execute_leased(&lease, "a", "k", &[], |exchange| {
        let atom = exchange.atom();
        // Another thread completing the atom presents no token.
        let other = std::thread::scope(|scope| {
            scope.spawn(|| store.complete_atom(atom, &AtomOutput::default())).join().expect("thread")
        });
        assert!(matches!(other, Err(Error::LeaseHeld { .. })), "{other:?}");
        Ok(AtomOutput { result: b"mine".to_vec(), ..AtomOutput::default() })
    });
    let executed = outcome.expect("the holder's completion").executed;
    assert_eq!(store.atom(executed.atom).expect("atom").output.map(|o| o.result), Some(b"mine".to_vec()));
    let again = store.execute_leased(&lease, "a", "k", &[], |_| panic!("replayed")).expect("replay");
    assert!(again.executed.replayed);
    assert!(store.shared.leases.forget_atom(executed.atom).is_none(), "nothing stays noted");
}

#[test]
fn a_lease_atom_s_result_is_described_for_the_dump_tool() {
    let dir = tempfile::tempdir().expect("dir");
    let store = Store::open(dir.path()).expect("open");
    let run = store.create_run(RunSpec::new("r")).expect("run");
    let lease = store.acquire_lease(run, "w1", LONG).expect("grant");
    store.release_lease(lease.clone()).expect("release");
    let described: Vec<String> = store
        .agent_history(run, LEASE_AGENT)
        .map(|atom| crate::lease::describe_event(&atom.expect("atom").output.expect("output").result).expect("decodes"))
        .collect();
    let until = lease.expires_at_unix_us;
    assert_eq!(
        described,
        [
            format!("lease event 1: token 1 granted to \"w1\" until unix microsecond {until}"),
            "lease event 2: token 1 released by \"w1\"".to_owned(),
        ]
    );
    assert_eq!(crate::lease::describe_event(b"not a lease event"), None);
}

/// A guarded side effect inside `execute_leased` work runs once and is recorded with the atom:
/// the atom's start is in the log before its work runs, as in `execute_with`.
#[test]
fn a_guard_inside_leased_work_runs_once() {
    let dir = tempfile::tempdir().expect("dir");
    let store = crate::Store::open(dir.path()).expect("open");
    let run = store.create_run(crate::RunSpec::new("r")).expect("run");
    let lease = store.acquire_lease(run, "w", std::time::Duration::from_secs(60)).expect("lease");
    let mut charged = 0;
    let done = store
        .execute_leased(&lease, "agent", "step", &[], |exchange| {
            let atom = exchange.atom();
            let receipt = store.guarded(atom, "charge", |_| {
                charged += 1;
                Ok(b"charged".to_vec())
            })?;
            Ok(crate::AtomOutput { result: receipt, ..crate::AtomOutput::default() })
        })
        .expect("leased step with a guard");
    assert_eq!((charged, done.executed.output.result.as_slice()), (1, &b"charged"[..]));
    drop(store);
    let store = crate::Store::open(dir.path()).expect("reopen");
    let lease = store.acquire_lease(run, "w2", std::time::Duration::from_secs(60));
    assert!(matches!(lease, Err(crate::Error::LeaseHeld { .. })), "the first lease still holds");
}
