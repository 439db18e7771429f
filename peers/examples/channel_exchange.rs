//! Channel throughput (issue 36): 16 agents (threads) exchanging messages durably, against the
//! store's workload 2 (16 writers of durable atoms, `benches/peers.rs`) and against the same
//! exchange on a SQLite queue (`continuum_peers::sqlite_queue`), trials of the three run back
//! to back in each round so that the host's drift cancels out of the ratios.
//!
//! The exchange: the agents form a ring; each step of agent `i` is one atom (the workload's
//! ~510-byte delta, chained to the agent's previous atom) that receives what is pending on
//! channel `to-i` (as consumer `agent-i`) and sends one 256-byte message on `to-(i+1)`. On
//! continuum a step is one `Store::execute_with` (default `Sync`: the atom's start, then its
//! completion with its message and offset atoms in one synced batch); on SQLite it is one
//! transaction (`synchronous=FULL`, WAL) that reads the offset and the messages past it, inserts
//! the atom row and the message, and updates the offset row. Messages/s counts messages sent
//! (one per step); after every trial each system must account for every message sent: received
//! in the trial, or still pending.
//!
//! `cargo run --release -p continuum-peers --example channel_exchange [trials] [steps]`
//! (defaults 7 trials of 16 × 250 steps). Files live under `target/tmp`, never on tmpfs. Goals:
//! the exchange's messages/s at least 0.7× workload 2's atoms/s, and at least 5× SQLite's.

use std::path::Path;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use continuum::{AtomId, CompactionPolicy, RunId, RunSpec, Store};
use continuum_peers::sqlite_queue::{SqliteQueue, Step};
use continuum_peers::{AtomSink, Deltas, Encoded, Engine, Mode};

/// Agents exchanging messages, and writers of workload 2.
const AGENTS: u32 = 16;
/// Bytes of each message.
const PAYLOAD_BYTES: usize = 256;
/// At most this many messages received by one step.
const RECEIVE_MAX: usize = 256;
/// Deltas each agent cycles through.
const POOL: usize = 64;
/// Pause before each trial, for the previous one's background work to finish.
const SETTLE: Duration = Duration::from_millis(300);

fn main() {
    let mut args = std::env::args().skip(1).filter(|arg| arg != "--bench");
    let trials: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(7);
    let steps: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(250);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/tmp");
    std::fs::create_dir_all(&root).expect("bench dir");
    let dir = tempfile::tempdir_in(&root).expect("dir");
    let pools: Vec<Vec<Encoded>> = (0..AGENTS)
        .map(|agent| {
            (0..POOL)
                .map({
                    let mut d = Deltas::new(u64::from(agent));
                    move |_| d.next_encoded()
                })
                .collect()
        })
        .collect();

    let w2 = Engine::ContinuumStore.open(&dir.path().join("w2"), Mode::Durable).expect("w2 store");
    let exchange = Exchange::open(&dir.path().join("exchange"));
    let queue = SqliteQueue::open(&dir.path().join("sqlite")).expect("sqlite queue");

    let (mut w2_rates, mut ours, mut theirs) = (Vec::new(), Vec::new(), Vec::new());
    let (mut per_sync, mut w2_per_sync) = (Vec::new(), Vec::new());
    for trial in 0..trials {
        let first = trial as u64 * steps;
        std::thread::sleep(SETTLE);
        let before = w2.commit_metrics().expect("the store keeps metrics");
        w2_rates.push(atoms_w2(w2.as_ref(), &pools, first, steps));
        let after = w2.commit_metrics().expect("the store keeps metrics");
        let syncs = after.fdatasyncs.saturating_sub(before.fdatasyncs).max(1);
        w2_per_sync.push((u64::from(AGENTS) * steps) as f64 / syncs as f64);
        std::thread::sleep(SETTLE);
        let before = exchange.store.metrics();
        ours.push(exchange.trial(&pools, first, steps));
        let after = exchange.store.metrics();
        let syncs = after.fdatasyncs.saturating_sub(before.fdatasyncs).max(1);
        per_sync.push((u64::from(AGENTS) * steps) as f64 / syncs as f64);
        std::thread::sleep(SETTLE);
        theirs.push(sqlite_trial(&queue, &pools, first, steps));
        eprintln!(
            "trial {trial}: W2 {:.0} atoms/s, continuum exchange {:.0} msgs/s, SQLite exchange {:.0} msgs/s",
            w2_rates[trial], ours[trial], theirs[trial]
        );
    }
    let to_w2: Vec<f64> = ours.iter().zip(&w2_rates).map(|(o, w)| o / w).collect();
    let to_sqlite: Vec<f64> = ours.iter().zip(&theirs).map(|(o, s)| o / s).collect();
    eprintln!(
        "==== summary channel_exchange: {trials} trials of {AGENTS} x {steps} steps, medians: W2 {:.0} atoms/s \
         ({:.1} atoms per fdatasync), continuum exchange {:.0} msgs/s ({:.1} steps per fdatasync), SQLite exchange {:.0} msgs/s; \
         paired ratios (median, low-high): exchange / W2 {} (goal >= 0.7), exchange / SQLite {} (goal >= 5)",
        median(&w2_rates),
        median(&w2_per_sync),
        median(&ours),
        median(&per_sync),
        median(&theirs),
        spread(&to_w2),
        spread(&to_sqlite),
    );
    w2.close().expect("close w2");
    queue.close().expect("close sqlite");
}

