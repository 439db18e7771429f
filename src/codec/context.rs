//! [`Context`]: the state an agent needs to continue, and the deterministic fold of deltas
//! that produces it.

use std::collections::HashMap;

use prost::Message;
use prost::encoding::{self, WireType};

use crate::codec::CodecError;
use crate::codec::delta_view::{self, MessageSpans, Op, ToolCallSpans};
use crate::codec::proto::{self, ChatMessage, Delta, ToolCall, state_change};
use crate::codec::wire::{self, Fields, Span, Unusual};

/// How far [`Context::apply_ops`] has rotated a context's message window in place instead of
/// moving every message down when the oldest ones are dropped: message `i` of the window is at
/// `(offset + i) % len` until [`Context::settle`] puts it back in order. Held by the replay that
/// applies the ops, never by a context a caller sees.
#[derive(Debug, Default)]
pub(crate) struct Rotation(usize);

/// Keyed values of a context (tool outputs, intermediate results, state): a hash map, since
/// replay looks a key up for every change; [`Context::encode`] orders them by key. Hashed with
/// foldhash (randomly seeded per process, several times faster than the standard library's
/// SipHash on the short keys agents use).
pub type KeyedValues = HashMap<String, Vec<u8>, foldhash::fast::RandomState>;

/// The state an agent needs to continue: its message window, recorded tool outputs,
/// intermediate results and key/value state. Applying the same deltas in the same order always
/// gives the same context, byte for byte ([`Context::encode`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Context {
    inner: Inner,
}

/// The fields of `proto::Context`, with hash maps for its ordered maps.
#[derive(Clone, Debug, Default, PartialEq)]
struct Inner {
    messages: Vec<ChatMessage>,
    tool_outputs: KeyedValues,
    intermediate_results: KeyedValues,
    state: KeyedValues,
}

impl Context {
    /// An empty context.
    pub fn new() -> Self {
        Self::default()
    }

    /// The message window, oldest first.
    pub fn messages(&self) -> &[ChatMessage] {
        &self.inner.messages
    }

    /// Recorded tool outputs by tool-call id (unordered).
    pub fn tool_outputs(&self) -> &KeyedValues {
        &self.inner.tool_outputs
    }

    /// Intermediate results by name (unordered).
    pub fn intermediate_results(&self) -> &KeyedValues {
        &self.inner.intermediate_results
    }

    /// Key/value state (unordered).
    pub fn state(&self) -> &KeyedValues {
        &self.inner.state
    }

    /// Applies one atom's delta: summarizations (ranges clamped to the window; an empty range
    /// is skipped), then dropping the oldest messages, then new messages, tool outputs,
    /// intermediate results and state changes, each in delta order.
    pub fn apply(&mut self, delta: &Delta) {
        self.apply_owned(delta.clone());
    }

    /// [`Context::apply`] for a delta the caller no longer needs: moves its contents instead
    /// of copying them (what replay uses).
    pub fn apply_owned(&mut self, delta: Delta) {
        let messages = &mut self.inner.messages;
        for summary in delta.summarizations {
            let to = (summary.to as usize).min(messages.len());
            let from = (summary.from as usize).min(to);
            if from < to {
                let replacement = ChatMessage { role: summary.role, content: summary.summary, tool_call: None };
                messages.splice(from..to, std::iter::once(replacement));
            }
        }
        let dropped = (delta.drop_oldest_messages as usize).min(messages.len());
        messages.drain(..dropped);
        messages.extend(delta.messages);
        for output in delta.tool_outputs {
            self.inner.tool_outputs.insert(output.tool_call_id, output.output);
        }
        for result in delta.intermediate_results {
            self.inner.intermediate_results.insert(result.name, result.value);
        }
        for change in delta.state_changes {
            match change.change {
                Some(state_change::Change::Set(value)) => {
                    self.inner.state.insert(change.key, value);
                }
                Some(state_change::Change::Delete(_)) => {
                    self.inner.state.remove(&change.key);
                }
                None => {}
            }
        }
    }

