//! The leases' in-memory state of an open store: the locks, the cache of each run's newest
//! lease event, the atoms begun under a lease, and the keys being executed under one. All of
//! it is bounded, and all but the locks is rebuilt from the log (or needs no rebuild) after a
//! reopen.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU8, Ordering};
use std::thread::ThreadId;

use parking_lot::{Condvar, Mutex, RwLock};

use crate::error::Error;
use crate::lease::record::LeaseEvent;
use crate::limits::{LEASE_LOCKS, LEASE_RUNS_CACHED_MAX, LEASED_ATOMS_IN_FLIGHT_MAX};
use crate::store::{AtomId, RunId};

/// [`LeaseState::leased`]: not looked at yet since the open.
const UNKNOWN: u8 = 0;
/// No run of the store has a lease atom.
const NEVER: u8 = 1;
/// Some run of the store has (or is getting) a lease atom.
const SOME: u8 = 2;

/// A run's lease as its newest lease atom left it (all zero for a run never leased).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct RunLease {
    /// The newest lease atom's event number (its key); 0 if none.
    pub event: u64,
    /// The newest granted token; 0 if none.
    pub token: u64,
    pub holder: String,
    /// 0 once released (or never granted).
    pub expires_at_unix_us: u64,
}

impl RunLease {
    /// Whether a lease holds the run at `now_us`.
    pub fn is_live(&self, now_us: u64) -> bool {
        self.expires_at_unix_us > now_us
    }
}

impl From<LeaseEvent> for RunLease {
    fn from(event: LeaseEvent) -> Self {
        RunLease {
            event: event.event,
            token: event.token,
            holder: event.holder,
            expires_at_unix_us: event.expires_at_unix_us,
        }
    }
}

/// An atom begun under a lease by [`Store::execute_leased`](crate::Store::execute_leased).
pub(crate) struct LeasedAtom {
    pub token: u64,
    /// The thread that begun it: only its completions present the token.
    pub thread: ThreadId,
}

/// The leases of an open store (a field of the store's shared state).
pub(crate) struct LeaseState {
    /// Whether any run may be leased: [`UNKNOWN`], [`NEVER`] or [`SOME`]. While it is not
    /// [`SOME`], completions take no lease lock (`gate` only).
    leased: AtomicU8,
    /// Held shared by completions that skip the lease check (`leased` is [`NEVER`]), and
    /// exclusively by the first grant while it sets [`SOME`]: no such completion lands after a grant.
    gate: RwLock<()>,
    /// A run's lease lock is `locks[run % LEASE_LOCKS]`: taken shared by its completions from
    /// the check to the index update, exclusively by its grants, renewals and releases.
    locks: Box<[RwLock<()>]>,
    /// Runs' newest lease events; written under the run's lock. A cache: cleared when full.
    runs: Mutex<HashMap<u64, RunLease>>,
    /// Atoms begun under a lease, until the call that began them returns.
    atoms: Mutex<HashMap<u64, LeasedAtom>>,
    /// (run, agent, key) being executed under a lease, and the signal that one ended.
    claims: Mutex<HashSet<(u64, String, String)>>,
    claim_ended: Condvar,
}

impl Default for LeaseState {
    fn default() -> Self {
        Self {
            leased: AtomicU8::new(UNKNOWN),
            gate: RwLock::new(()),
            locks: (0..LEASE_LOCKS).map(|_| RwLock::new(())).collect(),
            runs: Mutex::new(HashMap::new()),
            atoms: Mutex::new(HashMap::new()),
            claims: Mutex::new(HashSet::new()),
            claim_ended: Condvar::new(),
        }
    }
}

impl LeaseState {
    /// The lock of `run`'s lease.
    pub fn lock(&self, run: RunId) -> &RwLock<()> {
        &self.locks[(run.get() % LEASE_LOCKS as u64) as usize]
    }

    /// Whether some run may be leased, `None` while not known since the open.
    pub fn leased(&self) -> Option<bool> {
        match self.leased.load(Ordering::Acquire) {
            UNKNOWN => None,
            state => Some(state == SOME),
        }
    }

