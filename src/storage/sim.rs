//! [`SimStorage`]: a deterministic in-memory file system for crash and fault tests.
//!
//! Every file is an inode with its *live* bytes (what readers see), its *durable* bytes (what a
//! power loss keeps) and the list of writes and length changes made since its last
//! [`StorageFile::sync_data`]. Every directory likewise keeps its live entries apart from its
//! durable ones, with the creates, renames and removals made since its last
//! [`Storage::sync_dir`]. Two kinds of crash differ in what they keep:
//! - [`SimStorage::crash_process`], a process crash: the process's handles and locks die, the
//!   kernel's page cache does not. Every written byte and every directory change stays as it
//!   was, readable by the next process and still unsynced, so a later power loss can drop it.
//! - [`SimStorage::crash`], a power loss (or a kernel crash): unsynced state is thrown away with
//!   a chosen [`CrashDamage`], and whatever survives is then on the disk, durable.
//!
//! [`SimStorage::inject`] and [`SimStorage::halt_after`] make chosen calls fail.
//! All randomness comes from the seed given to [`SimStorage::new`], so a test that makes the same
//! calls in the same order sees the same damage.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, MutexGuard};

use super::{DirLock, OpenMode, ReadView, Storage, StorageFile};

/// A torn write is cut at a multiple of this many bytes of the file.
const SECTOR: usize = 512;
/// The most garbage bytes [`DataDamage::TornPrefixWithGarbage`] writes.
const MAX_GARBAGE: u64 = 1024;
/// `EIO` on every Unix.
const EIO: i32 = 5;

/// A call of [`Storage`] or [`StorageFile`], to aim a [`Fault`] at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// [`Storage::create_dir_all`].
    CreateDir,
    /// [`Storage::list_dir`].
    ListDir,
    /// [`Storage::open`].
    Open,
    /// [`Storage::rename`].
    Rename,
    /// [`Storage::remove_file`].
    Remove,
    /// [`Storage::sync_dir`].
    SyncDir,
    /// [`Storage::lock_dir`].
    Lock,
    /// [`StorageFile::read_exact_at`].
    Read,
    /// [`StorageFile::write_all_at`].
    Write,
    /// [`StorageFile::sync_data`].
    SyncData,
    /// [`StorageFile::len`].
    Len,
    /// [`StorageFile::set_len`].
    SetLen,
    /// [`StorageFile::allocate`].
    Allocate,
    /// [`StorageFile::view`].
    View,
}

/// How an injected [`Fault`] fails its call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// `EIO`: an error with raw OS error 5.
    Eio,
    /// `ENOSPC`: an error of kind [`io::ErrorKind::StorageFull`].
    NoSpace,
}

impl FaultKind {
    fn error(self) -> io::Error {
        match self {
            Self::Eio => eio(),
            Self::NoSpace => io::ErrorKind::StorageFull.into(),
        }
    }
}

/// A fault to arm with [`SimStorage::inject`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    /// The kind of call that fails; `None` matches every call.
    pub op: Option<Op>,
    /// Which matching call fails, counting from 1 at the next matching call (0 acts as 1).
    pub nth: u64,
    /// How it fails.
    pub kind: FaultKind,
}

/// What a crash does to file contents written since the file's last `sync_data`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataDamage {
    /// Every unsynced write and length change is lost.
    DropUnsynced,
    /// A random prefix of the unsynced writes survives, torn at a 512-byte sector boundary.
    TornPrefix,
    /// As [`DataDamage::TornPrefix`], followed by 1 to 1024 random bytes where the kept data
    /// ends. The garbage never covers durable bytes outside the write that was torn.
    TornPrefixWithGarbage,
}

/// What a crash does to directory entries changed since the directory's last `sync_dir`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirDamage {
    /// Every unsynced create, rename and removal is undone.
    ForgetUnsynced,
    /// Every directory change survives.
    KeepAll,
    /// In each directory, a random prefix of its unsynced changes survives.
    KeepRandomPrefix,
}

/// The damage one [`SimStorage::crash`] does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CrashDamage {
    /// Damage to file contents.
    pub data: DataDamage,
    /// Damage to directory entries.
    pub dir: DirDamage,
}

impl CrashDamage {
    /// Every combination of [`DataDamage`] and [`DirDamage`].
    pub const ALL: [CrashDamage; 9] = {
        use DataDamage::{DropUnsynced, TornPrefix, TornPrefixWithGarbage};
        use DirDamage::{ForgetUnsynced, KeepAll, KeepRandomPrefix};
        const fn d(data: DataDamage, dir: DirDamage) -> CrashDamage {
            CrashDamage { data, dir }
        }
        [
            d(DropUnsynced, ForgetUnsynced),
            d(DropUnsynced, KeepAll),
            d(DropUnsynced, KeepRandomPrefix),
            d(TornPrefix, ForgetUnsynced),
            d(TornPrefix, KeepAll),
            d(TornPrefix, KeepRandomPrefix),
            d(TornPrefixWithGarbage, ForgetUnsynced),
            d(TornPrefixWithGarbage, KeepAll),
            d(TornPrefixWithGarbage, KeepRandomPrefix),
        ]
    };
}

/// An in-memory [`Storage`] that can crash and fail on demand. Clones share one simulated disk.
#[derive(Clone)]
pub struct SimStorage {
    state: Arc<Mutex<State>>,
    /// The crash epoch this handle belongs to, if it is one process's ([`SimStorage::process`]).
    process: Option<u64>,
}

