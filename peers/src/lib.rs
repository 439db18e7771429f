//! continuum side by side with the storage engines a user would pick instead for agent
//! checkpoints: SQLite (what LangGraph's `SqliteSaver` uses), tikv/raft-engine and okaywal.
//!
//! Every engine sits behind one trait, [`AtomSink`], so that the benchmark
//! (`benches/peers.rs`) runs identical workloads against each: append one atom (durably or
//! buffered), rebuild one agent after reopening, and report the bytes it keeps on disk. An
//! atom is one completed unit of agent work: run, agent, atom id, status and a ~500-byte
//! protobuf delta ([`continuum::Delta`]) from [`Deltas`], a deterministic generator of
//! realistic agent traffic.
//!
//! This crate is not part of the default build: the root package's tests never compile it.
//! Run it with `cargo bench -p continuum-peers --bench peers` (see `docs/BENCHMARKS.md`).

mod continuum_sinks;
mod disk;
pub mod group_floor;
mod okaywal_sink;
mod raft_engine_sink;
pub mod sqlite_queue;
mod sqlite_sink;
mod workload;

use std::path::Path;

pub use disk::{DiskUsage, FdatasyncProbe, Machine, disk_usage};
pub use workload::{AtomRef, Deltas, Encoded, HEADER_BYTES};

/// How the continuum store sink writes an atom: `record_atom_encoded` (the default) or
/// `begin_atom + complete_atom_encoded` (`CONTINUUM_PEERS_STORE=begin_complete`).
pub fn store_protocol() -> &'static str {
    if continuum_sinks::begin_complete() { "begin_atom + complete_atom_encoded" } else { "record_atom_encoded" }
}

/// What can go wrong in a sink: each engine's own error, kept as it is.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file-system call failed (okaywal reports everything this way).
    #[error("I/O failed: {0}")]
    Io(#[from] std::io::Error),
    /// SQLite refused a statement.
    #[error("SQLite failed: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// raft-engine failed.
    #[error("raft-engine failed: {0}")]
    RaftEngine(#[from] raft_engine::Error),
    /// continuum failed.
    #[error("continuum failed: {0}")]
    Continuum(#[from] continuum::Error),
    /// A stored delta did not decode.
    #[error("a stored delta did not decode: {0}")]
    Decode(#[from] prost::DecodeError),
    /// A stored record is not what this crate wrote.
    #[error("{engine}: malformed record: {reason}")]
    Malformed {
        /// The engine that returned it.
        engine: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The engine has no such mode (okaywal and the continuum store always sync).
    #[error("{engine} has no {mode:?} mode")]
    Unsupported {
        /// The engine.
        engine: &'static str,
        /// The mode asked for.
        mode: Mode,
    },
}

/// This crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How a sink acknowledges an append.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Acknowledged once `fdatasync` (or the engine's equivalent) has returned.
    Durable,
    /// Acknowledged once the operating system has the bytes; synced later in the background
    /// or by the next sync.
    Buffered,
    /// Setting up a data set: appends and batches need not be durable until
    /// [`AtomSink::sync`]; each engine loads as fast as its API allows while keeping the
    /// on-disk layout of one atom per write.
    Load,
}

/// The engines under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Engine {
    /// SQLite (bundled by rusqlite): WAL mode, one row per atom, one transaction per write.
    Sqlite,
    /// tikv/raft-engine 0.4.2: one Raft group per agent, one entry per atom.
    RaftEngine,
    /// okaywal 0.3.1: one committed entry per atom.
    Okaywal,
    /// continuum's raw log: one record per atom.
    ContinuumLog,
    /// continuum's atom store: `record_atom_encoded` per atom (`begin_atom` + `complete_atom_encoded` with
    /// `CONTINUUM_PEERS_STORE=begin_complete`).
    ContinuumStore,
}

impl Engine {
    /// Every engine, peers first.
    pub const ALL: [Engine; 5] =
        [Engine::Sqlite, Engine::RaftEngine, Engine::Okaywal, Engine::ContinuumLog, Engine::ContinuumStore];

    /// The engine's name as the tables print it.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Sqlite => "sqlite",
            Engine::RaftEngine => "raft-engine",
            Engine::Okaywal => "okaywal",
            Engine::ContinuumLog => "continuum log",
            Engine::ContinuumStore => "continuum store",
        }
    }

    /// The engine's name as a criterion benchmark id (no spaces).
    pub fn id(self) -> &'static str {
        match self {
            Engine::Sqlite => "sqlite",
            Engine::RaftEngine => "raft_engine",
            Engine::Okaywal => "okaywal",
            Engine::ContinuumLog => "continuum_log",
            Engine::ContinuumStore => "continuum_store",
        }
    }

    /// Whether this is continuum (rather than a peer).
    pub fn is_continuum(self) -> bool {
        matches!(self, Engine::ContinuumLog | Engine::ContinuumStore)
    }

    /// Whether the engine can acknowledge appends in `mode`.
    pub fn supports(self, mode: Mode) -> bool {
        !(mode == Mode::Buffered && self == Engine::Okaywal)
    }

    /// Opens (creating if needed) the engine's data in `dir`, running its recovery.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the engine has no such `mode`, and the engine's own errors.
    pub fn open(self, dir: &Path, mode: Mode) -> Result<Box<dyn AtomSink>> {
        if !self.supports(mode) {
            return Err(Error::Unsupported { engine: self.name(), mode });
        }
        std::fs::create_dir_all(dir)?;
        Ok(match self {
            Engine::Sqlite => Box::new(sqlite_sink::SqliteSink::open(dir, mode)?),
            Engine::RaftEngine => Box::new(raft_engine_sink::RaftEngineSink::open(dir, mode)?),
            Engine::Okaywal => Box::new(okaywal_sink::OkaywalSink::open(dir, mode)?),
            Engine::ContinuumLog => Box::new(continuum_sinks::LogSink::open(dir, mode)?),
            Engine::ContinuumStore => Box::new(continuum_sinks::StoreSink::open(dir, mode)?),
        })
    }
}

