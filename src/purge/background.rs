//! The store's background thread: writes policy snapshots, trains the compression dictionary
//! and runs compaction on a timer, off the agents' threads. It holds only a weak reference to
//! the store while idle, so dropping the store stops it.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::store::types::AtomId;
use crate::store::{Shared, Store};

/// Jobs waiting for the thread; more are dropped rather than blocking an agent (snapshot
/// requests are never lost that way: they wait in [`DueSnapshots`], one per agent).
const JOB_QUEUE_MAX: usize = 1024;
/// How long the thread sleeps when no compaction interval is set.
const IDLE_WAIT: Duration = Duration::from_secs(3600);

/// Policy snapshots due and not yet written: the newest due atom of each agent (by agent
/// number). Bounded by the number of agents, so a burst coalesces instead of queueing.
type DueSnapshots = Arc<Mutex<BTreeMap<u32, AtomId>>>;

/// The shortest time between two policy snapshots of one agent while the store is open: a
/// snapshot that falls due sooner waits (coalesced with later ones) until this long after the
/// agent's previous one. A snapshot rewrites the agent's whole context; an agent bursting
/// thousands of atoms a second would otherwise have it rewritten many times a second (for the
/// 410 KB contexts of the peers suite's agents, 40 MB/s of snapshots for 2.5 MB/s of deltas), while a
/// crash costs at most this much of its atoms' replay more. At an agent's usual pace (seconds
/// per atom) the policy's count is reached far less often, and this never applies.
const AGENT_SNAPSHOT_INTERVAL_MIN: Duration = Duration::from_secs(1);

/// Work for the thread.
pub(crate) enum Job {
    /// Run a compaction round now.
    Compact,
    /// Wake up: to train a dictionary and write the due snapshots (every wake-up does), or
    /// to notice `stopping`.
    Wake,
}

/// The handle that owns the thread; dropping it stops and joins the thread.
pub(crate) struct Worker {
    shared: Weak<Shared>,
    sender: SyncSender<Job>,
    due: DueSnapshots,
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    /// Starts the thread for `shared`.
    pub fn start(shared: &Arc<Shared>) -> Result<Self> {
        let (sender, receiver) = std::sync::mpsc::sync_channel(JOB_QUEUE_MAX);
        let stopping = Arc::new(AtomicBool::new(false));
        let weak = Arc::downgrade(shared);
        let interval = shared.policies.compaction.interval;
        let flag = Arc::clone(&stopping);
        let due = DueSnapshots::default();
        let thread_due = Arc::clone(&due);
        let thread = std::thread::Builder::new()
            .name("continuum-background".into())
            .spawn(move || {
                lower_priority();
                run(&weak, &receiver, &thread_due, &flag, interval);
            })
            .map_err(|e| Error::io("spawn the background thread", std::path::PathBuf::new(), e))?;
        Ok(Self { shared: Arc::downgrade(shared), sender, due, stopping, thread: Some(thread) })
    }

    /// Asks for a policy snapshot of `atom`, the newest due atom of `agent`: it replaces an
    /// older request of the same agent not yet written, and the thread is woken only if the
    /// agent had none waiting.
    pub fn request_snapshot(&self, agent: u32, atom: AtomId) {
        let mut due = self.due.lock();
        let fresh = !due.contains_key(&agent);
        let slot = due.entry(agent).or_insert(atom);
        *slot = (*slot).max(atom);
        drop(due);
        // An agent already waiting (to be taken, or for its interval) has the thread's
        // attention: a timer wakes it for the deferred ones.
        if fresh {
            self.wake();
        }
    }

    /// Wakes the thread to take what waits for it (due snapshots, a dictionary to train).
    pub fn wake(&self) {
        // A full queue means the thread has jobs to wake it, and every wake-up takes both.
        let _ = self.request(Job::Wake);
    }

    /// Queues `job`; returns `false` if the queue is full (the job is dropped).
    pub fn request(&self, job: Job) -> bool {
        match self.sender.try_send(job) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::Release);
        if let Some(shared) = self.shared.upgrade() {
            shared.closing.store(true, Ordering::Release);
        }
        // Wake the thread if it sleeps; a full queue means it is awake and will see the flag.
        let _ = self.sender.try_send(Job::Wake);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Lowers this thread's scheduling priority (nice 10), so that agents' threads get the CPU
/// first when snapshots and compaction compete with them. Best effort: a failure changes
/// nothing else.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        let _ = rustix::process::setpriority_process(Some(rustix::thread::gettid()), 10);
    }
}

