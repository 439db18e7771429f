//! Protobuf field writers for the records the append path writes in place
//! (`Codec::put_start`, `Codec::put_completion`): the same bytes as prost's encoding of the
//! owned records (fields in number order, proto3 defaults omitted), written straight into the
//! batch's frame. Tests compare the records with prost's byte for byte.

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

/// Writes a `uint64` field, unless it is zero.
#[inline]
pub(super) fn put_uint64(out: &mut Vec<u8>, tag: u8, value: u64) {
    if value != 0 {
        out.push(key(tag, VARINT));
        put_varint(out, value);
    }
}
