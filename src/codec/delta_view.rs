//! Zero-copy views of the two records replay reads most: an `AtomCompleted` body's delta, as
//! a list of [`Op`]s over byte spans of the body that `Context::apply_ops` copies into place, and an `AtomStarted`
//! body's parents. Strings are not checked here: the delta's are checked as they are applied,
//! each once. Nothing here allocates once its vectors have grown; an input the views do
//! not handle is [`Unusual`] and is decoded with prost instead (`wire.rs`).

use crate::codec::wire::{self, Fields, Span, Unusual, Value};

/// One chat message of a delta.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct MessageSpans {
    pub role: Span,
    pub content: Span,
    pub tool_call: Option<ToolCallSpans>,
}

/// A message's tool call.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ToolCallSpans {
    pub id: Span,
    pub name: Span,
    pub arguments: Span,
}

/// A keyed value: a tool output (by tool-call id) or an intermediate result (by name).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct EntrySpans {
    pub key: Span,
    pub value: Span,
}

/// One step of applying a delta to a context, in the order `Context::apply` takes them. A
/// delta reads as: its summarizations, one `Window`, its messages, tool outputs, intermediate
/// results and state changes. Spans index the completion body the ops were read from.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Op {
    /// Replace messages `from..to` (clamped to the window) with one message.
    Summarize { from: u32, to: u32, role: Span, summary: Span },
    /// Drop the `drop` oldest messages; `added` `Message` ops follow.
    Window { drop: u32, added: u32 },
    /// Append a message.
    Message(MessageSpans),
    /// Record a tool output by tool-call id.
    ToolOutput(EntrySpans),
    /// Record an intermediate result by name.
    Result(EntrySpans),
    /// Set a state key.
    Set(EntrySpans),
    /// Delete a state key.
    Delete { key: Span },
}

/// Appends to `ops` the delta of the `AtomCompleted` body `body`, which must be about atom
/// `subject`. A completion without a delta reads as an empty delta (one `Window` op that does
/// nothing). Checks structure, not strings: `Context::apply_ops` checks each string is UTF-8 as
/// it copies it.
///
/// # Errors
/// [`Unusual`] for anything but a well-formed completion that encodes each embedded message
/// and string once (what this crate writes); `ops` is then as it was, and the caller decodes
/// the record with prost.
pub(crate) fn read_completion(body: &[u8], subject: u64, ops: &mut Vec<Op>) -> Result<(), Unusual> {
    let start = ops.len();
    let read = read_completion_ops(body, subject, ops);
    if read.is_err() {
        ops.truncate(start);
    }
    read
}

fn read_completion_ops(body: &[u8], subject: u64, ops: &mut Vec<Op>) -> Result<(), Unusual> {
    let mut atom = 0;
    let mut delta = None;
    let mut fields = Fields::new(body);
    while let Some(field) = fields.next_field() {
        match field? {
            (1, value) => atom = wire::varint(value)?,
            (2, value) => once(&mut delta, wire::bytes(value)?)?,
            (3, value) => {
                wire::bytes(value)?;
            }
            (4, value) => {
                wire::varint(value)?;
            }
            _ => {}
        }
    }
    if atom != subject {
        return Err(Unusual);
    }
    let Some(delta) = delta else {
        ops.push(Op::Window { drop: 0, added: 0 });
        return Ok(());
    };
    read_delta_ops(body, delta, ops)
}

/// Appends to `ops` the delta at `delta` of `body` (see [`read_completion`]).
fn read_delta_ops(body: &[u8], delta: Span, ops: &mut Vec<Op>) -> Result<(), Unusual> {
    // One walk in encoding order, then a stable sort into the order ops are applied in
    // (summarizations, the window, messages, tool outputs, intermediate results, state
    // changes), keeping each kind's own order.
    // The window's op goes first and is filled in at the end: a delta without summarizations,
    // encoded in field order as prost does, then needs no sorting.
    let first = ops.len();
    ops.push(Op::Window { drop: 0, added: 0 });
    let (mut drop, mut added) = (0, 0u32);
    let mut fields = Fields::nested(body, delta);
    while let Some(field) = fields.next_field() {
        match field? {
            (1, value) => {
                ops.push(Op::Message(read_message(body, wire::bytes(value)?)?));
                added = added.checked_add(1).ok_or(Unusual)?;
            }
            (2, value) => ops.push(Op::ToolOutput(read_entry(body, wire::bytes(value)?)?)),
            (3, value) => ops.push(Op::Result(read_entry(body, wire::bytes(value)?)?)),
            (4, value) => ops.push(read_change(body, wire::bytes(value)?)?),
            // prost reads a `uint32` as the low 32 bits of the varint.
            (5, value) => drop = wire::varint(value)? as u32,
            (6, value) => ops.push(read_summary(body, wire::bytes(value)?)?),
            _ => {}
        }
    }
    ops[first] = Op::Window { drop, added };
    let record = &mut ops[first..];
    if !record.is_sorted_by_key(Op::order) {
        record.sort_by_key(Op::order);
    }
    Ok(())
}

