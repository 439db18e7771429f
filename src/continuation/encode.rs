//! Continuation events to and from the protobuf messages a control atom's result holds, and
//! the bounds every continuation is checked against: a caller's before it is written, a
//! stored one after it is read.

use std::collections::HashSet;

use prost::Message;

use crate::codec::proto;
use crate::codec::proto::continuation_event::Event;
use crate::codec::proto::suspend_reason::Reason;
use crate::continuation::types::{ContinuationLevel, Decision, PendingRequest, SuspendReason, Verdict};
use crate::error::{Error, Result};
use crate::limits::{
    CONTINUATION_BYTES_MAX, CONTINUATION_DEPTH_MAX, CONTINUATION_LEVELS_MAX, CONTINUATION_NAME_BYTES_MAX,
    CONTINUATION_REQUESTS_MAX, CONTINUATION_TEXT_BYTES_MAX,
};
use crate::store::types::AtomId;

/// A decoded continuation event.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum ContinuationEvent {
    Suspension(StoredSuspension),
    Decision(StoredDecision),
    Resumption { suspension: u64, resumed_at_unix_us: u64 },
}

/// A suspension as its atom records it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct StoredSuspension {
    pub number: u64,
    pub reason: SuspendReason,
    pub since_unix_us: u64,
    pub root: ContinuationLevel,
}

/// A decision as its atom records it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct StoredDecision {
    pub suspension: u64,
    pub tool_call_id: String,
    pub decision: Decision,
}

/// Encodes `event` as a control atom's result.
pub(crate) fn encode(event: &ContinuationEvent) -> Vec<u8> {
    let event = match event {
        ContinuationEvent::Suspension(suspension) => Event::Suspension(proto::Suspension {
            number: suspension.number,
            reason: Some(reason_to_proto(&suspension.reason)),
            since_unix_us: suspension.since_unix_us,
            root: Some(level_to_proto(&suspension.root)),
        }),
        ContinuationEvent::Decision(decided) => Event::Decision(decision_to_proto(decided)),
        ContinuationEvent::Resumption { suspension, resumed_at_unix_us } => {
            Event::Resumption(proto::Resumption { suspension: *suspension, resumed_at_unix_us: *resumed_at_unix_us })
        }
    };
    proto::ContinuationEvent { event: Some(event) }.encode_to_vec()
}

/// Decodes a control atom's result (the atom's start record at `lsn`, for the error), and
/// checks it against the bounds a caller's continuation is held to.
///
/// # Errors
/// [`Error::InconsistentLog`] for bytes that are not a valid continuation event.
pub(crate) fn decode(bytes: &[u8], lsn: u64) -> Result<ContinuationEvent> {
    let invalid = |reason| Error::InconsistentLog { lsn, reason };
    if bytes.len() > CONTINUATION_BYTES_MAX {
        return Err(invalid("a continuation event is larger than its limit"));
    }
    let message =
        proto::ContinuationEvent::decode(bytes).map_err(|_| invalid("a continuation event does not decode"))?;
    let event = match message.event.ok_or(invalid("a continuation event is empty"))? {
        Event::Suspension(suspension) => {
            let reason = reason_from_proto(suspension.reason.ok_or(invalid("a suspension without a reason"))?)
                .ok_or(invalid("a suspension without a reason"))?;
            let root = level_from_proto(suspension.root.ok_or(invalid("a suspension without a tree"))?);
            check_suspension(&reason, &root).map_err(|_| invalid("a stored suspension breaks its bounds"))?;
            ContinuationEvent::Suspension(StoredSuspension {
                number: suspension.number,
                reason,
                since_unix_us: suspension.since_unix_us,
                root,
            })
        }
        Event::Decision(decision) => {
            let decided = decision_from_proto(decision);
            check_decision(&decided.decision).map_err(|_| invalid("a stored decision breaks its bounds"))?;
            ContinuationEvent::Decision(decided)
        }
        Event::Resumption(resumption) => ContinuationEvent::Resumption {
            suspension: resumption.suspension,
            resumed_at_unix_us: resumption.resumed_at_unix_us,
        },
    };
    Ok(event)
}