    /// Records what the open's index says (`any`: some run has a lease atom), unless a grant
    /// already said so.
    pub fn settle(&self, any: bool) {
        let state = if any { SOME } else { NEVER };
        let _ = self.leased.compare_exchange(UNKNOWN, state, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Before a grant: once this returns, every completion checks the lease of its run.
    pub fn open_gate(&self) {
        if self.leased.load(Ordering::Acquire) != SOME {
            // Waits for the completions that skipped the check to land.
            let _exclusive = self.gate.write();
            self.leased.store(SOME, Ordering::Release);
        }
    }

    /// The gate held shared by a completion that skips the lease check, if it may (no run of
    /// the store is leased); `None` if it must check.
    pub fn unleased_gate(&self) -> Option<parking_lot::RwLockReadGuard<'_, ()>> {
        if self.leased.load(Ordering::Acquire) != NEVER {
            return None;
        }
        let shared = self.gate.read();
        (self.leased.load(Ordering::Acquire) == NEVER).then_some(shared)
    }

    /// The cached lease of `run`, if any.
    pub fn cached(&self, run: RunId) -> Option<RunLease> {
        self.runs.lock().get(&run.get()).cloned()
    }

    /// Caches `run`'s lease; the caller holds the run's lock.
    pub fn cache(&self, run: RunId, lease: RunLease) {
        let mut runs = self.runs.lock();
        if runs.len() >= LEASE_RUNS_CACHED_MAX && !runs.contains_key(&run.get()) {
            runs.clear();
        }
        runs.insert(run.get(), lease);
    }

    /// Notes an atom begun under a lease; hands it back, noting nothing, past
    /// [`LEASED_ATOMS_IN_FLIGHT_MAX`] ([`too_many_atoms`] is the error to return then).
    pub fn note_atom(&self, atom: AtomId, leased: LeasedAtom) -> std::result::Result<(), LeasedAtom> {
        let mut atoms = self.atoms.lock();
        if atoms.len() >= LEASED_ATOMS_IN_FLIGHT_MAX {
            return Err(leased);
        }
        let previous = atoms.insert(atom.get(), leased);
        assert!(previous.is_none(), "an atom is begun under one lease at a time");
        Ok(())
    }

    /// The token `atom` presents when the current thread completes it, if it was begun under
    /// a lease by this thread.
    pub fn presented(&self, atom: AtomId) -> Option<u64> {
        let atoms = self.atoms.lock();
        let leased = atoms.get(&atom.get())?;
        (leased.thread == std::thread::current().id()).then_some(leased.token)
    }

    /// Forgets `atom`; returns what was noted of it.
    pub fn forget_atom(&self, atom: AtomId) -> Option<LeasedAtom> {
        self.atoms.lock().remove(&atom.get())
    }

    /// Claims (run, agent, key) for one execution under a lease, waiting while another thread
    /// holds it; the claim ends when the returned guard drops.
    pub fn claim(&self, run: RunId, agent: &str, key: &str) -> Claim<'_> {
        let claimed = (run.get(), agent.to_owned(), key.to_owned());
        let mut claims = self.claims.lock();
        while claims.contains(&claimed) {
            self.claim_ended.wait(&mut claims);
        }
        claims.insert(claimed.clone());
        Claim { state: self, claimed }
    }
}

/// [`Error::LimitExceeded`] for an atom begun past [`LEASED_ATOMS_IN_FLIGHT_MAX`].
pub(crate) fn too_many_atoms() -> Error {
    Error::LimitExceeded { what: "atoms in flight under leases".into(), limit: LEASED_ATOMS_IN_FLIGHT_MAX as u64 }
}

/// A key claimed by [`LeaseState::claim`].
pub(crate) struct Claim<'a> {
    state: &'a LeaseState,
    claimed: (u64, String, String),
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.state.claims.lock().remove(&self.claimed);
        self.state.claim_ended.notify_all();
    }
}
