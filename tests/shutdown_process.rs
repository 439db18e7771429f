//! Real-process tests of graceful shutdown: a child process (this test binary run again with
//! `CONTINUUM_SHUTDOWN_CHILD_DIR` set) runs agents on a store with `Shutdown` installed and
//! prints each atom it acknowledges; the parent sends it real SIGTERMs with `kill`. Guards
//! against a stop that loses an acknowledged atom, begins an atom after the signal, leaves a
//! run without its stop checkpoint, outlives its budget, or ignores a second signal.

use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use continuum::checkpoint::CheckpointDraft;
use continuum::shutdown::{EXIT_OVER_BUDGET, Shutdown, StopOptions};
use continuum::{AtomId, AtomOutput, AtomStatus, Error, RunId, RunSpec, Store};

const CHILD_DIR: &str = "CONTINUUM_SHUTDOWN_CHILD_DIR";
/// `agents` (every step ends), `stuck` (one agent's step never ends) or `dropped` (the
/// handling installed and dropped, no agents).
const CHILD_MODE: &str = "CONTINUUM_SHUTDOWN_CHILD_MODE";
const CHILD_BUDGET_MS: &str = "CONTINUUM_SHUTDOWN_CHILD_BUDGET_MS";
const RUNS: [&str; 2] = ["run-0", "run-1"];
const AGENTS: [&str; 2] = ["planner", "writer"];
/// The agent whose step never ends in `stuck` mode, and the step.
const STUCK_AGENT: &str = "planner";
const STUCK_STEP: u64 = 5;

/// One line of the child's stdout: an atom acknowledged (`ACK run agent key atom`).
#[derive(Debug)]
struct Ack {
    run: String,
    agent: String,
    key: String,
    atom: AtomId,
}

fn print_line(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// One agent's loop: steps until the store refuses the next one.
fn agent_loop(store: &Store, run: (RunId, &str), agent: &str, stuck: bool) {
    let mut parents = Vec::new();
    for step in 0.. {
        let key = format!("step-{step}");
        let executed = store.execute(run.0, agent, &key, &parents, |_| {
            if stuck && step == STUCK_STEP {
                print_line("STUCK");
                loop {
                    std::thread::sleep(Duration::from_secs(3600));
                }
            }
            std::thread::sleep(Duration::from_millis(3));
            Ok(AtomOutput { delta: continuum::Delta::default(), result: key.clone().into_bytes() })
        });
        match executed {
            Ok(executed) => {
                print_line(&format!("ACK {} {agent} {key} {}", run.1, executed.atom.get()));
                parents = vec![executed.atom];
            }
            Err(Error::Stopping { .. }) => {
                print_line(&format!("STOPPED {} {agent}", run.1));
                return;
            }
            Err(error) => panic!("agent {agent}: {error}"),
        }
    }
}

#[test]
fn shutdown_child() {
    let Ok(dir) = std::env::var(CHILD_DIR) else { return };
    // The harness's "test shutdown_child ... " has no newline: end it.
    print_line("");
    let stuck = std::env::var(CHILD_MODE).as_deref() == Ok("stuck");
    let budget_ms = std::env::var(CHILD_BUDGET_MS).ok().and_then(|v| v.parse().ok()).expect("a budget");
    let store = Arc::new(Store::open(&dir).expect("child store"));
    let options = StopOptions::default().budget(Duration::from_millis(budget_ms));
    let shutdown = Shutdown::install(Arc::clone(&store), options).expect("install");
    if std::env::var(CHILD_MODE).as_deref() == Ok("dropped") {
        drop(shutdown);
        print_line("READY");
        loop {
            std::thread::park();
        }
    }
    let runs: Vec<RunId> = RUNS.iter().map(|name| store.create_run(RunSpec::new(*name)).expect("run")).collect();
    for run in &runs {
        store.write_checkpoint(*run, CheckpointDraft::at("planner", "start")).expect("first checkpoint");
    }
    print_line("READY");
    std::thread::scope(|scope| {
        for (run, name) in runs.iter().zip(RUNS) {
            for agent in AGENTS {
                let store = &store;
                let stuck = stuck && agent == STUCK_AGENT && name == RUNS[0];
                scope.spawn(move || agent_loop(store, (*run, name), agent, stuck));
            }
        }
    });
    // Every agent stopped: the stop a signal started exits the process.
    shutdown.wait();
    panic!("no signal started a stop");
}

/// A child running agents, and its stdout lines as they come.
struct Agents {
    child: Child,
    lines: Receiver<String>,
    seen: Vec<String>,
}

impl Agents {
    fn start(dir: &Path, mode: &str, budget: Duration) -> Self {
        let mut child = Command::new(std::env::current_exe().expect("test binary"))
            .args(["--exact", "shutdown_child", "--nocapture", "--test-threads=1"])
            .env(CHILD_DIR, dir)
            .env(CHILD_MODE, mode)
            .env(CHILD_BUDGET_MS, budget.as_millis().to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn child");
        let stdout = child.stdout.take().expect("piped stdout");
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = std::io::BufReader::new(stdout);
            let mut line = String::new();
            // Only complete lines: an exit may cut the last one short.
            while reader.read_line(&mut line).is_ok_and(|read| read > 0) && line.ends_with('\n') {
                if sender.send(line.trim_end().to_owned()).is_err() {
                    return;
                }
                line.clear();
            }
        });
        Self { child, lines, seen: Vec::new() }
    }

    /// Reads lines until `done` holds of those seen (60 s at most).
    fn wait_for(&mut self, what: &str, done: impl Fn(&[String]) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !done(&self.seen) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(_) => panic!("the child never printed {what}; it printed {:?}", self.seen),
            }
        }
    }

    /// Sends `signal` with `kill`; returns when it was sent (just before).
    fn signal(&self, signal: &str) -> Instant {
        let sent = Instant::now();
        let status = Command::new("kill").arg(format!("-{signal}")).arg(self.child.id().to_string()).status();
        assert!(status.expect("kill runs").success(), "kill -{signal}");
        sent
    }

    /// Waits for the child's exit (`limit` at most): its status and the time since `since`.
    fn exit(&mut self, since: Instant, limit: Duration) -> (ExitStatus, Duration) {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                let took = since.elapsed();
                // The pipe closes at the exit: every line printed before it is read.
                self.seen.extend(self.lines.iter());
                return (status, took);
            }
            if started.elapsed() > limit {
                let _ = self.child.kill();
                panic!("the child did not exit within {limit:?}; it printed {:?}", self.seen);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The atoms acknowledged.
    fn acks(&self) -> Vec<Ack> {
        let parse = |line: &String| {
            let mut words = line.strip_prefix("ACK ")?.split(' ');
            let (run, agent, key) = (words.next()?.to_owned(), words.next()?.to_owned(), words.next()?.to_owned());
            Some(Ack { run, agent, key, atom: AtomId::from_raw(words.next()?.parse().ok()?) })
        };
        self.seen.iter().filter_map(parse).collect()
    }
}

