//! The store's policies: when snapshots are written, what retention keeps, and when
//! compaction rewrites a segment.

use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::log::FrameCompression;
use crate::store::types::AtomId;

/// When a full snapshot of an agent's context is written: after `every_atoms` completed atoms
/// of the agent, or `every` of wall time since its last snapshot, whichever comes first
/// (checked when an atom completes). Defaults: 50 atoms, 10 minutes. The store's background
/// thread writes them, at most one per agent per second: an agent completing atoms faster than
/// that has its due snapshots coalesced to its newest atom (see `docs/ARCHITECTURE.md`,
/// "Snapshot policy"); a clean close writes every one still due. A store opened with
/// `background(false)` has the completing thread write each as it falls due instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotPolicy {
    /// Completed atoms of an agent between snapshots; 0 turns the count off.
    pub every_atoms: u32,
    /// Wall time between snapshots of an agent; zero turns the clock off.
    pub every: Duration,
}

impl SnapshotPolicy {
    /// No policy snapshots at all (explicit [`Store::snapshot_now`](crate::Store::snapshot_now)
    /// still works).
    pub const NEVER: SnapshotPolicy = SnapshotPolicy { every_atoms: 0, every: Duration::ZERO };

    /// Whether an agent with `atoms` completions over `elapsed` since its last snapshot is due.
    pub fn is_due(&self, atoms: u32, elapsed: Duration) -> bool {
        (self.every_atoms > 0 && atoms >= self.every_atoms) || (!self.every.is_zero() && elapsed >= self.every)
    }
}

impl Default for SnapshotPolicy {
    fn default() -> Self {
        Self { every_atoms: 50, every: Duration::from_secs(10 * 60) }
    }
}

/// What retention keeps. History older than the oldest kept snapshot of an agent becomes
/// reclaimable unless something still needs it (see `docs/ARCHITECTURE.md`, "Retention and
/// compaction").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetentionPolicy {
    /// Snapshots kept per agent, newest first (default 5, at least 1); snapshots of atoms a
    /// rollback abandoned and of pinned atoms do not count. Applied by each compaction round:
    /// a snapshot written between rounds stays until the next one.
    pub snapshots_per_agent: usize,
    /// Finished runs older than this (since they finished) are dropped entirely by the next
    /// compaction. `None` (the default) keeps them forever.
    pub finished_run_age: Option<Duration>,
}

impl Default for RetentionPolicy {
    fn default() -> Self {
        Self { snapshots_per_agent: 5, finished_run_age: None }
    }
}

/// When compaction rewrites a sealed segment, and how often it runs in the background.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CompactionPolicy {
    /// A sealed segment whose live fraction (live bytes / bytes) falls below this is rewritten
    /// (default 0.7, which bounds the space of sealed segments to about 1.43× their live data).
    pub live_fraction_min: f64,
    /// How often the background thread runs compaction; `None` leaves it to
    /// [`Store::compact`](crate::Store::compact). Default: every 60 s.
    pub interval: Option<Duration>,
    /// Cold compression: every sealed segment not yet compressed is rewritten with its records
    /// stored plain and compressed together, in frames of `frame_bytes` at zstd `level`
    /// (`docs/FORMAT.md` §5a; far smaller than records compressed one by one, at a CPU cost
    /// paid once, on the background thread). `None` turns it off. Default:
    /// [`CompactionPolicy::COLD_COMPRESSION`].
    pub cold_compression: Option<FrameCompression>,
}

impl CompactionPolicy {
    /// The default cold compression: zstd level 17 in frames of 512 KiB (`docs/BENCHMARKS.md`
    /// §6 has the measurements behind the choice).
    pub const COLD_COMPRESSION: FrameCompression = FrameCompression { level: 17, frame_bytes: 512 * 1024 };
}

impl Default for CompactionPolicy {
    fn default() -> Self {
        Self {
            live_fraction_min: 0.7,
            interval: Some(Duration::from_secs(60)),
            cold_compression: Some(Self::COLD_COMPRESSION),
        }
    }
}

/// The policies of a store.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Policies {
    pub snapshot: SnapshotPolicy,
    pub retention: RetentionPolicy,
    pub compaction: CompactionPolicy,
    /// Records a fold must cover beyond the newest index snapshot before the store writes
    /// another on its own (at open, at close, on the background thread).
    pub index_snapshot_after: u64,
    /// The smallest record body compressed as it is appended.
    pub compress_records_from: usize,
    /// The ballast's size (`store::ballast`); 0: none.
    pub ballast_bytes: u64,
    /// How durable an atom's end record (completion or failure) is when its call returns.
    pub atom_durability: crate::Durability,
}

impl Default for Policies {
    fn default() -> Self {
        Self {
            snapshot: SnapshotPolicy::default(),
            retention: RetentionPolicy::default(),
            compaction: CompactionPolicy::default(),
            index_snapshot_after: crate::store::index_snapshot::MIN_NEW_RECORDS,
            compress_records_from: crate::limits::COMPRESSION_MIN_BYTES,
            ballast_bytes: 0,
            atom_durability: crate::Durability::Sync,
        }
    }
}

impl Policies {
    pub fn validate(&self) -> Result<()> {
        if self.retention.snapshots_per_agent == 0 {
            return Err(Error::InvalidConfig { reason: "retention must keep at least one snapshot per agent".into() });
        }
        let fraction = self.compaction.live_fraction_min;
        if !(0.0..=1.0).contains(&fraction) {
            return Err(Error::InvalidConfig { reason: format!("live_fraction_min {fraction} is not in 0..=1") });
        }
        if self.index_snapshot_after == 0 {
            return Err(Error::InvalidConfig { reason: "index_snapshot_after must be at least 1 record".into() });
        }
        if self.compaction.interval.is_some_and(|interval| interval.is_zero()) {
            return Err(Error::InvalidConfig { reason: "the compaction interval must not be zero".into() });
        }
        if let Some(compression) = &self.compaction.cold_compression {
            compression.validate()?;
        }
        Ok(())
    }
}

/// One agent's progress towards its next policy snapshot.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SnapshotClock {
    pub atoms: u32,
    pub since: Instant,
    /// The agent's newest completed atom counted since the last snapshot.
    pub last: Option<AtomId>,
    /// The `every_atoms` of the policy its run follows (the store's, or the run's own).
    pub every_atoms: u32,
}

impl SnapshotClock {
    pub fn new(every_atoms: u32) -> Self {
        Self { atoms: 0, since: Instant::now(), last: None, every_atoms }
    }

    /// Whether it has counted at least half of its policy's atoms.
    pub fn half_way(&self) -> bool {
        self.every_atoms > 0 && self.atoms.saturating_mul(2) >= self.every_atoms
    }
}

/// Every agent's [`SnapshotClock`], and the agents whose count reached half way since the
/// background thread last looked (so that it looks at those, not at every agent's clock).
#[derive(Debug, Default)]
pub(crate) struct SnapshotClocks {
    pub clocks: std::collections::HashMap<u32, SnapshotClock>,
    pub half_way: Vec<u32>,
}

/// Milliseconds of `duration`, saturating.
pub(crate) fn duration_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
