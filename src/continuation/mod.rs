//! Continuations: a run suspended on purpose (for approval of tool calls, until a time, at a
//! budget limit, on request, ahead of a deadline), decided request by request, and resumed,
//! after every process has exited if need be (`docs/ARCHITECTURE.md`, "Continuations").
//!
//! Built on control atoms (`store/control.rs`) of the agent [`CONTINUATION_AGENT`], each a
//! `ContinuationEvent` message in its result: `suspend/<n>` (the tree),
//! `decision/<n>/<tool call id>` (one per request: the key makes "decided once" durable),
//! `resume/<n>`. The in-memory table of suspended runs (`table.rs`) is rebuilt from them at
//! open.
//!
//! - `types.rs`: the public values;
//! - `encode.rs`: events to and from their protobuf messages, and their bounds;
//! - `table.rs`: the table of suspended runs;
//! - `suspend.rs`: suspending, reading a suspension, loading the table at open;
//! - `decide.rs`: deciding a request;
//! - `resume.rs`: resuming, and running an approved call through its guard;
//! - `listing.rs`: finding suspended runs and due timers;
//! - `deadline.rs`: running against a hard deadline, suspending ahead of it.

mod deadline;
mod decide;
pub(crate) mod encode;
mod listing;
mod resume;
mod suspend;
pub(crate) mod table;
pub mod types;

#[cfg(test)]
mod tests;

pub use deadline::{DEADLINE_ROOT, DeadlineOutcome, DeadlineStep, DeadlineWatch};
pub use types::{
    ApprovedCall, Continuation, ContinuationLevel, DecidedRequest, Decision, PendingRequest, ReasonKind, Resumed,
    ResumedLevel, SuspendReason, SuspendedFilter, SuspendedRun, SuspensionId, Verdict,
};

/// The control agent whose atoms record a run's suspensions, decisions and resumptions.
pub const CONTINUATION_AGENT: &str = "continuum.continuation";

/// The guard operation under which an approved tool call runs ([`Store::run_approved`]).
///
/// [`Store::run_approved`]: crate::Store::run_approved
pub const TOOL_CALL_OPERATION: &str = "tool-call";

/// The key of suspension `number`'s atom.
fn suspension_key(number: u64) -> String {
    format!("suspend/{number}")
}

/// The key of the decision atom of `tool_call_id` in suspension `number`.
fn decision_key(number: u64, tool_call_id: &str) -> String {
    format!("decision/{number}/{tool_call_id}")
}

/// The key of suspension `number`'s resumption atom.
fn resumption_key(number: u64) -> String {
    format!("resume/{number}")
}
