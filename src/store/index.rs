//! The store's in-memory index: runs, agents, atoms and guards, rebuilt from the log on open.
//! Everything large stays in the log; the index keeps LSNs to find it, within a fixed budget
//! of bytes per atom (`docs/ARCHITECTURE.md`, "Store index").

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;

use crate::store::atom_table::AtomTable;
use crate::store::types::{AtomId, AtomStatus, RunId, RunStatus};

/// Where an atom is, including the transient states that keep two threads from writing
/// conflicting transitions for the same atom.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EntryState {
    /// No atom has this id (its start was never written, or failed to be).
    Vacant,
    /// Its start record is being appended.
    Starting,
    /// Started; not finished.
    Running,
    /// A completion or failure record is being appended.
    Finishing,
    Completed,
    Failed,
    FailedRetryable,
}

impl EntryState {
    /// The public status, for entries whose start is durable.
    pub fn status(self) -> Option<AtomStatus> {
        match self {
            EntryState::Running | EntryState::Finishing => Some(AtomStatus::Running),
            EntryState::Completed => Some(AtomStatus::Completed),
            EntryState::Failed => Some(AtomStatus::Failed { retryable: false }),
            EntryState::FailedRetryable => Some(AtomStatus::Failed { retryable: true }),
            EntryState::Vacant | EntryState::Starting => None,
        }
    }

    /// Whether a completion or failure may be recorded now.
    pub fn can_finish(self) -> bool {
        matches!(self, EntryState::Running | EntryState::FailedRetryable)
    }

    /// Moves a live atom's entry (under the index write lock) from `self` to `to`, asserting
    /// that the atom protocol allows the edge: a reservation is written (`Starting → Running`)
    /// or given back (`Starting → Vacant`), or written with its completion in one batch
    /// (`Starting → Completed`); an end record is appended (`Running |
    /// FailedRetryable → Finishing`), then lands (`Finishing → Completed | Failed |
    /// FailedRetryable`) or is given back (`Finishing → Running | FailedRetryable`). The open's
    /// fold replays recorded transitions and does not pass here.
    pub fn transition(self, to: EntryState) -> EntryState {
        use EntryState::{Completed, Failed, FailedRetryable, Finishing, Running, Starting, Vacant};
        let allowed = matches!(
            (self, to),
            (Starting, Running | Vacant | Completed)
                | (Running | FailedRetryable, Finishing)
                | (Finishing, Completed | Failed | FailedRetryable | Running)
        );
        assert!(allowed, "atom state {self:?} cannot become {to:?}");
        to
    }
}

/// One atom: 32 bytes. The key, parents and output live in the log at `started_lsn` and
/// `ended_lsn`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AtomEntry {
    pub started_lsn: u64,
    /// LSN of the completion or failure record; 0 while running.
    pub ended_lsn: u64,
    pub run: u32,
    pub agent: u32,
    pub state: EntryState,
    /// Rolled back: readable history, but no longer the agent's current branch.
    pub abandoned: bool,
    /// Compaction reclaimed (or is reclaiming) its delta: no rebuild may need it any more.
    pub reclaimed: bool,
    /// Pinned: retention keeps what its context needs.
    pub pinned: bool,
    /// A compaction round released it: no rebuild can reach it any more (`purge/plan.rs`).
    pub released: bool,
}

impl AtomEntry {
    pub(crate) const VACANT: AtomEntry = AtomEntry {
        started_lsn: 0,
        ended_lsn: 0,
        run: 0,
        agent: 0,
        state: EntryState::Vacant,
        abandoned: false,
        reclaimed: false,
        pinned: false,
        released: false,
    };

    /// A new entry in `state`.
    pub fn new(started_lsn: u64, run: u32, agent: u32, state: EntryState) -> Self {
        Self {
            started_lsn,
            ended_lsn: 0,
            run,
            agent,
            state,
            abandoned: false,
            reclaimed: false,
            pinned: false,
            released: false,
        }
    }
}

