//! The public values of continuations: why a run suspends, the continuation tree, pending
//! requests, decisions, and what a resume returns.

use crate::store::types::{AtomId, RunId};

/// Why a run suspends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SuspendReason {
    /// Pending requests (tool calls) wait for a decision each.
    Approval,
    /// The run waits until a time ([`Store::due`](crate::Store::due) lists it once passed).
    Timer {
        /// When it may resume, in microseconds since the Unix epoch.
        resume_at_unix_us: u64,
    },
    /// A turn or budget limit was reached.
    Budget {
        /// What the limit limits (`"turns"`, `"tokens"`, `"dollars"`).
        what: String,
    },
    /// Someone outside asked the run to stop.
    Requested {
        /// Who asked.
        by: String,
    },
    /// The run stopped ahead of a hard deadline.
    Deadline {
        /// The deadline, in microseconds since the Unix epoch.
        at_unix_us: u64,
    },
}

/// The kind of a [`SuspendReason`], without its data: what [`SuspendedFilter`] filters by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReasonKind {
    /// [`SuspendReason::Approval`].
    Approval,
    /// [`SuspendReason::Timer`].
    Timer,
    /// [`SuspendReason::Budget`].
    Budget,
    /// [`SuspendReason::Requested`].
    Requested,
    /// [`SuspendReason::Deadline`].
    Deadline,
}

impl SuspendReason {
    /// Its kind.
    pub fn kind(&self) -> ReasonKind {
        match self {
            SuspendReason::Approval => ReasonKind::Approval,
            SuspendReason::Timer { .. } => ReasonKind::Timer,
            SuspendReason::Budget { .. } => ReasonKind::Budget,
            SuspendReason::Requested { .. } => ReasonKind::Requested,
            SuspendReason::Deadline { .. } => ReasonKind::Deadline,
        }
    }

    /// Whether resuming waits for a decision on every pending request (only for approval).
    pub fn needs_decisions(&self) -> bool {
        *self == SuspendReason::Approval
    }
}

/// A tool call that waits for a decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingRequest {
    /// The tool call's id: names the request in [`Store::decide`](crate::Store::decide); unique
    /// within a suspension.
    pub tool_call_id: String,
    /// The tool's name.
    pub tool_name: String,
    /// The call's arguments (JSON text, as the model produced them).
    pub arguments: String,
    /// The agents from the root of the tree to the level that asks, such as
    /// `["hr", "account", "authorize_account"]`. Filled by the store from the tree; left empty
    /// when a caller builds a level.
    pub path: Vec<String>,
}

/// Whether a decision lets a tool call run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The call runs (with its edited arguments, if any), once.
    Approve,
    /// The call never runs.
    Reject,
}

/// A decision on one pending request: who approved or rejected it, when, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Approve or reject.
    pub verdict: Verdict,
    /// A message for the agent (why, or what to do instead).
    pub message: Option<String>,
    /// Arguments to run the call with instead of the requested ones (approvals only).
    pub edited_arguments: Option<String>,
    /// Who decided.
    pub decided_by: String,
    /// When, in microseconds since the Unix epoch: stamped by the store when it records the
    /// decision (a value given to [`Store::decide`](crate::Store::decide) is ignored).
    pub decided_at_unix_us: u64,
}

impl Decision {
    /// An approval by `by`.
    pub fn approve(by: impl Into<String>) -> Self {
        Self::new(Verdict::Approve, by.into())
    }

    /// A rejection by `by`.
    pub fn reject(by: impl Into<String>) -> Self {
        Self::new(Verdict::Reject, by.into())
    }

    fn new(verdict: Verdict, decided_by: String) -> Self {
        Decision { verdict, message: None, edited_arguments: None, decided_by, decided_at_unix_us: 0 }
    }

    /// Adds a message for the agent.
    #[must_use]
    pub fn message(mut self, message: impl Into<String>) -> Self {
        self.message = Some(message.into());
        self
    }

    /// Runs the call with `arguments` instead of the requested ones.
    #[must_use]
    pub fn edited_arguments(mut self, arguments: impl Into<String>) -> Self {
        self.edited_arguments = Some(arguments.into());
        self
    }

    /// Whether it approves.
    pub fn approved(&self) -> bool {
        self.verdict == Verdict::Approve
    }

    /// Whether `other` is the same decision, its time aside: deciding it again is idempotent.
    pub fn same_as(&self, other: &Decision) -> bool {
        (self.verdict, &self.message, &self.edited_arguments, &self.decided_by)
            == (other.verdict, &other.message, &other.edited_arguments, &other.decided_by)
    }
}

/// A request and its recorded decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecidedRequest {
    /// The request.
    pub request: PendingRequest,
    /// Its decision, as recorded.
    pub decision: Decision,
    /// The control atom that records the decision: an approved call's guard is keyed on it
    /// ([`Store::run_approved`](crate::Store::run_approved)).
    pub atom: AtomId,
}

impl DecidedRequest {
    /// The arguments the call runs with: the edited ones if the decision gave any.
    pub fn arguments(&self) -> &str {
        self.decision.edited_arguments.as_deref().unwrap_or(&self.request.arguments)
    }
}

/// One level of a continuation tree: an agent, the atom it continues from, the requests it
/// waits on, the decisions taken on them, and its sub-agents' levels. A sub-agent that
/// suspends suspends its parent: the tree holds the whole path.
///
/// Its messages are not copied: they are the context the store rebuilds from `head`
/// ([`Store::rebuild_context`](crate::Store::rebuild_context)).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContinuationLevel {
    /// The agent.
    pub agent: String,
    /// The atom of `agent` it continues from, if it has one.
    pub head: Option<AtomId>,
    /// The requests of this level that wait for a decision.
    pub resume_request: Vec<PendingRequest>,
    /// The decisions taken on this level's requests (filled by the store; empty when
    /// suspending).
    pub processed: Vec<DecidedRequest>,
    /// The levels of its sub-agents.
    pub children: Vec<ContinuationLevel>,
}

