//! Fencing: the check at the places an atom's end is appended (`Store::finish_atom`,
//! `Store::complete_atom_with`, `Store::record`) that only the holder of a run's lease ends
//! its atoms. The check and the append are atomic: the completion holds its run's lease lock
//! shared from the check to its index update, and grants hold it exclusively.
//!
//! A store in which no run was ever leased skips the check: its completions hold only the
//! gate, shared, which the store's first grant takes exclusively once.

use parking_lot::RwLockReadGuard;

use crate::error::{Error, Result};
use crate::lease::LEASE_AGENT;
use crate::lease::grant::held;
use crate::lease::table::RunLease;
use crate::store::{AtomId, RunId, Store, is_control_agent, now_us};

/// What an atom's end holds from its lease check until its index update: the gate or its
/// run's lease lock, shared (nothing for the store's own agents).
#[must_use = "the fence holds until the completion's index update"]
pub(crate) struct Fence<'a> {
    _held: Option<RwLockReadGuard<'a, ()>>,
}

impl Store {
    /// Checks that the end of `atom` may land now and holds that true until the fence drops:
    /// refused if its run has a live lease whose token the current thread does not present
    /// for it (an atom it began in [`Store::execute_leased`]), or if the token it presents is
    /// no longer current or expired.
    ///
    /// # Errors
    /// [`Error::LeaseHeld`], [`Error::StaleLease`]; the errors of reading the run's lease.
    pub(crate) fn fence_end(&self, atom: AtomId) -> Result<Fence<'_>> {
        if let Some(gate) = self.unleased_gate() {
            return Ok(Fence { _held: Some(gate) });
        }
        let leases = &self.shared.leases;
        let run = self.shared.index.read().atom(atom).map(|entry| RunId::from_raw(u64::from(entry.run)));
        // An unknown atom is refused by the transition that follows.
        let Some(run) = run else { return Ok(Fence { _held: None }) };
        let shared = leases.lock(run).read();
        let presented = leases.presented(atom);
        if presented.is_some() || self.has_lease_atoms(run) {
            admit(run, self.run_lease(run)?, presented, now_us())?;
        }
        Ok(Fence { _held: Some(shared) })
    }

    /// [`Store::fence_end`] for an atom of `agent` in `run` recorded whole (start and end in
    /// one batch), which presents no token. The store's own agents are not fenced.
    ///
    /// # Errors
    /// [`Error::LeaseHeld`]; the errors of reading the run's lease.
    pub(crate) fn fence_record(&self, run: RunId, agent: &str) -> Result<Fence<'_>> {
        if is_control_agent(agent) {
            return Ok(Fence { _held: None });
        }
        if let Some(gate) = self.unleased_gate() {
            return Ok(Fence { _held: Some(gate) });
        }
        let shared = self.shared.leases.lock(run).read();
        if self.has_lease_atoms(run) {
            admit(run, self.run_lease(run)?, None, now_us())?;
        }
        Ok(Fence { _held: Some(shared) })
    }

    /// The gate, shared, if no run of the store is leased (settled from the index the first
    /// time it is asked after the open).
    fn unleased_gate(&self) -> Option<RwLockReadGuard<'_, ()>> {
        let leases = &self.shared.leases;
        if leases.leased().is_none() {
            let any = self.shared.index.read().agents.iter().any(|(_, name)| &**name == LEASE_AGENT);
            leases.settle(any);
        }
        leases.unleased_gate()
    }
}

/// Whether an end presenting `presented` (or no token) may land in `run` whose lease is
/// `current`, at `now_us`.
///
/// # Errors
/// [`Error::StaleLease`] for a token that is not current or whose lease expired;
/// [`Error::LeaseHeld`] for no token while a lease is live.
pub(crate) fn admit(run: RunId, current: RunLease, presented: Option<u64>, now_us: u64) -> Result<()> {
    let live = current.is_live(now_us);
    match presented {
        Some(token) if token == current.token && live => Ok(()),
        Some(token) => Err(Error::StaleLease { run: run.get(), token, current: current.token }),
        None if live => Err(held(run, current)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_current_unexpired_token_or_no_live_lease_admits() {
        let run = RunId::from_raw(1);
        let lease = RunLease { event: 2, token: 2, holder: "a".into(), expires_at_unix_us: 100 };
        assert!(admit(run, lease.clone(), Some(2), 99).is_ok());
        assert!(matches!(admit(run, lease.clone(), Some(2), 100), Err(Error::StaleLease { current: 2, .. })));
        assert!(matches!(admit(run, lease.clone(), Some(1), 50), Err(Error::StaleLease { token: 1, .. })));
        assert!(matches!(admit(run, lease.clone(), None, 99), Err(Error::LeaseHeld { token: 2, .. })));
        assert!(admit(run, lease.clone(), None, 100).is_ok(), "an expired lease holds nothing");
        let released = RunLease { expires_at_unix_us: 0, ..lease };
        assert!(admit(run, released.clone(), None, 0).is_ok());
        assert!(admit(run, released, Some(2), 0).is_err(), "a released token writes nothing");
        assert!(admit(run, RunLease::default(), None, 0).is_ok(), "a run never leased");
    }
}
