//! Idempotency guards: a side effect runs at most once per key, across crashes.
//!
//! `GuardStarted` is written durably before the effect runs and `GuardCompleted` (with the
//! effect's result) after, or `GuardFailed` if the effect reports a failure (a retryable one
//! frees the key for another attempt; another is the key's outcome). A later call with a completed key returns the recorded result; a
//! key that started but never completed is *in doubt* (the process died during the effect):
//! running it again could repeat it, so the caller gets [`Error::GuardInDoubt`] and decides,
//! using the key with the external system, then records the outcome with
//! [`Store::resolve_guard`].

use crate::codec::StoreRecord;
use crate::codec::proto;
use crate::config::Durability;
use crate::error::{Error, Result};
use crate::store::index::GuardEntry;
use crate::store::types::{AtomFailure, AtomId, RunId};
use crate::store::{Store, now_us};

impl Store {
    /// The idempotency key of `operation` inside `atom`:
    /// `"<run name>#<run id>/<agent>/<atom key>/<operation>"`. Deterministic, so the same step
    /// of a resumed agent derives the same key; pass it to external APIs that accept one. The
    /// run's id keeps apart a run that reuses the name of one retention dropped: its steps'
    /// effects are new ones, under new keys. In each part `%`, `/` and `#` are escaped as
    /// `%25`, `%2F` and `%23`, so that two different atoms or operations never share a key
    /// (agent `"a/b"` with key `"c"` against agent `"a"` with key `"b/c"`). A step run again
    /// after a [`Store::rollback`] derives the key it had before, so its effect is not repeated
    /// (the recorded result comes back): the effect happened in the world, and only the caller
    /// knows whether to undo it or to perform another one (under another operation name).
    ///
    /// # Errors
    /// [`Error::UnknownAtom`] and the log's read errors.
    pub fn guard_key(&self, atom: AtomId, operation: &str) -> Result<String> {
        Ok(self.guard_names(atom)?.key(operation))
    }

    /// What `atom`'s guard keys are made of.
    fn guard_names(&self, atom: AtomId) -> Result<GuardNames> {
        let found = self.atom(atom)?;
        let run_name = self.shared.index.read().run(found.run).map(|run| run.name.clone()).unwrap_or_default();
        Ok(GuardNames { run: found.run, run_name, agent: found.agent, atom_key: found.key })
    }

