//! Reading channels: a consumer's offset, the messages past it, and the messages a completed
//! atom consumed (its view of the exchange, returned on replay).
//!
//! A message whose payload compaction reclaimed (every live consumer had consumed it,
//! `purge/messages.rs`) is never read again: receives skip it (only a consumer that first
//! consumes after the reclaim meets one: it starts past them), and a replayed atom's view lists
//! the messages of its range that are still held.

use crate::channel::Message;
use crate::channel::exchange::Received;
use crate::channel::names::{self, CONSUMER_AGENT_PREFIX};
use crate::codec::StoreRecord;
use crate::error::{Error, Result};
use crate::store::index::EntryState;
use crate::store::{AtomId, RunId, Store, unknown_run};

impl Store {
    /// The offset `consumer` of `channel` in `run` has reached: the id of the last message it
    /// consumed (0 before its first). It advances only with a completed consuming atom.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad name; [`Error::UnknownRun`]; read errors, and
    /// [`Error::InconsistentLog`] for an offset atom whose result is not an offset.
    pub fn consumer_offset(&self, run: RunId, channel: &str, consumer: &str) -> Result<u64> {
        names::check_name("channel", channel)?;
        names::check_name("consumer", consumer)?;
        self.run_status(run)?;
        self.offset_of(run, &names::consumer_agent(channel, consumer))
    }

    /// Up to `max` messages of `channel` in `run` that `consumer` has not consumed, oldest
    /// first, without consuming them (an atom consumes with
    /// [`Exchange::receive`](crate::channel::Exchange::receive)).
    ///
    /// # Errors
    /// As [`Store::consumer_offset`]; [`Error::InvalidArgument`] for a `max` of 0 or above
    /// [`CHANNEL_RECEIVE_MESSAGES_MAX`](crate::limits::CHANNEL_RECEIVE_MESSAGES_MAX).
    pub fn pending_messages(&self, run: RunId, channel: &str, consumer: &str, max: usize) -> Result<Vec<Message>> {
        check_max(max)?;
        let offset = self.consumer_offset(run, channel, consumer)?;
        self.messages_after(run, channel, offset, max)
    }

    /// The offset a consumer agent has reached: cached, or from its newest completed offset
    /// atom.
    pub(crate) fn offset_of(&self, run: RunId, consumer_agent: &str) -> Result<u64> {
        match self.shared.channels.cached_offset(run.0, consumer_agent) {
            Some(offset) => Ok(offset),
            None => self.offset_in_log(run, consumer_agent),
        }
    }

    /// [`Store::offset_of`] that fills the cache on a miss; the caller holds the consumer's
    /// lock, so no commit changes the offset between the read and the fill.
    pub(crate) fn offset_locked(&self, run: RunId, consumer_agent: &str) -> Result<u64> {
        let state = &self.shared.channels;
        if let Some(offset) = state.cached_offset(run.0, consumer_agent) {
            return Ok(offset);
        }
        let offset = self.offset_in_log(run, consumer_agent)?;
        state.cache_offset(run.0, consumer_agent, offset);
        Ok(offset)
    }

    /// The offset a consumer agent has reached, from its newest completed offset atom.
    fn offset_in_log(&self, run: RunId, consumer_agent: &str) -> Result<u64> {
        let newest = {
            let index = self.shared.index.read();
            let run32 = u32::try_from(run.0).map_err(|_| unknown_run(run))?;
            let Some(agent) = index.agent_id(run32, consumer_agent) else { return Ok(0) };
            index.last_run_atom(run, |entry| entry.agent == agent && entry.state == EntryState::Completed)
        };
        match newest {
            Some(atom) => Ok(self.offset_range(atom)?.1),
            None => Ok(0),
        }
    }

    /// The range (from, to] of message ids the offset atom `atom` consumed.
    fn offset_range(&self, atom: AtomId) -> Result<(u64, u64)> {
        let read = self.atom(atom)?;
        let result = read.output.map(|output| output.result).unwrap_or_default();
        names::decode_offset(&result)
            .ok_or(Error::InconsistentLog { lsn: read.started_lsn.get(), reason: "an offset atom holds no offset" })
    }

    /// Up to `max` completed messages of `channel` with ids above `after`, oldest first. A
    /// message whose batch is still being appended ends the list: no later message is
    /// returned before it lands (or its append fails), so consumers see one order. Messages
    /// whose payload was reclaimed are skipped.
    pub(crate) fn messages_after(&self, run: RunId, channel: &str, after: u64, max: usize) -> Result<Vec<Message>> {
        let ids = self.message_ids(run, channel, (after, u64::MAX), max)?;
        self.messages_held(ids)
    }

    /// The messages `ids` whose payloads are still held, in order.
    fn messages_held(&self, ids: Vec<AtomId>) -> Result<Vec<Message>> {
        let mut messages = Vec::with_capacity(ids.len());
        for id in ids {
            messages.extend(self.message(id)?);
        }
        Ok(messages)
    }

