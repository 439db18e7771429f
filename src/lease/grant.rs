//! Granting, renewing, releasing and reading a run's lease. Each change is one control atom
//! of [`LEASE_AGENT`] in the run, durable before it returns, written under the run's lease
//! lock held exclusively, so that no completion of the run is checked against a lease
//! that changes before it lands.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::lease::record::{self, EventKind, LeaseEvent};
use crate::lease::table::RunLease;
use crate::lease::{LEASE_AGENT, Lease};
use crate::limits::{LEASE_HOLDER_BYTES_MAX, LEASE_TTL_US_MAX};
use crate::store::{RunId, Store, now_us};

impl Store {
    /// Takes a lease on `run` for `holder`, valid for `ttl` of wall-clock time: until it
    /// expires or is released, only completions that present its token
    /// ([`Store::execute_leased`]) land in the run, and no other lease is granted on it. Each
    /// grant on a run gets a token one greater than the previous grant's, durable before this
    /// returns: after a crash and a reopen, the next grant's token is greater than every token
    /// ever granted. The expiry is wall-clock Unix microseconds, so a lease outlives a crash of
    /// its holder's process until its time (`docs/ARCHITECTURE.md`, "Leases").
    ///
    /// # Errors
    /// [`Error::LeaseHeld`] while another unexpired lease holds the run (whoever holds it);
    /// [`Error::InvalidArgument`] for an empty holder, one above
    /// [`LEASE_HOLDER_BYTES_MAX`] bytes, or a `ttl` of zero or above [`LEASE_TTL_US_MAX`];
    /// [`Error::UnknownRun`], [`Error::RunFinished`], and the log's errors. Nothing is
    /// granted on error.
    ///
    /// # Example
    /// ```
    /// # fn main() -> continuum::Result<()> {
    /// use std::time::Duration;
    /// use continuum::{AtomOutput, Error, RunSpec, Store};
    /// let dir = tempfile::tempdir().unwrap();
    /// let store = Store::open(dir.path())?;
    /// let run = store.create_run(RunSpec::new("pipeline"))?;
    /// let lease = store.acquire_lease(run, "worker-1", Duration::from_secs(30))?;
    /// assert!(matches!(store.acquire_lease(run, "worker-2", Duration::from_secs(30)), Err(Error::LeaseHeld { .. })));
    /// let step = store.execute_leased(&lease, "planner", "step-1", &[], |_| Ok(AtomOutput::default()))?;
    /// assert!(!step.executed.replayed);
    /// store.release_lease(lease)?;
    /// let next = store.acquire_lease(run, "worker-2", Duration::from_secs(30))?;
    /// assert_eq!(next.token, 2, "every grant's token is one greater than the previous grant's");
    /// # Ok(())
    /// # }
    /// ```
    pub fn acquire_lease(&self, run: RunId, holder: &str, ttl: Duration) -> Result<Lease> {
        check_holder(holder)?;
        let ttl_us = check_ttl(ttl)?;
        self.run_status(run)?;
        self.shared.leases.open_gate();
        let _exclusive = self.shared.leases.lock(run).write();
        let current = self.run_lease(run)?;
        let now = now_us();
        if current.is_live(now) {
            return Err(held(run, current));
        }
        let event = LeaseEvent {
            kind: EventKind::Grant,
            event: current.event + 1,
            token: current.token + 1,
            expires_at_unix_us: now.saturating_add(ttl_us),
            holder: holder.to_owned(),
        };
        self.record_lease_event(run, event)
    }

    /// Moves the expiry of `lease` to `ttl` from now; returns the renewed lease (same token).
    ///
    /// # Errors
    /// [`Error::StaleLease`] when `lease`'s token is no longer its run's current one or the
    /// lease expired (another holder may have the run; the caller must stop writing to it);
    /// the argument and log errors of [`Store::acquire_lease`].
    pub fn renew_lease(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        let ttl_us = check_ttl(ttl)?;
        let _exclusive = self.shared.leases.lock(lease.run).write();
        let current = self.current_lease_of(lease)?;
        let event = LeaseEvent {
            kind: EventKind::Renewal,
            event: current.event + 1,
            token: current.token,
            expires_at_unix_us: now_us().saturating_add(ttl_us),
            holder: current.holder,
        };
        self.record_lease_event(lease.run, event)
    }