    /// [`Context::apply`] for a delta read in place from the completion body `body` as a list
    /// of ops (what replay uses): the same fold, copying bytes into the buffers the context
    /// already has wherever it can. An overwritten key keeps its value's buffer, and messages
    /// dropped from the window lend theirs to the messages added in the same delta, so a
    /// steady-state agent (bounded window, bounded keys) replays without allocating, and
    /// without moving its window: the window may be left rotated (`rotation`), and the caller
    /// must [`Context::settle`] it before anything else reads or updates the context.
    ///
    /// # Errors
    /// [`CodecError::Protobuf`] if a string of the delta is not UTF-8 (as prost would say);
    /// the context is then partly updated and must be discarded.
    pub(crate) fn apply_ops(&mut self, body: &[u8], ops: &[Op], rotation: &mut Rotation) -> Result<(), CodecError> {
        // Window slots `next_recycled..` (`recycled` of them, modulo the window's length) hold
        // dropped messages to be overwritten by this delta's messages, in order.
        let (mut next_recycled, mut recycled) = (0, 0);
        for op in ops {
            match *op {
                Op::Summarize { from, to, role, summary } => {
                    self.settle(rotation);
                    let messages = &mut self.inner.messages;
                    let to = (to as usize).min(messages.len());
                    let from = (from as usize).min(to);
                    if from < to {
                        let replacement = ChatMessage {
                            role: text(body, role)?.to_owned(),
                            content: text(body, summary)?.to_owned(),
                            tool_call: None,
                        };
                        messages.splice(from..to, std::iter::once(replacement));
                    }
                }
                Op::Window { drop, added } => {
                    let len = self.inner.messages.len();
                    let dropped = (drop as usize).min(len);
                    if dropped > 0 && dropped == added as usize {
                        // The steady state of a bounded window: the `dropped` oldest slots take
                        // the new messages, and the window's start moves past them.
                        (next_recycled, recycled) = (rotation.0, dropped);
                        rotation.0 = (rotation.0 + dropped) % len;
                    } else {
                        self.settle(rotation);
                        let messages = &mut self.inner.messages;
                        let kept = dropped.min(added as usize);
                        messages.drain(..dropped - kept);
                        // The next `kept` oldest messages move to the end, to be overwritten.
                        messages.rotate_left(kept);
                        (next_recycled, recycled) = (messages.len() - kept, kept);
                    }
                }
                Op::Message(new) => {
                    let messages = &mut self.inner.messages;
                    let len = messages.len();
                    match messages.get_mut(next_recycled % len.max(1)) {
                        Some(slot) if recycled > 0 => {
                            overwrite_message(slot, body, &new)?;
                            (next_recycled, recycled) = (next_recycled + 1, recycled - 1);
                        }
                        _ => messages.push(owned_message(body, &new)?),
                    }
                }
                Op::ToolOutput(entry) => {
                    put(&mut self.inner.tool_outputs, text(body, entry.key)?, entry.value.of(body))
                }
                Op::Result(entry) => {
                    put(&mut self.inner.intermediate_results, text(body, entry.key)?, entry.value.of(body));
                }
                Op::Set(entry) => put(&mut self.inner.state, text(body, entry.key)?, entry.value.of(body)),
                Op::Delete { key } => {
                    self.inner.state.remove(text(body, key)?);
                }
            }
        }
        Ok(())
    }

    /// Puts the message window back in order after [`Context::apply_ops`]; replay calls it
    /// once its last delta is applied (and before any other kind of update).
    pub(crate) fn settle(&mut self, rotation: &mut Rotation) {
        let len = self.inner.messages.len();
        if len > 0 && !rotation.0.is_multiple_of(len) {
            self.inner.messages.rotate_left(rotation.0 % len);
        }
        rotation.0 = 0;
    }

    /// The deterministic protobuf encoding of `proto::Context`: messages in window order, then
    /// each map's entries ordered by key, byte for byte what prost writes for the same context
    /// held in ordered maps.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for message in &self.inner.messages {
            encoding::message::encode(1, message, &mut out);
        }
        for (tag, map) in [(2, &self.inner.tool_outputs), (3, &self.inner.intermediate_results), (4, &self.inner.state)]
        {
            let mut entries: Vec<(&String, &Vec<u8>)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            for (key, value) in entries {
                encode_entry(tag, key, value, &mut out);
            }
        }
        out
    }

    /// Decodes [`Context::encode`]'s bytes.
    ///
    /// # Errors
    /// [`CodecError::Protobuf`] for bytes that are not a context.
    pub fn decode(bytes: &[u8]) -> Result<Self, CodecError> {
        // Straight into hash maps; prost (into ordered maps, then moved) decides anything else.
        match decode_in_place(bytes) {
            Ok(context) => Ok(context),
            Err(Unusual) => Self::decode_with_prost(bytes),
        }
    }

    /// [`Context::decode`]'s in-place path alone (for the fuzz target comparing it with prost).
    pub(crate) fn decode_in_place(bytes: &[u8]) -> Result<Self, Unusual> {
        decode_in_place(bytes)
    }

    /// [`Context::decode`] through prost's generated `proto::Context`.
    pub(crate) fn decode_with_prost(bytes: &[u8]) -> Result<Self, CodecError> {
        let decoded = proto::Context::decode(bytes).map_err(|_| CodecError::Protobuf)?;
        Ok(Self {
            inner: Inner {
                messages: decoded.messages,
                tool_outputs: decoded.tool_outputs.into_iter().collect(),
                intermediate_results: decoded.intermediate_results.into_iter().collect(),
                state: decoded.state.into_iter().collect(),
            },
        })
    }
}

