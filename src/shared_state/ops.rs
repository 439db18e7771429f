//! Reading and writing shared state inside an atom: the versions an atom read and the writes
//! it makes, which its commit checks and records (`shared_state/commit.rs`).

use std::collections::BTreeMap;

use crate::channel::Exchange;
use crate::error::{Error, Result};
use crate::limits::{STATE_KEYS_PER_ATOM_MAX, STATE_VALUE_BYTES_MAX, STATE_WRITES_PER_ATOM_MAX};
use crate::shared_state::names::{VersionKind, kind_of};
use crate::shared_state::{StateKey, StateValue, Versioned};
use crate::store::RunId;

/// One write of an atom to a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Write {
    /// Replace the key's bytes.
    Put(Vec<u8>),
    /// Add to the key's counter.
    Add(i64),
    /// Append an item to the key's list.
    Append(Vec<u8>),
}

/// What an atom read and wrote of shared state, committed with it.
#[derive(Debug, Default)]
pub(crate) struct StateOps {
    /// Per run and key agent: what the atom read (the version, 0 for a key never written, and
    /// the value), which its commit checks is still the key's newest version.
    pub reads: BTreeMap<(RunId, String), Option<Versioned>>,
    /// Each write, in the order the atom made them: run, key agent, write.
    pub writes: Vec<(RunId, String, Write)>,
}

impl StateOps {
    /// Whether the atom touched no key.
    pub(crate) fn is_empty(&self) -> bool {
        self.reads.is_empty() && self.writes.is_empty()
    }

    /// The keys the atom read or wrote, once each, in order.
    pub(crate) fn keys(&self) -> Vec<(RunId, String)> {
        let mut keys: Vec<(RunId, String)> = self.reads.keys().cloned().collect();
        keys.extend(self.writes.iter().map(|(run, agent, _)| (*run, agent.clone())));
        keys.sort_unstable();
        keys.dedup();
        keys
    }
}

/// `value` after `write`, or `None` when `write` does not fit the key's kind (or a counter
/// would overflow).
pub(crate) fn apply(value: Option<StateValue>, write: &Write) -> Option<StateValue> {
    match (value, write) {
        (None | Some(StateValue::Bytes(_)), Write::Put(bytes)) => Some(StateValue::Bytes(bytes.clone())),
        (None, Write::Add(add)) => Some(StateValue::Counter(*add)),
        (Some(StateValue::Counter(total)), Write::Add(add)) => total.checked_add(*add).map(StateValue::Counter),
        (None, Write::Append(item)) => Some(StateValue::List(vec![item.clone()])),
        (Some(StateValue::List(mut items)), Write::Append(item)) => {
            items.push(item.clone());
            Some(StateValue::List(items))
        }
        _ => None,
    }
}

/// The error for a write that does not fit its key's value.
pub(crate) fn misfit(key_agent: &str, holds: Option<VersionKind>, write: &Write) -> Error {
    let key = key_agent.strip_prefix(crate::shared_state::STATE_AGENT_PREFIX).unwrap_or(key_agent);
    let holds = holds.map_or("nothing", VersionKind::name);
    let what = match write {
        Write::Put(_) => "a put",
        Write::Add(_) => "an addition (or the counter would overflow)",
        Write::Append(_) => "an append",
    };
    Error::InvalidArgument { reason: format!("state key {key:?} holds {holds}: {what} does not apply to it") }
}

