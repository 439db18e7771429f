//! The check of a `Delta` handed over already encoded (`Store::record_atom_encoded`): whether
//! prost decodes it, answered in place, in one walk over its bytes that collects nothing.
//!
//! It accepts less than prost does: anything it does not expect (a group, an over-long varint,
//! a length past the end, a known field of another wire type) is [`Unusual`], and the caller
//! then decodes the delta with prost, which decides. What it accepts, prost accepts: the
//! differential tests in `codec/tests.rs` and the fuzz target `replay_decode` hold it to that.

use crate::codec::envelope;
use crate::codec::wire::Unusual;

/// Wire type 0: a varint.
const VARINT: u8 = 0;
/// Wire type 1: eight bytes.
const FIXED64: u8 = 1;
/// Wire type 2: a length, then that many bytes.
const LEN: u8 = 2;
/// Wire type 5: four bytes.
const FIXED32: u8 = 5;

/// Checks that `delta` is a `Delta` that prost decodes: each known field of the wire type prost
/// expects, every string field UTF-8 (as prost checks them), every embedded message well
/// formed, unknown fields skipped as prost skips them. A field given twice is checked twice, as
/// prost merges it.
///
/// # Errors
/// [`Unusual`] for anything this walk does not accept; decode those with prost to decide.
pub(crate) fn check_delta(delta: &[u8]) -> Result<(), Unusual> {
    let mut rest = delta;
    while !rest.is_empty() {
        match tag(&mut rest)? {
            (1, LEN) => check_message(take(&mut rest)?)?,
            // `ToolOutput` and `IntermediateResult`: a string and a `bytes` field.
            (2 | 3, LEN) => check_scalars(take(&mut rest)?, &[Kind::Text, Kind::Bytes])?,
            (4, LEN) => check_change(take(&mut rest)?)?,
            (5, VARINT) => {
                varint(&mut rest)?;
            }
            (6, LEN) => check_scalars(take(&mut rest)?, &[Kind::Varint, Kind::Varint, Kind::Text, Kind::Text])?,
            (1..=6, _) => return Err(Unusual),
            (_, wire) => skip(&mut rest, wire)?,
        }
    }
    Ok(())
}

/// The type of a field, as [`check_scalars`] checks it.
#[derive(Clone, Copy)]
enum Kind {
    /// A varint (`uint32`, `uint64`).
    Varint,
    /// A `string`: length-delimited, UTF-8.
    Text,
    /// `bytes`: length-delimited, anything.
    Bytes,
}

/// Checks the message `message` whose fields 1, 2, ... are of the kinds `kinds`; fields beyond
/// those are unknown and skipped.
fn check_scalars(mut message: &[u8], kinds: &[Kind]) -> Result<(), Unusual> {
    while !message.is_empty() {
        let (field, wire) = tag(&mut message)?;
        match (kinds.get(field as usize - 1), wire) {
            (Some(Kind::Varint), VARINT) => {
                varint(&mut message)?;
            }
            (Some(Kind::Text), LEN) => check_text(take(&mut message)?)?,
            (Some(Kind::Bytes), LEN) => {
                take(&mut message)?;
            }
            (Some(_), _) => return Err(Unusual),
            (None, wire) => skip(&mut message, wire)?,
        }
    }
    Ok(())
}

/// A `ChatMessage`: role and content, and its `ToolCall` (three strings).
fn check_message(mut message: &[u8]) -> Result<(), Unusual> {
    while !message.is_empty() {
        match tag(&mut message)? {
            (1 | 2, LEN) => check_text(take(&mut message)?)?,
            (3, LEN) => check_scalars(take(&mut message)?, &[Kind::Text, Kind::Text, Kind::Text])?,
            (1..=3, _) => return Err(Unusual),
            (_, wire) => skip(&mut message, wire)?,
        }
    }
    Ok(())
}

/// A `StateChange`: its key, and the `change` oneof (`set` bytes, or a `Delete` message, whose
/// fields are all unknown and must only be well formed).
fn check_change(mut change: &[u8]) -> Result<(), Unusual> {
    while !change.is_empty() {
        match tag(&mut change)? {
            (1, LEN) => check_text(take(&mut change)?)?,
            (2, LEN) => {
                take(&mut change)?;
            }
            (3, LEN) => check_scalars(take(&mut change)?, &[])?,
            (1..=3, _) => return Err(Unusual),
            (_, wire) => skip(&mut change, wire)?,
        }
    }
    Ok(())
}

/// Checks that `text` is UTF-8: all ASCII (most of an agent's text) a word at a time first.
#[inline]
fn check_text(text: &[u8]) -> Result<(), Unusual> {
    if text.is_ascii() || std::str::from_utf8(text).is_ok() { Ok(()) } else { Err(Unusual) }
}

/// Reads a field's key: its number (1 to 2^29 - 1, as prost requires) and wire type.
#[inline]
fn tag(rest: &mut &[u8]) -> Result<(u32, u8), Unusual> {
    let key = u32::try_from(varint(rest)?).map_err(|_| Unusual)?;
    let field = key >> 3;
    if field == 0 {
        return Err(Unusual);
    }
    Ok((field, (key & 7) as u8))
}

/// Reads a length-delimited value: its bytes.
#[inline]
fn take<'a>(rest: &mut &'a [u8]) -> Result<&'a [u8], Unusual> {
    let len = usize::try_from(varint(rest)?).map_err(|_| Unusual)?;
    if len > rest.len() {
        return Err(Unusual);
    }
    let (value, after) = rest.split_at(len);
    *rest = after;
    Ok(value)
}

/// Skips an unknown field's value of wire type `wire`; a group (3, 4) or an invalid wire type is
/// [`Unusual`].
fn skip(rest: &mut &[u8], wire: u8) -> Result<(), Unusual> {
    let len = match wire {
        VARINT => return varint(rest).map(|_| ()),
        LEN => return take(rest).map(|_| ()),
        FIXED64 => 8,
        FIXED32 => 4,
        _ => return Err(Unusual),
    };
    *rest = rest.get(len..).ok_or(Unusual)?;
    Ok(())
}

/// A LEB128 varint of at most 10 bytes whose value fits 64 bits (what prost accepts):
/// [`envelope::take_varint`], with the one-byte case (tags, short lengths) inline.
#[inline]
fn varint(rest: &mut &[u8]) -> Result<u64, Unusual> {
    if let Some((&byte, after)) = rest.split_first()
        && byte < 0x80
    {
        *rest = after;
        return Ok(u64::from(byte));
    }
    envelope::take_varint(rest).map_err(|_| Unusual)
}
