//! The record envelope: a 4-byte header naming the record kind, its schema version and its
//! compression, in front of the (possibly compressed) protobuf body. Pure bytes, no I/O.
//!
//! ```text
//! envelope := kind:u8 schema_version:u8 compression:u8 reserved:u8 compressed_part? body
//! compressed_part := (dictionary_id:u32)? uncompressed_len:u32     (compression 1: no id; 2: id)
//! ```

use crate::codec::CodecError;
use crate::limits;
use crate::log::record::read_u32_le;

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

/// A parsed envelope header, borrowing the body.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Envelope<'a> {
    pub kind: u8,
    pub schema_version: u8,
    pub compression: Compression,
    pub body: &'a [u8],
}

/// Writes an envelope header for `kind` into `out`.
pub(crate) fn write_header(out: &mut Vec<u8>, kind: u8, schema_version: u8, compression: Compression) {
    let code = match compression {
        Compression::None => COMPRESSION_NONE,
        Compression::Zstd { .. } => COMPRESSION_ZSTD,
        Compression::ZstdDictionary { .. } => COMPRESSION_ZSTD_DICTIONARY,
    };
    out.extend_from_slice(&[kind, schema_version, code, 0]);
    match compression {
        Compression::None => {}
        Compression::Zstd { uncompressed_len } => out.extend_from_slice(&uncompressed_len.to_le_bytes()),
        Compression::ZstdDictionary { dictionary_id, uncompressed_len } => {
            out.extend_from_slice(&dictionary_id.to_le_bytes());
            out.extend_from_slice(&uncompressed_len.to_le_bytes());
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
    let rest = &bytes[ENVELOPE_HEADER_BYTES..];
    let (compression, body) = match header[2] {
        COMPRESSION_NONE => (Compression::None, rest),
        COMPRESSION_ZSTD => {
            let len = rest.get(..4).ok_or(CodecError::Truncated)?;
            (Compression::Zstd { uncompressed_len: checked_len(read_u32_le(len, 0))? }, &rest[4..])
        }
        COMPRESSION_ZSTD_DICTIONARY => {
            let ids = rest.get(..8).ok_or(CodecError::Truncated)?;
            let dictionary_id = read_u32_le(ids, 0);
            let uncompressed_len = checked_len(read_u32_le(ids, 4))?;
            (Compression::ZstdDictionary { dictionary_id, uncompressed_len }, &rest[8..])
        }
        _ => return Err(CodecError::Malformed("unknown compression")),
    };
    Ok(Envelope { kind: header[0], schema_version: header[1], compression, body })
}

fn checked_len(len: u32) -> Result<u32, CodecError> {
    if len > limits::RECORD_DECOMPRESSED_BYTES_MAX {
        return Err(CodecError::TooLarge {
            bytes: u64::from(len),
            max: u64::from(limits::RECORD_DECOMPRESSED_BYTES_MAX),
        });
    }
    Ok(len)
}