impl SimStorage {
    /// An empty disk whose random choices all derive from `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: Arc::new(Mutex::new(State::new(seed))), process: None }
    }

    /// One process's handle on this disk: after the next [`SimStorage::crash`] every call
    /// through it fails with `EIO` and changes nothing, as a dead process's calls never reach
    /// the disk. A test can then drop what ran on it (a store's close writes nothing) instead
    /// of leaking it.
    pub fn process(&self) -> SimStorage {
        let epoch = self.state.lock().epoch;
        Self { state: Arc::clone(&self.state), process: Some(epoch) }
    }

    /// Locks the disk for a call through this handle, which fails if its process died.
    fn lock_alive(&self) -> io::Result<MutexGuard<'_, State>> {
        let state = self.state.lock();
        if self.process.is_some_and(|epoch| epoch != state.epoch) {
            return Err(eio());
        }
        Ok(state)
    }

    /// Simulates a power loss (or a kernel crash): applies `damage` to everything not synced,
    /// makes what survives durable, makes every open handle fail with `EIO`, releases every
    /// directory lock and clears any halt and armed faults.
    pub fn crash(&self, damage: CrashDamage) {
        self.state.lock().crash(damage);
    }

    /// Simulates a process crash: every open handle fails with `EIO` from now on, every
    /// directory lock is released, any halt and armed faults are cleared. The page cache
    /// survives: file contents and directory entries stay as the dead process left them, and
    /// what it never synced stays unsynced, for a later [`SimStorage::crash`] to damage.
    pub fn crash_process(&self) {
        self.state.lock().crash_process();
    }

    /// Arms `fault`; several faults may be armed at once.
    pub fn inject(&self, fault: Fault) {
        let remaining = fault.nth.max(1);
        self.state.lock().faults.push(Armed { op: fault.op, remaining, kind: fault.kind });
    }

    /// Lets the next `ops` calls run, then fails every later call with `EIO` without effect
    /// until [`SimStorage::crash`]: a process that dies right after its `ops`-th call.
    pub fn halt_after(&self, ops: u64) {
        let mut state = self.state.lock();
        state.halt_at = Some(state.ops.saturating_add(ops));
    }

    /// How many [`Storage`] and [`StorageFile`] calls have been made so far.
    pub fn op_count(&self) -> u64 {
        self.state.lock().ops
    }

    /// Bytes passed to successful [`StorageFile::write_all_at`] calls so far.
    pub fn bytes_written(&self) -> u64 {
        self.state.lock().bytes_written
    }

    /// Makes every later [`StorageFile::sync_data`] sleep `delay` (without holding the disk's
    /// lock, so other calls go on meanwhile) before it syncs: a disk whose `fdatasync` takes
    /// time. Zero, the default, syncs at once.
    pub fn set_sync_delay(&self, delay: Duration) {
        self.state.lock().sync_delay = delay;
    }

    /// Caps the total length of all files (linked or still open) at `bytes`; a write, `set_len`
    /// or `allocate` that would pass it fails with [`io::ErrorKind::StorageFull`] and changes
    /// nothing. `None`, the default, is unlimited.
    pub fn set_capacity(&self, bytes: Option<u64>) {
        self.state.lock().capacity = bytes;
    }

    /// The space the files take now (what [`SimStorage::set_capacity`] caps): the live length
    /// of every file that is linked or still open.
    pub fn used_bytes(&self) -> u64 {
        self.state.lock().used_bytes()
    }

    /// The live bytes of the file at `path`, bypassing faults and op counting.
    pub fn file_bytes(&self, path: &Path) -> Option<Vec<u8>> {
        let state = self.state.lock();
        let id = state.live.get(path)?;
        Some(state.inodes.get(id)?.live.clone())
    }

    /// The synced bytes of the file now at `path`: what a [`DataDamage::DropUnsynced`] crash
    /// would leave of it, provided its directory entry survives.
    pub fn durable_bytes(&self, path: &Path) -> Option<Vec<u8>> {
        let state = self.state.lock();
        let id = state.live.get(path)?;
        Some(state.inodes.get(id)?.durable.clone())
    }

    /// Overwrites bytes of the file at `path` in place, in its live and its durable content
    /// alike (and in its unsynced writes), as bit rot would.
    ///
    /// # Panics
    /// If no file is at `path` or the range passes its live end: a bug in the test.
    pub fn overwrite(&self, path: &Path, offset: u64, bytes: &[u8]) {
        let mut state = self.state.lock();
        let id = *state.live.get(path).unwrap_or_else(|| panic!("no file at {}", path.display()));
        let inode = state.inodes.get_mut(&id).expect("invariant: linked inodes exist");
        let offset = usize::try_from(offset).expect("overwrite offset fits in memory");
        assert!(offset + bytes.len() <= inode.live.len(), "overwrite past the end of the file");
        inode.corrupt(offset, bytes);
    }

    /// The live names in `dir`, sorted, bypassing faults and op counting.
    pub fn file_names(&self, dir: &Path) -> Vec<String> {
        self.state.lock().names_in(dir)
    }
}

impl fmt::Debug for SimStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = f.debug_struct("SimStorage");
        if let Some(state) = self.state.try_lock() {
            out.field("ops", &state.ops).field("epoch", &state.epoch);
        }
        out.finish_non_exhaustive()
    }
}

impl Storage for SimStorage {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut state = self.lock_alive()?;
        state.enter(Op::CreateDir)?;
        state.create_dir_all(dir)
    }

    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut state = self.lock_alive()?;
        state.enter(Op::ListDir)?;
        state.require_dir(dir)?;
        Ok(state.names_in(dir))
    }

    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn StorageFile>> {
        let mut state = self.lock_alive()?;
        state.enter(Op::Open)?;
        let inode = state.open(path, mode)?;
        let handle = Arc::clone(&state.inodes.get(&inode).ok_or_else(eio)?.handles);
        Ok(Arc::new(SimFile {
            state: Arc::clone(&self.state),
            inode,
            epoch: state.epoch,
            writable: mode != OpenMode::ReadOnly,
            _handle: handle,
        }))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut state = self.lock_alive()?;
        state.enter(Op::Rename)?;
        state.rename(from, to)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut state = self.lock_alive()?;
        state.enter(Op::Remove)?;
        state.remove_file(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut state = self.lock_alive()?;
        state.enter(Op::SyncDir)?;
        state.sync_dir(dir)
    }

    fn lock_dir(&self, dir: &Path) -> io::Result<DirLock> {
        let mut state = self.lock_alive()?;
        state.enter(Op::Lock)?;
        state.require_dir(dir)?;
        if !state.locks.insert(dir.to_path_buf()) {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let guard = LockGuard { state: Arc::clone(&self.state), dir: dir.to_path_buf(), epoch: state.epoch };
        Ok(DirLock::new(Box::new(guard)))
    }
}

/// Unregisters a directory lock on drop, unless a crash has released it already.
struct LockGuard {
    state: Arc<Mutex<State>>,
    dir: PathBuf,
    epoch: u64,
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let mut state = self.state.lock();
        if state.epoch == self.epoch {
            state.locks.remove(&self.dir);
        }
    }
}

/// An open file of a [`SimStorage`]: an inode id, valid until the next crash.
struct SimFile {
    state: Arc<Mutex<State>>,
    inode: u64,
    epoch: u64,
    writable: bool,
    /// Keeps the inode's space counted while the file is open, as an unlinked open file's is.
    _handle: Arc<()>,
}

impl SimFile {
    /// Counts the call and checks faults, then that no crash happened since the open.
    fn enter(&self, op: Op) -> io::Result<MutexGuard<'_, State>> {
        let mut state = self.state.lock();
        state.enter(op)?;
        self.check_epoch(&state)?;
        Ok(state)
    }

    /// As [`SimFile::enter`], for a call that changes the file.
    fn enter_writable(&self, op: Op) -> io::Result<MutexGuard<'_, State>> {
        let state = self.enter(op)?;
        if !self.writable {
            return Err(io::ErrorKind::PermissionDenied.into());
        }
        Ok(state)
    }

    fn check_epoch(&self, state: &State) -> io::Result<()> {
        if state.epoch == self.epoch { Ok(()) } else { Err(eio()) }
    }
}

impl fmt::Debug for SimFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimFile")
            .field("inode", &self.inode)
            .field("epoch", &self.epoch)
            .field("writable", &self.writable)
            .finish()
    }
}

impl StorageFile for SimFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut state = self.enter(Op::Read)?;
        let live = &state.inode_mut(self.inode)?.live;
        let start = to_usize(offset)?;
        let end = start.checked_add(buf.len()).filter(|&end| end <= live.len());
        let end = end.ok_or(io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(&live[start..end]);
        Ok(())
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut state = self.state.lock();
        if let Some(kind) = state.gate(Op::Write)? {
            if self.writable && self.check_epoch(&state).is_ok() {
                state.short_write(self.inode, buf, offset);
            }
            return Err(kind.error());
        }
        self.check_epoch(&state)?;
        if !self.writable {
            return Err(io::ErrorKind::PermissionDenied.into());
        }
        state.write(self.inode, to_usize(offset)?, buf)
    }

    fn sync_data(&self) -> io::Result<()> {
        let delay = self.state.lock().sync_delay;
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        let mut state = self.enter(Op::SyncData)?;
        state.inode_mut(self.inode)?.sync();
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        let mut state = self.enter(Op::Len)?;
        Ok(state.inode_mut(self.inode)?.live.len() as u64)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut state = self.enter_writable(Op::SetLen)?;
        state.set_len(self.inode, to_usize(len)?, false)
    }

    fn allocate(&self, len: u64) -> io::Result<()> {
        let mut state = self.enter_writable(Op::Allocate)?;
        state.set_len(self.inode, to_usize(len)?, true)
    }

    fn view(&self) -> io::Result<ReadView> {
        let mut state = self.enter(Op::View)?;
        Ok(ReadView::from_vec(state.inode_mut(self.inode)?.live.clone()))
    }
}

