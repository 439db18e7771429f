//! continuum itself: the raw [`Log`] (one record per atom) and the atom [`Store`] (each agent
//! its own run, atoms chained as a DAG). The store records each atom finished, with
//! `record_atom_encoded` (its start and completion in one durable batch, the delta handed over
//! as the same protobuf bytes every other engine is given), as the peers write one row or entry per finished atom;
//! `CONTINUUM_PEERS_STORE=begin_complete` makes it call `begin_atom` and then
//! `complete_atom_encoded` instead, as an agent that must survive a crash mid-step does.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use continuum::log::Rewrite;
use continuum::storage::{DirLock, FileStorage, OpenMode, ReadView, Storage, StorageFile, WriteMap};
use continuum::{AtomId, CompactionPolicy, Durability, Log, Lsn, RewriteOptions, RunId, RunSpec, Store};

use crate::workload::{decode_framed, framed, framed_agent};
use crate::{AGENTS_MAX, AtomRef, AtomSink, Error, Mode, Names, Result, Resumed, run_name};

const LOG: &str = "continuum log";

/// continuum's raw log: each atom one record (agent, atom id, delta), each agent its own
/// stream ([`continuum::LogBuilder::stream_key`]: an index by agent in memory, built when the
/// log opens), so resuming an agent reads only its records.
pub(crate) struct LogSink {
    log: Log,
}

impl LogSink {
    /// Opens the log: `Sync` durability for durable appends, `Buffered` for buffered ones,
    /// `None` while loading.
    pub(crate) fn open(dir: &Path, mode: Mode) -> Result<Self> {
        let durability = match mode {
            Mode::Durable => Durability::Sync,
            Mode::Buffered => Durability::Buffered,
            Mode::Load => Durability::None,
        };
        Ok(Self { log: Log::builder(dir).durability(durability).stream_key(agent_stream).open()? })
    }

    /// The log of workload 6's at-rest sample: loaded without waiting for the disk, as the
    /// data set is, in 8 MiB segments so that the sample seals several (as the store's does).
    pub(crate) fn open_at_rest(dir: &Path) -> Result<Self> {
        let builder = Log::builder(dir).segment_bytes(8 << 20).durability(Durability::None);
        Ok(Self { log: builder.stream_key(agent_stream).open()? })
    }

    /// Rewrites every sealed segment with compressed frames, with the store's cold-compression
    /// settings: what a user of the raw log does with [`Log::rewrite_segment_with`]. Returns
    /// the segments rewritten and the frame bytes before and after.
    pub(crate) fn compress_sealed(&self) -> Result<(u64, u64, u64)> {
        let options = RewriteOptions { compression: Some(CompactionPolicy::COLD_COMPRESSION) };
        let (mut segments, mut before, mut after) = (0, 0, 0);
        for segment in self.log.segments().into_iter().filter(|segment| segment.sealed && !segment.compressed) {
            let report = self.log.rewrite_segment_with(segment.first_lsn, options, |_, _| Ok(Rewrite::Keep))?;
            segments += 1;
            before += report.bytes_before;
            after += report.bytes_after;
        }
        Ok((segments, before, after))
    }
}

impl AtomSink for LogSink {
    fn append(&self, atom: &AtomRef<'_>) -> Result<()> {
        self.log.append(&framed(atom))?;
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        self.log.sync()?;
        Ok(())
    }

    fn resume(&self, agent: u32) -> Result<Resumed> {
        let mut decoded = Ok(());
        let atoms = self.log.visit_stream(u64::from(agent), Lsn::FIRST, |_, record| {
            match decode_framed(LOG, record.bytes()) {
                Ok(delta) => {
                    std::hint::black_box(delta);
                    Ok(true)
                }
                Err(error) => {
                    decoded = Err(error);
                    Ok(false)
                }
            }
        })?;
        decoded?;
        Ok(Resumed { atoms: atoms as u64 })
    }

    fn used_bytes(&self) -> Result<Option<u64>> {
        Ok(Some(used_bytes(continuum::LogView::from(&self.log))?))
    }