/// One run.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RunEntry {
    pub name: String,
    pub status: RunStatus,
    /// The run's own snapshot policy, if it has one.
    pub snapshot_policy: Option<crate::store::SnapshotPolicy>,
    /// When it finished (0 while running).
    pub ended_at_unix_us: u64,
    /// Ids of its first and last atoms (0, 0 while it has none): the part of the atom table
    /// that walks over the run's atoms read, not the whole table. Widened as atoms are
    /// reserved or folded (a fold never empties an entry but a dropped run's, whose span it
    /// clears), set from the atoms an index snapshot loads ([`StoreIndex::note_atom_spans`]), so
    /// exact after an open; while the store runs, it may also cover a released reservation.
    pub atom_span: (u32, u32),
}

/// One guarded side effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GuardEntry {
    /// LSN of the start record; 0 while it is being appended.
    pub started_lsn: u64,
    /// LSN of the completion record; 0 if none.
    pub completed_lsn: u64,
}

/// The index.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct StoreIndex {
    /// Atom `n` is at `atoms[n - 1]`.
    pub atoms: AtomTable,
    /// Hash of (run, agent, key) → atom id; a hit is confirmed against the log.
    pub atom_keys: HashMap<u64, u32, PreHashed>,
    /// Hash of (run, agent, key) → the atoms that held it before the one in `atom_keys`, oldest
    /// first; only for keys more than one atom took (a step run again on another branch or
    /// after a rollback), so that finding a key's atom on a branch reads those atoms only.
    pub older_key_holders: HashMap<u64, Vec<u32>, PreHashed>,
    /// Run `n` is at `runs[n - 1]`.
    pub runs: Vec<RunEntry>,
    pub run_names: HashMap<String, u32, Fast>,
    /// Agent `n` is at `agents[n - 1]`: (run, name).
    pub agents: Vec<(u32, Box<str>)>,
    /// Run → agent name → agent id: looked up with a borrowed name, without allocating.
    pub agent_ids: HashMap<u32, HashMap<Box<str>, u32, Fast>, Fast>,
    /// Hash of the guard key → entry; a hit is confirmed against the log.
    pub guards: HashMap<u64, GuardEntry, PreHashed>,
    pub next_dictionary: u32,
    /// How `atom_keys` and `guards` hash their keys.
    pub identity: IdentityHasher,
}

/// How the index's maps hash their keys: foldhash, seeded per process (several times faster
/// than the standard SipHash on the short keys and 64-bit hashes the index holds; an index
/// rebuild hashes every atom's key twice).
pub(crate) type Fast = foldhash::fast::RandomState;

/// How `atom_keys` and `guards` hash their keys, which are already hashes ([`IdentityHasher`]'s,
/// seeded per store): not again. A map's iteration order is then its bucket order, which the
/// index snapshot writes its entries in, so that the next open inserts them into the same
/// buckets in memory order instead of at random (1,000,000 keys: the open's most expensive
/// step after checksums, measured at ~50 ns of cache misses per insert).
pub(crate) type PreHashed = std::hash::BuildHasherDefault<PassThrough>;

/// The [`std::hash::Hasher`] of [`PreHashed`]: a `u64` hashes to itself.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct PassThrough(u64);

impl std::hash::Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `u64` keys are hashed with it; other input is folded in, for completeness.
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}

/// The hasher of atom and guard identities: foldhash's higher-quality variant with a seed
/// chosen when the index is first built and kept with it (an index snapshot stores the seed,
/// so that the hashes it holds stay valid in the next process). These hashes stand for the
/// keys in the maps above; a hit is confirmed against the log.
#[derive(Clone, Copy, Debug)]
pub(crate) struct IdentityHasher {
    seed: u64,
    state: foldhash::quality::FixedState,
}

impl IdentityHasher {
    /// A hasher with a fresh random seed.
    pub fn random() -> Self {
        Self::with_seed(foldhash::quality::RandomState::default().hash_one(0x636f_6e74_696e_7575_u64))
    }

    /// The hasher of `seed`.
    pub fn with_seed(seed: u64) -> Self {
        Self { seed, state: foldhash::quality::FixedState::with_seed(seed) }
    }

    /// Its seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Hash of an atom's identity within the store.
    pub fn atom_key(&self, run: u32, agent: u32, key: &str) -> u64 {
        self.state.hash_one((run, agent, key))
    }

    /// Hash of a guard key.
    pub fn guard(&self, key: &str) -> u64 {
        self.state.hash_one(key)
    }

