//! Leases with fencing tokens: a worker's time-limited claim on a run
//! (`docs/ARCHITECTURE.md`, "Leases").
//!
//! [`Store::acquire_lease`](crate::Store::acquire_lease) grants a run's lease to one holder at
//! a time, with a token one greater than the run's previous grant's. While the lease is live,
//! an atom of the run ends (completes or fails) only under its token
//! ([`Store::execute_leased`](crate::Store::execute_leased)); any other end is refused with
//! [`Error::LeaseHeld`](crate::Error::LeaseHeld), and an end under a token that is no longer
//! current, or whose lease expired, with [`Error::StaleLease`](crate::Error::StaleLease).
//!
//! Grants, renewals and releases are control atoms of [`LEASE_AGENT`] in the run, durable
//! before they return, so a run's lease (its newest lease atom) and its token survive a crash
//! and are read back lazily after a reopen. The expiry is wall-clock Unix microseconds.

mod execute;
mod fence;
mod grant;
mod record;
mod table;

pub(crate) use table::LeaseState;

use crate::store::RunId;

/// The store's agent whose atoms record a run's lease grants, renewals and releases.
pub const LEASE_AGENT: &str = "continuum.lease";

/// A granted lease on a run ([`Store::acquire_lease`](crate::Store::acquire_lease)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The run it holds.
    pub run: RunId,
    /// Who holds it (the name given at the grant).
    pub holder: String,
    /// The fencing token: one greater than the run's previous grant's.
    pub token: u64,
    /// When it expires, in microseconds since the Unix epoch (wall clock).
    pub expires_at_unix_us: u64,
}

/// A lease atom's result, described for a person (the `dump` tool); `None` for bytes that are
/// not one.
pub fn describe_event(result: &[u8]) -> Option<String> {
    let event = record::decode(result, 0).ok()?;
    let what = match event.kind {
        record::EventKind::Grant => "granted to",
        record::EventKind::Renewal => "renewed for",
        record::EventKind::Release => "released by",
    };
    let until = match event.expires_at_unix_us {
        0 => String::new(),
        at => format!(" until unix microsecond {at}"),
    };
    Some(format!("lease event {}: token {} {what} {:?}{until}", event.event, event.token, event.holder))
}

#[cfg(test)]
mod tests;