    fn commit_metrics(&self) -> Option<continuum::MetricsSnapshot> {
        Some(self.log.metrics())
    }

    fn close(self: Box<Self>) -> Result<()> {
        self.log.close()?;
        Ok(())
    }
}

/// The stream of a log record: its agent.
fn agent_stream(record: &[u8]) -> Option<u64> {
    framed_agent(record).map(u64::from)
}

/// Bytes of a continuum directory that hold data: every file's length, less the preallocated
/// zeros after each segment's last record.
fn used_bytes(log: continuum::LogView<'_>) -> Result<u64> {
    let mut preallocated = 0;
    for segment in log.segments() {
        // A segment compaction deleted after the listing holds no bytes any more.
        match std::fs::metadata(&segment.path) {
            Ok(metadata) => preallocated += metadata.len().saturating_sub(segment.data_bytes),
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => return Err(error.into()),
        }
    }
    Ok(crate::disk_usage(log.dir())?.length.saturating_sub(preallocated))
}

/// The last atom stored for one agent (the parent of its next one).
enum Last {
    /// Not looked up since the store was opened.
    Unknown,
    /// Looked up, or written by this sink.
    Known(Option<AtomId>),
}

/// continuum's atom store. Each agent is its own run; each atom's parent is the agent's
/// previous atom, so rebuilding an agent folds its whole history.
pub(crate) struct StoreSink {
    store: Store,
    dir: PathBuf,
    runs: Vec<RunId>,
    names: Names,
    last: Vec<Mutex<Last>>,
}

impl StoreSink {
    /// Opens the store. Completions are always `Sync`; while loading ([`Mode::Load`]) the
    /// store runs on a file system whose `fdatasync` does nothing, and [`AtomSink::sync`]
    /// syncs every file afterwards.
    ///
    /// Its background thread runs no compaction rounds (`interval: None`; the rest of the
    /// policy is the default). A round's cold compression holds a core for tens of seconds
    /// with zstd 17, and it would run inside the other engines' trials (it halved the raw log's workload 2 and
    /// cut raft-engine's by a fifth, measured 2026-12-01). Compaction is measured on its own in the
    /// `compaction` bench and, with cold compression, in `at_rest` (workload 6).
    pub(crate) fn open(dir: &Path, mode: Mode) -> Result<Self> {
        let compaction = CompactionPolicy { interval: None, ..CompactionPolicy::default() };
        let store = match mode {
            Mode::Load => Store::builder(dir).storage(Arc::new(LoadStorage)).compaction(compaction).open()?,
            Mode::Durable => Store::builder(dir).compaction(compaction).open()?,
            Mode::Buffered => {
                Store::builder(dir).compaction(compaction).atom_durability(Durability::Buffered).open()?
            }
        };
        let runs =
            (0..AGENTS_MAX).map(|agent| store.create_run(RunSpec::new(run_name(agent)))).collect::<Result<_, _>>()?;
        let last = (0..AGENTS_MAX).map(|_| Mutex::new(Last::Unknown)).collect();
        Ok(Self { store, dir: dir.to_path_buf(), runs, names: Names::new(), last })
    }

    /// The store of workload 6's at-rest sample: loaded without `fdatasync` as the data set
    /// is, with no policy snapshots (so that compaction reclaims no delta: every atom keeps
    /// all of its data, as in the peers), in 8 MiB segments so that the sample seals several,
    /// and no background thread (the sample's round is run by [`StoreSink::compact`]).
    pub(crate) fn open_at_rest(dir: &Path) -> Result<Self> {
        let store = Store::builder(dir)
            .storage(Arc::new(LoadStorage))
            .segment_bytes(8 << 20)
            .snapshot_policy(continuum::SnapshotPolicy::NEVER)
            .background(false)
            .open()?;
        let runs =
            (0..AGENTS_MAX).map(|agent| store.create_run(RunSpec::new(run_name(agent)))).collect::<Result<_, _>>()?;
        let last = (0..AGENTS_MAX).map(|_| Mutex::new(Last::Unknown)).collect();
        Ok(Self { store, dir: dir.to_path_buf(), runs, names: Names::new(), last })
    }

