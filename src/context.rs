//! [`Context`]: the state an agent needs to continue, and the deterministic fold of deltas
//! that produces it.

use std::collections::BTreeMap;

use prost::Message;

use crate::codec::CodecError;
use crate::codec::proto::{self, ChatMessage, Delta, state_change};

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