    /// Hashes of fixed inputs: equal in two processes only if both hash alike (an index snapshot
    /// written by a build whose foldhash hashes differently is not used).
    pub fn test_vector(&self) -> [u64; 2] {
        [self.atom_key(1, 2, "continuum"), self.guard("continuum/guard")]
    }
}

impl Default for IdentityHasher {
    fn default() -> Self {
        Self::random()
    }
}

impl PartialEq for IdentityHasher {
    fn eq(&self, other: &Self) -> bool {
        self.seed == other.seed
    }
}

impl StoreIndex {
    /// The entry of `atom`, if the id was ever assigned.
    pub fn atom(&self, atom: AtomId) -> Option<&AtomEntry> {
        let at = usize::try_from(atom.0.checked_sub(1)?).ok()?;
        self.atoms.get(at).filter(|entry| entry.state != EntryState::Vacant)
    }

    /// The entry of `atom`, mutably.
    pub fn atom_mut(&mut self, atom: AtomId) -> Option<&mut AtomEntry> {
        let at = usize::try_from(atom.0.checked_sub(1)?).ok()?;
        self.atoms.get_mut(at).filter(|entry| entry.state != EntryState::Vacant)
    }

    /// Makes room for atom `atom` and returns its entry (rebuild and new atoms).
    pub fn atom_slot(&mut self, atom: AtomId) -> &mut AtomEntry {
        let at = usize::try_from(atom.0 - 1).expect("atom ids fit in memory");
        self.atoms.slot(at)
    }

    /// The run entry.
    pub fn run(&self, run: RunId) -> Option<&RunEntry> {
        self.runs.get(usize::try_from(run.0.checked_sub(1)?).ok()?)
    }

    /// The run entry, mutably.
    pub fn run_mut(&mut self, run: RunId) -> Option<&mut RunEntry> {
        self.runs.get_mut(usize::try_from(run.0.checked_sub(1)?).ok()?)
    }

    /// The agent id for (run, name), creating it.
    pub fn intern_agent(&mut self, run: u32, name: &str) -> u32 {
        if let Some(id) = self.agent_id(run, name) {
            return id;
        }
        self.agents.push((run, Box::from(name)));
        // Agent ids are u32 like atom ids' runs; four billion agents would exhaust memory first.
        let id = u32::try_from(self.agents.len()).unwrap_or(u32::MAX);
        self.agent_ids.entry(run).or_default().insert(Box::from(name), id);
        id
    }

    /// The agent id for (run, name), if it exists.
    pub fn agent_id(&self, run: u32, name: &str) -> Option<u32> {
        self.agent_ids.get(&run)?.get(name).copied()
    }

    /// The name of agent `agent`.
    pub fn agent_name(&self, agent: u32) -> &str {
        self.agents.get(agent as usize - 1).map_or("", |(_, name)| name)
    }

    /// Ids of every atom of `run` whose start is durable, in id order: the entries of its atom
    /// span only.
    pub fn run_atoms(&self, run: RunId) -> impl Iterator<Item = (AtomId, &AtomEntry)> {
        let (from, to) = self.atom_span(run);
        self.atoms
            .iter_from(from)
            .take_while(move |(at, _)| *at < to)
            .filter(move |(_, entry)| u64::from(entry.run) == run.0 && entry.state.status().is_some())
            .map(|(at, entry)| (AtomId(at as u64 + 1), entry))
    }

    /// The newest atom of `run` (highest id, durable start) whose entry satisfies `wanted`:
    /// the run's atom span walked from its end, so the cost is the entries after the match,
    /// not the run's size.
    pub fn last_run_atom(&self, run: RunId, mut wanted: impl FnMut(&AtomEntry) -> bool) -> Option<AtomId> {
        let (from, to) = self.atom_span(run);
        (from..to).rev().find_map(|at| {
            let entry = self.atoms.get(at)?;
            let found = u64::from(entry.run) == run.0 && entry.state.status().is_some() && wanted(entry);
            found.then_some(AtomId(at as u64 + 1))
        })
    }