/// The continuum store of workload 6's at-rest sample: every delta kept (no policy
/// snapshots, so nothing is reclaimable), sealed segments rewritten by a compaction round with
/// cold compression (the store's default), as a long-running store holds its history.
pub struct AtRestStore(continuum_sinks::StoreSink);

impl AtRestStore {
    /// Opens (creating) the sample's store in `dir`.
    ///
    /// # Errors
    /// continuum's errors.
    pub fn open(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        Ok(Self(continuum_sinks::StoreSink::open_at_rest(dir)?))
    }

    /// The store as a sink, to load the sample.
    pub fn sink(&self) -> &dyn AtomSink {
        &self.0
    }

    /// Runs one compaction round (cold compression of every sealed segment) and writes the
    /// index snapshot.
    ///
    /// # Errors
    /// continuum's errors.
    pub fn compact(&self) -> Result<continuum::CompactionReport> {
        self.0.compact()
    }

    /// Bytes of the log's compressed (sealed) segments, of its active segment, and of the
    /// index snapshot file: where the directory's bytes are.
    pub fn breakdown(&self) -> (u64, u64, u64) {
        self.0.breakdown()
    }

    /// Closes the store, syncing its files.
    ///
    /// # Errors
    /// continuum's errors, and the file system's.
    pub fn close(self) -> Result<()> {
        Box::new(self.0).close()
    }
}

/// The raw continuum log of workload 6's at-rest sample: one record per atom, every sealed
/// segment rewritten with compressed frames (the store's cold-compression settings), as a user
/// of the raw log compresses its history with `Log::rewrite_segment_with`.
pub struct AtRestLog(continuum_sinks::LogSink);

impl AtRestLog {
    /// Opens (creating) the sample's log in `dir`.
    ///
    /// # Errors
    /// continuum's errors.
    pub fn open(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        Ok(Self(continuum_sinks::LogSink::open_at_rest(dir)?))
    }

    /// The log as a sink, to load the sample.
    pub fn sink(&self) -> &dyn AtomSink {
        &self.0
    }

