//! Keys on branches: the atom a (run, agent, key) names on the branch of given parents, found
//! from the index and confirmed against its start record.

use crate::codec::StoreRecord;
use crate::codec::proto;
use crate::error::{Error, Result};
use crate::store::Store;
use crate::store::index::{AtomEntry, EntryState, StoreIndex};
use crate::store::types::{AtomId, RunId};

impl Store {
    /// The atom of (run, agent, key), confirmed against its start record: with `parents`,
    /// the one on their branch ([`Store::atom_on_branch`]); without, the newest that no rollback
    /// abandoned.
    pub(crate) fn find_atom(
        &self,
        index: &StoreIndex,
        run: u32,
        (agent, key): (&str, &str),
        parents: Option<&[AtomId]>,
    ) -> Result<Option<AtomId>> {
        let Some(agent_id) = index.agent_id(run, agent) else { return Ok(None) };
        self.atom_on_branch(index, (run, agent_id), agent, key, parents)
    }

    /// The atom `agent` of `run` calls `key` on the branch of `parents`: the newest that no
    /// rollback abandoned and that either has the same set of parents or is an ancestor of one
    /// of them (a step the agent runs again after moving past it); `None` for `parents`: the
    /// newest not abandoned, on any branch. A key names a step at one place of the agent's graph, so a fork
    /// re-running a step gets an atom of its own, and each branch finds its own
    /// (`docs/ARCHITECTURE.md`, "Keys and branches").
    ///
    /// The index maps a key's hash to its newest atom, and keeps the atoms that held it before
    /// (`older_key_holders`). Only when the newest is abandoned or on another branch are the
    /// older ones read, newest first, each from its start record: the lookup reads the atoms
    /// that took the key, never the branch's whole history.
    ///
    /// # Errors
    /// [`Error::KeyCollision`] when the hash's newest atom has another key; read errors.
    pub(crate) fn atom_on_branch(
        &self,
        index: &StoreIndex,
        (run, agent_id): (u32, u32),
        agent: &str,
        key: &str,
        parents: Option<&[AtomId]>,
    ) -> Result<Option<AtomId>> {
        let hash = index.identity.atom_key(run, agent_id, key);
        let Some(&id) = index.atom_keys.get(&hash) else { return Ok(None) };
        let holder = AtomId(u64::from(id));
        if let Some(entry) = index.atom(holder)
            && !entry.abandoned
        {
            match self.key_match(entry, agent, key, parents)? {
                KeyMatch::Same => return Ok(Some(holder)),
                KeyMatch::OtherKey => return Err(Error::KeyCollision { key: key.to_owned() }),
                KeyMatch::OtherBranch if self.is_ancestor(index, holder, parents.unwrap_or_default())? => {
                    return Ok(Some(holder));
                }
                KeyMatch::OtherBranch => {}
            }
        }
        let older = index.older_key_holders.get(&hash).map_or(&[][..], Vec::as_slice);
        for &id in older.iter().rev() {
            let atom = AtomId(u64::from(id));
            let Some(entry) = index.atom(atom) else { continue };
            if entry.abandoned || entry.agent != agent_id || entry.state.status().is_none() {
                continue;
            }
            match self.key_match(entry, agent, key, parents)? {
                KeyMatch::Same => return Ok(Some(atom)),
                KeyMatch::OtherBranch if self.is_ancestor(index, atom, parents.unwrap_or_default())? => {
                    return Ok(Some(atom));
                }
                KeyMatch::OtherBranch | KeyMatch::OtherKey => {}
            }
        }
        Ok(None)
    }

    /// Whether `ancestor` is an ancestor of one of `of`: a walk up from them through the
    /// atoms newer than `ancestor` only.
    fn is_ancestor(&self, index: &StoreIndex, ancestor: AtomId, of: &[AtomId]) -> Result<bool> {
        let mut found = false;
        self.walk_ancestors(index, of, ancestor.0, |atom, _| {
            found |= atom == ancestor;
            found
        })?;
        Ok(found)
    }

