//! [`Shutdown`]: SIGTERM and SIGINT handling for a process using a store. The signal handler
//! (signal-hook's) only records the signal; a thread of ours reads it and starts the stop on
//! another thread, so that a second signal is still read while the first one's stop runs.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;

use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::{Handle, Signals};

use crate::error::{Error, Result};
use crate::shutdown::{StopOptions, StopReport, close, graceful_stop};
use crate::store::Store;

/// The exit code when the budget runs out before the stop is done (as `timeout(1)`'s).
pub const EXIT_OVER_BUDGET: i32 = 124;

/// The exit code when the stop failed (a checkpoint or the close returned an error).
pub const EXIT_STOP_FAILED: i32 = 1;

/// Whether a [`Shutdown`] is installed: signals belong to the process, so one at a time.
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// SIGTERM and SIGINT handling for a process using a store, installed by
/// [`Shutdown::install`]; dropping it gives both signals their default action back.
///
/// On the first signal, a thread runs [`graceful_stop`] with the options given (the resume
/// hint becomes "stopped on signal SIGTERM", or SIGINT), then [`close`], and exits the
/// process with 0, or with [`EXIT_STOP_FAILED`] if either returned an error; if the budget
/// runs out first, the process exits at once with [`EXIT_OVER_BUDGET`]. A second signal exits
/// at once with 128 + its number (143 for SIGTERM, 130 for SIGINT), the shell's code for a
/// process a signal ended. No exit loses an acknowledged atom (see [the module](super)).
///
/// ```no_run
/// # fn main() -> continuum::Result<()> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use continuum::shutdown::{Shutdown, StopOptions};
/// use continuum::{AtomOutput, Error, RunSpec, Store};
/// let store = Arc::new(Store::open("agents.store")?);
/// let shutdown = Shutdown::install(Arc::clone(&store), StopOptions::default().budget(Duration::from_secs(20)))?;
/// let run = store.create_run(RunSpec::new("trip"))?;
/// for step in 0.. {
///     match store.execute(run, "planner", &format!("step-{step}"), &[], |_| Ok(AtomOutput::default())) {
///         Err(Error::Stopping { .. }) => break,
///         other => drop(other?),
///     }
/// }
/// // SIGTERM arrived: the shutdown thread checkpoints the run, closes the store and exits.
/// shutdown.wait();
/// # Ok(())
/// # }
/// ```
pub struct Shutdown {
    handle: Handle,
    thread: Option<JoinHandle<()>>,
    /// Set by the signal thread before it starts the stop.
    started: Arc<AtomicBool>,
}

impl std::fmt::Debug for Shutdown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shutdown").finish_non_exhaustive()
    }
}

impl Shutdown {
    /// Installs SIGTERM and SIGINT handling that stops `store` gracefully and exits the
    /// process (see [`Shutdown`]). The application keeps its own `Arc` clones of the store.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] while another `Shutdown` is installed in the process;
    /// [`Error::Io`] if the handlers cannot be registered or the thread cannot start.
    pub fn install(store: Arc<Store>, options: StopOptions) -> Result<Shutdown> {
        if INSTALLED.swap(true, Ordering::AcqRel) {
            return Err(Error::InvalidArgument { reason: "a Shutdown is already installed in this process".into() });
        }
        let installed = Self::install_handlers(store, options);
        if installed.is_err() {
            INSTALLED.store(false, Ordering::Release);
        }
        installed
    }

    /// [`Shutdown::install`] once it holds the process's one place.
    fn install_handlers(store: Arc<Store>, options: StopOptions) -> Result<Shutdown> {
        let dir = store.log().dir().to_path_buf();
        let io_error = |op, source| Error::Io { op, path: dir.clone(), source };
        let mut signals = Signals::new([SIGTERM, SIGINT]).map_err(|e| io_error("register signal handlers", e))?;
        let handle = signals.handle();
        let started = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&started);
        let thread = std::thread::Builder::new()
            .name("continuum-shutdown".into())
            .spawn(move || watch(&mut signals, store, options, &flag))
            .map_err(|e| io_error("spawn the shutdown thread", e))?;
        Ok(Shutdown { handle, thread: Some(thread), started })
    }

    /// Blocks the calling thread while a stop a signal started runs: that stop exits the
    /// process, so this returns only if no signal has started one. What an application's main
    /// thread calls once its agents stopped ([`Error::Stopping`]), so that it does not return
    /// from `main` (ending the process) before the stop's checkpoints are written.
    pub fn wait(&self) {
        while self.started.load(Ordering::Acquire) {
            std::thread::park();
        }
    }
}