impl Exchange<'_> {
    /// Reads `key` (a key of the atom's run, or [`StateKey::store`]): its newest committed
    /// value with the atom's own writes applied, `None` if it has none. The atom's commit then
    /// checks that the key is still at the version read, and is refused with
    /// [`Error::Conflict`] if another atom wrote it since. Reading a key again returns what the
    /// first read returned (with the atom's writes applied).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad key; [`Error::LimitExceeded`] past
    /// [`STATE_KEYS_PER_ATOM_MAX`] keys; read errors.
    pub fn read(&mut self, key: impl Into<StateKey>) -> Result<Option<Versioned>> {
        let (run, agent) = self.store().resolve_state_key(self.run(), &key.into())?;
        let id = (run, agent);
        let read = match self.state().reads.get(&id) {
            Some(read) => read.clone(),
            None => {
                self.check_keys(&id)?;
                let store = self.store();
                let read = store.value_at(run, &id.1, store.latest_version(run, &id.1)?)?;
                self.state_mut().reads.insert(id.clone(), read.clone());
                read
            }
        };
        let mut value = read.as_ref().map(|read| read.value.clone());
        for (_, _, write) in self.state().writes.iter().filter(|(r, a, _)| *r == id.0 && *a == id.1) {
            value = Some(apply(value.clone(), write).ok_or_else(|| misfit(&id.1, value.as_ref().map(kind_of), write))?);
        }
        let version = read.map_or(0, |read| read.version);
        Ok(value.map(|value| Versioned { version, value }))
    }

    /// Sets `key` to `value` when the atom commits. Without a read of `key` the put is blind:
    /// it never conflicts, and the last commit wins.
    ///
    /// # Errors
    /// As [`Exchange::read`]; [`Error::LimitExceeded`] for a value above
    /// [`STATE_VALUE_BYTES_MAX`] or more than [`STATE_WRITES_PER_ATOM_MAX`] writes.
    pub fn put(&mut self, key: impl Into<StateKey>, value: impl Into<Vec<u8>>) -> Result<()> {
        self.write(key.into(), Write::Put(value.into()))
    }

    /// Adds `amount` to the counter `key` (created at 0) when the atom commits: a merge that
    /// never conflicts unless the atom also read the key.
    ///
    /// # Errors
    /// As [`Exchange::put`]. A key that holds no counter, or a total that would overflow an
    /// `i64`, refuses the atom's commit with [`Error::InvalidArgument`].
    pub fn add(&mut self, key: impl Into<StateKey>, amount: i64) -> Result<()> {
        self.write(key.into(), Write::Add(amount))
    }

    /// Appends `item` to the list `key` (created empty) when the atom commits: a merge that
    /// never conflicts unless the atom also read the key.
    ///
    /// # Errors
    /// As [`Exchange::put`]. A key that holds no list, or a list at
    /// [`STATE_LIST_ITEMS_MAX`](crate::limits::STATE_LIST_ITEMS_MAX) items, refuses the atom's
    /// commit.
    pub fn append(&mut self, key: impl Into<StateKey>, item: impl Into<Vec<u8>>) -> Result<()> {
        self.write(key.into(), Write::Append(item.into()))
    }

    /// Notes a write, checked against the limits.
    fn write(&mut self, key: StateKey, write: Write) -> Result<()> {
        let (run, agent) = self.store().resolve_state_key(self.run(), &key)?;
        let bytes = match &write {
            Write::Put(bytes) | Write::Append(bytes) => bytes.len(),
            Write::Add(_) => 8,
        };
        if bytes > STATE_VALUE_BYTES_MAX {
            return Err(Error::LimitExceeded { what: "state value bytes".into(), limit: STATE_VALUE_BYTES_MAX as u64 });
        }
        if self.state().writes.len() == STATE_WRITES_PER_ATOM_MAX {
            let limit = STATE_WRITES_PER_ATOM_MAX as u64;
            return Err(Error::LimitExceeded { what: "state writes of one atom".into(), limit });
        }
        self.check_keys(&(run, agent.clone()))?;
        self.state_mut().writes.push((run, agent, write));
        Ok(())
    }

    /// Refuses a key past the number of keys one atom may touch.
    fn check_keys(&self, id: &(RunId, String)) -> Result<()> {
        let state = self.state();
        let known = state.reads.contains_key(id) || state.writes.iter().any(|(r, a, _)| *r == id.0 && *a == id.1);
        if !known && state.keys().len() >= STATE_KEYS_PER_ATOM_MAX {
            let limit = STATE_KEYS_PER_ATOM_MAX as u64;
            return Err(Error::LimitExceeded { what: "state keys one atom touches".into(), limit });
        }
        Ok(())
    }
}