/// Decodes a context's fields straight into hash maps (snapshot loads are dominated by map
/// inserts): messages through prost, map entries read in place. Anything the wire reader does
/// not expect is [`Unusual`], and [`Context::decode`] leaves it to prost.
pub(crate) fn decode_in_place(bytes: &[u8]) -> Result<Context, Unusual> {
    let mut inner = Inner::default();
    let mut fields = Fields::new(bytes);
    while let Some(field) = fields.next_field() {
        let (number, value) = field?;
        let map = match number {
            1 => {
                let message = ChatMessage::decode(wire::bytes(value)?.of(bytes)).map_err(|_| Unusual)?;
                inner.messages.push(message);
                continue;
            }
            2 => &mut inner.tool_outputs,
            3 => &mut inner.intermediate_results,
            4 => &mut inner.state,
            // Unknown fields are skipped, as prost skips them.
            _ => continue,
        };
        let entry = delta_view::read_entry(bytes, wire::bytes(value)?)?;
        let key = entry.key.text(bytes)?;
        // A key seen twice keeps its last value, as prost's map merge does.
        map.insert(key.to_owned(), entry.value.of(bytes).to_vec());
    }
    Ok(Context { inner })
}

/// One `map<string, bytes>` entry as prost encodes it: a length-delimited message whose key
/// (field 1) and value (field 2) are left out when empty.
fn encode_entry(tag: u32, key: &str, value: &[u8], out: &mut Vec<u8>) {
    let field_len =
        |len: usize| if len == 0 { 0 } else { encoding::key_len(1) + encoding::encoded_len_varint(len as u64) + len };
    let (key_len, value_len) = (field_len(key.len()), field_len(value.len()));
    encoding::encode_key(tag, WireType::LengthDelimited, out);
    encoding::encode_varint((key_len + value_len) as u64, out);
    if !key.is_empty() {
        encoding::encode_key(1, WireType::LengthDelimited, out);
        encoding::encode_varint(key.len() as u64, out);
        out.extend_from_slice(key.as_bytes());
    }
    if !value.is_empty() {
        encoding::encode_key(2, WireType::LengthDelimited, out);
        encoding::encode_varint(value.len() as u64, out);
        out.extend_from_slice(value);
    }
}

/// Sets `key` to `value`, reusing the old value's buffer if the key exists.
fn put(map: &mut KeyedValues, key: &str, value: &[u8]) {
    match map.get_mut(key) {
        Some(old) => {
            old.clear();
            old.extend_from_slice(value);
        }
        None => {
            map.insert(key.to_owned(), value.to_vec());
        }
    }
}

fn set_text(target: &mut String, text: &str) {
    target.clear();
    target.push_str(text);
}

/// The text at `span` of `body`.
fn text(body: &[u8], span: Span) -> Result<&str, CodecError> {
    span.text(body).map_err(|Unusual| CodecError::Protobuf)
}

fn owned_message(body: &[u8], new: &MessageSpans) -> Result<ChatMessage, CodecError> {
    Ok(ChatMessage {
        role: text(body, new.role)?.to_owned(),
        content: text(body, new.content)?.to_owned(),
        tool_call: new.tool_call.map(|call| owned_call(body, &call)).transpose()?,
    })
}

fn owned_call(body: &[u8], call: &ToolCallSpans) -> Result<ToolCall, CodecError> {
    Ok(ToolCall {
        id: text(body, call.id)?.to_owned(),
        name: text(body, call.name)?.to_owned(),
        arguments: text(body, call.arguments)?.to_owned(),
    })
}

