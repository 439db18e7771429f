//! Suspending a run, reading its suspension, and loading the table of suspended runs at open.

use crate::continuation::encode::{self, ContinuationEvent, StoredDecision, StoredSuspension};
use crate::continuation::table::Suspended;
use crate::continuation::types::{
    Continuation, ContinuationLevel, DecidedRequest, PendingRequest, SuspendedRun, SuspensionId,
};
use crate::continuation::{CONTINUATION_AGENT, suspension_key};
use crate::error::{Error, Result};
use crate::store::index::EntryState;
use crate::store::types::{AtomId, RunId, RunStatus};
use crate::store::{Store, now_us, unknown_run};

/// The events of a run's newest suspension, read from its control atoms newest first.
pub(crate) struct LatestEvents {
    pub suspension: (AtomId, StoredSuspension),
    pub decisions: Vec<(AtomId, StoredDecision)>,
    /// When it was resumed, if it was.
    pub resumed_at_unix_us: Option<u64>,
}

impl Store {
    /// Suspends `run` with `continuation`: why, and the tree of its agents with the requests
    /// that wait for a decision. Durable on return (one control atom holding the tree; see
    /// `docs/ARCHITECTURE.md`, "Continuations"). From then on the run's status is
    /// [`RunStatus::Suspended`] and it takes no new atom, rollback or fork
    /// ([`Error::RunSuspended`]) until [`Store::resume_suspended`]; atoms begun before still
    /// complete. Every head must be an atom of the run and of its level's agent; retention keeps
    /// an agent's newest atom rebuildable, and an older head only if it is pinned
    /// ([`Store::pin`]).
    ///
    /// # Example
    /// ```
    /// # fn main() -> continuum::Result<()> {
    /// use continuum::continuation::{Continuation, ContinuationLevel, SuspendReason};
    /// use continuum::{AtomOutput, RunSpec, RunStatus, Store};
    /// let dir = tempfile::tempdir().unwrap();
    /// let store = Store::open(dir.path())?;
    /// let run = store.create_run(RunSpec::new("onboarding"))?;
    /// let turn = store.record_atom(run, "account", "turn-1", &[], "", &AtomOutput::default())?;
    /// let tree = ContinuationLevel::new("hr").child(
    ///     ContinuationLevel::new("account").head(turn).request("call-7", "authorize_account", r#"{"user":"ada"}"#),
    /// );
    /// store.suspend(run, &Continuation::new(SuspendReason::Approval, tree))?;
    /// assert!(matches!(store.run_status(run)?, RunStatus::Suspended { .. }));
    /// assert_eq!(store.pending(run)?[0].path, ["hr", "account"]);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::UnknownRun`]; [`Error::RunSuspended`] for a run already suspended;
    /// [`Error::RunFinished`] for a finished or dropped run; [`Error::InvalidArgument`] for an
    /// empty or duplicate name, a head that is not an atom of its level's agent in the run, an
    /// approval with no request; [`Error::LimitExceeded`] past a bound of `limits.rs`; the log's
    /// errors. Nothing is written when it fails.
    pub fn suspend(&self, run: RunId, continuation: &Continuation) -> Result<SuspensionId> {
        encode::check_suspension(&continuation.reason, &continuation.root)?;
        let _control = self.control_lock();
        self.check_suspendable(run)?;
        self.check_level_heads(run, &continuation.root)?;
        let number = self.latest_suspension_number(run)? + 1;
        let mut root = continuation.root.clone();
        encode::fill_paths(&mut root, &mut Vec::new());
        let stored = StoredSuspension { number, reason: continuation.reason.clone(), since_unix_us: now_us(), root };
        let bytes = encode::encode(&ContinuationEvent::Suspension(stored.clone()));
        if bytes.len() > crate::limits::CONTINUATION_BYTES_MAX {
            return Err(Error::LimitExceeded {
                what: "bytes of an encoded suspension".into(),
                limit: crate::limits::CONTINUATION_BYTES_MAX as u64,
            });
        }
        let atom = self.record_continuation(run, &suspension_key(number), bytes)?;
        let id = SuspensionId { run, number, atom };
        let suspended = Suspended {
            id,
            reason: stored.reason,
            since_unix_us: stored.since_unix_us,
            root: stored.root,
            decided: Default::default(),
        };
        {
            // The index first (the lock order): a run finished since the check stays out.
            let index = self.shared.index.read();
            if index.run(run).is_some_and(|entry| entry.status == RunStatus::Running) {
                self.shared.continuations.write().runs.insert(run.get(), suspended);
            }
        }
        self.shared.log.metrics_handle().record_suspension();
        Ok(id)
    }

