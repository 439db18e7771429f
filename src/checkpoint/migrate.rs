//! Version migration: the application's registered steps (`from_version -> to_version`),
//! applied in a chain to a loaded checkpoint's shared context and its agents' rebuilt
//! contexts, and recorded once as a control atom. The stored checkpoint is never rewritten.

use std::collections::{BTreeMap, BTreeSet};
use std::panic::{AssertUnwindSafe, catch_unwind};

use prost::Message;

use crate::checkpoint::types::RunCheckpoint;
use crate::checkpoint::{MIGRATION_AGENT, codec};
use crate::codec::proto;
use crate::config::Durability;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::limits::MIGRATION_STEPS_MAX;
use crate::store::{AtomId, RunId, RunStatus, Store, now_us};

/// One migration step: changes the state of one version into the next one's, or says why not.
type MigrationFn = dyn Fn(&mut MigrationState) -> std::result::Result<(), String> + Send + Sync;

/// The state a migration works on: a checkpoint's shared context and each agent's context as
/// of its head, with the version they are in.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MigrationState {
    /// The pipeline version the state is in.
    pub version: String,
    /// The checkpoint's shared context.
    pub shared_context: BTreeMap<String, Vec<u8>>,
    /// Each agent's context, rebuilt as of the head the checkpoint names.
    pub agents: BTreeMap<String, Context>,
}

/// A checkpoint loaded for a pipeline version ([`Store::load_migrated_checkpoint`]).
#[derive(Clone, Debug, PartialEq)]
pub struct MigratedCheckpoint {
    /// The checkpoint as stored.
    pub checkpoint: RunCheckpoint,
    /// Its state in the version asked for.
    pub state: MigrationState,
    /// The versions the chain passed through, the checkpoint's first and the one asked for
    /// last; empty when the checkpoint was in that version already.
    pub path: Vec<String>,
    /// The control atom recording the migration (`None`: none applied, or the run has
    /// finished and takes no atom).
    pub recorded: Option<AtomId>,
    /// Whether an earlier load had recorded it already.
    pub recorded_before: bool,
}

/// The migrations an application registers: at most one step from each version.
///
/// ```
/// use continuum::checkpoint::Migrations;
/// let mut migrations = Migrations::new();
/// migrations.register("1", "2", |state| {
///     let plan = state.shared_context.remove("plan").ok_or("no plan")?;
///     state.shared_context.insert("itinerary".into(), plan);
///     Ok(())
/// })?;
/// assert!(migrations.register("1", "3", |_| Ok(())).is_err(), "one step from each version");
/// # Ok::<(), continuum::Error>(())
/// ```
#[derive(Default)]
pub struct Migrations {
    steps: BTreeMap<String, (String, Box<MigrationFn>)>,
}

impl std::fmt::Debug for Migrations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let steps: Vec<(&str, &str)> = self.steps.iter().map(|(from, (to, _))| (from.as_str(), to.as_str())).collect();
        f.debug_struct("Migrations").field("steps", &steps).finish()
    }
}

impl Migrations {
    /// No migrations.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers the step from version `from` to version `to`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `from` equals `to` or already has a step (nothing is
    /// registered then); [`Error::LimitExceeded`] for a version longer than its bound.
    pub fn register(
        &mut self,
        from: impl Into<String>,
        to: impl Into<String>,
        migrate: impl Fn(&mut MigrationState) -> std::result::Result<(), String> + Send + Sync + 'static,
    ) -> Result<&mut Self> {
        let (from, to) = (from.into(), to.into());
        codec::check_name("pipeline version", &from)?;
        codec::check_name("pipeline version", &to)?;
        if from == to || self.steps.contains_key(&from) {
            return Err(Error::InvalidArgument {
                reason: format!("a migration from {from:?} to {to:?}: one step from each version, to another"),
            });
        }
        self.steps.insert(from, (to, Box::new(migrate)));
        Ok(self)
    }

    /// The steps from `from` to `to`, in order.
    fn chain<'a>(&'a self, from: &'a str, to: &str) -> Result<Vec<(&'a str, &'a str, &'a MigrationFn)>> {
        let missing = || Error::NoMigrationPath { from: from.to_owned(), to: to.to_owned() };
        let mut chain = Vec::new();
        let mut seen = BTreeSet::from([from]);
        let mut at = from;
        while at != to {
            let (next, step) =
                self.steps.get_key_value(at).map(|(_, (next, step))| (next, step)).ok_or_else(missing)?;
            if !seen.insert(next.as_str()) || chain.len() == MIGRATION_STEPS_MAX {
                return Err(missing());
            }
            chain.push((at, next.as_str(), step.as_ref()));
            at = next;
        }
        Ok(chain)
    }
}

/// Applies `chain` to `state`: a step that returns an error or panics stops it.
fn apply(chain: &[(&str, &str, &MigrationFn)], state: &mut MigrationState) -> Result<()> {
    for (from, to, step) in chain {
        let failed = |message, panicked| Error::MigrationFailed {
            from: (*from).to_owned(),
            to: (*to).to_owned(),
            message,
            panicked,
        };
        match catch_unwind(AssertUnwindSafe(|| step(state))) {
            Ok(Ok(())) => state.version = (*to).to_owned(),
            Ok(Err(message)) => return Err(failed(message, false)),
            Err(payload) => return Err(failed(panic_message(payload.as_ref()), true)),
        }
    }
    Ok(())
}

/// A panic's message, if it has one.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    match (payload.downcast_ref::<&str>(), payload.downcast_ref::<String>()) {
        (Some(message), _) => (*message).to_owned(),
        (_, Some(message)) => message.clone(),
        _ => "the migration panicked".to_owned(),
    }
}