    /// Ids of completed messages of `channel` within `(from, to]` whose payload is held, at
    /// most `max`, up to the first one in flight.
    fn message_ids(&self, run: RunId, channel: &str, (from, to): (u64, u64), max: usize) -> Result<Vec<AtomId>> {
        let index = self.shared.index.read();
        let run32 = u32::try_from(run.0).map_err(|_| unknown_run(run))?;
        let Some(agent) = index.agent_id(run32, &names::channel_agent(channel)) else { return Ok(Vec::new()) };
        let (first, end) = index.atom_span(run);
        let start = first.max(usize::try_from(from).unwrap_or(usize::MAX));
        let mut ids = Vec::new();
        for (at, entry) in index.atoms.iter_from(start).take_while(|(at, _)| *at < end) {
            let id = at as u64 + 1;
            if ids.len() == max || id > to {
                break;
            }
            if entry.run != run32 || entry.agent != agent {
                continue;
            }
            match entry.state {
                EntryState::Completed if entry.reclaimed => {}
                EntryState::Completed => ids.push(AtomId(id)),
                EntryState::Starting => break,
                _ => {}
            }
        }
        Ok(ids)
    }

    /// Message `id`, read from its completion record alone; `None` if its payload was
    /// reclaimed (marked in the index, or, when a round marked and rewrote it since the caller
    /// listed it, an `AtomReclaimed` record: FORMAT.md §8, "Control atoms: channels").
    fn message(&self, id: AtomId) -> Result<Option<Message>> {
        let ended_lsn = {
            let index = self.shared.index.read();
            let entry = index.atom(id).filter(|entry| entry.state == EntryState::Completed);
            let entry = entry.ok_or(Error::UnknownAtom { atom: id.get() })?;
            if entry.reclaimed {
                return Ok(None);
            }
            entry.ended_lsn
        };
        let inconsistent = |reason| Error::InconsistentLog { lsn: ended_lsn, reason };
        let done = match self.read_record(ended_lsn)? {
            StoreRecord::AtomCompleted(done) => done,
            StoreRecord::AtomReclaimed(done) => {
                names::decode_message(&done.result).ok_or_else(|| inconsistent("a message names no sender"))?;
                return Ok(None);
            }
            _ => return Err(inconsistent("a message's end is not a completion")),
        };
        let (sender, payload) =
            names::decode_message(&done.result).ok_or_else(|| inconsistent("a message names no sender"))?;
        Ok(Some(Message { id, sender, payload: payload.to_vec() }))
    }

    /// The messages the completed atom `atom` of `run` consumed, per channel and consumer (in
    /// the order of their consumer agents' names), from the offset atoms recorded with it.
    pub(crate) fn consumed_by(&self, run: RunId, atom: AtomId) -> Result<Vec<Received>> {
        let mut consumers: Vec<String> = {
            let index = self.shared.index.read();
            let run32 = u32::try_from(run.0).map_err(|_| unknown_run(run))?;
            index.agent_ids.get(&run32).map_or_else(Vec::new, |agents| {
                agents
                    .keys()
                    .filter(|name| name.starts_with(CONSUMER_AGENT_PREFIX))
                    .map(|name| name.to_string())
                    .collect()
            })
        };
        consumers.sort_unstable();
        let mut received = Vec::new();
        for agent in consumers {
            let Some(offset_atom) = self.atom_by_key(run, &agent, &names::offset_key(atom))? else { continue };
            let (channel, consumer) = names::parse_consumer_agent(&agent)
                .ok_or(Error::InvalidArgument { reason: format!("consumer agent {agent:?} names no consumer") })?;
            let range = self.offset_range(offset_atom)?;
            let ids = self.message_ids(run, channel, range, usize::MAX)?;
            let messages = self.messages_held(ids)?;
            received.push(Received { run, channel: channel.to_owned(), consumer: consumer.to_owned(), messages });
        }
        Ok(received)
    }
}

/// Refuses a receive's `max` of 0 or above the limit.
pub(crate) fn check_max(max: usize) -> Result<()> {
    if max == 0 || max > crate::limits::CHANNEL_RECEIVE_MESSAGES_MAX {
        return Err(Error::InvalidArgument {
            reason: format!("a receive takes 1 to {} messages, not {max}", crate::limits::CHANNEL_RECEIVE_MESSAGES_MAX),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::RunSpec;

    /// A message or offset atom whose result breaks its layout (FORMAT.md §8, "Control atoms:
    /// channels") is refused with `InconsistentLog` when read, never misread.
    #[test]
    fn malformed_message_and_offset_results_are_refused_when_read() {
        let dir = tempfile::tempdir().expect("dir");
        let store = Store::open(dir.path()).expect("open");
        let run = store.create_run(RunSpec::new("r")).expect("run");
        let inconsistent = |error: Option<Error>| matches!(error, Some(Error::InconsistentLog { .. }));
        let channel = names::channel_agent("tasks");
        store.record_control(run, &channel, "1.0", &[], vec![1, 0, 0]).expect("short message");
        assert!(inconsistent(store.pending_messages(run, "tasks", "c", 10).err()));
        store.record_control(run, &names::channel_agent("zero"), "1.0", &[], vec![0; 12]).expect("sender 0");
        assert!(inconsistent(store.pending_messages(run, "zero", "c", 10).err()));
        let consumer = names::consumer_agent("tasks", "c");
        store.record_control(run, &consumer, "9", &[], names::encode_offset(0, 1)[..15].to_vec()).expect("short");
        assert!(inconsistent(store.consumer_offset(run, "tasks", "c").err()));
        let mut backwards = names::encode_offset(1, 5);
        backwards.rotate_left(8);
        store.record_control(run, &names::consumer_agent("tasks", "d"), "9", &[], backwards).expect("backwards");
        assert!(inconsistent(store.consumer_offset(run, "tasks", "d").err()));
    }
}
