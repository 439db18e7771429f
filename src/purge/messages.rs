//! Retention of channel messages (design invariant 7: keep every message some live consumer has
//! not consumed, reclaim the rest), as the purge plan sees it.
//!
//! A **live consumer** of a channel is a consumer agent of the channel's run (the topics run
//! for a topic) that the store knows, that is one with an offset atom, in a run not dropped; a
//! consumer group is one consumer. A channel's **horizon** is the lowest offset of its live
//! consumers: every message at or below it has been consumed by every one of them, and its
//! payload is reclaimable. A channel with no consumer yet keeps every message: the store cannot
//! tell a channel nobody will read from one whose reader has not started, and losing a message
//! is worse than keeping one. A consumer that first consumes after a round reclaimed messages
//! starts at the oldest message still held (reclaimed ones are skipped, never delivered
//! without their payload), as a Kafka consumer group whose offset is below the log's start.

use std::collections::{BTreeSet, HashMap, HashSet};

use crate::channel::{CHANNEL_AGENT_PREFIX, CONSUMER_AGENT_PREFIX};
use crate::error::Result;
use crate::purge::plan::AtomFacts;
use crate::store::{RunId, Store};

/// One channel as the purge plan reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ChannelFacts {
    /// Its completed messages whose payload is still held, in any order.
    pub messages: Vec<u64>,
    /// The offset of each of its live consumers (the id of the last message it consumed).
    pub offsets: Vec<u64>,
}

/// The messages whose payload a round reclaims: those at or below their channel's horizon.
pub(crate) fn reclaimable(channels: &[ChannelFacts]) -> BTreeSet<u64> {
    let mut reclaimed = BTreeSet::new();
    for channel in channels {
        // No consumer yet: everything is kept.
        let Some(horizon) = channel.offsets.iter().min().copied() else { continue };
        reclaimed.extend(channel.messages.iter().copied().filter(|id| *id <= horizon));
    }
    reclaimed
}

/// The channels of the live runs, as agent ids: which agents hold messages, and which consumer
/// agents (by name) read each channel.
#[derive(Debug, Default)]
pub(crate) struct ChannelAgents {
    /// Channel agent id → (run, consumer agent names of that channel in that run).
    channels: HashMap<u32, (u32, Vec<String>)>,
}

impl ChannelAgents {
    /// Whether `agent` is a channel's agent, whose atoms are messages.
    pub fn holds_messages(&self, agent: u32) -> bool {
        self.channels.contains_key(&agent)
    }
}

impl Store {
    /// The channel and consumer agents of every run not in `dropped_runs`.
    pub(crate) fn channel_agents(&self, dropped_runs: &HashSet<u32>) -> ChannelAgents {
        let index = self.shared.index.read();
        let mut by_name: HashMap<(u32, &str), u32> = HashMap::new();
        let mut consumers: Vec<(u32, &str, &str)> = Vec::new();
        for (at, (run, name)) in index.agents.iter().enumerate() {
            if dropped_runs.contains(run) {
                continue;
            }
            let agent = u32::try_from(at + 1).expect("agent ids fit in u32");
            if let Some(channel) = name.strip_prefix(CHANNEL_AGENT_PREFIX) {
                by_name.insert((*run, channel), agent);
            } else if let Some((channel, _)) =
                name.strip_prefix(CONSUMER_AGENT_PREFIX).and_then(|rest| rest.split_once('/'))
            {
                consumers.push((*run, channel, name));
            }
        }
        let mut channels: HashMap<u32, (u32, Vec<String>)> =
            by_name.iter().map(|((run, _), agent)| (*agent, (*run, Vec::new()))).collect();
        for (run, channel, name) in consumers {
            // A consumer of a channel that has no message yet has nothing to keep.
            if let Some(agent) = by_name.get(&(run, channel)) {
                channels.get_mut(agent).expect("every channel agent is listed").1.push(name.to_owned());
            }
        }
        ChannelAgents { channels }
    }

    /// What the plan needs of each channel: its messages still held (among `facts`) and its
    /// live consumers' offsets, read now. An offset only grows, so one read before the round's
    /// marks is a safe lower bound of the consumer's progress.
    ///
    /// # Errors
    /// The read errors of [`Store::offset_of`].
    pub(crate) fn channel_facts(
        &self,
        agents: &ChannelAgents,
        facts: &HashMap<u64, AtomFacts>,
    ) -> Result<Vec<ChannelFacts>> {
        let mut messages: HashMap<u32, Vec<u64>> = HashMap::new();
        for (id, fact) in facts {
            if fact.message && fact.completed && !fact.reclaimed && !fact.dropped {
                messages.entry(fact.agent).or_default().push(*id);
            }
        }
        let mut channels = Vec::with_capacity(messages.len());
        for (agent, messages) in messages {
            let Some((run, consumers)) = agents.channels.get(&agent) else { continue };
            let mut offsets = Vec::with_capacity(consumers.len());
            for consumer in consumers {
                offsets.push(self.offset_of(RunId(u64::from(*run)), consumer)?);
            }
            channels.push(ChannelFacts { messages, offsets });
        }
        Ok(channels)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn channel(messages: &[u64], offsets: &[u64]) -> ChannelFacts {
        ChannelFacts { messages: messages.to_vec(), offsets: offsets.to_vec() }
    }

    #[test]
    fn a_channel_without_consumers_keeps_every_message() {
        assert!(reclaimable(&[channel(&[1, 2, 3], &[])]).is_empty());
    }

    #[test]
    fn the_slowest_consumer_bounds_what_is_reclaimed() {
        // One consumer read everything, the other the first two messages.
        let channels = [channel(&[3, 1, 5, 7], &[7, 3])];
        assert_eq!(reclaimable(&channels), BTreeSet::from([1, 3]));
        // A consumer that has not consumed anything (offset 0) keeps the whole channel.
        assert!(reclaimable(&[channel(&[1, 2], &[2, 0])]).is_empty());
    }

    #[test]
    fn channels_are_decided_apart() {
        let channels = [channel(&[1, 4], &[4]), channel(&[2, 3], &[2, 9]), channel(&[5], &[])];
        assert_eq!(reclaimable(&channels), BTreeSet::from([1, 2, 4]));
    }
}
