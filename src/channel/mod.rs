//! Channels: named, ordered, durable message logs between the agents of a run, with
//! exactly-once processing per consumer (`docs/ARCHITECTURE.md`, "Channels").
//!
//! A message is a control atom of the channel's agent (`continuum.channel/<channel>`), written
//! in the same log batch as the completion of the atom that sent it; a consumer's offset is a
//! control atom of its agent (`continuum.consumer/<channel>/<consumer>`), written in the same
//! batch as the completion of the atom that consumed the messages. So a message exists iff its
//! sending atom completed, and an offset advances iff its consuming atom completed: after any
//! crash each message is processed by exactly one completed atom of each consumer. Both are
//! used inside [`Store::execute_with`](crate::Store::execute_with).

mod exchange;
mod names;
mod read;

use std::collections::HashMap;

use parking_lot::{Condvar, Mutex};

pub use exchange::{Exchange, Exchanged, Received};
pub(crate) use names::MESSAGE_HEADER_BYTES;
pub use names::{CHANNEL_AGENT_PREFIX, CONSUMER_AGENT_PREFIX};

use crate::store::AtomId;

/// The name of the run that holds the store-wide topics ([`Store::topics_run`]).
///
/// [`Store::topics_run`]: crate::Store::topics_run
pub const TOPICS_RUN: &str = "continuum.topics";

/// One message of a channel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// The message's control atom: its position in the channel (ids grow in channel order).
    pub id: AtomId,
    /// The atom that sent it.
    pub sender: AtomId,
    /// Its payload.
    pub payload: Vec<u8>,
}

/// Number of locks consumers' commits are spread over.
const CONSUMER_LOCKS: usize = 1024;

/// The channels' in-memory state of an open store.
pub(crate) struct ChannelState {
    /// A consuming atom's completion holds the lock of each of its consumers from the offset
    /// check to the index update, so that two atoms never both advance one offset.
    pub(crate) consumer_locks: [Mutex<()>; CONSUMER_LOCKS],
    /// Offsets known to be current, by run and consumer agent: written only under the
    /// consumer's lock (from the log, or by a commit after its index update), so a hit is never
    /// older than the last commit that released the lock. A cache: cleared when full.
    offsets: Mutex<HashMap<(u64, String), u64>>,
    /// Counts the sends applied to the index; receivers wait on `landed` for it to change.
    sends: Mutex<u64>,
    landed: Condvar,
}

impl Default for ChannelState {
    fn default() -> Self {
        Self {
            consumer_locks: std::array::from_fn(|_| Mutex::new(())),
            offsets: Mutex::new(HashMap::new()),
            sends: Mutex::new(0),
            landed: Condvar::new(),
        }
    }
}

impl ChannelState {
    /// The lock a consumer agent's commits take.
    pub(crate) fn consumer_lock(&self, run: crate::store::RunId, consumer_agent: &str) -> usize {
        crate::store::stripe_of(run, consumer_agent, CONSUMER_LOCKS)
    }

    /// The cached offset of a consumer agent of `run`, if any.
    fn cached_offset(&self, run: u64, consumer_agent: &str) -> Option<u64> {
        self.offsets.lock().get(&(run, consumer_agent.to_owned())).copied()
    }

    /// Caches a consumer agent's offset; the caller holds its consumer lock.
    pub(crate) fn cache_offset(&self, run: u64, consumer_agent: &str, offset: u64) {
        let mut offsets = self.offsets.lock();
        if offsets.len() >= crate::limits::CHANNEL_OFFSETS_CACHED_MAX {
            offsets.clear();
        }
        offsets.insert((run, consumer_agent.to_owned()), offset);
    }

    /// Wakes every receiver waiting for a message.
    pub(crate) fn notify_landed(&self) {
        *self.sends.lock() += 1;
        self.landed.notify_all();
    }
}