/// An armed [`Fault`].
#[derive(Debug)]
struct Armed {
    op: Option<Op>,
    /// Matching calls still to come before and including the failing one.
    remaining: u64,
    kind: FaultKind,
}

/// A file change not yet made durable by `sync_data`.
#[derive(Debug, Clone)]
enum Unsynced {
    Write { offset: usize, bytes: Vec<u8> },
    SetLen(usize),
}

/// A directory change not yet made durable by `sync_dir`.
#[derive(Debug, Clone)]
enum DirOp {
    Create(PathBuf, u64),
    Rename(PathBuf, PathBuf, u64),
    Remove(PathBuf),
}

impl DirOp {
    fn apply(&self, entries: &mut BTreeMap<PathBuf, u64>) {
        match self {
            Self::Create(path, id) => {
                entries.insert(path.clone(), *id);
            }
            Self::Rename(from, to, id) => {
                entries.remove(from);
                entries.insert(to.clone(), *id);
            }
            Self::Remove(path) => {
                entries.remove(path);
            }
        }
    }

    fn inode(&self) -> Option<u64> {
        match self {
            Self::Create(_, id) | Self::Rename(_, _, id) => Some(*id),
            Self::Remove(_) => None,
        }
    }
}

/// A file's contents.
#[derive(Debug, Default)]
struct Inode {
    live: Vec<u8>,
    durable: Vec<u8>,
    /// Changes since the last `sync_data`, in call order: replaying them on `durable` gives
    /// `live`.
    unsynced: Vec<Unsynced>,
    /// One clone per open handle of the current epoch.
    handles: Arc<()>,
}

impl Inode {
    fn write(&mut self, offset: usize, bytes: &[u8]) {
        write_into(&mut self.live, offset, bytes);
        self.unsynced.push(Unsynced::Write { offset, bytes: bytes.to_vec() });
    }

    fn set_len(&mut self, len: usize) {
        self.live.resize(len, 0);
        self.unsynced.push(Unsynced::SetLen(len));
    }

    fn sync(&mut self) {
        for change in self.unsynced.drain(..) {
            replay(&mut self.durable, &change);
        }
    }

    fn is_open(&self) -> bool {
        Arc::strong_count(&self.handles) > 1
    }

    fn corrupt(&mut self, offset: usize, bytes: &[u8]) {
        patch(&mut self.live, 0, offset, bytes);
        patch(&mut self.durable, 0, offset, bytes);
        for change in &mut self.unsynced {
            if let Unsynced::Write { offset: at, bytes: written } = change {
                patch(written, *at, offset, bytes);
            }
        }
    }

    /// Applies `damage` to the unsynced changes, then makes the result durable.
    fn crash(&mut self, damage: DataDamage, rng: &mut Rng) {
        self.handles = Arc::new(());
        if self.unsynced.is_empty() {
            return;
        }
        self.live = match damage {
            DataDamage::DropUnsynced => self.durable.clone(),
            DataDamage::TornPrefix => self.torn(rng).0,
            DataDamage::TornPrefixWithGarbage => {
                let (mut bytes, tail) = self.torn(rng);
                if let Some(tail) = tail {
                    add_garbage(&mut bytes, tail, self.durable.len(), rng);
                }
                bytes
            }
        };
        self.durable = self.live.clone();
        self.unsynced.clear();
    }

    /// The durable bytes with the unsynced changes replayed up to a random cut.
    fn torn(&self, rng: &mut Rng) -> (Vec<u8>, Option<Tail>) {
        let total: usize = self.unsynced.iter().map(written_len).sum();
        let cut = usize::try_from(rng.below(total as u64 + 1)).unwrap_or(total);
        replay_torn(self.durable.clone(), &self.unsynced, cut)
    }
}

/// Where a torn replay stopped writing.
#[derive(Debug, Clone, Copy)]
struct Tail {
    /// The file offset right after the last byte kept of the last write reached.
    at: usize,
    /// The end offset of that whole write.
    write_end: usize,
}

/// Replays `changes` on `file`, keeping only the first `cut` written bytes, torn at a sector.
fn replay_torn(mut file: Vec<u8>, changes: &[Unsynced], cut: usize) -> (Vec<u8>, Option<Tail>) {
    let mut consumed = 0;
    let mut tail = None;
    for change in changes {
        let Unsynced::Write { offset, bytes } = change else {
            replay(&mut file, change);
            continue;
        };
        let write_end = offset + bytes.len();
        let before = (cut - consumed).min(bytes.len());
        if before == bytes.len() {
            write_into(&mut file, *offset, bytes);
            consumed += before;
            tail = Some(Tail { at: write_end, write_end });
            continue;
        }
        let keep = ((offset + before) / SECTOR * SECTOR).saturating_sub(*offset);
        write_into(&mut file, *offset, &bytes[..keep]);
        return (file, Some(Tail { at: offset + keep, write_end }));
    }
    (file, tail)
}

/// Writes 1..=1024 random bytes at `tail.at`, but never over durable bytes outside the torn
/// write.
fn add_garbage(file: &mut Vec<u8>, tail: Tail, durable_len: usize, rng: &mut Rng) {
    let wanted = usize::try_from(1 + rng.below(MAX_GARBAGE)).unwrap_or(1);
    let mut end = tail.at + wanted;
    let writable_end = tail.write_end.max(tail.at);
    if durable_len > writable_end {
        end = end.min(writable_end);
    }
    let garbage: Vec<u8> = (tail.at..end).map(|_| rng.next_u64() as u8).collect();
    write_into(file, tail.at, &garbage);
}

fn written_len(change: &Unsynced) -> usize {
    match change {
        Unsynced::Write { bytes, .. } => bytes.len(),
        Unsynced::SetLen(_) => 0,
    }
}

fn replay(file: &mut Vec<u8>, change: &Unsynced) {
    match change {
        Unsynced::Write { offset, bytes } => write_into(file, *offset, bytes),
        Unsynced::SetLen(len) => file.resize(*len, 0),
    }
}

/// Writes `bytes` at `offset`, zero-extending `file` as needed.
fn write_into(file: &mut Vec<u8>, offset: usize, bytes: &[u8]) {
    let end = offset + bytes.len();
    if file.len() < end {
        file.resize(end, 0);
    }
    file[offset..end].copy_from_slice(bytes);
}

/// Copies the part of `bytes` (meant for file offset `offset`) that overlaps `buf`, which holds
/// file offsets `base..base + buf.len()`.
fn patch(buf: &mut [u8], base: usize, offset: usize, bytes: &[u8]) {
    let start = offset.max(base);
    let end = (offset + bytes.len()).min(base + buf.len());
    if start < end {
        buf[start - base..end - base].copy_from_slice(&bytes[start - offset..end - offset]);
    }
}

