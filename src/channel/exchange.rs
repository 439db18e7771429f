//! Sending and receiving inside an atom: [`Store::execute_with`] hands its work an
//! [`Exchange`], and records the atom's completion with its messages and its consumers'
//! offsets in one log batch (`store/batch.rs`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::channel::names::{self, channel_agent, consumer_agent};
use crate::channel::read::check_max;
use crate::channel::{Message, TOPICS_RUN};
use crate::error::{Error, Result};
use crate::limits::{CHANNEL_CONSUMERS_PER_ATOM_MAX, CHANNEL_MESSAGE_BYTES_MAX, CHANNEL_SENDS_PER_ATOM_MAX};
use crate::shared_state::commit::StateCommit;
use crate::shared_state::ops::StateOps;
use crate::store::batch::ControlDraft;
use crate::store::control::check_caller_agent;
use crate::store::{AtomFailure, AtomId, AtomOutput, Executed, RunId, Store};

/// What an atom run by [`Store::execute_with`] sends and receives. Its sends are written, and
/// its receives consumed, only when the atom completes, in the same log batch.
pub struct Exchange<'a> {
    store: &'a Store,
    run: RunId,
    atom: AtomId,
    /// The run, channel and payload of each message sent.
    sends: Vec<(RunId, String, Vec<u8>)>,
    /// Per run and consumer agent: what this atom has consumed so far.
    consumed: BTreeMap<(RunId, String), Received>,
    /// Per run and consumer agent: the offset before this atom's first receive.
    read_from: BTreeMap<(RunId, String), u64>,
    /// The shared state this atom read and wrote (`src/shared_state/`).
    state: StateOps,
}

/// The messages one atom consumed from one channel as one consumer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Received {
    /// The run the channel lives in: the atom's, or the topics run ([`Store::topics_run`]).
    pub run: RunId,
    /// The channel.
    pub channel: String,
    /// The consumer.
    pub consumer: String,
    /// The messages, oldest first.
    pub messages: Vec<Message>,
}

/// The result of [`Store::execute_with`]: the atom as [`Store::execute`] returns it, and the
/// messages it consumed (also when it is replayed: its view of the exchange).
#[derive(Clone, Debug, PartialEq)]
pub struct Exchanged {
    /// The atom, its output and whether it was replayed.
    pub executed: Executed,
    /// What it consumed, per channel and consumer.
    pub received: Vec<Received>,
}

impl<'a> Exchange<'a> {
    /// An exchange for `atom` of `run`, which is running.
    pub(crate) fn new(store: &'a Store, run: RunId, atom: AtomId) -> Self {
        let (sends, consumed, read_from, state) = (Vec::new(), BTreeMap::new(), BTreeMap::new(), StateOps::default());
        Self { store, run, atom, sends, consumed, read_from, state }
    }

    /// The store the atom belongs to.
    pub(crate) fn store(&self) -> &'a Store {
        self.store
    }

    /// The run the atom belongs to.
    pub(crate) fn run(&self) -> RunId {
        self.run
    }

    /// The shared state the atom read and wrote so far.
    pub(crate) fn state(&self) -> &StateOps {
        &self.state
    }

    /// [`Exchange::state`], to note a read or a write.
    pub(crate) fn state_mut(&mut self) -> &mut StateOps {
        &mut self.state
    }
}