    /// Calls `visit` with each atom of `from` and each of their ancestors whose id is at least
    /// `floor`, once, with its start record, until it returns `true`.
    fn walk_ancestors(
        &self,
        index: &StoreIndex,
        from: &[AtomId],
        floor: u64,
        mut visit: impl FnMut(AtomId, &proto::AtomStarted) -> bool,
    ) -> Result<()> {
        let mut seen = std::collections::HashSet::new();
        let mut stack: Vec<AtomId> = from.iter().copied().filter(|atom| atom.0 >= floor).collect();
        while let Some(atom) = stack.pop() {
            let Some(entry) = index.atom(atom).filter(|entry| entry.state.status().is_some()) else { continue };
            if !seen.insert(atom) {
                continue;
            }
            let StoreRecord::AtomStarted(started) = self.read_record(entry.started_lsn)? else {
                return Err(Error::InconsistentLog {
                    lsn: entry.started_lsn,
                    reason: "an atom's start is not a start record",
                });
            };
            if visit(atom, &started) {
                return Ok(());
            }
            // Parents are older than their children: ids below `floor` lead only further down.
            stack.extend(
                started.parents.iter().filter(|parent| **parent >= floor && **parent < atom.0).map(|p| AtomId(*p)),
            );
        }
        Ok(())
    }

    /// How the atom of `entry` stands to (`agent`, `key`, `parents`), read from its start
    /// record. An atom whose start is still being written is taken as the same (as a 64-bit
    /// hash of another key begun this very moment is not worth waiting for).
    fn key_match(&self, entry: &AtomEntry, agent: &str, key: &str, parents: Option<&[AtomId]>) -> Result<KeyMatch> {
        if entry.state == EntryState::Starting {
            return Ok(KeyMatch::Same);
        }
        let StoreRecord::AtomStarted(started) = self.read_record(entry.started_lsn)? else {
            return Err(Error::InconsistentLog {
                lsn: entry.started_lsn,
                reason: "an atom's start is not a start record",
            });
        };
        if started.key != key || started.agent != agent {
            return Ok(KeyMatch::OtherKey);
        }
        match parents {
            Some(parents) if !same_parents(&started.parents, parents) => Ok(KeyMatch::OtherBranch),
            _ => Ok(KeyMatch::Same),
        }
    }

    /// The atom `agent` of `run` calls `key` on the branch of `parents`, if it was begun: the
    /// atom [`Store::execute`] with these parents would answer with (the newest not abandoned
    /// whose parents are the same set, or that is an ancestor of one of them; see
    /// `docs/ARCHITECTURE.md`, "Keys and branches").
    ///
    /// # Errors
    /// Read errors of the log.
    pub fn atom_by_key_on(&self, run: RunId, agent: &str, key: &str, parents: &[AtomId]) -> Result<Option<AtomId>> {
        let index = self.shared.index.read();
        let Ok(run32) = u32::try_from(run.0) else { return Ok(None) };
        self.find_atom(&index, run32, (agent, key), Some(parents))
    }

    /// The newest atom `agent` of `run` calls `key` that no rollback abandoned, on any branch
    /// (after a fork two atoms may hold the key; [`Store::atom_by_key_on`] tells them apart).
    ///
    /// # Errors
    /// Read errors of the log.
    pub fn atom_by_key(&self, run: RunId, agent: &str, key: &str) -> Result<Option<AtomId>> {
        let index = self.shared.index.read();
        let Ok(run32) = u32::try_from(run.0) else { return Ok(None) };
        self.find_atom(&index, run32, (agent, key), None)
    }
}

/// How an atom stands to a lookup by key ([`Store::atom_on_branch`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KeyMatch {
    /// The same key, agent and branch.
    Same,
    /// The same key and agent, other parents.
    OtherBranch,
    /// Another key or agent with the same hash.
    OtherKey,
}

/// Whether `recorded` (a start record's parents) and `wanted` are the same set of atoms.
fn same_parents(recorded: &[u64], wanted: &[AtomId]) -> bool {
    let mut recorded = recorded.to_vec();
    let mut wanted: Vec<u64> = wanted.iter().map(|atom| atom.0).collect();
    recorded.sort_unstable();
    recorded.dedup();
    wanted.sort_unstable();
    wanted.dedup();
    recorded == wanted
}