fn reason_to_proto(reason: &SuspendReason) -> proto::SuspendReason {
    let reason = match reason {
        SuspendReason::Approval => Reason::Approval(proto::ApprovalReason {}),
        SuspendReason::Timer { resume_at_unix_us } => Reason::TimerResumeAtUnixUs(*resume_at_unix_us),
        SuspendReason::Budget { what } => Reason::BudgetWhat(what.clone()),
        SuspendReason::Requested { by } => Reason::RequestedBy(by.clone()),
        SuspendReason::Deadline { at_unix_us } => Reason::DeadlineAtUnixUs(*at_unix_us),
    };
    proto::SuspendReason { reason: Some(reason) }
}

fn reason_from_proto(reason: proto::SuspendReason) -> Option<SuspendReason> {
    Some(match reason.reason? {
        Reason::Approval(_) => SuspendReason::Approval,
        Reason::TimerResumeAtUnixUs(resume_at_unix_us) => SuspendReason::Timer { resume_at_unix_us },
        Reason::BudgetWhat(what) => SuspendReason::Budget { what },
        Reason::RequestedBy(by) => SuspendReason::Requested { by },
        Reason::DeadlineAtUnixUs(at_unix_us) => SuspendReason::Deadline { at_unix_us },
    })
}

fn level_to_proto(level: &ContinuationLevel) -> proto::ContinuationLevel {
    proto::ContinuationLevel {
        agent: level.agent.clone(),
        head_atom: level.head.map_or(0, AtomId::get),
        resume_request: level
            .resume_request
            .iter()
            .map(|request| proto::PendingToolCall {
                tool_call_id: request.tool_call_id.clone(),
                tool_name: request.tool_name.clone(),
                arguments: request.arguments.clone(),
            })
            .collect(),
        children: level.children.iter().map(level_to_proto).collect(),
    }
}

/// The level of `level` with each request's path filled from the tree.
fn level_from_proto(level: proto::ContinuationLevel) -> ContinuationLevel {
    let mut root = level_from_proto_at(level);
    fill_paths(&mut root, &mut Vec::new());
    root
}

fn level_from_proto_at(level: proto::ContinuationLevel) -> ContinuationLevel {
    ContinuationLevel {
        agent: level.agent,
        head: (level.head_atom != 0).then(|| AtomId::from_raw(level.head_atom)),
        resume_request: level
            .resume_request
            .into_iter()
            .map(|request| PendingRequest {
                tool_call_id: request.tool_call_id,
                tool_name: request.tool_name,
                arguments: request.arguments,
                path: Vec::new(),
            })
            .collect(),
        processed: Vec::new(),
        children: level.children.into_iter().map(level_from_proto_at).collect(),
    }
}

/// Sets every request's path to the agents from the root to its level.
pub(crate) fn fill_paths(level: &mut ContinuationLevel, path: &mut Vec<String>) {
    path.push(level.agent.clone());
    for request in &mut level.resume_request {
        request.path.clone_from(path);
    }
    for child in &mut level.children {
        fill_paths(child, path);
    }
    path.pop();
}

fn decision_to_proto(decided: &StoredDecision) -> proto::DecisionRecord {
    let decision = &decided.decision;
    proto::DecisionRecord {
        suspension: decided.suspension,
        tool_call_id: decided.tool_call_id.clone(),
        approved: decision.approved(),
        message: decision.message.clone(),
        edited_arguments: decision.edited_arguments.clone(),
        decided_by: decision.decided_by.clone(),
        decided_at_unix_us: decision.decided_at_unix_us,
    }
}

fn decision_from_proto(decision: proto::DecisionRecord) -> StoredDecision {
    StoredDecision {
        suspension: decision.suspension,
        tool_call_id: decision.tool_call_id,
        decision: Decision {
            verdict: if decision.approved { Verdict::Approve } else { Verdict::Reject },
            message: decision.message,
            edited_arguments: decision.edited_arguments,
            decided_by: decision.decided_by,
            decided_at_unix_us: decision.decided_at_unix_us,
        },
    }
}