/// The whole simulated disk.
#[derive(Debug)]
struct State {
    rng: Rng,
    /// Bumped by every crash; handles and lock guards of older epochs are dead.
    epoch: u64,
    ops: u64,
    /// Bytes of every successful `write_all_at`.
    bytes_written: u64,
    /// How long every `sync_data` sleeps before it syncs.
    sync_delay: Duration,
    /// Calls numbered above this fail with `EIO`.
    halt_at: Option<u64>,
    faults: Vec<Armed>,
    capacity: Option<u64>,
    dirs: BTreeSet<PathBuf>,
    inodes: BTreeMap<u64, Inode>,
    next_inode: u64,
    live: BTreeMap<PathBuf, u64>,
    durable: BTreeMap<PathBuf, u64>,
    /// Per directory, its changes since its last `sync_dir`.
    pending: BTreeMap<PathBuf, Vec<DirOp>>,
    locks: BTreeSet<PathBuf>,
}

impl State {
    fn new(seed: u64) -> Self {
        Self {
            rng: Rng::new(seed),
            epoch: 0,
            ops: 0,
            bytes_written: 0,
            sync_delay: Duration::ZERO,
            halt_at: None,
            faults: Vec::new(),
            capacity: None,
            dirs: BTreeSet::new(),
            inodes: BTreeMap::new(),
            next_inode: 0,
            live: BTreeMap::new(),
            durable: BTreeMap::new(),
            pending: BTreeMap::new(),
            locks: BTreeSet::new(),
        }
    }

    /// Counts a call; fails it if halted, and returns the kind of a fault that fires on it.
    fn gate(&mut self, op: Op) -> io::Result<Option<FaultKind>> {
        self.ops += 1;
        if self.halt_at.is_some_and(|halt| self.ops > halt) {
            return Err(eio());
        }
        let mut fired = None;
        self.faults.retain_mut(|fault| {
            if fault.op.is_some_and(|target| target != op) {
                return true;
            }
            fault.remaining -= 1;
            if fault.remaining > 0 {
                return true;
            }
            fired.get_or_insert(fault.kind);
            false
        });
        Ok(fired)
    }

    /// As [`State::gate`], failing the call if a fault fires.
    fn enter(&mut self, op: Op) -> io::Result<()> {
        match self.gate(op)? {
            Some(kind) => Err(kind.error()),
            None => Ok(()),
        }
    }

    fn inode_mut(&mut self, id: u64) -> io::Result<&mut Inode> {
        self.inodes.get_mut(&id).ok_or_else(eio)
    }

    fn dir_exists(&self, dir: &Path) -> bool {
        dir.as_os_str().is_empty() || dir.parent().is_none() || self.dirs.contains(dir)
    }

    fn require_dir(&self, dir: &Path) -> io::Result<()> {
        if self.dir_exists(dir) { Ok(()) } else { Err(io::ErrorKind::NotFound.into()) }
    }

    fn names_in(&self, dir: &Path) -> Vec<String> {
        let in_dir = self.live.keys().filter(|path| path.parent() == Some(dir));
        let mut names: Vec<String> = in_dir.filter_map(|path| path.file_name()?.to_str().map(str::to_owned)).collect();
        names.sort();
        names
    }

    fn create_dir_all(&mut self, dir: &Path) -> io::Result<()> {
        if dir.ancestors().any(|ancestor| self.live.contains_key(ancestor)) {
            return Err(io::ErrorKind::AlreadyExists.into());
        }
        for ancestor in dir.ancestors().filter(|a| !a.as_os_str().is_empty()) {
            self.dirs.insert(ancestor.to_path_buf());
        }
        Ok(())
    }

    fn open(&mut self, path: &Path, mode: OpenMode) -> io::Result<u64> {
        if mode != OpenMode::CreateNew {
            return self.live.get(path).copied().ok_or_else(|| io::ErrorKind::NotFound.into());
        }
        if self.live.contains_key(path) || self.dirs.contains(path) {
            return Err(io::ErrorKind::AlreadyExists.into());
        }
        self.require_dir(parent_of(path))?;
        let id = self.next_inode;
        self.next_inode += 1;
        self.inodes.insert(id, Inode::default());
        self.live.insert(path.to_path_buf(), id);
        self.record(parent_of(path), DirOp::Create(path.to_path_buf(), id));
        Ok(id)
    }

    fn rename(&mut self, from: &Path, to: &Path) -> io::Result<()> {
        let id = *self.live.get(from).ok_or(io::ErrorKind::NotFound)?;
        self.require_dir(parent_of(to))?;
        if self.dirs.contains(to) {
            return Err(io::ErrorKind::IsADirectory.into());
        }
        if from == to {
            return Ok(());
        }
        self.live.remove(from);
        self.live.insert(to.to_path_buf(), id);
        let (from_dir, to_dir) = (parent_of(from), parent_of(to));
        if from_dir == to_dir {
            self.record(from_dir, DirOp::Rename(from.to_path_buf(), to.to_path_buf(), id));
        } else {
            self.record(from_dir, DirOp::Remove(from.to_path_buf()));
            self.record(to_dir, DirOp::Create(to.to_path_buf(), id));
        }
        self.sweep();
        Ok(())
    }

    fn remove_file(&mut self, path: &Path) -> io::Result<()> {
        if self.dirs.contains(path) {
            return Err(io::ErrorKind::IsADirectory.into());
        }
        self.live.remove(path).ok_or(io::ErrorKind::NotFound)?;
        self.record(parent_of(path), DirOp::Remove(path.to_path_buf()));
        self.sweep();
        Ok(())
    }

    fn sync_dir(&mut self, dir: &Path) -> io::Result<()> {
        self.require_dir(dir)?;
        self.durable.retain(|path, _| path.parent() != Some(dir));
        let live = self.live.iter().filter(|(path, _)| path.parent() == Some(dir));
        let live: Vec<(PathBuf, u64)> = live.map(|(path, id)| (path.clone(), *id)).collect();
        self.durable.extend(live);
        self.pending.remove(dir);
        self.sweep();
        Ok(())
    }

    fn record(&mut self, dir: &Path, op: DirOp) {
        self.pending.entry(dir.to_path_buf()).or_default().push(op);
    }

    /// Drops inodes that no entry, pending directory change or open handle refers to.
    fn sweep(&mut self) {
        let mut used: BTreeSet<u64> = self.live.values().chain(self.durable.values()).copied().collect();
        used.extend(self.pending.values().flatten().filter_map(DirOp::inode));
        self.inodes.retain(|id, inode| used.contains(id) || inode.is_open());
    }

    /// Fails with `StorageFull` unless inode `id` may grow to `len` bytes.
    fn reserve(&self, id: u64, len: usize) -> io::Result<()> {
        let (Some(capacity), Some(inode)) = (self.capacity, self.inodes.get(&id)) else {
            return Ok(());
        };
        let growth = len.saturating_sub(inode.live.len()) as u64;
        if growth > 0 && self.used_bytes().saturating_add(growth) > capacity {
            return Err(io::ErrorKind::StorageFull.into());
        }
        Ok(())
    }

    /// The total live length of the files that take space: linked or open.
    fn used_bytes(&self) -> u64 {
        let linked: BTreeSet<u64> = self.live.values().copied().collect();
        let taking = self.inodes.iter().filter(|(id, inode)| linked.contains(id) || inode.is_open());
        taking.map(|(_, inode)| inode.live.len() as u64).sum()
    }

    /// The free bytes left, if the capacity is bounded.
    fn room(&self) -> Option<u64> {
        Some(self.capacity?.saturating_sub(self.used_bytes()))
    }