impl ContinuationLevel {
    /// A level of `agent`.
    pub fn new(agent: impl Into<String>) -> Self {
        ContinuationLevel { agent: agent.into(), ..Self::default() }
    }

    /// Sets the atom the agent continues from.
    #[must_use]
    pub fn head(mut self, atom: AtomId) -> Self {
        self.head = Some(atom);
        self
    }

    /// Adds a tool call that waits for a decision.
    #[must_use]
    pub fn request(
        mut self,
        tool_call_id: impl Into<String>,
        tool_name: impl Into<String>,
        arguments: impl Into<String>,
    ) -> Self {
        self.resume_request.push(PendingRequest {
            tool_call_id: tool_call_id.into(),
            tool_name: tool_name.into(),
            arguments: arguments.into(),
            path: Vec::new(),
        });
        self
    }

    /// Adds a sub-agent's level.
    #[must_use]
    pub fn child(mut self, level: ContinuationLevel) -> Self {
        self.children.push(level);
        self
    }

    /// Calls `visit` with every level, depth first (this one first), and its path.
    pub(crate) fn walk<'a>(&'a self, path: &mut Vec<String>, visit: &mut impl FnMut(&'a ContinuationLevel, &[String])) {
        path.push(self.agent.clone());
        visit(self, path);
        for child in &self.children {
            child.walk(path, visit);
        }
        path.pop();
    }
}

/// What a run suspends with: why, and the tree of its agents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Continuation {
    /// Why.
    pub reason: SuspendReason,
    /// The root agent's level.
    pub root: ContinuationLevel,
}

impl Continuation {
    /// A continuation for `reason` with `root`.
    pub fn new(reason: SuspendReason, root: ContinuationLevel) -> Self {
        Continuation { reason, root }
    }
}

/// Names one suspension of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SuspensionId {
    /// The run.
    pub run: RunId,
    /// 1 for its first suspension, then one more for each.
    pub number: u64,
    /// The control atom that records it.
    pub atom: AtomId,
}

/// A suspended run: what [`Store::suspended_runs`](crate::Store::suspended_runs) and
/// [`Store::suspension`](crate::Store::suspension) return.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SuspendedRun {
    /// The suspension.
    pub id: SuspensionId,
    /// The run's name.
    pub run_name: String,
    /// Why it suspended.
    pub reason: SuspendReason,
    /// Since when, in microseconds since the Unix epoch.
    pub since_unix_us: u64,
    /// The requests still open, flattened from the tree with their paths, depth first.
    pub pending: Vec<PendingRequest>,
    /// The decisions taken so far, in the order of the tree.
    pub decided: Vec<DecidedRequest>,
    /// The continuation tree, each level's `processed` filled.
    pub root: ContinuationLevel,
}

/// Which suspended runs [`Store::suspended_runs`](crate::Store::suspended_runs) lists.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SuspendedFilter {
    /// Only runs suspended for this kind of reason.
    pub reason: Option<ReasonKind>,
    /// Only runs suspended at or before this time (microseconds since the Unix epoch): "older
    /// than".
    pub suspended_before_unix_us: Option<u64>,
    /// At most this many (the oldest first); `None`: all.
    pub limit: Option<usize>,
}

/// One level of a resumed run: where its agent continues and what was decided for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResumedLevel {
    /// The agents from the root to this level.
    pub path: Vec<String>,
    /// The agent.
    pub agent: String,
    /// The atom it continues from; its context is
    /// [`Store::rebuild_context`](crate::Store::rebuild_context) of it.
    pub head: Option<AtomId>,
    /// Its requests' decisions, in request order.
    pub decided: Vec<DecidedRequest>,
    /// Its requests left undecided (a suspension that needs no decisions).
    pub undecided: Vec<PendingRequest>,
}

/// What [`Store::resume_suspended`](crate::Store::resume_suspended) returns: where each agent
/// continues and what was decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resumed {
    /// The suspension resumed.
    pub id: SuspensionId,
    /// Why it had suspended.
    pub reason: SuspendReason,
    /// When it suspended and when it resumed, in microseconds since the Unix epoch.
    pub suspended_at_unix_us: u64,
    /// When it resumed.
    pub resumed_at_unix_us: u64,
    /// Every level of the tree, depth first (the root first).
    pub levels: Vec<ResumedLevel>,
}

impl Resumed {
    /// The level whose path is `path`.
    pub fn level(&self, path: &[&str]) -> Option<&ResumedLevel> {
        self.levels.iter().find(|level| level.path.iter().map(String::as_str).eq(path.iter().copied()))
    }

    /// The heads of the levels that have one, depth first: rebuild every agent's context in one
    /// shared pass with [`Store::rebuild_contexts`](crate::Store::rebuild_contexts).
    pub fn heads(&self) -> Vec<AtomId> {
        self.levels.iter().filter_map(|level| level.head).collect()
    }

    /// Every decision, depth first.
    pub fn decided(&self) -> impl Iterator<Item = &DecidedRequest> {
        self.levels.iter().flat_map(|level| level.decided.iter())
    }
}

/// An approved tool call about to run (what [`Store::run_approved`](crate::Store::run_approved)
/// hands its closure).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApprovedCall<'a> {
    /// The request and its decision.
    pub decided: &'a DecidedRequest,
    /// The arguments to run it with (edited ones, if the decision gave any).
    pub arguments: &'a str,
    /// The idempotency key of this call: pass it to an external API that accepts one.
    pub idempotency_key: &'a str,
}