fn ack_count(lines: &[String]) -> usize {
    lines.iter().filter(|line| line.starts_with("ACK ")).count()
}

/// Every acknowledged atom is in the reopened store, completed, with its key and result.
fn assert_acknowledged_atoms_kept(store: &Store, acks: &[Ack]) {
    assert!(!acks.is_empty(), "the child acknowledged atoms");
    for ack in acks {
        let atom = store.atom(ack.atom).expect("an acknowledged atom is in the store");
        assert_eq!((atom.agent.as_str(), atom.key.as_str()), (ack.agent.as_str(), ack.key.as_str()), "{ack:?}");
        assert_eq!(atom.status, AtomStatus::Completed, "{ack:?}");
        assert_eq!(atom.output.map(|o| o.result), Some(ack.key.clone().into_bytes()), "{ack:?}");
        let run = store.run_id(&ack.run).expect("the run");
        assert_eq!(atom.run, run, "{ack:?}");
    }
}

#[test]
fn sigterm_stops_agents_at_a_boundary_checkpoints_each_run_and_exits_zero() {
    let dir = tempfile::tempdir().expect("tempdir");
    let budget = Duration::from_secs(5);
    let mut agents = Agents::start(dir.path(), "agents", budget);
    agents.wait_for("40 acknowledged atoms", |lines| ack_count(lines) >= 40);
    let sent = agents.signal("TERM");
    let (status, took) = agents.exit(sent, budget + Duration::from_secs(5));
    assert_eq!(status.code(), Some(0), "a graceful stop exits 0; the child printed {:?}", agents.seen);
    assert!(took <= budget, "the stop took {took:?}, over its budget");
    assert!(agents.seen.iter().any(|line| line.starts_with("STOPPED ")), "an agent was refused its next atom");

    let store = Store::open(dir.path()).expect("reopen");
    assert_acknowledged_atoms_kept(&store, &agents.acks());
    for name in RUNS {
        let run = store.run_id(name).expect("the run");
        let checkpoint = store.load_latest_checkpoint(run).expect("load").expect("the stop's checkpoint");
        assert_eq!(checkpoint.sequence, 2, "{name}: the stop's checkpoint follows the first");
        assert_eq!(checkpoint.resume_hint, "stopped on signal SIGTERM", "{name}");
        assert_eq!(checkpoint.position, "start", "{name}: the position carried over");
        assert!(!checkpoint.is_terminal);
        for agent in AGENTS {
            let newest = store.last_agent_atom(run, agent).expect("the agent's atoms");
            assert_eq!(checkpoint.agent_heads.get(agent), Some(&newest), "{name}/{agent}: the head is its newest atom");
            // No atom was begun after the stop: the checkpoint is newer than every atom.
            assert!(newest.get() < checkpoint.atom.get(), "{name}/{agent}: an atom after the checkpoint");
        }
        assert_eq!(store.incomplete_atoms(run), Vec::<AtomId>::new(), "{name}: an atom left begun");
    }
}