impl Op {
    /// Where ops of this kind go when a delta is applied.
    fn order(&self) -> u8 {
        match self {
            Op::Summarize { .. } => 0,
            Op::Window { .. } => 1,
            Op::Message(_) => 2,
            Op::ToolOutput(_) => 3,
            Op::Result(_) => 4,
            Op::Set(_) | Op::Delete { .. } => 5,
        }
    }
}

/// An embedded message field seen a second time would be merged by prost: left to it.
fn once(slot: &mut Option<Span>, span: Span) -> Result<(), Unusual> {
    match slot.replace(span) {
        Some(_) => Err(Unusual),
        None => Ok(()),
    }
}

/// Records a string field's span, unchecked: `Context::apply_spans` checks it is UTF-8 as it
/// copies it. A string seen a second time is [`Unusual`], so that every occurrence prost would
/// check is one that gets applied (and checked).
fn text_once(slot: &mut Span, seen: &mut u8, bit: u8, value: Value) -> Result<(), Unusual> {
    if *seen & bit != 0 {
        return Err(Unusual);
    }
    *seen |= bit;
    *slot = wire::bytes(value)?;
    Ok(())
}

fn read_message(body: &[u8], span: Span) -> Result<MessageSpans, Unusual> {
    let mut message = MessageSpans::default();
    let mut tool_call = None;
    let mut seen = 0;
    let mut fields = Fields::nested(body, span);
    while let Some(field) = fields.next_field() {
        match field? {
            (1, value) => text_once(&mut message.role, &mut seen, 1, value)?,
            (2, value) => text_once(&mut message.content, &mut seen, 2, value)?,
            (3, value) => once(&mut tool_call, wire::bytes(value)?)?,
            _ => {}
        }
    }
    if let Some(span) = tool_call {
        let mut call = ToolCallSpans::default();
        let mut seen = 0;
        let mut fields = Fields::nested(body, span);
        while let Some(field) = fields.next_field() {
            match field? {
                (1, value) => text_once(&mut call.id, &mut seen, 1, value)?,
                (2, value) => text_once(&mut call.name, &mut seen, 2, value)?,
                (3, value) => text_once(&mut call.arguments, &mut seen, 4, value)?,
                _ => {}
            }
        }
        message.tool_call = Some(call);
    }
    Ok(message)
}

/// A `map<string, bytes>` entry or a keyed delta field: key (field 1), value (field 2); the
/// key is not checked to be UTF-8.
pub(crate) fn read_entry(body: &[u8], span: Span) -> Result<EntrySpans, Unusual> {
    let mut entry = EntrySpans::default();
    let mut seen = 0;
    let mut fields = Fields::nested(body, span);
    while let Some(field) = fields.next_field() {
        match field? {
            (1, value) => text_once(&mut entry.key, &mut seen, 1, value)?,
            (2, value) => entry.value = wire::bytes(value)?,
            _ => {}
        }
    }
    Ok(entry)
}

/// A state change: `Set` or `Delete`.
fn read_change(body: &[u8], span: Span) -> Result<Op, Unusual> {
    let mut key = Span::default();
    let mut seen = 0;
    // The `change` oneof: `Some(Some(value))` for set, `Some(None)` for delete.
    let mut change: Option<Option<Span>> = None;
    let mut fields = Fields::nested(body, span);
    while let Some(field) = fields.next_field() {
        match field? {
            (1, value) => text_once(&mut key, &mut seen, 1, value)?,
            // A second `change` would be merged or replaced by prost: left to it.
            (2 | 3, _) if change.is_some() => return Err(Unusual),
            (2, value) => change = Some(Some(wire::bytes(value)?)),
            (3, value) => {
                // `Delete` has no fields; any it carries are unknown and skipped, as prost does.
                let mut inner = Fields::nested(body, wire::bytes(value)?);
                while let Some(field) = inner.next_field() {
                    field?;
                }
                change = Some(None);
            }
            _ => {}
        }
    }
    match change {
        Some(Some(value)) => Ok(Op::Set(EntrySpans { key, value })),
        Some(None) => Ok(Op::Delete { key }),
        // Applying it does nothing, but prost would still check its key: left to prost.
        None => Err(Unusual),
    }
}

