//! Shared state with optimistic concurrency: keyed values several agents read and write inside
//! their atoms, each key with a version (`docs/ARCHITECTURE.md`, "Shared state").
//!
//! Each version of a key is a control atom of the key's agent (`continuum.state/<key>`) in the
//! run the key belongs to (the atom's run, or the store-wide state run, [`STATE_RUN`]), keyed
//! by the version number and written in the same log batch as the completion of the atom that
//! wrote it. An atom run by [`Store::execute_with`](crate::Store::execute_with) reads keys
//! through its [`Exchange`](crate::channel::Exchange), which notes the version it read, and
//! writes keys; its completion commits only if every key it read is still at that version
//! (compare-and-set inside the commit, under the keys' locks), otherwise it is refused with
//! [`Error::Conflict`](crate::Error::Conflict) and nothing of it is written. Additions to a
//! counter ([`Exchange::add`](crate::channel::Exchange::add)) and appends to a list
//! ([`Exchange::append`](crate::channel::Exchange::append)) made without a read never conflict.

pub(crate) mod commit;
mod names;
pub(crate) mod ops;
mod read;
mod retry;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

pub use names::STATE_AGENT_PREFIX;
pub(crate) use names::VersionKind;

use crate::store::{AtomId, RunId};

/// The name of the run that holds the store-wide shared state ([`StateKey::store`]).
pub const STATE_RUN: &str = "continuum.state";

/// A key of shared state: of the run of the atom that uses it (`"budget".into()`), or of the
/// whole store ([`StateKey::store`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StateKey {
    /// Whether the key is store-wide.
    store_wide: bool,
    /// The key's name.
    name: String,
}

impl StateKey {
    /// A key of the run of the atom that reads or writes it.
    pub fn run(name: impl Into<String>) -> Self {
        Self { store_wide: false, name: name.into() }
    }

    /// A key shared by every run of the store (kept in the run [`STATE_RUN`]).
    pub fn store(name: impl Into<String>) -> Self {
        Self { store_wide: true, name: name.into() }
    }

    /// The key's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the key is store-wide.
    pub fn is_store_wide(&self) -> bool {
        self.store_wide
    }
}

impl From<&str> for StateKey {
    fn from(name: &str) -> Self {
        Self::run(name)
    }
}

impl From<String> for StateKey {
    fn from(name: String) -> Self {
        Self::run(name)
    }
}

/// The value of a key. A key's kind is set by its first write: a write of another kind is
/// refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateValue {
    /// Bytes, replaced whole by each [`Exchange::put`](crate::channel::Exchange::put).
    Bytes(Vec<u8>),
    /// A counter, changed by [`Exchange::add`](crate::channel::Exchange::add).
    Counter(i64),
    /// A list, grown by [`Exchange::append`](crate::channel::Exchange::append), oldest item first.
    List(Vec<Vec<u8>>),
}

/// A key's value at a version. Versions start at 1 with the key's first write and grow by one
/// with each write; a key never written is at version 0 and has no value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versioned {
    /// The version.
    pub version: u64,
    /// The value at that version.
    pub value: StateValue,
}

/// The newest version of a key, as the key's lock holder knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Latest {
    /// The version (0: never written).
    pub version: u64,
    /// The atom holding it (`None` at version 0).
    pub atom: Option<AtomId>,
    /// The kind of value the key holds (`None` at version 0).
    pub kind: Option<VersionKind>,
    /// A counter's total (0 unless the key is a counter).
    pub total: i64,
    /// The bytes of a bytes key, when at most [`STATE_VALUE_CACHED_BYTES_MAX`]: a read then
    /// needs no record from the log.
    ///
    /// [`STATE_VALUE_CACHED_BYTES_MAX`]: crate::limits::STATE_VALUE_CACHED_BYTES_MAX
    pub bytes: Option<Arc<[u8]>>,
}

impl Latest {
    /// A key never written.
    pub(crate) const ABSENT: Latest = Latest { version: 0, atom: None, kind: None, total: 0, bytes: None };

    /// Bytes worth keeping in the cache: a bytes key's value, if small.
    pub(crate) fn small_bytes(kind: VersionKind, payload: &[u8]) -> Option<Arc<[u8]>> {
        let small = kind == VersionKind::Bytes && payload.len() <= crate::limits::STATE_VALUE_CACHED_BYTES_MAX;
        small.then(|| Arc::from(payload))
    }

    /// Bytes this entry holds in the cache.
    fn cached_bytes(&self, key_agent: &str) -> usize {
        key_agent.len() + self.bytes.as_ref().map_or(0, |bytes| bytes.len()) + 64
    }
}

/// Number of locks the keys' commits are spread over.
const KEY_LOCKS: usize = 1024;

/// Shared state's in-memory part of an open store: the keys' locks and a cache of their newest
/// versions.
pub(crate) struct StateTable {
    /// A committing atom holds the lock of each key it read or wrote from the version check
    /// to the index update, so that no other commit changes the key in between.
    pub(crate) key_locks: [Mutex<()>; KEY_LOCKS],
    /// Newest versions, by run and key agent: written only under the key's lock (from the
    /// log, or by a commit after its index update), so a hit is never older than the last
    /// commit that released the lock. A cache: cleared when full.
    latest: Mutex<LatestCache>,
}

/// The newest versions cached, and the bytes they hold.
#[derive(Default)]
struct LatestCache {
    entries: HashMap<(u64, String), Latest>,
    bytes: usize,
}

impl Default for StateTable {
    fn default() -> Self {
        Self { key_locks: std::array::from_fn(|_| Mutex::new(())), latest: Mutex::new(LatestCache::default()) }
    }
}

impl StateTable {
    /// The lock a key agent's commits take.
    pub(crate) fn key_lock(&self, run: RunId, key_agent: &str) -> usize {
        crate::store::stripe_of(run, key_agent, KEY_LOCKS)
    }

    /// The cached newest version of a key agent of `run`, if any.
    fn cached(&self, run: RunId, key_agent: &str) -> Option<Latest> {
        self.latest.lock().entries.get(&(run.0, key_agent.to_owned())).cloned()
    }

    /// Caches a key agent's newest version; the caller holds its lock.
    fn cache(&self, run: RunId, key_agent: &str, latest: Latest) {
        let mut cache = self.latest.lock();
        let adding = latest.cached_bytes(key_agent);
        if cache.entries.len() >= crate::limits::STATE_VERSIONS_CACHED_MAX
            || cache.bytes + adding > crate::limits::STATE_CACHE_BYTES_MAX
        {
            cache.entries.clear();
            cache.bytes = 0;
        }
        if let Some(old) = cache.entries.insert((run.0, key_agent.to_owned()), latest) {
            cache.bytes -= old.cached_bytes(key_agent);
        }
        cache.bytes += adding;
    }
}
