//! Deciding a pending request: one durable decision atom per request.

use crate::continuation::decision_key;
use crate::continuation::encode::{self, ContinuationEvent, StoredDecision};
use crate::continuation::types::{DecidedRequest, Decision, PendingRequest};
use crate::error::{Error, Result};
use crate::store::types::RunId;
use crate::store::{Store, now_us};

impl Store {
    /// Decides the pending request `tool_call_id` of suspended `run`: approves or rejects it,
    /// recording who decided and when, durably on return. Deciding again with the same
    /// decision (its time aside) returns the recorded one and writes nothing; a different one
    /// is refused. An approved call runs after [`Store::resume_suspended`], through
    /// [`Store::run_approved`]; a rejected one never runs.
    ///
    /// # Example
    /// ```
    /// # fn main() -> continuum::Result<()> {
    /// use continuum::continuation::{Continuation, ContinuationLevel, Decision, SuspendReason};
    /// use continuum::{Error, RunSpec, Store};
    /// let dir = tempfile::tempdir().unwrap();
    /// let store = Store::open(dir.path())?;
    /// let run = store.create_run(RunSpec::new("refund"))?;
    /// let tree = ContinuationLevel::new("support").request("call-1", "refund", r#"{"eur":40}"#);
    /// store.suspend(run, &Continuation::new(SuspendReason::Approval, tree))?;
    /// let recorded = store.decide(run, "call-1", &Decision::approve("ada").message("ok"))?;
    /// assert!(recorded.decided_at_unix_us > 0);
    /// assert_eq!(store.decide(run, "call-1", &Decision::approve("ada").message("ok"))?, recorded);
    /// assert!(matches!(store.decide(run, "call-1", &Decision::reject("bob")), Err(Error::AlreadyDecided { .. })));
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::UnknownRun`]; [`Error::NotSuspended`]; [`Error::UnknownRequest`] when the run's
    /// suspension has no such request (a request of another run included);
    /// [`Error::AlreadyDecided`] for a different decision on a decided request;
    /// [`Error::InvalidArgument`] for an empty decider or request id, edited arguments on a
    /// rejection; [`Error::LimitExceeded`] for a text past its bound; the log's errors. Nothing
    /// is written when it fails.
    pub fn decide(&self, run: RunId, tool_call_id: &str, decision: &Decision) -> Result<Decision> {
        encode::check_request_id(tool_call_id)?;
        encode::check_decision(decision)?;
        let _control = self.control_lock();
        let (number, request) = match self.decidable(run, tool_call_id, decision)? {
            Decidable::Open { number, request } => (number, request),
            Decidable::Recorded(recorded) => return Ok(recorded),
        };
        let mut decision = decision.clone();
        decision.decided_at_unix_us = now_us();
        let stored = StoredDecision { suspension: number, tool_call_id: tool_call_id.to_owned(), decision };
        let bytes = encode::encode(&ContinuationEvent::Decision(stored.clone()));
        let atom = self.record_continuation(run, &decision_key(number, tool_call_id), bytes)?;
        let decided = DecidedRequest { request, decision: stored.decision.clone(), atom };
        if let Some(suspended) = self.shared.continuations.write().runs.get_mut(&run.get()) {
            suspended.decided.insert(tool_call_id.to_owned(), decided);
        }
        self.shared.log.metrics_handle().record_decision();
        Ok(stored.decision)
    }

    /// Whether `tool_call_id` of `run` can take `decision`: open (in which suspension, and the
    /// request), or decided the same way already.
    fn decidable(&self, run: RunId, tool_call_id: &str, decision: &Decision) -> Result<Decidable> {
        self.run_status(run)?;
        let table = self.shared.continuations.read();
        let suspended = table.runs.get(&run.get()).ok_or(Error::NotSuspended { run: run.get() })?;
        let unknown = || Error::UnknownRequest { run: run.get(), request: tool_call_id.to_owned() };
        let request = suspended.request(tool_call_id).ok_or_else(unknown)?;
        match suspended.decided.get(tool_call_id) {
            Some(recorded) if recorded.decision.same_as(decision) => Ok(Decidable::Recorded(recorded.decision.clone())),
            Some(recorded) => Err(Error::AlreadyDecided {
                run: run.get(),
                request: tool_call_id.to_owned(),
                approved: recorded.decision.approved(),
                decided_by: recorded.decision.decided_by.clone(),
            }),
            None => Ok(Decidable::Open { number: suspended.id.number, request: request.clone() }),
        }
    }
}

/// What [`Store::decidable`] found.
enum Decidable {
    Open { number: u64, request: PendingRequest },
    Recorded(Decision),
}