/// Workload 2 on the store: `steps` durable atoms from each of [`AGENTS`] threads, each its own
/// agent; atoms/s.
fn atoms_w2(sink: &dyn AtomSink, pools: &[Vec<Encoded>], first: u64, steps: u64) -> f64 {
    concurrently(steps, |agent, step| {
        let encoded = &pools[agent as usize][(step % POOL as u64) as usize];
        sink.append(&encoded.atom(agent, first + step + 1)).expect("durable append");
        0
    })
    .0
}

/// The exchange on a continuum store: one run, the agents' channels in it.
struct Exchange {
    store: Store,
    run: RunId,
}

impl Exchange {
    fn open(dir: &Path) -> Self {
        // As workload 2's store: default policies, no timed compaction rounds during trials.
        let compaction = CompactionPolicy { interval: None, ..CompactionPolicy::default() };
        let store = Store::builder(dir).compaction(compaction).open().expect("open");
        let run = store.create_run(RunSpec::new("exchange")).expect("run");
        Self { store, run }
    }

    /// One trial; messages/s. Checks that every message sent is received or pending.
    fn trial(&self, pools: &[Vec<Encoded>], first: u64, steps: u64) -> f64 {
        let pending_before = self.pending();
        let payload = vec![0x5a; PAYLOAD_BYTES];
        let last: Vec<std::sync::Mutex<Option<AtomId>>> = (0..AGENTS)
            .map(|agent| std::sync::Mutex::new(self.store.last_agent_atom(self.run, &agent_name(agent))))
            .collect();
        let (rate, received) = concurrently(steps, |agent, step| {
            let name = agent_name(agent);
            let (inbox, outbox) = (channel(agent), channel((agent + 1) % AGENTS));
            let output = &pools[agent as usize][(step % POOL as u64) as usize].output;
            let mut parent = last[agent as usize].lock().expect("one thread per agent");
            let parents: Vec<AtomId> = parent.iter().copied().collect();
            let done = self
                .store
                .execute_with(self.run, &name, &(first + step).to_string(), &parents, |x| {
                    x.receive(&inbox, &name, RECEIVE_MAX)?;
                    x.send(&outbox, payload.clone())?;
                    Ok(output.clone())
                })
                .expect("exchange step");
            *parent = Some(done.executed.atom);
            done.received.iter().map(|r| r.messages.len() as u64).sum()
        });
        let sent = u64::from(AGENTS) * steps;
        assert_eq!(received + self.pending() - pending_before, sent, "every message is received or pending");
        rate
    }

    fn pending(&self) -> u64 {
        (0..AGENTS)
            .map(|agent| {
                let pending = self.store.pending_messages(self.run, &channel(agent), &agent_name(agent), 4096);
                pending.expect("pending").len() as u64
            })
            .sum()
    }
}

/// The exchange on the SQLite queue; messages/s. Checks that every message sent is received or
/// pending.
fn sqlite_trial(queue: &SqliteQueue, pools: &[Vec<Encoded>], first: u64, steps: u64) -> f64 {
    let pending = || -> u64 {
        (0..AGENTS).map(|agent| queue.pending(&channel(agent), &agent_name(agent)).expect("pending")).sum()
    };
    let pending_before = pending();
    let payload = vec![0x5a; PAYLOAD_BYTES];
    let (rate, received) = concurrently(steps, |agent, step| {
        let name = agent_name(agent);
        let (inbox, outbox) = (channel(agent), channel((agent + 1) % AGENTS));
        let delta = &pools[agent as usize][(step % POOL as u64) as usize].bytes;
        let step = Step {
            run: "exchange",
            agent: &name,
            atom_id: first + step + 1,
            delta,
            inbox: &inbox,
            outbox: &outbox,
            payload: &payload,
            receive_max: RECEIVE_MAX,
        };
        queue.step(&step).expect("sqlite step").len() as u64
    });
    assert_eq!(received + pending() - pending_before, u64::from(AGENTS) * steps, "every message accounted for");
    rate
}

/// Runs `steps` calls of `work(agent, step)` on each of [`AGENTS`] threads, from the moment all
/// are ready; returns the calls per second and the sum of what `work` returned.
fn concurrently(steps: u64, work: impl Fn(u32, u64) -> u64 + Sync) -> (f64, u64) {
    let ready = Barrier::new(AGENTS as usize + 1);
    let (elapsed, total) = std::thread::scope(|scope| {
        let (ready, work) = (&ready, &work);
        let threads: Vec<_> = (0..AGENTS)
            .map(|agent| {
                scope.spawn(move || {
                    ready.wait();
                    (0..steps).map(|step| work(agent, step)).sum::<u64>()
                })
            })
            .collect();
        ready.wait();
        let start = Instant::now();
        let total: u64 = threads.into_iter().map(|t| t.join().expect("a thread should not panic")).sum();
        (start.elapsed(), total)
    });
    ((u64::from(AGENTS) * steps) as f64 / elapsed.as_secs_f64(), total)
}

fn agent_name(agent: u32) -> String {
    format!("agent-{agent}")
}

fn channel(agent: u32) -> String {
    format!("to-{agent}")
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

/// `median (low-high)` of paired ratios.
fn spread(ratios: &[f64]) -> String {
    let low = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let high = ratios.iter().copied().fold(0.0, f64::max);
    format!("{:.2}x ({low:.2}-{high:.2})", median(ratios))
}