    /// Rewrites every sealed segment compressed; returns the segments rewritten and their
    /// frame bytes before and after.
    ///
    /// # Errors
    /// continuum's errors.
    pub fn compress_sealed(&self) -> Result<(u64, u64, u64)> {
        self.0.compress_sealed()
    }

    /// Closes the log, syncing it.
    ///
    /// # Errors
    /// continuum's errors.
    pub fn close(self) -> Result<()> {
        Box::new(self.0).close()
    }
}

/// What rebuilding one agent found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resumed {
    /// Atoms of the agent read back and decoded (for the continuum store: the atoms the
    /// rebuilt context covers, those of the snapshot it started from and those applied on top).
    pub atoms: u64,
}

/// One engine holding agents' atoms. `Send + Sync`: the concurrent workloads share one sink
/// between threads, each thread writing its own agent.
pub trait AtomSink: Send + Sync {
    /// Stores one atom and returns once it is acknowledged under the sink's [`Mode`].
    ///
    /// # Errors
    /// The engine's errors.
    fn append(&self, atom: &AtomRef<'_>) -> Result<()>;

    /// Stores several atoms (a data set being loaded); durable after [`AtomSink::sync`].
    /// Each atom keeps its own row, entry or record, as [`AtomSink::append`] writes it, except
    /// in okaywal, where every commit syncs: there the batch is one entry of one chunk per atom.
    ///
    /// # Errors
    /// The engine's errors.
    fn append_batch(&self, atoms: &[AtomRef<'_>]) -> Result<()> {
        atoms.iter().try_for_each(|atom| self.append(atom))
    }

    /// Makes everything appended so far durable.
    ///
    /// # Errors
    /// The engine's errors.
    fn sync(&self) -> Result<()>;

    /// Reads back every atom of `agent` in atom order and decodes each delta: what an agent
    /// framework does to resume the agent after a restart.
    ///
    /// # Errors
    /// The engine's errors, and [`Error::Decode`] for a delta that does not decode.
    fn resume(&self, agent: u32) -> Result<Resumed>;

    /// Reads back every atom of `agent` with its recorded output (delta and, where the engine
    /// keeps one, result), in atom order, decoding each delta: what a framework resuming an
    /// agent that needs each step's result does, rather than a rebuilt context. For the peers
    /// (and the raw log) this is what [`AtomSink::resume`] reads; the continuum store reads its
    /// atoms through `Store::agent_history` instead of rebuilding a context from a snapshot.
    ///
    /// # Errors
    /// The engine's errors, and [`Error::Decode`] for a delta that does not decode.
    fn history(&self, agent: u32) -> Result<Resumed> {
        self.resume(agent)
    }

    /// Bytes of the engine's files that hold data, when the engine preallocates and can tell
    /// (continuum: segments up to their last record; okaywal: files up to their last entry).
    /// `None`: use the files' lengths.
    ///
    /// # Errors
    /// The engine's errors.
    fn used_bytes(&self) -> Result<Option<u64>> {
        Ok(None)
    }

    /// continuum's own counters (commit groups, `fdatasync`s, waits that slept, spinning held
    /// off: [`continuum::MetricsSnapshot`]), read before and after each workload-2 trial so
    /// that a trial's figure can be read against what its commit path did. `None` for the
    /// peers, which keep no such counters.
    fn commit_metrics(&self) -> Option<continuum::MetricsSnapshot> {
        None
    }

    /// Closes the engine cleanly (syncing what it syncs on close).
    ///
    /// # Errors
    /// The engine's errors.
    fn close(self: Box<Self>) -> Result<()>;
}

/// The run a benchmark agent belongs to: each agent is its own run (a LangGraph thread).
pub fn run_name(agent: u32) -> String {
    format!("run-{agent}")
}

/// The benchmark agent's name inside its run.
pub fn agent_name(agent: u32) -> String {
    format!("agent-{agent}")
}

/// Agents the sinks are prepared for (the concurrent workload's 16 writers, plus spares).
pub const AGENTS_MAX: u32 = 32;

/// Every agent's run and agent names ([`run_name`], [`agent_name`]), built once: an agent
/// framework holds its agent's names, it does not format them for every write, and neither
/// does a sink.
pub(crate) struct Names {
    runs: Vec<String>,
    agents: Vec<String>,
}

impl Names {
    /// The names of agents `0..AGENTS_MAX`.
    pub(crate) fn new() -> Self {
        Self { runs: (0..AGENTS_MAX).map(run_name).collect(), agents: (0..AGENTS_MAX).map(agent_name).collect() }
    }

    /// The run and agent names of `agent`.
    ///
    /// # Errors
    /// [`Error::Malformed`] for an agent at or beyond [`AGENTS_MAX`].
    pub(crate) fn of(&self, agent: u32) -> Result<(&str, &str)> {
        let at = usize::try_from(agent).ok().filter(|at| *at < self.agents.len());
        at.map(|at| (self.runs[at].as_str(), self.agents[at].as_str()))
            .ok_or(Error::Malformed { engine: "sink", reason: "agent out of range" })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every engine stores atoms of two agents, recovers them after a reopen, and resumes
    /// each agent with exactly its own atoms.
    #[test]
    fn every_engine_round_trips_atoms_across_a_reopen() {
        let mut deltas = Deltas::new(3);
        let encoded: Vec<Encoded> = (0..40).map(|_| deltas.next_encoded()).collect();
        for engine in Engine::ALL {
            let dir = tempfile::tempdir().expect("a temporary directory");
            for mode in [Mode::Durable, Mode::Load] {
                let sink = engine.open(dir.path(), mode).expect("opens");
                let offset = if mode == Mode::Durable { 0 } else { 10 };
                for (i, delta) in encoded[offset..offset + 10].iter().enumerate() {
                    sink.append(&delta.atom(1, offset as u64 + i as u64 + 1)).expect("appends");
                }
                let batch: Vec<AtomRef<'_>> = encoded[20 + offset..30 + offset]
                    .iter()
                    .enumerate()
                    .map(|(i, d)| d.atom(2, (offset + i) as u64 + 1))
                    .collect();
                sink.append_batch(&batch).expect("appends a batch");
                sink.sync().expect("syncs");
                sink.close().expect("closes");
            }
            let sink = engine.open(dir.path(), Mode::Durable).expect("reopens");
            assert_eq!(sink.resume(1).expect("resumes").atoms, 20, "{}", engine.name());
            assert_eq!(sink.resume(2).expect("resumes").atoms, 20, "{}", engine.name());
            assert_eq!(sink.resume(3).expect("resumes").atoms, 0, "{}", engine.name());
            let usage = disk_usage(dir.path()).expect("usage");
            assert!(usage.allocated > 0 && usage.length > 0, "{}", engine.name());
            sink.close().expect("closes");
        }
    }

    /// The continuum sinks report their commit counters (which count the appends), the peers
    /// none.
    #[test]
    fn only_continuum_reports_commit_metrics() {
        let encoded = Deltas::new(5).next_encoded();
        for engine in Engine::ALL {
            let dir = tempfile::tempdir().expect("a temporary directory");
            let sink = engine.open(dir.path(), Mode::Durable).expect("opens");
            let before = sink.commit_metrics();
            for id in 1..=3 {
                sink.append(&encoded.atom(1, id)).expect("appends");
            }
            match (engine.is_continuum(), before, sink.commit_metrics()) {
                (true, Some(before), Some(after)) => {
                    assert!(
                        after.fdatasyncs >= before.fdatasyncs + 3,
                        "{}: every durable append synced",
                        engine.name()
                    );
                    assert!(after.batches >= before.batches + 3, "{}", engine.name());
                }
                (false, None, None) => {}
                (_, before, after) => panic!("{}: {before:?} / {after:?}", engine.name()),
            }
            sink.close().expect("closes");
        }
    }

    #[test]
    fn buffered_mode_is_refused_where_every_commit_syncs() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        assert!(matches!(Engine::Okaywal.open(dir.path(), Mode::Buffered), Err(Error::Unsupported { .. })));
    }
}
