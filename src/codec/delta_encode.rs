//! A `Delta`'s protobuf encoding, written by hand for the append path: the same bytes as
//! prost's `Message::encode` (fields in number order, proto3 defaults omitted, every element of
//! a repeated message written, a set `oneof` written even when empty), with each nested length
//! computed once and the varints written inline. `record_atom` encodes one delta per atom on
//! the appending thread; prost took about 2,900 instructions for a 510-byte delta there
//! (callgrind, 2026-12-01). Tests check the bytes against prost's for random deltas of every
//! shape. Every struct is destructured field by field, so a field added to the schema
//! fails to compile here until it is encoded. Its field writers also write the start and
//! completion records around the delta (`Codec::encode_start`, `Codec::encode_completion`).

use crate::codec::proto::state_change::Change;
use crate::codec::proto::{
    ChatMessage, Delete, Delta, IntermediateResult, StateChange, Summarization, ToolCall, ToolOutput,
};

/// Wire type of varint fields.
const VARINT: u8 = 0;
/// Wire type of length-delimited fields (strings, bytes, messages).
const LEN: u8 = 2;

/// The one-byte key of field `tag` (every tag of these messages is below 16).
#[inline]
fn key(tag: u8, wire: u8) -> u8 {
    debug_assert!(tag < 16);
    (tag << 3) | wire
}

#[inline]
pub(super) fn varint_len(value: u64) -> usize {
    prost::encoding::encoded_len_varint(value)
}

#[inline]
pub(super) fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Bytes of a length-delimited field holding `len` bytes.
#[inline]
pub(super) fn field_len(len: usize) -> usize {
    1 + varint_len(len as u64) + len
}

/// Bytes of a string or bytes field: nothing when empty (the proto3 default).
#[inline]
pub(super) fn text_len(value: &[u8]) -> usize {
    if value.is_empty() { 0 } else { field_len(value.len()) }
}

/// Bytes of a `uint32` field: nothing when zero.
#[inline]
fn uint_len(value: u32) -> usize {
    uint64_len(u64::from(value))
}

/// Bytes of a `uint64` field: nothing when zero.
#[inline]
pub(super) fn uint64_len(value: u64) -> usize {
    if value == 0 { 0 } else { 1 + varint_len(value) }
}

/// Writes the key and the length of length-delimited field `tag` holding `len` bytes.
#[inline]
pub(super) fn put_field_header(out: &mut Vec<u8>, tag: u8, len: usize) {
    out.push(key(tag, LEN));
    put_varint(out, len as u64);
}

#[inline]
fn put_bytes(out: &mut Vec<u8>, tag: u8, value: &[u8]) {
    put_field_header(out, tag, value.len());
    out.extend_from_slice(value);
}

/// Writes a string or bytes field, unless it is empty.
#[inline]
pub(super) fn put_text(out: &mut Vec<u8>, tag: u8, value: &[u8]) {
    if !value.is_empty() {
        put_bytes(out, tag, value);
    }
}

#[inline]
fn put_uint(out: &mut Vec<u8>, tag: u8, value: u32) {
    put_uint64(out, tag, u64::from(value));
}

/// Writes a `uint64` field, unless it is zero.
#[inline]
pub(super) fn put_uint64(out: &mut Vec<u8>, tag: u8, value: u64) {
    if value != 0 {
        out.push(key(tag, VARINT));
        put_varint(out, value);
    }
}

fn tool_call_len(call: &ToolCall) -> usize {
    let ToolCall { id, name, arguments } = call;
    text_len(id.as_bytes()) + text_len(name.as_bytes()) + text_len(arguments.as_bytes())
}

fn message_len(message: &ChatMessage) -> usize {
    let ChatMessage { role, content, tool_call } = message;
    text_len(role.as_bytes())
        + text_len(content.as_bytes())
        + tool_call.as_ref().map_or(0, |call| field_len(tool_call_len(call)))
}

fn tool_output_len(output: &ToolOutput) -> usize {
    let ToolOutput { tool_call_id, output } = output;
    text_len(tool_call_id.as_bytes()) + text_len(output)
}

fn result_len(result: &IntermediateResult) -> usize {
    let IntermediateResult { name, value } = result;
    text_len(name.as_bytes()) + text_len(value)
}

fn state_change_len(change: &StateChange) -> usize {
    let StateChange { key, change } = change;
    text_len(key.as_bytes())
        + match change {
            None => 0,
            Some(Change::Set(value)) => field_len(value.len()),
            Some(Change::Delete(Delete {})) => field_len(0),
        }
}

fn summarization_len(summarization: &Summarization) -> usize {
    let Summarization { from, to, role, summary } = summarization;
    uint_len(*from) + uint_len(*to) + text_len(role.as_bytes()) + text_len(summary.as_bytes())
}