impl Drop for Shutdown {
    /// Gives SIGTERM and SIGINT their default action (ending the process) back and ends the
    /// signal thread; a stop already started goes on.
    fn drop(&mut self) {
        // Unregistering alone would leave the signals ignored (signal-hook keeps its handler).
        for signal in [SIGTERM, SIGINT] {
            let always = Arc::new(std::sync::atomic::AtomicBool::new(true));
            if let Err(error) = signal_hook::flag::register_conditional_default(signal, always) {
                tracing::warn!(%error, signal = signal_name(signal), "the default action was not restored");
            }
        }
        self.handle.close();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        INSTALLED.store(false, Ordering::Release);
    }
}

/// Reads the signals: the first starts the stop, a second exits at once.
fn watch(signals: &mut Signals, store: Arc<Store>, options: StopOptions, started: &AtomicBool) {
    let mut pending = Some((store, options));
    for signal in signals.forever() {
        let Some((store, options)) = pending.take() else {
            tracing::warn!(signal = signal_name(signal), "second signal: exiting at once");
            std::process::exit(128 + signal);
        };
        // Before the stop request: an agent refused by it finds the stop started.
        started.store(true, Ordering::Release);
        let options = options.resume_hint(format!("stopped on signal {}", signal_name(signal)));
        let started =
            std::thread::Builder::new().name("continuum-stop".into()).spawn(move || stop_and_exit(store, options));
        if let Err(error) = started {
            tracing::error!(%error, "the stop thread did not start: exiting at once");
            std::process::exit(EXIT_STOP_FAILED);
        }
    }
}

/// Stops the store and closes it on a thread of its own, and exits the process with the
/// outcome, or at the budget's end with [`EXIT_OVER_BUDGET`].
fn stop_and_exit(store: Arc<Store>, options: StopOptions) {
    let budget = options.budget;
    let (sender, receiver) = mpsc::channel();
    let worker = std::thread::Builder::new().name("continuum-stop-work".into()).spawn(move || {
        let outcome = graceful_stop(&store, &options).and_then(|report| close(store).map(|()| report));
        let _ = sender.send(outcome);
    });
    if let Err(error) = worker {
        tracing::error!(%error, "the stop thread did not start: exiting at once");
        std::process::exit(EXIT_STOP_FAILED);
    }
    std::process::exit(exit_code(receiver.recv_timeout(budget)));
}

/// The exit code of a stop's outcome (or of its wait running out).
fn exit_code(outcome: std::result::Result<Result<StopReport>, RecvTimeoutError>) -> i32 {
    match outcome {
        Ok(Ok(report)) => {
            tracing::info!(runs = report.checkpointed.len(), elapsed = ?report.elapsed, "stopped gracefully");
            0
        }
        Ok(Err(Error::StopBudgetExceeded { atoms_in_flight, checkpoints_written })) => {
            tracing::warn!(atoms_in_flight, checkpoints_written, "the stop ran out of its budget");
            EXIT_OVER_BUDGET
        }
        Err(RecvTimeoutError::Timeout) => {
            tracing::warn!("the stop ran out of its budget");
            EXIT_OVER_BUDGET
        }
        Ok(Err(error)) => {
            tracing::error!(%error, "the stop failed");
            EXIT_STOP_FAILED
        }
        Err(RecvTimeoutError::Disconnected) => {
            tracing::error!("the stop failed: its thread panicked");
            EXIT_STOP_FAILED
        }
    }
}

/// The name of a signal this module handles.
fn signal_name(signal: i32) -> &'static str {
    match signal {
        SIGTERM => "SIGTERM",
        SIGINT => "SIGINT",
        _ => "signal",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_shutdown_is_installed_at_a_time() {
        let dir = tempfile::tempdir().expect("dir");
        let store = Arc::new(Store::open(dir.path()).expect("open"));
        let first = Shutdown::install(Arc::clone(&store), StopOptions::default()).expect("install");
        let second = Shutdown::install(Arc::clone(&store), StopOptions::default());
        assert!(matches!(second, Err(Error::InvalidArgument { .. })), "{second:?}");
        drop(first);
        let again = Shutdown::install(Arc::clone(&store), StopOptions::default()).expect("install after the drop");
        drop(again);
        assert!(!store.is_stop_requested(), "installing stops nothing");
    }
}
