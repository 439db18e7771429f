//! Reading a run's or an agent's atoms with their outputs in one pass over the log:
//! [`Store::agent_history`] and [`Store::run_history`].
//!
//! The atoms are chosen from the index (one read lock, 40 bytes per atom kept), then read in
//! chunks of [`HISTORY_CHUNK_ATOMS`]: the chunk's start and end records are sorted by LSN and
//! visited in log order ([`Log::visit_lsns`](crate::Log::visit_lsns)), so each frame holding
//! them is read and verified once, and the frames between are stepped over on their headers.
//! Reading atom by atom instead ([`Store::atom`]) looks each record up and reads its frame
//! again for every record it holds.

use std::collections::{HashMap, VecDeque};

use crate::codec::StoreRecord;
use crate::error::{Error, Result};
use crate::store::index::AtomEntry;
use crate::store::reads::assemble_atom;
use crate::store::types::{Atom, AtomId, AtomStatus, RunId};
use crate::store::{Store, unknown_run};

/// Atoms read per pass over the log: what a history holds decoded at once.
pub(crate) const HISTORY_CHUNK_ATOMS: usize = 1024;

/// Atoms of a run, or of one agent of a run, with their outputs: an iterator of
/// `Result<Atom>`, oldest first unless [`History::newest_first`]. Made by
/// [`Store::agent_history`] and [`Store::run_history`]; the atoms are those the index held
/// when the first one was read.
///
/// ```
/// # fn main() -> continuum::Result<()> {
/// use continuum::{AtomOutput, RunSpec, Store};
/// let dir = tempfile::tempdir().unwrap();
/// let store = Store::open(dir.path())?;
/// let run = store.create_run(RunSpec::new("triage"))?;
/// let mut parent = Vec::new();
/// for step in 0..5u8 {
///     let output = AtomOutput { result: vec![step], ..AtomOutput::default() };
///     parent = vec![store.record_atom(run, "planner", &format!("step-{step}"), &parent, "", &output)?];
/// }
/// let last_two: Vec<u8> = store
///     .agent_history(run, "planner")
///     .newest_first()
///     .limit(2)
///     .map(|atom| atom.map(|atom| atom.output.map_or(0, |output| output.result[0])))
///     .collect::<continuum::Result<_>>()?;
/// assert_eq!(last_two, [4, 3]);
/// # Ok(())
/// # }
/// ```
#[must_use = "a history reads nothing until it is iterated"]
pub struct History<'a> {
    store: &'a Store,
    run: RunId,
    /// `None`: every agent of the run.
    agent: Option<String>,
    newest_first: bool,
    limit: usize,
    /// The chosen atoms, in the order they are yielded; `None` until the first read.
    chosen: Option<std::vec::IntoIter<(AtomId, AtomEntry)>>,
    /// Atoms read and not yet yielded.
    ready: VecDeque<Result<Atom>>,
}

impl Store {
    /// The atoms of `agent` in `run` with their outputs (and everything [`Store::atom`]
    /// returns), read in one pass over the log; see [`History`]. Abandoned atoms are included
    /// (their `abandoned` is set), as in [`Store::agent_atoms`].
    pub fn agent_history(&self, run: RunId, agent: &str) -> History<'_> {
        History::new(self, run, Some(agent.to_owned()))
    }

    /// The atoms of every agent of `run`, in id order, with their outputs; see
    /// [`Store::agent_history`].
    pub fn run_history(&self, run: RunId) -> History<'_> {
        History::new(self, run, None)
    }
}

impl<'a> History<'a> {
    fn new(store: &'a Store, run: RunId, agent: Option<String>) -> Self {
        History { store, run, agent, newest_first: false, limit: usize::MAX, chosen: None, ready: VecDeque::new() }
    }

    /// Yields the newest atom first (highest id).
    pub fn newest_first(mut self) -> Self {
        self.newest_first = true;
        self
    }

    /// Yields at most `atoms` atoms: with [`History::newest_first`], the newest ones.
    pub fn limit(mut self, atoms: usize) -> Self {
        self.limit = atoms;
        self
    }

    /// The atoms to read, in yield order, from the index.
    fn choose(&self) -> Result<Vec<(AtomId, AtomEntry)>> {
        let index = self.store.shared.index.read();
        index.run(self.run).ok_or_else(|| unknown_run(self.run))?;
        let agent = match &self.agent {
            Some(name) => match u32::try_from(self.run.get()).ok().and_then(|run| index.agent_id(run, name)) {
                Some(agent) => Some(agent),
                None => return Ok(Vec::new()),
            },
            None => None,
        };
        let mut chosen: Vec<(AtomId, AtomEntry)> = index
            .run_atoms(self.run)
            .filter(|(_, entry)| agent.is_none_or(|agent| entry.agent == agent))
            .map(|(atom, entry)| (atom, *entry))
            .collect();
        if self.newest_first {
            chosen.reverse();
        }
        chosen.truncate(self.limit);
        Ok(chosen)
    }

    /// Reads the next chunk of chosen atoms into `ready`.
    fn read_chunk(&mut self) {
        let Some(chosen) = self.chosen.as_mut() else { return };
        let chunk: Vec<(AtomId, AtomEntry)> = chosen.by_ref().take(HISTORY_CHUNK_ATOMS).collect();
        if chunk.is_empty() {
            return;
        }
        match read_atoms(self.store, &chunk) {
            Ok(atoms) => self.ready.extend(atoms.into_iter().map(Ok)),
            Err(error) => {
                // An error ends the history: nothing after it is read.
                self.ready.push_back(Err(error));
                self.chosen = Some(Vec::new().into_iter());
            }
        }
    }
}