fn run(
    shared: &Weak<Shared>,
    jobs: &Receiver<Job>,
    due: &DueSnapshots,
    stopping: &AtomicBool,
    interval: Option<Duration>,
) {
    let mut next_compaction = interval.map(|every| Instant::now() + every);
    let mut recent = RecentSnapshots::default();
    let mut next_deferred: Option<Instant> = None;
    loop {
        let compaction_at = next_compaction.unwrap_or_else(|| Instant::now() + IDLE_WAIT);
        let wake_at = next_deferred.map_or(compaction_at, |at| at.min(compaction_at));
        let job = jobs.recv_timeout(wake_at.saturating_duration_since(Instant::now()));
        let Some(shared) = shared.upgrade() else { return };
        let store = Store::view(shared);
        if stopping.load(Ordering::Acquire) {
            // A clean close writes the snapshots still due (one per agent at most), so that
            // the next open resumes every agent from a recent one.
            store.train_pending_dictionary();
            write_snapshots(&store, take_due(due), Pace::Closing, &mut recent);
            return;
        }
        let compaction_due = match job {
            Ok(Job::Wake) => false,
            Ok(Job::Compact) => true,
            // A timeout may be a deferred snapshot's: compaction keeps its own time.
            Err(RecvTimeoutError::Timeout) => Instant::now() >= compaction_at,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        if compaction_due {
            match store.compact() {
                Ok(report) => tracing::debug!(?report, "background compaction"),
                Err(error) => {
                    store.shared.log.metrics_handle().record_maintenance_failure();
                    tracing::warn!(%error, "background compaction failed");
                }
            }
            index_snapshot_if_due(&store);
            next_compaction = interval.map(|every| Instant::now() + every);
        }
        // Every wake-up takes the dictionary to train and the due snapshots, whatever job woke
        // it: a request whose own wake-up found the queue full is not left waiting.
        let work = store.shared.log.own_background_work();
        store.train_pending_dictionary();
        drop(work);
        let (mut ready, deferred_until) = take_ready(due, &mut recent, Instant::now());
        next_deferred = deferred_until;
        if !ready.is_empty() {
            take_newer(due, &mut ready);
            // The agents half way to their next snapshot join this round (see
            // `Store::take_half_due`), except those written within the interval.
            let half_due = store.take_half_due(|agent| {
                recent.written.contains_key(&agent) || ready.iter().any(|(taken, _)| *taken == agent)
            });
            // A request of theirs still waiting is for an older atom than this one's.
            let mut waiting = due.lock();
            for (agent, atom) in &half_due {
                if waiting.get(agent).is_some_and(|older| older <= atom) {
                    waiting.remove(agent);
                }
            }
            drop(waiting);
            ready.extend(half_due);
        }
        write_snapshots(&store, ready, Pace::Yielding(stopping), &mut recent);
    }
}

/// Writes an index snapshot when the records after the newest one (all of them, if
/// compaction deleted it) are at least `index_snapshot_after` and a quarter of those
/// it covers: a crash then costs an open at most that many records' fold, and rewriting the
/// index snapshot stays proportional to the records appended.
fn index_snapshot_if_due(store: &Store) {
    let (after, covered) = store.index_snapshot_lag();
    if after >= store.shared.policies.index_snapshot_after.max(covered / 4)
        && let Err(error) = store.write_index_snapshot()
    {
        store.shared.log.metrics_handle().record_maintenance_failure();
        tracing::warn!(%error, "background index snapshot failed");
    }
}

/// How the background thread paces policy snapshots.
#[derive(Clone, Copy)]
enum Pace<'a> {
    /// After each snapshot, sleep [`SNAPSHOT_YIELD_FACTOR`] times as long as it took, until
    /// the flag says the store is closing.
    Yielding(&'a AtomicBool),
    /// The store is closing: write what is due at once.
    Closing,
}

/// Policy snapshots take at most 1 / (1 + this) of the background thread's time: after each,
/// the thread sleeps this many times as long as the snapshot took. A large agent's snapshot
/// rebuilds, encodes and compresses its whole context (hundreds of KB, milliseconds); under a
/// sustained burst of atoms, snapshotting as often as the policy asks would take a whole core
/// from the appending threads. Requests that arrive meanwhile are coalesced to the newest atom
/// of each agent, so snapshots then come less often than the policy asks, never in a backlog.
const SNAPSHOT_YIELD_FACTOR: u32 = 3;

/// Policy snapshots written together, their rebuilds sharing one read of the log where their
/// agents' records interleave (`Store::policy_snapshots`); the pause after them is paced on
/// their time together.
const SNAPSHOTS_TOGETHER_MAX: usize = 32;

/// Writes the policy snapshots of `due` (agent, atom) and notes when each agent's began; a
/// failure is logged and the others are still written.
fn write_snapshots(store: &Store, due: Vec<(u32, AtomId)>, pace: Pace, recent: &mut RecentSnapshots) {
    for chunk in due.chunks(SNAPSHOTS_TOGETHER_MAX) {
        let started = Instant::now();
        let atoms: Vec<AtomId> = chunk
            .iter()
            .map(|(agent, atom)| {
                recent.written.insert(*agent, started);
                *atom
            })
            .collect();
        let work = store.shared.log.own_background_work();
        let written = store.policy_snapshots(&atoms);
        drop(work);
        for (atom, result) in atoms.iter().zip(written) {
            if let Err(error) = result {
                store.policy_snapshot_failed(*atom, &error);
            }
        }
        std::thread::sleep(pause_after(started.elapsed(), pace));
    }
}

/// When the thread last began a policy snapshot of each agent, for the agents snapshotted
/// within the last [`AGENT_SNAPSHOT_INTERVAL_MIN`] (older entries are dropped as it goes).
#[derive(Default)]
struct RecentSnapshots {
    written: HashMap<u32, Instant>,
}

/// How long the background thread sleeps after a policy snapshot that took `took`.
fn pause_after(took: Duration, pace: Pace<'_>) -> Duration {
    match pace {
        Pace::Yielding(stopping) if !stopping.load(Ordering::Acquire) => took.saturating_mul(SNAPSHOT_YIELD_FACTOR),
        Pace::Yielding(_) | Pace::Closing => Duration::ZERO,
    }
}

/// Moves the requests that came for the agents of `ready` while the thread waited into it: each
/// agent's snapshot is then of its newest due atom.
fn take_newer(due: &DueSnapshots, ready: &mut [(u32, AtomId)]) {
    let mut due = due.lock();
    for (agent, atom) in ready {
        if let Some(newer) = due.remove(agent) {
            *atom = (*atom).max(newer);
        }
    }
}

/// Every due snapshot, one per agent, leaving none (a closing store writes them all).
fn take_due(due: &DueSnapshots) -> Vec<(u32, AtomId)> {
    std::mem::take(&mut *due.lock()).into_iter().collect()
}

/// The due snapshots of the agents not snapshotted within [`AGENT_SNAPSHOT_INTERVAL_MIN`]
/// before `now`, taken out; the others stay (later requests of their agents replace them) and
/// the second value says when the first of them may be written. While the thread writes the
/// taken ones (and pauses), later requests gather again, each agent's newest replacing its
/// older ones.
fn take_ready(due: &DueSnapshots, recent: &mut RecentSnapshots, now: Instant) -> (Vec<(u32, AtomId)>, Option<Instant>) {
    recent.written.retain(|_, at| now.saturating_duration_since(*at) < AGENT_SNAPSHOT_INTERVAL_MIN);
    let mut due = due.lock();
    let mut ready = Vec::new();
    let mut deferred_until: Option<Instant> = None;
    due.retain(|agent, atom| match recent.written.get(agent) {
        Some(at) => {
            let until = *at + AGENT_SNAPSHOT_INTERVAL_MIN;
            deferred_until = Some(deferred_until.map_or(until, |earliest| earliest.min(until)));
            true
        }
        None => {
            ready.push((*agent, *atom));
            false
        }
    });
    (ready, deferred_until)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_snapshots_yield_three_quarters_of_the_time_until_the_store_closes() {
        let took = Duration::from_millis(4);
        let stopping = AtomicBool::new(false);
        assert_eq!(pause_after(took, Pace::Yielding(&stopping)), Duration::from_millis(12));
        stopping.store(true, Ordering::Release);
        assert_eq!(pause_after(took, Pace::Yielding(&stopping)), Duration::ZERO, "a closing store does not wait");
        assert_eq!(pause_after(took, Pace::Closing), Duration::ZERO);
        assert_eq!(pause_after(Duration::MAX, Pace::Yielding(&AtomicBool::new(false))), Duration::MAX, "no overflow");
    }

    #[test]
    fn requests_that_came_while_waiting_replace_the_taken_ones_of_their_agents() {
        let due: DueSnapshots = Arc::default();
        due.lock().extend([(1, AtomId(15)), (3, AtomId(40))]);
        let mut ready = vec![(1, AtomId(10)), (2, AtomId(20))];
        take_newer(&due, &mut ready);
        assert_eq!(ready, vec![(1, AtomId(15)), (2, AtomId(20))]);
        assert_eq!(*due.lock(), BTreeMap::from([(3, AtomId(40))]), "other agents' requests stay");
    }

    #[test]
    fn an_agent_snapshotted_within_the_interval_waits_and_the_others_are_taken() {
        let now = Instant::now() + AGENT_SNAPSHOT_INTERVAL_MIN * 2;
        let due: DueSnapshots = Arc::default();
        due.lock().extend([(1, AtomId(10)), (2, AtomId(20)), (3, AtomId(30))]);
        let mut recent = RecentSnapshots::default();
        let half = AGENT_SNAPSHOT_INTERVAL_MIN / 2;
        recent.written.insert(1, now - half);
        recent.written.insert(3, now - AGENT_SNAPSHOT_INTERVAL_MIN);
        recent.written.insert(4, now - AGENT_SNAPSHOT_INTERVAL_MIN * 2);
        let (ready, until) = take_ready(&due, &mut recent, now);
        assert_eq!(ready, vec![(2, AtomId(20)), (3, AtomId(30))], "never snapshotted, and the interval has passed");
        assert_eq!(until, Some(now + half), "agent 1 becomes ready one interval after its last snapshot");
        assert_eq!(*due.lock(), BTreeMap::from([(1, AtomId(10))]), "agent 1's request waits");
        assert_eq!(recent.written.keys().copied().collect::<Vec<_>>(), vec![1], "expired entries are dropped");
        // Once the interval has passed, it is taken.
        let (ready, until) = take_ready(&due, &mut recent, now + half);
        assert_eq!((ready, until), (vec![(1, AtomId(10))], None));
        assert!(due.lock().is_empty());
    }
}