    fn write(&mut self, id: u64, offset: usize, bytes: &[u8]) -> io::Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        let end = offset.checked_add(bytes.len()).ok_or(io::ErrorKind::InvalidInput)?;
        self.reserve(id, end)?;
        self.inode_mut(id)?.write(offset, bytes);
        self.bytes_written += bytes.len() as u64;
        Ok(())
    }

    /// What a write failing midway leaves: a random strict prefix of `bytes`, within capacity.
    fn short_write(&mut self, id: u64, bytes: &[u8], offset: u64) {
        let (Ok(offset), Some(len)) = (to_usize(offset), self.inodes.get(&id).map(|i| i.live.len())) else {
            return;
        };
        let mut keep = usize::try_from(self.rng.below(bytes.len() as u64)).unwrap_or(0);
        if let Some(room) = self.room() {
            let limit = len.saturating_add(usize::try_from(room).unwrap_or(usize::MAX));
            keep = keep.min(limit.saturating_sub(offset));
        }
        // Cannot fail: the prefix fits the capacity by construction.
        let _ = self.write(id, offset, &bytes[..keep]);
    }

    /// `set_len`, or with `grow_only` `allocate`, of inode `id`.
    fn set_len(&mut self, id: u64, len: usize, grow_only: bool) -> io::Result<()> {
        let current = self.inode_mut(id)?.live.len();
        if len == current || (grow_only && len < current) {
            return Ok(());
        }
        self.reserve(id, len)?;
        self.inode_mut(id)?.set_len(len);
        Ok(())
    }

    fn crash(&mut self, damage: CrashDamage) {
        let entries = self.surviving_entries(damage.dir);
        self.live = entries.clone();
        self.durable = entries;
        self.pending.clear();
        let linked: BTreeSet<u64> = self.live.values().copied().collect();
        self.inodes.retain(|id, _| linked.contains(id));
        for inode in self.inodes.values_mut() {
            inode.crash(damage.data, &mut self.rng);
        }
        self.end_epoch();
    }

    /// A process crash: its handles close (an unlinked file it held open goes), nothing else
    /// changes.
    fn crash_process(&mut self) {
        for inode in self.inodes.values_mut() {
            inode.handles = Arc::new(());
        }
        self.sweep();
        self.end_epoch();
    }

    /// Kills every handle and lock of the current epoch, and any halt and armed faults.
    fn end_epoch(&mut self) {
        self.epoch += 1;
        self.locks.clear();
        self.halt_at = None;
        self.faults.clear();
    }

    fn surviving_entries(&mut self, damage: DirDamage) -> BTreeMap<PathBuf, u64> {
        match damage {
            DirDamage::ForgetUnsynced => self.durable.clone(),
            DirDamage::KeepAll => self.live.clone(),
            DirDamage::KeepRandomPrefix => {
                let mut entries = self.durable.clone();
                for ops in self.pending.values() {
                    let kept = usize::try_from(self.rng.below(ops.len() as u64 + 1)).unwrap_or(0);
                    ops[..kept].iter().for_each(|op| op.apply(&mut entries));
                }
                entries
            }
        }
    }
}

/// The directory holding `path`: its parent, or the empty path for a bare name.
fn parent_of(path: &Path) -> &Path {
    path.parent().unwrap_or(Path::new(""))
}

fn to_usize(value: u64) -> io::Result<usize> {
    usize::try_from(value).map_err(|_| io::ErrorKind::FileTooLarge.into())
}

fn eio() -> io::Error {
    io::Error::from_raw_os_error(EIO)
}

/// SplitMix64: small, fast and good enough for choosing damage.
/// The simulator's random numbers.
type Rng = crate::synthetic::SplitMix64;

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "a failed call should fail the test loudly")]
mod tests {
    use super::*;

    const DIR: &str = "/db";

    fn path(name: &str) -> PathBuf {
        Path::new(DIR).join(name)
    }

    fn sim(seed: u64) -> SimStorage {
        let sim = SimStorage::new(seed);
        sim.create_dir_all(Path::new(DIR)).unwrap();
        sim
    }

    fn create(sim: &SimStorage, name: &str) -> Arc<dyn StorageFile> {
        sim.open(&path(name), OpenMode::CreateNew).unwrap()
    }