impl Iterator for History<'_> {
    type Item = Result<Atom>;

    fn next(&mut self) -> Option<Result<Atom>> {
        if self.chosen.is_none() {
            match self.choose() {
                Ok(chosen) => self.chosen = Some(chosen.into_iter()),
                Err(error) => {
                    self.chosen = Some(Vec::new().into_iter());
                    return Some(Err(error));
                }
            }
        }
        if self.ready.is_empty() {
            self.read_chunk();
        }
        self.ready.pop_front()
    }
}

/// Reads `chunk`'s atoms (in its order) with one visit of their records in LSN order. An atom
/// whose start record is gone (its run dropped since it was chosen) is left out.
fn read_atoms(store: &Store, chunk: &[(AtomId, AtomEntry)]) -> Result<Vec<Atom>> {
    let mut lsns: Vec<u64> = Vec::with_capacity(chunk.len() * 2);
    for (_, entry) in chunk {
        lsns.push(entry.started_lsn);
        if ends_recorded(entry) {
            lsns.push(entry.ended_lsn);
        }
    }
    lsns.sort_unstable();
    lsns.dedup();
    let codec = &store.shared.codec;
    let mut records: HashMap<u64, StoreRecord> = HashMap::with_capacity(lsns.len());
    store.shared.log.visit_lsns(&lsns, |lsn, record| {
        let decoded = codec.decode(record.bytes()).map_err(|source| Error::Codec { lsn, source })?;
        records.insert(lsn, decoded);
        Ok(true)
    })?;
    let mut atoms = Vec::with_capacity(chunk.len());
    for (atom, entry) in chunk {
        let Some(started) = records.remove(&entry.started_lsn) else {
            if store.shared.index.read().atom(*atom).is_some() {
                return Err(Error::InconsistentLog { lsn: entry.started_lsn, reason: "indexed record is missing" });
            }
            continue;
        };
        let ended = if ends_recorded(entry) {
            let ended = records.remove(&entry.ended_lsn);
            Some(ended.ok_or(Error::InconsistentLog { lsn: entry.ended_lsn, reason: "indexed record is missing" })?)
        } else {
            None
        };
        atoms.push(assemble_atom(*atom, entry, started, ended)?);
    }
    Ok(atoms)
}

/// Whether the atom of `entry` has an end record to read (what [`Store::atom`] reads).
fn ends_recorded(entry: &AtomEntry) -> bool {
    entry.ended_lsn != 0 && entry.state.status() != Some(AtomStatus::Running)
}

#[cfg(test)]
mod tests {
    use crate::synthetic::Transcript;
    use crate::{AtomFailure, AtomOutput, RunSpec, Store};

    /// Every atom the history yields is the atom `Store::atom` reads, in id order or newest
    /// first, limited, for one agent or the whole run, with running, failed, abandoned and
    /// compressed atoms among them, across several segments.
    #[test]
    fn a_history_yields_what_atom_reads_in_order_and_newest_first() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::builder(dir.path()).segment_bytes(256 * 1024).background(false).open().expect("open");
        let run = store.create_run(RunSpec::new("r")).expect("run");
        let mut parents = Vec::new();
        for step in 0..3_000u64 {
            let agent = if step % 3 == 0 { "b" } else { "a" };
            let output = AtomOutput {
                delta: Transcript::new(step).next_delta(if step % 500 == 0 { 4_000 } else { 200 }),
                result: step.to_le_bytes().to_vec(),
            };
            let key = format!("s{step}");
            let atom = match step % 7 {
                0 => store.begin_atom(run, agent, &key, &parents, "").expect("begin"),
                1 => {
                    let atom = store.begin_atom(run, agent, &key, &parents, "").expect("begin");
                    let failure = AtomFailure { message: format!("failure {step}"), retryable: step % 2 == 0 };
                    store.fail_atom(atom, &failure).expect("fail");
                    atom
                }
                _ => store.record_atom(run, agent, &key, &parents, "", &output).expect("record"),
            };
            if step % 7 != 0 {
                parents = vec![atom];
            }
        }
        let last_a = store.last_agent_atom(run, "a").expect("a head");
        let back_to = store.agent_atoms(run, "a")[1_500];
        store.rollback(run, "a", back_to, "test").expect("rollback");
        assert!(store.log().segments().len() > 3, "several segments");
        let expect = |ids: Vec<crate::AtomId>| -> Vec<crate::Atom> {
            ids.into_iter().map(|id| store.atom(id).expect("atom")).collect()
        };
        let read = |history: super::History<'_>| -> Vec<crate::Atom> {
            history.collect::<crate::Result<_>>().expect("history")
        };
        let a = store.agent_atoms(run, "a");
        assert_eq!(read(store.agent_history(run, "a")), expect(a.clone()));
        let newest: Vec<_> = a.iter().rev().take(10).copied().collect();
        assert_eq!(read(store.agent_history(run, "a").newest_first().limit(10)), expect(newest));
        assert_eq!(read(store.agent_history(run, "a").limit(3)), expect(a[..3].to_vec()));
        let all = store.run_atoms(run);
        assert_eq!(read(store.run_history(run).newest_first()), expect(all.iter().rev().copied().collect()));
        assert!(read(store.agent_history(run, "a")).iter().any(|atom| atom.id == last_a && atom.abandoned));
        assert!(read(store.agent_history(run, "nobody")).is_empty());
        let unknown = store.run_history(crate::RunId::from_raw(99)).next();
        assert!(matches!(unknown, Some(Err(crate::Error::UnknownRun { .. }))));
    }
}