    /// Ends `lease` before its expiry, durably: the next [`Store::acquire_lease`] on its run
    /// need not wait for the expiry.
    ///
    /// # Errors
    /// [`Error::StaleLease`] as [`Store::renew_lease`] (an expired lease is released already);
    /// the log's errors.
    pub fn release_lease(&self, lease: Lease) -> Result<()> {
        let _exclusive = self.shared.leases.lock(lease.run).write();
        let current = self.current_lease_of(&lease)?;
        let event = LeaseEvent {
            kind: EventKind::Release,
            event: current.event + 1,
            token: current.token,
            expires_at_unix_us: 0,
            holder: current.holder,
        };
        self.record_lease_event(lease.run, event).map(|_| ())
    }

    /// The lease that holds `run` now, if one does (granted, not expired, not released).
    ///
    /// # Errors
    /// [`Error::UnknownRun`]; the log's read errors and [`Error::InconsistentLog`] for a lease
    /// atom that does not decode.
    pub fn lease_of(&self, run: RunId) -> Result<Option<Lease>> {
        self.run_status(run)?;
        let _shared = self.shared.leases.lock(run).read();
        let current = self.run_lease(run)?;
        Ok(current.is_live(now_us()).then(|| lease_from(run, current)))
    }

    /// `lease`'s run's lease, if `lease` is it and has not expired.
    fn current_lease_of(&self, lease: &Lease) -> Result<RunLease> {
        let current = self.run_lease(lease.run)?;
        if current.token != lease.token || !current.is_live(now_us()) {
            return Err(Error::StaleLease { run: lease.run.get(), token: lease.token, current: current.token });
        }
        Ok(current)
    }

    /// Records `event` as a lease atom of `run`, durable on return; the caller holds the run's
    /// lease lock exclusively.
    fn record_lease_event(&self, run: RunId, event: LeaseEvent) -> Result<Lease> {
        let key = event.event.to_string();
        self.record_control(run, LEASE_AGENT, &key, &[], record::encode(&event))?;
        // IMPORTANT: a token is granted only once durable, whatever the atoms' durability.
        self.shared.log.sync()?;
        let lease = RunLease::from(event);
        self.shared.leases.cache(run, lease.clone());
        Ok(lease_from(run, lease))
    }

    /// `run`'s lease as its newest lease atom left it (cached, or read from the log); the
    /// caller holds the run's lease lock.
    pub(crate) fn run_lease(&self, run: RunId) -> Result<RunLease> {
        if let Some(cached) = self.shared.leases.cached(run) {
            return Ok(cached);
        }
        let newest = if self.has_lease_atoms(run) {
            self.agent_history(run, LEASE_AGENT).newest_first().limit(1).next().transpose()?
        } else {
            None
        };
        let lease = match newest {
            Some(atom) => {
                let lsn = atom.started_lsn.get();
                let output =
                    atom.output.ok_or(Error::InconsistentLog { lsn, reason: "a lease atom without result" })?;
                RunLease::from(record::decode(&output.result, lsn)?)
            }
            None => RunLease::default(),
        };
        self.shared.leases.cache(run, lease.clone());
        Ok(lease)
    }

    /// Whether `run` ever had a lease atom (its lease agent exists).
    pub(crate) fn has_lease_atoms(&self, run: RunId) -> bool {
        let index = self.shared.index.read();
        u32::try_from(run.get()).is_ok_and(|run32| index.agent_id(run32, LEASE_AGENT).is_some())
    }
}

/// The public lease of `run` from its table entry.
fn lease_from(run: RunId, lease: RunLease) -> Lease {
    Lease { run, holder: lease.holder, token: lease.token, expires_at_unix_us: lease.expires_at_unix_us }
}

/// [`Error::LeaseHeld`] for `run`'s lease `current`.
pub(crate) fn held(run: RunId, current: RunLease) -> Error {
    Error::LeaseHeld {
        run: run.get(),
        holder: current.holder,
        token: current.token,
        expires_at_unix_us: current.expires_at_unix_us,
    }
}

fn check_holder(holder: &str) -> Result<()> {
    if holder.is_empty() || holder.len() > LEASE_HOLDER_BYTES_MAX {
        return Err(Error::InvalidArgument {
            reason: format!("a lease holder's name has 1 to {LEASE_HOLDER_BYTES_MAX} bytes, not {}", holder.len()),
        });
    }
    Ok(())
}

/// `ttl` in microseconds, if it is a lease's.
fn check_ttl(ttl: Duration) -> Result<u64> {
    let ttl_us = u64::try_from(ttl.as_micros()).unwrap_or(u64::MAX);
    if ttl_us == 0 || ttl_us > LEASE_TTL_US_MAX {
        return Err(Error::InvalidArgument {
            reason: format!("a lease's time to live is 1 to {LEASE_TTL_US_MAX} microseconds, not {ttl_us}"),
        });
    }
    Ok(ttl_us)
}
