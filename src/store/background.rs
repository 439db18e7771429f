//! The store's background thread: writes policy snapshots and runs compaction on a timer, off
//! the agents' threads. It holds only a weak reference to the store while idle, so dropping
//! the store stops it.

use std::collections::BTreeMap;
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
    /// older request of the same agent not yet written, and the thread is woken only if no
    /// request was waiting (otherwise it is awake or already asked).
    pub fn request_snapshot(&self, agent: u32, atom: AtomId) {
        let mut due = self.due.lock();
        let idle = due.is_empty();
        let slot = due.entry(agent).or_insert(atom);
        *slot = (*slot).max(atom);
        drop(due);
        if idle {
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
    loop {
        let wait = next_compaction.map_or(IDLE_WAIT, |at| at.saturating_duration_since(Instant::now()));
        let job = jobs.recv_timeout(wait);
        let Some(shared) = shared.upgrade() else { return };
        let store = Store::view(shared);
        if stopping.load(Ordering::Acquire) {
            // A clean close writes the snapshots still due (one per agent at most), so that
            // the next open resumes every agent from a recent one.
            store.train_pending_dictionary();
            write_snapshots(&store, take_due(due), Pace::Closing);
            return;
        }
        match job {
            Ok(Job::Wake) => {}
            Ok(Job::Compact) | Err(RecvTimeoutError::Timeout) => {
                match store.compact() {
                    Ok(report) => tracing::debug!(?report, "background compaction"),
                    Err(error) => tracing::warn!(%error, "background compaction failed"),
                }
                checkpoint_if_due(&store);
                next_compaction = interval.map(|every| Instant::now() + every);
            }
            Err(RecvTimeoutError::Disconnected) => return,
        }
        // Every wake-up takes the dictionary to train and the due snapshots, whatever job woke
        // it: a request whose own wake-up found the queue full is not left waiting.
        store.train_pending_dictionary();
        write_snapshots(&store, take_due(due), Pace::Yielding(stopping));
    }
}

/// Writes an index checkpoint when the records after the newest one (all of them, if
/// compaction deleted it) are at least `index_checkpoint_after` and a quarter of those
/// it covers: a crash then costs an open at most that many records' fold, and rewriting the
/// checkpoint stays proportional to the records appended.
fn checkpoint_if_due(store: &Store) {
    let (after, covered) = store.checkpoint_lag();
    if after >= store.shared.policies.index_checkpoint_after.max(covered / 4)
        && let Err(error) = store.checkpoint_index()
    {
        tracing::warn!(%error, "background index checkpoint failed");
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

/// Writes policy snapshots of `atoms`; a failure is logged and the others are still written.
fn write_snapshots(store: &Store, atoms: Vec<AtomId>, pace: Pace) {
    for atom in atoms {
        let started = Instant::now();
        if let Err(error) = store.policy_snapshot(atom) {
            tracing::warn!(atom = atom.get(), %error, "policy snapshot failed");
        }
        std::thread::sleep(pause_after(started.elapsed(), pace));
    }
}

/// How long the background thread sleeps after a policy snapshot that took `took`.
fn pause_after(took: Duration, pace: Pace<'_>) -> Duration {
    match pace {
        Pace::Yielding(stopping) if !stopping.load(Ordering::Acquire) => took.saturating_mul(SNAPSHOT_YIELD_FACTOR),
        Pace::Yielding(_) | Pace::Closing => Duration::ZERO,
    }
}

/// Every due snapshot, one per agent, leaving none: while the thread writes them (and then
/// pauses), later requests gather again, each agent's newest replacing its older ones.
fn take_due(due: &DueSnapshots) -> Vec<AtomId> {
    std::mem::take(&mut *due.lock()).into_values().collect()
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
}