/// A summarization; its strings are checked here, since an empty range is skipped when
/// applied but prost checks them all the same.
fn read_summary(body: &[u8], span: Span) -> Result<Op, Unusual> {
    let (mut from, mut to, mut role, mut summary) = (0, 0, Span::default(), Span::default());
    let mut fields = Fields::nested(body, span);
    while let Some(field) = fields.next_field() {
        match field? {
            (1, value) => from = wire::varint(value)? as u32,
            (2, value) => to = wire::varint(value)? as u32,
            (3, value) => role = wire::text(body, value)?,
            (4, value) => summary = wire::text(body, value)?,
            _ => {}
        }
    }
    Ok(Op::Summarize { from, to, role, summary })
}

/// What the store index needs of an `AtomStarted` record, read in place.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct StartSpans {
    pub run: u64,
    /// The agent's name (checked UTF-8).
    pub agent: Span,
    /// The atom's key within its agent (checked UTF-8).
    pub key: Span,
}

/// Reads the `AtomStarted` body `body` about atom `subject`: its run, agent and key, and its
/// parents into `parents` (cleared first), packed or not.
///
/// # Errors
/// [`Unusual`] for anything but a well-formed start record; decode it with prost instead.
pub(crate) fn read_start(body: &[u8], subject: u64, parents: &mut Vec<u64>) -> Result<StartSpans, Unusual> {
    parents.clear();
    let mut start = StartSpans::default();
    let mut atom = 0;
    let mut fields = Fields::new(body);
    while let Some(field) = fields.next_field() {
        match field? {
            (1, value) => atom = wire::varint(value)?,
            (2, value) => start.run = wire::varint(value)?,
            (7, value) => {
                wire::varint(value)?;
            }
            (3, value) => start.agent = wire::text(body, value)?,
            (4, value) => start.key = wire::text(body, value)?,
            (6, value) => {
                wire::text(body, value)?;
            }
            (5, Value::Varint(parent)) => parents.push(parent),
            (5, Value::Bytes(span)) => {
                let mut packed = span.of(body);
                while !packed.is_empty() {
                    parents.push(crate::codec::envelope::take_varint(&mut packed).map_err(|_| Unusual)?);
                }
            }
            (5, Value::Fixed) => return Err(Unusual),
            _ => {}
        }
    }
    if atom != subject {
        return Err(Unusual);
    }
    Ok(start)
}