    /// The atom-table entries `from..to` the atoms of `run` lie in (empty for a run without
    /// atoms, or an unknown one).
    pub fn atom_span(&self, run: RunId) -> (usize, usize) {
        let (first, last) = self.run(run).map_or((0, 0), |entry| entry.atom_span);
        (first.saturating_sub(1) as usize, last as usize)
    }

    /// Widens the atom span of `run` to cover atom `id`.
    pub fn note_run_atom(&mut self, run: u32, id: u32) {
        if let Some(entry) = self.run_mut(RunId(u64::from(run))) {
            let (first, last) = &mut entry.atom_span;
            if *first == 0 || id < *first {
                *first = id;
            }
            *last = (*last).max(id);
        }
    }

    /// Sets every run's atom span from the atom table: one pass, when an open has loaded an
    /// index snapshot (which does not store them).
    pub fn note_atom_spans(&mut self) {
        let mut spans = vec![(0u32, 0u32); self.runs.len()];
        for (at, entry) in self.atoms.iter().filter(|(_, entry)| entry.state != EntryState::Vacant) {
            let (Some(span), Ok(id)) = (spans.get_mut((entry.run as usize).wrapping_sub(1)), u32::try_from(at + 1))
            else {
                continue;
            };
            // Ids come in ascending order: the first seen is the run's first.
            if span.0 == 0 {
                span.0 = id;
            }
            span.1 = id;
        }
        for (run, span) in self.runs.iter_mut().zip(spans) {
            run.atom_span = span;
        }
    }

    /// The released atoms as ascending (first id, count) ranges: what [`StoreIndex::release`]
    /// takes back.
    pub fn released_ranges(&self) -> Vec<(u64, u64)> {
        id_ranges(self.atoms.iter().filter(|(_, entry)| entry.released).map(|(at, _)| at as u64 + 1))
    }

    /// Marks the atoms of `first[i] .. first[i] + count[i]` released. The ranges must ascend
    /// without overlapping (as the writer writes them) and are clipped to the atoms the index
    /// holds, so a damaged record costs at most one pass over the index.
    ///
    /// # Errors
    /// `None` if the two lists differ in length, or the ranges overlap or descend.
    pub fn release(&mut self, first: &[u64], count: &[u64]) -> Option<()> {
        if first.len() != count.len() {
            return None;
        }
        let len = self.atoms.len() as u64;
        let mut done_to = 0u64;
        for (&from, &count) in first.iter().zip(count) {
            if from < done_to {
                return None;
            }
            done_to = from.saturating_add(count);
            let to = done_to.min(len.saturating_add(1));
            for id in from.max(1)..to {
                if let Some(entry) = self.atom_mut(AtomId(id)) {
                    entry.released = true;
                }
            }
        }
        Some(())
    }

    /// Marks every atom of (`run`, `agent`) after `after` abandoned; returns them. Walks the
    /// run's atom span after `after` only.
    pub fn abandon_after(&mut self, run: u32, agent: u32, after: u64) -> Vec<AtomId> {
        let (first, last) = self.atom_span(RunId(u64::from(run)));
        let from = usize::try_from(after).unwrap_or(usize::MAX).max(first);
        let mut abandoned = Vec::new();
        for (at, entry) in self.atoms.iter_mut_from(from).take_while(|(at, _)| *at < last) {
            if entry.run == run && entry.agent == agent && entry.state != EntryState::Vacant && !entry.abandoned {
                entry.abandoned = true;
                abandoned.push(AtomId(at as u64 + 1));
            }
        }
        abandoned
    }

    /// Forgets every atom of a dropped run, frees its name, and keeps atom ids below
    /// `next_atom` from being reused.
    pub fn drop_run(&mut self, run: RunId, next_atom: u64) {
        let Some(entry) = self.run_mut(run) else { return };
        entry.status = RunStatus::Dropped;
        let name = entry.name.clone();
        if self.run_names.get(&name).is_some_and(|id| u64::from(*id) == run.0) {
            self.run_names.remove(&name);
        }
        // Only the run's span: a drop round must not walk every atom of the store under the
        // index lock once per dropped run.
        let (first, last) = self.atom_span(run);
        for (_, atom) in self
            .atoms
            .iter_mut_from(first)
            .take_while(|(at, _)| *at < last)
            .filter(|(_, atom)| u64::from(atom.run) == run.0)
        {
            *atom = AtomEntry::VACANT;
        }
        self.atoms.release_vacant_pages(first, last);
        if let Some(entry) = self.run_mut(run) {
            entry.atom_span = (0, 0);
        }
        if let Some(floor) = next_atom.checked_sub(1).and_then(|n| usize::try_from(n).ok()) {
            self.atoms.extend_to(floor);
        }
    }