    /// One compaction round with the store's default cold compression, then an index
    /// checkpoint (what the background thread writes after a round).
    pub(crate) fn compact(&self) -> Result<continuum::CompactionReport> {
        let report = self.store.compact()?;
        self.store.write_index_snapshot()?;
        Ok(report)
    }

    /// Bytes of the compressed segments, of the other (as appended) segments, and of the index
    /// checkpoint file.
    pub(crate) fn breakdown(&self) -> (u64, u64, u64) {
        let segments = self.store.log().segments();
        let compressed = segments.iter().filter(|s| s.compressed).map(|s| s.data_bytes).sum();
        let appended = segments.iter().filter(|s| !s.compressed).map(|s| s.data_bytes).sum();
        let checkpoint = std::fs::metadata(self.dir.join("index.snapshot")).map_or(0, |m| m.len());
        (compressed, appended, checkpoint)
    }

    fn run(&self, agent: u32) -> Result<RunId> {
        let index = usize::try_from(agent).ok().filter(|index| *index < self.runs.len());
        index
            .map(|index| self.runs[index])
            .ok_or(Error::Malformed { engine: "continuum store", reason: "agent out of range" })
    }
}

/// Whether `CONTINUUM_PEERS_STORE=begin_complete` asks for the two-call protocol.
pub(crate) fn begin_complete() -> bool {
    static CHOICE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *CHOICE.get_or_init(|| std::env::var("CONTINUUM_PEERS_STORE").is_ok_and(|v| v == "begin_complete"))
}

impl AtomSink for StoreSink {
    fn append(&self, atom: &AtomRef<'_>) -> Result<()> {
        let run = self.run(atom.agent)?;
        let (_, name) = self.names.of(atom.agent)?;
        let mut last = self.last[atom.agent as usize].lock().unwrap_or_else(PoisonError::into_inner);
        if let Last::Unknown = *last {
            *last = Last::Known(self.store.last_agent_atom(run, name));
        }
        let parent = match *last {
            Last::Known(parent) => parent,
            Last::Unknown => None,
        };
        // The agent's previous atom, if any, without a Vec per atom.
        let parents = parent.as_slice();
        let mut digits = [0; 20];
        let key = decimal(atom.atom_id, &mut digits);
        let result = &atom.output.result;
        let id = if begin_complete() {
            let id = self.store.begin_atom(run, name, key, parents, "")?;
            self.store.complete_atom_encoded(id, atom.encoded, result)?;
            id
        } else {
            self.store.record_atom_encoded(run, name, key, parents, "", atom.encoded, result)?
        };
        *last = Last::Known(Some(id));
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        self.store.sync()?;
        sync_tree(&self.dir)?;
        Ok(())
    }

    fn resume(&self, agent: u32) -> Result<Resumed> {
        let run = self.run(agent)?;
        let (_, name) = self.names.of(agent)?;
        let Some(head) = self.store.last_agent_atom(run, name) else {
            return Ok(Resumed::default());
        };
        let rebuilt = self.store.rebuild_context(head)?;
        std::hint::black_box(&rebuilt.context);
        // A rebuild that starts from a snapshot covers the agent's atoms up to the snapshot
        // without applying them again: as many as the snapshot atom's key, the workload's
        // number of that atom among its agent's (1, 2, ...).
        let in_snapshot = match rebuilt.snapshot {
            Some(snapshot) => self.store.atom(snapshot)?.key.parse::<usize>().map_err(|_| Error::Malformed {
                engine: "continuum store",
                reason: "a snapshot's atom has a key that is not the workload's atom number",
            })?,
            None => 0,
        };
        Ok(Resumed { atoms: (in_snapshot + rebuilt.atoms_applied) as u64 })
    }

    fn history(&self, agent: u32) -> Result<Resumed> {
        let run = self.run(agent)?;
        let (_, name) = self.names.of(agent)?;
        let mut atoms = 0;
        for atom in self.store.agent_history(run, name) {
            let atom = atom?;
            std::hint::black_box(&atom.output);
            atoms += 1;
        }
        Ok(Resumed { atoms })
    }