impl Exchange<'_> {
    /// The atom this exchange belongs to.
    pub fn atom(&self) -> AtomId {
        self.atom
    }

    /// Sends `payload` on `channel` of the atom's run, written when the atom completes (and
    /// never if it does not).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad channel name; [`Error::LimitExceeded`] for a
    /// payload above [`CHANNEL_MESSAGE_BYTES_MAX`] or more than [`CHANNEL_SENDS_PER_ATOM_MAX`]
    /// sends. Nothing is sent on error.
    pub fn send(&mut self, channel: &str, payload: impl Into<Vec<u8>>) -> Result<()> {
        self.send_in(self.run, channel, payload.into())
    }

    /// [`Exchange::send`] to the store-wide topic `topic` (a channel of the topics run,
    /// [`Store::topics_run`], created on first use), written when the atom completes.
    ///
    /// # Errors
    /// As [`Exchange::send`], and the errors of creating the topics run.
    pub fn send_topic(&mut self, topic: &str, payload: impl Into<Vec<u8>>) -> Result<()> {
        let run = self.store.topics_run()?;
        self.send_in(run, topic, payload.into())
    }

    /// Sends `payload` on `channel` of `run` when the atom completes.
    fn send_in(&mut self, run: RunId, channel: &str, payload: Vec<u8>) -> Result<()> {
        names::check_name("channel", channel)?;
        if payload.len() > CHANNEL_MESSAGE_BYTES_MAX {
            return Err(Error::LimitExceeded {
                what: "channel message bytes".into(),
                limit: bytes(CHANNEL_MESSAGE_BYTES_MAX),
            });
        }
        if self.sends.len() == CHANNEL_SENDS_PER_ATOM_MAX {
            return Err(Error::LimitExceeded {
                what: "messages sent by one atom".into(),
                limit: bytes(CHANNEL_SENDS_PER_ATOM_MAX),
            });
        }
        self.sends.push((run, channel.to_owned(), payload));
        Ok(())
    }

    /// Receives up to `max` messages of `channel` as `consumer`, oldest first, continuing
    /// after what this atom received before; empty if there are none. They count as consumed
    /// once the atom completes.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad name or `max`; [`Error::LimitExceeded`] past
    /// [`CHANNEL_CONSUMERS_PER_ATOM_MAX`] consumers; read errors.
    pub fn receive(&mut self, channel: &str, consumer: &str, max: usize) -> Result<Vec<Message>> {
        self.receive_in(self.run, channel, consumer, max)
    }

    /// [`Exchange::receive`] from the store-wide topic `topic` ([`Exchange::send_topic`]);
    /// the consumer's offset lives in the topics run.
    ///
    /// # Errors
    /// As [`Exchange::receive`], and the errors of creating the topics run.
    pub fn receive_topic(&mut self, topic: &str, consumer: &str, max: usize) -> Result<Vec<Message>> {
        let run = self.store.topics_run()?;
        self.receive_in(run, topic, consumer, max)
    }

    /// Receives from `channel` of `run`.
    fn receive_in(&mut self, run: RunId, channel: &str, consumer: &str, max: usize) -> Result<Vec<Message>> {
        names::check_name("channel", channel)?;
        names::check_name("consumer", consumer)?;
        check_max(max)?;
        let agent = (run, consumer_agent(channel, consumer));
        let after = match self.consumed.get(&agent) {
            Some(received) => received.messages.last().map_or(0, |message| message.id.get()),
            None => self.store.offset_of(run, &agent.1)?,
        };
        let messages = self.store.messages_after(run, channel, after, max)?;
        if messages.is_empty() {
            return Ok(messages);
        }
        if !self.consumed.contains_key(&agent) && self.consumed.len() == CHANNEL_CONSUMERS_PER_ATOM_MAX {
            let limit = bytes(CHANNEL_CONSUMERS_PER_ATOM_MAX);
            return Err(Error::LimitExceeded { what: "consumers one atom receives as".into(), limit });
        }
        self.read_from.entry(agent.clone()).or_insert(after);
        let entry = self.consumed.entry(agent).or_insert_with(|| Received {
            run,
            channel: channel.to_owned(),
            consumer: consumer.to_owned(),
            messages: Vec::new(),
        });
        entry.messages.extend(messages.iter().cloned());
        Ok(messages)
    }

    /// [`Exchange::receive`] that waits up to `timeout` for a message when there is none: a
    /// message landing on any channel of the store wakes it to look again. Empty when the
    /// timeout passes first.
    ///
    /// # Errors
    /// As [`Exchange::receive`].
    pub fn receive_wait(
        &mut self,
        channel: &str,
        consumer: &str,
        max: usize,
        timeout: Duration,
    ) -> Result<Vec<Message>> {
        self.wait_in(self.run, (channel, consumer), max, timeout)
    }

    /// [`Exchange::receive_topic`] that waits as [`Exchange::receive_wait`] does.
    ///
    /// # Errors
    /// As [`Exchange::receive_topic`].
    pub fn receive_topic_wait(
        &mut self,
        topic: &str,
        consumer: &str,
        max: usize,
        timeout: Duration,
    ) -> Result<Vec<Message>> {
        let run = self.store.topics_run()?;
        self.wait_in(run, (topic, consumer), max, timeout)
    }

    /// Receives from `channel` of `run`, waiting up to `timeout` for a message.
    fn wait_in(
        &mut self,
        run: RunId,
        (channel, consumer): (&str, &str),
        max: usize,
        timeout: Duration,
    ) -> Result<Vec<Message>> {
        let deadline = Instant::now() + timeout;
        let state = &self.store.shared.channels;
        loop {
            let seen = *state.sends.lock();
            let messages = self.receive_in(run, channel, consumer, max)?;
            if !messages.is_empty() {
                return Ok(messages);
            }
            let mut sends = state.sends.lock();
            while *sends == seen {
                if state.landed.wait_until(&mut sends, deadline).timed_out() {
                    drop(sends);
                    return self.receive_in(run, channel, consumer, max);
                }
            }
        }
    }
}

