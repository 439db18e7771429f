//! Channel and consumer names, the control agents and keys they map to, and the layout of an
//! offset atom's result (`docs/FORMAT.md`, "Channel control atoms").

use crate::error::{Error, Result};
use crate::limits::{CHANNEL_NAME_BYTES_MAX, CHANNEL_SENDS_PER_ATOM_MAX};
use crate::store::{AtomId, CONTROL_AGENT_PREFIX};

/// A channel's messages are atoms of the agent named this followed by the channel's name.
pub const CHANNEL_AGENT_PREFIX: &str = "continuum.channel/";

/// A consumer's offsets are atoms of the agent named this, the channel, `/` and the consumer.
pub const CONSUMER_AGENT_PREFIX: &str = "continuum.consumer/";

/// Bytes of an offset atom's result: the offset before the atom and the one it reached.
pub(crate) const OFFSET_BYTES: usize = 16;

/// Refuses a channel or consumer name that is empty, longer than
/// [`CHANNEL_NAME_BYTES_MAX`], holds anything but ASCII letters, digits and `-_.:`, or starts
/// with the store's own prefix.
pub(crate) fn check_name(what: &str, name: &str) -> Result<()> {
    let refuse = |why: &str| Error::InvalidArgument { reason: format!("{what} name {name:?}: {why}") };
    if name.is_empty() {
        return Err(refuse("it is empty"));
    }
    if name.len() > CHANNEL_NAME_BYTES_MAX {
        return Err(refuse(&format!("it is longer than {CHANNEL_NAME_BYTES_MAX} bytes")));
    }
    if !name.bytes().all(|byte| byte.is_ascii_alphanumeric() || b"-_.:".contains(&byte)) {
        return Err(refuse("only ASCII letters, digits and -_.: are allowed"));
    }
    if name.starts_with(CONTROL_AGENT_PREFIX) {
        return Err(refuse(&format!("names starting with {CONTROL_AGENT_PREFIX:?} are the store's own")));
    }
    Ok(())
}

/// The agent whose atoms are `channel`'s messages.
pub(crate) fn channel_agent(channel: &str) -> String {
    format!("{CHANNEL_AGENT_PREFIX}{channel}")
}

/// The agent whose atoms are `consumer`'s offsets in `channel`.
pub(crate) fn consumer_agent(channel: &str, consumer: &str) -> String {
    format!("{CONSUMER_AGENT_PREFIX}{channel}/{consumer}")
}

/// The channel and consumer a consumer agent's name names.
pub(crate) fn parse_consumer_agent(agent: &str) -> Option<(&str, &str)> {
    agent.strip_prefix(CONSUMER_AGENT_PREFIX)?.split_once('/')
}

/// The key of message `index` (from 0) sent by `sender`.
pub(crate) fn message_key(sender: AtomId, index: usize) -> String {
    debug_assert!(index < CHANNEL_SENDS_PER_ATOM_MAX, "an atom sends at most the limit");
    format!("{}.{index}", sender.get())
}

/// Bytes before a message's payload in its atom's result: the sender's id.
pub(crate) const MESSAGE_HEADER_BYTES: usize = 8;

/// A message atom's result: the sender's id (u64 little-endian), then the payload, so that a
/// reader finds both in the completion record alone.
pub(crate) fn encode_message(sender: AtomId, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(MESSAGE_HEADER_BYTES + payload.len());
    out.extend_from_slice(&sender.get().to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// Splits a message atom's result into its sender and payload; `None` if it is shorter than
/// the header or names atom 0.
pub(crate) fn decode_message(result: &[u8]) -> Option<(AtomId, &[u8])> {
    let (sender, payload) = result.split_at_checked(MESSAGE_HEADER_BYTES)?;
    let sender = u64::from_le_bytes(sender.try_into().ok()?);
    (sender != 0).then_some((AtomId(sender), payload))
}

/// The key of the offset atom recorded with consuming atom `atom`.
pub(crate) fn offset_key(atom: AtomId) -> String {
    atom.get().to_string()
}

/// An offset atom's result: `from` and `to`, u64 little-endian each.
pub(crate) fn encode_offset(from: u64, to: u64) -> Vec<u8> {
    assert!(from < to, "an offset atom advances its consumer");
    let mut out = Vec::with_capacity(OFFSET_BYTES);
    out.extend_from_slice(&from.to_le_bytes());
    out.extend_from_slice(&to.to_le_bytes());
    out
}

/// Decodes an offset atom's result; `None` unless it is 16 bytes with `from < to`.
pub(crate) fn decode_offset(bytes: &[u8]) -> Option<(u64, u64)> {
    let bytes: &[u8; OFFSET_BYTES] = bytes.try_into().ok()?;
    let (from, to) = bytes.split_at(8);
    let from = u64::from_le_bytes(from.try_into().ok()?);
    let to = u64::from_le_bytes(to.try_into().ok()?);
    (from < to).then_some((from, to))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_keys_and_offsets_round_trip_and_bad_ones_are_refused() {
        assert!(check_name("channel", "tasks.v1:high-prio_2").is_ok());
        for bad in ["", "a/b", "a b", "é", "continuum.x", &"x".repeat(CHANNEL_NAME_BYTES_MAX + 1)] {
            assert!(matches!(check_name("channel", bad), Err(Error::InvalidArgument { .. })), "{bad:?}");
        }
        assert_eq!(parse_consumer_agent(&consumer_agent("tasks", "w1")), Some(("tasks", "w1")));
        assert_eq!(message_key(AtomId(7), 3), "7.3");
        assert_eq!(decode_message(&encode_message(AtomId(7), b"hi")), Some((AtomId(7), &b"hi"[..])));
        assert_eq!(decode_message(&encode_message(AtomId(7), b"")), Some((AtomId(7), &b""[..])));
        assert_eq!(decode_message(&encode_message(AtomId(7), b"")[..7]), None);
        assert_eq!(decode_message(&[0; 9]), None, "atom 0 sends nothing");
        assert_eq!(decode_offset(&encode_offset(3, 9)), Some((3, 9)));
        assert_eq!(decode_offset(&encode_offset(3, 9)[..15]), None);
        let mut backwards = encode_offset(3, 9);
        backwards.swap(0, 8);
        assert_eq!(decode_offset(&backwards), None, "to must be past from");
    }
}