/// [`read_start`] for the parents alone.
///
/// # Errors
/// [`Unusual`], as [`read_start`].
pub(crate) fn read_start_parents(body: &[u8], subject: u64, parents: &mut Vec<u64>) -> Result<(), Unusual> {
    read_start(body, subject, parents).map(|_| ())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use prost::Message;

    use super::*;
    use crate::codec::context::{Context, Rotation};
    use crate::codec::proto::{AtomCompleted, AtomStarted, Delta};
    use crate::codec::tests::arb_delta;

    /// What prost makes of `body` applied to `base`: the context, or `None` if prost rejects it.
    fn by_prost(base: &Context, body: &[u8], subject: u64) -> Option<Context> {
        let done = AtomCompleted::decode(body).ok().filter(|done| done.atom == subject)?;
        let mut context = base.clone();
        context.apply_owned(done.delta.unwrap_or_default());
        Some(context)
    }

    /// What the zero-copy path makes of it: `Err(())` if it leaves the record to prost,
    /// `Ok(None)` if it rejects it.
    fn by_spans(base: &Context, body: &[u8], subject: u64) -> Result<Option<Context>, ()> {
        let mut ops = vec![Op::Window { drop: 0, added: 0 }];
        if read_completion(body, subject, &mut ops).is_err() {
            assert_eq!(ops.len(), 1, "a failed read leaves the ops as they were");
            return Err(());
        }
        let mut context = base.clone();
        let mut rotation = Rotation::default();
        let applied = context.apply_ops(body, &ops[1..], &mut rotation).ok();
        context.settle(&mut rotation);
        Ok(applied.map(|()| context))
    }

    fn base_context(deltas: &[Delta]) -> Context {
        let mut context = Context::new();
        for delta in deltas {
            context.apply(delta);
        }
        context
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Every completion this crate writes takes the zero-copy path, and it folds exactly
        /// as prost's decoding does (on a context that already has messages and keys, so that
        /// the reuse of buffers is exercised).
        #[test]
        fn completions_fold_as_prost_decodes_them(
            history in proptest::collection::vec(arb_delta(), 0..4),
            delta in proptest::option::of(arb_delta()),
            atom in 1u64..u64::MAX,
        ) {
            let base = base_context(&history);
            let body = AtomCompleted { atom, delta, result: b"r".to_vec(), ended_at_unix_us: 7 }.encode_to_vec();
            let expected = by_prost(&base, &body, atom);
            prop_assert!(expected.is_some());
            prop_assert_eq!(by_spans(&base, &body, atom), Ok(expected));
        }

        /// A whole history folded through ops, the window rotating in place from one delta to
        /// the next and settled once at the end, equals the plain fold.
        #[test]
        fn histories_fold_through_ops_as_through_prost(
            history in proptest::collection::vec(arb_delta(), 1..24),
            steady in proptest::collection::vec(any::<bool>(), 24),
        ) {
            let (mut expected, mut folded, mut rotation) = (Context::new(), Context::new(), Rotation::default());
            for (atom, (mut delta, steady)) in history.into_iter().zip(steady).enumerate() {
                if steady {
                    // The steady state of a bounded window: drop as many as are added.
                    delta.drop_oldest_messages = delta.messages.len() as u32;
                    delta.summarizations.clear();
                }
                expected.apply(&delta);
                let atom = atom as u64 + 1;
                let body = AtomCompleted { atom, delta: Some(delta), result: Vec::new(), ended_at_unix_us: 0 }.encode_to_vec();
                let mut ops = Vec::new();
                prop_assert!(read_completion(&body, atom, &mut ops).is_ok());
                prop_assert!(folded.apply_ops(&body, &ops, &mut rotation).is_ok());
            }
            folded.settle(&mut rotation);
            prop_assert_eq!(folded, expected);
        }

        /// On damaged bytes the zero-copy path either leaves the record to prost, or agrees with
        /// prost: the same context when prost accepts it, an error when prost rejects it.
        #[test]
        fn damaged_completions_never_disagree_with_prost(
            history in proptest::collection::vec(arb_delta(), 0..3),
            delta in arb_delta(),
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
            cut in any::<prop::sample::Index>(),
            truncate in any::<bool>(),
        ) {
            let base = base_context(&history);
            let mut body = AtomCompleted { atom: 3, delta: Some(delta), result: Vec::new(), ended_at_unix_us: 1 }.encode_to_vec();
            for (at, byte) in flips {
                let at = at.index(body.len());
                body[at] = byte;
            }
            if truncate {
                body.truncate(cut.index(body.len() + 1));
            }
            if let Ok(spans) = by_spans(&base, &body, 3) {
                prop_assert_eq!(spans, by_prost(&base, &body, 3));
            }
        }

        /// Start records: the same parents as prost reads, packed or not; damaged ones never
        /// read differently.
        #[test]
        fn start_parents_read_as_prost_decodes_them(
            parents in proptest::collection::vec(any::<u64>(), 0..6),
            agent in any::<String>(),
            flip in proptest::option::of((any::<prop::sample::Index>(), any::<u8>())),
        ) {
            let started = AtomStarted { atom: 9, run: 2, agent, key: "k".into(), parents, idempotency_key: String::new(), started_at_unix_us: 4 };
            let mut body = started.encode_to_vec();
            if let Some((at, byte)) = flip {
                let at = at.index(body.len());
                body[at] = byte;
            }
            let mut read = Vec::new();
            if let Ok(spans) = read_start(&body, 9, &mut read) {
                let decoded = AtomStarted::decode(body.as_slice()).ok().filter(|started| started.atom == 9);
                let view = (spans.run, spans.agent.of(&body).to_vec(), spans.key.of(&body).to_vec(), read);
                prop_assert_eq!(decoded.map(|s| (s.run, s.agent.into_bytes(), s.key.into_bytes(), s.parents)), Some(view));
            } else {
                prop_assert!(flip.is_some(), "an undamaged start record must take the fast path");
            }
        }
    }

    #[test]
    fn unpacked_parents_and_repeated_fields_are_handled() {
        // parents = 5 written unpacked (wire type 0) twice, then packed once.
        let mut body = vec![0x08, 9, 0x28, 1, 0x28, 2, 0x2a, 2, 3, 4];
        let mut read = Vec::new();
        assert_eq!(read_start_parents(&body, 9, &mut read), Ok(()));
        assert_eq!(read, [1, 2, 3, 4]);
        assert_eq!(AtomStarted::decode(body.as_slice()).map(|s| s.parents), Ok(vec![1, 2, 3, 4]));
        // A group (wire type 3) is left to prost.
        body.extend_from_slice(&[0x33, 0x34]);
        assert_eq!(read_start_parents(&body, 9, &mut read), Err(Unusual));
    }
}
