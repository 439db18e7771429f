//! [`Context`]: the state an agent needs to continue, and the deterministic fold of deltas
//! that produces it.

use std::collections::BTreeMap;

use prost::Message;

use crate::codec::CodecError;
use crate::codec::delta_view::{DeltaSpans, MessageSpans, ToolCallSpans};
use crate::codec::proto::{self, ChatMessage, Delta, ToolCall, state_change};
use crate::codec::wire::Span;

/// The state an agent needs to continue: its message window, recorded tool outputs,
/// intermediate results and key/value state. Applying the same deltas in the same order always
/// gives the same context, byte for byte ([`Context::encode`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Context {
    inner: proto::Context,
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

    /// Recorded tool outputs by tool-call id.
    pub fn tool_outputs(&self) -> &BTreeMap<String, Vec<u8>> {
        &self.inner.tool_outputs
    }

    /// Intermediate results by name.
    pub fn intermediate_results(&self) -> &BTreeMap<String, Vec<u8>> {
        &self.inner.intermediate_results
    }

    /// Key/value state.
    pub fn state(&self) -> &BTreeMap<String, Vec<u8>> {
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

    /// [`Context::apply`] for a delta read in place from the completion body `body` (what
    /// replay uses): the same fold, copying bytes into the buffers the context already has
    /// wherever it can. An overwritten key keeps its value's buffer, and messages dropped from
    /// the window lend theirs to the messages added in the same delta, so a steady-state agent
    /// (bounded window, bounded keys) replays without allocating.
    ///
    /// # Errors
    /// [`CodecError::Protobuf`] if a string of the delta is not UTF-8 (as prost would say);
    /// the context is then partly updated and must be discarded.
    pub(crate) fn apply_spans(&mut self, body: &[u8], delta: &DeltaSpans) -> Result<(), CodecError> {
        let messages = &mut self.inner.messages;
        for summary in &delta.summarizations {
            let to = (summary.to as usize).min(messages.len());
            let from = (summary.from as usize).min(to);
            if from < to {
                let replacement = ChatMessage {
                    role: text(body, summary.role)?.to_owned(),
                    content: text(body, summary.summary)?.to_owned(),
                    tool_call: None,
                };
                messages.splice(from..to, std::iter::once(replacement));
            }
        }
        let dropped = (delta.drop_oldest_messages as usize).min(messages.len());
        let recycled = dropped.min(delta.messages.len());
        messages.drain(..dropped - recycled);
        // The next `recycled` oldest messages move to the end and are overwritten in order.
        messages.rotate_left(recycled);
        let kept = messages.len() - recycled;
        for (slot, new) in messages[kept..].iter_mut().zip(&delta.messages) {
            overwrite_message(slot, body, new)?;
        }
        for new in &delta.messages[recycled..] {
            messages.push(owned_message(body, new)?);
        }
        for output in &delta.tool_outputs {
            put(&mut self.inner.tool_outputs, text(body, output.key)?, output.value.of(body));
        }
        for result in &delta.intermediate_results {
            put(&mut self.inner.intermediate_results, text(body, result.key)?, result.value.of(body));
        }
        for change in &delta.state_changes {
            let key = text(body, change.key)?;
            match change.value {
                Some(value) => put(&mut self.inner.state, key, value.of(body)),
                None => {
                    self.inner.state.remove(key);
                }
            }
        }
        Ok(())
    }

    /// The deterministic protobuf encoding (maps are ordered).
    pub fn encode(&self) -> Vec<u8> {
        self.inner.encode_to_vec()
    }

    /// Decodes [`Context::encode`]'s bytes.
    ///
    /// # Errors
    /// [`CodecError::Protobuf`] for bytes that are not a context.
    pub fn decode(bytes: &[u8]) -> Result<Self, CodecError> {
        proto::Context::decode(bytes).map(|inner| Self { inner }).map_err(|_| CodecError::Protobuf)
    }
}

/// Sets `key` to `value`, reusing the old value's buffer if the key exists.
fn put(map: &mut BTreeMap<String, Vec<u8>>, key: &str, value: &[u8]) {
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
    std::str::from_utf8(span.of(body)).map_err(|_| CodecError::Protobuf)
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