/// Checks a suspension against its bounds: names present and short, texts bounded, the tree's
/// depth, levels and requests bounded, request ids unique, an approval with something to
/// approve, no decisions yet.
///
/// # Errors
/// [`Error::InvalidArgument`] for an empty or duplicate name and a shape that cannot be
/// suspended; [`Error::LimitExceeded`] for a bound passed.
pub(crate) fn check_suspension(reason: &SuspendReason, root: &ContinuationLevel) -> Result<()> {
    match reason {
        SuspendReason::Budget { what: text } | SuspendReason::Requested { by: text } => {
            check_name("the suspension reason's text", text)?;
        }
        SuspendReason::Approval | SuspendReason::Timer { .. } | SuspendReason::Deadline { .. } => {}
    }
    let mut levels = 0;
    let mut ids = HashSet::new();
    check_level(root, 1, &mut levels, &mut ids)?;
    if reason.needs_decisions() && ids.is_empty() {
        return Err(invalid("a suspension for approval needs at least one pending request"));
    }
    Ok(())
}

/// Checks one level and its children (at `depth`), counting levels and collecting request ids.
fn check_level<'a>(
    level: &'a ContinuationLevel,
    depth: usize,
    levels: &mut usize,
    ids: &mut HashSet<&'a str>,
) -> Result<()> {
    *levels += 1;
    bounded("continuation tree depth", depth, CONTINUATION_DEPTH_MAX)?;
    bounded("continuation tree levels", *levels, CONTINUATION_LEVELS_MAX)?;
    check_name("a continuation level's agent", &level.agent)?;
    if !level.processed.is_empty() {
        return Err(invalid("a level's processed decisions are the store's to fill; suspend with none"));
    }
    for request in &level.resume_request {
        check_name("a pending request's tool call id", &request.tool_call_id)?;
        check_name("a pending request's tool name", &request.tool_name)?;
        check_text("a pending request's arguments", &request.arguments)?;
        if !ids.insert(request.tool_call_id.as_str()) {
            return Err(invalid(&format!("tool call id {:?} is pending twice", request.tool_call_id)));
        }
        bounded("pending requests of a suspension", ids.len(), CONTINUATION_REQUESTS_MAX)?;
    }
    for child in &level.children {
        check_level(child, depth + 1, levels, ids)?;
    }
    Ok(())
}

/// Checks a decision against its bounds.
///
/// # Errors
/// [`Error::InvalidArgument`] for no decider or edited arguments on a rejection,
/// [`Error::LimitExceeded`] for a text too long.
pub(crate) fn check_decision(decision: &Decision) -> Result<()> {
    check_name("who decided", &decision.decided_by)?;
    if let Some(message) = &decision.message {
        check_text("a decision's message", message)?;
    }
    if let Some(arguments) = &decision.edited_arguments {
        check_text("a decision's edited arguments", arguments)?;
        if !decision.approved() {
            return Err(invalid("a rejection has no edited arguments"));
        }
    }
    Ok(())
}

/// Checks a request id a caller names.
pub(crate) fn check_request_id(request: &str) -> Result<()> {
    check_name("a pending request's tool call id", request)
}

fn check_name(what: &str, name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(invalid(&format!("{what} is empty")));
    }
    bounded(&format!("bytes of {what}"), name.len(), CONTINUATION_NAME_BYTES_MAX)
}

fn check_text(what: &str, text: &str) -> Result<()> {
    bounded(&format!("bytes of {what}"), text.len(), CONTINUATION_TEXT_BYTES_MAX)
}

fn bounded(what: &str, value: usize, max: usize) -> Result<()> {
    if value > max {
        return Err(Error::LimitExceeded { what: what.to_owned(), limit: max as u64 });
    }
    Ok(())
}

fn invalid(reason: &str) -> Error {
    Error::InvalidArgument { reason: reason.to_owned() }
}