    /// Maps the key `hash` to its newest atom `id`, keeping the atom it replaces in
    /// `older_key_holders`; returns that atom.
    pub fn take_key(&mut self, hash: u64, id: u32) -> Option<u32> {
        let previous = self.atom_keys.insert(hash, id);
        if let Some(previous) = previous.filter(|previous| *previous != id) {
            self.older_key_holders.entry(hash).or_default().push(previous);
        }
        previous
    }

    /// Gives the key `hash` back from `id`, whose start was not written, to `previous`, the
    /// atom [`StoreIndex::take_key`] returned (unless another atom took the key since).
    pub fn give_key_back(&mut self, hash: u64, id: u32, previous: Option<u32>) {
        if self.atom_keys.get(&hash) != Some(&id) {
            return;
        }
        let Some(previous) = previous else {
            self.atom_keys.remove(&hash);
            return;
        };
        self.atom_keys.insert(hash, previous);
        if let Some(older) = self.older_key_holders.get_mut(&hash) {
            assert_eq!(older.pop(), Some(previous), "the holder given back is the last one kept");
            if older.is_empty() {
                self.older_key_holders.remove(&hash);
            }
        }
    }

    /// Forgets the atom keys whose atoms are vacant (those of dropped runs): they could only
    /// ever lead to a vacant entry, which every lookup treats as no atom. One pass over the
    /// keys; called after a round drops runs and after an open that folded a drop.
    pub fn forget_vacant_keys(&mut self) {
        let atoms = &self.atoms;
        let live = |id: u32| {
            id.checked_sub(1).and_then(|at| atoms.get(at as usize)).is_some_and(|e| e.state != EntryState::Vacant)
        };
        self.atom_keys.retain(|_, id| live(*id));
        if self.atom_keys.len() < self.atom_keys.capacity() / 2 {
            self.atom_keys.shrink_to_fit();
        }
        // A key's atoms are all of one run: they go together.
        self.older_key_holders.retain(|_, older| {
            older.retain(|id| live(*id));
            !older.is_empty()
        });
    }

    /// Forgets the guards whose start (or, for one resolved without a start record, whose
    /// completion) is at one of `lsns`: those of dropped runs.
    pub fn forget_guards(&mut self, lsns: &HashSet<u64>) {
        self.guards.retain(|_, guard| !lsns.contains(&guard.started_lsn));
        if self.guards.len() < self.guards.capacity() / 2 {
            self.guards.shrink_to_fit();
        }
    }

    /// Approximate heap bytes held by the index (capacity-based).
    pub fn heap_bytes(&self) -> usize {
        let atoms = self.atoms.heap_bytes();
        let keys = self.atom_keys.capacity() * (std::mem::size_of::<(u64, u32)>() + 1);
        let older_keys: usize = self.older_key_holders.values().map(|older| older.capacity() * 4 + 40).sum();
        let guards = self.guards.capacity() * (std::mem::size_of::<(u64, GuardEntry)>() + 1);
        let runs = self.runs.capacity() * std::mem::size_of::<RunEntry>()
            + self.runs.iter().map(|r| r.name.len()).sum::<usize>();
        let agents = self.agents.iter().map(|(_, name)| 2 * (name.len() + 24)).sum::<usize>();
        atoms + keys + older_keys + guards + runs + agents
    }
}

const _: () = assert!(std::mem::size_of::<AtomEntry>() == 32);

/// Ascending ids as (first id, count) ranges of consecutive ids.
pub(crate) fn id_ranges(ids: impl IntoIterator<Item = u64>) -> Vec<(u64, u64)> {
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    for id in ids {
        match ranges.last_mut() {
            Some((first, count)) if *first + *count == id => *count += 1,
            _ => ranges.push((id, 1)),
        }
    }
    ranges
}
