//! Committing an atom's shared state: under the locks of every key it touched, check that each
//! key it read is still at the version read, and build the version atoms of its writes, which
//! go into the atom's completion batch (`store/batch.rs`).

use crate::error::{Error, Result};
use crate::limits::STATE_LIST_ITEMS_MAX;
use crate::shared_state::names::{self, VersionKind};
use crate::shared_state::ops::{StateOps, Write, misfit};
use crate::shared_state::{Latest, STATE_AGENT_PREFIX};
use crate::store::batch::ControlDraft;
use crate::store::{AtomId, RunId, Store};

/// The version atoms of an atom's writes and the newest version each key reaches.
#[derive(Debug, Default)]
pub(crate) struct StateCommit {
    /// One version atom per write, in the order of the writes.
    pub drafts: Vec<ControlDraft>,
    /// Per key written: its run, agent and newest version (without its atom, known once the
    /// batch is appended), in the order of `drafts`.
    pub reached: Vec<(RunId, String, Latest)>,
}

impl StateCommit {
    /// Caches each written key's newest version, given the ids of `drafts`' atoms; the caller
    /// still holds the keys' locks and the commit succeeded.
    pub(crate) fn publish(&self, store: &Store, ids: &[AtomId]) {
        assert_eq!(ids.len(), self.reached.len(), "one atom per write");
        for ((run, agent, latest), id) in self.reached.iter().zip(ids) {
            store.cache_latest(*run, agent, Latest { atom: Some(*id), ..latest.clone() });
        }
    }
}

impl Store {
    /// Checks the reads of `ops` and builds its version atoms. The caller holds the lock of
    /// every key of `ops` until the batch is applied to the index (or refused).
    ///
    /// # Errors
    /// [`Error::Conflict`] for a key read at a version that is no longer its newest;
    /// [`Error::InvalidArgument`] for a write that does not fit its key's kind;
    /// [`Error::LimitExceeded`] for a list past [`STATE_LIST_ITEMS_MAX`]; read errors.
    pub(crate) fn prepare_state(&self, ops: &StateOps) -> Result<StateCommit> {
        for ((run, agent), read) in &ops.reads {
            let found = self.latest_locked(*run, agent)?.version;
            let expected = read.as_ref().map_or(0, |read| read.version);
            if found != expected {
                let key = agent.strip_prefix(STATE_AGENT_PREFIX).unwrap_or(agent).to_owned();
                return Err(Error::Conflict { key, expected, found });
            }
        }
        let mut commit = StateCommit::default();
        for (run, agent, write) in &ops.writes {
            let previous = match commit.reached.iter().rev().find(|(r, a, _)| r == run && a == agent) {
                Some((_, _, latest)) => latest.clone(),
                None => self.latest_locked(*run, agent)?,
            };
            let mut latest = next_version(previous, agent, write)?;
            let payload = match write {
                Write::Put(bytes) | Write::Append(bytes) => bytes.clone(),
                Write::Add(_) => latest.total.to_le_bytes().to_vec(),
            };
            let kind = latest.kind.expect("a written key has a kind");
            latest.bytes = Latest::small_bytes(kind, &payload);
            let result = names::encode_version(latest.version, kind, &payload);
            let key = names::version_key(latest.version);
            commit.drafts.push(ControlDraft { run: *run, agent: agent.clone(), key, result });
            commit.reached.push((*run, agent.clone(), latest));
        }
        Ok(commit)
    }
}

/// The version a key reaches when `write` follows `previous`; refused when the write does not
/// fit the key's kind, a counter overflows or a list is full.
fn next_version(previous: Latest, agent: &str, write: &Write) -> Result<Latest> {
    let version = previous.version + 1;
    let (kind, total) = match (previous.kind, write) {
        (None | Some(VersionKind::Bytes), Write::Put(_)) => (VersionKind::Bytes, 0),
        (None | Some(VersionKind::Counter), Write::Add(add)) => match previous.total.checked_add(*add) {
            Some(total) => (VersionKind::Counter, total),
            None => return Err(misfit(agent, previous.kind, write)),
        },
        (None | Some(VersionKind::Item), Write::Append(_)) => {
            if version > STATE_LIST_ITEMS_MAX {
                return Err(Error::LimitExceeded { what: "items of a state list".into(), limit: STATE_LIST_ITEMS_MAX });
            }
            (VersionKind::Item, 0)
        }
        (kind, _) => return Err(misfit(agent, kind, write)),
    };
    Ok(Latest { version, atom: None, kind: Some(kind), total, bytes: None })
}