    /// Records a continuation control atom, durable on return whatever the store's atom
    /// durability.
    pub(crate) fn record_continuation(&self, run: RunId, key: &str, result: Vec<u8>) -> Result<AtomId> {
        let atom = self.record_control(run, CONTINUATION_AGENT, key, &[], result)?;
        if self.shared.policies.atom_durability != crate::Durability::Sync {
            // IMPORTANT: a suspension, decision or resumption is durable before it is acknowledged.
            self.sync()?;
        }
        Ok(atom)
    }

    /// Refuses to suspend a run that is unknown, finished, dropped or suspended.
    fn check_suspendable(&self, run: RunId) -> Result<()> {
        if let Some(suspended) = self.shared.continuations.read().runs.get(&run.get()) {
            return Err(Error::RunSuspended { run: run.get(), suspension: suspended.id.number });
        }
        let index = self.shared.index.read();
        match index.run(run).map(|entry| &entry.status) {
            None => Err(unknown_run(run)),
            Some(RunStatus::Running) => Ok(()),
            Some(_) => Err(Error::RunFinished { run: run.get() }),
        }
    }

    /// Checks that every level's head is a recorded atom of the run and of the level's agent.
    fn check_level_heads(&self, run: RunId, root: &ContinuationLevel) -> Result<()> {
        let index = self.shared.index.read();
        let mut problem = None;
        root.walk(&mut Vec::new(), &mut |level, _| {
            let Some(head) = level.head else { return };
            let fits = index.atom(head).is_some_and(|entry| {
                u64::from(entry.run) == run.get()
                    && !entry.abandoned
                    && !matches!(entry.state, EntryState::Vacant | EntryState::Starting)
                    && index.agent_name(entry.agent) == level.agent
            });
            if !fits && problem.is_none() {
                problem = Some(format!("head {head} is not a recorded atom of agent {:?} in run {run}", level.agent));
            }
        });
        problem.map_or(Ok(()), |reason| Err(Error::InvalidArgument { reason }))
    }

    /// Whether the run's newest continuation event is a resumption (one atom read).
    fn newest_event_is_a_resumption(&self, run: RunId) -> Result<bool> {
        let Some(newest) = self.agent_history(run, CONTINUATION_AGENT).newest_first().limit(1).next() else {
            return Ok(false);
        };
        Ok(matches!(decode_atom(&newest?)?.1, ContinuationEvent::Resumption { .. }))
    }

    /// The number of the run's newest suspension (0 if it never suspended).
    fn latest_suspension_number(&self, run: RunId) -> Result<u64> {
        let Some(newest) = self.agent_history(run, CONTINUATION_AGENT).newest_first().limit(1).next() else {
            return Ok(0);
        };
        let (_, event) = decode_atom(&newest?)?;
        Ok(match event {
            ContinuationEvent::Suspension(suspension) => suspension.number,
            ContinuationEvent::Decision(decision) => decision.suspension,
            ContinuationEvent::Resumption { suspension, .. } => suspension,
        })
    }

    /// The requests of `run` that wait for a decision, flattened from its continuation tree
    /// depth first, each with its path: what the application must decide. Empty for a run
    /// that is not suspended. Reads memory only.
    ///
    /// # Errors
    /// [`Error::UnknownRun`].
    pub fn pending(&self, run: RunId) -> Result<Vec<PendingRequest>> {
        self.run_status(run)?;
        Ok(self.shared.continuations.read().runs.get(&run.get()).map(Suspended::pending).unwrap_or_default())
    }

    /// The suspension of `run` with its tree, its open requests and the decisions taken so
    /// far, or `None` if it is not suspended. Reads memory only.
    ///
    /// # Errors
    /// [`Error::UnknownRun`].
    pub fn suspension(&self, run: RunId) -> Result<Option<SuspendedRun>> {
        let name = self.shared.index.read().run(run).map(|entry| entry.name.clone()).ok_or_else(|| unknown_run(run))?;
        Ok(self.shared.continuations.read().runs.get(&run.get()).map(|suspended| suspended.view(&name)))
    }