    /// Runs `effect` at most once for (`atom`, `operation`) across crashes and returns its
    /// result; every later call returns the recorded result without running it. `effect`
    /// receives the idempotency key, and reports a failure as an [`AtomFailure`]: a retryable
    /// one is recorded as such and leaves the key free, so the next call runs the effect again;
    /// one that is not retryable is recorded as the key's outcome, and every later call returns
    /// it without running the effect. Only a success is ever returned as a result.
    ///
    /// ```
    /// # fn main() -> continuum::Result<()> {
    /// use continuum::{AtomFailure, Error, RunSpec, Store};
    /// let dir = tempfile::tempdir().unwrap();
    /// let store = Store::open(dir.path())?;
    /// let run = store.create_run(RunSpec::new("trip"))?;
    /// let step = store.begin_atom(run, "planner", "book", &[], "")?;
    /// let busy = |_key: &str| Err(AtomFailure { message: "503".into(), retryable: true });
    /// assert!(matches!(store.guarded(step, "book_flight", busy), Err(Error::GuardFailed { retryable: true, .. })));
    /// let booked = store.guarded(step, "book_flight", |_key| Ok(b"PNR 7XK2".to_vec()))?;
    /// assert_eq!(booked, b"PNR 7XK2");
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::GuardFailed`] when `effect` fails, or failed for good before;
    /// [`Error::GuardInDoubt`] if an earlier attempt started the effect and never recorded its
    /// end; [`Error::UnknownAtom`]; the log's errors.
    pub fn guarded(
        &self,
        atom: AtomId,
        operation: &str,
        effect: impl FnOnce(&str) -> std::result::Result<Vec<u8>, AtomFailure>,
    ) -> Result<Vec<u8>> {
        let names = self.guard_names(atom)?;
        let key = names.key(operation);
        let hash = self.shared.identity.guard(&key);
        if let Some(result) = self.recorded_guard(&key, hash)? {
            return Ok(result);
        }
        if let Some(result) = self.legacy_guard(&names, operation)? {
            return Ok(result);
        }
        // Reserve the key so that a concurrent caller in this process sees it in doubt.
        {
            let mut index = self.shared.index.write();
            if index.guards.contains_key(&hash) {
                return Err(Error::GuardInDoubt { key });
            }
            index.guards.insert(hash, GuardEntry { started_lsn: 0, completed_lsn: 0 });
        }
        let started = StoreRecord::GuardStarted(proto::GuardStarted {
            key: key.clone(),
            atom: atom.get(),
            operation: operation.to_owned(),
            started_at_unix_us: now_us(),
        });
        // IMPORTANT: the intent is durable before the effect runs: at most once.
        let lsn = match self.append(&started, Durability::Sync) {
            Ok(lsn) => lsn,
            Err(error) => {
                self.shared.index.write().guards.remove(&hash);
                return Err(error);
            }
        };
        self.shared.index.write().guards.insert(hash, GuardEntry { started_lsn: lsn.get(), completed_lsn: 0 });
        match effect(&key) {
            Ok(result) => {
                self.record_guard(&key, hash, &result)?;
                Ok(result)
            }
            Err(failure) => {
                self.record_guard_failure(&key, hash, &failure)?;
                Err(Error::GuardFailed { key, message: failure.message, retryable: failure.retryable })
            }
        }
    }

    /// Records that the effect guarded by `key` failed: a retryable failure frees the key (the
    /// next call runs the effect again), another is the key's outcome. Should the record not be
    /// written, the key stays in doubt, the safe side.
    fn record_guard_failure(&self, key: &str, hash: u64, failure: &AtomFailure) -> Result<()> {
        let failed = StoreRecord::GuardFailed(proto::GuardFailed {
            key: key.to_owned(),
            error: failure.message.clone(),
            retryable: failure.retryable,
            ended_at_unix_us: now_us(),
        });
        // IMPORTANT: durable before the key is free, so that no open finds it in doubt while
        // this process runs the effect again.
        let lsn = self.append(&failed, Durability::Sync)?;
        let mut index = self.shared.index.write();
        if failure.retryable {
            index.guards.remove(&hash);
        } else {
            let entry = index.guards.entry(hash).or_insert(GuardEntry { started_lsn: lsn.get(), completed_lsn: 0 });
            entry.completed_lsn = entry.completed_lsn.max(lsn.get());
        }
        Ok(())
    }

    /// Records the outcome of an in-doubt guard after the caller checked the external system;
    /// later calls of [`Store::guarded`] return `result`.
    ///
    /// # Errors
    /// [`Error::GuardNotInDoubt`] if no effect is in doubt under `key` (none started under it,
    /// a mistyped key, or its outcome is already recorded, which stays as it is); the log's
    /// errors.
    pub fn resolve_guard(&self, key: &str, result: &[u8]) -> Result<()> {
        let hash = self.shared.identity.guard(key);
        let entry = self.shared.index.read().guards.get(&hash).copied();
        let not_in_doubt = || Error::GuardNotInDoubt { key: key.to_owned() };
        let entry = entry.filter(|entry| entry.completed_lsn == 0).ok_or_else(not_in_doubt)?;
        // A start being appended right now (`started_lsn` 0) is in doubt too; a recorded one
        // must be this key's, not another's of the same hash.
        if entry.started_lsn != 0 {
            match self.read_record(entry.started_lsn)? {
                StoreRecord::GuardStarted(started) if started.key == key => {}
                _ => return Err(not_in_doubt()),
            }
        }
        self.record_guard(key, hash, result)
    }

    fn record_guard(&self, key: &str, hash: u64, result: &[u8]) -> Result<()> {
        let completed = StoreRecord::GuardCompleted(proto::GuardCompleted {
            key: key.to_owned(),
            result: result.to_vec(),
            ended_at_unix_us: now_us(),
        });
        let lsn = self.append(&completed, Durability::Sync)?;
        let mut index = self.shared.index.write();
        let entry = index.guards.entry(hash).or_insert(GuardEntry { started_lsn: lsn.get(), completed_lsn: 0 });
        // Two outcomes can land (a resolution racing the effect): the newer counts, as on open.
        entry.completed_lsn = entry.completed_lsn.max(lsn.get());
        Ok(())
    }

    /// The guard a store written before keys named the run's id recorded for `operation` of
    /// an atom of the same run, under the key without the id: its recorded result, or
    /// [`Error::GuardInDoubt`] under that key (which [`Store::resolve_guard`] then takes).
    /// The guard of another run that had the same name (one retention dropped) is not this
    /// one.
    fn legacy_guard(&self, names: &GuardNames, operation: &str) -> Result<Option<Vec<u8>>> {
        let key = names.legacy_key(operation);
        let hash = self.shared.identity.guard(&key);
        let Some(entry) = self.shared.index.read().guards.get(&hash).copied() else { return Ok(None) };
        if !self.guard_started_in(entry.started_lsn, names.run)? {
            return Ok(None);
        }
        self.recorded_guard(&key, hash)
    }

    /// Whether the guard whose start is at `lsn` was started by an atom of `run`. A guard
    /// with no start record of its own (resolved without one) is taken to be: then the effect
    /// is not run again, which is the safe side.
    fn guard_started_in(&self, lsn: u64, run: RunId) -> Result<bool> {
        if lsn == 0 {
            return Ok(true);
        }
        match self.read_record(lsn)? {
            StoreRecord::GuardStarted(started) => {
                let index = self.shared.index.read();
                Ok(index.atom(AtomId(started.atom)).is_some_and(|entry| u64::from(entry.run) == run.0))
            }
            _ => Ok(true),
        }
    }

    /// The recorded result of a completed guard; [`Error::GuardInDoubt`] for a started one.
    fn recorded_guard(&self, key: &str, hash: u64) -> Result<Option<Vec<u8>>> {
        let Some(entry) = self.shared.index.read().guards.get(&hash).copied() else { return Ok(None) };
        if entry.completed_lsn == 0 {
            return Err(Error::GuardInDoubt { key: key.to_owned() });
        }
        match self.read_record(entry.completed_lsn)? {
            StoreRecord::GuardCompleted(done) if done.key == key => Ok(Some(done.result)),
            StoreRecord::GuardFailed(failed) if failed.key == key => {
                Err(Error::GuardFailed { key: key.to_owned(), message: failed.error, retryable: false })
            }
            StoreRecord::GuardCompleted(_) | StoreRecord::GuardFailed(_) => {
                Err(Error::KeyCollision { key: key.to_owned() })
            }
            _ => {
                Err(Error::InconsistentLog { lsn: entry.completed_lsn, reason: "a guard's end is not a guard record" })
            }
        }
    }
}

/// The names a guard key is made of: the atom's run (id and name), agent and key.
struct GuardNames {
    run: RunId,
    run_name: String,
    agent: String,
    atom_key: String,
}

impl GuardNames {
    /// `"<run name>#<run id>/<agent>/<atom key>/<operation>"`, each name escaped.
    fn key(&self, operation: &str) -> String {
        let (run, agent, atom, operation) =
            (escaped(&self.run_name), escaped(&self.agent), escaped(&self.atom_key), escaped(operation));
        format!("{run}#{}/{agent}/{atom}/{operation}", self.run.get())
    }

    /// The key stores derived before it named the run's id:
    /// `"<run name>/<agent>/<atom key>/<operation>"`.
    fn legacy_key(&self, operation: &str) -> String {
        format!("{}/{}/{}/{operation}", self.run_name, self.agent, self.atom_key)
    }
}

/// What every guard key of the run `run` named `run_name` starts with (see
/// [`Store::guard_key`]).
pub(crate) fn run_guard_prefix(run_name: &str, run: RunId) -> String {
    format!("{}#{}/", escaped(run_name), run.get())
}

/// `part` with `%`, `/` and `#` percent-escaped: the separators of a guard key cannot occur in
/// its parts, so distinct parts make distinct keys. Parts without them are returned as they are.
fn escaped(part: &str) -> std::borrow::Cow<'_, str> {
    if !part.contains(['%', '/', '#']) {
        return std::borrow::Cow::Borrowed(part);
    }
    let mut out = String::with_capacity(part.len() + 8);
    for c in part.chars() {
        match c {
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            '#' => out.push_str("%23"),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::escaped;

    #[test]
    fn escaping_keeps_plain_names_and_makes_separators_unambiguous() {
        assert_eq!(escaped("planner"), "planner");
        assert_eq!(escaped("a/b#c%d"), "a%2Fb%23c%25d");
        // `%2F` written literally is escaped too, so it cannot pass for an escaped `/`.
        assert_ne!(escaped("%2F"), escaped("/"));
    }
}