    fn pattern(len: usize, salt: u8) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8 ^ salt).collect()
    }

    fn damage(data: DataDamage, dir: DirDamage) -> CrashDamage {
        CrashDamage { data, dir }
    }

    const DROP_FORGET: CrashDamage = CrashDamage { data: DataDamage::DropUnsynced, dir: DirDamage::ForgetUnsynced };

    #[test]
    fn synced_data_survives_every_damage() {
        for (seed, damage) in CrashDamage::ALL.into_iter().enumerate() {
            for seed in [seed as u64, seed as u64 + 100] {
                let sim = sim(seed);
                let file = create(&sim, "a");
                let synced = pattern(3000, 1);
                file.write_all_at(&synced, 0).unwrap();
                file.sync_data().unwrap();
                sim.sync_dir(Path::new(DIR)).unwrap();
                file.write_all_at(&pattern(2000, 2), 3000).unwrap();
                file.write_all_at(&pattern(700, 3), 5000).unwrap();
                let other = create(&sim, "b");
                other.write_all_at(b"unsynced", 0).unwrap();
                sim.crash(damage);
                let after = sim.file_bytes(&path("a")).unwrap();
                assert_eq!(after[..3000], synced[..], "{damage:?}");
            }
        }
    }

    #[test]
    fn drop_unsynced_keeps_exactly_the_synced_state() {
        let sim = sim(1);
        let file = create(&sim, "a");
        file.write_all_at(b"hello", 0).unwrap();
        file.sync_data().unwrap();
        sim.sync_dir(Path::new(DIR)).unwrap();
        file.write_all_at(b" world", 5).unwrap();
        file.set_len(3).unwrap();
        assert_eq!(sim.durable_bytes(&path("a")).unwrap(), b"hello");
        sim.crash(damage(DataDamage::DropUnsynced, DirDamage::KeepAll));
        assert_eq!(sim.file_bytes(&path("a")).unwrap(), b"hello");
    }

    #[test]
    fn sync_makes_length_changes_durable() {
        let sim = sim(2);
        let file = create(&sim, "a");
        file.write_all_at(&pattern(100, 0), 0).unwrap();
        file.set_len(40).unwrap();
        file.allocate(60).unwrap();
        file.allocate(10).unwrap();
        file.sync_data().unwrap();
        sim.sync_dir(Path::new(DIR)).unwrap();
        let mut expected = pattern(40, 0);
        expected.resize(60, 0);
        assert_eq!(sim.durable_bytes(&path("a")).unwrap(), expected);
        sim.crash(DROP_FORGET);
        assert_eq!(sim.file_bytes(&path("a")).unwrap(), expected);
    }

    /// Appends writes of awkward sizes to a fresh, durable, empty file and returns the whole
    /// stream with the boundaries between writes.
    fn append_writes(file: &Arc<dyn StorageFile>, base: usize) -> (Vec<u8>, Vec<usize>) {
        let sizes = [100, 700, 1, 512, 1500, 3, 2048, 333];
        let mut stream = Vec::new();
        let mut starts = Vec::new();
        for (i, size) in sizes.into_iter().enumerate() {
            starts.push(base + stream.len());
            let bytes = pattern(size, i as u8 + 7);
            file.write_all_at(&bytes, (base + stream.len()) as u64).unwrap();
            stream.extend(bytes);
        }
        (stream, starts)
    }

    #[test]
    fn torn_prefix_keeps_a_sector_aligned_prefix() {
        let mut lengths = BTreeSet::new();
        for seed in 0..300 {
            let sim = sim(seed);
            let file = create(&sim, "a");
            sim.sync_dir(Path::new(DIR)).unwrap();
            let (stream, starts) = append_writes(&file, 0);
            sim.crash(damage(DataDamage::TornPrefix, DirDamage::ForgetUnsynced));
            let after = sim.file_bytes(&path("a")).unwrap();
            let kept = after.len();
            assert_eq!(after[..], stream[..kept], "seed {seed}");
            let aligned = kept.is_multiple_of(SECTOR);
            assert!(aligned || kept == stream.len() || starts.contains(&kept), "seed {seed}");
            lengths.insert(kept);
        }
        assert!(lengths.len() > 5, "cuts vary: {lengths:?}");
        assert!(lengths.contains(&0));
    }

    #[test]
    fn torn_prefix_applies_set_len_only_before_the_cut() {
        for seed in 0..100 {
            let sim = sim(seed);
            let file = create(&sim, "a");
            sim.sync_dir(Path::new(DIR)).unwrap();
            file.write_all_at(&pattern(1024, 0), 0).unwrap();
            file.set_len(4096).unwrap();
            sim.crash(damage(DataDamage::TornPrefix, DirDamage::KeepAll));
            let after = sim.file_bytes(&path("a")).unwrap();
            assert!([0, 512, 4096].contains(&after.len()), "seed {seed}: {}", after.len());
            assert_eq!(after[..after.len().min(1024)], pattern(1024, 0)[..after.len().min(1024)]);
        }
    }

    #[test]
    fn garbage_appears_only_after_the_kept_prefix() {
        let synced = pattern(1000, 99);
        let mut saw_garbage = false;
        for seed in 0..300 {
            let sim = sim(seed);
            let file = create(&sim, "a");
            file.write_all_at(&synced, 0).unwrap();
            file.sync_data().unwrap();
            sim.sync_dir(Path::new(DIR)).unwrap();
            let (stream, starts) = append_writes(&file, 1000);
            let mut expected = synced.clone();
            expected.extend(&stream);
            sim.crash(damage(DataDamage::TornPrefixWithGarbage, DirDamage::ForgetUnsynced));
            let after = sim.file_bytes(&path("a")).unwrap();
            assert_eq!(after[..1000], synced[..], "seed {seed}");
            let common = after.iter().zip(&expected).take_while(|(a, b)| a == b).count();
            let valid =
                |b: usize| b >= 1000 && (b.is_multiple_of(SECTOR) || starts.contains(&b) || b == expected.len());
            let kept = (1000..=common).rev().find(|&b| valid(b)).unwrap();
            assert!(after.len() > kept && after.len() <= kept + 1024, "seed {seed}");
            saw_garbage |= after[..] != expected[..after.len().min(expected.len())];
        }
        assert!(saw_garbage);
    }

    #[test]
    fn garbage_never_overwrites_synced_bytes_outside_the_torn_write() {
        let synced = pattern(4096, 5);
        for seed in 0..200 {
            let sim = sim(seed);
            let file = create(&sim, "a");
            file.write_all_at(&synced, 0).unwrap();
            file.sync_data().unwrap();
            sim.sync_dir(Path::new(DIR)).unwrap();
            file.write_all_at(&[0xFF; 100], 0).unwrap();
            sim.crash(damage(DataDamage::TornPrefixWithGarbage, DirDamage::KeepAll));
            let after = sim.file_bytes(&path("a")).unwrap();
            assert_eq!(after.len(), 4096);
            assert_eq!(after[100..], synced[100..], "seed {seed}");
        }
    }

    #[test]
    fn unsynced_create_is_forgotten_until_sync_dir() {
        let sim = sim(3);
        let file = create(&sim, "a");
        file.write_all_at(b"data", 0).unwrap();
        file.sync_data().unwrap();
        sim.crash(DROP_FORGET);
        assert_eq!(sim.file_names(Path::new(DIR)), Vec::<String>::new());
        let file = create(&sim, "a");
        file.write_all_at(b"data", 0).unwrap();
        file.sync_data().unwrap();
        sim.sync_dir(Path::new(DIR)).unwrap();
        sim.crash(DROP_FORGET);
        assert_eq!(sim.list_dir(Path::new(DIR)).unwrap(), ["a"]);
        assert_eq!(sim.file_bytes(&path("a")).unwrap(), b"data");
    }

    #[test]
    fn keep_all_keeps_unsynced_entries() {
        let sim = sim(4);
        create(&sim, "b");
        create(&sim, "a");
        sim.crash(damage(DataDamage::DropUnsynced, DirDamage::KeepAll));
        assert_eq!(sim.file_names(Path::new(DIR)), ["a", "b"]);
    }

    #[test]
    fn unsynced_rename_reverts() {
        let sim = sim(5);
        let old = create(&sim, "a");
        old.write_all_at(b"old", 0).unwrap();
        old.sync_data().unwrap();
        let tmp = create(&sim, "a.tmp");
        tmp.write_all_at(b"new", 0).unwrap();
        tmp.sync_data().unwrap();
        sim.sync_dir(Path::new(DIR)).unwrap();
        sim.rename(&path("a.tmp"), &path("a")).unwrap();
        assert_eq!(sim.file_names(Path::new(DIR)), ["a"]);
        assert_eq!(sim.file_bytes(&path("a")).unwrap(), b"new");
        assert_eq!(old.len().unwrap(), 3, "the renamed-over file's handle still works");
        sim.crash(DROP_FORGET);
        assert_eq!(sim.file_names(Path::new(DIR)), ["a", "a.tmp"]);
        assert_eq!(sim.file_bytes(&path("a")).unwrap(), b"old");
    }

    #[test]
    fn synced_rename_survives() {
        let sim = sim(6);
        create(&sim, "a.tmp").write_all_at(b"new", 0).unwrap();
        sim.rename(&path("a.tmp"), &path("a")).unwrap();
        sim.sync_dir(Path::new(DIR)).unwrap();
        sim.crash(damage(DataDamage::DropUnsynced, DirDamage::ForgetUnsynced));
        assert_eq!(sim.file_names(Path::new(DIR)), ["a"]);
        assert_eq!(sim.file_bytes(&path("a")).unwrap(), b"", "the data was never synced");
    }

    #[test]
    fn removed_file_comes_back() {
        let sim = sim(7);
        let file = create(&sim, "a");
        file.write_all_at(b"keep", 0).unwrap();
        file.sync_data().unwrap();
        sim.sync_dir(Path::new(DIR)).unwrap();
        drop(file);
        sim.remove_file(&path("a")).unwrap();
        assert!(sim.file_bytes(&path("a")).is_none());
        let error = sim.remove_file(&path("a")).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::NotFound);
        sim.crash(DROP_FORGET);
        assert_eq!(sim.file_bytes(&path("a")).unwrap(), b"keep");
        sim.remove_file(&path("a")).unwrap();
        sim.sync_dir(Path::new(DIR)).unwrap();
        sim.crash(DROP_FORGET);
        assert!(sim.file_names(Path::new(DIR)).is_empty());
    }

    #[test]
    fn keep_random_prefix_keeps_a_prefix_of_each_directory() {
        let mut seen = BTreeSet::new();
        for seed in 0..100 {
            let sim = sim(seed);
            for name in ["a", "b", "c"] {
                create(&sim, name);
            }
            sim.crash(damage(DataDamage::DropUnsynced, DirDamage::KeepRandomPrefix));
            let names = sim.file_names(Path::new(DIR));
            assert_eq!(names, ["a", "b", "c"][..names.len()], "seed {seed}");
            seen.insert(names.len());
        }
        assert_eq!(seen, BTreeSet::from([0, 1, 2, 3]));
    }

    #[test]
    fn open_modes() {
        let sim = sim(8);
        let error = sim.open(&path("a"), OpenMode::ReadWrite).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::NotFound);
        let error = sim.open(Path::new("/nodir/a"), OpenMode::CreateNew).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::NotFound);
        create(&sim, "a").write_all_at(b"abc", 0).unwrap();
        let error = sim.open(&path("a"), OpenMode::CreateNew).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::AlreadyExists);
        let reader = sim.open(&path("a"), OpenMode::ReadOnly).unwrap();
        let mut buf = [0; 2];
        reader.read_exact_at(&mut buf, 1).unwrap();
        assert_eq!(&buf, b"bc");
        let error = reader.read_exact_at(&mut buf, 2).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
        for error in [
            reader.write_all_at(b"x", 0).unwrap_err(),
            reader.set_len(0).unwrap_err(),
            reader.allocate(10).unwrap_err(),
        ] {
            assert_eq!(error.kind(), io::ErrorKind::PermissionDenied);
        }
        assert_eq!(&*reader.view().unwrap(), b"abc");
        let writer = sim.open(&path("a"), OpenMode::ReadWrite).unwrap();
        writer.write_all_at(b"z", 5).unwrap();
        assert_eq!(reader.len().unwrap(), 6);
        assert_eq!(sim.file_bytes(&path("a")).unwrap(), b"abc\0\0z");
    }

    #[test]
    fn locks_conflict_and_release() {
        let sim = sim(9);
        let dir = Path::new(DIR);
        let lock = sim.lock_dir(dir).unwrap();
        assert_eq!(sim.lock_dir(dir).unwrap_err().kind(), io::ErrorKind::WouldBlock);
        drop(lock);
        let stale = sim.lock_dir(dir).unwrap();
        sim.crash(DROP_FORGET);
        let fresh = sim.lock_dir(dir).unwrap();
        drop(stale);
        assert_eq!(sim.lock_dir(dir).unwrap_err().kind(), io::ErrorKind::WouldBlock);
        drop(fresh);
        sim.lock_dir(dir).unwrap();
    }

    #[test]
    fn faults_fire_on_the_nth_matching_call() {
        let sim = sim(10);
        let file = create(&sim, "a");
        sim.inject(Fault { op: Some(Op::SyncData), nth: 3, kind: FaultKind::Eio });
        sim.inject(Fault { op: Some(Op::Len), nth: 1, kind: FaultKind::NoSpace });
        file.sync_data().unwrap();
        assert_eq!(file.len().unwrap_err().kind(), io::ErrorKind::StorageFull);
        file.len().unwrap();
        file.sync_data().unwrap();
        file.write_all_at(b"lost", 0).unwrap();
        let error = file.sync_data().unwrap_err();
        assert_eq!(error.raw_os_error(), Some(EIO));
        file.sync_data().unwrap();
        assert_eq!(sim.durable_bytes(&path("a")).unwrap(), b"lost");
    }

    #[test]
    fn any_op_fault_counts_every_call() {
        let sim = sim(11);
        sim.inject(Fault { op: None, nth: 2, kind: FaultKind::Eio });
        sim.create_dir_all(Path::new("/x")).unwrap();
        assert!(sim.list_dir(Path::new("/x")).is_err());
        sim.list_dir(Path::new("/x")).unwrap();
    }

    #[test]
    fn failed_sync_leaves_data_unsynced() {
        let sim = sim(12);
        let file = create(&sim, "a");
        sim.sync_dir(Path::new(DIR)).unwrap();
        file.write_all_at(b"data", 0).unwrap();
        sim.inject(Fault { op: Some(Op::SyncData), nth: 1, kind: FaultKind::Eio });
        file.sync_data().unwrap_err();
        sim.crash(DROP_FORGET);
        assert_eq!(sim.file_bytes(&path("a")).unwrap(), b"");
    }

    #[test]
    fn failed_write_leaves_a_strict_prefix() {
        let mut lengths = BTreeSet::new();
        for seed in 0..50 {
            let sim = sim(seed);
            let file = create(&sim, "a");
            sim.inject(Fault { op: Some(Op::Write), nth: 1, kind: FaultKind::NoSpace });
            let bytes = pattern(100, 3);
            let error = file.write_all_at(&bytes, 10).unwrap_err();
            assert_eq!(error.kind(), io::ErrorKind::StorageFull);
            let after = sim.file_bytes(&path("a")).unwrap();
            if !after.is_empty() {
                assert!(after.len() < 110);
                assert_eq!(after[..10], [0; 10]);
                assert_eq!(after[10..], bytes[..after.len() - 10]);
            }
            lengths.insert(after.len());
            sim.crash(DROP_FORGET);
            assert!(sim.file_names(Path::new(DIR)).is_empty());
        }
        assert!(lengths.len() > 10);
    }

    #[test]
    fn halt_after_stops_everything_until_crash() {
        let sim = sim(13);
        let file = create(&sim, "a");
        sim.halt_after(2);
        file.write_all_at(b"one", 0).unwrap();
        file.sync_data().unwrap();
        let before = sim.op_count();
        let error = file.write_all_at(b"two", 3).unwrap_err();
        assert_eq!(error.raw_os_error(), Some(EIO));
        assert!(sim.open(&path("b"), OpenMode::CreateNew).is_err());
        assert!(sim.list_dir(Path::new(DIR)).is_err());
        assert_eq!(sim.op_count(), before + 3);
        assert_eq!(sim.file_bytes(&path("a")).unwrap(), b"one");
        assert_eq!(sim.file_names(Path::new(DIR)), ["a"]);
        sim.crash(damage(DataDamage::DropUnsynced, DirDamage::KeepAll));
        assert_eq!(sim.list_dir(Path::new(DIR)).unwrap(), ["a"]);
    }

    #[test]
    fn a_dead_process_reaches_the_disk_no_more() {
        let sim = sim(15);
        let process = sim.process();
        let file = create(&process, "a");
        file.write_all_at(b"one", 0).unwrap();
        file.sync_data().unwrap();
        sim.crash(damage(DataDamage::DropUnsynced, DirDamage::KeepAll));
        // Every call of the dead process fails, and none changes the disk.
        assert_eq!(process.open(&path("b"), OpenMode::CreateNew).unwrap_err().raw_os_error(), Some(EIO));
        assert!(process.remove_file(&path("a")).is_err());
        assert!(process.rename(&path("a"), &path("c")).is_err());
        assert!(process.list_dir(Path::new(DIR)).is_err());
        assert!(file.write_all_at(b"two", 0).is_err());
        assert_eq!(sim.file_names(Path::new(DIR)), ["a"]);
        assert_eq!(sim.file_bytes(&path("a")).unwrap(), b"one");
        // The next process, and the disk's own handle, go on.
        let next = sim.process();
        create(&next, "b");
        assert_eq!(sim.list_dir(Path::new(DIR)).unwrap(), ["a", "b"]);
    }

    #[test]
    fn a_process_crash_keeps_unsynced_state_for_a_later_power_loss() {
        let sim = sim(20);
        let process = sim.process();
        let synced = create(&process, "synced");
        synced.write_all_at(b"durable", 0).unwrap();
        synced.sync_data().unwrap();
        process.sync_dir(Path::new(DIR)).unwrap();
        synced.write_all_at(b" cached", 7).unwrap();
        let renamed = create(&process, "a.tmp");
        renamed.write_all_at(b"data", 0).unwrap();
        renamed.sync_data().unwrap();
        process.rename(&path("a.tmp"), &path("a")).unwrap();
        let _lock = process.lock_dir(Path::new(DIR)).unwrap();
        sim.crash_process();
        // The dead process reaches the disk no more; the next one sees the page cache.
        assert_eq!(synced.write_all_at(b"x", 0).unwrap_err().raw_os_error(), Some(EIO));
        assert_eq!(process.list_dir(Path::new(DIR)).unwrap_err().raw_os_error(), Some(EIO));
        let next = sim.process();
        assert_eq!(next.list_dir(Path::new(DIR)).unwrap(), ["a", "synced"]);
        assert_eq!(sim.file_bytes(&path("synced")).unwrap(), b"durable cached");
        assert_eq!(sim.durable_bytes(&path("synced")).unwrap(), b"durable", "still unsynced");
        drop(next.lock_dir(Path::new(DIR)).unwrap());
        // A power loss later drops what no process synced: the rename and the cached bytes.
        sim.crash(DROP_FORGET);
        assert_eq!(sim.file_names(Path::new(DIR)), ["synced"]);
        assert_eq!(sim.file_bytes(&path("synced")).unwrap(), b"durable");
    }

    #[test]
    fn a_directory_synced_after_a_process_crash_keeps_the_dead_process_entries() {
        let sim = sim(21);
        let process = sim.process();
        let file = create(&process, "a");
        file.write_all_at(b"data", 0).unwrap();
        file.sync_data().unwrap();
        sim.crash_process();
        let next = sim.process();
        next.sync_dir(Path::new(DIR)).unwrap();
        sim.crash(DROP_FORGET);
        assert_eq!(sim.file_bytes(&path("a")).unwrap(), b"data");
    }

    #[test]
    fn a_process_crash_frees_an_unlinked_file_only_it_held_open() {
        let sim = sim(22);
        sim.set_capacity(Some(100));
        let process = sim.process();
        let file = create(&process, "a");
        file.write_all_at(&[1; 100], 0).unwrap();
        process.remove_file(&path("a")).unwrap();
        sim.crash_process();
        assert_eq!(sim.used_bytes(), 0);
        create(&sim, "b").write_all_at(&[2; 100], 0).unwrap();
    }

    #[test]
    fn capacity_gives_storage_full() {
        let sim = sim(14);
        sim.set_capacity(Some(1000));
        let file = create(&sim, "a");
        file.write_all_at(&[1; 600], 0).unwrap();
        let other = create(&sim, "b");
        let error = other.write_all_at(&[2; 500], 0).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::StorageFull);
        assert_eq!(other.len().unwrap(), 0);
        assert_eq!(other.set_len(401).unwrap_err().kind(), io::ErrorKind::StorageFull);
        other.allocate(400).unwrap();
        other.write_all_at(&[3; 400], 0).unwrap();
        file.write_all_at(&[4; 600], 0).unwrap();
        assert_eq!(file.write_all_at(&[4], 600).unwrap_err().kind(), io::ErrorKind::StorageFull);
        file.set_len(100).unwrap();
        file.write_all_at(&[5; 500], 100).unwrap();
        drop(other);
        sim.remove_file(&path("b")).unwrap();
        file.allocate(1000).unwrap();
        sim.set_capacity(None);
        file.allocate(1 << 20).unwrap();
    }

    #[test]
    fn open_unlinked_file_keeps_its_space_and_data() {
        let sim = sim(15);
        sim.set_capacity(Some(100));
        let file = create(&sim, "a");
        file.write_all_at(&[1; 100], 0).unwrap();
        sim.remove_file(&path("a")).unwrap();
        let other = create(&sim, "b");
        assert_eq!(other.write_all_at(&[2], 0).unwrap_err().kind(), io::ErrorKind::StorageFull);
        assert_eq!(file.view().unwrap().len(), 100);
        drop(file);
        other.write_all_at(&[2; 100], 0).unwrap();
    }

    #[test]
    fn old_handles_fail_after_crash() {
        let sim = sim(16);
        let file = create(&sim, "a");
        file.sync_data().unwrap();
        sim.sync_dir(Path::new(DIR)).unwrap();
        sim.crash(DROP_FORGET);
        let mut buf = [0; 1];
        let errors = [
            file.len().unwrap_err(),
            file.write_all_at(b"x", 0).unwrap_err(),
            file.read_exact_at(&mut buf, 0).unwrap_err(),
            file.sync_data().unwrap_err(),
            file.view().unwrap_err(),
        ];
        for error in errors {
            assert_eq!(error.raw_os_error(), Some(EIO));
        }
        let file = sim.open(&path("a"), OpenMode::ReadWrite).unwrap();
        assert_eq!(file.len().unwrap(), 0);
    }

    #[test]
    fn op_count_counts_every_call() {
        let sim = SimStorage::new(17);
        sim.create_dir_all(Path::new(DIR)).unwrap();
        let file = create(&sim, "a");
        file.len().unwrap();
        let _ = sim.remove_file(&path("missing"));
        sim.file_bytes(&path("a"));
        assert_eq!(sim.op_count(), 4);
    }

    #[test]
    fn overwrite_changes_live_and_durable_bytes() {
        let sim = sim(18);
        let file = create(&sim, "a");
        file.write_all_at(b"abcdef", 0).unwrap();
        file.sync_data().unwrap();
        sim.sync_dir(Path::new(DIR)).unwrap();
        file.write_all_at(b"gh", 6).unwrap();
        sim.overwrite(&path("a"), 4, b"XYZ");
        assert_eq!(sim.file_bytes(&path("a")).unwrap(), b"abcdXYZh");
        assert_eq!(sim.durable_bytes(&path("a")).unwrap(), b"abcdXY");
        file.sync_data().unwrap();
        assert_eq!(sim.durable_bytes(&path("a")).unwrap(), b"abcdXYZh");
    }

    fn scenario(seed: u64, damage: CrashDamage) -> Vec<(String, Vec<u8>)> {
        let sim = sim(seed);
        for name in ["a", "b"] {
            let file = create(&sim, name);
            file.write_all_at(&pattern(3000, 1), 0).unwrap();
            file.write_all_at(&pattern(3000, 2), 3000).unwrap();
        }
        sim.crash(damage);
        let names = sim.file_names(Path::new(DIR));
        names.into_iter().map(|name| (name.clone(), sim.file_bytes(&path(&name)).unwrap())).collect()
    }

    #[test]
    fn same_seed_same_damage() {
        for damage in CrashDamage::ALL {
            assert_eq!(scenario(42, damage), scenario(42, damage));
        }
        let garbage = damage(DataDamage::TornPrefixWithGarbage, DirDamage::KeepRandomPrefix);
        let outcomes: BTreeSet<_> = (0..20).map(|seed| scenario(seed, garbage)).collect();
        assert!(outcomes.len() > 1);
    }

    #[test]
    fn rename_and_directory_errors() {
        let sim = sim(19);
        let error = sim.rename(&path("x"), &path("y")).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::NotFound);
        assert_eq!(sim.list_dir(Path::new("/nope")).unwrap_err().kind(), io::ErrorKind::NotFound);
        assert_eq!(sim.sync_dir(Path::new("/nope")).unwrap_err().kind(), io::ErrorKind::NotFound);
        sim.create_dir_all(&path("sub/deeper")).unwrap();
        create(&sim, "sub/f");
        assert!(sim.file_names(Path::new(DIR)).is_empty());
        assert_eq!(sim.file_names(&path("sub")), ["f"]);
    }
}