impl Store {
    /// Loads checkpoint `sequence` of `run` (the newest with `None`: what resuming the run
    /// starts from) in pipeline version `version`: its shared context and each agent's
    /// context rebuilt as of its head, migrated through the chain of `migrations` from the
    /// checkpoint's version when it differs. A migration is recorded once per checkpoint and
    /// version (a control atom of [`MIGRATION_AGENT`]: from, to, the path, the sequence, when);
    /// loading again, after a reopen too, applies the chain again and finds it recorded. The
    /// stored checkpoint and history are never rewritten. `None` if there is no such
    /// checkpoint.
    ///
    /// ```
    /// # fn main() -> continuum::Result<()> {
    /// use continuum::checkpoint::{CheckpointDraft, Migrations};
    /// use continuum::{RunSpec, Store};
    /// let dir = tempfile::tempdir().unwrap();
    /// let store = Store::open(dir.path())?;
    /// let run = store.create_run(RunSpec::new("trip").pipeline("travel", "1"))?;
    /// store.write_checkpoint(run, CheckpointDraft::at("planner", "start").shared("budget", b"100".to_vec()))?;
    /// let mut migrations = Migrations::new();
    /// migrations.register("1", "2", |state| {
    ///     state.shared_context.insert("currency".into(), b"EUR".to_vec());
    ///     Ok(())
    /// })?;
    /// let loaded = store.load_migrated_checkpoint(run, None, "2", &migrations)?.expect("a checkpoint");
    /// assert_eq!(loaded.state.shared_context["currency"], b"EUR");
    /// assert_eq!(loaded.path, ["1", "2"]);
    /// assert!(loaded.recorded.is_some());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::NoMigrationPath`] naming the checkpoint's version and `version`;
    /// [`Error::MigrationFailed`] if a step returns an error or panics; nothing is recorded on
    /// error and the store stays usable. The errors of [`Store::load_checkpoint`] and
    /// [`Store::rebuild_context`], and the log's.
    pub fn load_migrated_checkpoint(
        &self,
        run: RunId,
        sequence: Option<u64>,
        version: &str,
        migrations: &Migrations,
    ) -> Result<Option<MigratedCheckpoint>> {
        let checkpoint = match sequence {
            Some(sequence) => self.load_checkpoint(run, sequence)?,
            None => self.load_latest_checkpoint(run)?,
        };
        let Some(checkpoint) = checkpoint else { return Ok(None) };
        let mut state = self.checkpoint_state(&checkpoint)?;
        if checkpoint.pipeline_version == version {
            return Ok(Some(MigratedCheckpoint {
                checkpoint,
                state,
                path: Vec::new(),
                recorded: None,
                recorded_before: false,
            }));
        }
        let migrated = migrations.chain(&checkpoint.pipeline_version, version).and_then(|chain| {
            apply(&chain, &mut state)?;
            Ok(chain.iter().map(|(from, _, _)| (*from).to_owned()).chain([version.to_owned()]).collect::<Vec<_>>())
        });
        let metrics = self.shared.log.metrics_handle();
        let path = migrated.inspect_err(|_| metrics.record_migration(false))?;
        let (recorded, recorded_before) = self.record_migration(&checkpoint, &path)?;
        metrics.record_migration(true);
        Ok(Some(MigratedCheckpoint { checkpoint, state, path, recorded, recorded_before }))
    }

    /// The state of `checkpoint` in its own version.
    fn checkpoint_state(&self, checkpoint: &RunCheckpoint) -> Result<MigrationState> {
        let (agents, heads): (Vec<&String>, Vec<AtomId>) = checkpoint.agent_heads.iter().unzip();
        let mut contexts = BTreeMap::new();
        for (agent, rebuilt) in agents.into_iter().zip(self.rebuild_contexts(&heads)) {
            contexts.insert(agent.clone(), rebuilt?.context);
        }
        Ok(MigrationState {
            version: checkpoint.pipeline_version.clone(),
            shared_context: checkpoint.shared_context.clone(),
            agents: contexts,
        })
    }

    /// Records that `checkpoint` was migrated along `path`, unless a control atom says so
    /// already or the run has finished: the atom, and whether it was there before.
    fn record_migration(&self, checkpoint: &RunCheckpoint, path: &[String]) -> Result<(Option<AtomId>, bool)> {
        let to = path.last().map_or("", String::as_str);
        let key = format!("migration/{}/{to}", checkpoint.sequence);
        // The check and the record under one lock: a migration is recorded once.
        let _control = self.control_lock();
        if let Some(atom) = self.atom_by_key(checkpoint.run, MIGRATION_AGENT, &key)? {
            return Ok((Some(atom), true));
        }
        if self.run_status(checkpoint.run)? != RunStatus::Running {
            return Ok((None, false));
        }
        let body = proto::MigrationApplied {
            run: checkpoint.run.get(),
            checkpoint_sequence: checkpoint.sequence,
            from_version: checkpoint.pipeline_version.clone(),
            to_version: to.to_owned(),
            path: path.to_vec(),
            applied_at_unix_us: now_us(),
        };
        let atom = self.record_control(checkpoint.run, MIGRATION_AGENT, &key, &[], body.encode_to_vec())?;
        if self.shared.policies.atom_durability != Durability::Sync {
            // IMPORTANT: the record is durable on return whatever the store's atom durability.
            self.shared.log.sync()?;
        }
        Ok((Some(atom), false))
    }
}