impl Store {
    /// The run that holds the store-wide topics ([`TOPICS_RUN`]), created on first use.
    ///
    /// # Errors
    /// The errors of [`Store::create_run`].
    pub fn topics_run(&self) -> Result<RunId> {
        match self.run_id(TOPICS_RUN) {
            Some(run) => Ok(run),
            None => self.create_run(crate::RunSpec::new(TOPICS_RUN)),
        }
    }

    /// [`Store::execute`] for an atom that sends and receives messages on channels of `run`
    /// (and on the store-wide topics, [`Exchange::send_topic`]):
    /// `work` gets an [`Exchange`] to [`send`](Exchange::send) and
    /// [`receive`](Exchange::receive) with, and the atom's completion, its messages and its
    /// consumers' new offsets are one log batch. A message exists iff the atom that sent it
    /// completed; a consumer's offset advances iff the atom that consumed completed. If the atom
    /// already completed, `work` is not called, nothing is sent again, and the messages it
    /// consumed are returned again.
    ///
    /// One consumer must not receive in two atoms at once: the later completion is refused
    /// ([`Error::ConsumerConflict`] inside [`Error::OutputNotRecorded`]), and its atom can be
    /// executed again.
    ///
    /// ```
    /// # fn main() -> continuum::Result<()> {
    /// use continuum::{AtomOutput, RunSpec, Store};
    /// let dir = tempfile::tempdir().unwrap();
    /// let store = Store::open(dir.path())?;
    /// let run = store.create_run(RunSpec::new("team"))?;
    /// store.execute_with(run, "planner", "plan", &[], |exchange| {
    ///     exchange.send("tasks", b"research flights".to_vec())?; // a store error fails the atom
    ///     Ok(AtomOutput::default())
    /// })?;
    /// let work = |exchange: &mut continuum::channel::Exchange<'_>| {
    ///     let tasks = exchange.receive("tasks", "researcher", 10)?;
    ///     Ok(AtomOutput { result: tasks[0].payload.clone(), ..AtomOutput::default() })
    /// };
    /// let first = store.execute_with(run, "researcher", "step-1", &[], work)?;
    /// assert_eq!(first.executed.output.result, b"research flights");
    /// assert_eq!(store.pending_messages(run, "tasks", "researcher", 10)?, vec![], "consumed once");
    /// let again = store.execute_with(run, "researcher", "step-1", &[], |_| panic!("replayed"))?;
    /// assert_eq!(again.received, first.received, "a replay returns what the atom consumed");
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`Store::execute`]; [`Error::OutputNotRecorded`] holding [`Error::ConsumerConflict`]
    /// when a consumer's offset moved while the atom ran.
    pub fn execute_with(
        &self,
        run: RunId,
        agent: &str,
        key: &str,
        parents: &[AtomId],
        work: impl FnOnce(&mut Exchange<'_>) -> std::result::Result<AtomOutput, AtomFailure>,
    ) -> Result<Exchanged> {
        check_caller_agent(agent)?;
        let begin = |found: Option<AtomId>| found.map_or_else(|| self.begin_atom(run, agent, key, parents, ""), Ok);
        self.exchange_in(run, (agent, key, parents), begin, work)
    }

    /// [`Store::execute_with`]'s body: `begin` gets the key's atom left running or failed
    /// retryably, if there is one, and returns the atom `work` runs in.
    pub(crate) fn exchange_in(
        &self,
        run: RunId,
        (agent, key, parents): (&str, &str, &[AtomId]),
        begin: impl FnOnce(Option<AtomId>) -> Result<AtomId>,
        work: impl FnOnce(&mut Exchange<'_>) -> std::result::Result<AtomOutput, AtomFailure>,
    ) -> Result<Exchanged> {
        let found = match self.atom_by_key_on(run, agent, key, parents)? {
            Some(atom) => match self.replay(atom)? {
                Some(executed) => {
                    self.shared.log.metrics_handle().record_atom_skipped();
                    let mut received = self.consumed_by(run, atom)?;
                    if let Some(topics) = self.run_id(TOPICS_RUN).filter(|topics| *topics != run) {
                        received.extend(self.consumed_by(topics, atom)?);
                    }
                    return Ok(Exchanged { executed, received });
                }
                None => Some(atom),
            },
            None => None,
        };
        let atom = begin(found)?;
        let mut exchange = Exchange::new(self, run, atom);
        match work(&mut exchange) {
            Ok(output) => self.commit_exchange(exchange, output),
            Err(failure) => {
                self.fail_atom(atom, &failure)?;
                Err(Error::AtomFailed { atom: atom.0, message: failure.message, retryable: failure.retryable })
            }
        }
    }

    /// Completes an exchange's atom with its messages, offsets and shared-state versions,
    /// under its consumers' and keys' locks, after checking that no offset moved and no key it
    /// read changed since the atom read them.
    pub(crate) fn commit_exchange(&self, exchange: Exchange<'_>, output: AtomOutput) -> Result<Exchanged> {
        let Exchange { atom, sends, consumed, read_from, state: ops, .. } = exchange;
        let mut controls: Vec<ControlDraft> = Vec::with_capacity(sends.len() + consumed.len() + ops.writes.len());
        let sent = !sends.is_empty();
        for (at, (to_run, channel, payload)) in sends.into_iter().enumerate() {
            let key = names::message_key(atom, at);
            let result = names::encode_message(atom, &payload);
            controls.push(ControlDraft { run: to_run, agent: channel_agent(&channel), key, result });
        }
        for (key, received) in &consumed {
            let to = received.messages.last().expect("a consumer is noted with its messages").id.get();
            let result = names::encode_offset(read_from[key], to);
            controls.push(ControlDraft { run: key.0, agent: key.1.clone(), key: names::offset_key(atom), result });
        }
        let channels = &self.shared.channels;
        let consumer_stripes = stripes(consumed.keys().map(|(run, agent)| channels.consumer_lock(*run, agent)));
        let key_stripes = stripes(ops.keys().iter().map(|(run, agent)| self.shared.state.key_lock(*run, agent)));
        // Consumers' locks, then keys' locks, each in ascending order: two commits never wait
        // for each other's locks.
        let consumer_guards: Vec<_> = consumer_stripes.iter().map(|at| channels.consumer_locks[*at].lock()).collect();
        let key_guards: Vec<_> = key_stripes.iter().map(|at| self.shared.state.key_locks[*at].lock()).collect();
        let committed = self.check_offsets(&consumed, &read_from).and_then(|()| {
            let state = if ops.is_empty() { StateCommit::default() } else { self.prepare_state(&ops)? };
            let versions = controls.len();
            controls.extend(state.drafts.iter().cloned());
            let ids = self.complete_atom_with(atom, &output, &controls)?;
            state.publish(self, &ids[versions..]);
            Ok(())
        });
        if committed.is_ok() {
            for ((of_run, agent), received) in &consumed {
                let to = received.messages.last().expect("a consumer is noted with its messages").id.get();
                channels.cache_offset(of_run.0, agent, to);
            }
        }
        drop(key_guards);
        drop(consumer_guards);
        // The call that ends the atom returned (its index entry is final, or left running after
        // a conflict): a graceful stop no longer waits for it.
        self.shared.stop.ended(atom);
        match committed {
            Ok(()) => {
                if sent {
                    channels.notify_landed();
                }
                let executed = Executed { atom, output, replayed: false, delta_reclaimed: false };
                Ok(Exchanged { executed, received: consumed.into_values().collect() })
            }
            Err(source) => {
                Err(Error::OutputNotRecorded { atom: atom.0, output: Box::new(output), source: Box::new(source) })
            }
        }
    }

    /// Refuses a commit whose consumer's offset is no longer the one the atom read.
    fn check_offsets(
        &self,
        consumed: &BTreeMap<(RunId, String), Received>,
        read_from: &BTreeMap<(RunId, String), u64>,
    ) -> Result<()> {
        for (key, received) in consumed {
            let found = self.offset_locked(key.0, &key.1)?;
            if found != read_from[key] {
                return Err(Error::ConsumerConflict {
                    channel: received.channel.clone(),
                    consumer: received.consumer.clone(),
                    expected: read_from[key],
                    found,
                });
            }
        }
        Ok(())
    }
}

/// Lock stripes, sorted and once each.
fn stripes(of: impl Iterator<Item = usize>) -> Vec<usize> {
    let mut stripes: Vec<usize> = of.collect();
    stripes.sort_unstable();
    stripes.dedup();
    stripes
}

/// A count limit as the `u64` [`Error::LimitExceeded`] carries.
fn bytes(limit: usize) -> u64 {
    limit as u64
}
