//! The in-memory table of a store's suspended runs: changed by suspend, decide, resume and a
//! run's finish, rebuilt at open from the control atoms (`Store::load_suspensions`). Listing
//! suspended runs, the pending requests of one and the status of a run read it, never the log.

use std::collections::BTreeMap;

use crate::continuation::types::{
    ContinuationLevel, DecidedRequest, PendingRequest, SuspendReason, SuspendedRun, SuspensionId,
};

/// Suspended runs by run number.
#[derive(Debug, Default)]
pub(crate) struct Suspensions {
    pub runs: BTreeMap<u64, Suspended>,
}

/// One suspended run: its suspension and the decisions taken on it so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Suspended {
    pub id: SuspensionId,
    pub reason: SuspendReason,
    pub since_unix_us: u64,
    /// The tree as suspended (requests' paths filled, no decisions).
    pub root: ContinuationLevel,
    /// Decisions by tool call id.
    pub decided: BTreeMap<String, DecidedRequest>,
}

impl Suspended {
    /// The request named `tool_call_id`, if the tree holds it.
    pub fn request(&self, tool_call_id: &str) -> Option<&PendingRequest> {
        find_request(&self.root, tool_call_id)
    }

    /// Every request, depth first.
    pub fn requests(&self) -> Vec<&PendingRequest> {
        let mut requests = Vec::new();
        self.root.walk(&mut Vec::new(), &mut |level, _| requests.extend(level.resume_request.iter()));
        requests
    }

    /// The requests without a decision, depth first.
    pub fn pending(&self) -> Vec<PendingRequest> {
        self.requests()
            .into_iter()
            .filter(|request| !self.decided.contains_key(&request.tool_call_id))
            .cloned()
            .collect()
    }

    /// The tree with each level's `processed` filled.
    pub fn tree(&self) -> ContinuationLevel {
        let mut root = self.root.clone();
        self.fill_processed(&mut root);
        root
    }

    fn fill_processed(&self, level: &mut ContinuationLevel) {
        level.processed = level
            .resume_request
            .iter()
            .filter_map(|request| self.decided.get(&request.tool_call_id).cloned())
            .collect();
        for child in &mut level.children {
            self.fill_processed(child);
        }
    }

    /// The public view, for a run named `run_name`.
    pub fn view(&self, run_name: &str) -> SuspendedRun {
        let decided = self.requests().into_iter().filter_map(|r| self.decided.get(&r.tool_call_id).cloned()).collect();
        SuspendedRun {
            id: self.id,
            run_name: run_name.to_owned(),
            reason: self.reason.clone(),
            since_unix_us: self.since_unix_us,
            pending: self.pending(),
            decided,
            root: self.tree(),
        }
    }
}

/// The request of `root`'s tree named `tool_call_id`, if it holds one.
pub(crate) fn find_request<'a>(root: &'a ContinuationLevel, tool_call_id: &str) -> Option<&'a PendingRequest> {
    let mut found = None;
    root.walk(&mut Vec::new(), &mut |level, _| {
        if found.is_none() {
            found = level.resume_request.iter().find(|request| request.tool_call_id == tool_call_id);
        }
    });
    found
}