/// The length of `delta`'s encoding (prost's `encoded_len`).
pub(crate) fn encoded_len(delta: &Delta) -> usize {
    let Delta { messages, tool_outputs, intermediate_results, state_changes, drop_oldest_messages, summarizations } =
        delta;
    messages.iter().map(|message| field_len(message_len(message))).sum::<usize>()
        + tool_outputs.iter().map(|output| field_len(tool_output_len(output))).sum::<usize>()
        + intermediate_results.iter().map(|result| field_len(result_len(result))).sum::<usize>()
        + state_changes.iter().map(|change| field_len(state_change_len(change))).sum::<usize>()
        + uint_len(*drop_oldest_messages)
        + summarizations.iter().map(|summarization| field_len(summarization_len(summarization))).sum::<usize>()
}

/// Appends `delta`'s encoding to `out` (prost's `encode_raw`: no length prefix).
pub(crate) fn encode(delta: &Delta, out: &mut Vec<u8>) {
    let Delta { messages, tool_outputs, intermediate_results, state_changes, drop_oldest_messages, summarizations } =
        delta;
    for message in messages {
        put_field_header(out, 1, message_len(message));
        let ChatMessage { role, content, tool_call } = message;
        put_text(out, 1, role.as_bytes());
        put_text(out, 2, content.as_bytes());
        if let Some(call) = tool_call {
            put_field_header(out, 3, tool_call_len(call));
            let ToolCall { id, name, arguments } = call;
            put_text(out, 1, id.as_bytes());
            put_text(out, 2, name.as_bytes());
            put_text(out, 3, arguments.as_bytes());
        }
    }
    for output in tool_outputs {
        put_field_header(out, 2, tool_output_len(output));
        let ToolOutput { tool_call_id, output } = output;
        put_text(out, 1, tool_call_id.as_bytes());
        put_text(out, 2, output);
    }
    for result in intermediate_results {
        put_field_header(out, 3, result_len(result));
        let IntermediateResult { name, value } = result;
        put_text(out, 1, name.as_bytes());
        put_text(out, 2, value);
    }
    for change in state_changes {
        put_field_header(out, 4, state_change_len(change));
        let StateChange { key, change } = change;
        put_text(out, 1, key.as_bytes());
        match change {
            None => {}
            // A set oneof is written even when its value is the default.
            Some(Change::Set(value)) => put_bytes(out, 2, value),
            Some(Change::Delete(Delete {})) => put_field_header(out, 3, 0),
        }
    }
    put_uint(out, 5, *drop_oldest_messages);
    for summarization in summarizations {
        put_field_header(out, 6, summarization_len(summarization));
        let Summarization { from, to, role, summary } = summarization;
        put_uint(out, 1, *from);
        put_uint(out, 2, *to);
        put_text(out, 3, role.as_bytes());
        put_text(out, 4, summary.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use prost::Message;

    use super::*;
    use crate::codec::tests::arb_delta;
    use crate::synthetic::Transcript;

    fn check(delta: &Delta) {
        let mut ours = Vec::new();
        encode(delta, &mut ours);
        assert_eq!(ours, delta.encode_to_vec(), "{delta:?}");
        assert_eq!(encoded_len(delta), delta.encoded_len(), "{delta:?}");
    }

    proptest! {
        #[test]
        fn random_deltas_encode_as_prost_encodes_them(delta in arb_delta()) {
            let mut ours = Vec::new();
            encode(&delta, &mut ours);
            prop_assert_eq!(&ours, &delta.encode_to_vec());
            prop_assert_eq!(encoded_len(&delta), delta.encoded_len());
        }
    }

    #[test]
    fn the_shapes_random_deltas_leave_out_encode_as_prost_encodes_them() {
        check(&Delta::default());
        let long = "x".repeat(20_000);
        check(&Delta {
            messages: vec![
                ChatMessage::default(),
                ChatMessage { tool_call: Some(ToolCall::default()), ..Default::default() },
                ChatMessage { role: "user".into(), content: long.clone(), tool_call: None },
            ],
            tool_outputs: vec![ToolOutput::default(), ToolOutput { tool_call_id: "c".into(), output: vec![0; 200] }],
            intermediate_results: vec![IntermediateResult::default()],
            state_changes: vec![
                StateChange { key: "k".into(), change: None },
                StateChange { key: String::new(), change: Some(Change::Set(Vec::new())) },
                StateChange { key: long, change: Some(Change::Delete(Delete {})) },
            ],
            drop_oldest_messages: u32::MAX,
            summarizations: vec![
                Summarization::default(),
                Summarization { from: u32::MAX, to: 300, role: "system".into(), summary: "s".into() },
            ],
        });
        let mut transcript = Transcript::new(3);
        for bytes in [100, 500, 5_000] {
            check(&transcript.next_delta(bytes));
        }
    }
}
