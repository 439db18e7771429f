//! Reading shared state: a key's newest version (cached, or from the log) and its value.

use crate::codec::StoreRecord;
use crate::error::{Error, Result};
use crate::shared_state::names::{self, VersionKind};
use crate::shared_state::{Latest, STATE_RUN, StateKey, StateValue, Versioned};
use crate::store::index::EntryState;
use crate::store::{AtomId, RunId, Store, unknown_run};

impl Store {
    /// The newest committed value of `key`: a key of `run`, or a store-wide key
    /// ([`StateKey::store`]); `None` for a key never written.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad key; [`Error::UnknownRun`]; read errors, and
    /// [`Error::InconsistentLog`] for a version atom whose result is not a version.
    pub fn read_state(&self, run: RunId, key: impl Into<StateKey>) -> Result<Option<Versioned>> {
        let key = key.into();
        names::check_key(key.name())?;
        let run = match key.is_store_wide() {
            true => match self.run_id(STATE_RUN) {
                Some(state_run) => state_run,
                None => return Ok(None),
            },
            false => {
                self.run_status(run)?;
                run
            }
        };
        let agent = names::state_agent(key.name());
        let latest = self.latest_version(run, &agent)?;
        self.value_at(run, &agent, latest)
    }

    /// The run that holds the store-wide shared state ([`STATE_RUN`]), created on first use.
    ///
    /// # Errors
    /// The errors of [`Store::create_run`].
    pub fn state_run(&self) -> Result<RunId> {
        match self.run_id(STATE_RUN) {
            Some(run) => Ok(run),
            None => self.create_run(crate::RunSpec::new(STATE_RUN)),
        }
    }

    /// The run a key lives in, seen from an atom of `run`, and the key's agent.
    pub(crate) fn resolve_state_key(&self, run: RunId, key: &StateKey) -> Result<(RunId, String)> {
        names::check_key(key.name())?;
        let run = if key.is_store_wide() { self.state_run()? } else { run };
        Ok((run, names::state_agent(key.name())))
    }

    /// A key agent's newest version: cached, or from the log.
    pub(crate) fn latest_version(&self, run: RunId, key_agent: &str) -> Result<Latest> {
        match self.shared.state.cached(run, key_agent) {
            Some(latest) => Ok(latest),
            None => self.latest_in_log(run, key_agent),
        }
    }

    /// [`Store::latest_version`] that fills the cache on a miss; the caller holds the key's
    /// lock, so no commit changes the key between the read and the fill.
    pub(crate) fn latest_locked(&self, run: RunId, key_agent: &str) -> Result<Latest> {
        if let Some(latest) = self.shared.state.cached(run, key_agent) {
            return Ok(latest);
        }
        let latest = self.latest_in_log(run, key_agent)?;
        self.shared.state.cache(run, key_agent, latest.clone());
        Ok(latest)
    }

    /// Caches a key agent's newest version after a commit; the caller holds the key's lock.
    pub(crate) fn cache_latest(&self, run: RunId, key_agent: &str, latest: Latest) {
        self.shared.state.cache(run, key_agent, latest);
    }

    /// A key agent's newest version, from its newest completed version atom.
    fn latest_in_log(&self, run: RunId, key_agent: &str) -> Result<Latest> {
        let newest = {
            let index = self.shared.index.read();
            let run32 = u32::try_from(run.0).map_err(|_| unknown_run(run))?;
            let Some(agent) = index.agent_id(run32, key_agent) else { return Ok(Latest::ABSENT) };
            index.last_run_atom(run, |entry| entry.agent == agent && entry.state == EntryState::Completed)
        };
        let Some(atom) = newest else { return Ok(Latest::ABSENT) };
        let (version, kind, payload) = self.version_record(atom)?;
        let total = match kind {
            VersionKind::Counter => names::counter_total(&payload).unwrap_or_default(),
            VersionKind::Bytes | VersionKind::Item => 0,
        };
        let bytes = Latest::small_bytes(kind, &payload);
        Ok(Latest { version, atom: Some(atom), kind: Some(kind), total, bytes })
    }

    /// The value a key agent holds at `latest`; a list's items are read from every version.
    pub(crate) fn value_at(&self, run: RunId, key_agent: &str, latest: Latest) -> Result<Option<Versioned>> {
        let (Some(atom), Some(kind)) = (latest.atom, latest.kind) else { return Ok(None) };
        let value = match kind {
            VersionKind::Counter => StateValue::Counter(latest.total),
            VersionKind::Bytes => match &latest.bytes {
                Some(bytes) => StateValue::Bytes(bytes.to_vec()),
                None => StateValue::Bytes(self.version_record(atom)?.2),
            },
            VersionKind::Item => StateValue::List(self.list_items(run, key_agent, atom, latest.version)?),
        };
        Ok(Some(Versioned { version: latest.version, value }))
    }

    /// The items of a list key up to its version atom `upto`, oldest first: every version of a
    /// list is one item, so there are exactly `version` of them.
    fn list_items(&self, run: RunId, key_agent: &str, upto: AtomId, version: u64) -> Result<Vec<Vec<u8>>> {
        let ids: Vec<AtomId> = {
            let index = self.shared.index.read();
            let run32 = u32::try_from(run.0).map_err(|_| unknown_run(run))?;
            let Some(agent) = index.agent_id(run32, key_agent) else { return Ok(Vec::new()) };
            let (first, end) = index.atom_span(run);
            let end = end.min(usize::try_from(upto.get()).unwrap_or(usize::MAX));
            index
                .atoms
                .iter_from(first)
                .take_while(|(at, _)| *at < end)
                .filter(|(_, entry)| entry.run == run32 && entry.agent == agent && entry.state == EntryState::Completed)
                .map(|(at, _)| AtomId(at as u64 + 1))
                .collect()
        };
        let mut items = Vec::with_capacity(ids.len());
        for (expected, id) in (1u64..).zip(ids) {
            let (found, kind, payload) = self.version_record(id)?;
            if found != expected || kind != VersionKind::Item {
                let lsn = self.shared.index.read().atom(id).map_or(0, |entry| entry.ended_lsn);
                return Err(Error::InconsistentLog { lsn, reason: "a list's versions are not its items in order" });
            }
            items.push(payload);
        }
        if items.len() as u64 != version {
            return Err(Error::InconsistentLog { lsn: 0, reason: "a list holds fewer items than its version" });
        }
        Ok(items)
    }

    /// Version atom `id`'s version, kind and payload, read from its completion record alone.
    fn version_record(&self, id: AtomId) -> Result<(u64, VersionKind, Vec<u8>)> {
        let ended_lsn = {
            let index = self.shared.index.read();
            let entry = index.atom(id).filter(|entry| entry.state == EntryState::Completed);
            entry.ok_or(Error::UnknownAtom { atom: id.get() })?.ended_lsn
        };
        let inconsistent = |reason| Error::InconsistentLog { lsn: ended_lsn, reason };
        let (StoreRecord::AtomCompleted(done) | StoreRecord::AtomReclaimed(done)) = self.read_record(ended_lsn)? else {
            return Err(inconsistent("a state version's end is not a completion"));
        };
        let (version, kind, payload) =
            names::decode_version(&done.result).ok_or_else(|| inconsistent("a state atom holds no version"))?;
        Ok((version, kind, payload.to_vec()))
    }
}