/// Makes `slot` equal to the message `new`, in `slot`'s buffers.
fn overwrite_message(slot: &mut ChatMessage, body: &[u8], new: &MessageSpans) -> Result<(), CodecError> {
    set_text(&mut slot.role, text(body, new.role)?);
    set_text(&mut slot.content, text(body, new.content)?);
    match (&mut slot.tool_call, &new.tool_call) {
        (Some(old), Some(call)) => {
            set_text(&mut old.id, text(body, call.id)?);
            set_text(&mut old.name, text(body, call.name)?);
            set_text(&mut old.arguments, text(body, call.arguments)?);
        }
        (slot_call, call) => *slot_call = call.map(|call| owned_call(body, &call)).transpose()?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::proto::{Delete, StateChange, Summarization, ToolOutput};

    fn message(content: &str) -> ChatMessage {
        ChatMessage { role: "assistant".into(), content: content.into(), tool_call: None }
    }

    #[test]
    fn deltas_fold_in_the_documented_order() {
        let mut context = Context::new();
        context.apply(&Delta {
            messages: vec![message("a"), message("b"), message("c"), message("d")],
            tool_outputs: vec![ToolOutput { tool_call_id: "t1".into(), output: b"out".to_vec() }],
            state_changes: vec![StateChange {
                key: "k".into(),
                change: Some(state_change::Change::Set(b"v".to_vec())),
            }],
            ..Delta::default()
        });
        context.apply(&Delta {
            summarizations: vec![Summarization { from: 1, to: 3, role: "system".into(), summary: "b+c".into() }],
            drop_oldest_messages: 1,
            messages: vec![message("e")],
            state_changes: vec![StateChange { key: "k".into(), change: Some(state_change::Change::Delete(Delete {})) }],
            ..Delta::default()
        });
        let contents: Vec<&str> = context.messages().iter().map(|m| m.content.as_str()).collect();
        assert_eq!(contents, ["b+c", "d", "e"]);
        assert_eq!(context.tool_outputs().get("t1").map(Vec::as_slice), Some(&b"out"[..]));
        assert!(context.state().is_empty());
        assert_eq!(Context::decode(&context.encode()), Ok(context));
    }

    proptest::proptest! {
        /// The encoding is byte for byte prost's encoding of the same context in ordered maps
        /// (what snapshots held before the maps became hash maps), and decodes back to it.
        #[test]
        fn encoding_is_prosts_ordered_encoding(deltas in proptest::collection::vec(crate::codec::tests::arb_delta(), 0..6)) {
            let mut context = Context::new();
            for delta in &deltas {
                context.apply(delta);
            }
            let ordered = proto::Context {
                messages: context.messages().to_vec(),
                tool_outputs: context.tool_outputs().clone().into_iter().collect(),
                intermediate_results: context.intermediate_results().clone().into_iter().collect(),
                state: context.state().clone().into_iter().collect(),
            };
            proptest::prop_assert_eq!(context.encode(), ordered.encode_to_vec());
            proptest::prop_assert_eq!(Context::decode(&context.encode()), Ok(context));
        }
    }

    proptest::proptest! {
        /// The in-place decoder agrees with prost on damaged snapshot payloads: the same
        /// context, or both refuse.
        #[test]
        fn damaged_encodings_decode_as_prost_decodes_them(
            deltas in proptest::collection::vec(crate::codec::tests::arb_delta(), 1..4),
            flips in proptest::collection::vec((proptest::prelude::any::<proptest::sample::Index>(), proptest::prelude::any::<u8>()), 1..4),
        ) {
            let mut context = Context::new();
            for delta in &deltas {
                context.apply(delta);
            }
            let mut bytes = context.encode();
            if !bytes.is_empty() {
                for (at, byte) in flips {
                    let at = at.index(bytes.len());
                    bytes[at] = byte;
                }
            }
            let fast = decode_in_place(&bytes).map_err(|Unusual| ());
            if let Ok(fast) = fast {
                proptest::prop_assert_eq!(Ok(fast), Context::decode_with_prost(&bytes));
            }
        }
    }

    #[test]
    fn out_of_range_window_operations_are_clamped() {
        let mut context = Context::new();
        context.apply(&Delta { messages: vec![message("a")], ..Delta::default() });
        context.apply(&Delta {
            summarizations: vec![Summarization { from: 5, to: 9, role: "system".into(), summary: "x".into() }],
            drop_oldest_messages: 7,
            ..Delta::default()
        });
        assert!(context.messages().is_empty());
    }
}
