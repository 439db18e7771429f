//! [`Store::execute_leased`]: [`Store::execute_with`] for an atom begun and completed under a
//! lease, whose end lands only while the lease is its run's current one.

use std::cell::Cell;

use crate::channel::{Exchange, Exchanged};
use crate::error::Result;
use crate::lease::Lease;
use crate::lease::fence::admit;
use crate::lease::table::{LeasedAtom, too_many_atoms};
use crate::store::control::check_caller_agent;
use crate::store::{AtomFailure, AtomId, AtomOutput, Store, now_us};

impl Store {
    /// [`Store::execute_with`] in `lease`'s run, under `lease`: the atom's end (completion or
    /// failure, with its messages and offsets) lands only if `lease`'s token is still its
    /// run's current one and the lease has not expired when the end is appended; otherwise it
    /// is refused, nothing of its end is written, and the atom stays running for the run's
    /// next holder to execute again. A completed atom replays as in
    /// [`Store::execute_with`], without a check (its output is recorded already).
    ///
    /// Two threads executing the same (agent, key) under leases of the run take turns: the
    /// second waits for the first to return, then finds the atom completed and replays it, so
    /// `work` runs once.
    ///
    /// # Errors
    /// [`Error::StaleLease`](crate::Error::StaleLease) when `lease` is no longer current or
    /// expired: at the start (nothing begun), or inside
    /// [`Error::OutputNotRecorded`](crate::Error::OutputNotRecorded) when it lapsed while
    /// `work` ran (the output goes back to the caller, unrecorded);
    /// [`Error::LimitExceeded`](crate::Error::LimitExceeded) past
    /// [`LEASED_ATOMS_IN_FLIGHT_MAX`](crate::limits::LEASED_ATOMS_IN_FLIGHT_MAX) atoms in flight
    /// under leases; as [`Store::execute_with`].
    pub fn execute_leased(
        &self,
        lease: &Lease,
        agent: &str,
        key: &str,
        parents: &[AtomId],
        work: impl FnOnce(&mut Exchange<'_>) -> std::result::Result<AtomOutput, AtomFailure>,
    ) -> Result<Exchanged> {
        check_caller_agent(agent)?;
        let _claim = self.shared.leases.claim(lease.run, agent, key);
        let begun = Cell::new(None);
        let _forget = Forget { store: self, atom: &begun };
        let begin = |found: Option<AtomId>| {
            let atom = self.begin_leased(lease, found, (agent, key, parents))?;
            begun.set(Some(atom));
            Ok(atom)
        };
        self.exchange_in(lease.run, (agent, key, parents), begin, work)
    }

    /// Notes `found` (an atom of the key left running or failed retryably), or begins a new
    /// atom, as begun under `lease` by this thread.
    fn begin_leased(&self, lease: &Lease, found: Option<AtomId>, atom: (&str, &str, &[AtomId])) -> Result<AtomId> {
        let (agent, key, parents) = atom;
        {
            let _shared = self.shared.leases.lock(lease.run).read();
            admit(lease.run, self.run_lease(lease.run)?, Some(lease.token), now_us())?;
        }
        let noted = LeasedAtom { token: lease.token, thread: std::thread::current().id() };
        let atom = match found {
            Some(atom) => atom,
            // The start record is written now, as `execute_with` writes it: work inside the atom
            // (a guard, a suspension) needs the atom in the log. A refused end leaves it running,
            // for the next holder to execute again.
            None => self.begin_atom(lease.run, agent, key, parents, "")?,
        };
        self.shared.leases.note_atom(atom, noted).map(|()| atom).map_err(|_| too_many_atoms())
    }
}

/// Forgets the atom an [`Store::execute_leased`] began when it returns (or unwinds).
struct Forget<'a> {
    store: &'a Store,
    atom: &'a Cell<Option<AtomId>>,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        let Some(atom) = self.atom.get() else { return };
        self.store.shared.leases.forget_atom(atom);
    }
}
