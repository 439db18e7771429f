//! The record envelope: a 4-byte header naming the record kind, its schema version and its
//! compression, then the record's subject (the atom, run or dictionary it is about, so that the
//! index can be rebuilt without decompressing bodies), then the (possibly compressed) protobuf
//! body. Variable-length integers are LEB128. Pure bytes, no I/O.
//!
//! ```text
//! envelope := kind:u8 schema_version:u8 compression:u8 reserved:u8 subject:varint
//!             compressed_part? body
//! compressed_part := (dictionary_id:varint)? uncompressed_len:varint   (compression 1: no id; 2: id)
//! ```

use crate::codec::CodecError;
use crate::limits;

/// Bytes of the fixed envelope header.
pub(crate) const ENVELOPE_HEADER_BYTES: usize = 4;

/// How the body is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Compression {
    /// The body is the protobuf encoding.
    None,
    /// The body is a zstd frame of the protobuf encoding.
    Zstd { uncompressed_len: u32 },
    /// The body is a zstd frame made with the store's dictionary `dictionary_id`.
    ZstdDictionary { dictionary_id: u32, uncompressed_len: u32 },
}

const COMPRESSION_NONE: u8 = 0;
const COMPRESSION_ZSTD: u8 = 1;
const COMPRESSION_ZSTD_DICTIONARY: u8 = 2;

/// A parsed envelope, borrowing the body.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Envelope<'a> {
    pub kind: u8,
    pub schema_version: u8,
    pub subject: u64,
    pub compression: Compression,
    pub body: &'a [u8],
}

/// Writes an envelope header for `kind` about `subject` into `out`.
pub(crate) fn write_header(out: &mut Vec<u8>, kind: u8, schema_version: u8, subject: u64, compression: Compression) {
    let code = match compression {
        Compression::None => COMPRESSION_NONE,
        Compression::Zstd { .. } => COMPRESSION_ZSTD,
        Compression::ZstdDictionary { .. } => COMPRESSION_ZSTD_DICTIONARY,
    };
    out.extend_from_slice(&[kind, schema_version, code, 0]);
    put_varint(out, subject);
    match compression {
        Compression::None => {}
        Compression::Zstd { uncompressed_len } => put_varint(out, u64::from(uncompressed_len)),
        Compression::ZstdDictionary { dictionary_id, uncompressed_len } => {
            put_varint(out, u64::from(dictionary_id));
            put_varint(out, u64::from(uncompressed_len));
        }
    }
}

/// Parses an envelope, checking every bound before anything is allocated.
pub(crate) fn parse(bytes: &[u8]) -> Result<Envelope<'_>, CodecError> {
    let Some(header) = bytes.get(..ENVELOPE_HEADER_BYTES) else {
        return Err(CodecError::Truncated);
    };
    if header[3] != 0 {
        return Err(CodecError::Malformed("reserved envelope byte is set"));
    }
    let mut rest = &bytes[ENVELOPE_HEADER_BYTES..];
    let subject = take_varint(&mut rest)?;
    let compression = match header[2] {
        COMPRESSION_NONE => Compression::None,
        COMPRESSION_ZSTD => Compression::Zstd { uncompressed_len: checked_len(take_varint(&mut rest)?)? },
        COMPRESSION_ZSTD_DICTIONARY => {
            let dictionary_id = u32::try_from(take_varint(&mut rest)?)
                .map_err(|_| CodecError::Malformed("dictionary id out of range"))?;
            let uncompressed_len = checked_len(take_varint(&mut rest)?)?;
            Compression::ZstdDictionary { dictionary_id, uncompressed_len }
        }
        _ => return Err(CodecError::Malformed("unknown compression")),
    };
    Ok(Envelope { kind: header[0], schema_version: header[1], subject, compression, body: rest })
}

fn checked_len(len: u64) -> Result<u32, CodecError> {
    let max = limits::RECORD_DECOMPRESSED_BYTES_MAX;
    u32::try_from(len).ok().filter(|len| *len <= max).ok_or(CodecError::TooLarge { bytes: len, max: u64::from(max) })
}

/// Appends `value` as LEB128.
pub(crate) fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Reads a LEB128 value from the front of `bytes` (at most 10 bytes, no overflow).
pub(crate) fn take_varint(bytes: &mut &[u8]) -> Result<u64, CodecError> {
    let mut value = 0u64;
    for (i, &byte) in bytes.iter().enumerate().take(10) {
        let bits = u64::from(byte & 0x7f);
        if i == 9 && byte > 1 {
            return Err(CodecError::Malformed("varint overflows 64 bits"));
        }
        value |= bits << (7 * i);
        if byte & 0x80 == 0 {
            *bytes = &bytes[i + 1..];
            return Ok(value);
        }
    }
    Err(CodecError::Truncated)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_round_trip_at_every_width() {
        for value in [0, 1, 127, 128, 300, u64::from(u32::MAX), u64::MAX] {
            let mut out = Vec::new();
            put_varint(&mut out, value);
            let mut slice = out.as_slice();
            assert_eq!(take_varint(&mut slice), Ok(value));
            assert!(slice.is_empty());
        }
        assert_eq!(take_varint(&mut [0x80u8].as_slice()), Err(CodecError::Truncated));
        assert!(take_varint(&mut [0xffu8; 10].as_slice()).is_err());
    }
}