    fn used_bytes(&self) -> Result<Option<u64>> {
        Ok(Some(used_bytes(self.store.log())?))
    }

    fn commit_metrics(&self) -> Option<continuum::MetricsSnapshot> {
        Some(self.store.metrics())
    }

    fn close(self: Box<Self>) -> Result<()> {
        // Dropping the store may write its index snapshot (through the load storage, which
        // does not sync): sync what the directory holds now.
        let dir = self.dir.clone();
        drop(self.store);
        sync_tree(&dir)?;
        Ok(())
    }
}

/// `value` in decimal, written into `digits` without allocating: the atom's key, which an
/// agent framework has at hand as a string.
fn decimal(mut value: u64, digits: &mut [u8; 20]) -> &str {
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    std::str::from_utf8(&digits[at..]).unwrap_or_default()
}

/// `fsync`s every file under `dir`, and `dir` itself.
fn sync_tree(dir: &Path) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            std::fs::File::open(entry.path())?.sync_all()?;
        }
    }
    std::fs::File::open(dir)?.sync_all()
}

/// The real file system without `fdatasync`, for loading a data set into the store (whose
/// completions always sync) at the speed the peers load theirs. Never used for a measurement.
#[derive(Debug)]
struct LoadStorage;

impl Storage for LoadStorage {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        FileStorage.create_dir_all(dir)
    }

    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        FileStorage.list_dir(dir)
    }

    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn StorageFile>> {
        Ok(Arc::new(LoadFile { file: FileStorage.open(path, mode)? }))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        FileStorage.rename(from, to)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        FileStorage.remove_file(path)
    }

    fn sync_dir(&self, _dir: &Path) -> io::Result<()> {
        Ok(())
    }

    fn lock_dir(&self, dir: &Path) -> io::Result<DirLock> {
        FileStorage.lock_dir(dir)
    }
}

/// A real file whose `sync_data` does nothing.
#[derive(Debug)]
struct LoadFile {
    file: Arc<dyn StorageFile>,
}

impl StorageFile for LoadFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(buf, offset)
    }

    fn sync_data(&self) -> io::Result<()> {
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        self.file.len()
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    fn allocate(&self, len: u64) -> io::Result<()> {
        self.file.allocate(len)
    }

    fn writable_map(&self) -> io::Result<Option<WriteMap>> {
        self.file.writable_map()
    }

    fn view(&self) -> io::Result<ReadView> {
        self.file.view()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent_name;
    use crate::workload::Deltas;

    /// The store resumes an agent from its newest snapshot (written every 50 atoms by the
    /// default policy, and at the latest by a clean close) and counts the atoms the snapshot
    /// covers from the snapshot atom's key: every atom must be accounted for.
    #[test]
    fn keys_are_written_in_decimal_as_to_string_writes_them() {
        let mut digits = [0; 20];
        for value in [0, 7, 10, 99, 1_000, 123_456_789, u64::MAX] {
            assert_eq!(decimal(value, &mut digits), value.to_string());
        }
    }

    #[test]
    fn the_store_resumes_an_agent_from_a_snapshot_with_every_atom_counted() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut deltas = Deltas::new(5);
        let encoded: Vec<_> = (0..8).map(|_| deltas.next_encoded()).collect();
        let sink = StoreSink::open(dir.path(), Mode::Durable).expect("opens");
        for id in 1..=123u64 {
            sink.append(&encoded[id as usize % 8].atom(4, id)).expect("appends");
        }
        Box::new(sink).close().expect("closes");
        let sink = StoreSink::open(dir.path(), Mode::Durable).expect("reopens");
        let run = sink.run(4).expect("run");
        let head = sink.store.last_agent_atom(run, &agent_name(4)).expect("a head");
        let rebuilt = sink.store.rebuild_context(head).expect("rebuilds");
        assert!(rebuilt.snapshot.is_some(), "the rebuild starts from a snapshot");
        assert!(rebuilt.atoms_applied < 123, "not every atom is folded again");
        assert_eq!(sink.resume(4).expect("resumes").atoms, 123);
        assert_eq!(sink.resume(5).expect("resumes").atoms, 0);
    }
}