    /// The events of `run`'s newest suspension, if it ever suspended: read newest first from
    /// its control atoms until the suspension's own.
    pub(crate) fn latest_events(&self, run: RunId) -> Result<Option<LatestEvents>> {
        let mut decisions = Vec::new();
        let mut resumed_at_unix_us = None;
        let mut lsn = 0;
        // A suspension's events: itself, a decision per request at most, its resumption.
        let events_max = crate::limits::CONTINUATION_REQUESTS_MAX + 2;
        for atom in self.agent_history(run, CONTINUATION_AGENT).newest_first().limit(events_max) {
            let atom = atom?;
            lsn = atom.started_lsn.get();
            let (id, event) = decode_atom(&atom)?;
            match event {
                ContinuationEvent::Suspension(suspension) => {
                    decisions.reverse();
                    return Ok(Some(LatestEvents { suspension: (id, suspension), decisions, resumed_at_unix_us }));
                }
                ContinuationEvent::Decision(decision) => decisions.push((id, decision)),
                ContinuationEvent::Resumption { resumed_at_unix_us: at, .. } => {
                    if resumed_at_unix_us.is_some() || !decisions.is_empty() {
                        return Err(Error::InconsistentLog {
                            lsn,
                            reason: "a resumption follows another event of its suspension",
                        });
                    }
                    resumed_at_unix_us = Some(at);
                }
            }
        }
        if decisions.is_empty() && resumed_at_unix_us.is_none() {
            return Ok(None);
        }
        Err(Error::InconsistentLog { lsn, reason: "continuation events without their suspension" })
    }

    /// Rebuilds the table of suspended runs from the control atoms (at open): each running run
    /// whose newest suspension has no resumption.
    ///
    /// # Errors
    /// The log's read errors; [`Error::InconsistentLog`] for a continuation atom that does not
    /// decode or breaks its bounds.
    pub(crate) fn load_suspensions(&self) -> Result<()> {
        let runs: Vec<RunId> = {
            let index = self.shared.index.read();
            (1..=index.runs.len() as u64)
                .map(RunId::from_raw)
                .filter(|run| index.run(*run).is_some_and(|entry| entry.status == RunStatus::Running))
                .filter(|run| u32::try_from(run.get()).is_ok_and(|r| index.agent_id(r, CONTINUATION_AGENT).is_some()))
                .collect()
        };
        let mut table = crate::continuation::table::Suspensions::default();
        for run in runs {
            if self.newest_event_is_a_resumption(run)? {
                continue;
            }
            let Some(events) = self.latest_events(run)? else { continue };
            if events.resumed_at_unix_us.is_none() {
                table.runs.insert(run.get(), suspended_from(run, events)?);
            }
        }
        *self.shared.continuations.write() = table;
        Ok(())
    }
}

/// The table entry of a suspension read from the log.
///
/// # Errors
/// [`Error::InconsistentLog`] for a decision on a request the suspension does not hold, or on
/// another suspension.
pub(crate) fn suspended_from(run: RunId, events: LatestEvents) -> Result<Suspended> {
    let (atom, suspension) = events.suspension;
    let mut suspended = Suspended {
        id: SuspensionId { run, number: suspension.number, atom },
        reason: suspension.reason,
        since_unix_us: suspension.since_unix_us,
        root: suspension.root,
        decided: Default::default(),
    };
    for (atom, decision) in events.decisions {
        let request = suspended.request(&decision.tool_call_id).cloned();
        let Some(request) = request.filter(|_| decision.suspension == suspended.id.number) else {
            return Err(Error::InconsistentLog {
                lsn: 0,
                reason: "a decision on a request its suspension does not hold",
            });
        };
        let decided = DecidedRequest { request, decision: decision.decision, atom };
        suspended.decided.insert(decision.tool_call_id, decided);
    }
    Ok(suspended)
}

/// A continuation atom's id and decoded event.
///
/// # Errors
/// [`Error::InconsistentLog`] for an atom without a result that decodes.
pub(crate) fn decode_atom(atom: &crate::Atom) -> Result<(AtomId, ContinuationEvent)> {
    let lsn = atom.started_lsn.get();
    let output =
        atom.output.as_ref().ok_or(Error::InconsistentLog { lsn, reason: "a continuation atom without result" })?;
    Ok((atom.id, encode::decode(&output.result, lsn)?))
}