#[test]
fn a_second_sigterm_exits_at_once_and_keeps_every_acknowledged_atom() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A stop that cannot end before its budget: only the second signal ends the process.
    let budget = Duration::from_secs(60);
    let mut agents = Agents::start(dir.path(), "stuck", budget);
    agents.wait_for("a stuck step and 20 acknowledged atoms", |lines| {
        lines.iter().any(|line| line == "STUCK") && ack_count(lines) >= 20
    });
    agents.signal("TERM");
    // Every agent but the stuck one at its boundary: the stop waits for the stuck step only.
    let others = RUNS.len() * AGENTS.len() - 1;
    agents.wait_for("the other agents stopped", |lines| {
        lines.iter().filter(|line| line.starts_with("STOPPED ")).count() == others
    });
    let sent = agents.signal("TERM");
    let (status, took) = agents.exit(sent, Duration::from_secs(10));
    assert_eq!(status.code(), Some(128 + 15), "a second SIGTERM exits with 143; the child printed {:?}", agents.seen);
    assert!(took < Duration::from_secs(3), "the second signal's exit took {took:?}");

    let store = Store::open(dir.path()).expect("reopen");
    assert_acknowledged_atoms_kept(&store, &agents.acks());
    let run = store.run_id(RUNS[0]).expect("the run");
    assert_eq!(store.incomplete_atoms(run).len(), 1, "the stuck step is found running, as after a crash");
}

#[test]
fn a_stop_over_budget_exits_with_its_own_code_and_the_store_reopens_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    let budget = Duration::from_millis(800);
    let mut agents = Agents::start(dir.path(), "stuck", budget);
    agents.wait_for("a stuck step and 20 acknowledged atoms", |lines| {
        lines.iter().any(|line| line == "STUCK") && ack_count(lines) >= 20
    });
    let sent = agents.signal("TERM");
    let (status, took) = agents.exit(sent, Duration::from_secs(10));
    assert_eq!(status.code(), Some(EXIT_OVER_BUDGET), "the child printed {:?}", agents.seen);
    assert!(took >= budget, "exited after {took:?}, before its budget ran out");
    assert!(took < budget + Duration::from_secs(3), "exited after {took:?}, long after its budget");

    let store = Store::open(dir.path()).expect("reopen");
    assert!(store.recovery_report().is_lossless(), "nothing lost: {:?}", store.recovery_report());
    assert_acknowledged_atoms_kept(&store, &agents.acks());
    for name in RUNS {
        let run = store.run_id(name).expect("the run");
        let checkpoint = store.load_latest_checkpoint(run).expect("load").expect("the first checkpoint");
        assert_eq!(checkpoint.sequence, 1, "{name}: no checkpoint is written by a stop over budget");
    }
    let stuck = store.incomplete_atoms(store.run_id(RUNS[0]).expect("the run"));
    assert_eq!(stuck.len(), 1, "the stuck step is found running, as after a crash");
    assert_eq!(store.atom(stuck[0]).expect("atom").key, format!("step-{STUCK_STEP}"));
}

#[test]
fn a_dropped_shutdown_gives_sigterm_its_default_action_back() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = Agents::start(dir.path(), "dropped", Duration::from_secs(5));
    child.wait_for("READY", |lines| lines.iter().any(|line| line == "READY"));
    let sent = child.signal("TERM");
    let (status, _) = child.exit(sent, Duration::from_secs(10));
    assert_eq!(status.signal(), Some(15), "SIGTERM ends the process again: {status:?}");
}
