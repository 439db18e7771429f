//! Resuming a suspended run, reading the newest resumption again, and running an approved
//! tool call exactly once through its guard.

use std::time::Instant;

use crate::continuation::encode::{self, ContinuationEvent};
use crate::continuation::suspend::{decode_atom, suspended_from};
use crate::continuation::table::{Suspended, find_request};
use crate::continuation::types::{ApprovedCall, DecidedRequest, Resumed, ResumedLevel};
use crate::continuation::{CONTINUATION_AGENT, TOOL_CALL_OPERATION, resumption_key, suspension_key};
use crate::error::{Error, Result};
use crate::store::types::{AtomFailure, RunId};
use crate::store::{Store, now_us};

impl Store {
    /// Resumes suspended `run`: records the resumption durably, sets its status back to
    /// running, and returns each level of its tree (depth first) with the atom its agent
    /// continues from and what was decided for it. A suspension for approval resumes only once
    /// every request is decided; the other reasons (timer, budget, request, deadline) need no
    /// decision. Works on a store reopened after every process exited: the suspension and its
    /// decisions are read back at open.
    ///
    /// Each agent rebuilds its context with [`Store::rebuild_context`] of its head (all of
    /// them in one pass: [`Store::rebuild_contexts`] of [`Resumed::heads`]); an
    /// approved call runs with [`Store::run_approved`] (exactly once across crashes); a rejected
    /// one never runs. [`Store::resumed`] returns the same answer again, to a process that
    /// crashed after this returned.
    ///
    /// # Example
    /// ```
    /// # fn main() -> continuum::Result<()> {
    /// use continuum::continuation::{Continuation, ContinuationLevel, Decision, SuspendReason};
    /// use continuum::{RunSpec, RunStatus, Store};
    /// let dir = tempfile::tempdir().unwrap();
    /// let store = Store::open(dir.path())?;
    /// let run = store.create_run(RunSpec::new("refund"))?;
    /// let tree = ContinuationLevel::new("support").request("call-1", "refund", r#"{"eur":40}"#);
    /// store.suspend(run, &Continuation::new(SuspendReason::Approval, tree))?;
    /// store.decide(run, "call-1", &Decision::approve("ada"))?;
    /// let resumed = store.resume_suspended(run)?;
    /// assert_eq!(store.run_status(run)?, RunStatus::Running);
    /// let call = &resumed.levels[0].decided[0];
    /// let mut refunds = 0;
    /// for _ in 0..2 {
    ///     store.run_approved(call, |approved| {
    ///         refunds += 1;
    ///         Ok(format!("refunded {}", approved.arguments).into_bytes())
    ///     })?;
    /// }
    /// assert_eq!(refunds, 1, "an approved call runs once");
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::UnknownRun`]; [`Error::NotSuspended`]; [`Error::UndecidedRequests`] with the
    /// open requests; the log's errors. Nothing is written when it fails.
    pub fn resume_suspended(&self, run: RunId) -> Result<Resumed> {
        let started = Instant::now();
        let _control = self.control_lock();
        self.run_status(run)?;
        let suspended = self.shared.continuations.read().runs.get(&run.get()).cloned();
        let suspended = suspended.ok_or(Error::NotSuspended { run: run.get() })?;
        if suspended.reason.needs_decisions() {
            let open: Vec<String> = suspended.pending().into_iter().map(|request| request.tool_call_id).collect();
            if !open.is_empty() {
                return Err(Error::UndecidedRequests { run: run.get(), open });
            }
        }
        let resumed_at_unix_us = now_us();
        let event = ContinuationEvent::Resumption { suspension: suspended.id.number, resumed_at_unix_us };
        self.record_continuation(run, &resumption_key(suspended.id.number), encode::encode(&event))?;
        self.shared.continuations.write().runs.remove(&run.get());
        let suspended_us = resumed_at_unix_us.saturating_sub(suspended.since_unix_us);
        self.shared.log.metrics_handle().record_resume(suspended_us, started.elapsed());
        Ok(resumed(&suspended, resumed_at_unix_us))
    }

    /// The newest resumption of `run` as [`Store::resume_suspended`] returned it, read from the
    /// log: `None` if the run is suspended or never suspended. What a process that crashed
    /// after resuming, before its approved calls ran, continues from.
    ///
    /// # Errors
    /// [`Error::UnknownRun`]; the log's errors; [`Error::InconsistentLog`] for a continuation
    /// atom that does not decode.
    pub fn resumed(&self, run: RunId) -> Result<Option<Resumed>> {
        self.run_status(run)?;
        let Some(events) = self.latest_events(run)? else { return Ok(None) };
        let Some(resumed_at_unix_us) = events.resumed_at_unix_us else { return Ok(None) };
        Ok(Some(resumed(&suspended_from(run, events)?, resumed_at_unix_us)))
    }

    /// Runs the approved tool call `decided` (from [`Store::resume_suspended`] or
    /// [`Store::resumed`]) at most once across crashes, through [`Store::guarded`] under the
    /// decision atom and [`TOOL_CALL_OPERATION`]: `effect` gets the arguments (the edited ones
    /// if the decision gave any) and the idempotency key; a later call returns the recorded
    /// result without running it. The decision is read back from the log, not taken from
    /// `decided`.
    ///
    /// # Errors
    /// [`Error::RequestRejected`] for a rejected request (nothing runs);
    /// [`Error::RunSuspended`] while its suspension is not resumed; [`Error::InvalidArgument`]
    /// if `decided.atom` is not a decision atom; and as [`Store::guarded`] (an effect in doubt
    /// after a crash during it is [`Error::GuardInDoubt`], settled with
    /// [`Store::resolve_guard`]).
    pub fn run_approved(
        &self,
        decided: &DecidedRequest,
        effect: impl FnOnce(&ApprovedCall<'_>) -> std::result::Result<Vec<u8>, AtomFailure>,
    ) -> Result<Vec<u8>> {
        let (run, number, recorded) = self.recorded_decision(decided)?;
        if !recorded.decision.approved() {
            return Err(Error::RequestRejected { run: run.get(), request: recorded.request.tool_call_id });
        }
        let suspended = self.shared.continuations.read().runs.get(&run.get()).map(|s| s.id.number);
        if suspended == Some(number) {
            return Err(Error::RunSuspended { run: run.get(), suspension: number });
        }
        self.guarded(decided.atom, TOOL_CALL_OPERATION, |key| {
            effect(&ApprovedCall { decided: &recorded, arguments: recorded.arguments(), idempotency_key: key })
        })
    }

    /// The idempotency key [`Store::run_approved`] runs `decided` under (to look it up in the
    /// external system, or for [`Store::resolve_guard`]).
    ///
    /// # Errors
    /// As [`Store::guard_key`].
    pub fn approved_call_key(&self, decided: &DecidedRequest) -> Result<String> {
        self.guard_key(decided.atom, TOOL_CALL_OPERATION)
    }

    /// The decision recorded by `decided.atom`, with its run, its suspension's number and its
    /// request read from that suspension.
    fn recorded_decision(&self, decided: &DecidedRequest) -> Result<(RunId, u64, DecidedRequest)> {
        let atom = self.atom(decided.atom)?;
        let not_a_decision = || Error::InvalidArgument { reason: format!("atom {} is not a decision", decided.atom) };
        if atom.agent != CONTINUATION_AGENT {
            return Err(not_a_decision());
        }
        let (_, event) = decode_atom(&atom)?;
        let ContinuationEvent::Decision(stored) = event else { return Err(not_a_decision()) };
        let suspension = self.atom_by_key(atom.run, CONTINUATION_AGENT, &suspension_key(stored.suspension))?.ok_or(
            Error::InconsistentLog { lsn: atom.started_lsn.get(), reason: "a decision without its suspension" },
        )?;
        let (_, event) = decode_atom(&self.atom(suspension)?)?;
        let ContinuationEvent::Suspension(suspension) = event else {
            return Err(Error::InconsistentLog {
                lsn: atom.started_lsn.get(),
                reason: "a suspension key names another event",
            });
        };
        let request = find_request(&suspension.root, &stored.tool_call_id).cloned().ok_or(Error::InconsistentLog {
            lsn: atom.started_lsn.get(),
            reason: "a decision on a request its suspension does not hold",
        })?;
        Ok((atom.run, stored.suspension, DecidedRequest { request, decision: stored.decision, atom: decided.atom }))
    }
}

/// What resuming `suspended` at `resumed_at_unix_us` returns.
fn resumed(suspended: &Suspended, resumed_at_unix_us: u64) -> Resumed {
    let tree = suspended.tree();
    let mut levels = Vec::new();
    tree.walk(&mut Vec::new(), &mut |level, path| {
        let undecided = level
            .resume_request
            .iter()
            .filter(|request| !suspended.decided.contains_key(&request.tool_call_id))
            .cloned()
            .collect();
        levels.push(ResumedLevel {
            path: path.to_vec(),
            agent: level.agent.clone(),
            head: level.head,
            decided: level.processed.clone(),
            undecided,
        });
    });
    Resumed {
        id: suspended.id,
        reason: suspended.reason.clone(),
        suspended_at_unix_us: suspended.since_unix_us,
        resumed_at_unix_us,
        levels,
    }
}
